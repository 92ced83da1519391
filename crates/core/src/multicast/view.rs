//! Failure detection and the view change with ragged-edge cleanup (Derecho §3.3). This file is
//! one view's side of a change, up to installing the next view; agreeing on that view is
//! `agreement.rs`, running it (a fresh SST, joins, state transfer) `next.rs`.
//!
//! Every member raises a heartbeat word in its row's view block each period; a member whose
//! heartbeat stays unchanged for `suspect_after_ns` is **suspected**, and suspicions spread by
//! each member OR-ing the suspected sets of the rows it still trusts (they only grow). A member
//! that suspects anyone, or sees a join request (`next::JoinRequest`) in a trusted row (it
//! adopts it if it has none, so the request outlives its proposer), **wedges**: it stops sending, receiving and delivering, pushes its (now final) counter blocks
//! to every member and only then sets `wedged` in its view block, on the same FIFO endpoints,
//! so `wedged` guards the final counters. The wedged members then agree on the next view
//! (`agreement.rs`): the leader, the lowest rank not suspected, proposes the members to leave
//! out, a join request and, per subgroup, the **ragged trim** (for each sender, the smallest
//! final `received` among the kept members); a majority of the view accepts; a new leader takes
//! over a suspected one. Every member that learns the decided value delivers, in the subgroup's
//! order, every message below the trim and stops at the first one beyond it, installs the new
//! view (the kept members, then the joiner), and publishes the value as decided with
//! `wedged = 2`. Members that wedged on different suspicions or joins all install the leader's
//! value; a member the value leaves out stops (`Phase::Excluded`).
//!
//! **Without a majority the group stops.** A next view needs a majority of the view
//! (`agreement.rs`), and suspicions only grow, so a wedged member whose unsuspected members are
//! no majority of the view can only go on by learning a value a majority decided without it
//! (or that leaves it out). It waits `suspect_after_ns` after its last new suspicion for such a
//! value to reach it (a member that learned one keeps pushing it until this member installs),
//! then stops with [`MulticastError::MajorityLost`] instead of staying wedged for good (Derecho
//! shuts a member down at once when it suspects half of its view; the wait lets a value decided
//! just before the last suspicion still be installed). This is the end, too, of a group whose
//! joiner never starts because every holder of its state failed after the install and the view
//! counting the joiner has no majority without it (docs/MULTICAST.md).
//!
//! Why nothing delivered is lost: a message delivered anywhere (a failed member included) was
//! received by every member before, so it is below every kept member's final `received`, hence
//! below the trim; and every kept member holds every message below the trim (it computed from
//! their final counters, read after their `wedged`).

use microrep_fabric::{Fabric, NodeId, RemoteAddr};

use super::agreement::{Agreement, Proposal};
use super::api::{Deliver, MulticastError, Stats};
use super::config::FailureDetection;
use super::layout::{SST_REGION, view_word};
use super::member::{Ctx, Link, Subgroup, post};
use super::planted::PlantedBug;

/// Where a member stands in the view change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Sending and delivering in the current view.
    Running,
    /// A member is suspected (or a join requested): stopped, waiting for agreement on the next
    /// view.
    Wedged,
    /// Cleanup done; the next view is `View`.
    Installed(View),
    /// Other members suspected this one: it delivers nothing more.
    Excluded,
    /// A joiner waiting for its state transfer.
    Joining,
}

/// A view installed after a failure or a join.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// Its epoch: the old view's plus one.
    pub epoch: u64,
    /// Its members: the old view's live members in their rank order, then the joiner.
    pub members: Vec<NodeId>,
    /// The member that joined in this view, if any.
    pub joined: Option<NodeId>,
    /// Per subgroup of the old view, the sequence numbers this member delivered in it (nulls
    /// included), `None` where it is not a member (and at a joiner); equal at every member of a
    /// subgroup that installed this view.
    pub delivered: Vec<Option<u64>>,
}

/// A member's failure detector and view-change state.
#[derive(Debug)]
pub(super) struct ViewState {
    detection: FailureDetection,
    me: usize,
    heartbeat: u64,
    next_beat_ns: u64,
    /// Per group rank: the last heartbeat seen and when it changed.
    seen: Vec<Option<(u64, u64)>>,
    /// The ranks this member suspects (its own detection and every trusted row's set).
    suspected: u64,
    /// When `suspected` last grew.
    suspected_at_ns: u64,
    /// The rank of the member that joined in this view, at the members that were in the one
    /// before (`detect`).
    joiner: Option<usize>,
    /// The join request this member proposed or adopted and has not seen admitted
    /// (`next::JoinRequest` word; 0: none).
    join: u64,
    /// Installed: the kept members whose heartbeat stopped during the cleanup.
    stale: u64,
    pub(super) phase: Phase,
    agreement: Agreement,
    /// The next view, once agreed.
    decided: Option<Proposal>,
    /// Raised when the view block's header changes; per link, the version last pushed.
    version: u64,
    pushed: Vec<Option<u64>>,
}

fn bit(rank: usize) -> u64 {
    1 << rank
}

impl ViewState {
    pub(super) fn new(detection: FailureDetection, me: usize, members: usize, links: usize) -> Self {
        Self {
            detection,
            me,
            heartbeat: 0,
            next_beat_ns: 0,
            seen: vec![None; members],
            suspected: 0,
            suspected_at_ns: 0,
            joiner: None,
            join: 0,
            stale: 0,
            phase: Phase::Running,
            agreement: Agreement::new(members, me, links),
            decided: None,
            version: 1,
            pushed: vec![None; links],
        }
    }

    /// Rank `rank` joined in this view: its silence before it is first heard from counts from
    /// this member's latest new suspicion (`detect`).
    pub(super) fn expect_joiner(&mut self, rank: usize) {
        self.joiner = Some(rank);
    }

    /// The group ranks this member suspects.
    pub(super) fn suspected(&self) -> u64 {
        self.suspected
    }

    /// This member's own pending join request word (0: none).
    pub(super) fn join(&self) -> u64 {
        self.join
    }

    /// The join request of the agreed next view (0: none, or not agreed yet).
    pub(super) fn decided_join(&self) -> u64 {
        self.decided.as_ref().map_or(0, |d| d.join)
    }

    /// Proposes a join request word; false if one is set already or the view is changing.
    pub(super) fn propose_join(&mut self, word: u64) -> bool {
        if self.phase != Phase::Running || self.join != 0 {
            return false;
        }
        self.join = word;
        self.version += 1;
        true
    }

    /// Forgets what `link` was sent (it was reconnected).
    pub(super) fn reset_link(&mut self, link: usize) {
        if let Some(pushed) = self.pushed.get_mut(link) {
            *pushed = None;
        }
        self.agreement.reset_link(link);
    }

    /// Installed: whether kept member `rank` no longer needs this member's pushes of this
    /// view, because it installed the next view too (`wedged = 2`) or its heartbeat stopped
    /// during the cleanup (it failed; the next view's detection removes it).
    pub(super) fn released<F: Fabric>(&self, ctx: &Ctx<'_, F>, rank: usize) -> Result<bool, MulticastError> {
        Ok(self.stale & bit(rank) != 0
            || ctx.fabric.load_u64(SST_REGION, ctx.layout.view_at(rank) + view_word::WEDGED)? == 2)
    }

    /// One step of the view change; see the module docs.
    pub(super) fn step<F: Fabric>(
        &mut self,
        now_ns: u64,
        ctx: &Ctx<'_, F>,
        subgroups: &mut [Option<Subgroup>],
        links: &mut [Link<F::Endpoint>],
        deliver: &mut impl Deliver,
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        let mut work = false;
        if matches!(self.phase, Phase::Excluded) {
            return Ok(false);
        }
        if now_ns >= self.next_beat_ns {
            self.heartbeat += 1;
            self.next_beat_ns = now_ns + self.detection.heartbeat_period_ns;
            self.version += 1;
        }
        if matches!(self.phase, Phase::Running | Phase::Wedged) {
            work |= self.detect(now_ns, ctx)?;
        }
        if matches!(self.phase, Phase::Wedged) {
            work |= self.install(ctx, subgroups, links, deliver, stats)?;
        }
        if matches!(self.phase, Phase::Wedged) {
            self.check_majority(now_ns, ctx)?;
        }
        if matches!(self.phase, Phase::Installed(_)) {
            self.watch(now_ns, ctx)?;
        }
        if !matches!(self.phase, Phase::Excluded) {
            work |= self.push(ctx, subgroups, links, stats)?;
        }
        Ok(work)
    }

    /// Heartbeat timeouts and the trusted rows' suspicions; wedges on the first suspicion or
    /// join request. Suspicions keep growing while wedged: the leader's value takes them in.
    fn detect<F: Fabric>(&mut self, now_ns: u64, ctx: &Ctx<'_, F>) -> Result<bool, MulticastError> {
        let before = (self.suspected, self.join);
        let mut join_seen = self.join != 0;
        let frozen = self.phase == Phase::Wedged && ctx.config.bug(PlantedBug::FrozenSuspicions);
        for rank in 0..self.seen.len() {
            if rank == self.me || self.suspected & bit(rank) != 0 {
                continue;
            }
            let at = ctx.layout.view_at(rank);
            if frozen {
                if ctx.fabric.load_u64(SST_REGION, at + view_word::SUSPECTED)? & bit(self.me) != 0 {
                    self.phase = Phase::Excluded;
                    return Ok(true);
                }
                continue;
            }
            let heartbeat = ctx.fabric.load_u64(SST_REGION, at)?;
            match self.seen[rank] {
                Some((seen, since)) if seen == heartbeat => {
                    // The joiner, not heard from yet, may be waiting for a state writer just
                    // suspected, whose successor writes the state now (`transfer.rs`): its
                    // silence counts from this member's latest new suspicion. (Its rank is the
                    // last, so this poll's suspicions are in.)
                    let waiting = Some(rank) == self.joiner && heartbeat == 0;
                    let since = if waiting { since.max(self.suspected_at_ns) } else { since };
                    if now_ns.saturating_sub(since) > self.detection.suspect_after_ns {
                        self.suspected |= bit(rank);
                        self.suspected_at_ns = now_ns;
                        continue;
                    }
                }
                _ => self.seen[rank] = Some((heartbeat, now_ns)),
            }
            let theirs = ctx.fabric.load_u64(SST_REGION, at + view_word::SUSPECTED)?;
            if theirs & bit(self.me) != 0 {
                self.phase = Phase::Excluded;
                return Ok(true);
            }
            if theirs & !self.suspected != 0 {
                self.suspected |= theirs;
                self.suspected_at_ns = now_ns;
            }
            let join = ctx.fabric.load_u64(SST_REGION, at + view_word::JOIN)?;
            let outside =
                super::next::JoinRequest::from_word(join).is_some_and(|j| !ctx.config.members.contains(&j.node));
            if outside {
                join_seen = true;
                if self.join == 0 {
                    // Adopted, so the request outlives its proposer; carried to the next view
                    // if this change does not take it (`next.rs`).
                    self.join = join;
                }
            }
        }
        let wedge = matches!(self.phase, Phase::Running) && (self.suspected != 0 || join_seen);
        if wedge {
            self.phase = Phase::Wedged;
        }
        if (self.suspected, self.join) == before && !wedge {
            return Ok(false);
        }
        self.version += 1;
        Ok(true)
    }

    /// Wedged: stops ([`MulticastError::MajorityLost`]) once the members this member does not
    /// suspect have been no majority of the view for `suspect_after_ns` (module docs).
    fn check_majority<F: Fabric>(&self, now_ns: u64, ctx: &Ctx<'_, F>) -> Result<(), MulticastError> {
        let members = self.seen.len();
        let trusted = members - self.suspected.count_ones() as usize;
        if 2 * trusted > members || now_ns.saturating_sub(self.suspected_at_ns) <= self.detection.suspect_after_ns {
            return Ok(());
        }
        let suspected = (0..members).filter(|&r| self.suspected & bit(r) != 0).map(|r| ctx.config.members[r]).collect();
        Err(MulticastError::MajorityLost { epoch: ctx.epoch, members: ctx.config.members.clone(), suspected })
    }

    /// Installed: notes kept members whose heartbeat stopped (a failure during the cleanup).
    fn watch<F: Fabric>(&mut self, now_ns: u64, ctx: &Ctx<'_, F>) -> Result<(), MulticastError> {
        let left_out = self.decided.as_ref().map_or(0, |d| d.suspected);
        for rank in (0..self.seen.len()).filter(|&r| r != self.me && left_out & bit(r) == 0) {
            let heartbeat = ctx.fabric.load_u64(SST_REGION, ctx.layout.view_at(rank) + view_word::HEARTBEAT)?;
            match self.seen[rank] {
                Some((seen, since)) if seen == heartbeat => {
                    if now_ns.saturating_sub(since) > self.detection.suspect_after_ns {
                        self.stale |= bit(rank);
                    }
                }
                _ => self.seen[rank] = Some((heartbeat, now_ns)),
            }
        }
        Ok(())
    }

    /// Once the next view is decided (`agreement.rs`): cleanup delivery up to the ragged
    /// trims, then the new view; or, if the view leaves this member out, stop.
    fn install<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        subgroups: &mut [Option<Subgroup>],
        links: &[Link<F::Endpoint>],
        deliver: &mut impl Deliver,
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        let Some(value) = self.agreement.step(ctx, self.suspected, self.join, subgroups, stats)? else {
            return Ok(false);
        };
        if value.suspected & bit(self.me) != 0 {
            self.phase = Phase::Excluded;
            return Ok(true);
        }
        let skip_cleanup = ctx.config.bug(PlantedBug::NoRaggedEdge);
        let mut delivered = vec![None; subgroups.len()];
        for sub in subgroups.iter_mut().flatten() {
            if !skip_cleanup {
                sub.deliver(ctx, links, deliver, stats, Some(&value.trims[sub.index]))?;
            }
            delivered[sub.index] = Some(sub.delivered);
        }
        let kept = (0..self.seen.len()).filter(|&r| value.suspected & bit(r) == 0);
        let mut members: Vec<NodeId> = kept.map(|r| ctx.config.members[r]).collect();
        let joined = super::next::JoinRequest::from_word(value.join).map(|j| j.node);
        members.extend(joined);
        self.agreement.decide(value.clone());
        self.decided = Some(value);
        self.phase = Phase::Installed(View { epoch: ctx.epoch + 1, members, joined, delivered });
        self.version += 1;
        Ok(true)
    }

    /// Pushes the view block to every link whose subgroup pushes are complete (so `wedged`
    /// lands after the final counters): the agreement block if it changed, then the header.
    fn push<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        subgroups: &[Option<Subgroup>],
        links: &mut [Link<F::Endpoint>],
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        let wedged = match self.phase {
            Phase::Running => 0,
            Phase::Installed(_) => 2,
            _ => 1,
        };
        let header: Vec<u8> =
            [self.heartbeat, self.suspected, wedged, self.join].iter().flat_map(|w| w.to_le_bytes()).collect();
        let view_at = ctx.layout.view_at(self.me);
        let mut work = false;
        // Links added for a joiner after this view's install are not this view's.
        for (index, link) in links.iter_mut().enumerate().take(self.pushed.len()) {
            if link.broken {
                continue;
            }
            let behind = subgroups.iter().flatten().any(|sub| {
                let committed = sub.ring.as_ref().map_or(0, |r| r.committed());
                sub.pushes
                    .iter()
                    .any(|p| p.link == index && (p.real_pushed < committed || p.version_pushed != Some(sub.version)))
            });
            if behind {
                continue;
            }
            if self.pushed[index] == Some(self.version) {
                if self.agreement.unposted(index) {
                    work |= self.agreement.push(ctx.layout, index, link, stats)?;
                }
                continue;
            }
            // Stopped: the final counter blocks go to members outside the subgroups too, before
            // `wedged`, so that a leader in no subgroup can compute every subgroup's trims.
            if wedged != 0 {
                let mut posted = true;
                for sub in subgroups.iter().flatten().filter(|s| !s.pushes.iter().any(|p| p.link == index)) {
                    let at = sub.layout.block_at(ctx.layout, sub.my_row);
                    posted &= post(link, RemoteAddr::new(SST_REGION, at), &sub.counter_block(), stats)?;
                }
                if !posted {
                    continue;
                }
            }
            if !self.agreement.push(ctx.layout, index, link, stats)? {
                continue;
            }
            if post(link, RemoteAddr::new(SST_REGION, view_at), &header, stats)? {
                self.pushed[index] = Some(self.version);
                work = true;
            }
        }
        Ok(work)
    }
}
