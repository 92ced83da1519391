"""A local 3-replica cluster of a state machine written in Python."""

import os
import threading

import pytest
from conftest import SETTINGS, Counter, eventually, total

import microrep


def test_every_replica_applies_the_same_commands(cluster):
    expected = 0
    for i in range(1, 51):
        expected += i
        committed = cluster.propose(bytes([i]))
        assert total(committed) == expected
        assert isinstance(committed.index, microrep.Index)
    eventually("the followers catch up", lambda: all(app.total == expected for app in cluster.apps))
    assert [app.applied for app in cluster.apps] == [50, 50, 50]
    digest = format(expected, "016x")
    eventually("every status shows the digest", lambda: {n.status()["digest"] for n in cluster.nodes} == {digest})


def test_indexes_grow_and_order(cluster):
    first = cluster.propose(b"\x01").index
    second = cluster.propose(b"\x01").index
    assert second > first
    assert (second.entry, second.position) > (first.entry, first.position)
    assert repr(first).startswith("Index(entry=")


def test_a_follower_refuses_and_names_the_leader(cluster):
    cluster.propose(b"\x01")
    leader = next(n for n in cluster.nodes if n.leader == n.id)
    follower = next(n for n in cluster.nodes if n is not leader)
    with pytest.raises(microrep.NotLeaderError, match="not the leader") as refused:
        follower.propose(b"\x01")
    assert refused.value.leader == leader.id
    assert isinstance(refused.value, microrep.Error)


def test_propose_releases_the_gil_while_it_waits(cluster):
    """The command's apply waits for this thread to run Python code, which it can only do if
    the proposing thread released the GIL."""
    cluster.propose(b"\x01")
    leader = next(n for n in cluster.nodes if n.leader == n.id)
    app = cluster.apps[leader.id]
    applying, go = threading.Event(), threading.Event()
    plain_apply = app.apply

    def gated_apply(index, command):
        if command == b"\x07":
            applying.set()
            assert go.wait(30), "the test thread never ran"
        return plain_apply(index, command)

    app.apply = gated_apply
    outcome = []
    proposer = threading.Thread(target=lambda: outcome.append(leader.propose(b"\x07")))
    proposer.start()
    try:
        assert applying.wait(30), "apply never ran while propose waited"
        assert not outcome, "propose returned before its command was applied"
        go.set()
    finally:
        go.set()
        proposer.join(60)
    assert not proposer.is_alive()
    assert total(outcome[0]) == 8


def test_submitted_proposals_are_polled_or_waited_for(cluster):
    cluster.propose(b"\x01")
    leader = next(n for n in cluster.nodes if n.leader == n.id)
    pending = [leader.submit(b"\x02") for _ in range(6)]
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


def test_a_new_leader_takes_over_when_the_leader_stops(cluster):
    cluster.propose(b"\x01")
    old = next(n for n in cluster.nodes if n.leader == n.id)
    cluster.stop(old.id)
    committed = cluster.propose(b"\x01")
    assert total(committed) == 2
    new = next(n for n in cluster.nodes if not n.closed and n.leader == n.id)
    assert new.id != old.id


def test_a_restarted_replica_catches_up_from_a_snapshot():
    # A log of 64 slots: a replica away for 200 commands cannot catch up from the log alone.
    settings = dict(SETTINGS, **{"cluster.log.snapshot_every": 16, "cluster.log.slots": 64})
    with microrep.LocalCluster(Counter, replicas=3, settings=settings) as cluster:
        cluster.propose(b"\x01")
        follower = next(n.id for n in cluster.nodes if n.leader != n.id)
        cluster.stop(follower)
        for _ in range(200):
            cluster.propose(b"\x01")
        fresh = Counter()
        cluster.start(follower, fresh)
        eventually("the restarted replica catches up", lambda: fresh.total == 201)
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
