//! Availability of a history: how long the clients went without a single successful
//! operation, overall and after a fault healed.
//!
//! During a fault the clients may wait: for a fail-over, or for their operation timeout when
//! the leader they talk to is frozen. Once a fault heals (a restart, a resume, a healed
//! partition, a link back up), nothing is in the cluster's way that was not there before, so a
//! stretch without success that goes on after a heal is the cluster's own slowness coming
//! back: replicas that restart and cannot form a quorum, duels, a leader that cannot update its
//! followers. The longest such stretch, measured from the last heal inside it, is the figure
//! held to a goal (≤ 1 s, docs/RELIABILITY.md).

use serde::{Deserialize, Serialize};

/// The longest stretches without a successful operation, in milliseconds since the history
/// began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Availability {
    /// The longest stretch between two successful operations (or from the start of the load
    /// to the first one, or from the last one to the end).
    pub(crate) longest_gap_ms: u64,
    /// Where it began.
    pub(crate) longest_gap_at_ms: u64,
    /// The longest time from a heal to the next successful operation, over the heals that were
    /// the last inside a stretch without success.
    pub(crate) longest_after_heal_ms: u64,
    /// The heal it followed.
    pub(crate) longest_after_heal_at_ms: u64,
}

/// The availability of a history whose successful operations returned at `ok_return_ns`, whose
/// faults healed at `heal_ns` (both on the history's clock, in any order), with load from 0 to
/// `end_ns`.
pub(crate) fn measure(ok_return_ns: &[u64], heal_ns: &[u64], end_ns: u64) -> Availability {
    let mut bounds: Vec<u64> = ok_return_ns.iter().copied().filter(|&t| t <= end_ns).collect();
    bounds.push(0);
    bounds.push(end_ns);
    bounds.sort_unstable();
    let mut heals = heal_ns.to_vec();
    heals.sort_unstable();
    let ms = |ns: u64| ns / 1_000_000;
    let mut a = Availability::default();
    for pair in bounds.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        if to - from > a.longest_gap_ms * 1_000_000 {
            (a.longest_gap_ms, a.longest_gap_at_ms) = (ms(to - from), ms(from));
        }
        let before = heals.partition_point(|&t| t < to);
        let Some(&heal) = heals[..before].last().filter(|&&t| t >= from) else { continue };
        if to - heal > a.longest_after_heal_ms * 1_000_000 {
            (a.longest_after_heal_ms, a.longest_after_heal_at_ms) = (ms(to - heal), ms(heal));
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_longest_gap_and_its_start_are_found() {
        let a = measure(&[10 * MS, 20 * MS, 500 * MS, 510 * MS], &[], 600 * MS);
        assert_eq!((a.longest_gap_ms, a.longest_gap_at_ms), (480, 20));
        assert_eq!(a.longest_after_heal_ms, 0, "nothing healed");
    }

    #[test]
    fn only_the_time_after_the_last_heal_inside_a_gap_counts() {
        // Commits stop at 100 ms (a fault), a first heal at 300, another fault, its heal at
        // 700, and commits resume at 900: the cluster took 200 ms after the last heal.
        let a = measure(&[50 * MS, 100 * MS, 900 * MS, 950 * MS], &[300 * MS, 700 * MS], 1000 * MS);
        assert_eq!((a.longest_gap_ms, a.longest_gap_at_ms), (800, 100));
        assert_eq!((a.longest_after_heal_ms, a.longest_after_heal_at_ms), (200, 700));
    }

    #[test]
    fn heals_outside_any_gap_cost_nothing() {
        // Commits every 10 ms throughout: the heal at 305 is followed by one at 310.
        let oks: Vec<u64> = (1..100).map(|i| i * 10 * MS).collect();
        let a = measure(&oks, &[305 * MS], 1000 * MS);
        assert_eq!((a.longest_after_heal_ms, a.longest_after_heal_at_ms), (5, 305));
        assert_eq!(a.longest_gap_ms, 10);
    }

    #[test]
    fn a_cluster_that_never_recovers_is_charged_until_the_end_of_the_load() {
        let a = measure(&[100 * MS], &[300 * MS], 1000 * MS);
        assert_eq!((a.longest_gap_ms, a.longest_gap_at_ms), (900, 100));
        assert_eq!((a.longest_after_heal_ms, a.longest_after_heal_at_ms), (700, 300));
    }
}
