//! Running the conformance suite (and other tests) on the verbs backend.
//!
//! Verbs operations complete asynchronously, but [`Harness::settle`] has no handle on the
//! endpoints a check created. So the harness hands out [`VerbsTestNode`]s, which wrap
//! [`VerbsFabric`] and register every endpoint they open; `settle` waits for each to go idle. The
//! wrapper's lock costs nothing the suite measures; production code uses `VerbsFabric` directly.

use std::borrow::Cow;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::{PeerTable, VerbsConfig, VerbsEndpoint, VerbsFabric};
use crate::conformance::Harness;
use crate::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr,
    RevokePath,
};

/// Environment variable that turns "no RDMA device" from a skip into a failure (the VM harness
/// sets it).
pub const REQUIRE_RDMA_ENV: &str = "MICROREP_REQUIRE_RDMA";

/// Why verbs tests cannot run here, or `None` when they can (or must: with
/// `MICROREP_REQUIRE_RDMA=1`, a missing device fails the tests instead of skipping them).
pub fn skip_reason() -> Option<String> {
    if std::env::var(REQUIRE_RDMA_ENV).is_ok_and(|v| v == "1") {
        return None;
    }
    let regions = [RegionSpec::new(RegionId(0), 4096, crate::RemoteWrite::Never)];
    let mut config = VerbsConfig::new(NodeId(0), 1, &regions, (Ipv4Addr::LOCALHOST, 0).into(), PeerTable::new());
    config.staging_bytes = 4096;
    match VerbsFabric::start(config) {
        Ok(_) => None,
        Err(e) => Some(format!("verbs tests skipped: {e} (set {REQUIRE_RDMA_ENV}=1 to fail instead)")),
    }
}

type Registry = Arc<Mutex<Vec<Weak<Mutex<VerbsEndpoint>>>>>;

/// Starts verbs nodes in this process, bootstrapping over loopback TCP.
#[derive(Debug, Default)]
pub struct VerbsHarness {
    peers: PeerTable,
    endpoints: Registry,
    tune: Option<fn(&mut VerbsConfig)>,
}

impl VerbsHarness {
    /// A harness with a fresh peer table. Failure detection is tightened (3 retries of the
    /// 2^14 * 4.096 us ACK timeout) so the crash check finishes in well under a second.
    pub fn new() -> Self {
        Self::default()
    }

    /// A harness that applies `tune` to every node's configuration before it starts.
    pub fn tuned(tune: fn(&mut VerbsConfig)) -> Self {
        Self { tune: Some(tune), ..Self::default() }
    }

    /// The configuration `start` uses for node `id`.
    pub fn config(&self, id: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> VerbsConfig {
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let mut config = VerbsConfig::new(id, max_nodes, regions, listen, self.peers.clone());
        config.retry_count = 3;
        config.connect_timeout = Duration::from_secs(10);
        if let Some(tune) = self.tune {
            tune(&mut config);
        }
        config
    }
}

impl Harness for VerbsHarness {
    type F = VerbsTestNode;

    fn start(&mut self, id: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> Result<VerbsTestNode, FabricError> {
        let fabric = VerbsFabric::start(self.config(id, max_nodes, regions))?;
        Ok(VerbsTestNode { fabric, endpoints: Arc::clone(&self.endpoints) })
    }

    fn settle(&mut self) {
        let live: Vec<_> = self.endpoints.lock().expect("registry poisoned").iter().filter_map(Weak::upgrade).collect();
        for endpoint in live {
            let mut endpoint = endpoint.lock().expect("endpoint poisoned");
            let bound = endpoint.failure_bound();
            // On timeout the check's own assertions report what is missing.
            let _ = endpoint.wait_idle(bound);
        }
    }

    fn crash(&mut self, node: VerbsTestNode) {
        drop(node);
    }
}

/// A [`VerbsFabric`] whose endpoints the harness can settle.
#[derive(Debug)]
pub struct VerbsTestNode {
    fabric: VerbsFabric,
    endpoints: Registry,
}

impl VerbsTestNode {
    /// The wrapped node handle.
    pub fn fabric(&self) -> &VerbsFabric {
        &self.fabric
    }
}

/// An endpoint shared with the harness (see [`VerbsTestNode`]).
#[derive(Debug)]
pub struct VerbsTestEndpoint(Arc<Mutex<VerbsEndpoint>>);

impl VerbsTestEndpoint {
    fn inner(&self) -> MutexGuard<'_, VerbsEndpoint> {
        self.0.lock().expect("endpoint poisoned")
    }
}

impl Fabric for VerbsTestNode {
    type Endpoint = VerbsTestEndpoint;

    fn node_id(&self) -> NodeId {
        self.fabric.node_id()
    }

    fn connect(&self, peer: NodeId) -> Result<VerbsTestEndpoint, FabricError> {
        let endpoint = Arc::new(Mutex::new(self.fabric.connect(peer)?));
        let mut registry = self.endpoints.lock().expect("registry poisoned");
        registry.retain(|e| e.strong_count() > 0);
        registry.push(Arc::downgrade(&endpoint));
        Ok(VerbsTestEndpoint(endpoint))
    }

    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        self.fabric.grant_write(region, peer)
    }

    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
        self.fabric.revoke_write(region, peer)
    }

    fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
        self.fabric.region_len(region)
    }

    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.fabric.read_local(region, offset, buf)
    }

    unsafe fn local_bytes(&self, region: RegionId, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.fabric.local_bytes(region, offset, len) }
    }

    fn lends_local_bytes(&self) -> bool {
        self.fabric.lends_local_bytes()
    }

    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.fabric.write_local(region, offset, data)
    }

    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        self.fabric.load_u64(region, offset)
    }

    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
        self.fabric.store_u64(region, offset, value)
    }
}

impl Endpoint for VerbsTestEndpoint {
    fn peer(&self) -> NodeId {
        self.inner().peer()
    }

    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError> {
        self.inner().post_write(wr_id, dst, data, flags)
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
        self.inner().post_read(wr_id, src, len, local_region, local_offset, flags)
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        self.inner().poll_completion()
    }

    fn state(&self) -> EndpointState {
        self.inner().state()
    }

    fn reconnect(&mut self) -> Result<(), FabricError> {
        self.inner().reconnect()
    }
}
