//! The initiator side of a connection: lanes of RC QPs, one CQ, a staging ring, and the
//! bookkeeping that turns selectively signaled work completions into one [`Completion`] per
//! failed or signaled operation, in posting order.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::BasicCompletionQueue;
use sideway::ibverbs::completion::WorkCompletionStatus as Wc;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendError, PostSendGuard, QueuePair, SetInlineData, SetScatterGatherEntry, WorkRequestFlags,
};

use super::memory::Registered;
use super::node::Node;
use super::qp::{self, QpAddress};
use super::wire::{self, Header, RemoteRegion, Reply, Request};
use crate::{
    Completion, Endpoint, EndpointState, FabricError, NodeId, OpError, OpKind, PostFlags, RegionId, RemoteAddr,
    RemoteWrite, layout,
};

/// Bytes at the start of the staging MR that receive the internal fence READs.
pub(crate) const FENCE_BYTES: usize = 64;

/// An RC connection to one peer (see the module docs of `verbs` for lanes and signaling).
#[derive(Debug)]
pub struct VerbsEndpoint {
    node: Arc<Node>,
    peer: NodeId,
    bootstrap: SocketAddr,
    conn_id: u64,
    regions: Vec<RemoteRegion>,
    /// For each of `regions`, the lane its operations use.
    lane_of: Vec<usize>,
    lanes: Vec<Lane>,
    cq: Arc<BasicCompletionQueue>,
    staging: Registered,
    ring: Ring,
    inflight: VecDeque<Posted>,
    ready: VecDeque<Completion>,
    next_seq: u64,
    lane_now: usize,
    unsignaled_run: u32,
    state: EndpointState,
    max_inline: u32,
}

#[derive(Debug)]
struct Lane {
    qp: BasicQueuePair,
    remote: QpAddress,
}

/// A posted work request not yet known to be complete.
#[derive(Debug)]
struct Posted {
    seq: u64,
    wr_id: u64,
    kind: OpKind,
    report_success: bool,
    internal: bool,
    hw_signaled: bool,
    /// Ring position to release once it completes.
    staged_end: u64,
}

/// A FIFO byte ring over the staging MR (after the fence bytes); positions only grow.
#[derive(Debug)]
struct Ring {
    cap: u64,
    head: u64,
    tail: u64,
}

impl Ring {
    /// Reserves `len` contiguous bytes: `(offset in ring, end position)`.
    fn alloc(&mut self, len: u64) -> Option<(u64, u64)> {
        let mut start = self.head;
        if start % self.cap + len > self.cap {
            start += self.cap - start % self.cap;
        }
        let end = start + len;
        (end - self.tail <= self.cap).then(|| {
            self.head = end;
            (start % self.cap, end)
        })
    }

    fn release(&mut self, end: u64) {
        self.tail = self.tail.max(end);
    }
}

fn unreachable(peer: NodeId, why: impl std::fmt::Display) -> FabricError {
    FabricError::PeerUnreachable(peer, why.to_string())
}

fn exchange(node: &Node, peer: NodeId, addr: SocketAddr, timeout: Duration) -> Result<TcpStream, FabricError> {
    let stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| unreachable(peer, format!("bootstrap {addr}: {e}")))?;
    stream
        .set_read_timeout(Some(node.config.connect_timeout))
        .and_then(|()| stream.set_write_timeout(Some(node.config.connect_timeout)))
        .map_err(|e| unreachable(peer, e))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

impl VerbsEndpoint {
    pub(crate) fn connect(node: Arc<Node>, peer: NodeId) -> Result<Self, FabricError> {
        layout::check_peer(node.config.node, peer, node.config.max_nodes)?;
        let addr = node.config.peers.get(peer).ok_or_else(|| unreachable(peer, "no bootstrap address known"))?;
        let header = Header { from: node.config.node, to: peer };
        let mut stream = exchange(&node, peer, addr, node.config.connect_timeout)?;
        let io = |e: std::io::Error| unreachable(peer, format!("bootstrap: {e}"));
        wire::send_request(&mut stream, header, &Request::Hello).map_err(io)?;
        let (conn_id, regions, offered) = match wire::recv_reply(&mut stream).map_err(io)? {
            Reply::Offer { conn_id, regions, lanes } => (conn_id, regions, lanes),
            Reply::Refused(why) => return Err(unreachable(peer, format!("refused: {why}"))),
            other => return Err(unreachable(peer, format!("unexpected bootstrap reply {other:?}"))),
        };
        let lane_of = lane_map(peer, &regions, &offered)?;
        let device = &node.device;
        let depth = node.config.queue_depth as u32;
        let cq = device
            .context
            .create_cq_builder()
            .setup_cqe(depth + 16)
            .build()
            .map_err(|e| qp::verbs_error(&device.name, "creating a completion queue", &e))?;
        let mut lanes = Vec::with_capacity(offered.len());
        let mut local = Vec::with_capacity(offered.len());
        let mut max_inline = node.config.max_inline_bytes;
        for (_, remote) in &offered {
            let (qp, inline) = qp::create(device, &cq, depth + 1, max_inline)?;
            max_inline = max_inline.min(inline);
            let psn = qp::fresh_psn();
            local.push(QpAddress { qpn: qp.qp_number(), psn, lid: device.lid, gid: device.gid, mtu: device.mtu });
            lanes.push(Lane { qp, remote: *remote });
        }
        wire::send_request(&mut stream, header, &Request::Accept { lanes: local.clone() }).map_err(io)?;
        match wire::recv_reply(&mut stream).map_err(io)? {
            Reply::Done => {}
            Reply::Refused(why) => return Err(unreachable(peer, format!("refused: {why}"))),
            other => return Err(unreachable(peer, format!("unexpected bootstrap reply {other:?}"))),
        }
        for (lane, mine) in lanes.iter_mut().zip(&local) {
            qp::cycle_to_rts(&mut lane.qp, device, &node.config, mine.psn, &lane.remote, AccessFlags::RemoteRead)?;
        }
        let staging = Registered::new(&device.pd, FENCE_BYTES + node.config.staging_bytes, AccessFlags::LocalWrite)?;
        let ring = Ring { cap: node.config.staging_bytes as u64, head: 0, tail: 0 };
        Ok(Self {
            peer,
            bootstrap: addr,
            conn_id,
            regions,
            lane_of,
            lanes,
            cq,
            staging,
            ring,
            inflight: VecDeque::new(),
            ready: VecDeque::new(),
            next_seq: 1,
            lane_now: 0,
            unsignaled_run: 0,
            state: EndpointState::Ready,
            max_inline,
            node,
        })
    }

    /// The largest WRITE posted inline (without the staging copy).
    pub fn max_inline_bytes(&self) -> u32 {
        self.max_inline
    }

    /// How long the transport may take to fail an operation to a dead peer.
    pub fn failure_bound(&self) -> Duration {
        self.node.config.failure_bound()
    }

    /// Operations posted and not yet known to be complete.
    pub fn outstanding(&self) -> usize {
        self.inflight.len()
    }

    /// Waits until every posted operation is known to be complete (posting an internal signaled
    /// READ behind trailing unsignaled ones), or until `timeout`. Returns whether it completed.
    pub fn wait_idle(&mut self, timeout: Duration) -> bool {
        self.reap();
        if self.inflight.back().is_some_and(|p| !p.hw_signaled) && self.post_fence().is_err() {
            return false;
        }
        let deadline = Instant::now() + timeout;
        while !self.inflight.is_empty() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
            self.reap();
        }
        true
    }

    /// Polls the CQ and turns work completions into [`Completion`]s.
    fn reap(&mut self) {
        let mut done: [(u64, u32); 32] = [(0, 0); 32];
        loop {
            let mut n = 0;
            if let Ok(poller) = self.cq.start_poll() {
                for wc in poller.take(done.len()) {
                    done[n] = (wc.wr_id(), wc.status());
                    n += 1;
                }
            }
            for &(seq, status) in &done[..n] {
                self.complete(seq, status);
            }
            if n < done.len() {
                return;
            }
        }
    }

    fn complete(&mut self, seq: u64, status: u32) {
        if self.inflight.front().is_none_or(|p| seq < p.seq) {
            return; // from before a reconnect or an abandoned wait
        }
        // RC completes in order: everything posted before `seq` finished successfully.
        while let Some(p) = self.inflight.pop_front() {
            self.ring.release(p.staged_end);
            if p.seq < seq {
                self.finish(&p, Ok(()));
                continue;
            }
            let result = match status {
                s if s == Wc::Success as u32 => Ok(()),
                s if s == Wc::WorkRequestFlushedError as u32 => Err(OpError::Flushed),
                // A WRITE refused by the target QP's access flags completes as a remote access
                // error on most NICs but as a remote invalid request on soft-RoCE; addresses and
                // opcodes are checked before posting, so both mean "no permission".
                s if s == Wc::RemoteAccessError as u32 || s == Wc::RemoteInvalidRequestError as u32 => {
                    Err(OpError::PermissionDenied)
                }
                s if s == Wc::RetryCounterExceededError as u32
                    || s == Wc::ResponderNotReadyRetryCounterExceededError as u32
                    || s == Wc::ResponseTimeoutError as u32 =>
                {
                    Err(OpError::PeerUnreachable)
                }
                _ => Err(OpError::Transport),
            };
            let failed = result.is_err();
            self.finish(&p, result);
            if failed {
                self.fail_rest();
            }
            return;
        }
    }

    /// After a failure the QP is in the error state and flushes the rest: report them now.
    fn fail_rest(&mut self) {
        self.state = EndpointState::Error;
        while let Some(p) = self.inflight.pop_front() {
            self.ring.release(p.staged_end);
            self.finish(&p, Err(OpError::Flushed));
        }
    }

    fn finish(&mut self, p: &Posted, status: Result<(), OpError>) {
        if !p.internal && (p.report_success || status.is_err()) {
            self.ready.push_back(Completion { wr_id: p.wr_id, kind: p.kind, status });
        }
    }

    /// Makes room for one more operation, or reports the queue full.
    fn reserve(&mut self) -> Result<(), FabricError> {
        let depth = self.node.config.queue_depth;
        if self.inflight.len() + self.ready.len() >= depth {
            self.reap();
        }
        if self.inflight.len() + self.ready.len() >= depth {
            return Err(FabricError::QueueFull { peer: self.peer, depth });
        }
        Ok(())
    }

    /// Keeps the lanes one FIFO: before using another lane, waits for the current one to drain.
    fn switch_to(&mut self, lane: usize) {
        if lane == self.lane_now {
            return;
        }
        if !self.inflight.is_empty() && !self.wait_idle(self.node.config.failure_bound()) {
            // The transport bounds every operation; past that bound, give the lane up.
            qp::to_error(&mut self.lanes[self.lane_now].qp);
            self.fail_rest();
        }
        self.lane_now = lane;
    }

    fn remote(&self, at: RemoteAddr, len: u64) -> Result<(usize, &RemoteRegion), FabricError> {
        // Not `ok_or`: see `layout::find_spec`.
        let Some(i) = self.regions.iter().position(|r| r.id == at.region) else {
            return Err(FabricError::UnknownRegion { node: self.peer, region: at.region });
        };
        let r = &self.regions[i];
        layout::check_bounds(self.peer, at.region, r.len, at.offset, len)?;
        Ok((i, r))
    }

    /// Posts one work request on the current lane; `build` fills in the operation.
    fn post(
        &mut self,
        wr_id: u64,
        kind: OpKind,
        flags: PostFlags,
        internal: bool,
        staged_end: u64,
        build: impl FnOnce(&mut sideway::ibverbs::queue_pair::BasicPostSendGuard<'_>, u64, WorkRequestFlags),
    ) -> Result<(), FabricError> {
        let hw_signaled =
            internal || flags.is_signaled() || self.unsignaled_run + 1 >= self.node.config.signal_interval;
        let seq = self.next_seq;
        let wr_flags = if hw_signaled { WorkRequestFlags::Signaled } else { WorkRequestFlags::none() };
        let mut guard = self.lanes[self.lane_now].qp.start_post_send();
        build(&mut guard, seq, wr_flags);
        match guard.post() {
            Ok(()) => {}
            // Staging bytes reserved for this request are freed with the next completion after it.
            Err(PostSendError::NotEnoughResources(_)) => {
                return Err(FabricError::QueueFull { peer: self.peer, depth: self.node.config.queue_depth });
            }
            Err(e) => return Err(qp::verbs_error(&self.node.device.name, "posting a work request", &e)),
        }
        self.next_seq += 1;
        self.unsignaled_run = if hw_signaled { 0 } else { self.unsignaled_run + 1 };
        let report_success = flags.is_signaled();
        self.inflight.push_back(Posted { seq, wr_id, kind, report_success, internal, hw_signaled, staged_end });
        Ok(())
    }

    /// The staging ring has no room: report the queue full, and make sure a completion will
    /// free the ring. Staging bytes are released only by completions, and unsignaled WRITEs
    /// make none; if every operation since the last signaled one is unsignaled, a caller that
    /// waits for room before posting more would find the ring full for good (found running
    /// multicast over soft-RoCE: a sender's window of 10 KiB slots filled the ring in fewer
    /// than `signal_interval` WRITEs, and its last messages were never sent). A signaled fence
    /// behind them brings that completion.
    fn staging_full(&mut self) -> FabricError {
        let full = FabricError::QueueFull { peer: self.peer, depth: self.node.config.queue_depth };
        if self.inflight.back().is_none_or(|p| p.hw_signaled) {
            return full;
        }
        match self.post_fence() {
            // The send queue is full: its signaled operations will free the ring.
            Ok(()) | Err(FabricError::QueueFull { .. }) => full,
            Err(e) => e,
        }
    }

    /// An internal signaled 8-byte READ on the current lane: its completion proves that every
    /// operation posted before it on the lane has completed.
    fn post_fence(&mut self) -> Result<(), FabricError> {
        let lane = self.lane_now;
        let i = self.lane_of.iter().position(|&l| l == lane).unwrap_or(0);
        let (rkey, addr) = (self.regions[i].rkey, self.regions[i].addr);
        let (lkey, local) = (self.staging.lkey(), self.staging.addr(0));
        let end = self.ring.head;
        self.post(0, OpKind::Read, PostFlags::SIGNALED, true, end, |guard, seq, flags| {
            let wr = guard.construct_wr(seq, flags).setup_read(rkey, addr);
            // SAFETY: the 8 destination bytes are the staging MR's fence bytes, registered with
            // local write access and alive as long as this endpoint, which outlives its QPs' work.
            unsafe { wr.setup_sge(lkey, local, 8) };
        })
    }
}

/// Checks an offer's lanes against its regions: lane 0 is the open lane, and each granted region
/// has exactly one lane of its own. Returns each region's lane.
fn lane_map(
    peer: NodeId,
    regions: &[RemoteRegion],
    lanes: &[(Option<RegionId>, QpAddress)],
) -> Result<Vec<usize>, FabricError> {
    let bad = |why: &str| unreachable(peer, format!("inconsistent bootstrap offer: {why}"));
    if regions.is_empty() || lanes.first().is_none_or(|(r, _)| r.is_some()) {
        return Err(bad("no regions, or no open lane first"));
    }
    regions
        .iter()
        .map(|r| {
            let mine = lanes.iter().position(|(l, _)| *l == Some(r.id));
            match (r.remote_write, mine) {
                (RemoteWrite::Granted, Some(lane)) => Ok(lane),
                (RemoteWrite::Granted, None) => Err(bad("a granted region without a lane")),
                (_, None) => Ok(0),
                (_, Some(_)) => Err(bad("a lane for a region that takes no grants")),
            }
        })
        .collect()
}

impl Endpoint for VerbsEndpoint {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError> {
        let len = data.len() as u64;
        let (i, region) = self.remote(dst, len)?;
        let (rkey, addr) = (region.rkey, region.addr + dst.offset);
        let len32 = u32::try_from(len).map_err(|_| FabricError::OutOfBounds {
            node: self.peer,
            region: dst.region,
            offset: dst.offset,
            len,
            region_len: u64::from(u32::MAX),
        })?;
        let inline = len32 <= self.max_inline;
        if !inline && len > self.ring.cap {
            return Err(FabricError::Unsupported {
                device: self.node.device.name.clone(),
                feature: format!("a {len}-byte WRITE (staging_bytes is {})", self.ring.cap),
            });
        }
        self.reserve()?;
        self.switch_to(self.lane_of[i]);
        if self.state == EndpointState::Error {
            self.ready.push_back(Completion { wr_id, kind: OpKind::Write, status: Err(OpError::Flushed) });
            return Ok(());
        }
        if inline {
            let end = self.ring.head;
            return self.post(wr_id, OpKind::Write, flags, false, end, |guard, seq, wr_flags| {
                guard.construct_wr(seq, wr_flags).setup_write(rkey, addr).setup_inline_data(data);
            });
        }
        let (offset, end) = match self.ring.alloc(len) {
            Some(slot) => slot,
            None => {
                self.reap();
                match self.ring.alloc(len) {
                    Some(slot) => slot,
                    None => return Err(self.staging_full()),
                }
            }
        };
        let at = FENCE_BYTES + offset as usize;
        self.staging.copy_in(at, data);
        let (lkey, local) = (self.staging.lkey(), self.staging.addr(at as u64));
        self.post(wr_id, OpKind::Write, flags, false, end, |guard, seq, wr_flags| {
            let wr = guard.construct_wr(seq, wr_flags).setup_write(rkey, addr);
            // SAFETY: the source bytes are a reserved slice of the staging MR, alive as long as
            // this endpoint and not reused until this request completes (the ring releases it then).
            unsafe { wr.setup_sge(lkey, local, len32) };
        })
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
        let (i, region) = self.remote(src, u64::from(len))?;
        let (rkey, addr) = (region.rkey, region.addr + src.offset);
        let me = self.node.config.node;
        let (spec_index, spec) = layout::find_spec(me, &self.node.config.regions, local_region)?;
        layout::check_bounds(me, local_region, spec.len_bytes, local_offset, u64::from(len))?;
        self.reserve()?;
        self.switch_to(self.lane_of[i]);
        if self.state == EndpointState::Error {
            self.ready.push_back(Completion { wr_id, kind: OpKind::Read, status: Err(OpError::Flushed) });
            return Ok(());
        }
        let node = Arc::clone(&self.node);
        let mem = &node.regions[spec_index].1;
        let (lkey, local) = (mem.lkey(), mem.addr(local_offset));
        let end = self.ring.head;
        self.post(wr_id, OpKind::Read, flags, false, end, |guard, seq, wr_flags| {
            let wr = guard.construct_wr(seq, wr_flags).setup_read(rkey, addr);
            // SAFETY: the destination is inside a region registered with local write access
            // (bounds checked above), which lives as long as the node this endpoint holds.
            unsafe { wr.setup_sge(lkey, local, len) };
        })
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        if self.ready.is_empty() {
            self.reap();
        }
        self.ready.pop_front()
    }

    fn state(&self) -> EndpointState {
        self.state
    }

    fn reconnect(&mut self) -> Result<(), FabricError> {
        // Whatever is still in flight is abandoned: report it, as a failure must be.
        self.reap();
        self.fail_rest();
        let psns: Vec<u32> = self.lanes.iter().map(|_| qp::fresh_psn()).collect();
        let header = Header { from: self.node.config.node, to: self.peer };
        let mut stream = exchange(&self.node, self.peer, self.bootstrap, self.node.config.connect_timeout)?;
        let io = |e: std::io::Error| unreachable(self.peer, format!("bootstrap: {e}"));
        let request = Request::Reconnect { conn_id: self.conn_id, psns: psns.clone() };
        wire::send_request(&mut stream, header, &request).map_err(io)?;
        let theirs = match wire::recv_reply(&mut stream).map_err(io)? {
            Reply::Reconnected { psns } if psns.len() == self.lanes.len() => psns,
            Reply::Refused(why) => return Err(unreachable(self.peer, format!("refused: {why}"))),
            other => return Err(unreachable(self.peer, format!("unexpected bootstrap reply {other:?}"))),
        };
        for ((lane, &mine), &their) in self.lanes.iter_mut().zip(&psns).zip(&theirs) {
            lane.remote.psn = their;
            qp::cycle_to_rts(
                &mut lane.qp,
                &self.node.device,
                &self.node.config,
                mine,
                &lane.remote,
                AccessFlags::RemoteRead,
            )?;
        }
        // Completions of work abandoned above may still sit in the CQ: drop them.
        self.reap();
        self.ring = Ring { cap: self.ring.cap, head: 0, tail: 0 };
        self.unsignaled_run = 0;
        self.lane_now = 0;
        self.state = EndpointState::Ready;
        Ok(())
    }
}

impl Drop for VerbsEndpoint {
    fn drop(&mut self) {
        // Best effort: a dead or hung peer must not hold up the drop for long.
        let header = Header { from: self.node.config.node, to: self.peer };
        if let Ok(mut stream) = exchange(&self.node, self.peer, self.bootstrap, Duration::from_millis(200)) {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            if wire::send_request(&mut stream, header, &Request::Close { conn_id: self.conn_id }).is_ok() {
                let _ = wire::recv_reply(&mut stream);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn ring_wraps_and_bounds() {
        let mut ring = Ring { cap: 100, head: 0, tail: 0 };
        assert_eq!(ring.alloc(60), Some((0, 60)));
        assert_eq!(ring.alloc(50), None, "only 40 bytes free");
        ring.release(60);
        assert_eq!(ring.alloc(50), Some((0, 150)), "skips the 40-byte tail to stay contiguous");
        assert_eq!(ring.alloc(51), None);
        ring.release(150);
        assert_eq!(ring.alloc(50), Some((50, 200)));
    }
}
