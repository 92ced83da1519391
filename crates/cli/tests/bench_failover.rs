//! `microrep bench failover`: every injected failure is accounted for, in one column or another.

use std::process::Command;

mod json_row;

use json_row::number;

#[test]
fn every_kill_and_pause_is_recovered_unrecovered_or_moved() {
    every_failure_is_accounted_for(&[]);
}

/// The same for failures that each strike after 100 ms without proposals (with 2 ms heartbeats
/// the cluster rests after 32 ms): the successor proposes again.
#[test]
fn every_failure_of_an_idle_leader_is_accounted_for_too() {
    every_failure_is_accounted_for(&["--idle-before-ms", "100"]);
}

fn every_failure_is_accounted_for(extra: &[&str]) {
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
}
