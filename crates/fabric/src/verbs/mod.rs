//! The `verbs` backend: RDMA NICs (or soft-RoCE, `rdma_rxe`) through libibverbs, via `sideway`.
//!
//! * **Device**: the configured one or the first; RoCE v2 GID chosen automatically (an IPv4 GID
//!   first) unless [`VerbsConfig::gid_index`] says otherwise. libibverbs is loaded at run time, so
//!   a binary built with this feature runs on hosts without RDMA and reports
//!   [`FabricError::NoRdmaDevice`] there.
//! * **Regions** are page-aligned anonymous mappings registered once at start-up as memory regions
//!   (MRs). A [`crate::RemoteWrite::Never`] region's MR lacks remote write access; the others have it.
//!   See the `memory` module for how local code and the NIC share those bytes.
//! * **Endpoints** are RC queue pairs. An endpoint to a peer has one QP per *lane*: lane 0 carries
//!   operations on the peer's non-grantable regions, and each [`crate::RemoteWrite::Granted`] region has a
//!   lane of its own, because Mu §5.2 revokes write access by changing a QP's access flags, which
//!   covers every region reached through that QP; a separate lane per granted region lets a
//!   revocation of the log leave the always-writable background region writable. The lanes of an
//!   endpoint stay one FIFO: before an operation goes to another lane than the previous one, the
//!   endpoint waits for the earlier operations to complete (in Mu each plane uses one lane, so this
//!   never happens on the data path). WRITEs up to the QP's inline size are posted inline, larger
//!   ones from a registered staging ring; successes are signaled only when asked for, or every
//!   [`VerbsConfig::signal_interval`] operations to recycle send-queue slots; failures are always
//!   reported. Each endpoint has one completion queue shared by its lanes.
//! * **Bootstrap**: QP addresses and region tables travel over a small TCP exchange with the
//!   peer's listener thread (`wire`); the peer creates the target-side QPs and owns them.
//! * **Permissions** (Mu §5.2): `revoke_write` clears remote write from the access flags of every
//!   target-side QP of the peer's lanes for that region (fast path). If the change fails or the QP
//!   is left in the error state, the QP is cycled RESET, INIT, RTR, RTS with read-only access
//!   (slow path, [`crate::RevokePath::Slow`]). The writer's next WRITE on that lane fails with a remote
//!   access error ([`crate::OpError::PermissionDenied`]) and its endpoint must reconnect.
//! * **Failure**: a dead peer's QPs are gone, so operations to it exhaust the transport's retries
//!   ([`VerbsConfig::ack_timeout_exp`], [`VerbsConfig::retry_count`]) and complete with
//!   [`crate::OpError::PeerUnreachable`]; its bootstrap listener is gone too, so reconnecting fails.

mod device;
mod endpoint;
mod harness;
mod memory;
mod node;
mod perftest;
mod qp;
mod rereg;
pub(crate) mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use endpoint::VerbsEndpoint;
pub use harness::{REQUIRE_RDMA_ENV, VerbsHarness, VerbsTestEndpoint, VerbsTestNode, skip_reason};
pub use memory::memlock_limit;
pub use node::VerbsFabric;
pub use perftest::{PerftestError, PerftestLatency, perftest_latency};

use crate::{FabricError, NodeId, RegionSpec};

/// Where each node's bootstrap listener is. In one process, nodes share one table and each
/// inserts its own address when it starts; across processes, fill it from configuration.
#[derive(Clone, Debug, Default)]
pub struct PeerTable(Arc<RwLock<BTreeMap<NodeId, SocketAddr>>>);

impl PeerTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `node`'s bootstrap address.
    pub fn insert(&self, node: NodeId, addr: SocketAddr) {
        self.0.write().expect("peer table poisoned").insert(node, addr);
    }

    /// `node`'s bootstrap address, if known.
    pub fn get(&self, node: NodeId) -> Option<SocketAddr> {
        self.0.read().expect("peer table poisoned").get(&node).copied()
    }

    /// Forgets `node`, if it is still at `addr`.
    pub fn remove(&self, node: NodeId, addr: SocketAddr) {
        let mut table = self.0.write().expect("peer table poisoned");
        if table.get(&node) == Some(&addr) {
            table.remove(&node);
        }
    }
}

/// Configuration of one verbs node.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// This node.
    pub node: NodeId,
    /// Cluster size bound: node ids are `0..max_nodes`.
    pub max_nodes: u16,
    /// Regions to register.
    pub regions: Vec<RegionSpec>,
    /// Address of this node's bootstrap listener (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Bootstrap addresses of the nodes; this node adds its own when it starts.
    pub peers: PeerTable,
    /// RDMA device name (`ibv_devices`); `None` takes the first.
    pub device: Option<String>,
    /// Device port, from 1.
    pub port: u8,
    /// GID index (`show_gids`); `None` picks a RoCE v2 GID of an IPv4 address if there is one.
    pub gid_index: Option<u8>,
    /// Operations an endpoint may have outstanding (posted and not yet polled).
    pub queue_depth: usize,
    /// Inline data asked of each QP: WRITEs up to the size the device grants skip the staging copy.
    pub max_inline_bytes: u32,
    /// An unsignaled operation is signaled anyway after this many in a row, so send-queue slots
    /// are recycled.
    pub signal_interval: u32,
    /// Bytes of each endpoint's registered staging ring for WRITEs larger than the inline size
    /// (the largest single WRITE an endpoint takes).
    pub staging_bytes: usize,
    /// Endpoints this node holds at once, each registering a staging ring: the locked-memory
    /// check at start counts that many ([`VerbsConfig::pinned_bytes`]).
    pub endpoints: usize,
    /// Local ACK timeout exponent: the transport retransmits after 4.096 us * 2^exp.
    pub ack_timeout_exp: u8,
    /// Retransmissions before an operation fails with `PeerUnreachable` (at most 7).
    pub retry_count: u8,
    /// How long bootstrap exchanges wait for the peer.
    pub connect_timeout: Duration,
}

impl VerbsConfig {
    /// A configuration with defaults: first device, port 1, automatic GID, queue depth 256,
    /// 256 inline bytes, signal every 64, 4 MiB staging, one endpoint per peer, ACK timeout
    /// 2^14 * 4.096 us (67 ms) with 7 retries, bootstrap timeout 5 s, listening on `listen`.
    pub fn new(node: NodeId, max_nodes: u16, regions: &[RegionSpec], listen: SocketAddr, peers: PeerTable) -> Self {
        Self {
            node,
            max_nodes,
            regions: regions.to_vec(),
            listen,
            peers,
            device: None,
            port: 1,
            gid_index: None,
            queue_depth: 256,
            max_inline_bytes: 256,
            signal_interval: 64,
            staging_bytes: 4 << 20,
            endpoints: usize::from(max_nodes.saturating_sub(1).max(1)),
            ack_timeout_exp: 14,
            retry_count: 7,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Bytes the node pins (registers) once it holds [`VerbsConfig::endpoints`] endpoints: its
    /// regions and a staging ring per endpoint.
    pub fn pinned_bytes(&self) -> u64 {
        let regions: u64 = self.regions.iter().map(|r| r.len_bytes).sum();
        let staging = (endpoint::FENCE_BYTES + self.staging_bytes) as u64;
        regions.saturating_add(staging.saturating_mul(self.endpoints as u64))
    }

    /// Fails when pinning [`VerbsConfig::pinned_bytes`] would exceed the locked-memory limit
    /// `limit_bytes` (`None`: unlimited; the process's own is [`memlock_limit`]). A privileged
    /// process (root, which holds CAP_IPC_LOCK) is not limited by the kernel.
    pub fn check_memlock(&self, limit_bytes: Option<u64>, privileged: bool) -> Result<(), FabricError> {
        let needed_bytes = self.pinned_bytes();
        match limit_bytes {
            Some(limit_bytes) if !privileged && limit_bytes < needed_bytes => {
                Err(FabricError::MemlockTooLow { limit_bytes, needed_bytes })
            }
            _ => Ok(()),
        }
    }

    /// Upper bound on how long the transport takes to give up on a dead peer.
    pub(crate) fn failure_bound(&self) -> Duration {
        let per_try = Duration::from_nanos(4096 << self.ack_timeout_exp.min(31));
        per_try * (u32::from(self.retry_count) + 1) * 4 + Duration::from_secs(2)
    }

    fn validate(&self) -> Result<(), FabricError> {
        crate::layout::validate_membership(self.node, self.max_nodes)?;
        crate::layout::validate_specs(&self.regions)?;
        let bad = |why: String| Err(FabricError::InvalidLayout(why));
        if self.queue_depth == 0 || self.queue_depth > 1 << 14 {
            return bad(format!("queue_depth {} must be in 1..=16384", self.queue_depth));
        }
        if self.signal_interval == 0 {
            return bad("signal_interval must be at least 1".into());
        }
        if self.retry_count > 7 || self.ack_timeout_exp > 31 || self.port == 0 {
            return bad("retry_count must be <= 7, ack_timeout_exp <= 31 and port >= 1".into());
        }
        if self.staging_bytes < 4096 {
            return bad(format!("staging_bytes {} must be at least 4096", self.staging_bytes));
        }
        Ok(())
    }
}

// The runtime shares one node handle between its replication and background threads, and moves
// endpoints into them.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn sent<T: Send>() {}
    shared::<VerbsFabric>();
    sent::<VerbsEndpoint>();
};

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{PeerTable, VerbsConfig};
    use crate::{FabricError, NodeId, RegionId, RegionSpec, RemoteWrite};

    fn config(endpoints: usize) -> VerbsConfig {
        let regions = [
            RegionSpec::new(RegionId(0), 6 << 20, RemoteWrite::Granted),
            RegionSpec::new(RegionId(1), 2 << 20, RemoteWrite::Always),
        ];
        let mut config = VerbsConfig::new(NodeId(0), 3, &regions, (Ipv4Addr::LOCALHOST, 0).into(), PeerTable::new());
        config.staging_bytes = 1 << 20;
        config.endpoints = endpoints;
        config
    }

    #[test]
    fn pinned_bytes_count_the_regions_and_a_staging_ring_per_endpoint() {
        assert_eq!(VerbsConfig::new(NodeId(0), 3, &[], (Ipv4Addr::LOCALHOST, 0).into(), PeerTable::new()).endpoints, 2);
        assert_eq!(config(0).pinned_bytes(), 8 << 20);
        assert_eq!(config(4).pinned_bytes(), (8 << 20) + 4 * ((1 << 20) + 64));
    }

    #[test]
    fn memlock_limit_is_checked_for_unprivileged_processes() {
        let needed = config(4).pinned_bytes();
        let e = config(4).check_memlock(Some(8 << 20), false);
        assert_eq!(e, Err(FabricError::MemlockTooLow { limit_bytes: 8 << 20, needed_bytes: needed }));
        let text = e.expect_err("too low").to_string();
        assert!(text.contains("8388608") && text.contains(&needed.to_string()), "{text}");
        assert!(config(4).check_memlock(Some(8 << 20), true).is_ok(), "a privileged process is not limited");
        assert!(config(4).check_memlock(None, false).is_ok(), "unlimited");
        assert!(config(4).check_memlock(Some(needed), false).is_ok(), "exactly enough");
        assert!(config(0).check_memlock(Some(8 << 20), false).is_ok(), "the regions alone fit");
    }
}
