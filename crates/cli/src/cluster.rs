//! `microrep cluster up`: a local cluster of key-value replicas, one `microrep node` process
//! each, on the shm fabric (or tcp, or verbs: RDMA through this host's device). It writes each
//! node's config file, starts the processes, runs a demo load of RESP clients against the
//! leader (optionally SIGKILLing the leader half way), checks that no acknowledged write was
//! lost and that every replica holds the same state, and, with `--serve`, keeps the cluster up
//! for `redis-cli` until Ctrl-C. With `--durability fsync --kill-all` it then SIGKILLs every
//! replica, starts them all again and checks the same from their durable logs.
#![allow(clippy::print_stdout)]

use std::ffi::OsStr;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use microrep::Config;
use microrep::config::{
    AttachMode, ClusterConfig, Durability, FabricKind, NodeConfig, ThreadConfig, TimingConfig, VerbsSettings,
};
use microrep::idle::IdlePolicy;
use microrep_fabric::FabricError;
use microrep_fabric::shm::ShmFabric;
use microrep_testkit::KitError;
use microrep_testkit::child::Guarded;
use microrep_testkit::cluster::write_configs;
use microrep_testkit::scratch::ScratchDir;

use crate::load::{self, LoadError, LoadReport};
use crate::node::SignalHandlerError;
use crate::procs::SpawnError;
use crate::status::QueryError;
use crate::{procs, status};

/// Arguments of `microrep cluster up`.
#[derive(Debug, clap::Args)]
pub(crate) struct UpArgs {
    /// Replicas (processes) in the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=105))]
    replicas: u16,
    /// Client port of replica 0; replica i listens on BASE_PORT + i (loopback).
    #[arg(long, default_value_t = 6380, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    base_port: u16,
    /// Commands of the demo load (0: none).
    #[arg(long, alias = "entries", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    ops: u64,
    /// Concurrent clients of the demo load.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    clients: u16,
    /// SIGKILL the leader once half the load is done.
    #[arg(long)]
    kill_leader: bool,
    /// `cluster.durability`: "fsync" makes every replica keep a durable log in its data
    /// directory (under --dir: put it on the disk to measure).
    #[arg(long, default_value = "none", value_parser = ["none", "fsync"])]
    durability: String,
    /// After the demo load, SIGKILL every replica at once, start them all again, and check that
    /// every acknowledged write reads back (needs --durability fsync).
    #[arg(long)]
    kill_all: bool,
    /// After the demo, keep the cluster running for other clients (redis-cli) until Ctrl-C.
    #[arg(long)]
    serve: bool,
    /// Serve each replica's Prometheus metrics: replica i on 127.0.0.1:(METRICS_BASE_PORT + i)
    /// (docs/METRICS.md).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    metrics_base_port: Option<u16>,
    /// The fabric the replicas share: shm (processes on this host), tcp, or verbs (RDMA through
    /// this host's device, e.g. soft-RoCE; a build with the `verbs` feature). On tcp and verbs,
    /// replica i's fabric listens on 127.0.0.1:(BASE_PORT + REPLICAS + i).
    #[arg(long, value_enum, default_value_t = FabricArg::Shm)]
    fabric: FabricArg,
    /// Overrides a key of every replica's configuration (repeatable), e.g. `--set
    /// node.verbs.device=rxe0 --set node.verbs.gid_index=1` (docs/CONFIG.md).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Cluster directory: config files and shm segments (default: a fresh one under /dev/shm,
    /// removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The fabrics `cluster up --fabric` offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FabricArg {
    Shm,
    Tcp,
    Verbs,
}

impl From<FabricArg> for FabricKind {
    fn from(arg: FabricArg) -> Self {
        match arg {
            FabricArg::Shm => Self::Shm,
            FabricArg::Tcp => Self::Tcp,
            FabricArg::Verbs => Self::Verbs,
        }
    }
}

/// Why `microrep cluster up` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    #[error(
        "--kill-leader needs at least 3 replicas: without the leader, {} of {replicas} is no majority",
        replicas - 1
    )]
    TooFewToKill { replicas: u16 },
    #[error(
        "--kill-all needs --durability fsync: without a durable log a cluster all of whose members were killed has lost its state"
    )]
    KillAllWithoutDurability,
    #[error(transparent)]
    Signal(#[from] SignalHandlerError),
    /// The scratch directory or the configuration files could not be written.
    #[error(transparent)]
    Kit(#[from] KitError),
    /// Stale shm segments could not be removed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// A member's client address is not an address (or none is configured).
    #[error(transparent)]
    Member(#[from] microrep::ConfigError),
    /// A `--set` override does not apply, or makes the configuration invalid.
    #[error("--set: {0}")]
    Override(microrep::ConfigError),
    /// `--fabric verbs` in a build without it.
    #[cfg(not(feature = "verbs"))]
    #[error(transparent)]
    NotBuilt(microrep::StartError),
    #[error("{addr}: {source}")]
    Address { addr: String, source: std::net::AddrParseError },
    #[error("cannot listen on {addr} ({source}); choose other ports with --base-port")]
    Port { addr: SocketAddr, source: std::io::Error },
    #[error("cannot serve metrics on {addr} ({source}); choose other ports with --metrics-base-port")]
    MetricsPort { addr: SocketAddr, source: std::io::Error },
    #[error("creating {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("interrupted")]
    Interrupted,
    #[error("the nodes did not start within 60 s")]
    StartTimeout,
    #[error("a node exited during start-up ({0}); see its error above")]
    ExitedDuringStartUp(std::process::ExitStatus),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("killing the leader, node {node}: {source}")]
    Kill { node: usize, source: std::io::Error },
    #[error("the load panicked")]
    LoadPanicked,
    #[error("node {node}: {source}")]
    Status { node: usize, source: QueryError },
    /// The live replicas' applied indices and digests still differed at the deadline.
    #[error("replicas did not converge: {0:?}")]
    Diverged(Vec<(u64, Option<String>)>),
}

/// A node process: stopped with SIGTERM (then SIGKILL after 5 s) and reaped when dropped.
struct Proc {
    child: Guarded,
    alive: bool,
}

/// Runs `microrep cluster up`.
pub(crate) fn up(args: &UpArgs) -> Result<(), ClusterError> {
    if args.kill_leader && args.replicas < 3 {
        return Err(ClusterError::TooFewToKill { replicas: args.replicas });
    }
    if args.kill_all && args.durability != "fsync" {
        return Err(ClusterError::KillAllWithoutDurability);
    }
    #[cfg(not(feature = "verbs"))]
    if args.fabric == FabricArg::Verbs {
        return Err(ClusterError::NotBuilt(microrep::StartError::NotBuilt { fabric: FabricKind::Verbs }));
    }
    let stop = crate::node::stop_flag()?;
    let name = format!("cluster-{}", std::process::id());
    let Some(dir) = &args.dir else {
        let scratch = ScratchDir::new(microrep_fabric::shm::ShmConfig::default_dir(&name))?;
        return run(args, &name, scratch.path(), &stop);
    };
    ShmFabric::remove_stale(dir)?;
    run(args, &name, dir, &stop)
}

fn cluster_config(args: &UpArgs, name: &str, dir: &Path) -> Result<ClusterConfig, ClusterError> {
    let mut cluster = ClusterConfig::local(name, args.replicas, args.base_port);
    cluster.fabric = args.fabric.into();
    match cluster.fabric {
        FabricKind::Shm => cluster.shm_dir = Some(dir.to_path_buf()),
        FabricKind::Tcp | FabricKind::Verbs => {
            for m in &mut cluster.members {
                let port = args.base_port.saturating_add(args.replicas).saturating_add(m.id);
                m.fabric = Some(format!("127.0.0.1:{port}"));
            }
        }
    }
    if cluster.fabric == FabricKind::Verbs {
        cluster.timing = verbs_timing();
    } else {
        // Every replica snapshots its whole store every `snapshot_every` entries: with 100,000
        // keys about 6 ms each, which every 1,024 entries took a fifth of redis-benchmark's
        // throughput at 8 and 32 clients (docs/BENCHMARKS.md, "Snapshots four times rarer").
        // A log four times longer (16 MiB of 1 KiB slots) keeps recycling's slack. Over verbs
        // (registered memory, soft-RoCE) not measured: unchanged.
        cluster.log.slots = 16_384;
        cluster.log.snapshot_every = 4_096;
    }
    // Room for the whole demo state in a snapshot, so a restarted replica can catch up.
    cluster.log.snapshot_bytes = 16 << 20;
    if args.durability == "fsync" {
        cluster.durability = Durability::Fsync;
    }
    for m in &cluster.members {
        let addr: SocketAddr =
            m.client.parse().map_err(|source| ClusterError::Address { addr: m.client.clone(), source })?;
        TcpListener::bind(addr).map_err(|source| ClusterError::Port { addr, source })?;
        if let Some(addr) = &m.fabric {
            let addr: SocketAddr =
                addr.parse().map_err(|source| ClusterError::Address { addr: addr.clone(), source })?;
            TcpListener::bind(addr).map_err(|source| ClusterError::Port { addr, source })?;
        }
        if let Some(base) = args.metrics_base_port {
            let addr = SocketAddr::from(([127, 0, 0, 1], base.saturating_add(m.id)));
            TcpListener::bind(addr).map_err(|source| ClusterError::MetricsPort { addr, source })?;
        }
    }
    Ok(cluster)
}

/// Failure detection for replicas sharing the cores with a software RDMA device (soft-RoCE
/// does the NIC's work in the kernel, on the same cores). In the 2-vCPU soft-RoCE VM the
/// default 1 ms heartbeat, and the 2 ms of the Mu test over verbs (one process of three
/// threads), had the three replica processes take each other for dead over and over: no leader
/// held for a second. With 5 ms (a failure detected in about 70 ms), 3,000 commands and a leader
/// kill pass there. `--set cluster.timing.KEY=VALUE` changes them.
fn verbs_timing() -> TimingConfig {
    TimingConfig {
        heartbeat_us: 5000,
        fate_share_timeout_us: 500_000,
        fate_share_cooldown_us: 1_000_000,
        permission_timeout_us: 50_000,
        round_timeout_us: 250_000,
        recycle_period_us: 5000,
        lag_check_period_us: 25_000,
        ..TimingConfig::default()
    }
}

fn run(args: &UpArgs, name: &str, dir: &Path, stop: &AtomicBool) -> Result<(), ClusterError> {
    let cluster = cluster_config(args, name, dir)?;
    std::fs::create_dir_all(dir).map_err(|source| ClusterError::CreateDir { path: dir.to_path_buf(), source })?;
    println!(
        "microrep cluster: {} replicas on the {} fabric, files in {}",
        args.replicas,
        cluster.fabric,
        dir.display()
    );
    let (lines_tx, lines) = mpsc::channel();
    let mut procs = Vec::new();
    // Each member remembers its cluster generation in a data directory of its own: members
    // restarted all together stop with an error rather than start an empty cluster.
    let verbs = cluster.fabric == FabricKind::Verbs;
    let node = |id| NodeConfig {
        data_dir: Some(dir.join(format!("node-{id}.data"))),
        metrics: args.metrics_base_port.map(|base| format!("127.0.0.1:{}", base.saturating_add(id))),
        // A dead peer's operations fail after 4 retries of 67 ms, as in the Mu test over verbs.
        verbs: verbs.then(|| VerbsSettings { retry_count: 3, ..Default::default() }),
        // Parked, not yielding, between idle polls: the cores are soft-RoCE's too (in the VM
        // this nearly doubled the demo load's throughput, 164 to 311 commands/s).
        replication: if verbs {
            ThreadConfig { idle: IdlePolicy::Park, park_us: 100, ..ThreadConfig::default() }
        } else {
            ThreadConfig::default()
        },
        // The RESP server's one thread proposes each turn's commands itself: on shm and tcp it
        // served 1, 8 and 32 redis-benchmark clients faster than handing them to the
        // replication thread, which spins between turns (docs/BENCHMARKS.md, "The RESP server
        // under sustained load"). Over verbs (soft-RoCE) it was not measured: unchanged.
        mode: if verbs { NodeConfig::new(id).mode } else { AttachMode::Direct },
        ..NodeConfig::new(id)
    };
    // The overrides apply when each node loads its file; checked here first, on every member.
    for id in 0..args.replicas {
        let config = Config { cluster: cluster.clone(), node: node(id) };
        Config::parse(&config.to_toml(), &args.overrides).map_err(ClusterError::Override)?;
    }
    let configs = write_configs(dir, &cluster, node)?;
    for (id, path) in configs.iter().enumerate() {
        procs.push(spawn_node(path, id as u16, &args.overrides, &lines_tx)?);
    }
    let members: Vec<SocketAddr> = (0..args.replicas).map(|id| cluster.client_addr(id)).collect::<Result<_, _>>()?;
    wait_until_serving(&lines, &mut procs, args.replicas, stop)?;
    if let Some(base) = args.metrics_base_port {
        for id in 0..args.replicas {
            println!("metrics of node {id}: http://127.0.0.1:{}/metrics", base.saturating_add(id));
        }
    }
    let leader = load::find_leader(&members, Duration::from_secs(30))?;
    println!("leader: node {leader} at {}", members[leader]);
    let config_path = dir.join("node-0.toml");
    if args.ops > 0 {
        let killed = AtomicBool::new(false);
        let report = drive_load(args, &members, &mut procs, &killed, stop)?;
        report.print();
        verify(&members, &procs, &report)?;
        if args.kill_all {
            println!("killing every replica at once (SIGKILL), then starting them all again");
            for (node, p) in procs.iter_mut().enumerate() {
                p.child.child().kill().map_err(|source| ClusterError::Kill { node, source })?;
                p.child.child().wait().map_err(|source| ClusterError::Kill { node, source })?;
                p.alive = false;
            }
            let started = Instant::now();
            procs = configs
                .iter()
                .enumerate()
                .map(|(id, path)| spawn_node(path, id as u16, &args.overrides, &lines_tx))
                .collect::<Result<_, _>>()?;
            wait_until_serving(&lines, &mut procs, args.replicas, stop)?;
            let leader = load::find_leader(&members, Duration::from_secs(30))?;
            println!("back after {:.2} s: leader node {leader}", started.elapsed().as_secs_f64());
            verify(&members, &procs, &report)?;
        }
    }
    if args.serve {
        println!("serving until Ctrl-C; try:");
        println!("  redis-cli -p {} set greeting hello", args.base_port);
        println!("  target/release/microrep status --config {}", config_path.display());
        while !stop.load(Ordering::Acquire) {
            for (id, line) in lines.try_iter() {
                println!("  [node {id}] {line}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("stopping");
    }
    Ok(())
}

fn spawn_node(
    config: &Path,
    id: u16,
    overrides: &[String],
    lines: &mpsc::Sender<(u16, String)>,
) -> Result<Proc, SpawnError> {
    let mut args: Vec<&OsStr> =
        vec!["node".as_ref(), "--config".as_ref(), config.as_os_str(), "--exit-with-parent".as_ref()];
    for o in overrides {
        args.extend([OsStr::new("--set"), OsStr::new(o)]);
    }
    Ok(Proc { child: procs::spawn_tagged(&args, id, lines, None, Duration::from_secs(5))?, alive: true })
}

fn wait_until_serving(
    lines: &mpsc::Receiver<(u16, String)>,
    procs: &mut [Proc],
    replicas: u16,
    stop: &AtomicBool,
) -> Result<(), ClusterError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut serving = 0;
    while serving < replicas {
        if stop.load(Ordering::Acquire) {
            return Err(ClusterError::Interrupted);
        }
        if Instant::now() > deadline {
            return Err(ClusterError::StartTimeout);
        }
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.child().try_wait() {
                p.alive = false;
                return Err(ClusterError::ExitedDuringStartUp(status));
            }
        }
        if let Ok((id, line)) = lines.recv_timeout(Duration::from_millis(100)) {
            println!("  [node {id}] {line}");
            serving += u16::from(line.contains("serving RESP"));
        }
    }
    Ok(())
}

fn drive_load(
    args: &UpArgs,
    members: &[SocketAddr],
    procs: &mut [Proc],
    killed: &AtomicBool,
    stop: &AtomicBool,
) -> Result<LoadReport, ClusterError> {
    println!("demo load: {} commands (SET, GET, INCR) from {} clients, through the leader", args.ops, args.clients);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    std::thread::scope(|s| {
        let load = s.spawn(|| load::run(members, args.ops, args.clients, &done, stop));
        let mut next_report = Instant::now() + Duration::from_secs(1);
        while !load.is_finished() {
            let n = done.load(Ordering::Relaxed);
            if args.kill_leader && !killed.load(Ordering::Relaxed) && n * 2 >= args.ops {
                let leader = load::find_leader(members, Duration::from_secs(30))?;
                println!("  killing the leader, node {leader} (SIGKILL), after {n} commands");
                procs[leader].child.child().kill().map_err(|source| ClusterError::Kill { node: leader, source })?;
                procs[leader].alive = false;
                killed.store(true, Ordering::Relaxed);
            }
            if Instant::now() >= next_report {
                next_report += Duration::from_secs(1);
                println!("  {n}/{} commands after {:.1} s", args.ops, started.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(load.join().map_err(|_| ClusterError::LoadPanicked)??)
    })
}

/// Checks that every acknowledged write is there and that the live replicas converge.
fn verify(members: &[SocketAddr], procs: &[Proc], report: &LoadReport) -> Result<(), ClusterError> {
    report.check_reads_back(members)?;
    let live: Vec<usize> = (0..procs.len()).filter(|&i| procs[i].alive).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<(u64, Option<String>)> = live
            .iter()
            .map(|&i| {
                let status = status::query(members[i]).map_err(|source| ClusterError::Status { node: i, source })?;
                Ok((status.applied, status.digest))
            })
            .collect::<Result<_, ClusterError>>()?;
        if states.windows(2).all(|w| w[0] == w[1]) {
            println!(
                "{} live replicas applied {} log entries each; state digests agree ({})",
                live.len(),
                states[0].0,
                states[0].1.as_deref().unwrap_or("none")
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ClusterError::Diverged(states));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
