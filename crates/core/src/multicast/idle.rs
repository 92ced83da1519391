//! The idle fast path: which subgroups a poll may skip.
//!
//! A member in many subgroups of which few carry traffic used to run every step (receive,
//! deliver, null-send, push) of every subgroup on every poll. Each step exits early when idle,
//! but only after touching the subgroup's own state (its inboxes, ring, pushes: several cache
//! lines per subgroup, in separate allocations), and perf put most of an idle subgroup's cost in
//! those loads: with more threads than cores the poll thread is switched out constantly and
//! comes back to a cold cache (docs/BENCHMARKS.md, "Idle subgroups").
//!
//! A subgroup this member is not in is always skipped. A subgroup is **settled** after a poll that left it with nothing to do without new input:
//! nothing this member holds can be delivered (for an ordered subgroup, it lacks the next
//! message of the order; at receipt, everything held was delivered), no slot waits to be freed,
//! and every peer has been written everything (no slot, counter or commit unpushed). Such a
//! subgroup can only get work from a peer sender's guard (`sent_num`) moving past what this
//! member received, from a local send, or from a reconnect (which rewinds the pushes). A poll
//! checks a settled subgroup against a copy of its peer senders' guards (one copy per peer row
//! per poll) and the prefixes received, and runs the steps only when a guard moved;
//! `Member::reserve` and reconnects unsettle. Stability, freeing and null-sends read peers'
//! `received` counters, but only while a message is held undelivered or a slot waits to be
//! freed, which a settled subgroup has not.

use microrep_fabric::Fabric;

use super::api::MulticastError;
use super::config::Delivery;
use super::layout::{Layout, SST_REGION};
use super::member::Subgroup;
use super::smc::SenderRing;

/// Per subgroup index of the view: whether it is settled, and the guards that unsettle it.
#[derive(Debug, Default)]
pub(super) struct Quiet {
    settled: Vec<bool>,
    /// Per subgroup: its entries in `guard_in` and `received`.
    watch: Vec<(usize, usize)>,
    /// Where each watched `sent_num` word is in `scratch`, all subgroups in a row.
    guard_in: Vec<usize>,
    /// The prefix of that sender's stream this member received when the subgroup settled.
    received: Vec<u64>,
    /// Per peer row with a watched guard: the region range copied into `scratch`, from its
    /// first watched subgroup's counter block to its last (a row's blocks are contiguous), and
    /// where the copy starts.
    spans: Vec<(u64, usize, usize)>,
    scratch: Vec<u8>,
    /// Whether `scratch` was copied in this poll.
    fresh: bool,
}

impl Quiet {
    /// For the subgroups of a view: none settled; the guards each watches.
    pub(super) fn new(subgroups: &[Option<Subgroup>], layout: &Layout) -> Self {
        // Per peer sender row, the range of its watched guards.
        let mut rows: Vec<(usize, u64, u64)> = Vec::new();
        for sub in subgroups.iter().flatten() {
            for (rank, _) in sub.inboxes.iter().enumerate().filter(|(_, inbox)| inbox.is_some()) {
                let row = sub.sender_rows[rank];
                let at = sub.layout.sent_at(layout, row);
                match rows.iter_mut().find(|(r, _, _)| *r == row) {
                    Some((_, first, last)) => (*first, *last) = ((*first).min(at), (*last).max(at + 8)),
                    None => rows.push((row, at, at + 8)),
                }
            }
        }
        let mut quiet = Self::default();
        for &(_, first, end) in &rows {
            let len = (end - first) as usize;
            quiet.spans.push((first, len, quiet.scratch.len()));
            quiet.scratch.resize(quiet.scratch.len() + len, 0);
        }
        for sub in subgroups {
            let first = quiet.guard_in.len();
            if let Some(sub) = sub {
                for (rank, _) in sub.inboxes.iter().enumerate().filter(|(_, inbox)| inbox.is_some()) {
                    let row = sub.sender_rows[rank];
                    let at = sub.layout.sent_at(layout, row);
                    let span = rows.iter().position(|(r, _, _)| *r == row).expect("every watched row has a span");
                    let (span_at, _, in_scratch) = quiet.spans[span];
                    quiet.guard_in.push(in_scratch + (at - span_at) as usize);
                    quiet.received.push(0);
                }
            }
            quiet.watch.push((first, quiet.guard_in.len()));
            // A subgroup this member is not in never has anything to do.
            quiet.settled.push(sub.is_none());
        }
        quiet
    }

    /// A poll begins: the guards are copied again at the first check.
    pub(super) fn begin_poll(&mut self) {
        self.fresh = false;
    }

    /// Whether `subgroup` is settled and no peer sender's guard moved since: the poll may skip
    /// it. The first check of a poll copies each peer row's watched range at once (one copy
    /// per peer, sequential lines, instead of one load per guard); the copy is only a hint: a
    /// guard read torn or stale is read again by the next poll, and a subgroup found unsettled
    /// runs its steps, which read the guards properly.
    pub(super) fn skip<F: Fabric>(&mut self, fabric: &F, subgroup: usize) -> Result<bool, MulticastError> {
        if !self.settled[subgroup] {
            return Ok(false);
        }
        let (first, end) = self.watch[subgroup];
        if first == end {
            return Ok(true);
        }
        if !self.fresh {
            for &(at, len, in_scratch) in &self.spans {
                fabric.read_local(SST_REGION, at, &mut self.scratch[in_scratch..in_scratch + len])?;
            }
            self.fresh = true;
        }
        for i in first..end {
            let at = self.guard_in[i];
            let guard = u64::from_le_bytes(self.scratch[at..at + 8].try_into().expect("8 bytes"));
            if guard > self.received[i] {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// After a poll ran the steps of `sub`: settles it if it has nothing left to do without new
    /// input (module docs), noting what it received from each peer sender.
    pub(super) fn update(&mut self, sub: &Subgroup, delivery: Delivery) {
        let settled = sub.settled(delivery);
        self.settled[sub.index] = settled;
        if settled {
            let (first, _) = self.watch[sub.index];
            for (i, inbox) in sub.inboxes.iter().flatten().enumerate() {
                self.received[first + i] = inbox.received;
            }
        }
    }

    /// `subgroup` has local work (a send).
    pub(super) fn unsettle(&mut self, subgroup: usize) {
        if let Some(settled) = self.settled.get_mut(subgroup) {
            *settled = false;
        }
    }

    /// Every subgroup may have work (a reconnect rewound the pushes).
    pub(super) fn unsettle_all(&mut self) {
        self.settled.fill(false);
    }
}

impl Subgroup {
    /// Whether this subgroup has nothing to do until a peer sender's guard moves or this
    /// member sends (see the module docs).
    fn settled(&self, delivery: Delivery) -> bool {
        let ring = self.ring.as_ref();
        let deliverable = match delivery {
            _ if self.layout.senders == 0 => false,
            Delivery::Ordered => {
                let next_rank = (self.delivered % self.layout.senders) as usize;
                self.own_received(next_rank) > self.delivered / self.layout.senders
            }
            Delivery::Unordered => {
                self.inboxes.iter().flatten().any(|inbox| !inbox.pending.is_empty())
                    || ring.is_some_and(|r| r.delivered_real() < r.committed())
            }
        };
        let unfreed = ring.is_some_and(|r| r.freed() < r.delivered_real());
        let committed = ring.map_or(0, SenderRing::committed);
        let unpushed = ring.map_or(0, SenderRing::stream_len) != self.stream_len_pushed
            || self.pushes.iter().any(|p| p.real_pushed < committed || p.version_pushed != Some(self.version));
        !deliverable && !unfreed && !unpushed
    }
}
