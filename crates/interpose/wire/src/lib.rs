//! The seam between `libmicrorep_interpose.so` (inside the server process) and its wrap node
//! (the `microrep` process that runs the Mu replica): fixed-size frames over one unix stream
//! socket, and a control page both map.
//!
//! The shim sends a [`Request`] header, followed by `len` payload bytes for
//! [`Kind::Data`]; the wrap node answers each request with one [`Reply`]. Both headers are 16
//! bytes, little-endian, and neither side allocates to encode or decode them.
#![no_std]

pub mod input_time;
mod output;

pub use input_time::InputTime;
pub use output::{OUTPUT_BUCKET_BYTES, OutputBucket, OutputDigest};

/// Environment variable naming the wrap node's directory (holding [`SOCKET_NAME`] and
/// [`CONTROL_NAME`]). The shim activates only in the process that had it at load time, and
/// removes it from that process's environment so that children never see it.
pub const ENV_DIR: &str = "MICROREP_WRAP_DIR";
/// Environment variable holding the cluster's random seed (64 hex digits), which every copy of
/// the server gets: randomness it draws comes from it, the same on every copy (docs/WRAP.md,
/// "Time and randomness"). Removed from the environment like [`ENV_DIR`].
pub const ENV_SEED: &str = "MICROREP_WRAP_SEED";
/// The wrap node's unix socket, inside [`ENV_DIR`].
pub const SOCKET_NAME: &str = "shim.sock";
/// The control page, inside [`ENV_DIR`].
pub const CONTROL_NAME: &str = "shim.ctl";
/// Size of the control page: the counters below, then the ring of input times
/// ([`input_time`]).
pub const CONTROL_BYTES: usize = 8 * 4096;
const _: () = assert!(input_time::INPUT_TIME_END_WORD * 8 <= CONTROL_BYTES);
/// Control page word (u64 index): total bytes the server read on replay-agent connections.
pub const CONTROL_REPLAY_READ: usize = 0;
/// Control page word (u64 index): the value [`CONTROL_REPLAY_READ`] had when the thread that
/// reads replayed input last entered a readiness wait (`epoll_wait`, `epoll_pwait`, `poll`,
/// `select`) with nothing ready: the server has processed at least that much replayed input.
pub const CONTROL_REPLAY_SETTLED: usize = 1;
/// Control page word (u64 index): non-zero while the wrap node holds client input back (a
/// leader's copy giving a peer its state at a cut): the shim then neither reads from a client
/// connection nor accepts one; a non-blocking descriptor gets `EAGAIN`, a blocking one waits.
pub const CONTROL_GATE: usize = 2;
/// Control page word (u64 index): how many of the server's threads are inside a gated call
/// (from before they look at [`CONTROL_GATE`] until their input committed or was refused). The
/// wrap node closes the gate, then waits for this to be zero; both sides use sequentially
/// consistent accesses (Dekker), so no input is read after the node saw zero.
pub const CONTROL_GATED_CALLS: usize = 3;

/// The most bytes one intercepted read hands to the server (longer reads are shortened, which
/// every caller of `read` must accept): one read is one log entry.
pub const MAX_DATA: usize = 4096;
/// Bytes of a request or reply header.
pub const HEADER_BYTES: usize = 16;

/// What the shim asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// The server accepted a TCP connection; `value` is the peer's port, `len` is 1 when the
    /// peer is on loopback.
    Accept = 1,
    /// The server read `len` bytes (which follow) from connection `value`.
    Data = 2,
    /// The server closed connection `value`.
    Close = 3,
    /// The server's output on connection `value` completed a bucket (or, at its close, ended a
    /// partial one): the payload is an [`OutputBucket`] (output checking).
    Output = 4,
}

/// The wrap node's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Committed; for an accept, `value` is the new connection id; for data, the input time the
    /// leader chose for it (nanoseconds since the Unix epoch, [`input_time`]).
    Committed = 1,
    /// An accept from the local replay agent: pass its connection through.
    Replay = 2,
    /// Not committed (not the leader, or no quorum): refuse the connection or fail the read.
    Refused = 3,
}

/// A shim request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// What happened.
    pub kind: Kind,
    /// Payload bytes following the header (or a flag, see [`Kind`]).
    pub len: u32,
    /// Connection id, or peer port for [`Kind::Accept`].
    pub value: u64,
}

/// A wrap node reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The outcome.
    pub status: Status,
    /// The connection id of a committed accept, else 0.
    pub value: u64,
}

/// A header that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFrame(pub u32);

impl core::fmt::Display for BadFrame {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown frame tag {}", self.0)
    }
}

fn split(b: &[u8; HEADER_BYTES]) -> (u32, u32, u64) {
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[8..]);
    (word(0), word(4), u64::from_le_bytes(v))
}

fn join(tag: u32, len: u32, value: u64) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[..4].copy_from_slice(&tag.to_le_bytes());
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[8..].copy_from_slice(&value.to_le_bytes());
    b
}

impl Request {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        join(self.kind as u32, self.len, self.value)
    }

    /// Parses a header; a data frame longer than [`MAX_DATA`] is refused.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Self, BadFrame> {
        let (tag, len, value) = split(b);
        let kind = match tag {
            1 => Kind::Accept,
            2 if len as usize <= MAX_DATA => Kind::Data,
            3 => Kind::Close,
            4 if len as usize == OutputBucket::BYTES => Kind::Output,
            _ => return Err(BadFrame(tag)),
        };
        Ok(Self { kind, len, value })
    }
}

impl Reply {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        join(self.status as u32, 0, self.value)
    }

    /// Parses a header.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Self, BadFrame> {
        let (tag, _, value) = split(b);
        let status = match tag {
            1 => Status::Committed,
            2 => Status::Replay,
            3 => Status::Refused,
            _ => return Err(BadFrame(tag)),
        };
        Ok(Self { status, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for r in [
            Request { kind: Kind::Accept, len: 1, value: 40_000 },
            Request { kind: Kind::Data, len: MAX_DATA as u32, value: u64::MAX },
            Request { kind: Kind::Close, len: 0, value: 7 << 12 },
            Request { kind: Kind::Output, len: OutputBucket::BYTES as u32, value: 7 << 12 },
        ] {
            assert_eq!(Request::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn replies_round_trip() {
        for s in [Status::Committed, Status::Replay, Status::Refused] {
            let r = Reply { status: s, value: 99 };
            assert_eq!(Reply::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn bad_tags_and_oversized_data_are_refused() {
        assert_eq!(Request::decode(&join(9, 0, 0)), Err(BadFrame(9)));
        assert_eq!(Request::decode(&join(2, MAX_DATA as u32 + 1, 0)), Err(BadFrame(2)));
        assert_eq!(Request::decode(&join(4, 3, 0)), Err(BadFrame(4)), "an output report is one bucket");
        assert_eq!(Reply::decode(&join(0, 0, 0)), Err(BadFrame(0)));
    }
}
