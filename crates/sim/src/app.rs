//! The replicated application of the simulation: a small key-value register store whose every
//! application is checked online against the cluster-wide record of what each log index holds.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use microrep_core::mu::{RestoreError, StateMachine};
use microrep_fabric::NodeId;

use crate::check::Ledger;

/// A client operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Sets `key` to `value`; answers the previous value.
    Put {
        /// Register.
        key: u8,
        /// New value.
        value: u64,
    },
    /// Answers the value of `key` (0 if never set).
    Get {
        /// Register.
        key: u8,
    },
}

/// A command as it travels through the log: who asked, their sequence number, the operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Command {
    /// The client.
    pub client: u32,
    /// The client's operation number.
    pub seq: u64,
    /// The operation.
    pub op: Op,
}

impl Command {
    /// Encodes to 22 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(22);
        b.extend_from_slice(&self.client.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        match self.op {
            Op::Put { key, value } => {
                b.extend_from_slice(&[1, key]);
                b.extend_from_slice(&value.to_le_bytes());
            }
            Op::Get { key } => b.extend_from_slice(&[2, key, 0, 0, 0, 0, 0, 0, 0, 0]),
        }
        b
    }

    /// Decodes what `encode` produced.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 22 {
            return None;
        }
        let client = u32::from_le_bytes(b[0..4].try_into().ok()?);
        let seq = u64::from_le_bytes(b[4..12].try_into().ok()?);
        let op = match b[12] {
            1 => Op::Put { key: b[13], value: u64::from_le_bytes(b[14..22].try_into().ok()?) },
            2 => Op::Get { key: b[13] },
            _ => return None,
        };
        Some(Self { client, seq, op })
    }
}

/// The sequential specification: applies `op` to `state` and returns the answer.
pub fn execute(state: &mut BTreeMap<u8, u64>, op: Op) -> u64 {
    match op {
        Op::Put { key, value } => state.insert(key, value).unwrap_or(0),
        Op::Get { key } => state.get(&key).copied().unwrap_or(0),
    }
}

/// One replica's copy of the application.
#[derive(Debug)]
pub struct KvApp {
    node: NodeId,
    state: BTreeMap<u8, u64>,
    next_index: u64,
    ledger: Rc<RefCell<Ledger>>,
    /// Answers to commands applied since the simulator last took them, by index.
    pub answers: Vec<(u64, u64)>,
}

impl KvApp {
    /// A fresh replica of the application reporting to `ledger`.
    pub fn new(node: NodeId, ledger: Rc<RefCell<Ledger>>) -> Self {
        Self { node, state: BTreeMap::new(), next_index: 0, ledger, answers: Vec::new() }
    }

    /// The next index this copy will apply.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// A digest of the state (to compare replicas).
    pub fn digest(&self) -> u64 {
        let mut bytes = Vec::new();
        self.snapshot(&mut bytes);
        u64::from(microrep_fabric::checksum::crc32c(&bytes))
    }
}

impl StateMachine for KvApp {
    fn apply(&mut self, index: u64, command: &[u8]) {
        self.ledger.borrow_mut().applied(self.node, index, self.next_index, command);
        self.next_index = index + 1;
        if let Some(c) = Command::decode(command) {
            let answer = execute(&mut self.state, c.op);
            self.answers.push((index, answer));
        }
    }

    fn skip(&mut self, index: u64) {
        self.ledger.borrow_mut().applied(self.node, index, self.next_index, &[]);
        self.next_index = index + 1;
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.next_index.to_le_bytes());
        for (k, v) in &self.state {
            out.push(*k);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn restore(&mut self, index: u64, snapshot: &[u8]) -> Result<(), RestoreError> {
        if snapshot.len() < 8 || !(snapshot.len() - 8).is_multiple_of(9) {
            return Err(RestoreError::Length { got: snapshot.len(), expected: "8 + 9n bytes" });
        }
        let at = u64::from_le_bytes(snapshot[..8].try_into().expect("8 bytes"));
        if at != index {
            return Err(RestoreError::Index { taken: at, at: index });
        }
        self.state = snapshot[8..]
            .chunks_exact(9)
            .map(|c| (c[0], u64::from_le_bytes(c[1..9].try_into().expect("8 bytes"))))
            .collect();
        self.ledger.borrow_mut().restored(self.node, index, self.next_index);
        self.next_index = index;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        for op in [Op::Put { key: 3, value: u64::MAX }, Op::Get { key: 200 }] {
            let c = Command { client: 7, seq: 99, op };
            assert_eq!(Command::decode(&c.encode()), Some(c));
        }
        assert_eq!(Command::decode(&[0; 21]), None);
    }

    #[test]
    fn snapshots_restore_the_same_state() {
        let ledger = Rc::new(RefCell::new(Ledger::default()));
        let mut a = KvApp::new(NodeId(0), ledger.clone());
        for (i, v) in [5u64, 6, 7].iter().enumerate() {
            a.apply(i as u64, &Command { client: 1, seq: i as u64, op: Op::Put { key: *v as u8, value: *v } }.encode());
        }
        let mut snap = Vec::new();
        a.snapshot(&mut snap);
        let mut b = KvApp::new(NodeId(1), ledger);
        b.restore(3, &snap).expect("restore");
        assert_eq!(a.digest(), b.digest());
        assert_eq!(b.next_index(), 3);
        assert!(b.restore(4, &snap).is_err(), "index mismatch is refused");
    }

    #[test]
    fn a_restarted_replica_starts_over_from_a_snapshot_or_from_index_zero() {
        let ledger = Rc::new(RefCell::new(Ledger::default()));
        let commands: Vec<Command> =
            (0..4).map(|seq| Command { client: 1, seq, op: Op::Put { key: 1, value: seq } }).collect();
        let mut old_life = KvApp::new(NodeId(0), ledger.clone());
        for (i, c) in commands.iter().enumerate() {
            ledger.borrow_mut().issue(*c);
            old_life.apply(i as u64, &c.encode());
        }
        let mut snap = Vec::new();
        old_life.snapshot(&mut snap);
        let mut restored = KvApp::new(NodeId(0), ledger.clone());
        restored.restore(4, &snap).expect("restore");
        let mut replayed = KvApp::new(NodeId(0), ledger.clone());
        for (i, c) in commands.iter().enumerate() {
            replayed.apply(i as u64, &c.encode());
        }
        assert!(ledger.borrow().violations.is_empty(), "{:?}", ledger.borrow().violations);
        assert_eq!(restored.digest(), old_life.digest());
        assert_eq!(replayed.digest(), old_life.digest());
        let mut skipping = KvApp::new(NodeId(0), ledger.clone());
        skipping.apply(2, &commands[2].encode());
        assert!(ledger.borrow().violations[0].starts_with("no holes"), "a new life must not skip ahead unrestored");
    }
}
