//! Where Mu keeps its state in fabric memory (Mu §4, §5). Every replica registers the same
//! four regions:
//!
//! ```text
//! LOG      (remote write only when granted)   0: minProposal  8: FUO  16..64: reserved
//!                                              64 + k * slot_bytes: slot k of the circular log
//! CONTROL  (every peer may write)              0: heartbeat counter (pull-score, §5.1)
//!                                              8: head (next index this replica will apply)
//!                                             16: tail (slots below it may be recycled, §5.3)
//!                                             24: standing (its incarnation once a voter)
//!                                             32: incarnation (drawn at start)
//!                                             40: leading (1 while its log is granted to itself)
//!                                             48: generation (the cluster's, once a voter)
//!                                             56: durable (entries below it are on its disk)
//!                                             64 + 8r: permission request of replica r (§5.2)
//!                                             64 + 8n + 8r: permission ack from replica r
//!                                             64 + 16n + 8r: durable index replica r reports
//!                                                 to this replica while it leads
//!                                             64 + 24n: the index below which the leader
//!                                                 found every entry persisted by a majority
//! SCRATCH  (local only)                        per peer: READ destinations (words, slots)
//! SNAPSHOT (remote read only)                  0: the latest snapshot (§5.4 state transfer)
//!                                              snapshot_bytes: the inbox, where READs of a
//!                                              peer's snapshot land (never read by peers)
//! ```
//!
//! All words are little-endian u64 at 8-byte aligned offsets.

use microrep_fabric::{Fabric, NodeId, RegionId, RegionSpec, RemoteWrite};

use super::MuConfig;

/// The replicated log.
pub const LOG: RegionId = RegionId(0);
/// Heartbeats, heads, permission requests and acks.
pub const CONTROL: RegionId = RegionId(1);
/// Local destinations of READs.
pub const SCRATCH: RegionId = RegionId(2);
/// The published snapshot.
pub const SNAPSHOT: RegionId = RegionId(3);

/// LOG: the highest proposal number this replica promised (Paxos minProposal).
pub const MIN_PROPOSAL: u64 = 0;
/// LOG: first undecided offset: every entry below it is committed.
pub const FUO: u64 = 8;
/// LOG: where slot 0 starts.
pub const SLOTS_START: u64 = 64;

/// CONTROL: heartbeat counter.
pub const HEARTBEAT: u64 = 0;
/// CONTROL: next index this replica will apply.
pub const HEAD: u64 = 8;
/// CONTROL: this replica's recycling point.
pub const TAIL: u64 = 16;
/// CONTROL: equal to [`INCARNATION`] once this replica may count in quorums (see `standing`);
/// anything else while it recovers from a start with fresh memory.
pub const STANDING: u64 = 24;
/// CONTROL: this run's incarnation, drawn at start, never 0 (right after STANDING, so one READ
/// fetches both).
pub const INCARNATION: u64 = 32;
/// CONTROL: bit 0 set while this replica leads or tries to (its own log is granted to itself),
/// and from bit 2 up the proposal number of the term it leads (0 while acquiring):
/// the failure detector prefers a live leader over a lower id (`MuConfig::sticky_leader`). Right
/// after INCARNATION, so the heartbeat READ of STANDING fetches all three.
pub const LEADING: u64 = 40;
/// A bit of the [`LEADING`] word: this replica abstains from leading (its application cannot
/// serve for now, e.g. a wrapped server's copy being rebuilt); peers do not choose it.
pub const LEADING_ABSTAINS: u64 = 2;
/// CONTROL: the cluster generation this replica belongs to, 0 for none: drawn by the replica
/// that bootstraps the cluster, written into every member it makes a voter and into every
/// replica a leader promotes (before its `STANDING`); at start, the generation the replica
/// remembers from an earlier run (`MuConfig::generation`). See `mu::plane::bootstrap`.
pub const GENERATION: u64 = 48;
/// CONTROL: with a durable log (`MuConfig::durable`), the index below which every entry this
/// replica applied is on its disk, as its runtime reported it (`ReplicationPlane::set_durable`);
/// at start, what it restored from its disk. Read by the bootstrap round of a cluster all of
/// whose members restarted (see `mu::plane::bootstrap`). Right after GENERATION, so that READ fetches
/// both.
pub const DURABLE: u64 = 56;
/// A permission ack with this bit set comes from a replica that is recovering: it grants the
/// permission but must not be counted toward a majority.
pub const ACK_RECOVERING: u64 = 1 << 63;
/// Bits of a permission request number below the part that tells a replica's runs apart.
const REQUEST_RUN_SHIFT: u32 = 40;

/// The number before a replica's first permission request in the run `incarnation`; each
/// request takes the next. Permission managers serve each request number once (a stale request
/// must never revoke a live leader again), and the memory of what they served outlives the
/// requester: a replica restarted under the same id that counted from 0 again asked with the
/// numbers its previous run had used, and each was ignored (or acked again without a grant, so
/// that its first write found no permission) until a timeout or the lost permission made it
/// ask with the next. So the 23 bits above the low 40 come from the incarnation (folded, so
/// the simulator's incarnations, which differ in their middle bits, differ here too); 2^40
/// requests outlast any run, and bit 63 stays free for [`ACK_RECOVERING`].
pub fn first_request(incarnation: u64) -> u64 {
    let run = (incarnation ^ incarnation >> 23 ^ incarnation >> 46) & ((1 << 23) - 1);
    run << REQUEST_RUN_SHIFT
}
const PERMISSIONS_START: u64 = 64;

/// SCRATCH word slots per peer.
pub const SCRATCH_HEARTBEAT: u64 = 0;
/// SCRATCH: a peer's head.
pub const SCRATCH_HEAD: u64 = 8;
/// SCRATCH: a peer's minProposal.
pub const SCRATCH_MIN_PROPOSAL: u64 = 16;
/// SCRATCH: a peer's FUO.
pub const SCRATCH_FUO: u64 = 24;
/// SCRATCH: a peer's tail.
pub const SCRATCH_TAIL: u64 = 32;
/// SCRATCH: a peer's standing, incarnation and leading word (24 bytes, one READ of CONTROL
/// 24..48), read by the background plane with every heartbeat.
pub const SCRATCH_STANDING: u64 = 40;
/// SCRATCH: a peer's incarnation, as the background plane read it.
pub const SCRATCH_STANDING_INCARNATION: u64 = 48;
/// SCRATCH: a peer's leading word, as the background plane read it.
pub const SCRATCH_LEADING: u64 = 56;
/// SCRATCH: a peer's incarnation, as the replication plane read it when bringing the peer up
/// to date (a word of its own: the planes run on different threads).
pub const SCRATCH_INCARNATION: u64 = 64;
/// SCRATCH: a peer's standing, incarnation, leading, generation and durable words (40 bytes,
/// one READ of CONTROL 24..64), as the replication plane's bootstrap round read them.
pub const SCRATCH_BOOT_STANDING: u64 = 72;
/// SCRATCH: a peer's incarnation, as the bootstrap round read it.
pub const SCRATCH_BOOT_INCARNATION: u64 = 80;
/// SCRATCH: a peer's generation, as the bootstrap round read it.
pub const SCRATCH_BOOT_GENERATION: u64 = 96;
/// SCRATCH: a peer's durable index, as the bootstrap round read it.
pub const SCRATCH_BOOT_DURABLE: u64 = 104;
/// SCRATCH: a peer's log slots (up to [`CATCH_UP_BATCH`] of them).
pub const SCRATCH_SLOT: u64 = 112;
/// Slots a catch-up READ fetches at once.
pub const CATCH_UP_BATCH: u64 = 8;

/// Stores `value` in this replica's own `region` at `offset`. A store to a replica's own memory
/// fails only on a layout bug (an offset outside the region): debug builds stop there, release
/// builds log it, rather than drop a protocol word silently.
pub fn store_own<F: Fabric>(fabric: &F, region: RegionId, offset: u64, value: u64) {
    let stored = fabric.store_u64(region, offset, value);
    debug_assert!(stored.is_ok(), "store to own {region} at {offset}: {stored:?}");
    if let Err(error) = stored {
        tracing::error!(%region, offset, %error, "a store to this replica's own memory failed");
    }
}

/// Byte offsets computed from a configuration.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    slot_bytes: u64,
    log_slots: u64,
    replicas: u64,
    snapshot_bytes: u64,
}

impl Layout {
    /// The layout of `config`.
    pub fn new(config: &MuConfig) -> Self {
        Self {
            slot_bytes: u64::from(config.slot_bytes),
            log_slots: u64::from(config.log_slots),
            replicas: u64::from(config.replicas),
            snapshot_bytes: u64::from(config.snapshot_bytes),
        }
    }

    /// The regions a replica registers.
    pub fn regions(&self) -> [RegionSpec; 4] {
        [
            RegionSpec::new(LOG, SLOTS_START + self.slot_bytes * self.log_slots, RemoteWrite::Granted),
            RegionSpec::new(CONTROL, PERMISSIONS_START + 24 * self.replicas + 8, RemoteWrite::Always),
            RegionSpec::new(SCRATCH, self.scratch_stride() * self.replicas, RemoteWrite::Never),
            RegionSpec::new(SNAPSHOT, 2 * self.snapshot_bytes, RemoteWrite::Never),
        ]
    }

    /// Offset in LOG of the slot holding log index `index` (the log is circular).
    pub fn slot_offset(&self, index: u64) -> u64 {
        SLOTS_START + (index % self.log_slots) * self.slot_bytes
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Slots in the log.
    pub fn log_slots(&self) -> u64 {
        self.log_slots
    }

    /// Offset in CONTROL of the permission request written by `requester`.
    pub fn request_offset(&self, requester: NodeId) -> u64 {
        PERMISSIONS_START + 8 * u64::from(requester.0)
    }

    /// Offset in CONTROL of the ack written by `granter`.
    pub fn ack_offset(&self, granter: NodeId) -> u64 {
        PERMISSIONS_START + 8 * self.replicas + 8 * u64::from(granter.0)
    }

    /// Offset in CONTROL of the durable index `reporter` last reported to this replica (a
    /// follower pushes it to the leader it follows, see `mu::plane::durable`).
    pub fn durable_offset(&self, reporter: NodeId) -> u64 {
        PERMISSIONS_START + 16 * self.replicas + 8 * u64::from(reporter.0)
    }

    /// Offset in CONTROL of the index below which a leader found every entry persisted by a
    /// majority of the members (it pushes it to its followers, see `mu::plane::durable`).
    pub fn persisted_by_majority(&self) -> u64 {
        PERMISSIONS_START + 24 * self.replicas
    }

    fn scratch_stride(&self) -> u64 {
        SCRATCH_SLOT + self.slot_bytes * CATCH_UP_BATCH
    }

    /// Offset in SCRATCH of `field` (a `SCRATCH_*` constant) for `peer`.
    pub fn scratch(&self, peer: NodeId, field: u64) -> u64 {
        self.scratch_stride() * u64::from(peer.0) + field
    }

    /// Bytes of a snapshot: the published one, and the inbox.
    pub fn snapshot_bytes(&self) -> u64 {
        self.snapshot_bytes
    }

    /// Offset in SNAPSHOT of the inbox: READs of a peer's snapshot land there, never over the
    /// published one (a late READ from an earlier fetch would otherwise replace this replica's
    /// snapshot with an older one, and a follower it left behind could restore nothing).
    pub fn snapshot_inbox(&self) -> u64 {
        self.snapshot_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_inside_their_regions() {
        let config = MuConfig { log_slots: 8, slot_bytes: 128, ..MuConfig::new(NodeId(0), 5) };
        let l = Layout::new(&config);
        let [log, control, scratch, _] = l.regions();
        assert_eq!(l.slot_offset(0), SLOTS_START);
        assert_eq!(l.slot_offset(8), SLOTS_START, "index 8 reuses slot 0");
        assert!(l.slot_offset(7) + l.slot_bytes() <= log.len_bytes);
        assert!(l.ack_offset(NodeId(4)) + 8 <= control.len_bytes);
        assert!(l.request_offset(NodeId(4)) < l.ack_offset(NodeId(0)));
        assert!(l.ack_offset(NodeId(4)) < l.durable_offset(NodeId(0)));
        assert!(l.durable_offset(NodeId(4)) < l.persisted_by_majority());
        assert!(l.persisted_by_majority() + 8 <= control.len_bytes);
        assert!(l.scratch(NodeId(4), SCRATCH_SLOT) + CATCH_UP_BATCH * l.slot_bytes() <= scratch.len_bytes);
    }

    #[test]
    fn each_run_of_a_replica_numbers_its_permission_requests_apart() {
        // The simulator's incarnations: the node id plus 1, and a restart count from bit 16 up.
        let runs: Vec<u64> = (0..5_000u64).map(|k| 3 | k << 16).collect();
        let firsts: std::collections::BTreeSet<u64> = runs.iter().map(|&r| first_request(r)).collect();
        assert_eq!(firsts.len(), runs.len(), "every run starts elsewhere");
        for &first in &firsts {
            let last = first + (1 << REQUEST_RUN_SHIFT) - 1;
            assert_eq!(last & ACK_RECOVERING, 0, "2^40 requests leave the recovering flag free");
            assert!(firsts.range(first + 1..=last).next().is_none(), "runs do not overlap");
        }
        assert_eq!(first_request(u64::MAX) & ACK_RECOVERING, 0);
    }
}
