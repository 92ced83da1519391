//! The published snapshot (Mu §5.4 state transfer): a replica that fell behind the recycled
//! log READs a peer's snapshot region and restores it.
//!
//! ```text
//!  0 index u64     the snapshot covers every entry below index
//!  8 len u64       bytes of state
//! 16 checksum u64  CRC32C over index, len and the state (0 = no snapshot yet)
//! 24 reserved
//! 32 state[len]
//! ```
//! A reader may catch the owner rewriting it; the checksum rejects such a torn copy and the
//! reader tries again later.

/// Bytes before the state.
pub const HEADER_BYTES: usize = 32;

fn checksum(index: u64, state: &[u8]) -> u64 {
    let mut head = [0u8; 16];
    head[..8].copy_from_slice(&index.to_le_bytes());
    head[8..].copy_from_slice(&(state.len() as u64).to_le_bytes());
    // Never 0, which marks "no snapshot".
    u64::from(crc32c::crc32c_append(crc32c::crc32c(&head), state)) | 1 << 32
}

/// Encodes a snapshot of `state` at `index` into `out` (cleared first).
pub fn encode(index: u64, state: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(index, state).to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    out.extend_from_slice(state);
}

/// Decodes a snapshot region's bytes: `(index, state)` if whole and valid.
pub fn decode(region: &[u8]) -> Option<(u64, &[u8])> {
    let word = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(region.get(at..at + 8)?.try_into().ok()?)) };
    let (index, len, sum) = (word(0)?, word(8)?, word(16)?);
    let state = region.get(HEADER_BYTES..HEADER_BYTES.checked_add(usize::try_from(len).ok()?)?)?;
    (sum != 0 && sum == checksum(index, state)).then_some((index, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_torn_copies() {
        let mut bytes = Vec::new();
        encode(77, b"state of the world", &mut bytes);
        bytes.resize(128, 0);
        assert_eq!(decode(&bytes), Some((77, &b"state of the world"[..])));
        assert_eq!(decode(&[0u8; 128]), None, "an empty region holds no snapshot");
        let mut torn = bytes.clone();
        torn[40] ^= 1;
        assert_eq!(decode(&torn), None);
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&huge), None, "a length past the region is rejected, not trusted");
    }
}
