//! Failure detection and the view change with ragged-edge cleanup (Derecho §3.3). This file is
//! one view's side of a change, up to installing the next view; running the next view (a fresh
//! SST, joins, state transfer) is `next.rs`.
//!
//! Every member raises a heartbeat word in its row's view block each period; a member whose
//! heartbeat stays unchanged for `suspect_after_ns` is **suspected**, and suspicions spread by
//! each member OR-ing the suspected sets of the rows it still trusts. A member that suspects
//! anyone, or learns of a join request (`next::JoinRequest`, adopted like a suspicion),
//! **wedges**: it stops sending, receiving and delivering, pushes its (now final) counter
//! blocks and only then sets `wedged` in its view block, on the same FIFO endpoints, so
//! `wedged` guards the final counters; its suspected set and join request are frozen from then
//! on. The next view is **agreed** when its members are a majority of the view and every one of
//! them is wedged with the same suspected set and join request (two majorities share a member,
//! whose frozen set is then both sets: so at most one view, even under a partition). Then each
//! live member computes, per subgroup, the **ragged trim**: for each sender, the smallest
//! `received` among the live members' final counters. There is no leader (Derecho's leader
//! computes and publishes the trims): having read every live row's `wedged`, each member has
//! the same final counters, so computes the same trims. Every live member then delivers, in the
//! subgroup's order, every message below the trim and stops at the first one beyond it,
//! installs the new view (the live members, then the joiner), and publishes its trims and
//! `wedged = 2` (their guard). A member whose view of a failed member's final row is
//! incomplete (the member failed as its last writes landed at some peers and not others)
//! takes the trims of a member that installed: a member failing during a cleanup blocks no one
//! who can see an installed member.
//!
//! Why nothing delivered is lost: a message delivered anywhere (the failed member included)
//! was received by every member before, so it is below every live member's final `received`,
//! hence below the trim; and every live member holds every message below the trim.

use microrep_fabric::{Fabric, NodeId, RemoteAddr};

use super::api::{Deliver, MulticastError, Stats};
use super::config::FailureDetection;
use super::layout::{SST_REGION, VIEW_HEADER_BYTES, view_word};
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
    suspected: u64,
    /// The join request this view change adds (`next::JoinRequest` word; 0: none).
    join: u64,
    /// Installed: the live members whose heartbeat stopped during the cleanup.
    stale: u64,
    pub(super) phase: Phase,
    /// Installed: the trims it installed with, per subgroup, published for members that
    /// cannot compute them (see `trim`).
    trims: Vec<Option<Vec<u64>>>,
    /// Raised when the view block changes; per link, the version last pushed.
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
            join: 0,
            stale: 0,
            phase: Phase::Running,
            trims: Vec::new(),
            version: 1,
            pushed: vec![None; links],
        }
    }

    /// The group ranks this member suspects.
    pub(super) fn suspected(&self) -> u64 {
        self.suspected
    }

    /// The join request word of this change (0: none).
    pub(super) fn join(&self) -> u64 {
        self.join
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
    }

    /// Installed: whether live member `rank` no longer needs this member's pushes of this
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
            work |= self.install(ctx, subgroups, deliver, stats)?;
        }
        if matches!(self.phase, Phase::Installed(_)) {
            self.watch(now_ns, ctx)?;
        }
        if !matches!(self.phase, Phase::Excluded) {
            work |= self.push(ctx, subgroups, links, stats)?;
        }
        Ok(work)
    }

    fn detect<F: Fabric>(&mut self, now_ns: u64, ctx: &Ctx<'_, F>) -> Result<bool, MulticastError> {
        let before = (self.suspected, self.join);
        for rank in 0..self.seen.len() {
            if rank == self.me || self.suspected & bit(rank) != 0 {
                continue;
            }
            let at = ctx.layout.view_at(rank);
            if self.phase == Phase::Wedged {
                // Frozen once wedged (see `agreed`); only learn whether this member was
                // excluded.
                if ctx.fabric.load_u64(SST_REGION, at + view_word::SUSPECTED)? & bit(self.me) != 0 {
                    self.phase = Phase::Excluded;
                    return Ok(true);
                }
                continue;
            }
            let heartbeat = ctx.fabric.load_u64(SST_REGION, at)?;
            match self.seen[rank] {
                Some((seen, since)) if seen == heartbeat => {
                    if now_ns.saturating_sub(since) > self.detection.suspect_after_ns {
                        self.suspected |= bit(rank);
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
            self.suspected |= theirs;
            if self.join == 0 {
                // A join request spreads like a suspicion, and is frozen with it.
                self.join = ctx.fabric.load_u64(SST_REGION, at + view_word::JOIN)?;
            }
        }
        let wedge = matches!(self.phase, Phase::Running) && (self.suspected != 0 || self.join != 0);
        if wedge {
            self.phase = Phase::Wedged;
        }
        if (self.suspected, self.join) == before && !wedge {
            return Ok(false);
        }
        self.version += 1;
        Ok(true)
    }

    /// Installed: notes live members whose heartbeat stopped (a failure during the cleanup).
    fn watch<F: Fabric>(&mut self, now_ns: u64, ctx: &Ctx<'_, F>) -> Result<(), MulticastError> {
        for rank in self.live(self.seen.len()).filter(|&r| r != self.me).collect::<Vec<_>>() {
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

    fn live(&self, members: usize) -> impl Iterator<Item = usize> + '_ {
        (0..members).filter(move |&r| self.suspected & bit(r) == 0)
    }

    /// Whether `row` is wedged (or installed: `at_least` 2) with this member's suspected set
    /// and join request. `wedged` is read first: it guards the rest (a row's words of the
    /// version with `wedged` set are final; earlier versions have no suspicion and no join,
    /// unlike this one's).
    fn wedged_alike<F: Fabric>(&self, ctx: &Ctx<'_, F>, row: usize, at_least: u64) -> Result<bool, MulticastError> {
        let at = ctx.layout.view_at(row);
        Ok(ctx.fabric.load_u64(SST_REGION, at + view_word::WEDGED)? >= at_least
            && ctx.fabric.load_u64(SST_REGION, at + view_word::SUSPECTED)? == self.suspected
            && ctx.fabric.load_u64(SST_REGION, at + view_word::JOIN)? == self.join)
    }

    /// Whether the next view is agreed: its members (the live ones) are a majority of the view
    /// and every one of them is wedged with this member's suspected set and join request, or
    /// one of them installed with them (it saw that).
    ///
    /// Why this gives one view at most: a member's suspected set is frozen once it wedges, and
    /// two majorities share a member, so two agreed sets are the same set. The price: members
    /// that wedged on different sets (two suspicions a moment apart) never agree and stay
    /// wedged; Derecho restarts such a change with the larger set, which this slice does not.
    fn agreed<F: Fabric>(&self, ctx: &Ctx<'_, F>) -> Result<bool, MulticastError> {
        let members = self.seen.len();
        if 2 * self.live(members).count() <= members {
            return Ok(false);
        }
        let mut all = true;
        for row in self.live(members).filter(|&r| r != self.me) {
            if self.wedged_alike(ctx, row, 2)? {
                return Ok(true);
            }
            all &= self.wedged_alike(ctx, row, 1)?;
        }
        Ok(all)
    }

    /// The ragged trims of every subgroup of the view, per sender: the smallest final
    /// `received` of the subgroup's live members. Once every live row shows `wedged` with this
    /// member's sets, this member holds every live member's final counters of every subgroup
    /// (a wedging member pushes its final counter blocks to every member, not only to its
    /// subgroups' peers, before `wedged`), so it computes the trims every member computes. One
    /// that misses a failed member's final row (its last writes reached some members and not
    /// others) takes the trims a member installed with (published under `wedged = 2`). `None`
    /// while neither is possible.
    fn trims<F: Fabric>(
        &self,
        ctx: &Ctx<'_, F>,
        subgroups: &[Option<Subgroup>],
    ) -> Result<Option<Vec<Vec<u64>>>, MulticastError> {
        let members = self.seen.len();
        let live: Vec<usize> = self.live(members).filter(|&r| r != self.me).collect();
        let mut all_final = true;
        for &row in &live {
            all_final &= self.wedged_alike(ctx, row, 1)?;
        }
        let mut trims = Vec::with_capacity(ctx.config.subgroups.len());
        if all_final {
            for (index, sub) in ctx.config.subgroups.iter().enumerate() {
                let layout = &ctx.layout.subgroups[index];
                let rows = sub.members.iter().map(|&m| {
                    super::layout::rank_of(&ctx.config.members, m).expect("subgroup members are group members")
                });
                let live_rows: Vec<usize> = rows.filter(|&r| self.suspected & bit(r) == 0).collect();
                let mut trim = Vec::with_capacity(sub.senders.len());
                for rank in 0..sub.senders.len() {
                    let mut min = u64::MAX;
                    for &row in &live_rows {
                        let received = match (row == self.me, subgroups[index].as_ref()) {
                            (true, Some(mine)) => mine.own_received(rank),
                            _ => ctx.fabric.load_u64(SST_REGION, layout.received_at(ctx.layout, row, rank))?,
                        };
                        min = min.min(received);
                    }
                    trim.push(if live_rows.is_empty() { 0 } else { min });
                }
                trims.push(trim);
            }
            return Ok(Some(trims));
        }
        for &row in &live {
            if self.wedged_alike(ctx, row, 2)? {
                for (index, sub) in ctx.config.subgroups.iter().enumerate() {
                    let trim: Result<Vec<u64>, MulticastError> = (0..sub.senders.len())
                        .map(|rank| Ok(ctx.fabric.load_u64(SST_REGION, ctx.layout.trim_at(row, index, rank))?))
                        .collect();
                    trims.push(trim?);
                }
                return Ok(Some(trims));
            }
        }
        Ok(None)
    }

    /// Once the next view is agreed and every subgroup has its trim: cleanup delivery up to
    /// the ragged trims, then the new view.
    fn install<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        subgroups: &mut [Option<Subgroup>],
        deliver: &mut impl Deliver,
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        if !self.agreed(ctx)? {
            return Ok(false);
        }
        let Some(all) = self.trims(ctx, subgroups)? else { return Ok(false) };
        let trims: Vec<Option<Vec<u64>>> = all.into_iter().map(Some).collect();
        let skip_cleanup = ctx.config.bug(PlantedBug::NoRaggedEdge);
        let mut delivered = vec![None; subgroups.len()];
        for sub in subgroups.iter_mut().flatten() {
            let trim = trims[sub.index].as_deref().expect("every subgroup has its trim");
            if !skip_cleanup {
                sub.deliver(ctx, deliver, stats, Some(trim))?;
            }
            delivered[sub.index] = Some(sub.delivered);
        }
        let mut members: Vec<NodeId> = self.live(self.seen.len()).map(|r| ctx.config.members[r]).collect();
        let joined = super::next::JoinRequest::from_word(self.join).map(|j| j.node);
        members.extend(joined);
        self.trims = trims;
        self.phase = Phase::Installed(View { epoch: ctx.epoch + 1, members, joined, delivered });
        self.version += 1;
        Ok(true)
    }

    /// Pushes the view block to every link whose subgroup pushes are complete (so `wedged`
    /// lands after the final counters): the trim words first, then the header (`wedged = 2`
    /// guards the trims).
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
        let mut header = Vec::with_capacity(VIEW_HEADER_BYTES as usize);
        for word in [self.heartbeat, self.suspected, wedged, self.join] {
            header.extend_from_slice(&word.to_le_bytes());
        }
        let mut trim_area = vec![0u8; (ctx.layout.view_bytes - VIEW_HEADER_BYTES) as usize];
        for (index, trim) in self.trims.iter().enumerate() {
            for (rank, value) in trim.iter().flatten().enumerate() {
                let at = (ctx.layout.trim_at(self.me, index, rank) - ctx.layout.view_at(self.me) - VIEW_HEADER_BYTES)
                    as usize;
                trim_area[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
        }
        let view_at = ctx.layout.view_at(self.me);
        let mut work = false;
        // Links added for a joiner after this view's install are not this view's.
        for (index, link) in links.iter_mut().enumerate().take(self.pushed.len()) {
            if link.broken || self.pushed[index] == Some(self.version) {
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
            // Stopped: the final counter blocks go to members outside the subgroups too, before
            // `wedged`, so that any member can compute (and publish) every subgroup's trims.
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
            if !self.trims.is_empty()
                && !post(link, RemoteAddr::new(SST_REGION, view_at + VIEW_HEADER_BYTES), &trim_area, stats)?
            {
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
