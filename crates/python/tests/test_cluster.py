"""A local 3-replica cluster of a state machine written in Python."""

import gc
import os
import struct
import threading

import pytest
from conftest import SETTINGS, Counter, Journal, eventually, leader, total

import microrep


def test_every_replica_applies_the_same_commands_in_the_same_order():
    acked, unknown = [], []
    with microrep.LocalCluster(Journal, replicas=3, settings=SETTINGS) as cluster:
        for i in range(100):
            command = b"command %d" % i
            try:
                acked.append((command, struct.unpack("<Q", cluster.propose(command).reply)[0]))
            except microrep.OutcomeUnknownError:
                unknown.append(command)  # a leader change: it may or may not be in the journals
        first = cluster.apps[0]
        eventually("the replicas agree", lambda: all(app.entries == first.entries for app in cluster.apps))
        for command, position in acked:
            assert first.entries[position] == command
        for command in unknown:
            assert first.entries.count(command) <= 1
        assert len(first.entries) >= len(acked) >= 100 - len(unknown)


def test_every_replica_computes_the_same_state_and_digest(cluster):
    expected = 0
    for i in range(1, 21):
        expected += i
        assert total(cluster.propose(bytes([i]))) == expected
    eventually("the followers catch up", lambda: all(app.total == expected for app in cluster.apps))
    digest = format(expected, "016x")
    eventually("every status shows the digest", lambda: {n.status()["digest"] for n in cluster.nodes} == {digest})


def test_indexes_grow_and_order(cluster):
    first = cluster.propose(b"\x01").index
    second = cluster.propose(b"\x01").index
    assert second > first
    assert (second.entry, second.position) > (first.entry, first.position)
    assert repr(first).startswith("Index(entry=")


def test_a_follower_refuses_and_names_the_leader(cluster):
    lead = leader(cluster)
    follower = next(n for n in cluster.nodes if n is not lead)
    with pytest.raises(microrep.NotLeaderError, match="not the leader; the leader is node") as refused:
        follower.propose(b"\x01")
    assert refused.value.leader in {n.id for n in cluster.nodes if n is not follower}
    assert isinstance(refused.value, microrep.Error)


def test_propose_releases_the_gil_while_it_waits(cluster):
    """The command's apply, on a replica's own thread, waits for this thread to run Python
    code, which both can do only if the proposing thread released the GIL."""
    applying, go = threading.Event(), threading.Event()
    for app in cluster.apps:
        plain_apply = app.apply

        def gated_apply(index, command, plain_apply=plain_apply):
            if command == b"\x07":
                applying.set()
                assert go.wait(30), "the test thread never ran"
            return plain_apply(index, command)

        app.apply = gated_apply
    outcome = []
    proposer = threading.Thread(target=lambda: outcome.append(cluster.propose(b"\x07")))
    proposer.start()
    try:
        assert applying.wait(30), "apply never ran while propose waited"
        assert not outcome, "propose returned before its command was applied"
    finally:
        go.set()
        proposer.join(60)
    assert not proposer.is_alive()
    assert total(outcome[0]) == 7


def test_submitted_proposals_are_polled_or_waited_for(cluster):
    cluster.propose(b"\x01")
    lead = leader(cluster)
    pending = [lead.submit(b"\x02") for _ in range(6)]
    assert all(isinstance(p, microrep.Pending) for p in pending)
    replies = [total(p.wait()) for p in pending[:3]]
    for p in pending[3:]:
        outcome = []
        eventually("a submitted proposal commits", lambda p=p: outcome.append(p.poll()) or outcome[-1] is not None)
        replies.append(total(outcome[-1]))
    assert sorted(replies) == [3, 5, 7, 9, 11, 13]
    with pytest.raises(microrep.Error, match="already collected"):
        pending[0].wait()
    with pytest.raises(microrep.Error, match="already collected"):
        pending[5].poll()


def test_a_batch_commits_as_one_entry_with_a_reply_per_command(cluster):
    cluster.propose(b"\x01")
    lead = leader(cluster)
    batch = lead.propose_batch([b"\x02", b"\x03", b"\x04"])
    assert [total(c) for c in batch] == [3, 6, 10]
    assert len({c.index.entry for c in batch}) == 1
    assert [c.index.position for c in batch] == [0, 1, 2]
    assert lead.propose_batch([]) == []
    with pytest.raises(microrep.TooLargeError):
        lead.propose_batch([b"\x00" * 600, b"\x00" * 600])
    assert total(cluster.propose(b"\x01")) == 11


def test_a_new_leader_takes_over_when_the_leader_stops(cluster):
    cluster.propose(b"\x01")
    old = leader(cluster)
    cluster.stop(old.id)
    committed = cluster.propose(b"\x01")
    assert total(committed) == 2
    new = next(n for n in cluster.nodes if not n.closed and n.leader == n.id)
    assert new.id != old.id


def test_a_restarted_replica_catches_up_from_a_snapshot():
    # A log of 64 slots: a replica away for 200 commands cannot catch up from the log alone.
    settings = dict(SETTINGS, **{"cluster.log.snapshot_every": 16, "cluster.log.slots": 64})
    with microrep.LocalCluster(Counter, replicas=3, settings=settings) as cluster:
        lead = leader(cluster)
        follower = next(n.id for n in cluster.nodes if n is not lead)
        cluster.stop(follower)
        for _ in range(200):
            try:
                cluster.propose(b"\x01")
            except microrep.OutcomeUnknownError:
                pass  # a leader change; the check below compares replicas, not a count
        fresh = Counter()
        cluster.start(follower, fresh)
        source = cluster.apps[leader(cluster).id]
        eventually("the restarted replica catches up", lambda: fresh.total == source.total)
        assert fresh.total >= 150
        assert fresh.restores >= 1


def test_nodes_close_once_and_then_refuse(cluster):
    node = cluster.nodes[2]
    node.close()
    node.close()
    assert node.closed
    with pytest.raises(microrep.ShutdownError, match="closed"):
        node.propose(b"\x01")
    assert isinstance(microrep.ShutdownError("x"), microrep.OutcomeUnknownError)


def test_a_shm_directory_is_removed_on_close():
    with microrep.LocalCluster(Counter, replicas=3, settings=SETTINGS) as cluster:
        cluster.propose(b"\x01")
        shm_dir = cluster.shm_dir
        assert os.listdir(shm_dir)
    assert not os.path.exists(shm_dir)


def test_direct_mode_applies_on_the_proposing_thread():
    settings = dict(SETTINGS, **{"node.mode": "direct"})
    with microrep.LocalCluster(Counter, replicas=3, settings=settings) as cluster:
        expected = 0
        for i in range(1, 21):
            expected += i
            assert total(cluster.propose(bytes([i]))) == expected
        lead = leader(cluster)
        assert total(lead.submit(b"\x05").wait()) == expected + 5
        eventually("the followers catch up", lambda: all(app.total == expected + 5 for app in cluster.apps))


def test_nodes_dropped_without_close_stop(tmp_path):
    """Nodes the garbage collector frees stop their threads (with the GIL released: a replica
    thread may be waiting for it to apply a command)."""
    config = microrep.Config.local(f"dropped-{os.getpid()}", 3, shm_dir=tmp_path / "shm")
    config.set("cluster.timing.heartbeat_us", 20000)
    nodes = [microrep.Node(config.with_node(i), Counter()) for i in range(3)]
    eventually("a leader", lambda: any(n.leader == n.id for n in nodes))
    lead = next(n for n in nodes if n.leader == n.id)
    for _ in range(3):
        try:
            lead.propose(b"\x01")
        except microrep.Error:
            pass  # a leader change on a busy machine: this test is about dropping
    del nodes, lead
    gc.collect()
