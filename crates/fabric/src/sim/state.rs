//! The data of a simulated world: nodes with their memory, endpoints with their queues, events.

use std::collections::{BTreeSet, VecDeque};
use std::ops::Range;

use crate::{Completion, EndpointState, NodeId, OpKind, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

/// One node: its regions and, while it runs, their memory and grants.
#[derive(Debug)]
pub(super) struct Node {
    /// Bumped by every (re)start, so handles and endpoints of an older life can be told apart.
    pub(super) incarnation: u32,
    pub(super) crashed: bool,
    /// Paused: its endpoints start no new operation until released.
    pub(super) held: bool,
    /// Kept after a crash so that peers can still validate posts against the last known layout.
    pub(super) specs: Vec<RegionSpec>,
    /// Parallel to `specs`; emptied by a crash.
    pub(super) memory: Vec<Vec<u8>>,
    /// Parallel to `specs`: who may write each `Granted` region.
    pub(super) grants: Vec<BTreeSet<NodeId>>,
    /// `crash_times[i]` is when incarnation `i` crashed: timeouts of operations to it count from
    /// there.
    pub(super) crash_times: Vec<u64>,
}

impl Node {
    pub(super) fn new(incarnation: u32, specs: &[RegionSpec], crash_times: Vec<u64>) -> Self {
        let memory = specs.iter().map(|s| vec![0u8; region_len_usize(s.len_bytes)]).collect();
        Self {
            incarnation,
            crashed: false,
            held: false,
            specs: specs.to_vec(),
            memory,
            grants: vec![BTreeSet::new(); specs.len()],
            crash_times,
        }
    }

    /// Whether incarnation `inc` of this node is the one running now.
    pub(super) fn is_live(&self, inc: u32) -> bool {
        !self.crashed && self.incarnation == inc
    }

    pub(super) fn region_index(&self, region: RegionId) -> Option<usize> {
        self.specs.iter().position(|s| s.id == region)
    }

    /// The permission check a NIC does when a write arrives (contract rule 2).
    pub(super) fn may_write(&self, region: usize, writer: NodeId) -> bool {
        match self.specs[region].remote_write {
            RemoteWrite::Never => false,
            RemoteWrite::Always => true,
            RemoteWrite::Granted => self.grants[region].contains(&writer),
        }
    }
}

/// A region length as a `usize`; simulated regions must fit in this process's memory anyway.
pub(super) fn region_len_usize(len: u64) -> usize {
    usize::try_from(len).unwrap_or_else(|_| panic!("a simulated region of {len} bytes does not fit in memory"))
}

/// Converts an offset that has already been bounds-checked against an in-memory region.
pub(super) fn offset_usize(offset: u64) -> usize {
    usize::try_from(offset).unwrap_or(usize::MAX)
}

/// What an operation does.
#[derive(Debug)]
pub(super) enum OpBody {
    Write { dst: RemoteAddr, data: Vec<u8> },
    Read { src: RemoteAddr, len: u32, local_region: RegionId, local_offset: u64 },
}

impl OpBody {
    pub(super) const fn kind(&self) -> OpKind {
        match self {
            Self::Write { .. } => OpKind::Write,
            Self::Read { .. } => OpKind::Read,
        }
    }
}

/// Where the operation at the head of an endpoint's queue stands. Only the head ever leaves
/// `Queued`: that is what makes an endpoint FIFO.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Behind an earlier operation, or at the head of a held node's endpoint.
    Queued,
    /// A `Start` event is pending.
    Scheduled,
    /// A torn write: `pieces[..next]` have landed, a `Piece` event is pending for the rest.
    Applying { pieces: Vec<Range<usize>>, next: usize },
    /// The peer is dead; a `Fail` event is pending for when the timeout expires.
    Retrying,
}

/// A posted operation.
#[derive(Debug)]
pub(super) struct Op {
    /// World-unique, so stale events can recognise that their operation is gone.
    pub(super) id: u64,
    pub(super) wr_id: u64,
    pub(super) signaled: bool,
    /// The endpoint's connection epoch at post time; older epochs are flushed.
    pub(super) epoch: u64,
    pub(super) posted_at: u64,
    /// When the operation reaches the target if nothing is ahead of it.
    pub(super) arrival: u64,
    /// No latency either way ([`super::SimConfig::instant_prob`]).
    pub(super) instant: bool,
    pub(super) body: OpBody,
    pub(super) phase: Phase,
}

/// An endpoint (queue pair) as the world sees it.
#[derive(Debug)]
pub(super) struct Ep {
    pub(super) owner: NodeId,
    pub(super) peer: NodeId,
    /// The peer incarnation this endpoint is connected to.
    pub(super) peer_inc: u32,
    /// Bumped by each reconnect that resets the endpoint.
    pub(super) epoch: u64,
    pub(super) state: EndpointState,
    /// The owner crashed: nothing of this endpoint happens any more.
    pub(super) dead: bool,
    /// The handle was dropped: operations still run, completions are discarded.
    pub(super) closed: bool,
    /// Posted operations that have not finished applying, in post order.
    pub(super) queue: VecDeque<Op>,
    /// Posted operations whose completion event has not happened yet.
    pub(super) outstanding: usize,
    /// Completion time of the newest finished operation: later ones never complete earlier, so
    /// completions come in post order.
    pub(super) last_completion_at: u64,
    pub(super) cq: VecDeque<Completion>,
}

/// Something that happens at a simulated time.
#[derive(Debug)]
pub(super) enum Event {
    /// The head operation reaches the target.
    Start { ep: usize, op: u64 },
    /// The next piece of a torn write lands.
    Piece { ep: usize, op: u64 },
    /// An operation to a dead peer gives up.
    Fail { ep: usize, op: u64 },
    /// A completion reaches the initiator (`report`: it goes into the completion queue).
    Complete { ep: usize, completion: Completion, report: bool },
}
