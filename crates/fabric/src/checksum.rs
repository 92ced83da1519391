//! CRC-32C (Castagnoli, the iSCSI polynomial): the one checksum of the project, for log slots,
//! snapshots, wire frames, state transfers and durable records.
//!
//! Computed by `crc-fast` (carry-less multiplication, AVX-512 where the CPU has it: about four
//! times the SSE 4.2 `crc32` instruction's rate on 16 KiB here, docs/BENCHMARKS.md). The values
//! are CRC-32C's whatever computes them, so data checksummed by earlier builds still checks.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC-32C's final XOR (and initial state).
const XOR: u32 = 0xffff_ffff;

/// The CRC-32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// The CRC-32C of the bytes `crc` was computed over followed by `bytes`.
#[inline]
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(crc ^ XOR));
    digest.update(bytes);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_append(crc32c(b"12345"), b"6789"), 0xe306_9283);
        assert_eq!(crc32c_append(crc32c(b"123456789"), b""), 0xe306_9283);
    }

    proptest! {
        /// The same values as the `crc32c` crate, which computed every checksum before.
        #[test]
        fn equals_the_crc32c_crate(head in proptest::collection::vec(any::<u8>(), 0..5000),
                                   tail in proptest::collection::vec(any::<u8>(), 0..5000)) {
            prop_assert_eq!(crc32c(&head), ::crc32c::crc32c(&head));
            prop_assert_eq!(crc32c_append(crc32c(&head), &tail), ::crc32c::crc32c_append(::crc32c::crc32c(&head), &tail));
        }
    }
}
