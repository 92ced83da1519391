//! What the harness adds to the test kit's process table (`microrep_testkit::procs`): the shm
//! fabric's fencing of a stalled writer, read from the nodes' logs, so that a fenced node is
//! not taken for one that crashed.

use std::path::PathBuf;

pub(crate) use microrep_testkit::procs::START_MARKER;

/// What the shm fabric logs when it fences a writer stalled mid-write, naming it `pid=N`.
const FENCING_MESSAGE: &str = "fencing a writer stalled mid-write";

/// The tracing directive that keeps the fencing line in a node's log whatever else is filtered.
pub(crate) fn fencing_directive() -> String {
    format!("{}=warn", microrep_fabric::shm::FENCING_LOG_TARGET)
}

/// Whether one of the `logs` of a cluster's nodes says its node fenced process `pid` (the shm
/// fabric names the pid; the line may carry terminal colour codes).
pub(crate) fn fenced_by_a_peer(logs: &[PathBuf], pid: i32) -> bool {
    let needle = format!("pid={pid}");
    logs.iter().any(|log| {
        std::fs::read_to_string(log).is_ok_and(|log| {
            log.lines()
                .filter(|line| line.contains(FENCING_MESSAGE))
                .any(|line| strip_colours(line).trim_end().ends_with(&needle))
        })
    })
}

/// `line` without ANSI escape sequences (`ESC [ ... letter`).
pub(crate) fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fencing_line_names_the_pid_through_colour_codes() {
        let log = std::env::temp_dir().join(format!("microrep-faults-fenced-{}.log", std::process::id()));
        let line =
            format!("WARN shm fabric: {FENCING_MESSAGE} writer=node 0 \u{1b}[3mpid\u{1b}[0m\u{1b}[2m=\u{1b}[0m4242\n");
        std::fs::write(&log, line).expect("write log");
        assert!(fenced_by_a_peer(std::slice::from_ref(&log), 4242));
        assert!(!fenced_by_a_peer(std::slice::from_ref(&log), 424), "another pid");
        let _ = std::fs::remove_file(log);
    }
}
