//! Fault injection and determinism of the simulated fabric (`microrep_fabric::sim`).
//!
//! Every test is deterministic: randomness comes from fixed seeds, time is simulated, and the
//! searches over seeds and steps are exhaustive within fixed bounds.

use microrep_fabric::sim::{QUEUE_DEPTH, SimConfig, SimEndpoint, SimFabric, SimWorld};
use microrep_fabric::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, OpError, OpKind, PostFlags, RegionId, RegionSpec,
    RemoteAddr, RemoteWrite, RevokePath,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const LOG: RegionId = RegionId(0);
const BG: RegionId = RegionId(1);
const RO: RegionId = RegionId(2);
const SCRATCH: RegionId = RegionId(3);

fn regions() -> [RegionSpec; 4] {
    [
        RegionSpec::new(LOG, 1024, RemoteWrite::Granted),
        RegionSpec::new(BG, 256, RemoteWrite::Always),
        RegionSpec::new(RO, 64, RemoteWrite::Never),
        RegionSpec::new(SCRATCH, 1024, RemoteWrite::Never),
    ]
}

fn node(world: &SimWorld, id: u16) -> SimFabric {
    world.add_node(NodeId(id), &regions()).expect("add node")
}

fn read_region(f: &SimFabric, region: RegionId) -> Vec<u8> {
    let mut buf = vec![0u8; usize::try_from(f.region_len(region).expect("region len")).expect("fits")];
    f.read_local(region, 0, &mut buf).expect("read local");
    buf
}

fn drain(ep: &mut SimEndpoint) -> Vec<Completion> {
    std::iter::from_fn(|| ep.poll_completion()).collect()
}

/// Steps the world one event at a time until idle, polling `ep` after each step; returns each
/// completion with the simulated time it was first seen.
fn run_collecting(world: &SimWorld, ep: &mut SimEndpoint) -> Vec<(u64, Completion)> {
    let mut out = Vec::new();
    loop {
        while let Some(c) = ep.poll_completion() {
            out.push((world.now(), c));
        }
        if !world.step() {
            return out;
        }
    }
}

/// A pattern that differs per write and per byte, so a mix of two writes is never mistaken for
/// either.
fn pattern(k: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (k.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8 + 1).collect()
}

/// What a randomized workload produced: its digest, all live memory, and all completions.
#[derive(Debug, PartialEq)]
struct Outcome {
    digest: u64,
    memory: Vec<Vec<u8>>,
    completions: Vec<Completion>,
    now: u64,
}

/// A random workload over 4 nodes with every fault enabled: writes, reads, grants, revokes,
/// reconnects, holds, a crash and a restart, interleaved with steps. The calls themselves are
/// drawn from `workload_seed`, the fabric's behaviour from `fabric_seed`.
fn random_workload(fabric_seed: u64, workload_seed: u64) -> Outcome {
    let config = SimConfig { fail_prob: 0.02, ..SimConfig::faulty() };
    let world = SimWorld::new(fabric_seed, config);
    let mut rng = ChaCha8Rng::seed_from_u64(workload_seed);
    let mut fabrics: Vec<SimFabric> = (0..4).map(|i| node(&world, i)).collect();
    let mut eps: Vec<SimEndpoint> = Vec::new();
    for a in 0..4u16 {
        for b in 0..4u16 {
            if a != b {
                eps.push(fabrics[usize::from(a)].connect(NodeId(b)).expect("connect"));
            }
        }
    }
    let mut completions = Vec::new();
    for i in 0..3000u64 {
        let e = rng.random_range(0..eps.len());
        let target = eps[e].peer();
        match rng.random_range(0..100) {
            0..=39 => {
                let region = if rng.random_bool(0.7) { LOG } else { BG };
                let len = rng.random_range(1..=48usize);
                let max_off = if region == LOG { 1024 - 48 } else { 256 - 48 };
                let off = rng.random_range(0..=max_off);
                let flags = if rng.random_bool(0.5) { PostFlags::SIGNALED } else { PostFlags::NONE };
                let _ = eps[e].post_write(i, RemoteAddr::new(region, off), &pattern(i, len), flags);
            }
            40..=54 => {
                let off = rng.random_range(0..=(1024 - 64));
                let _ = eps[e].post_read(i, RemoteAddr::new(LOG, off), 64, SCRATCH, off, PostFlags::SIGNALED);
            }
            55..=64 => {
                let writer = NodeId(rng.random_range(0..4));
                let _ = fabrics[usize::from(target.0)].grant_write(LOG, writer);
            }
            65..=69 => {
                let writer = NodeId(rng.random_range(0..4));
                let _ = fabrics[usize::from(target.0)].revoke_write(LOG, writer);
            }
            70..=74 => {
                if eps[e].state() == EndpointState::Error {
                    let _ = eps[e].reconnect();
                }
            }
            75..=76 => world.hold_outgoing(NodeId(rng.random_range(0..4))),
            77..=79 => world.release_outgoing(NodeId(rng.random_range(0..4))),
            _ => {
                for _ in 0..rng.random_range(1..20) {
                    world.step();
                }
            }
        }
        if i == 1500 {
            world.crash(NodeId(3));
        }
        if i == 2000 {
            fabrics[3] = world.restart(NodeId(3), &regions()).expect("restart");
        }
        for ep in &mut eps {
            completions.extend(drain(ep));
        }
    }
    for n in 0..4 {
        world.release_outgoing(NodeId(n));
    }
    world.run_until_idle();
    for ep in &mut eps {
        completions.extend(drain(ep));
    }
    let memory =
        fabrics.iter().flat_map(|f| [read_region(f, LOG), read_region(f, BG), read_region(f, SCRATCH)]).collect();
    Outcome { digest: world.trace_digest(), memory, completions, now: world.now() }
}

#[test]
fn same_seed_gives_the_same_run_and_other_seeds_differ() {
    let a = random_workload(11, 5);
    let b = random_workload(11, 5);
    assert_eq!(a, b, "same seeds must replay bit for bit");
    // The workload must actually have exercised the fabric, with every kind of outcome.
    assert!(a.completions.iter().any(|c| c.status.is_ok() && c.kind == OpKind::Read));
    for err in [OpError::PermissionDenied, OpError::Transport, OpError::Flushed, OpError::PeerUnreachable] {
        assert!(a.completions.iter().any(|c| c.status == Err(err)), "workload never produced {err:?}");
    }
    assert!(a.memory.iter().any(|m| m.iter().any(|&b| b != 0)));

    let c = random_workload(12, 5);
    assert_ne!(a.digest, c.digest, "another fabric seed must give another run");
    assert_ne!(a.memory, c.memory);
}

/// One 64-byte torn write over zeroes, observed after every event; returns whether a partial
/// state was seen and whether one of them was not a prefix/suffix pattern of a left-to-right
/// copy (a later byte landed before an earlier one).
fn observe_torn_write(seed: u64) -> (bool, bool) {
    let config = SimConfig { torn_write_prob: 1.0, ..SimConfig::reliable() };
    let world = SimWorld::new(seed, config);
    let target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    let data = [0xABu8; 64];
    ep.post_write(1, RemoteAddr::new(BG, 64), &data, PostFlags::SIGNALED).expect("post");
    let (mut partial, mut out_of_order) = (false, false);
    while world.step() {
        let mut buf = [0u8; 64];
        target.read_local(BG, 64, &mut buf).expect("read");
        let landed: Vec<bool> = buf.iter().map(|&b| b == 0xAB).collect();
        assert!(buf.iter().all(|&b| b == 0 || b == 0xAB), "bytes other than old or new");
        if landed.iter().any(|&l| l) && !landed.iter().all(|&l| l) {
            partial = true;
            // Landed bytes after a missing one: not a simple in-order copy.
            let first_missing = landed.iter().position(|&l| !l).unwrap_or(64);
            if landed[first_missing..].iter().any(|&l| l) {
                out_of_order = true;
            }
        }
    }
    assert_eq!(drain(&mut ep), vec![Completion { wr_id: 1, kind: OpKind::Write, status: Ok(()) }]);
    let mut buf = [0u8; 64];
    target.read_local(BG, 64, &mut buf).expect("read");
    assert_eq!(buf, data, "a torn write must end up whole");
    (partial, out_of_order)
}

#[test]
fn torn_writes_are_observed_partially_applied_in_any_order() {
    let results: Vec<(bool, bool)> = (0..32).map(observe_torn_write).collect();
    assert!(results.iter().all(|&(partial, _)| partial), "with torn_write_prob 1 every write is seen torn");
    assert!(results.iter().any(|&(_, ooo)| ooo), "pieces never landed out of order");
}

#[test]
fn a_remote_read_can_observe_a_torn_write() {
    // A READ from a third node, posted at each possible moment, must sometimes copy a mix.
    let mut seen_mix = false;
    'search: for seed in 0..64 {
        for delay_steps in 0..6 {
            let config = SimConfig { torn_write_prob: 1.0, ..SimConfig::faulty() };
            let config = SimConfig { fail_prob: 0.0, delay_prob: 0.0, ..config };
            let world = SimWorld::new(seed, config);
            let _target = node(&world, 0);
            let writer = node(&world, 1);
            let reader = node(&world, 2);
            let mut wep = writer.connect(NodeId(0)).expect("connect");
            let mut rep = reader.connect(NodeId(0)).expect("connect");
            wep.post_write(1, RemoteAddr::new(BG, 0), &[0x5Au8; 32], PostFlags::SIGNALED).expect("post");
            for _ in 0..delay_steps {
                world.step();
            }
            rep.post_read(2, RemoteAddr::new(BG, 0), 32, SCRATCH, 0, PostFlags::SIGNALED).expect("post");
            world.run_until_idle();
            assert_eq!(drain(&mut rep).len(), 1);
            let copied = &read_region(&reader, SCRATCH)[..32];
            assert!(copied.iter().all(|&b| b == 0 || b == 0x5A));
            if copied.contains(&0) && copied.contains(&0x5A) {
                seen_mix = true;
                break 'search;
            }
        }
    }
    assert!(seen_mix, "no READ ever observed a partially applied write");
}

/// One race of a writer streaming whole-slot writes against a revocation at a random moment.
/// Returns whether the revocation caught a torn write in flight.
fn revoke_race(seed: u64) -> bool {
    const SLOT: usize = 96;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED);
    let config = SimConfig {
        torn_write_prob: 0.8,
        fail_prob: 0.0,
        latency_min_ns: 10,
        latency_max_ns: 2_000,
        ..SimConfig::faulty()
    };
    let world = SimWorld::new(seed, config);
    let target = node(&world, 0);
    let writer = node(&world, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    let writes = rng.random_range(1..12u64);
    for k in 1..=writes {
        ep.post_write(k, RemoteAddr::new(LOG, 128), &pattern(k, SLOT), PostFlags::SIGNALED).expect("post");
    }
    for _ in 0..rng.random_range(0..40) {
        world.step();
    }
    let torn_in_flight = {
        let slot = &read_region(&target, LOG)[128..128 + SLOT];
        !(slot.iter().all(|&b| b == 0) || (1..=writes).any(|k| slot == pattern(k, SLOT).as_slice()))
    };
    assert_eq!(target.revoke_write(LOG, NodeId(1)), Ok(RevokePath::Fast));
    let frozen = read_region(&target, LOG);
    // From here on nothing the writer does may change the region: check after every event.
    let mut more = writes;
    loop {
        assert_eq!(read_region(&target, LOG), frozen, "seed {seed}: a write landed after revoke returned");
        if rng.random_bool(0.1) {
            more += 1;
            let _ = ep.post_write(more, RemoteAddr::new(LOG, 0), &pattern(more, SLOT), PostFlags::SIGNALED);
        }
        if !world.step() {
            break;
        }
    }
    let completions = drain(&mut ep);
    assert_eq!(completions.len() as u64, more, "every write completes (signaled or failed)");
    let ok: Vec<u64> = completions.iter().filter(|c| c.status.is_ok()).map(|c| c.wr_id).collect();
    // Successes are a prefix of the posts, then the first failure is a permission error and the
    // rest are flushed.
    assert!(ok.iter().copied().eq(1..=ok.len() as u64), "seed {seed}: successes {ok:?} are not a prefix");
    let failures: Vec<_> = completions.iter().filter_map(|c| c.status.err()).collect();
    if let Some((first, rest)) = failures.split_first() {
        assert_eq!(*first, OpError::PermissionDenied, "seed {seed}");
        assert!(rest.iter().all(|e| *e == OpError::Flushed), "seed {seed}: {rest:?}");
    }
    // The slot holds the last successful write, whole.
    let slot = &frozen[128..128 + SLOT];
    match ok.last() {
        Some(&k) => assert_eq!(slot, pattern(k, SLOT).as_slice(), "seed {seed}: last successful write not whole"),
        None => assert!(slot.iter().all(|&b| b == 0), "seed {seed}: a failed write left bytes"),
    }
    assert_eq!(ep.state(), if failures.is_empty() { EndpointState::Ready } else { EndpointState::Error });
    torn_in_flight
}

#[test]
fn revoke_finishes_torn_writes_and_blocks_later_ones() {
    let caught_mid_write = (0..3000).filter(|&seed| revoke_race(seed)).count();
    assert!(caught_mid_write > 50, "only {caught_mid_write} races caught a torn write in flight");
}

#[test]
fn held_writer_fails_after_revoke_and_release() {
    let world = SimWorld::new(3, SimConfig::faulty());
    let target = node(&world, 0);
    let writer = node(&world, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    world.hold_outgoing(NodeId(1));
    ep.post_write(1, RemoteAddr::new(LOG, 0), &[7u8; 64], PostFlags::SIGNALED).expect("post");
    ep.post_write(2, RemoteAddr::new(LOG, 64), &[8u8; 64], PostFlags::NONE).expect("post");
    // A paused writer does not make progress, and the world goes idle instead of spinning.
    world.run_until_idle();
    assert_eq!(world.pending_ops(), 2);
    assert!(ep.poll_completion().is_none());
    assert_eq!(target.revoke_write(LOG, NodeId(1)), Ok(RevokePath::Fast));
    world.release_outgoing(NodeId(1));
    world.run_until_idle();
    assert_eq!(
        drain(&mut ep),
        vec![
            Completion { wr_id: 1, kind: OpKind::Write, status: Err(OpError::PermissionDenied) },
            Completion { wr_id: 2, kind: OpKind::Write, status: Err(OpError::Flushed) },
        ]
    );
    assert!(read_region(&target, LOG).iter().all(|&b| b == 0), "a revoked write landed");
    assert_eq!(ep.state(), EndpointState::Error);
    assert_eq!(world.pending_ops(), 0);
}

#[test]
fn hold_after_scheduling_still_waits() {
    // The op is already on its way (its start event is queued) when the node is held.
    let world = SimWorld::new(1, SimConfig::reliable());
    let target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    ep.post_write(1, RemoteAddr::new(BG, 0), &[1u8; 8], PostFlags::SIGNALED).expect("post");
    world.hold_outgoing(NodeId(1));
    world.run_until_idle();
    assert_eq!(target.load_u64(BG, 0), Ok(0));
    world.release_outgoing(NodeId(1));
    world.run_until_idle();
    assert_eq!(target.load_u64(BG, 0), Ok(u64::from_le_bytes([1u8; 8])));
    assert_eq!(drain(&mut ep).len(), 1);
}

#[test]
fn crash_gives_peer_unreachable_within_the_timeout() {
    for seed in 0..50 {
        let config = SimConfig { fail_prob: 0.0, ..SimConfig::faulty() };
        let timeout = config.peer_timeout_ns;
        let world = SimWorld::new(seed, config);
        let victim = node(&world, 0);
        let writer = node(&world, 1);
        victim.grant_write(LOG, NodeId(1)).expect("grant");
        let mut ep = writer.connect(NodeId(0)).expect("connect");
        for k in 0..20 {
            ep.post_write(k, RemoteAddr::new(LOG, 8 * k), &[9u8; 8], PostFlags::SIGNALED).expect("post");
        }
        for _ in 0..(seed % 15) {
            world.step();
        }
        let crashed_at = world.now();
        world.crash(NodeId(0));
        assert!(world.is_crashed(NodeId(0)));
        // Posts to a crashed peer are accepted and fail by completion.
        ep.post_write(100, RemoteAddr::new(LOG, 0), &[1u8; 8], PostFlags::SIGNALED).expect("post after crash");
        let got = run_collecting(&world, &mut ep);
        assert_eq!(got.len(), 21, "seed {seed}: every op completes");
        let wr_ids: Vec<u64> = got.iter().map(|(_, c)| c.wr_id).collect();
        assert!(wr_ids.windows(2).all(|w| w[0] < w[1]), "completions out of post order");
        let first_err = got.iter().position(|(_, c)| c.status.is_err()).expect("some op failed");
        assert_eq!(got[first_err].1.status, Err(OpError::PeerUnreachable), "seed {seed}");
        assert!(got[first_err..].iter().skip(1).all(|(_, c)| c.status == Err(OpError::Flushed)));
        for (at, c) in &got[first_err..] {
            assert!(*at <= crashed_at + timeout, "seed {seed}: {c:?} at {at}, crash at {crashed_at}");
        }
        assert_eq!(world.pending_ops(), 0);
        assert!(matches!(writer.connect(NodeId(0)), Err(FabricError::PeerUnreachable(NodeId(0), _))));
        assert!(matches!(ep.reconnect(), Err(FabricError::PeerUnreachable(NodeId(0), _))));
        // The crashed node's own handle is dead.
        let dead = FabricError::PeerUnreachable(NodeId(0), "this node crashed".to_owned());
        assert_eq!(victim.load_u64(LOG, 0), Err(dead.clone()));
        assert_eq!(victim.grant_write(LOG, NodeId(1)), Err(dead));
    }
}

#[test]
fn crashed_writer_ops_vanish_and_its_endpoints_are_dead() {
    let world = SimWorld::new(9, SimConfig::reliable());
    let target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    ep.post_write(1, RemoteAddr::new(BG, 0), &[3u8; 16], PostFlags::SIGNALED).expect("post");
    world.crash(NodeId(1));
    world.run_until_idle();
    assert!(read_region(&target, BG).iter().all(|&b| b == 0), "a crashed node's queued op landed");
    assert!(ep.poll_completion().is_none());
    assert_eq!(ep.state(), EndpointState::Error);
    let err = ep.post_write(2, RemoteAddr::new(BG, 0), &[3u8; 16], PostFlags::SIGNALED);
    assert_eq!(err, Err(FabricError::PeerUnreachable(NodeId(1), "this node crashed".to_owned())));
    assert_eq!(world.pending_ops(), 0);
}

#[test]
fn restart_gives_zeroed_memory_and_no_grants() {
    let world = SimWorld::new(4, SimConfig::reliable());
    let first = node(&world, 0);
    let writer = node(&world, 1);
    first.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    ep.post_write(1, RemoteAddr::new(LOG, 0), &[5u8; 64], PostFlags::SIGNALED).expect("post");
    first.store_u64(BG, 8, 77).expect("store");
    world.run_until_idle();
    assert_eq!(drain(&mut ep).len(), 1);
    assert_eq!(first.load_u64(LOG, 0), Ok(u64::from_le_bytes([5; 8])));

    assert!(matches!(world.restart(NodeId(0), &regions()), Err(FabricError::AlreadyRunning { .. })));
    world.crash(NodeId(0));
    let second = world.restart(NodeId(0), &regions()).expect("restart");
    assert!(!world.is_crashed(NodeId(0)));
    assert_eq!(second.incarnation(), first.incarnation() + 1);
    assert!(read_region(&second, LOG).iter().all(|&b| b == 0));
    assert!(read_region(&second, BG).iter().all(|&b| b == 0));
    assert!(first.load_u64(BG, 8).is_err(), "the old incarnation's handle must stay dead");

    // The old endpoint still points at the dead incarnation.
    ep.post_write(2, RemoteAddr::new(BG, 0), &[6u8; 8], PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut ep)[0].status, Err(OpError::PeerUnreachable));
    assert_eq!(second.load_u64(BG, 0), Ok(0));
    // Reconnected, it reaches the new incarnation, which has not granted the log.
    ep.reconnect().expect("reconnect");
    ep.post_write(3, RemoteAddr::new(LOG, 0), &[6u8; 8], PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut ep)[0].status, Err(OpError::PermissionDenied));
    ep.reconnect().expect("reconnect");
    ep.post_write(4, RemoteAddr::new(BG, 0), &[6u8; 8], PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut ep)[0].status, Ok(()));
    assert_eq!(second.load_u64(BG, 0), Ok(u64::from_le_bytes([6; 8])));
}

/// What real RDMA does when a host dies and comes back: its old queue pairs are gone, so
/// writes posted to the old life, whether not yet arrived or torn half-way, never land in the
/// restarted node's fresh memory; they fail, and only a reconnected endpoint reaches it.
#[test]
fn writes_in_flight_to_a_crashed_node_never_land_in_its_restarted_memory() {
    let torn_always = SimConfig { torn_write_prob: 1.0, ..SimConfig::reliable() };
    let world = SimWorld::new(6, torn_always);
    let first = node(&world, 0);
    let writer = node(&world, 1);
    first.grant_write(LOG, NodeId(1)).expect("grant");
    let mut torn = writer.connect(NodeId(0)).expect("connect");
    let mut queued = writer.connect(NodeId(0)).expect("connect");
    torn.post_write(1, RemoteAddr::new(LOG, 0), &[7u8; 64], PostFlags::SIGNALED).expect("post");
    // Step until the torn write's first piece has landed, and only that.
    let mut steps = 0;
    while read_region(&first, LOG).iter().all(|&b| b == 0) {
        assert!(world.step(), "the write never started");
        steps += 1;
        assert!(steps < 100, "no piece landed within 100 events");
    }
    assert!(read_region(&first, LOG).contains(&0), "a torn write lands in at least two pieces");
    queued.post_write(2, RemoteAddr::new(BG, 0), &[8u8; 16], PostFlags::SIGNALED).expect("post");

    world.crash(NodeId(0));
    let second = world.restart(NodeId(0), &regions()).expect("restart");
    second.grant_write(LOG, NodeId(1)).expect("the new life grants the log too");
    world.run_until_idle();
    assert!(read_region(&second, LOG).iter().all(|&b| b == 0), "the rest of a torn write landed after a restart");
    assert!(read_region(&second, BG).iter().all(|&b| b == 0), "a write to the old life landed in the new one");
    assert_eq!(drain(&mut torn)[0].status, Err(OpError::PeerUnreachable));
    assert_eq!(drain(&mut queued)[0].status, Err(OpError::PeerUnreachable));

    torn.reconnect().expect("reconnect to the new life");
    torn.post_write(3, RemoteAddr::new(LOG, 0), &[9u8; 8], PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut torn)[0].status, Ok(()));
    assert_eq!(second.load_u64(LOG, 0), Ok(u64::from_le_bytes([9; 8])));
}

#[test]
fn transport_failures_flush_until_reconnect() {
    let always_fail = SimConfig { fail_prob: 1.0, ..SimConfig::reliable() };
    let world = SimWorld::new(5, always_fail);
    let target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    for k in 0..3 {
        // Unsignaled: errors are reported anyway.
        ep.post_write(k, RemoteAddr::new(BG, 8 * k), &[1u8; 8], PostFlags::NONE).expect("post");
    }
    world.run_until_idle();
    let statuses: Vec<_> = drain(&mut ep).into_iter().map(|c| c.status).collect();
    assert_eq!(statuses, [Err(OpError::Transport), Err(OpError::Flushed), Err(OpError::Flushed)]);
    assert_eq!(ep.state(), EndpointState::Error);
    // Still in error after the failure: new posts are flushed too, even with faults switched off.
    world.set_config(SimConfig::reliable());
    ep.post_read(9, RemoteAddr::new(BG, 0), 8, SCRATCH, 0, PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut ep)[0].status, Err(OpError::Flushed));
    assert!(read_region(&target, BG).iter().all(|&b| b == 0), "a failed or flushed write landed");

    ep.reconnect().expect("reconnect");
    assert_eq!(ep.state(), EndpointState::Ready);
    ep.post_write(10, RemoteAddr::new(BG, 0), &[2u8; 8], PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut ep), vec![Completion { wr_id: 10, kind: OpKind::Write, status: Ok(()) }]);
    assert_eq!(target.load_u64(BG, 0), Ok(u64::from_le_bytes([2; 8])));
}

#[test]
fn random_transport_failures_follow_the_error_rules() {
    for seed in 0..40 {
        let config = SimConfig { fail_prob: 0.1, ..SimConfig::faulty() };
        let world = SimWorld::new(seed, config);
        let target = node(&world, 0);
        let writer = node(&world, 1);
        let mut ep = writer.connect(NodeId(0)).expect("connect");
        let mut errors = 0;
        for round in 0..20u64 {
            for k in 0..10 {
                let wr_id = round * 10 + k;
                ep.post_write(wr_id, RemoteAddr::new(BG, 8 * k), &wr_id.to_le_bytes(), PostFlags::SIGNALED)
                    .expect("post");
            }
            world.run_until_idle();
            let got = drain(&mut ep);
            assert_eq!(got.len(), 10);
            // Within a round: successes, then at most one real error, then only flushes; and each
            // success is visible in memory.
            let first_err = got.iter().position(|c| c.status.is_err()).unwrap_or(got.len());
            for c in &got[..first_err] {
                assert_eq!(target.load_u64(BG, 8 * (c.wr_id % 10)), Ok(c.wr_id));
            }
            if first_err < got.len() {
                errors += 1;
                assert_eq!(got[first_err].status, Err(OpError::Transport));
                assert!(got[first_err + 1..].iter().all(|c| c.status == Err(OpError::Flushed)));
                assert_eq!(ep.state(), EndpointState::Error);
                ep.reconnect().expect("reconnect");
            }
        }
        assert!(errors > 0, "seed {seed}: fail_prob 0.1 never failed in 200 ops");
    }
}

#[test]
fn fifo_holds_under_random_latencies() {
    for seed in 0..20 {
        let config = SimConfig {
            latency_min_ns: 1,
            latency_max_ns: 100_000,
            delay_prob: 0.2,
            delay_max_ns: 1_000_000,
            fail_prob: 0.0,
            torn_write_prob: 0.5,
            peer_timeout_ns: 1_000_000,
            preempt_prob: 0.0,
            preempt_max_ns: 0,
            instant_prob: 0.0,
            lend_peer_memory: false,
        };
        let world = SimWorld::new(seed, config);
        let target = node(&world, 0);
        let writer = node(&world, 1);
        let mut eps: Vec<SimEndpoint> = (0..3).map(|_| writer.connect(NodeId(0))).collect::<Result<_, _>>().expect("c");
        // Three endpoints each write a growing counter to their own word; interleave steps.
        for v in 1..=200u64 {
            for (i, ep) in eps.iter_mut().enumerate() {
                ep.post_write(v, RemoteAddr::new(BG, 8 * i as u64), &v.to_le_bytes(), PostFlags::SIGNALED).expect("p");
            }
            if v % 7 == 0 {
                world.step();
            }
        }
        world.run_until_idle();
        for (i, ep) in eps.iter_mut().enumerate() {
            let ids: Vec<u64> = drain(ep).iter().map(|c| c.wr_id).collect();
            assert!(ids.iter().copied().eq(1..=200), "seed {seed}: completions out of post order");
            assert_eq!(target.load_u64(BG, 8 * i as u64), Ok(200), "seed {seed}: last write did not win");
        }
    }
}

#[test]
fn queue_depth_is_bounded() {
    let world = SimWorld::new(1, SimConfig::reliable());
    let _target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    for k in 0..QUEUE_DEPTH as u64 {
        ep.post_write(k, RemoteAddr::new(BG, 0), &[1u8; 8], PostFlags::NONE).expect("post");
    }
    let full = ep.post_write(9999, RemoteAddr::new(BG, 0), &[1u8; 8], PostFlags::NONE);
    assert_eq!(full, Err(FabricError::QueueFull { peer: NodeId(0), depth: QUEUE_DEPTH }));
    world.run_until_idle();
    assert!(ep.poll_completion().is_none(), "unsignaled successes must not be reported");
    ep.post_write(1, RemoteAddr::new(BG, 0), &[1u8; 8], PostFlags::NONE).expect("room again");
}

#[test]
fn policies_and_bad_arguments() {
    let world = SimWorld::new(2, SimConfig::reliable());
    let target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    let mut post = |wr_id, region| {
        ep.post_write(wr_id, RemoteAddr::new(region, 0), &[1u8; 8], PostFlags::SIGNALED).expect("post");
        world.run_until_idle();
        let status = ep.poll_completion().expect("completion").status;
        if status.is_err() {
            ep.reconnect().expect("reconnect");
        }
        status
    };
    assert_eq!(post(1, RO), Err(OpError::PermissionDenied));
    assert_eq!(post(2, LOG), Err(OpError::PermissionDenied));
    assert_eq!(post(3, BG), Ok(()));
    target.grant_write(LOG, NodeId(1)).expect("grant");
    assert_eq!(post(4, LOG), Ok(()));
    assert_eq!(target.revoke_write(LOG, NodeId(1)), Ok(RevokePath::Fast));
    assert_eq!(post(5, LOG), Err(OpError::PermissionDenied));
    assert_eq!(target.grant_write(BG, NodeId(1)), Err(FabricError::NotGrantable { region: BG }));
    assert_eq!(target.revoke_write(RO, NodeId(1)), Err(FabricError::NotGrantable { region: RO }));
    assert!(matches!(target.grant_write(LOG, NodeId(0)), Err(FabricError::InvalidPeer { .. })));
    assert!(matches!(target.grant_write(RegionId(9), NodeId(1)), Err(FabricError::UnknownRegion { .. })));

    let mut ep = writer.connect(NodeId(0)).expect("connect");
    let unknown = ep.post_write(1, RemoteAddr::new(RegionId(9), 0), &[1], PostFlags::NONE);
    assert_eq!(unknown, Err(FabricError::UnknownRegion { node: NodeId(0), region: RegionId(9) }));
    assert!(matches!(
        ep.post_write(1, RemoteAddr::new(RO, 60), &[1u8; 8], PostFlags::NONE),
        Err(FabricError::OutOfBounds { .. })
    ));
    let local_oob = ep.post_read(1, RemoteAddr::new(RO, 0), 64, SCRATCH, 1000, PostFlags::NONE);
    assert!(matches!(local_oob, Err(FabricError::OutOfBounds { node: NodeId(1), .. })));
    assert_eq!(world.pending_ops(), 0, "rejected posts must not be queued");
    assert!(matches!(writer.connect(NodeId(7)), Err(FabricError::PeerUnreachable(NodeId(7), _))));
    assert!(matches!(writer.connect(NodeId(1)), Err(FabricError::InvalidPeer { .. })));
    assert!(matches!(target.load_u64(BG, 4), Err(FabricError::Misaligned { .. })));
    assert!(matches!(world.add_node(NodeId(5), &[regions()[0], regions()[0]]), Err(FabricError::InvalidLayout(_))));
}

#[test]
fn reads_copy_remote_memory_even_from_never_regions() {
    let world = SimWorld::new(8, SimConfig::faulty_free());
    let target = node(&world, 0);
    let reader = node(&world, 1);
    target.write_local(RO, 8, b"readonly").expect("write local");
    let mut ep = reader.connect(NodeId(0)).expect("connect");
    ep.post_read(1, RemoteAddr::new(RO, 8), 8, SCRATCH, 100, PostFlags::NONE).expect("post");
    world.run_until_idle();
    assert!(ep.poll_completion().is_none());
    assert_eq!(&read_region(&reader, SCRATCH)[100..108], b"readonly");
}

#[test]
fn advance_to_moves_time_and_runs_due_events_only() {
    let world = SimWorld::new(1, SimConfig::reliable());
    let target = node(&world, 0);
    let writer = node(&world, 1);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    ep.post_write(1, RemoteAddr::new(BG, 0), &[4u8; 8], PostFlags::SIGNALED).expect("post");
    // Reliable: it lands at 1000 ns and completes at 2000 ns.
    world.advance_to(999);
    assert_eq!((world.now(), target.load_u64(BG, 0)), (999, Ok(0)));
    world.advance_to(1000);
    assert_eq!(target.load_u64(BG, 0), Ok(u64::from_le_bytes([4; 8])));
    assert!(ep.poll_completion().is_none());
    world.advance_to(2000);
    assert!(ep.poll_completion().is_some());
    world.advance_to(500);
    assert_eq!(world.now(), 2000, "time never goes back");
    world.advance_to(10_000);
    assert_eq!(world.now(), 10_000);
    assert!(!world.step());
}

#[test]
#[should_panic(expected = "invalid SimConfig")]
fn invalid_config_panics() {
    let _ = SimWorld::new(0, SimConfig { torn_write_prob: 2.0, ..SimConfig::reliable() });
}

trait FaultFree {
    fn faulty_free() -> Self;
}

impl FaultFree for SimConfig {
    /// The faulty timings without any fault, to show timing alone changes nothing.
    fn faulty_free() -> Self {
        SimConfig { delay_prob: 0.0, fail_prob: 0.0, torn_write_prob: 0.0, ..SimConfig::faulty() }
    }
}

#[test]
fn a_held_link_stops_one_direction_only_until_released() {
    let world = SimWorld::new(3, SimConfig::reliable());
    let (a, b) = (node(&world, 0), node(&world, 1));
    a.grant_write(LOG, NodeId(1)).expect("grant");
    b.grant_write(LOG, NodeId(0)).expect("grant");
    let (mut a_to_b, mut b_to_a) = (a.connect(NodeId(1)).expect("connect"), b.connect(NodeId(0)).expect("connect"));
    world.hold_link(NodeId(0), NodeId(1));
    a_to_b.post_write(1, RemoteAddr::new(LOG, 0), &[7u8; 16], PostFlags::SIGNALED).expect("post");
    b_to_a.post_write(2, RemoteAddr::new(LOG, 0), &[9u8; 16], PostFlags::SIGNALED).expect("post");
    world.run_until_idle();
    assert_eq!(drain(&mut b_to_a), vec![Completion { wr_id: 2, kind: OpKind::Write, status: Ok(()) }]);
    assert_eq!(read_region(&a, LOG)[..16], [9u8; 16], "the other direction is untouched");
    assert!(drain(&mut a_to_b).is_empty() && world.pending_ops() == 1, "the held direction waits");
    assert!(read_region(&b, LOG).iter().all(|&x| x == 0));
    world.release_link(NodeId(0), NodeId(1));
    world.run_until_idle();
    assert_eq!(drain(&mut a_to_b), vec![Completion { wr_id: 1, kind: OpKind::Write, status: Ok(()) }]);
    assert_eq!(read_region(&b, LOG)[..16], [7u8; 16]);
}
