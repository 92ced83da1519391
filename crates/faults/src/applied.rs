//! Agreement of what the replicas applied: at every log index, every replica that applied an
//! entry applied the same one. Checked from the nodes' `apply` trace lines (target
//! `microrep_core::apply`, which the harness turns on in every node it starts), so it
//! sees every entry every incarnation of every replica applied, not only the final state: a
//! replica that diverged for a while and was later restored from a snapshot is caught too.
//!
//! Within one incarnation a replica applies consecutive indices (or jumps forward when it
//! restores a snapshot), so index-by-index agreement is what "every replica's applied sequence
//! is a prefix of the others'" comes to. An entry is named by its proposer and request id (a
//! leader that adopts another's value keeps both; its own proposal number may differ).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::procs::{START_MARKER, strip_colours};

/// The tracing directive that makes a node log every entry it applies.
pub(crate) fn apply_directive() -> String {
    format!("{}=trace", microrep_core::mu::APPLY_LOG_TARGET)
}

/// Disagreements listed in full; past this only counted.
const LISTED: usize = 8;

/// What the check found over one history's node logs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedCheck {
    /// `apply` lines read, over every replica and incarnation.
    pub(crate) applies: u64,
    /// Distinct indices applied somewhere.
    pub(crate) indices: u64,
    /// Indices applied more than once (by two replicas, or by two incarnations of one), and so
    /// compared.
    pub(crate) compared: u64,
    /// Restarted replicas (empty) that caught up by copies of the log from its first entry.
    pub(crate) restarts_by_log_copy: u64,
    /// Restarted replicas that first restored a snapshot (the entries had been recycled).
    pub(crate) restarts_by_snapshot: u64,
    /// Running replicas that fell behind the recycled log and restored a snapshot to resume.
    pub(crate) lapped_by_snapshot: u64,
    /// Replicas whose log holds no `apply` line (the check then says nothing about them).
    pub(crate) silent_nodes: Vec<usize>,
    /// Indices at which two replicas applied different entries.
    pub(crate) disagreeing_indices: u64,
    /// The first few of them, explained.
    pub(crate) disagreements: Vec<String>,
}

impl AppliedCheck {
    pub(crate) fn agrees(&self) -> bool {
        self.disagreeing_indices == 0
    }
}

/// An applied entry, as its `apply` line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Applied {
    index: u64,
    proposer: u64,
    request: u64,
}

/// The targets `apply` lines have had: their own, and the replayer's module before that.
const APPLY_TARGETS: [&str; 2] = [microrep_core::mu::APPLY_LOG_TARGET, "microrep_core::mu::replayer"];

/// Parses one log line; `None` unless it is a replayer's `apply` line.
fn parse_apply(line: &str) -> Option<Applied> {
    if !APPLY_TARGETS.iter().any(|t| line.contains(t)) || !line.contains(" apply ") {
        return None;
    }
    let line = strip_colours(line);
    let (_, fields) = line.split_once(" apply ")?;
    let mut applied = Applied { index: u64::MAX, proposer: u64::MAX, request: u64::MAX };
    for field in fields.split_ascii_whitespace() {
        let Some((name, value)) = field.split_once('=') else { continue };
        let slot = match name {
            "index" => &mut applied.index,
            "proposer" => &mut applied.proposer,
            "request" => &mut applied.request,
            _ => continue,
        };
        *slot = value.parse().ok()?;
    }
    (applied.index != u64::MAX && applied.proposer != u64::MAX && applied.request != u64::MAX).then_some(applied)
}

/// The first replica seen applying an index, and what it applied there.
#[derive(Clone, Copy, Debug)]
struct FirstSeen {
    node: usize,
    proposer: u64,
    request: u64,
}

/// Folds the `apply` lines of every replica's log into one verdict.
#[derive(Debug, Default)]
struct Agreement {
    by_index: HashMap<u64, FirstSeen>,
    disagreeing: HashSet<u64>,
    check: AppliedCheck,
}

impl Agreement {
    /// One replica's log: its incarnations start at the harness's [`START_MARKER`] lines (in
    /// logs written before the harness wrote them, where its applied index goes back).
    fn add_node(&mut self, node: usize, lines: impl Iterator<Item = String>) {
        // The index last applied by the current incarnation, and whether it is a restart.
        let mut last: Option<u64> = None;
        let mut restarted = false;
        let mut any = false;
        for line in lines {
            if line.starts_with(START_MARKER) {
                restarted |= any;
                last = None;
                continue;
            }
            let Some(a) = parse_apply(&line) else { continue };
            self.check.applies += 1;
            if last.is_some_and(|l| a.index <= l) {
                // An unmarked restart (an older log).
                last = None;
                restarted = true;
            }
            match last {
                None if restarted && a.index == 0 => self.check.restarts_by_log_copy += 1,
                None if restarted => self.check.restarts_by_snapshot += 1,
                Some(l) if a.index > l + 1 => self.check.lapped_by_snapshot += 1,
                _ => {}
            }
            any = true;
            last = Some(a.index);
            self.add(node, a);
        }
        if !any {
            self.check.silent_nodes.push(node);
        }
    }

    fn add(&mut self, node: usize, a: Applied) {
        match self.by_index.entry(a.index) {
            Entry::Vacant(v) => {
                v.insert(FirstSeen { node, proposer: a.proposer, request: a.request });
                self.check.indices += 1;
            }
            Entry::Occupied(o) => {
                let first = *o.get();
                self.check.compared += 1;
                if (first.proposer, first.request) != (a.proposer, a.request) && self.disagreeing.insert(a.index) {
                    self.check.disagreeing_indices += 1;
                    if self.check.disagreements.len() < LISTED {
                        self.check.disagreements.push(format!(
                            "index {}: node {} applied the entry of proposer {} request {}, node {} that of proposer {} request {}",
                            a.index, first.node, first.proposer, first.request, node, a.proposer, a.request
                        ));
                    }
                }
            }
        }
    }

    fn finish(self) -> AppliedCheck {
        self.check
    }
}

/// Checks the logs `node-0.log`, `node-1.log`, ... of `replicas` replicas in `dir`.
pub(crate) fn check_dir(dir: &Path, replicas: usize) -> Result<AppliedCheck, String> {
    let mut agreement = Agreement::default();
    for node in 0..replicas {
        let path = dir.join(format!("node-{node}.log"));
        let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut lines = Vec::new();
        for line in BufReader::new(file).split(b'\n') {
            let line = line.map_err(|e| format!("reading {}: {e}", path.display()))?;
            // A line that is not UTF-8 is no `apply` line, and must not end the reading.
            lines.push(String::from_utf8_lossy(&line).into_owned());
        }
        agreement.add_node(node, lines.into_iter());
    }
    Ok(agreement.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(node: usize, index: u64, proposer: u64, request: u64) -> String {
        format!(
            "2026-11-23T19:34:02.272000Z TRACE microrep_core::apply: apply node={node} index={index} prop=256 proposer={proposer} request={request}"
        )
    }

    fn check(nodes: &[Vec<String>]) -> AppliedCheck {
        let mut agreement = Agreement::default();
        for (node, lines) in nodes.iter().enumerate() {
            agreement.add_node(node, lines.iter().cloned());
        }
        agreement.finish()
    }

    #[test]
    fn a_line_with_colour_codes_parses() {
        let coloured = "\u{1b}[2m2026-11-23T19:34:02.272000Z\u{1b}[0m \u{1b}[35mTRACE\u{1b}[0m \u{1b}[2mmicrorep_core::mu::replayer\u{1b}[0m\u{1b}[2m:\u{1b}[0m apply \u{1b}[3mnode\u{1b}[0m\u{1b}[2m=\u{1b}[0m0 \u{1b}[3mindex\u{1b}[0m\u{1b}[2m=\u{1b}[0m7 \u{1b}[3mprop\u{1b}[0m\u{1b}[2m=\u{1b}[0m256 \u{1b}[3mproposer\u{1b}[0m\u{1b}[2m=\u{1b}[0m2 \u{1b}[3mrequest\u{1b}[0m\u{1b}[2m=\u{1b}[0m1795462442208592270";
        assert_eq!(parse_apply(coloured), Some(Applied { index: 7, proposer: 2, request: 1795462442208592270 }));
        assert_eq!(parse_apply(&line(1, 3, 0, 9)), Some(Applied { index: 3, proposer: 0, request: 9 }));
    }

    #[test]
    fn other_lines_and_truncated_apply_lines_are_not_applies() {
        assert_eq!(
            parse_apply("2026 TRACE microrep_core::mu::leader: accept node=0 index=3 proposer=0 request=1"),
            None
        );
        assert_eq!(
            parse_apply("2026 TRACE microrep_core::mu::replayer: apply node=0 index=3 prop=256 proposer=0"),
            None
        );
        assert_eq!(parse_apply("2026 WARN microrep: apply failed"), None);
    }

    fn start(n: u32) -> String {
        format!("{START_MARKER} {n}")
    }

    #[test]
    fn replicas_that_applied_prefixes_of_one_sequence_agree() {
        let entry = |node, i: u64| line(node, i, i % 3, 100 + i);
        let full: Vec<String> = std::iter::once(start(1)).chain((0..10).map(|i| entry(0, i))).collect();
        let prefix: Vec<String> = std::iter::once(start(1)).chain((0..6).map(|i| entry(1, i))).collect();
        // Replica 2 fell behind and restored a snapshot at 7, was killed, came back and copied
        // the log from 0, was killed again and restored a snapshot at 5; a start that applied
        // nothing is no restart of its own.
        let mut restarted = vec![start(1)];
        restarted.extend([0, 1, 2, 7, 8].map(|i| entry(2, i)));
        restarted.extend([start(2), entry(2, 0), entry(2, 1), start(3), start(4), entry(2, 5)]);
        let c = check(&[full, prefix, restarted]);
        assert!(c.agrees(), "{c:?}");
        assert_eq!((c.applies, c.indices, c.compared), (24, 10, 14));
        assert_eq!((c.restarts_by_log_copy, c.restarts_by_snapshot, c.lapped_by_snapshot), (1, 1, 1));
        assert!(c.silent_nodes.is_empty());
    }

    #[test]
    fn a_log_without_start_markers_shows_restarts_where_the_index_goes_back() {
        let entry = |i: u64| line(0, i, 0, 100 + i);
        let old: Vec<String> = [0, 1, 2, 3, 0, 1, 2, 6, 7].map(entry).into_iter().collect();
        let c = check(&[old]);
        assert_eq!((c.restarts_by_log_copy, c.restarts_by_snapshot, c.lapped_by_snapshot), (1, 0, 1));
        let old: Vec<String> = [0, 1, 2, 3, 2, 3].map(entry).into_iter().collect();
        let c = check(&[old]);
        assert_eq!((c.restarts_by_log_copy, c.restarts_by_snapshot, c.lapped_by_snapshot), (0, 1, 0));
    }

    #[test]
    fn a_replica_that_applied_another_entry_at_one_index_is_reported() {
        let good: Vec<String> = (0..5).map(|i| line(0, i, 0, 100 + i)).collect();
        // A deposed leader applied its own unchosen entry at 3 where the others have a no-op.
        let mut chosen = good.clone();
        chosen[3] = line(1, 3, 1, 0);
        let c = check(&[chosen.clone(), chosen, good]);
        assert!(!c.agrees());
        assert_eq!(c.disagreeing_indices, 1);
        assert_eq!(
            c.disagreements,
            vec!["index 3: node 0 applied the entry of proposer 1 request 0, node 2 that of proposer 0 request 103"]
        );
    }

    #[test]
    fn a_disagreement_is_counted_once_per_index_and_its_listing_is_bounded() {
        let a: Vec<String> = (0..20).map(|i| line(0, i, 0, i)).collect();
        let b: Vec<String> = (0..20).map(|i| line(1, i, 1, i)).collect();
        let c = check(&[a, b.clone(), b]);
        assert_eq!(c.disagreeing_indices, 20);
        assert_eq!(c.disagreements.len(), LISTED);
    }

    #[test]
    fn a_replica_without_apply_lines_is_named() {
        let a: Vec<String> = (0..3).map(|i| line(0, i, 0, i)).collect();
        let c = check(&[a, vec!["2026 WARN microrep: something".into()]]);
        assert_eq!(c.silent_nodes, vec![1]);
        assert!(c.agrees());
    }

    #[test]
    fn check_dir_reads_every_replica_and_names_a_missing_log() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-applied-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("node-0.log"), format!("{}\n{}\n", line(0, 0, 0, 1), line(0, 1, 0, 2))).expect("log");
        // A line of stray bytes before replica 1's apply line does not hide it.
        let mut stray = b"\xff\xfe not utf-8\n".to_vec();
        stray.extend_from_slice(format!("{}\n", line(1, 0, 0, 1)).as_bytes());
        std::fs::write(dir.join("node-1.log"), stray).expect("log");
        let c = check_dir(&dir, 2).expect("check");
        assert_eq!((c.applies, c.indices, c.compared), (3, 2, 1));
        let missing = check_dir(&dir, 3).expect_err("node-2.log is missing");
        assert!(missing.contains("node-2.log"), "{missing}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
