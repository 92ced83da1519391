//! `microrep cluster up`: a local cluster of Mu replicas, one process each, on the shm fabric,
//! with a demo workload: the leader appends checksummed commands, every replica applies them,
//! and at the end all replicas must hold the same state. `--kill-leader` SIGKILLs the leader
//! half way to show a fail-over: the next replica takes over and finishes the workload.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep_core::mu::{self, Event, MuConfig, Replica, Role, StateMachine};
use microrep_fabric::NodeId;
use microrep_fabric::shm::{ShmConfig, ShmFabric};

/// Arguments of `microrep cluster up`.
#[derive(Debug, clap::Args)]
pub(crate) struct UpArgs {
    /// Replicas (processes) in the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=32))]
    replicas: u16,
    /// Commands the workload appends.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    entries: u64,
    /// Bytes per command.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(8..=200))]
    payload: u32,
    /// SIGKILL the leader once half the workload is committed.
    #[arg(long)]
    kill_leader: bool,
    /// Cluster directory (default: a fresh one under /dev/shm, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Where a replica process finds its cluster (internal arguments).
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicaArgs {
    #[arg(long)]
    pub(crate) dir: PathBuf,
    #[arg(long)]
    pub(crate) id: u16,
    #[arg(long)]
    pub(crate) replicas: u16,
}

impl ReplicaArgs {
    /// Starts this replica's shm fabric node with the regions of `cfg`.
    pub(crate) fn start_fabric(&self, cfg: &MuConfig) -> Result<ShmFabric, String> {
        let shm = ShmConfig::new(&self.dir, NodeId(self.id), self.replicas, &mu::regions(cfg));
        ShmFabric::start(shm).map_err(|e| e.to_string())
    }
}

/// Arguments of one replica process (internal).
#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    replica: ReplicaArgs,
    #[arg(long)]
    entries: u64,
    #[arg(long)]
    payload: u32,
}

/// Mu settings for processes sharing a small machine: a heartbeat every millisecond (failure
/// declared after about six silent ones), so that descheduling does not look like failure.
pub(crate) fn config(node: NodeId, replicas: u16) -> MuConfig {
    MuConfig {
        log_slots: 4096,
        snapshot_every: 1024,
        heartbeat_period_ns: 1_000_000,
        fate_share_timeout_ns: 50_000_000,
        fate_share_cooldown_ns: 200_000_000,
        permission_timeout_ns: 5_000_000,
        round_timeout_ns: 10_000_000,
        recycle_period_ns: 1_000_000,
        lag_check_period_ns: 5_000_000,
        ..MuConfig::new(node, replicas)
    }
}

/// The demo application: counts commands and folds them into a CRC32C digest.
#[derive(Debug, Default)]
pub(crate) struct Digest {
    commands: u64,
    crc: u32,
}

impl StateMachine for Digest {
    fn apply(&mut self, _index: u64, command: &[u8]) {
        self.commands += 1;
        self.crc = crc32c::crc32c_append(self.crc, command);
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.commands.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    fn restore(&mut self, _index: u64, s: &[u8]) -> Result<(), String> {
        let bytes: [u8; 12] = s.try_into().map_err(|_| format!("snapshot of {} bytes, expected 12", s.len()))?;
        self.commands = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| "short")?);
        self.crc = u32::from_le_bytes(bytes[8..].try_into().map_err(|_| "short")?);
        Ok(())
    }
}

/// Runs one replica until told to quit on stdin; reports on stdout:
/// `status ROLE COMMANDS DIGEST` every 200 ms, and `latency P50 P99 P999 COUNT` when its
/// share of the workload is done.
pub(crate) fn run_node(args: &NodeArgs) -> Result<(), String> {
    let cfg = config(NodeId(args.replica.id), args.replica.replicas);
    let fabric = args.replica.start_fabric(&cfg)?;
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut replica = Replica::new(fabric, cfg, now()).map_err(|e| e.to_string())?;
    let quit = Arc::new(AtomicBool::new(false));
    let quit_flag = Arc::clone(&quit);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if line.map_or(true, |l| l.trim() == "quit") {
                break;
            }
        }
        quit_flag.store(true, Ordering::Release);
    });
    let (mut app, mut events) = (Digest::default(), Vec::new());
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let (mut in_flight, mut next_id, mut reported, mut next_status) = (None::<(u64, u64)>, 1u64, false, 0);
    let mut out = std::io::stdout().lock();
    let mut halfway = false;
    let mut last_role = Role::Follower;
    while !quit.load(Ordering::Acquire) {
        let t = now();
        replica.poll(t, &mut app, &mut events);
        for e in events.drain(..) {
            match e {
                Event::Committed { request_id, .. } | Event::Failed { request_id, .. }
                    if in_flight.is_some_and(|(id, _)| id == request_id) =>
                {
                    if let (Event::Committed { .. }, Some((_, sent))) = (&e, in_flight) {
                        latency.record((t - sent).max(1)).map_err(|e| e.to_string())?;
                    }
                    in_flight = None;
                }
                _ => {}
            }
        }
        let status = replica.status();
        if status.role == Role::Leader && in_flight.is_none() && app.commands < args.entries {
            let mut payload = vec![0u8; args.payload as usize];
            payload[..8].copy_from_slice(&app.commands.to_le_bytes());
            payload[8..].iter_mut().enumerate().for_each(|(i, b)| *b = (i as u64 ^ app.commands) as u8);
            // Request ids carry the replica id so that a new leader never reuses one.
            let id = (u64::from(args.replica.id) << 48) | next_id;
            if replica.propose(id, &payload).is_ok() {
                in_flight = Some((id, now()));
                next_id += 1;
            }
        }
        if !halfway && status.role == Role::Leader && app.commands * 2 >= args.entries {
            // Reported at once, so that `--kill-leader` strikes in the middle of the workload.
            halfway = true;
            writeln!(out, "halfway {}", app.commands).and_then(|()| out.flush()).map_err(|e| e.to_string())?;
        }
        if !reported && app.commands >= args.entries && !latency.is_empty() {
            reported = true;
            let q = |p| latency.value_at_quantile(p);
            writeln!(out, "latency {} {} {} {}", q(0.5), q(0.99), q(0.999), latency.len())
                .map_err(|e| e.to_string())?;
        }
        if t >= next_status || status.role != last_role {
            // Every 200 ms, and at once when the role changes.
            next_status = t + 200_000_000;
            last_role = status.role;
            writeln!(out, "status {:?} {} {:08x}", status.role, app.commands, app.crc).map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
        }
        pause_between_polls(&status);
    }
    Ok(())
}

/// The poll loop's idle policy: a leader yields (others may run, it comes back at once); a
/// follower, which Mu's one-sided writes do not need on the critical path, sleeps briefly,
/// well within a heartbeat period. Several replicas share two cores here, so nobody spins.
pub(crate) fn pause_between_polls(status: &mu::Status) {
    if status.role == Role::Follower {
        std::thread::sleep(Duration::from_micros(50));
    } else {
        std::thread::yield_now();
    }
}

/// A child process killed and reaped when dropped.
pub(crate) struct Reaper(pub(crate) Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Node {
    child: Child,
    stdin: ChildStdin,
    alive: bool,
    role: String,
    commands: u64,
    digest: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts replica `id` of `replicas` as `microrep SUBCOMMAND --id .. --replicas .. --dir ..
/// EXTRA..`, with piped stdin and stdout.
pub(crate) fn spawn_replica(
    subcommand: &str,
    id: u16,
    replicas: u16,
    dir: &Path,
    extra: &[String],
) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating microrep: {e}"))?;
    Command::new(exe)
        .args([subcommand, "--id", &id.to_string(), "--replicas", &replicas.to_string()])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting replica {id}: {e}"))
}

fn spawn_nodes(args: &UpArgs, dir: &Path, lines: &mpsc::Sender<(usize, String)>) -> Result<Vec<Node>, String> {
    let extra = ["--entries".to_string(), args.entries.to_string(), "--payload".into(), args.payload.to_string()];
    let mut nodes = Vec::new();
    for id in 0..args.replicas {
        let mut child = spawn_replica("cluster-node", id, args.replicas, dir, &extra)?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = lines.clone();
        let index = usize::from(id);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((index, line)).is_err() {
                    break;
                }
            }
        });
        nodes.push(Node { child, stdin, alive: true, role: "?".into(), commands: 0, digest: String::new() });
    }
    Ok(nodes)
}

/// Runs the cluster demo.
pub(crate) fn up(args: &UpArgs) -> Result<(), String> {
    if args.kill_leader && args.replicas < 3 {
        return Err(format!(
            "--kill-leader needs at least 3 replicas: without the leader, {} of {} is no majority",
            args.replicas - 1,
            args.replicas
        ));
    }
    let dir = args.dir.clone().unwrap_or_else(|| ShmConfig::default_dir(&format!("cluster-{}", std::process::id())));
    ShmFabric::remove_stale(&dir).map_err(|e| e.to_string())?;
    let result = drive(args, &dir);
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn drive(args: &UpArgs, dir: &Path) -> Result<(), String> {
    println!("microrep cluster: {} replicas on the shm fabric in {}", args.replicas, dir.display());
    println!("workload: {} commands of {} B appended by the leader, one at a time", args.entries, args.payload);
    let (tx, rx) = mpsc::channel();
    let mut nodes = spawn_nodes(args, dir, &tx)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120 + args.entries / 1_000);
    let mut killed = false;
    let mut latencies = Vec::new();
    loop {
        let Ok((i, line)) = rx.recv_timeout(Duration::from_millis(500)) else {
            if Instant::now() > deadline {
                return Err("the cluster did not finish in time".into());
            }
            continue;
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["status", role, commands, digest] => {
                let n = &mut nodes[i];
                if n.role != *role {
                    println!("  replica {i}: {role}");
                }
                (n.role, n.commands, n.digest) = (role.to_string(), commands.parse().unwrap_or(0), digest.to_string());
            }
            ["halfway", _] => {}
            ["latency", p50, p99, p999, count] => {
                println!(
                    "  replica {i} committed {count} commands: latency p50 {p50} ns, p99 {p99} ns, p99.9 {p999} ns"
                );
                latencies.push(line.clone());
            }
            _ => println!("  replica {i}: {line}"),
        }
        if let (true, false, ["halfway", commands]) = (args.kill_leader, killed, words.as_slice()) {
            println!("  killing leader {i} (SIGKILL) after {commands} commands");
            nodes[i].child.kill().map_err(|e| e.to_string())?;
            nodes[i].alive = false;
            killed = true;
        }
        let live: Vec<&Node> = nodes.iter().filter(|n| n.alive).collect();
        if live.iter().all(|n| n.commands >= args.entries) {
            let digests: Vec<&str> = live.iter().map(|n| n.digest.as_str()).collect();
            let agree = digests.windows(2).all(|w| w[0] == w[1]);
            println!(
                "done in {:.2} s: {} live replicas applied {} commands each; state digests {} ({})",
                started.elapsed().as_secs_f64(),
                live.len(),
                args.entries,
                if agree { "agree" } else { "DIFFER" },
                digests.join(", ")
            );
            return if agree { Ok(()) } else { Err("replicas diverged".into()) };
        }
        if Instant::now() > deadline {
            return Err("the cluster did not finish in time".into());
        }
    }
}
