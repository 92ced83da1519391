//! Where the replay agent's copy stands in the log, and which committed entries it still
//! needs. Mu may hand an entry to the state machine twice: after it restores a snapshot taken
//! below what the copy already holds (a copy rebuilt from a peer's state past the point its
//! own log had reached, whose node then restores a snapshot from an older point as it becomes
//! leader). Such entries are inside the copy's state and are not replayed again.

use microrep::Index;

/// The last entry the copy handled, and up to where entries are inside its state already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Cursor {
    /// The last entry handled: replayed, skipped as the copy's own, or inside a state it
    /// was restarted from.
    handled: Option<Index>,
    /// Entries up to here are inside the copy's state: delivered again, they are skipped.
    inside_state: Option<Index>,
}

impl Cursor {
    pub(super) fn handled(self) -> Option<Index> {
        self.handled
    }

    /// A committed entry arrived: true if it is new to the copy (and is now handled), false if
    /// it is inside the copy's state already.
    pub(super) fn arrived(&mut self, index: Index) -> bool {
        if self.inside_state.is_some_and(|upto| index <= upto) {
            return false;
        }
        self.handled = Some(index);
        true
    }

    /// The copy was restarted from a peer's state cut at `cut`.
    pub(super) fn installed(&mut self, cut: Option<Index>) {
        self.handled = cut;
        self.inside_state = cut;
    }

    /// Mu restored a snapshot whose last wrap entry is `upto`, and will apply the entries after
    /// it. True if the copy needs a peer's state: it has not handled `upto` (entries it never
    /// saw were recycled). Otherwise it keeps its state, and the entries Mu applies again up to
    /// the last one it handled are skipped.
    pub(super) fn restored(&mut self, upto: Option<Index>) -> bool {
        if upto <= self.handled {
            self.inside_state = self.inside_state.max(self.handled);
            return false;
        }
        self.handled = upto;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(entry: u64) -> Index {
        Index { entry, position: 0 }
    }

    #[test]
    fn a_snapshot_past_what_the_copy_handled_needs_a_peers_state() {
        let mut cursor = Cursor::default();
        assert!(cursor.arrived(at(5)));
        assert!(cursor.restored(Some(at(9))), "entries 6..=9 were never seen");
        assert_eq!(cursor.handled(), Some(at(9)));
        let mut fresh = Cursor::default();
        assert!(fresh.restored(Some(at(1))), "a restarted copy holds nothing");
        assert!(!Cursor::default().restored(None), "a snapshot of no entries misses nothing");
    }

    /// The CI failure of 2026-11-27: replica 0's copy was rebuilt from the serving leader's
    /// state at entry 316 while its node's log stood near 109; as it became leader its node
    /// restored a snapshot at 287, and the agent discarded a current copy. With every other
    /// copy being rebuilt at that moment, no replica could give state again.
    #[test]
    fn a_copy_rebuilt_past_an_older_snapshot_keeps_its_state_and_skips_entries_it_holds() {
        let mut cursor = Cursor::default();
        assert!(cursor.arrived(at(109)));
        cursor.installed(Some(at(316)));
        assert!(!cursor.restored(Some(at(287))), "the copy holds entry 287 already");
        for entry in 288..=316 {
            assert!(!cursor.arrived(at(entry)), "entry {entry} is inside the copy's state");
        }
        assert_eq!(cursor.handled(), Some(at(316)));
        assert!(cursor.arrived(at(317)));
        assert_eq!(cursor.handled(), Some(at(317)));
    }

    #[test]
    fn a_replayed_copy_skips_entries_delivered_again_after_a_snapshot_below_them() {
        let mut cursor = Cursor::default();
        for entry in 1..=40 {
            assert!(cursor.arrived(at(entry)));
        }
        assert!(!cursor.restored(Some(at(32))));
        assert!((33..=40).all(|entry| !cursor.arrived(at(entry))), "replayed once already");
        assert!(cursor.arrived(at(41)));
    }
}
