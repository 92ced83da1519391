//! Invariants of one replica that hold between any two polls. The simulator checks them after
//! every poll of every replica, so a broken one is reported at the step that broke it, with
//! its seed, rather than as a disagreement found much later.

use microrep_fabric::{Fabric, NodeId};

use super::layout;
use super::slot::MAX_PROPOSAL;
use super::{Replica, Status};

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvariantViolation {
    /// The replica applied an entry it does not know to be committed.
    #[error("applied up to {applied}, beyond the FUO {fuo} (and its log's FUO word {fuo_word})")]
    AppliedBeyondFuo {
        /// Next index to apply.
        applied: u64,
        /// The FUO as the replica knows it.
        fuo: u64,
        /// Its log's FUO word.
        fuo_word: u64,
    },
    /// The confirmed set holds this replica itself, a non-member or a duplicate.
    #[error("the confirmed set {confirmed:?} is not a set of distinct peers")]
    ConfirmedNotPeers {
        /// The confirmed set.
        confirmed: Vec<NodeId>,
    },
    /// The log was recycled past what this replica applied.
    #[error("the recycling point {tail} is beyond what was applied ({applied})")]
    TailBeyondApplied {
        /// The recycling point.
        tail: u64,
        /// Next index to apply.
        applied: u64,
    },
    /// The proposal number is not one this replica could have drawn.
    #[error("proposal number {prop_nr:#x} is not replica {node}'s (or exceeds 32 bits)")]
    ForeignProposal {
        /// The replica.
        node: NodeId,
        /// Its proposal number.
        prop_nr: u64,
    },
    /// A quantity that only grows went down.
    #[error("{what} went down from {before} to {after}")]
    WentDown {
        /// Which.
        what: &'static str,
        /// The earlier value.
        before: u64,
        /// The later one.
        after: u64,
    },
}

impl<F: Fabric> Replica<F> {
    /// Checks the invariants that hold at any moment between polls.
    pub fn invariants(&self) -> Result<(), InvariantViolation> {
        let fuo_word = self.fabric.load_u64(layout::LOG, layout::FUO).unwrap_or(0);
        status_invariants(self.status(), fuo_word, self.replication.replicas())
    }
}

/// The invariants of one replica's state `s`, whose log's FUO word is `fuo_word`, in a cluster
/// of `replicas`.
fn status_invariants(s: Status, fuo_word: u64, replicas: u16) -> Result<(), InvariantViolation> {
    if s.applied > s.fuo.max(fuo_word) {
        return Err(InvariantViolation::AppliedBeyondFuo { applied: s.applied, fuo: s.fuo, fuo_word });
    }
    let mut peers = s.confirmed.clone();
    peers.sort_unstable();
    peers.dedup();
    if peers.len() != s.confirmed.len() || peers.iter().any(|&p| p == s.node || p.0 >= replicas) {
        return Err(InvariantViolation::ConfirmedNotPeers { confirmed: s.confirmed });
    }
    if s.tail > s.applied {
        return Err(InvariantViolation::TailBeyondApplied { tail: s.tail, applied: s.applied });
    }
    let own = s.proposal_number == 0 || s.proposal_number & 0xff == u64::from(s.node.0);
    if !own || s.proposal_number > MAX_PROPOSAL {
        return Err(InvariantViolation::ForeignProposal { node: s.node, prop_nr: s.proposal_number });
    }
    Ok(())
}

/// The invariants across polls of one run of a replica (a restart with fresh memory starts a
/// new watch): what only grows never goes down.
#[derive(Clone, Debug, Default)]
pub struct InvariantWatch {
    applied: u64,
    proposal_number: u64,
    min_proposal: u64,
    terms_led: u64,
}

impl InvariantWatch {
    /// Checks `replica` against itself at the previous check, and [`Replica::invariants`].
    pub fn check<F: Fabric>(&mut self, replica: &Replica<F>) -> Result<(), InvariantViolation> {
        replica.invariants()?;
        let s = replica.status();
        let min_proposal = replica.fabric().load_u64(layout::LOG, layout::MIN_PROPOSAL).unwrap_or(0);
        let now = [
            ("the applied index", s.applied),
            ("the proposal number", s.proposal_number),
            ("the minProposal promise", min_proposal),
            ("the terms led", s.terms_led),
        ];
        let before = [self.applied, self.proposal_number, self.min_proposal, self.terms_led];
        for ((what, after), before) in now.into_iter().zip(before) {
            if after < before {
                return Err(InvariantViolation::WentDown { what, before, after });
            }
        }
        *self = Self { applied: s.applied, proposal_number: s.proposal_number, min_proposal, terms_led: s.terms_led };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use microrep_fabric::sim::{SimConfig, SimWorld};

    use super::*;
    use crate::mu::{MuConfig, regions};

    fn replica() -> Replica<microrep_fabric::sim::SimFabric> {
        let world = SimWorld::new(1, SimConfig::reliable());
        let config = MuConfig::simulated(NodeId(1), 3);
        let fabric = world.add_cluster_node(NodeId(1), 3, &regions(&config)).expect("node");
        Replica::new(fabric, config, 0).expect("replica")
    }

    #[test]
    fn a_fresh_replica_keeps_every_invariant_and_breaking_one_is_named() {
        let r = replica();
        let mut watch = InvariantWatch::default();
        assert_eq!(watch.check(&r), Ok(()));
        let check = |change: &dyn Fn(&mut Status)| {
            let mut s = r.status();
            change(&mut s);
            status_invariants(s, 0, 3)
        };
        let applied = check(&|s| s.applied = 3);
        assert!(matches!(applied, Err(InvariantViolation::AppliedBeyondFuo { applied: 3, .. })));
        let itself = check(&|s| s.confirmed = vec![NodeId(1)]);
        assert!(matches!(itself, Err(InvariantViolation::ConfirmedNotPeers { .. })), "itself");
        let duplicate = check(&|s| s.confirmed = vec![NodeId(2), NodeId(2)]);
        assert!(matches!(duplicate, Err(InvariantViolation::ConfirmedNotPeers { .. })), "a duplicate");
        let foreign = check(&|s| {
            s.confirmed = vec![NodeId(0), NodeId(2)];
            s.proposal_number = 0x300;
        });
        assert!(matches!(foreign, Err(InvariantViolation::ForeignProposal { .. })), "replica 0's number");
        let fine = check(&|s| {
            s.confirmed = vec![NodeId(0), NodeId(2)];
            s.proposal_number = 0x301;
        });
        assert_eq!(fine, Ok(()));
    }

    #[test]
    fn a_promise_that_goes_down_is_caught() {
        let r = replica();
        let mut watch = InvariantWatch::default();
        r.fabric.store_u64(layout::LOG, layout::MIN_PROPOSAL, 0x502).expect("store");
        assert_eq!(watch.check(&r), Ok(()));
        r.fabric.store_u64(layout::LOG, layout::MIN_PROPOSAL, 0x402).expect("store");
        assert_eq!(
            watch.check(&r),
            Err(InvariantViolation::WentDown { what: "the minProposal promise", before: 0x502, after: 0x402 })
        );
    }
}
