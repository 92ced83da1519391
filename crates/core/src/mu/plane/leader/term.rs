//! The leader's own state: the phase of its state machine and what its term knows. Only the
//! leader's modules (`leader` and its children) change it; the rest of the plane reads it
//! through the methods below.

use std::collections::VecDeque;

use microrep_fabric::NodeId;

use super::super::round::Round;
use super::standing::Standing;
use crate::mu::MuConfig;
use crate::mu::api::{Role, Stage};
use crate::mu::membership::MemberSet;
use crate::mu::slot::{EntryKind, Frame};

/// A request waiting to be replicated.
#[derive(Clone, Debug)]
pub(super) struct Proposal {
    pub(super) request_id: u64,
    pub(super) kind: EntryKind,
    /// The payload, with room for the entry's header and canary: sealed in place when accepted.
    pub(super) payload: Frame,
}

/// An entry being accepted, owned.
#[derive(Clone, Debug)]
pub(super) struct OwnedEntry {
    pub(super) proposer: NodeId,
    pub(super) request_id: u64,
    pub(super) kind: EntryKind,
    /// A value adopted from a prepare; `None` for this leader's own request, whose payload is
    /// that of the front of `pending` (sealed there: no copy).
    pub(super) payload: Option<Frame>,
}

/// Where the leader's state machine stands (Mu §4, Listing 2 and §4.2).
#[derive(Clone, Debug)]
pub(super) enum Phase {
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
    pub(super) fn round_mut(&mut self) -> Option<&mut Round> {
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

/// The leader's state: its phase, its term's followers, proposal number and queue.
#[derive(Debug)]
pub(in crate::mu::plane) struct Term {
    pub(super) phase: Phase,
    /// First undecided offset as this replica (when leading) knows it.
    pub(super) fuo: u64,
    pub(super) prop_nr: u64,
    pub(super) request_no: u64,
    /// The first permission request of the current attempt to lead: acks at least this high
    /// were given to this attempt.
    pub(super) term_request: u64,
    pub(super) confirmed: Vec<NodeId>,
    /// Omit-prepare (Mu §4.2): the index at which this term's prepare walk found every read
    /// slot empty; accepts go without prepares while set. Cleared whenever the confirmed set
    /// grows or the term ends, so that a new walk starts (A.4.4, A.4.5(b)).
    pub(super) walk_ended_at: Option<u64>,
    pub(super) pending: VecDeque<Proposal>,
    pub(super) front_written: bool,
    pub(super) last_progress_ns: u64,
    pub(super) next_recycle_ns: u64,
    /// With `recycle_wait_ns`: the lowest head among this leader and its confirmed followers
    /// at the last recycling, and since when it has been that low.
    pub(super) slowest_head: (u64, u64),
    pub(super) next_grow_ns: Vec<u64>,
    pub(super) fuo_pushed: u64,
    pub(super) next_keepalive_ns: u64,
    pub(super) terms_led: u64,
    pub(super) prepares: u64,
    /// What the leader knows of its followers' standing (`standing`, its state private there).
    pub(super) standing: Standing,
    /// The epoch of the configuration the current term's quorums were formed under, and its
    /// members.
    pub(super) term_epoch: u64,
    pub(super) term_members: MemberSet,
    /// Nothing is proposed before this replica applied every entry below this index, which may
    /// hold a `Membership` entry (what catch-up copied, or a change just committed): a term's
    /// quorums must be those of the configuration at its FUO.
    pub(super) config_known_from: u64,
}

impl Term {
    /// A replica that does not lead, for `config`, at `now`.
    pub(in crate::mu::plane) fn new(config: &MuConfig, now: u64) -> Self {
        Self {
            phase: Phase::Follower,
            fuo: 0,
            prop_nr: 0,
            request_no: crate::mu::layout::first_request(config.incarnation),
            term_request: 0,
            confirmed: Vec::new(),
            walk_ended_at: None,
            pending: VecDeque::new(),
            front_written: false,
            last_progress_ns: now,
            next_recycle_ns: now,
            slowest_head: (0, now),
            next_grow_ns: vec![0; usize::from(config.replicas)],
            fuo_pushed: 0,
            next_keepalive_ns: now,
            terms_led: 0,
            prepares: 0,
            standing: Standing::default(),
            term_epoch: 0,
            term_members: config.members,
            config_known_from: 0,
        }
    }

    /// Whether this replica leads or tries to.
    pub(in crate::mu::plane) fn leading(&self) -> bool {
        !matches!(self.phase, Phase::Follower)
    }

    /// Whether this replica leads past its catch-up: it knows its FUO, and the slot after it
    /// holds nothing committed that it does not know of.
    pub(in crate::mu::plane) fn knows_fuo(&self) -> bool {
        matches!(self.phase, Phase::Idle | Phase::Accept { .. })
    }

    /// The first undecided offset, as this replica last knew it while leading.
    pub(in crate::mu::plane) fn fuo(&self) -> u64 {
        self.fuo
    }

    /// The replica applied (or restored) everything below `index`: it is decided.
    pub(in crate::mu::plane) fn decided_below(&mut self, index: u64) {
        self.fuo = self.fuo.max(index);
    }

    /// The followers of this term.
    pub(in crate::mu::plane) fn confirmed(&self) -> &[NodeId] {
        &self.confirmed
    }

    /// The quorum round the leader waits on, if any.
    pub(in crate::mu::plane) fn round_mut(&mut self) -> Option<&mut Round> {
        self.phase.round_mut()
    }

    /// Whether requests are queued or a round, catch-up or recycling is under way.
    pub(in crate::mu::plane) fn is_busy(&self) -> bool {
        !self.pending.is_empty() || !matches!(self.phase, Phase::Follower | Phase::Idle)
    }

    /// Whether this replica leads, or tries to, and made no progress for longer than `timeout`.
    pub(in crate::mu::plane) fn stalled(&self, now: u64, timeout: u64) -> bool {
        self.leading() && now.saturating_sub(self.last_progress_ns) > timeout
    }

    /// Following, or leading with nothing to do, is no stall.
    pub(in crate::mu::plane) fn note_poll(&mut self, now: u64) {
        let idle = matches!(self.phase, Phase::Idle) && self.pending.is_empty();
        if idle || !self.leading() {
            self.last_progress_ns = now;
        }
    }

    /// The role this replica plays.
    pub(in crate::mu::plane) fn role(&self) -> Role {
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

    /// The step of the protocol this replica is at.
    pub(in crate::mu::plane) fn stage(&self) -> Stage {
        match self.phase {
            Phase::Follower => Stage::Follow,
            Phase::Acquire { .. } | Phase::Reacquire { .. } => Stage::AcquirePermissions,
            Phase::CatchUp { .. } | Phase::CatchUpCopy { .. } | Phase::CatchUpWait { .. } => Stage::CatchUp,
            Phase::Restore { .. } => Stage::RestoreSnapshot,
            Phase::ReadMin { .. } | Phase::WriteRead { .. } => Stage::Prepare,
            Phase::Accept { .. } => Stage::Accept,
            Phase::Idle => Stage::Idle,
            Phase::ReadHeads { .. } => Stage::Recycle,
            Phase::Grow { .. } => Stage::GrowFollowers,
        }
    }

    /// The proposal number of this term's prepares.
    pub(in crate::mu::plane) fn proposal_number(&self) -> u64 {
        self.prop_nr
    }

    /// Terms this replica led, and prepares it ran.
    pub(in crate::mu::plane) fn counts(&self) -> (u64, u64) {
        (self.terms_led, self.prepares)
    }

    /// Requests queued.
    pub(in crate::mu::plane) fn pending(&self) -> usize {
        self.pending.len()
    }
}
