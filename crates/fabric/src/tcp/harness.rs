//! Conformance harness: every node in this process, listening on 127.0.0.1 with a port chosen by
//! the OS (bind port 0, then read the address), so parallel tests never collide.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Node, TcpConfig, TcpFabric, TcpTimeouts};
use crate::conformance::Harness;
use crate::{FabricError, NodeId, RegionSpec};

/// How long `settle` waits for operations to complete before failing the check.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// Starts tcp nodes on loopback and tells every node where the others listen.
#[derive(Debug)]
pub struct TcpHarness {
    cluster: String,
    timeouts: TcpTimeouts,
    nodes: Vec<(NodeId, Weak<Node>)>,
    addrs: BTreeMap<NodeId, SocketAddr>,
}

impl TcpHarness {
    /// A harness for a cluster named after this process and `name`, with a short connect
    /// timeout (a crashed peer refuses connections at once on loopback).
    pub fn new(name: &str) -> Self {
        let timeouts = TcpTimeouts { connect: Duration::from_millis(200), request: Duration::from_secs(10) };
        Self::with_timeouts(name, timeouts)
    }

    /// A harness with the given timeouts.
    pub fn with_timeouts(name: &str, timeouts: TcpTimeouts) -> Self {
        let cluster = format!("test-{}-{name}", std::process::id());
        Self { cluster, timeouts, nodes: Vec::new(), addrs: BTreeMap::new() }
    }

    fn live(&self) -> impl Iterator<Item = Arc<Node>> + '_ {
        self.nodes.iter().filter_map(|(_, n)| n.upgrade()).filter(|n| !n.stopped())
    }
}

impl Harness for TcpHarness {
    type F = TcpFabric;

    fn start(&mut self, id: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> Result<TcpFabric, FabricError> {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut config = TcpConfig::new(&self.cluster, id, max_nodes, loopback, regions).with_peers(
            self.addrs.iter().filter(|(peer, _)| peer.0 < max_nodes && **peer != id).map(|(p, a)| (*p, *a)),
        );
        config.timeouts = self.timeouts;
        let fabric = TcpFabric::start(config)?;
        let addr = fabric.local_addr();
        for node in self.live() {
            if node.config.node != id && id.0 < node.config.max_nodes {
                node.peers.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, addr);
            }
        }
        self.addrs.insert(id, addr);
        self.nodes.push((id, Arc::downgrade(fabric.shared())));
        Ok(fabric)
    }

    fn settle(&mut self) {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        while let Some(busy) = self.live().find(|n| n.in_flight() > 0) {
            assert!(
                Instant::now() < deadline,
                "{} still has {} operations in flight after {SETTLE_DEADLINE:?}",
                busy.config.node,
                busy.in_flight()
            );
            std::thread::yield_now();
        }
    }

    fn crash(&mut self, node: TcpFabric) {
        drop(node);
    }
}
