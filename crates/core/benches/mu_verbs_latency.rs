//! Mu replication latency over the verbs fabric next to perftest's `ib_write_lat` on the same
//! device, in one run.
//!
//! `cargo bench -p microrep-core --features verbs --bench mu_verbs_latency [-- --samples N]`
//! Needs an RDMA device (scripts/verbs-test.sh --bench runs it on soft-RoCE in the VM).
//!
//! Three replicas in one process, one thread each. Replica 0 leads (the lowest live id does);
//! it proposes one command at a time and times each from `propose` to its `Committed` event:
//! written into the followers' logs with one-sided WRITEs, acknowledged by a majority, applied
//! locally. Followers sleep 50 us between polls, as in `microrep bench replication` on shm.
//! perftest and Mu alternate in blocks, [`ROUNDS`] rounds over the sizes, so that drift of the
//! emulated machine hits both; while perftest runs every replica is polled once a millisecond
//! (heartbeats go on, little CPU taken). perftest's row is its median round (by p50).
//!
//! After the rounds, one more block per size is traced (`support::timed_fabric`) and each commit
//! broken down into its steps (`support::commit_breakdown`); the tracing's own cost is in that
//! block's total, not in the rows above.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

mod support {
    pub(crate) mod commit_breakdown;
    pub(crate) mod timed_fabric;
}

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep_core::mu::{self, Event, MuConfig, Replica, Role, StateMachine};
use microrep_fabric::NodeId;
use microrep_fabric::verbs::{PeerTable, PerftestLatency, VerbsConfig, VerbsFabric, perftest_latency};
use support::commit_breakdown::Breakdown;
use support::timed_fabric::{TimedFabric, Trace};

type Leader = Replica<TimedFabric<VerbsFabric>>;

const REPLICAS: u16 = 3;
const SIZES: [usize; 3] = [8, 64, 1024];
/// Blocks of each system per size.
const ROUNDS: u64 = 3;
/// Commits discarded at the start of each Mu block.
const WARM_UP: u64 = 100;

#[derive(Default)]
struct Digest(u32);

impl StateMachine for Digest {
    fn apply(&mut self, _index: u64, command: &[u8]) {
        self.0 = microrep_fabric::checksum::crc32c_append(self.0, command);
    }
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
    }
    fn restore(&mut self, _index: u64, s: &[u8]) -> Result<(), mu::RestoreError> {
        let got = s.len();
        self.0 = u32::from_le_bytes(s.try_into().map_err(|_| mu::RestoreError::Length { got, expected: "4 bytes" })?);
        Ok(())
    }
}

fn config(node: NodeId) -> MuConfig {
    let slot_bytes = (1024 + mu::slot::HEADER_BYTES + mu::slot::CANARY_BYTES).next_multiple_of(8) as u32;
    MuConfig {
        slot_bytes,
        log_slots: 1024,
        snapshot_every: 256,
        // Slow failure detection: this measures commits, and the emulated machine stalls for
        // milliseconds at times (its p99s), which must not look like a failed leader.
        heartbeat_period_ns: 5_000_000,
        fate_share_timeout_ns: 1_000_000_000,
        fate_share_cooldown_ns: 1_000_000_000,
        permission_timeout_ns: 20_000_000,
        round_timeout_ns: 100_000_000,
        recycle_period_ns: 2_000_000,
        lag_check_period_ns: 10_000_000,
        ..MuConfig::new(node, REPLICAS)
    }
}

/// One commit: when it was proposed and when it committed; `None` when the proposal failed
/// (leadership moved), to be retried.
fn commit(
    leader: &mut Leader,
    app: &mut Digest,
    events: &mut Vec<Event>,
    id: u64,
    payload: &[u8],
    now: &impl Fn() -> u64,
) -> Option<(u64, u64)> {
    let t0 = now();
    leader.propose(id, payload).ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        leader.poll(now(), app, events);
        for e in events.drain(..) {
            match e {
                Event::Committed { request_id, .. } if request_id == id => return Some((t0, now())),
                Event::Failed { request_id, .. } if request_id == id => return None,
                _ => {}
            }
        }
        assert!(Instant::now() < deadline, "proposal {id} not committed: {:?}", leader.status());
    }
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let samples: u64 = args.iter().position(|a| a == "--samples").map_or(2000, |i| args[i + 1].parse().unwrap());
    let peers = PeerTable::new();
    let mut nodes: Vec<(VerbsFabric, MuConfig)> = (0..REPLICAS)
        .map(|i| {
            let cfg = config(NodeId(i));
            let listen = (Ipv4Addr::LOCALHOST, 0).into();
            let vc = VerbsConfig::new(NodeId(i), REPLICAS, &mu::regions(&cfg), listen, peers.clone());
            (VerbsFabric::start(vc).unwrap(), cfg)
        })
        .collect();
    let (device, gid_index) = nodes[0].0.device();
    let per_round = samples.div_ceil(ROUNDS);
    let stop = AtomicBool::new(false);
    let paused = AtomicBool::new(false);
    let trace = Trace::new(Instant::now());
    let now = || trace.now();
    let (fabric0, cfg0) = nodes.remove(0);
    let fabric0 = TimedFabric::new(fabric0, trace.clone());
    let mut rows: Vec<(usize, Histogram<u64>)> =
        SIZES.iter().map(|&size| (size, Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap())).collect();
    let mut base_rounds: Vec<Vec<PerftestLatency>> = SIZES.iter().map(|_| Vec::new()).collect();
    let mut breakdowns: Vec<(usize, Breakdown)> = SIZES.iter().map(|&size| (size, Breakdown::new())).collect();
    let mut retries = 0u64;
    std::thread::scope(|s| {
        // The followers stop when this thread leaves the scope, also by a panic (which the
        // scope would otherwise wait on forever, until the VM's timeout).
        let _stop_followers = StopOnDrop(&stop);
        for (fabric, cfg) in nodes {
            let (stop, paused) = (&stop, &paused);
            s.spawn(move || {
                let mut replica = Replica::new(fabric, cfg, now()).unwrap();
                let (mut app, mut events) = (Digest::default(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    replica.poll(now(), &mut app, &mut events);
                    events.clear();
                    // While perftest runs, a poll a millisecond keeps the heartbeats going.
                    let rest = if paused.load(Ordering::Relaxed) { 1000 } else { 50 };
                    std::thread::sleep(Duration::from_micros(rest));
                }
            });
        }
        let mut leader = Replica::new(fabric0, cfg0, now()).unwrap();
        let (mut app, mut events) = (Digest::default(), Vec::new());
        let wait_to_lead = |leader: &mut Leader, app: &mut Digest, events: &mut Vec<Event>| {
            let deadline = Instant::now() + Duration::from_secs(60);
            while leader.status().role != Role::Leader || leader.status().confirmed.len() < usize::from(REPLICAS) - 1 {
                assert!(Instant::now() < deadline, "replica 0 did not lead with both followers: {:?}", leader.status());
                leader.poll(now(), app, events);
                events.clear();
            }
        };
        let mut id = 0u64;
        for _ in 0..ROUNDS {
            for (k, &size) in SIZES.iter().enumerate() {
                // perftest runs on a thread of its own while this one polls the leader once a
                // millisecond: a leader left unpolled for seconds is deposed.
                paused.store(true, Ordering::Relaxed);
                let baseline = std::thread::scope(|p| {
                    let run =
                        p.spawn(|| perftest_latency("ib_write_lat", &device, gid_index, size, per_round as usize));
                    while !run.is_finished() {
                        leader.poll(now(), &mut app, &mut events);
                        events.clear();
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    run.join().unwrap()
                });
                paused.store(false, Ordering::Relaxed);
                match baseline {
                    Ok(p) => base_rounds[k].push(p),
                    Err(e) => println!("baseline ib_write_lat unavailable at {size} B: {e}"),
                }
                wait_to_lead(&mut leader, &mut app, &mut events);
                let payload = vec![0x5a; size];
                let h = &mut rows[k].1;
                let (target, mut done) = (h.len() + per_round, 0u64);
                while h.len() < target {
                    id += 1;
                    match commit(&mut leader, &mut app, &mut events, id, &payload, &now) {
                        Some((t0, t1)) if done >= WARM_UP => h.record((t1 - t0).max(1)).unwrap(),
                        Some(_) => {}
                        None => {
                            // Leadership moved (a stall looked like a failure): wait until
                            // replica 0, the lowest id, leads again.
                            retries += 1;
                            wait_to_lead(&mut leader, &mut app, &mut events);
                        }
                    }
                    done += 1;
                }
            }
        }
        for (size, breakdown) in &mut breakdowns {
            wait_to_lead(&mut leader, &mut app, &mut events);
            let payload = vec![0x5a; *size];
            let mut done = 0u64;
            while done < per_round + WARM_UP {
                id += 1;
                trace.begin();
                let timed = commit(&mut leader, &mut app, &mut events, id, &payload, &now);
                let recorded = trace.take();
                match timed {
                    Some((t0, t1)) if done >= WARM_UP => breakdown.add(t0, t1, &recorded),
                    Some(_) => {}
                    None => {
                        retries += 1;
                        wait_to_lead(&mut leader, &mut app, &mut events);
                    }
                }
                done += 1;
            }
        }
    });
    let baselines: Vec<(usize, PerftestLatency)> = SIZES
        .iter()
        .zip(base_rounds)
        .filter_map(|(&size, mut rounds)| {
            rounds.sort_by_key(|p| p.p50_ns);
            let median = rounds.len() / 2;
            rounds.into_iter().nth(median).map(|p| (size, p))
        })
        .collect();

    println!(
        "Mu replication over verbs on {device} (GID index {gid_index}), {REPLICAS} replicas, {samples} samples \
         in {ROUNDS} blocks per size alternating with ib_write_lat's"
    );
    println!("proposals retried after a leadership change: {retries}");
    println!(
        "{:>6} {:<22} {:>9} {:>9} {:>9} {:>8} {:>18}",
        "bytes", "impl", "p50 us", "p99 us", "p99.9 us", "samples", "p50 / ib_write_lat"
    );
    let us = |ns: u64| format!("{:.1}", ns as f64 / 1000.0);
    for (size, h) in &rows {
        let base = baselines.iter().find(|(s, _)| s == size).map(|(_, p)| *p);
        if let Some(p) = base {
            println!(
                "{size:>6} {:<22} {:>9} {:>9} {:>9} {:>8} {:>18}",
                "ib_write_lat (median)",
                us(p.p50_ns),
                us(p.p99_ns),
                us(p.p999_ns),
                p.iterations,
                ""
            );
        }
        let q = |p| h.value_at_quantile(p);
        let ratio = base.map_or(String::new(), |p| format!("{:.2}x", q(0.5) as f64 / p.p50_ns.max(1) as f64));
        println!(
            "{size:>6} {:<22} {:>9} {:>9} {:>9} {:>8} {:>18}",
            "microrep Mu commit",
            us(q(0.5)),
            us(q(0.99)),
            us(q(0.999)),
            h.len(),
            ratio
        );
    }
    for (size, breakdown) in &breakdowns {
        println!();
        breakdown.print(&format!("{size} B, one traced block (the tracing's cost included)"));
    }
}
