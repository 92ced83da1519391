//! Mu: state machine replication by one-sided writes ("Microsecond Consensus for Microsecond
//! Applications", Aguilera et al., OSDI 2020). Section numbers in comments refer to that paper.
//!
//! A [`Replica`] is two planes driven by `poll(now, ..)`:
//!
//! * the **replication plane** ([`ReplicationPlane`]): as leader, the replicator appends
//!   entries by writing them into a majority of followers' logs (§4); on every replica, the
//!   replayer applies committed entries (§4.2, A.4.3);
//! * the **background plane** ([`BackgroundPlane`]): heartbeats and pull-score failure
//!   detection that choose the leader (§5.1), and the permission manager that gives one leader
//!   at a time write access to the local log (§5.2).
//!
//! The runtime runs each plane on its own thread; the simulator polls both from one.

mod api;
mod background;
mod config;
mod election;
mod gate;
mod invariants;
pub mod layout;
mod links;
mod membership;
mod pace;
mod plane;
mod planted;
pub mod slot;
pub mod snapshot;

use microrep_fabric::{Fabric, FabricError, RegionSpec};

pub use api::{Event, LeaderView, MuError, ProposeError, RestoreError, Role, Stage, StateMachine, Status};

/// The tracing target of the line a replica logs for every entry it applies (at trace level:
/// node, index, proposal number, proposer, request id). A target of its own, so that a fault
/// harness can log every applied entry and nothing else to check that replicas agree.
pub const APPLY_LOG_TARGET: &str = "microrep_core::apply";
pub use background::{BackgroundPlane, ReplicationFacts};
pub use config::{ConfigError, MuConfig};
pub use election::PullScore;
pub use gate::LocalLogGate;
pub use invariants::{InvariantViolation, InvariantWatch};
pub use membership::{Configuration, MemberSet, MembershipChange, SharedMembers};
pub use plane::{APPLY_PER_POLL, ReplicationPlane};
#[cfg(feature = "planted-bugs")]
pub use planted::PlantedBug;

/// The regions a replica with `config` registers on its fabric.
pub fn regions(config: &MuConfig) -> [RegionSpec; 4] {
    layout::Layout::new(config).regions()
}

/// One Mu replica: both planes over one fabric handle, polled from one thread.
#[derive(Debug)]
pub struct Replica<F: Fabric> {
    fabric: F,
    background: BackgroundPlane<F::Endpoint>,
    replication: ReplicationPlane<F::Endpoint>,
}

impl<F: Fabric> Replica<F> {
    /// A replica on `fabric`, which must have registered [`regions`]`(&config)`.
    pub fn new(fabric: F, config: MuConfig, now_ns: u64) -> Result<Self, MuError> {
        config.validate()?;
        if fabric.node_id() != config.node {
            return Err(ConfigError {
                key: "node",
                problem: format!("differs from the fabric's {}", fabric.node_id()),
            }
            .into());
        }
        for spec in regions(&config) {
            let len = fabric.region_len(spec.id)?;
            if len != spec.len_bytes {
                return Err(MuError::Fabric(FabricError::InvalidLayout(format!(
                    "{} is {len} bytes; this configuration needs {}",
                    spec.id, spec.len_bytes
                ))));
            }
        }
        let gate = LocalLogGate::new();
        let members = SharedMembers::new(config.members);
        Ok(Self {
            background: BackgroundPlane::new(&config, gate.clone(), members.clone()),
            replication: ReplicationPlane::new(&config, gate, members, now_ns),
            fabric,
        })
    }

    /// Queues `payload` for replication under the caller's `request_id`; a `Committed` event
    /// reports its index once it is applied here.
    pub fn propose(&mut self, request_id: u64, payload: &[u8]) -> Result<(), ProposeError> {
        self.replication.propose(request_id, payload)
    }

    /// Queues a membership change (see [`ReplicationPlane::propose_membership`]); a
    /// `Committed` event for `request_id` reports it applied here, an
    /// [`Event::MembershipChanged`] what it changed.
    pub fn propose_membership(&mut self, request_id: u64, change: MembershipChange) -> Result<(), ProposeError> {
        self.replication.propose_membership(request_id, change)
    }

    /// Does the work due at `now` on both planes, applying committed entries to `app`.
    pub fn poll<S: StateMachine>(&mut self, now_ns: u64, app: &mut S, events: &mut Vec<Event>) {
        self.poll_background(now_ns);
        self.poll_replication(now_ns, app, events);
    }

    /// Polls as a runtime's two threads would (see [`Self::calm_until`]): the replication plane
    /// always, the background plane only once its rest is over, or when the replication plane
    /// has work while the background plane rests at an idle stride (the runtime's replication
    /// thread wakes it then). A simulator that polls this way serves a permission request to a
    /// resting replica no sooner than a runtime would.
    pub fn poll_resting<S: StateMachine>(&mut self, now_ns: u64, app: &mut S, events: &mut Vec<Event>) {
        let due = self.background.calm_until(now_ns).is_none_or(|t| t <= now_ns);
        if due || (self.background.resting() && self.replication.is_busy()) {
            self.poll_background(now_ns);
        }
        self.poll_replication(now_ns, app, events);
    }

    /// Does the background plane's work due at `now` (heartbeats, detection, permissions). With
    /// [`Replica::poll_replication`], a simulator runs the planes as separate actors, as the
    /// runtime's two threads do.
    pub fn poll_background(&mut self, now_ns: u64) {
        let facts = ReplicationFacts { stalled: self.replication.stalled(now_ns), busy: self.replication.is_busy() };
        self.background.poll(&self.fabric, now_ns, facts);
    }

    /// Does the replication plane's work due at `now`, following the leader the background
    /// plane chose and applying committed entries to `app`.
    pub fn poll_replication<S: StateMachine>(&mut self, now_ns: u64, app: &mut S, events: &mut Vec<Event>) {
        let view = LeaderView {
            leader: self.background.leader(now_ns),
            rounds: self.background.rounds(),
            live: self.background.detector().live_set(),
        };
        self.replication.poll(&self.fabric, now_ns, view, app, events);
    }

    /// The runtime's durability input: every entry below `index` that this replica applied is
    /// on its disk (see [`ReplicationPlane::set_durable`]).
    pub fn set_durable(&mut self, index: u64) {
        self.replication.set_durable(index);
    }

    /// Before the first poll: the application was restored from a durable log up to `index`,
    /// whose configuration there is `configuration` (see
    /// [`ReplicationPlane::restore_durable`]).
    pub fn restore_durable<S: StateMachine>(&mut self, app: &S, index: u64, configuration: Configuration) {
        self.replication.restore_durable(&self.fabric, app, index, configuration);
    }

    /// The configuration this replica starts with: the initial members (`MuConfig::members`),
    /// epoch 0 (what [`Self::restore_durable`] takes for a log that holds no change).
    pub fn initial_configuration(&self) -> Configuration {
        Configuration { members: self.replication.initial_members(), epoch: 0 }
    }

    /// Whether this replica rests between heartbeats at an idle stride (see
    /// [`MuConfig::idle_stride`]).
    pub fn resting(&self) -> bool {
        self.background.resting()
    }

    /// Whether this replica may be chosen to lead (see [`BackgroundPlane::set_candidate`]).
    pub fn set_candidate(&mut self, candidate: bool) {
        self.background.set_candidate(candidate);
    }

    /// The replica's protocol state.
    pub fn status(&self) -> Status {
        self.replication.status()
    }

    /// The failure detector's view.
    pub fn detector(&self) -> &PullScore {
        self.background.detector()
    }

    /// When the background plane next has work while nothing moves (see
    /// [`BackgroundPlane::calm_until`]).
    pub fn calm_until(&self, now_ns: u64) -> Option<u64> {
        self.background.calm_until(now_ns)
    }

    /// The fabric handle.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }
}
