//! The one-sided memory fabric that microrep's protocols run on.
//!
//! A *fabric* gives a node the small set of RDMA-like operations that Mu (OSDI'20) needs:
//!
//! * **regions**: memory a node registers at start-up; peers address it by
//!   (node, [`RegionId`], offset), with every access bounds-checked;
//! * **endpoints** (queue pairs): one per peer per plane, reliable and FIFO, carrying one-sided
//!   WRITEs and READs that complete with a [`Completion`] holding a typed status;
//! * **permissions**: remote write access to a [`RemoteWrite::Granted`] region is given to
//!   chosen peers and taken back with [`Fabric::revoke_write`]; after it returns, no write from
//!   that peer lands (Mu §3.2, §5.2);
//! * **failure**: a crashed peer surfaces as error completions, never a hang.
//!
//! The contract every backend keeps is written out in `docs/ARCHITECTURE.md` and proven by one
//! conformance suite ([`conformance`]) run against each backend:
//!
//! * [`shm`]: processes on one host sharing memory files (the default and fastest here);
//! * [`sim`]: a deterministic, seeded, single-threaded simulation with fault injection;
//! * [`tcp`]: nodes on any hosts over TCP, each running a user-space "NIC" thread that applies
//!   peers' operations to its regions (for clusters without RDMA).
//! * `verbs` (cargo feature `verbs`): RDMA NICs or soft-RoCE through libibverbs.
//!
//! # Example
//! ```
//! use microrep_fabric::sim::{SimConfig, SimWorld};
//! use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};
//!
//! let log = RegionId(0);
//! let regions = [RegionSpec::new(log, 4096, RemoteWrite::Granted)];
//! let world = SimWorld::new(7, SimConfig::reliable());
//! let follower = world.add_node(NodeId(0), &regions).unwrap();
//! let leader = world.add_node(NodeId(1), &regions).unwrap();
//!
//! follower.grant_write(log, NodeId(1)).unwrap();
//! let mut ep = leader.connect(NodeId(0)).unwrap();
//! ep.post_write(1, RemoteAddr::new(log, 64), b"entry", PostFlags::SIGNALED).unwrap();
//! world.run_until_idle();
//! assert!(ep.poll_completion().unwrap().status.is_ok());
//!
//! let mut buf = [0u8; 5];
//! follower.read_local(log, 64, &mut buf).unwrap();
//! assert_eq!(&buf, b"entry");
//! ```

use std::borrow::Cow;

pub mod checksum;
pub mod conformance;
mod error;
pub mod layout;
mod types;

pub mod shm;
pub mod sim;
pub mod tcp;
#[cfg(feature = "verbs")]
pub mod verbs;

/// The decoders' checks, for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`; not an API).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    /// Feeds bytes to the tcp frame decoder; panics if it breaks a promise.
    pub fn tcp_frames(data: &[u8]) {
        crate::tcp::wire::check::frames(data);
    }

    /// Feeds bytes to the verbs bootstrap decoders; panics if they break a promise.
    #[cfg(feature = "verbs")]
    pub fn verbs_bootstrap(data: &[u8]) {
        crate::verbs::wire::check::bootstrap(data);
    }
}

pub use error::{FabricError, OpError};
pub use types::{
    Completion, EndpointState, NodeId, OpKind, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite, RevokePath,
};

/// A node's handle on the fabric: its own regions, its permissions, and endpoints to peers.
pub trait Fabric {
    /// The endpoint (queue pair) type of this backend.
    type Endpoint: Endpoint;

    /// This node's id.
    fn node_id(&self) -> NodeId;

    /// Opens a reliable, FIFO endpoint to `peer`. Call once per plane that needs its own queue.
    fn connect(&self, peer: NodeId) -> Result<Self::Endpoint, FabricError>;

    /// [`Fabric::connect`] for a caller that must never wait for a peer that does not answer
    /// (a protocol's polling thread, whose silence peers would take for a failure): `Ok(None)`
    /// while the connection is being set up in the background; a later call returns it. The
    /// default, for backends whose `connect` does not wait on the peer, is `connect`.
    fn try_connect(&self, peer: NodeId) -> Result<Option<Self::Endpoint>, FabricError> {
        self.connect(peer).map(Some)
    }

    /// Lets `peer` write into local `region` (a [`RemoteWrite::Granted`] region).
    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError>;

    /// Takes write access to local `region` away from `peer`.
    ///
    /// When this returns `Ok`, every write of `peer` into `region` has either landed entirely or
    /// will fail with [`OpError::PermissionDenied`]; none lands later. The [`RevokePath`] says
    /// whether the fast path sufficed (Mu §5.2).
    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError>;

    /// Length in bytes of local `region`.
    fn region_len(&self, region: RegionId) -> Result<u64, FabricError>;

    /// Copies local memory at `region[offset..offset + buf.len()]` into `buf`.
    ///
    /// Peers may be writing the same bytes concurrently: the copy can observe a write partially
    /// applied, in any byte order. Protocols detect that with checksums.
    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError>;

    /// The local bytes at `region[offset..offset + len]`, read where they lie when the backend
    /// can (shm, tcp and verbs lend a slice of the region; the simulator copies): how a
    /// multicast receiver delivers a payload from its sender's ring without copying it out.
    ///
    /// # Safety
    ///
    /// No peer may change these bytes while the returned value lives: the caller's protocol
    /// must guarantee it, as a multicast sender reuses a ring slot only after every member has
    /// delivered the message in it. (A peer that writes the same bytes again, retransmitting
    /// after a reconnect, changes nothing a reader can observe on these backends.)
    unsafe fn local_bytes(&self, region: RegionId, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, FabricError>;

    /// Whether [`Fabric::local_bytes`] lends the region's bytes (or, in the simulator, stands
    /// for a backend that does) rather than copying them: a protocol that would hold memory
    /// only to read it in place copies instead where this is false (tcp).
    fn lends_local_bytes(&self) -> bool {
        false
    }

    /// Whether this node's endpoints lend their peer's memory ([`Endpoint::peer_load_u64`],
    /// [`Endpoint::peer_bytes`]): a reader can then take bytes a peer wrote into its own
    /// regions without a READ, and without a copy. True on shm (a peer's segment is mapped
    /// here), and in the simulator when its config says so; false where a NIC stands between
    /// the two memories (verbs, tcp).
    fn lends_peer_memory(&self) -> bool {
        false
    }

    /// Copies `data` into local memory at `region[offset..]`.
    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError>;

    /// Atomically loads the 8-byte-aligned little-endian word at `region[offset]` (acquire).
    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError>;

    /// Atomically stores the 8-byte-aligned word at `region[offset]` (release).
    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError>;
}

/// What [`Endpoint::peer_bytes`] and [`Endpoint::peer_load_u64`] fail with on a backend that
/// does not lend a peer's memory.
fn no_lending() -> FabricError {
    FabricError::Unsupported { device: "this fabric".to_owned(), feature: "lending a peer's memory".to_owned() }
}

/// A reliable, connected, FIFO channel of one-sided operations to one peer (an RC queue pair).
///
/// Posting validates arguments locally and returns `Err` for caller mistakes (unknown region,
/// out of bounds, queue full). Everything that happens at or on the way to the peer is reported by
/// a [`Completion`]: successes only when [`PostFlags::SIGNALED`], failures always. After a failed
/// completion the endpoint is in [`EndpointState::Error`] and later operations complete with
/// [`OpError::Flushed`] until [`Endpoint::reconnect`] succeeds.
pub trait Endpoint {
    /// The peer this endpoint reaches.
    fn peer(&self) -> NodeId;

    /// Posts a one-sided WRITE of `data` to the peer's memory at `dst`.
    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError>;

    /// Posts a one-sided READ of `len` bytes at the peer's `src` into local memory at
    /// `local_region[local_offset..]`.
    fn post_read(
        &mut self,
        wr_id: u64,
        src: RemoteAddr,
        len: u32,
        local_region: RegionId,
        local_offset: u64,
        flags: PostFlags,
    ) -> Result<(), FabricError>;

    /// A hint that a WRITE of `len` bytes to `dst` will be posted soon. A backend whose
    /// writes are this CPU's stores into the peer's memory (shm) asks for those cache lines
    /// now, so that the later write does not wait for them while other work can overlap the
    /// wait. It changes no memory and checks no permission; a bad address is ignored. The
    /// default, for backends where a NIC does the write, does nothing.
    fn prefetch_write(&mut self, dst: RemoteAddr, len: u32) {
        let _ = (dst, len);
    }

    /// Atomically loads (acquire) the 8-byte-aligned word at the peer's `src`, as the peer's own
    /// [`Fabric::load_u64`] would. Bytes the peer wrote locally before it posted a WRITE to this
    /// node are seen here once that WRITE's bytes are. A peer that died stays readable, as it
    /// was when it died, until this endpoint is dropped or reconnected. Fails with
    /// [`FabricError::Unsupported`] where [`Fabric::lends_peer_memory`] is false.
    fn peer_load_u64(&self, src: RemoteAddr) -> Result<u64, FabricError> {
        let _ = src;
        Err(no_lending())
    }

    /// Lends `len` bytes of the peer's memory at `src` (shm: its mapping; the simulator: a
    /// copy), readable as [`Endpoint::peer_load_u64`] says. Fails with
    /// [`FabricError::Unsupported`] where [`Fabric::lends_peer_memory`] is false.
    ///
    /// # Safety
    ///
    /// Nobody may change these bytes while the returned value lives: the caller's protocol
    /// must guarantee it, as a multicast sender reuses a ring slot only after every member has
    /// delivered the message in it.
    unsafe fn peer_bytes(&self, src: RemoteAddr, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let _ = (src, len);
        Err(no_lending())
    }

    /// Takes the oldest completion, if any.
    fn poll_completion(&mut self) -> Option<Completion>;

    /// Whether the endpoint accepts work or has failed.
    fn state(&self) -> EndpointState;

    /// Brings a failed endpoint back to [`EndpointState::Ready`] (the verbs backend cycles the
    /// queue pair through RESET, INIT, RTR and RTS). Fails if the peer is dead.
    fn reconnect(&mut self) -> Result<(), FabricError>;

    /// [`Endpoint::reconnect`] for a caller that must never wait for a peer that does not
    /// answer: `Ok(false)` while the new connection is being set up in the background (the
    /// endpoint stays failed; a later call finishes the job). The default, for backends whose
    /// `reconnect` does not wait on the peer, is `reconnect`.
    fn try_reconnect(&mut self) -> Result<bool, FabricError> {
        self.reconnect().map(|()| true)
    }

    /// Whether the peer process this endpoint reaches is known to be gone (it exited, or closed
    /// its fabric) although no operation has failed yet: the state is still
    /// [`EndpointState::Ready`], but the next operation will fail. A caller about to reuse
    /// failed endpoints treats such an endpoint as failed and reconnects it, reaching the
    /// peer's next incarnation if one runs. The default, for backends that learn of a peer's
    /// death only from a failed operation, is `false`.
    fn peer_gone(&self) -> bool {
        false
    }
}
