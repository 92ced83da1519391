//! `microrep node --config FILE`: one replica of the key-value example, serving RESP clients,
//! until SIGINT or SIGTERM.
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use microrep::Config;
use microrep_kv::KvNode;

/// Arguments of `microrep node`.
#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// The configuration file (TOML; see docs/CONFIG.md).
    #[arg(long)]
    config: PathBuf,
    /// Overrides `node.id`.
    #[arg(long)]
    id: Option<u16>,
    /// Overrides any key, e.g. `--set node.mode=direct --set cluster.timing.heartbeat_us=500`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Forget the cluster generation remembered in `node.data_dir` and take part in
    /// bootstrapping a new, empty cluster: for a cluster that lost its state (every member
    /// restarted), once you decided to start it again empty.
    #[arg(long)]
    force_new: bool,
    /// Cut a durable log damaged in a synced record at the damage (the damaged segment is kept
    /// beside it as NAME.damaged-SECONDS) and recover the rest from the peers, instead of
    /// refusing to start: once you decided this disk is not to be trusted past the damage.
    #[arg(long)]
    repair_log: bool,
    /// Exit when the parent process dies (used by `microrep cluster up`).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

/// Why `microrep node` could not run or stopped badly.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeError {
    /// The parent-death signal could not be set.
    #[error("prctl: {0}")]
    Prctl(rustix::io::Errno),
    /// The configuration file is missing or invalid.
    #[error("{}: invalid configuration: {source}", path.display())]
    Config { path: PathBuf, source: microrep::ConfigError },
    #[error(transparent)]
    Signal(#[from] SignalHandlerError),
    /// The key-value node did not start, or did not stop cleanly.
    #[error(transparent)]
    Kv(#[from] microrep_kv::KvError),
    /// The key-value node runs without a replica (it is always replicated here).
    #[error("no replica")]
    NoReplica,
    /// The replica stopped on a fatal error.
    #[error("node {id} stopped: {why}")]
    Stopped { id: u16, why: String },
    /// Progress could not be printed.
    #[error("writing to stdout: {0}")]
    Stdout(std::io::Error),
}

/// The SIGINT/SIGTERM handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("signal handler: {0}")]
pub(crate) struct SignalHandlerError(#[from] ctrlc::Error);

/// Installs a SIGINT/SIGTERM handler that sets the returned flag and unparks the calling
/// thread (which may then park until something happens).
pub(crate) fn stop_flag() -> Result<Arc<AtomicBool>, SignalHandlerError> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let watcher = std::thread::current();
    ctrlc::set_handler(move || {
        flag.store(true, Ordering::Release);
        watcher.unpark();
    })?;
    Ok(stop)
}

/// The longest the node's control loop parks between looks at its replica (it is unparked
/// by a signal and by every change it reports).
const WATCH_PARK_MAX: Duration = Duration::from_secs(1);

/// Runs the node.
pub(crate) fn run(args: &NodeArgs) -> Result<(), NodeError> {
    if args.exit_with_parent {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
            .map_err(NodeError::Prctl)?;
    }
    let mut overrides = args.overrides.clone();
    if let Some(id) = args.id {
        overrides.push(format!("node.id={id}"));
    }
    if args.force_new {
        overrides.push("node.force_new=true".into());
    }
    if args.repair_log {
        overrides.push("node.repair_log=true".into());
    }
    let config = Config::load(&args.config, &overrides)
        .map_err(|source| NodeError::Config { path: args.config.clone(), source })?;
    let stop = stop_flag()?;
    let node = KvNode::start(&config)?;
    let id = config.node.id;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "node {id}: serving RESP on {} (cluster {}, {} members, fingerprint {:016x})",
        node.addr(),
        config.cluster.name,
        config.cluster.members.len(),
        config.cluster.fingerprint()
    )
    .and_then(|()| out.flush())
    .map_err(NodeError::Stdout)?;
    if let Some(addr) = node.node().and_then(microrep::Node::metrics_addr) {
        writeln!(out, "node {id}: metrics at http://{addr}/metrics")
            .and_then(|()| out.flush())
            .map_err(NodeError::Stdout)?;
    }
    let (mut leader, mut removed) = (None, None);
    node.node().ok_or(NodeError::NoReplica)?.unpark_on_change(std::thread::current());
    while !stop.load(Ordering::Acquire) {
        let replica = node.node().ok_or(NodeError::NoReplica)?;
        if let Some(why) = replica.fatal() {
            return Err(NodeError::Stopped { id, why });
        }
        if replica.removed_at() != removed {
            removed = replica.removed_at();
            if let Some(index) = removed {
                writeln!(out, "node {id}: removed from the cluster at log index {index}; a spare now")
                    .and_then(|()| out.flush())
                    .map_err(NodeError::Stdout)?;
            }
        }
        if replica.leaving() {
            writeln!(out, "node {id}: not a member, asked to leave; stopping")
                .and_then(|()| out.flush())
                .map_err(NodeError::Stdout)?;
            break;
        }
        if replica.leader() != leader {
            leader = replica.leader();
            if let Some(l) = leader {
                writeln!(out, "node {id}: leader is node {}", l.0)
                    .and_then(|()| out.flush())
                    .map_err(NodeError::Stdout)?;
            }
        }
        // The control loop only watches, parked until the replica changes or a signal comes
        // (an idle node's control thread costs nothing); replication runs on the node's own
        // threads.
        std::thread::park_timeout(WATCH_PARK_MAX);
    }
    writeln!(out, "node {id}: stopping").map_err(NodeError::Stdout)?;
    Ok(node.stop()?)
}
