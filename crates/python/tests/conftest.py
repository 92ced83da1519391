"""Fixtures: a local 3-replica cluster of a counter, removed after each test."""

import struct
import time

import pytest

import microrep

# A replica descheduled on a busy 2-core machine should rarely look dead (failure detection
# takes about 14 heartbeats).
SETTINGS = {"cluster.timing.heartbeat_us": 20000}


class Counter:
    """Adds each command's first byte; replies with the new total (8 bytes, little-endian)."""

    def __init__(self):
        self.total = 0
        self.applied = 0
        self.restores = 0

    def apply(self, index, command):
        self.total += command[0]
        self.applied += 1
        return struct.pack("<Q", self.total)

    def snapshot(self):
        return struct.pack("<QQ", self.total, self.applied)

    def restore(self, snapshot):
        self.total, self.applied = struct.unpack("<QQ", snapshot)
        self.restores += 1

    def digest(self):
        return self.total


class Journal:
    """Appends every command; replies with its position (8 bytes, little-endian)."""

    def __init__(self):
        self.entries = []

    def apply(self, index, command):
        self.entries.append(command)
        return struct.pack("<Q", len(self.entries) - 1)

    def snapshot(self):
        return b"".join(struct.pack("<I", len(e)) + e for e in self.entries)

    def restore(self, snapshot):
        entries, at = [], 0
        while at < len(snapshot):
            (n,) = struct.unpack_from("<I", snapshot, at)
            entries.append(snapshot[at + 4 : at + 4 + n])
            at += 4 + n
        self.entries = entries


def leader(cluster):
    """The replica that leads, once a command committed through it."""
    cluster.propose(b"\x00")
    return next(n for n in cluster.nodes if not n.closed and n.leader == n.id)


def total(committed):
    return struct.unpack("<Q", committed.reply)[0]


def eventually(what, done, timeout=30.0):
    """Waits, at most `timeout` seconds, until `done()` holds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.0005)


@pytest.fixture
def cluster():
    with microrep.LocalCluster(Counter, replicas=3, settings=SETTINGS) as c:
        yield c
