//! Who may write this replica's own log locally.
//!
//! Remote writers are stopped by fabric permissions (Mu §5.2), but a leader writes its *own*
//! log with local stores that no permission check sees. The permission manager (background
//! plane) and the replicator (replication plane) may run on different threads, so they use the
//! same handshake as the shm fabric: the writer announces its write then checks ownership; the
//! manager changes ownership then waits for an announced write to finish. Either the writer sees
//! the change or the manager sees the write (sequentially consistent order). Its schedules are
//! explored by `tests/gate_shuttle.rs` (feature `shuttle`).

use std::sync::Arc;
#[cfg(not(feature = "shuttle"))]
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(feature = "shuttle")]
use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use microrep_fabric::NodeId;

const NOBODY: u32 = u32::MAX;

/// Shared between the planes of one replica.
#[derive(Debug)]
pub struct LocalLogGate {
    owner: AtomicU32,
    writing: AtomicBool,
    /// Whether this replica's replication plane leads or tries to, with the proposal number of
    /// its term (0 while acquiring permissions): 0 for neither, else that number + 1. The
    /// background plane publishes it with its heartbeat, so that of two replicas that both
    /// claim to lead, everyone prefers the newer term.
    term: AtomicU64,
    /// The longest a peer the background plane holds live said it may rest between heartbeats
    /// (see `mu::pace`): a would-be leader waits this much longer for permission acks.
    peers_rest_ns: AtomicU64,
}

impl LocalLogGate {
    /// A gate owned by nobody.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            owner: AtomicU32::new(NOBODY),
            writing: AtomicBool::new(false),
            term: AtomicU64::new(0),
            peers_rest_ns: AtomicU64::new(0),
        })
    }

    /// Records how much later than usual a peer may serve a permission request: the longest
    /// rest between heartbeats a live peer announced (the background plane, see `mu::pace`).
    pub fn set_peers_rest_ns(&self, ns: u64) {
        if self.peers_rest_ns.load(Ordering::Relaxed) != ns {
            self.peers_rest_ns.store(ns, Ordering::Relaxed);
        }
    }

    /// What [`Self::set_peers_rest_ns`] recorded last.
    pub fn peers_rest_ns(&self) -> u64 {
        self.peers_rest_ns.load(Ordering::Relaxed)
    }

    /// Records that this replica leads the term numbered `Some(prop_nr)` (`Some(0)`: it is
    /// acquiring permissions), or that it neither leads nor tries to (`None`).
    pub fn set_claim(&self, claim: Option<u64>) {
        self.term.store(claim.map_or(0, |t| t + 1), Ordering::Release);
    }

    /// What [`Self::set_claim`] recorded last.
    pub fn claim(&self) -> Option<u64> {
        self.term.load(Ordering::Acquire).checked_sub(1)
    }

    /// Runs `write` if `me` owns the log; returns whether it ran.
    pub fn write_if_owner(&self, me: NodeId, write: impl FnOnce()) -> bool {
        self.writing.store(true, Ordering::SeqCst);
        let owns = self.owner.load(Ordering::SeqCst) == u32::from(me.0);
        if owns {
            write();
        }
        self.writing.store(false, Ordering::Release);
        owns
    }

    /// Hands the log to `owner`; on return no write of a previous owner is under way.
    pub fn set_owner(&self, owner: NodeId) {
        self.owner.store(u32::from(owner.0), Ordering::SeqCst);
        while self.writing.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
    }

    /// The current owner.
    pub fn owner(&self) -> Option<NodeId> {
        let owner = self.owner.load(Ordering::Acquire);
        (owner != NOBODY).then_some(NodeId(owner as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_writes() {
        let gate = LocalLogGate::new();
        assert!(!gate.write_if_owner(NodeId(1), || panic!("nobody owns the log yet")));
        gate.set_owner(NodeId(1));
        let mut wrote = false;
        assert!(gate.write_if_owner(NodeId(1), || wrote = true));
        assert!(wrote);
        gate.set_owner(NodeId(2));
        assert!(!gate.write_if_owner(NodeId(1), || panic!("ownership moved")));
        assert_eq!(gate.owner(), Some(NodeId(2)));
    }
}
