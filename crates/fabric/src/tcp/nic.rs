//! The NIC thread: one per node, a `poll` loop over the listener, the inbound connections (peers'
//! requests, applied to this node's memory) and the outbound connections of this node's
//! endpoints (responses, turned into completions).
//!
//! Inbound sockets are non-blocking and owned by this thread; responses are buffered per
//! connection and sent as the socket accepts them. A connection whose unsent responses exceed
//! [`OUT_LIMIT`] is not read until they drain: that is the backpressure that stops a peer's
//! blocking post. Outbound sockets (non-blocking too) are shared with the endpoint: the posting
//! thread writes them, and responses are read by whichever of this thread (when `poll` reports
//! them readable) and the endpoint's `poll_completion` gets there first (see `Link::receive`).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::Node;
use super::endpoint::Link;
use super::wire::{self, Decoder, Frame, Header, Hello, Kind, Status, WireError};
use crate::{FabricError, NodeId, OpError, RegionId, layout};

/// Unsent response bytes above which a connection's requests are not read.
const OUT_LIMIT: usize = 256 * 1024;
/// How often the NIC thread looks at connections left to their polling endpoints.
const ATTENDED_RECHECK: Timespec = Timespec { tv_sec: 0, tv_nsec: 1_000_000 };
/// Inbound connections per possible peer; connections beyond are closed at once.
const CONNECTIONS_PER_PEER: usize = 16;
/// Socket reads per connection per wake-up, so one busy peer cannot starve the others.
const READS_PER_WAKE: usize = 16;

/// A peer's connection to this node's NIC.
#[derive(Debug)]
struct Inbound {
    stream: TcpStream,
    decoder: Decoder,
    conn: Conn,
}

/// The serving state of an inbound connection.
#[derive(Debug)]
struct Conn {
    /// The peer, once its handshake was accepted.
    peer: Option<NodeId>,
    /// The peer's revocations per region when the handshake was accepted, or when the peer
    /// reset the connection after a write was refused (see `memory`).
    revocations: Vec<u64>,
    /// A write was refused for want of permission since the last Reset.
    denied: bool,
    /// Before the handshake: when to give up on it.
    handshake_deadline: Option<Instant>,
    /// A request failed: answer the rest `Flushed` until a Reset.
    flushing: bool,
    out: Vec<u8>,
    sent: usize,
    /// Close once `out` is sent (after a refused handshake).
    closing: bool,
}

impl Conn {
    /// Serves one request frame; an `Err` drops the connection.
    fn handle(&mut self, node: &Node, frame: &Frame<'_>) -> Result<Option<Accepted>, WireError> {
        let h = &frame.header;
        let Some(peer) = self.peer else {
            let hello = Hello::decode(frame)?;
            match check_hello(node, &hello) {
                Ok(peer) => {
                    node.hello().encode_ack(node.memory.specs(), &mut self.out);
                    (self.peer, self.handshake_deadline) = (Some(peer), None);
                    self.revocations = node.memory.revocations(peer);
                    return Ok(Some(Accepted));
                }
                Err(reason) => {
                    tracing::warn!(node = %node.config.node, %reason, "tcp fabric: refusing a connection");
                    Hello::encode_refusal(&reason.to_string(), &mut self.out);
                    self.closing = true;
                }
            }
            return Ok(None);
        };
        let region = RegionId(h.region);
        let hostile = |_| WireError::Malformed { kind: h.kind, why: "address outside the registered regions" };
        match h.kind {
            Kind::Write => {
                let index = node.memory.locate(region, h.offset, frame.payload.len() as u64).map_err(hostile)?;
                let result = if self.flushing {
                    Err(OpError::Flushed)
                } else {
                    node.memory.apply_remote_write(peer, &self.revocations, index, h.offset, frame.payload)
                };
                self.flushing |= result.is_err();
                self.denied |= result == Err(OpError::PermissionDenied);
                let ack = Header { status: Status::of(result), ..*h };
                wire::encode(&mut self.out, &Header { kind: Kind::WriteAck, ..ack }, &[]);
            }
            Kind::Read => {
                if h.arg > node.config.max_op_bytes {
                    return Err(WireError::Malformed { kind: h.kind, why: "read larger than max_op_bytes" });
                }
                let index = node.memory.locate(region, h.offset, u64::from(h.arg)).map_err(hostile)?;
                let reply = Header { kind: Kind::ReadData, ..*h };
                if self.flushing {
                    wire::encode(&mut self.out, &Header { status: Status::Flushed, arg: 0, ..reply }, &[]);
                } else {
                    let len = h.arg as usize;
                    wire::encode_with(&mut self.out, &reply, len, |buf| node.memory.read(index, h.offset, buf));
                }
            }
            Kind::Reset => {
                self.flushing = false;
                // The peer sent this after it saw the refusal, so after the revocation that may
                // have caused it: what follows was sent since.
                if std::mem::take(&mut self.denied) {
                    self.revocations = node.memory.revocations(peer);
                }
            }
            Kind::Hello | Kind::HelloAck | Kind::WriteAck | Kind::ReadData => {
                return Err(WireError::Unexpected(h.kind));
            }
        }
        Ok(None)
    }
}

/// A handshake was accepted: the connection may now send frames of up to `max_op_bytes`.
#[derive(Debug)]
struct Accepted;

/// Why a handshake is refused; its text goes to the peer in the refusal.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("cluster id {theirs:#x} differs from ours ({ours:#x})")]
    Cluster { theirs: u64, ours: u64 },
    #[error("cluster size {theirs} differs from ours ({ours})")]
    Size { theirs: u16, ours: u16 },
    /// The peer's id is outside the cluster, or this node's own.
    #[error(transparent)]
    Peer(#[from] FabricError),
}

/// Whether a handshake may join: same cluster, a valid peer id. The reason if not.
fn check_hello(node: &Node, hello: &wire::Hello) -> Result<NodeId, Refusal> {
    let ours = node.hello();
    if hello.cluster_id != ours.cluster_id {
        return Err(Refusal::Cluster { theirs: hello.cluster_id, ours: ours.cluster_id });
    }
    if hello.max_nodes != ours.max_nodes {
        return Err(Refusal::Size { theirs: hello.max_nodes, ours: ours.max_nodes });
    }
    let peer = NodeId(hello.node);
    layout::check_peer(node.config.node, peer, node.config.max_nodes)?;
    Ok(peer)
}

/// Why an inbound connection is closed.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("closed by the peer")]
    ByPeer,
    #[error(transparent)]
    Io(std::io::Error),
    /// A frame that does not decode, or a request that may not be served.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// This node refused the handshake; the refusal was sent.
    #[error("handshake refused")]
    Refused,
}

impl Inbound {
    fn new(stream: TcpStream, node: &Node) -> Self {
        let conn = Conn {
            peer: None,
            revocations: Vec::new(),
            denied: false,
            handshake_deadline: Some(Instant::now() + node.config.timeouts.connect),
            flushing: false,
            out: Vec::new(),
            sent: 0,
            closing: false,
        };
        // Until the handshake is accepted only a handshake-sized frame is buffered, so
        // unauthenticated connections cannot make this node allocate max_op_bytes each.
        Self { stream, decoder: Decoder::new(wire::HANDSHAKE_MAX_PAYLOAD), conn }
    }

    fn interest(&self) -> PollFlags {
        let mut flags = PollFlags::empty();
        if self.conn.out.len() < OUT_LIMIT && !self.conn.closing {
            flags |= PollFlags::IN;
        }
        if self.conn.sent < self.conn.out.len() {
            flags |= PollFlags::OUT;
        }
        flags
    }

    /// Reads and serves requests, then sends what it can. `Err` closes the connection.
    fn serve(&mut self, node: &Node) -> Result<(), Closed> {
        for _ in 0..READS_PER_WAKE {
            if self.conn.out.len() >= OUT_LIMIT || self.conn.closing {
                break;
            }
            match self.stream.read(self.decoder.spare()) {
                Ok(0) => return Err(Closed::ByPeer),
                Ok(n) => self.decoder.filled(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Closed::Io(e)),
            }
            while let Some(frame) = self.decoder.next()? {
                if self.conn.handle(node, &frame)?.is_some() {
                    self.decoder.set_max_payload(node.config.max_op_bytes as usize);
                }
            }
        }
        self.flush()
    }

    fn flush(&mut self) -> Result<(), Closed> {
        let conn = &mut self.conn;
        while conn.sent < conn.out.len() {
            match self.stream.write(&conn.out[conn.sent..]) {
                Ok(n) => conn.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Closed::Io(e)),
            }
        }
        conn.out.clear();
        conn.sent = 0;
        if conn.out.capacity() > 4 * OUT_LIMIT {
            // A large READ grew the buffer; give the memory back.
            conn.out = Vec::new();
        }
        if conn.closing { Err(Closed::Refused) } else { Ok(()) }
    }
}

/// How long `poll` may sleep: forever with nothing to time out, else a fraction of the shortest
/// timeout, so that a timeout fires at most that much late.
fn poll_timeout(node: &Node, inbound: &[Inbound], outbound: &[Arc<Link>]) -> Option<Timespec> {
    let t = node.config.timeouts;
    let mut shortest = None::<Duration>;
    if !outbound.is_empty() {
        shortest = Some(t.request);
    }
    if inbound.iter().any(|c| c.conn.peer.is_none()) {
        shortest = Some(shortest.map_or(t.connect, |s| s.min(t.connect)));
    }
    let tick = (shortest? / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    Some(Timespec { tv_sec: tick.as_secs() as i64, tv_nsec: i64::from(tick.subsec_nanos()) })
}

/// The NIC thread's body: runs until the node is stopped.
pub(super) fn run(node: &Node, listener: TcpListener, wake: UnixStream) {
    let mut inbound: Vec<Inbound> = Vec::new();
    let mut outbound: Vec<Arc<Link>> = Vec::new();
    let mut ready: Vec<PollFlags> = Vec::new();
    while !node.stopped() {
        let new_links = std::mem::take(&mut *node.new_links.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        outbound.extend(new_links);

        let timeout = poll_timeout(node, &inbound, &outbound);
        // Accepting below appends to `inbound`; readiness flags exist for these first ones only.
        let polled_inbound = inbound.len();
        let mut fds = Vec::with_capacity(2 + inbound.len() + outbound.len());
        fds.push(PollFd::new(&wake, PollFlags::IN));
        fds.push(PollFd::new(&listener, PollFlags::IN));
        fds.extend(inbound.iter().map(|c| PollFd::new(&c.stream, c.interest())));
        let now_ns = node.now_ns();
        let mut attended = false;
        fds.extend(outbound.iter().map(|link| {
            // An endpoint that is polling reads its responses itself; waking up for them too
            // would only take the CPU from it. Errors and hang-ups are reported regardless.
            let watch = if link.attended(now_ns) { PollFlags::empty() } else { PollFlags::IN };
            attended |= watch.is_empty();
            PollFd::new(&link.stream, watch)
        }));
        // Look again once the endpoint may have stopped polling.
        let timeout = if attended { timeout.map(|t| t.min(ATTENDED_RECHECK)) } else { timeout };
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(node = %node.config.node, error = %e, "tcp fabric: NIC poll failed; stopping");
                break;
            }
        }
        ready.clear();
        ready.extend(fds.iter().map(PollFd::revents));
        drop(fds);

        if !ready[0].is_empty() {
            let mut sink = [0u8; 64];
            // Wake-ups carry no data; a few reads empty the socket (more are harmless wake-ups).
            for _ in 0..16 {
                if !matches!((&wake).read(&mut sink), Ok(n) if n > 0) {
                    break;
                }
            }
        }
        if !ready[1].is_empty() {
            accept_all(node, &listener, &mut inbound);
        }
        let (in_ready, out_ready) = ready[2..].split_at(polled_inbound);
        let now = Instant::now();
        let mut i = 0;
        inbound.retain_mut(|c| {
            let events = in_ready.get(i).copied().unwrap_or(PollFlags::empty());
            i += 1;
            let result = if events.is_empty() { Ok(()) } else { c.serve(node) };
            let expired = c.conn.handshake_deadline.is_some_and(|d| now > d);
            match result {
                Ok(()) if !expired => true,
                Ok(()) => {
                    tracing::warn!(node = %node.config.node, "tcp fabric: dropping a connection that never completed its handshake");
                    false
                }
                Err(why) => {
                    if c.conn.peer.is_some() || !matches!(why, Closed::ByPeer) {
                        tracing::debug!(node = %node.config.node, peer = ?c.conn.peer, %why, "tcp fabric: inbound connection closed");
                    }
                    false
                }
            }
        });
        let mut i = 0;
        outbound.retain(|link| {
            let events = out_ready.get(i).copied().unwrap_or(PollFlags::empty());
            i += 1;
            let result = if events.is_empty() { Ok(()) } else { link.receive(node) };
            let result = result.and_then(|()| {
                if link.timed_out(now, node.config.timeouts.request) { Err(OpError::PeerUnreachable) } else { Ok(()) }
            });
            match result {
                Ok(()) => true,
                Err(why) => {
                    link.fail(node, why);
                    false
                }
            }
        });
    }
    // Links handed over after the last loop are failed here or, if handed over even later, by
    // `Node::watch` itself, which checks `stopped` after queueing them.
    let late = std::mem::take(&mut *node.new_links.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    for link in outbound.into_iter().chain(late) {
        link.fail(node, OpError::PeerUnreachable);
    }
    for c in inbound {
        let _ = c.stream.shutdown(Shutdown::Both);
    }
}

fn accept_all(node: &Node, listener: &TcpListener, inbound: &mut Vec<Inbound>) {
    // Bounded: a few accepts per wake-up; more stay queued in the listen backlog.
    for _ in 0..64 {
        match listener.accept() {
            Ok((stream, from)) => {
                if inbound.len() >= CONNECTIONS_PER_PEER * usize::from(node.config.max_nodes) {
                    tracing::warn!(node = %node.config.node, %from, "tcp fabric: too many connections; closing a new one");
                } else if stream.set_nonblocking(true).and_then(|()| stream.set_nodelay(true)).is_ok() {
                    inbound.push(Inbound::new(stream, node));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(node = %node.config.node, error = %e, "tcp fabric: accept failed");
                return;
            }
        }
    }
}
