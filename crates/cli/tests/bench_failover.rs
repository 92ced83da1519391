//! `microrep bench failover`: every injected failure is accounted for, in one column or another.

use std::process::Command;

mod json_row;

use json_row::number;

#[test]
fn every_kill_and_pause_is_recovered_unrecovered_or_moved() {
    every_failure_is_accounted_for(&[]);
}

/// The same for failures that each strike after 100 ms without proposals (with 2 ms heartbeats
/// the cluster rests after 32 ms), and none goes unrecovered: the successor proposes again, and
/// commits, although the leader it replaced was resting.
#[test]
fn every_failure_of_an_idle_leader_is_accounted_for_and_recovered() {
    let text = every_failure_is_accounted_for(&["--idle-before-ms", "100"]);
    let row = text.lines().find(|l| l.contains("\"kind\":\"all\",\"part\":\"total\"")).expect("a total row");
    assert_eq!(number(row, "unrecovered"), 0, "{row}");
}

/// Runs the benchmark with `extra` arguments, checks that every failure is counted once, and
/// returns its JSON lines.
fn every_failure_is_accounted_for(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "failover", "--failures", "4", "--kind", "both", "--heartbeat-us", "2000", "--json"])
        .args(extra)
        .output()
        .expect("run microrep bench failover");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for (kind, failures) in [("kill", 2), ("stop", 2), ("all", 4)] {
        let row = text
            .lines()
            .find(|l| l.contains(&format!("\"kind\":\"{kind}\",\"part\":\"total\"")))
            .unwrap_or_else(|| panic!("no total row for {kind} in:\n{text}"));
        let counted = number(row, "recovered") + number(row, "unrecovered") + number(row, "moved");
        assert_eq!(counted, failures, "{row}");
        assert!(number(row, "slow") <= number(row, "recovered"), "{row}");
    }
    text.into_owned()
}
