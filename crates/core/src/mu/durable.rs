//! Durability (`MuConfig::durable`): what the core knows of the replicas' disks, and the
//! acknowledgement rule that depends on it.
//!
//! The core never touches a file. The runtime appends every entry a replica applies (and every
//! snapshot it takes or restores, as a checkpoint) to a local log with group commit, and tells
//! the core how far that log is synced with [`ReplicationPlane::set_durable`], an input like
//! `now`; the simulator drives the same code with a modelled disk.
//!
//! - **Publication.** Each replica keeps its durable index in its CONTROL `DURABLE` word, read
//!   by the bootstrap round of a cluster all of whose members restarted (`mu::bootstrap`), and
//!   a follower *pushes* it into the CONTROL region of the leader it follows (one unsignaled
//!   WRITE whenever it grows, and again every lag-check period in case one was lost), so that
//!   the leader learns it without a READ round on the commit path.
//! - **Acknowledgement.** A leader reports its request committed only once a majority of the
//!   members (itself included) have the entry on disk: Raft acknowledges only entries that a
//!   majority persisted (Raft §5.3, "a log entry is committed once the leader that created the
//!   entry has replicated it on a majority of the servers", with persistent logs), and Mu's
//!   one-sided accept has no follower CPU to persist before acking, so the acknowledgement is
//!   decoupled from the accept. Entries stay committed in the protocol's sense (a majority's
//!   memory holds them, Mu §4); what waits is only the report to the client.
//! - **What a durable index means.** A replica's durable log holds the entries it *applied*,
//!   which are committed, in index order, after a checkpoint: a contiguous prefix of the one
//!   committed log. So the durable prefixes of all replicas are prefixes of one another, and
//!   the longest of them holds every entry durable anywhere: every acknowledged entry, once
//!   every member is back (`mu::bootstrap`). A recovering follower's disk counts like a
//!   voter's: what it persisted is committed whatever its standing.
//! - **Restart.** A runtime that restored its application from its log starts the plane with
//!   [`ReplicationPlane::restore_durable`], as if it had restored a snapshot taken there: its
//!   log region holds nothing below that index, and a lagging peer restores its snapshot.

use std::collections::VecDeque;

use microrep_fabric::{Endpoint, Fabric, NodeId, RemoteAddr};

use super::api::{Event, StateMachine};
use super::layout;
use super::replication::{Phase, ReplicationPlane};

/// What the durability rules keep in a replication plane.
#[derive(Debug, Default)]
pub(super) struct Durability {
    /// Entries below this index are on this replica's disk (the runtime's input).
    index: u64,
    /// The value last stored in the CONTROL `DURABLE` word.
    published: u64,
    /// The leader last pushed to, and the value pushed.
    pushed: Option<(NodeId, u64)>,
    /// When the next push is due even if nothing changed (a WRITE may have been lost).
    next_push_ns: u64,
    /// As leader: requests applied here, oldest first, waiting for a majority to persist them
    /// (index, request id).
    awaiting: VecDeque<(u64, u64)>,
}

impl<E: Endpoint> ReplicationPlane<E> {
    /// The runtime's input: every entry below `index` that this replica applied is on its
    /// disk. Never goes down.
    pub fn set_durable(&mut self, index: u64) {
        debug_assert!(index >= self.durability.index, "durable index went down: {} -> {index}", self.durability.index);
        self.durability.index = self.durability.index.max(index);
    }

    /// The index below which this replica's applied entries are on its disk, as last reported.
    pub fn durable(&self) -> u64 {
        self.durability.index
    }

    /// Before the first poll: the runtime restored the application `app` from its durable log
    /// up to `index` (everything below applied). The plane starts as if it had restored a
    /// snapshot taken there: applied, FUO and recycling point at `index`, the snapshot
    /// published, and `index` durable. Its log region holds nothing below `index`, so a peer
    /// that needs those entries restores its snapshot (Mu §5.4).
    pub fn restore_durable<F: Fabric<Endpoint = E>, S: StateMachine>(&mut self, fabric: &F, app: &S, index: u64) {
        assert!(
            self.applied == 0 && matches!(self.phase, Phase::Follower),
            "restore_durable is for a plane that has not run yet"
        );
        self.durability.index = index;
        if index == 0 {
            return;
        }
        self.applied = index;
        self.fuo = index;
        self.last_apply_ns = 0;
        self.publish_snapshot(fabric, app);
        self.raise_tail(fabric, index);
        layout::store_own(fabric, layout::CONTROL, layout::HEAD, index);
        layout::store_own(fabric, layout::LOG, layout::FUO, index);
    }

    /// Stores the durable index in CONTROL before the incarnation is first published (see
    /// `refresh_standing`): a peer that reads the incarnation reads it too.
    pub(super) fn publish_durable<F: Fabric<Endpoint = E>>(&mut self, fabric: &F) {
        if self.durability.published != self.durability.index {
            self.durability.published = self.durability.index;
            layout::store_own(fabric, layout::CONTROL, layout::DURABLE, self.durability.index);
        }
    }

    /// A request proposed here was applied at `index`: reports it committed now, or, with a
    /// durable log, once a majority persisted it. A replica that stepped down already reported
    /// it failed with an unknown outcome (it no longer hears its followers' disks).
    pub(super) fn applied_own(&mut self, request_id: u64, index: u64) {
        if !self.config.durable || self.config.bug(super::planted::PlantedBug::AckBeforeDurable) {
            self.events.push(Event::Committed { request_id, index });
        } else if !matches!(self.phase, Phase::Follower) {
            self.durability.awaiting.push_back((index, request_id));
        }
    }

    /// Durability work of one poll: publishes this replica's durable index, pushes it to the
    /// leader it follows, and as leader reports the requests a majority persisted.
    pub(super) fn poll_durability<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        if !self.config.durable {
            return;
        }
        self.publish_durable(fabric);
        let leader = self.leader;
        if leader != self.me {
            self.push_durable(fabric, now, leader);
        }
        if self.durability.awaiting.is_empty() {
            return;
        }
        let persisted = self.majority_durable(fabric);
        while let Some(&(index, request_id)) = self.durability.awaiting.front().filter(|&&(i, _)| i < persisted) {
            self.durability.awaiting.pop_front();
            self.events.push(Event::Committed { request_id, index });
        }
    }

    /// The highest index below which a majority of the members (this one included) have every
    /// entry on disk, as the followers last reported.
    fn majority_durable<F: Fabric<Endpoint = E>>(&self, fabric: &F) -> u64 {
        let mut reported: Vec<u64> = self
            .links
            .peers()
            .map(|p| fabric.load_u64(layout::CONTROL, self.layout.durable_offset(p)).unwrap_or(0))
            .chain([self.durability.index])
            .collect();
        reported.sort_unstable_by(|a, b| b.cmp(a));
        reported[self.config.majority() - 1]
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

    /// A follower failed (leader side): forget the durable index it reported, which its next
    /// process may not have (a disk replaced with the machine); it pushes again once back.
    pub(super) fn forget_durable<F: Fabric<Endpoint = E>>(&self, fabric: &F, peer: NodeId) {
        if self.config.durable {
            layout::store_own(fabric, layout::CONTROL, self.layout.durable_offset(peer), 0);
        }
    }

    /// Stepping down: requests applied but not yet persisted by a majority are reported with
    /// an unknown outcome (they are committed, but this replica no longer learns of the
    /// followers' disks).
    pub(super) fn fail_awaiting_durable(&mut self) {
        for (_, request_id) in self.durability.awaiting.drain(..) {
            self.events.push(Event::Failed { request_id, maybe_committed: true });
        }
    }
}
