//! Requests queued for replication: a client's, and membership changes (`crate::mu::membership`).

use microrep_fabric::Endpoint;

use super::ReplicationPlane;
use super::term::{Phase, Proposal};
use crate::mu::api::ProposeError;
use crate::mu::membership::{self, MembershipChange};
use crate::mu::slot::{EntryKind, Frame};

impl<E: Endpoint> ReplicationPlane<E> {
    /// Queues a request if this replica leads (or is about to).
    pub fn propose(&mut self, request_id: u64, payload: &[u8]) -> Result<(), ProposeError> {
        self.check_proposal(payload.len())?;
        let payload = self.spare_payloads.copy(payload);
        self.term.pending.push_back(Proposal { request_id, kind: EntryKind::Normal, payload });
        Ok(())
    }

    /// As [`Self::propose`], keeping `payload`'s buffer instead of copying it: the entry is
    /// sealed around the payload where it is and written to the logs from there.
    pub fn propose_framed(&mut self, request_id: u64, payload: Frame) -> Result<(), ProposeError> {
        self.check_proposal(payload.payload().len())?;
        self.term.pending.push_back(Proposal { request_id, kind: EntryKind::Normal, payload });
        Ok(())
    }

    /// Whether a request of `len` bytes may be queued now.
    fn check_proposal(&self, len: usize) -> Result<(), ProposeError> {
        if matches!(self.term.phase, Phase::Follower) {
            return Err(ProposeError::NotLeader { leader: self.leader });
        }
        let max = self.config.max_payload_bytes();
        if len > max {
            return Err(ProposeError::TooLarge { len, max });
        }
        if self.term.pending.len() >= self.config.max_pending {
            return Err(ProposeError::Backlogged { pending: self.term.pending.len() });
        }
        if let Some(state) =
            self.replay.snapshot_overflow().filter(|_| self.term.fuo >= self.tail + self.layout.log_slots())
        {
            return Err(ProposeError::StateTooLarge { state, limit: self.layout.snapshot_bytes() as usize });
        }
        Ok(())
    }

    /// Queues a membership change (see `membership`) if this replica leads, the change makes
    /// sense in the configuration it applied, no other change is queued or under way, and an
    /// added replica is a promoted follower this leader confirmed (caught up: it votes only
    /// then). The change commits as request `request_id`.
    pub fn propose_membership(&mut self, request_id: u64, change: MembershipChange) -> Result<(), ProposeError> {
        let refuse = |why: String| Err(ProposeError::Membership(why));
        if matches!(self.term.phase, Phase::Follower) {
            return Err(ProposeError::NotLeader { leader: self.leader });
        }
        if let Some(why) = self.configuration.refuses(change, self.config.replicas) {
            return refuse(why);
        }
        if self.term.pending.iter().any(|p| p.kind == EntryKind::Membership)
            || self.term.fuo < self.term.config_known_from
        {
            return refuse("another membership change is under way".into());
        }
        let new_term_due = self.term.term_epoch != self.configuration.epoch
            && !self.config.bug(crate::mu::planted::PlantedBug::KeepTermAcrossChange);
        if new_term_due || !matches!(self.role(), crate::mu::Role::Leader) {
            return refuse("this leader is still starting its term".into());
        }
        if let MembershipChange::Add(id) = change {
            if !self.live.contains(id) {
                return refuse(format!(
                    "replica {} is not live: its heartbeat does not advance (is it running?)",
                    id.0
                ));
            }
            if !self.term.confirmed.contains(&id) {
                return refuse(format!("replica {} is not a follower of this leader yet (is it running?)", id.0));
            }
            if self.term.standing.is_recovering(id) {
                return refuse(format!("replica {} is still catching up", id.0));
            }
        }
        if self.term.pending.len() >= self.config.max_pending {
            return Err(ProposeError::Backlogged { pending: self.term.pending.len() });
        }
        let payload = Frame::of(&membership::encode(change, self.configuration.epoch));
        self.term.pending.push_back(Proposal { request_id, kind: EntryKind::Membership, payload });
        Ok(())
    }
}
