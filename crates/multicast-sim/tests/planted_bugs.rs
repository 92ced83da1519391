//! The checkers can fail: each planted multicast bug is caught within a documented number of
//! seeds (docs/MULTICAST.md), and the failing seed replays exactly.
//!
//! Run with `cargo test --release -p microrep-multicast-sim --features planted-bugs --test planted_bugs`.
#![cfg(feature = "planted-bugs")]

use microrep_core::multicast::PlantedBug;
use microrep_multicast_sim::check::Violation;
use microrep_multicast_sim::{Failure, Options, rings_pulled, run};

/// Runs seeds from 0 until one fails; returns the failure.
fn first_failure(bug: PlantedBug, budget: u64) -> Failure {
    first_failure_among(bug, 0..budget).unwrap_or_else(|| panic!("{bug:?} went unnoticed for {budget} seeds"))
}

/// Runs `seeds` in order until one fails; returns the failure, checked to replay exactly.
fn first_failure_among(bug: PlantedBug, seeds: impl Iterator<Item = u64>) -> Option<Failure> {
    let options = Options { bug: Some(bug), ..Options::default() };
    for seed in seeds {
        if let Err(failure) = run(seed, &options) {
            let again = run(seed, &options).expect_err("a failing seed fails again");
            assert_eq!(again, failure, "{bug:?}: seed {seed} must replay exactly");
            return Some(failure);
        }
    }
    None
}

#[test]
fn delivering_before_stability_is_caught() {
    let failure = first_failure(PlantedBug::DeliverBeforeStable, 5);
    assert!(matches!(failure.violation, Violation::Stability { .. }), "{failure}");
}

#[test]
fn reading_slots_without_the_guard_is_caught() {
    let failure = first_failure(PlantedBug::NoGuard, 50);
    // A torn slot shows as bytes that were never sent; a ring pulled from its sender's memory,
    // which the simulator writes whole, as a sequence number delivered out of order.
    assert!(
        matches!(failure.violation, Violation::Validity { .. } | Violation::Poll(_) | Violation::Duplicate { .. }),
        "{failure}"
    );
}

#[test]
fn installing_a_view_without_ragged_edge_cleanup_is_caught() {
    let failure = first_failure(PlantedBug::NoRaggedEdge, 200);
    assert!(matches!(failure.violation, Violation::VirtualSynchrony(_)), "{failure}");
}

#[test]
fn a_view_change_that_drops_a_live_senders_undelivered_messages_is_caught() {
    let failure = first_failure(PlantedBug::NoResend, 100);
    assert!(matches!(failure.violation, Violation::Liveness(_)), "{failure}");
}

#[test]
fn counting_majorities_among_trusted_members_is_caught() {
    let failure = first_failure(PlantedBug::MajorityOfTrusted, 100);
    assert!(matches!(failure.violation, Violation::VirtualSynchrony(_)), "a minority view, or two views: {failure}");
}

#[test]
fn members_that_stop_taking_in_suspicions_once_wedged_are_caught() {
    let failure = first_failure(PlantedBug::FrozenSuspicions, 50);
    assert!(matches!(failure.violation, Violation::Liveness(_)), "a change that never ends: {failure}");
}

#[test]
fn reusing_a_slot_a_member_has_not_delivered_yet_is_caught() {
    let failure = first_failure(PlantedBug::FreeOnReceipt, 100);
    assert!(matches!(failure.violation, Violation::Validity { .. }), "a payload overwritten in place: {failure}");
}

/// The first failure under `bug` among seeds whose rings are pulled from the sender's memory
/// (shm's way), within `budget` seeds.
fn first_pulled_failure(bug: PlantedBug, budget: u64) -> Failure {
    first_failure_among(bug, (0..budget).filter(|&s| rings_pulled(s)))
        .unwrap_or_else(|| panic!("{bug:?} went unnoticed for the pulled seeds among {budget}"))
}

#[test]
fn the_bugs_of_the_rings_are_caught_where_receivers_pull_them_from_the_senders_memory() {
    let failure = first_pulled_failure(PlantedBug::FreeOnReceipt, 200);
    assert!(matches!(failure.violation, Violation::Validity { .. }), "a payload overwritten in place: {failure}");
    let failure = first_pulled_failure(PlantedBug::DeliverBeforeStable, 20);
    assert!(matches!(failure.violation, Violation::Stability { .. }), "{failure}");
    let failure = first_pulled_failure(PlantedBug::NoRaggedEdge, 400);
    assert!(matches!(failure.violation, Violation::VirtualSynchrony(_)), "{failure}");
    // Not `NoGuard`: the simulator's local write, which puts a pulled ring's slot in place,
    // lands whole, so a reader past the guard never sees half a slot there (on shm it is a
    // copy another process can see half done; the guard orders it).
}
