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
    /// Exit when the parent process dies (used by `microrep cluster up`).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

/// Installs a SIGINT/SIGTERM handler that sets the returned flag.
pub(crate) fn stop_on_signal() -> Result<Arc<AtomicBool>, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    ctrlc::set_handler(move || flag.store(true, Ordering::Release)).map_err(|e| format!("signal handler: {e}"))?;
    Ok(stop)
}

/// Runs the node.
pub(crate) fn run(args: &NodeArgs) -> Result<(), String> {
    if args.exit_with_parent {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
            .map_err(|e| format!("prctl: {e}"))?;
    }
    let mut overrides = args.overrides.clone();
    if let Some(id) = args.id {
        overrides.push(format!("node.id={id}"));
    }
    if args.force_new {
        overrides.push("node.force_new=true".into());
    }
    let config = Config::load(&args.config, &overrides)
        .map_err(|e| format!("{}: invalid configuration: {e}", args.config.display()))?;
    let stop = stop_on_signal()?;
    let node = KvNode::start(&config).map_err(|e| e.to_string())?;
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
    .map_err(|e| e.to_string())?;
    if let Some(addr) = node.node().and_then(microrep::Node::metrics_addr) {
        writeln!(out, "node {id}: metrics at http://{addr}/metrics")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())?;
    }
    let mut leader = None;
    while !stop.load(Ordering::Acquire) {
        let replica = node.node().ok_or("no replica")?;
        if let Some(why) = replica.fatal() {
            return Err(format!("node {id} stopped: {why}"));
        }
        if replica.leader() != leader {
            leader = replica.leader();
            if let Some(l) = leader {
                writeln!(out, "node {id}: leader is node {}", l.0)
                    .and_then(|()| out.flush())
                    .map_err(|e| e.to_string())?;
            }
        }
        // The control loop only watches; replication runs on the node's own threads.
        std::thread::sleep(Duration::from_millis(20));
    }
    writeln!(out, "node {id}: stopping").map_err(|e| e.to_string())?;
    node.stop().map_err(|e| e.to_string())
}
