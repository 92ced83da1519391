//! The TCP bootstrap's messages: how two nodes exchange region tables and QP addresses.
//!
//! Every message is a frame: a little-endian `u32` length (at most [`MAX_FRAME_BYTES`]) and that
//! many bytes. Requests open with a header (magic, version, kind, sender, addressee) so that a
//! stray connection or a stale address table is refused with a clear error. Decoding checks every
//! length; malformed input is an `Err`, never a panic.
//!
//! Connecting (one TCP connection, initiator I, target T):
//! `I -> T Hello`, `T -> I Offer` (T's regions, one passive QP per lane, in INIT),
//! `I -> T Accept` (I's QP addresses), `T -> I Done` (T's QPs in RTS), then I moves its QPs to RTS.
//! Reconnecting: `I -> T Reconnect` (I's fresh PSNs), `T -> I Reconnected` (T's fresh PSNs).
//! Closing: `I -> T Close`, `T -> I Done`.

use std::io::{Read, Write};
use std::net::TcpStream;

use sideway::ibverbs::address::Gid;
use sideway::ibverbs::device_context::Mtu;

use super::qp::QpAddress;
use crate::{NodeId, RegionId, RemoteWrite};

/// Largest frame accepted.
pub(crate) const MAX_FRAME_BYTES: u32 = 64 * 1024;
const MAGIC: u32 = 0x4256_524d; // "MRVB"
const VERSION: u16 = 1;
const OPEN_LANE: u16 = u16::MAX;
/// Longest refusal reason sent (cut at a character boundary).
const MAX_REFUSAL_BYTES: usize = 1024;

/// A region of the target as the initiator addresses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RemoteRegion {
    pub(crate) id: RegionId,
    pub(crate) remote_write: RemoteWrite,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
}

/// A request's kind and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Hello,
    Accept { lanes: Vec<QpAddress> },
    Reconnect { conn_id: u64, psns: Vec<u32> },
    Close { conn_id: u64 },
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Lanes: `None` is the open lane, `Some(region)` the lane of a granted region.
    Offer {
        conn_id: u64,
        regions: Vec<RemoteRegion>,
        lanes: Vec<(Option<RegionId>, QpAddress)>,
    },
    Reconnected {
        psns: Vec<u32>,
    },
    Done,
    Refused(String),
}

/// Sender and addressee of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) from: NodeId,
    pub(crate) to: NodeId,
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn count(&mut self, n: usize) -> &mut Self {
        self.u16(u16::try_from(n).expect("at most MAX_REGIONS lanes and regions"))
    }
    fn qp(&mut self, a: &QpAddress) -> &mut Self {
        self.u32(a.qpn).u32(a.psn).u16(a.lid).u32(a.mtu as u32);
        self.0.extend_from_slice(&a.gid.raw);
        self
    }
}

/// Why a bootstrap message cannot be decoded; the connection carrying it is dropped.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub(crate) enum BootstrapError {
    #[error("message truncated")]
    Truncated,
    #[error("{0} trailing bytes")]
    Trailing(usize),
    #[error("{0} entries announced, at most {max}", max = crate::layout::MAX_REGIONS + 1)]
    TooManyEntries(usize),
    #[error("invalid path MTU code {0}")]
    BadMtu(u32),
    #[error("not a microrep verbs bootstrap message")]
    BadMagic,
    #[error("bootstrap protocol version {0}, expected {VERSION}")]
    BadVersion(u16),
    #[error("unknown request kind {0}")]
    UnknownRequest(u8),
    #[error("unknown reply kind {0}")]
    UnknownReply(u8),
    #[error("unknown write policy {0}")]
    UnknownPolicy(u8),
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], BootstrapError> {
        let (head, rest) = self.0.split_at_checked(N).ok_or(BootstrapError::Truncated)?;
        self.0 = rest;
        Ok(head.try_into().expect("split at N"))
    }
    fn u8(&mut self) -> Result<u8, BootstrapError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, BootstrapError> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, BootstrapError> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, BootstrapError> {
        self.take().map(u64::from_le_bytes)
    }
    fn count(&mut self) -> Result<usize, BootstrapError> {
        let n = usize::from(self.u16()?);
        if n > crate::layout::MAX_REGIONS + 1 {
            return Err(BootstrapError::TooManyEntries(n));
        }
        Ok(n)
    }
    fn qp(&mut self) -> Result<QpAddress, BootstrapError> {
        let (qpn, psn, lid) = (self.u32()?, self.u32()?, self.u16()?);
        let mtu = match self.u32()? {
            m @ 1..=5 => Mtu::from(m),
            m => return Err(BootstrapError::BadMtu(m)),
        };
        Ok(QpAddress { qpn, psn: psn & 0x00ff_ffff, lid, gid: Gid { raw: self.take()? }, mtu })
    }
    fn end(&self) -> Result<(), BootstrapError> {
        if self.0.is_empty() { Ok(()) } else { Err(BootstrapError::Trailing(self.0.len())) }
    }
}

fn write_frame(stream: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len()).expect("frames are small");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(body);
    stream.write_all(&frame)
}

fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    Ok(body)
}

fn invalid(e: BootstrapError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// Sends a request.
pub(crate) fn send_request(stream: &mut TcpStream, header: Header, request: &Request) -> std::io::Result<()> {
    write_frame(stream, &encode_request(header, request))
}

fn encode_request(header: Header, request: &Request) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(MAGIC).u16(VERSION).u16(header.from.0).u16(header.to.0);
    match request {
        Request::Hello => {
            w.u8(1);
        }
        Request::Accept { lanes } => {
            w.u8(2).count(lanes.len());
            lanes.iter().for_each(|a| {
                w.qp(a);
            });
        }
        Request::Reconnect { conn_id, psns } => {
            w.u8(3).u64(*conn_id).count(psns.len());
            psns.iter().for_each(|&p| {
                w.u32(p);
            });
        }
        Request::Close { conn_id } => {
            w.u8(4).u64(*conn_id);
        }
    }
    w.0
}

/// Receives a request.
pub(crate) fn recv_request(stream: &mut TcpStream) -> std::io::Result<(Header, Request)> {
    let body = read_frame(stream)?;
    decode_request(&body).map_err(invalid)
}

pub(crate) fn decode_request(body: &[u8]) -> Result<(Header, Request), BootstrapError> {
    let mut r = Reader(body);
    if r.u32()? != MAGIC {
        return Err(BootstrapError::BadMagic);
    }
    let version = r.u16()?;
    if version != VERSION {
        return Err(BootstrapError::BadVersion(version));
    }
    let header = Header { from: NodeId(r.u16()?), to: NodeId(r.u16()?) };
    let request = match r.u8()? {
        1 => Request::Hello,
        2 => {
            let n = r.count()?;
            Request::Accept { lanes: (0..n).map(|_| r.qp()).collect::<Result<_, _>>()? }
        }
        3 => {
            let conn_id = r.u64()?;
            let n = r.count()?;
            Request::Reconnect {
                conn_id,
                psns: (0..n).map(|_| r.u32().map(|p| p & 0x00ff_ffff)).collect::<Result<_, _>>()?,
            }
        }
        4 => Request::Close { conn_id: r.u64()? },
        k => return Err(BootstrapError::UnknownRequest(k)),
    };
    r.end()?;
    Ok((header, request))
}

/// Sends a reply.
pub(crate) fn send_reply(stream: &mut TcpStream, reply: &Reply) -> std::io::Result<()> {
    write_frame(stream, &encode_reply(reply))
}

fn encode_reply(reply: &Reply) -> Vec<u8> {
    let mut w = Writer::default();
    match reply {
        Reply::Offer { conn_id, regions, lanes } => {
            w.u8(1).u64(*conn_id).count(regions.len());
            for g in regions {
                let policy = match g.remote_write {
                    RemoteWrite::Never => 0,
                    RemoteWrite::Granted => 1,
                    RemoteWrite::Always => 2,
                };
                w.u16(g.id.0).u8(policy).u64(g.addr).u64(g.len).u32(g.rkey);
            }
            w.count(lanes.len());
            for (region, a) in lanes {
                w.u16(region.map_or(OPEN_LANE, |r| r.0)).qp(a);
            }
        }
        Reply::Reconnected { psns } => {
            w.u8(2).count(psns.len());
            psns.iter().for_each(|&p| {
                w.u32(p);
            });
        }
        Reply::Done => {
            w.u8(3);
        }
        Reply::Refused(why) => {
            let cut = (0..=why.len().min(MAX_REFUSAL_BYTES)).rev().find(|&at| why.is_char_boundary(at)).unwrap_or(0);
            let why = &why.as_bytes()[..cut];
            w.u8(4).u16(why.len() as u16);
            w.0.extend_from_slice(why);
        }
    }
    w.0
}

/// Receives a reply.
pub(crate) fn recv_reply(stream: &mut TcpStream) -> std::io::Result<Reply> {
    let body = read_frame(stream)?;
    decode_reply(&body).map_err(invalid)
}

pub(crate) fn decode_reply(body: &[u8]) -> Result<Reply, BootstrapError> {
    let mut r = Reader(body);
    let reply = match r.u8()? {
        1 => {
            let conn_id = r.u64()?;
            let n = r.count()?;
            let mut regions = Vec::with_capacity(n);
            for _ in 0..n {
                let id = RegionId(r.u16()?);
                let remote_write = match r.u8()? {
                    0 => RemoteWrite::Never,
                    1 => RemoteWrite::Granted,
                    2 => RemoteWrite::Always,
                    p => return Err(BootstrapError::UnknownPolicy(p)),
                };
                regions.push(RemoteRegion { id, remote_write, addr: r.u64()?, len: r.u64()?, rkey: r.u32()? });
            }
            let n = r.count()?;
            let mut lanes = Vec::with_capacity(n);
            for _ in 0..n {
                let region = match r.u16()? {
                    OPEN_LANE => None,
                    id => Some(RegionId(id)),
                };
                lanes.push((region, r.qp()?));
            }
            Reply::Offer { conn_id, regions, lanes }
        }
        2 => {
            let n = r.count()?;
            Reply::Reconnected { psns: (0..n).map(|_| r.u32().map(|p| p & 0x00ff_ffff)).collect::<Result<_, _>>()? }
        }
        3 => Reply::Done,
        4 => {
            let n = usize::from(r.u16()?);
            let (text, rest) = r.0.split_at_checked(n).ok_or(BootstrapError::Truncated)?;
            r.0 = rest;
            Reply::Refused(String::from_utf8_lossy(text).into_owned())
        }
        k => return Err(BootstrapError::UnknownReply(k)),
    };
    r.end()?;
    Ok(reply)
}

#[cfg(any(test, feature = "fuzzing"))]
#[path = "wire_check.rs"]
pub(crate) mod check;

#[cfg(test)]
mod tests {
    use super::*;

    fn qp(n: u32) -> QpAddress {
        QpAddress { qpn: n, psn: n + 1, lid: 3, gid: Gid { raw: [n as u8; 16] }, mtu: Mtu::Mtu1024 }
    }

    #[test]
    fn messages_round_trip() {
        let header = Header { from: NodeId(1), to: NodeId(2) };
        for request in [
            Request::Hello,
            Request::Accept { lanes: vec![qp(1), qp(2)] },
            Request::Reconnect { conn_id: 9, psns: vec![5, 6] },
            Request::Close { conn_id: 4 },
        ] {
            let encoded = encode_request(header, &request);
            assert_eq!(decode_request(&encoded), Ok((header, request)));
        }
        let region =
            RemoteRegion { id: RegionId(3), remote_write: RemoteWrite::Granted, addr: 1 << 40, len: 4096, rkey: 7 };
        for reply in [
            Reply::Offer { conn_id: 1, regions: vec![region], lanes: vec![(None, qp(1)), (Some(RegionId(3)), qp(2))] },
            Reply::Reconnected { psns: vec![1, 2, 3] },
            Reply::Done,
            Reply::Refused("no".into()),
        ] {
            assert_eq!(decode_reply(&encode_reply(&reply)), Ok(reply));
        }
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = encode_reply(&Reply::Offer {
            conn_id: 1,
            regions: vec![RemoteRegion {
                id: RegionId(0),
                remote_write: RemoteWrite::Always,
                addr: 0,
                len: 8,
                rkey: 1,
            }],
            lanes: vec![(None, qp(1))],
        });
        for cut in 0..good.len() {
            assert!(decode_reply(&good[..cut]).is_err(), "truncated at {cut}");
        }
        assert!(decode_reply(&[9]).is_err());
        assert!(decode_request(&[0; 12]).is_err(), "bad magic");
        let mut many = encode_request(Header { from: NodeId(0), to: NodeId(1) }, &Request::Accept { lanes: vec![] });
        let at = many.len() - 2;
        many[at..].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode_request(&many).is_err(), "absurd count");
    }

    /// Every message kind, encoded, then a few bytes overwritten or the tail cut.
    fn mutated_message() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let message = (0u8..8, any::<u64>(), 0usize..4, any::<String>());
        let flips = proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3);
        (message, flips, any::<u8>()).prop_map(|((kind, id, n, why), flips, cut)| {
            let header = Header { from: NodeId(id as u16), to: NodeId(1) };
            let region = RemoteRegion { id: RegionId(2), remote_write: RemoteWrite::Never, addr: id, len: 64, rkey: 5 };
            let psns: Vec<u32> = (0..n as u32).collect();
            let lanes: Vec<QpAddress> = (0..n as u32).map(qp).collect();
            let mut bytes = match kind {
                0 => encode_request(header, &Request::Hello),
                1 => encode_request(header, &Request::Accept { lanes }),
                2 => encode_request(header, &Request::Reconnect { conn_id: id, psns }),
                3 => encode_request(header, &Request::Close { conn_id: id }),
                4 => encode_reply(&Reply::Offer {
                    conn_id: id,
                    regions: vec![region; n],
                    lanes: lanes.into_iter().map(|l| (Some(RegionId(2)), l)).collect(),
                }),
                5 => encode_reply(&Reply::Reconnected { psns }),
                6 => encode_reply(&Reply::Done),
                _ => encode_reply(&Reply::Refused(why)),
            };
            for (at, byte) in flips {
                let len = bytes.len();
                bytes[at % len] = byte;
            }
            bytes.truncate(bytes.len() - usize::from(cut % 4).min(bytes.len()));
            bytes
        })
    }

    proptest::proptest! {
        /// Byte soup: the decoders return errors, never panic.
        #[test]
        fn any_bytes_keep_the_decoder_promises(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            check::bootstrap(&data);
        }

        /// Messages of every kind, corrupted: rejected, or accepted and stable under re-encoding.
        #[test]
        fn mutated_messages_keep_the_decoder_promises(data in mutated_message()) {
            check::bootstrap(&data);
        }
    }
}
