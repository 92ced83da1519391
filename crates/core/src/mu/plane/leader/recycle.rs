//! Log recycling (Mu §5.3): the leader reads its confirmed followers' heads and frees the log
//! up to what a majority (itself included) applied, within its own snapshot.

use microrep_fabric::{Endpoint, Fabric, NodeId, RemoteAddr};

use super::super::ReplicationPlane;
use super::term::Phase;
use crate::mu::layout;

impl<E: Endpoint> ReplicationPlane<E> {
    /// Mu §5.3 recycling, first step: READ every confirmed follower's head.
    pub(super) fn start_read_heads<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let confirmed = self.term.confirmed.clone();
        let src = RemoteAddr::new(layout::CONTROL, layout::HEAD);
        let round = self.read_word_round(fabric, now, &confirmed, src, layout::SCRATCH_HEAD);
        self.term.phase = Phase::ReadHeads { round };
    }

    /// Recycles up to the head that a majority (this replica included) has applied, bounded by
    /// this replica's snapshot so a follower left behind can always restore one. Followers below
    /// the new tail leave the confirmed set; they catch up by snapshot and rejoin by growing.
    /// With `recycle_wait_ns`, also bounded by every confirmed follower's head (the last one
    /// read: a lower bound, zeroed when it joins), unless the log is full and the slowest head
    /// has not moved for that long.
    ///
    /// Unlike Mu, recycled slots are not zeroed: every slot carries its absolute index under the
    /// checksum, so an older lap's entry never passes for a newer one, and a reused slot is
    /// rewritten whole. Zeroing would even be unsafe here: after a leader change the physical
    /// slot of a recycled index may already hold a newer index (docs/ARCHITECTURE.md).
    pub(super) fn finish_recycle<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, acked: &[NodeId]) {
        let waiting = self.config.recycle_wait_ns > 0;
        let read = if waiting { &self.term.confirmed[..] } else { acked };
        let mut heads: Vec<(u64, NodeId)> =
            read.iter().map(|&p| (self.word(fabric, p, layout::SCRATCH_HEAD), p)).collect();
        heads.push((self.replay.applied(), self.me));
        heads.sort_unstable_by(|a, b| b.cmp(a));
        // Only members count toward the majority that must hold what is recycled.
        let members = self.configuration.members;
        let member_heads: Vec<u64> = heads.iter().filter(|&&(_, p)| members.contains(p)).map(|&(h, _)| h).collect();
        let majority_head = member_heads[(members.majority() - 1).min(member_heads.len() - 1)];
        let mut new_tail = majority_head.min(self.replay.snapshot_index()).min(self.term.fuo);
        let slowest = heads.last().map_or(self.replay.applied(), |h| h.0);
        if waiting {
            if slowest != self.term.slowest_head.0 {
                self.term.slowest_head = (slowest, now);
            }
            let full = self.term.fuo >= self.tail + self.layout.log_slots();
            if !full || now.saturating_sub(self.term.slowest_head.1) <= self.config.recycle_wait_ns {
                new_tail = new_tail.min(slowest);
            }
        } else {
            // Slack for a follower that answered but is behind: recycle no further than half
            // a log below the FUO. Under a steady stream a follower the scheduler kept waiting
            // for a moment otherwise found the tail past its head at every lag check (the tail
            // follows the snapshots, every `snapshot_every` entries) and restored snapshot
            // after snapshot without ever catching up. Recycling less is always safe.
            new_tail = new_tail.min(slowest.max(self.term.fuo.saturating_sub(self.layout.log_slots() / 2)));
        }
        if new_tail > self.tail {
            tracing::trace!(node = self.me.0, from = self.tail, to = new_tail, fuo = self.term.fuo, "recycle");
            self.term.confirmed.retain(|p| heads.iter().any(|&(h, q)| q == *p && h >= new_tail));
            self.raise_tail(fabric, new_tail);
        } else if self.term.fuo >= self.tail + self.layout.log_slots() {
            // Still full: retry from idle, without a prepare for every try, and after trying to
            // grow the confirmed set (a follower that joins may give the majority that frees it).
            self.term.phase = Phase::Idle;
            return;
        }
        self.next_proposal(fabric, now);
    }
}
