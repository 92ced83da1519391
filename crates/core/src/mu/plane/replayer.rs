//! The replayer (Mu §4.2, appendix A.4.3): every replica, leader included, applies committed
//! entries of its own log to the application exactly once, in index order; publishes its head
//! for recycling and a snapshot for state transfer; and, as a follower that fell behind the
//! recycled log, restores a peer's snapshot (§5.4).

use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RemoteAddr};

use super::round::Round;
use super::{ReplicationPlane, read_entry};
use crate::mu::api::{Event, StateMachine};
use crate::mu::layout;
use crate::mu::membership;
use crate::mu::planted::PlantedBug;
use crate::mu::slot::{self, EntryKind};
use crate::mu::snapshot;

/// Entries applied per poll at most, so one poll stays short.
pub const APPLY_PER_POLL: usize = 256;

/// What a follower does about falling behind the recycled log.
#[derive(Clone, Debug)]
enum LagWork {
    None,
    /// Reading the leader's tail.
    ReadTail {
        round: Round,
        leader: NodeId,
    },
    /// Copying `from`'s snapshot, which must cover the leader's log from `leader_tail` on.
    Restore {
        round: Round,
        leader: NodeId,
        leader_tail: u64,
        from: NodeId,
    },
}

/// The replayer's state.
#[derive(Debug)]
pub(super) struct Replay {
    /// The next index to apply.
    applied: u64,
    /// The index of the snapshot published in SNAPSHOT.
    snapshot_index: u64,
    /// The size of the last snapshot that did not fit the snapshot region, until one fits.
    snapshot_overflow: Option<usize>,
    /// As leader: the lowest index this replica applied but could not copy from its own log
    /// (the slot no longer decodes: a deposed leader's write for a later lap tore it). Followers
    /// that need it can only restore a snapshot that covers it (see `cover_uncopyable`).
    uncopyable: Option<u64>,
    lag: LagWork,
    /// Snapshot fetches started, to rotate their source among the peers (`snapshot_source`).
    snapshot_fetches: u64,
    big_buf: Vec<u8>,
    /// The application's state for the next published snapshot, kept between snapshots so
    /// that a large state is not allocated (and its pages faulted in) every time.
    state_buf: Vec<u8>,
    /// An entry whose bytes this replica holds already, to be applied from them: as a
    /// follower, the slot after the newest one proven committed by commit piggybacking (read,
    /// and checksummed, as that proof); as a leader, the entry it is replicating (encoded
    /// there, see [`Replay::hold_entry`]). `next_read` names its index and ballot word, so
    /// that applying it costs one word's load instead of a read and a checksum (see
    /// `apply_committed`).
    next_buf: Vec<u8>,
    next_read: Option<(u64, u64)>,
    last_apply_ns: u64,
}

impl Replay {
    /// A replayer that applied nothing, at `now`.
    pub(super) fn new(now: u64) -> Self {
        Self {
            applied: 0,
            snapshot_index: 0,
            snapshot_overflow: None,
            uncopyable: None,
            lag: LagWork::None,
            snapshot_fetches: 0,
            big_buf: Vec::new(),
            state_buf: Vec::new(),
            next_buf: Vec::new(),
            next_read: None,
            last_apply_ns: now,
        }
    }

    /// The next index to apply.
    pub(super) fn applied(&self) -> u64 {
        self.applied
    }

    /// The index of the published snapshot.
    pub(super) fn snapshot_index(&self) -> u64 {
        self.snapshot_index
    }

    /// The size of a state that did not fit the snapshot region, until one fits.
    pub(super) fn snapshot_overflow(&self) -> Option<usize> {
        self.snapshot_overflow
    }

    /// The leader found the applied entry at `index` no longer decoding in its log: only a
    /// snapshot covering it can bring a follower past it.
    pub(super) fn cannot_copy(&mut self, index: u64) {
        self.uncopyable = Some(self.uncopyable.map_or(index, |u| u.min(index)));
    }

    /// The leader's entry at `index`, committed, in `bytes` (as encoded for the logs): applied
    /// from them, without reading the slot back. Returns the buffer it replaces.
    pub(super) fn hold_entry(&mut self, index: u64, bytes: Vec<u8>) -> Vec<u8> {
        let old = std::mem::replace(&mut self.next_buf, bytes);
        self.next_read = Some((index, slot::ballot_word(&self.next_buf)));
        old
    }

    /// The round a lag check waits on, if any.
    pub(super) fn lag_round_mut(&mut self) -> Option<&mut Round> {
        match &mut self.lag {
            LagWork::ReadTail { round, .. } | LagWork::Restore { round, .. } => Some(round),
            LagWork::None => None,
        }
    }

    /// An operation to `peer` failed: a lag check waiting on it is dropped (and starts again).
    pub(super) fn peer_failed(&mut self, peer: NodeId) {
        if self.lag_round_mut().is_some_and(|r| r.posted_to(peer)) {
            self.lag = LagWork::None;
        }
    }

    /// The application was restored from a durable log up to `index` before the first poll.
    pub(super) fn restored_durable(&mut self, index: u64) {
        assert_eq!(self.applied, 0, "restore_durable is for a plane that has not run yet");
        self.applied = index;
        self.last_apply_ns = 0;
    }
}

impl<E: Endpoint> ReplicationPlane<E> {
    /// Whether the entry at `index` is committed. Below the FUO it is (the leader writes the FUO
    /// only after the entries below it); otherwise commit piggybacking: a complete entry at
    /// `index + 1` proves the leader finished `index` on a majority first, because leaders
    /// write slots in order (Mu A.4.3: commit all but the newest).
    pub(super) fn is_committed<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, index: u64) -> bool {
        let leading = self.term.leading();
        let fuo = fabric.load_u64(layout::LOG, layout::FUO).unwrap_or(0).max(if leading { self.term.fuo() } else { 0 });
        if index < fuo || (!leading && self.config.bug(PlantedBug::CommitNewest)) {
            return true;
        }
        if self.term.knows_fuo() {
            // A leader past its catch-up knows its FUO: the next slot of its own log holds an
            // entry of an older lap or nothing, and reading it on every poll only costs (the
            // replication hot path). Under-approximating what is committed is always safe.
            return false;
        }
        let mut next = std::mem::take(&mut self.replay.next_buf);
        let trust_canary = self.trust_canary();
        let committed =
            read_entry(fabric, layout::LOG, self.layout.slot_offset(index + 1), &mut next, self.layout.slot_bytes())
                && slot::decode(&next, index + 1, trust_canary).is_some();
        self.replay.next_read = committed.then(|| (index + 1, slot::ballot_word(&next)));
        self.replay.next_buf = next;
        committed
    }

    /// Applies every committed entry from `applied` on.
    pub(super) fn apply_committed<F, S>(&mut self, fabric: &F, now: u64, app: &mut S)
    where
        F: Fabric<Endpoint = E>,
        S: StateMachine,
    {
        let trust_canary = self.trust_canary();
        let start = self.replay.applied;
        // With a durable log an entry is persisted before it is applied (`mu::plane::durable`).
        self.persist_committed(fabric, app);
        let limit = self.apply_limit(fabric);
        for _ in 0..APPLY_PER_POLL {
            let index = self.replay.applied;
            if index >= limit {
                break;
            }
            // The bytes of this index held already (the slot read, and checksummed, to prove
            // the previous index committed, or a leader's own entry): they move to `slot_buf`.
            let proof = self.replay.next_read.take().filter(|&(at, _)| at == index).map(|(_, ballot)| {
                std::mem::swap(&mut self.slot_buf, &mut self.replay.next_buf);
                ballot
            });
            // Commitment first, then the slot. A leader updating this log writes the slots
            // before the FUO (and slot i before slot i + 1); a slot read before the commit was
            // seen may be the stale entry a copy was about to replace (a deposed leader's own
            // unchosen entry, found by the fault harness: seeds 210001 and 230005).
            if !self.is_committed(fabric, index) {
                break;
            }
            // So the proof's bytes count only if the slot's ballot word, loaded now that the
            // commit is seen, is still theirs. A proposal number writes one value per index
            // (copies keep an entry's number), so the same word is the same entry: had the
            // slot been rewritten with the chosen entry before the commit was seen, its word
            // would differ, since a leader writes a slot before the next one.
            let at = self.layout.slot_offset(index);
            let kept = proof.is_some_and(|ballot| fabric.load_u64(layout::LOG, at).is_ok_and(|now| now == ballot));
            if !kept && (!self.read_local_slot(fabric, index) || !slot::claims(&self.slot_buf, index)) {
                self.correct_fuo_field(fabric, index);
                break;
            }
            // Checksummed once, after the cheap checks (the hot path of every commit).
            let check = match (kept, trust_canary) {
                (true, _) => slot::Completeness::Verified,
                (false, true) => slot::Completeness::Canary,
                (false, false) => slot::Completeness::Checksum,
            };
            let Some(entry) = slot::decode_with(&self.slot_buf, index, check) else {
                self.correct_fuo_field(fabric, index);
                break;
            };
            tracing::trace!(
                target: crate::mu::APPLY_LOG_TARGET,
                node = self.me.0,
                index,
                prop = entry.prop_nr,
                proposer = entry.proposer.0,
                request = entry.request_id,
                "apply"
            );
            let membership = match entry.kind {
                EntryKind::Normal => {
                    app.apply(index, entry.payload);
                    None
                }
                EntryKind::Noop => {
                    app.skip(index);
                    None
                }
                EntryKind::Membership => {
                    app.skip(index);
                    membership::decode(entry.payload)
                }
            };
            let (proposer, request_id) = (entry.proposer, entry.request_id);
            if let Some((change, epoch)) = membership {
                self.apply_membership(index, change, epoch);
            }
            if proposer == self.me && self.awaiting_apply.remove(&request_id) {
                self.events.push(Event::Committed { request_id, index });
            }
            self.replay.applied += 1;
        }
        // A.4.3 follower-side FUO advance: what this replica applied is committed. (A leader's
        // own FUO is already at least this high; raising it never hurts.) Checked on every
        // poll, not only after applying: a leader's FUO write delayed on the way can land after
        // this replica applied past it, and a FUO word below the head made the leader take the
        // follower for one that needs a snapshot while the follower saw no reason to fetch one
        // (swarm seeds 17571 and 19963, with a clogged link).
        let field = fabric.load_u64(layout::LOG, layout::FUO).unwrap_or(0);
        if field < self.replay.applied {
            layout::store_own(fabric, layout::LOG, layout::FUO, self.replay.applied);
        }
        self.cover_uncopyable(fabric, app);
        if self.replay.applied == start {
            return;
        }
        self.replay.last_apply_ns = now;
        layout::store_own(fabric, layout::CONTROL, layout::HEAD, self.replay.applied);
        if self.replay.applied >= self.replay.snapshot_index + self.config.snapshot_every {
            self.publish_snapshot(fabric, app);
        }
    }

    /// A leader that cannot copy an entry it applied (see `uncopyable`) publishes a snapshot
    /// that covers it and raises its recycling point to that snapshot: followers below see the
    /// tail past their head and restore the snapshot instead of waiting for a copy that cannot
    /// come (swarm seed 95489).
    fn cover_uncopyable<F: Fabric<Endpoint = E>, S: StateMachine>(&mut self, fabric: &F, app: &S) {
        let Some(index) = self.replay.uncopyable else { return };
        if self.replay.snapshot_index <= index && self.replay.applied > index {
            self.publish_snapshot(fabric, app);
        }
        if self.replay.snapshot_index > index {
            tracing::debug!(
                node = self.me.0,
                index,
                tail = self.replay.snapshot_index,
                "recycling past an uncopyable entry"
            );
            self.raise_tail(fabric, self.replay.snapshot_index);
            self.replay.uncopyable = None;
        }
    }

    /// A follower whose FUO field claims an entry its log does not hold (it was lapped or
    /// restored past its log) lowers the field, so a leader growing it copies from there.
    pub(super) fn correct_fuo_field<F: Fabric<Endpoint = E>>(&self, fabric: &F, missing: u64) {
        if !self.term.leading() && fabric.load_u64(layout::LOG, layout::FUO).unwrap_or(0) > missing {
            layout::store_own(fabric, layout::LOG, layout::FUO, missing);
        }
    }

    /// Writes the state as of `applied` into the SNAPSHOT region (if it fits).
    pub(super) fn publish_snapshot<F: Fabric<Endpoint = E>, S: StateMachine>(&mut self, fabric: &F, app: &S) {
        let mut state = std::mem::take(&mut self.replay.state_buf);
        state.clear();
        app.snapshot(&mut state);
        app.checkpoint(self.replay.applied, self.configuration, &state);
        let bytes = snapshot::HEADER_BYTES + state.len();
        if bytes as u64 <= self.layout.snapshot_bytes() {
            // The state, then its header: a reader that catches the region between the two
            // finds the old header's checksum wrong for the new state and tries again later.
            let header = snapshot::header(self.replay.applied, self.configuration, &state);
            let written = fabric.write_local(layout::SNAPSHOT, snapshot::HEADER_BYTES as u64, &state).is_ok()
                && fabric.write_local(layout::SNAPSHOT, 0, &header).is_ok();
            if written {
                self.replay.snapshot_index = self.replay.applied;
            }
            self.replay.snapshot_overflow = None;
        } else {
            if self.replay.snapshot_overflow.is_none() {
                tracing::error!(
                    node = self.me.0,
                    bytes,
                    limit = self.layout.snapshot_bytes(),
                    "the state does not fit the snapshot region: the log cannot be recycled past it, and writes \
                     stop once the log is full; raise log.snapshot_bytes"
                );
            }
            self.replay.snapshot_overflow = Some(bytes);
        }
        self.replay.state_buf = state;
    }

    /// Restores the snapshot that a READ from `from` placed in the local snapshot inbox, if it
    /// is whole, newer than what was applied and taken at `at_least` or later, and publishes it
    /// as this replica's own. Returns whether it did.
    pub(super) fn restore_from_snapshot_region<F: Fabric<Endpoint = E>, S: StateMachine>(
        &mut self,
        fabric: &F,
        app: &mut S,
        from: NodeId,
        at_least: u64,
    ) -> bool {
        let mut bytes = std::mem::take(&mut self.replay.big_buf);
        bytes.resize(self.layout.snapshot_bytes() as usize, 0);
        let restored = match fabric
            .read_local(layout::SNAPSHOT, self.layout.snapshot_inbox(), &mut bytes)
            .ok()
            .and_then(|()| snapshot::decode(&bytes))
        {
            Some((index, configuration, state)) if index > self.replay.applied && index >= at_least => {
                match app.restore(index, state) {
                    Ok(()) => {
                        app.checkpoint(index, configuration, state);
                        self.set_configuration(configuration);
                        Some(index)
                    }
                    Err(e) => {
                        tracing::error!(node = self.me.0, error = %e, "snapshot rejected by the application");
                        None
                    }
                }
            }
            other => {
                tracing::debug!(node = self.me.0, from = from.0, found = ?other.map(|f| f.0), applied = self.replay.applied, at_least, "no usable snapshot");
                None
            }
        };
        // The snapshot index bounds the recycling point (a follower left behind must find a
        // snapshot at least that new here): publish what was restored.
        let published = restored.is_some() && fabric.write_local(layout::SNAPSHOT, 0, &bytes).is_ok();
        self.replay.big_buf = bytes;
        let Some(index) = restored else { return false };
        tracing::info!(node = self.me.0, index, from = from.0, leader = self.leader.0, "restored a snapshot");
        self.replay.applied = index;
        self.persisted_through_snapshot(index);
        if published {
            self.replay.snapshot_index = index;
        }
        self.term.decided_below(index);
        // The local log holds nothing below the snapshot: for peers that is as if recycled.
        self.raise_tail(fabric, index);
        layout::store_own(fabric, layout::CONTROL, layout::HEAD, index);
        if fabric.load_u64(layout::LOG, layout::FUO).unwrap_or(0) < index {
            layout::store_own(fabric, layout::LOG, layout::FUO, index);
        }
        self.events.push(Event::Restored { index, from });
        true
    }

    /// A follower that has applied nothing for a while asks whether the leader recycled past
    /// it, and if so copies a snapshot (§5.4): a follower's when it covers what the leader
    /// recycled, so that the leader serves no state transfer, else the leader's.
    pub(super) fn check_lag<F, S>(&mut self, fabric: &F, now: u64, app: &mut S)
    where
        F: Fabric<Endpoint = E>,
        S: StateMachine,
    {
        let timeout = self.config.round_timeout_ns;
        match std::mem::replace(&mut self.replay.lag, LagWork::None) {
            LagWork::None => {
                let leader = self.leader;
                if leader == self.me || now.saturating_sub(self.replay.last_apply_ns) < self.config.lag_check_period_ns
                {
                    return;
                }
                self.replay.last_apply_ns = now;
                self.links.reconnect(fabric, leader, now);
                let src = RemoteAddr::new(layout::CONTROL, layout::TAIL);
                let round = self.read_word_round(fabric, now, &[leader], src, layout::SCRATCH_TAIL);
                self.replay.lag = LagWork::ReadTail { round, leader };
            }
            LagWork::ReadTail { round, leader } if !round.acked.is_empty() => {
                let at = self.layout.scratch(leader, layout::SCRATCH_TAIL);
                let leader_tail = fabric.load_u64(layout::SCRATCH, at).unwrap_or(0);
                tracing::debug!(
                    node = self.me.0,
                    leader = leader.0,
                    leader_tail,
                    applied = self.replay.applied,
                    "lag check"
                );
                if leader_tail > self.replay.applied {
                    let from = snapshot_source(self.me, leader, self.config.replicas, self.replay.snapshot_fetches);
                    self.replay.snapshot_fetches += 1;
                    self.fetch_snapshot(fabric, now, leader, leader_tail, from);
                }
            }
            LagWork::Restore { round, leader, leader_tail, from } if !round.acked.is_empty() => {
                // A follower's snapshot older than the leader's tail would leave a gap that no
                // log holds any more: the leader's covers it.
                if !self.restore_from_snapshot_region(fabric, app, from, leader_tail) && from != leader {
                    self.fetch_snapshot(fabric, now, leader, leader_tail, leader);
                }
            }
            work @ (LagWork::ReadTail { .. } | LagWork::Restore { .. }) => {
                let started = match &work {
                    LagWork::ReadTail { round, .. } | LagWork::Restore { round, .. } => round.started_ns,
                    LagWork::None => now,
                };
                if now.saturating_sub(started) <= timeout {
                    self.replay.lag = work;
                }
            }
        }
    }

    /// Whether no lag check or snapshot copy is under way.
    pub(super) fn is_idle_lag(&self) -> bool {
        matches!(self.replay.lag, LagWork::None)
    }

    /// READs `from`'s published snapshot into the local SNAPSHOT region; the next lag checks
    /// restore it if it covers `leader_tail`.
    pub(super) fn fetch_snapshot<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        leader: NodeId,
        leader_tail: u64,
        from: NodeId,
    ) {
        self.links.reconnect(fabric, from, now);
        let (id, len, inbox) = (self.round_id(), self.layout.snapshot_bytes() as u32, self.layout.snapshot_inbox());
        let posted = self.post_to(fabric, now, &[from], id, |ep, _, id| {
            let src = RemoteAddr::new(layout::SNAPSHOT, 0);
            ep.post_read(id, src, len, layout::SNAPSHOT, inbox, PostFlags::SIGNALED).is_ok()
        });
        let round = self.new_round(posted, now);
        self.replay.lag = LagWork::Restore { round, leader, leader_tail, from };
    }
}

/// The peer whose snapshot a lagging replica's `attempt`-th fetch reads: the followers in turn,
/// starting after `me`, then the leader, so a dead or lagging follower costs one attempt and
/// never blocks the transfer.
fn snapshot_source(me: NodeId, leader: NodeId, replicas: u16, attempt: u64) -> NodeId {
    let followers: Vec<NodeId> =
        (1..replicas).map(|step| NodeId((me.0 + step) % replicas)).filter(|&p| p != leader).collect();
    let turn = usize::try_from(attempt % (followers.len() as u64 + 1)).unwrap_or(0);
    followers.get(turn).copied().unwrap_or(leader)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use microrep_fabric::sim::{SimConfig, SimEndpoint, SimFabric, SimWorld};
    use microrep_fabric::{FabricError, NodeId, RegionId, RevokePath};

    use super::*;
    use crate::mu::slot::Entry;
    use crate::mu::{LocalLogGate, MuConfig, regions};

    type Landing = Box<dyn FnOnce(&SimFabric)>;

    /// A fabric on which a remote leader's writes land right after the replica's next access to
    /// its own log: the interleaving that real concurrency allows between two local reads and a
    /// stepped simulation never shows.
    struct Racing {
        inner: SimFabric,
        landing: RefCell<Option<Landing>>,
        /// Land after an access of the log at this offset only (any offset if `None`).
        at: Option<u64>,
        /// Reads of the log at each offset, in order.
        reads: RefCell<Vec<u64>>,
    }

    impl Racing {
        fn new(inner: SimFabric, landing: Option<Landing>, at: Option<u64>) -> Self {
            Self { inner, landing: RefCell::new(landing), at, reads: RefCell::new(Vec::new()) }
        }

        fn accessed(&self, region: RegionId, offset: u64) {
            if region == layout::LOG {
                self.reads.borrow_mut().push(offset);
                if self.at.is_none_or(|at| at == offset)
                    && let Some(land) = self.landing.borrow_mut().take()
                {
                    land(&self.inner);
                }
            }
        }
    }

    impl Fabric for Racing {
        type Endpoint = SimEndpoint;

        fn node_id(&self) -> NodeId {
            self.inner.node_id()
        }
        fn connect(&self, peer: NodeId) -> Result<SimEndpoint, FabricError> {
            self.inner.connect(peer)
        }
        fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
            self.inner.grant_write(region, peer)
        }
        fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
            self.inner.revoke_write(region, peer)
        }
        fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
            self.inner.region_len(region)
        }
        fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
            let read = self.inner.read_local(region, offset, buf);
            self.accessed(region, offset);
            read
        }
        unsafe fn local_bytes(
            &self,
            region: RegionId,
            offset: u64,
            len: usize,
        ) -> Result<std::borrow::Cow<'_, [u8]>, FabricError> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.inner.local_bytes(region, offset, len) }
        }
        fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
            self.inner.write_local(region, offset, data)
        }
        fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
            let word = self.inner.load_u64(region, offset);
            self.accessed(region, offset);
            word
        }
        fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
            self.inner.store_u64(region, offset, value)
        }
    }

    #[derive(Default)]
    struct Applied(Vec<Vec<u8>>);

    impl StateMachine for Applied {
        fn apply(&mut self, _index: u64, command: &[u8]) {
            self.0.push(command.to_vec());
        }
        fn snapshot(&self, _out: &mut Vec<u8>) {}
        fn restore(&mut self, _index: u64, _snapshot: &[u8]) -> Result<(), crate::mu::RestoreError> {
            Ok(())
        }
    }

    fn slot_bytes(config: &MuConfig, index: u64, proposer: u16, payload: &[u8]) -> Vec<u8> {
        let mut slot = vec![0; config.slot_bytes as usize];
        let entry = Entry {
            prop_nr: 256 + u64::from(proposer),
            index,
            proposer: NodeId(proposer),
            request_id: 1,
            kind: EntryKind::Normal,
            payload,
        };
        slot::encode(&entry, &mut slot);
        slot
    }

    /// The fault harness's seeds 210001 and 230005: a deposed leader's log holds its own
    /// unchosen entry at the next index; the new leader copies the chosen entry over it, then
    /// raises the FUO. The deposed replica must apply the chosen entry, never the stale one it
    /// read just before the copy landed.
    #[test]
    fn a_slot_read_before_its_commit_was_seen_is_never_applied() {
        let config = MuConfig::simulated(NodeId(0), 3);
        let world = SimWorld::new(1, SimConfig::reliable());
        let inner = world.add_node(NodeId(0), &regions(&config)).expect("a sim node");
        let layout = layout::Layout::new(&config);
        let stale = slot_bytes(&config, 0, 0, b"stale");
        inner.write_local(layout::LOG, layout.slot_offset(0), &stale).expect("own log");
        let chosen = slot_bytes(&config, 0, 1, b"chosen");
        let copy: Landing = Box::new(move |log| {
            log.write_local(layout::LOG, layout.slot_offset(0), &chosen).expect("copied slot");
            log.store_u64(layout::LOG, layout::FUO, 1).expect("copied FUO");
        });
        let fabric = Racing::new(inner, Some(copy), None);
        let members = crate::mu::SharedMembers::new(config.members);
        let mut plane = ReplicationPlane::<SimEndpoint>::new(&config, LocalLogGate::new(), members, 0);
        let mut app = Applied::default();
        plane.apply_committed(&fabric, 0, &mut app);
        plane.apply_committed(&fabric, 1, &mut app);
        assert_eq!(app.0, [b"chosen".to_vec()]);
    }

    /// A follower with entries 0 and 1 of a deposed leader and nothing after them: entry 1
    /// proves 0 committed. `landing`, if any, lands right after that proof read entry 1's
    /// payload. Returns what was applied and the log offsets read, after two polls.
    fn apply_after_a_proof(
        landing: impl FnOnce(&SimFabric, &layout::Layout) + 'static,
    ) -> (Vec<Vec<u8>>, Vec<u64>, layout::Layout) {
        let config = MuConfig::simulated(NodeId(0), 3);
        let world = SimWorld::new(1, SimConfig::reliable());
        let inner = world.add_node(NodeId(0), &regions(&config)).expect("a sim node");
        let layout = layout::Layout::new(&config);
        for (index, payload) in [(0, &b"first"[..]), (1, b"stale")] {
            inner
                .write_local(layout::LOG, layout.slot_offset(index), &slot_bytes(&config, index, 1, payload))
                .expect("log");
        }
        let at = layout.slot_offset(1) + slot::HEADER_BYTES as u64;
        let copy: Landing = Box::new(move |log| landing(log, &layout));
        let fabric = Racing::new(inner, Some(copy), Some(at));
        let members = crate::mu::SharedMembers::new(config.members);
        let mut plane = ReplicationPlane::<SimEndpoint>::new(&config, LocalLogGate::new(), members, 0);
        let mut app = Applied::default();
        plane.apply_committed(&fabric, 0, &mut app);
        plane.apply_committed(&fabric, 1, &mut app);
        let reads = fabric.reads.borrow().clone();
        (app.0, reads, layout)
    }

    /// The slot read to prove its predecessor committed is applied without a second read
    /// once the next entry proves it committed too.
    #[test]
    fn a_slot_read_as_a_proof_is_applied_from_that_read() {
        let (applied, reads, layout) = apply_after_a_proof(|log, layout| {
            let config = MuConfig::simulated(NodeId(0), 3);
            log.write_local(layout::LOG, layout.slot_offset(2), &slot_bytes(&config, 2, 1, b"next")).expect("log");
        });
        assert_eq!(applied, [b"first".to_vec(), b"stale".to_vec()], "the old leader's entries are both proven");
        let slot_1 = layout.slot_offset(1);
        let payload_reads = reads.iter().filter(|&&at| at == slot_1 + slot::HEADER_BYTES as u64).count();
        assert_eq!(payload_reads, 1, "entry 1's payload is read once, as the proof: {reads:?}");
    }

    /// The race that rule guards against: a new leader copies its chosen entry over slot 1
    /// and writes slot 2 right after slot 1 was read as a proof. The copy's ballot word
    /// differs, so the proof's bytes are not applied.
    #[test]
    fn a_proof_whose_slot_was_rewritten_before_its_commit_was_seen_is_read_again() {
        let (applied, _, _) = apply_after_a_proof(|log, layout| {
            let config = MuConfig::simulated(NodeId(0), 3);
            log.write_local(layout::LOG, layout.slot_offset(1), &slot_bytes(&config, 1, 2, b"chosen")).expect("log");
            log.write_local(layout::LOG, layout.slot_offset(2), &slot_bytes(&config, 2, 2, b"next")).expect("log");
        });
        assert_eq!(applied, [b"first".to_vec(), b"chosen".to_vec()]);
    }

    #[test]
    fn snapshot_sources_rotate_over_the_followers_then_the_leader() {
        let sources = |me, leader, replicas| -> Vec<u16> {
            (0..6).map(|attempt| snapshot_source(NodeId(me), NodeId(leader), replicas, attempt).0).collect()
        };
        // Five replicas, 3 lagging, 0 leading: the followers after 3 in turn, then the leader.
        assert_eq!(sources(3, 0, 5), [4, 1, 2, 0, 4, 1]);
        assert_eq!(sources(2, 0, 3), [1, 0, 1, 0, 1, 0]);
        assert_eq!(sources(0, 2, 3), [1, 2, 1, 2, 1, 2]);
        // Alone with the leader, only the leader has a snapshot to give.
        assert_eq!(sources(1, 0, 2), [0; 6]);
    }
}
