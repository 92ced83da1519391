//! The poll loop's steps for one subgroup: receive, deliver, null-send, push (see
//! [`super::member`]). Each reads the SST from local memory (a pulled ring from its sender's)
//! and batches its writes.

use std::borrow::Cow;

use microrep_fabric::{Endpoint, Fabric, FabricError, NodeId, PostFlags, RemoteAddr};

use super::api::{Deliver, DeliveryBatch, Message, MulticastError, Stats};
use super::config::Delivery;
use super::layout::{SLOT_HEADER_BYTES, SST_REGION};
use super::member::{Ctx, Link, Subgroup};
use super::planted::PlantedBug;
use super::smc::{Held, Inbox, SenderRing, read_length_word, seq_of};

impl Subgroup {
    /// Receive, batched: drains every peer sender up to its guard (or until the inbox for it is
    /// full). The new `received` counters go out in one counter-block write per peer.
    pub(super) fn receive<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        links: &[Link<F::Endpoint>],
    ) -> Result<bool, MulticastError> {
        let mut progressed = false;
        for rank in 0..self.inboxes.len() {
            let ring = match self.sender_links.get(rank).copied().flatten() {
                // Pulled: the ring is read in the sender's own memory, once its link exists.
                Some(link) => match links[link].ep.as_ref() {
                    Some(ep) => RingAt::<F>::Sender(ep),
                    None => continue,
                },
                None => RingAt::Local(ctx.fabric),
            };
            progressed |= self.receive_from(ctx, rank, &ring)?;
        }
        Ok(progressed)
    }

    /// Receives what sender `rank`'s guard covers (or until the inbox for it is full), reading
    /// its ring at `ring`.
    pub(super) fn receive_from<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        rank: usize,
        ring: &RingAt<'_, F>,
    ) -> Result<bool, MulticastError> {
        let no_guard = ctx.config.bug(PlantedBug::NoGuard);
        let mut progressed = false;
        let Some(inbox) = self.inboxes[rank].as_mut() else { return Ok(false) };
        let sent_at = self.layout.sent_at(ctx.layout, self.sender_rows[rank]);
        let sent = ctx.fabric.load_u64(SST_REGION, sent_at)?;
        if let RingAt::Sender(_) = ring
            && inbox.received < sent
            && ring.load_u64(sent_at)? < sent
        {
            // The sender's own memory is behind the guard it pushed: this link reaches a later
            // incarnation of it (connected after it died and came back), whose memory holds
            // none of these messages. Nothing is received from it; a view change removes it.
            return Ok(false);
        }
        loop {
            let index = inbox.received;
            let guarded = index < sent;
            if !guarded && !no_guard {
                // The common case of an idle sender: one load, no slot arithmetic (a
                // division here was most of an idle subgroup's cost).
                break;
            }
            let slot = self.layout.slot_at(rank, inbox.real_received % self.layout.window);
            // The guard was read first (acquire): every slot below it has fully landed.
            let tag = ring.load_u64(slot)?;
            let real = tag == index + 1;
            if !guarded && !real {
                break;
            }
            if real {
                if inbox.is_full() {
                    break;
                }
                let word = ring.load_u64(slot + 8)?;
                let max_len = self.layout.slot_bytes - SLOT_HEADER_BYTES;
                let (len, held) =
                    read_length_word(word, max_len).map_err(|(len, flags)| MulticastError::CorruptSlot {
                        subgroup: self.index,
                        sender: self.sender_ids[rank],
                        index,
                        len,
                        flags,
                        max_len,
                    })?;
                let (at, len) = (slot + SLOT_HEADER_BYTES, len as usize);
                if held {
                    inbox.push_real(index, Some(at), len);
                } else {
                    ring.copy(at, inbox.next_buffer(len))?;
                    inbox.push_real(index, None, len);
                }
            } else {
                // A null: the slot still holds an older message (or is unwritten).
                inbox.received += 1;
            }
            progressed = true;
        }
        if progressed {
            self.version += 1;
        }
        Ok(progressed)
    }

    /// This member's prefix of sender `rank`'s stream.
    pub(super) fn own_received(&self, rank: usize) -> u64 {
        match &self.inboxes[rank] {
            Some(inbox) => inbox.received,
            None => self.ring.as_ref().map_or(0, |ring| ring.stream_len()),
        }
    }

    /// Delivery, batched: every sequence number that all members have received, in order, in
    /// one upcall; then one counter-block write per peer. Stability (Derecho's delivery
    /// predicate): message `i` of sender `k` is stable when `received[k] > i` in every
    /// member's row. With `trim` (a view change's cleanup), what is below the ragged trim is
    /// delivered instead.
    pub(super) fn deliver<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        links: &[Link<F::Endpoint>],
        deliver: &mut impl Deliver,
        stats: &mut Stats,
        trim: Option<&[u64]>,
    ) -> Result<bool, MulticastError> {
        if self.layout.senders == 0 {
            // Every sender left in an earlier view change: nothing more to deliver.
            return Ok(false);
        }
        if ctx.config.subgroups[self.index].delivery == Delivery::Unordered {
            return self.deliver_at_receipt(ctx, links, deliver, stats, trim);
        }
        let before_stable = ctx.config.bug(PlantedBug::DeliverBeforeStable);
        // This member's own prefix bounds stability: if it lacks the next message, nothing
        // is deliverable and the peers' rows need not be read (idle subgroups stay cheap).
        let next_rank = (self.delivered % self.layout.senders) as usize;
        if trim.is_none() && self.own_received(next_rank) <= self.delivered / self.layout.senders {
            // Nothing to deliver: only a slot may have become free.
            let freed = self.free_slots(ctx)?;
            return Ok(freed > 0);
        }
        for rank in 0..self.stable.len() {
            if let Some(trim) = trim {
                self.stable[rank] = trim[rank];
                continue;
            }
            let mut stable = self.own_received(rank);
            if !before_stable {
                for &row in &self.peer_rows {
                    stable =
                        stable.min(ctx.fabric.load_u64(SST_REGION, self.layout.received_at(ctx.layout, row, rank))?);
                }
            }
            self.stable[rank] = stable;
        }
        self.taken.fill(0);
        let senders = self.layout.senders;
        let mut next = self.delivered;
        let mut payloads: Vec<(NodeId, u64, Cow<'_, [u8]>)> = Vec::new();
        loop {
            let rank = (next % senders) as usize;
            let index = next / senders;
            if index >= self.stable[rank] {
                break;
            }
            let taken = self.taken[rank];
            if let Some((real_index, payload)) =
                pending_payload(self.ring_at(ctx.fabric, links, rank), &self.inboxes[rank], self.ring.as_ref(), taken)?
            {
                assert!(real_index >= index, "a pending message precedes the delivery point");
                if real_index == index {
                    payloads.push((self.sender_ids[rank], next, payload));
                    self.taken[rank] += 1;
                }
            }
            next += 1;
        }
        let progressed = next != self.delivered;
        hand_over(ctx, self.index, &payloads, deliver, stats);
        drop(payloads);
        self.take_delivered();
        debug_assert_eq!(seq_of(next / senders, (next % senders) as usize, senders), next);
        if progressed {
            self.delivered = next;
            self.version += 1;
        }
        let freed = self.free_slots(ctx)?;
        Ok(progressed || freed > 0)
    }

    /// Delivery at receipt ([`Delivery::Unordered`]): every received message not yet delivered,
    /// sender by sender in each one's order, in one upcall; with `trim` (a view change's
    /// cleanup), only those below it. `delivered` counts messages here, not sequence numbers.
    fn deliver_at_receipt<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        links: &[Link<F::Endpoint>],
        deliver: &mut impl Deliver,
        stats: &mut Stats,
        trim: Option<&[u64]>,
    ) -> Result<bool, MulticastError> {
        self.taken.fill(0);
        let senders = self.layout.senders;
        let mut payloads: Vec<(NodeId, u64, Cow<'_, [u8]>)> = Vec::new();
        for rank in 0..self.stable.len() {
            let bound = trim.map_or(u64::MAX, |t| t[rank]);
            let sender = self.sender_ids[rank];
            loop {
                let taken = self.taken[rank];
                let at = self.ring_at(ctx.fabric, links, rank);
                let next = pending_payload(at, &self.inboxes[rank], self.ring.as_ref(), taken)?;
                let Some((index, payload)) = next.filter(|&(index, _)| index < bound) else { break };
                payloads.push((sender, seq_of(index, rank, senders), payload));
                self.taken[rank] += 1;
            }
        }
        let count = payloads.len() as u64;
        hand_over(ctx, self.index, &payloads, deliver, stats);
        drop(payloads);
        self.take_delivered();
        if count > 0 {
            self.delivered += count;
            self.version += 1;
        }
        let freed = self.free_slots(ctx)?;
        Ok(count > 0 || freed > 0)
    }

    /// Drops what the last delivery took (`taken` per sender rank) from the inboxes and marks
    /// this member's own messages delivered.
    fn take_delivered(&mut self) {
        for (rank, &taken) in self.taken.iter().enumerate() {
            match &mut self.inboxes[rank] {
                Some(inbox) => {
                    inbox.pending.drain(..taken);
                }
                None => {
                    if let Some(ring) = &mut self.ring {
                        ring.mark_delivered(taken as u64);
                    }
                }
            }
        }
    }

    /// Slots whose message every peer is done with, and this member delivered, can be reused;
    /// checked on every poll, since the last peer's counter may arrive after the delivery.
    /// "Done" is received for a message copied out at receipt, delivered for one delivered
    /// in place ([`Inbox`]); an unordered subgroup delivers in the poll that receives, before
    /// its counters go out, so received suffices there for both.
    fn free_slots<F: Fabric>(&mut self, ctx: &Ctx<'_, F>) -> Result<u64, MulticastError> {
        let mut freed = 0;
        if let (Some(rank), Some(ring)) = (self.my_rank, self.ring.as_mut())
            && ring.freed() < ring.delivered_real()
        {
            let on_receipt = ctx.config.subgroups[self.index].delivery == Delivery::Unordered
                || ctx.config.bug(PlantedBug::FreeOnReceipt);
            // The peers' `delivered` counters are read only when the next slot to free needs
            // them; otherwise no message delivered in place is freed in this poll (0).
            let in_place = !on_receipt && ring.next_in_place();
            let senders = self.layout.senders;
            let (mut received, mut delivered) = (ring.stream_len(), ring.stream_len());
            for &row in &self.peer_rows {
                let peer_received = ctx.fabric.load_u64(SST_REGION, self.layout.received_at(ctx.layout, row, rank))?;
                received = received.min(peer_received);
                delivered = delivered.min(if on_receipt {
                    peer_received
                } else if in_place {
                    // Delivered sequence numbers below `d` hold stream indices below
                    // ceil((d - rank) / senders) of this sender.
                    let d = ctx.fabric.load_u64(SST_REGION, self.layout.delivered_at(ctx.layout, row))?;
                    d.saturating_sub(rank as u64).div_ceil(senders)
                } else {
                    0
                });
            }
            freed = ring.free(received, delivered);
        }
        Ok(freed)
    }

    /// This member's counter block: sent_num, received per sender, delivered.
    pub(super) fn counter_block(&self) -> Vec<u8> {
        let mut block = Vec::with_capacity(self.layout.block_bytes() as usize);
        block.extend_from_slice(&self.ring.as_ref().map_or(0, |ring| ring.stream_len()).to_le_bytes());
        for rank in 0..self.inboxes.len() {
            block.extend_from_slice(&self.own_received(rank).to_le_bytes());
        }
        block.extend_from_slice(&self.delivered.to_le_bytes());
        block
    }

    /// Spindle's null-send: a sender whose stream lags a message it would precede in the
    /// round-robin order adds nulls up to it, as one raise of its stream length (one counter
    /// in the next block write), so an idle or slow sender does not hold the order back. When
    /// nobody sends, nobody needs a null: an idle group is quiescent.
    pub(super) fn null_send(&mut self, stats: &mut Stats) -> bool {
        let (Some(me), Some(ring)) = (self.my_rank, self.ring.as_mut()) else { return false };
        let mut target = 0;
        for (rank, inbox) in self.inboxes.iter().enumerate() {
            let Some(inbox) = inbox else { continue };
            // Sender `rank`'s last received message has index received - 1; this member's
            // messages before it in the order are its indices below received (rank > me) or
            // below received - 1 (rank < me).
            let needed = if rank > me { inbox.received } else { inbox.received.saturating_sub(1) };
            target = target.max(needed);
        }
        let nulls = ring.add_nulls(target);
        stats.nulls_sent += nulls;
        nulls > 0
    }

    /// Push, batched: per peer, the ring's committed slots not yet written to it (at most two
    /// WRITEs: two only when the run wraps), then the counter block if it changed. The block
    /// holds `sent_num`, so posting it after the slots on the same FIFO endpoint is what makes
    /// it their guard. A full queue leaves the rest for the next poll.
    pub(super) fn push<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        links: &mut [Link<F::Endpoint>],
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        // A commit changes sent_num without a poll step noticing: count it as a change.
        let stream_len = self.ring.as_ref().map_or(0, |ring| ring.stream_len());
        if stream_len != self.stream_len_pushed {
            self.stream_len_pushed = stream_len;
            self.version += 1;
        }
        // The common case of an idle subgroup: every peer has everything; build nothing.
        let committed = self.ring.as_ref().map_or(0, |ring| ring.committed());
        if self.pushes.iter().all(|p| p.real_pushed >= committed && p.version_pushed == Some(self.version)) {
            return Ok(false);
        }
        let block = self.counter_block();
        let block_at = self.layout.block_at(ctx.layout, self.my_row);
        let mut work = false;
        let pulled = !self.sender_links.is_empty();
        if pulled {
            // The peers compare the guard they were sent with this copy, which is never behind it
            // (`receive_from`).
            ctx.fabric.write_local(SST_REGION, block_at, &block)?;
        }
        if pulled && let (Some(rank), Some(ring)) = (self.my_rank, self.ring.as_ref()) {
            // Pulled: the slots go once into this member's own row, where every peer reads
            // them; the counter blocks below, posted after, are their guard.
            let committed = ring.committed();
            self.local_pushed = self.local_pushed.max(ring.freed());
            for run in ring.runs(self.local_pushed, committed) {
                ctx.fabric.write_local(SST_REGION, self.layout.slot_at(rank, run.position), run.bytes)?;
                self.local_pushed += run.slots;
                work = true;
            }
            for push in &mut self.pushes {
                push.real_pushed = committed;
            }
        }
        for push in &mut self.pushes {
            let link = &mut links[push.link];
            if link.broken {
                continue;
            }
            if let (Some(rank), Some(ring)) = (self.my_rank, self.ring.as_ref()) {
                let committed = ring.committed();
                // A reconnect rewound to the freed point of its time; the peer may have had
                // more, and what is freed since needs no writing: every member holds it.
                push.real_pushed = push.real_pushed.max(ring.freed());
                if push.real_pushed < committed {
                    for run in ring.runs(push.real_pushed, committed) {
                        let dst = RemoteAddr::new(SST_REGION, self.layout.slot_at(rank, run.position));
                        if !post(link, dst, run.bytes, stats)? {
                            break;
                        }
                        push.real_pushed += run.slots;
                        work = true;
                    }
                }
                if push.real_pushed < committed {
                    continue;
                }
            }
            if push.version_pushed != Some(self.version)
                && post(link, RemoteAddr::new(SST_REGION, block_at), &block, stats)?
            {
                push.version_pushed = Some(self.version);
                work = true;
            }
        }
        Ok(work)
    }
}

/// Where a peer sender's ring is read: this member's copy in its own SST, pushed there by the
/// sender, or the sender's own memory, lent by the link to it (pulled: `Subgroup::sender_links`).
pub(super) enum RingAt<'a, F: Fabric> {
    Local(&'a F),
    Sender(&'a F::Endpoint),
    /// Pulled, but the link to the sender was never made: nothing of it was received.
    Unlinked,
}

impl<'a, F: Fabric> RingAt<'a, F> {
    fn load_u64(&self, offset: u64) -> Result<u64, FabricError> {
        match self {
            RingAt::Local(fabric) => fabric.load_u64(SST_REGION, offset),
            RingAt::Sender(ep) => ep.peer_load_u64(RemoteAddr::new(SST_REGION, offset)),
            RingAt::Unlinked => Err(unlinked()),
        }
    }

    /// Copies the bytes at `offset` into `out`. The caller reads only a received slot that its
    /// sender does not reuse until this member's counters say so.
    fn copy(&self, offset: u64, out: &mut [u8]) -> Result<(), FabricError> {
        match self {
            RingAt::Local(fabric) => fabric.read_local(SST_REGION, offset, out),
            RingAt::Sender(ep) => {
                // SAFETY: the slot's sender does not rewrite it before this member's counters
                // cover it, and they go out after this copy (`push` follows `receive`).
                out.copy_from_slice(&unsafe { ep.peer_bytes(RemoteAddr::new(SST_REGION, offset), out.len()) }?);
                Ok(())
            }
            RingAt::Unlinked => Err(unlinked()),
        }
    }

    /// # Safety
    ///
    /// As [`Fabric::local_bytes`] and [`Endpoint::peer_bytes`]: nobody changes the bytes while
    /// they are lent.
    unsafe fn bytes(self, offset: u64, len: usize) -> Result<Cow<'a, [u8]>, FabricError> {
        match self {
            // SAFETY: the caller's contract.
            RingAt::Local(fabric) => unsafe { fabric.local_bytes(SST_REGION, offset, len) },
            // SAFETY: the caller's contract.
            RingAt::Sender(ep) => unsafe { ep.peer_bytes(RemoteAddr::new(SST_REGION, offset), len) },
            RingAt::Unlinked => Err(unlinked()),
        }
    }
}

/// Pulled messages were received through a link; one that never existed held none.
fn unlinked() -> FabricError {
    FabricError::InvalidLayout("a pulled sender's ring read without a link to it".to_owned())
}

impl Subgroup {
    /// Where sender `rank`'s ring is read.
    fn ring_at<'a, F: Fabric>(&self, fabric: &'a F, links: &'a [Link<F::Endpoint>], rank: usize) -> RingAt<'a, F> {
        match self.sender_links.get(rank).copied().flatten() {
            Some(link) => links[link].ep.as_ref().map_or(RingAt::Unlinked, RingAt::Sender),
            None => RingAt::Local(fabric),
        }
    }
}

/// A pending message's stream index and payload.
type Payload<'a> = (u64, Cow<'a, [u8]>);

/// The stream index and payload of a sender's message `offset` places after its next one to
/// deliver, if received: a peer's (`inbox`) read in place from its ring (`at`), this member's
/// own from its `ring`.
fn pending_payload<'a, F: Fabric>(
    at: RingAt<'a, F>,
    inbox: &'a Option<Inbox>,
    ring: Option<&'a SenderRing>,
    offset: usize,
) -> Result<Option<Payload<'a>>, MulticastError> {
    Ok(match inbox {
        Some(inbox) => match inbox.payload(offset) {
            Some((index, Held::Copied(payload))) => Some((index, Cow::Borrowed(payload))),
            Some((index, Held::InPlace { at: offset, len })) => {
                // SAFETY: the sender rewrites the slot of a message delivered in place only
                // once every member's `delivered` (ordered) or `received` (unordered) counter
                // covers it, and this member publishes its counters after the upcall that takes
                // the payload has returned and the payload is dropped (`push` follows
                // `deliver`).
                let payload = unsafe { at.bytes(offset, len) }?;
                Some((index, payload))
            }
            None => None,
        },
        None => ring
            .and_then(|ring| ring.own_payload(ring.delivered_real() + offset as u64))
            .map(|(index, payload)| (index, Cow::Borrowed(payload))),
    })
}

/// Hands `payloads` (sender, sequence number, bytes) to the application in one upcall.
fn hand_over<F: Fabric>(
    ctx: &Ctx<'_, F>,
    subgroup: usize,
    payloads: &[(NodeId, u64, Cow<'_, [u8]>)],
    deliver: &mut impl Deliver,
    stats: &mut Stats,
) {
    if payloads.is_empty() {
        return;
    }
    let messages: Vec<Message<'_>> =
        payloads.iter().map(|(sender, seq, payload)| Message { sender: *sender, seq: *seq, payload }).collect();
    stats.delivered += messages.len() as u64;
    stats.batches += 1;
    deliver.deliver(DeliveryBatch { epoch: ctx.epoch, subgroup, messages: &messages });
}

/// Posts one unsignaled WRITE; false if it must wait (queue full) or the link failed.
pub(super) fn post<E: Endpoint>(
    link: &mut Link<E>,
    dst: RemoteAddr,
    data: &[u8],
    stats: &mut Stats,
) -> Result<bool, MulticastError> {
    let Some(ep) = link.ep.as_mut() else {
        link.broken = true;
        return Ok(false);
    };
    match ep.post_write(0, dst, data, PostFlags::NONE) {
        Ok(()) => {
            stats.writes += 1;
            stats.write_bytes += data.len() as u64;
            Ok(true)
        }
        Err(FabricError::QueueFull { .. }) => Ok(false),
        Err(FabricError::PeerUnreachable(..)) => {
            link.broken = true;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
