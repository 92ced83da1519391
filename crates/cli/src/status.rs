//! `microrep status --config FILE`: asks every member for its status (`MICROREP.STATUS`) and
//! prints one line per replica. A replica of a wrapped server (`microrep wrap`, whose scratch
//! directory holds the configuration files) is asked on its state socket instead, and also
//! shows its server copy's role and output checking's counts.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use microrep::{Config, ConfigError, NodeStatus};
use microrep_core::mu::Role;
use microrep_testkit::client::{Client, RespError, Value};

/// Arguments of `microrep status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Any member's configuration file (only the `[cluster]` part is used).
    #[arg(long)]
    config: PathBuf,
    /// Print each member's status as one JSON line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Why a member's status could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueryError {
    #[error("unreachable: {0}")]
    Unreachable(std::io::Error),
    #[error(transparent)]
    Call(#[from] RespError),
    #[error("bad status: {0}")]
    BadStatus(serde_json::Error),
    #[error("unexpected reply {0:?}")]
    Unexpected(Value),
    #[error("state socket {}: {source}", path.display())]
    StateSocket { path: PathBuf, source: std::io::Error },
}

/// Why `microrep status` could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatusError {
    /// The configuration file is missing or invalid.
    #[error("{}: {source}", path.display())]
    Config { path: PathBuf, source: ConfigError },
    /// A member has no valid client address.
    #[error(transparent)]
    Member(ConfigError),
}

/// One member's status, or why it could not be had.
pub(crate) fn query(addr: SocketAddr) -> Result<NodeStatus, QueryError> {
    let mut client = Client::connect(addr, Duration::from_secs(2)).map_err(QueryError::Unreachable)?;
    match client.call(&[b"MICROREP.STATUS"])? {
        Value::Bulk(Some(bytes)) => serde_json::from_slice(&bytes).map_err(QueryError::BadStatus),
        other => Err(QueryError::Unexpected(other)),
    }
}

/// A wrap replica's status (`wrap::ask_status`): its node's, and the rest of the line (the
/// copy's role, whether it is current, output checking's counts).
fn query_wrapped(socket: &std::path::Path) -> Result<(NodeStatus, serde_json::Value), QueryError> {
    let error = |source| QueryError::StateSocket { path: socket.to_path_buf(), source };
    let line = crate::wrap::ask_status(socket).map_err(error)?;
    let mut wrap: serde_json::Value = serde_json::from_str(&line).map_err(QueryError::BadStatus)?;
    let node = wrap.get_mut("node").map(serde_json::Value::take).unwrap_or_default();
    let status = serde_json::from_value(node).map_err(QueryError::BadStatus)?;
    if let Some(fields) = wrap.as_object_mut() {
        fields.remove("node");
    }
    Ok((status, wrap))
}

/// One line about a wrap replica's server copy.
fn copy_line(wrap: &serde_json::Value) -> String {
    let current = if wrap["copy_current"].as_bool() == Some(true) { "current" } else { "not current" };
    format!(
        "      copy {}, {current}; output buckets {} matched, {} differed",
        wrap["role"].as_str().unwrap_or("?"),
        or_dash(wrap["output"]["buckets_matched"].as_u64()),
        or_dash(wrap["output"]["buckets_differed"].as_u64()),
    )
}

fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Prints the table.
pub(crate) fn run(args: &StatusArgs) -> Result<(), StatusError> {
    let config =
        Config::load(&args.config, &[]).map_err(|source| StatusError::Config { path: args.config.clone(), source })?;
    if !args.json {
        println!(
            "{:>4}  {:<21}  {:<10}  {:>6}  {:>8}  {:>10}  {:>10}  {:>10}  {:<16}  last leader change",
            "node", "address", "role", "leader", "proposal", "fuo", "applied", "log head", "digest"
        );
    }
    // Ids that were down, and that recover, counted against the members once they are known.
    let (mut down_ids, mut recovering_ids) = (Vec::new(), Vec::new());
    // The newest configuration a member reported, and its epoch.
    let mut members_seen: (Vec<u16>, u64) = (Vec::new(), 0);
    for id in 0..config.cluster.members.len() as u16 {
        let addr = config.cluster.client_addr(id).map_err(StatusError::Member)?;
        let (status, wrap) = match crate::wrap::state_socket(&args.config, id) {
            Some(socket) => match query_wrapped(&socket) {
                Ok((status, wrap)) => (Ok(status), Some(wrap)),
                Err(e) => (Err(e), None),
            },
            None => (query(addr), None),
        };
        if args.json {
            match (&status, &wrap) {
                (Ok(s), Some(w)) => {
                    let mut line: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap_or_default();
                    line["wrap"] = w.clone();
                    println!("{line}");
                }
                (Ok(s), None) => println!("{}", s.to_json()),
                (Err(e), _) => println!("{}", serde_json::json!({ "node": id, "error": e.to_string() })),
            }
            if status.is_err() {
                down_ids.push(id);
            }
            continue;
        }
        match status {
            Ok(s) => {
                // A replica restarted with fresh memory counts in no quorum until promoted.
                if s.recovering {
                    recovering_ids.push(id);
                }
                if s.epoch >= members_seen.1 {
                    members_seen = (s.members.clone(), s.epoch);
                }
                let role = match s.role {
                    _ if !s.members.is_empty() && !s.members.contains(&id) => "spare",
                    _ if s.recovering => "recovering",
                    Role::Follower => "follower",
                    Role::Candidate => "candidate",
                    Role::Leader => "leader",
                };
                let last = s
                    .leader_changes
                    .back()
                    .map(|c| format!("to node {} at {} ms", c.leader, c.at_ms))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "{id:>4}  {addr:<21}  {:<10}  {:>6}  {:>8}  {:>10}  {:>10}  {:>10}  {:<16}  {last}",
                    role,
                    or_dash(s.leader),
                    s.proposal_number,
                    s.fuo,
                    s.applied,
                    s.tail,
                    or_dash(s.digest.as_ref()),
                );
                if let Some(why) = &s.fatal {
                    println!("      stopped: {why}");
                }
                if let Some(wrap) = &wrap {
                    println!("{}", copy_line(wrap));
                }
            }
            Err(e) => {
                down_ids.push(id);
                println!("{id:>4}  {addr:<21}  down ({e})");
            }
        }
    }
    if !args.json && !members_seen.0.is_empty() {
        let ids: Vec<String> = members_seen.0.iter().map(u16::to_string).collect();
        println!("members: {} (configuration epoch {}; other ids are spares)", ids.join(", "), members_seen.1);
    }
    let members: Vec<u16> =
        if members_seen.0.is_empty() { (0..config.cluster.members.len() as u16).collect() } else { members_seen.0 };
    let n = members.len();
    let down = down_ids.iter().filter(|id| members.contains(id)).count();
    let recovering = recovering_ids.iter().filter(|id| members.contains(id)).count();
    if down * 2 >= n {
        println!("{down} of {n} members are down: no majority, so no progress (and no corruption) until they return");
    } else if (down + recovering) * 2 >= n {
        println!(
            "{down} of {n} members are down and {recovering} recovering (restarted with fresh memory, waiting for a \
             leader to promote them): no majority of voters, so no progress until the down ones return"
        );
    }
    Ok(())
}
