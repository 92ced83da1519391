//! Exactly-once client sessions: `MICROREP.SESSION <client-id> <seq> <command> [args...]`.
//!
//! A command whose outcome a client did not learn (`-UNKNOWN`: leadership changed while it
//! replicated, or the connection broke) may or may not have been applied. Retried plainly, an
//! `INCR` or an `APPEND` could apply twice. Retried inside a session with the same sequence
//! number, it is applied at most once, and the retry gets the reply of the first application.
//!
//! The replicated state keeps, per client id, the highest sequence number applied and its
//! reply (as Raft's client sessions do). Applying a session command with sequence `s`:
//!
//! - `s` above the last: the command runs; its reply is kept and returned;
//! - `s` equal to the last: the kept reply is returned, nothing runs (a retry);
//! - `s` below the last: refused (`-ERR SESSION stale ...`): the client already moved on;
//! - an id the state does not know, with `s` other than 1: refused (`-ERR SESSION unknown
//!   ...`), since its session may have been evicted and a retry could then run twice.
//!
//! At most [`MAX_SESSIONS`] sessions are kept; a new one evicts the session used longest ago
//! (in log order, so every replica evicts the same). A client must use one id per session, one
//! command at a time per id, and sequence numbers from 1 up; a new id starts a new session.
//! Sessions are part of the snapshot and of the digest.

use std::collections::{BTreeMap, HashMap};

/// Sessions kept at most.
pub const MAX_SESSIONS: usize = 65_536;
/// Longest client id, in bytes.
pub const MAX_ID_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    seq: u64,
    reply: Vec<u8>,
    /// When it was last used (a count of session commands applied, the same on every replica).
    used: u64,
}

/// What the state machine does with a session command.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Run the command, then [`Sessions::record`] its reply.
    Run,
    /// A retry: answer with the kept reply.
    Replay(&'a [u8]),
    /// Answer with this error text.
    Refuse(String),
}

/// The session table of the replicated state.
#[derive(Debug, Default)]
pub struct Sessions {
    by_id: HashMap<Vec<u8>, Session>,
    /// Client ids by last use, for eviction.
    by_use: BTreeMap<u64, Vec<u8>>,
    clock: u64,
    digest: u64,
}

fn session_hash(id: &[u8], s: &Session) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&(id.len() as u64).to_le_bytes());
    h.update(id);
    h.update(&s.seq.to_le_bytes());
    h.update(&s.reply);
    h.digest()
}

impl Sessions {
    /// Decides what to do with command `seq` of client `id`.
    pub fn check(&self, id: &[u8], seq: u64) -> Verdict<'_> {
        let shown = String::from_utf8_lossy(id);
        match self.by_id.get(id) {
            Some(s) if seq == s.seq => Verdict::Replay(&s.reply),
            Some(s) if seq < s.seq => {
                Verdict::Refuse(format!("ERR SESSION stale sequence {seq} for '{shown}' (it applied {})", s.seq))
            }
            Some(_) => Verdict::Run,
            None if seq == 1 => Verdict::Run,
            None => Verdict::Refuse(format!(
                "ERR SESSION unknown or expired session '{shown}' at sequence {seq}: start a new session id"
            )),
        }
    }

    /// Keeps `reply` as the outcome of command `seq` of client `id` (after [`Verdict::Run`]).
    pub fn record(&mut self, id: &[u8], seq: u64, reply: &[u8]) {
        self.clock += 1;
        let session = Session { seq, reply: reply.to_vec(), used: self.clock };
        if let Some(old) = self.by_id.get(id) {
            self.by_use.remove(&old.used);
            self.digest ^= session_hash(id, old);
        } else if self.by_id.len() >= MAX_SESSIONS
            && let Some((_, evicted)) = self.by_use.pop_first()
            && let Some(old) = self.by_id.remove(&evicted)
        {
            self.digest ^= session_hash(&evicted, &old);
        }
        self.digest ^= session_hash(id, &session);
        self.by_use.insert(session.used, id.to_vec());
        self.by_id.insert(id.to_vec(), session);
    }

    /// Sessions kept.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// An order-independent digest of the sessions.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Appends the sessions (a count, then id, sequence, last use and reply of each, in order of
    /// use) and the use clock.
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.clock.to_le_bytes());
        out.extend_from_slice(&(self.by_use.len() as u64).to_le_bytes());
        for id in self.by_use.values() {
            let s = &self.by_id[id];
            out.extend_from_slice(&(id.len() as u32).to_le_bytes());
            out.extend_from_slice(id);
            out.extend_from_slice(&s.seq.to_le_bytes());
            out.extend_from_slice(&s.used.to_le_bytes());
            out.extend_from_slice(&(s.reply.len() as u32).to_le_bytes());
            out.extend_from_slice(&s.reply);
        }
    }

    /// Reads what [`Sessions::snapshot`] wrote from the front of `s`, advancing it.
    pub fn restore(s: &mut &[u8]) -> Result<Self, SessionsError> {
        fn take<'a>(s: &mut &'a [u8], n: usize) -> Result<&'a [u8], SessionsError> {
            let (head, rest) = s.split_at_checked(n).ok_or(SessionsError::Truncated)?;
            *s = rest;
            Ok(head)
        }
        fn array<const N: usize>(s: &mut &[u8]) -> Result<[u8; N], SessionsError> {
            let (head, rest) = s.split_first_chunk::<N>().ok_or(SessionsError::Truncated)?;
            *s = rest;
            Ok(*head)
        }
        fn u64_(s: &mut &[u8]) -> Result<u64, SessionsError> {
            array(s).map(u64::from_le_bytes)
        }
        fn bytes(s: &mut &[u8]) -> Result<Vec<u8>, SessionsError> {
            let n = u32::from_le_bytes(array(s)?) as usize;
            Ok(take(s, n)?.to_vec())
        }
        let mut sessions = Self { clock: u64_(s)?, ..Self::default() };
        for _ in 0..u64_(s)? {
            let id = bytes(s)?;
            let (seq, used) = (u64_(s)?, u64_(s)?);
            let session = Session { seq, used, reply: bytes(s)? };
            if used > sessions.clock || sessions.by_use.insert(used, id.clone()).is_some() {
                return Err(SessionsError::UseStamp { id: String::from_utf8_lossy(&id).into_owned(), used });
            }
            sessions.digest ^= session_hash(&id, &session);
            sessions.by_id.insert(id, session);
        }
        Ok(sessions)
    }
}

/// Why the sessions of a snapshot could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionsError {
    /// The bytes end inside a session.
    #[error("truncated sessions")]
    Truncated,
    /// A session was last used after the use clock, or at the same time as another one.
    #[error("session '{id}' has a bad use stamp {used}")]
    UseStamp {
        /// The session's client id (lossily as text).
        id: String,
        /// Its use stamp.
        used: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_gets_the_first_reply_and_runs_nothing() {
        let mut s = Sessions::default();
        assert_eq!(s.check(b"c1", 1), Verdict::Run);
        s.record(b"c1", 1, b":1\r\n");
        assert_eq!(s.check(b"c1", 1), Verdict::Replay(b":1\r\n"));
        assert_eq!(s.check(b"c1", 2), Verdict::Run);
        s.record(b"c1", 2, b":2\r\n");
        assert!(matches!(s.check(b"c1", 1), Verdict::Refuse(e) if e.contains("stale")));
        assert!(matches!(s.check(b"c2", 5), Verdict::Refuse(e) if e.contains("unknown or expired")));
    }

    #[test]
    fn the_session_used_longest_ago_is_evicted_first_and_cannot_run_twice() {
        let mut s = Sessions::default();
        for i in 0..MAX_SESSIONS as u64 {
            s.record(&i.to_le_bytes(), 1, b"+OK\r\n");
        }
        // Session 0 is used again: 1 is now the oldest.
        s.record(&0u64.to_le_bytes(), 2, b"+OK\r\n");
        s.record(b"newcomer", 1, b"+OK\r\n");
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(matches!(s.check(&1u64.to_le_bytes(), 2), Verdict::Refuse(_)), "evicted: a retry is refused");
        assert_eq!(s.check(&0u64.to_le_bytes(), 2), Verdict::Replay(b"+OK\r\n"));
    }

    #[test]
    fn snapshots_restore_sessions_order_and_digest() {
        let mut s = Sessions::default();
        s.record(b"a", 1, b"x");
        s.record(b"b", 3, b"y");
        s.record(b"a", 2, b"z");
        let mut bytes = Vec::new();
        s.snapshot(&mut bytes);
        let mut rest = bytes.as_slice();
        let r = Sessions::restore(&mut rest).expect("restore");
        assert!(rest.is_empty());
        assert_eq!((r.digest(), r.len(), r.check(b"a", 2)), (s.digest(), 2, Verdict::Replay(b"z")));
        assert_eq!(r.by_use.first_key_value().map(|(_, id)| id.as_slice()), Some(&b"b"[..]));
        assert!(matches!(Sessions::restore(&mut &bytes[..bytes.len() - 1]), Err(SessionsError::Truncated)));
    }
}
