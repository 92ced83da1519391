//! Connecting to a peer's NIC: TCP connect plus the handshake, either on the caller's thread
//! ([`dial`]) or on a thread of its own ([`BackgroundDial`]), for callers that must never wait
//! for a peer that does not answer: a frozen process accepts connections in its kernel and
//! never answers the handshake, and a partitioned host drops the SYN, each costing up to
//! `timeouts.connect`. A protocol's polling thread blocked that long stops heartbeating, and
//! its peers take it for dead (found by the fault harness: every follower of a SIGSTOPped
//! leader reconnecting to it at once stalled a 5-replica cluster for over a second).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::Node;
use super::wire::{Decoder, Hello};
use crate::{FabricError, NodeId, RegionSpec};

/// How long `try_connect` and `try_reconnect` wait for a dial they start before they return
/// and leave it running: a live peer on a fast link answers within it. A dial already under
/// way is only looked at, never waited for, so polling it costs nothing.
pub(super) const DIAL_WAIT: Duration = Duration::from_millis(1);

/// A dial running on a thread of its own. The thread ends by itself within the connect
/// timeout; if nobody takes its result, the connection is closed.
#[derive(Debug)]
pub(super) struct BackgroundDial {
    peer: NodeId,
    result: mpsc::Receiver<Result<Dialed, FabricError>>,
}

impl BackgroundDial {
    /// Starts dialing `peer` (no retries of refused connections: the caller tries again).
    pub(super) fn start(node: &Arc<Node>, peer: NodeId) -> Result<Self, FabricError> {
        let (tx, result) = mpsc::sync_channel(1);
        let node = Arc::clone(node);
        std::thread::Builder::new()
            .name(format!("microrep-dial-{}", peer.0))
            .spawn(move || {
                let _ = tx.send(dial(&node, peer, None));
            })
            .map_err(|e| unreachable(peer, format!("starting a dialing thread: {e}")))?;
        Ok(Self { peer, result })
    }

    /// The dial's outcome once it ended, waiting at most `wait`; `None` while it runs.
    pub(super) fn outcome(&self, wait: Duration) -> Option<Result<Dialed, FabricError>> {
        match self.result.recv_timeout(wait) {
            Ok(outcome) => Some(outcome),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(unreachable(self.peer, "the dialing thread died"))),
        }
    }
}

/// A connected, handshaken stream and what the peer said about itself.
#[derive(Debug)]
pub(super) struct Dialed {
    pub(super) stream: TcpStream,
    pub(super) regions: Vec<RegionSpec>,
    pub(super) max_op_bytes: u32,
}

pub(super) fn unreachable(peer: NodeId, why: impl std::fmt::Display) -> FabricError {
    FabricError::PeerUnreachable(peer, why.to_string())
}

/// Connects to `peer` and runs the handshake; retries refused connections until `retry_until`.
pub(super) fn dial(node: &Node, peer: NodeId, retry_until: Option<Instant>) -> Result<Dialed, FabricError> {
    if node.stopped() {
        return Err(unreachable(peer, "this node was stopped"));
    }
    let addr: SocketAddr = *node
        .peers
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&peer)
        .ok_or_else(|| unreachable(peer, "no address configured for it"))?;
    let timeouts = node.config.timeouts;
    let mut pause = Duration::from_millis(1);
    let stream = loop {
        match TcpStream::connect_timeout(&addr, timeouts.connect) {
            Ok(stream) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                match retry_until {
                    // Control path only: back off while the peer starts up.
                    Some(deadline) if Instant::now() + pause < deadline => std::thread::sleep(pause),
                    _ => return Err(unreachable(peer, format!("connecting to {addr}: {e}"))),
                }
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(unreachable(peer, format!("connecting to {addr}: {e}"))),
        }
    };
    let setup = |e: std::io::Error| unreachable(peer, format!("handshake with {addr}: {e}"));
    stream.set_nodelay(true).map_err(setup)?;
    stream.set_read_timeout(Some(timeouts.connect)).map_err(setup)?;
    stream.set_write_timeout(Some(timeouts.connect)).map_err(setup)?;
    let mut hello = Vec::new();
    node.hello().encode(&mut hello);
    (&stream).write_all(&hello).map_err(setup)?;
    let mut decoder = Decoder::new(node.config.max_op_bytes as usize);
    let (theirs, regions) = loop {
        let n = (&stream).read(decoder.spare()).map_err(setup)?;
        if n == 0 {
            return Err(unreachable(peer, format!("{addr} closed the connection during the handshake")));
        }
        decoder.filled(n);
        match decoder.next() {
            Ok(Some(frame)) => break Hello::decode_ack(&frame),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
    }
    .map_err(|e| unreachable(peer, format!("handshake with {addr}: {e}")))?;
    let ours = node.hello();
    if theirs.node != peer.0 || theirs.cluster_id != ours.cluster_id || theirs.max_nodes != ours.max_nodes {
        return Err(unreachable(
            peer,
            format!(
                "{addr} is node {} of cluster {:#x} ({} nodes), expected {peer} of cluster {:#x} ({} nodes)",
                theirs.node, theirs.cluster_id, theirs.max_nodes, ours.cluster_id, ours.max_nodes
            ),
        ));
    }
    if decoder.next().map_err(|e| unreachable(peer, e)).is_ok_and(|f| f.is_some()) {
        return Err(unreachable(peer, format!("{addr} sent frames before any request")));
    }
    stream.set_nonblocking(true).map_err(setup)?;
    Ok(Dialed { stream, regions, max_op_bytes: theirs.max_op_bytes.min(ours.max_op_bytes) })
}
