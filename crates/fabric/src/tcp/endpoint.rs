//! A tcp endpoint: one TCP connection to the peer's NIC. The posting thread writes request
//! frames; the node's NIC thread, or the endpoint's own `poll_completion`, reads the responses
//! and turns them into completions.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::Node;
use super::dial::{BackgroundDial, DIAL_WAIT, Dialed, dial, unreachable};
use super::wire::{self, Decoder, Header, Kind, Status};
use crate::{
    Completion, Endpoint, EndpointState, FabricError, NodeId, OpError, OpKind, PostFlags, RegionId, RegionSpec,
    RemoteAddr, layout,
};

/// One posted operation waiting for its response.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) wr_id: u64,
    pub(super) kind: OpKind,
    pub(super) signaled: bool,
    /// Already reported as `Flushed` by `reconnect`; its response is only consumed.
    pub(super) reported: bool,
    /// Where a READ's data goes: local region index and offset.
    pub(super) read_into: (usize, u64),
    /// Bytes a READ expects.
    pub(super) len: u32,
}

/// The state an endpoint shares with the NIC thread.
#[derive(Debug)]
pub(super) struct Queue {
    /// The generation of the endpoint's current connection; a connection of another
    /// generation is stale and its responses are ignored.
    pub(super) generation: u64,
    pub(super) link_alive: bool,
    pub(super) outstanding: VecDeque<Pending>,
    pub(super) completions: VecDeque<Completion>,
    pub(super) state: EndpointState,
    /// When the oldest outstanding operation last saw progress (a post into an empty queue, or
    /// response bytes).
    pub(super) last_progress: Instant,
}

impl Queue {
    /// Records the outcome of an operation; a failure moves the endpoint to the error state.
    pub(super) fn complete(&mut self, wr_id: u64, kind: OpKind, signaled: bool, status: Result<(), OpError>) {
        if status.is_err() {
            self.state = EndpointState::Error;
        }
        if status.is_err() || signaled {
            self.completions.push_back(Completion { wr_id, kind, status });
        }
    }

    /// Reports every operation still waiting for a response as `Flushed`, keeping it queued
    /// only to consume its response. Called when a response reported a failure: the peer's NIC
    /// then flushes every later request of the connection until a Reset, so these operations
    /// cannot take effect, and reporting them now keeps completions in posting order ahead of
    /// anything posted later (which completes `Flushed` at once).
    pub(super) fn flush_outstanding(&mut self, node: &Node) {
        for op in self.outstanding.iter_mut().filter(|op| !op.reported) {
            op.reported = true;
            node.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.completions.push_back(Completion { wr_id: op.wr_id, kind: op.kind, status: Err(OpError::Flushed) });
        }
    }

    /// The connection is gone: the oldest operation fails with `why`, the rest are flushed.
    pub(super) fn fail_link(&mut self, node: &Node, why: OpError) {
        self.link_alive = false;
        let mut first = true;
        while let Some(op) = self.outstanding.pop_front() {
            if op.reported {
                continue;
            }
            node.in_flight.fetch_sub(1, Ordering::AcqRel);
            let status = if first { why } else { OpError::Flushed };
            first = false;
            self.complete(op.wr_id, op.kind, op.signaled, Err(status));
        }
    }
}

/// How long after an endpoint's last `poll_completion` the NIC thread leaves its responses to it.
pub(super) const ATTENDED: Duration = Duration::from_millis(1);

/// Socket reads per `Link::receive`, so one busy connection cannot hold the NIC thread.
const READS_PER_RECEIVE: usize = 16;

/// An outbound connection (non-blocking socket), owned by an endpoint and watched by the NIC
/// thread.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) stream: TcpStream,
    pub(super) generation: u64,
    pub(super) queue: Arc<Mutex<Queue>>,
    /// Response bytes received and not yet decoded; whoever holds it reads the socket.
    decoder: Mutex<Decoder>,
    /// When the endpoint last polled for a completion (ns since `Node::epoch`): while it keeps
    /// polling, the NIC thread leaves the reading to it (see `Link::attended`).
    polled_at_ns: AtomicU64,
}

impl Link {
    fn new(stream: TcpStream, generation: u64, queue: Arc<Mutex<Queue>>, max_op_bytes: u32) -> Self {
        let decoder = Mutex::new(Decoder::new(max_op_bytes as usize));
        Self { stream, generation, queue, decoder, polled_at_ns: AtomicU64::new(0) }
    }

    /// Whether the endpoint polled within [`ATTENDED`] before `now_ns`: then the NIC thread need
    /// not wake up for this connection's responses, which the polling thread reads itself.
    pub(super) fn attended(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.polled_at_ns.load(Ordering::Relaxed)) < ATTENDED.as_nanos() as u64
    }

    /// Reads the responses that have arrived and completes their operations; never blocks.
    ///
    /// Called by the NIC thread when `poll` reports the socket readable, and by
    /// `poll_completion` of an endpoint waiting for an operation, so a thread polling for its
    /// completion picks it up without a hand-off from the NIC thread. The decoder lock makes the
    /// two take turns (the endpoint only tries it: if the NIC thread is reading, it skips).
    pub(super) fn receive(&self, node: &Node) -> Result<(), OpError> {
        let mut decoder = self.decoder.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.receive_with(node, &mut decoder)
    }

    fn try_receive(&self, node: &Node) -> Result<(), OpError> {
        match self.decoder.try_lock() {
            Ok(mut decoder) => self.receive_with(node, &mut decoder),
            Err(std::sync::TryLockError::Poisoned(p)) => self.receive_with(node, &mut p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Ok(()),
        }
    }

    fn receive_with(&self, node: &Node, decoder: &mut Decoder) -> Result<(), OpError> {
        for _ in 0..READS_PER_RECEIVE {
            match (&self.stream).read(decoder.spare()) {
                Ok(0) => return Err(OpError::PeerUnreachable),
                Ok(n) => decoder.filled(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(OpError::PeerUnreachable),
            }
            self.complete_responses(node, decoder)?;
        }
        Ok(())
    }

    /// Matches decoded responses to the outstanding operations, in order.
    fn complete_responses(&self, node: &Node, decoder: &mut Decoder) -> Result<(), OpError> {
        let mut queue = self.lock();
        if queue.generation != self.generation || !queue.link_alive {
            return Err(OpError::Flushed);
        }
        queue.last_progress = Instant::now();
        while let Some(frame) = decoder.next().map_err(|_| OpError::Transport)? {
            let h = frame.header;
            let op = queue.outstanding.front().ok_or(OpError::Transport)?;
            let expected = if op.kind == OpKind::Write { Kind::WriteAck } else { Kind::ReadData };
            let data_len_ok = h.status != Status::Ok || op.kind == OpKind::Write || h.arg == op.len;
            if h.kind != expected || h.wr_id != op.wr_id || h.status == Status::Rejected || !data_len_ok {
                return Err(OpError::Transport);
            }
            let op = queue.outstanding.pop_front().ok_or(OpError::Transport)?;
            if op.reported {
                continue;
            }
            node.in_flight.fetch_sub(1, Ordering::AcqRel);
            let status = h.status.to_result();
            if status.is_ok() && op.kind == OpKind::Read {
                node.memory.write(op.read_into.0, op.read_into.1, frame.payload);
            }
            queue.complete(op.wr_id, op.kind, op.signaled, status);
            if status.is_err() {
                queue.flush_outstanding(node);
            }
        }
        Ok(())
    }

    /// Whether the oldest outstanding operation has waited longer than `limit` for progress.
    pub(super) fn timed_out(&self, now: Instant, limit: Duration) -> bool {
        let queue = self.lock();
        queue.outstanding.iter().any(|op| !op.reported) && now.saturating_duration_since(queue.last_progress) > limit
    }

    /// Sends a whole frame, waiting for socket space up to `timeout` without progress.
    fn send(&self, bytes: &[u8], timeout: Duration) -> std::io::Result<()> {
        let mut deadline = Instant::now() + timeout;
        let mut sent = 0;
        while sent < bytes.len() {
            match (&self.stream).write(&bytes[sent..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    sent += n;
                    deadline = Instant::now() + timeout;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(std::io::ErrorKind::TimedOut.into());
                    }
                    let wait = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
                    let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
                    match rustix::event::poll(&mut fds, Some(&wait)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails the endpoint's operations if this is still its connection, and closes it.
    pub(super) fn fail(&self, node: &Node, why: OpError) {
        let mut queue = self.lock();
        if queue.generation == self.generation && queue.link_alive {
            queue.fail_link(node, why);
        }
        drop(queue);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// An endpoint (queue pair) of the tcp backend.
#[derive(Debug)]
pub struct TcpEndpoint {
    node: Arc<Node>,
    peer: NodeId,
    queue: Arc<Mutex<Queue>>,
    link: Arc<Link>,
    peer_regions: Vec<RegionSpec>,
    max_op_bytes: u32,
    /// Reused frame buffer.
    tx: Vec<u8>,
    /// A new connection being dialed by `try_reconnect`.
    dialing: Option<BackgroundDial>,
}

impl TcpEndpoint {
    /// Connects to `peer`, waiting up to the connect timeout for it to accept.
    pub(super) fn open(node: &Arc<Node>, peer: NodeId) -> Result<Self, FabricError> {
        layout::check_peer(node.config.node, peer, node.config.max_nodes)?;
        let dialed = dial(node, peer, Some(Instant::now() + node.config.timeouts.connect))?;
        Ok(Self::connected(node, peer, dialed))
    }

    /// Connects to `peer` without waiting for a peer that does not answer: `None` while the
    /// dial runs in the background (the next call takes its outcome).
    pub(super) fn try_open(node: &Arc<Node>, peer: NodeId) -> Result<Option<Self>, FabricError> {
        layout::check_peer(node.config.node, peer, node.config.max_nodes)?;
        let lock = || node.dials.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let running = lock().remove(&peer);
        // Only a dial just started is waited for (briefly); one under way is only looked at.
        let (dial, wait) = match running {
            Some(dial) => (dial, Duration::ZERO),
            None => (BackgroundDial::start(node, peer)?, DIAL_WAIT),
        };
        match dial.outcome(wait) {
            Some(outcome) => Ok(Some(Self::connected(node, peer, outcome?))),
            None => {
                lock().insert(peer, dial);
                Ok(None)
            }
        }
    }

    fn connected(node: &Arc<Node>, peer: NodeId, dialed: Dialed) -> Self {
        let queue = Arc::new(Mutex::new(Queue {
            generation: 0,
            link_alive: true,
            outstanding: VecDeque::new(),
            completions: VecDeque::new(),
            state: EndpointState::Ready,
            last_progress: Instant::now(),
        }));
        let link = Arc::new(Link::new(dialed.stream, 0, Arc::clone(&queue), dialed.max_op_bytes));
        node.watch(Arc::clone(&link));
        Self {
            node: Arc::clone(node),
            peer,
            queue,
            link,
            peer_regions: dialed.regions,
            max_op_bytes: dialed.max_op_bytes,
            tx: Vec::new(),
            dialing: None,
        }
    }

    /// Replaces a dead connection with `dialed`: operations still outstanding on the old one
    /// are flushed.
    fn install(&mut self, dialed: Dialed) {
        let mut queue = self.lock();
        queue.generation += 1;
        queue.fail_link(&self.node, OpError::Flushed);
        queue.link_alive = true;
        queue.state = EndpointState::Ready;
        let link = Arc::new(Link::new(dialed.stream, queue.generation, Arc::clone(&self.queue), dialed.max_op_bytes));
        drop(queue);
        self.node.watch(Arc::clone(&link));
        let _ = self.link.stream.shutdown(Shutdown::Both);
        self.link = link;
        self.peer_regions = dialed.regions;
        self.max_op_bytes = dialed.max_op_bytes;
    }

    /// Brings the endpoint back on its live connection, if it has one (`None` otherwise): the
    /// peer's NIC answered a request with a failure and flushes every later one until our
    /// Reset. The operations behind it were reported `Flushed` when that answer arrived
    /// (`flush_outstanding`, a no-op here); their own answers are consumed without a second
    /// report. Checked and done under one lock, so a link failing meanwhile is never taken for
    /// a live one, nor a dead one for a reason to dial on the caller's thread.
    fn reset_live_link(&mut self) -> Option<Result<(), FabricError>> {
        let mut queue = self.lock();
        if !queue.link_alive {
            return None;
        }
        if queue.state == EndpointState::Ready {
            return Some(Ok(()));
        }
        queue.flush_outstanding(&self.node);
        queue.state = EndpointState::Ready;
        drop(queue);
        self.tx.clear();
        wire::encode(&mut self.tx, &Header::new(Kind::Reset), &[]);
        if let Err(e) = self.link.send(&self.tx, self.node.config.timeouts.request) {
            self.link.fail(&self.node, OpError::PeerUnreachable);
            return Some(Err(unreachable(self.peer, format!("sending reset: {e}"))));
        }
        Some(Ok(()))
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks `len` bytes at `addr` against the peer's region table and the size bound.
    fn check_remote(&self, addr: RemoteAddr, len: u64) -> Result<(), FabricError> {
        let (_, spec) = layout::find_spec(self.peer, &self.peer_regions, addr.region)?;
        layout::check_bounds(self.peer, addr.region, spec.len_bytes, addr.offset, len)?;
        if len > u64::from(self.max_op_bytes) {
            return Err(FabricError::TooLarge { len, max: u64::from(self.max_op_bytes) });
        }
        Ok(())
    }

    /// Queues `op` and sends its frame (in `self.tx`), or completes it at once if the endpoint
    /// cannot carry it.
    fn submit(&mut self, op: Pending) -> Result<(), FabricError> {
        let mut queue = self.lock();
        let depth = self.node.config.queue_depth;
        if queue.outstanding.len() + queue.completions.len() >= depth {
            return Err(FabricError::QueueFull { peer: self.peer, depth });
        }
        if queue.state == EndpointState::Error {
            queue.complete(op.wr_id, op.kind, op.signaled, Err(OpError::Flushed));
            return Ok(());
        }
        if !queue.link_alive {
            queue.complete(op.wr_id, op.kind, op.signaled, Err(OpError::PeerUnreachable));
            return Ok(());
        }
        if queue.outstanding.is_empty() {
            queue.last_progress = Instant::now();
        }
        queue.outstanding.push_back(op);
        self.node.in_flight.fetch_add(1, Ordering::AcqRel);
        drop(queue);
        // Never hold the queue lock while sending: the NIC thread needs it to drain responses,
        // which is what makes room at the peer for this send.
        if self.link.send(&self.tx, self.node.config.timeouts.request).is_err() {
            self.link.fail(&self.node, OpError::PeerUnreachable);
        }
        Ok(())
    }
}

impl Endpoint for TcpEndpoint {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError> {
        self.check_remote(dst, data.len() as u64)?;
        self.tx.clear();
        let header = Header { region: dst.region.0, wr_id, offset: dst.offset, ..Header::new(Kind::Write) };
        wire::encode(&mut self.tx, &header, data);
        let signaled = flags.is_signaled();
        self.submit(Pending { wr_id, kind: OpKind::Write, signaled, reported: false, read_into: (0, 0), len: 0 })
    }

    fn post_read(
        &mut self,
        wr_id: u64,
        src: RemoteAddr,
        len: u32,
        local_region: RegionId,
        local_offset: u64,
        flags: PostFlags,
    ) -> Result<(), FabricError> {
        self.check_remote(src, u64::from(len))?;
        let local = self.node.memory.locate(local_region, local_offset, u64::from(len))?;
        self.tx.clear();
        let header = Header { region: src.region.0, wr_id, offset: src.offset, arg: len, ..Header::new(Kind::Read) };
        wire::encode(&mut self.tx, &header, &[]);
        let signaled = flags.is_signaled();
        self.submit(Pending {
            wr_id,
            kind: OpKind::Read,
            signaled,
            reported: false,
            read_into: (local, local_offset),
            len,
        })
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        let mut queue = self.lock();
        if let Some(done) = queue.completions.pop_front() {
            return Some(done);
        }
        if queue.outstanding.is_empty() {
            return None;
        }
        drop(queue);
        self.link.polled_at_ns.store(self.node.now_ns(), Ordering::Relaxed);
        if let Err(why) = self.link.try_receive(&self.node) {
            self.link.fail(&self.node, why);
        }
        self.lock().completions.pop_front()
    }

    fn state(&self) -> EndpointState {
        self.lock().state
    }

    /// The connection ended (the NIC thread read its end, or an operation failed on it): the
    /// peer's process is gone or unreachable, though the endpoint stays `Ready` until an
    /// operation fails. A new leader then reconnects before it posts its permission request
    /// instead of losing that request to the dead connection.
    fn peer_gone(&self) -> bool {
        !self.lock().link_alive
    }

    fn reconnect(&mut self) -> Result<(), FabricError> {
        if let Some(reset) = self.reset_live_link() {
            return reset;
        }
        self.dialing = None;
        let dialed = dial(&self.node, self.peer, None)?;
        self.install(dialed);
        Ok(())
    }

    fn try_reconnect(&mut self) -> Result<bool, FabricError> {
        if let Some(reset) = self.reset_live_link() {
            return reset.map(|()| true);
        }
        let (dial, wait) = match self.dialing.take() {
            Some(dial) => (dial, Duration::ZERO),
            None => (BackgroundDial::start(&self.node, self.peer)?, DIAL_WAIT),
        };
        match dial.outcome(wait) {
            Some(outcome) => {
                self.install(outcome?);
                Ok(true)
            }
            None => {
                self.dialing = Some(dial);
                Ok(false)
            }
        }
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        let mut queue = self.lock();
        // Operations still outstanding will never be polled; stop counting them.
        for op in queue.outstanding.iter_mut().filter(|op| !op.reported) {
            op.reported = true;
            self.node.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        queue.link_alive = false;
        drop(queue);
        let _ = self.link.stream.shutdown(Shutdown::Both);
    }
}
