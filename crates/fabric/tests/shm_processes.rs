//! shm conformance cases that need separate processes: writer/revoker races across processes, a
//! writer stopped (SIGSTOP) mid-copy while its access is revoked, a SIGKILLed peer, stale files.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use microrep_fabric::conformance::{LOG, OPEN, regions};
use microrep_fabric::shm::{FenceHook, ShmConfig, ShmFabric};
use microrep_fabric::{Endpoint, Fabric, FabricError, NodeId, OpError, PostFlags, RemoteAddr, RevokePath};

/// A `microrep-fabric-peer` process, killed and reaped on drop.
struct PeerProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn region_args() -> Vec<String> {
    regions()
        .iter()
        .map(|r| {
            let policy = format!("{:?}", r.remote_write).to_lowercase();
            format!("{}:{}:{policy}", r.id.0, r.len_bytes)
        })
        .collect()
}

impl PeerProcess {
    fn spawn(dir: &Path, node: u16) -> Self {
        Self::spawn_with(dir, node, false)
    }

    fn spawn_with(dir: &Path, node: u16, symmetric_fences: bool) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_microrep-fabric-peer"));
        if symmetric_fences {
            command.env("MICROREP_SHM_SYMMETRIC_FENCES", "1");
        }
        let mut child = command
            .arg(dir)
            .arg(node.to_string())
            .arg("3")
            .args(region_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn microrep-fabric-peer");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut peer = Self { child, stdin, stdout };
        assert_eq!(peer.line(), "ready");
        peer
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read peer output");
        line.trim_end().to_string()
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush()).expect("write peer command");
    }

    fn call(&mut self, command: &str) -> String {
        self.send(command);
        self.line()
    }

    fn signal(&self, signal: nix_signal::Signal) {
        nix_signal::send(self.pid(), signal);
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal signal sending for the tests (SIGSTOP/SIGCONT/SIGKILL) through the `kill` command,
/// which keeps the test free of extra dependencies.
mod nix_signal {
    #[derive(Clone, Copy, Debug)]
    pub(crate) enum Signal {
        Stop,
        Cont,
        Kill,
    }

    pub(crate) fn send(pid: i32, signal: Signal) {
        let name = match signal {
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
            Signal::Kill => "-KILL",
        };
        let status = std::process::Command::new("kill").arg(name).arg(pid.to_string()).status().expect("run kill");
        assert!(status.success(), "kill {name} {pid} failed");
    }
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let dir = ShmConfig::default_dir(&format!("proc-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    fn start(&self, node: u16) -> Result<ShmFabric, FabricError> {
        ShmFabric::start(ShmConfig::new(&self.0, NodeId(node), 3, &regions()))
    }

    /// A revoke-race target: those races are about the fast path, so a writer descheduled
    /// mid-copy on a busy machine is waited for rather than fenced (fencing has its own tests).
    fn start_race_target(&self, symmetric_fences: bool) -> Result<ShmFabric, FabricError> {
        let mut config = ShmConfig::new(&self.0, NodeId(0), 3, &regions());
        config.symmetric_fences = symmetric_fences;
        config.revoke_fence_timeout = Duration::from_secs(10);
        ShmFabric::start(config)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn record_seq(bytes: &[u8]) -> Option<u64> {
    let mut words = bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
    let first = words.next()?;
    words.all(|w| w == first).then_some(first)
}

fn read(f: &ShmFabric, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    f.read_local(LOG, offset, &mut buf).expect("read");
    buf
}

/// Spins until `done` holds, failing the test if it does not within a generous bound: a
/// condition wait, never a sleep.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn revoke_races_a_writer_process() {
    revoke_races_a_writer_process_with(false);
}

#[test]
fn revoke_races_a_writer_process_with_symmetric_fences() {
    revoke_races_a_writer_process_with(true);
}

fn revoke_races_a_writer_process_with(symmetric_fences: bool) {
    const ROUNDS: u64 = 2000;
    let dir = Dir::new(if symmetric_fences { "race-sym" } else { "race" });
    let target = dir.start_race_target(symmetric_fences).expect("start target");
    let mut writer = PeerProcess::spawn_with(&dir.0, 1, symmetric_fences);
    let mut lcg = 0x2545_f491_4f6c_dd1du64;
    for round in 0..ROUNDS {
        target.grant_write(LOG, NodeId(1)).expect("grant");
        writer.send("write-loop 0 0 0 256 100000000");
        assert_eq!(writer.line(), "started", "round {round}");
        lcg = lcg.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        // Revoke at a random point of the writer's stream, while it is writing.
        let at_least = 1 + (lcg >> 40) % 64;
        wait_for("the writer to progress", || target.load_u64(LOG, 0).expect("word") >= at_least);
        let path = target.revoke_write(LOG, NodeId(1)).expect("revoke");
        assert_eq!(path, RevokePath::Fast, "a running writer finishes its copy promptly");
        let at_revoke = read(&target, 0, 256);
        let reply = writer.line();
        let words: Vec<&str> = reply.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"ok"), "round {round}: {reply}");
        assert_eq!(words.get(2), Some(&"PermissionDenied"), "round {round}: the writer must be stopped by the revoke");
        let last_ok: u64 = words[1].parse().expect("seq");
        let seen = record_seq(&at_revoke).unwrap_or_else(|| panic!("round {round}: torn record at revoke"));
        assert_eq!(seen, last_ok, "round {round}: memory at revoke differs from the last acknowledged write");
        assert_eq!(read(&target, 0, 256), at_revoke, "round {round}: a write landed after the revoke returned");
    }
}

#[test]
fn writer_stopped_mid_copy_is_fenced_and_never_lands_later() {
    const RECORD: usize = 1 << 20;
    let dir = Dir::new("paused");
    let fenced = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&fenced);
    let mut config = ShmConfig::new(&dir.0, NodeId(0), 3, &regions());
    config.on_fence = Some(FenceHook::new(move |writer, pid| seen.lock().expect("lock").push((writer, pid))));
    let target = ShmFabric::start(config).expect("start target");
    let mut writer = PeerProcess::spawn(&dir.0, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    writer.send(&format!("write-loop 0 0 0 {RECORD} 100000000"));
    assert_eq!(writer.line(), "started");
    // Stop the writer at arbitrary moments until it is caught inside a copy (its in-flight word
    // set while it cannot run); 1 MiB copies make that likely within a few tries.
    let mut caught = false;
    for _ in 0..2000 {
        writer.signal(nix_signal::Signal::Stop);
        wait_for("the writer to stop", || proc_state(writer.pid()) == Some('T'));
        if target.writer_in_flight(LOG, NodeId(1)).expect("slot").is_some() {
            caught = true;
            break;
        }
        writer.signal(nix_signal::Signal::Cont);
    }
    assert!(caught, "never caught the writer inside a copy");
    let path = target.revoke_write(LOG, NodeId(1)).expect("revoke must return, fencing the stopped writer");
    assert_eq!(path, RevokePath::Slow, "a writer stopped mid-copy can only be fenced");
    assert_eq!(*fenced.lock().expect("lock"), [(NodeId(1), writer.pid())], "on_fence names the fenced writer");
    let at_revoke = read(&target, 0, RECORD);
    writer.signal(nix_signal::Signal::Cont);
    let status = writer.child.wait().expect("reap writer");
    assert!(!status.success(), "the fenced writer must have been killed");
    assert!(read(&target, 0, RECORD) == at_revoke, "the stopped write landed after the revoke returned");
}

#[test]
fn writer_stopped_between_copies_fails_after_resume() {
    let dir = Dir::new("resume");
    let target = dir.start(0).expect("start target");
    let mut writer = PeerProcess::spawn(&dir.0, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    assert_eq!(writer.call("write 0 0 0 before"), "ok");
    writer.signal(nix_signal::Signal::Stop);
    wait_for("the writer to stop", || proc_state(writer.pid()) == Some('T'));
    assert_eq!(target.revoke_write(LOG, NodeId(1)).expect("revoke"), RevokePath::Fast);
    writer.signal(nix_signal::Signal::Cont);
    assert_eq!(writer.call("write 0 0 0 after!"), "ok failed PermissionDenied");
    assert_eq!(read(&target, 0, 6), b"before");
}

#[test]
fn killed_peer_gives_error_completions() {
    let dir = Dir::new("killed");
    let writer = dir.start(1).expect("start writer");
    let mut target = PeerProcess::spawn(&dir.0, 0);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    target.signal(nix_signal::Signal::Kill);
    target.child.wait().expect("reap target");
    let mut wr_id = 0;
    let status = loop {
        wr_id += 1;
        ep.post_write(wr_id, RemoteAddr::new(OPEN, 0), b"x", PostFlags::SIGNALED).expect("post");
        let status = ep.poll_completion().expect("shm completes at once").status;
        if status.is_err() {
            break status;
        }
        // The watcher thread flags the death asynchronously; wait on that event, bounded.
        assert!(wr_id < 50_000_000, "death of the peer never surfaced");
        std::thread::yield_now();
    };
    assert_eq!(status, Err(OpError::PeerUnreachable));
    assert!(ep.reconnect().is_err());
}

/// A peer that was SIGKILLed is known to be gone before any operation to it fails (the watcher
/// saw its pidfd), so a caller can reconnect the endpoint first; while nothing new runs under
/// the id (the dead process not even reaped: a zombie) there is nothing to reconnect to, and
/// once the id runs again the same endpoint reaches the new process.
#[test]
fn killed_peer_is_gone_before_an_operation_fails_and_its_next_run_is_reached() {
    let dir = Dir::new("gone");
    let writer = dir.start(1).expect("start writer");
    let mut target = PeerProcess::spawn(&dir.0, 0);
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    assert!(!ep.peer_gone());
    target.signal(nix_signal::Signal::Kill);
    wait_for("the watcher to see the peer exit", || ep.peer_gone());
    assert_eq!(ep.state(), microrep_fabric::EndpointState::Ready, "no operation failed yet");
    assert!(ep.reconnect().is_err(), "the run that ended is not linked to again");
    let mut config = ShmConfig::new(&dir.0, NodeId(2), 3, &regions());
    config.connect_timeout = Duration::ZERO;
    let late = ShmFabric::start(config).expect("start a node that never saw the peer");
    assert!(late.connect(NodeId(0)).is_err(), "an exited process that was not reaped yet must not be linked to");
    target.child.wait().expect("reap target");
    let why = ep.reconnect().expect_err("nothing runs under the id yet");
    assert!(why.to_string().contains("belongs to the run that ended"), "{why}");
    let _next = PeerProcess::spawn(&dir.0, 0);
    assert!(ep.peer_gone(), "still the old run's link");
    ep.reconnect().expect("reconnect to the new run");
    assert!(!ep.peer_gone());
    ep.post_write(1, RemoteAddr::new(OPEN, 0), b"x", PostFlags::SIGNALED).expect("post");
    assert_eq!(ep.poll_completion().expect("shm completes at once").status, Ok(()));
}

#[test]
fn stale_files_are_replaced_and_live_ids_refused() {
    let dir = Dir::new("stale");
    let mut peer = PeerProcess::spawn(&dir.0, 0);
    match dir.start(0) {
        Err(FabricError::AlreadyRunning { node: NodeId(0), pid }) => assert_eq!(pid, peer.pid()),
        other => panic!("a live node id must be refused, got {other:?}"),
    }
    peer.signal(nix_signal::Signal::Kill);
    peer.child.wait().expect("reap");
    assert!(dir.0.join("node-0.shm").exists(), "a SIGKILLed node leaves its segment behind");
    let other = dir.start(1).expect("start node 1");
    assert!(other.connect(NodeId(0)).is_err(), "a stale segment must not be connected to");
    let restarted = dir.start(0).expect("a stale segment is replaced");
    restarted.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = other.connect(NodeId(0)).expect("connect to the new incarnation");
    ep.post_write(1, RemoteAddr::new(LOG, 0), b"fresh", PostFlags::SIGNALED).expect("post");
    assert_eq!(ep.poll_completion().expect("completion").status, Ok(()));
    assert_eq!(read(&restarted, 0, 5), b"fresh");
    drop(restarted);
    drop(ep);
    let crashed = PeerProcess::spawn(&dir.0, 2);
    crashed.signal(nix_signal::Signal::Kill);
    drop(crashed);
    assert_eq!(ShmFabric::remove_stale(&dir.0).expect("clean"), 1, "only node 2's file was stale");
    assert!(!dir.0.join("node-2.shm").exists());
    assert!(dir.0.join("node-1.shm").exists(), "a live node's segment must survive cleaning");
}

/// The state letter of `/proc/PID/stat` (`T` when stopped).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}
