//! The multicast API's values: delivered messages, the delivery upcall, errors and counters.

use microrep_fabric::{FabricError, NodeId};

use super::config::ConfigError;
use super::view::View;

/// One delivered message. `payload` borrows the member's buffers for the upcall's duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// The sender.
    pub sender: NodeId,
    /// Its position in the subgroup's total order (`index × senders + sender rank`).
    pub seq: u64,
    /// The bytes sent.
    pub payload: &'a [u8],
}

/// Every message of one subgroup that became deliverable in one poll, in order.
#[derive(Clone, Copy, Debug)]
pub struct DeliveryBatch<'a> {
    /// The view (epoch) the messages were sent and delivered in: 0 for the first view.
    pub epoch: u64,
    /// The subgroup's index in [`super::GroupConfig::subgroups`].
    pub subgroup: usize,
    /// The messages, in sequence order (nulls are never delivered).
    pub messages: &'a [Message<'a>],
}

/// The application's delivery upcall: called once per subgroup per poll with everything that
/// became stable (Spindle's batched delivery), and at view changes.
pub trait Deliver {
    /// Takes a batch. Every member calls it with the same messages in the same order.
    fn deliver(&mut self, batch: DeliveryBatch<'_>);

    /// A view was installed: every message of the old view that any member delivers was
    /// delivered before this call (virtual synchrony). A joiner gets it once, after
    /// [`Deliver::restore`].
    fn view_installed(&mut self, _view: &View) {}

    /// Appends the application's state of `subgroup` (what it delivered there so far) for a
    /// joiner; called at the view boundary, right after [`Deliver::view_installed`]. At most
    /// `FailureDetection::state_bytes_max` bytes.
    fn snapshot(&mut self, _subgroup: usize, _out: &mut Vec<u8>) {}

    /// A joiner takes the state of `subgroup` that a member's [`Deliver::snapshot`] made,
    /// before it delivers anything there.
    fn restore(&mut self, _subgroup: usize, _state: &[u8]) {}
}

impl<T: FnMut(DeliveryBatch<'_>)> Deliver for T {
    fn deliver(&mut self, batch: DeliveryBatch<'_>) {
        self(batch);
    }
}

/// A member could not be created or polled.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum MulticastError {
    /// The configuration is invalid.
    #[error("invalid multicast configuration: {0}")]
    Config(#[from] ConfigError),
    /// A local fabric call failed (the member's region is missing or too small, for example).
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// A slot below a sender's guard holds a length larger than a slot, or a flag this
    /// version does not know: the sender wrote it wrongly (or runs another version), or a
    /// write landed out of the fabric's order.
    #[error(
        "subgroup {subgroup}: {sender}'s message {index} has a corrupt header: {len} bytes (a slot holds {max_len}), flags {flags:#x} (known: 0x1)"
    )]
    CorruptSlot {
        /// Subgroup index.
        subgroup: usize,
        /// The sender.
        sender: NodeId,
        /// Stream index of the message.
        index: u64,
        /// The length it claims.
        len: u64,
        /// Its flags word (bit 0: held until delivered).
        flags: u32,
        /// The most a slot holds.
        max_len: u64,
    },
    /// The state transfer to this joiner is malformed (the group's configuration differs from
    /// this member's template, or a section was written wrongly).
    #[error("state transfer: {0}")]
    Transfer(String),
    /// A member refused the join this joiner asked for ([`super::Member::ask_to_join`]).
    #[error("the group refused this join: {0}")]
    JoinRefused(JoinError),
    /// This joiner has no state `waited_ns` after its first poll, the bound it was given
    /// ([`super::Member::join`]): the group did not admit it in time (its request was lost and
    /// it did not ask, or the members it could ask are gone). It stopped; every later poll
    /// returns this error.
    #[error(
        "no state {waited_ns} ns after this joiner started ({asks} requests left with members): the group did not admit it"
    )]
    JoinTimedOut {
        /// Nanoseconds since its first poll.
        waited_ns: u64,
        /// Requests it left in members' mailboxes ([`super::Member::ask_to_join`]).
        asks: u64,
    },
    /// The members of view `epoch` this member does not suspect are no majority of it, and no
    /// agreed next view reached it within `suspect_after_ns`: no next view can be installed with
    /// it (Derecho's rule: a view change needs a majority of the view), and suspicions only
    /// grow, so it would wait for good. It stopped; every later poll returns this error.
    #[error("view {epoch}: this member suspects {suspected:?} of {members:?}, and the rest are no majority: stopped")]
    MajorityLost {
        /// The view it stopped in.
        epoch: u64,
        /// That view's members.
        members: Vec<NodeId>,
        /// The members it suspects.
        suspected: Vec<NodeId>,
    },
    /// The application's snapshot of a subgroup exceeds `state_bytes_max`.
    #[error("the state of subgroup {subgroup} is {len} bytes; state_bytes_max is {max}")]
    StateTooLarge {
        /// Subgroup index.
        subgroup: usize,
        /// Bytes of the snapshot.
        len: usize,
        /// The bound.
        max: u64,
    },
}

/// Why a join cannot be proposed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The group has no failure detection, so its views never change.
    #[error("the group has no failure detection: its view is static")]
    StaticGroup,
    /// This member is not running in a view (changing views, excluded, or joining itself).
    #[error("this member is not running in a view")]
    NotRunning,
    /// Another join is under way (one at a time).
    #[error("{0} is already joining")]
    Pending(NodeId),
    /// The node is a member already.
    #[error("{0} is a member already")]
    AlreadyMember(NodeId),
    /// The view is at `max_members`.
    #[error("the view has max_members ({0}) members")]
    Full(usize),
    /// No such subgroup.
    #[error("there is no subgroup {0}")]
    NoSuchSubgroup(usize),
    /// Only a joiner ([`super::Member::join`]) asks to join.
    #[error("this member is not a joiner")]
    NotAJoiner,
}

/// Why a message cannot be sent now.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No such subgroup.
    #[error("there is no subgroup {0}")]
    NoSuchSubgroup(usize),
    /// This member does not send in the subgroup.
    #[error("this member is not a sender of subgroup {0}")]
    NotASender(usize),
    /// Every slot of the ring holds a message some member has not received yet (not delivered
    /// yet, for a message delivered in place); poll and retry (back-pressure).
    #[error("the ring of subgroup {0} is full")]
    WindowFull(usize),
    /// A member is suspected: the group is changing its view and takes no new messages.
    #[error("subgroup {0} is changing its view")]
    ViewChanging(usize),
    /// The payload is larger than a slot.
    #[error("a payload of {len} bytes exceeds the slot's {max} bytes")]
    TooLong {
        /// Bytes asked for.
        len: usize,
        /// Slot payload size.
        max: usize,
    },
    /// A message handed over whole (`Member::send_owned`) lacks the room for the slot header
    /// in front of its payload.
    #[error("a message of {len} bytes has no room for the {room}-byte slot header in front")]
    NoHeaderRoom {
        /// Bytes handed over.
        len: usize,
        /// Header room needed.
        room: usize,
    },
}

/// Counters of one member, for benchmarks and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Real messages committed by this member.
    pub sent: u64,
    /// Null messages this member added to its streams.
    pub nulls_sent: u64,
    /// Real messages delivered to the upcall.
    pub delivered: u64,
    /// Delivery upcalls made.
    pub batches: u64,
    /// WRITEs posted.
    pub writes: u64,
    /// Bytes in those WRITEs.
    pub write_bytes: u64,
    /// Endpoints reconnected after a failed operation.
    pub reconnects: u64,
    /// Ballots this member started as the leader of a view change (more than one per change
    /// when a leader was replaced or a ballot was overtaken).
    pub ballots: u64,
    /// Proposals this member made as leader that took a value an earlier ballot had accepted
    /// (a new leader finishing its predecessor's change).
    pub adopted: u64,
    /// Members that stay whose write access this member revoked and granted again at an
    /// install, because their `wedged` flag had not arrived (the fresh-SST barrier, `next.rs`).
    pub barriers: u64,
    /// Sections of a joiner's state this member wrote in place of every earlier writer, all of
    /// which it suspected (`transfer.rs`, "Who writes a section").
    pub takeovers: u64,
    /// Join requests this joiner left in a member's mailbox (`Member::ask_to_join`).
    pub join_asks: u64,
}
