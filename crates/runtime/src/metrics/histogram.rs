//! A latency histogram that a hot path records into with two relaxed atomic additions and no
//! lock or allocation: fixed bucket bounds (two per octave, 1 us to about 4 s), counted
//! separately and summed into Prometheus's cumulative buckets only when scraped.

use std::sync::atomic::{AtomicU64, Ordering};

/// Octaves covered above 1 us: the last finite bound is 2^22 us, about 4.2 s.
const OCTAVES: usize = 22;

/// Finite upper bounds: 1 us, then 1.5 and 2 times each power of two.
const BOUNDS: usize = 1 + 2 * OCTAVES;

/// The finite upper bounds in nanoseconds, ascending.
const BOUNDS_NS: [u64; BOUNDS] = bounds_ns();

const fn bounds_ns() -> [u64; BOUNDS] {
    let mut b = [1_000u64; BOUNDS];
    let mut octave = 0;
    while octave < OCTAVES {
        let base = 1_000u64 << octave;
        b[1 + 2 * octave] = base + base / 2;
        b[2 + 2 * octave] = 2 * base;
        octave += 1;
    }
    b
}

/// Durations counted in fixed buckets, with their sum.
#[derive(Debug)]
pub(crate) struct Histogram {
    /// Counts per bucket (not cumulative); the last one is above every finite bound.
    counts: [AtomicU64; BOUNDS + 1],
    sum_ns: AtomicU64,
}

/// What a scrape reads of a [`Histogram`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HistogramSnapshot {
    /// Sum of the recorded durations, in seconds.
    pub(crate) sum_seconds: f64,
    /// Recorded durations.
    pub(crate) count: u64,
    /// (upper bound in seconds, count in that bucket alone), the last bound infinite.
    pub(crate) buckets: Vec<(f64, u64)>,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Self { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }

    /// Counts one duration of `ns` nanoseconds.
    pub(crate) fn record(&self, ns: u64) {
        let bucket = BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts as of now. Each count is read on its own: a scrape racing a record may see
    /// the duration in the sum but not yet in its bucket, which the next scrape corrects.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let bound = |i: usize| BOUNDS_NS.get(i).map_or(f64::INFINITY, |&ns| ns as f64 / 1e9);
        let buckets: Vec<(f64, u64)> =
            self.counts.iter().enumerate().map(|(i, c)| (bound(i), c.load(Ordering::Relaxed))).collect();
        HistogramSnapshot {
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count: buckets.iter().map(|&(_, n)| n).sum(),
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_rise_by_half_and_whole_steps_from_one_microsecond() {
        assert_eq!(&BOUNDS_NS[..6], &[1_000, 1_500, 2_000, 3_000, 4_000, 6_000]);
        assert_eq!(BOUNDS_NS[BOUNDS - 1], 1_000 << OCTAVES);
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_duration_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let h = Histogram::new();
        for ns in [0, 1_000, 1_001, 1_500, 2_999, 3_000, 5_000_000_000] {
            h.record(ns);
        }
        let s = h.snapshot();
        let count = |le: f64| s.buckets.iter().find(|&&(b, _)| b == le).map(|&(_, n)| n);
        assert_eq!(count(1e-6), Some(2), "0 and exactly 1 us");
        assert_eq!(count(1.5e-6), Some(2), "1,001 ns and 1,500 ns");
        assert_eq!(count(2e-6), Some(0));
        assert_eq!(count(3e-6), Some(2));
        assert_eq!(count(f64::INFINITY), Some(1), "5 s is above the last finite bound");
        assert_eq!(s.count, 7);
        assert!((s.sum_seconds - 5.000_009_5).abs() < 1e-9, "{}", s.sum_seconds);
    }
}
