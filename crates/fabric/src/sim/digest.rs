//! The trace digest: a running hash over every event the simulation applies.
//!
//! It is FNV-1a over little-endian fields, written out here rather than taken from `std` because
//! `DefaultHasher` may change between Rust releases and a digest is only useful if two runs (also
//! on different toolchains) can be compared.

use crate::OpError;

/// What kind of event a record describes. The value is hashed, so keep the numbers stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    AddNode = 1,
    Crash = 2,
    Connect = 3,
    Reconnect = 4,
    Post = 5,
    Start = 6,
    Piece = 7,
    Read = 8,
    Retry = 9,
    Finish = 10,
    Complete = 11,
    Grant = 12,
    Revoke = 13,
    Hold = 14,
    Release = 15,
    LocalWrite = 16,
    Config = 17,
    Close = 18,
    LinkHold = 19,
    LinkRelease = 20,
}

/// FNV-1a, 64 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Digest(u64);

impl Digest {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub(super) const fn new() -> Self {
        Self(Self::OFFSET)
    }

    pub(super) const fn value(self) -> u64 {
        self.0
    }

    fn byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(Self::PRIME);
    }

    /// Hashes one field.
    pub(super) fn word(&mut self, x: u64) {
        for b in x.to_le_bytes() {
            self.byte(b);
        }
    }

    /// Hashes a byte string, length first so that adjacent strings cannot alias.
    pub(super) fn bytes(&mut self, data: &[u8]) {
        self.word(data.len() as u64);
        for &b in data {
            self.byte(b);
        }
    }

    /// Hashes one event: its tag, the time it happened, and its fields.
    pub(super) fn record(&mut self, tag: Tag, now: u64, fields: &[u64]) {
        self.word(tag as u64);
        self.word(now);
        self.word(fields.len() as u64);
        for &f in fields {
            self.word(f);
        }
    }
}

/// A stable number for an operation status, for hashing.
pub(super) const fn status_code(status: Result<(), OpError>) -> u64 {
    match status {
        Ok(()) => 0,
        Err(OpError::PermissionDenied) => 1,
        Err(OpError::PeerUnreachable) => 2,
        Err(OpError::Flushed) => 3,
        Err(OpError::Transport) => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vector() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (reference test vector).
        let mut d = Digest::new();
        d.byte(b'a');
        assert_eq!(d.value(), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn field_order_and_boundaries_matter() {
        let mut a = Digest::new();
        a.record(Tag::Post, 1, &[2, 3]);
        let mut b = Digest::new();
        b.record(Tag::Post, 1, &[3, 2]);
        assert_ne!(a, b);
        let mut c = Digest::new();
        c.bytes(b"ab");
        c.bytes(b"c");
        let mut d = Digest::new();
        d.bytes(b"a");
        d.bytes(b"bc");
        assert_ne!(c, d);
    }
}
