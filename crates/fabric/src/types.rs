//! Plain values shared by every backend.

use crate::OpError;

/// A node of the cluster. Ids are small and dense: `0..max_nodes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u16);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// A memory region of a node, registered at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionId(pub u16);

impl std::fmt::Display for RegionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "region {}", self.0)
    }
}

/// Who may write a region remotely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RemoteWrite {
    /// Peers may only read it.
    Never,
    /// Peers may write it once granted ([`crate::Fabric::grant_write`]); Mu's log (§5.2).
    Granted,
    /// Every peer may always write it; Mu's background plane (heartbeats, permission requests).
    Always,
}

/// A region to register: id, length and remote write policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionSpec {
    /// The id peers use to address it.
    pub id: RegionId,
    /// Length in bytes; a multiple of 8 and at least 8.
    pub len_bytes: u64,
    /// Remote write policy.
    pub remote_write: RemoteWrite,
}

impl RegionSpec {
    /// A region spec.
    pub const fn new(id: RegionId, len_bytes: u64, remote_write: RemoteWrite) -> Self {
        Self { id, len_bytes, remote_write }
    }
}

/// An address in the memory of an endpoint's peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The peer's region.
    pub region: RegionId,
    /// Byte offset inside it.
    pub offset: u64,
}

impl RemoteAddr {
    /// An address.
    pub const fn new(region: RegionId, offset: u64) -> Self {
        Self { region, offset }
    }
}

/// Options of a posted operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PostFlags(u8);

impl PostFlags {
    /// Report success with a completion (failures are always reported).
    pub const SIGNALED: Self = Self(1);
    /// Neither signaled nor anything else.
    pub const NONE: Self = Self(0);

    /// Whether successes of this operation produce a completion.
    pub const fn is_signaled(self) -> bool {
        self.0 & Self::SIGNALED.0 != 0
    }
}

/// The kind of a one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// One-sided WRITE.
    Write,
    /// One-sided READ.
    Read,
}

/// The outcome of one posted operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The caller's id from the post.
    pub wr_id: u64,
    /// What was posted.
    pub kind: OpKind,
    /// `Ok` when the operation took full effect at the peer.
    pub status: Result<(), OpError>,
}

/// Whether an endpoint accepts work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndpointState {
    /// Operations are carried out.
    Ready,
    /// An operation failed; later ones are flushed until [`crate::Endpoint::reconnect`].
    Error,
}

/// How a revocation was achieved (Mu §5.2: fast path first, slow path if it cannot finish).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RevokePath {
    /// Access flags changed; no write of the peer was in flight, or it finished promptly.
    Fast,
    /// The fast path could not finish, so the backend forced it: a queue pair cycled through
    /// RESET..RTS (verbs), or a writer stalled mid-write fenced by killing its process (shm).
    Slow,
}
