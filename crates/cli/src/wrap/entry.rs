//! What a wrap node writes into Mu's log, and the replicated state machine that hands
//! committed entries to the replay agent.
//!
//! Every entry names its origin (replica id and a random nonce drawn for each copy of the
//! server a wrap node runs): an entry that the current copy's leader proposed for its own
//! client was delivered by the shim, so the replay agent skips it; every other entry, the
//! entries of an earlier copy of the same replica included, is replayed.
//!
//! A leader's copy may execute a client's input only if nothing but its own entries committed
//! since its promotion barrier: the state machine answers each of them with that fact
//! ([`Verdict`]), in log order, so a leader that lost its term for a moment (a pause, another
//! leader's entries) never hands input to a copy that missed entries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;

use microrep::{Apply, Index};

use super::input_clock::InputClock;

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
    /// The leader's digests of its copy's output on a connection (`wrap/output.rs`).
    Check = 5,
}

/// Who proposed an entry: one copy of the server, run by one wrap node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) replica: u16,
    pub(crate) nonce: u64,
}

impl Origin {
    /// A fresh origin for a new copy of replica `replica`'s server.
    pub(crate) fn fresh(replica: u16) -> Self {
        use std::hash::BuildHasher;
        let seed = (std::process::id(), microrep::monotonic_ns());
        Self { replica, nonce: std::collections::hash_map::RandomState::new().hash_one(seed) }
    }
}

/// The copy a wrap node runs now: its origin, shared by the threads that propose (with it) and
/// the state machine (which tells the leader whether its copy may execute an entry); whether
/// it can still be trusted; and where the state machine stands, for a leader's checkpoint.
#[derive(Debug)]
pub(crate) struct CurrentCopy {
    replica: u16,
    nonce: AtomicU64,
    diverged: AtomicBool,
    /// The last entry applied and its verdict, packed by [`Position::pack`].
    position: AtomicU64,
    /// The input times of the log (a leader's next one comes after every one applied).
    pub(crate) input_clock: InputClock,
}

/// The last entry the state machine applied, and whether the current copy was in order there
/// (every entry since its promotion barrier was its own, so it executed exactly the log up to
/// that entry if it has not diverged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) last: Index,
    pub(crate) in_order: bool,
}

impl Position {
    /// Entry in the high 51 bits, position in a batch (< 4096) in the next 12, the verdict last.
    fn pack(self) -> u64 {
        debug_assert!(self.last.entry < 1 << 51 && self.last.position < 1 << 12);
        self.last.entry << 13 | u64::from(self.last.position & 0xfff) << 1 | u64::from(self.in_order)
    }

    fn unpack(word: u64) -> Option<Self> {
        (word != 0).then_some(Self {
            last: Index { entry: word >> 13, position: ((word >> 1) & 0xfff) as u32 },
            in_order: word & 1 == 1,
        })
    }
}

impl CurrentCopy {
    pub(crate) fn new(origin: Origin) -> Arc<Self> {
        Arc::new(Self {
            replica: origin.replica,
            nonce: AtomicU64::new(origin.nonce),
            diverged: AtomicBool::new(false),
            position: AtomicU64::new(0),
            input_clock: InputClock::default(),
        })
    }

    pub(crate) fn get(&self) -> Origin {
        Origin { replica: self.replica, nonce: self.nonce.load(Ordering::Acquire) }
    }

    /// Replaces the copy (before the new one may serve): a new origin, trusted.
    pub(crate) fn set(&self, origin: Origin) {
        debug_assert_eq!(origin.replica, self.replica);
        self.nonce.store(origin.nonce, Ordering::Release);
        self.diverged.store(false, Ordering::Release);
    }

    /// Marks the copy as no longer holding the log's state (a proposal whose outcome is unknown,
    /// or input the copy executed that the log does not have in that order).
    pub(crate) fn diverge(&self) {
        self.diverged.store(true, Ordering::Release);
    }

    pub(crate) fn diverged(&self) -> bool {
        self.diverged.load(Ordering::Acquire)
    }

    /// Where the state machine stands (`None` before the first entry).
    pub(crate) fn position(&self) -> Option<Position> {
        Position::unpack(self.position.load(Ordering::Acquire))
    }
}

/// The state machine's answer to a leader's own `Accept`, `Data` or `Close` entry: whether
/// every entry since the proposing copy's promotion barrier was its own, so that its copy,
/// which saw only those through the shim, holds the log's state up to this entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The copy may execute it.
    InOrder,
    /// Another origin's entry committed after the copy's barrier: the copy missed it, and must
    /// neither execute this input nor serve again before it is rebuilt.
    Missed,
}

impl Verdict {
    fn byte(self) -> u8 {
        match self {
            Self::InOrder => 1,
            Self::Missed => 0,
        }
    }

    /// Reads the verdict at the end of a committed reply.
    pub(crate) fn of_reply(reply: &[u8]) -> Self {
        if reply.last() == Some(&1) { Self::InOrder } else { Self::Missed }
    }
}

/// A decoded entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) tag: Tag,
    pub(crate) origin: Origin,
    pub(crate) conn: u64,
    /// A `Data` entry's input time (`wrap/input_clock.rs`); 0 for other entries.
    pub(crate) time_ns: u64,
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

/// Encodes a `Data` entry: its input time, then the bytes the server read.
pub(crate) fn encode_data(origin: Origin, conn: u64, time_ns: u64, bytes: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(8 + bytes.len());
    data.extend_from_slice(&time_ns.to_le_bytes());
    data.extend_from_slice(bytes);
    encode(Tag::Data, origin, conn, &data)
}

/// Decodes an entry; `None` if it is not one.
pub(crate) fn decode(bytes: &[u8]) -> Option<Entry> {
    let tag = match *bytes.first()? {
        1 => Tag::Accept,
        2 => Tag::Data,
        3 => Tag::Close,
        4 => Tag::Barrier,
        5 => Tag::Check,
        _ => return None,
    };
    let replica = u16::from_le_bytes(bytes.get(1..3)?.try_into().ok()?);
    let nonce = u64::from_le_bytes(bytes.get(3..11)?.try_into().ok()?);
    let conn = u64::from_le_bytes(bytes.get(11..19)?.try_into().ok()?);
    let (time_ns, data) = match tag {
        Tag::Data => (u64::from_le_bytes(bytes.get(HEADER..HEADER + 8)?.try_into().ok()?), bytes.get(HEADER + 8..)?),
        _ => (0, bytes.get(HEADER..)?),
    };
    Some(Entry { tag, origin: Origin { replica, nonce }, conn, time_ns, data: data.to_vec() })
}

/// A committed entry on its way to the replay agent, which skips those of its current copy
/// (the shim delivered them).
#[derive(Debug)]
pub(crate) struct Committed {
    pub(crate) index: Index,
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
    /// The copy must be discarded (a deposed leader's that served, an unknown outcome, a
    /// server that exited): replace it with a peer's state at a cut at or after the last entry
    /// handled, keeping the node and its log (docs/WRAP.md, "Rebuilding a copy").
    Rebuild { why: Discard },
}

/// Why a copy must be replaced by a peer's state (docs/WRAP.md, "Rebuilding a copy").
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum Discard {
    /// Its exit status, or why that could not be read.
    #[error("the server exited ({0})")]
    ServerExited(String),
    /// A proposal's outcome is unknown.
    #[error("a client's input may have committed without its server having seen it")]
    Diverged,
    /// A deposed leader's copy executed input that only the shim delivered.
    #[error("lost leadership after serving clients")]
    LostLeadership,
    /// Mu restored a snapshot (see [`Work::Restore`]).
    #[error("behind the recycled log")]
    BehindRecycledLog,
    /// Its output on a connection differed from the leader's (output checking, `--output-check
    /// repair`).
    #[error("its output on connection {0} differed from the leader's")]
    OutputDiffered(u64),
}

/// The wrap node's replicated state machine: it forwards committed entries, in log order, to
/// the replay agent's thread (which talks to the server, off Mu's replication thread). Its own
/// state is only a count and the last entry's index: the server's state lives in the server,
/// and a replica that needs it gets it from a peer's copy (`transfer`).
#[derive(Debug)]
pub(crate) struct WrapApp {
    copy: Arc<CurrentCopy>,
    replay: Sender<Work>,
    applied: u64,
    last: Option<Index>,
    /// The copy (nonce) whose promotion barrier committed, if every entry since was its own.
    in_order: Option<u64>,
}

impl WrapApp {
    pub(crate) fn new(copy: Arc<CurrentCopy>, replay: Sender<Work>) -> Self {
        Self { copy, replay, applied: 0, last: None, in_order: None }
    }
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
        let copy = self.copy.get();
        if entry.origin != copy {
            self.in_order = None;
        } else if entry.tag == Tag::Barrier {
            self.in_order = Some(copy.nonce);
        }
        let verdict = if self.in_order == Some(copy.nonce) { Verdict::InOrder } else { Verdict::Missed };
        let position = Position { last: index, in_order: verdict == Verdict::InOrder };
        self.copy.position.store(position.pack(), Ordering::Release);
        match entry.tag {
            Tag::Accept => {
                entry.conn = conn_id(index);
                reply.extend_from_slice(&entry.conn.to_le_bytes());
                reply.push(verdict.byte());
            }
            Tag::Barrier => reply.extend_from_slice(&index.entry.to_le_bytes()),
            Tag::Data => {
                self.copy.input_clock.observe(entry.time_ns);
                reply.push(verdict.byte());
            }
            Tag::Close => reply.push(verdict.byte()),
            Tag::Check => {}
        }
        // The agent's thread ends only when the node is being stopped.
        let _ = self.replay.send(Work::Entry(Committed { index, entry }));
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
        self.in_order = None;
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
        let bytes = encode_data(origin, 7 << 12, 1_234, b"*1\r\n$4\r\nPING\r\n");
        let entry = decode(&bytes).expect("decodes");
        assert_eq!(
            entry,
            Entry { tag: Tag::Data, origin, conn: 7 << 12, time_ns: 1_234, data: b"*1\r\n$4\r\nPING\r\n".to_vec() }
        );
        assert_eq!(decode(&encode(Tag::Barrier, origin, 0, &[])).map(|e| e.tag), Some(Tag::Barrier));
        assert_eq!(decode(&[9, 0, 0]), None);
        assert_eq!(decode(&bytes[..10]), None);
    }

    #[test]
    fn positions_pack_into_one_word() {
        for (entry, position, in_order) in [(1, 0, true), (7, 4095, false), ((1 << 51) - 1, 3, true)] {
            let p = Position { last: Index { entry, position }, in_order };
            assert_eq!(Position::unpack(p.pack()), Some(p));
        }
        assert_eq!(Position::unpack(0), None);
    }

    #[test]
    fn connection_ids_are_log_positions() {
        assert_eq!(conn_id(Index { entry: 5, position: 0 }), 5 << 12);
        assert_eq!(conn_id(Index { entry: 5, position: 3 }), (5 << 12) | 3);
    }

    #[test]
    fn accepts_reply_their_connection_id_and_entries_keep_their_origin() {
        let (tx, rx) = std::sync::mpsc::channel();
        let me = Origin { replica: 0, nonce: 1 };
        let mut app = WrapApp::new(CurrentCopy::new(me), tx);
        let mut reply = Vec::new();
        app.apply(Index { entry: 9, position: 0 }, &encode(Tag::Accept, me, 0, &[]), &mut reply);
        assert_eq!(reply.get(..8), Some(&(9u64 << 12).to_le_bytes()[..]));
        let other = Origin { replica: 1, nonce: 1 };
        app.apply(Index { entry: 10, position: 0 }, &encode_data(other, 9 << 12, 5, b"x"), &mut Vec::new());
        let (Ok(Work::Entry(first)), Ok(Work::Entry(second))) = (rx.recv(), rx.recv()) else { panic!("two entries") };
        assert!(first.entry.origin == me && first.entry.conn == 9 << 12);
        assert!(second.entry.origin == other && second.entry.data == b"x" && second.entry.time_ns == 5);
        assert_eq!(app.copy.input_clock.next(0), 6, "a new input comes after the last one applied");
    }

    /// The verdict a leader's copy gets with each of its own entries: in order only after its
    /// own barrier and while nothing of another origin (another leader, or an earlier copy of
    /// the same replica) committed since.
    #[test]
    fn a_copy_executes_input_only_while_every_entry_since_its_barrier_was_its_own() {
        let (tx, _rx) = std::sync::mpsc::channel();
        let me = Origin { replica: 0, nonce: 1 };
        let copy = CurrentCopy::new(me);
        let mut app = WrapApp::new(Arc::clone(&copy), tx);
        let mut at = 0;
        let mut verdict = |app: &mut WrapApp, tag: Tag, origin: Origin| {
            at += 1;
            let mut reply = Vec::new();
            let entry =
                if tag == Tag::Data { encode_data(origin, 4096, at, b"x") } else { encode(tag, origin, 4096, b"x") };
            app.apply(Index { entry: at, position: 0 }, &entry, &mut reply);
            Verdict::of_reply(&reply)
        };
        assert_eq!(verdict(&mut app, Tag::Data, me), Verdict::Missed, "before any barrier");
        verdict(&mut app, Tag::Barrier, me);
        assert_eq!(verdict(&mut app, Tag::Data, me), Verdict::InOrder);
        assert_eq!(verdict(&mut app, Tag::Close, me), Verdict::InOrder);
        let rival = Origin { replica: 1, nonce: 7 };
        verdict(&mut app, Tag::Barrier, rival);
        assert_eq!(verdict(&mut app, Tag::Data, me), Verdict::Missed, "another leader's entry came between");
        verdict(&mut app, Tag::Barrier, me);
        assert_eq!(verdict(&mut app, Tag::Accept, me), Verdict::InOrder, "promoted again");
        let next = Origin { replica: 0, nonce: 2 };
        copy.set(next);
        assert_eq!(verdict(&mut app, Tag::Data, me), Verdict::Missed, "the replaced copy's entries");
        assert_eq!(verdict(&mut app, Tag::Data, next), Verdict::Missed, "the new copy before its barrier");
        verdict(&mut app, Tag::Barrier, next);
        assert_eq!(verdict(&mut app, Tag::Data, next), Verdict::InOrder);
    }

    #[test]
    fn a_restored_snapshot_asks_the_agent_for_a_peers_state_past_its_last_entry() {
        let (tx, rx) = std::sync::mpsc::channel();
        let me = Origin { replica: 0, nonce: 1 };
        let mut donor = WrapApp::new(CurrentCopy::new(me), tx.clone());
        donor.apply(Index { entry: 7, position: 2 }, &encode(Tag::Barrier, me, 0, &[]), &mut Vec::new());
        let mut bytes = Vec::new();
        donor.snapshot(&mut bytes);
        let mut recipient = WrapApp::new(CurrentCopy::new(me), tx);
        recipient.restore(&bytes).expect("restores");
        assert_eq!((recipient.applied, recipient.last), (1, Some(Index { entry: 7, position: 2 })));
        let last = rx.try_iter().last();
        assert!(matches!(last, Some(Work::Restore { upto: Some(Index { entry: 7, position: 2 }) })), "{last:?}");
        assert!(recipient.restore(b"short").is_err());
    }
}
