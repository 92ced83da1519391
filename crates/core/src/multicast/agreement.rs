//! Agreeing on the next view: Derecho's leader-driven view change (Jha et al., TOCS 2019, §3.3:
//! the lowest-ranked member not suspected leads, proposes the changes it knows of, members adopt
//! the leader's proposal, and a new leader takes over a suspected one and first learns what its
//! predecessor may have committed), written as single-decree Paxos over the SST, one decree per
//! view.
//!
//! **The value** ([`Proposal`]) is the whole next view: the ranks it leaves out, the join
//! request it adds, and the ragged trim of every subgroup. A leader proposes a value of its own
//! only when every member the value keeps is wedged (so their final counters are here, and the
//! trims are the minimum of them) and the kept members are a majority of the view.
//!
//! **Ballots** are `round × 64 + rank`: unique to their leader, ordered by round. Each member's
//! agreement block holds `promised` (the highest ballot it promised), `accepted` (the ballot of
//! the value it holds, 0 for none) and that value. A member follows only the leader it believes
//! in (the lowest rank it does not suspect; suspicions only grow and spread, so live members
//! come to believe in the same one):
//!
//! 1. the leader starts a ballot above every ballot it has seen and promises it itself;
//! 2. a member promises the leader's ballot if it is above its own promise (phase 1b);
//! 3. once a majority of the view promised it, the leader proposes: the value of the highest
//!    ballot any of them accepted, or, if none did, a value of its own (phase 2a);
//! 4. a member accepts the leader's proposal unless it promised a higher ballot (phase 2b);
//! 5. a value accepted by a majority of the view in one ballot is **decided**; whoever sees that
//!    (or a block marked decided, `accepted = u64::MAX`) installs it and marks its own block
//!    decided, so members that missed a failed member's writes learn it too.
//!
//! Why at most one next view, even under a partition: Paxos. If value `v` is accepted by a
//! majority in ballot `b`, every later ballot's phase-1 majority contains a member of that
//! majority, which reports `b` or a later ballot's value, itself `v` by induction; so every
//! later proposal is `v`. Why it ends: suspicions only grow, so once failures stop the live
//! members suspect the same set and follow the same leader; a member the leader waits for either
//! wedges (it sees the leader's suspicions) or is suspected; a leader suspected mid-change is
//! replaced by the next rank, whose higher ballot takes over (and re-proposes what may have been
//! decided, whose failed members the next view then removes). Members that wedged on different
//! suspicions or join requests therefore converge on the leader's value.
//!
//! The block is many words and is read while it may be landing, so it is written as a seqlock
//! on one FIFO endpoint: the guard word odd, then the body, then the guard even; a reader reads
//! the guard, the body, and the guard again, and takes the body only if both guard reads are the
//! same even number. A member that fails in the middle of such a write would leave its block
//! unreadable for good, and with it what it had accepted (a peer that needed that acceptance to
//! count a majority then never learns the decided view: simulator seed 58653, a group of two
//! whose leader failed while marking its block decided); so the row holds two copies, version
//! `v` written into copy `v mod 2`, and a reader takes the readable copy of the higher version.
//! Writes land in posting order, so at most the copy being written is unreadable.

use std::sync::atomic::{Ordering, fence};

use microrep_fabric::{Endpoint, Fabric, RemoteAddr};

use super::api::{MulticastError, Stats};
use super::layout::{AGREEMENT_COPIES, AGREEMENT_HEADER_BYTES, Layout, SST_REGION, rank_of, view_word};
use super::member::{Ctx, Link, Subgroup, post};
use super::next::JoinRequest;
use super::planted::PlantedBug;

/// The `accepted` ballot of a block whose value is decided.
pub(super) const DECIDED: u64 = u64::MAX;

/// Bits of a ballot that hold its leader's rank (at most 64 members).
const RANK_BITS: u32 = 6;

/// A value to agree on: the next view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Proposal {
    /// The ranks of the current view the next view leaves out.
    pub(super) suspected: u64,
    /// The join request it adds (a [`JoinRequest`] word; 0: none).
    pub(super) join: u64,
    /// Per subgroup, per sender rank: the ragged trim.
    pub(super) trims: Vec<Vec<u64>>,
}

/// One member's agreement block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Block {
    promised: u64,
    accepted: u64,
    /// Present exactly when `accepted != 0`.
    value: Option<Proposal>,
}

fn bit(rank: usize) -> u64 {
    1 << rank
}

fn owner(ballot: u64) -> usize {
    (ballot & ((1 << RANK_BITS) - 1)) as usize
}

/// A member's side of the agreement on the next view of one epoch.
#[derive(Debug)]
pub(super) struct Agreement {
    members: usize,
    me: usize,
    own: Block,
    /// The ballot this member leads, and whether it has proposed in it.
    leading: Option<(u64, bool)>,
    /// Raised whenever `own` changes; per link, the version last posted.
    version: u64,
    pushed: Vec<Option<u64>>,
}

impl Agreement {
    pub(super) fn new(members: usize, me: usize, links: usize) -> Self {
        Self { members, me, own: Block::default(), leading: None, version: 0, pushed: vec![Some(0); links] }
    }

    /// Whether `count` members are a majority of the view (with the planted bug
    /// `MajorityOfTrusted`: of the members not in `suspected`).
    fn majority(&self, count: usize, suspected: u64, trusted_bug: bool) -> bool {
        let base = if trusted_bug { self.members - suspected.count_ones() as usize } else { self.members };
        2 * count > base
    }

    /// One step while wedged: learn a decided value, or follow the leader, or lead. Returns
    /// the decided value once this member knows it. `suspected` is this member's suspected
    /// set, `join` its own pending join request word.
    pub(super) fn step<F: Fabric>(
        &mut self,
        ctx: &Ctx<'_, F>,
        suspected: u64,
        join: u64,
        subgroups: &[Option<Subgroup>],
        stats: &mut Stats,
    ) -> Result<Option<Proposal>, MulticastError> {
        let trusted_bug = ctx.config.bug(PlantedBug::MajorityOfTrusted);
        let mut blocks = Vec::with_capacity(self.members);
        for row in 0..self.members {
            blocks.push(if row == self.me { Some(self.own.clone()) } else { read(ctx, row)? });
        }
        if let Some(value) = self.learn(&blocks, suspected, trusted_bug) {
            return Ok(Some(value));
        }
        let leader = (0..self.members).find(|&r| suspected & bit(r) == 0).expect("this member does not suspect itself");
        if leader != self.me {
            self.leading = None;
            if let Some(theirs) = &blocks[leader] {
                self.follow(leader, theirs);
            }
            return Ok(None);
        }
        let live = (0..self.members).filter(|&r| suspected & bit(r) == 0).count();
        if !self.majority(live, suspected, trusted_bug) {
            // No view can keep a majority: stay wedged (a minority side of a partition).
            return Ok(None);
        }
        let highest = blocks.iter().flatten().flat_map(|b| [b.promised, b.accepted]).filter(|&b| b != DECIDED).max();
        let ballot = match self.leading {
            Some((ballot, _)) if highest.unwrap_or(0) <= ballot => ballot,
            _ => {
                // Phase 1a: a ballot above every ballot seen, promised by the leader itself.
                let round = (highest.unwrap_or(0) >> RANK_BITS) + 1;
                let ballot = round << RANK_BITS | self.me as u64;
                self.own.promised = ballot;
                self.leading = Some((ballot, false));
                self.version += 1;
                stats.ballots += 1;
                return Ok(None);
            }
        };
        if self.leading == Some((ballot, true)) {
            return Ok(None);
        }
        let quorum: Vec<&Block> = blocks.iter().flatten().filter(|b| b.promised == ballot).collect();
        if !self.majority(quorum.len(), suspected, trusted_bug) {
            return Ok(None);
        }
        // Phase 2a: the value of the highest ballot the quorum accepted (it may have been
        // decided), else this leader's own.
        let adopted = quorum.iter().filter(|b| b.accepted != 0).max_by_key(|b| b.accepted);
        let value = match adopted.and_then(|b| b.value.clone()) {
            Some(value) => {
                stats.adopted += 1;
                value
            }
            None => match own_value(ctx, suspected, join, subgroups)? {
                Some(value) => value,
                None => return Ok(None),
            },
        };
        self.own = Block { promised: ballot, accepted: ballot, value: Some(value) };
        self.leading = Some((ballot, true));
        self.version += 1;
        Ok(None)
    }

    /// A value is decided if a block says so or a majority of the view accepted it in one
    /// ballot (one ballot has one value: its leader's).
    fn learn(&self, blocks: &[Option<Block>], suspected: u64, trusted_bug: bool) -> Option<Proposal> {
        if let Some(decided) = blocks.iter().flatten().find(|b| b.accepted == DECIDED) {
            return decided.value.clone();
        }
        for block in blocks.iter().flatten().filter(|b| b.accepted != 0) {
            let count = blocks.iter().flatten().filter(|b| b.accepted == block.accepted).count();
            if self.majority(count, suspected, trusted_bug) {
                return block.value.clone();
            }
        }
        None
    }

    /// Phases 1b and 2b: promise the leader's ballot, accept its proposal, unless this member
    /// promised a higher ballot.
    fn follow(&mut self, leader: usize, theirs: &Block) {
        let before = self.own.clone();
        if owner(theirs.promised) == leader && theirs.promised > self.own.promised {
            self.own.promised = theirs.promised;
        }
        let proposal = theirs.accepted;
        if proposal != 0
            && proposal != DECIDED
            && owner(proposal) == leader
            && proposal >= self.own.promised
            && proposal != self.own.accepted
        {
            self.own = Block { promised: proposal, accepted: proposal, value: theirs.value.clone() };
        }
        if self.own != before {
            self.version += 1;
        }
    }

    /// The next view is decided: publish it (for members that cannot count the acceptances).
    pub(super) fn decide(&mut self, value: Proposal) {
        self.own = Block { promised: self.own.promised, accepted: DECIDED, value: Some(value) };
        self.leading = None;
        self.version += 1;
    }

    /// Forgets what `link` was sent (it was reconnected).
    pub(super) fn reset_link(&mut self, link: usize) {
        if let Some(pushed) = self.pushed.get_mut(link) {
            *pushed = None;
        }
    }

    /// Whether the block changed since it was last posted to link `index`.
    pub(super) fn unposted(&self, index: usize) -> bool {
        self.pushed[index] != Some(self.version)
    }

    /// Posts the block to `link` (number `index`) if it changed since the last post there:
    /// guard odd, body, guard even. Returns false if it must be posted again.
    pub(super) fn push<E: Endpoint>(
        &mut self,
        layout: &Layout,
        index: usize,
        link: &mut Link<E>,
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        if !self.unposted(index) {
            return Ok(true);
        }
        if self.version == 0 {
            // Never changed: the peer's zeroed area already holds the empty block.
            self.pushed[index] = Some(0);
            return Ok(true);
        }
        let at = layout.agreement_at(self.me, self.version % AGREEMENT_COPIES);
        let body = encode(layout, &self.own);
        let guard = |g: u64| g.to_le_bytes();
        let posted = post(link, RemoteAddr::new(SST_REGION, at), &guard(2 * self.version - 1), stats)?
            && post(link, RemoteAddr::new(SST_REGION, at + 8), &body, stats)?
            && post(link, RemoteAddr::new(SST_REGION, at), &guard(2 * self.version), stats)?;
        if posted {
            self.pushed[index] = Some(self.version);
        }
        Ok(posted)
    }
}

/// The leader's own value: every member it keeps (those it does not suspect) is wedged, so
/// their final counters are here; the trims are, per subgroup and sender, the smallest final
/// `received` among the subgroup's kept members (a wedging member pushes its final counter
/// blocks to every member before `wedged`). The join request is the first, in rank order, of a
/// kept member's (this member's included) that names a node outside the view. `None` while a
/// kept member is not wedged.
fn own_value<F: Fabric>(
    ctx: &Ctx<'_, F>,
    suspected: u64,
    own_join: u64,
    subgroups: &[Option<Subgroup>],
) -> Result<Option<Proposal>, MulticastError> {
    let me = rank_of(&ctx.config.members, ctx.config.me).expect("a member of its view");
    let mut join = 0;
    for row in (0..ctx.config.members.len()).filter(|&r| suspected & bit(r) == 0) {
        let word = if row == me {
            own_join
        } else {
            let at = ctx.layout.view_at(row);
            if ctx.fabric.load_u64(SST_REGION, at + view_word::WEDGED)? == 0 {
                return Ok(None);
            }
            ctx.fabric.load_u64(SST_REGION, at + view_word::JOIN)?
        };
        let outside = JoinRequest::from_word(word).is_some_and(|j| !ctx.config.members.contains(&j.node));
        if join == 0 && outside {
            join = word;
        }
    }
    let mut trims = Vec::with_capacity(ctx.config.subgroups.len());
    for (index, sub) in ctx.config.subgroups.iter().enumerate() {
        let layout = &ctx.layout.subgroups[index];
        let kept: Vec<usize> = sub
            .members
            .iter()
            .map(|&m| rank_of(&ctx.config.members, m).expect("subgroup members are group members"))
            .filter(|&r| suspected & bit(r) == 0)
            .collect();
        let mut trim = Vec::with_capacity(sub.senders.len());
        for rank in 0..sub.senders.len() {
            let mut min = u64::MAX;
            for &row in &kept {
                let received = match (row == me, subgroups[index].as_ref()) {
                    (true, Some(mine)) => mine.own_received(rank),
                    _ => ctx.fabric.load_u64(SST_REGION, layout.received_at(ctx.layout, row, rank))?,
                };
                min = min.min(received);
            }
            trim.push(if kept.is_empty() { 0 } else { min });
        }
        trims.push(trim);
    }
    Ok(Some(Proposal { suspected, join, trims }))
}

/// The body of a block (after its guard): promised, accepted, the value's suspected set and
/// join request, then its trims in the layout's order.
fn encode(layout: &Layout, block: &Block) -> Vec<u8> {
    let mut body = vec![0u8; (layout.agreement_bytes() - 8) as usize];
    let mut put = |at: u64, word: u64| {
        let at = (at - 8) as usize;
        body[at..at + 8].copy_from_slice(&word.to_le_bytes());
    };
    put(8, block.promised);
    put(16, block.accepted);
    if let Some(value) = &block.value {
        put(24, value.suspected);
        put(32, value.join);
        for (subgroup, trim) in value.trims.iter().enumerate() {
            for (rank, &word) in trim.iter().enumerate() {
                put(layout.trim_in_agreement(subgroup, rank), word);
            }
        }
    }
    body
}

fn decode(layout: &Layout, body: &[u8]) -> Block {
    let word = |at: u64| {
        let at = (at - 8) as usize;
        u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"))
    };
    let accepted = word(16);
    let value = (accepted != 0).then(|| Proposal {
        suspected: word(24),
        join: word(32),
        trims: layout
            .subgroups
            .iter()
            .enumerate()
            .map(|(s, sub)| (0..sub.senders as usize).map(|rank| word(layout.trim_in_agreement(s, rank))).collect())
            .collect(),
    });
    Block { promised: word(8), accepted, value }
}

/// `row`'s block: of its two copies, the readable one of the higher version (module docs), or
/// `None` while neither is readable.
fn read<F: Fabric>(ctx: &Ctx<'_, F>, row: usize) -> Result<Option<Block>, MulticastError> {
    let mut newest: Option<(u64, Block)> = None;
    for copy in 0..AGREEMENT_COPIES {
        if let Some((guard, block)) = read_copy(ctx, row, copy)?
            && newest.as_ref().is_none_or(|(g, _)| guard > *g)
        {
            newest = Some((guard, block));
        }
    }
    Ok(newest.map(|(_, block)| block))
}

/// One copy of `row`'s block and its guard, as one version (the seqlock read of the module
/// docs), or `None` while it is being rewritten.
fn read_copy<F: Fabric>(ctx: &Ctx<'_, F>, row: usize, copy: u64) -> Result<Option<(u64, Block)>, MulticastError> {
    let at = ctx.layout.agreement_at(row, copy);
    let guard = ctx.fabric.load_u64(SST_REGION, at)?;
    if guard % 2 == 1 {
        return Ok(None);
    }
    let mut body = vec![0u8; (ctx.layout.agreement_bytes() - 8) as usize];
    ctx.fabric.read_local(SST_REGION, at + 8, &mut body)?;
    // The body's loads complete before the second guard load.
    fence(Ordering::Acquire);
    if ctx.fabric.load_u64(SST_REGION, at)? != guard {
        return Ok(None);
    }
    Ok(Some((guard, decode(ctx.layout, &body))))
}

const _: () = assert!(AGREEMENT_HEADER_BYTES == 40, "guard, promised, accepted, suspected, join");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multicast::config::{Delivery, GroupConfig, SubgroupConfig};
    use microrep_fabric::NodeId;

    #[test]
    fn a_block_round_trips_through_its_words_and_ballots_name_their_leader() {
        let ids = |v: &[u16]| v.iter().map(|&i| NodeId(i)).collect::<Vec<_>>();
        let config = GroupConfig {
            subgroups: vec![
                SubgroupConfig {
                    members: ids(&[0, 1, 2]),
                    senders: ids(&[0, 2]),
                    window: 4,
                    max_payload_bytes: 16,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
                SubgroupConfig {
                    members: ids(&[1, 2]),
                    senders: ids(&[1]),
                    window: 2,
                    max_payload_bytes: 8,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
            ],
            ..GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 1, 8)
        };
        let layout = Layout::new(&config);
        let ballot = 3 << RANK_BITS | 2;
        assert_eq!(owner(ballot), 2);
        let value = Proposal { suspected: 0b100, join: 1 << 63 | 9, trims: vec![vec![5, 7], vec![11]] };
        let block = Block { promised: ballot, accepted: ballot, value: Some(value) };
        assert_eq!(decode(&layout, &encode(&layout, &block)), block);
        let empty = Block::default();
        assert_eq!(decode(&layout, &encode(&layout, &empty)), empty, "a zeroed block is the empty block");
    }
}
