//! `microrep bench replication`: Mu replication latency on the shm or tcp fabric, one process
//! per replica. The leader proposes commands one at a time and times each from `propose` to its
//! `Committed` event (committed on a majority and applied locally); in the same run, in
//! alternating blocks, it times the unreplicated baseline: applying the same command to the
//! same state machine directly. On the tcp fabric a third block times a plain TCP ping-pong of
//! the same payload on loopback (`bench_pingpong`), and the table gives replication / ping-pong.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use microrep_core::mu::{self, Event, MuConfig, MuError, ProposeError, Replica, Role, Stage, StateMachine};
use microrep_fabric::shm::ShmConfig;
use microrep_fabric::{FabricError, NodeId};
use microrep_testkit::KitError;
use microrep_testkit::hist;
use microrep_testkit::scratch::ScratchDir;

use crate::bench_pingpong::{PingPong, PingPongError, PingPongServer};
use crate::procs::{self, Digest, SpawnError};

const BLOCK: u64 = 500;

/// How long a replica leads before it measures.
const STABLE_LEADERSHIP_NS: u64 = 300_000_000;

/// The row of the plain TCP baseline.
const PINGPONG: &str = "tcp-ping-pong";

/// Arguments of `microrep bench replication`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicationArgs {
    /// Replicas (processes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=32))]
    replicas: u16,
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "8,64,256,1024,4096",
          value_parser = clap::value_parser!(u32).range(8..=65_536))]
    sizes: Vec<u32>,
    /// Timed proposals per size (and as many baseline applications).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    samples: u64,
    /// The fabric between the replica processes: shm, or tcp on loopback.
    #[arg(long, default_value = "shm", value_parser = ["shm", "tcp"])]
    fabric: String,
    /// With `--fabric tcp`: replica i listens on BASE_PORT + i.
    #[arg(long, default_value_t = 17_400, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    base_port: u16,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the latency distribution (quantile, ns) of every size and impl as CSV.
    #[arg(long)]
    cdf: Option<std::path::PathBuf>,
}

/// Arguments of one benchmark replica process (internal).
#[derive(Debug, clap::Args)]
pub(crate) struct BenchNodeArgs {
    #[command(flatten)]
    replica: procs::ReplicaArgs,
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u32>,
    #[arg(long)]
    samples: u64,
    /// The ping-pong server of the plain TCP baseline (with the tcp fabric).
    #[arg(long)]
    pingpong: Option<std::net::SocketAddr>,
}

/// Why the replication benchmark (or one of its replicas) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(transparent)]
    Mu(#[from] MuError),
    #[error("writing to stdout: {0}")]
    Stdout(std::io::Error),
    #[error("leadership lost: {0}")]
    Propose(#[from] ProposeError),
    #[error("leadership lost to replica {0}")]
    LostTo(u16),
    #[error("recording a latency: {0}")]
    Record(#[from] hdrhistogram::RecordError),
    #[error(transparent)]
    PingPong(#[from] PingPongError),
    /// The scratch directory could not be made.
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("replica {0} has no piped stdout")]
    NoStdout(usize),
    #[error("no result within {0:?}")]
    NoResult(Duration),
    #[error("every replica exited")]
    AllExited,
    /// The replica that measured reported an error (`error WHY` on its stdout).
    #[error("the measuring replica failed: {0}")]
    Measuring(String),
    #[error("writing {}: {source}", path.display())]
    Cdf { path: PathBuf, source: std::io::Error },
}

fn bench_config(node: NodeId, replicas: u16, max_payload: u32) -> MuConfig {
    let slot_bytes = (max_payload as usize + mu::slot::HEADER_BYTES + mu::slot::CANARY_BYTES).next_multiple_of(8);
    let slot_bytes = slot_bytes.max(64);
    // The default log's bytes (4 MiB), up to its 16,384 slots: half of it is the slack a
    // follower the scheduler keeps waiting for a moment has before it is recycled past.
    let default = MuConfig::new(node, replicas);
    let log_bytes = default.log_slots as usize * default.slot_bytes as usize;
    let log_slots = (log_bytes / slot_bytes).clamp(1024, default.log_slots as usize) as u32;
    MuConfig {
        slot_bytes: slot_bytes as u32,
        log_slots,
        snapshot_every: u64::from(log_slots / 4),
        ..procs::config(node, replicas)
    }
}

fn payload(size: u32, seq: u64) -> Vec<u8> {
    (0..size as usize).map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i) as u8).collect()
}

/// Polls a replica's two planes on one thread as the runtime's two threads do: the replication
/// plane on every poll, the background plane (heartbeats, detection, permissions) only when it
/// has work due ([`Replica::calm_until`]), as the runtime's background thread rests until then.
#[derive(Default)]
struct Planes {
    background_due_ns: u64,
}

impl Planes {
    fn poll<F: microrep_fabric::Fabric>(
        &mut self,
        replica: &mut Replica<F>,
        now: u64,
        app: &mut Digest,
        events: &mut Vec<Event>,
    ) {
        if now >= self.background_due_ns {
            replica.poll_background(now);
            self.background_due_ns = replica.calm_until(now).unwrap_or(now);
        }
        replica.poll_replication(now, app, events);
    }
}

/// One benchmark replica: followers apply; the leader runs the measurement and prints
/// `result SIZE IMPL P50 P99 P999 COUNT` lines, then `done` (or `error WHY`).
pub(crate) fn run_node(args: &BenchNodeArgs) -> Result<(), BenchError> {
    let max = args.sizes.iter().copied().max().unwrap_or(8);
    let cfg = bench_config(NodeId(args.replica.id), args.replica.replicas, max);
    match args.replica.tcp_base_port {
        Some(port) => serve(args, args.replica.start_tcp(&cfg, port)?, cfg),
        None => serve(args, args.replica.start_fabric(&cfg)?, cfg),
    }
}

fn serve<F: microrep_fabric::Fabric>(args: &BenchNodeArgs, fabric: F, cfg: MuConfig) -> Result<(), BenchError> {
    let clock = quanta::Clock::new();
    let start = clock.raw();
    // Nanoseconds since start at a raw clock reading (the commit loop reuses its first reading).
    let at = |raw| clock.delta_as_nanos(start, raw);
    let now = || at(clock.raw());
    let mut replica = Replica::new(fabric, cfg, now())?;
    let quit = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&quit);
    std::thread::spawn(move || {
        let _ = std::io::stdin().lock().lines().next();
        flag.store(true, Ordering::Release);
    });
    let (mut app, mut events) = (Digest::default(), Vec::new());
    let mut out = std::io::stdout().lock();
    let mut measured = false;
    let mut planes = Planes::default();
    // Measure once this replica has led for a while: at start-up, leadership may move once more
    // when the lowest id becomes eligible after its join grace.
    let mut leading_since = None;
    let mut applied_before = 0;
    while !quit.load(Ordering::Acquire) {
        planes.poll(&mut replica, now(), &mut app, &mut events);
        events.clear();
        let t = now();
        leading_since =
            match (replica.status().role == Role::Leader && replica.status().phase == Stage::Idle, leading_since) {
                (false, _) => None,
                (true, since) => Some(since.unwrap_or(t)),
            };
        if !measured && leading_since.is_some_and(|since| t - since >= STABLE_LEADERSHIP_NS) {
            measured = true;
            for &size in &args.sizes {
                let rows = args.pingpong.map(|addr| PingPong::connect(addr, size)).transpose().map_err(Into::into);
                let rows = rows
                    .and_then(|pingpong| measure(&mut replica, &mut app, &at, &clock, size, args.samples, pingpong));
                let (rows, (fewest, most)) = match rows {
                    Ok(measured) => measured,
                    Err(e) => {
                        writeln!(out, "error {e}").and_then(|()| out.flush()).map_err(BenchError::Stdout)?;
                        return Err(e);
                    }
                };
                for (name, h, aborted) in rows {
                    let q = |p| h.value_at_quantile(p);
                    let (p50, p99, p999) = (q(0.5), q(0.99), q(0.999));
                    writeln!(out, "result {size} {name} {p50} {p99} {p999} {} {aborted}", h.len())
                        .map_err(BenchError::Stdout)?;
                    let cdf: Vec<String> = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 1.0]
                        .iter()
                        .map(|&p| format!("{p}:{}", q(p)))
                        .collect();
                    writeln!(out, "cdf {size} {name} {}", cdf.join(",")).map_err(BenchError::Stdout)?;
                }
                writeln!(out, "followers {size} {fewest} {most}").map_err(BenchError::Stdout)?;
            }
            writeln!(out, "done").and_then(|()| out.flush()).map_err(BenchError::Stdout)?;
        }
        // A follower that applied a full batch is behind and polls again at once: one that
        // rested after every poll fell behind a fast leader, left its confirmed set and
        // restored snapshots over and over, and the leader then replicated to one follower
        // instead of two (the table prints how many it wrote to).
        let applied = replica.status().applied;
        if applied.saturating_sub(applied_before) < mu::APPLY_PER_POLL as u64 {
            procs::pause_between_polls(&replica.status());
        }
        applied_before = applied;
    }
    Ok(())
}

/// A row of the table: its name, the histogram of completed operations, and the count of
/// attempts that did not complete.
type Row = (&'static str, Histogram<u64>, u64);

/// The fewest and the most confirmed followers the leader had, sampled between blocks.
type Confirmed = (usize, usize);

/// Times `samples` replicated proposals and as many direct applications (and TCP round trips,
/// given a ping-pong connection), alternating in blocks. The leader spins while a proposal is
/// in flight: the followers are not on the critical path (Mu's one-sided writes need no
/// follower CPU). Returns the table's rows; an attempt the leader aborted is counted, not a
/// sample.
fn measure<F: microrep_fabric::Fabric>(
    replica: &mut Replica<F>,
    app: &mut Digest,
    at: &impl Fn(u64) -> u64,
    clock: &quanta::Clock,
    size: u32,
    samples: u64,
    mut pingpong: Option<PingPong>,
) -> Result<(Vec<Row>, Confirmed), BenchError> {
    let (mut ours, mut base, mut tcp) = (hist::latency_ns(), hist::latency_ns(), hist::latency_ns());
    let mut confirmed = (usize::MAX, 0);
    let mut aborted = 0u64;
    let mut baseline_app = Digest::default();
    let mut events = Vec::new();
    let mut seq = 0u64;
    // Its own: the serving loop's planes resume polling their background at once after this.
    let mut planes = Planes::default();
    let now = || at(clock.raw());
    while ours.len() < samples {
        let followers = replica.status().confirmed.len();
        confirmed = (confirmed.0.min(followers), confirmed.1.max(followers));
        for _ in 0..BLOCK.min(samples - ours.len()) {
            seq += 1;
            let command = payload(size, seq);
            let t0 = clock.raw();
            replica.propose(seq | 1 << 62, &command)?;
            // The first poll takes its time from t0: a clock read costs about 25 ns here.
            let mut poll_at = at(t0);
            let committed = loop {
                planes.poll(replica, poll_at, app, &mut events);
                if let Some(done) = events.drain(..).find_map(|e| match e {
                    Event::Committed { request_id, .. } if request_id == seq | 1 << 62 => Some(true),
                    Event::Failed { request_id, .. } if request_id == seq | 1 << 62 => Some(false),
                    _ => None,
                }) {
                    break done;
                }
                poll_at = now();
            };
            if !committed {
                // The leader aborted an attempt (a timeout while descheduled, say) and asks for
                // permissions again: counted, not a sample; the next proposal waits for it to lead.
                aborted += 1;
                loop {
                    let status = replica.status();
                    if status.phase == Stage::Idle {
                        break;
                    }
                    if status.role == Role::Follower {
                        return Err(BenchError::LostTo(status.leader.0));
                    }
                    planes.poll(replica, now(), app, &mut events);
                    events.clear();
                }
                continue;
            }
            ours.record(clock.delta_as_nanos(t0, clock.raw()).max(1))?;
        }
        for i in 0..BLOCK.min(samples - base.len()) {
            let command = payload(size, seq + i);
            let t0 = clock.raw();
            baseline_app.apply(seq + i, std::hint::black_box(&command));
            base.record(clock.delta_as_nanos(t0, clock.raw()).max(1))?;
        }
        if let Some(pingpong) = &mut pingpong {
            for i in 0..BLOCK.min(samples - tcp.len()) {
                let request = payload(size, seq + i);
                let t0 = clock.raw();
                pingpong.round_trip(&request)?;
                tcp.record(clock.delta_as_nanos(t0, clock.raw()).max(1))?;
                // A block of round trips lasts longer than failure detection: keep heartbeating.
                planes.poll(replica, now(), app, &mut events);
                events.clear();
            }
        }
    }
    std::hint::black_box(&baseline_app);
    let mut rows = vec![("microrep", ours, aborted), ("unreplicated", base, 0)];
    if pingpong.is_some() {
        rows.push((PINGPONG, tcp, 0));
    }
    Ok((rows, confirmed))
}

/// Prints replication / ping-pong at each percentile.
fn print_ratio(size: &str, ours: &[f64; 3], pingpong: &[f64; 3], json: bool) {
    let r: Vec<f64> = ours.iter().zip(pingpong).map(|(o, p)| o / p).collect();
    if json {
        println!(
            "{{\"bench\":\"replication\",\"fabric\":\"tcp\",\"bytes\":{size},\"ratio\":\"microrep/{PINGPONG}\",\"p50\":{:.2},\"p99\":{:.2},\"p999\":{:.2}}}",
            r[0], r[1], r[2]
        );
    } else {
        println!("{size:>6} {:<13} {:>8.2}x {:>8.2}x {:>8.2}x", "microrep/tcp", r[0], r[1], r[2]);
    }
}

/// Runs the replication benchmark and prints its table.
pub(crate) fn replication(args: &ReplicationArgs) -> Result<(), BenchError> {
    let dir = ShmConfig::default_dir(&format!("bench-{}", std::process::id()));
    let dir = ScratchDir::new(dir)?;
    drive(args, dir.path())
}

fn drive(args: &ReplicationArgs, dir: &Path) -> Result<(), BenchError> {
    let sizes: Vec<String> = args.sizes.iter().map(u32::to_string).collect();
    let mut extra = vec!["--sizes".to_string(), sizes.join(","), "--samples".into(), args.samples.to_string()];
    // The ping-pong server lives in this process, another one than the measuring leader's.
    let pingpong = if args.fabric == "tcp" { Some(PingPongServer::start()?) } else { None };
    if let Some(server) = &pingpong {
        extra.extend(["--tcp-base-port".to_string(), args.base_port.to_string()]);
        extra.extend(["--pingpong".to_string(), server.addr().to_string()]);
    }
    let mut children = Vec::new();
    for id in 0..args.replicas {
        children.push(procs::spawn_replica("bench-node", id, args.replicas, dir, &extra)?);
    }
    if !args.json {
        eprintln!(
            "microrep bench replication: {} replicas, {} fabric, {} samples per size",
            args.replicas, args.fabric, args.samples
        );
        println!(
            "{:>6} {:<13} {:>9} {:>9} {:>9} {:>8} {:>8}",
            "bytes", "impl", "p50 ns", "p99 ns", "p99.9 ns", "samples", "aborted"
        );
    }
    // Whichever replica leads measures; read every replica's reports, with a deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    for (id, child) in children.iter_mut().enumerate() {
        let out = child.child().stdout.take().ok_or(BenchError::NoStdout(id))?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let budget = Duration::from_secs(60 + args.samples * args.sizes.len() as u64 / 1_000);
    let deadline = std::time::Instant::now() + budget;
    let mut cdf = Vec::new();
    let mut replicated = std::collections::HashMap::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Err(BenchError::NoResult(budget)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(BenchError::AllExited),
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["result", size, name, p50, p99, p999, n, aborted] => {
                if args.json {
                    println!(
                        "{{\"bench\":\"replication\",\"fabric\":\"{}\",\"replicas\":{},\"bytes\":{size},\"impl\":\"{name}\",\"p50_ns\":{p50},\"p99_ns\":{p99},\"p999_ns\":{p999},\"samples\":{n},\"aborted\":{aborted}}}",
                        args.fabric, args.replicas
                    );
                } else {
                    println!("{size:>6} {name:<13} {p50:>9} {p99:>9} {p999:>9} {n:>8} {aborted:>8}");
                }
                let ns = [p50, p99, p999].map(|v| v.parse::<f64>().unwrap_or(f64::NAN));
                if *name == "microrep" {
                    replicated.insert(size.to_string(), ns);
                } else if let (PINGPONG, Some(ours)) = (*name, replicated.get(*size)) {
                    print_ratio(size, ours, &ns, args.json);
                }
            }
            ["cdf", size, name, points] => cdf.push(format!("{size},{name},{points}")),
            ["followers", size, fewest, most] => {
                let of = args.replicas - 1;
                if args.json {
                    println!(
                        "{{\"bench\":\"replication\",\"fabric\":\"{}\",\"replicas\":{},\"bytes\":{size},\"confirmed_followers_min\":{fewest},\"confirmed_followers_max\":{most},\"followers\":{of}}}",
                        args.fabric, args.replicas
                    );
                } else {
                    println!(
                        "{size:>6} the leader wrote to {fewest} to {most} of {of} followers (sampled every {BLOCK} commits)"
                    );
                }
            }
            ["done"] => {
                if let Some(path) = &args.cdf {
                    let mut text = String::from("bytes,impl,quantile,ns\n");
                    for row in &cdf {
                        let mut f = row.splitn(3, ',');
                        let (size, name, points) =
                            (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or(""));
                        for point in points.split(',') {
                            let (q, v) = point.split_once(':').unwrap_or(("", ""));
                            text.push_str(&format!("{size},{name},{q},{v}\n"));
                        }
                    }
                    std::fs::write(path, text).map_err(|source| BenchError::Cdf { path: path.clone(), source })?;
                }
                return Ok(());
            }
            ["error", ..] => return Err(BenchError::Measuring(line["error ".len()..].to_string())),
            _ => {}
        }
    }
}
