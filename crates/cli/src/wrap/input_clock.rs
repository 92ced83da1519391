//! The input clock: the time a leader's wrap node gives each `Data` entry (docs/WRAP.md, "Time
//! and randomness"). Every copy's server reads it while processing that input, so it must never
//! go back, across entries or leaders: it is the machine's wall clock, but always after the
//! last input time in the log.

use std::sync::atomic::{AtomicU64, Ordering};

/// The last input time chosen here or seen in the log (nanoseconds since the Unix epoch).
#[derive(Debug, Default)]
pub(crate) struct InputClock {
    last: AtomicU64,
}

impl InputClock {
    /// An entry with input time `time_ns` committed.
    pub(crate) fn observe(&self, time_ns: u64) {
        self.last.fetch_max(time_ns, Ordering::AcqRel);
    }

    /// The time of a new input: `now_ns` (the wall clock), or just after the last one if the
    /// clock is behind it.
    pub(crate) fn next(&self, now_ns: u64) -> u64 {
        let mut last = self.last.load(Ordering::Acquire);
        loop {
            let time = now_ns.max(last + 1);
            match self.last.compare_exchange_weak(last, time, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return time,
                Err(seen) => last = seen,
            }
        }
    }
}

/// The machine's wall clock, in nanoseconds since the Unix epoch.
pub(crate) fn wall_clock_ns() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_times_only_go_forward() {
        let clock = InputClock::default();
        assert_eq!(clock.next(100), 100);
        assert_eq!(clock.next(100), 101, "the same reading twice");
        assert_eq!(clock.next(50), 102, "a clock behind the last input");
        clock.observe(1_000);
        assert_eq!(clock.next(500), 1_001, "after another leader's input");
        clock.observe(10);
        assert_eq!(clock.next(2_000), 2_000);
    }
}
