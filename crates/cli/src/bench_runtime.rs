//! Benchmarks of the runtime (`microrep` crate) with replicas in separate processes on the shm
//! fabric; whichever replica leads runs the measurement and prints `result ...` lines:
//!
//! * `microrep bench throughput`: commands per second and their latency over batch sizes
//!   and outstanding entries (Mu §7.4), through `Node::submit` (the runtime batches what waits,
//!   up to `batch` commands per log entry, handover mode) and through `Node::submit_batch`
//!   (one ticket per batch of `batch` commands: one log entry each);
//! * `microrep bench groups`: commit latency of one proposal at a time (direct mode) over
//!   group sizes up to 105 replicas: followers are silent in Mu's common path, so the leader's
//!   cost grows only with the writes it posts.
#![allow(clippy::print_stdout)]

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use microrep::config::{AttachMode, ClusterConfig, NodeConfig};
use microrep::idle::IdlePolicy;
use microrep::{Config, Node, ProposeError};
use microrep_testkit::cluster::write_configs;
use microrep_testkit::hist;
use microrep_testkit::scratch::ScratchDir;

use crate::procs::{self, SpawnError};

/// Arguments of `microrep bench throughput`.
#[derive(Debug, clap::Args)]
pub(crate) struct ThroughputArgs {
    /// Replicas (processes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    replicas: u16,
    /// Commands per log entry at most (`submit`), or per batch (`submit_batch`).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    batches: Vec<u32>,
    /// The proposing API: `submit` (one ticket per command) and/or `batch` (one per batch).
    #[arg(long, value_delimiter = ',', default_value = "submit,batch")]
    api: Vec<Api>,
    /// Log entries outstanding (queued or replicating) at once.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    outstanding: Vec<u32>,
    /// Bytes per command.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    payload: u32,
    /// Measuring time per point, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    millis: u64,
    /// Measure the cost of the metrics: run the sweep on clusters without and with
    /// `node.metrics` (a listener on a free loopback port, not scraped), alternating, twice each.
    #[arg(long)]
    compare_metrics: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// How the throughput benchmark proposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Api {
    /// `Node::submit`, one command at a time; the runtime batches what waits.
    Submit,
    /// `Node::submit_batch`, a batch of commands at a time.
    Batch,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Batch => "batch",
        }
    }
}

/// Arguments of `microrep bench groups`.
#[derive(Debug, clap::Args)]
pub(crate) struct GroupsArgs {
    /// Group sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "3,5,9,17,33,65,105",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    sizes: Vec<u16>,
    /// Proposals timed per size.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    samples: u64,
    /// Bytes per command.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    payload: u32,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of one benchmark replica (internal).
#[derive(Debug, clap::Args)]
pub(crate) struct RuntimeNodeArgs {
    #[arg(long)]
    config: PathBuf,
    /// `throughput BATCHES OUTSTANDING PAYLOAD MILLIS` or `latency SAMPLES PAYLOAD`.
    #[arg(long, num_args = 1.., allow_hyphen_values = true)]
    task: Vec<String>,
}

/// Why a runtime benchmark (or one of its replicas) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RuntimeBenchError {
    #[error("prctl: {0}")]
    Prctl(rustix::io::Errno),
    #[error("{}: {source}", path.display())]
    Config { path: PathBuf, source: microrep::ConfigError },
    #[error(transparent)]
    Start(#[from] microrep::StartError),
    #[error("writing to stdout: {0}")]
    Stdout(std::io::Error),
    #[error("unknown task {0:?}")]
    UnknownTask(Vec<String>),
    #[error("submit: {0}")]
    Submit(ProposeError),
    #[error("recording a latency: {0}")]
    Record(#[from] hdrhistogram::RecordError),
    /// The scratch directory or the configuration files could not be written.
    #[error(transparent)]
    Kit(#[from] microrep_testkit::KitError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The replica that measured reported an error (`error WHY` on its stdout).
    #[error("the measuring replica failed: {0}")]
    Measuring(String),
    #[error("no result within {0:?}")]
    NoResult(Duration),
}

fn list(s: &str) -> Vec<u32> {
    s.split(',').filter_map(|v| v.parse().ok()).collect()
}

/// One replica; the leader runs the task and prints its results, then `done`.
pub(crate) fn run_node(args: &RuntimeNodeArgs) -> Result<(), RuntimeBenchError> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(RuntimeBenchError::Prctl)?;
    let config = Config::load(&args.config, &[])
        .map_err(|source| RuntimeBenchError::Config { path: args.config.clone(), source })?;
    let node = microrep::start(&config, procs::Count::default())?;
    // Followers run until the benchmark closes their stdin; whoever comes to lead (leadership
    // settles on the lowest id after the join grace) runs the task.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_line(&mut String::new());
        std::process::exit(0);
    });
    // Start once this replica has led for a while: at start-up, leadership may move once more
    // when the lowest id becomes eligible after its join grace. A replica that does not lead
    // looks again every 20 ms: a hundred followers looking every millisecond were a hundred
    // thousand wake-ups a second on the cores being measured.
    let mut leading_since = None;
    while leading_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(300)) {
        let pause = if node.leader() == Some(node.id()) && node.propose(b"warm-up").is_ok() {
            leading_since.get_or_insert_with(Instant::now);
            Duration::from_millis(1)
        } else {
            leading_since = None;
            Duration::from_millis(20)
        };
        std::thread::sleep(pause);
    }
    let mut out = std::io::stdout().lock();
    let result = match args.task.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["throughput", api, batches, outstanding, payload, millis] => {
            let (payload, millis) = (payload.parse().unwrap_or(64), millis.parse().unwrap_or(500));
            let api = if *api == "batch" { Api::Batch } else { Api::Submit };
            throughput_sweep(&node, api, &list(batches), &list(outstanding), payload, millis, &mut out)
        }
        ["latency", samples, payload] => {
            latency(&node, samples.parse().unwrap_or(1000), payload.parse().unwrap_or(64), &mut out)
        }
        other => Err(RuntimeBenchError::UnknownTask(other.iter().map(ToString::to_string).collect())),
    };
    if let Err(e) = &result {
        writeln!(out, "error {e}").map_err(RuntimeBenchError::Stdout)?;
    }
    writeln!(out, "done").and_then(|()| out.flush()).map_err(RuntimeBenchError::Stdout)
}

/// What one point of the throughput sweep counted.
#[derive(Default)]
struct Tally {
    commands: u64,
    entries: u64,
    failed: u64,
}

/// One proposal in flight: a command (`submit`) or a batch (`submit_batch`).
enum InFlight {
    Command(microrep::Pending),
    Batch(microrep::PendingBatch),
}

impl InFlight {
    fn submit(node: &Node, api: Api, batch: &[&[u8]]) -> Result<Self, ProposeError> {
        match api {
            Api::Submit => node.submit(batch[0]).map(Self::Command),
            Api::Batch => node.submit_batch(batch.iter().copied()).map(Self::Batch),
        }
    }

    /// Waits and counts: commands and the entries that started with them.
    fn wait(self, tally: &mut Tally) -> bool {
        match self {
            Self::Command(p) => match p.wait() {
                Ok(c) => {
                    tally.commands += 1;
                    tally.entries += u64::from(c.index.position == 0);
                    true
                }
                Err(_) => {
                    tally.failed += 1;
                    false
                }
            },
            Self::Batch(p) => {
                let n = p.len() as u64;
                match p.wait() {
                    Ok(_) => {
                        tally.commands += n;
                        tally.entries += 1;
                        true
                    }
                    Err(_) => {
                        tally.failed += n;
                        false
                    }
                }
            }
        }
    }
}

/// Measures each (batch, outstanding) point for `millis`. With `submit`, `batch` is the most
/// commands the runtime packs into an entry and `batch × outstanding` commands are in flight,
/// each timed; with `submit_batch`, `outstanding` batches of `batch` commands are in flight and
/// each batch is timed once (no per-command clock reading).
fn throughput_sweep(
    node: &Node,
    api: Api,
    batches: &[u32],
    outstanding: &[u32],
    payload: u32,
    millis: u64,
    out: &mut impl Write,
) -> Result<(), RuntimeBenchError> {
    let command = vec![7u8; payload as usize];
    for &b in batches {
        node.set_max_batch(b);
        let batch = vec![command.as_slice(); if api == Api::Batch { b as usize } else { 1 }];
        for &o in outstanding {
            let window = if api == Api::Batch { o as usize } else { (b * o) as usize };
            let mut latency = hist::latency_ns();
            let mut inflight = VecDeque::with_capacity(window);
            let start = Instant::now();
            let end = start + Duration::from_millis(millis);
            let mut tally = Tally::default();
            while Instant::now() < end || !inflight.is_empty() {
                while inflight.len() < window && Instant::now() < end {
                    let p = InFlight::submit(node, api, &batch).map_err(RuntimeBenchError::Submit)?;
                    inflight.push_back((p, Instant::now()));
                }
                let Some((p, t0)) = inflight.pop_front() else { break };
                // A proposal that failed is counted next to the percentiles, never in them.
                if p.wait(&mut tally) {
                    latency.record(t0.elapsed().as_nanos().max(1) as u64)?;
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let q = |p| latency.value_at_quantile(p);
            let (p50, p99, p999) = (q(0.5), q(0.99), q(0.999));
            let Tally { commands, entries, failed } = tally;
            writeln!(
                out,
                "result {} {b} {o} {:.0} {p50} {p99} {p999} {commands} {failed} {:.0} {entries}",
                api.name(),
                commands as f64 / secs,
                entries as f64 / secs
            )
            .and_then(|()| out.flush())
            .map_err(RuntimeBenchError::Stdout)?;
        }
    }
    Ok(())
}

fn latency(node: &Node, samples: u64, payload: u32, out: &mut impl Write) -> Result<(), RuntimeBenchError> {
    let command = vec![7u8; payload as usize];
    let mut h = hist::latency_ns();
    let mut failed = 0u64;
    let mut reasons = std::collections::BTreeMap::<String, u64>::new();
    // Every attempt counts: a failed proposal is reported next to the percentiles, not retried
    // into the histogram.
    for _ in 0..samples {
        let t0 = Instant::now();
        match node.propose(&command) {
            Ok(_) => h.record(t0.elapsed().as_nanos().max(1) as u64)?,
            Err(e) => {
                failed += 1;
                *reasons.entry(e.to_string()).or_default() += 1;
            }
        }
    }
    for (reason, count) in reasons {
        writeln!(out, "note {count} proposals failed: {reason}").map_err(RuntimeBenchError::Stdout)?;
    }
    let q = |p| h.value_at_quantile(p);
    writeln!(out, "result {} {} {} {} {failed}", q(0.5), q(0.99), q(0.999), h.len()).map_err(RuntimeBenchError::Stdout)
}

/// Starts `replicas` processes running `task` (logs of `max_slots` slots at most, heartbeats
/// every `heartbeat_us` in groups of up to 9), and returns the leader's result lines.
fn run_cluster(
    name: &str,
    replicas: u16,
    (slot_bytes, max_slots): (u32, u32),
    heartbeat_us: u64,
    node: impl Fn(u16) -> NodeConfig,
    task: &[String],
    budget: Duration,
) -> Result<Vec<String>, RuntimeBenchError> {
    let dir = ScratchDir::new(microrep_fabric::shm::ShmConfig::default_dir(name))?;
    let dir = dir.path();
    (|| {
        let mut cluster = ClusterConfig::local(name, replicas, 1);
        cluster.shm_dir = Some(dir.to_path_buf());
        cluster.log.slot_bytes = slot_bytes;
        // `max_slots`, fewer when they are large (big batches): at most about 64 MiB of log.
        let slots = ((64u32 << 20) / slot_bytes).clamp(64, max_slots);
        cluster.log.slots = slots;
        cluster.log.snapshot_every = u64::from(slots / 2);
        cluster.timing.heartbeat_us = heartbeat_us;
        cluster.timing.fate_share_timeout_us = 2_000_000;
        if replicas > 9 {
            // Large groups on two cores: slow heartbeats keep the background planes cheap. A
            // calm background thread rests at most a quarter of the permission timeout
            // (`BackgroundPlane::calm_until`): at the default 5 ms, 105 of them woke 84,000
            // times a second whatever the heartbeat.
            cluster.timing.heartbeat_us = 20_000;
            cluster.timing.permission_timeout_us = 4 * cluster.timing.heartbeat_us;
        }
        let paths = write_configs(dir, &cluster, node)?;
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        let log = std::env::var("MICROREP_BENCH_LOG").unwrap_or_else(|_| "error".into());
        for (id, path) in paths.iter().enumerate() {
            let mut args =
                vec!["bench-runtime-node".as_ref(), "--config".as_ref(), path.as_os_str(), "--task".as_ref()];
            args.extend(task.iter().map(|t| std::ffi::OsStr::new(t.as_str())));
            children.push(procs::spawn_tagged(&args, id as u16, &tx, Some(&log), Duration::ZERO)?);
        }
        drop(tx);
        let deadline = Instant::now() + budget;
        let mut results = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((_, line)) if line == "done" => return Ok(results),
                Ok((_, line)) if line.starts_with("error ") => {
                    return Err(RuntimeBenchError::Measuring(line["error ".len()..].to_string()));
                }
                Ok((_, line)) if line.starts_with("result ") => results.push(line),
                Ok((id, line)) if line.starts_with("note ") => eprintln!("replica {id}: {}", &line["note ".len()..]),
                Ok(_) => {}
                Err(_) => return Err(RuntimeBenchError::NoResult(budget)),
            }
        }
    })()
}

/// Runs `microrep bench throughput`.
pub(crate) fn throughput(args: &ThroughputArgs) -> Result<(), RuntimeBenchError> {
    let max_batch = args.batches.iter().copied().max().unwrap_or(1);
    let entry = 3 + max_batch * (4 + args.payload);
    let slot_bytes = (entry + 64).next_multiple_of(8);
    let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let node = |id, metrics: bool| {
        let mut n = NodeConfig::new(id);
        n.mode = AttachMode::Handover;
        n.queue_capacity = 65_536;
        n.metrics = metrics.then(|| "127.0.0.1:0".to_string());
        n
    };
    let points = (args.batches.len() * args.outstanding.len()) as u64;
    let budget = Duration::from_secs(60 + points * args.millis / 100);
    if !args.json {
        eprintln!(
            "microrep bench throughput: {} replicas, {} B commands, {} ms per point",
            args.replicas, args.payload, args.millis
        );
        println!(
            "{:>6} {:>6} {:>11} {:>12} {:>10} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8}",
            "api",
            "batch",
            "outstanding",
            "commands/s",
            "entries/s",
            "cmd/entry",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "failed",
            "metrics"
        );
    }
    let rounds: &[bool] = if args.compare_metrics { &[false, true, false, true] } else { &[false] };
    for (round, &metrics) in rounds.iter().enumerate() {
        // The APIs alternate on one cluster per round, so that they are compared side by side.
        for api in &args.api {
            let task = [
                "throughput".to_string(),
                api.name().to_string(),
                join(&args.batches),
                join(&args.outstanding),
                args.payload.to_string(),
                args.millis.to_string(),
            ];
            let name = format!("bench-throughput-{}-{round}-{}", std::process::id(), api.name());
            // Heartbeats every 5 ms (a false suspicion after about 70 ms, not 14): four
            // threads that never rest on two cores, with the hypervisor taking its share, kept
            // the leader's background thread off a core long enough to lose the lead in most
            // runs, which ended the measurement (fail-over is `bench failover`'s).
            let sizes = (slot_bytes, 1024);
            for line in run_cluster(&name, args.replicas, sizes, 5000, |id| node(id, metrics), &task, budget)? {
                print_throughput(&line, args, metrics);
            }
        }
    }
    Ok(())
}

/// Prints one `result` line of the measuring replica as a table row or JSON.
fn print_throughput(line: &str, args: &ThroughputArgs, metrics: bool) {
    let w: Vec<&str> = line.split_whitespace().collect();
    let [_, api, b, o, rate, p50, p99, p999, n, failed, entries, entry_count] = w.as_slice() else { return };
    let per_entry = n.parse::<f64>().unwrap_or(0.0) / entry_count.parse::<f64>().unwrap_or(0.0).max(1.0);
    if args.json {
        println!(
            "{{\"bench\":\"throughput\",\"api\":\"{api}\",\"replicas\":{},\"payload\":{},\"batch\":{b},\"outstanding\":{o},\"commands_per_s\":{rate},\"entries_per_s\":{entries},\"commands_per_entry\":{per_entry:.2},\"p50_ns\":{p50},\"p99_ns\":{p99},\"p999_ns\":{p999},\"samples\":{n},\"failed\":{failed},\"metrics\":{metrics}}}",
            args.replicas, args.payload
        );
    } else {
        let on = if metrics { "on" } else { "off" };
        let us = |v: &str| v.parse::<f64>().unwrap_or(0.0) / 1000.0;
        let (p50, p99, p999) = (us(p50), us(p99), us(p999));
        println!(
            "{api:>6} {b:>6} {o:>11} {rate:>12} {entries:>10} {per_entry:>9.1} {p50:>10.1} {p99:>10.1} {p999:>10.1} {failed:>8} {on:>8}"
        );
    }
}

/// Runs `microrep bench groups`.
pub(crate) fn groups(args: &GroupsArgs) -> Result<(), RuntimeBenchError> {
    if !args.json {
        eprintln!("microrep bench groups: {} B commands, {} samples per size", args.payload, args.samples);
        println!(
            "{:>8} {:>10} {:>10} {:>10} {:>8} {:>8}",
            "replicas", "p50 us", "p99 us", "p99.9 us", "samples", "failed"
        );
    }
    for &n in &args.sizes {
        let node = |id| {
            let mut c = NodeConfig::new(id);
            c.mode = AttachMode::Direct;
            // Followers are off the critical path: let them sleep, or 100 processes starve
            // the two cores. A follower must still apply before the leader laps half the log
            // (8192 slots): about 4 ms of a small group's commits, more of a large group's.
            c.replication.idle = IdlePolicy::Park;
            c.replication.park_us = if n > 9 { 5000 } else { 1000 };
            c.background.park_us = 2000;
            c
        };
        let task = ["latency".to_string(), args.samples.to_string(), args.payload.to_string()];
        let name = format!("bench-groups-{}-{n}", std::process::id());
        let budget = Duration::from_secs(120 + u64::from(n) + args.samples / 1000);
        let slot_bytes = (args.payload + 128).next_multiple_of(8);
        for line in run_cluster(&name, n, (slot_bytes, 8192), 1000, node, &task, budget)? {
            let w: Vec<&str> = line.split_whitespace().collect();
            let [_, p50, p99, p999, count, failed] = w.as_slice() else { continue };
            let us = |v: &str| v.parse::<f64>().unwrap_or(0.0) / 1000.0;
            if args.json {
                println!(
                    "{{\"bench\":\"groups\",\"replicas\":{n},\"payload\":{},\"p50_ns\":{p50},\"p99_ns\":{p99},\"p999_ns\":{p999},\"samples\":{count},\"failed\":{failed}}}",
                    args.payload
                );
            } else {
                println!("{n:>8} {:>10.1} {:>10.1} {:>10.1} {count:>8} {failed:>8}", us(p50), us(p99), us(p999));
            }
        }
    }
    Ok(())
}
