//! `microrep topic pub|sub` as a user runs it: two subscriber processes and one publisher
//! process on shm; both subscribers print the published messages in the publisher's order,
//! and bad input is refused with a message saying why.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Kills the child processes still running and removes the group's directory at the end.
struct Cleanup {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn topic(dir: &str, id: &str, verb: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_microrep"));
    command
        .args(["topic", verb, "--dir", dir, "--id", id, "--members", "0,1,2"])
        .args(["--topic", "news=atomic", "--topic", "feed=unordered"])
        .args(extra);
    command
}

#[test]
fn two_subscribers_print_what_a_publisher_published_in_its_order() {
    let dir = format!("/dev/shm/microrep-topic-cli-{}", std::process::id());
    let mut cleanup = Cleanup { dir: PathBuf::from(&dir), children: Vec::new() };
    for id in ["1", "2"] {
        let child = topic(&dir, id, "sub", &["--count", "3"]).stdout(Stdio::piped()).spawn().expect("run sub");
        cleanup.children.push(child);
    }
    let published = topic(&dir, "0", "pub", &["--on", "news", "one", "two", "three"]).output().expect("run pub");
    assert!(published.status.success(), "pub failed: {}", String::from_utf8_lossy(&published.stderr));
    assert!(String::from_utf8_lossy(&published.stdout).contains("published 3 message(s) on news"));
    for child in std::mem::take(&mut cleanup.children) {
        let out = child.wait_with_output().expect("wait for sub");
        assert!(out.status.success(), "sub failed");
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("news"))
            .map(str::to_string)
            .collect();
        assert_eq!(lines, ["news <node 0>: one", "news <node 0>: two", "news <node 0>: three"]);
    }
}

#[test]
fn bad_input_is_refused_with_the_reason() {
    let dir = format!("/dev/shm/microrep-topic-cli-bad-{}", std::process::id());
    let _cleanup = Cleanup { dir: PathBuf::from(&dir), children: Vec::new() };
    let cases: [(&[&str], &str); 3] = [
        (&["sub", "--dir", &dir, "--id", "0", "--members", "0", "--topic", "news=fast"], "unknown QoS `fast`"),
        (&["sub", "--dir", &dir, "--id", "5", "--members", "0,1", "--topic", "news=atomic"], "not a member"),
        (&["sub", "--dir", &dir, "--id", "0", "--members", "0", "--topic", "l=logged"], "give a log directory"),
    ];
    for (args, reason) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_microrep")).arg("topic").args(args).output().expect("run");
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
}
