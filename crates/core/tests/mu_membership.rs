//! Membership changes through the log (`mu::membership`, docs/ARCHITECTURE.md "Membership
//! changes"), as scenarios on the simulated fabric.

mod common;

use common::Cluster;
use microrep_core::mu::{self, Event, MemberSet, MembershipChange, ProposeError};
use microrep_fabric::NodeId;
use microrep_fabric::sim::SimConfig;

/// Five ids, members 0, 1 and 2 at start; 3 and 4 are spares.
fn three_members_two_spares(configure: impl Fn(&mut mu::MuConfig)) -> Cluster {
    Cluster::new(5, common::timing(), |m| {
        m.members = MemberSet::first(3);
        configure(m);
    })
}

/// Asks the leader for `change` until it is committed, as `microrep member` does: the leader
/// refuses while the spare catches up or its term starts, and a change dropped by a leader
/// change is asked again.
fn change(c: &mut Cluster, change: MembershipChange, request_id: u64) {
    for _ in 0..200 {
        let leader = c.settled_leader();
        match c.replicas[leader].as_mut().expect("leads").propose_membership(request_id, change) {
            Ok(()) => {
                let done = |c: &Cluster| {
                    c.events[leader].iter().any(|e| {
                        matches!(e, Event::Committed { request_id: r, .. } | Event::Failed { request_id: r, .. }
                            if *r == request_id)
                    })
                };
                c.run_until(50_000, "the change's outcome", done);
                if c.committed(leader).contains(&request_id) {
                    return;
                }
            }
            Err(ProposeError::Membership(why)) => {
                let retry = ["catching up", "not a follower", "not live", "under way", "starting its term"];
                assert!(retry.iter().any(|r| why.contains(r)), "{change} refused: {why}");
                c.run_for(200);
            }
            Err(e) => panic!("{change}: {e}"),
        }
    }
    panic!("{change} never committed");
}

/// Waits until every running replica applied a configuration with `members`.
fn everyone_applied(c: &mut Cluster, members: &[u16]) {
    let want: MemberSet = members.iter().map(|&id| NodeId(id)).collect();
    c.run_until(50_000, "every replica applies the configuration", |c| {
        c.replicas.iter().flatten().all(|r| r.status().configuration.members == want)
    });
}

/// A spare that joins counts in majorities from then on: with member 1 crashed, commits go on
/// only because 3 is a member (0, 2 and 3 are three of four); then the leader leaves, steps
/// down, and the others go on without it.
#[test]
fn a_spare_joins_counts_in_majorities_and_a_leader_that_leaves_steps_down() {
    let mut c = three_members_two_spares(|_| {});
    let leader = c.settled_leader();
    c.commit_sequentially(leader, 1, 10);
    change(&mut c, MembershipChange::Add(NodeId(3)), 1000);
    everyone_applied(&mut c, &[0, 1, 2, 3]);
    c.crash(if leader == 1 { 2 } else { 1 });
    let leader = c.settled_leader();
    c.commit_sequentially(leader, 11, 10);
    change(&mut c, MembershipChange::Remove(NodeId(leader as u16)), 1001);
    c.run_until(50_000, "the removed leader steps down", |c| c.status(leader).role == mu::Role::Follower);
    let next = c.settled_leader();
    assert_ne!(next, leader, "a removed leader stepped down");
    c.commit_sequentially(next, 21, 10);
    c.run_until(50_000, "the members converge", |c| c.converged_with(next));
    assert_eq!(c.apps[next].commands().len(), 30, "every command applied once");
}

/// Holds every link between the two groups, both ways.
fn partition(c: &Cluster, one: &[u16], other: &[u16]) {
    for &a in one {
        for &b in other {
            c.world.hold_link(NodeId(a), NodeId(b));
            c.world.hold_link(NodeId(b), NodeId(a));
        }
    }
}

/// After two changes (three members, then five) leader 0 is cut off with member 1 from 2, 3
/// and 4, which elect a leader and commit; returns whether 0 committed a command on its side,
/// and whether the two sides applied different commands at one index.
fn old_leader_commits_in_the_minority(configure: impl Fn(&mut mu::MuConfig)) -> (bool, bool) {
    let mut c = three_members_two_spares(configure);
    c.run_until(50_000, "0 leads", |c| c.status(0).role == mu::Role::Leader);
    c.commit_sequentially(0, 1, 5);
    change(&mut c, MembershipChange::Add(NodeId(3)), 1000);
    change(&mut c, MembershipChange::Add(NodeId(4)), 1001);
    everyone_applied(&mut c, &[0, 1, 2, 3, 4]);
    assert_eq!(c.settled_leader(), 0, "no fault yet: 0 still leads");
    partition(&c, &[0, 1], &[2, 3, 4]);
    c.propose(0, 50, b"minority").expect("0 still leads in its own view");
    c.run_until(50_000, "2, 3 and 4 elect a leader of their own", |c| {
        (2..5).any(|i| c.status(i).role == mu::Role::Leader && c.status(i).phase == mu::Stage::Idle)
    });
    let majority_leader = (2..5).find(|&i| c.status(i).role == mu::Role::Leader).expect("a leader");
    c.commit_sequentially(majority_leader, 60, 3);
    // An index 0 applied a command at, which the other side applied past with something else
    // there (another command, or a no-op).
    let other = &c.apps[majority_leader].applied;
    let past = c.status(majority_leader).applied;
    let diverged = c.apps[0]
        .applied
        .iter()
        .any(|(i, command)| *i < past && !other.iter().any(|(j, theirs)| j == i && theirs == command));
    (c.committed(0).contains(&50), diverged)
}

/// The configuration changes twice while one leader leads; majorities of five are what count
/// afterwards, so a leader cut off with one other replica commits nothing.
#[test]
fn a_leader_cut_off_with_a_majority_of_an_old_configuration_commits_nothing() {
    assert_eq!(old_leader_commits_in_the_minority(|_| {}), (false, false));
}

/// Planted `KeepTermAcrossChange`: the leader keeps counting majorities of the configuration its
/// term started with (three members) after two changes made five; cut off with one other
/// replica, it commits while the other three, a majority of five, commit too: two disjoint
/// majorities.
#[cfg(feature = "planted-bugs")]
#[test]
fn membership_planted_keep_term_across_change_is_caught() {
    let bug = |m: &mut mu::MuConfig| m.planted_bug = Some(mu::PlantedBug::KeepTermAcrossChange);
    assert_eq!(old_leader_commits_in_the_minority(bug), (true, true), "two disjoint majorities commit");
}

/// Without membership changes nothing differs: the spares of a cluster that never adds them
/// follow, and a leader's majority is one of the three members.
#[test]
fn spares_follow_without_counting() {
    let mut c = Cluster::new(5, SimConfig::reliable(), |m| m.members = MemberSet::first(3));
    let leader = c.settled_leader();
    c.commit_sequentially(leader, 1, 10);
    c.run_until(50_000, "the spares apply too", |c| c.converged_with(leader));
    c.crash(3);
    c.crash(4);
    c.commit_sequentially(leader, 11, 5);
    assert!(c.replicas.iter().flatten().all(|r| r.status().configuration.members == MemberSet::first(3)));
}
