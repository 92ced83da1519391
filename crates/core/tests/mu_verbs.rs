//! Three Mu replicas over the verbs fabric (one thread each, one process): a few thousand
//! proposals, with the leader killed halfway; the survivors elect a new leader, finish the
//! workload and agree on what they applied. Needs an RDMA device (scripts/verbs-test.sh runs it
//! on soft-RoCE in a VM); without one it prints why and passes, unless MICROREP_REQUIRE_RDMA=1.
#![cfg(feature = "verbs")]

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use microrep_core::mu::{self, Event, MuConfig, Replica, Role, StateMachine};
use microrep_fabric::NodeId;
use microrep_fabric::verbs::{PeerTable, VerbsConfig, VerbsFabric, skip_reason};

const REPLICAS: u16 = 3;
const PROPOSALS: u64 = 3000;

/// Counts commands and folds them into a CRC32C; remembers the digest after `PROPOSALS`.
#[derive(Debug, Default)]
struct Digest {
    commands: u64,
    crc: u32,
    at_target: Option<u32>,
}

impl StateMachine for Digest {
    fn apply(&mut self, _index: u64, command: &[u8]) {
        self.commands += 1;
        self.crc = microrep_fabric::checksum::crc32c_append(self.crc, command);
        if self.commands == PROPOSALS {
            self.at_target = Some(self.crc);
        }
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.commands.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    fn restore(&mut self, _index: u64, s: &[u8]) -> Result<(), mu::RestoreError> {
        let bytes: [u8; 12] =
            s.try_into().map_err(|_| mu::RestoreError::Length { got: s.len(), expected: "12 bytes" })?;
        let (commands, crc) = bytes.split_at(8);
        self.commands = u64::from_le_bytes(commands.try_into().expect("8 bytes"));
        self.crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        Ok(())
    }
}

/// What the test thread sees of a replica thread.
#[derive(Debug, Default)]
struct Shared {
    applied: AtomicU64,
    leader: AtomicBool,
    kill: AtomicBool,
    exited: AtomicBool,
    /// 0 while running; 1 done; 2 failed.
    outcome: AtomicU8,
    digest_at_target: Mutex<Option<u32>>,
}

/// Timeouts for replicas sharing two emulated cores with the software NIC: a 2 ms heartbeat,
/// rounds and permission waits in tens of milliseconds.
fn mu_config(node: NodeId) -> MuConfig {
    MuConfig {
        log_slots: 1024,
        snapshot_every: 256,
        heartbeat_period_ns: 2_000_000,
        fate_share_timeout_ns: 200_000_000,
        fate_share_cooldown_ns: 400_000_000,
        permission_timeout_ns: 20_000_000,
        round_timeout_ns: 100_000_000,
        recycle_period_ns: 2_000_000,
        lag_check_period_ns: 10_000_000,
        ..MuConfig::new(node, REPLICAS)
    }
}

fn run_replica(fabric: VerbsFabric, cfg: MuConfig, shared: &Shared, start: Instant) {
    let now = || start.elapsed().as_nanos() as u64;
    let node = cfg.node;
    let mut replica = Replica::new(fabric, cfg, now()).expect("replica");
    let (mut app, mut events) = (Digest::default(), Vec::new());
    let (mut in_flight, mut next_id) = (None::<u64>, 1u64);
    while !shared.kill.load(Ordering::Acquire) && shared.outcome.load(Ordering::Acquire) == 0 {
        replica.poll(now(), &mut app, &mut events);
        for e in events.drain(..) {
            if let Event::Committed { request_id, .. } | Event::Failed { request_id, .. } = e
                && in_flight == Some(request_id)
            {
                in_flight = None;
            }
        }
        let status = replica.status();
        shared.applied.store(app.commands, Ordering::Release);
        shared.leader.store(status.role == Role::Leader, Ordering::Release);
        if let Some(d) = app.at_target {
            *shared.digest_at_target.lock().expect("digest") = Some(d);
        }
        if status.role == Role::Leader && in_flight.is_none() && app.commands < PROPOSALS {
            // Request ids carry the replica id so a new leader never reuses one.
            let id = (u64::from(node.0) << 48) | next_id;
            if replica.propose(id, &app.commands.to_le_bytes()).is_ok() {
                in_flight = Some(id);
                next_id += 1;
            }
        }
        if status.role == Role::Follower {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
    }
    shared.exited.store(true, Ordering::Release);
    // Dropping the replica drops its fabric: its QPs and listener vanish, as in a crash.
}

/// Stops every replica thread when the test ends, also when an assertion fails.
struct StopAll<'a>(&'a [Arc<Shared>]);

impl Drop for StopAll<'_> {
    fn drop(&mut self) {
        for r in self.0 {
            let _ = r.outcome.compare_exchange(0, 2, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

fn wait_for(what: &str, deadline: Instant, shared: &[Arc<Shared>], done: impl Fn(&[Arc<Shared>]) -> bool) {
    while !done(shared) {
        let applied: Vec<u64> = shared.iter().map(|s| s.applied.load(Ordering::Acquire)).collect();
        assert!(Instant::now() < deadline, "{what}: not reached in time; applied {applied:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn three_replicas_survive_a_leader_kill() {
    if let Some(why) = skip_reason() {
        eprintln!("{why}");
        return;
    }
    let peers = PeerTable::new();
    let fabrics: Vec<(VerbsFabric, MuConfig)> = (0..REPLICAS)
        .map(|i| {
            let cfg = mu_config(NodeId(i));
            let mut vc = VerbsConfig::new(
                NodeId(i),
                REPLICAS,
                &mu::regions(&cfg),
                (Ipv4Addr::LOCALHOST, 0).into(),
                peers.clone(),
            );
            vc.retry_count = 3;
            (VerbsFabric::start(vc).expect("verbs node"), cfg)
        })
        .collect();
    let shared: Vec<Arc<Shared>> = (0..REPLICAS).map(|_| Arc::new(Shared::default())).collect();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(300);
    std::thread::scope(|s| {
        let _stop = StopAll(&shared);
        for ((fabric, cfg), me) in fabrics.into_iter().zip(&shared) {
            s.spawn(move || run_replica(fabric, cfg, me, start));
        }
        wait_for("half the proposals", deadline, &shared, |sh| {
            sh.iter().any(|r| r.leader.load(Ordering::Acquire) && r.applied.load(Ordering::Acquire) >= PROPOSALS / 2)
        });
        let victim = shared.iter().position(|r| r.leader.load(Ordering::Acquire)).expect("a leader");
        shared[victim].kill.store(true, Ordering::Release);
        wait_for("the leader's exit", deadline, &shared, |sh| sh[victim].exited.load(Ordering::Acquire));
        let survivors: Vec<usize> = (0..shared.len()).filter(|&i| i != victim).collect();
        wait_for("all proposals on both survivors", deadline, &shared, |sh| {
            survivors.iter().all(|&i| sh[i].applied.load(Ordering::Acquire) >= PROPOSALS)
        });
        for r in &shared {
            r.outcome.store(1, Ordering::Release);
        }
        let digests: Vec<Option<u32>> =
            survivors.iter().map(|&i| *shared[i].digest_at_target.lock().expect("digest")).collect();
        assert!(digests[0].is_some(), "survivor {} has no digest at {PROPOSALS}", survivors[0]);
        assert_eq!(digests[0], digests[1], "the survivors applied different commands");
        eprintln!(
            "{PROPOSALS} proposals over verbs with leader {victim} killed halfway: {:.1} s",
            start.elapsed().as_secs_f64()
        );
    });
}
