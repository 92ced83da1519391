//! [`GroupConfig`]: who is in the group, its subgroups, and their ring sizes.

use microrep_fabric::NodeId;

use super::planted::PlantedBug;

/// Largest payload of one message, in bytes (a slot is this plus its 16-byte header).
pub const MAX_PAYLOAD_BYTES_MAX: u32 = 1 << 20;
/// Largest ring, in slots.
pub const WINDOW_MAX: u32 = 1 << 16;

/// One subgroup: its members, the members that may send, and its ring geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubgroupConfig {
    /// Members, each also in [`GroupConfig::members`]. Every member must receive a message
    /// before any member delivers it (stability).
    pub members: Vec<NodeId>,
    /// Members that send, in rank order: sender `rank` owns the sequence numbers
    /// `index × senders + rank`. Members not listed only receive.
    pub senders: Vec<NodeId>,
    /// Slots in each sender's ring: how many of its messages may be in flight (not yet received
    /// by every member).
    pub window: u32,
    /// Largest payload of one message in bytes; a multiple of 8.
    pub max_payload_bytes: u32,
    /// Whether members deliver in one total order once a message is stable, or at receipt.
    pub delivery: Delivery,
    /// This member's messages of at most this many payload bytes are copied out of its ring
    /// at receipt, and their slot is reused once every member has received them; longer ones
    /// are delivered where they landed, and their slot is reused once every member has
    /// delivered them (docs/MULTICAST.md, "Delivery in place"). 0 delivers every message in
    /// place; at least `max_payload_bytes` copies every one. Each message's header carries its
    /// sender's choice, so members may use different values (a receiver's own only sizes its
    /// inbox). [`COPY_AT_RECEIPT_BYTES`] by default. On a fabric that cannot
    /// lend its memory (`Fabric::lends_local_bytes`: tcp) every message is copied at receipt,
    /// whatever this says.
    pub copy_at_receipt_bytes: u32,
}

/// [`SubgroupConfig::copy_at_receipt_bytes`] by default: below it a copy costs less than the
/// slot held until every member has delivered (docs/BENCHMARKS.md, "Multicast delivered in
/// place").
pub const COPY_AT_RECEIPT_BYTES: u32 = 1024;

/// How a subgroup delivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// Atomic multicast: every member delivers the same messages in the same (round-robin)
    /// order, each once every member has received it; view changes keep virtual synchrony.
    #[default]
    Ordered,
    /// At receipt, in each sender's order, with no order across senders and no wait for the
    /// other members (Derecho's unordered mode): at most once, and at a view change a message
    /// may have been delivered by some members and not others.
    Unordered,
}

/// Failure detection by heartbeats in the SST, which turns a failure (or a join) into a view
/// change; with it the group runs view after view (docs/MULTICAST.md, "Running the next view").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureDetection {
    /// How often a member raises its heartbeat counter, in nanoseconds.
    pub heartbeat_period_ns: u64,
    /// A member whose heartbeat has not changed for this long is suspected, in nanoseconds.
    pub suspect_after_ns: u64,
    /// Most members any view may have: joins beyond it are refused. It sizes the SST areas, so
    /// every member (and every joiner) must use the same value.
    pub max_members: usize,
    /// Largest application state of one subgroup handed to a joiner, in bytes (a multiple of
    /// 8); it sizes the state-transfer region.
    pub state_bytes_max: u64,
}

impl FailureDetection {
    /// Detection with room for `max_members` members and `state_bytes_max` bytes of state per
    /// subgroup.
    pub fn new(heartbeat_period_ns: u64, suspect_after_ns: u64, max_members: usize, state_bytes_max: u64) -> Self {
        Self { heartbeat_period_ns, suspect_after_ns, max_members, state_bytes_max }
    }
}

/// Most members of a group with failure detection (suspicions are a 64-bit set).
pub const DETECTION_MEMBERS_MAX: usize = 64;
/// Largest state of one subgroup transferred to a joiner.
pub const STATE_BYTES_MAX: u64 = 1 << 24;
/// Most subgroups of a group with failure detection (a join request names the subgroups a
/// joiner enters as a set in one 64-bit word, next to its node id).
pub const JOIN_SUBGROUPS_MAX: usize = 47;

/// A view of a multicast group and the node this configuration is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// This node.
    pub me: NodeId,
    /// Every member of the view, in rank order; row `r` of the SST belongs to `members[r]`.
    pub members: Vec<NodeId>,
    /// The subgroups; a member may be in several, and in none.
    pub subgroups: Vec<SubgroupConfig>,
    /// Failure detection; `None` keeps the view static (a crashed member stalls delivery).
    pub failure_detection: Option<FailureDetection>,
    /// A deliberate protocol mutation (tests that prove the simulator's checkers can fail).
    #[cfg(feature = "planted-bugs")]
    pub planted_bug: Option<PlantedBug>,
}

/// Why a [`GroupConfig`] cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The group has no members.
    #[error("the group has no members")]
    NoMembers,
    /// A node is listed twice where each may appear once.
    #[error("{node} is listed twice in {place}")]
    Duplicate {
        /// The node.
        node: NodeId,
        /// Which list.
        place: &'static str,
    },
    /// `me` is not a member of the group.
    #[error("{0} is not a member of the group")]
    NotAMember(NodeId),
    /// A subgroup names a node outside the group, or a sender outside the subgroup.
    #[error("subgroup {subgroup}: {node} is not in {outside}")]
    Outside {
        /// Subgroup index.
        subgroup: usize,
        /// The node.
        node: NodeId,
        /// The list it is missing from.
        outside: &'static str,
    },
    /// Failure detection is configured out of bounds.
    #[error("failure detection: {0}")]
    Detection(&'static str),
    /// A subgroup without members or senders, or with a ring geometry out of bounds.
    #[error("subgroup {subgroup}: {problem}")]
    Subgroup {
        /// Subgroup index.
        subgroup: usize,
        /// What is wrong.
        problem: &'static str,
    },
}

impl GroupConfig {
    /// A group of `members` with one subgroup in which everyone sends.
    pub fn single(me: NodeId, members: Vec<NodeId>, window: u32, max_payload_bytes: u32) -> Self {
        let subgroup = SubgroupConfig {
            members: members.clone(),
            senders: members.clone(),
            window,
            max_payload_bytes,
            delivery: Delivery::Ordered,
            copy_at_receipt_bytes: COPY_AT_RECEIPT_BYTES,
        };
        Self {
            me,
            members,
            subgroups: vec![subgroup],
            failure_detection: None,
            #[cfg(feature = "planted-bugs")]
            planted_bug: None,
        }
    }

    /// Checks the configuration; [`super::Member::new`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check(false)
    }

    /// [`GroupConfig::validate`], except that a later view may have subgroups whose members or
    /// senders all left (they stay, empty, so that subgroup indices keep their meaning).
    pub(crate) fn validate_view(&self) -> Result<(), ConfigError> {
        self.check(true)
    }

    fn check(&self, later_view: bool) -> Result<(), ConfigError> {
        if self.members.is_empty() {
            return Err(ConfigError::NoMembers);
        }
        no_duplicates(&self.members, "the group's members")?;
        if !self.members.contains(&self.me) {
            return Err(ConfigError::NotAMember(self.me));
        }
        if let Some(d) = self.failure_detection {
            if d.max_members > DETECTION_MEMBERS_MAX {
                return Err(ConfigError::Detection("max_members is at most 64"));
            }
            if self.members.len() > d.max_members {
                return Err(ConfigError::Detection("the view has more members than max_members"));
            }
            if d.heartbeat_period_ns == 0 || d.suspect_after_ns <= d.heartbeat_period_ns {
                return Err(ConfigError::Detection("suspect_after_ns must exceed a positive heartbeat_period_ns"));
            }
            if d.state_bytes_max % 8 != 0 || d.state_bytes_max > STATE_BYTES_MAX {
                return Err(ConfigError::Detection("state_bytes_max must be a multiple of 8, at most 16 MiB"));
            }
            if self.subgroups.len() > JOIN_SUBGROUPS_MAX {
                return Err(ConfigError::Detection("at most 47 subgroups"));
            }
        }
        for (index, sub) in self.subgroups.iter().enumerate() {
            let problem = |problem| ConfigError::Subgroup { subgroup: index, problem };
            if sub.members.is_empty() && !later_view {
                return Err(problem("it has no members"));
            }
            if sub.senders.is_empty() && !later_view {
                return Err(problem("it has no senders"));
            }
            if sub.window == 0 || sub.window > WINDOW_MAX {
                return Err(problem("window must be in 1..=65536"));
            }
            if sub.max_payload_bytes == 0
                || sub.max_payload_bytes % 8 != 0
                || sub.max_payload_bytes > MAX_PAYLOAD_BYTES_MAX
            {
                return Err(problem("max_payload_bytes must be a positive multiple of 8, at most 1 MiB"));
            }
            no_duplicates(&sub.members, "a subgroup's members")?;
            no_duplicates(&sub.senders, "a subgroup's senders")?;
            for &node in &sub.members {
                if !self.members.contains(&node) {
                    return Err(ConfigError::Outside { subgroup: index, node, outside: "the group" });
                }
            }
            for &node in &sub.senders {
                if !sub.members.contains(&node) {
                    return Err(ConfigError::Outside { subgroup: index, node, outside: "the subgroup's members" });
                }
            }
        }
        Ok(())
    }

    /// Whether the planted bug `bug` is switched on.
    #[cfg(feature = "planted-bugs")]
    pub(crate) fn bug(&self, bug: PlantedBug) -> bool {
        self.planted_bug == Some(bug)
    }

    /// Without the `planted-bugs` feature no bug is ever active.
    #[cfg(not(feature = "planted-bugs"))]
    #[inline(always)]
    pub(crate) fn bug(&self, _bug: PlantedBug) -> bool {
        false
    }
}

fn no_duplicates(nodes: &[NodeId], place: &'static str) -> Result<(), ConfigError> {
    for (i, node) in nodes.iter().enumerate() {
        if nodes[..i].contains(node) {
            return Err(ConfigError::Duplicate { node: *node, place });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u16]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn a_single_subgroup_group_is_valid() {
        assert_eq!(GroupConfig::single(NodeId(1), ids(&[0, 1, 2]), 8, 64).validate(), Ok(()));
    }

    #[test]
    fn rejects_members_senders_and_geometry_out_of_bounds() {
        let base = GroupConfig::single(NodeId(0), ids(&[0, 1]), 8, 64);
        let mut c = base.clone();
        c.me = NodeId(5);
        assert_eq!(c.validate(), Err(ConfigError::NotAMember(NodeId(5))));
        let mut c = base.clone();
        c.subgroups[0].senders = ids(&[0, 3]);
        assert!(matches!(c.validate(), Err(ConfigError::Outside { node: NodeId(3), .. })));
        let mut c = base.clone();
        c.subgroups[0].max_payload_bytes = 12;
        assert!(matches!(c.validate(), Err(ConfigError::Subgroup { .. })));
        let mut c = base.clone();
        c.subgroups[0].window = 0;
        assert!(matches!(c.validate(), Err(ConfigError::Subgroup { .. })));
        let mut c = base;
        c.members = ids(&[0, 1, 0]);
        assert!(matches!(c.validate(), Err(ConfigError::Duplicate { .. })));
    }
}
