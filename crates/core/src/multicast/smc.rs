//! Small-message multicast (SMC) rings: the sender's ring of `window` slots, built in place,
//! and a receiver's inbox per sender (short payloads copied out, long ones read in place).
//!
//! A sender's messages form its **stream**: stream index 0, 1, 2, ... Each index is either a
//! real message, which occupies the next slot of its ring, or a null (Spindle's null-send),
//! which occupies nothing: the sender only raises `sent_num` past it. A receiver tells them
//! apart by the slot tag: the next unread slot holds stream index `i` exactly when `i` is real.
//! The message with stream index `i` of sender rank `r` among `S` senders has the
//! subgroup-wide sequence number `i × S + r` (round-robin order).

use std::collections::VecDeque;

use super::layout::SLOT_HEADER_BYTES;

/// The sequence number of stream index `index` of sender `rank` among `senders`.
pub(crate) fn seq_of(index: u64, rank: usize, senders: u64) -> u64 {
    index * senders + rank as u64
}

/// A sender's ring: its slots as they are built, committed, pushed, and freed.
///
/// Real messages are counted from 0 in commit order; real message `n` lives in slot
/// `n % window`. Invariant: `freed <= delivered_real <= committed` and
/// `committed - freed <= window`, with `in_ring` holding the stream indices of messages
/// `freed..committed` in order, each with whether receivers deliver it in place.
#[derive(Debug)]
pub(crate) struct SenderRing {
    window: u64,
    slot_bytes: u64,
    max_payload_bytes: usize,
    /// The slots' bytes, header and payload, exactly as they are written to peers (zero-copy:
    /// the application builds the payload here and the push writes straight from it).
    staging: Vec<u8>,
    /// Per slot: a message handed over whole ([`SenderRing::commit_owned`]: its header and
    /// payload in a buffer of its own, pushed from there), or empty when the slot's bytes are
    /// in `staging`. Meaningful for committed slots only.
    owned: Vec<Vec<u8>>,
    /// Real messages committed.
    committed: u64,
    /// Real messages this member has delivered itself.
    delivered_real: u64,
    /// Real messages whose slot may be reused.
    freed: u64,
    /// Stream indices of real messages `freed..committed`, and whether each is delivered in
    /// place (longer than `copy_at_receipt` bytes).
    in_ring: VecDeque<(u64, bool)>,
    /// [`super::SubgroupConfig::copy_at_receipt_bytes`].
    copy_at_receipt: usize,
    /// Stream length: real and null messages assigned so far.
    stream_len: u64,
}

impl SenderRing {
    pub(crate) fn new(window: u64, slot_bytes: u64, copy_at_receipt: usize) -> Self {
        let max_payload_bytes = usize::try_from(slot_bytes - SLOT_HEADER_BYTES).unwrap_or(usize::MAX);
        let len = usize::try_from(window * slot_bytes).unwrap_or(usize::MAX);
        Self {
            window,
            slot_bytes,
            max_payload_bytes,
            staging: vec![0; len],
            owned: vec![Vec::new(); usize::try_from(window).unwrap_or(0)],
            committed: 0,
            delivered_real: 0,
            freed: 0,
            in_ring: VecDeque::with_capacity(usize::try_from(window).unwrap_or(0)),
            copy_at_receipt,
            stream_len: 0,
        }
    }

    pub(crate) fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    pub(crate) fn committed(&self) -> u64 {
        self.committed
    }

    pub(crate) fn freed(&self) -> u64 {
        self.freed
    }

    pub(crate) fn stream_len(&self) -> u64 {
        self.stream_len
    }

    fn slot_range(&self, real: u64) -> std::ops::Range<usize> {
        // Bounded by `staging.len()`, which fit in usize at construction.
        let start = ((real % self.window) * self.slot_bytes) as usize;
        start..start + self.slot_bytes as usize
    }

    /// The payload bytes of the next slot, if the ring has a free one.
    pub(crate) fn reserve(&mut self) -> Option<&mut [u8]> {
        if self.committed - self.freed == self.window {
            return None;
        }
        let range = self.slot_range(self.committed);
        Some(&mut self.staging[range][SLOT_HEADER_BYTES as usize..])
    }

    /// Commits the reserved slot with `len` payload bytes; returns its stream index.
    pub(crate) fn commit(&mut self, len: usize) -> u64 {
        assert!(self.committed - self.freed < self.window, "commit without a free slot");
        assert!(len <= self.max_payload_bytes, "commit of {len} bytes past the slot");
        let index = self.stream_len;
        let position = (self.committed % self.window) as usize;
        self.owned[position] = Vec::new();
        let range = self.slot_range(self.committed);
        let in_place = len > self.copy_at_receipt;
        write_header(&mut self.staging[range], index, len, in_place);
        self.committed_one(index, in_place)
    }

    /// Commits the next slot with `message` as it is: [`SLOT_HEADER_BYTES`] of room for the
    /// header, then the payload. `message` takes the place of the slot's previous buffer,
    /// handed back in `message` (empty if there was none) for reuse. Returns the stream index.
    pub(crate) fn commit_owned(&mut self, message: &mut Vec<u8>) -> u64 {
        assert!(self.committed - self.freed < self.window, "commit without a free slot");
        let header = SLOT_HEADER_BYTES as usize;
        let len = message.len().checked_sub(header).expect("a message has room for its header");
        assert!(len <= self.max_payload_bytes, "commit of {len} bytes past the slot");
        let index = self.stream_len;
        let in_place = len > self.copy_at_receipt;
        write_header(message, index, len, in_place);
        let position = (self.committed % self.window) as usize;
        std::mem::swap(&mut self.owned[position], message);
        message.clear();
        self.committed_one(index, in_place)
    }

    fn committed_one(&mut self, index: u64, in_place: bool) -> u64 {
        self.in_ring.push_back((index, in_place));
        self.committed += 1;
        self.stream_len += 1;
        index
    }

    /// Spindle's null-send: raises the stream to `target` with nulls; returns how many.
    pub(crate) fn add_nulls(&mut self, target: u64) -> u64 {
        let nulls = target.saturating_sub(self.stream_len);
        self.stream_len += nulls;
        nulls
    }

    /// The next own real message to deliver, if its stream index is `index`: its payload.
    pub(crate) fn own_payload(&self, real: u64) -> Option<(u64, &[u8])> {
        let offset = usize::try_from(real.checked_sub(self.freed)?).ok()?;
        let (index, _) = *self.in_ring.get(offset)?;
        let slot = self.slot(real);
        let len = u32::from_le_bytes([slot[8], slot[9], slot[10], slot[11]]) as usize;
        Some((index, &slot[SLOT_HEADER_BYTES as usize..SLOT_HEADER_BYTES as usize + len]))
    }

    pub(crate) fn delivered_real(&self) -> u64 {
        self.delivered_real
    }

    /// Records that this member delivered `count` more of its own real messages.
    pub(crate) fn mark_delivered(&mut self, count: u64) {
        self.delivered_real += count;
        assert!(self.delivered_real <= self.committed, "delivered an own message never committed");
    }

    /// Whether the next message to free is delivered in place (so freeing it waits for the
    /// peers' `delivered` counters rather than their `received` ones).
    pub(crate) fn next_in_place(&self) -> bool {
        self.in_ring.front().is_some_and(|&(_, in_place)| in_place)
    }

    /// Frees slots whose message every peer is done with, and this member has delivered:
    /// `received` and `delivered` are the smallest prefixes of this sender's stream any peer
    /// has received and delivered; a message copied out at receipt needs the first, one
    /// delivered in place the second. Returns how many were freed.
    pub(crate) fn free(&mut self, received: u64, delivered: u64) -> u64 {
        let mut freed = 0;
        while self.freed < self.delivered_real
            && self.in_ring.front().is_some_and(|&(i, in_place)| i < if in_place { delivered } else { received })
        {
            self.in_ring.pop_front();
            self.freed += 1;
            freed += 1;
        }
        freed
    }

    /// The bytes of committed real message `real`'s slot: from its own buffer if it was
    /// handed over whole (header and payload only), else the whole slot in `staging`.
    fn slot(&self, real: u64) -> &[u8] {
        match &self.owned[(real % self.window) as usize] {
            owned if !owned.is_empty() => owned,
            _ => &self.staging[self.slot_range(real)],
        }
    }

    /// The bytes of real messages `from..to` as few writes: contiguous runs of `staging` (split
    /// where the range wraps around the end of the ring) and each message handed over whole on
    /// its own.
    pub(crate) fn runs(&self, from: u64, to: u64) -> impl Iterator<Item = Run<'_>> {
        assert!(
            self.freed <= from && from <= to && to <= self.committed,
            "push of slots {from}..{to} outside the ring (freed {}, committed {})",
            self.freed,
            self.committed
        );
        let mut next = from;
        std::iter::from_fn(move || {
            if next >= to {
                return None;
            }
            let position = next % self.window;
            let owned = &self.owned[position as usize];
            if !owned.is_empty() {
                next += 1;
                return Some(Run { position, bytes: owned, slots: 1 });
            }
            let staged = |n: u64| position + n < self.window && self.owned[(position + n) as usize].is_empty();
            let mut slots = 1;
            while next + slots < to && staged(slots) {
                slots += 1;
            }
            next += slots;
            let start = (position * self.slot_bytes) as usize;
            Some(Run { position, bytes: &self.staging[start..start + (slots * self.slot_bytes) as usize], slots })
        })
    }
}

/// One write of a push: `slots` slots from slot `position` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run<'a> {
    pub(crate) position: u64,
    pub(crate) bytes: &'a [u8],
    pub(crate) slots: u64,
}

/// The slot header's flag (bit 32 of its second word) of a message its sender holds until
/// every member has delivered it: receivers may deliver it in place. Without it a receiver
/// must copy the payload out at receipt, since the sender reuses the slot once all received
/// it. The sender's choice travels with the message, so members configured with different
/// [`super::SubgroupConfig::copy_at_receipt_bytes`] still agree on it.
pub(crate) const HELD_UNTIL_DELIVERED: u64 = 1 << 32;

/// A slot header's second word, read back: the payload length (its low 32 bits) and whether
/// the sender holds the slot until delivered. `Err((len, flags))` if the length is more than
/// `max_len` or a flag this version does not know is set (the high 32 bits, as they were).
pub(crate) fn read_length_word(word: u64, max_len: u64) -> Result<(u64, bool), (u64, u32)> {
    let (len, flags) = (word & u64::from(u32::MAX), (word >> 32) as u32);
    let held = word & HELD_UNTIL_DELIVERED != 0;
    let unknown = flags & !((HELD_UNTIL_DELIVERED >> 32) as u32);
    if len > max_len || unknown != 0 { Err((len, flags)) } else { Ok((len, held)) }
}

/// Writes a slot's header: tag (stream index + 1), payload length, and whether the sender
/// holds the slot until every member delivered the message ([`HELD_UNTIL_DELIVERED`]).
fn write_header(slot: &mut [u8], index: u64, len: usize, held: bool) {
    slot[0..8].copy_from_slice(&(index + 1).to_le_bytes());
    let word = len as u64 | if held { HELD_UNTIL_DELIVERED } else { 0 };
    slot[8..16].copy_from_slice(&word.to_le_bytes());
}

/// A message received from a peer sender, waiting for delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Its stream index.
    pub(crate) index: u64,
    /// Where its payload starts in the SST region if it is delivered in place; `None` if it
    /// was copied into the inbox's buffer.
    pub(crate) at: Option<u64>,
    /// Payload length.
    pub(crate) len: usize,
}

/// Where a pending message's payload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held<'a> {
    /// Copied into the inbox at receipt.
    Copied(&'a [u8]),
    /// In the sender's ring in the SST (this member's copy of it, or the sender's own where
    /// the fabric lends a peer's memory): `len` bytes at `at`.
    InPlace { at: u64, len: usize },
}

/// What a member holds of one peer sender's stream.
///
/// A message its sender did not flag [`HELD_UNTIL_DELIVERED`] (at most the sender's
/// `copy_at_receipt` bytes: a copy that cheap costs less than holding the slot longer) is
/// copied out at receipt, and its sender reuses the slot once every member has received it.
/// A flagged one stays in the sender's ring and is delivered from there (zero-copy, as
/// Derecho's SMC): its sender reuses the slot only once every member has delivered it
/// (ordered subgroups; an unordered one delivers in the poll that receives, before its
/// counters go out, so received suffices). `pending` never holds more than `window` real
/// messages.
#[derive(Debug)]
pub(crate) struct Inbox {
    window: u64,
    max_payload_bytes: usize,
    /// Bytes of the buffer per slot: this member's own `copy_at_receipt`, grown to
    /// `max_payload_bytes` the first time a sender copies out a longer message.
    stride: usize,
    /// Prefix of the sender's stream received.
    pub(crate) received: u64,
    /// Real messages received: the next one is in slot `real_received % window`.
    pub(crate) real_received: u64,
    /// Real messages received and not yet delivered, oldest first; a copied message `real`
    /// has its payload at buffer position `real % window`.
    pub(crate) pending: VecDeque<Pending>,
    buffer: Vec<u8>,
}

impl Inbox {
    /// The inbox of a sender whose messages are of at most `max_payload_bytes`, sized for
    /// copies of up to `copy_at_receipt` bytes (what this member's own config flags).
    pub(crate) fn new(window: u64, max_payload_bytes: usize, copy_at_receipt: usize) -> Self {
        let stride = copy_at_receipt.min(max_payload_bytes);
        let len = usize::try_from(window).unwrap_or(0).saturating_mul(stride);
        Self {
            window,
            max_payload_bytes,
            stride,
            received: 0,
            real_received: 0,
            pending: VecDeque::with_capacity(usize::try_from(window).unwrap_or(0)),
            buffer: vec![0; len],
        }
    }

    /// Whether a window of messages waits: a sender that wrote more overwrote one of them.
    pub(crate) fn is_full(&self) -> bool {
        self.pending.len() as u64 == self.window
    }

    fn buffer_range(&self, real: u64, len: usize) -> std::ops::Range<usize> {
        let start = (real % self.window) as usize * self.stride;
        start..start + len
    }

    /// The buffer for the next real message's payload of `len` bytes (at most the sender's
    /// `max_payload_bytes`), copied out at receipt. A sender that copies out longer messages
    /// than this member would (its `copy_at_receipt` is larger) makes the buffer grow once to
    /// whole slots, the pending copies moved along.
    pub(crate) fn next_buffer(&mut self, len: usize) -> &mut [u8] {
        self.grow_for(len);
        let range = self.buffer_range(self.real_received, len);
        &mut self.buffer[range]
    }

    /// Grows the buffer to whole slots, the pending copies moved along, if a copy of `len`
    /// bytes does not fit a slot's share of it.
    fn grow_for(&mut self, len: usize) {
        assert!(len <= self.max_payload_bytes, "a copy of {len} bytes past the slot");
        if len <= self.stride {
            return;
        }
        let old = std::mem::take(&mut self.buffer);
        let old_stride = std::mem::replace(&mut self.stride, self.max_payload_bytes);
        self.buffer = vec![0; usize::try_from(self.window).unwrap_or(0) * self.stride];
        let first = self.real_received - self.pending.len() as u64;
        for (real, pending) in (first..).zip(&self.pending) {
            if pending.at.is_none() {
                let from = (real % self.window) as usize * old_stride;
                let range = self.buffer_range(real, pending.len);
                self.buffer[range].copy_from_slice(&old[from..from + pending.len]);
            }
        }
    }

    /// Copies every pending message held in place into the buffer, `read(at, out)` filling
    /// `out` with the bytes at `at`: before the memory they lie in is lost (a sender read in
    /// its own memory, whose link is about to reach its next incarnation).
    pub(crate) fn copy_out_in_place<E>(
        &mut self,
        mut read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(longest) = self.pending.iter().filter(|p| p.at.is_some()).map(|p| p.len).max() else {
            return Ok(());
        };
        self.grow_for(longest);
        let first = self.real_received - self.pending.len() as u64;
        for real in first..self.real_received {
            let pending = &self.pending[(real - first) as usize];
            let Some(at) = pending.at else { continue };
            let range = self.buffer_range(real, pending.len);
            read(at, &mut self.buffer[range])?;
            self.pending[(real - first) as usize].at = None;
        }
        Ok(())
    }

    /// Records the next real message: stream index `index`, `len` payload bytes, at `at` in
    /// the SST if delivered in place, else already in [`Inbox::next_buffer`].
    pub(crate) fn push_real(&mut self, index: u64, at: Option<u64>, len: usize) {
        assert!(!self.is_full(), "inbox overflow");
        assert_eq!(index, self.received, "a real message must extend the received prefix");
        self.pending.push_back(Pending { index, at, len });
        self.real_received += 1;
        self.received += 1;
    }

    /// The stream index and payload of pending message `offset` (0 = oldest).
    pub(crate) fn payload(&self, offset: usize) -> Option<(u64, Held<'_>)> {
        let pending = self.pending.get(offset)?;
        let held = match pending.at {
            Some(at) => Held::InPlace { at, len: pending.len },
            None => {
                let real = self.real_received - self.pending.len() as u64 + offset as u64;
                Held::Copied(&self.buffer[self.buffer_range(real, pending.len)])
            }
        };
        Some((pending.index, held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_word_reads_back_as_written_and_unknown_flags_or_overlong_lengths_are_refused() {
        let mut slot = [0u8; 16];
        for (len, held) in [(0, false), (100, true), (4096, false)] {
            write_header(&mut slot, 7, len, held);
            let word = u64::from_le_bytes(slot[8..16].try_into().expect("8 bytes"));
            assert_eq!(read_length_word(word, 4096), Ok((len as u64, held)));
        }
        assert_eq!(read_length_word(4097, 4096), Err((4097, 0)), "longer than a slot");
        // An unknown flag is reported as a flag, with the length as it is, not as a huge length.
        assert_eq!(read_length_word(1 << 40 | HELD_UNTIL_DELIVERED | 12, 4096), Err((12, 0x101)));
    }

    #[test]
    fn a_ring_wraps_in_two_runs_and_frees_only_what_everyone_is_done_with_and_i_delivered() {
        let mut ring = SenderRing::new(4, SLOT_HEADER_BYTES + 8, 1);
        for n in 0..4u8 {
            ring.reserve().expect("free slot")[0] = n;
            // Messages 0 and 2 are copied out at receipt (1 byte), 1 and 3 delivered in place.
            assert_eq!(ring.commit(1 + usize::from(n % 2)), u64::from(n));
        }
        assert!(ring.reserve().is_none(), "a full ring refuses");
        assert_eq!(ring.add_nulls(6), 2);
        ring.mark_delivered(3);
        assert_eq!(ring.free(1, 0), 1, "only stream index 0 is received everywhere");
        assert_eq!(ring.free(10, 1), 0, "index 1 is delivered in place: received is not enough");
        assert_eq!(ring.free(10, 2), 2, "then index 2 goes by its receipt");
        assert_eq!(ring.free(10, 10), 0, "only what this member delivered is freed");
        ring.reserve().expect("freed slot")[0] = 9;
        assert_eq!(ring.commit(1), 6, "after two nulls the next real message is index 6");
        let runs: Vec<_> = ring.runs(3, 5).map(|r| (r.position, r.bytes.len(), r.slots)).collect();
        assert_eq!(runs, vec![(3, 24, 1), (0, 24, 1)]);
        let (index, payload) = ring.own_payload(4).expect("own message");
        assert_eq!((index, payload), (6, &[9u8][..]));
    }

    #[test]
    fn messages_handed_over_whole_are_pushed_from_their_own_buffers_between_staged_runs() {
        let header = SLOT_HEADER_BYTES as usize;
        let mut ring = SenderRing::new(4, SLOT_HEADER_BYTES + 8, 8);
        ring.reserve().expect("free slot")[0] = 1;
        ring.commit(1);
        let mut message = vec![0; header + 3];
        message[header..].copy_from_slice(b"xyz");
        assert_eq!(ring.commit_owned(&mut message), 1);
        assert!(message.is_empty(), "the slot held no buffer before");
        for n in 2..4u8 {
            ring.reserve().expect("free slot")[0] = n;
            ring.commit(1);
        }
        let runs: Vec<_> = ring.runs(0, 4).map(|r| (r.position, r.bytes.len(), r.slots)).collect();
        assert_eq!(runs, vec![(0, 24, 1), (1, header + 3, 1), (2, 48, 2)], "staged, owned, staged run");
        let owned = ring.runs(1, 2).next().expect("one run").bytes;
        assert_eq!(&owned[..8], &2u64.to_le_bytes(), "tag: stream index 1 + 1");
        assert_eq!(&owned[8..12], &3u32.to_le_bytes(), "payload length");
        assert_eq!(ring.own_payload(1), Some((1, &b"xyz"[..])));
        ring.mark_delivered(4);
        assert_eq!(ring.free(4, 4), 4);
        // Slot 1 taken by a staged message drops the buffer; one handed over returns it.
        ring.reserve().expect("free slot")[0] = 9;
        ring.commit(1);
        let mut again = vec![0; header + 1];
        assert_eq!(ring.commit_owned(&mut again), 5);
        assert!(again.is_empty(), "slot 1's buffer went with the staged commit");
        assert_eq!(ring.own_payload(5), Some((5, &[0u8][..])));
        assert_eq!(ring.own_payload(4), Some((4, &[9u8][..])));
    }

    #[test]
    fn an_inbox_copies_short_payloads_notes_where_long_ones_lie_and_bounds_them() {
        let mut inbox = Inbox::new(2, 8, 2);
        inbox.received = 3;
        inbox.next_buffer(2).copy_from_slice(b"ab");
        inbox.push_real(3, None, 2);
        inbox.push_real(4, Some(200), 3);
        assert!(inbox.is_full());
        assert_eq!(inbox.payload(0), Some((3, Held::Copied(&b"ab"[..]))));
        assert_eq!(inbox.payload(1), Some((4, Held::InPlace { at: 200, len: 3 })));
        assert_eq!(inbox.payload(2), None);
        assert_eq!(seq_of(4, 1, 3), 13);
    }

    /// A window of 3 slots of up to 8 bytes, sized for 2-byte copies: "ab" copied out (index
    /// 0), then 7 bytes held in place at 300 (index 1).
    fn inbox_with_a_copy_and_one_in_place() -> Inbox {
        let mut inbox = Inbox::new(3, 8, 2);
        inbox.next_buffer(2).copy_from_slice(b"ab");
        inbox.push_real(0, None, 2);
        inbox.push_real(1, Some(300), 7);
        inbox
    }

    #[test]
    fn an_inbox_grows_for_a_sender_that_copies_out_longer_messages_and_keeps_what_it_holds() {
        let mut inbox = inbox_with_a_copy_and_one_in_place();
        inbox.next_buffer(6).copy_from_slice(b"cdefgh");
        inbox.push_real(2, None, 6);
        assert_eq!(inbox.payload(0), Some((0, Held::Copied(&b"ab"[..]))), "moved along when the buffer grew");
        assert_eq!(inbox.payload(1), Some((1, Held::InPlace { at: 300, len: 7 })));
        assert_eq!(inbox.payload(2), Some((2, Held::Copied(&b"cdefgh"[..]))));
    }

    #[test]
    fn an_inbox_copies_out_what_it_held_in_place_and_keeps_its_copies() {
        let mut inbox = inbox_with_a_copy_and_one_in_place();
        inbox.push_real(2, Some(400), 8);
        let mut asked = Vec::new();
        inbox
            .copy_out_in_place(|at, out: &mut [u8]| {
                asked.push((at, out.len()));
                out.fill(if at == 300 { b'x' } else { b'y' });
                Ok::<(), ()>(())
            })
            .expect("read");
        assert_eq!(asked, [(300, 7), (400, 8)]);
        assert_eq!(inbox.payload(0), Some((0, Held::Copied(&b"ab"[..]))));
        assert_eq!(inbox.payload(1), Some((1, Held::Copied(&b"xxxxxxx"[..]))));
        assert_eq!(inbox.payload(2), Some((2, Held::Copied(&b"yyyyyyyy"[..]))));
        inbox.copy_out_in_place(|_, _| Err("nothing is left in place")).expect("no read");
    }

    #[test]
    fn a_slot_header_carries_whether_its_sender_holds_it_until_delivered() {
        let mut ring = SenderRing::new(2, SLOT_HEADER_BYTES + 8, 4);
        ring.reserve().expect("free slot");
        ring.commit(4);
        ring.reserve().expect("free slot");
        ring.commit(5);
        let word = |real: u64| {
            let bytes = ring.runs(real, real + 1).next().expect("one run").bytes;
            u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"))
        };
        assert_eq!(word(0), 4, "copied out at receipt: no flag");
        assert_eq!(word(1), 5 | HELD_UNTIL_DELIVERED);
    }
}
