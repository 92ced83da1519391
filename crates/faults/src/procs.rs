//! What the harness adds to the test kit's process table (`microrep_testkit::procs`): a node
//! fenced by a peer is told from one that crashed by the peers' structured `fenced` events.

use std::path::PathBuf;

use microrep::events::{self, NodeEvent};

/// Whether the events of a cluster's nodes (`events`, one file per node) say that one of them
/// fenced process `pid`. Unreadable files say nothing.
pub(crate) fn fenced_by_a_peer(events: &[PathBuf], pid: i32) -> bool {
    events.iter().any(|path| {
        events::read(path).is_ok_and(|events| {
            events.iter().any(|e| matches!(e, NodeEvent::Fenced { pid: fenced, .. } if *fenced == pid))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_event_of_any_node_names_the_pid() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-fenced-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (quiet, fencer) = (dir.join("node-0.events.jsonl"), dir.join("node-1.events.jsonl"));
        std::fs::write(&quiet, "").expect("empty events");
        let log = events::EventLog::open(Some(&fencer)).expect("open");
        log.emit(NodeEvent::Start { node: 1, pid: 7 });
        log.emit(NodeEvent::Fenced { writer: 0, pid: 4242 });
        let files = [quiet, fencer, dir.join("missing.events.jsonl")];
        assert!(fenced_by_a_peer(&files, 4242));
        assert!(!fenced_by_a_peer(&files, 424), "another pid");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
