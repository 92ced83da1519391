//! Configuration of a Mu replica, validated up front.

use microrep_fabric::NodeId;

use super::membership::MemberSet;

#[cfg(feature = "planted-bugs")]
pub(super) use super::planted::PlantedBug;

/// Configuration of one replica. All replicas of a cluster must agree on every field but `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MuConfig {
    /// This replica.
    pub node: NodeId,
    /// The ids the cluster can use: `0..replicas` (every replica registers regions sized for
    /// them).
    pub replicas: u16,
    /// The members at start (by default all of `0..replicas`); `Membership` entries change
    /// them (see `mu::membership`). An id outside them follows as a joiner until it is added.
    pub members: MemberSet,
    /// Bytes per log slot, header included (a multiple of 8, at least 64).
    pub slot_bytes: u32,
    /// Slots in the circular log (at least 4).
    pub log_slots: u32,
    /// Bytes reserved for the published snapshot (Mu §5.4 state transfer).
    pub snapshot_bytes: u32,
    /// A replica snapshots its state every this many applied entries.
    pub snapshot_every: u64,
    /// Period of heartbeat increments and of pull-score reads (Mu §5.1).
    pub heartbeat_period_ns: u64,
    /// While the cluster is idle, replicas heartbeat (and read heartbeats) once every this many
    /// periods instead of every period, so that an idle cluster hardly wakes (see `mu::pace`);
    /// a crashed idle leader is then noticed up to this many periods later. 1: never rest.
    pub idle_stride: u8,
    /// Largest failure-detector score.
    pub score_max: u8,
    /// A live peer is declared failed when its score drops below this.
    pub score_fail_below: u8,
    /// A failed peer is declared recovered when its score rises above this.
    pub score_recover_above: u8,
    /// Heartbeat periods a replica waits after starting before it counts itself among the
    /// candidates for leader. A replica that restarts while another leads would otherwise
    /// claim leadership at once (it is the lowest live id in its own eyes) while its peers
    /// still hold it failed, and the two would take permissions from each other until the
    /// peers' scores of it recover; twice `score_recover_above + 2` periods lets them.
    pub join_grace_heartbeats: u32,
    /// Leader stickiness: among the live voters, one that says it leads (its own log is granted
    /// to itself) is chosen over a lower id, so a replica that comes back does not take
    /// leadership from a working leader (one fail-over per fault, not two). `false`: Mu's rule,
    /// the lowest live id leads.
    pub sticky_leader: bool,
    /// A leader whose proposals make no progress for this long stops heartbeating (fate
    /// sharing, Mu §5.1).
    pub fate_share_timeout_ns: u64,
    /// How long a replica that fate-shared stays silent and out of the running for leader, so
    /// that the replica elected instead is not displaced at once.
    pub fate_share_cooldown_ns: u64,
    /// How long a would-be leader waits for a majority of permission acks before asking again.
    pub permission_timeout_ns: u64,
    /// How long one quorum round (prepare, accept, catch-up read) may wait for a majority.
    pub round_timeout_ns: u64,
    /// How often the leader tries to recycle log slots (Mu §5.3).
    pub recycle_period_ns: u64,
    /// 0: the leader recycles up to the head a majority applied (Mu §5.3), and a follower
    /// below it restores a snapshot. Otherwise it recycles only what every confirmed follower
    /// applied, and leaves the slowest behind only once the log is full and that follower has
    /// applied nothing for this long (a dead or stopped follower stalls the leader this long at
    /// most). For state machines that cannot restore snapshots cheaply; below
    /// `fate_share_timeout_ns`, or the waiting leader would stop heartbeating.
    pub recycle_wait_ns: u64,
    /// How often a follower that stopped applying checks whether it fell behind the log.
    pub lag_check_period_ns: u64,
    /// Proposals a replica queues before refusing more.
    pub max_pending: usize,
    /// This run of the replica, never 0: a replica that restarts must come back with another
    /// one, so that a leader's promotion of its previous run cannot promote it (see
    /// `mu::plane::leader::standing`). [`MuConfig::new`] draws a random one; simulations set their own.
    pub incarnation: u64,
    /// The cluster generation this replica remembers belonging to from an earlier run, 0 for
    /// none (a new member, or one that keeps nothing across restarts). A replica that
    /// remembers one never takes part in bootstrapping a new cluster: if every member is live
    /// and none is a voter, the cluster lost its state, and it reports
    /// [`Event::ClusterLost`](super::Event::ClusterLost) instead (see `mu::plane::bootstrap`).
    pub generation: u64,
    /// Whether every replica keeps a durable log of what it applies (its runtime reports its
    /// progress through `ReplicationPlane::set_durable`). With it, a leader reports a request
    /// committed only once a majority of the members have it on disk (as Raft acknowledges
    /// only entries a majority persisted), and a cluster all of whose members restarted starts
    /// again from the member with the most durable state instead of reporting
    /// [`Event::ClusterLost`](super::Event::ClusterLost) (see `mu::plane::durable`, `mu::plane::bootstrap`).
    pub durable: bool,
    /// A deliberate protocol mutation (tests of the checkers only).
    #[cfg(feature = "planted-bugs")]
    pub planted_bug: Option<PlantedBug>,
}

/// A random nonzero incarnation (std's per-instance hash keys are random; no extra dependency).
fn random_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
}

/// A configuration value that cannot work.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("invalid Mu configuration: {key} {problem}")]
pub struct ConfigError {
    /// The offending field.
    pub key: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl MuConfig {
    /// Defaults tuned for the shm fabric on a small machine: microsecond heartbeats, a 4 MiB log.
    pub fn new(node: NodeId, replicas: u16) -> Self {
        Self {
            node,
            replicas,
            members: MemberSet::first(replicas),
            slot_bytes: 256,
            log_slots: 16_384,
            snapshot_bytes: 1 << 20,
            snapshot_every: 4096,
            heartbeat_period_ns: 20_000,
            idle_stride: 1,
            score_max: 15,
            score_fail_below: 2,
            score_recover_above: 6,
            join_grace_heartbeats: 16,
            sticky_leader: true,
            fate_share_timeout_ns: 2_000_000,
            fate_share_cooldown_ns: 20_000_000,
            permission_timeout_ns: 1_000_000,
            round_timeout_ns: 2_000_000,
            recycle_period_ns: 100_000,
            recycle_wait_ns: 0,
            lag_check_period_ns: 1_000_000,
            max_pending: 4096,
            incarnation: random_incarnation(),
            generation: 0,
            durable: false,
            #[cfg(feature = "planted-bugs")]
            planted_bug: None,
        }
    }

    /// Settings for simulated clusters: a 64-slot log of 128-byte slots that wraps many times
    /// per run, a snapshot every 16 entries, timeouts scaled to simulated latencies.
    pub fn simulated(node: NodeId, replicas: u16) -> Self {
        Self {
            slot_bytes: 128,
            log_slots: 64,
            snapshot_bytes: 4096,
            snapshot_every: 16,
            heartbeat_period_ns: 20_000,
            fate_share_timeout_ns: 2_000_000,
            fate_share_cooldown_ns: 5_000_000,
            permission_timeout_ns: 300_000,
            round_timeout_ns: 400_000,
            recycle_period_ns: 40_000,
            lag_check_period_ns: 200_000,
            max_pending: 64,
            // The simulator's seeds were verified without a join grace (docs/SIMULATION.md).
            join_grace_heartbeats: 0,
            // Deterministic; a simulated restart must draw another.
            incarnation: u64::from(node.0) + 1,
            ..Self::new(node, replicas)
        }
    }

    /// Largest payload a slot holds.
    pub fn max_payload_bytes(&self) -> usize {
        self.slot_bytes as usize - super::slot::HEADER_BYTES - super::slot::CANARY_BYTES
    }

    /// Checks every field; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, problem: String| Err(ConfigError { key, problem });
        if self.replicas == 0 || self.replicas > microrep_fabric::layout::MAX_NODES {
            return bad("replicas", format!("is {}; it must be in 1..=256", self.replicas));
        }
        if self.node.0 >= self.replicas {
            return bad("node", format!("is {}; it must be below replicas ({})", self.node.0, self.replicas));
        }
        if self.members.is_empty() || self.members.end() > self.replicas {
            return bad("members", format!("are {}; they must be some of 0..{}", self.members, self.replicas));
        }
        if self.slot_bytes < 64 || !self.slot_bytes.is_multiple_of(8) {
            return bad("slot_bytes", format!("is {}; it must be a multiple of 8, at least 64", self.slot_bytes));
        }
        if self.log_slots < 4 {
            return bad("log_slots", format!("is {}; it must be at least 4", self.log_slots));
        }
        if self.incarnation == 0 {
            return bad("incarnation", "is 0; it must be nonzero (0 marks a replica that is not a voter)".into());
        }
        if u64::from(self.slot_bytes) * u64::from(self.log_slots) > 1 << 34 {
            return bad("log_slots", "makes a log larger than 16 GiB".into());
        }
        if self.snapshot_bytes < 64 || !self.snapshot_bytes.is_multiple_of(8) {
            return bad(
                "snapshot_bytes",
                format!("is {}; it must be a multiple of 8, at least 64", self.snapshot_bytes),
            );
        }
        if self.snapshot_every == 0 || self.snapshot_every >= u64::from(self.log_slots) {
            return bad("snapshot_every", format!("is {}; it must be in 1..log_slots", self.snapshot_every));
        }
        if !(self.score_fail_below < self.score_recover_above && self.score_recover_above < self.score_max) {
            return bad("score_recover_above", "must lie strictly between score_fail_below and score_max".into());
        }
        for (key, value) in [
            ("heartbeat_period_ns", self.heartbeat_period_ns),
            ("fate_share_timeout_ns", self.fate_share_timeout_ns),
            ("fate_share_cooldown_ns", self.fate_share_cooldown_ns),
            ("permission_timeout_ns", self.permission_timeout_ns),
            ("round_timeout_ns", self.round_timeout_ns),
            ("recycle_period_ns", self.recycle_period_ns),
            ("lag_check_period_ns", self.lag_check_period_ns),
        ] {
            if value == 0 {
                return bad(key, "must be positive".into());
            }
        }
        if self.idle_stride == 0 {
            return bad("idle_stride", "is 0; it must be in 1..=255 (1: heartbeat every period, idle or not)".into());
        }
        if self.max_pending == 0 {
            return bad("max_pending", "must be positive".into());
        }
        if self.recycle_wait_ns >= self.fate_share_timeout_ns {
            return bad(
                "recycle_wait_ns",
                format!(
                    "is {}; it must be below fate_share_timeout_ns ({}): a leader waiting for a follower makes no \
                     progress",
                    self.recycle_wait_ns, self.fate_share_timeout_ns
                ),
            );
        }
        Ok(())
    }

    /// Whether the planted bug `bug` is active.
    #[cfg(feature = "planted-bugs")]
    pub(crate) fn bug(&self, bug: PlantedBug) -> bool {
        self.planted_bug == Some(bug)
    }

    /// Without the `planted-bugs` feature no bug is ever active.
    #[cfg(not(feature = "planted-bugs"))]
    #[inline(always)]
    pub(crate) fn bug(&self, _bug: super::planted::PlantedBug) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_errors_name_the_key() {
        assert_eq!(MuConfig::new(NodeId(0), 3).validate(), Ok(()));
        let e = MuConfig { slot_bytes: 60, ..MuConfig::new(NodeId(0), 3) }.validate().expect_err("bad slot");
        assert_eq!(e.key, "slot_bytes");
        let e = MuConfig::new(NodeId(3), 3).validate().expect_err("bad node");
        assert_eq!(e.key, "node");
        let e = MuConfig { score_recover_above: 1, ..MuConfig::new(NodeId(0), 3) }.validate().expect_err("bad score");
        assert_eq!(e.key, "score_recover_above");
        let e = MuConfig { round_timeout_ns: 0, ..MuConfig::new(NodeId(0), 3) }.validate().expect_err("zero");
        assert_eq!(e.key, "round_timeout_ns");
        let slow = MuConfig { recycle_wait_ns: 2_000_000, ..MuConfig::new(NodeId(0), 3) };
        assert_eq!(slow.validate().expect_err("waits as long as fate sharing").key, "recycle_wait_ns");
        assert_eq!(MuConfig { recycle_wait_ns: 1_000_000, ..slow }.validate(), Ok(()));
        let e =
            MuConfig { members: MemberSet::first(4), ..MuConfig::new(NodeId(0), 3) }.validate().expect_err("4 of 3");
        assert_eq!(e.key, "members");
        let e = MuConfig { members: MemberSet::default(), ..MuConfig::new(NodeId(0), 3) }.validate().expect_err("none");
        assert_eq!(e.key, "members");
    }
}
