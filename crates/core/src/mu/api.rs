//! What an application sees of a replica: the state machine it implements, the events a
//! replica reports, and its errors.

use microrep_fabric::{FabricError, NodeId};

use super::membership::Configuration;

/// The deterministic application every replica runs (the "state machine" of SMR).
pub trait StateMachine {
    /// Applies the committed command at log `index`. Called once per index, in index order, on
    /// every replica, with the same bytes.
    fn apply(&mut self, index: u64, command: &[u8]);

    /// Log `index` holds no command (a no-op a new leader committed). Called in index order
    /// like `apply`; the default does nothing.
    fn skip(&mut self, index: u64) {
        let _ = index;
    }

    /// With a durable log (`MuConfig::durable`): the entry at `index` is committed and must be
    /// persisted (`command` is `None` for an entry without one), in index order, before it is
    /// applied; the runtime reports how far it synced with `ReplicationPlane::set_durable`. An
    /// entry is applied only once a majority of the members persisted it. The default does
    /// nothing.
    fn persist(&mut self, index: u64, command: Option<&[u8]>) {
        let _ = (index, command);
    }

    /// With a durable log: like [`Self::persist`] for a `Membership` entry (`mu::membership`),
    /// with the configuration it leaves (the same as before it if it changes nothing), so that
    /// a replica restarted from its disk knows the members as of its last entry. The default
    /// persists it as an entry without a command.
    fn persist_membership(&mut self, index: u64, configuration: Configuration) {
        let _ = configuration;
        self.persist(index, None);
    }

    /// With a durable log: the state as of `index` (everything below applied), with the
    /// configuration as of it, was just snapshotted ([`Self::snapshot`]) or restored from a
    /// peer ([`Self::restore`]): a checkpoint from which the log may start again. The default
    /// does nothing.
    fn checkpoint(&self, index: u64, configuration: Configuration, state: &[u8]) {
        let _ = (index, configuration, state);
    }

    /// Serialises the whole state, as of the last applied index, into `out`.
    fn snapshot(&self, out: &mut Vec<u8>);

    /// Replaces the whole state with a snapshot taken after applying everything below `index`.
    /// An error leaves the state as it was; the replica logs it and fetches another snapshot.
    fn restore(&mut self, index: u64, snapshot: &[u8]) -> Result<(), RestoreError>;
}

/// Why a state machine refused a snapshot.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RestoreError {
    /// The snapshot's length cannot hold this state machine's state.
    #[error("snapshot of {got} bytes; {expected}")]
    Length {
        /// The length received.
        got: usize,
        /// What the state machine expects, in words ("12 bytes", "8 + 9n bytes").
        expected: &'static str,
    },
    /// The snapshot says it was taken at another index than the one it is restored at.
    #[error("snapshot taken at index {taken}, restored at {at}")]
    Index {
        /// The index the snapshot names.
        taken: u64,
        /// The index it is restored at.
        at: u64,
    },
    /// The application refused it, saying why.
    #[error("the application refused the snapshot: {0}")]
    Application(String),
}

/// Something a replica reports from `poll`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request proposed here is committed and applied locally at `index`.
    Committed {
        /// The id given to `propose`.
        request_id: u64,
        /// Its log index.
        index: u64,
    },
    /// A request proposed here was dropped because this replica stopped leading. If
    /// `maybe_committed`, it was written to some logs and may still commit (its outcome is
    /// unknown; a `Committed` event follows if it is applied here).
    Failed {
        /// The id given to `propose`.
        request_id: u64,
        /// Whether it may still commit.
        maybe_committed: bool,
    },
    /// This replica's view of the leader changed.
    LeaderChanged {
        /// The new leader.
        leader: NodeId,
    },
    /// This replica became a voter of cluster generation `generation` (a bootstrap or a
    /// promotion): a runtime that keeps state across restarts remembers it
    /// (`MuConfig::generation`).
    Voter {
        /// The cluster generation.
        generation: u64,
    },
    /// Every member is live and none is a voter, so none can be promoted again, and at least
    /// one remembers belonging to a cluster (`generation`, 0 if none remembers but some log
    /// is not pristine): the cluster lost its state, every member having restarted with fresh
    /// memory. Bootstrapping would start it again empty, losing every acknowledged write, so
    /// it does not happen; an operator decides (see `mu::plane::bootstrap`). Reported once.
    ClusterLost {
        /// The generation a member remembers (the highest), or 0.
        generation: u64,
    },
    /// Every member restarted and restored its durable log (`MuConfig::durable`); this one
    /// had the most durable state (entries below `index`) and became the only voter of
    /// `generation`, to lead the others back (see `mu::plane::bootstrap`). Reported once.
    RestartedFromDisk {
        /// The index below which this replica restored every entry from its disk.
        index: u64,
        /// The generation it is a voter of.
        generation: u64,
    },
    /// A `Membership` entry at `index` was applied here and changed the configuration to
    /// `configuration` (one that changed nothing is not reported). A replica no longer among
    /// the members stops counting in quorums and leading; its runtime may stop it.
    MembershipChanged {
        /// The entry's index.
        index: u64,
        /// The configuration from `index + 1` on.
        configuration: super::Configuration,
    },
    /// This replica fell behind the recycled log and restored a snapshot taken at `index`.
    Restored {
        /// The snapshot's index.
        index: u64,
        /// The replica whose published snapshot it was.
        from: NodeId,
    },
}

/// Why `propose` refused a request.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ProposeError {
    /// This replica does not lead; `leader` is the replica it believes does.
    #[error("not the leader; try {leader}")]
    NotLeader {
        /// The believed leader.
        leader: NodeId,
    },
    /// The payload is larger than a log slot holds.
    #[error("command of {len} bytes exceeds the slot payload limit of {max} bytes")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Too many proposals are queued.
    #[error("{pending} proposals are already queued")]
    Backlogged {
        /// Queue length.
        pending: usize,
    },
    /// The log is full and cannot be recycled: the application's state (`state` bytes as a
    /// snapshot) does not fit the snapshot region (`limit` bytes), and the log is recycled only
    /// up to a published snapshot, so that a replica left behind can always restore one.
    #[error(
        "the log is full and cannot be recycled: the state's snapshot is {state} bytes, more than the \
         {limit} bytes of the snapshot region (raise log.snapshot_bytes on every member)"
    )]
    StateTooLarge {
        /// The snapshot's size.
        state: usize,
        /// The snapshot region's size.
        limit: usize,
    },
    /// A membership change that cannot be made now (the reason says why: not a member, not
    /// caught up yet, another change under way...).
    #[error("membership change refused: {0}")]
    Membership(String),
}

/// A replica that cannot start.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum MuError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] super::ConfigError),
    /// The fabric refused the layout or an access.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// The role a replica plays now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Applies what a leader writes.
    Follower,
    /// Believes it should lead and is acquiring permissions or catching up.
    Candidate,
    /// Holds write permission on a majority and replicates.
    Leader,
}

/// What a replica's replication plane is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Following a leader.
    Follow,
    /// Asking for permissions (Mu §5.2).
    AcquirePermissions,
    /// Leader catch-up, update followers (§4.2).
    CatchUp,
    /// Restoring a snapshot before leading.
    RestoreSnapshot,
    /// The prepare phase (Listing 2).
    Prepare,
    /// The accept phase.
    Accept,
    /// Leading, nothing in flight.
    Idle,
    /// Reading heads to recycle the log (§5.3).
    Recycle,
    /// Growing the confirmed followers.
    GrowFollowers,
}

impl Stage {
    /// Its name, as `microrep status` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Follow => "follow",
            Self::AcquirePermissions => "acquire permissions",
            Self::CatchUp => "catch up",
            Self::RestoreSnapshot => "restore snapshot",
            Self::Prepare => "prepare",
            Self::Accept => "accept",
            Self::Idle => "idle",
            Self::Recycle => "recycle",
            Self::GrowFollowers => "grow followers",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot of a replica's protocol state, for `microrep status` and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// This replica.
    pub node: NodeId,
    /// Its role.
    pub role: Role,
    /// What the replication plane is doing.
    pub phase: Stage,
    /// The leader it believes in.
    pub leader: NodeId,
    /// Its current proposal number (0 before it ever led).
    pub proposal_number: u64,
    /// First undecided offset of its log.
    pub fuo: u64,
    /// Next index it will apply.
    pub applied: u64,
    /// Its log's recycling point.
    pub tail: u64,
    /// Followers that granted it permission (when leading).
    pub confirmed: Vec<NodeId>,
    /// Proposals queued here.
    pub pending: usize,
    /// Times it became leader.
    pub terms_led: u64,
    /// Prepare phases it ran (omit-prepare keeps this at about one per term, Mu §4.2).
    pub prepares: u64,
    /// Whether it counts in quorums; false while it recovers from a start with fresh memory
    /// (see `mu::plane::leader::standing`).
    pub voter: bool,
    /// The configuration it applied last (see `mu::membership`).
    pub configuration: super::Configuration,
}

/// What the background plane tells the replication plane each poll: the leader its failure
/// detector chose, and how many detection rounds (heartbeat periods, each READing every peer's
/// heartbeat) it has run, so that the replication plane can wait for a view formed after an
/// event of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderView {
    /// The replica the background plane believes leads.
    pub leader: microrep_fabric::NodeId,
    /// Detection rounds run so far.
    pub rounds: u64,
    /// The replicas the failure detector holds live (a membership change adds only one of
    /// them).
    pub live: super::MemberSet,
}
