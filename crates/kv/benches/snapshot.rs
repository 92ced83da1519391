//! The cost of one snapshot of the key-value store, which every replica takes every
//! `log.snapshot_every` entries so that the log can be recycled (`mu::plane::replayer`): on a
//! follower it is most of the CPU an entry costs once the store is large, and on a leader in
//! direct mode it runs on the serving thread.
//!
//! ```text
//! cargo bench -p microrep-kv --bench snapshot -- [--keys 100000] [--value 64] [--samples 50]
//! ```
//!
//! Fills a store with `--keys` SETs of `--value`-byte values (keys `key:<n>`, as
//! redis-benchmark's `-r`), then times `--samples` snapshots into a reused buffer and as many
//! restores of one into a fresh store, each sample into an HdrHistogram (microseconds). Every
//! sample is kept; a restore that fails is counted as failed.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::Instant;

use hdrhistogram::Histogram;
use microrep::{Apply, Index};
use microrep_kv::{KvStore, store};

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} takes a number, got {v}")))
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (keys, value, samples) =
        (arg(&args, "--keys", 100_000), arg(&args, "--value", 64), arg(&args, "--samples", 50));
    let mut kv = KvStore::default();
    let (mut command, mut reply) = (Vec::new(), Vec::new());
    for n in 0..keys {
        let set = [b"SET".to_vec(), format!("key:{n:012}").into_bytes(), vec![b'x'; value as usize]];
        store::encode(&set, &mut command).unwrap();
        reply.clear();
        kv.apply(Index { entry: n, position: 0 }, &command, &mut reply);
    }
    let mut taken = Histogram::<u64>::new(3).unwrap();
    let mut restored = Histogram::<u64>::new(3).unwrap();
    let (mut snapshot, mut failed) = (Vec::new(), 0u64);
    for _ in 0..samples {
        snapshot.clear();
        let start = Instant::now();
        kv.snapshot(&mut snapshot);
        taken.record(start.elapsed().as_micros() as u64).unwrap();
        let mut copy = KvStore::default();
        let start = Instant::now();
        let ok = copy.restore(&snapshot).is_ok() && copy.len() == kv.len();
        restored.record(start.elapsed().as_micros() as u64).unwrap();
        failed += u64::from(!ok);
    }
    println!("kv snapshot: {keys} keys, {value} B values, {} snapshot bytes, {samples} samples", snapshot.len());
    println!("{:<9} {:>9} {:>9} {:>9} {:>8} {:>7}", "op", "p50 us", "p99 us", "max us", "samples", "failed");
    for (op, h, f) in [("snapshot", &taken, 0), ("restore", &restored, failed)] {
        println!(
            "{op:<9} {:>9} {:>9} {:>9} {:>8} {f:>7}",
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max(),
            h.len()
        );
    }
}
