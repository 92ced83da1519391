//! Agreement of what the replicas applied: at every log index, every replica that applied an
//! entry applied the same one. Checked from the nodes' structured events (`microrep::events`,
//! which the harness turns on in every node it starts: `node-N.events.jsonl`), so it sees every
//! entry every incarnation of every replica applied, not only the final state: a replica that
//! diverged for a while and was later restored from a snapshot is caught too.
//!
//! Within one incarnation (the events after one `start`) a replica applies consecutive indices
//! (or jumps forward when it restores a snapshot), so index-by-index agreement is what "every
//! replica's applied sequence is a prefix of the others'" comes to. An entry is named by the
//! digest of its command bytes (`None` for a no-op, and for a `Membership` entry).
//!
//! A `Membership` entry that changed the configuration is also reported by a `membership` event
//! naming the members it made: at every such index, every replica that reported one must name
//! the same members. (A replica that took the entry for a no-op would say nothing there; that
//! shows in its configuration at the end, which the convergence check compares.)

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use microrep::events::{self, EventsError, NodeEvent};
use serde::{Deserialize, Serialize};

/// Replica `node`'s events file in a history's directory.
pub(crate) fn events_path(dir: &Path, node: usize) -> PathBuf {
    dir.join(format!("node-{node}.events.jsonl"))
}

/// Disagreements listed in full; past this only counted.
const LISTED: usize = 8;

/// What the check found over one history's node logs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedCheck {
    /// `applied` events read, over every replica and incarnation.
    pub(crate) applies: u64,
    /// Distinct indices applied somewhere.
    pub(crate) indices: u64,
    /// Indices applied more than once (by two replicas, or by two incarnations of one), and so
    /// compared.
    pub(crate) compared: u64,
    /// Indices where a membership change took effect, and how many times one was reported at
    /// an index that another replica (or incarnation) reported before, and so compared.
    #[serde(default)]
    pub(crate) membership_changes: u64,
    #[serde(default)]
    pub(crate) membership_compared: u64,
    /// Restarted replicas (empty) that caught up by copies of the log from its first entry.
    pub(crate) restarts_by_log_copy: u64,
    /// Restarted replicas that first restored a snapshot (the entries had been recycled).
    pub(crate) restarts_by_snapshot: u64,
    /// Running replicas that fell behind the recycled log and restored a snapshot to resume.
    pub(crate) lapped_by_snapshot: u64,
    /// Replicas that reported no applied entry (the check then says nothing about them).
    pub(crate) silent_nodes: Vec<usize>,
    /// Indices at which two replicas applied different entries (or changes that made different
    /// members).
    pub(crate) disagreeing_indices: u64,
    /// The first few of them, explained.
    pub(crate) disagreements: Vec<String>,
}

impl AppliedCheck {
    pub(crate) fn agrees(&self) -> bool {
        self.disagreeing_indices == 0
    }
}

/// The first replica seen applying an index, and what it applied there.
#[derive(Clone, Debug)]
struct FirstSeen {
    node: usize,
    digest: Option<String>,
}

/// Folds the events of every replica into one verdict.
#[derive(Debug, Default)]
struct Agreement {
    by_index: HashMap<u64, FirstSeen>,
    /// The first replica that reported a membership change at an index, and the members.
    changes: HashMap<u64, (usize, Vec<u16>)>,
    disagreeing: HashSet<u64>,
    check: AppliedCheck,
}

impl Agreement {
    /// One replica's events: its incarnations start at `start` events.
    fn add_node(&mut self, node: usize, events: impl Iterator<Item = NodeEvent>) {
        // The index last applied by the current incarnation, and whether it is a restart.
        let mut last: Option<u64> = None;
        let mut restarted = false;
        let mut any = false;
        for event in events {
            let (index, digest) = match event {
                NodeEvent::Start { .. } => {
                    restarted |= any;
                    last = None;
                    continue;
                }
                NodeEvent::Applied { index, digest } => (index, digest),
                NodeEvent::Membership { index, members } => {
                    self.add_change(node, index, members);
                    continue;
                }
                _ => continue,
            };
            self.check.applies += 1;
            match last {
                None if restarted && index == 0 => self.check.restarts_by_log_copy += 1,
                None if restarted => self.check.restarts_by_snapshot += 1,
                Some(l) if index > l + 1 => self.check.lapped_by_snapshot += 1,
                _ => {}
            }
            any = true;
            last = Some(index);
            self.add(node, index, digest);
        }
        if !any {
            self.check.silent_nodes.push(node);
        }
    }

    fn add(&mut self, node: usize, index: u64, digest: Option<String>) {
        match self.by_index.entry(index) {
            Entry::Vacant(v) => {
                v.insert(FirstSeen { node, digest });
                self.check.indices += 1;
            }
            Entry::Occupied(o) => {
                let first = o.get().clone();
                self.check.compared += 1;
                if first.digest != digest {
                    let name = |d: &Option<String>| d.as_ref().map_or("a no-op".to_string(), |d| format!("entry {d}"));
                    let text = format!(
                        "index {index}: node {} applied {}, node {node} {}",
                        first.node,
                        name(&first.digest),
                        name(&digest)
                    );
                    self.disagree(index, text);
                }
            }
        }
    }

    fn add_change(&mut self, node: usize, index: u64, members: Vec<u16>) {
        match self.changes.entry(index) {
            Entry::Vacant(v) => {
                v.insert((node, members));
                self.check.membership_changes += 1;
            }
            Entry::Occupied(o) => {
                let (first, made) = o.get().clone();
                self.check.membership_compared += 1;
                if made != members {
                    let text = format!(
                        "index {index}: node {first}'s membership change made members {made:?}, node {node}'s {members:?}"
                    );
                    self.disagree(index, text);
                }
            }
        }
    }

    /// Counts a disagreement at `index` (once per index), listing the first few.
    fn disagree(&mut self, index: u64, text: String) {
        if self.disagreeing.insert(index) {
            self.check.disagreeing_indices += 1;
            if self.check.disagreements.len() < LISTED {
                self.check.disagreements.push(text);
            }
        }
    }

    fn finish(self) -> AppliedCheck {
        self.check
    }
}

/// Checks the events files of `replicas` replicas in `dir` ([`events_path`]).
pub(crate) fn check_dir(dir: &Path, replicas: usize) -> Result<AppliedCheck, EventsError> {
    let mut agreement = Agreement::default();
    for node in 0..replicas {
        let events = events::read(&events_path(dir, node))?;
        agreement.add_node(node, events.into_iter());
    }
    Ok(agreement.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(index: u64, digest: u64) -> NodeEvent {
        NodeEvent::Applied { index, digest: Some(format!("{digest:016x}")) }
    }

    fn start() -> NodeEvent {
        NodeEvent::Start { node: 0, pid: 1 }
    }

    fn check(nodes: &[Vec<NodeEvent>]) -> AppliedCheck {
        let mut agreement = Agreement::default();
        for (node, events) in nodes.iter().enumerate() {
            agreement.add_node(node, events.iter().cloned());
        }
        agreement.finish()
    }

    #[test]
    fn replicas_that_applied_prefixes_of_one_sequence_agree() {
        let entry = |i: u64| applied(i, 100 + i);
        let full: Vec<NodeEvent> = std::iter::once(start()).chain((0..10).map(entry)).collect();
        let prefix: Vec<NodeEvent> = std::iter::once(start()).chain((0..6).map(entry)).collect();
        // Replica 2 fell behind and restored a snapshot at 7, was killed, came back and copied
        // the log from 0, was killed again and restored a snapshot at 5; a start that applied
        // nothing is no restart of its own. Other events change nothing.
        let mut restarted = vec![start()];
        restarted.extend([0, 1, 2, 7, 8].map(entry));
        restarted.extend([
            start(),
            entry(0),
            NodeEvent::LeaderChange { leader: 1 },
            entry(1),
            start(),
            start(),
            entry(5),
        ]);
        let c = check(&[full, prefix, restarted]);
        assert!(c.agrees(), "{c:?}");
        assert_eq!((c.applies, c.indices, c.compared), (24, 10, 14));
        assert_eq!((c.restarts_by_log_copy, c.restarts_by_snapshot, c.lapped_by_snapshot), (1, 1, 1));
        assert!(c.silent_nodes.is_empty());
    }

    #[test]
    fn a_replica_that_applied_another_entry_at_one_index_is_reported() {
        let good: Vec<NodeEvent> = (0..5).map(|i| applied(i, 100 + i)).collect();
        // A deposed leader applied its own unchosen entry at 3 where the others have a no-op.
        let mut noop = good.clone();
        noop[3] = NodeEvent::Applied { index: 3, digest: None };
        let c = check(&[noop.clone(), noop, good]);
        assert!(!c.agrees());
        assert_eq!(c.disagreeing_indices, 1);
        assert_eq!(c.disagreements, vec!["index 3: node 0 applied a no-op, node 2 entry 0000000000000067"]);
    }

    #[test]
    fn a_disagreement_is_counted_once_per_index_and_its_listing_is_bounded() {
        let a: Vec<NodeEvent> = (0..20).map(|i| applied(i, i)).collect();
        let b: Vec<NodeEvent> = (0..20).map(|i| applied(i, 1000 + i)).collect();
        let c = check(&[a, b.clone(), b]);
        assert_eq!(c.disagreeing_indices, 20);
        assert_eq!(c.disagreements.len(), LISTED);
    }

    #[test]
    fn membership_changes_are_compared_index_by_index() {
        let change = |index, members: &[u16]| NodeEvent::Membership { index, members: members.to_vec() };
        let noop = |index| NodeEvent::Applied { index, digest: None };
        // Replicas 0 and 1 applied the change at 2 (adding 3), replica 3 (the spare) too,
        // after a restart that copied the log; replica 2 was removed at 4 and reports it.
        let leader = vec![applied(0, 0), applied(1, 1), noop(2), change(2, &[0, 1, 2, 3]), applied(3, 3)];
        let spare =
            vec![start(), applied(0, 0), start(), applied(0, 0), applied(1, 1), noop(2), change(2, &[0, 1, 2, 3])];
        let removed = vec![applied(0, 0), noop(2), change(2, &[0, 1, 2, 3]), noop(4), change(4, &[0, 1, 3])];
        let c = check(&[leader.clone(), leader.clone(), removed.clone(), spare]);
        assert!(c.agrees(), "{c:?}");
        assert_eq!((c.membership_changes, c.membership_compared), (2, 3));
        // A replica whose change at 2 made other members disagrees there.
        let mut other = leader.clone();
        other[3] = change(2, &[0, 1, 2, 4]);
        let c = check(&[leader, other, removed]);
        assert_eq!(c.disagreeing_indices, 1);
        assert_eq!(
            c.disagreements,
            ["index 2: node 0's membership change made members [0, 1, 2, 3], node 1's [0, 1, 2, 4]"]
        );
    }

    #[test]
    fn a_replica_without_applied_events_is_named() {
        let a: Vec<NodeEvent> = (0..3).map(|i| applied(i, i)).collect();
        let c = check(&[a, vec![start(), NodeEvent::LeaderChange { leader: 0 }]]);
        assert_eq!(c.silent_nodes, vec![1]);
        assert!(c.agrees());
    }

    #[test]
    fn check_dir_reads_every_replica_and_names_a_missing_file() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-applied-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for (node, count) in [(0, 2), (1, 1)] {
            let log = microrep::events::EventLog::open(Some(&events_path(&dir, node))).expect("open");
            (0..count).for_each(|i| log.emit(applied(i, i)));
        }
        let c = check_dir(&dir, 2).expect("check");
        assert_eq!((c.applies, c.indices, c.compared), (3, 2, 1));
        let missing = check_dir(&dir, 3).expect_err("node 2's events are missing");
        assert!(matches!(&missing, EventsError::Io { path, .. } if path.ends_with("node-2.events.jsonl")), "{missing}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
