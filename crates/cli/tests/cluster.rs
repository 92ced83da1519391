//! The README's main job: `microrep cluster up` runs a 3-replica key-value cluster with a demo
//! load over RESP, nothing acknowledged is lost, the replicas agree, a killed leader is
//! replaced, and nothing is left behind. Also `microrep node`, `microrep status` and the
//! benchmarks' smoke runs.

use std::process::{Command, Stdio};
use std::sync::Mutex;

/// One cluster at a time: several clusters of spinning replicas at once on a two-core machine
/// would starve each other into fail-overs.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

fn one_cluster() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A client port range of its own for each test binary run (tests of one binary are
/// serialised), below Linux's ephemeral range (32768..) so that no outgoing connection holds it.
fn base_port() -> String {
    (20_000 + std::process::id() % 9_000).to_string()
}

fn cluster_up(extra: &[&str]) -> (bool, String, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["cluster", "up", "--replicas", "3", "--ops", "2000", "--base-port", &base_port()])
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
    assert!(text.contains("done: 2000 commands answered"), "{text}");
    assert!(text.contains("acknowledged writes read back"), "{text}");
    assert!(text.contains("3 live replicas applied") && text.contains("state digests agree"), "{text}");
    assert_cleaned_up(pid);
}

#[test]
fn a_killed_leader_is_replaced_and_the_survivors_agree() {
    let _one = one_cluster();
    let (ok, text, pid) = cluster_up(&["--kill-leader"]);
    assert!(ok, "cluster failed:\n{text}");
    assert!(text.contains("(SIGKILL)"), "{text}");
    assert!(text.contains("acknowledged writes read back"), "{text}");
    assert!(text.contains("2 live replicas applied") && text.contains("state digests agree"), "{text}");
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
            // Every attempt counts: those the leader aborted are reported next to the samples.
            assert!(row.contains("\"samples\":300") && row.contains("\"aborted\":"), "{row}");
        }
    }
}

#[test]
fn replication_benchmark_on_tcp_reports_the_ping_pong_baseline_and_the_ratio() {
    let _one = one_cluster();
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "replication", "--fabric", "tcp", "--samples", "200", "--sizes", "8", "--json"])
        // Below Linux's ephemeral range (32768+), which the other tests' connections draw from.
        .args(["--base-port", &(10_000 + std::process::id() % 10_000).to_string()])
        .output()
        .expect("run microrep bench replication --fabric tcp");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for name in ["microrep", "unreplicated", "tcp-ping-pong"] {
        let row = text
            .lines()
            .find(|l| l.contains("\"fabric\":\"tcp\"") && l.contains(&format!("\"impl\":\"{name}\"")))
            .unwrap_or_else(|| panic!("no {name} row in:\n{text}"));
        assert!(row.contains("\"bytes\":8,") && row.contains("\"samples\":200"), "{row}");
    }
    let ratio = text
        .lines()
        .find(|l| l.contains("\"ratio\":\"microrep/tcp-ping-pong\""))
        .unwrap_or_else(|| panic!("no ratio in:\n{text}"));
    assert!(ratio.contains("\"p50\":") && !ratio.contains("NaN") && !ratio.contains("inf"), "{ratio}");
}

#[test]
fn the_etcd_benchmark_without_its_load_generator_says_how_to_build_it() {
    let missing = std::env::temp_dir().join(format!("no-etcdbench-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "etcd", "--etcdbench"])
        .arg(&missing)
        .output()
        .expect("run microrep bench etcd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not found") && err.contains("go build"), "{err}");
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

#[test]
fn a_tcp_cluster_applies_the_workload_and_agrees() {
    let _one = one_cluster();
    let (ok, text, pid) = cluster_up(&["--fabric", "tcp"]);
    assert!(ok, "cluster failed:\n{text}");
    assert!(text.contains("3 replicas on the tcp fabric"), "{text}");
    assert!(text.contains("acknowledged writes read back"), "{text}");
    assert!(text.contains("3 live replicas applied") && text.contains("state digests agree"), "{text}");
    assert_cleaned_up(pid);
}

#[test]
fn an_override_that_does_not_fit_the_fabric_is_refused_before_any_node_starts() {
    // The same ports as the other tests: `cluster up` checks them before the overrides.
    let _one = one_cluster();
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["cluster", "up", "--base-port", &base_port(), "--set", "node.verbs.device=rxe0"])
        .output()
        .expect("run microrep cluster up");
    assert!(!out.status.success());
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(err.contains("--set: node.verbs: applies to fabric = \"verbs\" only"), "{err}");
    assert!(!text.contains("serving RESP"), "{text}");
    assert_cleaned_up(out_pid(&text));
}

/// The pid in `cluster up`'s first line (its directory's name).
fn out_pid(text: &str) -> u32 {
    let start = text.find("microrep-cluster-").expect("the cluster directory") + "microrep-cluster-".len();
    text[start..].split(|c: char| !c.is_ascii_digit()).next().and_then(|p| p.parse().ok()).expect("a pid")
}

#[test]
fn a_verbs_node_without_its_device_fails_with_a_clear_error() {
    let scratch = write_config(
        "verbs",
        "[cluster]\nname = \"v\"\nfabric = \"verbs\"\nmembers = [{ id = 0, client = \"127.0.0.1:1\", fabric = \"127.0.0.1:2\" }]\n[node]\nid = 0\n[node.verbs]\ndevice = \"microrep-missing0\"\n",
        None,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["node", "--config"])
        .arg(scratch.path())
        .output()
        .expect("run microrep node");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "verbs") {
        assert!(err.contains("no usable RDMA device") && err.contains("microrep-missing0"), "{err}");
    } else {
        assert!(err.contains("this build has no verbs fabric") && err.contains("--features verbs"), "{err}");
    }
}

/// A child process killed if the test ends early.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test's configuration file, and the shared-memory directory its nodes make, removed when
/// the test ends, passing or failing (declared before the nodes, so dropped after them).
struct Scratch {
    config: std::path::PathBuf,
    shm_dir: Option<String>,
}

impl Scratch {
    fn path(&self) -> &std::path::Path {
        &self.config
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
        if let Some(dir) = &self.shm_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn write_config(name: &str, body: &str, shm_dir: Option<&str>) -> Scratch {
    let config = std::env::temp_dir().join(format!("microrep-test-{name}-{}.toml", std::process::id()));
    std::fs::write(&config, body).expect("write config");
    Scratch { config, shm_dir: shm_dir.map(str::to_string) }
}

#[test]
fn a_bad_config_is_refused_naming_the_key() {
    let scratch = write_config(
        "bad",
        "[cluster]\nname = \"t\"\nmembers = [{ id = 0, client = \"127.0.0.1:1\" }]\n[cluster.log]\nslots = 2\n[node]\nid = 0\n",
        None,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["node", "--config"])
        .arg(scratch.path())
        .output()
        .expect("run microrep node");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.log.slots"), "{err}");
}

#[test]
fn a_node_serves_reports_its_status_and_stops_on_sigterm() {
    let _one = one_cluster();
    let name = format!("status-{}", std::process::id());
    let dir = format!("/dev/shm/microrep-{name}");
    let port = 30_000 + std::process::id() % 2_500;
    let scratch = write_config(
        "status",
        &format!(
            "[cluster]\nname = \"{name}\"\nshm_dir = \"{dir}\"\nmembers = [{{ id = 0, client = \"127.0.0.1:{port}\" }}]\n[node]\nid = 0\n"
        ),
        Some(&dir),
    );
    let path = scratch.path();
    let node = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["node", "--config"])
        .arg(path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run microrep node");
    let mut node = KillOnDrop(node);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(node.0.stdout.take().expect("stdout")));
    let first = lines.next().expect("a line").expect("utf8");
    assert!(first.contains(&format!("serving RESP on 127.0.0.1:{port}")), "{first}");
    // A single member leads itself once its background plane has run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        assert!(std::time::Instant::now() < deadline, "microrep status never showed a leader");
        let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
            .args(["status", "--config"])
            .arg(path)
            .output()
            .expect("run microrep status");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.lines().nth(1).is_some_and(|l| l.contains(" leader ")) {
            break text;
        }
    };
    assert!(status.lines().nth(1).is_some_and(|l| l.contains("leader") && l.contains(&port.to_string())), "{status}");
    let pid = rustix::process::Pid::from_raw(node.0.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    assert!(node.0.wait().expect("wait").success(), "the node must stop cleanly on SIGTERM");
}

#[test]
fn throughput_and_group_benchmarks_report_every_point() {
    let _one = one_cluster();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_microrep")).args(args).output().expect("run microrep bench");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{args:?} failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let text = run(&["bench", "throughput", "--millis", "50", "--batches", "1,4", "--outstanding", "2", "--json"]);
    for (api, batch) in [("submit", "1"), ("submit", "4"), ("batch", "1"), ("batch", "4")] {
        let row = text
            .lines()
            .find(|l| l.contains(&format!("\"api\":\"{api}\",")) && l.contains(&format!("\"batch\":{batch},")))
            .unwrap_or_else(|| panic!("no {api} row for batch {batch} in:\n{text}"));
        assert!(!row.contains("\"commands_per_s\":0,") && row.contains("\"failed\":"), "{row}");
        assert!(!row.contains("\"entries_per_s\":0,"), "{row}");
        if api == "batch" {
            assert!(row.contains(&format!("\"commands_per_entry\":{batch}.00,")), "one entry per batch: {row}");
        }
    }
    let text = run(&["bench", "groups", "--sizes", "3", "--samples", "200", "--json"]);
    assert!(
        text.contains("\"replicas\":3,") && text.contains("\"samples\":200") && text.contains("\"failed\":"),
        "{text}"
    );
}

/// `microrep bench resp` in both attach modes: a latency row per command and server, every
/// request counted.
#[test]
fn resp_benchmark_reports_both_servers_in_both_modes() {
    let _one = one_cluster();
    let port = base_port();
    for mode in ["handover", "direct"] {
        let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
            .args(["bench", "resp", "--requests", "300", "--mode", mode, "--base-port", &port, "--json"])
            .output()
            .expect("run microrep bench resp");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{mode}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        for (command, server) in
            [("SET", "microrep"), ("SET", "unreplicated"), ("GET", "microrep"), ("GET", "unreplicated")]
        {
            let row = text
                .lines()
                .find(|l| l.contains(&format!("\"command\":\"{command}\",\"server\":\"{server}\"")))
                .unwrap_or_else(|| panic!("{mode}: no {command} row for {server} in:\n{text}"));
            assert!(row.contains("\"requests\":300}"), "{mode}: {row}");
        }
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_microrep")).args(["bench", "resp", "--mode", "sideways"]).output();
    let bad = bad.expect("run microrep bench resp");
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("sideways"));
}

/// Runs `microrep member ARGS --config CONFIG`; its success and output.
fn member(config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .arg("member")
        .arg(args[0])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .output()
        .expect("run microrep member");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `microrep member` (issue 19 §1): a spare joins a one-member cluster, the first member
/// leaves and its process stops when told, a change that cannot be made is refused with its
/// reason, and the removed member started afresh is added back.
#[test]
fn a_spare_joins_and_a_removed_member_stops_and_comes_back() {
    let _one = one_cluster();
    let name = format!("member-{}", std::process::id());
    let dir = format!("/dev/shm/microrep-{name}");
    let port = 32_000 - std::process::id() % 2_500;
    let scratch = write_config(
        "member",
        &format!(
            "[cluster]\nname = \"{name}\"\nshm_dir = \"{dir}\"\ninitial_members = [0]\nmembers = [\n  {{ id = 0, client = \
             \"127.0.0.1:{port}\" }},\n  {{ id = 1, client = \"127.0.0.1:{}\" }},\n]\n[node]\nid = 0\n",
            port + 1
        ),
        Some(&dir),
    );
    let path = scratch.path();
    let start = |id: &str| {
        let child = Command::new(env!("CARGO_BIN_EXE_microrep"))
            .args(["node", "--id", id, "--config"])
            .arg(path)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run microrep node");
        KillOnDrop(child)
    };
    let mut first = start("0");
    let _spare = start("1");
    let (ok, text) = member(path, &["add", "1"]);
    assert!(ok, "{text}");
    assert!(text.contains("add replica 1: done") && text.contains("members 0,1"), "{text}");
    let (ok, text) = member(path, &["add", "7"]);
    assert!(!ok && text.contains("replica 7 is not one of the cluster's ids 0..2"), "{text}");
    let (ok, text) = member(path, &["remove", "0"]);
    assert!(ok && text.contains("members 1"), "{text}");
    assert!(first.0.wait().expect("wait").success(), "a removed node stops cleanly");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut first.0.stdout.take().expect("stdout"), &mut out).expect("read");
    assert!(out.contains("node 0: removed from the cluster at log index"), "{out}");
    let (ok, text) = member(path, &["remove", "1"]);
    assert!(!ok && text.contains("replica 1 is the last member"), "{text}");
    // Started afresh, the removed member replays its own removal and follows as a spare (it
    // stopped for good once, when it replayed it); it can be added back.
    let mut again = start("0");
    let (ok, text) = member(path, &["add", "0"]);
    assert!(ok && text.contains("members 0,1"), "{text}");
    assert!(again.0.try_wait().expect("try_wait").is_none(), "the member added back runs");
}
