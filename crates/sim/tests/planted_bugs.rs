//! The checkers can fail: each planted protocol bug is caught by the simulator within a
//! documented number of seeds (docs/SIMULATION.md), and the failing seed replays exactly.
//!
//! Run with `cargo test --release -p microrep-sim --features planted-bugs --test planted_bugs`.
#![cfg(feature = "planted-bugs")]

use microrep_core::mu::PlantedBug;
use microrep_sim::{SimOptions, run};

fn options(seed: u64, bug: PlantedBug) -> SimOptions {
    SimOptions { bug: Some(bug), ..SimOptions::new([3, 5, 7][(seed % 3) as usize]) }
}

/// Runs seeds from 0 until one fails; returns the failing seed.
fn first_failing_seed(bug: PlantedBug, budget: u64) -> u64 {
    first_failing(bug, budget, |seed| options(seed, bug))
}

/// Runs seeds from 0 with `options` until one fails, which must replay exactly; returns it.
fn first_failing(bug: PlantedBug, budget: u64, options: impl Fn(u64) -> SimOptions) -> u64 {
    for seed in 0..budget {
        if let Err(failure) = run(seed, &options(seed)) {
            let again = run(seed, &options(seed)).expect_err("a failing seed fails again");
            assert_eq!(again, failure, "{bug:?}: seed {seed} must replay exactly");
            return seed;
        }
    }
    panic!("{bug:?} went unnoticed for {budget} seeds");
}

#[test]
fn skip_revoke_is_caught() {
    first_failing_seed(PlantedBug::SkipRevoke, 50);
}

#[test]
fn ignoring_prepared_values_is_caught() {
    first_failing_seed(PlantedBug::IgnorePreparedValues, 50);
}

#[test]
fn acking_before_a_majority_is_caught() {
    first_failing_seed(PlantedBug::AckBeforeMajority, 50);
}

#[test]
fn committing_the_newest_entry_on_a_follower_is_caught() {
    first_failing_seed(PlantedBug::CommitNewest, 300);
}

#[test]
fn trusting_the_canary_byte_is_caught() {
    first_failing_seed(PlantedBug::TrustCanaryOnly, 400);
}

#[test]
fn advancing_the_fuo_before_a_majority_is_caught() {
    first_failing_seed(PlantedBug::FuoBeforeMajority, 300);
}

/// Swarm testing's seeds that catch `bug`, found by a scan from seed 0 (docs/SIMULATION.md);
/// kept as regressions of the checkers: each must still fail, and replay exactly.
fn swarm_seed_fails(bug: PlantedBug, seed: u64, replicas: u16, restarts: bool) {
    let options = SimOptions {
        bug: Some(bug),
        swarm: true,
        restarts,
        bounded_amnesia: restarts,
        amnesia_heals: restarts,
        ..SimOptions::new(replicas)
    };
    let failure = run(seed, &options).expect_err("the seed that caught the bug catches it still");
    assert_eq!(run(seed, &options).expect_err("fails again"), failure, "{bug:?}: seed {seed} must replay exactly");
    let fixed = SimOptions { bug: None, ..options };
    assert!(run(seed, &fixed).is_ok(), "{bug:?}: seed {seed} passes without the bug");
}

/// The safety review's hole 2: found by swarm testing as two values chosen at one index.
#[test]
fn growing_without_a_new_prepare_is_caught() {
    swarm_seed_fails(PlantedBug::GrowWithoutPrepare, 11075, 3, false);
}

/// Membership changes (`SimOptions::membership`, sizes 5 to 7): scans from seed 0 until `bug`
/// is caught, checks that the seed replays exactly and passes without the bug.
fn membership_seed_fails(bug: PlantedBug, budget: u64) {
    let options =
        |seed: u64| SimOptions { bug: Some(bug), membership: true, ..SimOptions::new([5, 6, 7][(seed % 3) as usize]) };
    let seed = first_failing(bug, budget, options);
    assert!(run(seed, &SimOptions { bug: None, ..options(seed) }).is_ok(), "{bug:?}: seed {seed} passes without it");
}

/// A joiner counted in quorums before it is caught up and added: two values chosen at one
/// index.
#[test]
fn a_joiner_voting_before_it_is_added_is_caught() {
    membership_seed_fails(PlantedBug::JoinerVotesEarly, 100);
}

/// A leader that keeps counting majorities of its term's first configuration across the
/// changes it commits: two disjoint majorities once the configuration moved far enough.
#[test]
fn keeping_a_term_across_membership_changes_is_caught() {
    membership_seed_fails(PlantedBug::KeepTermAcrossChange, 300);
}
