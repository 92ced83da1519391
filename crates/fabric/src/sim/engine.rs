//! The event loop: operations reaching their target, torn pieces landing, timeouts, completions.
//!
//! Invariants the rest of the module relies on:
//! * events are processed in `(time, insertion sequence)` order and never scheduled in the past;
//! * only the head of an endpoint's queue leaves [`Phase::Queued`], and the next head is scheduled
//!   only when the previous one has finished applying (contract rule 1, FIFO);
//! * an event names its endpoint and operation id; if that operation is no longer the head in the
//!   expected phase (crash, revoke, ...), the event is stale and does nothing.

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::{SliceRandom, index};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::SimConfig;
use super::digest::{Digest, Tag, status_code};
use super::state::{Ep, Event, Node, OpBody, Phase, offset_usize};
use crate::{Completion, EndpointState, NodeId, OpError, RegionSpec};

/// Upper bound on events processed by one `run_until_idle`. Every operation causes a bounded
/// number of events and only calls post operations, so reaching it means a simulator bug.
const MAX_IDLE_STEPS: u64 = 1 << 32;

/// The whole simulated world.
#[derive(Debug)]
pub(super) struct World {
    pub(super) config: SimConfig,
    pub(super) rng: ChaCha8Rng,
    pub(super) now: u64,
    next_seq: u64,
    pub(super) next_op: u64,
    events: BTreeMap<(u64, u64), Event>,
    pub(super) nodes: BTreeMap<NodeId, Node>,
    pub(super) eps: Vec<Ep>,
    /// Directed links whose operations wait in place (`SimWorld::hold_link`).
    pub(super) held_links: BTreeSet<(NodeId, NodeId)>,
    pub(super) digest: Digest,
    /// With [`SimConfig::lend_peer_memory`]: the layout and memory of each restarted node's
    /// earlier incarnations, as they were at their crash, for endpoints still connected to them.
    pub(super) graves: BTreeMap<(NodeId, u32), Grave>,
}

/// What a crashed incarnation leaves for peers that still read its memory: its regions' specs
/// and their bytes.
pub(super) type Grave = (Vec<RegionSpec>, Vec<Vec<u8>>);

impl World {
    pub(super) fn new(seed: u64, config: SimConfig) -> Self {
        Self {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            next_seq: 0,
            next_op: 0,
            events: BTreeMap::new(),
            nodes: BTreeMap::new(),
            eps: Vec::new(),
            held_links: BTreeSet::new(),
            digest: Digest::new(),
            graves: BTreeMap::new(),
        }
    }

    pub(super) fn trace(&mut self, tag: Tag, fields: &[u64]) {
        self.digest.record(tag, self.now, fields);
    }

    fn schedule(&mut self, at: u64, event: Event) {
        debug_assert!(at >= self.now, "event scheduled in the past");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.events.insert((at.max(self.now), seq), event);
    }

    /// One leg's latency: uniform in the configured range, sometimes with an extra delay.
    pub(super) fn draw_latency(&mut self) -> u64 {
        let c = &self.config;
        let mut latency = if c.latency_min_ns == c.latency_max_ns {
            c.latency_min_ns
        } else {
            self.rng.random_range(c.latency_min_ns..=c.latency_max_ns)
        };
        if c.delay_prob > 0.0 && self.rng.random_bool(c.delay_prob) {
            latency = latency.saturating_add(self.rng.random_range(0..=c.delay_max_ns));
        }
        latency
    }

    /// Whether a new operation is instant ([`SimConfig::instant_prob`]; 0 draws nothing).
    pub(super) fn draw_instant(&mut self) -> bool {
        let p = self.config.instant_prob;
        p > 0.0 && self.rng.random_bool(p)
    }

    /// The completion leg of the head operation of `ep`: none for an instant one.
    fn completion_latency(&mut self, ep: usize) -> u64 {
        if self.eps[ep].queue.front().is_some_and(|op| op.instant) { 0 } else { self.draw_latency() }
    }

    /// Processes the events due now (an instant operation's, and whatever else is due).
    pub(super) fn run_due(&mut self) {
        while self.next_event_time().is_some_and(|at| at <= self.now) {
            self.step();
        }
    }

    pub(super) fn pending_events(&self) -> usize {
        self.events.len()
    }

    pub(super) fn next_event_time(&self) -> Option<u64> {
        self.events.first_key_value().map(|(&(at, _), _)| at)
    }

    /// With [`SimConfig::preempt_prob`], deschedules the calling node before a local access:
    /// time moves on by up to [`SimConfig::preempt_max_ns`] and the events due meanwhile happen.
    pub(super) fn preempt(&mut self) {
        let c = &self.config;
        if c.preempt_prob > 0.0 && self.rng.random_bool(c.preempt_prob) {
            let until = self.now.saturating_add(self.rng.random_range(0..=self.config.preempt_max_ns));
            while self.next_event_time().is_some_and(|at| at <= until) {
                self.step();
            }
            self.now = self.now.max(until);
        }
    }

    /// Processes the earliest event; false if there is none.
    pub(super) fn step(&mut self) -> bool {
        let Some(((at, _), event)) = self.events.pop_first() else {
            return false;
        };
        self.now = self.now.max(at);
        match event {
            Event::Start { ep, op } => self.on_start(ep, op),
            Event::Piece { ep, op } => self.on_piece(ep, op),
            Event::Fail { ep, op } => {
                if self.head_in_phase(ep, op, |p| *p == Phase::Retrying) {
                    self.finish_op(ep, Err(OpError::PeerUnreachable), self.now);
                }
            }
            Event::Complete { ep, completion, report } => self.on_complete(ep, completion, report),
        }
        true
    }

    pub(super) fn run_until_idle(&mut self) {
        let mut steps = 0u64;
        while self.step() {
            steps += 1;
            assert!(steps < MAX_IDLE_STEPS, "simulated fabric did not go idle after {steps} events");
        }
    }

    /// Whether operation `op` is the head of live endpoint `ep` and its phase passes `check`.
    fn head_in_phase(&self, ep: usize, op: u64, check: impl Fn(&Phase) -> bool) -> bool {
        let e = &self.eps[ep];
        !e.dead && e.queue.front().is_some_and(|h| h.id == op && check(&h.phase))
    }

    fn peer_live(&self, ep: usize) -> bool {
        let e = &self.eps[ep];
        self.nodes.get(&e.peer).is_some_and(|n| n.is_live(e.peer_inc))
    }

    /// Whether operations from `owner` to `peer` wait in place: the owner is held, or the link.
    fn blocked(&self, owner: NodeId, peer: NodeId) -> bool {
        self.nodes.get(&owner).is_none_or(|n| n.held) || self.held_links.contains(&(owner, peer))
    }

    /// Schedules the head operation of `ep` if it is waiting and neither its owner nor its link
    /// is held.
    pub(super) fn schedule_head(&mut self, ep: usize) {
        let e = &self.eps[ep];
        if e.dead || self.blocked(e.owner, e.peer) {
            return;
        }
        let flushed_now = e.state == EndpointState::Error;
        let epoch = e.epoch;
        let now = self.now;
        let Some(head) = self.eps[ep].queue.front_mut() else {
            return;
        };
        if head.phase != Phase::Queued {
            return;
        }
        head.phase = Phase::Scheduled;
        // A flushed operation never travels, so it need not wait for its latency.
        let at = if flushed_now || head.epoch != epoch { now } else { head.arrival.max(now) };
        let op = head.id;
        self.schedule(at, Event::Start { ep, op });
    }

    /// The head operation reaches the target: decide its fate (contract rules 2, 4, 5, 6).
    fn on_start(&mut self, ep: usize, op: u64) {
        if !self.head_in_phase(ep, op, |p| *p == Phase::Scheduled) {
            return;
        }
        let e = &self.eps[ep];
        let (owner, peer) = (e.owner, e.peer);
        let flushed = e.state == EndpointState::Error || e.queue.front().is_some_and(|h| h.epoch != e.epoch);
        if self.nodes.contains_key(&owner) && self.blocked(owner, peer) {
            // Held after it was scheduled: it waits in place until release.
            if let Some(head) = self.eps[ep].queue.front_mut() {
                head.phase = Phase::Queued;
            }
            return;
        }
        self.trace(Tag::Start, &[ep as u64, op]);
        if flushed {
            self.finish_op(ep, Err(OpError::Flushed), self.now);
            return;
        }
        if !self.peer_live(ep) {
            self.begin_retry(ep);
            return;
        }
        if self.config.fail_prob > 0.0 && self.rng.random_bool(self.config.fail_prob) {
            let at = self.now.saturating_add(self.completion_latency(ep));
            self.finish_op(ep, Err(OpError::Transport), at);
            return;
        }
        let Some(head) = self.eps[ep].queue.front() else {
            return;
        };
        let Some(target) = self.nodes.get(&peer) else {
            return;
        };
        match head.body {
            OpBody::Write { dst, ref data } => {
                // Posts were validated against this incarnation's layout (a restart would have
                // changed the incarnation), so the region is there.
                let allowed = target.region_index(dst.region).is_some_and(|r| target.may_write(r, owner));
                let len = data.len();
                if !allowed {
                    let at = self.now.saturating_add(self.completion_latency(ep));
                    self.finish_op(ep, Err(OpError::PermissionDenied), at);
                    return;
                }
                if let Some(pieces) = self.draw_pieces(len, dst.offset) {
                    self.apply_piece(ep, pieces[0].clone());
                    if let Some(head) = self.eps[ep].queue.front_mut() {
                        head.phase = Phase::Applying { pieces, next: 1 };
                    }
                    self.schedule_piece(ep, op);
                } else {
                    self.apply_piece(ep, 0..len);
                    let at = self.now.saturating_add(self.completion_latency(ep));
                    self.finish_op(ep, Ok(()), at);
                }
            }
            OpBody::Read { src, len, local_region, local_offset } => {
                // READs need no permission; bounds were checked at post time, against this
                // incarnation's layout.
                let start = offset_usize(src.offset);
                let bytes = target
                    .region_index(src.region)
                    .and_then(|r| target.memory[r].get(start..start.saturating_add(len as usize)))
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default();
                if let Some(node) = self.nodes.get_mut(&owner) {
                    write_region(node, local_region, local_offset, &bytes);
                }
                self.digest.bytes(&bytes);
                self.trace(Tag::Read, &[ep as u64, op, src.region.0.into(), src.offset, len.into()]);
                let at = self.now.saturating_add(self.completion_latency(ep));
                self.finish_op(ep, Ok(()), at);
            }
        }
    }

    /// Whether and how to tear a write of `len` bytes to target offset `offset`: contiguous
    /// ranges in the order they will land, or `None` if the write lands at once. Cuts fall only
    /// on 8-byte boundaries of the target address: like a NIC, the fabric never tears an aligned
    /// 8-byte word (the contract's word atomicity).
    pub(super) fn draw_pieces(&mut self, len: usize, offset: u64) -> Option<Vec<std::ops::Range<usize>>> {
        let p = self.config.torn_write_prob;
        let first_cut = ((8 - offset % 8) % 8) as usize;
        let first_cut = if first_cut == 0 { 8 } else { first_cut };
        let candidates: Vec<usize> = (first_cut..len).step_by(8).collect();
        if candidates.is_empty() || p <= 0.0 || !self.rng.random_bool(p) {
            return None;
        }
        let count = self.rng.random_range(2..=(candidates.len() + 1).min(4));
        let mut cuts: Vec<usize> =
            index::sample(&mut self.rng, candidates.len(), count - 1).into_iter().map(|c| candidates[c]).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::with_capacity(count);
        let mut start = 0;
        for cut in cuts.into_iter().chain([len]) {
            pieces.push(start..cut);
            start = cut;
        }
        // Random order: a reader may see any subset of the pieces (the contract's "any byte order").
        pieces.shuffle(&mut self.rng);
        Some(pieces)
    }

    fn schedule_piece(&mut self, ep: usize, op: u64) {
        // Strictly later, so every piece lands at its own simulated time.
        let gap = self.rng.random_range(1..=self.config.latency_max_ns.max(1));
        self.schedule(self.now.saturating_add(gap), Event::Piece { ep, op });
    }

    /// Copies `range` of the head write's data into the target's memory.
    pub(super) fn apply_piece(&mut self, ep: usize, range: std::ops::Range<usize>) {
        let e = &self.eps[ep];
        let (peer, owner) = (e.peer, e.owner);
        let Some(head) = e.queue.front() else { return };
        let OpBody::Write { dst, data } = &head.body else {
            return;
        };
        let op = head.id;
        let Some(bytes) = data.get(range.clone()) else {
            return;
        };
        if let Some(target) = self.nodes.get_mut(&peer) {
            write_region(target, dst.region, dst.offset.saturating_add(range.start as u64), bytes);
        }
        self.digest.bytes(bytes);
        let fields =
            [ep as u64, op, owner.0.into(), peer.0.into(), dst.region.0.into(), dst.offset, range.start as u64];
        self.trace(Tag::Piece, &fields);
    }

    /// The next piece of a torn write lands, unless the target died meanwhile.
    fn on_piece(&mut self, ep: usize, op: u64) {
        if !self.head_in_phase(ep, op, |p| matches!(p, Phase::Applying { .. })) {
            return;
        }
        if !self.peer_live(ep) {
            // The rest of the write is lost with the target's memory.
            self.begin_retry(ep);
            return;
        }
        let Some(head) = self.eps[ep].queue.front_mut() else {
            return;
        };
        let Phase::Applying { pieces, next } = &mut head.phase else {
            return;
        };
        let range = pieces[*next].clone();
        *next += 1;
        let done = *next == pieces.len();
        self.apply_piece(ep, range);
        if done {
            let at = self.now.saturating_add(self.draw_latency());
            self.finish_op(ep, Ok(()), at);
        } else {
            self.schedule_piece(ep, op);
        }
    }

    /// Lands every remaining piece of the head write of `ep` now (revocation, contract rule 3).
    pub(super) fn complete_torn_write(&mut self, ep: usize) {
        let Some(head) = self.eps[ep].queue.front_mut() else {
            return;
        };
        let Phase::Applying { pieces, next } = &mut head.phase else {
            return;
        };
        let rest: Vec<_> = pieces[*next..].to_vec();
        *next = pieces.len();
        for range in rest {
            self.apply_piece(ep, range);
        }
        let at = self.now.saturating_add(self.draw_latency());
        self.finish_op(ep, Ok(()), at);
    }

    /// The head operation's peer is dead: it retries until the peer timeout, counted from its post
    /// or the crash, whichever is later (contract rule 6).
    fn begin_retry(&mut self, ep: usize) {
        let e = &self.eps[ep];
        let crashed_at =
            self.nodes.get(&e.peer).and_then(|n| n.crash_times.get(e.peer_inc as usize).copied()).unwrap_or(self.now);
        let timeout = self.config.peer_timeout_ns;
        let Some(head) = self.eps[ep].queue.front_mut() else {
            return;
        };
        head.phase = Phase::Retrying;
        let op = head.id;
        let at = head.posted_at.max(crashed_at).saturating_add(timeout).max(self.now);
        self.trace(Tag::Retry, &[ep as u64, op, at]);
        self.schedule(at, Event::Fail { ep, op });
    }

    /// The head operation of `ep` has finished applying (or failed): its completion is scheduled
    /// for `at` (never before an earlier operation's) and the next operation may start.
    pub(super) fn finish_op(&mut self, ep: usize, status: Result<(), OpError>, at: u64) {
        let e = &mut self.eps[ep];
        let Some(op) = e.queue.pop_front() else {
            return;
        };
        if status.is_err() && op.epoch == e.epoch {
            // An operation of an older connection epoch must not break the reconnected endpoint.
            e.state = EndpointState::Error;
        }
        let at = at.max(e.last_completion_at);
        e.last_completion_at = at;
        // Failures are always reported (contract rule 4).
        let report = status.is_err() || op.signaled;
        let completion = Completion { wr_id: op.wr_id, kind: op.body.kind(), status };
        self.trace(Tag::Finish, &[ep as u64, op.id, status_code(status), at]);
        tracing::trace!(ep, op = op.id, ?status, at, "simulated operation finished");
        self.schedule(at, Event::Complete { ep, completion, report });
        self.schedule_head(ep);
    }

    fn on_complete(&mut self, ep: usize, completion: Completion, report: bool) {
        let e = &mut self.eps[ep];
        if e.dead {
            return;
        }
        e.outstanding = e.outstanding.saturating_sub(1);
        let fields = [ep as u64, completion.wr_id, status_code(completion.status), u64::from(report)];
        if report && !e.closed {
            e.cq.push_back(completion);
        }
        self.trace(Tag::Complete, &fields);
    }
}

/// Copies `bytes` into `node`'s `region` at `offset`. Callers checked the bounds at post time; an
/// access that no longer fits (it cannot happen while the incarnation is unchanged) is dropped.
pub(super) fn write_region(node: &mut Node, region: crate::RegionId, offset: u64, bytes: &[u8]) {
    let start = offset_usize(offset);
    let dst = node
        .region_index(region)
        .and_then(|r| node.memory.get_mut(r))
        .and_then(|m| m.get_mut(start..start.saturating_add(bytes.len())));
    match dst {
        Some(dst) => dst.copy_from_slice(bytes),
        None => debug_assert!(false, "simulated access outside {region} escaped the post-time bounds check"),
    }
}
