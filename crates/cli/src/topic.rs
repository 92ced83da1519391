//! `microrep topic pub|sub`: publish/subscribe on a small group of processes sharing memory
//! (docs/MULTICAST.md, "Topics"). Every process is a member of the group and of every topic;
//! start them with the same `--dir`, `--members` and `--topic` list, each with its own `--id`:
//!
//! ```sh
//! microrep topic sub --dir /dev/shm/t --id 1 --members 0,1,2 --topic news=atomic &
//! microrep topic sub --dir /dev/shm/t --id 2 --members 0,1,2 --topic news=atomic &
//! microrep topic pub --dir /dev/shm/t --id 0 --members 0,1,2 --topic news=atomic --on news hello world
//! ```
//!
//! A publisher leaves once its messages are delivered; the others notice (failure detection)
//! and go on in a view without it. `sub --join` joins a running group instead (an id outside
//! `--members`): it leaves a request in `<dir>/join-requests/`, the running member of lowest id
//! proposes it (a `sub`: a `pub` does not sponsor; a joiner not in after two seconds also asks
//! a member of `--members` itself), and the joiner first prints the history of
//! the volatile and logged topics (marked `replayed`), then new messages. A joiner not in after
//! `--join-timeout-secs` (default 60) fails with the reason instead of waiting; a member whose
//! group lost its majority fails with the members it suspects (docs/MULTICAST.md).
#![allow(clippy::print_stdout)]

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use clap::{Args, Subcommand};
use microrep::multicast::{MulticastSendError, shm_fabric};
use microrep::multicast_topics::{TopicError, TopicEvent, TopicNode, TopicSpec, topic_group};
use microrep_core::multicast::{FailureDetection, SendError};
use microrep_fabric::NodeId;

/// `microrep topic`.
#[derive(Debug, Subcommand)]
pub(crate) enum TopicCommand {
    /// Joins the group and publishes messages on a topic, then leaves.
    Pub(PubArgs),
    /// Joins the group and prints every message of every topic.
    Sub(SubArgs),
}

/// The group every `microrep topic` process of one group shares.
#[derive(Debug, Args)]
pub(crate) struct GroupArgs {
    /// The group's shared-memory directory (the same for every member).
    #[arg(long)]
    dir: PathBuf,
    /// This member's id (one of --members).
    #[arg(long)]
    id: u16,
    /// Every member's id, comma-separated, the same list everywhere (e.g. 0,1,2).
    #[arg(long, value_delimiter = ',', required = true)]
    members: Vec<u16>,
    /// A topic as NAME=QOS, QOS one of unordered, atomic, volatile, logged; repeat for more,
    /// in the same order everywhere.
    #[arg(long = "topic", required = true)]
    topics: Vec<String>,
    /// Where logged topics keep their files (`<dir>/<id>/<topic>.log`).
    #[arg(long)]
    log_dir: Option<PathBuf>,
}

/// `microrep topic pub`.
#[derive(Debug, Args)]
pub(crate) struct PubArgs {
    #[command(flatten)]
    group: GroupArgs,
    /// The topic to publish on.
    #[arg(long = "on")]
    topic: String,
    /// The messages (default: the lines of stdin).
    messages: Vec<String>,
}

/// `microrep topic sub`.
#[derive(Debug, Args)]
pub(crate) struct SubArgs {
    #[command(flatten)]
    group: GroupArgs,
    /// Leave after this many messages, history included (default: run until interrupted).
    #[arg(long)]
    count: Option<u64>,
    /// Join a running group (this id is not in --members).
    #[arg(long)]
    join: bool,
    /// With --join: fail if not in the group after this many seconds.
    #[arg(long, default_value_t = 60, requires = "join")]
    join_timeout_secs: u64,
}

/// Runs `microrep topic pub|sub`.
pub(crate) fn run(command: &TopicCommand) -> Result<(), TopicError> {
    match command {
        TopicCommand::Pub(args) => publish(args),
        TopicCommand::Sub(args) => subscribe(args),
    }
}

/// What the delivery thread tells the command.
enum Seen {
    Own,
    Other,
}

/// Most members a `microrep topic` group may grow to (the same everywhere: it sizes the SST).
const MAX_MEMBERS: usize = 16;

fn start(
    group: &GroupArgs,
    join: Option<Duration>,
    on_event: impl Fn(&TopicEvent<'_>) + Send + 'static,
) -> Result<(TopicNode, mpsc::Receiver<Seen>), TopicError> {
    let topics = group.topics.iter().map(|t| TopicSpec::parse(t)).collect::<Result<Vec<_>, _>>()?;
    let mut members: Vec<NodeId> = group.members.iter().map(|&m| NodeId(m)).collect();
    let me = NodeId(group.id);
    if join.is_some() {
        // A joiner's member list is only a template: its view comes from the members.
        members.retain(|&m| m != me);
        members.push(me);
    }
    // Heartbeats every millisecond; a member silent for a second is taken for failed.
    let detection = FailureDetection::new(1_000_000, 1_000_000_000, MAX_MEMBERS, 1 << 20);
    let config = topic_group(me, members, &topics, detection)?;
    let fabric = shm_fabric(&group.dir, &config).map_err(|e| TopicError::Node(e.into()))?;
    let (tx, rx) = mpsc::channel();
    let handler = move |event: TopicEvent<'_>| {
        on_event(&event);
        if let TopicEvent::Message { publisher, replayed, .. } = event {
            let own = publisher == Some(me) && !replayed;
            let _ = tx.send(if own { Seen::Own } else { Seen::Other });
        }
    };
    let logs = group.log_dir.as_ref().map(|d| d.join(group.id.to_string()));
    let node = TopicNode::start(fabric, config, &topics, logs.as_deref(), join, handler)?;
    Ok((node, rx))
}

/// Where joiners leave their requests.
fn requests(group: &GroupArgs) -> PathBuf {
    group.dir.join("join-requests")
}

/// The member of lowest id in the current view proposes each pending join request (one at a
/// time: a request stays until the joiner is in the view).
fn sponsor(group: &GroupArgs, node: &TopicNode) -> Result<(), TopicError> {
    let (_, members) = node.node().view();
    if members.iter().min() != Some(&NodeId(group.id)) {
        return Ok(());
    }
    let Ok(entries) = std::fs::read_dir(requests(group)) else { return Ok(()) };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(|n| n.parse::<u16>().ok()) else { continue };
        if members.contains(&NodeId(id)) {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        match node.propose_join(NodeId(id)) {
            Ok(()) => println!("proposed {id} to join"),
            // Another change (or this join) is under way: try again later.
            Err(TopicError::Node(microrep::multicast::MulticastNodeError::Join(_))) => {}
            Err(e) => return Err(e),
        }
        break;
    }
    Ok(())
}

fn print(event: &TopicEvent<'_>) {
    match event {
        TopicEvent::Message { topic, publisher, payload, replayed } => {
            let from = publisher.map_or_else(|| "history".to_string(), |p| p.to_string());
            let mark = if *replayed { " (replayed)" } else { "" };
            println!("{topic} <{from}>{mark}: {}", String::from_utf8_lossy(payload));
        }
        TopicEvent::View { epoch, members } => {
            let ids: Vec<String> = members.iter().map(|m| m.0.to_string()).collect();
            println!("view {epoch}: members {}", ids.join(","));
        }
    }
}

fn publish(args: &PubArgs) -> Result<(), TopicError> {
    let messages: Vec<String> = if args.messages.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .map_err(|source| TopicError::Log { path: "stdin".into(), source })?
    } else {
        args.messages.clone()
    };
    let (node, seen) = start(&args.group, None, |_| {})?;
    for message in &messages {
        loop {
            match node.publish(&args.topic, message.as_bytes()) {
                Ok(()) => break,
                Err(TopicError::Send(MulticastSendError::Send(SendError::WindowFull(_)))) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        }
    }
    // Leave once every message is delivered here (with an ordered topic: received by all).
    let mut own = 0;
    while own < messages.len() {
        match seen.recv_timeout(Duration::from_secs(60)) {
            Ok(Seen::Own) => own += 1,
            Ok(Seen::Other) => {}
            Err(_) => {
                return Err(TopicError::Node(microrep::multicast::MulticastNodeError::Stopped));
            }
        }
    }
    println!("published {} message(s) on {}", messages.len(), args.topic);
    node.stop()
}

fn subscribe(args: &SubArgs) -> Result<(), TopicError> {
    let join = args.join.then(|| Duration::from_secs(args.join_timeout_secs));
    let (node, seen) = start(&args.group, join, print)?;
    if args.join {
        let dir = requests(&args.group);
        let request = dir.join(args.group.id.to_string());
        let io = |source| TopicError::Log { path: request.clone(), source };
        std::fs::create_dir_all(&dir).map_err(io)?;
        std::fs::write(&request, b"").map_err(io)?;
    }
    let mut count = 0;
    while args.count.is_none_or(|n| count < n) {
        match seen.recv_timeout(Duration::from_millis(100)) {
            Ok(_) => count += 1,
            Err(mpsc::RecvTimeoutError::Timeout) => sponsor(&args.group, &node)?,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    node.stop()
}
