//! CRC-32C as the project computes it (`microrep_fabric::checksum`, by `crc-fast`) next to the
//! `crc32c` crate that computed it before, in one run, alternating in blocks.
//!
//! `cargo bench -p microrep-fabric --bench checksum [-- --calls N]`
//!
//! Each sample is the time of 100 checksums of one buffer (so the clock's own cost is small),
//! recorded per checksum in ns in an HdrHistogram; the buffer stays in cache, as a log entry
//! does between its encoding and its checksum. Both functions must agree on every buffer.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

use hdrhistogram::Histogram;
use microrep_fabric::checksum::crc32c;

/// 64 B: a small command's entry; 16,448 B: an entry of 256 commands of 64 B.
const SIZES: [usize; 4] = [64, 1024, 16_448, 262_144];
const BLOCKS: usize = 10;
const PER_SAMPLE: u64 = 100;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut calls: u64 = 200_000;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--calls" => calls = args.next().and_then(|v| v.parse().ok()).expect("--calls takes a number"),
            "--bench" => {}
            other => panic!("unknown argument {other} (usage: checksum [--calls N])"),
        }
    }
    println!(
        "{:>8} {:<16} {:>9} {:>9} {:>9} {:>10} {:>8}",
        "bytes", "impl", "p50 ns", "p99 ns", "p99.9 ns", "p50 GB/s", "samples"
    );
    for size in SIZES {
        let buf: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        assert_eq!(crc32c(&buf), crc32c::crc32c(&buf), "the two functions disagree at {size} B");
        let mut ours = Histogram::<u64>::new(3).unwrap();
        let mut old = Histogram::<u64>::new(3).unwrap();
        // Fewer calls for larger buffers, at least 10 samples a block.
        let samples = (calls * 64 / size as u64 / PER_SAMPLE / BLOCKS as u64).max(10);
        for _ in 0..BLOCKS {
            time(&mut ours, samples, || crc32c(black_box(&buf)));
            time(&mut old, samples, || crc32c::crc32c(black_box(&buf)));
        }
        for (name, hist) in [("crc-fast (ours)", &ours), ("crc32c crate", &old)] {
            let p50 = hist.value_at_quantile(0.5);
            println!(
                "{size:>8} {name:<16} {p50:>9} {:>9} {:>9} {:>10.1} {:>8}",
                hist.value_at_quantile(0.99),
                hist.value_at_quantile(0.999),
                size as f64 / p50.max(1) as f64,
                hist.len()
            );
        }
    }
}

/// Records `samples` samples of `PER_SAMPLE` calls of `f`, each as ns per call.
fn time(hist: &mut Histogram<u64>, samples: u64, f: impl Fn() -> u32) {
    for _ in 0..samples {
        let began = Instant::now();
        let mut x = 0;
        for _ in 0..PER_SAMPLE {
            x ^= f();
        }
        black_box(x);
        hist.record((began.elapsed().as_nanos() as u64 / PER_SAMPLE).max(1)).unwrap();
    }
}
