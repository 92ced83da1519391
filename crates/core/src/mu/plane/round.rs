//! A quorum round: one batch of operations posted to some followers, done when a majority of
//! the cluster (the leader's own part included) has acknowledged it (Mu §4.1: "wait for a
//! majority only").

use microrep_fabric::NodeId;
use smallvec::SmallVec;

use crate::mu::membership::MemberSet;

/// A round's followers: inline up to 8, so that a round of a small cluster allocates nothing
/// (one round per commit on the replication hot path).
pub(super) type Peers = SmallVec<[NodeId; 8]>;

/// The followers' answers to one round.
#[derive(Clone, Debug)]
pub(super) struct Round {
    /// Work-request id carried by the round's signaled operations.
    pub(super) id: u64,
    /// Followers the round was posted to.
    posted: Peers,
    /// Followers whose operations all succeeded, in completion order.
    pub(super) acked: Peers,
    /// When it was posted.
    pub(super) started_ns: u64,
    /// `posted` and `acked` as sets: an ack is recorded in constant time (a round of a
    /// 105-replica group takes 104 acks; searching the lists made each commit quadratic).
    posted_set: MemberSet,
    acked_set: MemberSet,
}

impl Round {
    /// A round with id `id` posted to `posted` at `now`.
    pub(super) fn new(id: u64, posted: Peers, now: u64) -> Self {
        let mut posted_set = MemberSet::default();
        for &p in &posted {
            posted_set.insert(p);
        }
        Self { id, posted, acked: Peers::new(), started_ns: now, posted_set, acked_set: MemberSet::default() }
    }

    /// Whether the round was posted to `peer` (and `peer` was not dropped from it since).
    pub(super) fn posted_to(&self, peer: NodeId) -> bool {
        self.posted_set.contains(peer)
    }

    /// Drops `peer` (failed) from the followers the round waits on.
    pub(super) fn drop_peer(&mut self, peer: NodeId) {
        self.posted.retain(|p| *p != peer);
        self.posted_set.remove(peer);
    }

    /// Records a success of `peer` for this round.
    pub(super) fn ack(&mut self, peer: NodeId) {
        if self.posted_set.contains(peer) && !self.acked_set.contains(peer) {
            self.acked_set.insert(peer);
            self.acked.push(peer);
        }
    }

    /// The followers the round waits on.
    pub(super) fn posted(&self) -> &[NodeId] {
        &self.posted
    }
}
