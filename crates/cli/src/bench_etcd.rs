//! `microrep bench etcd`: replicated PUT latency of a 3-member etcd cluster next to replicated SET
//! latency through the RESP server of a 3-replica microrep cluster, in one invocation, with the
//! same value size and the same number of concurrent clients (each one request at a time), by
//! two routes for both systems: every client at the leader, and clients spread over every member
//! (etcd's followers forward each PUT to the leader; microrep's answer `-NOTLEADER`, and the
//! client moves to the leader and sends the command again).
//!
//! The etcd members (`etcd` from Debian's `etcd-server`) listen on 127.0.0.1 only, with data
//! directories under a temporary directory; the etcd load comes from `tools/etcdbench` (Go, the
//! official v3 client), driven block by block over its standard input. The microrep load is
//! `bench resp`'s clients against `bench resp`'s cluster, once per fabric. Blocks of etcd and
//! microrep alternate so that both see the same machine conditions. Every process is killed and
//! every directory removed on every exit path, Ctrl-C (SIGINT/SIGTERM) included; after a SIGKILL
//! the kernel still kills the processes (`PR_SET_PDEATHSIG`), but the directories stay.
#![allow(clippy::print_stdout)]

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use microrep_testkit::KitError;
use microrep_testkit::child::{Guarded, command_dying_with_parent};
use microrep_testkit::scratch::ScratchDir;
use serde_json::Value as Json;

use crate::bench_resp::{self, RespBenchError, RespCluster};
use crate::node::{self, SignalHandlerError};

/// Members of each cluster.
const MEMBERS: u16 = 3;

/// The longest an etcd block may take before the benchmark gives up.
const BLOCK_DEADLINE: Duration = Duration::from_secs(300);

/// Arguments of `microrep bench etcd`.
#[derive(Debug, clap::Args)]
pub(crate) struct EtcdArgs {
    /// Concurrent clients of each system, each with its own connection, one request at a time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    clients: u16,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=bench_resp::MAX_VALUE as i64))]
    value: u32,
    /// Requests timed per system and fabric, in alternating blocks of up to 1,000.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    requests: u64,
    /// The fabrics of the microrep cluster, one after the other (etcd runs next to each).
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp", value_parser = ["shm", "tcp"])]
    fabrics: Vec<String>,
    /// The etcd server binary (Debian: etcd-server).
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// The load generator built from tools/etcdbench (scripts/bench-etcd.sh builds it).
    #[arg(long, default_value = "target/etcdbench")]
    etcdbench: PathBuf,
    /// Where the etcd data directories go (a temporary directory is made inside and removed);
    /// etcd fsyncs its log there, so a disk and a tmpfs (/dev/shm) give different figures.
    #[arg(long)]
    etcd_dir: Option<PathBuf>,
    /// etcd member i serves clients on BASE_PORT + i and peers on BASE_PORT + 10 + i; microrep
    /// replica i serves clients on BASE_PORT + 20 + i (its tcp fabric on BASE_PORT + 220 + i).
    #[arg(long, default_value_t = 17_600, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    base_port: u16,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Why the etcd comparison failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    #[error(
        "{} not found: build it with (cd tools/etcdbench && go build -o ../../target/etcdbench .), \
         or run scripts/bench-etcd.sh",
        .0.display()
    )]
    NoEtcdbench(PathBuf),
    #[error(transparent)]
    Signal(#[from] SignalHandlerError),
    /// A scratch directory could not be made.
    #[error(transparent)]
    Kit(#[from] KitError),
    /// The microrep side (its cluster or its clients) failed.
    #[error(transparent)]
    Microrep(#[from] RespBenchError),
    #[error("adding latencies: {0}")]
    Add(#[from] hdrhistogram::AdditionError),
    #[error("interrupted")]
    Interrupted,
    #[error("etcdbench reported no {0}")]
    NoField(&'static str),
    /// etcdbench counted failed PUTs; `first` is the first error it saw.
    #[error("{count} etcd PUTs failed: {first}")]
    PutsFailed { count: f64, first: Json },
    #[error("etcd log {}: {source}", path.display())]
    EtcdLog { path: PathBuf, source: std::io::Error },
    #[error("{0} (apt install etcd-server)")]
    StartEtcd(KitError),
    #[error("starting etcdbench: {0}")]
    StartEtcdbench(KitError),
    #[error("etcdbench has no piped stdout")]
    NoStdout,
    #[error("etcdbench gave no {key} line (exit code {code:?}; its error is above)")]
    NoLine { key: &'static str, code: Option<i32> },
    #[error("etcdbench printed {line:?}: {source}")]
    NotJson { line: String, source: serde_json::Error },
    #[error("etcdbench printed {line:?}, expected {key}")]
    Unexpected { line: String, key: &'static str },
    #[error("etcdbench's input is closed")]
    InputClosed,
    #[error("etcdbench: {0}")]
    Io(std::io::Error),
    #[error("etcdbench exited with {0}")]
    Exited(std::process::ExitStatus),
    #[error("etcdbench did not exit within {0:?} of its input closing")]
    NoExit(Duration),
}

/// Runs the benchmark.
pub(crate) fn etcd(args: &EtcdArgs) -> Result<(), EtcdError> {
    if !args.etcdbench.is_file() {
        return Err(EtcdError::NoEtcdbench(args.etcdbench.clone()));
    }
    let stop = node::stop_flag()?;
    let parent = args.etcd_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = ScratchDir::new(parent.join(format!("microrep-bench-etcd-{}", std::process::id())))?;
    drive(args, dir.path(), &stop)
}

fn drive(args: &EtcdArgs, dir: &Path, stop: &AtomicBool) -> Result<(), EtcdError> {
    let _members = start_etcd(args, dir)?;
    let endpoints: Vec<String> = (0..MEMBERS).map(|i| format!("127.0.0.1:{}", args.base_port + i)).collect();
    let mut loads = Routes {
        leader: EtcdLoad::start(args, &endpoints.join(","), true)?,
        any: EtcdLoad::start(args, &endpoints.join(","), false)?,
    };
    if !args.json {
        eprintln!(
            "microrep bench etcd: {MEMBERS} etcd members ({}) next to {MEMBERS} microrep replicas, \
             {} clients each, {} B values, {} requests per system, route and fabric",
            dir.display(),
            args.clients,
            args.value,
            args.requests
        );
        println!(
            "{:<6} {:<11} {:<13} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
            "fabric", "route", "system", "p50 us", "p99 us", "p99.9 us", "max us", "ops/s", "requests"
        );
    }
    let value = vec![b'v'; args.value as usize];
    for fabric in &args.fabrics {
        let name = format!("bench-etcd-{}-{fabric}", std::process::id());
        let shm = ScratchDir::new(microrep_fabric::shm::ShmConfig::default_dir(&name))?;
        compare(args, fabric, &name, shm.path(), &value, &mut loads, stop)?;
    }
    loads.leader.finish()?;
    loads.any.finish()
}

/// The etcd load of each route: clients connected to the leader only, or to every member.
struct Routes {
    leader: EtcdLoad,
    any: EtcdLoad,
}

/// One fabric's comparison, route by route: alternating blocks of etcd PUTs and microrep SETs,
/// then both rows and their ratios. Only one system has a block running at a time.
fn compare(
    args: &EtcdArgs,
    fabric: &str,
    name: &str,
    shm: &Path,
    value: &[u8],
    loads: &mut Routes,
    stop: &AtomicBool,
) -> Result<(), EtcdError> {
    let mode = microrep::config::AttachMode::default();
    let cluster = RespCluster::start(name, shm, MEMBERS, args.base_port + 20, fabric, mode)?;
    let leader_only = [cluster.leader];
    for (route, load, addrs) in
        [("leader", &mut loads.leader, &leader_only[..]), ("any member", &mut loads.any, &cluster.members[..])]
    {
        let mut ours = microrep_testkit::hist::latency_ns();
        let mut elapsed = Duration::ZERO;
        let mut done = 0;
        while done < args.requests {
            if stop.load(Ordering::Acquire) {
                return Err(EtcdError::Interrupted);
            }
            let block = 1000.min(args.requests - done);
            load.run(block)?;
            let (h, took) = bench_resp::timed_block(addrs, b"SET", block, args.clients, value)?;
            ours.add(h)?;
            elapsed += took;
            done += block;
        }
        let them = load.report()?;
        print_route(args, fabric, route, &ours, elapsed, &them)?;
    }
    Ok(())
}

/// Prints one route's rows (microrep, etcd) and their ratios.
fn print_route(
    args: &EtcdArgs,
    fabric: &str,
    route: &str,
    ours: &hdrhistogram::Histogram<u64>,
    elapsed: Duration,
    them: &Json,
) -> Result<(), EtcdError> {
    let us = |q: f64| ours.value_at_quantile(q) as f64 / 1000.0;
    let ours_row = Row {
        p50: us(0.5),
        p99: us(0.99),
        p999: us(0.999),
        max: ours.max() as f64 / 1000.0,
        ops: ours.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        requests: ours.len(),
    };
    let field = |k: &'static str| them.get(k).and_then(Json::as_f64).ok_or(EtcdError::NoField(k));
    let errors = field("errors")?;
    if errors > 0.0 {
        return Err(EtcdError::PutsFailed { count: errors, first: them["first_error"].clone() });
    }
    let etcd_row = Row {
        p50: field("p50_us")?,
        p99: field("p99_us")?,
        p999: field("p999_us")?,
        max: field("max_us")?,
        ops: field("puts_per_s")?,
        requests: field("puts")? as u64,
    };
    for (system, row) in [("microrep SET", &ours_row), ("etcd PUT", &etcd_row)] {
        row.print(args, fabric, route, system);
    }
    let ratio = [etcd_row.p50 / ours_row.p50, etcd_row.p99 / ours_row.p99, etcd_row.p999 / ours_row.p999];
    let throughput = ours_row.ops / etcd_row.ops;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"bench": "etcd", "fabric": fabric, "route": route, "ratio": "etcd/microrep",
                "p50": ratio[0], "p99": ratio[1], "p999": ratio[2], "throughput_microrep_over_etcd": throughput})
        );
    } else {
        println!(
            "{fabric:<6} {route:<11} {:<13} {:>9.1}x {:>9.1}x {:>9.1}x {:>10} {:>9.1}x   (ops/s: microrep/etcd)",
            "etcd/microrep", ratio[0], ratio[1], ratio[2], "", throughput
        );
    }
    Ok(())
}

/// One system's figures (latencies in microseconds).
struct Row {
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    ops: f64,
    requests: u64,
}

impl Row {
    fn print(&self, args: &EtcdArgs, fabric: &str, route: &str, system: &str) {
        if args.json {
            println!(
                "{}",
                serde_json::json!({"bench": "etcd", "fabric": fabric, "route": route, "system": system, "members": MEMBERS,
                    "clients": args.clients, "value_bytes": args.value, "p50_us": self.p50, "p99_us": self.p99,
                    "p999_us": self.p999, "max_us": self.max, "ops_per_s": self.ops.round(), "requests": self.requests})
            );
        } else {
            println!(
                "{fabric:<6} {route:<11} {system:<13} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.0} {:>8}",
                self.p50, self.p99, self.p999, self.max, self.ops, self.requests
            );
        }
    }
}

/// Starts the etcd members on loopback, each logging to `dir/etcd-I.log`; they are killed and
/// reaped when the returned value is dropped.
fn start_etcd(args: &EtcdArgs, dir: &Path) -> Result<Vec<Guarded>, EtcdError> {
    let url = |port: u16| format!("http://127.0.0.1:{port}");
    let cluster: Vec<String> = (0..MEMBERS).map(|i| format!("e{i}={}", url(args.base_port + 10 + i))).collect();
    let token = format!("microrep-bench-{}", std::process::id());
    let mut members = Vec::new();
    for i in 0..MEMBERS {
        let (client, peer) = (url(args.base_port + i), url(args.base_port + 10 + i));
        let path = dir.join(format!("etcd-{i}.log"));
        let log = File::create(&path).map_err(|source| EtcdError::EtcdLog { path, source })?;
        let mut command = command_dying_with_parent(&args.etcd);
        command
            .args(["--name", &format!("e{i}"), "--data-dir"])
            .arg(dir.join(format!("etcd-{i}")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster.join(","), "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &token, "--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let member = Guarded::spawn(&mut command, Duration::ZERO).map_err(EtcdError::StartEtcd)?;
        members.push(member);
    }
    Ok(members)
}

/// The etcdbench process in its block mode: its clients connect once and stay connected.
struct EtcdLoad {
    child: Guarded,
    input: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl EtcdLoad {
    /// Starts etcdbench on `endpoints`, its clients on the leader alone with `leader_only`.
    fn start(args: &EtcdArgs, endpoints: &str, leader_only: bool) -> Result<Self, EtcdError> {
        let mut command = command_dying_with_parent(&args.etcdbench);
        if leader_only {
            command.arg("-leader-only");
        }
        command
            .args(["-endpoints", endpoints, "-clients", &args.clients.to_string()])
            .args(["-size", &args.value.to_string(), "-timeout", "20s", "-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = Guarded::spawn(&mut command, Duration::ZERO).map_err(EtcdError::StartEtcdbench)?;
        let (input, output) = (child.child().stdin.take(), child.child().stdout.take().ok_or(EtcdError::NoStdout)?);
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut load = Self { child, input, lines };
        // Connecting includes waiting for the new cluster to elect a leader.
        load.expect("ready")?;
        Ok(load)
    }

    /// The next line, which must be a JSON object with `key`.
    fn expect(&mut self, key: &'static str) -> Result<Json, EtcdError> {
        let line = self.lines.recv_timeout(BLOCK_DEADLINE).map_err(|_| {
            let _ = self.child.child().kill();
            let code = self.child.child().wait().ok().and_then(|s| s.code());
            EtcdError::NoLine { key, code }
        })?;
        let v: Json = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(source) => return Err(EtcdError::NotJson { line, source }),
        };
        if v.get(key).is_none() {
            return Err(EtcdError::Unexpected { line, key });
        }
        Ok(v)
    }

    fn send(&mut self, command: &str) -> Result<(), EtcdError> {
        let input = self.input.as_mut().ok_or(EtcdError::InputClosed)?;
        writeln!(input, "{command}").and_then(|()| input.flush()).map_err(EtcdError::Io)
    }

    /// Runs `n` PUTs split across the clients.
    fn run(&mut self, n: u64) -> Result<(), EtcdError> {
        self.send(&format!("run {n}"))?;
        self.expect("block").map(drop)
    }

    /// Everything since the last report.
    fn report(&mut self) -> Result<Json, EtcdError> {
        self.send("report")?;
        self.expect("puts")
    }

    /// Closes its input and waits for it to exit.
    fn finish(mut self) -> Result<(), EtcdError> {
        drop(self.input.take());
        let status = wait_bounded(self.child.child(), Duration::from_secs(30))?;
        if status.success() { Ok(()) } else { Err(EtcdError::Exited(status)) }
    }
}

/// Waits for `child` to exit, at most `limit`.
fn wait_bounded(child: &mut Child, limit: Duration) -> Result<std::process::ExitStatus, EtcdError> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().map_err(EtcdError::Io)? {
            return Ok(status);
        }
        if std::time::Instant::now() > deadline {
            return Err(EtcdError::NoExit(limit));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
