//! Publish/subscribe topics on a multicast group, each topic one subgroup, with a quality of
//! service ([`Qos`]):
//!
//! | QoS | subgroup | promise |
//! |---|---|---|
//! | `unordered` | delivers at receipt | each publisher's messages in its order, at most once; no order across publishers |
//! | `atomic` | ordered | every member delivers the same messages in the same order (virtual synchrony across views) |
//! | `volatile` | ordered | as `atomic`, and each member keeps the topic's history in memory: a member that joins later receives it (state transfer) before any new message |
//! | `logged` | ordered | as `volatile`, and each member appends every message to a log file and syncs it before handing the message to the subscriber; a restarted member replays its log first |
//!
//! Every member of the group is in every topic (a member subscribes by handling the topic's
//! messages and publishes with [`TopicNode::publish`]). Built on [`MulticastNode`]; the group
//! needs failure detection for joins and for members to leave.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use microrep_core::multicast::{Deliver, Delivery, DeliveryBatch, FailureDetection, GroupConfig, SubgroupConfig, View};
use microrep_fabric::{Fabric, NodeId};

use crate::config::ThreadConfig;
use crate::multicast::{MulticastNode, MulticastNodeError, MulticastSendError};

/// A topic's quality of service (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    /// At receipt, per publisher order.
    Unordered,
    /// One total order.
    Atomic,
    /// One total order, history in memory for joiners.
    VolatileStorage,
    /// One total order, history in memory and in a synced log file.
    LoggedStorage,
}

impl std::str::FromStr for Qos {
    type Err = TopicError;

    fn from_str(s: &str) -> Result<Self, TopicError> {
        match s {
            "unordered" => Ok(Self::Unordered),
            "atomic" => Ok(Self::Atomic),
            "volatile" => Ok(Self::VolatileStorage),
            "logged" => Ok(Self::LoggedStorage),
            other => Err(TopicError::BadQos(other.to_string())),
        }
    }
}

impl Qos {
    fn stores(self) -> bool {
        matches!(self, Self::VolatileStorage | Self::LoggedStorage)
    }
}

/// One topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSpec {
    /// Its name: letters, digits, `-`, `_` and `.`, at most 64 bytes.
    pub name: String,
    /// Its quality of service.
    pub qos: Qos,
    /// Largest message in bytes (a multiple of 8).
    pub max_message_bytes: u32,
    /// Messages a publisher may have in flight.
    pub window: u32,
}

impl TopicSpec {
    /// A topic with room for 1 KiB messages and 16 in flight per publisher.
    pub fn new(name: &str, qos: Qos) -> Self {
        Self { name: name.to_string(), qos, max_message_bytes: 1024, window: 16 }
    }

    /// Parses `NAME=QOS` (`news=atomic`).
    pub fn parse(text: &str) -> Result<Self, TopicError> {
        let (name, qos) = text.split_once('=').ok_or_else(|| TopicError::BadSpec(text.to_string()))?;
        let spec = Self::new(name, qos.parse()?);
        check_name(&spec.name)?;
        Ok(spec)
    }
}

/// A topic configuration or operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// A topic is not written `NAME=QOS`.
    #[error("`{0}` is not NAME=QOS (for example news=atomic)")]
    BadSpec(String),
    /// An unknown quality of service.
    #[error("unknown QoS `{0}`: one of unordered, atomic, volatile, logged")]
    BadQos(String),
    /// A topic name that is empty, too long or has other characters.
    #[error("topic name `{0}`: use 1 to 64 letters, digits, `-`, `_` or `.`")]
    BadName(String),
    /// Two topics with one name.
    #[error("topic `{0}` is listed twice")]
    Duplicate(String),
    /// No topics.
    #[error("no topics")]
    NoTopics,
    /// No such topic.
    #[error("no topic `{0}`")]
    UnknownTopic(String),
    /// A logged topic without a log directory.
    #[error("topic `{0}` is logged: give a log directory")]
    NoLogDir(String),
    /// Reading or writing a topic's log.
    #[error("topic log {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The multicast node failed.
    #[error(transparent)]
    Node(#[from] MulticastNodeError),
    /// A publish was refused.
    #[error(transparent)]
    Send(#[from] MulticastSendError),
}

fn check_name(name: &str) -> Result<(), TopicError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok { Ok(()) } else { Err(TopicError::BadName(name.to_string())) }
}

/// The group configuration of `topics` for `me` among `members`: one subgroup per topic, in
/// order, every member a member and a publisher of each.
pub fn topic_group(
    me: NodeId,
    members: Vec<NodeId>,
    topics: &[TopicSpec],
    detection: FailureDetection,
) -> Result<GroupConfig, TopicError> {
    if topics.is_empty() {
        return Err(TopicError::NoTopics);
    }
    for (i, t) in topics.iter().enumerate() {
        check_name(&t.name)?;
        if topics[..i].iter().any(|o| o.name == t.name) {
            return Err(TopicError::Duplicate(t.name.clone()));
        }
    }
    let subgroups = topics
        .iter()
        .map(|t| SubgroupConfig {
            members: members.clone(),
            senders: members.clone(),
            window: t.window,
            max_payload_bytes: t.max_message_bytes,
            delivery: if t.qos == Qos::Unordered { Delivery::Unordered } else { Delivery::Ordered },
            copy_at_receipt_bytes: microrep_core::multicast::COPY_AT_RECEIPT_BYTES,
        })
        .collect();
    let config =
        GroupConfig { subgroups, failure_detection: Some(detection), ..GroupConfig::single(me, members, 1, 8) };
    config.validate().map_err(|e| TopicError::Node(MulticastNodeError::Multicast(e.into())))?;
    Ok(config)
}

/// What a subscriber is handed.
#[derive(Debug, PartialEq, Eq)]
pub enum TopicEvent<'a> {
    /// A message of `topic`. `replayed`: from a storage topic's history (a joiner's state
    /// transfer, or a restarted member's log), before any new message.
    Message {
        /// The topic.
        topic: &'a str,
        /// Who published it (`None` when replayed).
        publisher: Option<NodeId>,
        /// The bytes.
        payload: &'a [u8],
        /// Whether it is history.
        replayed: bool,
    },
    /// A new view of the group.
    View {
        /// Its epoch.
        epoch: u64,
        /// Its members.
        members: &'a [NodeId],
    },
}

/// The delivery side of a topic node: histories, logs, and the subscriber.
struct TopicApp<H> {
    topics: Vec<TopicSpec>,
    history: Vec<Vec<Vec<u8>>>,
    logs: Vec<Option<(PathBuf, File)>>,
    handler: H,
}

impl<H: FnMut(TopicEvent<'_>) + Send> Deliver for TopicApp<H> {
    fn deliver(&mut self, batch: DeliveryBatch<'_>) {
        let topic = &self.topics[batch.subgroup];
        if let Some((path, file)) = &mut self.logs[batch.subgroup] {
            // Logged: on disk, synced, before the subscriber sees it.
            let mut bytes = Vec::new();
            for m in batch.messages {
                encode_record(m.payload, &mut bytes);
            }
            if let Err(e) = file.write_all(&bytes).and_then(|()| file.sync_data()) {
                panic!("topic log {}: {e} (a logged topic cannot go on without its log)", path.display());
            }
        }
        for m in batch.messages {
            if topic.qos.stores() {
                self.history[batch.subgroup].push(m.payload.to_vec());
            }
            (self.handler)(TopicEvent::Message {
                topic: &topic.name,
                publisher: Some(m.sender),
                payload: m.payload,
                replayed: false,
            });
        }
    }

    fn view_installed(&mut self, view: &View) {
        (self.handler)(TopicEvent::View { epoch: view.epoch, members: &view.members });
    }

    fn snapshot(&mut self, subgroup: usize, out: &mut Vec<u8>) {
        for message in &self.history[subgroup] {
            encode_record(message, out);
        }
    }

    fn restore(&mut self, subgroup: usize, state: &[u8]) {
        let (records, _) = decode_records(state);
        for payload in records {
            if let Some((path, file)) = &mut self.logs[subgroup] {
                let mut bytes = Vec::new();
                encode_record(&payload, &mut bytes);
                if let Err(e) = file.write_all(&bytes).and_then(|()| file.sync_data()) {
                    panic!("topic log {}: {e}", path.display());
                }
            }
            let topic = &self.topics[subgroup].name;
            (self.handler)(TopicEvent::Message { topic, publisher: None, payload: &payload, replayed: true });
            self.history[subgroup].push(payload);
        }
    }
}

/// Bytes of a log record's header.
const RECORD_HEADER_BYTES: usize = 12;

/// A log record: length (u32 LE), XXH3-64 of the payload (u64 LE), payload.
fn encode_record(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The whole records at the start of `bytes` and how many bytes they take; a torn or corrupt
/// tail (a crash mid-append) ends the list.
fn decode_records(bytes: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + RECORD_HEADER_BYTES) {
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let sum = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
        let Some(payload) = bytes.get(at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + len) else { break };
        if xxhash_rust::xxh3::xxh3_64(payload) != sum {
            break;
        }
        records.push(payload.to_vec());
        at += RECORD_HEADER_BYTES + len;
    }
    (records, at)
}

/// Opens (creating) `dir/<topic>.log`, returns its whole records and the file, cut after the
/// last whole record, positioned at its end.
fn open_log(dir: &Path, topic: &str) -> Result<(Vec<Vec<u8>>, PathBuf, File), TopicError> {
    let path = dir.join(format!("{topic}.log"));
    let io = |source| TopicError::Log { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut file = std::fs::OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io)?;
    let (records, whole) = decode_records(&bytes);
    if whole < bytes.len() {
        tracing::warn!("topic log {}: dropping a torn tail of {} bytes", path.display(), bytes.len() - whole);
        file.set_len(whole as u64).map_err(io)?;
    }
    Ok((records, path, file))
}

/// A member of a topic group (module docs).
#[derive(Debug)]
pub struct TopicNode {
    node: MulticastNode,
    names: Vec<String>,
}

impl TopicNode {
    /// Starts a member of `group` (from [`topic_group`] with the same `topics`), replaying the
    /// logs of logged topics from `log_dir` to `handler` first. `join: Some(give_up_after)`:
    /// this member joins a running group (`group` is then its template) and gets the storage
    /// topics' history from the members once one of them proposes it
    /// ([`TopicNode::propose_join`]), or, if none does within twice the suspicion timeout, once
    /// it asked a member of `group` itself; if it is not in `give_up_after` after it started,
    /// it stops with [`microrep_core::multicast::MulticastError::JoinTimedOut`]
    /// ([`MulticastNode::wait_joined`] on [`TopicNode::node`]).
    pub fn start<F, H>(
        fabric: F,
        group: GroupConfig,
        topics: &[TopicSpec],
        log_dir: Option<&Path>,
        join: Option<Duration>,
        mut handler: H,
    ) -> Result<Self, TopicError>
    where
        F: Fabric + Send + 'static,
        F::Endpoint: Send,
        H: FnMut(TopicEvent<'_>) + Send + 'static,
    {
        let mut history = vec![Vec::new(); topics.len()];
        let mut logs = Vec::with_capacity(topics.len());
        for (i, topic) in topics.iter().enumerate() {
            if topic.qos != Qos::LoggedStorage {
                logs.push(None);
                continue;
            }
            let dir = log_dir.ok_or_else(|| TopicError::NoLogDir(topic.name.clone()))?;
            let (records, path, file) = open_log(dir, &topic.name)?;
            for payload in records {
                handler(TopicEvent::Message { topic: &topic.name, publisher: None, payload: &payload, replayed: true });
                history[i].push(payload);
            }
            logs.push(Some((path, file)));
        }
        if join.is_some() {
            // A joiner's history comes from the members: what its log had is replaced.
            for (h, log) in history.iter_mut().zip(&mut logs) {
                h.clear();
                if let Some((path, file)) = log {
                    file.set_len(0).map_err(|source| TopicError::Log { path: path.clone(), source })?;
                }
            }
        }
        let app = TopicApp { topics: topics.to_vec(), history, logs, handler };
        let node = if let Some(give_up_after) = join {
            // It also asks for itself (`MulticastNode::join_asking`), in case its proposer fails
            // before any member saw the request; after twice the suspicion timeout, so that a
            // proposal under way usually lands first (asked twice, it is admitted once).
            let suspect_after_ns = group.failure_detection.map_or(1_000_000_000, |d| d.suspect_after_ns);
            let retry = Duration::from_nanos(suspect_after_ns.saturating_mul(2));
            let all: Vec<usize> = (0..topics.len()).collect();
            MulticastNode::join_asking(fabric, group, &all, retry, give_up_after, ThreadConfig::default(), app)?
        } else {
            MulticastNode::start(fabric, group, ThreadConfig::default(), app)?
        };
        Ok(Self { node, names: topics.iter().map(|t| t.name.clone()).collect() })
    }

    /// Publishes `payload` on `topic`.
    pub fn publish(&self, topic: &str, payload: &[u8]) -> Result<(), TopicError> {
        let index = self.names.iter().position(|n| n == topic).ok_or_else(|| TopicError::UnknownTopic(topic.into()))?;
        Ok(self.node.send(index, payload)?)
    }

    /// Asks the group to add `node` to every topic (its storage topics' history is transferred).
    pub fn propose_join(&self, node: NodeId) -> Result<(), TopicError> {
        let all: Vec<usize> = (0..self.names.len()).collect();
        Ok(self.node.propose_join(node, &all)?)
    }

    /// The multicast node underneath.
    pub fn node(&self) -> &MulticastNode {
        &self.node
    }

    /// Stops the member.
    pub fn stop(self) -> Result<(), TopicError> {
        Ok(self.node.stop()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(TopicSpec::parse("news=atomic").expect("valid"), TopicSpec::new("news", Qos::Atomic));
        assert!(matches!(TopicSpec::parse("news"), Err(TopicError::BadSpec(_))));
        assert!(matches!(TopicSpec::parse("news=fast"), Err(TopicError::BadQos(q)) if q == "fast"));
        assert!(matches!(TopicSpec::parse("a b=atomic"), Err(TopicError::BadName(_))));
        let detection = FailureDetection::new(1_000_000, 1_000_000_000, 4, 1 << 16);
        let twice = [TopicSpec::new("a", Qos::Atomic), TopicSpec::new("a", Qos::Unordered)];
        assert!(matches!(topic_group(NodeId(0), vec![NodeId(0)], &twice, detection), Err(TopicError::Duplicate(_))));
        assert!(matches!(topic_group(NodeId(0), vec![NodeId(0)], &[], detection), Err(TopicError::NoTopics)));
    }

    #[test]
    fn a_log_replays_its_whole_records_and_drops_a_torn_tail() {
        let mut bytes = Vec::new();
        encode_record(b"one", &mut bytes);
        encode_record(b"two", &mut bytes);
        let whole = bytes.len();
        encode_record(b"three", &mut bytes);
        bytes.truncate(bytes.len() - 2);
        assert_eq!(decode_records(&bytes), (vec![b"one".to_vec(), b"two".to_vec()], whole));
        let mut corrupt = bytes[..whole].to_vec();
        corrupt[whole - 1] ^= 1;
        assert_eq!(decode_records(&corrupt).0, vec![b"one".to_vec()], "a bad checksum ends the log");
    }
}
