//! Durability (`MuConfig::durable`): what the core knows of the replicas' disks, and the
//! acknowledgement rule that depends on it.
//!
//! The core never touches a file. The runtime appends every committed entry the core hands it
//! before applying it (and every
//! snapshot it takes or restores, as a checkpoint) to a local log with group commit, and tells
//! the core how far that log is synced with [`ReplicationPlane::set_durable`], an input like
//! `now`; the simulator drives the same code with a modelled disk.
//!
//! - **Publication.** Each replica keeps its durable index in its CONTROL `DURABLE` word, read
//!   by the bootstrap round of a cluster all of whose members restarted (`mu::plane::bootstrap`), and
//!   a follower *pushes* it into the CONTROL region of the leader it follows (one unsignaled
//!   WRITE whenever it grows, and again every lag-check period in case one was lost), so that
//!   the leader learns it without a READ round on the commit path.
//! - **Persist, then apply.** Every replica hands each committed entry to its log
//!   (`StateMachine::persist`), in index order, and applies an entry only once a majority of
//!   the members (itself among them or not, but having handed it over itself) have it on disk:
//!   Raft's order (an entry a state machine applied is on a majority of disks, Raft §5.3 with
//!   persistent logs). Mu's one-sided accept has no follower CPU to persist before acking, so
//!   persistence trails the in-memory commit (Mu §4) and the apply trails persistence. The
//!   leader learns each follower's durable index from its pushes, computes the index below
//!   which a majority persisted, keeps it in its CONTROL word and pushes it to its followers.
//!   The leader acknowledges a request when it applies it, so an acknowledgement too waits for
//!   a majority of disks. Entries applied before a crash are therefore never undone by a
//!   restart from disk (an earlier design applied first and persisted after, and the fault
//!   harness's whole-cluster kills showed an applied entry undone).
//! - **What a durable index means.** A replica's durable log holds committed entries in index
//!   order after a checkpoint: a contiguous prefix of the one committed log. So the durable
//!   prefixes of all replicas are prefixes of one another, and the longest of them holds every
//!   entry durable anywhere, every applied one included, once every member is back
//!   (`mu::plane::bootstrap`). A recovering follower's disk counts like a voter's: what it persisted
//!   is committed whatever its standing. A replica that is no member of an entry's
//!   configuration (a spare, a removed member) persists it only below the index a majority of
//!   the members persisted: its disk never holds a committed entry that no member's disk holds,
//!   which a whole-cluster restart, reading the members only, could fill otherwise. Membership
//!   entries and checkpoints are persisted with their configurations
//!   (`StateMachine::persist_membership`, `StateMachine::checkpoint`).
//! - **Restart.** A runtime that restored its application from its log starts the plane with
//!   [`ReplicationPlane::restore_durable`], as if it had restored a snapshot taken there: its
//!   log region holds nothing below that index, and a lagging peer restores its snapshot.

use microrep_fabric::{Endpoint, Fabric, NodeId, RemoteAddr};

use super::ReplicationPlane;
use crate::mu::api::StateMachine;
use crate::mu::layout;
use crate::mu::membership::{self, Configuration};
use crate::mu::planted::PlantedBug;
use crate::mu::slot::{self, EntryKind};

/// Entries handed to the log per poll at most, so one poll stays short.
const PERSIST_PER_POLL: usize = 256;

/// What the durability rules keep in a replication plane.
#[derive(Debug, Default)]
pub(super) struct Durability {
    /// Entries below this index are on this replica's disk (the runtime's input).
    index: u64,
    /// The next committed entry to hand to the log (`StateMachine::persist`); at least
    /// `applied`.
    pub(super) persisted: u64,
    /// The configuration of index `persisted` while it is ahead of `applied` (the
    /// `Membership` entries handed to the log but not applied yet changed it).
    configuration: Configuration,
    /// The value last stored in the CONTROL `DURABLE` word.
    published: u64,
    /// The leader last pushed to, and the value pushed.
    pushed: Option<(NodeId, u64)>,
    /// When the next push is due even if nothing changed (a WRITE may have been lost).
    next_push_ns: u64,
    /// As leader: the index below which a majority persisted, as last pushed to the followers.
    majority_pushed: u64,
    /// When the next push of it is due even if it did not grow.
    next_majority_push_ns: u64,
}

impl<E: Endpoint> ReplicationPlane<E> {
    /// The runtime's input: every entry below `index` that this replica handed to its log is
    /// on its disk. Never goes down.
    pub fn set_durable(&mut self, index: u64) {
        debug_assert!(index >= self.durability.index, "durable index went down: {} -> {index}", self.durability.index);
        self.durability.index = self.durability.index.max(index);
    }

    /// The index below which this replica's entries are on its disk, as last reported.
    pub fn durable(&self) -> u64 {
        self.durability.index
    }

    /// Before the first poll: the runtime restored the application `app` from its durable log
    /// up to `index` (everything below applied), and `configuration` is the one its log holds
    /// as of `index` (the initial one if it holds no change). The plane starts as if it had restored a
    /// snapshot taken there: applied, FUO and recycling point at `index`, the snapshot
    /// published, and `index` durable. Its log region holds nothing below `index`, so a peer
    /// that needs those entries restores its snapshot (Mu §5.4).
    pub fn restore_durable<F: Fabric<Endpoint = E>, S: StateMachine>(
        &mut self,
        fabric: &F,
        app: &S,
        index: u64,
        configuration: Configuration,
    ) {
        assert!(!self.term.leading(), "restore_durable is for a plane that has not run yet");
        self.set_configuration(configuration);
        self.durability.index = index;
        self.durability.persisted = index;
        if index == 0 {
            return;
        }
        self.replay.restored_durable(index);
        self.term.decided_below(index);
        self.publish_snapshot(fabric, app);
        self.raise_tail(fabric, index);
        layout::store_own(fabric, layout::CONTROL, layout::HEAD, index);
        layout::store_own(fabric, layout::LOG, layout::FUO, index);
    }

    /// A snapshot restored at `index`: the log starts again from it.
    pub(super) fn persisted_through_snapshot(&mut self, index: u64) {
        self.durability.persisted = self.durability.persisted.max(index);
    }

    /// Stores the durable index in CONTROL before the incarnation is first published (see
    /// `refresh_standing`): a peer that reads the incarnation reads it too.
    pub(super) fn publish_durable<F: Fabric<Endpoint = E>>(&mut self, fabric: &F) {
        if self.durability.published != self.durability.index {
            self.durability.published = self.durability.index;
            layout::store_own(fabric, layout::CONTROL, layout::DURABLE, self.durability.index);
        }
    }

    /// With a durable log: hands every committed entry not yet handed over to the log, in index
    /// order (`StateMachine::persist`), before anything applies it (Raft's order: an entry is
    /// on disk before a state machine sees it).
    pub(super) fn persist_committed<F: Fabric<Endpoint = E>, S: StateMachine>(&mut self, fabric: &F, app: &mut S) {
        if !self.config.durable {
            return;
        }
        let trust_canary = self.trust_canary();
        if self.durability.persisted <= self.replay.applied() {
            self.durability.persisted = self.replay.applied();
            self.durability.configuration = self.configuration;
        }
        let by_majority = fabric.load_u64(layout::CONTROL, self.layout.persisted_by_majority()).unwrap_or(0);
        for _ in 0..PERSIST_PER_POLL {
            let index = self.durability.persisted;
            if !self.is_committed(fabric, index) {
                break;
            }
            // A replica that is not a member of the entry's configuration persists only what a
            // majority of the members did: no disk then holds a committed entry that a whole-
            // cluster restart without it could fill otherwise (`mu::plane::bootstrap`).
            if !self.durability.configuration.members.contains(self.me) && index >= by_majority {
                break;
            }
            if !self.read_local_slot(fabric, index) || !slot::claims(&self.slot_buf, index) {
                self.correct_fuo_field(fabric, index);
                break;
            }
            let Some(entry) = slot::decode(&self.slot_buf, index, trust_canary) else {
                self.correct_fuo_field(fabric, index);
                break;
            };
            match entry.kind {
                EntryKind::Normal => app.persist(index, Some(entry.payload)),
                EntryKind::Noop => app.persist(index, None),
                EntryKind::Membership => {
                    let before = self.durability.configuration;
                    let after = membership::decode(entry.payload)
                        .and_then(|(change, epoch)| before.apply(change, epoch, self.config.replicas))
                        .unwrap_or(before);
                    self.durability.configuration = after;
                    app.persist_membership(index, after);
                }
            }
            self.durability.persisted += 1;
        }
    }

    /// The index below which entries may be applied: without a durable log, any committed one;
    /// with one, those this replica handed to its log and a majority of the members persisted
    /// (the leader learns it from the followers' pushed indices and pushes it to them).
    pub(super) fn apply_limit<F: Fabric<Endpoint = E>>(&self, fabric: &F) -> u64 {
        if !self.config.durable {
            return u64::MAX;
        }
        let leading = self.term.leading();
        if leading && self.config.bug(PlantedBug::AckBeforeDurable) {
            return self.durability.persisted;
        }
        let pushed = fabric.load_u64(layout::CONTROL, self.layout.persisted_by_majority()).unwrap_or(0);
        let known = if leading { pushed.max(self.majority_durable(fabric)) } else { pushed };
        known.min(self.durability.persisted)
    }

    /// Durability work of one poll: publishes this replica's durable index, pushes it to the
    /// leader it follows, and as leader pushes the index a majority persisted to the followers.
    pub(super) fn poll_durability<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        if !self.config.durable {
            return;
        }
        self.publish_durable(fabric);
        let leader = self.leader;
        if leader != self.me {
            self.push_durable(fabric, now, leader);
        }
        if self.term.leading() {
            self.push_majority(fabric, now);
        }
    }

    /// The highest index below which a majority of the members (this one included) have every
    /// entry on disk, as the followers last reported.
    fn majority_durable<F: Fabric<Endpoint = E>>(&self, fabric: &F) -> u64 {
        let members = self.configuration.members;
        let mut reported: Vec<u64> = self
            .links
            .peers()
            .filter(|&p| members.contains(p))
            .map(|p| fabric.load_u64(layout::CONTROL, self.layout.durable_offset(p)).unwrap_or(0))
            .chain([self.durability.index])
            .collect();
        reported.sort_unstable_by(|a, b| b.cmp(a));
        reported[(members.majority() - 1).min(reported.len() - 1)]
    }

    fn push_durable<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, leader: NodeId) {
        let value = self.durability.index;
        if self.durability.pushed == Some((leader, value)) && now < self.durability.next_push_ns {
            return;
        }
        self.links.reconnect(fabric, leader, now);
        let at = RemoteAddr::new(layout::CONTROL, self.layout.durable_offset(self.me));
        if self.write_untracked(fabric, now, leader, at, &value.to_le_bytes()) {
            self.durability.pushed = Some((leader, value));
            self.durability.next_push_ns = now + self.config.lag_check_period_ns;
        }
    }

    /// As leader: keeps the index a majority persisted in its own CONTROL word and writes it to
    /// the confirmed followers when it grew (and every lag-check period), so that they apply
    /// what a majority persisted. Any value ever computed stays true, so a stale one is safe.
    fn push_majority<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let majority = self.majority_durable(fabric);
        let at = self.layout.persisted_by_majority();
        if majority > fabric.load_u64(layout::CONTROL, at).unwrap_or(0) {
            layout::store_own(fabric, layout::CONTROL, at, majority);
        }
        if majority <= self.durability.majority_pushed && now < self.durability.next_majority_push_ns {
            return;
        }
        let dst = RemoteAddr::new(layout::CONTROL, at);
        for peer in self.term.confirmed().to_vec() {
            self.write_untracked(fabric, now, peer, dst, &majority.to_le_bytes());
        }
        self.durability.majority_pushed = majority;
        self.durability.next_majority_push_ns = now + self.config.lag_check_period_ns;
    }

    /// A follower failed (leader side): forget the durable index it reported, which its next
    /// process may not have (a disk replaced with the machine); it pushes again once back.
    pub(super) fn forget_durable<F: Fabric<Endpoint = E>>(&self, fabric: &F, peer: NodeId) {
        if self.config.durable {
            layout::store_own(fabric, layout::CONTROL, self.layout.durable_offset(peer), 0);
        }
    }
}
