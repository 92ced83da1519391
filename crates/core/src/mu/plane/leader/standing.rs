//! Standing: whether a replica may count in quorums, which a replica restarted with fresh
//! memory may not at first.
//!
//! Mu assumes a replica that fails stays failed. A replica restarted under the same id with
//! fresh (zeroed) memory has forgotten what it accepted and promised. Counted in a quorum it
//! could lose a chosen entry: a leader commits entry E on itself and follower A; A restarts
//! empty; the leader pauses; B, which missed E, is elected with A's help, finds E nowhere, and
//! fills its slot with something else (the fault harness caught exactly this).
//!
//! So a replica starts *recovering* (its CONTROL `STANDING` word differs from its
//! `INCARNATION`). It still serves permission requests and follows, so a leader can bring it up
//! to date, but its permission acks carry [`layout::ACK_RECOVERING`], no leader counts it toward
//! a majority, and it never leads (peers read its standing with their heartbeat READs and skip
//! it when choosing a leader). It becomes a *voter* in one of two ways:
//!
//! - **Promotion.** A leader that brought it up to date (copied its committed log into it) then
//!   finishes a prepare walk (its prepare found every read slot empty at some index `e`, after
//!   adopting and re-accepting, into this replica too, every value found below `e`) and commits
//!   the entry at `e`, with a majority of voters; it writes the replica's incarnation into the
//!   replica's `STANDING`. Every entry chosen before the restart is below `e` and so in the
//!   replica's log. Committing an entry is not enough without the walk: the catch-up FUO can
//!   lie below entries a previous leader chose (the FUO word trails accepted entries), and
//!   those reach the replica only as the walk passes them. The incarnation guards against a
//!   replica that restarted again meanwhile.
//! - **Bootstrap.** Every member reports a pristine log (minProposal and FUO 0) and remembers
//!   no cluster generation: nothing was ever accepted anywhere, so nothing can have been
//!   forgotten, and the replica that sees it makes every member a voter (`mu::plane::bootstrap`). A
//!   new cluster therefore starts once every member is up. A cluster all of whose members
//!   restarted with fresh memory does too unless a member remembers its generation; then it
//!   reports the loss instead.
//!
//! The price is availability, as in Viewstamped Replication's recovery: a recovering replica
//! counts as failed, so a cluster makes progress only while a majority are live voters, with one
//! exception: a voter that hears from *every* member counts the recovering ones too. A chosen
//! entry lives on a majority; if none of its voters is among those heard, all of its holders
//! forgot it and nothing can bring it back, and otherwise the candidate reads it from one of
//! them. So the last voter standing can still lead two restarted replicas back.

use std::collections::BTreeMap;

use microrep_fabric::{Endpoint, Fabric, NodeId, RemoteAddr};

use super::ReplicationPlane;
use crate::mu::MuConfig;
use crate::mu::api::Event;
use crate::mu::layout;
use crate::mu::membership::MemberSet;
use crate::mu::plane::round::{Peers, Round};
use crate::mu::slot::EntryKind;

/// What a leader knows of a recovering follower it brought up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Recovering {
    /// The follower's incarnation, as read when it was brought up to date.
    pub(super) incarnation: u64,
    /// Once the leader's FUO passes this index (an entry proposed after the follower was
    /// brought up to date is committed), the follower may be promoted; `None` until then.
    pub(super) promote_after: Option<u64>,
}

/// Which sets of followers, with the leader (a member), make a quorum: a majority of the
/// members that are voters; or, in a term whose permission acks came from every member
/// (`all_voters` known), every voter plus enough recovering members for a majority. Followers
/// that are not members (joiners, `mu::membership`) never count.
#[derive(Debug)]
pub(super) struct Quorum<'a> {
    members: MemberSet,
    recovering: &'a BTreeMap<NodeId, Recovering>,
    all_voters: Option<&'a [NodeId]>,
    /// The planted bug `JoinerVotesEarly`: every follower counts toward the members' majority.
    everyone_votes: bool,
}

impl<'a> Quorum<'a> {
    pub(super) fn new(
        members: MemberSet,
        recovering: &'a BTreeMap<NodeId, Recovering>,
        all_voters: Option<&'a [NodeId]>,
    ) -> Self {
        Self { members, recovering, all_voters, everyone_votes: false }
    }

    /// Whether the leader and `followers` make a quorum.
    pub(super) fn reached(&self, followers: &[NodeId]) -> bool {
        let majority = self.members.majority();
        if self.everyone_votes {
            return 1 + followers.len() >= majority;
        }
        let members = || followers.iter().filter(|p| self.members.contains(**p));
        let voters = members().filter(|p| !self.recovering.contains_key(p)).count();
        1 + voters >= majority
            || self
                .all_voters
                .is_some_and(|all| all.iter().all(|v| followers.contains(v)) && 1 + members().count() >= majority)
    }

    /// Whether the leader and the followers that acknowledged `round` make a quorum.
    pub(super) fn holds(&self, round: &Round) -> bool {
        self.reached(&round.acked)
    }

    /// Whether `round` can no longer reach a quorum once `dropped` followers are gone.
    pub(super) fn lost(&self, round: &Round, dropped: &[NodeId]) -> bool {
        let still_possible: Peers = round.posted().iter().copied().filter(|p| !dropped.contains(p)).collect();
        !self.reached(&still_possible)
    }
}

/// What a leader knows of its followers' standing in its term: the standing sub-machine's
/// state, private to this module (the leader's other modules use the methods below).
#[derive(Debug, Default)]
pub(super) struct Standing {
    /// Followers that granted permission while recovering, not counted in quorums.
    recovering: BTreeMap<NodeId, Recovering>,
    /// In a term whose permission acks came from every member: the voters among them (see
    /// [`Quorum`]).
    all_voters: Option<Vec<NodeId>>,
}

impl Standing {
    /// A new attempt to lead, or none: nothing is known of the followers.
    pub(super) fn clear(&mut self) {
        self.recovering.clear();
        self.all_voters = None;
    }

    /// The permission acks of this term came from every member: `voters` are the voters among
    /// them. `None` if some member did not grant.
    pub(super) fn heard_from_all(&mut self, voters: Option<Vec<NodeId>>) {
        self.all_voters = voters;
    }

    /// Whether `peer` granted permission while recovering and is not promoted yet.
    pub(super) fn is_recovering(&self, peer: NodeId) -> bool {
        self.recovering.contains_key(&peer)
    }

    /// The quorum rule of a term under `members` (borrowing only this state, so that a caller
    /// may hold it while changing the leader's phase).
    pub(super) fn quorum<'a>(&'a self, config: &MuConfig, members: MemberSet) -> Quorum<'a> {
        let everyone_votes = config.bug(crate::mu::planted::PlantedBug::JoinerVotesEarly);
        Quorum { everyone_votes, ..Quorum::new(members, &self.recovering, self.all_voters.as_deref()) }
    }
}

impl<E: Endpoint> ReplicationPlane<E> {
    /// The members whose majorities this term counts: those of the configuration applied (a
    /// term under an older one ends before proposing, see `membership`), or, with the planted
    /// bug `KeepTermAcrossChange`, those the term started with.
    pub(super) fn quorum_members(&self) -> MemberSet {
        if self.config.bug(crate::mu::planted::PlantedBug::KeepTermAcrossChange) && self.term.leading() {
            self.term.term_members
        } else {
            self.configuration.members
        }
    }

    /// The quorum rule of the current term.
    pub(super) fn quorum(&self) -> Quorum<'_> {
        self.term.standing.quorum(&self.config, self.quorum_members())
    }

    /// Publishes the remembered generation, the durable index and the incarnation (once, in that
    /// order: a peer that reads the incarnation reads the other two too) and reads this replica's standing,
    /// reporting [`Event::Voter`] when it becomes a voter.
    pub(in crate::mu::plane) fn refresh_standing<F: Fabric<Endpoint = E>>(&mut self, fabric: &F) {
        let incarnation = self.config.incarnation;
        if fabric.load_u64(layout::CONTROL, layout::INCARNATION).unwrap_or(0) != incarnation {
            layout::store_own(fabric, layout::CONTROL, layout::GENERATION, self.config.generation);
            self.publish_durable(fabric);
            layout::store_own(fabric, layout::CONTROL, layout::INCARNATION, incarnation);
        }
        let voter = fabric.load_u64(layout::CONTROL, layout::STANDING).unwrap_or(0) == incarnation;
        if voter && !self.voter {
            let generation = fabric.load_u64(layout::CONTROL, layout::GENERATION).unwrap_or(0);
            self.events.push(Event::Voter { generation });
        }
        self.voter = voter;
    }

    /// Records the standing a permission ack of `peer` reports (leader side).
    pub(super) fn note_ack_standing(&mut self, peer: NodeId, ack: u64) {
        if ack & layout::ACK_RECOVERING != 0 {
            self.term.standing.recovering.entry(peer).or_insert(Recovering { incarnation: 0, promote_after: None });
        } else {
            self.term.standing.recovering.remove(&peer);
        }
    }

    /// A recovering follower's log now holds everything this leader committed: it becomes
    /// promotable once an entry proposed from here on commits. Queues a no-op so one does even
    /// without client requests.
    pub(super) fn brought_up_to_date<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, peer: NodeId) {
        let incarnation = fabric.load_u64(layout::SCRATCH, self.layout.scratch(peer, layout::SCRATCH_INCARNATION));
        let fuo = self.term.fuo;
        if let Some(r) = self.term.standing.recovering.get_mut(&peer) {
            *r = Recovering { incarnation: incarnation.unwrap_or(0), promote_after: Some(fuo) };
            if self.term.pending.is_empty() {
                self.term.pending.push_back(super::term::Proposal {
                    request_id: 0,
                    kind: EntryKind::Noop,
                    payload: crate::mu::slot::Frame::new(),
                });
            }
        }
    }

    /// Promotes every confirmed recovering follower whose promotion point was committed by a
    /// term whose prepare walk is over (see the module documentation).
    pub(super) fn promote_ready<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) {
        let walk = if self.config.bug(crate::mu::planted::PlantedBug::PromoteAtCatchUp) {
            Some(u64::MAX - 1)
        } else {
            self.term.walk_ended_at.filter(|&e| e < self.term.fuo)
        };
        let Some(walk_end) = walk else {
            return;
        };
        let ready: Vec<(NodeId, u64)> = self
            .term
            .standing
            .recovering
            .iter()
            .filter(|(p, r)| self.term.confirmed.contains(p) && r.incarnation != 0)
            .filter(|(_, r)| r.promote_after.is_some_and(|at| at < self.term.fuo && at <= walk_end))
            .map(|(&p, r)| (p, r.incarnation))
            .collect();
        let generation = fabric.load_u64(layout::CONTROL, layout::GENERATION).unwrap_or(0);
        for (peer, incarnation) in ready {
            // The generation first: a replica that finds itself a voter finds its generation
            // (one FIFO link).
            let (generation_at, standing) = (
                RemoteAddr::new(layout::CONTROL, layout::GENERATION),
                RemoteAddr::new(layout::CONTROL, layout::STANDING),
            );
            if self.write_untracked(fabric, now, peer, generation_at, &generation.to_le_bytes())
                && self.write_untracked(fabric, now, peer, standing, &incarnation.to_le_bytes())
            {
                tracing::debug!(node = self.me.0, peer = peer.0, index = self.term.fuo, "recovering follower promoted");
                self.term.standing.recovering.remove(&peer);
                if let Some(all) = self.term.standing.all_voters.as_mut() {
                    all.push(peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use microrep_fabric::sim::{SimConfig, SimEndpoint, SimWorld};

    use super::*;
    use crate::mu::{LocalLogGate, MuConfig, regions};

    /// Hole 3 of the safety review: a recovering follower brought up to date at the catch-up
    /// FUO was promoted as soon as the first entry after it committed, while the term's prepare
    /// walk still had chosen entries to re-accept into it. Promotion now waits for the walk to
    /// find an empty slot and for that slot's entry to commit.
    #[test]
    fn standing_a_recovering_follower_is_promoted_only_after_the_prepare_walk() {
        let world = SimWorld::new(1, SimConfig::reliable());
        let config = MuConfig::simulated(NodeId(0), 3);
        let leader = world.add_cluster_node(NodeId(0), 3, &regions(&config)).expect("leader");
        let follower = world.add_cluster_node(NodeId(1), 3, &regions(&config)).expect("follower");
        let members = crate::mu::SharedMembers::new(config.members);
        let mut plane = ReplicationPlane::<SimEndpoint>::new(&config, LocalLogGate::new(), members, 0);
        let peer = NodeId(1);
        plane.term.confirmed = vec![peer];
        plane.term.standing.recovering.insert(peer, Recovering { incarnation: 9, promote_after: Some(10) });
        // The walk re-accepted the value found at 10 (committed: FUO 11) and goes on at 11.
        plane.term.fuo = 11;
        plane.promote_ready(&leader, 0);
        assert!(plane.term.standing.recovering.contains_key(&peer), "promoted while the walk may pass chosen entries");
        // The walk found 11 empty everywhere and proposed there; not yet committed.
        plane.term.walk_ended_at = Some(11);
        plane.promote_ready(&leader, 0);
        assert!(plane.term.standing.recovering.contains_key(&peer), "promoted before the walk's own entry committed");
        plane.term.fuo = 12;
        plane.promote_ready(&leader, 0);
        assert!(
            !plane.term.standing.recovering.contains_key(&peer),
            "the walk is over: the follower holds every chosen entry"
        );
        world.run_until_idle();
        assert_eq!(follower.load_u64(layout::CONTROL, layout::STANDING), Ok(9), "its standing was written");
    }

    #[test]
    fn section_4_1_majority_includes_the_leader() {
        let none = std::collections::BTreeMap::new();
        let q = Quorum::new(crate::mu::MemberSet::first(5), &none, None);
        let mut r =
            crate::mu::plane::round::Round::new(1, smallvec::smallvec![NodeId(1), NodeId(2), NodeId(3), NodeId(4)], 0);
        assert!(!q.holds(&r));
        r.ack(NodeId(3));
        r.ack(NodeId(3));
        assert!(!q.holds(&r), "duplicate acks count once");
        r.ack(NodeId(9));
        assert!(!q.holds(&r), "acks from followers not in the round do not count");
        r.ack(NodeId(1));
        assert!(q.holds(&r));
        assert!(!q.lost(&r, &[NodeId(2)]));
        assert!(q.lost(&r, &[NodeId(1), NodeId(2), NodeId(3), NodeId(4)]));
    }

    #[test]
    fn followers_that_are_not_members_never_count() {
        let none = std::collections::BTreeMap::new();
        let members: crate::mu::MemberSet = [NodeId(0), NodeId(1), NodeId(2)].into_iter().collect();
        let q = Quorum::new(members, &none, None);
        let mut r = crate::mu::plane::round::Round::new(1, smallvec::smallvec![NodeId(1), NodeId(3), NodeId(4)], 0);
        r.ack(NodeId(3));
        r.ack(NodeId(4));
        assert!(!q.holds(&r), "two joiners acked: no member did");
        r.ack(NodeId(1));
        assert!(q.holds(&r));
    }
}
