//! Prometheus metrics from the command line: `microrep node` with `node.metrics` serves them,
//! and `microrep cluster up --metrics-base-port` gives replica i port BASE + i.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};

mod scrape;
use scrape::scrape;
use std::time::{Duration, Instant};

/// A child process killed if the test ends early.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_node_with_node_metrics_serves_them_until_sigterm() {
    let name = format!("metrics-cli-{}", std::process::id());
    let dir = format!("/dev/shm/microrep-{name}");
    // Below Linux's ephemeral range, apart from the other CLI tests' ports.
    let port = 12_000 + std::process::id() % 2_000;
    let path = std::env::temp_dir().join(format!("microrep-test-{name}.toml"));
    let config = format!(
        "[cluster]\nname = \"{name}\"\nshm_dir = \"{dir}\"\nmembers = [{{ id = 0, client = \"127.0.0.1:{port}\" }}]\n[node]\nid = 0\n"
    );
    std::fs::write(&path, config).expect("write config");
    let node = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["node", "--set", "node.metrics=127.0.0.1:0", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run microrep node");
    let mut node = KillOnDrop(node);
    let mut lines = BufReader::new(node.0.stdout.take().expect("stdout")).lines();
    let line = lines.nth(1).expect("a second line").expect("utf8");
    let addr = line
        .strip_prefix("node 0: metrics at http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{line}"));
    let addr: SocketAddr = addr.parse().expect("an address");
    // A single member leads itself once its background plane has run.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !scrape(addr).contains("\nmicrorep_role{role=\"leader\"} 1\n") {
        assert!(Instant::now() < deadline, "the metrics never showed the node leading");
        std::thread::yield_now();
    }
    let pid = rustix::process::Pid::from_raw(node.0.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    assert!(node.0.wait().expect("wait").success(), "the node must stop cleanly on SIGTERM");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cluster_up_names_a_metrics_port_it_cannot_use() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        // Replica 0's metrics port is the taken one, checked before any other port of the
        // metrics range (which another process may hold for a moment on a busy machine).
        .args(["cluster", "up", "--ops", "0", "--metrics-base-port"])
        .arg(port.to_string())
        .args(["--base-port", &(14_000 + std::process::id() % 2_000).to_string()])
        .output()
        .expect("run microrep cluster up");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot serve metrics on 127.0.0.1:{port}")) && err.contains("--metrics-base-port"),
        "{err}"
    );
}

#[test]
fn cluster_up_gives_each_replica_its_metrics_port() {
    let base = 16_000 + std::process::id() % 2_000;
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["cluster", "up", "--ops", "200", "--metrics-base-port", &base.to_string()])
        .args(["--base-port", &(18_000 + std::process::id() % 1_000).to_string()])
        .output()
        .expect("run microrep cluster up");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for id in 0..3 {
        let line = format!("metrics of node {id}: http://127.0.0.1:{}/metrics", base + id);
        assert!(text.contains(&line), "no {line:?} in\n{text}");
    }
}
