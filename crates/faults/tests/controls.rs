//! The harness end to end against one redis-server (linearizable by construction): it must
//! pass a correct system and must report a violation when the clients fake stale reads.
//! Needs `redis-server` and `go` on PATH (docs/RELIABILITY.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("microrep-faults-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn harness(out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_microrep-faults"))
        .args(["--target", "redis", "--duration", "3", "--clients", "4", "--rate", "200", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .expect("the harness runs")
}

fn summary(out: &Path, seed: u64) -> serde_json::Value {
    let text = std::fs::read(out.join(format!("seed-{seed}/summary.json"))).expect("a summary per history");
    serde_json::from_slice(&text).expect("the summary is JSON")
}

/// Pausing the server past the operation timeout leaves writes of unknown outcome that take
/// effect after the resume: the checker must accept them.
#[test]
fn a_single_redis_passes_every_check_through_pauses() {
    let out = out_dir("redis-pass");
    let run =
        harness(&out, &["--seed", "11", "--faults", "pause-all", "--fault-gap-ms", "800", "--op-timeout-ms", "50"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "exit {:?}\n{stdout}\n{}", run.status, String::from_utf8_lossy(&run.stderr));
    let s = summary(&out, 11);
    assert_eq!(s["verdict"], "pass", "{s}");
    assert_eq!(s["linearizability"], "linearizable");
    assert!(s["outcomes"]["ok"].as_u64().is_some_and(|ok| ok > 100), "too few operations: {s}");
    assert!(s["faults"]["pause-all"].as_u64().is_some_and(|n| n > 0), "the server was paused: {s}");
    assert!(s["outcomes"]["info"].as_u64().is_some_and(|n| n > 0), "some operations timed out: {s}");
    let history = std::fs::read_to_string(out.join("seed-11/history.json")).expect("history kept");
    assert!(history.contains(r#""op":"incr""#) && history.contains(r#""op":"append""#));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn stale_reads_are_reported_as_a_violation() {
    let out = out_dir("redis-stale");
    let run = harness(&out, &["--seed", "12", "--corrupt-reads", "0.05", "--expect-anomaly"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "exit {:?}\n{stdout}", run.status);
    let s = summary(&out, 12);
    assert_eq!(s["verdict"], "anomaly", "{s}");
    assert_eq!(s["linearizability"], "not-linearizable");
    let report = std::fs::read_to_string(out.join("seed-12/checker.txt")).expect("checker report kept");
    assert!(report.contains("impossible in this state"), "{report}");
    assert!(out.join("seed-12/violation.html").is_file(), "the violation is visualised");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn without_expected_anomalies_a_violation_fails_the_run() {
    let out = out_dir("redis-stale-fails");
    let run = harness(&out, &["--seed", "13", "--corrupt-reads", "0.05"]);
    assert_eq!(run.status.code(), Some(1), "{}", String::from_utf8_lossy(&run.stdout));
    let _ = std::fs::remove_dir_all(&out);
}

/// Killing redis (no persistence) and starting it again loses acknowledged writes: the final
/// reads must expose them. This also drives the nemesis's kill and restart on a real process.
#[test]
fn a_server_that_forgets_acknowledged_writes_is_caught() {
    let out = out_dir("redis-forgets");
    let run =
        harness(&out, &["--seed", "14", "--faults", "kill-majority", "--fault-gap-ms", "1000", "--expect-anomaly"]);
    assert!(run.status.success(), "exit {:?}\n{}", run.status, String::from_utf8_lossy(&run.stdout));
    let s = summary(&out, 14);
    assert!(s["faults"]["kill-majority"].as_u64().is_some_and(|n| n > 0), "{s}");
    assert!(s["lost_writes"].as_array().is_some_and(|l| !l.is_empty()), "{s}");
    let _ = std::fs::remove_dir_all(&out);
}
