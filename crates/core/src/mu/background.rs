//! The background plane (Mu §5): heartbeats, pull-score failure detection, leader choice, and
//! the permission manager. It shares nothing with the replication plane but the fabric, the
//! local-log gate, and two facts passed in each poll: whether replication is stalled (fate
//! sharing) and nothing else.

use std::sync::Arc;

use microrep_fabric::{Completion, Endpoint, Fabric, NodeId, OpError, PostFlags, RemoteAddr};

use super::MuConfig;
use super::election::PullScore;
use super::gate::LocalLogGate;
use super::layout::{self, Layout};
use super::links::Links;
use super::membership::SharedMembers;
use super::pace::{self, Pace};
use super::planted::PlantedBug;

const WR_HEARTBEAT_READ: u64 = 1;
const WR_ACK: u64 = 2;

/// What the background plane learns from the replication plane at each poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicationFacts {
    /// The replication plane is stuck as a leader: heartbeats stop for the fate-sharing
    /// cooldown (Mu §5.1: a replica whose replication plane is stuck must look dead so that
    /// another leads).
    pub stalled: bool,
    /// It has work under way (queued proposals, a leader's round): the replica does not rest
    /// between heartbeats (see `mu::pace`).
    pub busy: bool,
}

/// Heartbeats, failure detection and permission management of one replica.
#[derive(Debug)]
pub struct BackgroundPlane<E> {
    config: MuConfig,
    layout: Layout,
    gate: Arc<LocalLogGate>,
    /// The members as the replication plane last applied them: only they lead, and only their
    /// permission requests are served.
    members: Arc<SharedMembers>,
    links: Links<E>,
    detector: PullScore,
    /// This replica's stride and the strides its peers announced (see `mu::pace`).
    pace: Pace,
    heartbeat: u64,
    /// Detection rounds run (see [`Self::rounds`]).
    rounds: u64,
    next_tick_ns: u64,
    silent_until_ns: u64,
    /// Until then this replica does not count itself among the candidates (set at the first
    /// poll, see [`MuConfig::join_grace_heartbeats`]).
    eligible_from_ns: Option<u64>,
    read_outstanding: Vec<bool>,
    last_request_served: Vec<u64>,
    last_request_acked: Vec<u64>,
    /// Whether each peer's last heartbeat read showed it leading a term.
    leads_term: Vec<bool>,
    /// Whether this replica is a voter, as of the last poll.
    voter: bool,
    /// Whether the application asked this replica not to lead (see `set_candidate`).
    abstaining: bool,
    /// Whether the last poll left a permission request of a live requester unserved or
    /// unacknowledged (to be retried at the next poll).
    permissions_pending: bool,
    /// The leader chosen at the end of the last poll, and the one chosen before it: while
    /// either's score moves, a permission request is on its way (see [`Self::calm_until`]).
    chosen: NodeId,
    former: Option<NodeId>,
    completions: Vec<(microrep_fabric::NodeId, Completion)>,
}

impl<E: Endpoint> BackgroundPlane<E> {
    /// The background plane of `config.node`.
    pub fn new(config: &MuConfig, gate: Arc<LocalLogGate>, members: Arc<SharedMembers>) -> Self {
        let n = usize::from(config.replicas);
        Self {
            config: config.clone(),
            layout: Layout::new(config),
            gate,
            members,
            links: Links::new(config.node, config.replicas, config.heartbeat_period_ns * 8, true),
            detector: PullScore::new(config),
            pace: Pace::new(config),
            heartbeat: 0,
            rounds: 0,
            next_tick_ns: 0,
            silent_until_ns: 0,
            eligible_from_ns: None,
            read_outstanding: vec![false; n],
            last_request_served: vec![0; n],
            last_request_acked: vec![0; n],
            leads_term: vec![false; n],
            voter: false,
            abstaining: false,
            permissions_pending: false,
            chosen: config.node,
            former: None,
            completions: Vec::new(),
        }
    }

    /// The replica this one believes leads. While fate-sharing, during its join grace, while
    /// it is not a voter (see `standing`) or not a member (see `membership`), and while it
    /// abstains, this replica does not count itself among the candidates.
    pub fn leader(&self, now: u64) -> NodeId {
        if self.deferring(now) { self.detector.leader_among_peers() } else { self.detector.leader(self.claim(now)) }
    }

    /// Detection rounds run so far: each heartbeat period READs every peer's heartbeat, and the
    /// READs of round `r` are taken into the view before round `r + 1` starts.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Whether this replica may be chosen to lead (the default), or abstains: it stays a voter
    /// that accepts the leader's entries and counts in majorities, but neither it nor its peers
    /// (who read the abstention with its heartbeat) choose it while another live voter can
    /// lead. Which replica leads does not bear on safety (Mu §5.1): this is a liveness hint
    /// from the application, e.g. a wrapped server whose copy cannot serve until rebuilt.
    pub fn set_candidate(&mut self, candidate: bool) {
        self.abstaining = !candidate;
    }

    fn deferring(&self, now: u64) -> bool {
        !self.voter
            || self.abstaining
            || now < self.silent_until_ns
            || self.eligible_from_ns.is_none_or(|t| now < t)
            || !self.members.get().contains(self.config.node)
    }

    /// Whether this replica leads or tries to (its replication plane says so, and it is a
    /// candidate whose own log is granted to itself), with the proposal number of the term it
    /// leads (0 while still acquiring).
    fn claim(&self, now: u64) -> Option<u64> {
        let owns = !self.deferring(now) && self.gate.owner() == Some(self.config.node);
        self.gate.claim().filter(|_| owns)
    }

    /// How long peers take to see a replica live again once its heartbeat resumes.
    fn recovery_window_ns(&self) -> u64 {
        (u64::from(self.config.score_recover_above) + 2) * self.config.heartbeat_period_ns
    }

    /// When the next poll is due while nothing is in motion: the next heartbeat tick (or the
    /// end of a join grace or a silence, if sooner), but, at stride 1, no later than a quarter
    /// of the permission timeout from `now`, if the scores of the leader this replica chooses
    /// and of the one it chose before are settled ([`PullScore::settled`]) with their heartbeat
    /// READs taken into the view, and no permission request waits for a retry. `None` while
    /// something moves: the caller polls at its own pace then. A runtime parks until then
    /// instead of polling every few microseconds, so an idle cluster is idle. A fail-over
    /// stays fast: the failed leader's first missed heartbeats unsettle its score on every
    /// survivor, which then polls at its own pace before the new leader's permission request
    /// lands, and goes on until the failed leader's score has settled at zero. Other peers do
    /// not count: one that fails or comes back changes no leader (a live leader keeps
    /// leading), and in a large group on few cores some peer's heartbeat is always late. Their
    /// READs still outstanding are taken at the next tick's poll, before it posts new ones. A
    /// request made while everything is calm (a planned switch: a leader that abstains, a
    /// restarted replica taking over) is served within a quarter of the requester's permission
    /// timeout, well before it gives up (with 50 ms heartbeats and a 25 ms timeout, resting
    /// until the next tick let a wrapped cluster's leaders time out over and over); a replica
    /// resting at a longer stride (`mu::pace`) serves it at its next tick, and the requester,
    /// which read that stride, waits that much longer ([`LocalLogGate::peers_rest_ns`]).
    pub fn calm_until(&self, now: u64) -> Option<u64> {
        let soon = |t: u64| if t > now { t } else { u64::MAX };
        let due = self.next_tick_ns.min(soon(self.silent_until_ns)).min(self.eligible_from_ns.map_or(u64::MAX, soon));
        let cap = if self.pace.stride() > 1 { u64::MAX } else { now + self.config.permission_timeout_ns / 4 };
        self.calm(now).then_some(due.min(cap))
    }

    /// Whether the leaders this replica chooses and chose before have settled scores with no
    /// READ of theirs in flight, and no permission request waits for a retry.
    fn calm(&self, now: u64) -> bool {
        let in_flight = self.leaders(now).any(|p| self.read_outstanding[usize::from(p.0)]);
        self.settled(now) && !in_flight
    }

    /// Whether the leaders this replica chooses and chose before have settled scores, and no
    /// permission request waits for a retry.
    fn settled(&self, now: u64) -> bool {
        !self.permissions_pending && self.leaders(now).all(|p| self.detector.settled(p))
    }

    /// The leader this replica chooses, the one it chose at the last poll, and the one before.
    fn leaders(&self, now: u64) -> impl Iterator<Item = NodeId> {
        [Some(self.leader(now)), Some(self.chosen), self.former].into_iter().flatten()
    }

    /// The stride this replica may rest at if its replication plane has been quiet long enough
    /// (see `mu::pace`): 1 unless its leaders' scores are settled, no leader it chose missed a
    /// heartbeat or has a heartbeat READ overdue, no failed peer is coming back and it is not
    /// silent; then `idle_stride` if it leads a term, else the stride of the leader it follows.
    fn resting_stride(&self, now: u64) -> u8 {
        let missed = self
            .leaders(now)
            .any(|p| self.pace.missed(p) || self.pace.overdue(p, self.read_outstanding[usize::from(p.0)], now));
        let returning = self.links.peers().any(|p| !self.detector.is_live(p) && !self.detector.settled(p));
        if !self.settled(now) || missed || returning || now < self.silent_until_ns {
            return 1;
        }
        match self.leader(now) {
            me if me == self.config.node => {
                if self.claim(now).is_some_and(|term| term > 0) {
                    self.config.idle_stride
                } else {
                    1
                }
            }
            leader => self.pace.peer_stride(leader),
        }
    }

    /// Whether this replica rests between heartbeats at a stride above 1 (see `mu::pace`).
    pub fn resting(&self) -> bool {
        self.pace.stride() > 1
    }

    /// The failure detector's view.
    pub fn detector(&self) -> &PullScore {
        &self.detector
    }

    /// Does the background work due at `now`, with what the replication plane reports (see
    /// [`ReplicationFacts`]).
    pub fn poll<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64, replication: ReplicationFacts) {
        let grace = u64::from(self.config.join_grace_heartbeats) * self.config.heartbeat_period_ns;
        self.eligible_from_ns.get_or_insert(now + grace);
        let standing = fabric.load_u64(layout::CONTROL, layout::STANDING).unwrap_or(0);
        let voter = standing == self.config.incarnation;
        if voter != self.voter {
            self.voter = voter;
            // Acks given while recovering carried the flag: give them again.
            self.last_request_acked.fill(0);
            // A new voter waits out the join grace (two heartbeats at least) before it leads,
            // so that it first reads which of its peers became voters with it (a cluster
            // bootstrapping together would otherwise pass leadership around).
            self.eligible_from_ns = Some(now + grace.max(2 * self.config.heartbeat_period_ns));
        }
        self.take_completions(fabric);
        if self.pace.stride() > 1 && (replication.busy || self.resting_stride(now) == 1) {
            // Work arrived, or something stirred (a leader's promised heartbeat did not come):
            // tick every period again.
            self.next_tick_ns = self.next_tick_ns.min(self.pace.hurried_tick_ns());
        }
        // After a silence, heartbeat long enough for peers to see this replica live again before
        // the next one: two stalled candidates that each look dead to the other would otherwise
        // stay silent for good and keep taking permissions from each other.
        let heard_again = self.silent_until_ns + self.recovery_window_ns();
        if replication.stalled && now >= heard_again {
            tracing::debug!(node = self.config.node.0, "replication stalled: fate sharing");
            self.silent_until_ns = now + self.config.fate_share_cooldown_ns;
        }
        if now >= self.next_tick_ns {
            let quiet = !replication.busy && !replication.stalled;
            let fuo = fabric.load_u64(layout::LOG, layout::FUO).unwrap_or(0);
            let stride = self.pace.tick(now, quiet, fuo, self.resting_stride(now));
            self.next_tick_ns = self.pace.next_tick_ns();
            self.rounds += 1;
            if now >= self.silent_until_ns {
                self.heartbeat += 1;
                // A replica that is not a member (removed, or a joiner) abstains too: peers that
                // have not applied its removal yet would otherwise wait for it to lead.
                let member = self.members.get().contains(self.config.node);
                let abstains = if self.abstaining || !member { layout::LEADING_ABSTAINS } else { 0 };
                let claim = self.claim(now).map_or(0, |term| term << 2 | 1);
                layout::store_own(fabric, layout::CONTROL, layout::LEADING, claim | abstains);
                layout::store_own(
                    fabric,
                    layout::CONTROL,
                    layout::HEARTBEAT,
                    pace::heartbeat_word(self.heartbeat, stride),
                );
            }
            self.read_heartbeats(fabric, now);
        }
        self.manage_permissions(fabric, now);
        // A would-be leader's permission requests may be served this much later.
        self.gate.set_peers_rest_ns(self.pace.rest_ns(|p| self.detector.is_live(p)));
        let chosen = self.leader(now);
        if chosen != self.chosen {
            self.former = Some(std::mem::replace(&mut self.chosen, chosen));
        }
    }

    fn take_completions<F: Fabric<Endpoint = E>>(&mut self, fabric: &F) {
        self.completions.clear();
        self.links.drain(&mut self.completions);
        for (peer, c) in std::mem::take(&mut self.completions) {
            let lost = matches!(c.status, Err(OpError::Transport | OpError::Flushed));
            if c.wr_id == WR_ACK && lost && self.gate.owner() == Some(peer) {
                // The ack was lost on the way to a live requester: send it again while the
                // requester still holds the grant.
                self.last_request_acked[usize::from(peer.0)] = 0;
            }
            if c.wr_id != WR_HEARTBEAT_READ {
                continue;
            }
            self.read_outstanding[usize::from(peer.0)] = false;
            let word = |field| fabric.load_u64(layout::SCRATCH, self.layout.scratch(peer, field)).ok();
            let counter = match c.status {
                Ok(()) => word(layout::SCRATCH_HEARTBEAT),
                Err(_) => None,
            };
            if counter.is_some() {
                // Read just before the counter: a peer is a candidate only as a voter that does
                // not abstain.
                let standing = word(layout::SCRATCH_STANDING).unwrap_or(0);
                let voter = standing != 0 && Some(standing) == word(layout::SCRATCH_STANDING_INCARNATION);
                let leading = word(layout::SCRATCH_LEADING).unwrap_or(0);
                // A peer that leads a term counts even if this replica's configuration, perhaps
                // older than the leader's, does not hold it: following it is how this replica
                // catches up (which replica leads bears on liveness only, Mu §5.1).
                let leads = leading & 1 == 1 && leading >> 2 != 0;
                self.leads_term[usize::from(peer.0)] = leads;
                let member = self.members.get().contains(peer) || leads;
                let candidate = voter && member && leading & layout::LEADING_ABSTAINS == 0;
                self.detector.set_standing(peer, candidate, (leading & 1 == 1).then_some(leading >> 2));
            }
            let moved = counter.is_some_and(|c| self.detector.moved(peer, c));
            if self.pace.judge(peer, counter, moved) {
                self.observe(peer, counter);
            }
        }
    }

    fn observe(&mut self, peer: NodeId, counter: Option<u64>) {
        if self.detector.observe(peer, counter) {
            tracing::debug!(
                node = self.config.node.0,
                peer = peer.0,
                live = self.detector.is_live(peer),
                "liveness changed"
            );
        }
    }

    /// Mu §5.1 pull-score: READ every peer's heartbeat counter once per period. A READ still
    /// outstanding from the previous period counts as silence.
    fn read_heartbeats<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let peers: Vec<NodeId> = self.links.peers().collect();
        for peer in peers {
            let i = usize::from(peer.0);
            if self.read_outstanding[i] {
                self.pace.silent(peer);
                self.observe(peer, None);
                continue;
            }
            let dst = self.layout.scratch(peer, layout::SCRATCH_HEARTBEAT);
            let standing_dst = self.layout.scratch(peer, layout::SCRATCH_STANDING);
            let posted = self.links.ready(fabric, peer, now).is_some_and(|ep| {
                let standing = RemoteAddr::new(layout::CONTROL, layout::STANDING);
                let src = RemoteAddr::new(layout::CONTROL, layout::HEARTBEAT);
                ep.post_read(0, standing, 24, layout::SCRATCH, standing_dst, PostFlags::NONE).is_ok()
                    && ep.post_read(WR_HEARTBEAT_READ, src, 8, layout::SCRATCH, dst, PostFlags::SIGNALED).is_ok()
            });
            if posted {
                self.read_outstanding[i] = true;
                self.pace.posted(peer, now);
            } else {
                self.pace.silent(peer);
                self.observe(peer, None);
            }
        }
    }

    /// Mu §5.2 permission manager: serve new permission requests in requester order. Serving
    /// one revokes write access to the local log from every other replica, grants it to the
    /// requester, and acks by writing the request number into the requester's CONTROL region.
    fn manage_permissions<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let me = self.config.node;
        self.permissions_pending = false;
        for r in 0..self.config.replicas {
            let (requester, i) = (NodeId(r), usize::from(r));
            let Ok(request) = fabric.load_u64(layout::CONTROL, self.layout.request_offset(requester)) else {
                continue;
            };
            if request == 0 {
                continue;
            }
            if request != self.last_request_served[i] {
                if requester != me && !self.members.get().contains(requester) && !self.leads_term[i] {
                    // Not a member as far as this replica applied (removed, or not added yet),
                    // and not leading a term (which would make this replica's configuration the
                    // stale one): it may not lead.
                    continue;
                }
                if requester != me && !self.detector.is_live(requester) {
                    // A request from a replica this one holds failed is left unserved until it is
                    // live again: a leader paused long enough to be replaced wakes with its old
                    // request still landing, which would take the permissions from its successor.
                    continue;
                }
                tracing::trace!(node = me.0, requester = r, request, "serving a permission request");
                if !self.serve(fabric, requester) {
                    // Left unserved; retried on the next poll.
                    self.permissions_pending = true;
                    return;
                }
            }
            self.last_request_served[i] = request;
            if request == self.last_request_acked[i] {
                continue;
            }
            // A recovering replica grants, but flags its ack so that it is not counted.
            let ack = if self.voter { request } else { request | layout::ACK_RECOVERING };
            let acked = if requester == me {
                fabric.store_u64(layout::CONTROL, self.layout.ack_offset(me), ack).is_ok()
            } else {
                let dst = RemoteAddr::new(layout::CONTROL, self.layout.ack_offset(me));
                self.links
                    .ready(fabric, requester, now)
                    .is_some_and(|ep| ep.post_write(WR_ACK, dst, &ack.to_le_bytes(), PostFlags::NONE).is_ok())
            };
            // An ack that could not be posted is retried on the next poll (the grant is not).
            if acked {
                self.last_request_acked[i] = request;
            } else if requester == me || self.detector.is_live(requester) {
                self.permissions_pending = true;
            }
        }
    }

    /// Gives `requester` exclusive write access to the local log (remote peers through fabric
    /// permissions, this replica through the local-log gate). False if a revoke failed.
    fn serve<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, requester: NodeId) -> bool {
        let me = self.config.node;
        if !self.config.bug(PlantedBug::SkipRevoke) {
            for other in self.links.peers().filter(|&p| p != requester) {
                if let Err(e) = fabric.revoke_write(layout::LOG, other) {
                    tracing::warn!(node = me.0, peer = other.0, error = %e, "revoke failed");
                    return false;
                }
            }
            self.gate.set_owner(requester);
        } else if requester == me {
            self.gate.set_owner(me);
        }
        requester == me || fabric.grant_write(layout::LOG, requester).is_ok()
    }
}
