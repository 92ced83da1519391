//! Scenario tests of heartbeat pacing (`mu::pace`, `MuConfig::idle_stride`): an idle cluster
//! heartbeats once every `idle_stride` periods, keeps its leader while it rests, wakes with
//! work, and still replaces a leader that crashes or steps aside while it rests.

mod common;

use common::Cluster;
use microrep_core::mu::{self, MuConfig, layout};
use microrep_fabric::sim::SimConfig;
use microrep_fabric::{Fabric, NodeId};

/// The simulated heartbeat period (the tests' clusters tick every microsecond).
fn period_us() -> u64 {
    MuConfig::simulated(NodeId(0), 3).heartbeat_period_ns / 1_000
}

fn replica(c: &Cluster, i: usize) -> &mu::Replica<microrep_fabric::sim::SimFabric> {
    c.replicas[i].as_ref().expect("running")
}

fn leads_idle(c: &Cluster, i: usize) -> bool {
    let s = c.status(i);
    s.role == mu::Role::Leader && s.phase == mu::Stage::Idle
}

/// A cluster of `n` whose replicas have the idle stride `stride(node)`, polled as the runtime
/// polls them (a resting background plane is left alone), that committed a few entries through
/// replica 0 and then went idle until every replica rests.
fn resting_cluster(n: u16, stride: impl Fn(NodeId) -> u8) -> Cluster {
    let mut c = Cluster::new(n, SimConfig::reliable(), |cfg| cfg.idle_stride = stride(cfg.node));
    c.rests = true;
    c.commit_sequentially(0, 1, 3);
    c.run_until(10_000, "every replica rests", |c| (0..usize::from(n)).all(|i| replica(c, i).resting()));
    c
}

/// Runs `periods` heartbeat periods and returns, per replica, the longest it was told it may
/// rest (`Replica::calm_until`), in periods (rounded up); panics if any replica holds a
/// running peer failed on the way, or stops resting.
fn longest_rests(c: &mut Cluster, periods: u64) -> Vec<u64> {
    let n = c.replicas.len();
    let mut longest = vec![0; n];
    for _ in 0..periods * period_us() {
        c.tick();
        for (i, most) in longest.iter_mut().enumerate() {
            let r = replica(c, i);
            assert!(r.resting(), "replica {i} stopped resting: {:?}", c.status(i));
            assert!((0..n).all(|p| r.detector().is_live(NodeId(p as u16))), "replica {i} suspects a resting peer");
            // `None` while a heartbeat READ of the leader is in flight.
            if let Some(until) = r.calm_until(c.now) {
                *most = (*most).max((until - c.now).div_ceil(period_us() * 1_000));
            }
        }
    }
    longest
}

#[test]
fn an_idle_cluster_rests_at_its_stride_keeps_its_leader_and_wakes_with_work() {
    let mut c = resting_cluster(3, |_| 8);
    assert_eq!(longest_rests(&mut c, 100), vec![8; 3], "each rests up to 8 periods at a time");
    assert!((0..3).all(|i| c.status(i).leader == NodeId(0)), "no leader change: {:?}", c.status(1));
    c.propose(0, 100, b"work").expect("propose");
    c.run_until(10_000, "the command commits", |c| c.committed(0).contains(&100));
    // The leader hurries with the work; its followers within one stride of theirs.
    c.run_until(9 * period_us(), "no replica rests", |c| (0..3).all(|i| !replica(c, i).resting()));
    assert!((0..3).all(|i| c.status(i).leader == NodeId(0)));
}

#[test]
fn a_follower_never_rests_longer_than_its_leader_announced() {
    let mut c = resting_cluster(3, |node| if node == NodeId(0) { 4 } else { 16 });
    assert_eq!(longest_rests(&mut c, 100), vec![4; 3]);
    let mut c = resting_cluster(3, |node| if node == NodeId(0) { 16 } else { 4 });
    assert_eq!(longest_rests(&mut c, 100), vec![16, 4, 4], "followers rest at most their own stride");
}

/// When replica `i` next ticks while it rests (ticks until its rest is known: not while a
/// heartbeat READ of its leader is in flight).
fn next_tick(c: &mut Cluster, i: usize) -> u64 {
    loop {
        if let Some(due) = replica(c, i).calm_until(c.now) {
            return due;
        }
        c.tick();
    }
}

/// A leader that crashes while the cluster rests is held failed by every survivor as soon as in
/// a busy cluster, counted from the survivor's first heartbeat tick after the crash (at most one
/// stride on): the first heartbeat it misses puts the survivor back to a tick every period,
/// and the score falls from there.
#[test]
fn a_leader_that_crashes_while_the_cluster_rests_is_found_from_the_next_tick_on() {
    let stride = 16;
    let mut c = resting_cluster(3, |_| stride);
    let config = common::config(NodeId(0), 3);
    let period = period_us() * 1_000;
    let first_tick = next_tick(&mut c, 1).max(next_tick(&mut c, 2));
    assert!(first_tick <= c.now + u64::from(stride) * period);
    c.crash(0);
    let misses = u64::from(config.score_max - config.score_fail_below) + 1;
    let failed = |c: &Cluster, i: usize| !replica(c, i).detector().is_live(NodeId(0));
    c.run_until(64 * u64::from(stride) * period_us(), "both survivors hold the leader failed", |c| {
        (1..3).all(|i| failed(c, i))
    });
    assert!(
        c.now <= first_tick + (misses + 1) * period,
        "held failed {} periods after the first tick",
        (c.now - first_tick) / period
    );
    let leader = c.settled_leader();
    c.commit_sequentially(leader, 10, 3);
}

/// A leader that stops (its memory still readable, its counter unchanged) just before its
/// resting tick: each survivor finds the increment late at its next tick and hurries, but
/// counts the silence only after the rest's grace (`idle_stride / 8` periods, 4 here), and
/// then holds the leader failed as fast as in a busy cluster. A resting leader whose tick
/// comes a little late, which on a small or virtual machine is common, is not taken for failed.
#[test]
fn a_leader_that_stops_while_the_cluster_rests_is_found_after_the_grace() {
    let stride = 32;
    let grace = u64::from(stride / 8);
    let mut c = resting_cluster(3, |_| stride);
    let config = common::config(NodeId(0), 3);
    let period = period_us() * 1_000;
    let due = next_tick(&mut c, 0);
    c.run_until(64 * u64::from(stride) * period_us(), "just before the leader's tick", |c| c.now + 1_000 >= due);
    c.paused[0] = true;
    let misses = u64::from(config.score_max - config.score_fail_below) + 1;
    let failed = |c: &Cluster, i: usize| !replica(c, i).detector().is_live(NodeId(0));
    c.run_until(64 * u64::from(stride) * period_us(), "both survivors hold the leader failed", |c| {
        (1..3).all(|i| failed(c, i))
    });
    let after = (c.now - due) / period;
    assert!(after >= grace + misses - 1, "held failed {after} periods after the leader's missed tick: no grace");
    assert!(after <= u64::from(stride) + grace + misses + 1, "held failed {after} periods after its missed tick");
    c.crash(0);
    let leader = c.settled_leader();
    c.commit_sequentially(leader, 10, 3);
}

/// A leader that crashes while its survivors rest out of phase: the successor finds it failed
/// and asks for permissions while the other survivor, which has not read the leader since the
/// crash, rests for about 47 more periods (the permission timeout is 15). The survivor serves
/// the request at its next tick, and the successor, which read its stride, waits that long
/// instead of giving up and asking again: it asks once.
#[test]
fn a_successor_waits_for_a_resting_peer_to_serve_its_request() {
    let mut c = resting_cluster(3, |_| 64);
    let period = period_us() * 1_000;
    // Replica 2 skips a tick and comes back 62 periods late: out of phase with replica 1.
    let due = next_tick(&mut c, 2);
    c.paused[2] = true;
    c.run_until(128 * period_us(), "replica 2's late tick", |c| c.now >= due + 62 * period);
    c.paused[2] = false;
    c.tick();
    let late = next_tick(&mut c, 2);
    // The leader crashes just before replica 1's next tick, long before replica 2's.
    let due = next_tick(&mut c, 1);
    c.run_until(64 * period_us(), "replica 1's next tick", |c| c.now + 1_000 >= due);
    assert!(late >= c.now + 40 * period, "replica 2 rests on: {} periods", (late - c.now) / period);
    c.crash(0);
    let at = layout::Layout::new(&common::config(NodeId(1), 3)).request_offset(NodeId(1));
    let mut requests = std::collections::BTreeSet::new();
    c.run_until(50_000, "replica 1 leads, its term's no-op committed", |c| {
        requests.extend(replica(c, 1).fabric().load_u64(layout::CONTROL, at).ok().filter(|&r| r != 0));
        leads_idle(c, 1)
    });
    assert_eq!(requests.len(), 1, "it asked once: {requests:?}");
    c.commit_sequentially(1, 10, 3);
}
