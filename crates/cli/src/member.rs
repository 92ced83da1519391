//! `microrep member add|remove|replace --config FILE ID...`: membership changes of a running
//! cluster (docs/CONFIG.md "Membership changes"). The leader is found with `MICROREP.STATUS`;
//! each change is one `MICROREP.MEMBER` request to it, asked again while the leader says the
//! joiner is still catching up, or while leadership moves, until `--timeout`.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use microrep::{Config, ConfigError};
use microrep_testkit::client::{Client, Value};

/// `microrep member ...`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum MemberCommand {
    /// Makes a running spare (an id of `cluster.members` outside the configuration) a member,
    /// once it has caught up with the leader.
    Add(ChangeArgs),
    /// Makes a member leave, then asks its node to stop (`MICROREP.LEAVE`).
    Remove(ChangeArgs),
    /// Replaces member OLD by the running spare NEW: adds NEW, removes OLD, stops OLD's node.
    Replace(ReplaceArgs),
}

/// What every change needs.
#[derive(Debug, clap::Args)]
pub(crate) struct Common {
    /// Any member's configuration file (only the `[cluster]` part is used).
    #[arg(long)]
    config: PathBuf,
    /// How long to keep asking (a joiner catching up, a leader change) before giving up.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_s: u64,
}

/// `microrep member add|remove`.
#[derive(Debug, clap::Args)]
pub(crate) struct ChangeArgs {
    #[command(flatten)]
    common: Common,
    /// The replica's id.
    id: u16,
}

/// `microrep member replace`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplaceArgs {
    #[command(flatten)]
    common: Common,
    /// The member that leaves.
    old: u16,
    /// The spare that takes its place.
    new: u16,
}

/// Why a change did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MemberError {
    #[error("{}: {source}", path.display())]
    Config { path: PathBuf, source: ConfigError },
    #[error("replica {id} is not one of the cluster's ids 0..{n} (cluster.members)")]
    UnknownId { id: u16, n: usize },
    #[error("{change}: refused: {why}")]
    Refused { change: String, why: String },
    #[error("{change}: not done within {timeout_s} s; last answer: {last}")]
    Timeout { change: String, timeout_s: u64, last: String },
}

/// Runs one `microrep member` command.
pub(crate) fn run(command: &MemberCommand) -> Result<(), MemberError> {
    match command {
        MemberCommand::Add(args) => change(&args.common, "ADD", args.id),
        MemberCommand::Remove(args) => {
            change(&args.common, "REMOVE", args.id)?;
            stop_removed(&args.common, args.id);
            Ok(())
        }
        MemberCommand::Replace(args) => {
            change(&args.common, "ADD", args.new)?;
            change(&args.common, "REMOVE", args.old)?;
            stop_removed(&args.common, args.old);
            Ok(())
        }
    }
}

/// Asks the removed member's node to stop (`MICROREP.LEAVE`), which it does once it applied
/// its removal; says so when it does not run or does not answer. Best effort: the removal is
/// done either way, and a node left running follows as a spare.
fn stop_removed(common: &Common, id: u16) {
    let Ok(config) = Config::load(&common.config, &[]) else { return };
    let Ok(addr) = config.cluster.client_addr(id) else { return };
    let deadline = Instant::now() + Duration::from_secs(common.timeout_s.min(10));
    let last = loop {
        let answer = Client::connect(addr, Duration::from_secs(2))
            .map_err(|e| format!("not reachable ({e}); if it runs, it follows as a spare"))
            .and_then(|mut c| c.call(&[b"MICROREP.LEAVE"]).map_err(|e| e.to_string()));
        match answer {
            Ok(Value::Simple(_)) => {
                println!("replica {id}: its node stops");
                return;
            }
            Ok(Value::Error(why)) if why.contains("is a member") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(other) => break format!("{other:?}"),
            Err(e) => break e,
        }
    };
    println!("replica {id}: not stopped: {last}");
}

/// Answers after which asking again may succeed: the joiner is catching up, another change
/// or a new term is under way, or leadership moved.
fn worth_retrying(error: &str) -> bool {
    [
        "catching up",
        "not a follower",
        "not live",
        "under way",
        "starting its term",
        "not the leader",
        "NOTLEADER",
        "no leader",
        "TRYAGAIN",
        "UNKNOWN",
        "node ",
    ]
    .iter()
    .any(|s| error.contains(s))
}

fn change(common: &Common, op: &str, id: u16) -> Result<(), MemberError> {
    let config = Config::load(&common.config, &[])
        .map_err(|source| MemberError::Config { path: common.config.clone(), source })?;
    let n = config.cluster.members.len();
    if usize::from(id) >= n {
        return Err(MemberError::UnknownId { id, n });
    }
    let what = format!("{} replica {id}", op.to_ascii_lowercase());
    let deadline = Instant::now() + Duration::from_secs(common.timeout_s);
    let mut shown = String::new();
    loop {
        let last = match ask_leader(&config, op, id) {
            Ok(done) => {
                println!("{what}: done: {done}");
                return Ok(());
            }
            Err(e) if !worth_retrying(&e) => return Err(MemberError::Refused { change: what, why: e }),
            Err(e) => e,
        };
        if last != shown {
            println!("{what}: waiting: {last}");
            shown.clone_from(&last);
        }
        if Instant::now() >= deadline {
            return Err(MemberError::Timeout { change: what, timeout_s: common.timeout_s, last });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends the change to the member that says it leads, unless its configuration already holds
/// the change (an earlier attempt whose answer was lost); `Err` carries the answer to show.
fn ask_leader(config: &Config, op: &str, id: u16) -> Result<String, String> {
    let leader = (0..config.cluster.members.len() as u16)
        .filter_map(|m| config.cluster.client_addr(m).ok())
        .find_map(|addr| crate::status::query(addr).ok().filter(|s| s.role == microrep_core::mu::Role::Leader))
        .ok_or_else(|| "no leader answered MICROREP.STATUS".to_string())?;
    if leader.members.contains(&id) == (op == "ADD") {
        let ids: Vec<String> = leader.members.iter().map(u16::to_string).collect();
        return Ok(format!("members {} epoch {} (as node {} applied)", ids.join(","), leader.epoch, leader.node));
    }
    let addr = config.cluster.client_addr(leader.node).map_err(|e| e.to_string())?;
    let mut client =
        Client::connect(addr, Duration::from_secs(10)).map_err(|e| format!("node {}: {e}", leader.node))?;
    match client.call(&[b"MICROREP.MEMBER", op.as_bytes(), id.to_string().as_bytes()]) {
        Ok(Value::Simple(text)) => Ok(text),
        Ok(Value::Error(text)) => Err(text),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(e) => Err(format!("node {}: {e}", leader.node)),
    }
}
