//! The tcp backend's wire format: length-prefixed, CRC32C-checked frames.
//!
//! ```text
//! offset size field
//!  0     4    len      total frame bytes, this field and the CRC included (32..=max)
//!  4     1    kind     Hello, HelloAck, Write, Read, Reset, WriteAck, ReadData
//!  5     1    status   0 ok, 1 permission denied, 2 flushed, 3 rejected (responses only)
//!  6     2    region   region id
//!  8     8    wr_id    the initiator's work request id, echoed in the response
//! 16     8    offset   byte offset in the region
//! 24     4    arg      READ length; ReadData length
//! 28     n    payload  WRITE data, READ data, handshake body
//! 28+n   4    crc      CRC32C of bytes 0..28+n
//! ```
//!
//! All integers are little-endian. The decoder checks the length against the negotiated bound
//! before buffering a frame, then the CRC, kind and status, then each kind's shape, and reports
//! anything else as a [`WireError`]: the connection is then dropped. Whether a region and offset
//! exist is checked by the NIC against its own table.

use crate::layout::MAX_REGIONS;
use crate::{OpError, RegionId, RegionSpec, RemoteWrite};

/// Bytes before the payload.
pub(super) const HEADER_LEN: usize = 28;
/// Bytes of a frame besides its payload.
pub(super) const FRAME_OVERHEAD: usize = HEADER_LEN + 4;
/// Identifies the protocol and its version in handshakes.
const MAGIC: u64 = u64::from_le_bytes(*b"MRTCP\0\0\x01");
/// Handshake body: magic, cluster, node, max_nodes, max_op_bytes.
const HELLO_LEN: usize = 24;
/// One region in a HelloAck: id, policy, padding, length.
const REGION_ENTRY_LEN: usize = 16;
/// Largest payload a connection may send before its handshake is accepted.
pub(super) const HANDSHAKE_MAX_PAYLOAD: usize = 1024;
/// Bytes read from a socket at a time, at least.
const READ_CHUNK: usize = 64 * 1024;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Initiator to NIC, first frame: who is connecting.
    Hello = 1,
    /// NIC to initiator: accepted (with the region table) or rejected (with a reason).
    HelloAck = 2,
    /// One-sided WRITE request.
    Write = 3,
    /// One-sided READ request.
    Read = 4,
    /// Leave the flushing state entered after a failed operation (`Endpoint::reconnect`).
    Reset = 5,
    /// Outcome of a WRITE.
    WriteAck = 6,
    /// Outcome and data of a READ.
    ReadData = 7,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Hello,
            2 => Self::HelloAck,
            3 => Self::Write,
            4 => Self::Read,
            5 => Self::Reset,
            6 => Self::WriteAck,
            7 => Self::ReadData,
            _ => return None,
        })
    }
}

/// A response's status byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Ok = 0,
    Denied = 1,
    Flushed = 2,
    Rejected = 3,
}

impl Status {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0 => Self::Ok,
            1 => Self::Denied,
            2 => Self::Flushed,
            3 => Self::Rejected,
            _ => return None,
        })
    }

    /// The status of an operation's outcome.
    pub(super) fn of(result: Result<(), OpError>) -> Self {
        match result {
            Ok(()) => Self::Ok,
            Err(OpError::PermissionDenied) => Self::Denied,
            Err(_) => Self::Flushed,
        }
    }

    /// The completion status this response reports.
    pub(super) fn to_result(self) -> Result<(), OpError> {
        match self {
            Self::Ok => Ok(()),
            Self::Denied => Err(OpError::PermissionDenied),
            Self::Flushed => Err(OpError::Flushed),
            Self::Rejected => Err(OpError::Transport),
        }
    }
}

/// A frame's fixed fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) kind: Kind,
    pub(super) status: Status,
    pub(super) region: u16,
    pub(super) wr_id: u64,
    pub(super) offset: u64,
    pub(super) arg: u32,
}

impl Header {
    /// A header of `kind` with every other field zero / ok.
    pub(super) fn new(kind: Kind) -> Self {
        Self { kind, status: Status::Ok, region: 0, wr_id: 0, offset: 0, arg: 0 }
    }
}

/// A decoded frame, borrowing its payload from the decoder's buffer.
#[derive(Debug)]
pub(super) struct Frame<'a> {
    pub(super) header: Header,
    pub(super) payload: &'a [u8],
}

/// A frame or handshake that breaks the protocol; the connection carrying it is dropped.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub(super) enum WireError {
    #[error("frame length {0} is shorter than a header")]
    TooShort(u32),
    #[error("frame length {len} exceeds the bound of {max} bytes")]
    Oversize { len: u32, max: usize },
    #[error("frame checksum mismatch")]
    BadChecksum,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    #[error("malformed {kind:?} frame: {why}")]
    Malformed { kind: Kind, why: &'static str },
    #[error("unexpected {0:?} frame")]
    Unexpected(Kind),
    #[error("handshake refused: {0}")]
    Refused(String),
}

/// Appends a frame with `payload_len` payload bytes, written by `fill`, to `out`.
pub(super) fn encode_with(out: &mut Vec<u8>, header: &Header, payload_len: usize, fill: impl FnOnce(&mut [u8])) {
    let start = out.len();
    let len = u32::try_from(FRAME_OVERHEAD + payload_len).expect("payloads are bounded by max_op_bytes");
    out.extend_from_slice(&len.to_le_bytes());
    out.push(header.kind as u8);
    out.push(header.status as u8);
    out.extend_from_slice(&header.region.to_le_bytes());
    out.extend_from_slice(&header.wr_id.to_le_bytes());
    out.extend_from_slice(&header.offset.to_le_bytes());
    out.extend_from_slice(&header.arg.to_le_bytes());
    out.resize(start + HEADER_LEN + payload_len, 0);
    fill(&mut out[start + HEADER_LEN..]);
    let crc = crate::checksum::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Appends a frame carrying `payload` to `out`.
pub(super) fn encode(out: &mut Vec<u8>, header: &Header, payload: &[u8]) {
    encode_with(out, header, payload.len(), |dst| dst.copy_from_slice(payload));
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks one kind's shape: which fields may be set and how long the payload is.
fn check_shape(header: &Header, payload: &[u8]) -> Result<(), WireError> {
    let malformed = |why| Err(WireError::Malformed { kind: header.kind, why });
    let request = matches!(header.kind, Kind::Hello | Kind::Write | Kind::Read | Kind::Reset);
    if request && header.status != Status::Ok {
        return malformed("a request carries a status");
    }
    let control = matches!(header.kind, Kind::Hello | Kind::HelloAck | Kind::Reset);
    if control && (header.region, header.wr_id, header.offset, header.arg) != (0, 0, 0, 0) {
        // Found by the property tests (`check::frames`): such a frame was accepted with the
        // fields ignored, so two different byte strings meant the same handshake.
        return malformed("a control frame carries an address");
    }
    match header.kind {
        Kind::Hello if payload.len() != HELLO_LEN => malformed("wrong handshake length"),
        Kind::Read | Kind::Reset | Kind::WriteAck if !payload.is_empty() => malformed("unexpected payload"),
        Kind::ReadData if header.status == Status::Ok && payload.len() != header.arg as usize => {
            malformed("data length differs from its header")
        }
        Kind::ReadData if header.status != Status::Ok && !payload.is_empty() => malformed("data with a failure"),
        _ => Ok(()),
    }
}

/// Reassembles frames from a byte stream, holding at most one frame of `max_frame` bytes.
#[derive(Debug)]
pub(super) struct Decoder {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame: usize,
}

impl Decoder {
    /// A decoder accepting payloads of up to `max_payload` bytes.
    pub(super) fn new(max_payload: usize) -> Self {
        Self { buf: Vec::new(), start: 0, end: 0, max_frame: FRAME_OVERHEAD + max_payload }
    }

    /// Raises (or lowers) the largest accepted payload, e.g. once a handshake succeeded.
    pub(super) fn set_max_payload(&mut self, max_payload: usize) {
        self.max_frame = FRAME_OVERHEAD + max_payload;
    }

    /// Free buffer space to receive into; pass what was received to [`Self::filled`].
    pub(super) fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
            if self.buf.len() > 4 * READ_CHUNK {
                // A large frame grew the buffer; give the memory back.
                self.buf = Vec::new();
            }
        }
        let pending = self.end - self.start;
        // The frame being assembled, once its length is known (bounded by `next`'s checks).
        let frame_len = if pending >= 4 { u32_at(&self.buf, self.start) as usize } else { 0 };
        let want = frame_len.clamp(READ_CHUNK.min(self.max_frame), self.max_frame).max(pending + 1);
        if self.buf.len() - self.start < want {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, pending);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were received into [`Self::spare`].
    pub(super) fn filled(&mut self, n: usize) {
        self.end += n;
        debug_assert!(self.end <= self.buf.len());
    }

    /// The next whole frame, `None` if more bytes are needed.
    pub(super) fn next(&mut self) -> Result<Option<Frame<'_>>, WireError> {
        let pending = &self.buf[self.start..self.end];
        if pending.len() < 4 {
            return Ok(None);
        }
        let len = u32_at(pending, 0);
        if (len as usize) < FRAME_OVERHEAD {
            return Err(WireError::TooShort(len));
        }
        if len as usize > self.max_frame {
            return Err(WireError::Oversize { len, max: self.max_frame });
        }
        let len = len as usize;
        if pending.len() < len {
            return Ok(None);
        }
        let frame = &pending[..len];
        if crate::checksum::crc32c(&frame[..len - 4]) != u32_at(frame, len - 4) {
            return Err(WireError::BadChecksum);
        }
        let kind = Kind::from_byte(frame[4]).ok_or(WireError::UnknownKind(frame[4]))?;
        let status = Status::from_byte(frame[5]).ok_or(WireError::UnknownStatus(frame[5]))?;
        let header = Header {
            kind,
            status,
            region: u16_at(frame, 6),
            wr_id: u64_at(frame, 8),
            offset: u64_at(frame, 16),
            arg: u32_at(frame, 24),
        };
        let start = self.start;
        self.start += len;
        let payload = &self.buf[start + HEADER_LEN..start + len - 4];
        check_shape(&header, payload)?;
        Ok(Some(Frame { header, payload }))
    }
}

/// What a handshake says about its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) cluster_id: u64,
    pub(super) node: u16,
    pub(super) max_nodes: u16,
    pub(super) max_op_bytes: u32,
}

impl Hello {
    fn write(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.cluster_id.to_le_bytes());
        out[16..18].copy_from_slice(&self.node.to_le_bytes());
        out[18..20].copy_from_slice(&self.max_nodes.to_le_bytes());
        out[20..24].copy_from_slice(&self.max_op_bytes.to_le_bytes());
    }

    fn read(kind: Kind, body: &[u8]) -> Result<Self, WireError> {
        if body.len() < HELLO_LEN {
            return Err(WireError::Malformed { kind, why: "short handshake" });
        }
        if u64_at(body, 0) != MAGIC {
            return Err(WireError::Malformed { kind, why: "not a microrep tcp fabric (or another version)" });
        }
        Ok(Self {
            cluster_id: u64_at(body, 8),
            node: u16_at(body, 16),
            max_nodes: u16_at(body, 18),
            max_op_bytes: u32_at(body, 20),
        })
    }

    /// Appends the initiator's Hello frame.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        encode_with(out, &Header::new(Kind::Hello), HELLO_LEN, |body| self.write(body));
    }

    /// Reads an initiator's Hello.
    pub(super) fn decode(frame: &Frame<'_>) -> Result<Self, WireError> {
        if frame.header.kind != Kind::Hello {
            return Err(WireError::Unexpected(frame.header.kind));
        }
        Self::read(Kind::Hello, frame.payload)
    }

    /// Appends the NIC's acceptance, listing its regions.
    pub(super) fn encode_ack(&self, regions: &[RegionSpec], out: &mut Vec<u8>) {
        let len = HELLO_LEN + 8 + REGION_ENTRY_LEN * regions.len();
        encode_with(out, &Header::new(Kind::HelloAck), len, |body| {
            self.write(body);
            body[HELLO_LEN..HELLO_LEN + 4].copy_from_slice(&(regions.len() as u32).to_le_bytes());
            for (spec, entry) in regions.iter().zip(body[HELLO_LEN + 8..].chunks_exact_mut(REGION_ENTRY_LEN)) {
                entry[..2].copy_from_slice(&spec.id.0.to_le_bytes());
                entry[2] = match spec.remote_write {
                    RemoteWrite::Never => 0,
                    RemoteWrite::Granted => 1,
                    RemoteWrite::Always => 2,
                };
                entry[8..].copy_from_slice(&spec.len_bytes.to_le_bytes());
            }
        });
    }

    /// Appends the NIC's refusal with a reason for the initiator's error message.
    pub(super) fn encode_refusal(reason: &str, out: &mut Vec<u8>) {
        let header = Header { status: Status::Rejected, ..Header::new(Kind::HelloAck) };
        encode(out, &header, reason.as_bytes());
    }

    /// Reads a NIC's HelloAck: its Hello and region table, or its refusal.
    pub(super) fn decode_ack(frame: &Frame<'_>) -> Result<(Self, Vec<RegionSpec>), WireError> {
        let kind = Kind::HelloAck;
        if frame.header.kind != kind {
            return Err(WireError::Unexpected(frame.header.kind));
        }
        if frame.header.status != Status::Ok {
            return Err(WireError::Refused(String::from_utf8_lossy(frame.payload).into_owned()));
        }
        let hello = Self::read(kind, frame.payload)?;
        let body = &frame.payload[HELLO_LEN..];
        let count = if body.len() >= 8 { u32_at(body, 0) as usize } else { usize::MAX };
        if count > MAX_REGIONS || body.len() != 8 + count * REGION_ENTRY_LEN {
            return Err(WireError::Malformed { kind, why: "bad region table" });
        }
        let mut regions = Vec::with_capacity(count);
        for entry in body[8..].chunks_exact(REGION_ENTRY_LEN) {
            let remote_write = match entry[2] {
                0 => RemoteWrite::Never,
                1 => RemoteWrite::Granted,
                2 => RemoteWrite::Always,
                _ => return Err(WireError::Malformed { kind, why: "unknown region policy" }),
            };
            regions.push(RegionSpec::new(RegionId(u16_at(entry, 0)), u64_at(entry, 8), remote_write));
        }
        crate::layout::validate_specs(&regions).map_err(|_| WireError::Malformed { kind, why: "invalid regions" })?;
        Ok((hello, regions))
    }
}

#[cfg(any(test, feature = "fuzzing"))]
#[path = "wire_check.rs"]
pub(crate) mod check;

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
