//! Membership changes through the log: which replicas are members (count in quorums, may
//! lead), changed one member at a time by `Membership` entries. docs/ARCHITECTURE.md,
//! "Membership changes", argues the rules; in short:
//!
//! - The ids a cluster can ever use are `0..MuConfig::replicas` (every replica registers
//!   regions sized for them); the **members** are a subset, `MuConfig::members` at start and
//!   then whatever the log's `Membership` entries made them.
//! - The configuration of log index `i` is the one after applying every entry below `i`. An
//!   entry names the configuration it changes (its **epoch**: the number of changes applied
//!   before it) and one member to add or remove; applied to another epoch, or adding a member
//!   or removing a non-member, it changes nothing. So every replica derives the same
//!   configuration for every index from the one log.
//! - A leader's quorums are majorities of the configuration of the index it works on: it
//!   starts a term (permissions, catch-up, prepare) only once it has applied everything below
//!   its FUO, and after committing a `Membership` entry it applies it and starts a new term
//!   under the new configuration before it proposes anything else. Two configurations one
//!   member apart have intersecting majorities, and a leader never uses a configuration more
//!   than one change old for a slot, so Paxos's intersection holds at every index.
//! - A joiner (a non-member id) follows like a recovering replica: the leader writes to it,
//!   brings it up to date and promotes it (`mu::plane::leader::standing`), but no quorum counts it. Adding it
//!   is refused until it is a promoted, confirmed follower: it votes only once caught up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use microrep_fabric::NodeId;

/// Words of a member set: 256 ids.
const WORDS: usize = 4;

/// A set of replica ids (at most 256).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemberSet([u64; WORDS]);

impl MemberSet {
    /// The ids `0..n`.
    pub fn first(n: u16) -> Self {
        (0..n).map(NodeId).collect()
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: NodeId) -> bool {
        let i = usize::from(id.0);
        i < WORDS * 64 && self.0[i / 64] & 1 << (i % 64) != 0
    }

    /// Adds `id` (below 256).
    pub fn insert(&mut self, id: NodeId) {
        let i = usize::from(id.0);
        self.0[i / 64] |= 1 << (i % 64);
    }

    /// Removes `id`.
    pub fn remove(&mut self, id: NodeId) {
        let i = usize::from(id.0);
        if i < WORDS * 64 {
            self.0[i / 64] &= !(1 << (i % 64));
        }
    }

    /// How many ids it holds.
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; WORDS]
    }

    /// Members that form a majority.
    pub fn majority(&self) -> usize {
        self.len() / 2 + 1
    }

    /// The ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..WORDS * 64).filter(|&i| self.0[i / 64] & 1 << (i % 64) != 0).map(|i| NodeId(i as u16))
    }

    /// The highest id plus one (0 for an empty set).
    pub fn end(&self) -> u16 {
        self.iter().last().map_or(0, |id| id.0 + 1)
    }

    /// The set as little-endian words.
    pub fn to_words(self) -> [u64; WORDS] {
        self.0
    }

    /// The set from [`Self::to_words`].
    pub fn from_words(words: [u64; WORDS]) -> Self {
        Self(words)
    }
}

impl FromIterator<NodeId> for MemberSet {
    fn from_iter<I: IntoIterator<Item = NodeId>>(ids: I) -> Self {
        let mut set = Self::default();
        for id in ids {
            set.insert(id);
        }
        set
    }
}

impl std::fmt::Display for MemberSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.iter().map(|id| id.0.to_string()).collect();
        write!(f, "{{{}}}", ids.join(", "))
    }
}

/// One change of the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MembershipChange {
    /// Makes a caught-up follower a member.
    Add(NodeId),
    /// Makes a member leave.
    Remove(NodeId),
}

impl MembershipChange {
    /// The id it adds or removes.
    pub fn node(&self) -> NodeId {
        match *self {
            Self::Add(id) | Self::Remove(id) => id,
        }
    }
}

impl std::fmt::Display for MembershipChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Add(id) => write!(f, "add {id}"),
            Self::Remove(id) => write!(f, "remove {id}"),
        }
    }
}

/// Bytes of a `Membership` entry's payload.
pub(super) const PAYLOAD_BYTES: usize = 16;

/// The payload of a `Membership` entry: the change and the epoch it applies to.
pub(super) fn encode(change: MembershipChange, epoch: u64) -> [u8; PAYLOAD_BYTES] {
    let (op, id) = match change {
        MembershipChange::Add(id) => (1u8, id),
        MembershipChange::Remove(id) => (2u8, id),
    };
    let mut out = [0u8; PAYLOAD_BYTES];
    out[0] = op;
    out[2..4].copy_from_slice(&id.0.to_le_bytes());
    out[8..16].copy_from_slice(&epoch.to_le_bytes());
    out
}

/// Decodes a `Membership` payload: `None` if it is not one [`encode`] writes.
pub(super) fn decode(payload: &[u8]) -> Option<(MembershipChange, u64)> {
    if payload.len() != PAYLOAD_BYTES || payload[1] != 0 || payload[4..8] != [0; 4] {
        return None;
    }
    let id = NodeId(u16::from_le_bytes([payload[2], payload[3]]));
    let epoch = u64::from_le_bytes(payload[8..16].try_into().ok()?);
    let change = match payload[0] {
        1 => MembershipChange::Add(id),
        2 => MembershipChange::Remove(id),
        _ => return None,
    };
    Some((change, epoch))
}

/// The configuration a replica applied: its members and how many changes made them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Configuration {
    /// The members.
    pub members: MemberSet,
    /// Changes applied since the cluster started.
    pub epoch: u64,
}

impl Configuration {
    /// Bytes of [`Self::to_bytes`].
    pub const BYTES: usize = 8 + 8 * WORDS;

    /// The epoch, then the member set's words, little-endian (snapshots and durable logs).
    pub fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..8].copy_from_slice(&self.epoch.to_le_bytes());
        for (i, word) in self.members.to_words().iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The configuration [`Self::to_bytes`] wrote; `None` if `bytes` is not that long or names
    /// no member.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; Self::BYTES] = bytes.try_into().ok()?;
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let members = MemberSet::from_words(std::array::from_fn(|i| word(i + 1)));
        (!members.is_empty()).then_some(Self { members, epoch: word(0) })
    }

    /// Why `change` cannot apply to this configuration in a cluster of `capacity` ids, if it
    /// cannot.
    pub fn refuses(&self, change: MembershipChange, capacity: u16) -> Option<String> {
        let (id, n) = (change.node(), change.node().0);
        match change {
            _ if id.0 >= capacity => Some(format!("replica {n} is not one of the cluster's ids 0..{capacity}")),
            MembershipChange::Add(_) if self.members.contains(id) => Some(format!("replica {n} is already a member")),
            MembershipChange::Remove(_) if !self.members.contains(id) => Some(format!("replica {n} is not a member")),
            MembershipChange::Remove(_) if self.members.len() == 1 => {
                Some(format!("replica {n} is the last member: a cluster needs one"))
            }
            _ => None,
        }
    }

    /// The configuration after applying a `Membership` entry proposed for `epoch`: a change
    /// proposed for another epoch, or one this configuration refuses, changes nothing.
    pub fn apply(&self, change: MembershipChange, epoch: u64, capacity: u16) -> Option<Self> {
        if epoch != self.epoch || self.refuses(change, capacity).is_some() {
            return None;
        }
        let mut members = self.members;
        match change {
            MembershipChange::Add(id) => members.insert(id),
            MembershipChange::Remove(id) => members.remove(id),
        }
        Some(Self { members, epoch: self.epoch + 1 })
    }
}

/// The members, shared by the replication plane (which applies changes) with the background
/// plane (which chooses leaders and serves permissions among them), on another thread in the
/// runtime.
#[derive(Debug, Default)]
pub struct SharedMembers([AtomicU64; WORDS]);

impl SharedMembers {
    /// Shared members, starting as `members`.
    pub fn new(members: MemberSet) -> Arc<Self> {
        let shared = Arc::new(Self::default());
        shared.set(members);
        shared
    }

    /// Publishes `members`.
    pub fn set(&self, members: MemberSet) {
        for (word, value) in self.0.iter().zip(members.to_words()) {
            word.store(value, Ordering::Release);
        }
    }

    /// The members last published (a change is one id, so a reader racing it sees the set
    /// before or after it, or both ids' states from either: never a third member).
    pub fn get(&self) -> MemberSet {
        MemberSet::from_words(std::array::from_fn(|i| self.0[i].load(Ordering::Acquire)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_sets_count_majorities_and_render() {
        let mut set = MemberSet::first(3);
        assert_eq!((set.len(), set.majority(), set.end()), (3, 2, 3));
        set.insert(NodeId(200));
        assert!(set.contains(NodeId(200)) && !set.contains(NodeId(199)));
        assert_eq!(set.majority(), 3);
        set.remove(NodeId(1));
        assert_eq!(set.to_string(), "{0, 2, 200}");
        assert_eq!(MemberSet::from_words(set.to_words()), set);
        assert!(MemberSet::default().is_empty());
    }

    #[test]
    fn payloads_round_trip_and_junk_is_no_change() {
        for change in [MembershipChange::Add(NodeId(7)), MembershipChange::Remove(NodeId(255))] {
            assert_eq!(decode(&encode(change, 42)), Some((change, 42)));
        }
        let mut bad = encode(MembershipChange::Add(NodeId(1)), 0);
        bad[0] = 3;
        assert_eq!(decode(&bad), None);
        assert_eq!(decode(&[1u8; 3]), None);
    }

    #[test]
    fn a_change_applies_only_to_its_epoch_and_only_if_it_makes_sense() {
        let c = Configuration { members: MemberSet::first(3), epoch: 0 };
        let added = c.apply(MembershipChange::Add(NodeId(3)), 0, 5).expect("add 3");
        assert_eq!((added.members.len(), added.epoch), (4, 1));
        assert_eq!(added.apply(MembershipChange::Remove(NodeId(0)), 0, 5), None, "stale epoch");
        assert_eq!(c.apply(MembershipChange::Add(NodeId(1)), 0, 5), None, "already a member");
        assert_eq!(c.apply(MembershipChange::Add(NodeId(5)), 0, 5), None, "outside the ids");
        assert_eq!(c.apply(MembershipChange::Remove(NodeId(4)), 0, 5), None, "not a member");
        let one = Configuration { members: MemberSet::first(1), epoch: 3 };
        assert!(one.refuses(MembershipChange::Remove(NodeId(0)), 5).expect("last").contains("last member"));
    }
}
