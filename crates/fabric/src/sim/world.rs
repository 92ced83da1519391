//! [`SimWorld`]: the handle the tests and the cluster simulator drive.

use std::cell::RefCell;
use std::rc::Rc;

use super::config::SimConfig;
use super::digest::Tag;
use super::engine::World;
use super::fabric::SimFabric;
use crate::{FabricError, NodeId, RegionSpec, layout};

/// A deterministic simulated fabric shared by every node in it.
///
/// Cloning gives another handle on the same world. Nothing happens by itself: time moves and
/// operations progress only through [`SimWorld::step`], [`SimWorld::run_until_idle`] and
/// [`SimWorld::advance_to`]. Events are processed in (time, creation order), and every random
/// choice comes from one ChaCha8 generator seeded by the seed, so the same seed and the same calls
/// give the same run, bit for bit ([`SimWorld::trace_digest`] makes that checkable).
#[derive(Clone)]
pub struct SimWorld {
    inner: Rc<RefCell<World>>,
}

impl std::fmt::Debug for SimWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.inner.try_borrow() {
            Ok(w) => f
                .debug_struct("SimWorld")
                .field("now", &w.now)
                .field("nodes", &w.nodes.len())
                .field("endpoints", &w.eps.len())
                .field("pending_events", &w.pending_events())
                .finish(),
            Err(_) => f.write_str("SimWorld { <busy> }"),
        }
    }
}

impl SimWorld {
    /// A world with no nodes at time 0.
    ///
    /// # Panics
    /// If `config` is invalid ([`SimConfig::validate`]): this is a test tool and a bad
    /// configuration is a bug in the test.
    pub fn new(seed: u64, config: SimConfig) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid SimConfig: {e}");
        }
        Self { inner: Rc::new(RefCell::new(World::new(seed, config))) }
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut self.inner.borrow_mut())
    }

    /// Like [`SimWorld::with`], but does nothing while the world is borrowed (for `Drop`).
    pub(super) fn try_with(&self, f: impl FnOnce(&mut World)) {
        if let Ok(mut w) = self.inner.try_borrow_mut() {
            f(&mut w);
        }
    }

    /// Adds node `id` with zeroed `regions` and returns its handle. A crashed id may be added
    /// again (the same as [`SimWorld::restart`]); a running one is refused with
    /// [`FabricError::AlreadyRunning`] (pid 0: the simulator has no processes).
    ///
    /// Peers are checked against [`layout::MAX_NODES`]; see [`SimWorld::add_cluster_node`] for a
    /// smaller cluster.
    pub fn add_node(&self, id: NodeId, regions: &[RegionSpec]) -> Result<SimFabric, FabricError> {
        self.add_cluster_node(id, layout::MAX_NODES, regions)
    }

    /// Like [`SimWorld::add_node`], but the node treats ids `>= max_nodes` as
    /// [`FabricError::InvalidPeer`], as the other backends do for a cluster of `max_nodes`.
    pub fn add_cluster_node(
        &self,
        id: NodeId,
        max_nodes: u16,
        regions: &[RegionSpec],
    ) -> Result<SimFabric, FabricError> {
        layout::validate_membership(id, max_nodes)?;
        let incarnation = self.with(|w| w.start_node(id, regions))?;
        Ok(SimFabric::new(self.clone(), id, incarnation, max_nodes))
    }

    /// Simulated time in nanoseconds.
    pub fn now(&self) -> u64 {
        self.with(|w| w.now)
    }

    /// Processes exactly the next event in (time, creation order); false if none is pending.
    pub fn step(&self) -> bool {
        self.with(World::step)
    }

    /// Processes events until none is left. It always terminates: events only come from posted
    /// operations, each of which causes a bounded number of them (a held node's operations wait
    /// without events, see [`SimWorld::hold_outgoing`]).
    pub fn run_until_idle(&self) {
        self.with(World::run_until_idle);
    }

    /// Processes every event due at or before `t_ns`, then sets the time to `t_ns` (time never
    /// goes back: an earlier `t_ns` only processes what is already due).
    pub fn advance_to(&self, t_ns: u64) {
        self.with(|w| {
            while w.next_event_time().is_some_and(|at| at <= t_ns) {
                w.step();
            }
            w.now = w.now.max(t_ns);
        });
    }

    /// Crashes `node`: its memory and grants are gone, its own queued operations are dropped
    /// without completions (a write it had partly applied stays partial), its handles return
    /// [`FabricError::PeerUnreachable`], and operations of others to it complete with
    /// [`crate::OpError::PeerUnreachable`] after [`SimConfig::peer_timeout_ns`]. Unknown or
    /// already crashed nodes are ignored.
    pub fn crash(&self, node: NodeId) {
        self.with(|w| w.crash(node));
    }

    /// Brings a crashed `node` back with zeroed `regions`, no grants and a new incarnation.
    /// Endpoints to its old incarnation keep failing until they are reconnected.
    pub fn restart(&self, node: NodeId, regions: &[RegionSpec]) -> Result<SimFabric, FabricError> {
        self.add_node(node, regions)
    }

    /// Whether `node` is crashed (false for a running or unknown node).
    pub fn is_crashed(&self, node: NodeId) -> bool {
        self.with(|w| w.nodes.get(&node).is_some_and(|n| n.crashed))
    }

    /// Pauses `node`'s outgoing operations: those not yet started wait in place (a writer stopped
    /// mid-post). Pieces of a write already being applied still land, as they are past the
    /// sender.
    pub fn hold_outgoing(&self, node: NodeId) {
        self.with(|w| w.set_held(node, true));
    }

    /// Lets a held node's operations go on.
    pub fn release_outgoing(&self, node: NodeId) {
        self.with(|w| w.set_held(node, false));
    }

    /// Holds the directed link `from` → `to`: operations `from` posts to `to` wait in place, as
    /// behind a partition or a clogged link (pieces of a write already being applied still
    /// land). Operations the other way are untouched, so one-way holds make asymmetric
    /// reachability; both ways, a partition between the two.
    pub fn hold_link(&self, from: NodeId, to: NodeId) {
        self.with(|w| w.set_link_held(from, to, true));
    }

    /// Lets the operations waiting on a held link go on.
    pub fn release_link(&self, from: NodeId, to: NodeId) {
        self.with(|w| w.set_link_held(from, to, false));
    }

    /// Replaces the configuration, e.g. to stop injecting faults for a liveness phase.
    ///
    /// # Panics
    /// If `config` is invalid, or changes `lend_peer_memory` (what the backend is, not a fault).
    pub fn set_config(&self, config: SimConfig) {
        if let Err(e) = config.validate() {
            panic!("invalid SimConfig: {e}");
        }
        self.with(|w| {
            assert_eq!(
                config.lend_peer_memory, w.config.lend_peer_memory,
                "lending peers' memory is the backend's, fixed when the world is made"
            );
            w.config = config;
            let c = &w.config;
            let fields = [
                c.latency_min_ns,
                c.latency_max_ns,
                c.delay_prob.to_bits(),
                c.delay_max_ns,
                c.fail_prob.to_bits(),
                c.torn_write_prob.to_bits(),
                c.peer_timeout_ns,
            ];
            w.trace(Tag::Config, &fields);
        });
    }

    /// The current configuration.
    pub fn config(&self) -> SimConfig {
        self.with(|w| w.config.clone())
    }

    /// A hash over every event so far (posts, operations starting, pieces landing with their
    /// bytes, failures, completions, grants, revocations, crashes, ...). Equal for equal runs.
    pub fn trace_digest(&self) -> u64 {
        self.with(|w| w.digest.value())
    }

    /// Operations posted on live endpoints whose completion has not happened yet.
    pub fn pending_ops(&self) -> usize {
        self.with(|w| w.eps.iter().filter(|e| !e.dead).map(|e| e.outstanding).sum())
    }
}
