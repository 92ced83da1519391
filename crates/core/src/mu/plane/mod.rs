//! The replication plane of one replica: the leader's replicator (`leader.rs`, Mu §4) and
//! every replica's replayer (`replayer.rs`, Mu §4.2, A.4.3). This file holds their shared
//! state, the proposal queue, completion dispatch and role changes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use microrep_fabric::{Completion, Endpoint, Fabric, NodeId, OpError, PostFlags, RemoteAddr};
use rustc_hash::FxHashSet;

mod bootstrap;
mod durable;
mod leader;
mod replayer;
mod round;
mod standing;

pub use replayer::APPLY_PER_POLL;

use crate::mu::MuConfig;
use crate::mu::api::{Event, LeaderView, ProposeError, Role, Stage, StateMachine, Status};
use crate::mu::gate::LocalLogGate;
use crate::mu::layout::{self, Layout};
use crate::mu::links::Links;
use crate::mu::membership::{self, Configuration, MemberSet, MembershipChange, SharedMembers};
use crate::mu::slot::{self, EntryKind, Frame};
use durable::Durability;
use round::{Peers, Round};
use standing::Recovering;

/// Work-request id of operations whose success nobody waits for.
const WR_UNTRACKED: u64 = 0;

/// A request waiting to be replicated.
#[derive(Clone, Debug)]
struct Proposal {
    request_id: u64,
    kind: EntryKind,
    /// The payload, with room for the entry's header and canary: sealed in place when accepted.
    payload: Frame,
}

/// An entry being accepted, owned.
#[derive(Clone, Debug)]
struct OwnedEntry {
    proposer: NodeId,
    request_id: u64,
    kind: EntryKind,
    /// A value adopted from a prepare; `None` for this leader's own request, whose payload is
    /// that of the front of `pending` (sealed there: no copy).
    payload: Option<Frame>,
}

/// Spare payload buffers: copies of commands go into them instead of new allocations.
#[derive(Debug, Default)]
struct PayloadPool(Vec<Vec<u8>>);

impl PayloadPool {
    /// A frame holding a copy of `bytes`, in a spare buffer if there is one.
    fn copy(&mut self, bytes: &[u8]) -> Frame {
        let mut frame = self.0.pop().map(Frame::reuse).unwrap_or_default();
        frame.extend_from_slice(bytes);
        frame
    }

    /// Keeps `buffer` for a later [`Self::copy`]: at most 64 of them, none larger than 64 KiB,
    /// so that a burst of large commands does not pin their memory.
    fn recycle(&mut self, buffer: Vec<u8>) {
        if self.0.len() < 64 && buffer.capacity() <= 64 << 10 {
            self.0.push(buffer);
        }
    }
}

/// Where the leader's state machine stands (Mu §4, Listing 2 and §4.2).
#[derive(Clone, Debug)]
enum Phase {
    /// Not leading.
    Follower,
    /// Waiting for a majority of permission acks (§5.2).
    Acquire { since_ns: u64 },
    /// An attempt failed (permissions lost, a round timed out): before asking for permissions
    /// again, wait until the failure detector has run detection round `after_round`, which
    /// started after the failure, and still chooses this replica. A leader paused long enough
    /// to be replaced wakes with a view from before its pause; acting on it, it took the
    /// permissions back from its successor (a duel, with proposals on both sides failing).
    Reacquire { after_round: u64 },
    /// Reading confirmed followers' FUO and tail (leader catch-up, §4.2).
    CatchUp { round: Round },
    /// Copying committed slots `[next, upto)` from `from` into the local log.
    CatchUpCopy { round: Round, from: NodeId, next: u64, upto: u64, count: u64 },
    /// Waiting for the local replayer to apply copied entries before copying more, so the copy
    /// never laps the circular log ahead of what was applied.
    CatchUpWait { from: NodeId, next: u64, upto: u64, since_ns: u64 },
    /// Restoring `from`'s snapshot because the entries this replica lacks were recycled there.
    Restore { round: Round },
    /// Prepare, first half: reading minProposals.
    ReadMin { round: Round },
    /// Prepare, second half: writing the new proposal number and reading the slot at FUO.
    WriteRead { round: Round },
    /// Accept: writing the slot at FUO.
    Accept { round: Round, entry: OwnedEntry, mine: bool },
    /// Leading, nothing in flight.
    Idle,
    /// Reading followers' heads to recycle the log (§5.3).
    ReadHeads { round: Round },
    /// Reading a late follower's FUO before adding it to the confirmed set (§4.2).
    Grow { round: Round, peer: NodeId },
}

impl Phase {
    /// The quorum round this phase waits on, if any.
    fn round_mut(&mut self) -> Option<&mut Round> {
        match self {
            Phase::CatchUp { round }
            | Phase::CatchUpCopy { round, .. }
            | Phase::Restore { round }
            | Phase::ReadMin { round }
            | Phase::WriteRead { round }
            | Phase::Accept { round, .. }
            | Phase::ReadHeads { round }
            | Phase::Grow { round, .. } => Some(round),
            Phase::Follower
            | Phase::Acquire { .. }
            | Phase::Reacquire { .. }
            | Phase::Idle
            | Phase::CatchUpWait { .. } => None,
        }
    }
}

/// What a follower does about falling behind the recycled log.
#[derive(Clone, Debug)]
enum LagWork {
    None,
    /// Reading the leader's tail.
    ReadTail {
        round: Round,
        leader: NodeId,
    },
    /// Copying `from`'s snapshot, which must cover the leader's log from `leader_tail` on.
    Restore {
        round: Round,
        leader: NodeId,
        leader_tail: u64,
        from: NodeId,
    },
}

/// The replication plane of one replica.
#[derive(Debug)]
pub struct ReplicationPlane<E> {
    config: MuConfig,
    layout: Layout,
    me: NodeId,
    gate: Arc<LocalLogGate>,
    links: Links<E>,
    phase: Phase,
    lag: LagWork,
    /// Snapshot fetches started, to rotate their source among the peers (`snapshot_source`).
    snapshot_fetches: u64,
    leader: NodeId,
    /// First undecided offset as this replica (when leading) knows it.
    fuo: u64,
    pub(in crate::mu) applied: u64,
    tail: u64,
    snapshot_index: u64,
    /// The size of the last snapshot that did not fit the snapshot region, until one fits.
    snapshot_overflow: Option<usize>,
    /// As leader: the lowest index this replica applied but could not copy from its own log
    /// (the slot no longer decodes: a deposed leader's write for a later lap tore it). Followers
    /// that need it can only restore a snapshot that covers it (see `Self::cover_uncopyable`).
    uncopyable: Option<u64>,
    pub(in crate::mu) prop_nr: u64,
    request_no: u64,
    /// The first permission request of the current attempt to lead: acks at least this high
    /// were given to this attempt.
    term_request: u64,
    pub(in crate::mu) confirmed: Vec<NodeId>,
    /// Omit-prepare (Mu §4.2): the index at which this term's prepare walk found every read
    /// slot empty; accepts go without prepares while set. Cleared whenever the confirmed set
    /// grows or the term ends, so that a new walk starts (A.4.4, A.4.5(b)).
    walk_ended_at: Option<u64>,
    pending: VecDeque<Proposal>,
    front_written: bool,
    /// Requests of this replica that committed (or may have) and are not applied yet: a hash
    /// set keeps its table when it empties, where a B-tree set allocated and freed a node per
    /// commit.
    awaiting_apply: FxHashSet<u64>,
    next_round_id: u64,
    last_progress_ns: u64,
    last_apply_ns: u64,
    next_recycle_ns: u64,
    /// With `recycle_wait_ns`: the lowest head among this leader and its confirmed followers
    /// at the last recycling, and since when it has been that low.
    slowest_head: (u64, u64),
    next_grow_ns: Vec<u64>,
    fuo_pushed: u64,
    next_keepalive_ns: u64,
    terms_led: u64,
    /// The failure detector's rounds, as of the last poll (see [`LeaderView`]).
    rounds: u64,
    prepares: u64,
    slot_buf: Vec<u8>,
    big_buf: Vec<u8>,
    /// The application's state for the next published snapshot, kept between snapshots so
    /// that a large state is not allocated (and its pages faulted in) every time.
    state_buf: Vec<u8>,
    /// An entry whose bytes this replica holds already, to be applied from them: as a
    /// follower, the slot after the newest one proven committed by commit piggybacking (read,
    /// and checksummed, as that proof); as a leader, the entry it is replicating (encoded
    /// here). `next_read` names its index and ballot word, so that applying it costs one
    /// word's load instead of a read and a checksum (see `apply_committed`).
    next_buf: Vec<u8>,
    next_read: Option<(u64, u64)>,
    /// Payload buffers of committed proposals, reused for the next ones (the replication hot
    /// path allocates nothing per command once warm).
    spare_payloads: PayloadPool,
    events: Vec<Event>,
    /// Whether this replica counts in quorums (see `standing`), as of the last poll.
    voter: bool,
    /// As leader: followers that granted permission while recovering, not counted in quorums.
    recovering: BTreeMap<NodeId, Recovering>,
    /// As leader, in a term whose permission acks came from every member: the voters among
    /// them (see `standing::Quorum`).
    all_voters: Option<Vec<NodeId>>,
    /// While recovering: the READ of every peer's minProposal, FUO, standing and generation
    /// (`bootstrap`).
    bootstrap: Option<Round>,
    next_bootstrap_ns: u64,
    /// Bootstrap rounds in a row that found every member live and none a voter (`bootstrap`).
    loss_rounds: u32,
    /// After this replica bootstrapped the cluster: the peers it made voters (with their
    /// incarnations) whose writes are not yet confirmed (`bootstrap`).
    made_voters: Vec<(NodeId, u64)>,
    /// The disks' progress and the requests waiting for it (`durable`).
    durability: Durability,
    /// The configuration this replica applied (`membership`), published to the background
    /// plane through `shared_members`.
    configuration: Configuration,
    shared_members: Arc<SharedMembers>,
    /// The epoch of the configuration the current term's quorums were formed under, and its
    /// members.
    term_epoch: u64,
    term_members: crate::mu::MemberSet,
    /// As leader: nothing is proposed before this replica applied every entry below this
    /// index, which may hold a `Membership` entry (what catch-up copied, or a change just
    /// committed): a term's quorums must be those of the configuration at its FUO.
    config_known_from: u64,
    /// The replicas the failure detector held live at the last poll.
    live: MemberSet,
    completions: Vec<(NodeId, Completion)>,
}

impl<E: Endpoint> ReplicationPlane<E> {
    /// The replication plane of `config.node`.
    pub fn new(config: &MuConfig, gate: Arc<LocalLogGate>, shared_members: Arc<SharedMembers>, now: u64) -> Self {
        Self {
            config: config.clone(),
            layout: Layout::new(config),
            me: config.node,
            gate,
            links: Links::new(config.node, config.replicas, config.heartbeat_period_ns * 8, false),
            phase: Phase::Follower,
            lag: LagWork::None,
            snapshot_fetches: 0,
            leader: NodeId(0),
            fuo: 0,
            applied: 0,
            tail: 0,
            snapshot_index: 0,
            snapshot_overflow: None,
            uncopyable: None,
            prop_nr: 0,
            request_no: layout::first_request(config.incarnation),
            term_request: 0,
            confirmed: Vec::new(),
            walk_ended_at: None,
            pending: VecDeque::new(),
            front_written: false,
            awaiting_apply: FxHashSet::default(),
            next_round_id: 16,
            last_progress_ns: now,
            last_apply_ns: now,
            next_recycle_ns: now,
            slowest_head: (0, now),
            next_grow_ns: vec![0; usize::from(config.replicas)],
            fuo_pushed: 0,
            next_keepalive_ns: now,
            terms_led: 0,
            rounds: 0,
            prepares: 0,
            slot_buf: vec![0; config.slot_bytes as usize],
            big_buf: Vec::new(),
            state_buf: Vec::new(),
            next_buf: Vec::new(),
            next_read: None,
            spare_payloads: PayloadPool::default(),
            events: Vec::new(),
            voter: false,
            recovering: BTreeMap::new(),
            all_voters: None,
            bootstrap: None,
            next_bootstrap_ns: now,
            loss_rounds: 0,
            made_voters: Vec::new(),
            durability: Durability::default(),
            configuration: Configuration { members: config.members, epoch: 0 },
            shared_members,
            term_epoch: 0,
            term_members: config.members,
            config_known_from: 0,
            live: MemberSet::default(),
            completions: Vec::new(),
        }
    }

    /// Queues a request if this replica leads (or is about to).
    pub fn propose(&mut self, request_id: u64, payload: &[u8]) -> Result<(), ProposeError> {
        self.check_proposal(payload.len())?;
        let payload = self.spare_payloads.copy(payload);
        self.pending.push_back(Proposal { request_id, kind: EntryKind::Normal, payload });
        Ok(())
    }

    /// As [`Self::propose`], keeping `payload`'s buffer instead of copying it: the entry is
    /// sealed around the payload where it is and written to the logs from there.
    pub fn propose_framed(&mut self, request_id: u64, payload: Frame) -> Result<(), ProposeError> {
        self.check_proposal(payload.payload().len())?;
        self.pending.push_back(Proposal { request_id, kind: EntryKind::Normal, payload });
        Ok(())
    }

    /// Whether a request of `len` bytes may be queued now.
    fn check_proposal(&self, len: usize) -> Result<(), ProposeError> {
        if matches!(self.phase, Phase::Follower) {
            return Err(ProposeError::NotLeader { leader: self.leader });
        }
        let max = self.config.max_payload_bytes();
        if len > max {
            return Err(ProposeError::TooLarge { len, max });
        }
        if self.pending.len() >= self.config.max_pending {
            return Err(ProposeError::Backlogged { pending: self.pending.len() });
        }
        if let Some(state) = self.snapshot_overflow.filter(|_| self.fuo >= self.tail + self.layout.log_slots()) {
            return Err(ProposeError::StateTooLarge { state, limit: self.layout.snapshot_bytes() as usize });
        }
        Ok(())
    }

    /// Queues a membership change (see `membership`) if this replica leads, the change makes
    /// sense in the configuration it applied, no other change is queued or under way, and an
    /// added replica is a promoted follower this leader confirmed (caught up: it votes only
    /// then). The change commits as request `request_id`.
    pub fn propose_membership(&mut self, request_id: u64, change: MembershipChange) -> Result<(), ProposeError> {
        let refuse = |why: String| Err(ProposeError::Membership(why));
        if matches!(self.phase, Phase::Follower) {
            return Err(ProposeError::NotLeader { leader: self.leader });
        }
        if let Some(why) = self.configuration.refuses(change, self.config.replicas) {
            return refuse(why);
        }
        if self.pending.iter().any(|p| p.kind == EntryKind::Membership) || self.fuo < self.config_known_from {
            return refuse("another membership change is under way".into());
        }
        let new_term_due = self.term_epoch != self.configuration.epoch
            && !self.config.bug(crate::mu::planted::PlantedBug::KeepTermAcrossChange);
        if new_term_due || !matches!(self.role(), crate::mu::Role::Leader) {
            return refuse("this leader is still starting its term".into());
        }
        if let MembershipChange::Add(id) = change {
            if !self.live.contains(id) {
                return refuse(format!(
                    "replica {} is not live: its heartbeat does not advance (is it running?)",
                    id.0
                ));
            }
            if !self.confirmed.contains(&id) {
                return refuse(format!("replica {} is not a follower of this leader yet (is it running?)", id.0));
            }
            if self.recovering.contains_key(&id) {
                return refuse(format!("replica {} is still catching up", id.0));
            }
        }
        if self.pending.len() >= self.config.max_pending {
            return Err(ProposeError::Backlogged { pending: self.pending.len() });
        }
        let payload = Frame::of(&membership::encode(change, self.configuration.epoch));
        self.pending.push_back(Proposal { request_id, kind: EntryKind::Membership, payload });
        Ok(())
    }

    /// The members the cluster started with (`MuConfig::members`).
    pub fn initial_members(&self) -> MemberSet {
        self.config.members
    }

    /// The configuration this replica applied.
    pub fn configuration(&self) -> Configuration {
        self.configuration
    }

    /// Applies the `Membership` entry at `index` (see `membership`).
    fn apply_membership(&mut self, index: u64, change: MembershipChange, epoch: u64) {
        let Some(configuration) = self.configuration.apply(change, epoch, self.config.replicas) else {
            tracing::debug!(node = self.me.0, index, "a membership entry that changes nothing");
            return;
        };
        tracing::info!(node = self.me.0, index, members = %configuration.members, epoch = configuration.epoch, "configuration changed");
        self.set_configuration(configuration);
        self.events.push(Event::MembershipChanged { index, configuration });
    }

    /// Adopts `configuration` (applied, or restored with a snapshot).
    fn set_configuration(&mut self, configuration: Configuration) {
        self.configuration = configuration;
        self.shared_members.set(configuration.members);
    }

    /// Whether this replica is a member of the configuration it applied.
    fn is_member(&self) -> bool {
        self.configuration.members.contains(self.me)
    }

    /// Whether this replica leads, or tries to, and has neither committed nor been idle for
    /// longer than the fate-sharing timeout (Mu §5.1): its replication plane is stuck.
    pub fn stalled(&self, now: u64) -> bool {
        !matches!(self.phase, Phase::Follower)
            && now.saturating_sub(self.last_progress_ns) > self.config.fate_share_timeout_ns
    }

    /// Drives the plane: follows `leader` (the background plane's choice), replicates if that is
    /// this replica, applies committed entries to `app`, and appends events to `events`.
    pub fn poll<F, S>(&mut self, fabric: &F, now: u64, view: LeaderView, app: &mut S, events: &mut Vec<Event>)
    where
        F: Fabric<Endpoint = E>,
        S: StateMachine,
    {
        let leader = view.leader;
        self.rounds = view.rounds;
        self.live = view.live;
        self.refresh_standing(fabric);
        if leader != self.leader {
            self.leader = leader;
            self.events.push(Event::LeaderChanged { leader });
        }
        let idle = matches!(self.phase, Phase::Idle) && self.pending.is_empty();
        if idle || matches!(self.phase, Phase::Follower) {
            // Following, or leading with nothing to do, is no stall.
            self.last_progress_ns = now;
        }
        if leader == self.me && matches!(self.phase, Phase::Follower) && self.voter && self.is_member() {
            self.start_acquire(fabric, now);
        } else if (leader != self.me || !self.is_member()) && !matches!(self.phase, Phase::Follower) {
            self.step_down(fabric, now);
        }
        self.dispatch_completions(fabric);
        if !matches!(self.phase, Phase::Follower) {
            self.drive_leader(fabric, now, app);
            // A fabric that completes as it posts (shm) has the acks of what was just posted:
            // taking them in this poll lets an accept commit in the poll that proposed it.
            if self.dispatch_completions(fabric) && !matches!(self.phase, Phase::Follower) {
                self.drive_leader(fabric, now, app);
            }
        }
        self.apply_committed(fabric, now, app);
        self.poll_durability(fabric, now);
        if matches!(self.phase, Phase::Follower) {
            self.check_lag(fabric, now, app);
        }
        self.check_bootstrap(fabric, now);
        events.append(&mut self.events);
    }

    /// Gives up leading: queued requests fail, and the permission request is withdrawn (a
    /// request still on its way, from a leader paused long enough to be replaced, would
    /// otherwise take a follower's log from the successor once it lands and is served).
    fn step_down<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        tracing::debug!(node = self.me.0, "stepping down");
        let at = RemoteAddr::new(layout::CONTROL, self.layout.request_offset(self.me));
        layout::store_own(fabric, layout::CONTROL, at.offset, 0);
        let peers: Vec<NodeId> = self.links.peers().collect();
        for peer in peers {
            self.write_untracked(fabric, now, peer, at, &0u64.to_le_bytes());
        }
        let front_written = self.front_written;
        for (i, p) in self.pending.drain(..).enumerate().filter(|(_, p)| p.kind != EntryKind::Noop) {
            self.events.push(Event::Failed { request_id: p.request_id, maybe_committed: i == 0 && front_written });
            if i == 0 && front_written {
                self.awaiting_apply.insert(p.request_id);
            }
        }
        self.front_written = false;
        self.gate.set_claim(None);
        self.phase = Phase::Follower;
        self.confirmed.clear();
        self.recovering.clear();
        self.all_voters = None;
        self.walk_ended_at = None;
    }

    /// Abandons the current attempt and asks for permissions again (Listing 2: "abort"), once
    /// the failure detector has a view formed after the failure that still chooses this
    /// replica ([`Phase::Reacquire`]).
    ///
    /// A request already written to some log is not proposed again: another leader may adopt
    /// it from there and commit it (Listing 2 line 24), possibly where this replica never looks
    /// (it may restore a snapshot past it), so proposing it anew could commit it twice. Its
    /// outcome is reported unknown; a `Committed` event follows if it is applied here.
    fn abort(&mut self, why: &str) {
        tracing::debug!(node = self.me.0, why, "leader attempt aborted");
        if self.front_written {
            if let Some(p) = self.pending.pop_front().filter(|p| p.kind != EntryKind::Noop) {
                self.events.push(Event::Failed { request_id: p.request_id, maybe_committed: true });
                self.awaiting_apply.insert(p.request_id);
            }
            self.front_written = false;
        }
        self.gate.set_claim(None);
        self.phase = Phase::Reacquire { after_round: self.rounds + 3 };
    }

    /// Takes the fabric's completions into the rounds they belong to; whether there were any.
    fn dispatch_completions<F: Fabric<Endpoint = E>>(&mut self, fabric: &F) -> bool {
        let mut completions = std::mem::take(&mut self.completions);
        completions.clear();
        self.links.drain(&mut completions);
        let any = !completions.is_empty();
        for &(peer, ref c) in &completions {
            match c.status {
                Ok(()) => {
                    if let Some(round) = self.current_round_mut().filter(|r| r.id == c.wr_id) {
                        round.ack(peer);
                    }
                    if let Some(round) = self.lag_round_mut().filter(|r| r.id == c.wr_id) {
                        round.ack(peer);
                    }
                    if let Some(round) = self.bootstrap.as_mut().filter(|r| r.id == c.wr_id) {
                        round.ack(peer);
                    }
                }
                Err(e) => self.on_failure(fabric, peer, e),
            }
        }
        // Kept for the next poll: no allocation per poll on the commit path.
        self.completions = completions;
        any
    }

    fn on_failure<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, peer: NodeId, error: OpError) {
        tracing::trace!(node = self.me.0, peer = peer.0, ?error, "operation failed");
        if self.lag_round_mut().is_some_and(|r| r.posted_to(peer)) {
            self.lag = LagWork::None;
        }
        if self.bootstrap.as_ref().is_some_and(|r| r.posted_to(peer)) {
            self.bootstrap = None;
        }
        match self.phase {
            Phase::Follower | Phase::Acquire { .. } | Phase::Reacquire { .. } => {}
            _ if error == OpError::PermissionDenied && self.confirmed.contains(&peer) => {
                // Another replica holds this follower's log: someone else leads (Mu §5.2).
                self.abort("permission lost");
            }
            _ => {
                self.confirmed.retain(|&p| p != peer);
                // Its grant may be gone with it (a restarted process grants nobody): forget
                // its ack, so that growing it back starts with a new permission request.
                layout::store_own(fabric, layout::CONTROL, self.layout.ack_offset(peer), 0);
                self.forget_durable(fabric, peer);
                if matches!(self.phase, Phase::Grow { peer: growing, .. } if growing == peer) {
                    // Only that follower failed to join; the term goes on without it.
                    self.phase = Phase::Idle;
                    return;
                }
                let lost = self.current_round_mut().is_some_and(|r| r.posted_to(peer));
                let quorum = standing::quorum_rule(
                    &self.config,
                    self.quorum_members(),
                    &self.recovering,
                    self.all_voters.as_deref(),
                );
                if !quorum.reached(&self.confirmed)
                    || (lost && self.phase.round_mut().is_some_and(|r| r.is_lost(&[peer], &quorum)))
                {
                    self.abort("majority lost");
                } else if let Some(round) = self.current_round_mut() {
                    round.drop_peer(peer);
                }
            }
        }
    }

    fn current_round_mut(&mut self) -> Option<&mut Round> {
        self.phase.round_mut()
    }

    fn lag_round_mut(&mut self) -> Option<&mut Round> {
        match &mut self.lag {
            LagWork::ReadTail { round, .. } | LagWork::Restore { round, .. } => Some(round),
            LagWork::None => None,
        }
    }

    fn new_round(&mut self, posted: Peers, now: u64) -> Round {
        self.next_round_id += 1;
        Round::new(self.next_round_id, posted, now)
    }

    /// Posts to each of `peers` the operations `post` makes, the last one signaled with the
    /// round's id; returns the peers it could post to.
    fn post_to<F>(
        &mut self,
        fabric: &F,
        now: u64,
        peers: &[NodeId],
        round_id: u64,
        mut post: impl FnMut(&mut E, NodeId, u64) -> bool,
    ) -> Peers
    where
        F: Fabric<Endpoint = E>,
    {
        let mut posted = Peers::new();
        for &peer in peers {
            if let Some(ep) = self.links.ready(fabric, peer, now)
                && post(ep, peer, round_id)
            {
                posted.push(peer);
            }
        }
        posted
    }

    /// A round reading one 8-byte word, `src` of each of `peers`, into their SCRATCH `field`.
    fn read_word_round<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        peers: &[NodeId],
        src: RemoteAddr,
        field: u64,
    ) -> Round {
        let (layout, id) = (self.layout, self.round_id());
        let posted = self.post_to(fabric, now, peers, id, |ep, peer, id| {
            ep.post_read(id, src, 8, layout::SCRATCH, layout.scratch(peer, field), PostFlags::SIGNALED).is_ok()
        });
        self.new_round(posted, now)
    }

    /// An unsignaled WRITE of `data` to `peer` at `dst`; a failure surfaces as a completion.
    fn write_untracked<F: Fabric<Endpoint = E>>(
        &mut self,
        fabric: &F,
        now: u64,
        peer: NodeId,
        dst: RemoteAddr,
        data: &[u8],
    ) -> bool {
        self.links
            .ready(fabric, peer, now)
            .is_some_and(|ep| ep.post_write(WR_UNTRACKED, dst, data, PostFlags::NONE).is_ok())
    }

    /// A new round id for operations posted one peer at a time.
    fn round_id(&self) -> u64 {
        self.next_round_id + 1
    }

    /// Whether slots are judged complete by their canary alone (a planted bug).
    fn trust_canary(&self) -> bool {
        self.config.bug(crate::mu::planted::PlantedBug::TrustCanaryOnly)
    }

    /// Raises the recycling point to `tail` and publishes it in CONTROL for peers that check
    /// whether they fell behind.
    fn raise_tail<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, tail: u64) {
        if tail > self.tail {
            self.tail = tail;
            layout::store_own(fabric, layout::CONTROL, layout::TAIL, tail);
        }
    }

    /// The cluster size.
    pub fn replicas(&self) -> u16 {
        self.config.replicas
    }

    /// The next index this replica will apply (cheaper than [`Self::status`]).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Whether the plane has work under way: queued proposals, or a leader's round, catch-up
    /// or recycling in progress. A runtime polls a busy plane without pausing.
    pub fn is_busy(&self) -> bool {
        !self.pending.is_empty() || !matches!(self.phase, Phase::Follower | Phase::Idle)
    }

    /// The role this replica plays now (cheaper than [`Self::status`]).
    pub fn role(&self) -> Role {
        match self.phase {
            Phase::Follower => Role::Follower,
            Phase::Acquire { .. }
            | Phase::CatchUp { .. }
            | Phase::CatchUpCopy { .. }
            | Phase::CatchUpWait { .. }
            | Phase::Restore { .. } => Role::Candidate,
            _ => Role::Leader,
        }
    }

    /// This replica's protocol state.
    pub fn status(&self) -> Status {
        let role = self.role();
        let phase = match self.phase {
            Phase::Follower => Stage::Follow,
            Phase::Acquire { .. } | Phase::Reacquire { .. } => Stage::AcquirePermissions,
            Phase::CatchUp { .. } | Phase::CatchUpCopy { .. } | Phase::CatchUpWait { .. } => Stage::CatchUp,
            Phase::Restore { .. } => Stage::RestoreSnapshot,
            Phase::ReadMin { .. } | Phase::WriteRead { .. } => Stage::Prepare,
            Phase::Accept { .. } => Stage::Accept,
            Phase::Idle => Stage::Idle,
            Phase::ReadHeads { .. } => Stage::Recycle,
            Phase::Grow { .. } => Stage::GrowFollowers,
        };
        Status {
            node: self.me,
            role,
            phase,
            leader: self.leader,
            proposal_number: self.prop_nr,
            fuo: self.fuo,
            applied: self.applied,
            tail: self.tail,
            confirmed: self.confirmed.clone(),
            pending: self.pending.len(),
            terms_led: self.terms_led,
            prepares: self.prepares,
            voter: self.voter,
            configuration: self.configuration,
        }
    }

    /// Reads the entry in local log slot of `index` into `slot_buf` (see [`read_entry`]).
    fn read_local_slot<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, index: u64) -> bool {
        read_entry(fabric, layout::LOG, self.layout.slot_offset(index), &mut self.slot_buf, self.layout.slot_bytes())
    }
}

/// Reads the entry in the slot at `offset` of local `region` into `buf`, grown first to a whole
/// slot's `slot_bytes` if it is shorter (a leader's buffers may hold just an entry, see
/// `slot::Frame`): the header, then, if the slot is written, as many payload bytes as the header
/// announces and the canary after them, not the whole slot (`slot`: an entry occupies the start
/// of its slot). The rest of `buf` keeps what it held. A slot rewritten between the two reads
/// shows a header and a payload of different writes, which the checksum refuses as it refuses
/// a slot torn within one read. False if the fabric refused the read.
fn read_entry<F: Fabric>(
    fabric: &F,
    region: microrep_fabric::RegionId,
    offset: u64,
    buf: &mut Vec<u8>,
    slot_bytes: u64,
) -> bool {
    let slot_bytes = usize::try_from(slot_bytes).unwrap_or(usize::MAX);
    if buf.len() < slot_bytes {
        buf.resize(slot_bytes, 0);
    }
    let Some((header, rest)) = buf.split_at_mut_checked(slot::HEADER_BYTES) else { return false };
    if fabric.read_local(region, offset, header).is_err() {
        return false;
    }
    if !slot::is_written(header) {
        return true;
    }
    let body = slot::announced_len(header).saturating_add(slot::CANARY_BYTES);
    // A length past the slot leaves the body unread: `slot::decode` refuses the header.
    rest.get_mut(..body).is_none_or(|body| fabric.read_local(region, offset + slot::HEADER_BYTES as u64, body).is_ok())
}

#[cfg(test)]
mod tests {
    use super::PayloadPool;

    #[test]
    fn a_payload_pool_reuses_buffers_and_keeps_few_small_ones() {
        let mut pool = PayloadPool::default();
        let first = pool.copy(b"abc");
        assert_eq!(first.payload(), b"abc");
        let at = first.payload().as_ptr();
        pool.recycle(first.into_bytes());
        let again = pool.copy(b"xy");
        assert_eq!((again.payload(), again.payload().as_ptr()), (&b"xy"[..], at), "the spare buffer is reused");
        pool.recycle(Vec::with_capacity(65 << 10));
        assert!(pool.0.is_empty(), "a buffer over 64 KiB is not kept");
        for _ in 0..100 {
            pool.recycle(Vec::with_capacity(8));
        }
        assert_eq!(pool.0.len(), 64);
    }
}
