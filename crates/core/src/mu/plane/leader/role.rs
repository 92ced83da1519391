//! Role changes of the leader's state machine: stepping down, aborting an attempt, and a
//! follower's failure during a term.

use microrep_fabric::{Endpoint, Fabric, NodeId, OpError, RemoteAddr};

use super::ReplicationPlane;
use super::term::Phase;
use crate::mu::api::Event;
use crate::mu::layout;
use crate::mu::slot::EntryKind;

impl<E: Endpoint> ReplicationPlane<E> {
    /// Gives up leading: queued requests fail, and the permission request is withdrawn (a
    /// request still on its way, from a leader paused long enough to be replaced, would
    /// otherwise take a follower's log from the successor once it lands and is served).
    pub(in crate::mu::plane) fn step_down<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        tracing::debug!(node = self.me.0, "stepping down");
        let at = RemoteAddr::new(layout::CONTROL, self.layout.request_offset(self.me));
        layout::store_own(fabric, layout::CONTROL, at.offset, 0);
        let peers: Vec<NodeId> = self.links.peers().collect();
        for peer in peers {
            self.write_untracked(fabric, now, peer, at, &0u64.to_le_bytes());
        }
        let front_written = self.term.front_written;
        for (i, p) in self.term.pending.drain(..).enumerate().filter(|(_, p)| p.kind != EntryKind::Noop) {
            self.events.push(Event::Failed { request_id: p.request_id, maybe_committed: i == 0 && front_written });
            if i == 0 && front_written {
                self.awaiting_apply.insert(p.request_id);
            }
        }
        self.term.front_written = false;
        self.gate.set_claim(None);
        self.term.phase = Phase::Follower;
        self.term.confirmed.clear();
        self.term.standing.clear();
        self.term.walk_ended_at = None;
    }

    /// Abandons the current attempt and asks for permissions again (Listing 2: "abort"), once
    /// the failure detector has a view formed after the failure that still chooses this
    /// replica ([`Phase::Reacquire`]).
    ///
    /// A request already written to some log is not proposed again: another leader may adopt
    /// it from there and commit it (Listing 2 line 24), possibly where this replica never looks
    /// (it may restore a snapshot past it), so proposing it anew could commit it twice. Its
    /// outcome is reported unknown; a `Committed` event follows if it is applied here.
    pub(super) fn abort(&mut self, why: &str) {
        tracing::debug!(node = self.me.0, why, "leader attempt aborted");
        if self.term.front_written {
            if let Some(p) = self.term.pending.pop_front().filter(|p| p.kind != EntryKind::Noop) {
                self.events.push(Event::Failed { request_id: p.request_id, maybe_committed: true });
                self.awaiting_apply.insert(p.request_id);
            }
            self.term.front_written = false;
        }
        self.gate.set_claim(None);
        self.term.phase = Phase::Reacquire { after_round: self.rounds + 3 };
    }

    /// An operation to `peer` failed while this replica leads or tries to: a lost permission
    /// ends the attempt, a failed follower leaves the confirmed set, and the attempt ends if
    /// no quorum is left.
    pub(in crate::mu::plane) fn leader_peer_failed<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        peer: NodeId,
        error: OpError,
    ) {
        match self.term.phase {
            Phase::Follower | Phase::Acquire { .. } | Phase::Reacquire { .. } => {}
            _ if error == OpError::PermissionDenied && self.term.confirmed.contains(&peer) => {
                // Another replica holds this follower's log: someone else leads (Mu §5.2).
                self.abort("permission lost");
            }
            _ => {
                self.term.confirmed.retain(|&p| p != peer);
                // Its grant may be gone with it (a restarted process grants nobody): forget
                // its ack, so that growing it back starts with a new permission request.
                layout::store_own(fabric, layout::CONTROL, self.layout.ack_offset(peer), 0);
                self.forget_durable(fabric, peer);
                if matches!(self.term.phase, Phase::Grow { peer: growing, .. } if growing == peer) {
                    // Only that follower failed to join; the term goes on without it.
                    self.term.phase = Phase::Idle;
                    return;
                }
                let lost = self.term.round_mut().is_some_and(|r| r.posted_to(peer));
                let members = self.quorum_members();
                let quorum = self.term.standing.quorum(&self.config, members);
                if !quorum.reached(&self.term.confirmed)
                    || (lost && self.term.phase.round_mut().is_some_and(|r| quorum.lost(r, &[peer])))
                {
                    self.abort("majority lost");
                } else if let Some(round) = self.term.round_mut() {
                    round.drop_peer(peer);
                }
            }
        }
    }
}
