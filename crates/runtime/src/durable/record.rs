//! One record of the durable log: a 40-byte header, the payload, zero padding to 8 bytes.
//!
//! ```text
//!  0  len u32      payload bytes
//!  4  crc u32      CRC32C of bytes 0..4 and 8..40 of the header, then of the payload
//!  8  magic u32    "MRDL"
//! 12  kind u8      4 checkpoint, 2 entry, 3 skipped entry (a no-op), 5 membership change,
//!                  1 checkpoint of a log written before membership changes; 3 bytes of zero
//! 16  index u64    the entry's log index, or the index a checkpoint was taken at
//! 24  at u64       this record's own offset in its file
//! 32  batch u64    the offset of the first record of the group-commit write it belongs to
//! 40  payload, then zeros to a multiple of 8
//! ```
//!
//! The offset under the checksum means a copy of a record found elsewhere (inside a payload, or
//! a stale block) never passes for one; the batch offset lets recovery tell a torn last write
//! from damage to a synced one (see `recover`). Little-endian throughout.

/// Bytes of a record header.
pub(crate) const HEADER_BYTES: usize = 40;
const MAGIC: u32 = u32::from_le_bytes(*b"MRDL");

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A checkpoint written before logs recorded configurations: the application's snapshot
    /// after applying every entry below `index`; the configuration then was the initial one
    /// (membership changes were refused on durable clusters).
    InitialCheckpoint = 1,
    /// The entry applied at `index`.
    Entry = 2,
    /// Index `index` holds no command (a leader's no-op): nothing to apply.
    Skip = 3,
    /// The configuration as of `index` (`Configuration::to_bytes`), then the application's
    /// snapshot after applying every entry below `index`.
    Checkpoint = 4,
    /// Index `index` holds a membership change: the configuration it leaves
    /// (`Configuration::to_bytes`); nothing to apply.
    Membership = 5,
}

impl Kind {
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::InitialCheckpoint),
            2 => Some(Self::Entry),
            3 => Some(Self::Skip),
            4 => Some(Self::Checkpoint),
            5 => Some(Self::Membership),
            _ => None,
        }
    }

    /// Whether a record of this kind starts a segment.
    pub(crate) fn is_checkpoint(self) -> bool {
        matches!(self, Self::Checkpoint | Self::InitialCheckpoint)
    }
}

/// A record read back whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub(crate) kind: Kind,
    pub(crate) index: u64,
    pub(crate) payload: &'a [u8],
    /// The offset of the first record of its group-commit write.
    pub(crate) batch: u64,
    /// Its length in the file, padding included.
    pub(crate) len: u64,
}

/// Why no record could be read at an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// The header or the payload runs past the end of the file.
    Incomplete,
    /// The bytes are not a record written at this offset (wrong magic, kind, offset or
    /// checksum).
    Invalid,
}

/// The length of a record with `payload_len` bytes of payload, padding included.
pub(crate) fn padded_len(payload_len: usize) -> usize {
    (HEADER_BYTES + payload_len).next_multiple_of(8)
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    let crc = microrep_fabric::checksum::crc32c(&header[0..4]);
    let crc = microrep_fabric::checksum::crc32c_append(crc, &header[8..HEADER_BYTES]);
    microrep_fabric::checksum::crc32c_append(crc, payload)
}

/// Appends the record (`kind`, `index`, `payload`), to be written at file offset `at` as part of
/// the write starting at `batch`, to `out`.
pub(crate) fn encode(kind: Kind, index: u64, payload: &[u8], at: u64, batch: u64, out: &mut Vec<u8>) {
    let start = out.len();
    let len = u32::try_from(payload.len()).expect("a record payload under 4 GiB (slots and snapshots are smaller)");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[kind as u8, 0, 0, 0]);
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&batch.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(start + padded_len(payload.len()), 0);
    let crc = checksum(&out[start..start + HEADER_BYTES], payload);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Reads the record at offset `at` of `file`.
pub(crate) fn decode(file: &[u8], at: u64) -> Result<Record<'_>, Bad> {
    let start = usize::try_from(at).map_err(|_| Bad::Incomplete)?;
    let header = file.get(start..start.saturating_add(HEADER_BYTES)).ok_or(Bad::Incomplete)?;
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    let long = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
    if word(8) != MAGIC || long(24) != at || header[13..16] != [0, 0, 0] {
        return Err(Bad::Invalid);
    }
    let kind = Kind::from_code(header[12]).ok_or(Bad::Invalid)?;
    let len = word(0) as usize;
    let payload_at = start + HEADER_BYTES;
    let payload = file.get(payload_at..payload_at.saturating_add(len)).ok_or(Bad::Incomplete)?;
    if checksum(header, payload) != word(4) {
        return Err(Bad::Invalid);
    }
    Ok(Record { kind, index: long(16), payload, batch: long(32), len: padded_len(len) as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_at_their_offset_only() {
        let mut file = Vec::new();
        encode(Kind::Checkpoint, 7, b"state", 0, 0, &mut file);
        let second = file.len() as u64;
        encode(Kind::Entry, 7, b"command", second, 0, &mut file);
        let first = decode(&file, 0).expect("first");
        assert_eq!((first.kind, first.index, first.payload, first.len), (Kind::Checkpoint, 7, &b"state"[..], second));
        let next = decode(&file, second).expect("second");
        assert_eq!((next.kind, next.payload, next.batch), (Kind::Entry, &b"command"[..], 0));
        assert_eq!(file.len() % 8, 0);
        // The same bytes elsewhere are not a record: the offset is under the checksum.
        let mut moved = vec![0; 8];
        moved.extend_from_slice(&file);
        assert_eq!(decode(&moved, 8), Err(Bad::Invalid));
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_detected() {
        let mut file = Vec::new();
        encode(Kind::Entry, 3, b"payload bytes", 0, 0, &mut file);
        let used = HEADER_BYTES + b"payload bytes".len();
        for bit in 0..used * 8 {
            let mut damaged = file.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&damaged, 0).is_err(), "bit {bit} flipped went unnoticed");
        }
        for cut in 0..used {
            assert_eq!(decode(&file[..cut], 0), Err(Bad::Incomplete), "cut at {cut}");
        }
    }
}
