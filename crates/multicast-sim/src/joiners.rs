//! What the group owes a joiner, and when a node may stop for good: the liveness rules the
//! stages' settling (`run.rs`) and the polls (`sim.rs`) apply to joins and to lost majorities.
//!
//! - A joiner that asks for itself (`Member::ask_to_join`) must get in while a member of its
//!   template runs in the latest view, its request lost or not; one that does not ask must get
//!   in or give up (`MulticastError::JoinTimedOut`): it never waits for good.
//! - A member stops for want of a majority (`MulticastError::MajorityLost`) only when its view
//!   has no majority of members that run (or will run: a joiner whose state a running member
//!   holds), and then every node must stop: none stays wedged or joining for good.

use microrep_core::multicast::{MulticastError, Phase};
use microrep_fabric::NodeId;

use crate::check::Violation;
use crate::run::Failure;
use crate::sim::{Node, Sim};

impl Sim {
    /// Whether joiner `n`, a member of view `epoch`, will get its state: a member of that view
    /// other than `n` runs, and for each subgroup `n` enters there whose old members the view
    /// kept, one of them runs.
    pub(crate) fn served(&self, n: &Node, epoch: u64) -> bool {
        let Some(config) = self.configs.get(&epoch) else { return false };
        let runs = |m: &NodeId| *m != n.id && self.live().any(|o| o.id == *m && o.member.phase() != Phase::Joining);
        let entered = config.subgroups.iter().filter(|s| s.members.contains(&n.id));
        config.members.iter().any(runs)
            && entered.into_iter().all(|s| s.members.iter().all(|m| *m == n.id) || s.members.iter().any(runs))
    }

    /// Whether a stage must wait for joiner `n` (still joining) before it settles: it is in
    /// the latest view (its state must come); or it does not ask (it must get in or give up);
    /// or it was not refused and a member of its template runs in the latest view (the joiner
    /// asks the template's members in turn). So a joiner whose request was lost (its sponsor
    /// failed before any member saw it), and one the group gave up on (a failure cut its state
    /// transfer short, so a later view removed it), get in or, if they do not ask, give up; a
    /// refused one is told why (`MulticastError::JoinRefused`) and is done.
    pub(crate) fn awaited(&self, n: &Node, latest: &[NodeId]) -> bool {
        if latest.contains(&n.id) || !n.asks {
            return true;
        }
        n.refused.is_none() && self.template.members.iter().any(|m| self.runs_in(*m, latest, false))
    }

    /// Whether node `m` is up and a member of `latest` that has started (with `steady`: that
    /// runs it, not changing views).
    fn runs_in(&self, m: NodeId, latest: &[NodeId], steady: bool) -> bool {
        self.nodes.iter().any(|o| {
            let phase = o.member.phase();
            o.id == m
                && o.up()
                && latest.contains(&m)
                && !matches!(phase, Phase::Excluded | Phase::Joining)
                && (!steady || phase == Phase::Running)
        })
    }

    /// Node `i`, a joiner, gave up. A joiner that does not ask may (its request may have been
    /// lost); one that asks must not while the group owes it admission: it is in the latest
    /// view and served, or a member of its template runs the latest view. (Not checked after a
    /// partition: a side may be out of the joiner's reach.)
    pub(crate) fn check_gave_up(&self, i: usize) -> Result<(), Failure> {
        let n = &self.nodes[i];
        if !n.asks || self.report.partition {
            return Ok(());
        }
        let latest = self.views.last().expect("the first view");
        let owed = if latest.contains(&n.id) {
            self.served(n, self.views.len() as u64 - 1)
        } else {
            self.template.members.iter().any(|m| self.runs_in(*m, latest, true))
        };
        if !owed {
            return Ok(());
        }
        Err(self.fail(Violation::Liveness(format!(
            "joiner {} gave up asking while the group owed it admission (latest view {latest:?})",
            n.id
        ))))
    }

    /// Node `i` stopped with `error` ([`MulticastError::MajorityLost`]) for want of a majority
    /// of its view: that view must have no majority of members that are up and not excluded
    /// (a joiner counting if it is served), unless the next view is installed without node
    /// `i` (it was left out, and stops like an excluded member). Not checked after a partition,
    /// where a majority may run out of reach.
    pub(crate) fn check_majority_lost(&self, i: usize, error: &MulticastError) -> Result<(), Failure> {
        let MulticastError::MajorityLost { epoch, .. } = *error else { return Ok(()) };
        let me = self.nodes[i].id;
        let left_out = self.views.get(epoch as usize + 1).is_some_and(|next| !next.contains(&me));
        if self.report.partition || left_out {
            return Ok(());
        }
        let members = &self.views[epoch as usize];
        let counts = |n: &&Node| match n.member.phase() {
            Phase::Excluded => false,
            Phase::Joining => self.served(n, epoch),
            _ => true,
        };
        let alive = members.iter().filter(|m| self.live().filter(counts).any(|n| n.id == **m)).count();
        if 2 * alive <= members.len() {
            return Ok(());
        }
        Err(self.fail(Violation::Liveness(format!(
            "{me} stopped for want of a majority of view {epoch} {members:?}, of which {alive} run: {error}"
        ))))
    }
}
