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
//! and go on in a view without it.
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
    /// Leave after this many new messages (default: run until interrupted).
    #[arg(long)]
    count: Option<u64>,
}

/// Runs `microrep topic pub|sub`.
pub(crate) fn run(command: &TopicCommand) -> Result<(), String> {
    match command {
        TopicCommand::Pub(args) => publish(args).map_err(|e| e.to_string()),
        TopicCommand::Sub(args) => subscribe(args).map_err(|e| e.to_string()),
    }
}

/// What the delivery thread tells the command.
enum Seen {
    Own,
    Other,
}

fn start(
    group: &GroupArgs,
    on_event: impl Fn(&TopicEvent<'_>) + Send + 'static,
) -> Result<(TopicNode, mpsc::Receiver<Seen>), TopicError> {
    let topics = group.topics.iter().map(|t| TopicSpec::parse(t)).collect::<Result<Vec<_>, _>>()?;
    let members: Vec<NodeId> = group.members.iter().map(|&m| NodeId(m)).collect();
    let me = NodeId(group.id);
    // Heartbeats every millisecond; a member silent for a second is taken for failed.
    let detection = FailureDetection::new(1_000_000, 1_000_000_000, members.len().max(8), 1 << 20);
    let config = topic_group(me, members, &topics, detection)?;
    let fabric = shm_fabric(&group.dir, &config).map_err(|e| TopicError::Node(e.into()))?;
    let (tx, rx) = mpsc::channel();
    let handler = move |event: TopicEvent<'_>| {
        on_event(&event);
        if let TopicEvent::Message { publisher: Some(p), replayed: false, .. } = event {
            let _ = tx.send(if p == me { Seen::Own } else { Seen::Other });
        }
    };
    let logs = group.log_dir.as_ref().map(|d| d.join(group.id.to_string()));
    let node = TopicNode::start(fabric, config, &topics, logs.as_deref(), false, handler)?;
    Ok((node, rx))
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
    let (node, seen) = start(&args.group, |_| {})?;
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
    let (node, seen) = start(&args.group, print)?;
    let mut count = 0;
    while args.count.is_none_or(|n| count < n) {
        if seen.recv().is_err() {
            break;
        }
        count += 1;
    }
    node.stop()
}
