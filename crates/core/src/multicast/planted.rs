//! Deliberate protocol mutations ("planted bugs") of the multicast core. They exist to prove
//! that the multicast simulator's checkers can fail: with the `planted-bugs` feature a test
//! turns one on through `GroupConfig::planted_bug` and expects a violation within a
//! documented number of seeds (docs/MULTICAST.md). Without the feature none can be selected
//! and the checks (`GroupConfig::bug`) compile to `false`.
#![cfg_attr(not(feature = "planted-bugs"), allow(dead_code, unreachable_pub))]

/// One deliberate mutation of the multicast protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlantedBug {
    /// A member delivers a message as soon as it has received it itself, not once every member
    /// of the subgroup has (breaks stability, Derecho's delivery predicate).
    DeliverBeforeStable,
    /// A receiver takes a ring slot as complete when its tag word names the next message,
    /// without waiting for the sender's `sent_num` guard, so it may copy a slot whose payload
    /// is still landing (the multi-word row read half written).
    NoGuard,
    /// At a view change, members install the new view without delivering up to the ragged
    /// trim, so messages some member delivered before the failure are missing at others.
    NoRaggedEdge,
    /// Running the next view, senders do not send again their messages the old view did not
    /// deliver: a live sender's messages are lost at a view change.
    NoResend,
    /// A wedged member stops taking in suspicions (its own timeouts and the other rows'), as
    /// members did before the leader-driven agreement: a member that fails while a change is
    /// agreed is never suspected by the leader, which waits for it to wedge forever.
    FrozenSuspicions,
    /// Agreeing on the next view, majorities are counted among the members this member does
    /// not suspect instead of the whole view, so each side of a partition can decide a view.
    MajorityOfTrusted,
    /// An ordered subgroup's sender reuses a ring slot once every member has received its
    /// message instead of delivered it (as when receivers copied messages out at receipt):
    /// a member that delivers later reads in place a slot already overwritten.
    FreeOnReceipt,
}

impl PlantedBug {
    /// Every planted bug.
    pub const ALL: [Self; 7] = [
        Self::DeliverBeforeStable,
        Self::NoGuard,
        Self::NoRaggedEdge,
        Self::NoResend,
        Self::FrozenSuspicions,
        Self::MajorityOfTrusted,
        Self::FreeOnReceipt,
    ];
}
