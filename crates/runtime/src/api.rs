//! What an application sees: the state machine it implements and the results of proposing.

pub use microrep_core::mu::RestoreError;
use microrep_fabric::NodeId;
use serde::Serialize;

/// Where a command sits in the replicated order: its log entry, and its position in the batch
/// that entry carries (0 for an entry of one command).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Index {
    /// The log index of the entry.
    pub entry: u64,
    /// The command's position inside the entry.
    pub position: u32,
}

/// The deterministic application every replica runs. Each replica applies the same commands
/// in the same order, so each must compute the same state and the same replies.
pub trait Apply: Send + 'static {
    /// Applies the committed `command` at `index` and writes the reply for its proposer into
    /// `reply` (empty on entry). Runs on every replica; only the proposer's reply is returned.
    fn apply(&mut self, index: Index, command: &[u8], reply: &mut Vec<u8>);

    /// Serialises the whole state into `out` (state transfer to a replica that fell behind).
    fn snapshot(&self, out: &mut Vec<u8>);

    /// Replaces the whole state with `snapshot`; a snapshot it cannot use is refused, saying
    /// why (the replica then keeps its state and tries another source).
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError>;

    /// A digest of the state, equal on replicas that applied the same commands; reported by
    /// `status` so that operators and tests can compare replicas.
    fn digest(&self) -> Option<u64> {
        None
    }
}

/// A committed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// Where it was committed.
    pub index: Index,
    /// What [`Apply::apply`] answered on this replica.
    pub reply: Vec<u8>,
}

/// Why a proposal did not (or may not have) committed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ProposeError {
    /// This replica does not lead. Nothing was written; retry at `leader` if known.
    #[error("not the leader{}", leader.map(|l| format!("; the leader is {l}")).unwrap_or_default())]
    NotLeader {
        /// The replica believed to lead.
        leader: Option<NodeId>,
    },
    /// Leadership was lost after the command was written to some logs: it may or may not
    /// commit. A client must treat the outcome as unknown.
    #[error("leadership lost while replicating: the command may or may not commit")]
    Unknown,
    /// No outcome within the propose timeout; the command may still commit.
    #[error("timed out waiting for the command to commit: it may still commit")]
    Timeout,
    /// The command does not fit in a log slot.
    #[error("command of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The largest command a slot holds.
        max: usize,
    },
    /// A batch holds more commands than one log entry carries; nothing was written.
    #[error("a batch of {count} commands exceeds the limit of {max} commands per log entry")]
    TooManyCommands {
        /// Its commands.
        count: usize,
        /// The most one entry carries.
        max: usize,
    },
    /// Too many proposals are waiting; nothing was written.
    #[error("too many proposals are waiting; retry later")]
    Backlogged,
    /// The log is full and cannot be recycled, because the application's state does not fit
    /// the snapshot region (`log.snapshot_bytes`); nothing was written.
    #[error(
        "the log is full and cannot be recycled: the state's snapshot is {state} bytes, more than \
         log.snapshot_bytes = {limit} (raise it on every member)"
    )]
    StateTooLarge {
        /// The snapshot's size.
        state: usize,
        /// `log.snapshot_bytes`.
        limit: usize,
    },
    /// The node is shutting down; the command may have been written.
    #[error("the node is shutting down")]
    Shutdown,
    /// A membership change that cannot be made now; nothing was written. The text says why
    /// (not a member, not caught up yet, another change under way...).
    #[error("membership change refused: {0}")]
    Membership(String),
}

impl ProposeError {
    /// Whether the command may have been (or may yet be) committed.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Self::Unknown | Self::Timeout | Self::Shutdown)
    }
}
