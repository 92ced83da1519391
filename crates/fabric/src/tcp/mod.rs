//! The `tcp` backend: nodes on any hosts, no RDMA. Each node runs a user-space "NIC" thread that
//! applies peers' one-sided WRITEs and serves their READs against its registered regions.
//!
//! * **Threads**: one per node, the NIC thread. It `poll`s the listening socket, every inbound
//!   connection (peers' requests) and every outbound connection of this node's endpoints (the
//!   responses to their requests), so a node costs one thread however many peers and endpoints
//!   it has. Posting is done by the caller's thread, which writes the request frame to the
//!   endpoint's socket itself (waiting for room up to the request timeout), and
//!   `poll_completion` reads arrived responses itself; while an endpoint keeps polling, the NIC
//!   thread does not wake up for its responses.
//! * **Endpoints**: one TCP connection each (`TCP_NODELAY`), opened with a handshake that names
//!   the sender's node id and the cluster id and returns the peer's region table, so posts are
//!   bounds-checked locally like the other backends. Every request gets a response, in order;
//!   the endpoint matches them FIFO and queues completions. At most `queue_depth` operations are
//!   outstanding or unpolled per endpoint; posting past that fails with `QueueFull`.
//! * **Permissions** (Mu §5.2): the NIC checks a write's permission and applies it while holding
//!   the grant table's read lock, which `revoke_write` must take for writing: see
//!   `tcp/memory.rs` for the argument that no write lands after `revoke_write` returns. After a
//!   failed request the NIC *flushes* every later request of that connection (answers `Flushed`
//!   without applying it) until the initiator's `reconnect` sends a Reset frame, so a write
//!   posted behind a denied one never lands either, as on an RDMA queue pair in error.
//! * **Failure**: a closed or reset connection fails the endpoint's outstanding operations at
//!   once (`PeerUnreachable`, then `Flushed`); a peer that stops answering (partition, frozen
//!   process) fails them once the oldest has waited `timeouts.request` with no response bytes;
//!   a blocked send gives up after the same time; connecting gives up after `timeouts.connect`.
//! * **Wire**: see `tcp/wire.rs`: length-prefixed frames with a CRC32C; anything malformed drops
//!   the connection.
//!
//! Sockets are created in the network namespace of the thread calling [`TcpFabric::start`]
//! (listener), [`Fabric::connect`] and [`Endpoint::reconnect`](crate::Endpoint::reconnect).
//!
//! User guide (addresses, firewall, timeouts, troubleshooting): `docs/TCP.md`.
//!
//! # Example
//! ```
//! use std::time::{Duration, Instant};
//! use microrep_fabric::tcp::{TcpConfig, TcpFabric};
//! use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};
//!
//! let log = RegionId(0);
//! let regions = [RegionSpec::new(log, 4096, RemoteWrite::Granted)];
//! let any_port = "127.0.0.1:0".parse().unwrap();
//! let follower = TcpFabric::start(TcpConfig::new("doc", NodeId(0), 2, any_port, &regions)).unwrap();
//! let leader = TcpFabric::start(
//!     TcpConfig::new("doc", NodeId(1), 2, any_port, &regions).with_peers([(NodeId(0), follower.local_addr())]),
//! )
//! .unwrap();
//!
//! follower.grant_write(log, NodeId(1)).unwrap();
//! let mut ep = leader.connect(NodeId(0)).unwrap();
//! ep.post_write(1, RemoteAddr::new(log, 64), b"entry", PostFlags::SIGNALED).unwrap();
//! let deadline = Instant::now() + Duration::from_secs(10);
//! let completion = loop {
//!     match ep.poll_completion() {
//!         Some(c) => break c,
//!         None if Instant::now() < deadline => std::thread::yield_now(),
//!         None => panic!("no completion"),
//!     }
//! };
//! assert!(completion.status.is_ok());
//!
//! let mut buf = [0u8; 5];
//! follower.read_local(log, 64, &mut buf).unwrap();
//! assert_eq!(&buf, b"entry");
//! ```

mod dial;
mod endpoint;
mod harness;
mod memory;
mod nic;
pub(crate) mod wire;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use endpoint::TcpEndpoint;
pub use harness::TcpHarness;
use memory::Memory;

use crate::{Fabric, FabricError, NodeId, RegionId, RegionSpec, RevokePath, layout};

/// How long the tcp fabric waits before declaring a peer unreachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpTimeouts {
    /// Opening a connection and its handshake; also how long [`Fabric::connect`] retries a peer
    /// that refuses connections (still starting up).
    pub connect: Duration,
    /// How long the oldest outstanding operation of an endpoint may wait without any response
    /// bytes arriving, and how long a post may block sending, before the endpoint's operations
    /// fail with `PeerUnreachable`.
    pub request: Duration,
}

impl Default for TcpTimeouts {
    /// Connect 1 s, request 1 s: a LAN peer that answers nothing for a second is treated as down.
    fn default() -> Self {
        Self { connect: Duration::from_secs(1), request: Duration::from_secs(1) }
    }
}

/// Configuration of one tcp node.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// This node.
    pub node: NodeId,
    /// Cluster size bound: node ids are `0..max_nodes`. Every node must use the same value.
    pub max_nodes: u16,
    /// Identifies the cluster; connections between nodes with different ids are refused (see
    /// [`TcpConfig::cluster_id_of`]).
    pub cluster_id: u64,
    /// Address to listen on for peers' connections (port 0: chosen by the OS, see
    /// [`TcpFabric::local_addr`]).
    pub listen: SocketAddr,
    /// Where each peer listens. Peers can also be added later with [`TcpFabric::set_peer_addr`].
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// Regions to register.
    pub regions: Vec<RegionSpec>,
    /// Failure detection bounds.
    pub timeouts: TcpTimeouts,
    /// Operations an endpoint can hold (outstanding plus unpolled completions) before posting
    /// fails with `QueueFull`.
    pub queue_depth: usize,
    /// Largest WRITE or READ in bytes (one frame's payload); a connection uses the smaller of its
    /// two nodes' values.
    pub max_op_bytes: u32,
}

impl TcpConfig {
    /// Smallest accepted [`TcpConfig::max_op_bytes`].
    pub const MIN_OP_BYTES: u32 = 4096;
    /// Largest accepted [`TcpConfig::max_op_bytes`] (1 GiB).
    pub const MAX_OP_BYTES: u32 = 1 << 30;

    /// A configuration with no peers yet, default timeouts, queue depth 1024 and 16 MiB
    /// operations.
    pub fn new(cluster: &str, node: NodeId, max_nodes: u16, listen: SocketAddr, regions: &[RegionSpec]) -> Self {
        Self {
            node,
            max_nodes,
            cluster_id: Self::cluster_id_of(cluster),
            listen,
            peers: BTreeMap::new(),
            regions: regions.to_vec(),
            timeouts: TcpTimeouts::default(),
            queue_depth: 1024,
            max_op_bytes: 16 << 20,
        }
    }

    /// Adds peers' addresses (e.g. from a cluster file's `node id -> host:port` list).
    pub fn with_peers(mut self, peers: impl IntoIterator<Item = (NodeId, SocketAddr)>) -> Self {
        self.peers.extend(peers);
        self
    }

    /// A cluster id derived from a cluster name (64-bit FNV-1a of its UTF-8 bytes).
    pub fn cluster_id_of(name: &str) -> u64 {
        name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }

    fn validate(&self) -> Result<(), FabricError> {
        layout::validate_membership(self.node, self.max_nodes)?;
        layout::validate_specs(&self.regions)?;
        let invalid = |why: String| Err(FabricError::InvalidLayout(why));
        if self.queue_depth == 0 {
            return invalid("queue_depth must be at least 1".into());
        }
        if !(Self::MIN_OP_BYTES..=Self::MAX_OP_BYTES).contains(&self.max_op_bytes) {
            return invalid(format!(
                "max_op_bytes is {}; it must be in {}..={}",
                self.max_op_bytes,
                Self::MIN_OP_BYTES,
                Self::MAX_OP_BYTES
            ));
        }
        if self.timeouts.connect.is_zero() || self.timeouts.request.is_zero() {
            return invalid("tcp timeouts must be non-zero".into());
        }
        for &peer in self.peers.keys() {
            layout::check_peer(self.node, peer, self.max_nodes)?;
        }
        Ok(())
    }
}

/// State shared by a node's fabric handle, its endpoints and its NIC thread.
#[derive(Debug)]
pub(crate) struct Node {
    config: TcpConfig,
    memory: Memory,
    peers: RwLock<BTreeMap<NodeId, SocketAddr>>,
    /// Operations posted by this node's endpoints and not yet completed (for `settle`).
    in_flight: AtomicUsize,
    stopped: AtomicBool,
    /// Outbound connections opened by endpoints, waiting for the NIC thread to watch them.
    new_links: Mutex<Vec<Arc<endpoint::Link>>>,
    /// Dials started by `try_connect` and not yet taken, by peer.
    dials: Mutex<BTreeMap<NodeId, dial::BackgroundDial>>,
    waker: UnixStream,
    /// Origin of the node's coarse nanosecond clock (`now_ns`).
    epoch: Instant,
}

impl Node {
    /// This node's handshake.
    fn hello(&self) -> wire::Hello {
        wire::Hello {
            cluster_id: self.config.cluster_id,
            node: self.config.node.0,
            max_nodes: self.config.max_nodes,
            max_op_bytes: self.config.max_op_bytes,
        }
    }

    /// Hands an outbound connection to the NIC thread.
    fn watch(&self, link: Arc<endpoint::Link>) {
        self.new_links.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Arc::clone(&link));
        if self.stopped() {
            // The NIC thread may have made its last pass over `new_links` already.
            link.fail(self, crate::OpError::PeerUnreachable);
        }
        self.wake();
    }

    fn wake(&self) {
        // A full wake socket already holds a pending wake-up, so a failed write loses nothing.
        let _ = std::io::Write::write(&mut &self.waker, &[1]);
    }

    /// Nanoseconds since the node started.
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Operations posted and not yet completed, over all endpoints of this node.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// A node on the tcp fabric. Dropping it stops the node: its NIC thread exits and its sockets
/// close, so peers' operations to it fail.
#[derive(Debug)]
pub struct TcpFabric {
    node: Arc<Node>,
    local_addr: SocketAddr,
    nic: Option<JoinHandle<()>>,
}

const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    const fn sent_to_a_thread<T: Send>() {}
    shared_across_threads::<TcpFabric>();
    sent_to_a_thread::<TcpEndpoint>();
};

impl TcpFabric {
    /// Registers this node's regions, listens on `config.listen` and starts its NIC thread.
    pub fn start(config: TcpConfig) -> Result<Self, FabricError> {
        config.validate()?;
        let listener = TcpListener::bind(config.listen)
            .map_err(|e| FabricError::os(format!("listening on {}", config.listen), e))?;
        let local_addr = listener.local_addr().map_err(|e| FabricError::os("reading the listening address", e))?;
        listener.set_nonblocking(true).map_err(|e| FabricError::os("configuring the listener", e))?;
        let (waker, wake_rx) = UnixStream::pair().map_err(|e| FabricError::os("creating the NIC wake socket", e))?;
        for end in [&waker, &wake_rx] {
            end.set_nonblocking(true).map_err(|e| FabricError::os("configuring the NIC wake socket", e))?;
        }
        let memory = Memory::new(config.node, config.max_nodes, &config.regions);
        let node = Arc::new(Node {
            peers: RwLock::new(config.peers.clone()),
            config,
            memory,
            in_flight: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            new_links: Mutex::new(Vec::new()),
            dials: Mutex::new(BTreeMap::new()),
            waker,
            epoch: Instant::now(),
        });
        let nic_node = Arc::clone(&node);
        let nic = std::thread::Builder::new()
            .name(format!("microrep-tcp-nic-{}", node.config.node.0))
            .spawn(move || nic::run(&nic_node, listener, wake_rx))
            .map_err(|e| FabricError::os("starting the NIC thread", e))?;
        Ok(Self { node, local_addr, nic: Some(nic) })
    }

    /// The address peers connect to (with the OS-chosen port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sets or changes where `peer` listens; later connects and reconnects use it.
    pub fn set_peer_addr(&self, peer: NodeId, addr: SocketAddr) -> Result<(), FabricError> {
        layout::check_peer(self.node.config.node, peer, self.node.config.max_nodes)?;
        self.node.peers.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(peer, addr);
        Ok(())
    }

    pub(crate) fn shared(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        self.node.stopped.store(true, Ordering::Release);
        self.node.wake();
        if let Some(nic) = self.nic.take() {
            let _ = nic.join();
        }
    }
}

impl Fabric for TcpFabric {
    type Endpoint = TcpEndpoint;

    fn node_id(&self) -> NodeId {
        self.node.config.node
    }

    fn connect(&self, peer: NodeId) -> Result<TcpEndpoint, FabricError> {
        TcpEndpoint::open(&self.node, peer)
    }

    fn try_connect(&self, peer: NodeId) -> Result<Option<TcpEndpoint>, FabricError> {
        TcpEndpoint::try_open(&self.node, peer)
    }

    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        self.node.memory.grant(region, peer)
    }

    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
        // Waits for at most the one write being applied (see `memory`): always the fast path.
        self.node.memory.revoke(region, peer)?;
        Ok(RevokePath::Fast)
    }

    fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
        let (_, spec) = layout::find_spec(self.node.config.node, self.node.memory.specs(), region)?;
        Ok(spec.len_bytes)
    }

    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let index = self.node.memory.locate(region, offset, buf.len() as u64)?;
        self.node.memory.read(index, offset, buf);
        Ok(())
    }

    /// A copy: region bytes are atomic words here (see `memory`), never lent as plain bytes.
    unsafe fn local_bytes(&self, region: RegionId, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let mut bytes = vec![0; len];
        self.read_local(region, offset, &mut bytes)?;
        Ok(Cow::Owned(bytes))
    }

    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let index = self.node.memory.locate(region, offset, data.len() as u64)?;
        self.node.memory.write(index, offset, data);
        Ok(())
    }

    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        Ok(self.node.memory.word(region, offset)?.load(Ordering::Acquire))
    }

    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
        self.node.memory.word(region, offset)?.store(value, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemoteWrite;

    fn config() -> TcpConfig {
        let regions = [RegionSpec::new(RegionId(0), 64, RemoteWrite::Granted)];
        TcpConfig::new("unit", NodeId(0), 3, SocketAddr::from(([127, 0, 0, 1], 0)), &regions)
    }

    #[test]
    fn bad_configurations_are_typed_errors() {
        let mut c = config();
        c.queue_depth = 0;
        assert!(matches!(TcpFabric::start(c), Err(FabricError::InvalidLayout(_))));
        let mut c = config();
        c.max_op_bytes = 16;
        assert!(matches!(TcpFabric::start(c), Err(FabricError::InvalidLayout(_))));
        let mut c = config();
        c.timeouts.request = Duration::ZERO;
        assert!(matches!(TcpFabric::start(c), Err(FabricError::InvalidLayout(_))));
        let c = config().with_peers([(NodeId(0), SocketAddr::from(([127, 0, 0, 1], 9)))]);
        assert!(matches!(TcpFabric::start(c), Err(FabricError::InvalidPeer { .. })), "self as a peer");
        let c = config().with_peers([(NodeId(5), SocketAddr::from(([127, 0, 0, 1], 9)))]);
        assert!(matches!(TcpFabric::start(c), Err(FabricError::InvalidPeer { .. })), "peer outside the cluster");
    }

    #[test]
    fn cluster_ids_differ_by_name() {
        assert_ne!(TcpConfig::cluster_id_of("a"), TcpConfig::cluster_id_of("b"));
        assert_eq!(TcpConfig::cluster_id_of("prod"), TcpConfig::cluster_id_of("prod"));
    }
}
