//! shm fabric latency next to a plain `memcpy` into the same shared memory, in one run.
//!
//! `cargo bench -p microrep-fabric --bench shm_latency [-- --iters N] [-- --json]`
//!
//! A peer process (`microrep-fabric-peer`) registers the regions and grants this process write
//! access; this process times each operation (post + completion) with the TSC clock and records
//! it in an HdrHistogram. The baseline maps the peer's segment file itself and copies with
//! `ptr::copy_nonoverlapping`: the cheapest possible one-sided write between the two processes.
//! Ours and the baseline alternate in blocks so that machine drift hits both alike. "microrep shm"
//! uses the asymmetric (membarrier) permission fence; "shm seqcst fence" the symmetric one.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use hdrhistogram::Histogram;
use memmap2::MmapRaw;
use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

const LOG: RegionId = RegionId(0);
const SCRATCH: RegionId = RegionId(1);
const REGION_LEN: u64 = 1 << 20;
const SIZES: [usize; 7] = [8, 64, 128, 256, 512, 1024, 4096];
const BLOCKS: usize = 10;

struct Row {
    op: &'static str,
    size: usize,
    impl_name: &'static str,
    hist: Histogram<u64>,
}

fn spawn_peer(dir: &std::path::Path, symmetric_fences: bool) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_microrep-fabric-peer"));
    if symmetric_fences {
        command.env("MICROREP_SHM_SYMMETRIC_FENCES", "1");
    }
    let mut child = command
        .arg(dir)
        .args(["0", "2", &format!("0:{REGION_LEN}:granted"), &format!("1:{REGION_LEN}:never")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    writeln!(child.stdin.as_mut().unwrap(), "grant 0 1").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ok");
    child
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000, 3).unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let iters: usize = args.iter().position(|a| a == "--iters").map_or(200_000, |i| args[i + 1].parse().unwrap());
    let per_block = (iters / BLOCKS).max(1);

    let dir = ShmConfig::default_dir(&format!("bench-{}", std::process::id()));
    let dir_seqcst = ShmConfig::default_dir(&format!("bench-seqcst-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir_seqcst);
    let mut peer = spawn_peer(&dir, false);
    let mut peer_seqcst = spawn_peer(&dir_seqcst, true);
    let regions = [
        RegionSpec::new(LOG, REGION_LEN, RemoteWrite::Granted),
        RegionSpec::new(SCRATCH, REGION_LEN, RemoteWrite::Never),
    ];
    let me = ShmFabric::start(ShmConfig::new(&dir, NodeId(1), 2, &regions)).unwrap();
    let mut config_seqcst = ShmConfig::new(&dir_seqcst, NodeId(1), 2, &regions);
    config_seqcst.symmetric_fences = true;
    let me_seqcst = ShmFabric::start(config_seqcst).unwrap();
    let mut eps = [me.connect(NodeId(0)).unwrap(), me_seqcst.connect(NodeId(0)).unwrap()];
    let names = ["microrep shm", "shm seqcst fence"];
    let file = std::fs::File::options().read(true).write(true).open(dir.join("node-0.shm")).unwrap();
    let raw = MmapRaw::map_raw(&file).unwrap();
    // Baseline target: the last megabyte of the peer's segment, which is its SCRATCH region.
    let base_dst = raw.len() - REGION_LEN as usize;
    let clock = quanta::Clock::new();
    let src = vec![0xa5u8; 4096];
    let mut local = vec![0u8; 4096];
    let mut rows = Vec::new();

    for &size in &SIZES {
        let (mut w_ours, mut w_base, mut r_ours, mut r_base) = ([hist(), hist()], hist(), hist(), hist());
        for _ in 0..BLOCKS {
            for (ep, w) in eps.iter_mut().zip(w_ours.iter_mut()) {
                for i in 0..per_block {
                    let offset = ((i * 4096) as u64) % (REGION_LEN - 4096);
                    let t0 = clock.raw();
                    ep.post_write(i as u64, RemoteAddr::new(LOG, offset), &src[..size], PostFlags::SIGNALED).unwrap();
                    let c = ep.poll_completion().unwrap();
                    let t1 = clock.raw();
                    assert!(c.status.is_ok());
                    w.record(clock.delta_as_nanos(t0, t1).max(1)).unwrap();
                }
            }
            for i in 0..per_block {
                let offset = (i * 4096) % (REGION_LEN as usize - 4096);
                let t0 = clock.raw();
                // SAFETY: base_dst + offset + size stays inside the mapping of the peer's file.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), raw.as_mut_ptr().add(base_dst + offset), size) };
                let t1 = clock.raw();
                w_base.record(clock.delta_as_nanos(t0, t1).max(1)).unwrap();
            }
            for i in 0..per_block {
                let offset = ((i * 4096) as u64) % (REGION_LEN - 4096);
                let t0 = clock.raw();
                eps[0]
                    .post_read(i as u64, RemoteAddr::new(LOG, offset), size as u32, SCRATCH, 0, PostFlags::SIGNALED)
                    .unwrap();
                let c = eps[0].poll_completion().unwrap();
                let t1 = clock.raw();
                assert!(c.status.is_ok());
                r_ours.record(clock.delta_as_nanos(t0, t1).max(1)).unwrap();
            }
            for i in 0..per_block {
                let offset = (i * 4096) % (REGION_LEN as usize - 4096);
                let t0 = clock.raw();
                // SAFETY: as above, reading instead.
                unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr().add(base_dst + offset), local.as_mut_ptr(), size) };
                let t1 = clock.raw();
                r_base.record(clock.delta_as_nanos(t0, t1).max(1)).unwrap();
            }
            std::hint::black_box(&local);
        }
        let [w_light, w_seqcst] = w_ours;
        rows.push(Row { op: "write", size, impl_name: names[0], hist: w_light });
        rows.push(Row { op: "write", size, impl_name: names[1], hist: w_seqcst });
        rows.push(Row { op: "write", size, impl_name: "memcpy baseline", hist: w_base });
        rows.push(Row { op: "read", size, impl_name: names[0], hist: r_ours });
        rows.push(Row { op: "read", size, impl_name: "memcpy baseline", hist: r_base });
    }

    rows.push(Row { op: "revoke+grant", size: 0, impl_name: names[0], hist: time_revoke(&me, &clock, iters / 10) });
    rows.push(Row {
        op: "revoke+grant",
        size: 0,
        impl_name: names[1],
        hist: time_revoke(&me_seqcst, &clock, iters / 10),
    });

    report(&rows, json);
    drop(eps);
    drop(me);
    drop(me_seqcst);
    for child in [&mut peer, &mut peer_seqcst] {
        writeln!(child.stdin.as_mut().unwrap(), "quit").unwrap();
        child.wait().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir_seqcst);
}

/// Latency of revoking the peer's write access to our log and granting it again.
fn time_revoke(fabric: &ShmFabric, clock: &quanta::Clock, iters: usize) -> Histogram<u64> {
    let mut h = hist();
    for _ in 0..iters {
        let t0 = clock.raw();
        fabric.revoke_write(LOG, NodeId(0)).unwrap();
        fabric.grant_write(LOG, NodeId(0)).unwrap();
        h.record(clock.delta_as_nanos(t0, clock.raw()).max(1)).unwrap();
    }
    h
}

fn report(rows: &[Row], json: bool) {
    if !json {
        println!(
            "{:<13} {:>6} {:<17} {:>8} {:>8} {:>8} {:>8} {:>10}",
            "op", "bytes", "impl", "p50 ns", "p99 ns", "p99.9 ns", "max ns", "samples"
        );
    }
    for r in rows {
        let q = |p: f64| r.hist.value_at_quantile(p);
        if json {
            println!(
                "{{\"op\":\"{}\",\"bytes\":{},\"impl\":\"{}\",\"p50_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{},\"samples\":{}}}",
                r.op,
                r.size,
                r.impl_name,
                q(0.5),
                q(0.99),
                q(0.999),
                r.hist.max(),
                r.hist.len()
            );
        } else {
            println!(
                "{:<13} {:>6} {:<17} {:>8} {:>8} {:>8} {:>8} {:>10}",
                r.op,
                r.size,
                r.impl_name,
                q(0.5),
                q(0.99),
                q(0.999),
                r.hist.max(),
                r.hist.len()
            );
        }
    }
}
