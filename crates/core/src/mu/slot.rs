//! The layout of one log slot and its checksum.
//!
//! ```text
//!  0 ballot word u64  low half: CRC32C of the value part and the proposal number; high half:
//!                     the proposal number that wrote it (u32; 0 = empty)
//!  8 index u64        absolute log index (disambiguates laps of the circular log)
//! 16 request_id u64   the proposer's id for the request
//! 24 proposer u16, kind u8, reserved u8, len u32
//! 32 reserved u64
//! 40 payload[len]
//! 40 + len: canary byte (1), trusted by nothing but a planted bug
//! ```
//!
//! An entry occupies the first [`encoded_len`] bytes of its slot; a writer writes only those
//! and a reader reads the header, then only as much payload as it announces
//! (`ReplicationPlane::read_entry`), so a 64-byte command costs the same in a slot of 1 KiB as
//! in one of 128 bytes. Bytes after the canary are whatever an earlier lap left there.
//!
//! The *value part* is bytes 8 on ([`VALUE_START`]); the checksum covers bytes 8..40, the
//! payload and the proposal number. A reader may see a slot partially written, in any byte order (a NIC does not
//! promise placement order), so completeness is decided by the checksum, never by the canary
//! alone (DESIGN.md "Visibility").
//!
//! **Replacing a slot is atomic for readers.** The ballot word carries the checksum and the
//! fabric never tears an aligned 8-byte word, so a slot decodes only to a ballot word and a
//! value part written together. The value part does not depend on the ballot, so
//! re-accepting a value that a slot already holds at a higher ballot (a new leader's prepare
//! adopting it, Listing 2 line 24) rewrites identical bytes: torn at any point, the slot holds
//! that value, under the old ballot or the new, never nothing. Were the ballot under the value
//! checksum, a torn re-accept could leave the only live copy of a chosen value undecodable and
//! a later leader would fill the slot anew (docs/ARCHITECTURE.md, "Torn re-accepts"). A write
//! of a different value torn over a slot leaves either entry whole or nothing (as before).
//!
//! Proposal numbers are therefore 32 bits: a 24-bit round and an 8-bit replica id
//! ([`MAX_PROPOSAL`]).

use microrep_fabric::NodeId;

/// Bytes before the payload.
pub const HEADER_BYTES: usize = 40;
/// Where the value part starts: everything after the ballot word.
pub const VALUE_START: usize = 8;
/// The highest proposal number a slot can carry.
pub const MAX_PROPOSAL: u64 = u32::MAX as u64;
/// Bytes after the payload.
pub const CANARY_BYTES: usize = 1;

/// What an entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// An application command.
    Normal = 1,
    /// A membership change (reserved for Mu §5.4 membership; not yet produced).
    Membership = 2,
    /// Does nothing; lets a new leader commit without a client request.
    Noop = 3,
}

impl EntryKind {
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Normal),
            2 => Some(Self::Membership),
            3 => Some(Self::Noop),
            _ => None,
        }
    }
}

/// A decoded log entry borrowing its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Proposal number that wrote it.
    pub prop_nr: u64,
    /// Absolute log index.
    pub index: u64,
    /// Who proposed it.
    pub proposer: NodeId,
    /// The proposer's request id.
    pub request_id: u64,
    /// What it carries.
    pub kind: EntryKind,
    /// The command bytes.
    pub payload: &'a [u8],
}

impl Entry<'_> {
    /// Whether two entries carry the same request (the identity Paxos value adoption compares).
    pub fn same_request(&self, other: &Entry<'_>) -> bool {
        self.proposer == other.proposer && self.request_id == other.request_id && self.kind == other.kind
    }
}

/// CRC32C of the value part (header and payload, contiguous) followed by the proposal number.
fn checksum(slot: &[u8], len: usize, prop_nr: u64) -> u32 {
    microrep_fabric::checksum::crc32c_append(
        microrep_fabric::checksum::crc32c(&slot[VALUE_START..HEADER_BYTES + len]),
        &prop_nr.to_le_bytes(),
    )
}

/// Writes `entry` into the first bytes of `slot` (a whole slot's buffer) and returns how many
/// it used, [`encoded_len`]: the bytes to write into a log. Panics if the payload does not fit
/// (the caller checked it against `MuConfig::max_payload_bytes`) or the proposal number is 0
/// or above [`MAX_PROPOSAL`].
pub fn encode(entry: &Entry<'_>, slot: &mut [u8]) -> usize {
    let len = entry.payload.len();
    assert!(HEADER_BYTES + len + CANARY_BYTES <= slot.len(), "payload of {len} bytes does not fit the slot");
    slot[HEADER_BYTES..HEADER_BYTES + len].copy_from_slice(entry.payload);
    seal(&mut slot[..encoded_len(len)], &Entry { payload: &[], ..*entry })
}

/// Writes the header, ballot word and canary of an entry around the payload already in place
/// in `image[HEADER_BYTES..image.len() - CANARY_BYTES]` (`head`'s payload is ignored); returns
/// `image.len()`. Panics as [`encode`] does.
fn seal(image: &mut [u8], head: &Entry<'_>) -> usize {
    let len = image.len() - HEADER_BYTES - CANARY_BYTES;
    assert!(head.prop_nr != 0, "proposal number 0 marks an empty slot");
    assert!(head.prop_nr <= MAX_PROPOSAL, "proposal number {} exceeds 32 bits", head.prop_nr);
    image[..HEADER_BYTES].fill(0);
    image[8..16].copy_from_slice(&head.index.to_le_bytes());
    image[16..24].copy_from_slice(&head.request_id.to_le_bytes());
    image[24..26].copy_from_slice(&head.proposer.0.to_le_bytes());
    image[26] = head.kind as u8;
    image[28..32].copy_from_slice(&(len as u32).to_le_bytes());
    let ballot_word = head.prop_nr << 32 | u64::from(checksum(image, len, head.prop_nr));
    image[0..8].copy_from_slice(&ballot_word.to_le_bytes());
    image[HEADER_BYTES + len] = 1;
    image.len()
}

/// A payload with room around it for its entry's header and canary: the entry's bytes as a
/// slot holds them, built where the payload was written (the leader seals the entry there), so
/// that a leader writes its logs from the proposer's buffer without copying the payload into a
/// slot image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame(Vec<u8>);

impl Default for Frame {
    fn default() -> Self {
        Self::new()
    }
}

impl Frame {
    /// No frame: what a frame's place holds while the frame is taken out of it for a moment
    /// (never sealed or read).
    pub(crate) const TAKEN: Self = Self(Vec::new());

    /// A frame with an empty payload.
    pub fn new() -> Self {
        Self(vec![0; HEADER_BYTES + CANARY_BYTES])
    }

    /// A frame with an empty payload and room for `payload_bytes` before its buffer grows.
    pub fn with_capacity(payload_bytes: usize) -> Self {
        let mut buffer = Vec::with_capacity(HEADER_BYTES + payload_bytes + CANARY_BYTES);
        buffer.resize(HEADER_BYTES + CANARY_BYTES, 0);
        Self(buffer)
    }

    /// A frame holding a copy of `payload`.
    pub fn of(payload: &[u8]) -> Self {
        let mut frame = Self::with_capacity(payload.len());
        frame.extend_from_slice(payload);
        frame
    }

    /// The bytes its buffer holds before it grows (header and canary included).
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.0[HEADER_BYTES..self.0.len() - CANARY_BYTES]
    }

    /// The payload, to change in place.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.0.len() - CANARY_BYTES;
        &mut self.0[HEADER_BYTES..end]
    }

    /// Empties the payload, keeping the buffer.
    pub fn clear(&mut self) {
        self.0.truncate(HEADER_BYTES + CANARY_BYTES);
    }

    /// Appends `bytes` to the payload.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.truncate(self.0.len() - CANARY_BYTES);
        self.0.extend_from_slice(bytes);
        self.0.resize(self.0.len() + CANARY_BYTES, 0);
    }

    /// Seals the frame as the entry `head` describes (its payload ignored: the frame's is the
    /// entry's) and returns the entry's bytes, [`encoded_len`] of the payload, to write into a
    /// log. Panics as [`encode`] does.
    pub(crate) fn seal(&mut self, head: &Entry<'_>) -> &[u8] {
        seal(&mut self.0, head);
        &self.0
    }

    /// The buffer, header and canary room included (sealed or not).
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// A frame of a buffer from [`Frame::into_bytes`]: its payload is empty.
    pub(crate) fn reuse(mut bytes: Vec<u8>) -> Self {
        bytes.clear();
        bytes.resize(HEADER_BYTES + CANARY_BYTES, 0);
        Self(bytes)
    }
}

/// The payload length a slot's header announces (not checked against anything).
pub fn announced_len(header: &[u8]) -> usize {
    header.get(28..32).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
}

/// Whether a slot's header shows a written slot (a proposal number in its ballot word).
pub fn is_written(header: &[u8]) -> bool {
    header.len() >= 8 && word(header, 0) >> 32 != 0
}

/// The bytes an entry with a payload of `len` bytes occupies at the start of its slot.
pub const fn encoded_len(len: usize) -> usize {
    HEADER_BYTES + len + CANARY_BYTES
}

fn word(slot: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether the slot's header claims an entry for `index` (no checksum check: a cheap filter
/// before [`decode`]).
pub fn claims(slot: &[u8], index: u64) -> bool {
    slot.len() >= HEADER_BYTES + CANARY_BYTES && word(slot, 0) >> 32 != 0 && word(slot, 8) == index
}

/// The slot's ballot word: its proposal number and the checksum of its value under that
/// number. Equal words at one index mean the same entry (a proposal number writes one value
/// per index; see `decode`).
pub fn ballot_word(slot: &[u8]) -> u64 {
    word(slot, 0)
}

/// How `decode_with` knows the slot is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completeness {
    /// The checksum in the ballot word matches the value part.
    Checksum,
    /// The canary byte is set (the planted bug `TrustCanaryOnly`).
    Canary,
    /// These very bytes decoded with [`Completeness::Checksum`] before, unchanged since.
    Verified,
}

/// Decodes a complete entry for log index `index`, or `None` if the slot is empty, torn, of
/// another lap, or corrupt. With `trust_canary` (a planted bug) a set canary replaces the
/// checksum check.
pub fn decode(slot: &[u8], index: u64, trust_canary: bool) -> Option<Entry<'_>> {
    decode_with(slot, index, if trust_canary { Completeness::Canary } else { Completeness::Checksum })
}

/// [`decode`], checking completeness as `check` says.
pub fn decode_with(slot: &[u8], index: u64, check: Completeness) -> Option<Entry<'_>> {
    if slot.len() < HEADER_BYTES + CANARY_BYTES {
        return None;
    }
    let ballot_word = word(slot, 0);
    let prop_nr = ballot_word >> 32;
    let len = u32::from_le_bytes(slot[28..32].try_into().expect("4 bytes")) as usize;
    if prop_nr == 0 || word(slot, 8) != index || HEADER_BYTES + len + CANARY_BYTES > slot.len() {
        return None;
    }
    let crc = ballot_word as u32;
    let complete = match check {
        Completeness::Checksum => crc == checksum(slot, len, prop_nr),
        Completeness::Canary => slot[HEADER_BYTES + len] == 1,
        Completeness::Verified => true,
    };
    // Reserved bytes are written zero; a slot with them set was not written by `encode`
    // (found by the property tests of `crate::fuzzing`: such a slot decoded, its bytes ignored).
    if !complete || slot[27] != 0 || word(slot, 32) != 0 {
        return None;
    }
    Some(Entry {
        prop_nr,
        index,
        proposer: NodeId(u16::from_le_bytes([slot[24], slot[25]])),
        request_id: word(slot, 16),
        kind: EntryKind::from_code(slot[26])?,
        payload: &slot[HEADER_BYTES..HEADER_BYTES + len],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> Entry<'_> {
        Entry { prop_nr: 7, index: 42, proposer: NodeId(2), request_id: 9, kind: EntryKind::Normal, payload }
    }

    #[test]
    fn round_trip() {
        let mut slot = vec![0u8; 128];
        assert!(!claims(&slot, 0), "an empty slot claims nothing");
        encode(&sample(b"hello"), &mut slot);
        assert_eq!(decode(&slot, 42, false), Some(sample(b"hello")));
        assert!(claims(&slot, 42) && !claims(&slot, 43));
    }

    #[test]
    fn a_frame_made_with_room_for_its_payload_fills_it_without_growing() {
        let mut frame = Frame::with_capacity(1000);
        let room = frame.capacity();
        assert!(room >= HEADER_BYTES + 1000 + CANARY_BYTES);
        (0..10).for_each(|i| frame.extend_from_slice(&[i; 100]));
        assert_eq!(frame.capacity(), room, "no reallocation");
        assert_eq!((frame.payload().len(), frame.payload()[999]), (1000, 9));
        assert_eq!(Frame::with_capacity(0), Frame::new());
    }

    #[test]
    fn a_frame_sealed_in_place_holds_the_bytes_encode_writes_into_a_slot() {
        let mut frame = Frame::of(b"hel");
        frame.extend_from_slice(b"lo");
        assert_eq!(frame.payload(), b"hello");
        let mut slot = vec![0u8; 128];
        let used = encode(&sample(b"hello"), &mut slot);
        assert_eq!(frame.seal(&sample(b"ignored")), &slot[..used]);
        assert_eq!(decode(&slot[..used], 42, false), Some(sample(b"hello")));
        // Sealed again under a new ballot and index, as a leader re-accepting it does.
        let again = Entry { prop_nr: 300, index: 43, ..sample(b"") };
        assert_eq!(decode(frame.seal(&again), 43, false), Some(Entry { payload: b"hello", ..again }));
        frame.payload_mut()[0] = b'j';
        assert_eq!(frame.payload(), b"jello");
        frame.clear();
        assert_eq!(frame.payload(), b"");
        assert_eq!(frame.into_bytes().len(), HEADER_BYTES + CANARY_BYTES);
        assert_eq!(Frame::reuse(vec![9; 100]), Frame::new(), "a reused buffer's payload is empty");
    }

    #[test]
    fn empty_other_lap_and_torn_slots_are_not_entries() {
        let mut slot = vec![0u8; 128];
        assert_eq!(decode(&slot, 0, false), None, "zeroed slot");
        encode(&sample(b"hello"), &mut slot);
        assert_eq!(decode(&slot, 42 + 128, false), None, "an older lap of the circular log");
        for byte in 0..slot.len() - 1 {
            let mut torn = slot.clone();
            torn[byte] ^= 0x40;
            assert!(decode(&torn, 42, false).is_none_or(|e| e == sample(b"hello")), "flip at {byte} accepted");
        }
        let long = [7u8; 60];
        encode(&sample(&long), &mut slot);
        let mut half = vec![0u8; 128];
        half[..64].copy_from_slice(&slot[..64]);
        half[HEADER_BYTES + long.len()] = 1;
        assert_eq!(decode(&half, 42, false), None, "a half-written slot with its canary set");
        assert!(decode(&half, 42, true).is_some(), "the planted canary-only check is fooled by it");
    }

    /// Which of `before` and `after` a slot torn between them shows: every mix of their
    /// 8-byte words (the fabric's unit of atomicity) in which the words listed in `landed` come
    /// from `after`.
    fn torn_mix(before: &[u8], after: &[u8], landed: u64) -> Vec<u8> {
        let mut torn = before.to_vec();
        for w in 0..before.len() / 8 {
            if landed & 1 << w != 0 {
                torn[w * 8..w * 8 + 8].copy_from_slice(&after[w * 8..w * 8 + 8]);
            }
        }
        torn
    }

    /// Mu Listing 2 line 24 (value adoption) under torn writes: a new leader re-accepting the
    /// value a slot holds at a higher ballot rewrites identical value bytes, so whatever subset
    /// of words has landed, the slot holds that value, under the old ballot or the new.
    #[test]
    fn listing_2_a_torn_re_accept_of_the_same_value_never_erases_it() {
        let old = sample(b"chosen value");
        let new = Entry { prop_nr: 7 + 256, ..old };
        let (mut before, mut after) = (vec![0u8; 64], vec![0u8; 64]);
        encode(&old, &mut before);
        encode(&new, &mut after);
        assert_eq!(before[VALUE_START..], after[VALUE_START..], "the value part does not depend on the ballot");
        for landed in 0..1u64 << 8 {
            let torn = torn_mix(&before, &after, landed);
            let e = decode(&torn, 42, false).expect("the value survives any tear");
            assert_eq!(e.payload, b"chosen value");
            assert_eq!(e.prop_nr, if landed & 1 == 1 { new.prop_nr } else { old.prop_nr });
        }
    }

    /// A write of another value torn over a slot leaves one of the two entries whole, or
    /// nothing: never one value under the other's ballot.
    #[test]
    fn a_torn_write_of_another_value_never_mixes_value_and_ballot() {
        let (mut before, mut after) = (vec![0u8; 64], vec![0u8; 64]);
        encode(&sample(b"one value"), &mut before);
        encode(&Entry { prop_nr: 9 << 8, request_id: 10, ..sample(b"other") }, &mut after);
        for landed in 0..1u64 << 8 {
            let torn = torn_mix(&before, &after, landed);
            match decode(&torn, 42, false) {
                None => {}
                Some(e) if e.payload == b"one value" => assert_eq!(e.prop_nr, 7, "mix {landed:#b}"),
                Some(e) => assert_eq!((e.payload, e.prop_nr), (&b"other"[..], 9 << 8), "mix {landed:#b}"),
            }
        }
    }

    #[test]
    fn an_entry_occupies_only_the_start_of_its_slot() {
        let mut slot = vec![0xaau8; 256];
        let used = encode(&sample(b"hello"), &mut slot);
        assert_eq!(used, encoded_len(5));
        assert!(slot[used..].iter().all(|&b| b == 0xaa), "bytes after the entry are left as they were");
        assert_eq!(decode(&slot, 42, false), Some(sample(b"hello")), "an earlier lap's bytes after it do not matter");
        assert_eq!(decode(&slot, 42, true), Some(sample(b"hello")));
        let mut fresh = vec![0u8; 64];
        fresh[..used].copy_from_slice(&slot[..used]);
        assert_eq!(decode(&fresh, 42, false), Some(sample(b"hello")), "the used bytes alone are the entry");
        assert!(is_written(&slot[..HEADER_BYTES]) && !is_written(&[0u8; HEADER_BYTES]));
        assert_eq!(announced_len(&slot[..HEADER_BYTES]), 5);
    }

    #[test]
    fn reserved_bytes_set_make_a_slot_no_entry() {
        for at in [27, 32, 39] {
            let mut slot = vec![0u8; 128];
            encode(&sample(b"hello"), &mut slot);
            slot[at] = 45;
            let value = microrep_fabric::checksum::crc32c_append(
                microrep_fabric::checksum::crc32c(&slot[VALUE_START..HEADER_BYTES]),
                b"hello",
            );
            let crc = microrep_fabric::checksum::crc32c_append(value, &7u64.to_le_bytes());
            slot[0..8].copy_from_slice(&(7u64 << 32 | u64::from(crc)).to_le_bytes());
            assert_eq!(decode(&slot, 42, false), None, "reserved byte {at} set, checksum valid");
        }
    }

    #[test]
    #[should_panic(expected = "exceeds 32 bits")]
    fn proposal_numbers_fit_the_ballot_word() {
        encode(&Entry { prop_nr: MAX_PROPOSAL + 1, ..sample(b"") }, &mut [0u8; 64]);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn oversized_payload_is_a_caller_bug() {
        encode(&sample(&[0u8; 100]), &mut [0u8; 128]);
    }
}
