//! The replicated key-value state machine and the commands its log carries.
//!
//! A command in the log is the client's argument vector, checked and normalised before it is
//! proposed (`[u16 argc][u32 len, bytes]*`, the name upper-cased), so that every replica applies
//! exactly what the leader validated. Applying writes the RESP reply directly.

use std::collections::HashMap;

use microrep::{Apply, Index, RestoreError};

use crate::resp;
use crate::sessions::{self, Sessions, SessionsError, Verdict};

/// The wrapper of a command run at most once (see `sessions`).
const SESSION: &str = "MICROREP.SESSION";

/// Commands that go through the log, and their arities (`-n`: at least n, name included).
const COMMANDS: [(&str, i32); 9] = [
    ("GET", 2),
    ("SET", 3),
    ("DEL", -2),
    ("EXISTS", -2),
    ("INCR", 2),
    ("APPEND", 3),
    ("MGET", -2),
    ("MSET", -3),
    ("DBSIZE", 1),
];

/// Why a client's command is refused before it is proposed; its `Display` is the RESP error
/// text Redis sends in the same case.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// No command name.
    #[error("ERR empty command")]
    Empty,
    /// A command this server does not have.
    #[error("ERR unknown command '{0}'")]
    Unknown(String),
    /// A known command with the wrong number of arguments.
    #[error("ERR wrong number of arguments for '{0}' command")]
    Arity(String),
    /// A `MICROREP.SESSION` wrapper with a bad client id or sequence number.
    #[error("ERR SESSION {0}")]
    Session(String),
}

/// Checks a client's arguments and encodes them as a log command; an `Err` is the error to
/// send back (nothing is proposed). `MICROREP.SESSION id seq command...` wraps a command.
pub fn encode(args: &[Vec<u8>], out: &mut Vec<u8>) -> Result<(), CommandError> {
    let wrapped = args.first().is_some_and(|n| n.eq_ignore_ascii_case(SESSION.as_bytes()));
    if !wrapped {
        let name = check(args)?;
        write(&[name.as_bytes()], &args[1..], out);
        return Ok(());
    }
    let [_, id, seq, command @ ..] = args else {
        return Err(CommandError::Arity(SESSION.to_lowercase()));
    };
    if command.is_empty() {
        return Err(CommandError::Arity(SESSION.to_lowercase()));
    }
    if id.is_empty() || id.len() > sessions::MAX_ID_BYTES {
        return Err(CommandError::Session(format!("client id must be 1 to {} bytes", sessions::MAX_ID_BYTES)));
    }
    if parse_seq(seq).is_none() {
        return Err(CommandError::Session("sequence number must be an integer from 1".into()));
    }
    let name = check(command)?;
    write(&[SESSION.as_bytes(), id, seq, name.as_bytes()], &command[1..], out);
    Ok(())
}

fn parse_seq(seq: &[u8]) -> Option<u64> {
    std::str::from_utf8(seq).ok()?.parse::<u64>().ok().filter(|&s| s >= 1)
}

/// The canonical name of the command `args` if it is one the log carries with a valid arity.
fn check(args: &[Vec<u8>]) -> Result<&'static str, CommandError> {
    let name = args.first().map(|n| n.to_ascii_uppercase()).ok_or(CommandError::Empty)?;
    let (name, arity) = COMMANDS
        .iter()
        .find(|(c, _)| c.as_bytes() == name.as_slice())
        .ok_or_else(|| CommandError::Unknown(String::from_utf8_lossy(&name).into_owned()))?;
    let n = args.len() as i32;
    let arity_ok = if *arity > 0 { n == *arity } else { n >= -arity };
    let pairs_ok = *name != "MSET" || n % 2 == 1;
    if !arity_ok || !pairs_ok {
        return Err(CommandError::Arity(name.to_lowercase()));
    }
    Ok(name)
}

/// Encodes `head` then `tail` as one log command.
fn write(head: &[&[u8]], tail: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&((head.len() + tail.len()) as u16).to_le_bytes());
    for a in head.iter().copied().chain(tail.iter().map(Vec::as_slice)) {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
}

/// Decodes a log command into its arguments (borrowed from `bytes`).
fn decode(bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let (argc, mut rest) = bytes.split_at_checked(2)?;
    let argc = u16::from_le_bytes([argc[0], argc[1]]);
    let mut args = Vec::with_capacity(usize::from(argc));
    for _ in 0..argc {
        let (len, after) = rest.split_at_checked(4)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let (arg, after) = after.split_at_checked(len)?;
        args.push(arg);
        rest = after;
    }
    rest.is_empty().then_some(args)
}

/// The key-value state: a map, and an order-independent digest of its contents kept up to date
/// with every change (so comparing replicas costs nothing).
#[derive(Debug, Default)]
pub struct KvStore {
    map: HashMap<Vec<u8>, Vec<u8>>,
    digest: u64,
    sessions: Sessions,
}

fn pair_hash(key: &[u8], value: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&(key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(value);
    h.digest()
}

impl KvStore {
    fn set(&mut self, key: &[u8], value: Vec<u8>) {
        self.digest ^= pair_hash(key, &value);
        if let Some(old) = self.map.insert(key.to_vec(), value) {
            self.digest ^= pair_hash(key, &old);
        }
    }

    fn remove(&mut self, key: &[u8]) -> bool {
        match self.map.remove(key) {
            Some(old) => {
                self.digest ^= pair_hash(key, &old);
                true
            }
            None => false,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    /// Runs a session command at most once (see `sessions`).
    fn execute_in_session(&mut self, id: &[u8], seq: &[u8], command: &[&[u8]], out: &mut Vec<u8>) {
        let Some(seq) = parse_seq(seq) else {
            return resp::error(out, "ERR malformed command in the log");
        };
        match self.sessions.check(id, seq) {
            Verdict::Run => {
                let start = out.len();
                self.execute(command, out);
                self.sessions.record(id, seq, &out[start..]);
            }
            Verdict::Replay(reply) => out.extend_from_slice(reply),
            Verdict::Refuse(text) => resp::error(out, &text),
        }
    }

    fn execute(&mut self, args: &[&[u8]], out: &mut Vec<u8>) {
        match (args[0], &args[1..]) {
            (b"GET", [k]) => resp::bulk(out, self.get(k)),
            (b"SET", [k, v]) => {
                self.set(k, v.to_vec());
                resp::simple(out, "OK");
            }
            (b"DEL", keys) => {
                let n = keys.iter().filter(|k| self.remove(k)).count();
                resp::integer(out, n as i64);
            }
            (b"EXISTS", keys) => resp::integer(out, keys.iter().filter(|k| self.map.contains_key(**k)).count() as i64),
            (b"INCR", [k]) => {
                let current = self.get(k).map(|v| std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()));
                match current {
                    Some(None) => resp::error(out, "ERR value is not an integer or out of range"),
                    other => match other.flatten().unwrap_or(0).checked_add(1) {
                        Some(n) => {
                            self.set(k, n.to_string().into_bytes());
                            resp::integer(out, n);
                        }
                        None => resp::error(out, "ERR increment or decrement would overflow"),
                    },
                }
            }
            (b"APPEND", [k, v]) => {
                let mut value = self.get(k).map(<[u8]>::to_vec).unwrap_or_default();
                value.extend_from_slice(v);
                let len = value.len();
                self.set(k, value);
                resp::integer(out, len as i64);
            }
            (b"MGET", keys) => {
                resp::array(out, keys.len());
                keys.iter().for_each(|k| resp::bulk(out, self.get(k)));
            }
            (b"MSET", pairs) => {
                pairs.chunks_exact(2).for_each(|kv| self.set(kv[0], kv[1].to_vec()));
                resp::simple(out, "OK");
            }
            (b"DBSIZE", []) => resp::integer(out, self.map.len() as i64),
            _ => resp::error(out, "ERR malformed command in the log"),
        }
    }
}

impl Apply for KvStore {
    fn apply(&mut self, _index: Index, command: &[u8], reply: &mut Vec<u8>) {
        match decode(command) {
            Some(args) if args.len() >= 4 && args[0] == SESSION.as_bytes() => {
                self.execute_in_session(args[1], args[2], &args[3..], reply);
            }
            Some(args) if !args.is_empty() => self.execute(&args, reply),
            // Every replica decodes the same bytes, so all of them skip it alike.
            _ => resp::error(reply, "ERR malformed command in the log"),
        }
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        // In the map's order: a snapshot is restored as a whole, so equal states need not give
        // equal bytes (the digest compares them), and sorting the keys was most of its cost
        // (`cargo bench -p microrep-kv --bench snapshot`).
        let bytes: usize = self.map.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        out.reserve(8 + bytes);
        out.extend_from_slice(&(self.map.len() as u64).to_le_bytes());
        for (k, v) in &self.map {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
        self.sessions.snapshot(out);
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.restore_pairs(snapshot).map_err(|e| RestoreError::Application(e.to_string()))
    }

    fn digest(&self) -> Option<u64> {
        Some(self.digest ^ self.sessions.digest())
    }
}

impl KvStore {
    /// Decodes a snapshot (a count, then length-prefixed key and value pairs, then the
    /// sessions) into the state.
    fn restore_pairs(&mut self, snapshot: &[u8]) -> Result<(), SnapshotError> {
        fn take<'a>(s: &mut &'a [u8], n: usize) -> Result<&'a [u8], SnapshotError> {
            let (head, rest) = s.split_at_checked(n).ok_or(SnapshotError::Truncated)?;
            *s = rest;
            Ok(head)
        }
        fn array<const N: usize>(s: &mut &[u8]) -> Result<[u8; N], SnapshotError> {
            let (head, rest) = s.split_first_chunk::<N>().ok_or(SnapshotError::Truncated)?;
            *s = rest;
            Ok(*head)
        }
        fn len(s: &mut &[u8]) -> Result<usize, SnapshotError> {
            Ok(u32::from_le_bytes(array(s)?) as usize)
        }
        let mut s = snapshot;
        let count = u64::from_le_bytes(array(&mut s)?);
        let mut restored = Self::default();
        // A pair takes at least 8 bytes: a larger count is damage, not a size to reserve.
        restored.map.reserve(usize::try_from(count).unwrap_or(usize::MAX).min(s.len() / 8));
        for _ in 0..count {
            let n = len(&mut s)?;
            let k = take(&mut s, n)?;
            let n = len(&mut s)?;
            let v = take(&mut s, n)?.to_vec();
            restored.set(k, v);
        }
        restored.sessions = Sessions::restore(&mut s)?;
        if !s.is_empty() {
            return Err(SnapshotError::Trailing(s.len()));
        }
        *self = restored;
        Ok(())
    }
}

/// Why a snapshot of the store could not be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes end inside a key or a value.
    #[error("truncated snapshot")]
    Truncated,
    /// The sessions are malformed.
    #[error(transparent)]
    Sessions(#[from] SessionsError),
    /// Bytes follow the sessions.
    #[error("{0} bytes after the sessions")]
    Trailing(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(store: &mut KvStore, args: &[&str]) -> String {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        let mut cmd = Vec::new();
        if let Err(e) = encode(&args, &mut cmd) {
            return format!("-{e}");
        }
        let mut reply = Vec::new();
        store.apply(Index { entry: 0, position: 0 }, &cmd, &mut reply);
        String::from_utf8(reply).expect("utf8")
    }

    #[test]
    fn commands_behave_like_redis() {
        let s = &mut KvStore::default();
        assert_eq!(run(s, &["set", "a", "1"]), "+OK\r\n");
        assert_eq!(run(s, &["GET", "a"]), "$1\r\n1\r\n");
        assert_eq!(run(s, &["get", "nope"]), "$-1\r\n");
        assert_eq!(run(s, &["incr", "a"]), ":2\r\n");
        assert_eq!(run(s, &["incr", "fresh"]), ":1\r\n");
        assert_eq!(run(s, &["append", "a", "x"]), ":2\r\n");
        assert_eq!(run(s, &["incr", "a"]), "-ERR value is not an integer or out of range\r\n");
        assert_eq!(run(s, &["mset", "b", "2", "c", "3"]), "+OK\r\n");
        assert_eq!(run(s, &["mget", "a", "zz", "c"]), "*3\r\n$2\r\n2x\r\n$-1\r\n$1\r\n3\r\n");
        assert_eq!(run(s, &["exists", "a", "b", "zz"]), ":2\r\n");
        assert_eq!(run(s, &["dbsize"]), ":4\r\n");
        assert_eq!(run(s, &["del", "a", "zz"]), ":1\r\n");
        assert_eq!(run(s, &["set", "m", &i64::MAX.to_string()]), "+OK\r\n");
        assert_eq!(run(s, &["incr", "m"]), "-ERR increment or decrement would overflow\r\n");
    }

    #[test]
    fn bad_commands_are_refused_before_the_log() {
        let s = &mut KvStore::default();
        assert_eq!(run(s, &["flushall"]), "-ERR unknown command 'FLUSHALL'");
        assert_eq!(run(s, &["get"]), "-ERR wrong number of arguments for 'get' command");
        assert_eq!(run(s, &["mset", "a"]), "-ERR wrong number of arguments for 'mset' command");
        assert_eq!(run(s, &["mset", "a", "1", "b"]), "-ERR wrong number of arguments for 'mset' command");
        let mut reply = Vec::new();
        s.apply(Index { entry: 0, position: 0 }, &[9, 9, 9], &mut reply);
        assert_eq!(reply, b"-ERR malformed command in the log\r\n");
        assert!(s.is_empty());
    }

    #[test]
    fn a_session_runs_a_retried_command_once_and_replays_its_reply() {
        let s = &mut KvStore::default();
        let incr = |s: &mut KvStore, seq: &str| run(s, &["microrep.session", "client-7", seq, "incr", "n"]);
        assert_eq!(incr(s, "1"), ":1\r\n");
        assert_eq!(incr(s, "1"), ":1\r\n", "a retry gets the first reply");
        assert_eq!(s.get(b"n"), Some(&b"1"[..]), "and runs nothing");
        assert_eq!(incr(s, "2"), ":2\r\n");
        assert!(incr(s, "1").starts_with("-ERR SESSION stale sequence 1"), "{}", incr(s, "1"));
        let other = run(s, &["MICROREP.SESSION", "new-client", "3", "incr", "n"]);
        assert!(other.starts_with("-ERR SESSION unknown or expired session"), "{other}");
        assert_eq!(s.get(b"n"), Some(&b"2"[..]));
        assert_eq!(run(s, &["MICROREP.SESSION", "c", "1", "get", "n"]), "$1\r\n2\r\n", "reads work too");
    }

    #[test]
    fn malformed_session_wrappers_are_refused_before_the_log() {
        let s = &mut KvStore::default();
        assert_eq!(
            run(s, &["microrep.session", "c", "1"]),
            "-ERR wrong number of arguments for 'microrep.session' command"
        );
        assert_eq!(
            run(s, &["microrep.session", "c", "0", "get", "k"]),
            "-ERR SESSION sequence number must be an integer from 1"
        );
        assert_eq!(
            run(s, &["microrep.session", "c", "x", "get", "k"]),
            "-ERR SESSION sequence number must be an integer from 1"
        );
        assert_eq!(run(s, &["microrep.session", "", "1", "get", "k"]), "-ERR SESSION client id must be 1 to 64 bytes");
        assert_eq!(run(s, &["microrep.session", "c", "1", "flushall"]), "-ERR unknown command 'FLUSHALL'");
        assert_eq!(run(s, &["microrep.session", "c", "1", "get"]), "-ERR wrong number of arguments for 'get' command");
        assert!(s.is_empty() && s.sessions.is_empty());
    }

    #[test]
    fn sessions_travel_with_snapshots_and_count_in_the_digest() {
        let (a, b) = (&mut KvStore::default(), &mut KvStore::default());
        run(a, &["set", "x", "1"]);
        run(b, &["set", "x", "1"]);
        run(a, &["microrep.session", "c", "1", "append", "y", "+"]);
        run(b, &["append", "y", "+"]);
        assert_ne!(a.digest(), b.digest(), "same data, different sessions");
        let mut snap = Vec::new();
        a.snapshot(&mut snap);
        let c = &mut KvStore::default();
        c.restore(&snap).expect("restore");
        assert_eq!(c.digest(), a.digest());
        assert_eq!(run(c, &["microrep.session", "c", "1", "append", "y", "+"]), ":1\r\n", "the restored copy replays");
    }

    #[test]
    fn digest_tracks_content_and_snapshots_restore_it() {
        let (a, b) = (&mut KvStore::default(), &mut KvStore::default());
        run(a, &["set", "x", "1"]);
        run(a, &["set", "y", "2"]);
        run(b, &["set", "y", "2"]);
        run(b, &["set", "x", "0"]);
        assert_ne!(a.digest(), b.digest());
        run(b, &["incr", "x"]);
        assert_eq!(a.digest(), b.digest(), "same content in another order, same digest");
        let mut snap = Vec::new();
        a.snapshot(&mut snap);
        let c = &mut KvStore::default();
        c.restore(&snap).expect("restore");
        assert_eq!((c.digest(), c.len(), c.get(b"x")), (a.digest(), 2, Some(&b"1"[..])));
        assert!(c.restore(&snap[..snap.len() - 1]).is_err());
        assert_eq!(c.digest(), a.digest(), "a failed restore leaves the state alone");
    }
}
