//! Output checking (FALCON): every copy digests the replies its server wrote on each client
//! connection, CRC-64/XZ over fixed buckets of [`OUTPUT_BUCKET_BYTES`], so that a follower's
//! copy can be compared with the leader's through the log. The shim digests the leader's
//! writes; a follower's replay agent digests what its copy answers on the same connection.
//! Both sides use this one type, so a bucket is cut at the same byte on both.

use crc::{CRC_64_XZ, Crc};

/// Bytes of output per digested bucket.
pub const OUTPUT_BUCKET_BYTES: u64 = 4096;

const CRC64: Crc<u64> = Crc::<u64>::new(&CRC_64_XZ);
/// The checksum of no bytes, where every bucket starts.
const EMPTY: u64 = CRC64.checksum(&[]);

/// `crc` (the checksum of some bytes) extended by `bytes`: the checksum of both.
fn resume(crc: u64, bytes: &[u8]) -> u64 {
    // The algorithm reflects its input: its register holds the running value reflected, and the
    // checksum is the register XOR `xorout`.
    let mut digest = CRC64.digest_with_initial((crc ^ CRC_64_XZ.xorout).reverse_bits());
    digest.update(bytes);
    digest.finalize()
}

/// One bucket of a connection's output: its number (0 for the first `OUTPUT_BUCKET_BYTES`),
/// how many bytes it holds (less than a full bucket only for a connection's last), and their
/// CRC-64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputBucket {
    pub bucket: u64,
    pub len: u64,
    pub crc: u64,
}

impl OutputBucket {
    /// Bytes of an encoded bucket (the payload of a `Kind::Output` request).
    pub const BYTES: usize = 24;

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..8].copy_from_slice(&self.bucket.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8; Self::BYTES]) -> Self {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Self { bucket: word(0), len: word(8), crc: word(16) }
    }
}

/// The running digest of one connection's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputDigest {
    /// CRC-64 of the current bucket's bytes so far.
    crc: u64,
    /// Bytes in the current bucket.
    fill: u64,
    /// The current bucket's number.
    bucket: u64,
}

impl Default for OutputDigest {
    fn default() -> Self {
        Self { crc: EMPTY, fill: 0, bucket: 0 }
    }
}

impl OutputDigest {
    /// Digests `bytes`, handing each bucket they complete to `full`.
    pub fn feed(&mut self, mut bytes: &[u8], mut full: impl FnMut(OutputBucket)) {
        while !bytes.is_empty() {
            let room = (OUTPUT_BUCKET_BYTES - self.fill) as usize;
            let (piece, rest) = bytes.split_at(room.min(bytes.len()));
            self.crc = resume(self.crc, piece);
            self.fill += piece.len() as u64;
            bytes = rest;
            if self.fill == OUTPUT_BUCKET_BYTES {
                full(OutputBucket { bucket: self.bucket, len: self.fill, crc: self.crc });
                *self = Self { crc: EMPTY, fill: 0, bucket: self.bucket + 1 };
            }
        }
    }

    /// The bucket under way, if it holds any byte (a closing connection's last).
    pub fn partial(&self) -> Option<OutputBucket> {
        (self.fill > 0).then_some(OutputBucket { bucket: self.bucket, len: self.fill, crc: self.crc })
    }

    /// The state as two words (the shim keeps one digest per descriptor in atomics).
    pub fn pack(&self) -> [u64; 2] {
        [self.crc, self.bucket << 13 | self.fill]
    }

    /// The state [`Self::pack`] gave; a fresh digest for two zero words (a descriptor never
    /// written).
    pub fn unpack(words: [u64; 2]) -> Self {
        if words == [0, 0] {
            return Self::default();
        }
        Self { crc: words[0], fill: words[1] & 0x1fff, bucket: words[1] >> 13 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_resumed_over_pieces_equals_the_checksum_of_the_whole() {
        let bytes: [u8; 300] = core::array::from_fn(|i| (i * 7 % 251) as u8);
        for cut in [0, 1, 17, 299, 300] {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(resume(resume(EMPTY, a), b), CRC64.checksum(&bytes), "cut at {cut}");
        }
    }

    #[test]
    fn buckets_are_cut_at_the_same_bytes_however_the_output_was_written() {
        let output: [u8; 10_000] = core::array::from_fn(|i| (i % 253) as u8);
        let mut whole = OutputDigest::default();
        let mut a = [OutputBucket { bucket: 0, len: 0, crc: 0 }; 3];
        let mut n = 0;
        whole.feed(&output, |b| {
            a[n] = b;
            n += 1;
        });
        assert_eq!(n, 2, "two full buckets in 10,000 bytes");
        let mut pieces = OutputDigest::default();
        let mut m = 0;
        for chunk in output.chunks(777) {
            pieces.feed(chunk, |b| {
                assert_eq!(b, a[m]);
                m += 1;
            });
            let packed = pieces.pack();
            pieces = OutputDigest::unpack(packed);
        }
        assert_eq!(m, 2);
        assert_eq!(pieces.partial(), whole.partial());
        assert_eq!(whole.partial().map(|b| (b.bucket, b.len)), Some((2, 10_000 - 2 * OUTPUT_BUCKET_BYTES)));
        assert_eq!(a[0].crc, CRC64.checksum(&output[..4096]));
        assert_eq!(OutputBucket::decode(&a[1].encode()), a[1]);
    }
}
