//! Deliberate protocol mutations ("planted bugs"), each a rule of the paper broken on purpose.
//! They exist to prove that the simulator's checkers can fail: with the `planted-bugs` feature a
//! test turns one on through `MuConfig::planted_bug` and expects a violation within a
//! documented number of seeds. Without the feature none can be selected and the checks
//! (`MuConfig::bug`) compile to `false`.
#![cfg_attr(not(feature = "planted-bugs"), allow(dead_code, unreachable_pub))]

/// One deliberate protocol mutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlantedBug {
    /// The permission manager grants without revoking the previous holder (breaks §5.2).
    SkipRevoke,
    /// Replicas judge a slot complete by its trailing canary byte, ignoring the checksum (the
    /// last-byte polling that relaxed-ordering NICs break), when applying, preparing and
    /// catching up.
    TrustCanaryOnly,
    /// Followers apply the newest entry at once instead of all but the newest (breaks commit
    /// piggybacking, A.4.3).
    CommitNewest,
    /// The leader counts an entry committed after its own local write, before a majority acked
    /// (breaks §4.1's majority wait).
    AckBeforeMajority,
    /// The leader tells followers an entry is decided (writes their FUO past it) right after
    /// posting it, before a majority acked it.
    FuoBeforeMajority,
    /// The prepare phase ignores values found in slots and proposes its own (breaks Paxos value
    /// adoption, §4.1 Listing 2).
    IgnorePreparedValues,
    /// The prepare phase skips reading minProposals and every leader reuses one fixed proposal
    /// number (ballots are no longer unique and rising).
    SkipMinProposalRead,
    /// The failure detector has no hysteresis: a peer recovers as soon as its score rises
    /// (breaks §5.1's recovery threshold). A liveness and stability bug, not a safety one: the
    /// safety checkers rightly stay silent (see docs/SIMULATION.md).
    NoScoreHysteresis,
    /// A follower that joins the confirmed set mid-term does not make the leader prepare again,
    /// and a joiner ahead is not caught up from (breaks A.4.4, A.4.5(b): the safety review's
    /// hole 2).
    GrowWithoutPrepare,
    /// A recovering follower is promoted once an entry after its catch-up FUO commits, before
    /// the term's prepare walk ends (the safety review's hole 3).
    PromoteAtCatchUp,
    /// With a durable log, the leader applies (and acknowledges) entries as soon as it handed
    /// them to its own log, before a majority of the members persisted them (breaks Raft's
    /// order, §5.3 with persistent logs; see `mu::plane::durable`). Only whole-cluster kills reveal
    /// it.
    AckBeforeDurable,
    /// Every follower that acked counts toward the members' majority, joiners that are not
    /// members yet and are still catching up included (breaks "a joiner votes only once caught
    /// up and added", `mu::membership`).
    JoinerVotesEarly,
    /// A leader keeps counting majorities of the configuration it started its term under,
    /// across the membership changes it commits, instead of starting a new term under each
    /// new configuration (`mu::membership`). Two changes later its majorities and those of a
    /// leader under the new configuration can be disjoint (three members, then five).
    KeepTermAcrossChange,
}

impl PlantedBug {
    /// Every planted bug.
    pub const ALL: [Self; 13] = [
        Self::SkipRevoke,
        Self::TrustCanaryOnly,
        Self::CommitNewest,
        Self::AckBeforeMajority,
        Self::FuoBeforeMajority,
        Self::IgnorePreparedValues,
        Self::SkipMinProposalRead,
        Self::NoScoreHysteresis,
        Self::GrowWithoutPrepare,
        Self::PromoteAtCatchUp,
        Self::AckBeforeDurable,
        Self::JoinerVotesEarly,
        Self::KeepTermAcrossChange,
    ];
}
