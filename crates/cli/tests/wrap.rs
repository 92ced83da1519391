//! `microrep wrap` around a real, unmodified redis-server (Debian's 7.0.15): writes through
//! the leader reach every copy (equal `DEBUG DIGEST`, read through each copy's unix socket,
//! which the shim leaves alone), followers refuse clients, and a killed leader's successor
//! holds every acknowledged write. Skipped, saying so, where redis-server is not installed.

mod scrape;
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use microrep_kv::client::{Client, Value};
use scrape::{metric, scrape};
use support::{Wrap, one_cluster};

fn redis_missing() -> bool {
    support::server_missing("redis-server")
}

/// Client ports of this test binary's run: below Linux's ephemeral range (32768..), away
/// from the cluster tests' range (20000..29000).
fn base_port() -> u16 {
    29_100 + (std::process::id() % 3_000) as u16
}

/// A wrapped redis-server whose copies each also listen on a unix socket (`admin.sock` in their
/// directory), which the shim leaves alone; with `options` for `microrep wrap`.
fn start_with(replicas: u16, options: &[&str]) -> Wrap {
    let redis = ["redis-server", "--port", "{port}", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    let admin = ["--enable-debug-command", "yes", "--unixsocket", "{dir}/admin.sock"];
    Wrap::start(replicas, base_port(), options, &[&redis[..], &admin[..]].concat())
}

/// Whether the server at `addr` answers PING.
fn pings(addr: SocketAddr) -> bool {
    Client::connect(addr, Duration::from_secs(2))
        .is_ok_and(|mut c| c.call(&[b"PING"]).ok() == Some(Value::Simple("PONG".into())))
}

/// `DEBUG DIGEST` of the server copy in `dir`, through its unix socket (not replicated); an
/// error while the copy is not up (a restarted replica's server starts anew).
fn digest(dir: &Path) -> Result<String, String> {
    let mut s = UnixStream::connect(dir.join("admin.sock")).map_err(|e| format!("{}: {e}", dir.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.write_all(b"*2\r\n$5\r\nDEBUG\r\n$6\r\nDIGEST\r\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line).map_err(|e| e.to_string())?;
    Ok(line.trim().to_string())
}

/// Waits until the copies in `dirs` report one digest, and returns it.
fn converged(wrap: &mut Wrap, dirs: &[&Path]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let digests: Vec<Result<String, String>> = dirs.iter().map(|d| digest(d)).collect();
        if digests.iter().all(Result::is_ok) && digests.windows(2).all(|w| w[0] == w[1]) {
            return digests[0].clone().unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "copies did not converge: {digests:?}\n{}", wrap.output());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn set_keys(wrap: &mut Wrap, leader: usize, range: std::ops::Range<u32>) {
    let mut c = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect to the leader");
    for i in range {
        let (k, v) = (format!("key:{i}"), format!("value-{i}"));
        let reply = c.call(&[b"SET", k.as_bytes(), v.as_bytes()]);
        let reply = reply.unwrap_or_else(|e| panic!("SET {k} on replica {leader}: {e}\n{}", wrap.output()));
        assert_eq!(reply, Value::Simple("OK".into()));
    }
    // Pipelined: several commands in one read, several reads in one log entry or not.
    for i in 0..50 {
        c.send(&[b"RPUSH", b"list", format!("{i}").as_bytes()]).expect("send");
    }
    c.flush().expect("flush");
    for _ in 0..50 {
        assert!(matches!(c.read().expect("reply"), Value::Integer(_)));
    }
}

fn assert_keys(addr: SocketAddr, range: std::ops::Range<u32>) {
    let mut c = Client::connect(addr, Duration::from_secs(10)).expect("connect");
    for i in range {
        let k = format!("key:{i}");
        let got = c.call(&[b"GET", k.as_bytes()]).expect("GET");
        assert_eq!(got, Value::Bulk(Some(format!("value-{i}").into_bytes())), "{k}");
    }
}

/// Reads until the peer closes; true if it closed without answering.
fn closed_without_reply(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else { return true };
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = s.write_all(b"*1\r\n$4\r\nPING\r\n");
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn writes_through_the_leader_reach_every_copy() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let mut wrap = start_with(3, &[]);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, leader, 0..150);
    // Every copy forks a child to save (an LD_PRELOADed process that must propose nothing).
    let mut c = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect");
    assert!(matches!(c.call(&[b"BGSAVE"]).expect("BGSAVE"), Value::Simple(_)));
    set_keys(&mut wrap, leader, 150..300);
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    let saved = Instant::now() + Duration::from_secs(30);
    while !dirs.iter().all(|d| d.join("dump.rdb").is_file()) {
        assert!(Instant::now() < saved, "not every copy saved:\n{}", wrap.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    let agreed = converged(&mut wrap, &dirs);
    assert_ne!(agreed, "0000000000000000000000000000000000000000", "the copies hold the keys");
    for follower in (0..3).filter(|&i| i != leader) {
        assert!(closed_without_reply(wrap.addr(follower)), "follower {follower} served a client");
    }
    assert_keys(wrap.addr(leader), 0..300);
    wrap.assert_cleaned_up(&replicas);
}

#[test]
fn a_killed_leaders_successor_holds_every_acknowledged_write() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let mut wrap = start_with(3, &[]);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, leader, 0..200);
    // Every copy caught up before the fail-over (a replica still joining while the leader dies
    // is another case: see docs/WRAP.md).
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    let mut held = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect");
    assert_eq!(held.call(&[b"PING"]).expect("PING"), Value::Simple("PONG".into()));
    let pid = rustix::process::Pid::from_raw(replicas[leader].0 as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL the leader");
    assert!(held.call(&[b"PING"]).is_err(), "a client of the killed leader sees its connection closed");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let successor = wrap.leader(&survivors, pings);
    assert_keys(wrap.addr(successor), 0..200);
    set_keys(&mut wrap, successor, 200..300);
    assert_keys(wrap.addr(successor), 0..300);
    let dirs: Vec<&Path> = survivors.iter().map(|&i| replicas[i].1.as_path()).collect();
    converged(&mut wrap, &dirs);
    // The killed replica is restarted empty and replays the log (never recycled here).
    wrap.wait_for_line(&format!("replica {leader}: restarted"));
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    wrap.assert_cleaned_up(&replicas);
}

/// Sends `s` to replica `i`'s process.
fn signal(replicas: &[(u32, PathBuf)], i: usize, s: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(replicas[i].0 as i32).expect("pid");
    rustix::process::kill_process(pid, s).expect("signal");
}

/// Three copies with a 64-entry log (recycled as it goes), 100 keys written through the first
/// leader and every copy holding them; then that leader's replica stopped (not killed: its
/// server lives on) until a successor serves. Returns the cluster, its replicas, the stopped
/// leader and its successor.
fn a_paused_leader_replaced() -> (Wrap, Vec<(u32, PathBuf)>, usize, usize) {
    let small_log = ["--set", "cluster.log.slots=64", "--set", "cluster.log.snapshot_every=32"];
    let mut wrap = start_with(3, &small_log);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, leader, 0..100);
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    signal(&replicas, leader, rustix::process::Signal::STOP);
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let successor = wrap.leader(&survivors, pings);
    (wrap, replicas, leader, successor)
}

/// A leader paused long enough to be replaced finds, once resumed, that it served clients
/// under a leadership it lost: its copy may differ from the log, so it is rebuilt from a
/// peer's state while its node (and log, and vote) stays: the replica process is not
/// restarted (docs/WRAP.md, "Rebuilding a copy").
#[test]
fn a_deposed_leader_rebuilds_its_copy_from_a_peer_and_keeps_its_node() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let (mut wrap, replicas, leader, successor) = a_paused_leader_replaced();
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    set_keys(&mut wrap, successor, 100..300);
    signal(&replicas, leader, rustix::process::Signal::CONT);
    wrap.wait_for_line(&format!("replica {leader}: copy rebuilt from "));
    let serving = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, serving, 300..400);
    converged(&mut wrap, &dirs);
    assert!(replicas[leader].1.join("dump.rdb").is_file(), "the old leader's copy was loaded from a peer's RDB");
    assert!(!wrap.output().contains(&format!("replica {leader}: restarted")), "{}", wrap.output());
    assert_keys(wrap.addr(serving), 0..400);
    wrap.assert_cleaned_up(&replicas);
}

/// Two copies need a peer's state at once and only the serving leader's is current (the
/// fault run's seed 1015): the deposed leader's copy, and a follower killed while it was
/// paused. The leader gives its state at a cut, holding its clients' input back for it.
#[test]
fn two_copies_needing_state_at_once_get_it_from_the_serving_leader() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let (mut wrap, replicas, first, second) = a_paused_leader_replaced();
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    // One connection, kept open: no client's close is being committed when the follower dies
    // (the leader, without a majority then, would not know that close's outcome and would
    // have to discard its copy too, leaving no copy to give state).
    let mut held = Client::connect(wrap.addr(second), Duration::from_secs(10)).expect("connect");
    for i in 100..300 {
        let (k, v) = (format!("key:{i}"), format!("value-{i}"));
        assert_eq!(held.call(&[b"SET", k.as_bytes(), v.as_bytes()]).expect("SET"), Value::Simple("OK".into()));
    }
    let follower = (0..3).find(|&i| i != first && i != second).expect("the third replica");
    signal(&replicas, follower, rustix::process::Signal::KILL);
    signal(&replicas, first, rustix::process::Signal::CONT);
    wrap.wait_for_line(&format!("replica {first}: copy rebuilt from "));
    wrap.wait_for_line(&format!("replica {follower}: copy rebuilt from "));
    let leader_gave = format!("copy rebuilt from replica {second}, the serving leader's state");
    assert!(wrap.output().contains(&leader_gave), "{}", wrap.output());
    // Giving its state cost the serving leader none of its clients, unless it was deposed since
    // (Mu's leader is the lowest id alive: the rebuilt first leader may take over again).
    match held.call(&[b"GET", b"key:299"]) {
        Ok(got) => assert_eq!(got, Value::Bulk(Some(b"value-299".to_vec()))),
        Err(e) => {
            let deposed = format!("replica {second}: lost leadership");
            assert!(wrap.output().contains(&deposed), "GET: {e}\n{}", wrap.output());
        }
    }
    let serving = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, serving, 300..400);
    converged(&mut wrap, &dirs);
    assert_keys(wrap.addr(serving), 0..400);
    wrap.assert_cleaned_up(&replicas);
}

#[test]
fn a_killed_follower_restarts_and_gets_a_peers_state() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    // A 64-entry log, recycled as it goes: the restarted copy cannot replay from the start.
    let small_log = ["--set", "cluster.log.slots=64", "--set", "cluster.log.snapshot_every=32"];
    let mut wrap = start_with(3, &small_log);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, leader, 0..200);
    // A session whose state a fresh server must be given: database 2, a name.
    let mut held = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect");
    assert_eq!(held.call(&[b"SELECT", b"2"]).expect("SELECT"), Value::Simple("OK".into()));
    assert_eq!(held.call(&[b"CLIENT", b"SETNAME", b"held"]).expect("SETNAME"), Value::Simple("OK".into()));
    assert_eq!(held.call(&[b"SET", b"in-db-2", b"before"]).expect("SET"), Value::Simple("OK".into()));
    // Both followers hold the state first (the other follower is the donor: a leader gives
    // none, docs/WRAP.md). A follower that started late may itself have needed a transfer.
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let pid = rustix::process::Pid::from_raw(replicas[follower].0 as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL a follower");
    set_keys(&mut wrap, leader, 200..300);
    wrap.wait_for_line(&format!("replica {follower}: restarted"));
    set_keys(&mut wrap, leader, 300..400);
    assert_eq!(held.call(&[b"SET", b"in-db-2", b"after"]).expect("SET"), Value::Simple("OK".into()));
    let agreed = converged(&mut wrap, &dirs);
    assert_ne!(agreed, "0000000000000000000000000000000000000000");
    assert!(
        replicas[follower].1.join("dump.rdb").is_file(),
        "the restarted copy was loaded from a peer's RDB (nothing else saves one here)"
    );
    assert_keys(wrap.addr(leader), 0..400);
    wrap.assert_cleaned_up(&replicas);
}

#[test]
fn a_copy_that_needs_state_without_a_hook_says_why_it_stops() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let options =
        ["--state-transfer", "none", "--set", "cluster.log.slots=64", "--set", "cluster.log.snapshot_every=32"];
    let mut wrap = start_with(3, &options);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, leader, 0..10);
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let pid = rustix::process::Pid::from_raw(replicas[follower].0 as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL a follower");
    // Past the 64-entry log while it is down: the restarted copy would need a peer's state.
    set_keys(&mut wrap, leader, 10..200);
    wrap.wait_for_line(&format!("replica {follower}: its server copy cannot be brought up to date"));
    assert!(wrap.output().contains("no state-transfer hook"), "{}", wrap.output());
    assert_keys(wrap.addr(leader), 0..200);
    wrap.assert_cleaned_up(&replicas);
}

/// What output checking found on the replica in `dir`: (buckets matched, buckets differed),
/// from its state socket's `status`.
fn output_counts(dir: &Path) -> (u64, u64) {
    let mut s = UnixStream::connect(dir.join("state.sock")).expect("the replica's state socket");
    s.write_all(b"status\n").expect("ask");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("status");
    let status: serde_json::Value = serde_json::from_str(&line).expect("json");
    let count = |k: &str| status["output"][k].as_u64().expect("a count");
    (count("buckets_matched"), count("buckets_differed"))
}

/// Output checking: replies equal to the leader's match, bucket by bucket; a reply that
/// differs (`CONFIG GET port`: every copy has its own port) is found by every follower, and
/// with `--output-check repair` each rebuilds its copy from a peer, while the client only
/// ever saw the leader's answer. Each follower's metrics count what it found and its rebuild.
#[test]
fn a_follower_whose_output_differs_is_found_and_rebuilt() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let metrics_base = base_port() + 20;
    let mut wrap = start_with(3, &["--output-check", "repair", "--metrics-base-port", &metrics_base.to_string()]);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    // More than a 4 KiB bucket of equal replies, then the connection closes (its last bucket).
    set_keys(&mut wrap, leader, 0..300);
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !followers.iter().all(|&f| output_counts(&replicas[f].1).0 > 0) {
        assert!(Instant::now() < deadline, "no bucket compared:\n{}", wrap.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    for &f in &followers {
        assert_eq!(output_counts(&replicas[f].1).1, 0, "replica {f}: equal replies differed");
    }
    let mut c = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect");
    let reply = c.call(&[b"CONFIG", b"GET", b"port"]).expect("CONFIG GET port");
    let port = wrap.addr(leader).port().to_string().into_bytes();
    assert_eq!(reply, Value::Array(Some(vec![Value::Bulk(Some(b"port".to_vec())), Value::Bulk(Some(port))])));
    drop(c);
    for &f in &followers {
        wrap.wait_for_line(&format!("replica {f}: copy rebuilt from "));
        let page = scrape(SocketAddr::from(([127, 0, 0, 1], metrics_base + f as u16)));
        let count = |name: &str| metric(&page, name).unwrap_or_else(|| panic!("no {name} in\n{page}"));
        assert!(count("microrep_wrap_output_buckets_matched_total") >= 1.0, "{page}");
        assert!(count("microrep_wrap_output_buckets_differed_total") >= 1.0, "{page}");
        assert!(count("microrep_wrap_copies_rebuilt_total") >= 1.0, "{page}");
    }
    assert!(wrap.output().contains("output check: connection"), "{}", wrap.output());
    let serving = wrap.leader(&[0, 1, 2], pings);
    set_keys(&mut wrap, serving, 300..400);
    converged(&mut wrap, &dirs);
    assert_keys(wrap.addr(serving), 0..400);
    wrap.assert_cleaned_up(&replicas);
}

/// By default (`--output-check report`) a difference is counted and logged, and the copy kept:
/// a reply that depends on each copy's own settings is no divergence of its data.
#[test]
fn output_differences_are_reported_by_default_and_the_copies_kept() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let mut wrap = start_with(3, &[]);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    let mut c = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect");
    c.call(&[b"CONFIG", b"GET", b"port"]).expect("CONFIG GET port");
    drop(c);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !followers.iter().all(|&f| output_counts(&replicas[f].1).1 > 0) {
        assert!(Instant::now() < deadline, "no difference found:\n{}", wrap.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    set_keys(&mut wrap, leader, 0..50);
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    assert!(!wrap.output().contains("copy rebuilt"), "{}", wrap.output());
    // `microrep status` on the wrapped cluster's configuration asks each replica's state socket.
    let config = replicas[0].1.parent().expect("the scratch directory").join("node-0.toml");
    assert!(wrap.output().contains(&format!("status: microrep status --config {}", config.display())));
    let status = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_microrep"));
        command.args(["status", "--config"]).arg(&config);
        if json {
            command.arg("--json");
        }
        let out = command.output().expect("run microrep status");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = status(false);
    let copies: Vec<&str> = table.lines().filter(|l| l.trim_start().starts_with("copy ")).collect();
    assert_eq!(copies.len(), 3, "{table}");
    assert_eq!(copies.iter().filter(|l| l.contains("copy serving, current;")).count(), 1, "{table}");
    assert_eq!(copies.iter().filter(|l| l.contains("copy following, current;")).count(), 2, "{table}");
    for &f in &followers {
        // Only CONFIG GET port's bucket differs, so this count no longer moves (matched ones may).
        let differed = output_counts(&replicas[f].1).1;
        let line = format!(" matched, {differed} differed");
        assert!(differed > 0 && copies[f].contains(&line), "replica {f}: no {line:?} in\n{table}");
    }
    for line in status(true).lines() {
        let member: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert!(member["wrap"]["output"]["buckets_differed"].is_u64(), "{line}");
        assert!(member["fuo"].is_u64(), "the node's status fields stay at the top: {line}");
    }
    wrap.assert_cleaned_up(&replicas);
}

/// One command through the unix socket of the copy in `dir` (not replicated, outside any input
/// window): its first reply line.
fn admin(dir: &Path, command: &[&str]) -> String {
    let mut s = UnixStream::connect(dir.join("admin.sock")).expect("the copy's unix socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut frame = format!("*{}\r\n", command.len());
    for arg in command {
        frame += &format!("${}\r\n{arg}\r\n", arg.len());
    }
    s.write_all(frame.as_bytes()).expect("send");
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line).expect("reply");
    line.trim().to_string()
}

/// Time and randomness (docs/WRAP.md): every copy processes a client's input at the input
/// time the leader logged with it, and draws randomness from one seed. So an expiry set
/// relative to now has the same deadline on every copy, and `TIME`, `PTTL` and `ACL GENPASS`
/// answer alike on every copy: output checking (`repair`) finds no difference and rebuilds
/// nothing.
#[test]
fn every_copy_sees_the_leaders_time_and_draws_the_same_randomness() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let mut wrap = start_with(3, &["--output-check", "repair"]);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let mut c = Client::connect(wrap.addr(leader), Duration::from_secs(10)).expect("connect");
    for i in 0..20 {
        let key = format!("session:{i}");
        assert_eq!(
            c.call(&[b"SET", key.as_bytes(), b"v", b"EX", b"1000"]).expect("SET EX"),
            Value::Simple("OK".into())
        );
        assert!(matches!(c.call(&[b"PTTL", key.as_bytes()]).expect("PTTL"), Value::Integer(_)));
        assert!(matches!(c.call(&[b"TIME"]).expect("TIME"), Value::Array(Some(_))));
        assert!(matches!(c.call(&[b"ACL", b"GENPASS"]).expect("ACL GENPASS"), Value::Bulk(Some(_))));
    }
    drop(c);
    let dirs: Vec<&Path> = replicas.iter().map(|(_, d)| d.as_path()).collect();
    converged(&mut wrap, &dirs);
    for i in [0, 19] {
        let key = format!("session:{i}");
        let deadlines: Vec<String> = dirs.iter().map(|d| admin(d, &["PEXPIRETIME", &key])).collect();
        assert!(deadlines.windows(2).all(|w| w[0] == w[1]), "{key}: deadlines {deadlines:?}\n{}", wrap.output());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !followers.iter().all(|&f| output_counts(&replicas[f].1).0 > 0) {
        assert!(Instant::now() < deadline, "no bucket compared:\n{}", wrap.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    for &f in &followers {
        assert_eq!(output_counts(&replicas[f].1).1, 0, "replica {f} answered otherwise:\n{}", wrap.output());
    }
    assert!(!wrap.output().contains("copy rebuilt"), "{}", wrap.output());
    wrap.assert_cleaned_up(&replicas);
}

#[test]
fn bad_invocations_are_refused_with_a_reason() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_microrep")).arg("wrap").args(args).output().expect("run");
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--", "redis-server", "--port", "6379"]);
    assert!(err.contains("{port}"), "{err}");
    let err = run(&["--", "no-such-server-xyz", "--port", "{port}"]);
    assert!(err.contains("no-such-server-xyz") && err.contains("not found"), "{err}");
    let err = run(&["--preload", "/nonexistent/libshim.so", "--", "sh", "{port}"]);
    assert!(err.contains("/nonexistent/libshim.so") && err.contains("does not exist"), "{err}");
    let err = run(&[]);
    assert!(err.contains("SERVER ARGS"), "{err}");
    // Not the cluster tests' ports, which one of them may hold meanwhile.
    let port = (base_port() + 50).to_string();
    let err = run(&["--base-port", &port, "--set", "cluster.no_such_key=1", "--", "sh", "{port}"]);
    assert!(err.contains("--set") && err.contains("no_such_key"), "{err}");
    let err = run(&["--base-port", &port, "--metrics-base-port", &port, "--", "sh", "{port}"]);
    assert!(err.contains("--metrics-base-port") && err.contains("overlaps"), "{err}");
}

#[test]
fn every_replica_serves_metrics_and_the_leaders_count_its_committed_inputs() {
    if redis_missing() {
        return;
    }
    let _one = one_cluster();
    let metrics_base = base_port() + 20;
    let mut wrap = start_with(3, &["--metrics-base-port", &metrics_base.to_string()]);
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], pings);
    let page = |i: usize| scrape(SocketAddr::from(([127, 0, 0, 1], metrics_base + i as u16)));
    let before = metric(&page(leader), "microrep_commit_latency_seconds_count").expect("a commit latency count");
    set_keys(&mut wrap, leader, 0..150);
    let after = page(leader);
    // Each SET was read and committed on its own (one request, then its answer): at least one
    // committed input each, every one timed.
    let timed = metric(&after, "microrep_commit_latency_seconds_count").expect("a commit latency count");
    assert!(timed - before >= 150.0, "{before} -> {timed} timed commits for 150 SETs:\n{after}");
    assert_eq!(metric(&after, "microrep_commits_total"), Some(timed), "{after}");
    for i in 0..3 {
        let info = format!("microrep_node_info{{node=\"{i}\"");
        assert!(page(i).contains(&info), "replica {i}'s page has no {info}");
    }
    wrap.assert_cleaned_up(&replicas);
}
