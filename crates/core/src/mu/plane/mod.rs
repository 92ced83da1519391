//! The replication plane of one replica, made of sub-machines that each own their state,
//! private to their module (the compiler enforces it: a module sees its own state and what
//! this file shares, never a sibling's):
//!
//! - `leader`: the leader's replicator (Mu §4, Listing 2, §4.2, §5.3) and, in its children,
//!   standing and promotion, growing the confirmed set, recycling, catch-up and proposals;
//! - `replayer`: every replica's replayer (Mu §4.2, A.4.3), snapshots and state transfer;
//! - `bootstrap`: a recovering replica's bootstrap rounds;
//! - `durable`: the disks' progress (`MuConfig::durable`).
//!
//! This file holds what they share (links, layout, configuration, the events of a poll), the
//! poll that drives them in turn, posting and completion dispatch.

use std::sync::Arc;

use microrep_fabric::{Completion, Endpoint, Fabric, NodeId, OpError, PostFlags, RemoteAddr};
use rustc_hash::FxHashSet;

mod bootstrap;
mod durable;
mod leader;
mod replayer;
mod round;

pub use replayer::APPLY_PER_POLL;

use crate::mu::MuConfig;
use crate::mu::api::{Event, LeaderView, Role, StateMachine, Status};
use crate::mu::gate::LocalLogGate;
use crate::mu::layout::{self, Layout};
use crate::mu::links::Links;
use crate::mu::membership::{Configuration, MemberSet, MembershipChange, SharedMembers};
use crate::mu::slot::{self, Frame};
use bootstrap::Bootstrap;
use durable::Durability;
use leader::Term;
use replayer::Replay;
use round::{Peers, Round};

/// Work-request id of operations whose success nobody waits for.
const WR_UNTRACKED: u64 = 0;

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

/// The replication plane of one replica: what its sub-machines share, and the sub-machines,
/// each owning its state (private to its module).
#[derive(Debug)]
pub struct ReplicationPlane<E> {
    config: MuConfig,
    layout: Layout,
    me: NodeId,
    gate: Arc<LocalLogGate>,
    links: Links<E>,
    /// The leader the failure detector chose, as of the last poll.
    leader: NodeId,
    /// The recycling point of this replica's log: nothing below it is held any more.
    tail: u64,
    /// Requests of this replica that committed (or may have) and are not applied yet: a hash
    /// set keeps its table when it empties, where a B-tree set allocated and freed a node per
    /// commit.
    awaiting_apply: FxHashSet<u64>,
    next_round_id: u64,
    /// The failure detector's rounds, as of the last poll (see [`LeaderView`]).
    rounds: u64,
    /// A whole slot's buffer, for reads of one slot.
    slot_buf: Vec<u8>,
    /// Payload buffers of committed proposals, reused for the next ones (the replication hot
    /// path allocates nothing per command once warm).
    spare_payloads: PayloadPool,
    events: Vec<Event>,
    /// Whether this replica counts in quorums (see `leader::standing`), as of the last poll.
    voter: bool,
    /// The configuration this replica applied (`crate::mu::membership`), published to the
    /// background plane through `shared_members`.
    configuration: Configuration,
    shared_members: Arc<SharedMembers>,
    /// The replicas the failure detector held live at the last poll.
    live: MemberSet,
    completions: Vec<(NodeId, Completion)>,
    /// The leader's state machine (`leader`).
    term: Term,
    /// The replayer's state (`replayer`).
    replay: Replay,
    /// A recovering replica's bootstrap rounds (`bootstrap`).
    boot: Bootstrap,
    /// The disks' progress and the requests waiting for it (`durable`).
    durability: Durability,
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
            leader: NodeId(0),
            tail: 0,
            awaiting_apply: FxHashSet::default(),
            next_round_id: 16,
            rounds: 0,
            slot_buf: vec![0; config.slot_bytes as usize],
            spare_payloads: PayloadPool::default(),
            events: Vec::new(),
            voter: false,
            configuration: Configuration { members: config.members, epoch: 0 },
            shared_members,
            live: MemberSet::default(),
            completions: Vec::new(),
            term: Term::new(config, now),
            replay: Replay::new(now),
            boot: Bootstrap::new(now),
            durability: Durability::default(),
        }
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
        self.term.stalled(now, self.config.fate_share_timeout_ns)
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
        self.term.note_poll(now);
        if leader == self.me && !self.term.leading() && self.voter && self.is_member() {
            self.start_acquire(fabric, now);
        } else if (leader != self.me || !self.is_member()) && self.term.leading() {
            self.step_down(fabric, now);
        }
        self.dispatch_completions(fabric);
        if self.term.leading() {
            self.drive_leader(fabric, now, app);
            // A fabric that completes as it posts (shm) has the acks of what was just posted:
            // taking them in this poll lets an accept commit in the poll that proposed it.
            if self.dispatch_completions(fabric) && self.term.leading() {
                self.drive_leader(fabric, now, app);
            }
        }
        self.apply_committed(fabric, now, app);
        self.poll_durability(fabric, now);
        if !self.term.leading() {
            self.check_lag(fabric, now, app);
        }
        self.check_bootstrap(fabric, now);
        events.append(&mut self.events);
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
                    if let Some(round) = self.term.round_mut().filter(|r| r.id == c.wr_id) {
                        round.ack(peer);
                    }
                    if let Some(round) = self.replay.lag_round_mut().filter(|r| r.id == c.wr_id) {
                        round.ack(peer);
                    }
                    if let Some(round) = self.boot.round_mut().filter(|r| r.id == c.wr_id) {
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
        self.replay.peer_failed(peer);
        self.boot.peer_failed(peer);
        if self.term.leading() {
            self.leader_peer_failed(fabric, peer, error);
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
        self.replay.applied()
    }

    /// Whether the plane has work under way: queued proposals, or a leader's round, catch-up
    /// or recycling in progress. A runtime polls a busy plane without pausing.
    pub fn is_busy(&self) -> bool {
        self.term.is_busy()
    }

    /// The role this replica plays now (cheaper than [`Self::status`]).
    pub fn role(&self) -> Role {
        self.term.role()
    }

    /// This replica's protocol state.
    pub fn status(&self) -> Status {
        let (terms_led, prepares) = self.term.counts();
        Status {
            node: self.me,
            role: self.term.role(),
            phase: self.term.stage(),
            leader: self.leader,
            proposal_number: self.term.proposal_number(),
            fuo: self.term.fuo(),
            applied: self.replay.applied(),
            tail: self.tail,
            confirmed: self.term.confirmed().to_vec(),
            pending: self.term.pending(),
            terms_led,
            prepares,
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
