//! The world's side of the public calls: nodes coming and going, endpoints, posts, permissions
//! and local memory access. Everything a call validates is checked here, before any effect.

use std::collections::VecDeque;

use super::digest::Tag;
use super::engine::{World, write_region};
use super::state::{Ep, Node, Op, OpBody, Phase, offset_usize};
use crate::{
    Completion, EndpointState, FabricError, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite,
    RevokePath, layout,
};

/// Most operations an endpoint may have posted and not yet completed (contract rule 7).
pub const QUEUE_DEPTH: usize = 1024;

fn crashed_self(node: NodeId) -> FabricError {
    FabricError::PeerUnreachable(node, "this node crashed".to_owned())
}

impl World {
    /// Starts `id` (again): fresh zeroed memory, no grants, a new incarnation.
    pub(super) fn start_node(&mut self, id: NodeId, specs: &[RegionSpec]) -> Result<u32, FabricError> {
        layout::validate_membership(id, layout::MAX_NODES)?;
        layout::validate_specs(specs)?;
        let (incarnation, crash_times) = match self.nodes.remove(&id) {
            None => (0, Vec::new()),
            Some(old) if old.crashed => {
                if self.config.lend_peer_memory {
                    self.graves.insert((id, old.incarnation), (old.specs, old.memory));
                }
                (old.incarnation + 1, old.crash_times)
            }
            Some(old) => {
                self.nodes.insert(id, old);
                // The simulator has no processes; pid 0 says so.
                return Err(FabricError::AlreadyRunning { node: id, pid: 0 });
            }
        };
        self.nodes.insert(id, Node::new(incarnation, specs, crash_times));
        let mut fields = vec![id.0.into(), incarnation.into()];
        fields.extend(specs.iter().flat_map(|s| [s.id.0.into(), s.len_bytes, s.remote_write as u64]));
        self.trace(Tag::AddNode, &fields);
        tracing::debug!(%id, incarnation, now = self.now, "simulated node started");
        Ok(incarnation)
    }

    /// Crashes `id`: memory (unless peers may still read it, [`SimConfig::lend_peer_memory`])
    /// and grants gone, its own queued operations dropped silently, its
    /// endpoints dead. Operations of others to it time out (see `begin_retry`).
    pub(super) fn crash(&mut self, id: NodeId) {
        let now = self.now;
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        if node.crashed {
            return;
        }
        node.crashed = true;
        node.held = false;
        if !self.config.lend_peer_memory {
            node.memory = Vec::new();
        }
        node.grants.iter_mut().for_each(std::collections::BTreeSet::clear);
        node.crash_times.push(now);
        let incarnation = node.incarnation;
        for e in self.eps.iter_mut().filter(|e| e.owner == id && !e.dead) {
            // A torn write in progress stays partial in its target's memory, as it would on a NIC
            // that loses its host mid-transfer.
            e.dead = true;
            e.state = EndpointState::Error;
            e.queue.clear();
            e.cq.clear();
            e.outstanding = 0;
        }
        self.trace(Tag::Crash, &[id.0.into(), incarnation.into()]);
        tracing::debug!(%id, incarnation, now, "simulated node crashed");
    }

    /// The running node `id` in incarnation `inc`, or the error every call of a crashed node gets.
    pub(super) fn live_node(&self, id: NodeId, inc: u32) -> Result<&Node, FabricError> {
        self.nodes.get(&id).filter(|n| n.is_live(inc)).ok_or_else(|| crashed_self(id))
    }

    fn live_node_mut(&mut self, id: NodeId, inc: u32) -> Result<&mut Node, FabricError> {
        self.nodes.get_mut(&id).filter(|n| n.is_live(inc)).ok_or_else(|| crashed_self(id))
    }

    pub(super) fn set_held(&mut self, id: NodeId, held: bool) {
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        if node.crashed || node.held == held {
            return;
        }
        node.held = held;
        self.trace(if held { Tag::Hold } else { Tag::Release }, &[id.0.into()]);
        if !held {
            for ep in 0..self.eps.len() {
                if self.eps[ep].owner == id {
                    self.schedule_head(ep);
                }
            }
        }
    }

    pub(super) fn set_link_held(&mut self, from: NodeId, to: NodeId, held: bool) {
        let changed = if held { self.held_links.insert((from, to)) } else { self.held_links.remove(&(from, to)) };
        if !changed {
            return;
        }
        self.trace(if held { Tag::LinkHold } else { Tag::LinkRelease }, &[from.0.into(), to.0.into()]);
        if !held {
            for ep in 0..self.eps.len() {
                if self.eps[ep].owner == from && self.eps[ep].peer == to {
                    self.schedule_head(ep);
                }
            }
        }
    }

    pub(super) fn connect(
        &mut self,
        owner: NodeId,
        inc: u32,
        peer: NodeId,
        max_nodes: u16,
    ) -> Result<usize, FabricError> {
        self.live_node(owner, inc)?;
        layout::check_peer(owner, peer, max_nodes)?;
        let peer_inc = match self.nodes.get(&peer) {
            None => {
                return Err(FabricError::PeerUnreachable(peer, "no such node in the simulated world".to_owned()));
            }
            Some(n) if n.crashed => {
                return Err(FabricError::PeerUnreachable(peer, "crashed".to_owned()));
            }
            Some(n) => n.incarnation,
        };
        let ep = self.eps.len();
        self.eps.push(Ep {
            owner,
            peer,
            peer_inc,
            epoch: 0,
            state: EndpointState::Ready,
            dead: false,
            closed: false,
            queue: VecDeque::new(),
            outstanding: 0,
            last_completion_at: 0,
            cq: VecDeque::new(),
        });
        self.trace(Tag::Connect, &[ep as u64, owner.0.into(), peer.0.into(), peer_inc.into()]);
        Ok(ep)
    }

    fn check_ep_owner(&self, ep: usize) -> Result<&Ep, FabricError> {
        let e = &self.eps[ep];
        if e.dead { Err(crashed_self(e.owner)) } else { Ok(e) }
    }

    /// Validates and queues an operation (contract rules 5 and 7: bounds at post time, depth).
    pub(super) fn post(&mut self, ep: usize, wr_id: u64, body: OpBody, flags: PostFlags) -> Result<(), FabricError> {
        let e = self.check_ep_owner(ep)?;
        let (owner, peer) = (e.owner, e.peer);
        // The peer's layout is known to the whole world, like rkeys exchanged at connect time; a
        // crashed peer keeps its last layout so that posts to it still fail by completion.
        let peer_specs = self.nodes.get(&peer).map(|n| n.specs.as_slice()).unwrap_or_default();
        let (remote, len) = match &body {
            OpBody::Write { dst, data } => (*dst, data.len() as u64),
            OpBody::Read { src, len, .. } => (*src, u64::from(*len)),
        };
        let (_, spec) = layout::find_spec(peer, peer_specs, remote.region)?;
        layout::check_bounds(peer, remote.region, spec.len_bytes, remote.offset, len)?;
        if let OpBody::Read { local_region, local_offset, .. } = body {
            let own_specs = self.nodes.get(&owner).map(|n| n.specs.as_slice()).unwrap_or_default();
            let (_, spec) = layout::find_spec(owner, own_specs, local_region)?;
            layout::check_bounds(owner, local_region, spec.len_bytes, local_offset, len)?;
        }
        if e.outstanding >= QUEUE_DEPTH {
            return Err(FabricError::QueueFull { peer, depth: QUEUE_DEPTH });
        }
        let (id, epoch, now) = (self.next_op, e.epoch, self.now);
        self.next_op += 1;
        let instant = self.draw_instant();
        let arrival = if instant { now } else { now.saturating_add(self.draw_latency()) };
        let mut fields = vec![ep as u64, id, wr_id, u64::from(flags.is_signaled()), arrival];
        fields.extend([remote.region.0.into(), remote.offset, len]);
        match &body {
            OpBody::Write { data, .. } => self.digest.bytes(data),
            OpBody::Read { local_region, local_offset, .. } => fields.extend([local_region.0.into(), *local_offset]),
        }
        self.trace(Tag::Post, &fields);
        let e = &mut self.eps[ep];
        let signaled = flags.is_signaled();
        let op = Op { id, wr_id, signaled, epoch, posted_at: now, arrival, instant, body, phase: Phase::Queued };
        e.queue.push_back(op);
        e.outstanding += 1;
        self.schedule_head(ep);
        if instant {
            self.run_due();
        }
        Ok(())
    }

    pub(super) fn poll(&mut self, ep: usize) -> Option<Completion> {
        let e = &mut self.eps[ep];
        if e.dead { None } else { e.cq.pop_front() }
    }

    pub(super) fn ep_state(&self, ep: usize) -> EndpointState {
        let e = &self.eps[ep];
        if e.dead { EndpointState::Error } else { e.state }
    }

    /// Whether the peer incarnation `ep` is connected to has crashed (whether or not another
    /// runs now): a transport that watches its peers' processes knows it before an operation
    /// fails, as the shm fabric's pidfds do.
    pub(super) fn ep_peer_gone(&self, ep: usize) -> bool {
        let e = &self.eps[ep];
        !e.dead && self.nodes.get(&e.peer).is_none_or(|n| !n.is_live(e.peer_inc))
    }

    /// Back to `Ready`, connected to the peer's running incarnation. Operations posted before
    /// are flushed (they carry the old epoch); a `Ready` endpoint already connected to the
    /// running incarnation is left alone.
    pub(super) fn reconnect(&mut self, ep: usize) -> Result<(), FabricError> {
        let e = self.check_ep_owner(ep)?;
        let peer = e.peer;
        let peer_inc = match self.nodes.get(&peer) {
            Some(n) if !n.crashed => n.incarnation,
            _ => return Err(FabricError::PeerUnreachable(peer, "crashed".to_owned())),
        };
        if e.state == EndpointState::Ready && e.peer_inc == peer_inc {
            return Ok(());
        }
        let e = &mut self.eps[ep];
        e.epoch += 1;
        e.state = EndpointState::Ready;
        e.peer_inc = peer_inc;
        let epoch = e.epoch;
        self.trace(Tag::Reconnect, &[ep as u64, epoch, peer_inc.into()]);
        Ok(())
    }

    /// With [`SimConfig::lend_peer_memory`], copies the bytes at `src` of the peer incarnation
    /// endpoint `ep` is connected to, running or crashed, into `buf`.
    pub(super) fn peer_memory(&self, ep: usize, src: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        if !self.config.lend_peer_memory {
            return Err(FabricError::Unsupported {
                device: "this simulated fabric".to_owned(),
                feature: "lending a peer's memory (SimConfig::lend_peer_memory)".to_owned(),
            });
        }
        let e = self.check_ep_owner(ep)?;
        let (peer, inc) = (e.peer, e.peer_inc);
        let (specs, memory) = match self.nodes.get(&peer) {
            Some(n) if n.incarnation == inc => (&n.specs, &n.memory),
            _ => self
                .graves
                .get(&(peer, inc))
                .map(|(specs, memory)| (specs, memory))
                .ok_or_else(|| FabricError::PeerUnreachable(peer, "no such incarnation".to_owned()))?,
        };
        let (r, spec) = layout::find_spec(peer, specs, src.region)?;
        layout::check_bounds(peer, src.region, spec.len_bytes, src.offset, buf.len() as u64)?;
        let start = offset_usize(src.offset);
        buf.copy_from_slice(&memory[r][start..start + buf.len()]);
        Ok(())
    }

    pub(super) fn close(&mut self, ep: usize) {
        let e = &mut self.eps[ep];
        e.closed = true;
        e.cq = VecDeque::new();
        self.trace(Tag::Close, &[ep as u64]);
    }

    /// The index of a `Granted` region, after the checks both grant and revoke make.
    fn grantable(
        &self,
        id: NodeId,
        inc: u32,
        region: RegionId,
        peer: NodeId,
        max_nodes: u16,
    ) -> Result<usize, FabricError> {
        let node = self.live_node(id, inc)?;
        layout::check_peer(id, peer, max_nodes)?;
        let (r, spec) = layout::find_spec(id, &node.specs, region)?;
        if spec.remote_write != RemoteWrite::Granted {
            return Err(FabricError::NotGrantable { region });
        }
        Ok(r)
    }

    pub(super) fn grant(
        &mut self,
        id: NodeId,
        inc: u32,
        region: RegionId,
        peer: NodeId,
        max_nodes: u16,
    ) -> Result<(), FabricError> {
        let r = self.grantable(id, inc, region, peer, max_nodes)?;
        self.live_node_mut(id, inc)?.grants[r].insert(peer);
        self.trace(Tag::Grant, &[id.0.into(), region.0.into(), peer.0.into()]);
        Ok(())
    }

    /// Contract rule 3: after this, no write of `peer` lands in `region`. Writes that have not
    /// reached the target yet will fail the permission check; a torn write already partly applied
    /// is finished now, so it lands entirely before the revocation completes.
    pub(super) fn revoke(
        &mut self,
        id: NodeId,
        inc: u32,
        region: RegionId,
        peer: NodeId,
        max_nodes: u16,
    ) -> Result<RevokePath, FabricError> {
        let r = self.grantable(id, inc, region, peer, max_nodes)?;
        self.live_node_mut(id, inc)?.grants[r].remove(&peer);
        for ep in 0..self.eps.len() {
            let e = &self.eps[ep];
            let in_flight = !e.dead
                && e.owner == peer
                && e.peer == id
                && e.peer_inc == inc
                && e.queue.front().is_some_and(|h| {
                    matches!(h.phase, Phase::Applying { .. })
                        && matches!(h.body, OpBody::Write { dst, .. } if dst.region == region)
                });
            if in_flight {
                self.complete_torn_write(ep);
            }
        }
        self.trace(Tag::Revoke, &[id.0.into(), region.0.into(), peer.0.into()]);
        Ok(RevokePath::Fast)
    }

    /// The length and index of local `region` of a running node.
    pub(super) fn local_region(&self, id: NodeId, inc: u32, region: RegionId) -> Result<(usize, u64), FabricError> {
        let node = self.live_node(id, inc)?;
        let (r, spec) = layout::find_spec(id, &node.specs, region)?;
        Ok((r, spec.len_bytes))
    }

    pub(super) fn read_local(
        &self,
        id: NodeId,
        inc: u32,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        let (r, len) = self.local_region(id, inc, region)?;
        layout::check_bounds(id, region, len, offset, buf.len() as u64)?;
        let node = self.live_node(id, inc)?;
        let start = offset_usize(offset);
        buf.copy_from_slice(&node.memory[r][start..start + buf.len()]);
        Ok(())
    }

    pub(super) fn write_local(
        &mut self,
        id: NodeId,
        inc: u32,
        region: RegionId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), FabricError> {
        let (_, len) = self.local_region(id, inc, region)?;
        layout::check_bounds(id, region, len, offset, data.len() as u64)?;
        write_region(self.live_node_mut(id, inc)?, region, offset, data);
        self.digest.bytes(data);
        self.trace(Tag::LocalWrite, &[id.0.into(), region.0.into(), offset]);
        Ok(())
    }

    pub(super) fn load_u64(&self, id: NodeId, inc: u32, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        let (_, len) = self.local_region(id, inc, region)?;
        layout::check_word(id, region, len, offset)?;
        let mut word = [0u8; 8];
        self.read_local(id, inc, region, offset, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    pub(super) fn store_u64(
        &mut self,
        id: NodeId,
        inc: u32,
        region: RegionId,
        offset: u64,
        value: u64,
    ) -> Result<(), FabricError> {
        let (_, len) = self.local_region(id, inc, region)?;
        layout::check_word(id, region, len, offset)?;
        self.write_local(id, inc, region, offset, &value.to_le_bytes())
    }
}
