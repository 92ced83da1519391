//! A node's structured events: one JSON object per line, appended to the file named by
//! `node.events` (for instance `/dev/fd/3` for an inherited descriptor), for tools that follow
//! what a node does (the fault harness) without reading its human log. Every line carries the
//! schema version [`EVENTS_SCHEMA`]; a reader refuses other versions.
//!
//! ```text
//! {"v":1,"event":"start","node":0,"pid":4242}
//! {"v":1,"event":"applied","index":7,"digest":"9c1f3ac9f1e0a2b4"}
//! {"v":1,"event":"leader_change","leader":1}
//! {"v":1,"event":"restore","index":512,"from":2}
//! {"v":1,"event":"fenced","writer":1,"pid":4243}
//! ```
//!
//! Each line is written with one `write` on a file opened for appending, so lines of the
//! threads of one node (and of its successive incarnations) never interleave; a process killed
//! mid-line leaves at most its last line torn, which [`read`] skips.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// The version of the event lines' schema; bump it on any incompatible change.
pub const EVENTS_SCHEMA: u32 = 1;

/// One event of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum NodeEvent {
    /// The node started (each incarnation writes one before anything else).
    Start {
        /// Its member id.
        node: u16,
        /// Its process id.
        pid: u32,
    },
    /// The node applied log entry `index`; `digest` is the XXH3-64 of the entry's command
    /// bytes in hex, `None` for an entry without a command (a new leader's no-op).
    Applied {
        /// The log index.
        index: u64,
        /// The entry's digest.
        digest: Option<String>,
    },
    /// The node's view of the leader changed.
    LeaderChange {
        /// The new leader.
        leader: u16,
    },
    /// The node fell behind the recycled log and restored a snapshot taken at `index`.
    Restore {
        /// The snapshot's index.
        index: u64,
        /// The member whose snapshot it was.
        from: u16,
    },
    /// The node applied the `Membership` entry at `index`, which made `members` the members.
    Membership {
        /// The log index.
        index: u64,
        /// The members from `index + 1` on.
        members: Vec<u16>,
    },
    /// The node fenced (SIGKILLed) a writer stalled mid-write into its log (shm fabric).
    Fenced {
        /// The writer's member id.
        writer: u16,
        /// The writer's process id.
        pid: i32,
    },
}

/// One line: the schema version and the event.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    v: u32,
    #[serde(flatten)]
    event: NodeEvent,
}

/// Why events could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The events file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line (not the last) is not an event of this schema.
    #[error("{path} line {line}: {problem}")]
    Malformed {
        /// The events file.
        path: PathBuf,
        /// Its 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
}

/// Where a node writes its events: a file, or nowhere. Cheap to clone; clones share the file.
#[derive(Clone, Debug, Default)]
pub struct EventLog(Option<Arc<Mutex<File>>>);

impl EventLog {
    /// Opens `path` for appending, or writes nowhere for `None`.
    pub fn open(path: Option<&Path>) -> Result<Self, EventsError> {
        let Some(path) = path else { return Ok(Self(None)) };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| EventsError::Io { path: path.to_path_buf(), source })?;
        Ok(Self(Some(Arc::new(Mutex::new(file)))))
    }

    /// Whether events go anywhere (callers skip building them otherwise).
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Appends `event` as one line. A failed write is logged, not returned: events are for
    /// observers, and a full disk must not stop replication.
    pub fn emit(&self, event: NodeEvent) {
        let Some(file) = &self.0 else { return };
        let mut line = match serde_json::to_vec(&Line { v: EVENTS_SCHEMA, event }) {
            Ok(line) => line,
            Err(e) => return tracing::warn!(error = %e, "cannot encode an event"),
        };
        line.push(b'\n');
        let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = file.write_all(&line) {
            tracing::warn!(error = %e, "cannot write an event");
        }
    }
}

/// Reads the events in `path`. A torn last line (its writer was killed mid-write) is skipped;
/// any other line that is not an event of schema [`EVENTS_SCHEMA`] is an error.
pub fn read(path: &Path) -> Result<Vec<NodeEvent>, EventsError> {
    let io = |source| EventsError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io)?;
    let lines: Vec<Vec<u8>> = std::io::BufReader::new(file).split(b'\n').collect::<Result<_, _>>().map_err(io)?;
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let malformed = |problem: String| EventsError::Malformed { path: path.to_path_buf(), line: i + 1, problem };
        match serde_json::from_slice::<Line>(line) {
            Ok(Line { v: EVENTS_SCHEMA, event }) => events.push(event),
            Ok(Line { v, .. }) => return Err(malformed(format!("schema version {v}, expected {EVENTS_SCHEMA}"))),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => return Err(malformed(e.to_string())),
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("microrep-events-{name}-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn events_round_trip_through_two_handles_and_a_torn_tail_is_skipped() {
        let path = scratch("round-trip");
        let events = [
            NodeEvent::Start { node: 0, pid: 42 },
            NodeEvent::Applied { index: 7, digest: Some("3ac9f1e0".into()) },
            NodeEvent::Applied { index: 8, digest: None },
            NodeEvent::LeaderChange { leader: 1 },
            NodeEvent::Restore { index: 512, from: 2 },
            NodeEvent::Fenced { writer: 1, pid: 43 },
        ];
        let (a, b) = (EventLog::open(Some(&path)).expect("open"), EventLog::open(Some(&path)).expect("open again"));
        for (i, event) in events.iter().enumerate() {
            if i % 2 == 0 { a.emit(event.clone()) } else { b.emit(event.clone()) }
        }
        let mut torn = OpenOptions::new().append(true).open(&path).expect("append");
        torn.write_all(br#"{"v":1,"event":"appl"#).expect("torn line");
        assert_eq!(read(&path).expect("read"), events);
        let text = std::fs::read_to_string(&path).expect("text");
        assert!(text.starts_with(r#"{"v":1,"event":"start","node":0,"pid":42}"#), "{text}");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn another_schema_version_or_a_bad_line_is_refused() {
        let path = scratch("versions");
        std::fs::write(&path, "{\"v\":2,\"event\":\"start\",\"node\":0,\"pid\":1}\n").expect("write");
        assert!(matches!(read(&path), Err(EventsError::Malformed { line: 1, .. })));
        std::fs::write(&path, "not json\n{\"v\":1,\"event\":\"leader_change\",\"leader\":0}\n").expect("write");
        assert!(matches!(read(&path), Err(EventsError::Malformed { line: 1, .. })));
        assert!(EventLog::open(None).is_ok_and(|log| !log.is_on()));
        let _ = std::fs::remove_file(path);
    }
}
