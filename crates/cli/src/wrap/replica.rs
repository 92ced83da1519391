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

use microrep::{Config, ProposeError};
use microrep_interpose_wire::{CONTROL_BYTES, CONTROL_NAME, SOCKET_NAME};

use super::control::Control;
use super::entry::{CurrentCopy, Origin, Tag, Work, WrapApp};
use super::replay::{self, Progress, Transfer};
use super::server::Server;
use super::shim::{self, Role, Shared};
use super::transfer::{self, Hook};

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
    /// The server command, placeholders already substituted.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Prints one line of the replica's story on standard output (which `microrep wrap` passes
/// on), flushed at once.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Removes everything in `dir` (a previous run's server files, sockets and control page) but
/// the server's log, which the next server appends to.
fn empty_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
        let path = entry.path();
        if entry.file_name() == "server.log" {
            continue;
        }
        let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        removed.map_err(|e| format!("emptying {}: {e}", path.display()))?;
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

/// Runs the replica until SIGTERM, its node stops, or its copy can never be brought up to date
/// (no state-transfer hook); a copy that must be discarded is rebuilt from a peer meanwhile.
pub(crate) fn run(args: &ReplicaArgs) -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| format!("prctl: {e}"))?;
    let config = Config::load(&args.config, &[]).map_err(|e| format!("{}: {e}", args.config.display()))?;
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
        .map_err(|e| format!("{}: {e}", control_path.display()))?;
    let socket_path = args.dir.join(SOCKET_NAME);
    let listener = UnixListener::bind(&socket_path).map_err(|e| format!("{}: {e}", socket_path.display()))?;
    let state_path = args.dir.join(transfer::SOCKET_NAME);
    let state_listener = UnixListener::bind(&state_path).map_err(|e| format!("{}: {e}", state_path.display()))?;
    let siblings = args.dir.parent().unwrap_or(Path::new("/"));
    let peers: Vec<PathBuf> = (0..config.cluster.members.len() as u16)
        .filter(|&p| p != id)
        .map(|p| siblings.join(format!("replica-{p}")))
        .collect();
    await_peers(&peers, Duration::from_secs(10));
    let copy = CurrentCopy::new(Origin::fresh(id));
    let (tx, rx) = mpsc::channel();
    let app = WrapApp::new(Arc::clone(&copy), tx.clone());
    let node = microrep::start(&config, app).map_err(|e| e.to_string())?;
    let progress = Arc::new(Progress::default());
    let server = Arc::new(Server::start(args.command.clone(), args.dir.clone(), args.preload.clone())?);
    let (requests_tx, requests) = mpsc::channel();
    let transfer = Transfer {
        copy: Arc::clone(&copy),
        hook: args.state_transfer,
        requests,
        server: Arc::clone(&server),
        peers,
        dir: args.dir.clone(),
    };
    let agent = Arc::clone(&progress);
    let port = args.port;
    let control = Arc::new(Control::map(&control).map_err(|e| format!("mapping {}: {e}", control_path.display()))?);
    let agent_control = Arc::clone(&control);
    std::thread::Builder::new()
        .name("wrap-replay".into())
        .spawn(move || replay::run(port, agent_control, &rx, &agent, transfer))
        .map_err(|e| e.to_string())?;
    let shared = Arc::new(Shared::new(node, copy, progress));
    let handlers = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("wrap-shim".into())
        .spawn(move || shim::serve(&listener, &handlers))
        .map_err(|e| e.to_string())?;
    let donors = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("wrap-state".into())
        .spawn(move || transfer::serve(&state_listener, &donors, &requests_tx))
        .map_err(|e| e.to_string())?;
    let stop = crate::node::stop_on_signal()?;
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
) -> Result<(), String> {
    let id = shared.copy.get().replica;
    let started = Instant::now();
    let mut leading_since = None;
    while !stop.load(Ordering::Acquire) {
        if let Some(why) = shared.node.fatal() {
            return Err(format!("replica {id}: the node stopped: {why}"));
        }
        if let Some(why) = shared.progress.failure() {
            return Err(format!(
                "replica {id}: its server copy cannot be brought up to date: {why}; stopping this copy"
            ));
        }
        let stale = shared.progress.stale();
        // A copy being rebuilt cannot serve: its node stays a voter but does not lead, so that
        // a replica whose copy is current leads (and retires the old leader's connections,
        // which a donor's clean cut may wait for).
        shared.node.set_candidate(!stale);
        let leading = shared.node.leader() == Some(shared.node.id());
        leading_since = if leading { leading_since.or_else(|| Some(Instant::now())) } else { None };
        if !stale {
            if let Some(why) = discard_reason(shared, server, leading) {
                say(&format!("replica {id}: {why}; rebuilding its copy from a peer's state (the node stays)"));
                shared.set_role(Role::Following);
                shared.delivered.store(false, Ordering::Release);
                shared.progress.stale.store(true, Ordering::Release);
                agent.send(Work::Rebuild { why }).map_err(|_| format!("replica {id}: the replay agent stopped"))?;
                continue;
            }
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
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Why the copy must be replaced by a peer's state, if it must: it executed input that only
/// the shim delivered and lost the leadership under which that input was ordered (a copy
/// whose connections the new leader retired, or whose reads were refused, differs from the
/// log), a proposal's outcome is unknown, or the server exited.
fn discard_reason(shared: &Shared, server: &Server, leading: bool) -> Option<String> {
    if let Some(status) = server.exited() {
        return Some(format!("the server exited ({status})"));
    }
    if shared.copy.diverged() {
        return Some("a client's input may have committed without its server having seen it".into());
    }
    (shared.role() == Role::Serving && !leading && shared.delivered.load(Ordering::Acquire))
        .then(|| "lost leadership after serving clients".into())
}

/// Makes a new leader's server current before clients reach it: commits a barrier, waits
/// until the replay agent handled everything up to it and the server processed all replayed
/// input, then retires the old leader's connections through the log. False if leadership
/// moved on meanwhile.
fn promote(shared: &Shared, control: &Control) -> Result<bool, String> {
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
            Err(e) if Instant::now() > deadline => return Err(format!("the promotion barrier did not commit: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    tracing::info!("replica {id}: promotion barrier at entry {barrier}");
    while shared.progress.applied.load(Ordering::Acquire) < barrier {
        if Instant::now() > deadline {
            return Err("the replay agent did not reach the promotion barrier within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    replay::server_caught_up(control, &shared.progress, Duration::from_secs(30))
        .map_err(|e| format!("promotion: the server did not consume the replayed input within 30 s: {e}"))?;
    tracing::info!("replica {id}: the server consumed every replayed input");
    for conn in shared.progress.open_connections() {
        match shared.propose(Tag::Close, conn, &[]) {
            Ok(_) => {}
            Err(ProposeError::NotLeader { .. }) => return follow(),
            Err(e) => return Err(format!("retiring connection {conn}: {e}")),
        }
    }
    shared.set_role(Role::Serving);
    Ok(true)
}
