//! [`SimHarness`]: runs the conformance suite against the simulator.

use super::config::SimConfig;
use super::fabric::SimFabric;
use super::world::SimWorld;
use crate::conformance::Harness;
use crate::{Fabric, FabricError, NodeId, RegionSpec};

/// Starts nodes in one [`SimWorld`] for the conformance checks.
#[derive(Debug)]
pub struct SimHarness {
    world: SimWorld,
}

impl SimHarness {
    /// A harness over a fresh world with this seed and configuration.
    ///
    /// # Panics
    /// If `config` is invalid (see [`SimWorld::new`]).
    pub fn new(seed: u64, config: SimConfig) -> Self {
        Self { world: SimWorld::new(seed, config) }
    }

    /// The world the nodes live in, e.g. to crash, hold or step it directly.
    pub const fn world(&self) -> &SimWorld {
        &self.world
    }
}

impl Harness for SimHarness {
    type F = SimFabric;

    fn start(&mut self, id: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> Result<SimFabric, FabricError> {
        self.world.add_cluster_node(id, max_nodes, regions)
    }

    fn settle(&mut self) {
        self.world.run_until_idle();
    }

    fn crash(&mut self, node: SimFabric) {
        self.world.crash(node.node_id());
    }

    fn advance(&mut self, events: u32) {
        for _ in 0..events {
            if !self.world.step() {
                break;
            }
        }
    }
}
