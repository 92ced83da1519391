//! The one latency histogram of the CLI's reports and benchmarks.

use hdrhistogram::Histogram;

/// Largest latency recorded: 10 minutes, in nanoseconds (above any deadline of the tools).
pub const LATENCY_MAX_NS: u64 = 600_000_000_000;

/// An empty histogram of latencies in nanoseconds, 1 ns..[`LATENCY_MAX_NS`], 3 significant
/// digits.
pub fn latency_ns() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("constant bounds are valid")
}

#[cfg(test)]
mod tests {
    #[test]
    fn records_the_whole_range() {
        let mut h = super::latency_ns();
        h.record(1).expect("1 ns");
        h.record(super::LATENCY_MAX_NS).expect("the maximum");
        assert!(h.record(super::LATENCY_MAX_NS * 2).is_err(), "beyond the maximum is refused");
        assert_eq!(h.len(), 2);
    }
}
