//! Availability of a history: how long the clients went without a single successful
//! operation, overall and after a fault healed.
//!
//! During a fault the clients may wait: for a fail-over, or for their operation timeout when
//! the leader they talk to is frozen. Once a fault heals (a restart, a resume, a healed
//! partition, a link back up) and until the nemesis acts again, nothing is in the cluster's way
//! that was not there before, so time without success then is the cluster's own slowness:
//! replicas that restart and cannot form a quorum, duels, a leader that cannot update its
//! followers. The longest such window, from a heal to the next success or the nemesis's next
//! action, whichever comes first, is the figure held to a goal (≤ 1 s, docs/RELIABILITY.md).

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
    /// The longest window without success that began with a heal and ended with the next
    /// success or the nemesis's next action.
    pub(crate) longest_after_heal_ms: u64,
    /// The heal it followed.
    pub(crate) longest_after_heal_at_ms: u64,
}

/// The availability of a history whose successful operations returned at `ok_return_ns`, whose
/// nemesis acted at `actions` (time, and whether the action healed a fault; both on the
/// history's clock, in any order), with load from 0 to `end_ns`.
pub(crate) fn measure(ok_return_ns: &[u64], actions: &[(u64, bool)], end_ns: u64) -> Availability {
    let mut bounds: Vec<u64> = ok_return_ns.iter().copied().filter(|&t| t <= end_ns).collect();
    bounds.push(0);
    bounds.push(end_ns);
    bounds.sort_unstable();
    let mut actions = actions.to_vec();
    actions.sort_unstable();
    let ms = |ns: u64| ns / 1_000_000;
    let mut a = Availability::default();
    let mut next = 0; // the first action at or after the current stretch
    for pair in bounds.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        if to - from > a.longest_gap_ms * 1_000_000 {
            (a.longest_gap_ms, a.longest_gap_at_ms) = (ms(to - from), ms(from));
        }
        while next < actions.len() && actions[next].0 < from {
            next += 1;
        }
        // Each heal inside the stretch opens a window that the next action or the stretch's
        // end closes.
        let mut i = next;
        while i < actions.len() && actions[i].0 < to {
            let (at, healed) = actions[i];
            let until = actions.get(i + 1).map_or(to, |&(t, _)| t.min(to));
            if healed && until - at > a.longest_after_heal_ms * 1_000_000 {
                (a.longest_after_heal_ms, a.longest_after_heal_at_ms) = (ms(until - at), ms(at));
            }
            i += 1;
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
    fn a_window_runs_from_a_heal_to_the_next_action_or_success() {
        // Commits stop at 100 ms (a fault at 90), a heal at 300, a new fault at 650, its heal at
        // 700, and commits resume at 900: windows of 350 ms (300 to 650) and 200 ms (700 to
        // 900) began with a heal; the time under faults does not count.
        let actions = [(90 * MS, false), (300 * MS, true), (650 * MS, false), (700 * MS, true)];
        let a = measure(&[50 * MS, 100 * MS, 900 * MS, 950 * MS], &actions, 1000 * MS);
        assert_eq!((a.longest_gap_ms, a.longest_gap_at_ms), (800, 100));
        assert_eq!((a.longest_after_heal_ms, a.longest_after_heal_at_ms), (350, 300));
    }

    #[test]
    fn heals_outside_any_gap_cost_nothing() {
        // Commits every 10 ms throughout: the heal at 305 is followed by one at 310.
        let oks: Vec<u64> = (1..100).map(|i| i * 10 * MS).collect();
        let a = measure(&oks, &[(305 * MS, true)], 1000 * MS);
        assert_eq!((a.longest_after_heal_ms, a.longest_after_heal_at_ms), (5, 305));
        assert_eq!(a.longest_gap_ms, 10);
    }

    #[test]
    fn a_cluster_that_never_recovers_is_charged_until_the_end_of_the_load() {
        let a = measure(&[100 * MS], &[(300 * MS, true)], 1000 * MS);
        assert_eq!((a.longest_gap_ms, a.longest_gap_at_ms), (900, 100));
        assert_eq!((a.longest_after_heal_ms, a.longest_after_heal_at_ms), (700, 300));
    }
}
