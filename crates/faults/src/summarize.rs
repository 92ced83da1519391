//! `microrep-faults --summarize DIR...`: the totals over the histories that earlier runs left
//! in their artifact directories (`DIR/seed-N/summary.json`), finished or stopped part way,
//! with the agreement check of crate::applied run on the node logs of the histories recorded
//! before it existed.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};

use microrep::events::EventsError;

use crate::applied;
use crate::report::{HistoryReport, Totals, Verdict};

/// Why the histories could not be totalled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SummarizeError {
    #[error("{}: {source}", dir.display())]
    List { dir: PathBuf, source: std::io::Error },
    #[error("{}: no seed-N/summary.json in it", .0.display())]
    NoHistories(PathBuf),
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not a history's summary: {source}", path.display())]
    NotASummary { path: PathBuf, source: serde_json::Error },
    /// The agreement check could not read a node's events.
    #[error(transparent)]
    Events(#[from] EventsError),
}

/// Reads every history under `dirs`, prints the ones that did not pass and the totals, and
/// returns the worst verdict.
pub(crate) fn summarize(dirs: &[PathBuf]) -> Result<(Totals, Verdict), SummarizeError> {
    let mut totals = Totals::default();
    let mut worst = Verdict::Pass;
    for dir in dirs {
        let histories = history_dirs(dir)?;
        if histories.is_empty() {
            return Err(SummarizeError::NoHistories(dir.clone()));
        }
        println!("{}: {} histories", dir.display(), histories.len());
        for (_, history) in histories {
            let report = read_history(&history)?;
            if report.verdict != Verdict::Pass {
                report.print_line();
            }
            worst = worst.worst(report.verdict);
            totals.add(&report);
        }
    }
    totals.print();
    Ok((totals, worst))
}

/// The `seed-N` subdirectories of `dir` that hold a `summary.json`, in seed order.
fn history_dirs(dir: &Path) -> Result<Vec<(u64, PathBuf)>, SummarizeError> {
    let list = |source| SummarizeError::List { dir: dir.to_path_buf(), source };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(list)? {
        let entry = entry.map_err(list)?;
        let name = entry.file_name();
        let seed = name.to_str().and_then(|n| n.strip_prefix("seed-")).and_then(|s| s.parse::<u64>().ok());
        if let Some(seed) = seed
            && entry.path().join("summary.json").is_file()
        {
            found.push((seed, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// One history's report; the agreement check is run on its nodes' events if the report
/// predates it and the events are there.
fn read_history(dir: &Path) -> Result<HistoryReport, SummarizeError> {
    let path = dir.join("summary.json");
    let bytes = std::fs::read(&path).map_err(|source| SummarizeError::Read { path: path.clone(), source })?;
    let mut report: HistoryReport =
        serde_json::from_slice(&bytes).map_err(|source| SummarizeError::NotASummary { path: path.clone(), source })?;
    let ran = report.target.starts_with("microrep") && report.linearizability.is_some();
    if report.applied.is_none() && ran && applied::events_path(dir, 0).is_file() {
        let check = applied::check_dir(dir, report.nodes())?;
        if check.silent_nodes.len() < report.nodes() {
            report.add_applied(check);
            if !report.anomalies.is_empty() {
                report.verdict = Verdict::Anomaly;
            } else if !report.errors.is_empty() {
                report.verdict = report.verdict.worst(Verdict::Error);
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes the `applied` events of entries `digests` (by index) as replica `node`'s.
    fn write_events(dir: &Path, node: usize, digests: &[&str]) {
        let log = microrep::events::EventLog::open(Some(&applied::events_path(dir, node))).expect("events file");
        for (index, digest) in digests.iter().enumerate() {
            log.emit(microrep::events::NodeEvent::Applied { index: index as u64, digest: Some(digest.to_string()) });
        }
    }

    /// A passing 2-replica history's summary as an older harness wrote it (no `applied`).
    fn old_summary(seed: u64) -> String {
        format!(
            r#"{{"seed": {seed}, "target": "microrep", "replicas": 2, "duration_s": 60.0, "elapsed_s": 61.0,
              "outcomes": {{"ok": 10, "fail": 1, "info": 2}}, "faults": {{"kill-leader": 3, "pause-follower": 1}},
              "stale_leader_wakeups": 1, "unexpected_replies": 0, "linearizability": "linearizable",
              "lost_writes": [], "converged": true, "anomalies": [], "errors": [], "verdict": "pass",
              "phases": {{"leader_after_heal_s": 0.1, "final_reads_s": 0.2, "checker_s": 0.3, "convergence_s": 0.4}}}}"#
        )
    }

    #[test]
    fn old_histories_are_totalled_and_their_events_rechecked() {
        let root = std::env::temp_dir().join(format!("microrep-faults-summarize-{}", std::process::id()));
        let (good, bad) = (root.join("seed-7"), root.join("seed-12"));
        for (dir, seed) in [(&good, 7), (&bad, 12)] {
            std::fs::create_dir_all(dir).expect("dir");
            std::fs::write(dir.join("summary.json"), old_summary(seed)).expect("summary");
            write_events(dir, 0, &["a", "b"]);
        }
        write_events(&good, 1, &["a"]);
        // Replica 1 of seed 12 applied another entry at index 1.
        write_events(&bad, 1, &["a", "c"]);
        std::fs::create_dir_all(root.join("unrelated")).expect("dir");

        let (totals, worst) = summarize(std::slice::from_ref(&root)).expect("summarize");
        assert_eq!(worst, Verdict::Anomaly);
        assert_eq!(totals.histories, 2);
        assert_eq!(totals.outcomes.ok, 20);
        assert_eq!(totals.anomalous_seeds, vec![12]);
        assert_eq!((totals.applied_checked, totals.applied_compared), (2, 3));

        let empty = summarize(&[root.join("unrelated")]).expect_err("empty");
        assert!(empty.to_string().contains("no seed-N/summary.json"), "{empty}");
        std::fs::write(good.join("summary.json"), "{").expect("summary");
        let bad = summarize(std::slice::from_ref(&root)).expect_err("bad json");
        assert!(matches!(&bad, SummarizeError::NotASummary { path, .. } if path.starts_with(&good)), "{bad}");
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
