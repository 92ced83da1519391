//! Growing the confirmed set (Mu §4.2): a follower that acked the leader's permission request
//! late joins the followers every accept writes to once its log is brought up to date.

use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RemoteAddr};

use super::super::ReplicationPlane;
use super::term::Phase;
use super::{read_history, read_incarnation};
use crate::mu::layout;
use crate::mu::planted::PlantedBug;

impl<E: Endpoint> ReplicationPlane<E> {
    /// Mu §4.2 grow confirmed followers: a follower that acked late joins once its log is
    /// brought up to date.
    pub(super) fn start_grow<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, peer: NodeId) {
        // Its earlier failure was processed (it left the confirmed set), so reuse is safe.
        self.links.reconnect(fabric, peer, now);
        self.forget_head(fabric, peer);
        if self.links.ready(fabric, peer, now).is_none() {
            // Unreachable (it may have died since it acked): try again later.
            return;
        }
        let (layout, id, durable) = (self.layout, self.round_id(), self.config.durable);
        let posted = self.post_to(fabric, now, &[peer], id, |ep, peer, id| {
            let fuo = RemoteAddr::new(layout::LOG, layout::FUO);
            let fuo_at = layout.scratch(peer, layout::SCRATCH_FUO);
            // No promise is written here: the prepare that follows the grow reads the joiner's
            // minProposal first and writes a higher one (a blind write could lower it).
            let tail = RemoteAddr::new(layout::CONTROL, layout::TAIL);
            let tail_at = layout.scratch(peer, layout::SCRATCH_TAIL);
            read_incarnation(ep, &layout, peer)
                && (!durable || read_history(ep, &layout, peer))
                && ep.post_read(0, tail, 8, layout::SCRATCH, tail_at, PostFlags::NONE).is_ok()
                && ep.post_read(id, fuo, 8, layout::SCRATCH, fuo_at, PostFlags::SIGNALED).is_ok()
        });
        let round = self.new_round(posted, now);
        self.term.phase = Phase::Grow { round, peer };
    }

    /// The joiner's log may hold what this term's prepare walk never read: a rival leader's
    /// entries, committed on a majority that included it. So a grown follower always makes the
    /// next proposal prepare again (A.4.4, A.4.5(b)); and a joiner that knows more entries
    /// committed than this leader does (its FUO is ahead) is caught up from first (§4.2 leader
    /// catch-up), before anything is proposed.
    pub(super) fn finish_grow<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, peer: NodeId) {
        let their_fuo = self.word(fabric, peer, layout::SCRATCH_FUO);
        tracing::trace!(node = self.me.0, peer = peer.0, their_fuo, fuo = self.term.fuo, "grow");
        if self.term.confirmed.contains(&peer) {
            return self.next_proposal(fabric, now);
        }
        if self.config.bug(PlantedBug::GrowWithoutPrepare) {
            if their_fuo >= self.term.fuo || self.copy_log_to(fabric, now, peer, their_fuo) {
                self.term.confirmed.push(peer);
                self.brought_up_to_date(fabric, peer);
            }
            return self.next_proposal(fabric, now);
        }
        self.term.walk_ended_at = None;
        if self.of_another_history(fabric, peer) {
            if self.adopt_into_history(fabric, now, peer) {
                self.term.confirmed.push(peer);
                self.brought_up_to_date(fabric, peer);
                tracing::debug!(node = self.me.0, peer = peer.0, "a follower of another history rewritten and added");
            }
            return self.next_proposal(fabric, now);
        }
        if their_fuo > self.term.fuo {
            self.term.confirmed.push(peer);
            tracing::debug!(node = self.me.0, peer = peer.0, their_fuo, "joiner ahead: catching up from it");
            return self.catch_up_from(fabric, now, Some((their_fuo, peer)));
        }
        if their_fuo == self.term.fuo || self.copy_log_to(fabric, now, peer, their_fuo) {
            self.term.confirmed.push(peer);
            self.brought_up_to_date(fabric, peer);
            tracing::debug!(node = self.me.0, peer = peer.0, "confirmed follower added");
        }
        self.next_proposal(fabric, now);
    }
}
