//! Byte layout of the shared state table (SST) region, identical at every member.
//!
//! The region holds one **row** per member of the view, in rank order. Row `r` is written only
//! by `members[r]`: locally, and by one-sided WRITEs into the same offsets of every peer's
//! region, so each member reads every row from its own memory (Derecho's SST). A row is:
//!
//! ```text
//! view block (used with failure detection):
//!   +0                 heartbeat    u64  raised every heartbeat period
//!   +8                 suspected    u64  set of group ranks this member suspects
//!   +16                wedged       u64  1 once this member stopped and pushed its final
//!                                        counters (the guard of those counters); 2 once it
//!                                        installed the next view
//!   +24                join         u64  a node this member asks to add and the subgroups it
//!                                        joins, in one word (`next::JoinRequest`; 0: none)
//!   two copies of the agreement block (`agreement.rs`: the ballots and the value of the
//!   next view), version v in copy v mod 2, each written as guard odd, then the body, then
//!   guard even, so a reader checks it read one version, and a writer that fails mid-write
//!   leaves the other copy readable; copy c at +32 + c × (40 + 8 × trim words):
//!   +0                 guard        u64  2 × version of the block (odd while it is rewritten)
//!   +8                 promised     u64  the highest ballot this member promised
//!   +16                accepted     u64  the ballot of the value it accepted (0: none;
//!                                        u64::MAX: the value is decided)
//!   +24                suspected    u64  the value: the ranks the next view leaves out
//!   +32                join         u64  the value: the join request it adds (0: none)
//!   +40 + 8j           trim[j]      u64  the value: per subgroup, per sender, the ragged edge
//! then, for each subgroup s (every row has every block, in subgroup order):
//!   +0                 sent_num     u64  messages (real and null) this member published as a
//!                                        sender of s; the guard of its ring (see below)
//!   +8 + 8k            received[k]  u64  messages of sender k of s this member has received
//!                                        (a prefix of k's stream), k in 0..senders(s)
//!   +8 + 8·senders     delivered    u64  sequence numbers of s this member has delivered
//! then, for each subgroup s in which this member sends:
//!   window(s) slots of slot_bytes(s) = 16 + max_payload_bytes(s):
//!   +0  tag  u64   stream index + 1 of the message in the slot (0: never written)
//!   +8  len  u32   payload length in bytes
//!   +12 zero u32
//!   +16 payload
//! ```
//!
//! Every field is an aligned 8-byte word or lies inside a slot, so the counters are never
//! torn (the fabric's one placement guarantee). A slot is many words and can be observed half
//! written; `sent_num` is the **guard**: the sender posts it after the slot writes on the same
//! FIFO endpoint, so a receiver that has read `sent_num > i` finds message `i`'s slot complete.
//!
//! With failure detection the group runs view after view, each (an **epoch**) in a fresh SST:
//! the region holds three **areas** of [`area_bytes`] each, and epoch `e` lays its rows out in
//! area `e mod 3` (why three: `next.rs`).

use microrep_fabric::{NodeId, RegionId, RegionSpec, RemoteWrite};

use super::config::GroupConfig;

/// The region every member registers for the SST (peers write rows into it at any time).
pub const SST_REGION: RegionId = RegionId(0);

/// Bytes of the view block's header words (heartbeat, suspected, wedged, join).
pub(crate) const VIEW_HEADER_BYTES: u64 = 32;

/// Bytes of the agreement block's words before its trims (guard, promised, accepted, the
/// value's suspected set and join request).
pub(crate) const AGREEMENT_HEADER_BYTES: u64 = 40;

/// Copies of the agreement block in a row (written in turn).
pub(crate) const AGREEMENT_COPIES: u64 = 2;

/// Offsets of the view block's header words.
pub(crate) mod view_word {
    pub(crate) const HEARTBEAT: u64 = 0;
    pub(crate) const SUSPECTED: u64 = 8;
    pub(crate) const WEDGED: u64 = 16;
    pub(crate) const JOIN: u64 = 24;
}

/// SST areas in the region of a group with failure detection (one per epoch, in turn).
pub(crate) const AREAS: u64 = 3;

/// Bytes of a slot header: tag (8), payload length (4), flags (4: `HELD_UNTIL_DELIVERED`).
pub const SLOT_HEADER_BYTES: u64 = 16;

/// Offsets of one subgroup's fields inside every row, and of its senders' rings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SubgroupLayout {
    /// Offset of the counter block inside a row.
    pub(crate) block_in_row: u64,
    /// Number of senders.
    pub(crate) senders: u64,
    /// Slots per ring.
    pub(crate) window: u64,
    /// Bytes per slot, header included.
    pub(crate) slot_bytes: u64,
    /// For each sender rank, the region offset of its ring (inside its own row).
    pub(crate) ring_at: Vec<u64>,
}

impl SubgroupLayout {
    /// Bytes of the counter block: sent_num, received per sender, delivered.
    pub(crate) fn block_bytes(&self) -> u64 {
        8 * (self.senders + 2)
    }

    /// Region offset of `row`'s counter block.
    pub(crate) fn block_at(&self, layout: &Layout, row: usize) -> u64 {
        layout.row_at[row] + self.block_in_row
    }

    /// Region offset of `row`'s `sent_num`.
    pub(crate) fn sent_at(&self, layout: &Layout, row: usize) -> u64 {
        self.block_at(layout, row)
    }

    /// Region offset of `row`'s `received[sender_rank]`.
    pub(crate) fn received_at(&self, layout: &Layout, row: usize, sender_rank: usize) -> u64 {
        self.block_at(layout, row) + 8 + 8 * sender_rank as u64
    }

    /// Region offset of `row`'s `delivered`.
    pub(crate) fn delivered_at(&self, layout: &Layout, row: usize) -> u64 {
        self.block_at(layout, row) + 8 + 8 * self.senders
    }

    /// Region offset of slot `position` of sender `sender_rank`'s ring.
    pub(crate) fn slot_at(&self, sender_rank: usize, position: u64) -> u64 {
        self.ring_at[sender_rank] + position * self.slot_bytes
    }
}

/// The whole SST layout of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Region offset of each member's row, by rank.
    pub(crate) row_at: Vec<u64>,
    /// Bytes of the view block at the start of every row.
    pub(crate) view_bytes: u64,
    /// Per subgroup: index of its first trim word in the view block's trim area.
    pub(crate) trim_first: Vec<u64>,
    /// Per subgroup.
    pub(crate) subgroups: Vec<SubgroupLayout>,
    /// Bytes of the area the layout uses, from its start.
    len_bytes: u64,
}

impl Layout {
    /// The layout of a (validated) configuration. It depends only on the group, not on `me`,
    /// so every member computes the same offsets.
    pub fn new(config: &GroupConfig) -> Self {
        Self::at(config, 0)
    }

    /// The layout of epoch `epoch` of a group: in its area of the region (area 0 without
    /// failure detection, whose group has one epoch).
    pub(crate) fn of_epoch(config: &GroupConfig, epoch: u64) -> Self {
        Self::at(config, (epoch % AREAS) * area_bytes(config))
    }

    /// The layout with its rows from region offset `base` on.
    fn at(config: &GroupConfig, base: u64) -> Self {
        let trim_words: u64 = config.subgroups.iter().map(|s| s.senders.len() as u64).sum();
        let view_bytes = VIEW_HEADER_BYTES + AGREEMENT_COPIES * (AGREEMENT_HEADER_BYTES + 8 * trim_words);
        let trim_first = config
            .subgroups
            .iter()
            .scan(0, |at, s| {
                let first = *at;
                *at += s.senders.len() as u64;
                Some(first)
            })
            .collect();
        let blocks_bytes: u64 =
            view_bytes + config.subgroups.iter().map(|s| 8 * (s.senders.len() as u64 + 2)).sum::<u64>();
        let mut subgroups = Vec::with_capacity(config.subgroups.len());
        let mut block_in_row = view_bytes;
        for sub in &config.subgroups {
            subgroups.push(SubgroupLayout {
                block_in_row,
                senders: sub.senders.len() as u64,
                window: u64::from(sub.window),
                slot_bytes: SLOT_HEADER_BYTES + u64::from(sub.max_payload_bytes),
                ring_at: vec![0; sub.senders.len()],
            });
            block_in_row += 8 * (sub.senders.len() as u64 + 2);
        }
        let mut row_at = Vec::with_capacity(config.members.len());
        let mut at = base;
        for &member in &config.members {
            row_at.push(at);
            at += blocks_bytes;
            for (sub, sub_layout) in config.subgroups.iter().zip(subgroups.iter_mut()) {
                if let Some(rank) = sub.senders.iter().position(|&s| s == member) {
                    sub_layout.ring_at[rank] = at;
                    at += sub_layout.window * sub_layout.slot_bytes;
                }
            }
        }
        Self { row_at, view_bytes, trim_first, subgroups, len_bytes: (at - base).max(8) }
    }

    /// Region offset of `row`'s view block (heartbeat, suspected, wedged, join).
    pub(crate) fn view_at(&self, row: usize) -> u64 {
        self.row_at[row]
    }

    /// Region offset of copy `copy` of `row`'s agreement block (its guard word first).
    pub(crate) fn agreement_at(&self, row: usize, copy: u64) -> u64 {
        self.row_at[row] + VIEW_HEADER_BYTES + copy * self.agreement_bytes()
    }

    /// Bytes of one copy of the agreement block, guard included.
    pub(crate) fn agreement_bytes(&self) -> u64 {
        (self.view_bytes - VIEW_HEADER_BYTES) / AGREEMENT_COPIES
    }

    /// Offset of the trim word for sender `rank` of `subgroup` inside the agreement block.
    pub(crate) fn trim_in_agreement(&self, subgroup: usize, rank: usize) -> u64 {
        AGREEMENT_HEADER_BYTES + 8 * (self.trim_first[subgroup] + rank as u64)
    }

    /// Bytes of the area this layout uses.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
}

/// Bytes of one SST area: this view's layout without failure detection; with it, the layout
/// of the largest view the group may reach (`max_members` members, each a sender of every
/// subgroup), so that any later view fits.
pub(crate) fn area_bytes(config: &GroupConfig) -> u64 {
    let Some(detection) = config.failure_detection else { return Layout::at(config, 0).len_bytes };
    let all: Vec<NodeId> = (0..detection.max_members.max(config.members.len()))
        .map(|i| NodeId(u16::try_from(i).unwrap_or(u16::MAX)))
        .collect();
    let widest = GroupConfig {
        members: all.clone(),
        subgroups: config
            .subgroups
            .iter()
            .map(|s| super::config::SubgroupConfig { members: all.clone(), senders: all.clone(), ..s.clone() })
            .collect(),
        ..config.clone()
    };
    Layout::at(&widest, 0).len_bytes
}

/// The SST region a member of `config`'s group registers: one area, which every peer may
/// always write, for a static group; three areas for a group with failure detection, writable
/// only by the members of the current view (removed members are revoked: `next.rs`).
pub(crate) fn sst_region(config: &GroupConfig) -> RegionSpec {
    match config.failure_detection {
        None => RegionSpec::new(SST_REGION, area_bytes(config), RemoteWrite::Always),
        Some(_) => RegionSpec::new(SST_REGION, AREAS * area_bytes(config), RemoteWrite::Granted),
    }
}

/// The rank of `node` in `list`.
pub(crate) fn rank_of(list: &[NodeId], node: NodeId) -> Option<usize> {
    list.iter().position(|&n| n == node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multicast::config::{Delivery, SubgroupConfig};

    #[test]
    fn offsets_of_a_two_subgroup_group() {
        let ids = |v: &[u16]| v.iter().map(|&i| NodeId(i)).collect::<Vec<_>>();
        let config = GroupConfig {
            subgroups: vec![
                SubgroupConfig {
                    members: ids(&[0, 1, 2]),
                    senders: ids(&[0, 2]),
                    window: 4,
                    max_payload_bytes: 16,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
                SubgroupConfig {
                    members: ids(&[1, 2]),
                    senders: ids(&[1]),
                    window: 2,
                    max_payload_bytes: 8,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
            ],
            ..GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 1, 8)
        };
        let layout = Layout::new(&config);
        // View block: 32 + 2·(40 + 8·(2+1)) = 160 bytes; counter blocks: subgroup 0 =
        // 8·(2+2) = 32 bytes, subgroup 1 = 8·(1+2) = 24 bytes.
        let blocks = 160 + 56;
        let ring0 = 4 * 32;
        let ring1 = 2 * 24;
        assert_eq!(layout.row_at, vec![0, blocks + ring0, 2 * blocks + ring0 + ring1]);
        let s0 = &layout.subgroups[0];
        assert_eq!(s0.ring_at, vec![blocks, 2 * blocks + ring0 + ring1 + blocks]);
        assert_eq!(layout.subgroups[1].ring_at, vec![blocks + ring0 + blocks]);
        assert_eq!(s0.received_at(&layout, 1, 1), layout.row_at[1] + 160 + 16);
        assert_eq!(layout.subgroups[1].delivered_at(&layout, 2), layout.row_at[2] + 160 + 32 + 16);
        assert_eq!(layout.agreement_at(2, 1) + layout.trim_in_agreement(1, 0), layout.row_at[2] + 96 + 40 + 16);
        assert_eq!(layout.agreement_bytes(), 64);
        assert_eq!(layout.len_bytes(), 3 * blocks + 2 * ring0 + ring1);
        assert!(layout.row_at.iter().chain(&s0.ring_at).all(|at| at % 8 == 0));
    }
}
