//! Unit tests of the simulator's internals; the behaviour seen through the public API is tested
//! in `tests/sim_faults.rs`.

use super::engine::World;
use super::state::Phase;
use super::{SimConfig, SimWorld};
use crate::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

const R: RegionId = RegionId(0);

fn spec() -> [RegionSpec; 1] {
    [RegionSpec::new(R, 512, RemoteWrite::Always)]
}

#[test]
fn torn_pieces_partition_the_write() {
    let mut w = World::new(1, SimConfig { torn_write_prob: 1.0, ..SimConfig::reliable() });
    for offset in 0..16u64 {
        for len in 9..80 {
            for _ in 0..20 {
                let mut pieces = w.draw_pieces(len, offset).expect("always torn");
                assert!((2..=4).contains(&pieces.len()), "{} pieces for {len} bytes", pieces.len());
                pieces.sort_by_key(|p| p.start);
                assert_eq!(pieces[0].start, 0);
                assert_eq!(pieces[pieces.len() - 1].end, len);
                assert!(pieces.windows(2).all(|p| p[0].end == p[1].start), "gaps or overlaps: {pieces:?}");
                assert!(pieces.iter().all(|p| !p.is_empty()));
                for p in &pieces {
                    assert!(p.start == 0 || (offset + p.start as u64).is_multiple_of(8), "cut inside a word: {p:?}");
                }
            }
        }
    }
    assert!(w.draw_pieces(8, 0).is_none(), "an aligned word never tears");
    assert!(w.draw_pieces(7, 1).is_none(), "a write inside one word cannot tear");
    assert!(w.draw_pieces(0, 0).is_none());
    assert!(w.draw_pieces(9, 0).is_some(), "a write spanning two words can");
}

/// Drives two writers and a reader at one target with every fault on, checking after each event
/// that only queue heads ever leave `Queued` (FIFO) and that outstanding counts add up.
#[test]
fn only_heads_are_in_flight_and_counts_add_up() {
    let world = SimWorld::new(3, SimConfig { fail_prob: 0.05, ..SimConfig::faulty() });
    let _target = world.add_node(NodeId(0), &spec()).expect("add");
    let mut eps = Vec::new();
    for id in 1..=3 {
        let f = world.add_node(NodeId(id), &spec()).expect("add");
        eps.push(f.connect(NodeId(0)).expect("connect"));
        eps.push(f.connect(NodeId(0)).expect("connect"));
    }
    let mut polled = 0usize;
    for round in 0..200u64 {
        for (i, ep) in eps.iter_mut().enumerate() {
            let off = 8 * (i as u64);
            if round % 3 == 0 {
                ep.post_read(round, RemoteAddr::new(R, off), 64, R, 256, PostFlags::SIGNALED).expect("post");
            } else {
                ep.post_write(round, RemoteAddr::new(R, off), &[round as u8; 40], PostFlags::SIGNALED).expect("post");
            }
            if ep.state() == crate::EndpointState::Error && round % 5 == 0 {
                ep.reconnect().expect("reconnect");
            }
        }
        for _ in 0..(round % 13) {
            world.step();
            world.with(|w| {
                for e in &w.eps {
                    assert!(e.queue.iter().skip(1).all(|op| op.phase == Phase::Queued), "a non-head op started");
                    assert!(e.outstanding >= e.queue.len());
                }
            });
        }
        for ep in &mut eps {
            polled += std::iter::from_fn(|| ep.poll_completion()).count();
        }
    }
    world.run_until_idle();
    for ep in &mut eps {
        polled += std::iter::from_fn(|| ep.poll_completion()).count();
    }
    // Every op was signaled, so every op produced exactly one completion.
    assert_eq!(polled, 200 * eps.len());
    assert_eq!(world.pending_ops(), 0);
}

#[test]
fn digest_sees_written_bytes() {
    let run = |byte: u8| {
        let world = SimWorld::new(1, SimConfig::reliable());
        let _t = world.add_node(NodeId(0), &spec()).expect("add");
        let f = world.add_node(NodeId(1), &spec()).expect("add");
        let mut ep = f.connect(NodeId(0)).expect("connect");
        ep.post_write(1, RemoteAddr::new(R, 0), &[1, 2, byte], PostFlags::NONE).expect("post");
        world.run_until_idle();
        world.trace_digest()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

#[test]
fn stale_events_after_revoke_do_nothing() {
    // A torn write finished by a revocation leaves its piece events behind; they must not apply
    // the pieces again or finish the next operation early.
    let config = SimConfig { torn_write_prob: 1.0, ..SimConfig::reliable() };
    let world = SimWorld::new(2, config);
    let t = world.add_node(NodeId(0), &[RegionSpec::new(R, 64, RemoteWrite::Granted)]).expect("add");
    let f = world.add_node(NodeId(1), &spec()).expect("add");
    t.grant_write(R, NodeId(1)).expect("grant");
    let mut ep = f.connect(NodeId(0)).expect("connect");
    ep.post_write(1, RemoteAddr::new(R, 0), &[9u8; 32], PostFlags::SIGNALED).expect("post");
    ep.post_write(2, RemoteAddr::new(R, 32), &[8u8; 32], PostFlags::SIGNALED).expect("post");
    while world.with(|w| !w.eps[0].queue.front().is_some_and(|op| matches!(op.phase, Phase::Applying { .. }))) {
        assert!(world.step(), "the first write never started");
    }
    t.revoke_write(R, NodeId(1)).expect("revoke");
    world.run_until_idle();
    let statuses: Vec<_> = std::iter::from_fn(|| ep.poll_completion()).map(|c| c.status).collect();
    assert_eq!(statuses, [Ok(()), Err(crate::OpError::PermissionDenied)]);
    let mut buf = [0u8; 64];
    t.read_local(R, 0, &mut buf).expect("read");
    assert_eq!(buf[..32], [9u8; 32]);
    assert_eq!(buf[32..], [0u8; 32]);
}

/// A preempted node's read sees a peer's write that landed while it was descheduled, without
/// the test moving time; without preemption the same read comes first.
#[test]
fn preemption_lets_writes_land_between_two_local_reads() {
    for (preempt_prob, landed) in [(0.0, false), (1.0, true)] {
        // Up to 1 ms of preemption against a 1 us flight: the draw of this seed covers it.
        let config = SimConfig { preempt_prob, preempt_max_ns: 1_000_000, ..SimConfig::reliable() };
        let world = SimWorld::new(5, config);
        let reader = world.add_node(NodeId(0), &spec()).expect("add");
        let writer = world.add_node(NodeId(1), &spec()).expect("add");
        let mut ep = writer.connect(NodeId(0)).expect("connect");
        ep.post_write(1, RemoteAddr::new(R, 0), &[7; 8], PostFlags::SIGNALED).expect("post");
        let mut word = [0u8; 8];
        reader.read_local(R, 0, &mut word).expect("read");
        assert_eq!(word == [7; 8], landed, "preempt_prob {preempt_prob}");
        assert_eq!(world.now() > 0, landed, "a preemption moves time on");
    }
}

/// An instant operation takes effect and completes within its post call, without time moving;
/// an ordinary one completes only once the world runs.
#[test]
fn instant_operations_complete_within_their_post() {
    for (instant_prob, instant) in [(0.0, false), (1.0, true)] {
        let world = SimWorld::new(9, SimConfig { instant_prob, ..SimConfig::reliable() });
        let target = world.add_node(NodeId(0), &spec()).expect("add");
        let writer = world.add_node(NodeId(1), &spec()).expect("add");
        let mut ep = writer.connect(NodeId(0)).expect("connect");
        ep.post_write(4, RemoteAddr::new(R, 8), &[7; 16], PostFlags::SIGNALED).expect("post");
        ep.post_read(5, RemoteAddr::new(R, 8), 8, R, 128, PostFlags::SIGNALED).expect("post");
        let mut landed = [0u8; 16];
        target.read_local(R, 8, &mut landed).expect("read");
        let mut read = [0u8; 8];
        writer.read_local(R, 128, &mut read).expect("read");
        let done: Vec<u64> = std::iter::from_fn(|| ep.poll_completion()).map(|c| c.wr_id).collect();
        assert_eq!((landed == [7; 16], read == [7; 8]), (instant, instant), "instant_prob {instant_prob}");
        assert_eq!(done, if instant { vec![4, 5] } else { vec![] }, "completions in order, at once");
        assert_eq!(world.now(), 0, "no time passes");
        world.run_until_idle();
        assert_eq!(target.load_u64(R, 8).expect("load"), u64::from_le_bytes([7; 8]));
    }
}
