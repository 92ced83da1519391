//! A replicated book in one process: every replica a `microrep::Node` on the shm fabric, for
//! the benchmark and the tests. Dropped, it stops the nodes and removes its shm segments.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use microrep::config::{AttachMode, ClusterConfig, NodeConfig};
use microrep::{Config, Index, Node, ProposeError, StartError};

use crate::command::{Command, DecodeError, Outcome};
use crate::machine::ReplicatedBook;

/// Why a command got no outcome.
#[derive(Debug, thiserror::Error)]
pub enum ProposeFailure {
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("no replica led within {0:?}")]
    NoLeader(Duration),
    #[error("the reply does not decode: {0}")]
    Reply(#[from] DecodeError),
}

/// The replicas of one book.
#[derive(Debug)]
pub struct LocalCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
    /// The replica that led last.
    leader: usize,
}

impl LocalCluster {
    /// Starts `replicas` replicas named `name` (their shm segments under /dev/shm), in attach
    /// `mode`, with heartbeats every `heartbeat_us` (the runtime's default is 1000; tests on a
    /// busy machine use longer ones so that a descheduled replica is rarely suspected).
    pub fn start(name: &str, replicas: u16, mode: AttachMode, heartbeat_us: u64) -> Result<Self, StartError> {
        let mut config = ClusterConfig::local(name, replicas, 1);
        config.timing.heartbeat_us = heartbeat_us;
        let dir = microrep_shm_dir(name);
        config.shm_dir = Some(dir.clone());
        let mut cluster = Self { nodes: Vec::new(), dir, leader: 0 };
        for id in 0..replicas {
            let node = NodeConfig { mode, ..NodeConfig::new(id) };
            let config = Config { cluster: config.clone(), node };
            cluster.nodes.push(microrep::start_on_shm(&config, ReplicatedBook::default())?);
        }
        Ok(cluster)
    }

    /// Waits (at most `patience`) until a replica leads; its index.
    pub fn await_leader(&mut self, patience: Duration) -> Option<usize> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(i) = self.nodes.iter().position(|n| n.leader() == Some(n.id())) {
                self.leader = i;
                return Some(i);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// Proposes `command` at the replica that leads, following a redirect once a leader is
    /// known again; an outcome that may or may not have committed is an error. Returns where
    /// it committed and what the book did.
    pub fn propose(&mut self, command: &Command) -> Result<(Index, Outcome), ProposeFailure> {
        let bytes = command.encode();
        loop {
            match self.nodes[self.leader].propose(&bytes) {
                Ok(committed) => return Ok((committed.index, Outcome::decode(&committed.reply)?)),
                Err(ProposeError::NotLeader { .. }) => {
                    let patience = Duration::from_secs(5);
                    self.await_leader(patience).ok_or(ProposeFailure::NoLeader(patience))?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Each replica's (entries applied, digest), to compare replicas.
    pub fn digests(&self) -> Vec<(u64, Option<String>)> {
        self.nodes.iter().map(|n| n.status()).map(|s| (s.applied, s.digest)).collect()
    }
}

fn microrep_shm_dir(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(format!("microrep-{name}"))
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in self.nodes.drain(..) {
            node.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
