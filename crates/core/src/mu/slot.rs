//! The layout of one log slot and its checksum.
//!
//! ```text
//!  0 prop_nr u64      proposal number that wrote it (0 = empty)
//!  8 index u64        absolute log index (disambiguates laps of the circular log)
//! 16 request_id u64   the proposer's id for the request
//! 24 proposer u16, kind u8, reserved u8, len u32
//! 32 checksum u32     CRC32C over bytes 0..32 and the payload; reserved u32
//! 40 payload[len]
//! slot_bytes - 1: canary byte (1), written last, trusted by nothing but a planted bug
//! ```
//!
//! A reader may see a slot partially written, in any byte order (a NIC does not promise
//! placement order), so completeness is decided by the checksum over the whole entry, never by
//! the canary alone (DESIGN.md "Visibility").

use microrep_fabric::NodeId;

/// Bytes before the payload.
pub const HEADER_BYTES: usize = 40;
/// Bytes after the payload area.
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

fn checksum(slot: &[u8], len: usize) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&slot[..32]), &slot[HEADER_BYTES..HEADER_BYTES + len])
}

/// Writes `entry` into `slot` (a whole slot's bytes). Panics if the payload does not fit: the
/// caller checked it against `MuConfig::max_payload_bytes`.
pub fn encode(entry: &Entry<'_>, slot: &mut [u8]) {
    let len = entry.payload.len();
    assert!(HEADER_BYTES + len + CANARY_BYTES <= slot.len(), "payload of {len} bytes does not fit the slot");
    assert!(entry.prop_nr != 0, "proposal number 0 marks an empty slot");
    slot.fill(0);
    slot[0..8].copy_from_slice(&entry.prop_nr.to_le_bytes());
    slot[8..16].copy_from_slice(&entry.index.to_le_bytes());
    slot[16..24].copy_from_slice(&entry.request_id.to_le_bytes());
    slot[24..26].copy_from_slice(&entry.proposer.0.to_le_bytes());
    slot[26] = entry.kind as u8;
    slot[28..32].copy_from_slice(&(len as u32).to_le_bytes());
    slot[HEADER_BYTES..HEADER_BYTES + len].copy_from_slice(entry.payload);
    let crc = checksum(slot, len);
    slot[32..36].copy_from_slice(&crc.to_le_bytes());
    let last = slot.len() - 1;
    slot[last] = 1;
}

fn word(slot: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether the slot's header claims an entry for `index` (no checksum check: a cheap filter
/// before [`decode`]).
pub fn claims(slot: &[u8], index: u64) -> bool {
    slot.len() >= HEADER_BYTES + CANARY_BYTES && word(slot, 0) != 0 && word(slot, 8) == index
}

/// Decodes a complete entry for log index `index`, or `None` if the slot is empty, torn, of
/// another lap, or corrupt. With `trust_canary` (a planted bug) a set canary replaces the
/// checksum check.
pub fn decode(slot: &[u8], index: u64, trust_canary: bool) -> Option<Entry<'_>> {
    if slot.len() < HEADER_BYTES + CANARY_BYTES {
        return None;
    }
    let prop_nr = word(slot, 0);
    let len = u32::from_le_bytes(slot[28..32].try_into().expect("4 bytes")) as usize;
    if prop_nr == 0 || word(slot, 8) != index || HEADER_BYTES + len + CANARY_BYTES > slot.len() {
        return None;
    }
    let crc = u32::from_le_bytes(slot[32..36].try_into().expect("4 bytes"));
    let complete = if trust_canary { slot[slot.len() - 1] == 1 } else { crc == checksum(slot, len) };
    if !complete {
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
        half[127] = 1;
        assert_eq!(decode(&half, 42, false), None, "a half-written slot with its canary set");
        assert!(decode(&half, 42, true).is_some(), "the planted canary-only check is fooled by it");
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn oversized_payload_is_a_caller_bug() {
        encode(&sample(&[0u8; 100]), &mut [0u8; 128]);
    }
}
