//! Leader catch-up and update followers (Mu §4.2): a new leader reads its confirmed
//! followers' FUOs, copies what it lacks (or restores a snapshot when that was recycled), then
//! brings every confirmed follower up to its FUO.

use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RemoteAddr};

use super::super::{ReplicationPlane, read_entry};
use super::term::{Phase, Proposal};
use super::{read_history, read_incarnation};
use crate::mu::layout::{self, CATCH_UP_BATCH};
use crate::mu::slot::{self, EntryKind, Frame};

impl<E: Endpoint> ReplicationPlane<E> {
    /// Whether a catch-up batch starting at `next` stays within one lap of what was applied.
    pub(super) fn copy_fits(&self, next: u64) -> bool {
        next + CATCH_UP_BATCH <= self.replay.applied() + self.layout.log_slots()
    }

    /// Mu §4.2 leader catch-up, first step: READ every confirmed follower's FUO and tail.
    pub(super) fn start_catch_up<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let field = Self::local_word(fabric, layout::LOG, layout::FUO);
        self.term.fuo = self.term.fuo.max(field).max(self.replay.applied());
        self.term.fuo = self.first_missing(fabric, self.replay.applied(), self.term.fuo);
        tracing::trace!(
            node = self.me.0,
            field,
            applied = self.replay.applied(),
            fuo = self.term.fuo,
            "catch-up start"
        );
        let (layout, id, durable) = (self.layout, self.round_id(), self.config.durable);
        let confirmed = self.term.confirmed.clone();
        let posted = self.post_to(fabric, now, &confirmed, id, |ep, peer, id| {
            let fuo = RemoteAddr::new(layout::LOG, layout::FUO);
            let tail = RemoteAddr::new(layout::CONTROL, layout::TAIL);
            read_incarnation(ep, &layout, peer)
                && (!durable || read_history(ep, &layout, peer))
                && ep
                    .post_read(0, fuo, 8, layout::SCRATCH, layout.scratch(peer, layout::SCRATCH_FUO), PostFlags::NONE)
                    .is_ok()
                && ep
                    .post_read(
                        id,
                        tail,
                        8,
                        layout::SCRATCH,
                        layout.scratch(peer, layout::SCRATCH_TAIL),
                        PostFlags::SIGNALED,
                    )
                    .is_ok()
        });
        let round = self.new_round(posted, now);
        self.term.phase = Phase::CatchUp { round };
    }

    pub(super) fn finish_catch_up<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, acked: &[NodeId]) {
        // A follower of another history (see `of_another_history`) is no source: its FUO may
        // count entries the cluster decided otherwise since.
        let best = acked
            .iter()
            .filter(|&&p| !self.of_another_history(fabric, p))
            .map(|&p| (self.word(fabric, p, layout::SCRATCH_FUO), p))
            .max();
        tracing::trace!(node = self.me.0, ?best, fuo = self.term.fuo, ?acked, "catch-up read");
        self.term.confirmed.retain(|p| acked.contains(p));
        self.catch_up_from(fabric, now, best);
    }

    /// Brings this replica's log up to `best` (the highest FUO a follower reported, and who),
    /// copying or restoring a snapshot, then updates the followers.
    pub(super) fn catch_up_from<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, best: Option<(u64, NodeId)>) {
        if self.replay.applied() < self.log_start() {
            // Our own log lapped past what we applied (we lagged as a follower): only a
            // snapshot brings the state machine up.
            if let Some((_, from)) = best {
                return self.start_restore(fabric, now, from);
            }
        }
        match best {
            Some((max_fuo, from)) if max_fuo > self.term.fuo => {
                let recycled_there = self.term.fuo < self.word(fabric, from, layout::SCRATCH_TAIL);
                let overwritten_there = self.term.fuo + self.layout.log_slots() <= max_fuo;
                if recycled_there || overwritten_there {
                    // The entries this replica lacks are gone from that log: restore its snapshot.
                    self.start_restore(fabric, now, from);
                } else {
                    self.start_copy(fabric, now, from, self.term.fuo, max_fuo);
                }
            }
            _ => self.update_followers(fabric, now),
        }
    }

    pub(super) fn start_restore<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, from: NodeId) {
        let (id, len, inbox) = (self.round_id(), self.layout.snapshot_bytes(), self.layout.snapshot_inbox());
        let posted = self.post_to(fabric, now, &[from], id, |ep, _, id| {
            let src = RemoteAddr::new(layout::SNAPSHOT, 0);
            ep.post_read(id, src, len as u32, layout::SNAPSHOT, inbox, PostFlags::SIGNALED).is_ok()
        });
        let round = self.new_round(posted, now);
        self.term.phase = Phase::Restore { round };
    }

    /// READs the next batch of committed slots `[next, upto)` from `from`.
    pub(super) fn start_copy<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        from: NodeId,
        next: u64,
        upto: u64,
    ) {
        let slots = self.layout.log_slots();
        let count = CATCH_UP_BATCH.min(upto - next).min(slots - next % slots);
        let (layout, id) = (self.layout, self.round_id());
        let len = (count * layout.slot_bytes()) as u32;
        let posted = self.post_to(fabric, now, &[from], id, |ep, peer, id| {
            let src = RemoteAddr::new(layout::LOG, layout.slot_offset(next));
            let dst = layout.scratch(peer, layout::SCRATCH_SLOT);
            ep.post_read(id, src, len, layout::SCRATCH, dst, PostFlags::SIGNALED).is_ok()
        });
        let round = self.new_round(posted, now);
        self.term.phase = Phase::CatchUpCopy { round, from, next, upto, count };
    }

    pub(super) fn finish_copy<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        from: NodeId,
        next: u64,
        upto: u64,
        count: u64,
    ) {
        let slot_bytes = self.layout.slot_bytes();
        for i in 0..count {
            let at = self.layout.scratch(from, layout::SCRATCH_SLOT) + i * slot_bytes;
            if !read_entry(fabric, layout::SCRATCH, at, &mut self.slot_buf, self.layout.slot_bytes())
                || slot::decode(&self.slot_buf, next + i, self.trust_canary()).is_none()
            {
                // The source's log wrapped past that entry: take its snapshot instead.
                return self.start_restore(fabric, now, from);
            }
            if !self.write_own_log(fabric, self.layout.slot_offset(next + i), &self.slot_buf) {
                return self.abort("lost the local log during catch-up");
            }
        }
        // Copied entries are committed: raising the FUO lets the replayer apply them meanwhile.
        tracing::trace!(node = self.me.0, from = from.0, next, count, "catch-up copied");
        self.term.fuo = next + count;
        if !self.write_own_log(fabric, layout::FUO, &self.term.fuo.to_le_bytes()) {
            return self.abort("lost the local log during catch-up");
        }
        if self.term.fuo < upto {
            return if self.copy_fits(self.term.fuo) {
                self.start_copy(fabric, now, from, self.term.fuo, upto)
            } else {
                self.term.phase = Phase::CatchUpWait { from, next: self.term.fuo, upto, since_ns: now };
            };
        }
        self.update_followers(fabric, now);
    }

    /// The first index in `[from, to)` whose entry the local log does not hold, or `to`. What
    /// this replica counts as known committed must be in its log to be copied to others.
    pub(super) fn first_missing<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, from: u64, to: u64) -> u64 {
        let mut buf = std::mem::take(&mut self.slot_buf);
        let missing = (from..to).find(|&index| {
            !read_entry(fabric, layout::LOG, self.layout.slot_offset(index), &mut buf, self.layout.slot_bytes())
                || slot::decode(&buf, index, self.trust_canary()).is_none()
        });
        self.slot_buf = buf;
        missing.unwrap_or(to)
    }

    /// The lowest index this replica's log still holds: below the recycling point (or a restored
    /// snapshot) nothing, and a full lap back the slots hold newer entries.
    pub(super) fn log_start(&self) -> u64 {
        self.tail.max(self.term.fuo.saturating_sub(self.layout.log_slots()))
    }

    /// Whether `peer` (its generation and head just READ) follows another history than this
    /// leader's: a replica that kept running while every member was killed and the cluster
    /// restarted from its disks (`mu::plane::bootstrap` mints a new generation then). Its log and FUO
    /// word may count as decided entries of the history before, which the restart decided
    /// otherwise; only what it applied (below its head) is certainly in both (the restart starts
    /// from the most durable disk, and nothing beyond any member's disk was applied anywhere).
    /// A replica that never learnt a generation (0) has nothing to hold against. Only a
    /// durable cluster restarts from its disks, so only there are the words read and compared.
    pub(super) fn of_another_history<F: Fabric<Endpoint = E>>(&self, fabric: &F, peer: NodeId) -> bool {
        if !self.config.durable {
            return false;
        }
        let theirs = self.word(fabric, peer, layout::SCRATCH_BOOT_GENERATION);
        let ours = Self::local_word(fabric, layout::CONTROL, layout::GENERATION);
        theirs != 0 && ours != 0 && theirs != ours
    }

    /// Brings a follower of another history into this one: rewrites its log from what it applied
    /// and its FUO word down to this leader's (FIFO order puts both before any later accept or
    /// FUO), then its generation. False if its head lies before this log's start (it restores a
    /// snapshot first).
    pub(super) fn adopt_into_history<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, peer: NodeId) -> bool {
        let head = self.word(fabric, peer, layout::SCRATCH_HEAD).min(self.term.fuo);
        tracing::info!(node = self.me.0, peer = peer.0, head, fuo = self.term.fuo, "a follower of another history");
        if !self.copy_log_to(fabric, now, peer, head) {
            return false;
        }
        let generation = Self::local_word(fabric, layout::CONTROL, layout::GENERATION).to_le_bytes();
        self.write_untracked(fabric, now, peer, RemoteAddr::new(layout::CONTROL, layout::GENERATION), &generation)
    }

    /// Copies the committed slots `[from_index, self.term.fuo)` and the FUO to `peer`; FIFO order on
    /// the endpoint puts them before any later accept to the same follower. Returns false (and
    /// copies nothing more) if the local log lacks one of them; a slot inside the log that no
    /// longer decodes is reported to the replayer (`Replay::cannot_copy`).
    pub(super) fn copy_log_to<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        peer: NodeId,
        from_index: u64,
    ) -> bool {
        if from_index < self.log_start() {
            return false;
        }
        let mut buf = std::mem::take(&mut self.slot_buf);
        let mut missing = None;
        for index in from_index..self.term.fuo {
            let offset = self.layout.slot_offset(index);
            let Some(used) = read_entry(fabric, layout::LOG, offset, &mut buf, self.layout.slot_bytes())
                .then(|| slot::decode(&buf, index, self.trust_canary()).map(|e| slot::encoded_len(e.payload.len())))
                .flatten()
            else {
                missing = Some(index);
                break;
            };
            self.write_untracked(fabric, now, peer, RemoteAddr::new(layout::LOG, offset), &buf[..used]);
        }
        self.slot_buf = buf;
        if let Some(index) = missing {
            tracing::debug!(node = self.me.0, index, peer = peer.0, "an applied entry no longer decodes here");
            self.replay.cannot_copy(index);
            return false;
        }
        let fuo = self.term.fuo.to_le_bytes();
        self.write_untracked(fabric, now, peer, RemoteAddr::new(layout::LOG, layout::FUO), &fuo);
        true
    }

    /// Mu §4.2 update followers: bring every confirmed follower's log up to this replica's FUO;
    /// followers behind the recycled tail cannot be, and leave the confirmed set.
    pub(super) fn update_followers<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        for peer in self.term.confirmed.clone() {
            let their_fuo = self.word(fabric, peer, layout::SCRATCH_FUO);
            tracing::trace!(node = self.me.0, peer = peer.0, their_fuo, fuo = self.term.fuo, "update follower");
            if self.of_another_history(fabric, peer) {
                if !self.adopt_into_history(fabric, now, peer) {
                    self.term.confirmed.retain(|&p| p != peer);
                } else {
                    self.brought_up_to_date(fabric, peer);
                }
                continue;
            }
            if their_fuo < self.term.fuo && !self.copy_log_to(fabric, now, peer, their_fuo) {
                // Behind what this log holds: it must restore a snapshot, then rejoin by growing.
                self.term.confirmed.retain(|&p| p != peer);
            } else {
                self.brought_up_to_date(fabric, peer);
            }
        }
        if !self.quorum().reached(&self.term.confirmed) {
            return self.abort("too few followers could be updated");
        }
        if !self.write_own_log(fabric, layout::FUO, &self.term.fuo.to_le_bytes()) {
            return self.abort("lost the local log");
        }
        tracing::debug!(node = self.me.0, fuo = self.term.fuo, confirmed = ?self.term.confirmed, "leading");
        // Entries beyond our FUO may be committed without our catch-up majority knowing. A
        // no-op at the head of the queue makes the prepare phase walk through them, adopting
        // each, even when no client writes (as Raft's new-term entry does).
        if self.term.pending.front().is_none_or(|p| p.kind != EntryKind::Noop) {
            self.term.pending.push_front(Proposal { request_id: 0, kind: EntryKind::Noop, payload: Frame::new() });
        }
        self.term.fuo_pushed = self.term.fuo;
        self.term.walk_ended_at = None;
        // What catch-up copied may change the configuration: apply it before proposing.
        self.term.config_known_from = self.term.config_known_from.max(self.term.fuo);
        self.term.phase = Phase::Idle;
    }
}
