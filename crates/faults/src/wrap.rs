//! The wrapped-redis target (`--target wrap-redis`): the replicas of `microrep wrap` around an
//! unmodified redis-server, run as this harness's own processes. `microrep wrap
//! --print-replicas` writes the configurations and names each replica's `microrep
//! wrap-replica` command; the harness starts, kills, pauses and restarts those (each replica's
//! server copy is its child: it dies with it, and is paused with it here). Clients talk to the
//! copies' ports: the leader's serves, followers close connections. The replicas' state
//! sockets answer `status` (role, whether the copy holds the data) and each copy has a unix
//! socket for `DEBUG DIGEST`. docs/RELIABILITY.md, docs/WRAP.md.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use microrep_testkit::procs::Spec;
use rustix::process::{Pid, Signal, kill_process};
use serde::Deserialize;

use crate::history::Clock;
use crate::target::{NodeStatus, Target};

/// The copies' unix socket for inspection (not replicated: reads only).
const ADMIN_SOCKET: &str = "admin.sock";

/// Why the replicas could not be planned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlanError {
    #[error("found no {0} consecutive free loopback ports in 100 tries")]
    NoConsecutivePorts(u16),
    #[error("running {} wrap: {source}", microrep.display())]
    Run { microrep: PathBuf, source: std::io::Error },
    #[error("{} wrap --print-replicas failed ({status}): {stderr}", microrep.display())]
    Failed { microrep: PathBuf, status: ExitStatus, stderr: String },
    #[error("microrep wrap planned {line:?}: {source}")]
    BadLine { line: String, source: serde_json::Error },
    #[error("microrep wrap planned {planned} replicas, not {replicas}")]
    Count { planned: usize, replicas: u16 },
}

/// Why a replica's state socket gave no status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicaStatusError {
    #[error("{}: {source}", path.display())]
    Ask { path: PathBuf, source: std::io::Error },
    #[error("{}: bad status: {source}", path.display())]
    Bad { path: PathBuf, source: serde_json::Error },
}

/// Why a copy's `DEBUG DIGEST` could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DigestError {
    #[error("{}: {source}", path.display())]
    Ask { path: PathBuf, source: std::io::Error },
    #[error("{}: DEBUG DIGEST replied {reply:?}", path.display())]
    Unexpected { path: PathBuf, reply: String },
}

/// Recorded in artifacts (`convergence.json`) as its message.
impl serde::Serialize for DigestError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Why a replica's server copy could not be paused or resumed with it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PauseError {
    #[error("replica process {0} did not stop within 5 s of SIGSTOP")]
    NotStopped(i32),
    #[error("signalling process {pid}: {source}")]
    Signal { pid: i32, source: rustix::io::Errno },
}

/// The replicas of one wrapped cluster, as `microrep wrap --print-replicas` planned them.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Where clients connect, by replica.
    pub(crate) nodes: Vec<SocketAddr>,
    /// Each replica's directory (its state socket, its copy's files and admin socket).
    pub(crate) dirs: Vec<PathBuf>,
    /// How to start each replica.
    pub(crate) specs: Vec<Spec>,
}

/// One line of `microrep wrap --print-replicas`.
#[derive(Debug, Deserialize)]
struct PlannedReplica {
    port: u16,
    dir: PathBuf,
    program: PathBuf,
    args: Vec<String>,
}

/// Has `microrep` plan `replicas` replicas of `redis` in `scratch` (their shm fabric, working
/// directories and configurations), with their logs in `logs`.
pub(crate) fn plan(
    microrep: &Path,
    redis: &Path,
    replicas: u16,
    scratch: &Path,
    logs: &Path,
) -> Result<Plan, PlanError> {
    let base = consecutive_free_ports(replicas)?;
    let redis_args = [
        "--port",
        "{port}",
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--io-threads",
        "1",
        "--unixsocket",
        &format!("{{dir}}/{ADMIN_SOCKET}"),
        "--enable-debug-command",
        "local",
    ];
    let output = Command::new(microrep)
        .args(["wrap", "--print-replicas", "--replicas", &replicas.to_string(), "--base-port", &base.to_string()])
        .arg("--dir")
        .arg(scratch)
        .arg("--")
        .arg(redis)
        .args(redis_args)
        .output()
        .map_err(|source| PlanError::Run { microrep: microrep.into(), source })?;
    if !output.status.success() {
        return Err(PlanError::Failed {
            microrep: microrep.into(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().into(),
        });
    }
    let mut plan = Plan { nodes: Vec::new(), dirs: Vec::new(), specs: Vec::new() };
    for (id, line) in String::from_utf8_lossy(&output.stdout).lines().enumerate() {
        let r: PlannedReplica =
            serde_json::from_str(line).map_err(|source| PlanError::BadLine { line: line.into(), source })?;
        plan.nodes.push(SocketAddr::from(([127, 0, 0, 1], r.port)));
        plan.specs.push(Spec {
            program: r.program,
            args: r.args.into_iter().map(Into::into).collect(),
            log: logs.join(format!("node-{id}.log")),
            env: Vec::new(),
        });
        plan.dirs.push(r.dir);
    }
    if plan.nodes.len() != usize::from(replicas) {
        return Err(PlanError::Count { planned: plan.nodes.len(), replicas });
    }
    Ok(plan)
}

/// The first of `n` consecutive loopback ports that are free when asked (`microrep wrap`
/// gives replica i the base port + i, and checks again that they are free), below Linux's
/// ephemeral range (32768 and up by default): a server port there can be taken, while its
/// copy restarts, by the local end of some outgoing connection, and the restarted server then
/// fails to listen (seed 1036 of a 50-history run: a restarted copy's redis-server could not
/// bind its port for the rest of the history).
fn consecutive_free_ports(n: u16) -> Result<u16, PlanError> {
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id() % SPAN;
    for attempt in 0..100u32 {
        let base = (FIRST + (start + attempt * 97) % SPAN) as u16;
        if (base..base + n).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            return Ok(base);
        }
    }
    Err(PlanError::NoConsecutivePorts(n))
}

/// What a replica's state socket answers to `status`.
#[derive(Debug, Deserialize)]
struct ReplicaStatus {
    node: NodeStatus,
    /// Whether the copy holds the data (false until it applied an entry past the first or
    /// installed a peer's state).
    copy_current: bool,
}

/// The status of the replica in `dir`, as a node status whose `recovering` also covers a copy
/// that does not hold the data yet (the nemesis must not count it as a voter: with the leader's
/// copy gone, it would have nothing to give).
pub(crate) fn status(dir: &Path, timeout: Duration) -> Result<NodeStatus, ReplicaStatusError> {
    let path = dir.join("state.sock");
    let asked = UnixStream::connect(&path).and_then(|mut s| {
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.write_all(b"status\n")?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line)
    });
    let line = asked.map_err(|source| ReplicaStatusError::Ask { path: path.clone(), source })?;
    let status: ReplicaStatus =
        serde_json::from_str(&line).map_err(|source| ReplicaStatusError::Bad { path, source })?;
    let mut node = status.node;
    node.recovering |= !status.copy_current;
    Ok(node)
}

/// The copy's `DEBUG DIGEST` (over its unix socket, which is not replicated).
pub(crate) fn digest(dir: &Path, timeout: Duration) -> Result<String, DigestError> {
    let path = dir.join(ADMIN_SOCKET);
    let asked = UnixStream::connect(&path).and_then(|mut s| {
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.write_all(b"*2\r\n$5\r\nDEBUG\r\n$6\r\nDIGEST\r\n")?;
        let mut line = String::new();
        BufReader::new(s.take(256)).read_line(&mut line)?;
        Ok(line)
    });
    let line = asked.map_err(|source| DigestError::Ask { path: path.clone(), source })?;
    match line.strip_prefix('+') {
        Some(digest) => Ok(digest.trim_end().to_string()),
        None => Err(DigestError::Unexpected { path, reply: line.trim_end().into() }),
    }
}

/// Waits until every copy reports the same digest; the last digests read.
pub(crate) fn converged(dirs: &[PathBuf], deadline: Instant) -> (bool, Vec<Result<String, DigestError>>) {
    loop {
        let digests: Vec<Result<String, DigestError>> =
            dirs.iter().map(|dir| digest(dir, Duration::from_millis(500))).collect();
        let first = digests.first().and_then(|d| d.as_ref().ok());
        let converged = first.is_some() && digests.iter().all(|d| d.as_ref().ok() == first);
        if converged || Instant::now() >= deadline {
            return (converged, digests);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The processes descended from `pid` (its server copy, and anything that forked).
fn descendants(pid: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| Some((p, stat_fields(p)?.1)))
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|&&(_, pp)| pp == parent).map(|&(p, _)| p));
        i += 1;
    }
    found.split_off(1)
}

/// The state letter and parent pid of process `pid`, from `/proc/PID/stat`.
fn stat_fields(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may contain anything: the fields follow its last ')'.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Stops the descendants of the replica `pid`, which was just sent SIGSTOP: once it has
/// stopped (it can start no other process then), each process under it.
pub(crate) fn pause_descendants(pid: i32) -> Result<(), PauseError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while stat_fields(pid).is_some_and(|(state, _)| state != 'T') {
        if Instant::now() > deadline {
            return Err(PauseError::NotStopped(pid));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    signal_all(&descendants(pid), Signal::STOP)
}

/// Resumes the descendants of the replica `pid`, before the replica itself is resumed.
pub(crate) fn resume_descendants(pid: i32) -> Result<(), PauseError> {
    signal_all(&descendants(pid), Signal::CONT)
}

fn signal_all(pids: &[i32], signal: Signal) -> Result<(), PauseError> {
    for &p in pids {
        let Some(pid) = Pid::from_raw(p) else { continue };
        match kill_process(pid, signal) {
            // Gone meanwhile: nothing left to signal.
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(source) => return Err(PauseError::Signal { pid: p, source }),
        }
    }
    Ok(())
}

/// The last line of a replica's log: why it exited.
pub(crate) fn last_words(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(empty log)").trim().to_string()
}

/// How long an exited replica stays down before it is restarted (as `microrep wrap` does).
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// Restarts the replicas that exit on their own until `stop`, each after [`RESTART_AFTER`]:
/// by design a wrapped replica stops when its copy may hold input that was not committed (a
/// deposed leader that had served) or cannot get a peer's state. Returns each exit, with the
/// time on `clock` (started with the target) and the last line of the replica's log. The checks of the data judge whether such an exit lost
/// anything.
pub(crate) fn supervise(target: &Target, logs: &Path, clock: Clock, stop: &AtomicBool) -> Vec<String> {
    let mut exits = Vec::new();
    let mut pending: Vec<(usize, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut procs = target.procs();
        procs.reap_exited();
        for exit in std::mem::take(&mut procs.exits) {
            let log = logs.join(format!("node-{}.log", exit.index));
            let at_s = clock.now_ns() as f64 / 1e9;
            exits.push(format!(
                "node {} {} {at_s:.1} s after the start: {}",
                exit.index,
                exit.status,
                last_words(&log)
            ));
            pending.push((exit.index, Instant::now() + RESTART_AFTER));
        }
        pending.retain(|&(i, at)| {
            if Instant::now() < at {
                return true;
            }
            if !procs.is_running(i)
                && let Err(e) = procs.start(i)
            {
                exits.push(format!("node {i} could not be restarted: {e}"));
            }
            false
        });
        drop(procs);
        std::thread::sleep(Duration::from_millis(20));
    }
    exits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: i32) -> char {
        stat_fields(pid).map_or('?', |(state, _)| state)
    }

    /// Polls `done` until it holds or 10 s passed.
    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_paused_replica_is_paused_with_everything_under_it() {
        let me = std::process::id() as i32;
        assert_eq!(
            stat_fields(me).map(|(_, parent)| parent),
            rustix::process::getppid().map(|p| p.as_raw_nonzero().get())
        );
        // A stand-in replica (a shell) with a server under it.
        let mut replica = Command::new("bash").args(["-c", "sleep 30 & wait"]).spawn().expect("bash");
        let pid = replica.id() as i32;
        wait_for("the stand-in server started", || descendants(pid).len() == 1);
        let server = descendants(pid)[0];
        let replica_pid = Pid::from_raw(pid).expect("pid");
        kill_process(replica_pid, Signal::STOP).expect("SIGSTOP");
        pause_descendants(pid).expect("pause");
        wait_for("both stopped", || state(pid) == 'T' && state(server) == 'T');
        resume_descendants(pid).expect("resume");
        kill_process(replica_pid, Signal::CONT).expect("SIGCONT");
        wait_for("both running again", || state(pid) != 'T' && state(server) != 'T');
        kill_process(Pid::from_raw(server).expect("pid"), Signal::KILL).expect("kill the server");
        replica.wait().expect("the stand-in replica ends with its server");
    }
}
