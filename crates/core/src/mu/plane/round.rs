//! A quorum round: one batch of operations posted to some followers, done when a majority of
//! the cluster (the leader's own part included) has acknowledged it (Mu §4.1: "wait for a
//! majority only").

use microrep_fabric::NodeId;
use smallvec::SmallVec;

use super::standing::Quorum;
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

    /// Whether the leader plus the acknowledging followers make a quorum.
    pub(super) fn has_majority(&self, quorum: &Quorum<'_>) -> bool {
        quorum.reached(&self.acked)
    }

    /// Whether a quorum can no longer be reached with the followers still pending.
    pub(super) fn is_lost(&self, dropped: &[NodeId], quorum: &Quorum<'_>) -> bool {
        let still_possible: Peers = self.posted.iter().copied().filter(|p| !dropped.contains(p)).collect();
        !quorum.reached(&still_possible)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_4_1_majority_includes_the_leader() {
        let none = std::collections::BTreeMap::new();
        let q = Quorum::new(crate::mu::MemberSet::first(5), &none, None);
        let mut r = Round::new(1, smallvec::smallvec![NodeId(1), NodeId(2), NodeId(3), NodeId(4)], 0);
        assert!(!r.has_majority(&q));
        r.ack(NodeId(3));
        r.ack(NodeId(3));
        assert!(!r.has_majority(&q), "duplicate acks count once");
        r.ack(NodeId(9));
        assert!(!r.has_majority(&q), "acks from followers not in the round do not count");
        r.ack(NodeId(1));
        assert!(r.has_majority(&q));
        assert!(!r.is_lost(&[NodeId(2)], &q));
        assert!(r.is_lost(&[NodeId(1), NodeId(2), NodeId(3), NodeId(4)], &q));
    }

    #[test]
    fn followers_that_are_not_members_never_count() {
        let none = std::collections::BTreeMap::new();
        let members: crate::mu::MemberSet = [NodeId(0), NodeId(1), NodeId(2)].into_iter().collect();
        let q = Quorum::new(members, &none, None);
        let mut r = Round::new(1, smallvec::smallvec![NodeId(1), NodeId(3), NodeId(4)], 0);
        r.ack(NodeId(3));
        r.ack(NodeId(4));
        assert!(!r.has_majority(&q), "two joiners acked: no member did");
        r.ack(NodeId(1));
        assert!(r.has_majority(&q));
    }
}
