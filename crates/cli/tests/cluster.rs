//! The README's main job: `microrep cluster up` runs a 3-replica cluster with a workload, the
//! replicas agree, a killed leader is replaced, and nothing is left behind.

use std::process::{Command, Stdio};
use std::sync::Mutex;

/// One cluster at a time: several clusters of spinning replicas at once on a two-core machine
/// would starve each other into fail-overs.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

fn one_cluster() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn cluster_up(extra: &[&str]) -> (bool, String, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["cluster", "up", "--replicas", "3", "--entries", "2000"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run microrep cluster up");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the cluster");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), pid)
}

fn assert_cleaned_up(pid: u32) {
    let dir = std::path::PathBuf::from(format!("/dev/shm/microrep-cluster-{pid}"));
    assert!(!dir.exists(), "the cluster left {} behind", dir.display());
}

#[test]
fn three_replicas_apply_the_workload_and_agree() {
    let _one = one_cluster();
    let (ok, text, pid) = cluster_up(&[]);
    assert!(ok, "cluster failed:\n{text}");
    assert!(text.contains("3 live replicas applied 2000 commands each; state digests agree"), "{text}");
    assert_cleaned_up(pid);
}

#[test]
fn a_killed_leader_is_replaced_and_the_survivors_agree() {
    let _one = one_cluster();
    let (ok, text, pid) = cluster_up(&["--kill-leader"]);
    assert!(ok, "cluster failed:\n{text}");
    assert!(text.contains("(SIGKILL)"), "{text}");
    assert!(text.contains("2 live replicas applied 2000 commands each; state digests agree"), "{text}");
    assert_cleaned_up(pid);
}

#[test]
fn replication_benchmark_reports_every_size_next_to_its_baseline() {
    let _one = one_cluster();
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "replication", "--samples", "300", "--sizes", "8,512", "--json"])
        .output()
        .expect("run microrep bench replication");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for size in ["8", "512"] {
        for name in ["microrep", "unreplicated"] {
            let row = text
                .lines()
                .find(|l| l.contains(&format!("\"bytes\":{size},")) && l.contains(&format!("\"impl\":\"{name}\"")))
                .unwrap_or_else(|| panic!("no {name} row for {size} bytes in:\n{text}"));
            assert!(row.contains("\"samples\":300"), "{row}");
        }
    }
}

#[test]
fn killing_the_leader_of_a_cluster_too_small_to_survive_it_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["cluster", "up", "--replicas", "2", "--kill-leader"])
        .output()
        .expect("run microrep cluster up");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kill-leader needs at least 3 replicas"), "{err}");
}
