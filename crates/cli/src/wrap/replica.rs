//! One replica of `microrep wrap` (`microrep wrap-replica`, started by the supervisor): a Mu
//! node whose state machine is the replay agent, the socket the shim talks to, and the server
//! copy, started with the shim preloaded. Its main thread watches leadership: a replica that
//! becomes leader first applies everything committed before it, then lets clients in.
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use microrep::{Config, ConfigError, ProposeError, StartError};
use microrep_interpose_wire::{CONTROL_BYTES, CONTROL_NAME, SOCKET_NAME};

use super::control::Control;
use super::entry::{CurrentCopy, Discard, Origin, Tag, Work, WrapApp};
use super::output::OutputCheck;
use super::replay::{self, CatchUpError, Progress, Transfer, Unrecoverable};
use super::server::{Server, ServerError};
use super::shim::{self, Role, Shared};
use super::transfer::{self, Hook};
use crate::node::SignalHandlerError;

/// Arguments of `microrep wrap-replica` (internal).
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicaArgs {
    /// This replica's node configuration.
    #[arg(long)]
    config: PathBuf,
    /// Working directory of the server copy; also holds the shim's socket and control page.
    /// Emptied at start: a copy starts empty, and gets any state through the log or a peer.
    /// The peers' directories are its siblings `replica-ID`.
    #[arg(long)]
    dir: PathBuf,
    /// The port the server copy listens on (loopback is enough for the replay agent).
    #[arg(long)]
    port: u16,
    /// The shim library.
    #[arg(long)]
    preload: PathBuf,
    /// How the server's state is transferred to a copy that needs it.
    #[arg(long, value_enum)]
    state_transfer: Hook,
    /// A file holding the cluster's random seed (64 hex digits; every copy's randomness is
    /// drawn from it, docs/WRAP.md "Time and randomness"); without it, each copy draws from
    /// the kernel.
    #[arg(long)]
    random_seed: Option<PathBuf>,
    /// Output checking (see `microrep wrap --help`).
    #[arg(long, value_enum, default_value = "report")]
    output_check: OutputCheck,
    /// The server command, placeholders already substituted.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Why a wrap replica could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicaError {
    /// The parent-death signal could not be set.
    #[error("prctl: {0}")]
    Prctl(rustix::io::Errno),
    #[error("{}: {source}", path.display())]
    Config { path: PathBuf, source: ConfigError },
    #[error("creating {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("{}: not a random seed (64 hexadecimal digits)", .0.display())]
    Seed(PathBuf),
    #[error("{}: {source}", path.display())]
    ReadDir { path: PathBuf, source: std::io::Error },
    #[error("emptying {}: {source}", path.display())]
    Remove { path: PathBuf, source: std::io::Error },
    /// The control page could not be created, or a socket bound.
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    #[error("mapping {}: {source}", path.display())]
    Map { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("starting thread {name}: {source}")]
    Thread { name: &'static str, source: std::io::Error },
    #[error(transparent)]
    Signal(#[from] SignalHandlerError),
    /// The Mu node stopped on a fatal error.
    #[error("replica {id}: the node stopped: {why}")]
    NodeStopped { id: u16, why: String },
    #[error("replica {id}: its server copy cannot be brought up to date: {source}; stopping this copy")]
    Unrecoverable { id: u16, source: Unrecoverable },
    #[error("replica {id}: the replay agent stopped")]
    AgentStopped { id: u16 },
    #[error(transparent)]
    Promote(#[from] PromoteError),
    #[error("adding the output checks to the metrics: {0}")]
    Metrics(#[from] microrep::MetricNameError),
}

/// Why a new leader's server could not be made current before serving clients.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PromoteError {
    #[error("the promotion barrier did not commit: {0}")]
    Barrier(ProposeError),
    #[error("the replay agent did not reach the promotion barrier within 30 s")]
    AgentBehind,
    #[error("promotion: the server did not consume the replayed input within 30 s: {0}")]
    ServerBehind(CatchUpError),
    #[error("retiring connection {conn}: {source}")]
    Retire { conn: u64, source: ProposeError },
}

/// Adds output checking's counts and the copy's rebuilds to the node's metrics (served with
/// `microrep wrap --metrics-base-port`).
fn register_metrics(node: &microrep::Node, progress: &Arc<Progress>) -> Result<(), microrep::MetricNameError> {
    let read = |count: fn(&Progress) -> &std::sync::atomic::AtomicU64| {
        let progress = Arc::clone(progress);
        move || count(&progress).load(Ordering::Relaxed)
    };
    node.register_counter(
        "microrep_wrap_output_buckets_matched",
        "Buckets of this copy's replies (4 KiB of one connection) equal to the leader's",
        read(|p| &p.output.matched),
    )?;
    node.register_counter(
        "microrep_wrap_output_buckets_differed",
        "Buckets of this copy's replies that differed from the leader's or were never written",
        read(|p| &p.output.differed),
    )?;
    node.register_counter(
        "microrep_wrap_copies_rebuilt",
        "Times this replica's server copy was replaced by a peer's state",
        read(|p| &p.rebuilt),
    )
}

/// Prints one line of the replica's story on standard output (which `microrep wrap` passes
/// on), flushed at once.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Removes everything in `dir` (a previous run's server files, sockets and control page) but
/// the server's log, which the next server appends to.
fn empty_dir(dir: &Path) -> Result<(), ReplicaError> {
    std::fs::create_dir_all(dir).map_err(|source| ReplicaError::CreateDir { path: dir.into(), source })?;
    let entries = std::fs::read_dir(dir).map_err(|source| ReplicaError::ReadDir { path: dir.into(), source })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == "server.log" {
            continue;
        }
        let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        removed.map_err(|source| ReplicaError::Remove { path, source })?;
    }
    Ok(())
}

/// Waits (at most `patience`) until every peer's wrap node has its state socket, so that the
/// Mu nodes of a cluster start together: one started much later than the others would be
/// suspected at once, and a cluster starting one replica at a time on a busy machine changed
/// leaders after its first leader had served clients. A restarted replica finds its peers'
/// sockets at once.
fn await_peers(peers: &[PathBuf], patience: Duration) {
    let deadline = Instant::now() + patience;
    while !peers.iter().all(|p| p.join(transfer::SOCKET_NAME).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The random seed in `path`: 64 hexadecimal digits (a line end allowed).
fn read_seed(path: &Path) -> Result<String, ReplicaError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReplicaError::File { path: path.into(), source })?;
    let seed = text.trim_end();
    if seed.len() == 64 && seed.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(seed.to_owned())
    } else {
        Err(ReplicaError::Seed(path.into()))
    }
}

/// Runs the replica until SIGTERM, its node stops, or its copy can never be brought up to date
/// (no state-transfer hook); a copy that must be discarded is rebuilt from a peer meanwhile.
pub(crate) fn run(args: &ReplicaArgs) -> Result<(), ReplicaError> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(ReplicaError::Prctl)?;
    let config =
        Config::load(&args.config, &[]).map_err(|source| ReplicaError::Config { path: args.config.clone(), source })?;
    let id = config.node.id;
    empty_dir(&args.dir)?;
    let control_path = args.dir.join(CONTROL_NAME);
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&control_path)
        .and_then(|f| f.set_len(CONTROL_BYTES as u64).map(|()| f))
        .map_err(|source| ReplicaError::File { path: control_path.clone(), source })?;
    let bind =
        |path: &Path| UnixListener::bind(path).map_err(|source| ReplicaError::File { path: path.into(), source });
    let socket_path = args.dir.join(SOCKET_NAME);
    let listener = bind(&socket_path)?;
    let state_path = args.dir.join(transfer::SOCKET_NAME);
    let state_listener = bind(&state_path)?;
    let siblings = args.dir.parent().unwrap_or(Path::new("/"));
    let peers: Vec<PathBuf> = (0..config.cluster.members.len() as u16)
        .filter(|&p| p != id)
        .map(|p| siblings.join(format!("replica-{p}")))
        .collect();
    await_peers(&peers, Duration::from_secs(10));
    let copy = CurrentCopy::new(Origin::fresh(id));
    let (tx, rx) = mpsc::channel();
    let app = WrapApp::new(Arc::clone(&copy), tx.clone());
    let node = microrep::start(&config, app)?;
    let progress = Arc::new(Progress::default());
    register_metrics(&node, &progress)?;
    let seed = args.random_seed.as_deref().map(read_seed).transpose()?;
    let server = Arc::new(Server::start(args.command.clone(), args.dir.clone(), args.preload.clone(), seed)?);
    let (requests_tx, requests) = mpsc::channel();
    let transfer = Transfer {
        output_check: args.output_check,
        copy: Arc::clone(&copy),
        hook: args.state_transfer,
        requests,
        server: Arc::clone(&server),
        peers,
        dir: args.dir.clone(),
    };
    let agent = Arc::clone(&progress);
    let port = args.port;
    let control =
        Arc::new(Control::map(&control).map_err(|source| ReplicaError::Map { path: control_path.clone(), source })?);
    let agent_control = Arc::clone(&control);
    spawn("wrap-replay", move || replay::run(port, agent_control, &rx, &agent, transfer))?;
    let shared = Arc::new(Shared::new(node, copy, progress, args.output_check));
    let handlers = Arc::clone(&shared);
    spawn("wrap-shim", move || shim::serve(&listener, &handlers))?;
    let donors = Arc::clone(&shared);
    spawn("wrap-state", move || transfer::serve(&state_listener, &donors, &requests_tx))?;
    let stop = crate::node::stop_flag()?;
    say(&format!(
        "replica {id}: server pid {}, port {}, log {}",
        server.pid().unwrap_or_default(),
        args.port,
        args.dir.join("server.log").display()
    ));
    let result = watch(&shared, &server, &stop, &control, args.port, &tx);
    server.stop();
    let _ = std::fs::remove_file(&socket_path);
    let _ = std::fs::remove_file(&state_path);
    let _ = std::fs::remove_file(&control_path);
    result
}

/// Starts the replica's thread `name`.
fn spawn(name: &'static str, f: impl FnOnce() + Send + 'static) -> Result<(), ReplicaError> {
    let started = std::thread::Builder::new().name(name.into()).spawn(f);
    started.map(drop).map_err(|source| ReplicaError::Thread { name, source })
}

/// How long a replica's node runs before its server may serve clients. On a busy machine the
/// nodes of a starting cluster suspected each other while some were still starting, and a
/// replica that led (and served) in that first moment was deposed tens of milliseconds later,
/// costing its copy.
const STARTUP_SETTLE: Duration = Duration::from_millis(1000);
/// How long a replica must have been leader, in its own view, before it promotes: after a
/// fail-over on a busy machine the survivors' failure detectors did not always agree at once,
/// and the first of two to lead was deposed by the other within milliseconds of serving. A
/// fail-over takes this much longer.
const LEADERSHIP_SETTLE: Duration = Duration::from_millis(150);

fn watch(
    shared: &Shared,
    server: &Server,
    stop: &AtomicBool,
    control: &Control,
    port: u16,
    agent: &mpsc::Sender<Work>,
) -> Result<(), ReplicaError> {
    let id = shared.copy.get().replica;
    let started = Instant::now();
    let mut leading_since = None;
    while !stop.load(Ordering::Acquire) {
        if let Some(why) = shared.node.fatal() {
            return Err(ReplicaError::NodeStopped { id, why });
        }
        if let Some(source) = shared.progress.failure() {
            return Err(ReplicaError::Unrecoverable { id, source });
        }
        let stale = shared.progress.stale();
        // A copy being rebuilt cannot serve: its node stays a voter but does not lead, so that
        // a replica whose copy is current leads (and retires the old leader's connections,
        // which a donor's clean cut may wait for).
        shared.node.set_candidate(!stale);
        let leading = shared.node.leader() == Some(shared.node.id());
        leading_since = if leading { leading_since.or_else(|| Some(Instant::now())) } else { None };
        if !stale && let Some(why) = discard_reason(shared, server, leading) {
            say(&format!("replica {id}: {why}; rebuilding its copy from a peer's state (the node stays)"));
            shared.set_role(Role::Following);
            shared.delivered.store(false, Ordering::Release);
            shared.progress.stale.store(true, Ordering::Release);
            agent.send(Work::Rebuild { why }).map_err(|_| ReplicaError::AgentStopped { id })?;
            continue;
        }
        let settled = started.elapsed() >= STARTUP_SETTLE
            && leading_since.is_some_and(|since: Instant| since.elapsed() >= LEADERSHIP_SETTLE);
        match shared.role() {
            Role::Following if settled && !stale && promote(shared, control)? => {
                say(&format!("replica {id}: leader, serving clients on port {port}"));
            }
            Role::Serving if !leading => {
                shared.set_role(Role::Following);
                say(&format!("replica {id}: following"));
            }
            _ => {}
        }
        // A follower of a settled leader only watches for changes that take 150 ms to act on.
        let quiet = shared.role() == Role::Following && !leading && !stale;
        std::thread::sleep(Duration::from_millis(if quiet { 10 } else { 2 }));
    }
    Ok(())
}

/// Why the copy must be replaced by a peer's state, if it must: it executed input that only
/// the shim delivered and lost the leadership under which that input was ordered (a copy
/// whose connections the new leader retired, or whose reads were refused, differs from the
/// log), a proposal's outcome is unknown, or the server exited.
fn discard_reason(shared: &Shared, server: &Server, leading: bool) -> Option<Discard> {
    if let Some(status) = server.exited() {
        return Some(Discard::ServerExited(status));
    }
    if shared.copy.diverged() {
        return Some(Discard::Diverged);
    }
    (shared.role() == Role::Serving && !leading && shared.delivered.load(Ordering::Acquire))
        .then_some(Discard::LostLeadership)
}

/// Makes a new leader's server current before clients reach it: commits a barrier, waits
/// until the replay agent handled everything up to it and the server processed all replayed
/// input, then retires the old leader's connections through the log. False if leadership
/// moved on meanwhile.
fn promote(shared: &Shared, control: &Control) -> Result<bool, PromoteError> {
    shared.set_role(Role::Promoting);
    let id = shared.copy.get().replica;
    tracing::debug!("replica {id}: leader; committing the promotion barrier");
    let deadline = Instant::now() + Duration::from_secs(30);
    let follow = || {
        shared.set_role(Role::Following);
        Ok(false)
    };
    let barrier = loop {
        match shared.propose(Tag::Barrier, 0, &[]) {
            Ok(reply) => break reply.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes),
            Err(ProposeError::NotLeader { .. }) => return follow(),
            Err(e) if Instant::now() > deadline => return Err(PromoteError::Barrier(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    tracing::info!("replica {id}: promotion barrier at entry {barrier}");
    while shared.progress.applied.load(Ordering::Acquire) < barrier {
        if Instant::now() > deadline {
            return Err(PromoteError::AgentBehind);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    replay::server_caught_up(control, &shared.progress, Duration::from_secs(30)).map_err(PromoteError::ServerBehind)?;
    tracing::info!("replica {id}: the server consumed every replayed input");
    for conn in shared.progress.open_connections() {
        match shared.propose(Tag::Close, conn, &[]) {
            Ok(_) => {}
            Err(ProposeError::NotLeader { .. }) => return follow(),
            Err(source) => return Err(PromoteError::Retire { conn, source }),
        }
    }
    shared.reported.clear();
    shared.set_role(Role::Serving);
    Ok(true)
}
