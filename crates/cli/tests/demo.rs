//! The README's main job: `microrep demo` runs end to end and cleans up after itself.

use std::process::Command;

#[test]
fn demo_walks_through_the_fabric_contract_and_cleans_up() {
    let child = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["demo", "--entries", "3000"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run microrep demo");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed:\n{text}");
    for expected in [
        "-> Err(PermissionDenied) (a stale leader cannot write)",
        "target checks every slot's checksum: 3000 0 (valid, corrupt)",
        "next write -> Err(PermissionDenied); target re-checks: 3000 0",
        "next write -> Err(PeerUnreachable)",
        "done.",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    let dir = std::path::PathBuf::from(format!("/dev/shm/microrep-demo-{pid}"));
    assert!(!dir.exists(), "the demo left {} behind", dir.display());
}

#[test]
fn bad_arguments_are_refused_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["demo", "--entries", "zero"])
        .output()
        .expect("run microrep demo");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'zero' for '--entries"), "{err}");
}
