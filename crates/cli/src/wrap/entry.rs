//! What a wrap node writes into Mu's log, and the replicated state machine that hands
//! committed entries to the replay agent.
//!
//! Every entry names its origin (replica id and a random nonce drawn when the wrap node
//! started): an entry that this very wrap node proposed for its own server's client was
//! delivered by the shim, so the replay agent skips it; every other entry is replayed.

use std::sync::mpsc::Sender;

use microrep::{Apply, Index};

/// Bytes before an entry's payload: tag, origin replica, origin nonce, connection id.
const HEADER: usize = 1 + 2 + 8 + 8;

/// What happened on the leader's server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    /// A client connection was accepted; its id is [`conn_id`] of the entry's index.
    Accept = 1,
    /// The server read the payload from a connection.
    Data = 2,
    /// The server closed a connection (or a new leader retired one of the old leader's).
    Close = 3,
    /// Nothing: a new leader's marker that everything before it has been applied.
    Barrier = 4,
}

/// Who proposed an entry: a wrap node incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) replica: u16,
    pub(crate) nonce: u64,
}

/// A decoded entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) tag: Tag,
    pub(crate) origin: Origin,
    pub(crate) conn: u64,
    pub(crate) data: Vec<u8>,
}

/// The connection id of an accept committed at `index`: its log index, with its position in
/// a batch in the low 12 bits (a batch holds at most 4096 commands).
pub(crate) fn conn_id(index: Index) -> u64 {
    (index.entry << 12) | u64::from(index.position & 0xfff)
}

/// Encodes an entry.
pub(crate) fn encode(tag: Tag, origin: Origin, conn: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + data.len());
    out.push(tag as u8);
    out.extend_from_slice(&origin.replica.to_le_bytes());
    out.extend_from_slice(&origin.nonce.to_le_bytes());
    out.extend_from_slice(&conn.to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// Decodes an entry; `None` if it is not one.
pub(crate) fn decode(bytes: &[u8]) -> Option<Entry> {
    let tag = match *bytes.first()? {
        1 => Tag::Accept,
        2 => Tag::Data,
        3 => Tag::Close,
        4 => Tag::Barrier,
        _ => return None,
    };
    let replica = u16::from_le_bytes(bytes.get(1..3)?.try_into().ok()?);
    let nonce = u64::from_le_bytes(bytes.get(3..11)?.try_into().ok()?);
    let conn = u64::from_le_bytes(bytes.get(11..19)?.try_into().ok()?);
    Some(Entry { tag, origin: Origin { replica, nonce }, conn, data: bytes.get(HEADER..)?.to_vec() })
}

/// A committed entry on its way to the replay agent.
#[derive(Debug)]
pub(crate) struct Committed {
    pub(crate) index: Index,
    /// Proposed by this wrap node (delivered to its server by the shim).
    pub(crate) own: bool,
    pub(crate) entry: Entry,
}

/// What the state machine hands the replay agent, in log order.
#[derive(Debug)]
pub(crate) enum Work {
    /// Replay this entry (unless `own`).
    Entry(Committed),
    /// Mu restored a snapshot: this replica fell behind the recycled log (or restarted after
    /// the log was recycled). Its server needs the state of a peer's copy that has handled at
    /// least the entries up to `upto` (the snapshot's last wrap entry), then the entries after
    /// that peer's cut (docs/WRAP.md, state transfer).
    Restore { upto: Option<Index> },
}

/// The wrap node's replicated state machine: it forwards committed entries, in log order, to
/// the replay agent's thread (which talks to the server, off Mu's replication thread). Its own
/// state is only a count and the last entry's index: the server's state lives in the server,
/// and a replica that needs it gets it from a peer's copy (`transfer`).
#[derive(Debug)]
pub(crate) struct WrapApp {
    pub(crate) me: Origin,
    pub(crate) replay: Sender<Work>,
    pub(crate) applied: u64,
    pub(crate) last: Option<Index>,
}

/// Encodes the snapshot: entries applied, then the last one's index (or none).
fn encode_snapshot(applied: u64, last: Option<Index>, out: &mut Vec<u8>) {
    out.extend_from_slice(&applied.to_le_bytes());
    if let Some(last) = last {
        out.extend_from_slice(&last.entry.to_le_bytes());
        out.extend_from_slice(&last.position.to_le_bytes());
    }
}

fn decode_snapshot(bytes: &[u8]) -> Option<(u64, Option<Index>)> {
    let applied = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let last = match bytes.len() {
        8 => None,
        20 => Some(Index {
            entry: u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?),
            position: u32::from_le_bytes(bytes.get(16..20)?.try_into().ok()?),
        }),
        _ => return None,
    };
    Some((applied, last))
}

impl Apply for WrapApp {
    fn apply(&mut self, index: Index, command: &[u8], reply: &mut Vec<u8>) {
        self.applied += 1;
        self.last = Some(index);
        let Some(mut entry) = decode(command) else {
            tracing::error!("entry {} is not a wrap entry; skipped", index.entry);
            return;
        };
        match entry.tag {
            Tag::Accept => {
                entry.conn = conn_id(index);
                reply.extend_from_slice(&entry.conn.to_le_bytes());
            }
            Tag::Barrier => reply.extend_from_slice(&index.entry.to_le_bytes()),
            Tag::Data | Tag::Close => {}
        }
        let own = entry.origin == self.me;
        // The agent's thread ends only when the node is being stopped.
        let _ = self.replay.send(Work::Entry(Committed { index, own, entry }));
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        encode_snapshot(self.applied, self.last, out);
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), microrep::RestoreError> {
        let (applied, last) = decode_snapshot(snapshot)
            .ok_or_else(|| microrep::RestoreError::Application("not a wrap snapshot".into()))?;
        tracing::warn!(?last, "behind the recycled log: this copy needs a peer's server state");
        self.applied = applied;
        self.last = last;
        let _ = self.replay.send(Work::Restore { upto: last });
        Ok(())
    }

    fn digest(&self) -> Option<u64> {
        Some(self.applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let origin = Origin { replica: 2, nonce: 0xdead_beef };
        let bytes = encode(Tag::Data, origin, 7 << 12, b"*1\r\n$4\r\nPING\r\n");
        let entry = decode(&bytes).expect("decodes");
        assert_eq!(entry, Entry { tag: Tag::Data, origin, conn: 7 << 12, data: b"*1\r\n$4\r\nPING\r\n".to_vec() });
        assert_eq!(decode(&encode(Tag::Barrier, origin, 0, &[])).map(|e| e.tag), Some(Tag::Barrier));
        assert_eq!(decode(&[9, 0, 0]), None);
        assert_eq!(decode(&bytes[..10]), None);
    }

    #[test]
    fn connection_ids_are_log_positions() {
        assert_eq!(conn_id(Index { entry: 5, position: 0 }), 5 << 12);
        assert_eq!(conn_id(Index { entry: 5, position: 3 }), (5 << 12) | 3);
    }

    #[test]
    fn accepts_reply_their_connection_id_and_own_entries_are_marked() {
        let (tx, rx) = std::sync::mpsc::channel();
        let me = Origin { replica: 0, nonce: 1 };
        let mut app = WrapApp { me, replay: tx, applied: 0, last: None };
        let mut reply = Vec::new();
        app.apply(Index { entry: 9, position: 0 }, &encode(Tag::Accept, me, 0, &[]), &mut reply);
        assert_eq!(reply, (9u64 << 12).to_le_bytes());
        let other = Origin { replica: 1, nonce: 1 };
        app.apply(Index { entry: 10, position: 0 }, &encode(Tag::Data, other, 9 << 12, b"x"), &mut Vec::new());
        let (Ok(Work::Entry(first)), Ok(Work::Entry(second))) = (rx.recv(), rx.recv()) else { panic!("two entries") };
        assert!(first.own && first.entry.conn == 9 << 12);
        assert!(!second.own && second.entry.data == b"x");
    }

    #[test]
    fn a_restored_snapshot_asks_the_agent_for_a_peers_state_past_its_last_entry() {
        let (tx, rx) = std::sync::mpsc::channel();
        let me = Origin { replica: 0, nonce: 1 };
        let mut donor = WrapApp { me, replay: tx.clone(), applied: 0, last: None };
        donor.apply(Index { entry: 7, position: 2 }, &encode(Tag::Barrier, me, 0, &[]), &mut Vec::new());
        let mut bytes = Vec::new();
        donor.snapshot(&mut bytes);
        let mut recipient = WrapApp { me, replay: tx, applied: 0, last: None };
        recipient.restore(&bytes).expect("restores");
        assert_eq!((recipient.applied, recipient.last), (1, Some(Index { entry: 7, position: 2 })));
        let last = rx.try_iter().last();
        assert!(matches!(last, Some(Work::Restore { upto: Some(Index { entry: 7, position: 2 }) })), "{last:?}");
        assert!(recipient.restore(b"short").is_err());
    }
}
