//! [`SimFabric`] and [`SimEndpoint`]: the [`Fabric`] and [`Endpoint`] of a simulated node.

use std::borrow::Cow;

use super::state::OpBody;
use super::world::SimWorld;
use crate::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, PostFlags, RegionId, RemoteAddr, RevokePath,
};

/// One incarnation of a node in a [`SimWorld`]. After the node crashes every call returns
/// [`FabricError::PeerUnreachable`] naming the node itself, also once it has been restarted (the
/// restart hands out a new `SimFabric`).
#[derive(Debug)]
pub struct SimFabric {
    world: SimWorld,
    id: NodeId,
    incarnation: u32,
    max_nodes: u16,
}

impl SimFabric {
    pub(super) const fn new(world: SimWorld, id: NodeId, incarnation: u32, max_nodes: u16) -> Self {
        Self { world, id, incarnation, max_nodes }
    }

    /// The world this node lives in.
    pub const fn world(&self) -> &SimWorld {
        &self.world
    }

    /// Which life of the node this handle belongs to: 0 at first, one more per restart.
    pub const fn incarnation(&self) -> u32 {
        self.incarnation
    }
}

impl Fabric for SimFabric {
    type Endpoint = SimEndpoint;

    fn node_id(&self) -> NodeId {
        self.id
    }

    /// Connecting to an id never added, or to a crashed node, fails with
    /// [`FabricError::PeerUnreachable`].
    fn connect(&self, peer: NodeId) -> Result<SimEndpoint, FabricError> {
        let ep = self.world.with(|w| w.connect(self.id, self.incarnation, peer, self.max_nodes))?;
        Ok(SimEndpoint { world: self.world.clone(), ep, owner: self.id, peer })
    }

    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        self.world.with(|w| w.grant(self.id, self.incarnation, region, peer, self.max_nodes))
    }

    /// Always [`RevokePath::Fast`]: the simulated target checks permissions when a write arrives,
    /// and finishes a torn write already under way before returning.
    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
        self.world.with(|w| w.revoke(self.id, self.incarnation, region, peer, self.max_nodes))
    }

    fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
        self.world.with(|w| w.local_region(self.id, self.incarnation, region).map(|(_, len)| len))
    }

    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.world.with(|w| {
            w.preempt();
            w.read_local(self.id, self.incarnation, region, offset, buf)
        })
    }

    /// A copy: the simulated memory lives in the world, behind its lock.
    unsafe fn local_bytes(&self, region: RegionId, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let mut bytes = vec![0; len];
        self.read_local(region, offset, &mut bytes)?;
        Ok(Cow::Owned(bytes))
    }

    /// True: the simulator copies only because its memory lives behind the world's lock; it
    /// stands for the backends that lend.
    fn lends_local_bytes(&self) -> bool {
        true
    }

    /// As [`SimConfig::lend_peer_memory`](super::SimConfig::lend_peer_memory) says.
    fn lends_peer_memory(&self) -> bool {
        self.world.with(|w| w.config.lend_peer_memory)
    }

    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.world.with(|w| w.write_local(self.id, self.incarnation, region, offset, data))
    }

    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        self.world.with(|w| {
            w.preempt();
            w.load_u64(self.id, self.incarnation, region, offset)
        })
    }

    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
        self.world.with(|w| w.store_u64(self.id, self.incarnation, region, offset, value))
    }
}

/// A simulated queue pair. Dropping it discards its future completions; operations already
/// posted still run, like work requests already handed to a NIC.
#[derive(Debug)]
pub struct SimEndpoint {
    world: SimWorld,
    ep: usize,
    owner: NodeId,
    peer: NodeId,
}

impl SimEndpoint {
    /// The node that posts on this endpoint.
    pub const fn owner(&self) -> NodeId {
        self.owner
    }

    /// Operations posted on this endpoint whose completion has not happened yet.
    pub fn outstanding(&self) -> usize {
        self.world.with(|w| w.eps[self.ep].outstanding)
    }
}

impl Endpoint for SimEndpoint {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError> {
        let body = OpBody::Write { dst, data: data.to_vec() };
        self.world.with(|w| w.post(self.ep, wr_id, body, flags))
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
        let body = OpBody::Read { src, len, local_region, local_offset };
        self.world.with(|w| w.post(self.ep, wr_id, body, flags))
    }

    fn peer_load_u64(&self, src: RemoteAddr) -> Result<u64, FabricError> {
        if !src.offset.is_multiple_of(8) {
            return Err(FabricError::Misaligned { region: src.region, offset: src.offset });
        }
        let mut word = [0u8; 8];
        self.world.with(|w| {
            w.preempt();
            w.peer_memory(self.ep, src, &mut word)
        })?;
        Ok(u64::from_le_bytes(word))
    }

    /// A copy: the simulated memory lives in the world, behind its lock.
    unsafe fn peer_bytes(&self, src: RemoteAddr, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let mut bytes = vec![0; len];
        self.world.with(|w| {
            w.preempt();
            w.peer_memory(self.ep, src, &mut bytes)
        })?;
        Ok(Cow::Owned(bytes))
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        self.world.with(|w| w.poll(self.ep))
    }

    fn state(&self) -> EndpointState {
        self.world.with(|w| w.ep_state(self.ep))
    }

    fn peer_gone(&self) -> bool {
        self.world.with(|w| w.ep_peer_gone(self.ep))
    }

    /// Fails with [`FabricError::PeerUnreachable`] while the peer is crashed. After a peer
    /// restart it connects to the new incarnation. Operations posted before it are flushed.
    fn reconnect(&mut self) -> Result<(), FabricError> {
        self.world.with(|w| w.reconnect(self.ep))
    }
}

impl Drop for SimEndpoint {
    fn drop(&mut self) {
        let ep = self.ep;
        self.world.try_with(|w| w.close(ep));
    }
}
