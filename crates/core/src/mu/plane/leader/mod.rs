//! The leader's sub-machine (Mu §4.1 Listing 2, §4.2): permission acquisition, prepare,
//! accept and omit-prepare here, each a phase of [`Phase`] advanced by `drive_leader`; leader
//! catch-up and update followers in `catch_up`, growing the confirmed set in `grow`, recycling
//! the log in `recycle`, queued requests in `propose`, stepping down and aborting in `role`,
//! standing and promotion in `standing`. Its state, [`Term`], is visible to these modules only.

use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RemoteAddr};

mod catch_up;
mod grow;
mod propose;
mod recycle;
mod role;
mod standing;
mod term;

pub(super) use term::Term;

use super::{ReplicationPlane, read_entry};
use crate::mu::layout;
use crate::mu::membership::MemberSet;
use crate::mu::planted::PlantedBug;
use crate::mu::slot::{self, Entry, EntryKind, Frame};
use term::{OwnedEntry, Phase};

/// A proposal number above `seen`, unique to `me` (the low byte is the replica id), or `None`
/// once the 24-bit round of the 32-bit ballot word is exhausted (see `slot`).
fn next_prop(seen: u64, me: NodeId) -> Option<u64> {
    Some((((seen >> 8) + 1) << 8) | u64::from(me.0)).filter(|&p| p <= slot::MAX_PROPOSAL)
}

/// Posts an unsignaled READ of `peer`'s incarnation into its SCRATCH word.
pub(super) fn read_incarnation<E: Endpoint>(ep: &mut E, layout: &layout::Layout, peer: NodeId) -> bool {
    let src = RemoteAddr::new(layout::CONTROL, layout::INCARNATION);
    ep.post_read(0, src, 8, layout::SCRATCH, layout.scratch(peer, layout::SCRATCH_INCARNATION), PostFlags::NONE).is_ok()
}

/// READs a follower's generation and head (the next index it applies), for
/// [`ReplicationPlane::of_another_history`]. The generation lands where the bootstrap round's
/// does: that round runs only while this replica follows, these only while it leads.
pub(super) fn read_history<E: Endpoint>(ep: &mut E, layout: &layout::Layout, peer: NodeId) -> bool {
    let generation = RemoteAddr::new(layout::CONTROL, layout::GENERATION);
    let head = RemoteAddr::new(layout::CONTROL, layout::HEAD);
    let at = |field| layout.scratch(peer, field);
    ep.post_read(0, generation, 8, layout::SCRATCH, at(layout::SCRATCH_BOOT_GENERATION), PostFlags::NONE).is_ok()
        && ep.post_read(0, head, 8, layout::SCRATCH, at(layout::SCRATCH_HEAD), PostFlags::NONE).is_ok()
}

impl<E: Endpoint> ReplicationPlane<E> {
    pub(super) fn word<F: Fabric<Endpoint = E>>(&self, fabric: &F, peer: NodeId, field: u64) -> u64 {
        fabric.load_u64(layout::SCRATCH, self.layout.scratch(peer, field)).unwrap_or(0)
    }

    pub(super) fn local_word<F: Fabric<Endpoint = E>>(
        fabric: &F,
        region: microrep_fabric::RegionId,
        offset: u64,
    ) -> u64 {
        fabric.load_u64(region, offset).unwrap_or(0)
    }

    /// Writes this replica's own log under the local-log gate; false if it lost the log (or
    /// the fabric refused the write, which would be a layout bug).
    pub(super) fn write_own_log<F: Fabric<Endpoint = E>>(&self, fabric: &F, offset: u64, data: &[u8]) -> bool {
        let mut written = false;
        let owner =
            self.gate.write_if_owner(self.me, || written = fabric.write_local(layout::LOG, offset, data).is_ok());
        debug_assert!(!owner || written, "a local log write inside the layout failed");
        owner && written
    }

    /// Mu §5.2: ask every replica (this one included) for exclusive write access to its log.
    pub(super) fn start_acquire<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        self.gate.set_claim(Some(0));
        self.term.request_no += 1;
        self.term.term_request = self.term.request_no;
        let request = self.term.request_no;
        let at = RemoteAddr::new(layout::CONTROL, self.layout.request_offset(self.me));
        layout::store_own(fabric, layout::CONTROL, at.offset, request);
        let peers: Vec<NodeId> = self.links.peers().collect();
        for peer in peers {
            // A new attempt starts from nothing: failed endpoints may be reused from here on.
            self.links.reconnect(fabric, peer, now);
            self.forget_head(fabric, peer);
            self.write_untracked(fabric, now, peer, at, &request.to_le_bytes());
        }
        self.term.confirmed.clear();
        self.term.standing.clear();
        self.term.walk_ended_at = None;
        self.term.slowest_head = (0, now);
        self.term.term_epoch = self.configuration.epoch;
        self.term.term_members = self.configuration.members;
        self.term.phase = Phase::Acquire { since_ns: now };
    }

    /// Zeroes the last head read from `peer`: a replica that restarted since has applied less.
    pub(super) fn forget_head<F: Fabric<Endpoint = E>>(&self, fabric: &F, peer: NodeId) {
        layout::store_own(fabric, layout::SCRATCH, self.layout.scratch(peer, layout::SCRATCH_HEAD), 0);
    }

    /// Advances the leader's current phase.
    pub(super) fn drive_leader<F, S>(&mut self, fabric: &F, now: u64, app: &mut S)
    where
        F: Fabric<Endpoint = E>,
        S: crate::mu::StateMachine,
    {
        // Followers compare their head with this to learn they need a snapshot, also while we
        // are still acquiring a majority that may need them.
        layout::store_own(fabric, layout::CONTROL, layout::TAIL, self.log_start());
        match &self.term.phase {
            Phase::Follower => {}
            &Phase::Reacquire { after_round } => {
                if self.rounds >= after_round {
                    self.start_acquire(fabric, now);
                }
            }
            Phase::Acquire { since_ns } => {
                let since = *since_ns;
                let ack = |p: NodeId| Self::local_word(fabric, layout::CONTROL, self.layout.ack_offset(p));
                let granted = |ack: u64| ack & !layout::ACK_RECOVERING >= self.term.term_request;
                if granted(ack(self.me)) {
                    let members = self.quorum_members();
                    let confirmed: Vec<(NodeId, u64)> =
                        self.links.peers().map(|p| (p, ack(p))).filter(|&(_, a)| granted(a)).collect();
                    let voters: Vec<NodeId> = confirmed
                        .iter()
                        .filter(|&&(p, a)| a & layout::ACK_RECOVERING == 0 && members.contains(p))
                        .map(|&(p, _)| p)
                        .collect();
                    let everyone = members.iter().all(|m| m == self.me || confirmed.iter().any(|&(p, _)| p == m));
                    let counted = if self.config.bug(PlantedBug::JoinerVotesEarly) {
                        confirmed.iter().map(|&(p, _)| p).collect()
                    } else {
                        voters.clone()
                    };
                    if self.quorum().reached(&counted) || everyone {
                        for &(peer, a) in &confirmed {
                            self.note_ack_standing(peer, a);
                        }
                        self.term.standing.heard_from_all(everyone.then_some(voters));
                        self.term.confirmed = confirmed.into_iter().map(|(p, _)| p).collect();
                        self.term.terms_led += 1;
                        self.start_catch_up(fabric, now);
                        return;
                    }
                }
                // A resting peer serves the request at its next tick (see `mu::pace`).
                if now.saturating_sub(since) > self.config.permission_timeout_ns + self.gate.peers_rest_ns() {
                    self.abort("permissions not granted in time");
                }
            }
            Phase::Idle => self.idle(fabric, now),
            &Phase::CatchUpWait { from, next, upto, since_ns } => {
                if self.copy_fits(next) {
                    self.start_copy(fabric, now, from, next, upto);
                } else if now.saturating_sub(since_ns) > self.config.round_timeout_ns {
                    self.abort("catch-up stalled");
                }
            }
            _ => {
                let single =
                    matches!(self.term.phase, Phase::CatchUpCopy { .. } | Phase::Restore { .. } | Phase::Grow { .. });
                let timeout = self.config.round_timeout_ns;
                let members = self.quorum_members();
                let quorum = self.term.standing.quorum(&self.config, members);
                let Some((done, timed_out)) = self.term.phase.round_mut().map(|r| {
                    let done = if single { !r.acked.is_empty() } else { quorum.holds(r) };
                    (done, now.saturating_sub(r.started_ns) > timeout)
                }) else {
                    return;
                };
                if done {
                    let phase = std::mem::replace(&mut self.term.phase, Phase::Idle);
                    self.finish(fabric, now, phase, app);
                } else if timed_out {
                    if let Phase::Grow { .. } = self.term.phase {
                        self.term.phase = Phase::Idle;
                    } else {
                        self.abort("round timed out");
                    }
                }
            }
        }
    }

    /// A round reached its quorum: act on what it read and start the next phase.
    fn finish<F, S>(&mut self, fabric: &F, now: u64, phase: Phase, app: &mut S)
    where
        F: Fabric<Endpoint = E>,
        S: crate::mu::StateMachine,
    {
        match phase {
            Phase::CatchUp { round } => self.finish_catch_up(fabric, now, &round.acked),
            Phase::CatchUpCopy { from, next, upto, count, .. } => {
                self.finish_copy(fabric, now, from, next, upto, count)
            }
            Phase::Restore { round } => {
                let from = round.acked.first().copied().unwrap_or(self.me);
                if self.restore_from_snapshot_region(fabric, app, from, 0) {
                    self.start_catch_up(fabric, now);
                } else {
                    self.abort("snapshot torn or stale");
                }
            }
            Phase::ReadMin { round } => {
                // Only followers whose minProposal we read take part in this prepare: writing our
                // number to another could lower its promise, and the ballots in its log with it.
                self.term.confirmed.retain(|p| round.acked.contains(p));
                let seen = round.acked.iter().map(|&p| self.word(fabric, p, layout::SCRATCH_MIN_PROPOSAL));
                let local = Self::local_word(fabric, layout::LOG, layout::MIN_PROPOSAL);
                let highest = seen.chain([local, self.term.prop_nr]).max().unwrap_or(0);
                match next_prop(highest, self.me) {
                    Some(prop_nr) => self.start_write_read(fabric, now, prop_nr),
                    None => {
                        tracing::error!(
                            node = self.me.0,
                            highest,
                            "proposal numbers exhausted: this cluster can no longer elect a leader"
                        );
                        self.abort("proposal numbers exhausted");
                    }
                }
            }
            Phase::WriteRead { round } => {
                // Followers whose slot we did not read may hold a value this prepare must adopt.
                self.term.confirmed.retain(|p| round.acked.contains(p));
                self.finish_prepare(fabric, now, &round.acked)
            }
            Phase::Accept { entry, mine, .. } => self.finish_accept(fabric, now, entry, mine),
            Phase::ReadHeads { round } => self.finish_recycle(fabric, now, &round.acked),
            Phase::Grow { peer, .. } => self.finish_grow(fabric, now, peer),
            Phase::Follower
            | Phase::Acquire { .. }
            | Phase::Reacquire { .. }
            | Phase::Idle
            | Phase::CatchUpWait { .. } => {}
        }
    }

    fn idle<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        if self.term.term_epoch != self.configuration.epoch && !self.configuration_current(fabric, now) {
            return;
        }
        if self.gate.owner() != Some(self.me) {
            // Our own permission manager served another would-be leader: it may have committed
            // entries we do not know of. Ask for permissions again and catch up.
            return self.abort("another replica took the local log");
        }
        if self.term.pending.is_empty() && (self.term.fuo_pushed < self.term.fuo || now >= self.term.next_keepalive_ns)
        {
            // Lazy FUO update, so followers apply the newest entry without waiting for the next;
            // repeated now and then as a keepalive whose failure reveals a lost permission.
            self.term.next_keepalive_ns = now + self.config.lag_check_period_ns;
            let fuo = self.term.fuo.to_le_bytes();
            // Taken and put back: no copy of the list on the hot path (`write_untracked`
            // uses the links only).
            let confirmed = std::mem::take(&mut self.term.confirmed);
            for &peer in &confirmed {
                self.write_untracked(fabric, now, peer, RemoteAddr::new(layout::LOG, layout::FUO), &fuo);
            }
            self.term.confirmed = confirmed;
            self.term.fuo_pushed = self.term.fuo;
        }
        // Every peer confirmed (the common case): nothing to grow, and no search of the list.
        let peers = usize::from(self.config.replicas) - 1;
        let candidates: Vec<NodeId> = if self.term.confirmed.len() < peers {
            let mut confirmed = MemberSet::default();
            self.term.confirmed.iter().for_each(|&p| confirmed.insert(p));
            self.links.peers().filter(|&p| !confirmed.contains(p)).collect()
        } else {
            Vec::new()
        };
        for peer in candidates {
            let i = usize::from(peer.0);
            if now < self.term.next_grow_ns[i] {
                continue;
            }
            self.term.next_grow_ns[i] = now + self.config.lag_check_period_ns;
            let ack = Self::local_word(fabric, layout::CONTROL, self.layout.ack_offset(peer));
            if ack & !layout::ACK_RECOVERING >= self.term.term_request {
                // Before recycling and proposing: a full log may wait on a majority that needs
                // this follower (a confirmed follower that stopped applying holds the tail).
                self.note_ack_standing(peer, ack);
                return self.start_grow(fabric, now, peer);
            }
            // The request or its ack was lost, or the peer served another replica since: ask
            // again with a new number (a permission manager serves each number once).
            self.links.reconnect(fabric, peer, now);
            self.term.request_no += 1;
            let at = RemoteAddr::new(layout::CONTROL, self.layout.request_offset(self.me));
            self.write_untracked(fabric, now, peer, at, &self.term.request_no.to_le_bytes());
        }
        let used = self.term.fuo - self.tail;
        if now >= self.term.next_recycle_ns || used * 4 >= self.layout.log_slots() * 3 {
            self.term.next_recycle_ns = now + self.config.recycle_period_ns;
            if self.tail < self.replay.snapshot_index().min(self.term.fuo) {
                return self.start_read_heads(fabric, now);
            }
        }
        if !self.term.pending.is_empty() {
            self.next_proposal(fabric, now);
        }
    }

    /// Whether this term's quorums are those of the configuration at the FUO; if not, waits
    /// (applying what may change it) or starts a new term under the configuration applied
    /// (see `mu::membership`), and returns false.
    fn configuration_current<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) -> bool {
        if self.replay.applied() < self.term.config_known_from {
            self.term.phase = Phase::Idle;
            return false;
        }
        if self.term.term_epoch != self.configuration.epoch && !self.config.bug(PlantedBug::KeepTermAcrossChange) {
            tracing::debug!(node = self.me.0, epoch = self.configuration.epoch, "configuration changed: new term");
            self.start_acquire(fabric, now);
            return false;
        }
        true
    }

    /// Starts replicating the oldest queued request: prepare unless it may be omitted.
    pub(super) fn next_proposal<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        if !self.configuration_current(fabric, now) {
            return;
        }
        let Some(front) = self.term.pending.front() else {
            self.term.phase = Phase::Idle;
            return;
        };
        if self.term.walk_ended_at.is_some() {
            let entry = OwnedEntry { proposer: self.me, request_id: front.request_id, kind: front.kind, payload: None };
            self.start_accept(fabric, now, entry, true);
        } else if self.config.bug(PlantedBug::SkipMinProposalRead) {
            // Every leader, every term, the same ballot: Paxos's unique, rising numbers broken.
            self.start_write_read(fabric, now, 256);
        } else {
            self.start_read_min(fabric, now);
        }
    }

    /// Listing 2 lines 13-14: READ minProposal of every confirmed follower.
    fn start_read_min<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let confirmed = self.term.confirmed.clone();
        let src = RemoteAddr::new(layout::LOG, layout::MIN_PROPOSAL);
        let round = self.read_word_round(fabric, now, &confirmed, src, layout::SCRATCH_MIN_PROPOSAL);
        self.term.phase = Phase::ReadMin { round };
    }

    /// Listing 2 lines 16-18: write the new proposal number and READ the slot at FUO.
    fn start_write_read<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, prop_nr: u64) {
        if !self.write_own_log(fabric, layout::MIN_PROPOSAL, &prop_nr.to_le_bytes()) {
            return self.abort("lost the local log");
        }
        self.term.prop_nr = prop_nr;
        self.gate.set_claim(Some(prop_nr));
        self.term.prepares += 1;
        let (layout, id, fuo) = (self.layout, self.round_id(), self.term.fuo);
        let confirmed = self.term.confirmed.clone();
        let posted = self.post_to(fabric, now, &confirmed, id, |ep, peer, id| {
            let min = RemoteAddr::new(layout::LOG, layout::MIN_PROPOSAL);
            let slot = RemoteAddr::new(layout::LOG, layout.slot_offset(fuo));
            let dst = layout.scratch(peer, layout::SCRATCH_SLOT);
            ep.post_write(0, min, &prop_nr.to_le_bytes(), PostFlags::NONE).is_ok()
                && ep.post_read(id, slot, layout.slot_bytes() as u32, layout::SCRATCH, dst, PostFlags::SIGNALED).is_ok()
        });
        let round = self.new_round(posted, now);
        self.term.phase = Phase::WriteRead { round };
    }

    /// Listing 2 lines 20-24: adopt the highest-numbered value found at FUO, or propose our own
    /// and, having seen the slot empty everywhere, omit the prepare from now on (§4.2).
    fn finish_prepare<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, acked: &[NodeId]) {
        let mut found: Option<OwnedEntry> = None;
        let mut best_prop = 0;
        let mut buf = std::mem::take(&mut self.slot_buf);
        let sources =
            acked.iter().map(|&p| self.layout.scratch(p, layout::SCRATCH_SLOT)).map(|at| (layout::SCRATCH, at));
        for (region, at) in sources.chain([(layout::LOG, self.layout.slot_offset(self.term.fuo))]) {
            if !read_entry(fabric, region, at, &mut buf, self.layout.slot_bytes()) {
                continue;
            }
            if let Some(e) = slot::decode(&buf, self.term.fuo, self.trust_canary()).filter(|e| e.prop_nr > best_prop) {
                best_prop = e.prop_nr;
                let payload = Some(self.spare_payloads.copy(e.payload));
                found = Some(OwnedEntry { proposer: e.proposer, request_id: e.request_id, kind: e.kind, payload });
            }
        }
        self.slot_buf = buf;
        tracing::trace!(node = self.me.0, index = self.term.fuo, acked = ?acked, found = ?found.as_ref().map(|e| (e.proposer.0, e.request_id)), "prepared");
        let Some(front) = self.term.pending.front() else {
            self.term.phase = Phase::Idle;
            return;
        };
        let own = OwnedEntry { proposer: self.me, request_id: front.request_id, kind: front.kind, payload: None };
        match found.filter(|_| !self.config.bug(PlantedBug::IgnorePreparedValues)) {
            Some(entry) => {
                let mine =
                    entry.proposer == own.proposer && entry.request_id == own.request_id && entry.kind == own.kind;
                self.start_accept(fabric, now, entry, mine);
            }
            None => {
                self.term.walk_ended_at = Some(self.term.fuo);
                self.start_accept(fabric, now, own, true);
            }
        }
    }

    /// Listing 2 lines 27-28: write the entry into slot FUO of every confirmed follower and of
    /// the local log.
    fn start_accept<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, mut entry: OwnedEntry, mine: bool) {
        if self.term.fuo >= self.tail + self.layout.log_slots() {
            // §5.3: never let the log fill; recycle first, then prepare this slot again.
            self.term.walk_ended_at = None;
            return self.start_read_heads(fabric, now);
        }
        let head = Entry {
            prop_nr: self.term.prop_nr,
            index: self.term.fuo,
            proposer: entry.proposer,
            request_id: entry.request_id,
            kind: entry.kind,
            payload: &[],
        };
        // Sealed where the payload is (the proposer's buffer, or the adopted value's copy) and
        // written to every log from there: no copy into a slot image. Taken out of its place
        // for the writes (`post_to` borrows the plane) and put back below.
        let own = entry.payload.is_none();
        let mut frame = match entry.payload.take() {
            Some(adopted) => adopted,
            None => {
                let front = self.term.pending.front_mut().expect("an own entry is the front of the queue");
                std::mem::replace(&mut front.payload, Frame::TAKEN)
            }
        };
        let bytes = frame.seal(&head);
        let offset = self.layout.slot_offset(self.term.fuo);
        let posted = self.write_own_log(fabric, offset, bytes).then(|| {
            tracing::trace!(node = self.me.0, index = self.term.fuo, prop = self.term.prop_nr, proposer = entry.proposer.0, request = entry.request_id, confirmed = ?self.term.confirmed, "accept");
            let id = self.round_id();
            // Taken and put back below (`post_to` uses the links only): no copy per accept.
            let confirmed = std::mem::take(&mut self.term.confirmed);
            let early_fuo = self.config.bug(PlantedBug::FuoBeforeMajority).then_some(self.term.fuo + 1);
            // The next slot of every follower, asked for now: its lines are cold (written a lap
            // ago), and fetching them overlaps the rest of this commit instead of stalling the
            // next.
            let next = RemoteAddr::new(layout::LOG, self.layout.slot_offset(self.term.fuo + 1));
            let posted = self.post_to(fabric, now, &confirmed, id, |ep, _, id| {
                let fuo = RemoteAddr::new(layout::LOG, layout::FUO);
                let written =
                    ep.post_write(id, RemoteAddr::new(layout::LOG, offset), bytes, PostFlags::SIGNALED).is_ok()
                        && early_fuo.is_none_or(|f| ep.post_write(0, fuo, &f.to_le_bytes(), PostFlags::NONE).is_ok());
                ep.prefetch_write(next, bytes.len() as u32);
                written
            });
            self.term.confirmed = confirmed;
            posted
        });
        if own {
            self.term.pending.front_mut().expect("the front is still there").payload = frame;
        } else {
            entry.payload = Some(frame);
        }
        let Some(posted) = posted else {
            return self.abort("lost the local log");
        };
        self.term.front_written |= mine;
        let round = self.new_round(posted, now);
        if self.config.bug(PlantedBug::AckBeforeMajority) {
            return self.finish_accept(fabric, now, entry, mine);
        }
        self.term.phase = Phase::Accept { round, entry, mine };
    }

    /// A majority holds the entry: it is committed. Listing 2 lines 30-32.
    fn finish_accept<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, entry: OwnedEntry, mine: bool) {
        tracing::trace!(node = self.me.0, index = self.term.fuo, "accepted by a quorum");
        self.term.fuo += 1;
        self.term.last_progress_ns = now;
        if !self.write_own_log(fabric, layout::FUO, &self.term.fuo.to_le_bytes()) {
            return self.abort("lost the local log");
        }
        self.promote_ready(fabric, now);
        if entry.kind == EntryKind::Membership {
            // The next index has the configuration this entry makes: apply it first. Followers
            // learn it committed at once (a leader that removed itself stops leading next).
            self.term.config_known_from = self.term.fuo;
            let fuo = self.term.fuo.to_le_bytes();
            for peer in self.term.confirmed.clone() {
                self.write_untracked(fabric, now, peer, RemoteAddr::new(layout::LOG, layout::FUO), &fuo);
            }
            self.term.fuo_pushed = self.term.fuo;
        }
        // The frame that was written: the adopted value's, or this leader's own at the front.
        let mut written = entry.payload;
        if mine {
            if let Some(p) = self.term.pending.pop_front() {
                debug_assert_eq!(p.request_id, entry.request_id);
                if p.kind != EntryKind::Noop {
                    self.awaiting_apply.insert(p.request_id);
                }
                match written {
                    Some(_) => self.spare_payloads.recycle(p.payload.into_bytes()),
                    None => written = Some(p.payload),
                }
            }
            self.term.front_written = false;
        }
        // Applied from these bytes, as a follower applies the slot it read as a commit proof: no
        // read and no second checksum of our own entry (see `apply_committed`).
        if let Some(frame) = written {
            let old = self.replay.hold_entry(self.term.fuo - 1, frame.into_bytes());
            self.spare_payloads.recycle(old);
        }
        self.next_proposal(fabric, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_4_1_proposal_numbers_rise_and_are_unique_per_replica() {
        assert_eq!(next_prop(0, NodeId(3)), Some(256 + 3));
        assert!(next_prop(256 + 3, NodeId(1)) > Some(256 + 3));
        assert_ne!(next_prop(512, NodeId(1)), next_prop(512, NodeId(2)));
        assert_eq!(next_prop(slot::MAX_PROPOSAL - 300, NodeId(4)), Some(0xFFFF_FF04));
        assert_eq!(next_prop(slot::MAX_PROPOSAL - 200, NodeId(4)), None, "the 24-bit round is exhausted");
    }
}
