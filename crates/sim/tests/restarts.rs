//! Restarts with empty memory (amnesia): crashed replicas come back as fresh replicas under
//! the same id, deterministically from the seed, and the checkers follow them across
//! incarnations.

use microrep_sim::{SimOptions, run};

fn restarting(seed: u64) -> SimOptions {
    SimOptions { restarts: true, ..SimOptions::new([3, 5, 7][(seed % 3) as usize]) }
}

#[test]
fn restarted_replicas_rejoin_and_every_checker_passes() {
    let mut restarts = 0;
    for seed in 0..12 {
        let report = run(seed, &restarting(seed)).unwrap_or_else(|f| panic!("{f}"));
        assert!(report.history.acked > 0, "seed {seed} acknowledged nothing");
        assert!(report.faults.restarts <= report.faults.leader_crashes + report.faults.follower_crashes);
        restarts += report.faults.restarts;
    }
    assert!(restarts >= 5, "only {restarts} restarts in 12 seeds");
}

#[test]
fn a_run_with_restarts_replays_bit_for_bit() {
    // Seed 3 crashes a replica, so restarting it changes the run.
    let options = restarting(3);
    let first = run(3, &options).expect("seed 3 passes with restarts");
    assert!(first.faults.restarts > 0, "seed 3 restarts nothing: {first:?}");
    assert_eq!(run(3, &options).expect("seed 3 passes with restarts"), first);
    let crash_stop = run(3, &SimOptions::new(3)).expect("seed 3 passes");
    assert_eq!(crash_stop.faults.restarts, 0);
    assert_ne!(crash_stop.trace_digest, first.trace_digest);
}

#[test]
fn bounded_amnesia_lets_at_most_a_minority_lose_its_memory() {
    for seed in 0..12 {
        let replicas = [3, 5][(seed % 2) as usize];
        let options = SimOptions { restarts: true, bounded_amnesia: true, ..SimOptions::new(replicas) };
        let report = run(seed, &options).unwrap_or_else(|f| panic!("{f}"));
        let crashes = report.faults.leader_crashes + report.faults.follower_crashes;
        assert!(crashes <= u64::from(replicas - 1) / 2, "seed {seed}: {crashes} crashes of {replicas} replicas");
    }
}

/// Seeds where microrep's Mu loses a chosen value once a replica restarts with empty memory.
/// In each, the value was accepted by a majority that included the restarted replica's old
/// life, another replica of that majority still holds it (paused or alive), and a new leader's
/// prepare quorum counted the empty replica (as leader or follower, positioned at a snapshot
/// it restored) plus replicas that never held the value, found nothing, and chose another
/// value at that index. They fail the same way under `bounded_amnesia`, where at most a
/// minority ever loses its memory, so a protocol in which a restarted replica takes no part in
/// quorums until it has recovered must pass them; since replicas recover before they vote
/// (`mu::plane::leader::standing`), it does.
#[test]
fn amnesic_replicas_do_not_lose_chosen_values() {
    let found: [(u64, u16); 4] = [
        (558, 3),  // 1 restarts, restores a snapshot at 48, leads with 2; 0 (paused) held 48..62
        (4197, 3), // 0 restarts, leads with 1 from its snapshot at 96; 2 (paused) held 96
        (4827, 3), // 2 restarts, 1 leads with it from 208; 0 (paused) held 208
        (6844, 5), // 2 restarts, 1 leads with {2, 4} from 176; 3 held 176 (0 crashed)
    ];
    for (seed, replicas) in found {
        let options = SimOptions { restarts: true, bounded_amnesia: true, ..SimOptions::new(replicas) };
        run(seed, &options).unwrap_or_else(|f| panic!("{f}"));
    }
}
