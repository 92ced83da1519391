"""Fixtures: a local 3-replica cluster of a counter, removed after each test."""

import struct
import time

import pytest

import microrep

# A replica descheduled on a busy 2-core machine should rarely look dead.
SETTINGS = {"cluster.timing.heartbeat_us": 5000}


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
