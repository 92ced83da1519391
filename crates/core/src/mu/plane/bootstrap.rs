//! Bootstrap, and cluster generations: when a cluster of recovering replicas may start over.
//!
//! A replica with fresh memory starts recovering (`mu::plane::leader::standing`) and becomes a voter when a
//! leader promotes it. A cluster with no voter has no leader to promote anyone, so the
//! recovering replicas look at each other: while recovering and following, a replica READs,
//! once per heartbeat period, every peer's minProposal, FUO, standing, incarnation and
//! generation.
//!
//! - **Bootstrap.** If every member's log is pristine (minProposal and FUO 0) and no member
//!   remembers a generation, nothing was ever accepted anywhere, so nothing can have been
//!   forgotten. The replica that sees it names a new **generation** (the highest incarnation
//!   among the members: random, never 0, and the same for replicas that bootstrap at once),
//!   writes it and then the member's own incarnation into every member's
//!   `GENERATION` and `STANDING` words, and so makes every member a voter at once. Leaders pass
//!   the generation on with every promotion.
//! - **Loss.** Before this rule a cluster all of whose members restarted with fresh memory
//!   bootstrapped again: it silently started empty, losing every acknowledged write. A runtime
//!   that keeps the generation across restarts (`MuConfig::generation`, from [`Event::Voter`])
//!   makes a restarted member publish it, and a member that remembers a generation is never
//!   pristine. If every member is live, none is a voter (none can ever be promoted again) and
//!   some member remembers a generation, or some log is not pristine, the cluster's state is
//!   gone from memory: the replica reports [`Event::ClusterLost`] once, and an operator decides
//!   (start a new, empty cluster, or restore from elsewhere). The observation must hold for
//!   [`LOSS_ROUNDS`] rounds in a row: one round's READs are not taken at one instant, and a
//!   bootstrap in progress (generations written, standings not yet) looks the same for a few
//!   microseconds.
//!
//! - **Restart from disk.** With a durable log (`MuConfig::durable`) the same observation is
//!   not a loss: every member restored its application from its disk and published how far
//!   (its `DURABLE` word, see `mu::plane::durable`). Those durable prefixes are prefixes of the one
//!   committed log, so the longest holds every entry persisted anywhere, every acknowledged
//!   one included (a leader acknowledges only what a majority persisted). The member with the
//!   most durable state (the lowest id among equals) makes itself a voter of a *new* generation
//!   (a replica that kept running through the kill, a spare, still holds the old history in
//!   memory; leaders tell it apart by its generation, `mu::plane::leader`); it is then the only voter, leads (with every member heard, the
//!   recovering ones count, `mu::plane::leader::standing`), and brings the others up to date and promotes them
//!   through the usual recovery path. Every member must be back, as for the loss: a member not
//!   heard from could be a voter that still holds entries applied but persisted nowhere, and a
//!   cluster restarted without it would diverge from it. Reports may rise meanwhile (a
//!   recovering member that lags restores a peer's published snapshot, itself what that peer
//!   restored from its disk), but never past the highest restored index, and the member that
//!   holds it reports it all along: a member makes itself a voter only if no report exceeds its
//!   own, so every member that does holds the longest durable prefix. Two may, if they hold the
//!   same prefix and one read the other's report from before it restored: they hold the same
//!   state, and safety from there on is Paxos's among replicas that accepted nothing yet.
//! - **Configurations.** "Every member" is every member of the configuration the reader's disk
//!   holds (`mu::membership`; each disk holds the one of its own prefix): the round reads those
//!   members only, and only a member of its own configuration decides. A member behind the most
//!   durable reporter copies its published snapshot meanwhile, so that a member of the longest
//!   prefix's configuration comes to hold it even when its holder is no member of it. Together
//!   with `mu::plane::durable`'s rule that a non-member persists only what a majority of the members
//!   did, no disk anywhere holds more than the restarter's prefix (docs/ARCHITECTURE.md,
//!   "Membership changes", argues it).
//!
//! A replica that keeps nothing across restarts (generation 0) behaves as before, except that
//! an unpristine cluster without voters is now reported rather than left waiting silently.

use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RemoteAddr};

use super::ReplicationPlane;
use super::round::Round;
use crate::mu::api::Event;
use crate::mu::layout;

/// Consecutive rounds that must each find the cluster without voters before it is reported
/// lost.
pub(super) const LOSS_ROUNDS: u32 = 3;

/// What one member reported in a bootstrap round.
#[derive(Clone, Copy, Debug)]
struct Report {
    pristine: bool,
    voter: bool,
    incarnation: u64,
    generation: u64,
    durable: u64,
}

/// The bootstrap rounds' state.
#[derive(Debug)]
pub(super) struct Bootstrap {
    /// While recovering: the READ of every peer's minProposal, FUO, standing and generation;
    /// after bootstrapping the cluster, the writes that make the peers voters.
    round: Option<Round>,
    next_ns: u64,
    /// Rounds in a row that found every member live and none a voter.
    loss_rounds: u32,
    /// After this replica bootstrapped the cluster: the peers it made voters (with their
    /// incarnations) whose writes are not yet confirmed.
    made_voters: Vec<(NodeId, u64)>,
}

impl Bootstrap {
    /// No round yet; the first is due at `now`.
    pub(super) fn new(now: u64) -> Self {
        Self { round: None, next_ns: now, loss_rounds: 0, made_voters: Vec::new() }
    }

    /// The round under way, if any.
    pub(super) fn round_mut(&mut self) -> Option<&mut Round> {
        self.round.as_mut()
    }

    /// An operation to `peer` failed: a round waiting on it is dropped (and starts again).
    pub(super) fn peer_failed(&mut self, peer: NodeId) {
        if self.round.as_ref().is_some_and(|r| r.posted_to(peer)) {
            self.round = None;
        }
    }
}

impl<E: Endpoint> ReplicationPlane<E> {
    /// Bootstrap and loss detection (follower side, while recovering); see the module
    /// documentation.
    pub(super) fn check_bootstrap<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        if self.voter {
            self.boot.loss_rounds = 0;
            return self.confirm_bootstrap(fabric, now);
        }
        if self.term.leading() || !self.is_member() {
            // Only members of this replica's configuration bootstrap the cluster or restart it
            // (the initial members, or those of the configuration its disk holds); a spare waits
            // to be brought up to date and promoted by a leader (`mu::membership`).
            self.boot.round = None;
            self.boot.loss_rounds = 0;
            return;
        }
        match self.boot.round.take() {
            None if now >= self.boot.next_ns => {
                self.boot.next_ns = now + self.config.heartbeat_period_ns;
                self.post_bootstrap_reads(fabric, now);
            }
            None => {}
            Some(round) if round.acked.len() + 1 == self.configuration.members.len() => {
                let peers: Vec<(NodeId, Report)> =
                    round.acked.iter().map(|&p| (p, self.peer_report(fabric, p))).collect();
                self.decide(fabric, now, &peers);
            }
            Some(round) if now.saturating_sub(round.started_ns) <= self.config.round_timeout_ns => {
                self.boot.round = Some(round);
            }
            Some(_) => self.boot.loss_rounds = 0,
        }
    }

    fn post_bootstrap_reads<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let members = self.configuration.members;
        let peers: Vec<NodeId> = self.links.peers().filter(|&p| members.contains(p)).collect();
        for &peer in &peers {
            self.links.reconnect(fabric, peer, now);
        }
        let (layout, id) = (self.layout, self.round_id());
        let posted = self.post_to(fabric, now, &peers, id, |ep, peer, id| {
            let min = RemoteAddr::new(layout::LOG, layout::MIN_PROPOSAL);
            let fuo = RemoteAddr::new(layout::LOG, layout::FUO);
            let words = RemoteAddr::new(layout::CONTROL, layout::STANDING);
            let at = |field| layout.scratch(peer, field);
            ep.post_read(0, words, 40, layout::SCRATCH, at(layout::SCRATCH_BOOT_STANDING), PostFlags::NONE).is_ok()
                && ep.post_read(0, min, 8, layout::SCRATCH, at(layout::SCRATCH_MIN_PROPOSAL), PostFlags::NONE).is_ok()
                && ep.post_read(id, fuo, 8, layout::SCRATCH, at(layout::SCRATCH_FUO), PostFlags::SIGNALED).is_ok()
        });
        self.boot.round = Some(self.new_round(posted, now));
    }

    fn peer_report<F: Fabric<Endpoint = E>>(&self, fabric: &F, peer: NodeId) -> Report {
        let word = |field| fabric.load_u64(layout::SCRATCH, self.layout.scratch(peer, field)).unwrap_or(1);
        let incarnation = word(layout::SCRATCH_BOOT_INCARNATION);
        Report {
            pristine: word(layout::SCRATCH_MIN_PROPOSAL) == 0 && word(layout::SCRATCH_FUO) == 0,
            voter: incarnation != 0 && word(layout::SCRATCH_BOOT_STANDING) == incarnation,
            incarnation,
            generation: word(layout::SCRATCH_BOOT_GENERATION),
            durable: word(layout::SCRATCH_BOOT_DURABLE),
        }
    }

    fn own_report<F: Fabric<Endpoint = E>>(&self, fabric: &F) -> Report {
        let word = |region, offset| fabric.load_u64(region, offset).unwrap_or(1);
        Report {
            pristine: word(layout::LOG, layout::MIN_PROPOSAL) == 0 && word(layout::LOG, layout::FUO) == 0,
            voter: false,
            incarnation: self.config.incarnation,
            generation: word(layout::CONTROL, layout::GENERATION),
            durable: word(layout::CONTROL, layout::DURABLE),
        }
    }

    fn decide<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, peers: &[(NodeId, Report)]) {
        let me = self.own_report(fabric);
        let reports = || std::iter::once(&me).chain(peers.iter().map(|(_, r)| r));
        // A peer that has not published its incarnation yet (its replication plane has not run)
        // cannot be made a voter: the write would carry 0. Wait for it.
        let fresh = reports().all(|r| r.pristine && r.generation == 0 && r.incarnation != 0);
        if fresh {
            self.make_all_voters(fabric, peers);
            return;
        }
        let no_voter = reports().all(|r| !r.voter && r.incarnation != 0);
        let remembered = reports().map(|r| r.generation).max().unwrap_or(0);
        if !no_voter || (remembered == 0 && reports().all(|r| r.pristine)) {
            self.boot.loss_rounds = 0;
            return;
        }
        self.boot.loss_rounds = self.boot.loss_rounds.saturating_add(1);
        if self.config.durable && self.boot.loss_rounds >= LOSS_ROUNDS {
            self.restart_from_disk(fabric, now, &me, peers);
        } else if self.boot.loss_rounds == LOSS_ROUNDS {
            tracing::error!(node = self.me.0, generation = remembered, "every member is live and none is a voter");
            self.events.push(Event::ClusterLost { generation: remembered });
        }
    }

    /// Every member of this replica's configuration restarted from its disk: the one with the
    /// most durable state (the lowest id among equals) becomes the only voter, of a new
    /// generation, and leads the others back (see the module
    /// documentation). Every member decides alike from the same reports; the others wait to be
    /// promoted. A member whose disk holds less copies the most durable one's published
    /// snapshot meanwhile, so that a member of the configuration of the longest prefix comes
    /// to hold it even if that disk's owner is no member of it (it persisted its own removal).
    fn restart_from_disk<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        me: &Report,
        peers: &[(NodeId, Report)],
    ) {
        let (durable, std::cmp::Reverse(first)) = peers
            .iter()
            .map(|&(p, r)| (r.durable, std::cmp::Reverse(p)))
            .fold((me.durable, std::cmp::Reverse(self.me)), std::cmp::max);
        if first != self.me {
            if durable > me.durable && self.is_idle_lag() {
                tracing::info!(
                    node = self.me.0,
                    from = first.0,
                    durable,
                    "every member restarted: copying the most durable state"
                );
                self.fetch_snapshot(fabric, now, first, durable, first);
            }
            return;
        }
        // A new generation, never the remembered one: a replica that kept running through the
        // kill (a spare) still holds the old history in memory, and leaders tell it apart by its
        // generation (`of_another_history` in `mu::plane::leader`). The members' incarnations are all
        // new, so their maximum is no generation seen before.
        let generation = peers.iter().map(|(_, r)| r.incarnation).fold(self.config.incarnation, u64::max);
        tracing::info!(node = self.me.0, durable = me.durable, generation, "every member restarted: leading from disk");
        self.events.push(Event::RestartedFromDisk { index: me.durable, generation });
        layout::store_own(fabric, layout::CONTROL, layout::GENERATION, generation);
        layout::store_own(fabric, layout::CONTROL, layout::STANDING, self.config.incarnation);
    }

    /// Every member becomes a voter of a new generation at once (a write carrying a peer's
    /// old incarnation does nothing if it restarted meanwhile). The peers' writes are
    /// confirmed, and made again until they are ([`Self::confirm_bootstrap`]).
    fn make_all_voters<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, peers: &[(NodeId, Report)]) {
        // The same for every replica that bootstraps at this moment: they read the same runs.
        let generation = peers.iter().map(|(_, r)| r.incarnation).fold(self.config.incarnation, u64::max);
        tracing::debug!(node = self.me.0, generation, "every member is pristine: all are voters from the start");
        self.boot.made_voters = peers.iter().map(|&(peer, r)| (peer, r.incarnation)).collect();
        layout::store_own(fabric, layout::CONTROL, layout::GENERATION, generation);
        layout::store_own(fabric, layout::CONTROL, layout::STANDING, self.config.incarnation);
    }

    /// After a bootstrap: writes each peer's generation and standing, signaled, until the
    /// writes are known to have landed. A lost write would leave that peer recovering with
    /// nobody to promote it until a leader brings it up to date, so a crash of another member
    /// could then leave no majority of voters (swarm seed 4086).
    fn confirm_bootstrap<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        if let Some(round) = self.boot.round.take() {
            self.boot.made_voters.retain(|(peer, _)| !round.acked.contains(peer));
            if now.saturating_sub(round.started_ns) <= self.config.round_timeout_ns && !self.boot.made_voters.is_empty()
            {
                self.boot.round = Some(round);
                return;
            }
        }
        if self.boot.made_voters.is_empty() || now < self.boot.next_ns {
            return;
        }
        self.boot.next_ns = now + self.config.heartbeat_period_ns;
        let generation = fabric.load_u64(layout::CONTROL, layout::GENERATION).unwrap_or(0).to_le_bytes();
        let writes = self.boot.made_voters.clone();
        let id = self.round_id();
        let peers: Vec<NodeId> = writes.iter().map(|&(p, _)| p).collect();
        for &peer in &peers {
            self.links.reconnect(fabric, peer, now);
        }
        let posted = self.post_to(fabric, now, &peers, id, |ep, peer, id| {
            let incarnation = writes.iter().find(|&&(p, _)| p == peer).map_or(0, |&(_, i)| i).to_le_bytes();
            let generation_at = RemoteAddr::new(layout::CONTROL, layout::GENERATION);
            let standing = RemoteAddr::new(layout::CONTROL, layout::STANDING);
            ep.post_write(0, generation_at, &generation, PostFlags::NONE).is_ok()
                && ep.post_write(id, standing, &incarnation, PostFlags::SIGNALED).is_ok()
        });
        self.boot.round = Some(self.new_round(posted, now));
    }
}
