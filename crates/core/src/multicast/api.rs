//! The multicast API's values: delivered messages, the delivery upcall, errors and counters.

use microrep_fabric::{FabricError, NodeId};

use super::config::ConfigError;

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
    /// The subgroup's index in [`super::GroupConfig::subgroups`].
    pub subgroup: usize,
    /// The messages, in sequence order (nulls are never delivered).
    pub messages: &'a [Message<'a>],
}

/// The application's delivery upcall: called once per subgroup per poll with everything that
/// became stable (Spindle's batched delivery).
pub trait Deliver {
    /// Takes a batch. Every member calls it with the same messages in the same order.
    fn deliver(&mut self, batch: DeliveryBatch<'_>);
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
    /// A slot below a sender's guard holds a length larger than a slot: the sender wrote it
    /// wrongly, or a write landed out of the fabric's order.
    #[error("subgroup {subgroup}: {sender}'s message {index} claims {len} bytes, more than a slot holds")]
    CorruptSlot {
        /// Subgroup index.
        subgroup: usize,
        /// The sender.
        sender: NodeId,
        /// Stream index of the message.
        index: u64,
        /// The length it claims.
        len: u64,
    },
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
    /// Every slot of the ring holds a message some member has not received yet; poll and
    /// retry (back-pressure).
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
}
