//! The client workload: each client thread runs random operations on a small set of keys, paced
//! at a fixed rate, and records every operation it invoked. Keys come in three kinds so that
//! every reply is checkable: registers (`r*`: get/set/del, unique values), counters (`c*`:
//! get/incr) and logs (`a*`: get/append of unique tokens, rare del to keep values short).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::history::{Clock, OpKind, OpRecord, Outcome};
use microrep_testkit::client::Value as Reply;
use microrep_testkit::session::{Executed, Session};

/// The kinds of key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Register,
    Counter,
    Log,
}

impl KeyKind {
    pub(crate) const ALL: [Self; 3] = [Self::Register, Self::Counter, Self::Log];

    pub(crate) fn of(key: &str) -> Option<Self> {
        match key.as_bytes().first() {
            Some(b'r') => Some(Self::Register),
            Some(b'c') => Some(Self::Counter),
            Some(b'a') => Some(Self::Log),
            _ => None,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Register => "r",
            Self::Counter => "c",
            Self::Log => "a",
        }
    }
}

/// Every key of a workload with `per_kind` keys of each kind.
pub(crate) fn keys(per_kind: usize) -> Vec<String> {
    KeyKind::ALL.iter().flat_map(|k| (0..per_kind).map(move |i| format!("{}{i}", k.prefix()))).collect()
}

/// The separator ending every appended token.
pub(crate) const TOKEN_END: char = ',';

/// What the clients share.
#[derive(Debug)]
pub(crate) struct WorkloadConfig {
    pub(crate) nodes: Vec<SocketAddr>,
    pub(crate) keys_per_kind: usize,
    pub(crate) op_timeout: Duration,
    /// Operations per second per client.
    pub(crate) rate: u32,
    /// Negative control: the fraction of successful reads whose value the client replaces with
    /// an older one it saw before (a stale read).
    pub(crate) corrupt_reads: f64,
    /// Confirm each new connection with a PING before sending an operation on it: a wrapped
    /// server's followers refuse clients by closing their connections, which must not count as
    /// a lost reply (an operation of unknown outcome).
    pub(crate) confirm_connections: bool,
}

/// One client thread's state.
#[derive(Debug)]
pub(crate) struct Client<'a> {
    index: usize,
    id: usize,
    cfg: &'a WorkloadConfig,
    clock: Clock,
    rng: ChaCha8Rng,
    session: Session,
    keys: Vec<String>,
    seq: u64,
    /// Per key, the last two distinct values this client read (older, newer).
    seen: HashMap<String, (Option<Value>, Value)>,
    /// Replies of an unexpected type (a server bug the checker cannot see).
    pub(crate) unexpected_replies: u64,
}

impl<'a> Client<'a> {
    pub(crate) fn new(index: usize, seed: u64, cfg: &'a WorkloadConfig, clock: Clock) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Self {
            index,
            id: index,
            cfg,
            clock,
            rng,
            session: match Session::new(cfg.nodes.clone(), index) {
                session if cfg.confirm_connections => session.confirming_connections(),
                session => session,
            },
            keys: keys(cfg.keys_per_kind),
            seq: 0,
            seen: HashMap::new(),
            unexpected_replies: 0,
        }
    }

    /// Records this client's next operations under `id`.
    pub(crate) fn set_id(&mut self, id: usize) {
        self.id = id;
    }

    /// Runs operations until `stop`, taking a fresh client id from `ids` after every operation
    /// of unknown outcome (the old id's operation never returns).
    pub(crate) fn run(&mut self, stop: &AtomicBool, ids: &AtomicUsize) -> Vec<OpRecord> {
        let period = Duration::from_secs(1) / self.cfg.rate.max(1);
        let mut next = Instant::now();
        let mut ops = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            next += period;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            } else {
                next = Instant::now();
            }
            let op = self.one_op();
            if op.outcome == Outcome::Info {
                self.id = ids.fetch_add(1, Ordering::Relaxed);
            }
            ops.push(op);
        }
        ops
    }

    fn one_op(&mut self) -> OpRecord {
        let key = self.keys[self.rng.random_range(0..self.keys.len())].clone();
        let roll = self.rng.random_range(0..100u32);
        let (op, arg) = match KeyKind::of(&key) {
            Some(KeyKind::Register) if roll < 50 => (OpKind::Get, None),
            Some(KeyKind::Register) if roll < 95 => (OpKind::Set, Some(format!("{}-{}", self.index, self.seq))),
            Some(KeyKind::Register) => (OpKind::Del, None),
            Some(KeyKind::Counter) if roll < 40 => (OpKind::Get, None),
            Some(KeyKind::Counter) => (OpKind::Incr, None),
            Some(KeyKind::Log) if roll < 40 => (OpKind::Get, None),
            Some(KeyKind::Log) if roll < 97 => {
                (OpKind::Append, Some(format!("{}.{}{TOKEN_END}", self.index, self.seq)))
            }
            _ => (OpKind::Del, None),
        };
        self.seq += 1;
        let mut record = self.invoke(op, key, arg);
        if op == OpKind::Get && record.outcome == Outcome::Ok && !record.result.is_null() {
            self.remember_or_corrupt(&mut record);
        }
        record
    }

    /// Runs one operation against the cluster and records it.
    pub(crate) fn invoke(&mut self, op: OpKind, key: String, arg: Option<String>) -> OpRecord {
        let name: &[u8] = match op {
            OpKind::Get => b"GET",
            OpKind::Set => b"SET",
            OpKind::Incr => b"INCR",
            OpKind::Append => b"APPEND",
            OpKind::Del => b"DEL",
        };
        let mut args = vec![name, key.as_bytes()];
        if let Some(arg) = &arg {
            args.push(arg.as_bytes());
        }
        let call_ns = self.clock.now_ns();
        let executed = self.session.execute(&args, Instant::now() + self.cfg.op_timeout);
        let return_ns = self.clock.now_ns();
        let (outcome, result, error) = match executed {
            Executed::Done(reply) => match result_of(op, reply) {
                Ok(value) => (Outcome::Ok, value, None),
                Err(e) => {
                    self.unexpected_replies += 1;
                    (Outcome::Info, Value::Null, Some(e.to_string()))
                }
            },
            Executed::Failed(text) => (Outcome::Fail, Value::Null, Some(text)),
            Executed::Unknown(text) => (Outcome::Info, Value::Null, Some(text)),
        };
        OpRecord { client: self.id, op, key, arg, call_ns, return_ns, outcome, result, error }
    }

    fn remember_or_corrupt(&mut self, record: &mut OpRecord) {
        let value = record.result.clone();
        match self.seen.get_mut(&record.key) {
            Some((older, newer)) if *newer != value => *older = Some(std::mem::replace(newer, value)),
            Some(_) => {}
            None => {
                self.seen.insert(record.key.clone(), (None, value));
            }
        }
        if self.cfg.corrupt_reads > 0.0 && self.rng.random_bool(self.cfg.corrupt_reads.min(1.0)) {
            // This client read `older` and then `newer`; claiming `older` now is a stale read.
            if let Some((Some(older), _)) = self.seen.get(&record.key) {
                record.result = older.clone();
            }
        }
    }
}

/// A reply that no correct server gives to the operation (a server bug the checker cannot see).
#[derive(Debug, PartialEq, thiserror::Error)]
enum UnexpectedReply {
    #[error("GET returned a value we never wrote (not UTF-8)")]
    NotUtf8,
    #[error("unexpected reply to {op:?}: {reply:?}")]
    Other { op: OpKind, reply: Reply },
}

/// The history's `result` for a reply, or why the reply is not one `op` can get.
fn result_of(op: OpKind, reply: Reply) -> Result<Value, UnexpectedReply> {
    match (op, reply) {
        (OpKind::Get, Reply::Bulk(None)) => Ok(Value::Null),
        (OpKind::Get, Reply::Bulk(Some(bytes))) => {
            String::from_utf8(bytes).map(Value::String).map_err(|_| UnexpectedReply::NotUtf8)
        }
        (OpKind::Set, Reply::Simple(s)) if s == "OK" => Ok(Value::String(s)),
        (OpKind::Incr | OpKind::Append | OpKind::Del, Reply::Integer(n)) => Ok(Value::from(n)),
        (op, reply) => Err(UnexpectedReply::Other { op, reply }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_each_kind() {
        assert_eq!(keys(2), ["r0", "r1", "c0", "c1", "a0", "a1"]);
        assert_eq!(KeyKind::of("c1"), Some(KeyKind::Counter));
        assert_eq!(KeyKind::of("x"), None);
    }

    #[test]
    fn replies_map_to_results() {
        assert_eq!(result_of(OpKind::Get, Reply::Bulk(None)), Ok(Value::Null));
        assert_eq!(result_of(OpKind::Get, Reply::Bulk(Some(b"v".to_vec()))), Ok(Value::from("v")));
        assert_eq!(result_of(OpKind::Incr, Reply::Integer(3)), Ok(Value::from(3)));
        assert_eq!(result_of(OpKind::Set, Reply::Simple("OK".into())), Ok(Value::from("OK")));
        assert_eq!(
            result_of(OpKind::Set, Reply::Integer(1)),
            Err(UnexpectedReply::Other { op: OpKind::Set, reply: Reply::Integer(1) })
        );
        assert!(result_of(OpKind::Incr, Reply::Bulk(None)).is_err());
        assert_eq!(result_of(OpKind::Get, Reply::Bulk(Some(vec![0xff]))), Err(UnexpectedReply::NotUtf8));
    }
}
