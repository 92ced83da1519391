//! verbs fabric latency next to perftest's `ib_write_lat` / `ib_read_lat` on the same device,
//! in one run.
//!
//! `cargo bench -p microrep-fabric --features verbs --bench verbs_latency [-- --samples N]`
//! Needs an RDMA device (scripts/verbs-test.sh --bench runs it on soft-RoCE in the VM) and, for
//! the baselines, perftest; perftest's server and client run over loopback on the same device.
//!
//! Rows, each an HdrHistogram of per-operation latencies:
//! * `write ping-pong/2`: two nodes (threads) bounce a WRITE: each polls its memory for the
//!   other's write, then writes back; half the round trip, perftest's `ib_write_lat` method;
//! * `write+completion`: post a signaled WRITE, poll its completion (what a Mu leader waits for);
//! * `read+completion`: post a READ, poll its completion; perftest's `ib_read_lat` method;
//! * `ib_write_lat` / `ib_read_lat`: perftest's median (t_typical), 99% and 99.9% figures; the
//!   median of three rounds, each round alternating with ours.
//!
//! Soft-RoCE is software emulation (here inside qemu without KVM), so absolute figures mean
//! little: compare ours with perftest's on the same boot (the ratio column).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep_fabric::verbs::{PeerTable, VerbsConfig, VerbsEndpoint, VerbsFabric, perftest_latency};
use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

const LOG: RegionId = RegionId(0);
const PING: RegionId = RegionId(1);
const SCRATCH: RegionId = RegionId(2);
const REGION_LEN: u64 = 1 << 20;
const SIZES: [usize; 3] = [8, 256, 4096];

/// Percentiles in nanoseconds.
struct Row {
    op: String,
    size: usize,
    p50: u64,
    p99: u64,
    p999: u64,
    samples: u64,
}

impl Row {
    fn from_hist(op: &str, size: usize, h: &Histogram<u64>) -> Self {
        let q = |p| h.value_at_quantile(p);
        Self { op: op.into(), size, p50: q(0.5), p99: q(0.99), p999: q(0.999), samples: h.len() }
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

fn wait_completion(ep: &mut VerbsEndpoint) {
    let deadline = Instant::now() + ep.failure_bound();
    loop {
        if let Some(c) = ep.poll_completion() {
            assert!(c.status.is_ok(), "{c:?}");
            return;
        }
        assert!(Instant::now() < deadline, "no completion");
        std::hint::spin_loop();
    }
}

/// Spins until the word at `PING[offset]` reads `seq`, or the stop flag is set.
fn wait_word(node: &VerbsFabric, offset: u64, seq: u64, stop: &AtomicBool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.load_u64(PING, offset).unwrap() != seq {
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

/// perftest's `tool` for `size` bytes as a row of the table (none if perftest is missing).
fn perftest(tool: &str, device: &str, gid_index: u8, size: usize, iters: usize) -> Option<Row> {
    match perftest_latency(tool, device, gid_index, size, iters) {
        Ok(p) => {
            Some(Row { op: tool.into(), size, p50: p.p50_ns, p99: p.p99_ns, p999: p.p999_ns, samples: p.iterations })
        }
        Err(e) => {
            println!("baseline {tool} unavailable: {e}");
            None
        }
    }
}

fn start(node: u16, peers: &PeerTable) -> VerbsFabric {
    let regions = [
        RegionSpec::new(LOG, REGION_LEN, RemoteWrite::Granted),
        RegionSpec::new(PING, REGION_LEN, RemoteWrite::Always),
        RegionSpec::new(SCRATCH, REGION_LEN, RemoteWrite::Never),
    ];
    let config = VerbsConfig::new(NodeId(node), 2, &regions, (Ipv4Addr::LOCALHOST, 0).into(), peers.clone());
    VerbsFabric::start(config).unwrap()
}

/// Rounds per size: perftest and ours alternate, so drift of this shared machine hits both.
const ROUNDS: usize = 3;
const WARMUP: u64 = 100;

/// perftest's figures over several rounds: the median round of each percentile.
fn median_of(op: &str, size: usize, runs: &[Row]) -> Option<Row> {
    let mid = |f: fn(&Row) -> u64| {
        let mut v: Vec<u64> = runs.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    (!runs.is_empty()).then(|| Row {
        op: op.into(),
        size,
        p50: mid(|r| r.p50),
        p99: mid(|r| r.p99),
        p999: mid(|r| r.p999),
        samples: runs.iter().map(|r| r.samples).sum(),
    })
}

/// Bounces `n` WRITEs of `size` bytes between the two nodes; records half of each round trip.
fn ping_pong(
    nodes: (&VerbsFabric, &VerbsFabric),
    eps: (&mut VerbsEndpoint, &mut VerbsEndpoint),
    size: usize,
    n: u64,
    h: &mut Histogram<u64>,
) {
    let ((target, me), (ep, back)) = (nodes, eps);
    // The last 8 bytes of each write carry its sequence number.
    let word = (size - 8) as u64;
    let stop = AtomicBool::new(false);
    let base = me.load_u64(PING, word).unwrap().max(target.load_u64(PING, word).unwrap());
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let mut data = vec![0u8; size];
            for seq in base + 1..=base + n {
                if !wait_word(target, word, seq, stop) {
                    return;
                }
                data[size - 8..].copy_from_slice(&seq.to_le_bytes());
                back.post_write(seq, RemoteAddr::new(PING, 0), &data, PostFlags::SIGNALED).unwrap();
                wait_completion(back);
            }
        });
        let mut data = vec![0u8; size];
        for seq in base + 1..=base + n {
            let t0 = Instant::now();
            data[size - 8..].copy_from_slice(&seq.to_le_bytes());
            ep.post_write(seq, RemoteAddr::new(PING, 0), &data, PostFlags::SIGNALED).unwrap();
            wait_completion(ep);
            if !wait_word(me, word, seq, stop) {
                stop.store(true, Ordering::Relaxed);
                panic!("ping-pong stalled at {seq}");
            }
            if seq > base + WARMUP {
                h.record((t0.elapsed().as_nanos() as u64 / 2).max(1)).unwrap();
            }
        }
    });
}

/// Posts `n` signaled operations one at a time and records post-to-completion times.
fn one_at_a_time(
    ep: &mut VerbsEndpoint,
    n: u64,
    h: &mut Histogram<u64>,
    mut post: impl FnMut(&mut VerbsEndpoint, u64),
) {
    for i in 0..n {
        let t0 = Instant::now();
        post(ep, i);
        wait_completion(ep);
        if i >= WARMUP {
            h.record(t0.elapsed().as_nanos().max(1) as u64).unwrap();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let samples: usize = args.iter().position(|a| a == "--samples").map_or(5000, |i| args[i + 1].parse().unwrap());
    let per_round = (samples / ROUNDS).max(1);
    let peers = PeerTable::new();
    let (target, me) = (start(0, &peers), start(1, &peers));
    target.grant_write(LOG, NodeId(1)).unwrap();
    let (device, gid_index) = me.device();
    let mut ep = me.connect(NodeId(0)).unwrap();
    let mut back = target.connect(NodeId(1)).unwrap();
    println!(
        "device {device}, GID index {gid_index}, inline up to {} bytes, {ROUNDS} rounds of {per_round} samples",
        ep.max_inline_bytes()
    );
    let src = vec![0xa5u8; 4096];
    let offset = |i: u64| (i * 4096) % (REGION_LEN - 4096);
    let mut rows = Vec::new();
    for &size in &SIZES {
        let (mut ping, mut write, mut read) = (hist(), hist(), hist());
        let (mut base_write, mut base_read) = (Vec::new(), Vec::new());
        let n = per_round as u64 + WARMUP;
        for _ in 0..ROUNDS {
            base_write.extend(perftest("ib_write_lat", &device, gid_index, size, per_round));
            ping_pong((&target, &me), (&mut ep, &mut back), size, n, &mut ping);
            one_at_a_time(&mut ep, n, &mut write, |ep, i| {
                ep.post_write(i, RemoteAddr::new(LOG, offset(i)), &src[..size], PostFlags::SIGNALED).unwrap();
            });
            base_read.extend(perftest("ib_read_lat", &device, gid_index, size, per_round));
            one_at_a_time(&mut ep, n, &mut read, |ep, i| {
                ep.post_read(i, RemoteAddr::new(LOG, offset(i)), size as u32, SCRATCH, 0, PostFlags::SIGNALED).unwrap();
            });
        }
        rows.extend(median_of("ib_write_lat", size, &base_write));
        rows.push(Row::from_hist("write ping-pong/2", size, &ping));
        rows.push(Row::from_hist("write+completion", size, &write));
        rows.extend(median_of("ib_read_lat", size, &base_read));
        rows.push(Row::from_hist("read+completion", size, &read));
    }
    report(&rows);
}

fn report(rows: &[Row]) {
    println!(
        "{:<18} {:>6} {:>10} {:>10} {:>10} {:>8} {:>16}",
        "op", "bytes", "p50 us", "p99 us", "p99.9 us", "samples", "p50 / perftest"
    );
    let us = |ns: u64| format!("{:.1}", ns as f64 / 1000.0);
    for r in rows {
        let baseline = if r.op.starts_with("read") { "ib_read_lat" } else { "ib_write_lat" };
        let ratio = rows
            .iter()
            .find(|b| b.op == baseline && b.size == r.size && !r.op.starts_with("ib_"))
            .map_or(String::new(), |b| format!("{:.2}x", r.p50 as f64 / b.p50.max(1) as f64));
        println!(
            "{:<18} {:>6} {:>10} {:>10} {:>10} {:>8} {:>16}",
            r.op,
            r.size,
            us(r.p50),
            us(r.p99),
            us(r.p999),
            r.samples,
            ratio
        );
    }
}
