//! Running the next view: after a view change installs (`view.rs`), the members move to a fresh
//! SST (the next **epoch**), failed members are fenced off, a joiner gets its state, and
//! senders send again what the old view did not deliver.
//!
//! **Three areas.** Epoch `e` uses area `e mod 3` of the SST region. Starting epoch `e`, a member
//! zeroes area `(e + 1) mod 3`, which epoch `e + 1` will use and epoch `e - 2` used. Why this
//! is safe, for each writer that could still land bytes there:
//!
//! - a member of both views `e - 1` and `e`: its WRITEs of epoch `e - 2` were posted before it
//!   left that epoch, so before its `wedged` flag of epoch `e - 1`, on the same FIFO endpoint
//!   (links are kept across views). Installing view `e`, this member reads that flag: if it is
//!   set, they have all landed (or failed, and never land); if not (this member learned the
//!   agreed view from others before the flag arrived), it revokes that member's write access
//!   and grants it again, a barrier: after `revoke_write` returns none of the earlier WRITEs
//!   lands (the member's link breaks and it writes its current state again);
//! - a member removed at the start of epoch `e - 1` or `e`: revoked here at that install
//!   ([`microrep_fabric::Fabric::revoke_write`]; the region is `Granted`): after revocation none
//!   of its WRITEs lands;
//! - epoch `e + 1`'s WRITEs come only once view `e + 1` is agreed, which needs this member
//!   wedged in epoch `e`, so after the zeroing.
//!
//! Two areas would not do: a member would have to zero the next area after the removed
//! members' revocation at the next install, when peers that installed first may already be
//! writing their rows of the next epoch into it.
//!
//! **Leaving the old view.** A member that installed keeps pushing its old view block (with
//! `wedged = 2`: installed) until every live member of the new view that was in the old one is
//! released (`ViewState::released`: it installed too, or its heartbeat stopped during the
//! cleanup), or shows a heartbeat in the new area (it left, so everyone installed). Then it
//! drops the old view's state and opens the new epoch ([`super::Member::open_epoch`]) on the
//! same links.
//!
//! **Resending.** A sender's messages beyond the ragged trim were delivered by nobody (the
//! trim bounds every delivery); the sender commits them again, in order, as the first messages
//! of its ring in the new view. Messages of removed senders beyond the trim are dropped. (Not
//! in a subgroup that delivers at receipt, where some members may have delivered them.)

use microrep_fabric::{Fabric, NodeId};

use super::api::{Deliver, MulticastError};
use super::config::GroupConfig;
use super::layout::{AREAS, Layout, SST_REGION, area_bytes, rank_of, view_word};
use super::member::{Ctx, Member};
use super::transfer::{Section, Transfer, decode_view, encode_view};
use super::view::View;

/// A request to add `node` to the group as a member and sender of `subgroups`, as one word in
/// the view block (so that it is never read torn): bit 63 set, the subgroup set in bits 16 to
/// 62, the node id in bits 0 to 15.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct JoinRequest {
    pub(super) node: NodeId,
    subgroups: u64,
}

impl JoinRequest {
    pub(super) fn new(node: NodeId, subgroups: &[usize]) -> Self {
        let set = subgroups.iter().fold(0u64, |set, &s| set | (1 << s));
        assert!(set < 1 << 47, "validated: at most 47 subgroups");
        Self { node, subgroups: set }
    }

    pub(super) fn word(self) -> u64 {
        1 << 63 | self.subgroups << 16 | u64::from(self.node.0)
    }

    pub(super) fn from_word(word: u64) -> Option<Self> {
        (word != 0).then_some(Self { node: NodeId(word as u16), subgroups: (word >> 16) & ((1 << 47) - 1) })
    }

    pub(super) fn enters(self, subgroup: usize) -> bool {
        self.subgroups & (1 << subgroup) != 0
    }

    /// The subgroups the joiner enters.
    pub(super) fn subgroups(self) -> Vec<usize> {
        (0..47).filter(|&s| self.enters(s)).collect()
    }
}

/// The configuration of the view after `old` (this member's): `view`'s members; every
/// subgroup keeps its live members and senders in their order, and the joiner enters the
/// subgroups of its request, last, as a member and a sender.
pub(super) fn next_config(old: &GroupConfig, view: &View, join: Option<JoinRequest>) -> GroupConfig {
    let keep = |list: &[NodeId]| list.iter().copied().filter(|n| view.members.contains(n)).collect::<Vec<_>>();
    let subgroups = old
        .subgroups
        .iter()
        .enumerate()
        .map(|(index, sub)| {
            let mut members = keep(&sub.members);
            let mut senders = keep(&sub.senders);
            if let Some(join) = join.filter(|j| j.enters(index)) {
                members.push(join.node);
                senders.push(join.node);
            }
            super::config::SubgroupConfig { members, senders, ..sub.clone() }
        })
        .collect();
    GroupConfig { members: view.members.clone(), subgroups, ..old.clone() }
}

impl<F: Fabric> Member<F> {
    /// The view change installed `view`: tell the application, fence removed members off, let
    /// the joiner in and prepare its state.
    pub(super) fn install(&mut self, view: View, deliver: &mut impl Deliver) -> Result<(), MulticastError> {
        let join = self.view.as_ref().and_then(|v| JoinRequest::from_word(v.decided_join()));
        let config = next_config(&self.config, &view, join);
        deliver.view_installed(&view);
        for &gone in self.config.members.iter().filter(|m| !view.members.contains(m)) {
            self.fabric.revoke_write(SST_REGION, gone)?;
        }
        // The fresh-SST barrier of the module docs, for members that stay.
        for (row, &peer) in self.config.members.iter().enumerate() {
            let stays = peer != self.config.me && view.members.contains(&peer);
            if stays && self.fabric.load_u64(SST_REGION, self.layout.view_at(row) + view_word::WEDGED)? == 0 {
                self.fabric.revoke_write(SST_REGION, peer)?;
                self.fabric.grant_write(SST_REGION, peer)?;
                self.stats.barriers += 1;
            }
        }
        if let Some(join) = join.filter(|j| !self.config.members.contains(&j.node)) {
            self.fabric.grant_write(SST_REGION, join.node)?;
            self.links.push(super::member::Link::open(&self.fabric, join.node)?);
            self.prepare_transfer(&view, &config, join, deliver)?;
        }
        self.next = Some(config);
        Ok(())
    }

    /// The sections of the joiner's state this member may write (`transfer.rs`, "Who writes
    /// a section"): each section whose writer order holds this member, with its bytes taken now,
    /// at the view boundary, and the members before it in the order.
    fn prepare_transfer(
        &mut self,
        view: &View,
        config: &GroupConfig,
        join: JoinRequest,
        deliver: &mut impl Deliver,
    ) -> Result<(), MulticastError> {
        let state = self.state_layout.as_ref().expect("views change only with failure detection");
        let epoch = view.epoch;
        let me = self.config.me;
        // The kept old members in rank order (`view.members` lists them so, the joiner last).
        let kept: Vec<NodeId> = view.members.iter().copied().filter(|&m| m != join.node).collect();
        let before_me = |order: &[NodeId]| order.iter().position(|&m| m == me).map(|p| order[..p].to_vec());
        let mut sections = Vec::new();
        if let Some(after) = before_me(&kept) {
            sections.push(Section::new(after, state.section(0, epoch, &encode_view(epoch, config))));
        }
        for (index, sub) in self.config.subgroups.iter().enumerate().filter(|&(i, _)| join.enters(i)) {
            let holders: Vec<NodeId> = kept.iter().copied().filter(|m| sub.members.contains(m)).collect();
            // Only a holder writes a held state: a member writing an empty one while a holder
            // it falsely suspects runs would hand the joiner a wrong state. With no holder
            // kept, nothing of the subgroup survives and every kept member holds the empty one.
            let order = if holders.is_empty() { &kept } else { &holders };
            let Some(after) = before_me(order) else { continue };
            let mut bytes = Vec::new();
            if !holders.is_empty() {
                deliver.snapshot(index, &mut bytes);
            }
            state.check_state(index, bytes.len())?;
            sections.push(Section::new(after, state.section(1 + index, epoch, &bytes)));
        }
        if !sections.is_empty() {
            self.transfers.push(Transfer::new(join.node, epoch, sections));
        }
        Ok(())
    }

    /// Posts the state owed to joiners, first thing in a poll: until a joiner has its state it
    /// has not granted the members write access to its SST, so their pushes there fail and
    /// break the link, flushing whatever was posted behind them. In the joiner's view, writes
    /// the sections whose earlier writers this member now suspects. Forgets a transfer once its
    /// joiner runs (its heartbeat shows in this view) or left the view.
    pub(super) fn push_transfers(&mut self) -> Result<bool, MulticastError> {
        let (epoch, config, layout, fabric) = (self.epoch, &self.config, &self.layout, &self.fabric);
        let suspected = self.view.as_ref().map_or(0, super::view::ViewState::suspected);
        let suspects: Vec<NodeId> =
            config.members.iter().enumerate().filter(|&(r, _)| suspected & (1 << r) != 0).map(|(_, &m)| m).collect();
        let mut done = Vec::new();
        for (i, transfer) in self.transfers.iter_mut().enumerate() {
            if epoch < transfer.epoch {
                continue;
            }
            let running = match rank_of(&config.members, transfer.joiner) {
                Some(row) if epoch == transfer.epoch => {
                    fabric.load_u64(SST_REGION, layout.view_at(row) + view_word::HEARTBEAT)? != 0
                }
                _ => true,
            };
            if running {
                done.push(i);
            } else {
                self.stats.takeovers += transfer.take_over(&suspects);
            }
        }
        for i in done.into_iter().rev() {
            self.transfers.swap_remove(i);
        }
        let mut work = false;
        for transfer in &mut self.transfers {
            if let Some(link) = self.links.iter_mut().find(|l| l.peer == transfer.joiner) {
                work |= transfer.push(link, &mut self.stats)?;
            }
        }
        Ok(work)
    }

    /// Whether this member may drop the old view (module docs, "Leaving the old view"): every
    /// member that stays has installed too, or has left, or failed during the cleanup, so none
    /// needs this member's old view block or counters any more. What is not posted of them
    /// is dropped; state owed to a joiner is still posted in the new view.
    pub(super) fn may_leave(&self) -> Result<bool, MulticastError> {
        let (Some(next), Some(view)) = (&self.next, &self.view) else { return Ok(false) };
        let next_layout = Layout::of_epoch(next, self.epoch + 1);
        let ctx = Ctx { fabric: &self.fabric, layout: &self.layout, config: &self.config, epoch: self.epoch };
        for (new_rank, &peer) in next.members.iter().enumerate() {
            let Some(old_rank) = rank_of(&self.config.members, peer).filter(|_| peer != self.config.me) else {
                continue;
            };
            let left = self.fabric.load_u64(SST_REGION, next_layout.view_at(new_rank) + view_word::HEARTBEAT)? != 0;
            if !left && !view.released(&ctx, old_rank)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Leaves the old view for the next one (module docs).
    pub(super) fn transition(&mut self) -> Result<(), MulticastError> {
        let next = self.next.take().expect("a transition follows an install");
        // Own messages beyond the trim (delivered by nobody), in ring order.
        let mut resend: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
        // Not for delivery at receipt: some members may have delivered them (at most once).
        let ordered = |index: usize| self.config.subgroups[index].delivery == super::config::Delivery::Ordered;
        for sub in self.subgroups.iter().flatten().filter(|s| ordered(s.index)) {
            let Some(ring) = &sub.ring else { continue };
            let payloads = (ring.delivered_real()..ring.committed())
                .map(|real| ring.own_payload(real).expect("an undelivered message is in the ring").1.to_vec())
                .collect();
            resend.push((sub.index, payloads));
        }
        if self.config.bug(super::planted::PlantedBug::NoResend) {
            resend.clear();
        }
        // A join this member proposed that the agreed view did not take is proposed again in
        // the next view (one join per change), unless the node got in meanwhile.
        let pending = self.view.as_ref().map_or(0, |v| v.join());
        let carried = JoinRequest::from_word(pending).filter(|j| {
            let room = self.config.failure_detection.is_some_and(|d| next.members.len() < d.max_members);
            !next.members.contains(&j.node) && room
        });
        let joined = self.view.as_ref().and_then(|v| JoinRequest::from_word(v.decided_join())).map(|j| j.node);
        let epoch = self.epoch + 1;
        let joiner = joined.and_then(|node| rank_of(&next.members, node));
        self.open_epoch(epoch, next)?;
        if let (Some(rank), Some(view)) = (joiner, self.view.as_mut()) {
            view.expect_joiner(rank);
        }
        if let (Some(join), Some(view)) = (carried, self.view.as_mut()) {
            assert!(view.propose_join(join.word()), "a fresh view runs with no join pending");
        }
        self.zero_area(epoch + 1)?;
        for (index, payloads) in resend {
            let Some(ring) = self.subgroups[index].as_mut().and_then(|s| s.ring.as_mut()) else { continue };
            for payload in payloads {
                ring.reserve().expect("a fresh ring has room for a window")[..payload.len()].copy_from_slice(&payload);
                ring.commit(payload.len());
            }
        }
        Ok(())
    }

    /// Zeroes, in local memory, the area epoch `epoch` will use.
    fn zero_area(&self, epoch: u64) -> Result<(), MulticastError> {
        let len = area_bytes(&self.config);
        let zeros = vec![0u8; len as usize];
        self.fabric.write_local(SST_REGION, (epoch % AREAS) * len, &zeros)?;
        Ok(())
    }

    /// A joiner's poll: once the view and the state of every subgroup it enters have arrived,
    /// restore the state and start running the view.
    pub(super) fn poll_joining(&mut self, deliver: &mut impl Deliver) -> Result<bool, MulticastError> {
        let template = self.joining.as_ref().expect("joining");
        let state = self.state_layout.as_ref().expect("a joiner has failure detection");
        let Some((epoch, bytes)) = state.read(&self.fabric, 0)? else { return Ok(false) };
        let (_, config) = decode_view(&bytes, template)?;
        if !config.members.contains(&config.me) {
            return Err(MulticastError::Transfer(format!("the view does not include this joiner, {}", config.me)));
        }
        let mut states = Vec::new();
        for (index, sub) in config.subgroups.iter().enumerate().filter(|(_, s)| s.members.contains(&config.me)) {
            match state.read(&self.fabric, 1 + index)? {
                Some((e, bytes)) if e == epoch => states.push((index, bytes)),
                _ => return Ok(false),
            }
            debug_assert!(sub.senders.contains(&config.me));
        }
        for (index, bytes) in states {
            deliver.restore(index, &bytes);
        }
        for &peer in config.members.iter().filter(|&&m| m != config.me) {
            self.fabric.grant_write(SST_REGION, peer)?;
        }
        let view = View {
            epoch,
            members: config.members.clone(),
            joined: Some(config.me),
            delivered: vec![None; config.subgroups.len()],
        };
        self.joining = None;
        self.open_epoch(epoch, config)?;
        self.zero_area(epoch + 1)?;
        deliver.view_installed(&view);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multicast::config::{Delivery, SubgroupConfig};

    fn ids(v: &[u16]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn a_join_request_is_one_word_and_round_trips() {
        let join = JoinRequest::new(NodeId(200), &[0, 2, 46]);
        let back = JoinRequest::from_word(join.word()).expect("a request is never the zero word");
        assert_eq!(back, join);
        assert!(back.enters(46) && back.enters(2) && !back.enters(1));
        assert_eq!(JoinRequest::from_word(0), None);
        assert_ne!(JoinRequest::new(NodeId(0), &[]).word(), 0);
    }

    #[test]
    fn the_next_view_keeps_live_members_in_order_and_adds_the_joiner_last() {
        let old = GroupConfig {
            subgroups: vec![
                SubgroupConfig {
                    members: ids(&[0, 1, 2]),
                    senders: ids(&[2, 0]),
                    window: 4,
                    max_payload_bytes: 8,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
                SubgroupConfig {
                    members: ids(&[1]),
                    senders: ids(&[1]),
                    window: 2,
                    max_payload_bytes: 8,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
            ],
            ..GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 1, 8)
        };
        let view = View { epoch: 1, members: ids(&[0, 2, 7]), joined: Some(NodeId(7)), delivered: vec![] };
        let next = next_config(&old, &view, Some(JoinRequest::new(NodeId(7), &[0])));
        assert_eq!(next.members, ids(&[0, 2, 7]));
        assert_eq!(next.subgroups[0].members, ids(&[0, 2, 7]));
        assert_eq!(next.subgroups[0].senders, ids(&[2, 0, 7]));
        assert!(next.subgroups[1].members.is_empty(), "a subgroup whose members all left stays, empty");
        assert_eq!(next.validate_view(), Ok(()));
        assert!(next.validate().is_err(), "which a user's configuration may not have");
    }
}
