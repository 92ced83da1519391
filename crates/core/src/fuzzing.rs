//! The Mu slot decoder's promises, checked on any bytes: shared by the property tests in the
//! default `cargo test` run and the cargo-fuzz target `mu_slot` (`fuzz/`). Not an API.
//!
//! Input layout: byte 0 is a mode (bit 0: take the index the slot claims, bit 1: repair the
//! checksum so the fuzzer gets past it, bit 2: the planted canary-only check), byte 1 the log
//! index otherwise; the rest is the slot.

use crate::mu::slot::{self, CANARY_BYTES, HEADER_BYTES, VALUE_START};

/// Decodes `data` as a log slot; panics if the decoder panics, accepts an entry its header
/// does not claim, or returns an entry that does not survive encoding and decoding again.
pub fn mu_slot(data: &[u8]) {
    let [mode, index, bytes @ ..] = data else { return };
    let mut bytes = bytes.to_vec();
    let whole = bytes.len() >= HEADER_BYTES + CANARY_BYTES;
    let index = if mode & 1 != 0 && whole { word(&bytes, 8) } else { u64::from(*index) };
    if mode & 2 != 0 && whole {
        repair_checksum(&mut bytes);
    }
    let trust_canary = mode & 4 != 0;
    let Some(entry) = slot::decode(&bytes, index, trust_canary) else { return };
    assert!(slot::claims(&bytes, index), "decoded a slot that claims no entry for {index}");
    assert_eq!(entry.index, index);
    assert!(HEADER_BYTES + entry.payload.len() + CANARY_BYTES <= bytes.len(), "payload past the slot");
    let mut fresh = vec![0u8; bytes.len()];
    slot::encode(&entry, &mut fresh);
    assert_eq!(slot::decode(&fresh, index, false), Some(entry), "the entry does not survive re-encoding");
    if !trust_canary {
        assert_eq!(fresh[VALUE_START..HEADER_BYTES - 8], bytes[VALUE_START..HEADER_BYTES - 8], "fields ignored");
    }
}

fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Rewrites the checksum half of the ballot word to match the slot's value part, if its
/// length field fits the slot.
fn repair_checksum(bytes: &mut [u8]) {
    let len = u32::from_le_bytes(bytes[28..32].try_into().expect("4 bytes")) as usize;
    if HEADER_BYTES + len + CANARY_BYTES > bytes.len() {
        return;
    }
    let prop_nr = word(bytes, 0) >> 32;
    let value = microrep_fabric::checksum::crc32c_append(
        microrep_fabric::checksum::crc32c(&bytes[VALUE_START..HEADER_BYTES]),
        &bytes[HEADER_BYTES..HEADER_BYTES + len],
    );
    let crc = microrep_fabric::checksum::crc32c_append(value, &prop_nr.to_le_bytes());
    bytes[0..8].copy_from_slice(&(prop_nr << 32 | u64::from(crc)).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::mu::slot::{Entry, EntryKind};
    use microrep_fabric::NodeId;

    /// An encoded entry in a slot of 48..160 bytes, then a few bytes overwritten.
    fn mutated_slot() -> impl Strategy<Value = Vec<u8>> {
        let entry = (
            1u64..=slot::MAX_PROPOSAL,
            any::<u64>(),
            any::<u16>(),
            1u8..=3,
            proptest::collection::vec(any::<u8>(), 0..64),
        );
        let flips = proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3);
        (any::<u8>(), entry, 0usize..56, flips).prop_map(
            |(mode, (prop_nr, request_id, proposer, kind, payload), spare, flips)| {
                let kind = [EntryKind::Normal, EntryKind::Membership, EntryKind::Noop][usize::from(kind - 1)];
                let entry =
                    Entry { prop_nr, index: 42, proposer: NodeId(proposer), request_id, kind, payload: &payload };
                let mut bytes = vec![0u8; HEADER_BYTES + payload.len() + CANARY_BYTES + spare];
                slot::encode(&entry, &mut bytes);
                for (at, byte) in flips {
                    let len = bytes.len();
                    bytes[at % len] = byte;
                }
                let mut data = vec![mode, 42];
                data.extend_from_slice(&bytes);
                data
            },
        )
    }

    proptest! {
        /// Byte soup: no panic, nothing decoded that the checks above reject.
        #[test]
        fn any_bytes_keep_the_slot_decoder_promises(data in proptest::collection::vec(any::<u8>(), 0..160)) {
            mu_slot(&data);
        }

        /// Encoded entries, corrupted, with and without repaired checksums.
        #[test]
        fn mutated_slots_keep_the_slot_decoder_promises(data in mutated_slot()) {
            mu_slot(&data);
        }
    }
}
