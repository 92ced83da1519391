//! Typed errors: [`FabricError`] for calls that fail locally, [`OpError`] inside completions.

use crate::{NodeId, RegionId};

/// A fabric call that failed before any remote effect.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FabricError {
    /// The region id is not registered (locally, or at the endpoint's peer).
    #[error("{region} is not registered at {node}")]
    UnknownRegion {
        /// Whose regions were searched.
        node: NodeId,
        /// The missing region.
        region: RegionId,
    },
    /// An access reaches past the end of a region.
    #[error("access of {len} bytes at offset {offset} is outside {region} of {node} ({region_len} bytes)")]
    OutOfBounds {
        /// Whose region.
        node: NodeId,
        /// The region.
        region: RegionId,
        /// Start of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// An atomic word access at an offset that is not a multiple of 8.
    #[error("offset {offset} in {region} is not 8-byte aligned")]
    Misaligned {
        /// The region.
        region: RegionId,
        /// The offending offset.
        offset: u64,
    },
    /// The node id is outside the cluster (`0..max_nodes`) or is this node itself.
    #[error("{node} is not a peer here (cluster of {max_nodes} nodes, this is {this})")]
    InvalidPeer {
        /// The offending id.
        node: NodeId,
        /// This node.
        this: NodeId,
        /// Cluster size bound.
        max_nodes: u16,
    },
    /// Permission calls on a region whose policy is not [`crate::RemoteWrite::Granted`].
    #[error("{region} does not take write grants (its policy is fixed)")]
    NotGrantable {
        /// The region.
        region: RegionId,
    },
    /// The region specs are unusable (duplicate ids, zero or unaligned length...).
    #[error("invalid region layout: {0}")]
    InvalidLayout(String),
    /// The endpoint has no room for another outstanding operation; poll completions first.
    #[error("endpoint to {peer} has {depth} outstanding operations; poll completions first")]
    QueueFull {
        /// The peer.
        peer: NodeId,
        /// The queue depth.
        depth: usize,
    },
    /// A single operation moves more bytes than the backend carries in one message.
    #[error("an operation of {len} bytes exceeds the largest of {max} bytes this endpoint carries")]
    TooLarge {
        /// Bytes requested.
        len: u64,
        /// The bound.
        max: u64,
    },
    /// The peer is dead (or never came up within the connect timeout).
    #[error("{0} is unreachable: {1}")]
    PeerUnreachable(NodeId, String),
    /// A node with this id already runs in this cluster.
    #[error("{node} already runs (pid {pid}); refusing to start a second copy")]
    AlreadyRunning {
        /// The id.
        node: NodeId,
        /// The live process holding it.
        pid: i32,
    },
    /// A revocation could not make sure the peer's writes stopped.
    #[error("could not revoke write access of {peer} to {region}: {reason}")]
    RevokeFailed {
        /// The writer.
        peer: NodeId,
        /// The region.
        region: RegionId,
        /// Why.
        reason: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {message}")]
    Os {
        /// What was being done.
        context: String,
        /// The OS error's kind.
        kind: std::io::ErrorKind,
        /// The OS error's text.
        message: String,
    },
}

impl FabricError {
    pub(crate) fn os(context: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        let source = source.into();
        Self::Os { context: context.into(), kind: source.kind(), message: source.to_string() }
    }
}

/// Why a posted operation failed (the status of a [`crate::Completion`]).
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpError {
    /// The peer does not (or no longer) grant this node write access to the region. Like an RDMA
    /// remote access error, it moves the endpoint to [`crate::EndpointState::Error`].
    #[error("remote access denied: no write permission on the peer's region")]
    PermissionDenied,
    /// The peer crashed or cannot be reached within the fabric's timeout.
    #[error("peer unreachable")]
    PeerUnreachable,
    /// Not attempted because an earlier operation on the endpoint failed.
    #[error("flushed: the endpoint is in error state")]
    Flushed,
    /// The backend failed the operation for a transient reason (injected by the simulator, or a
    /// transport error); the endpoint must be reconnected.
    #[error("transport error")]
    Transport,
}
