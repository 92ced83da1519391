//! The published snapshot (Mu §5.4 state transfer): a replica that fell behind the recycled
//! log READs a peer's snapshot region and restores it.
//!
//! ```text
//!  0 index u64     the snapshot covers every entry below index
//!  8 len u64       bytes of state
//! 16 checksum u64  CRC32C over index, len, the configuration and the state (0 = no snapshot)
//! 24 epoch u64     the configuration as of index (`mu::membership`): its epoch...
//! 32 members       ...and its members, 4 words (256 ids)
//! 64 state[len]
//! ```
//! A reader may catch the owner rewriting it; the checksum rejects such a torn copy and the
//! reader tries again later.

use super::membership::Configuration;

/// Bytes before the state.
pub const HEADER_BYTES: usize = 64;

fn checksum(index: u64, configuration: &[u8], state: &[u8]) -> u64 {
    let mut head = [0u8; 16];
    head[..8].copy_from_slice(&index.to_le_bytes());
    head[8..].copy_from_slice(&(state.len() as u64).to_le_bytes());
    let sum = microrep_fabric::checksum::crc32c_append(microrep_fabric::checksum::crc32c(&head), configuration);
    // Never 0, which marks "no snapshot".
    u64::from(microrep_fabric::checksum::crc32c_append(sum, state)) | 1 << 32
}

/// The header of a snapshot of `state` and `configuration` at `index`: the region holds it
/// followed by `state` (written separately, so the state is never copied into a staging buffer).
pub fn header(index: u64, configuration: Configuration, state: &[u8]) -> [u8; HEADER_BYTES] {
    let configuration = configuration.to_bytes();
    let mut out = [0u8; HEADER_BYTES];
    out[..8].copy_from_slice(&index.to_le_bytes());
    out[8..16].copy_from_slice(&(state.len() as u64).to_le_bytes());
    out[16..24].copy_from_slice(&checksum(index, &configuration, state).to_le_bytes());
    out[24..].copy_from_slice(&configuration);
    out
}

/// Decodes a snapshot region's bytes: `(index, configuration, state)` if whole and valid.
pub fn decode(region: &[u8]) -> Option<(u64, Configuration, &[u8])> {
    let word = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(region.get(at..at + 8)?.try_into().ok()?)) };
    let (index, len, sum) = (word(0)?, word(8)?, word(16)?);
    let state = region.get(HEADER_BYTES..HEADER_BYTES.checked_add(usize::try_from(len).ok()?)?)?;
    if sum == 0 || sum != checksum(index, region.get(24..HEADER_BYTES)?, state) {
        return None;
    }
    Some((index, Configuration::from_bytes(region.get(24..HEADER_BYTES)?)?, state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mu::MemberSet;

    #[test]
    fn round_trip_and_torn_copies() {
        let configuration = Configuration { members: MemberSet::first(3), epoch: 4 };
        let mut bytes = header(77, configuration, b"state of the world").to_vec();
        bytes.extend_from_slice(b"state of the world");
        bytes.resize(128, 0);
        assert_eq!(decode(&bytes), Some((77, configuration, &b"state of the world"[..])));
        assert_eq!(decode(&[0u8; 128]), None, "an empty region holds no snapshot");
        let mut torn = bytes.clone();
        torn[HEADER_BYTES + 8] ^= 1;
        assert_eq!(decode(&torn), None);
        let mut other_members = bytes.clone();
        other_members[32] ^= 8;
        assert_eq!(decode(&other_members), None, "the configuration is under the checksum");
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&huge), None, "a length past the region is rejected, not trusted");
    }
}
