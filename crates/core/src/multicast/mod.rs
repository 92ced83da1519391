//! Atomic multicast over a shared state table (Derecho, Jha et al., TOCS 2019) with Spindle's
//! batching and null-sends (Jha et al., "Spindle: Techniques for Optimizing Atomic Multicast
//! on RDMA", 2022). Design and status: docs/MULTICAST.md.
//!
//! A [`Member`] is one member of a group: its SST region ([`Layout`]) holds one row per
//! member, pushed with one-sided WRITEs; each sender of a subgroup owns a ring of `window` slots
//! in its row (SMC); every member delivers the same messages in the same round-robin order, each
//! once every member of the subgroup has received it. With [`FailureDetection`] a failure (or a
//! join, [`Member::propose_join`]) wedges the group, which agrees on the next view through its
//! leader (`agreement.rs`), delivers up to the ragged edge, installs it ([`Phase`], `view.rs`)
//! and runs it on a fresh SST, a joiner getting its state from the members (`next.rs`,
//! `transfer.rs`). The member is sans-IO: its owner calls [`Member::poll`] in a loop (the
//! runtime from a thread with an idle policy, the simulator from its scheduler) and
//! [`Member::reserve`] / [`Member::send`] to send.

mod agreement;
mod api;
mod ask;
mod config;
mod idle;
mod layout;
mod member;
mod next;
mod planted;
mod predicates;
mod smc;
mod transfer;
mod view;

pub use api::{Deliver, DeliveryBatch, JoinError, Message, MulticastError, SendError, Stats};
pub use config::{
    COPY_AT_RECEIPT_BYTES, ConfigError, DETECTION_MEMBERS_MAX, Delivery, FailureDetection, GroupConfig,
    JOIN_SUBGROUPS_MAX, MAX_PAYLOAD_BYTES_MAX, STATE_BYTES_MAX, SubgroupConfig, WINDOW_MAX,
};
pub use layout::{Layout, SLOT_HEADER_BYTES, SST_REGION};
pub use member::{Member, SlotWriter};
#[cfg(feature = "planted-bugs")]
pub use planted::PlantedBug;
pub use transfer::STATE_REGION;
pub use view::{Phase, View};

/// The regions a member of `config`'s group (or a joiner with `config` as its template)
/// registers on its fabric: the SST ([`SST_REGION`]) and, with failure detection, the
/// state-transfer region ([`STATE_REGION`]).
pub fn regions(config: &GroupConfig) -> Vec<microrep_fabric::RegionSpec> {
    let mut specs = vec![layout::sst_region(config)];
    specs.extend(transfer::StateLayout::new(config).map(|s| s.region()));
    specs
}
