//! Scenario tests of Mu's mechanisms, named after the paper's sections ("Microsecond Consensus
//! for Microsecond Applications", OSDI 2020), on clusters over the simulated fabric.

mod common;

use common::Cluster;
use microrep_core::mu::{self, Event, ProposeError, Role, layout, slot};
use microrep_fabric::sim::SimConfig;
use microrep_fabric::{Fabric, NodeId};

fn payloads(ids: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    ids.map(|id| id.to_le_bytes().to_vec()).collect()
}

#[test]
fn section_4_1_leader_replicates_to_a_majority_and_every_replica_applies_in_order() {
    let mut c = Cluster::new(3, common::timing(), |_| {});
    c.commit_sequentially(0, 1, 100);
    c.run_until(20_000, "followers apply", |c| c.converged_with(0));
    assert_eq!(c.apps[0].commands(), payloads(1..101), "the leader applied every command once, in order");
    let indices: Vec<u64> = c.apps[1].applied.iter().map(|(i, _)| *i).collect();
    assert!(indices.windows(2).all(|w| w[0] < w[1]), "indices rise");
}

#[test]
fn section_4_1_a_minority_down_does_not_stop_commits() {
    let mut c = Cluster::new(5, common::timing(), |_| {});
    c.bootstrapped();
    c.crash(3);
    c.crash(4);
    c.commit_sequentially(0, 1, 50);
    assert_eq!(c.apps[0].commands(), payloads(1..51));
}

#[test]
fn followers_redirect_proposals_to_the_leader() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.run_until(20_000, "leadership", |c| c.status(0).role == Role::Leader);
    assert_eq!(c.propose(2, 1, b"x"), Err(ProposeError::NotLeader { leader: NodeId(0) }));
    let too_big = vec![0u8; 1000];
    assert!(matches!(c.propose(0, 2, &too_big), Err(ProposeError::TooLarge { len: 1000, .. })));
}

#[test]
fn section_4_2_omit_prepare_runs_one_prepare_per_term() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.commit_sequentially(0, 1, 40);
    let s = c.status(0);
    assert_eq!(s.terms_led, 1);
    assert_eq!(s.prepares, 1, "after an empty slot was seen, accepts go without prepares");
}

#[test]
fn section_5_1_a_crashed_leader_is_replaced_by_the_next_lowest_id() {
    let mut c = Cluster::new(3, common::timing(), |_| {});
    c.commit_sequentially(0, 1, 10);
    c.crash(0);
    c.commit_sequentially(1, 100, 10);
    c.run_until(20_000, "follower 2 applies", |c| c.apps[2].commands().len() >= 20);
    let mut want = payloads(1..11);
    want.extend(payloads(100..110));
    assert_eq!(c.apps[1].commands(), want, "nothing committed by the old leader is lost");
}

/// An application that cannot serve for now (a wrapped server's copy being rebuilt) asks its
/// replica not to lead: the leader steps aside, the next live replica leads, and the one that
/// abstains keeps accepting and applying entries as a voter. Once it is a candidate again,
/// stickiness keeps the live leader.
#[test]
fn section_5_1_a_replica_that_abstains_is_passed_over_and_keeps_following() {
    let mut c = Cluster::new(3, common::timing(), |_| {});
    c.commit_sequentially(0, 1, 5);
    c.replicas[0].as_mut().expect("running").set_candidate(false);
    c.run_until(50_000, "another leader", |c| c.status(1).role == Role::Leader && c.status(1).phase == mu::Stage::Idle);
    assert_ne!(c.status(0).role, Role::Leader, "the abstaining replica stepped aside");
    c.commit_sequentially(1, 100, 5);
    c.run_until(20_000, "the abstaining replica applies", |c| c.converged_with(1));
    assert!(c.status(0).voter, "it still counts in majorities");
    c.crash(2);
    c.commit_sequentially(1, 200, 5);
    c.replicas[0].as_mut().expect("running").set_candidate(true);
    c.run_for(5_000);
    assert_eq!(c.status(1).role, Role::Leader, "the live leader keeps leading (stickiness)");
    c.commit_sequentially(1, 300, 3);
    c.run_until(20_000, "convergence", |c| c.converged_with(1));
}

/// A leader paused long enough to be replaced wakes up with a stale view: it must not take
/// leadership back from the live leader that replaced it (a duel: each takes the other's
/// permissions, and proposals on both fail with unknown outcomes). Before the fix (a failed
/// attempt waits for fresh detection rounds; the newer term wins between two claims; a
/// replica that steps down withdraws its permission request; requests of replicas held
/// failed wait), the woken leader took leadership back in most of these seeds.
#[test]
fn section_5_1_a_paused_leader_that_wakes_up_follows_its_successor() {
    for seed in 0..40 {
        let mut c = Cluster::seeded(seed, 3, common::timing(), |_| {});
        let old = c.settled_leader();
        c.commit_sequentially(old, 1, 5);
        c.paused[old] = true;
        let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
        c.run_until(50_000, "a new leader", |c| {
            others.iter().any(|&i| c.status(i).role == Role::Leader && c.status(i).phase == mu::Stage::Idle)
        });
        let new = others.into_iter().find(|&i| c.status(i).role == Role::Leader).expect("the new leader");
        c.commit_sequentially(new, 100, 5);
        let terms = c.status(old).terms_led;
        c.paused[old] = false;
        c.run_for(20_000);
        assert_eq!(c.status(old).terms_led, terms, "seed {seed}: the woken leader led again");
        assert_eq!(c.status(new).role, Role::Leader, "seed {seed}: its successor lost leadership");
        c.commit_sequentially(new, 200, 5);
        c.run_until(20_000, "convergence", |c| c.converged_with(new));
    }
}

#[test]
fn section_5_2_a_paused_leader_that_wakes_up_cannot_overwrite_the_new_leaders_log() {
    let mut c = Cluster::new(3, common::timing(), |_| {});
    c.commit_sequentially(0, 1, 10);
    c.propose(0, 11, &11u64.to_le_bytes()).expect("queued on the old leader");
    c.paused[0] = true;
    c.run_until(50_000, "a new leader", |c| c.status(1).role == Role::Leader);
    c.commit_sequentially(1, 200, 10);
    c.paused[0] = false;
    c.run_for(5_000);
    let leader = c.settled_leader();
    c.commit_sequentially(leader, 300, 5);
    c.run_until(50_000, "convergence", |c| c.converged_with(0));
    let commands = c.apps[0].commands();
    for id in (1..11u64).chain(200..210).chain(300..305) {
        assert_eq!(commands.iter().filter(|p| **p == id.to_le_bytes()).count(), 1, "request {id} applied once");
    }
}

/// A replica restarted under the same id (fresh memory, another incarnation) that comes to
/// lead gets its first permission request served. Permission managers serve each request
/// number once and remember, per requester id, the last one served; a new run that counted
/// from 0 again asked with the number its previous run had used: ignored (or only acked again,
/// so that its first write found no permission), it led only once a permission timeout or a
/// lost permission made it ask with the next (`microrep bench failover --kind kill` paid that in
/// most rounds).
#[test]
fn section_5_2_a_restarted_replica_is_granted_its_first_permission_request() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.commit_sequentially(0, 1, 3);
    c.crash(0);
    let successor = c.settled_leader();
    c.commit_sequentially(successor, 10, 3);
    c.restart(0);
    c.run_until(50_000, "the restarted replica's promotion", |c| c.status(0).voter);
    c.crash(successor);
    // Replica 0 is now the lowest live id.
    leads_after_asking_once(&mut c, 0);
    c.commit_sequentially(0, 20, 3);
}

/// A follower restarted while another replica led is reached by the next leader's first
/// permission request. The next leader, a follower until then, had not written to it since the
/// restart: its endpoint still pointed at the follower's previous run and looked ready, so the
/// request failed, and it led only after the permission timeout made it ask again. An endpoint
/// whose peer is gone is now reconnected wherever a failed one would be.
#[test]
fn section_5_2_a_new_leader_reaches_a_follower_restarted_since_it_last_wrote_to_it() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.commit_sequentially(0, 1, 3);
    c.crash(2);
    c.commit_sequentially(0, 10, 3);
    c.restart(2);
    c.run_until(50_000, "the restarted follower's promotion", |c| c.status(2).voter);
    c.commit_sequentially(0, 20, 3);
    c.crash(0);
    leads_after_asking_once(&mut c, 1);
    c.commit_sequentially(1, 30, 3);
}

/// Whether replica `i` leads with nothing in flight (its term's no-op committed).
fn leads_idle(c: &Cluster, i: usize) -> bool {
    let s = c.status(i);
    s.role == Role::Leader && s.phase == mu::Stage::Idle
}

/// Runs until replica `i` leads, recording every permission request it writes: it must have
/// asked once (a request lost to a stale endpoint makes it ask again after the timeout).
fn leads_after_asking_once(c: &mut Cluster, i: usize) {
    let id = NodeId(i as u16);
    let at = layout::Layout::new(&common::config(id, 3)).request_offset(id);
    let mut requests = std::collections::BTreeSet::new();
    c.run_until(50_000, &format!("replica {i} leads, its term's no-op committed"), |c| {
        let fabric = c.replicas[i].as_ref().expect("running").fabric();
        requests.extend(fabric.load_u64(layout::CONTROL, at).ok().filter(|&r| r != 0));
        leads_idle(c, i)
    });
    assert_eq!(requests.len(), 1, "it asked once: {requests:?}");
}

#[test]
fn section_5_3_the_log_wraps_many_times_with_a_minority_down() {
    let mut c = Cluster::new(3, common::timing(), |cfg| cfg.log_slots = 16);
    c.bootstrapped();
    c.crash(2);
    c.commit_sequentially(0, 1, 400);
    assert!(c.status(0).tail >= 300, "the log recycled as it went: {:?}", c.status(0));
    c.run_until(20_000, "follower applies", |c| c.apps[1].commands().len() == 400);
    assert_eq!(c.apps[1].commands(), payloads(1..401));
}

#[test]
fn section_5_4_a_follower_left_behind_restores_a_snapshot_and_converges() {
    let mut c = Cluster::new(3, common::timing(), |cfg| cfg.log_slots = 16);
    c.commit_sequentially(0, 1, 5);
    c.paused[2] = true;
    c.commit_sequentially(0, 100, 200);
    c.paused[2] = false;
    c.run_until(100_000, "the follower catches up", |c| c.apps[2].commands().len() == 205);
    assert!(!c.apps[2].restored_at.is_empty(), "the recycled entries came from a snapshot");
    // The live follower's snapshot, not the leader's: the leader serves no state transfer.
    assert_eq!(restored_from(&c.events[2]), [NodeId(1)]);
    assert!(c.converged_with(0));
}

/// Replica 2 stops applying while 40 commands, more than the 16-slot log holds, are queued on
/// the leader, and resumes after `stalled_us`; returns whether it restored a snapshot.
fn stalled_follower_restores(recycle_wait_ns: u64, stalled_us: u64) -> bool {
    let mut c = Cluster::new(3, SimConfig::reliable(), |cfg| {
        cfg.log_slots = 16;
        cfg.recycle_wait_ns = recycle_wait_ns;
    });
    c.commit_sequentially(0, 1, 5);
    c.run_until(20_000, "followers apply", |c| c.converged_with(0));
    c.paused[2] = true;
    for id in 100..140u64 {
        c.propose(0, id, &id.to_le_bytes()).expect("queued");
    }
    c.run_for(stalled_us);
    assert!(c.status(0).prepares < 10, "a leader waiting for a follower does not prepare again and again");
    c.paused[2] = false;
    c.run_until(200_000, "every replica applies everything", |c| {
        c.apps.iter().all(|a| a.commands().len() == 45) && c.converged_with(0)
    });
    !c.apps[2].restored_at.is_empty()
}

/// Replica 2 stops applying while the leader commits `commands` in a 64-slot log whose
/// snapshots (every 8 entries) pass it; returns how far the leader's tail went past what
/// replica 2 applied (0 if not past it) and whether replica 2 is still a confirmed follower.
fn tail_after_a_follower_stalls(commands: u64) -> (u64, bool) {
    let mut c = Cluster::new(3, SimConfig::reliable(), |cfg| cfg.log_slots = 64);
    c.commit_sequentially(0, 1, 5);
    c.run_until(20_000, "followers apply", |c| c.converged_with(0));
    c.paused[2] = true;
    let applied = c.status(2).applied;
    c.commit_sequentially(0, 100, commands);
    c.run_for(1_000);
    let status = c.status(0);
    (status.tail.saturating_sub(applied), status.confirmed.contains(&NodeId(2)))
}

#[test]
fn section_5_3_a_follower_behind_by_less_than_half_the_log_is_not_recycled_past() {
    // Recycling up to the majority's snapshot left a follower 20 entries behind outside the
    // confirmed set, to restore a snapshot that the next recycling passed again under a
    // steady stream (`microrep bench replication`). Half a log of slack keeps it.
    let (past, confirmed) = tail_after_a_follower_stalls(20);
    assert!(past == 0 && confirmed, "tail {past} past it, confirmed {confirmed}: the log keeps its entries");
    // More than half a log behind, it is left behind: the log must not fill.
    let (past, confirmed) = tail_after_a_follower_stalls(60);
    assert!(past > 0 && !confirmed, "tail {past} past it, confirmed {confirmed}: recycled past the stalled follower");
}

#[test]
fn section_5_3_recycle_wait_a_follower_that_stalls_briefly_is_not_left_behind() {
    // Mu's rule recycles past the stalled follower as soon as a majority applied: it restores.
    assert!(stalled_follower_restores(0, 600), "without the wait the stalled follower is left behind");
    // Waiting 1 ms for the follower (the log is full after 16 entries): no snapshot needed.
    assert!(!stalled_follower_restores(1_000_000, 600), "the leader waited for the follower");
}

#[test]
fn section_5_3_recycle_wait_a_stopped_follower_stalls_the_leader_only_for_the_wait() {
    let mut c = Cluster::new(3, common::timing(), |cfg| {
        cfg.log_slots = 16;
        cfg.recycle_wait_ns = 1_000_000;
    });
    c.bootstrapped();
    c.paused[2] = true;
    c.commit_sequentially(0, 1, 100);
    assert!(c.status(0).tail >= 80, "the log recycled past the stopped follower: {:?}", c.status(0));
    assert_eq!(c.status(0).terms_led, 1, "the leader kept its leadership while it waited");
    c.paused[2] = false;
    c.run_until(200_000, "the follower catches up", |c| c.converged_with(0));
    assert!(!c.apps[2].restored_at.is_empty(), "left behind, it restored a snapshot");
}

/// The replicas whose snapshots replica's `events` say it restored, in order.
fn restored_from(events: &[Event]) -> Vec<NodeId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Restored { from, .. } => Some(*from),
            _ => None,
        })
        .collect()
}

#[test]
fn section_5_4_a_snapshot_comes_from_the_leader_when_no_follower_can_give_one() {
    // Follower 1 has crashed: the fetch from it fails and the next comes from the leader.
    let mut c = Cluster::new(5, common::timing(), |cfg| cfg.log_slots = 16);
    c.bootstrapped();
    c.commit_sequentially(0, 1, 5);
    c.paused[4] = true;
    c.commit_sequentially(0, 100, 200);
    c.crash(1);
    c.paused[4] = false;
    c.run_until(200_000, "the follower catches up", |c| c.apps[4].commands().len() == 205);
    let sources = restored_from(&c.events[4]);
    assert!(!sources.is_empty(), "the recycled entries came from a snapshot");
    assert!(sources.iter().all(|&from| from != NodeId(1)), "{sources:?}");
    assert!(c.converged_with(0));
}

/// A state whose snapshot outgrows the snapshot region cannot be published, so the log cannot
/// be recycled past it (a replica left behind must always find a snapshot): once the log is
/// full, proposals are refused with an error that says so, instead of waiting forever.
#[test]
fn section_5_4_a_state_too_large_for_its_snapshot_region_is_refused_with_a_clear_error() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |cfg| {
        cfg.log_slots = 16;
        cfg.snapshot_every = 4;
        cfg.snapshot_bytes = 256;
    });
    c.bootstrapped();
    c.run_until(20_000, "leadership", |c| c.status(0).role == Role::Leader);
    let mut refused = None;
    for id in 1..=64u64 {
        match c.propose(0, id, &[7; 40]) {
            Ok(()) => c.run_until(20_000, "commit or a full log", |c| {
                c.committed(0).contains(&id) || c.status(0).fuo >= c.status(0).tail + 16
            }),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    match refused {
        Some(ProposeError::StateTooLarge { state, limit: 256 }) => assert!(state > 256, "{state}"),
        other => panic!("expected StateTooLarge once the log filled, got {other:?}"),
    }
}

#[test]
fn section_5_4_a_follower_snapshot_too_old_for_the_recycled_log_is_not_restored() {
    // Replica 4 is paused with an old snapshot; replica 3 restarts with fresh memory and
    // asks 4 first: 4's snapshot is too old to cover what the leader recycled, so the leader's
    // is restored (restoring 4's would leave a gap no log holds).
    let mut c = Cluster::new(5, common::timing(), |cfg| {
        cfg.log_slots = 16;
        cfg.snapshot_every = 4;
    });
    c.bootstrapped();
    c.commit_sequentially(0, 1, 5);
    c.paused[4] = true;
    c.commit_sequentially(0, 100, 200);
    c.crash(3);
    c.restart(3);
    c.run_until(200_000, "the restarted replica catches up", |c| c.apps[3].commands() == c.apps[0].commands());
    assert_eq!(restored_from(&c.events[3]), [NodeId(0)]);
}

/// A.4.3: a follower applies every complete entry but the newest, unless the FUO says the
/// newest is decided too; torn entries are never applied.
#[test]
fn appendix_a_4_3_followers_commit_all_but_the_newest() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    let f = c.replicas[2].as_ref().expect("follower").fabric();
    let cfg = common::config(NodeId(2), 3);
    let lay = layout::Layout::new(&cfg);
    let write = |index: u64, payload: &[u8]| {
        let mut buf = vec![0u8; cfg.slot_bytes as usize];
        let e = slot::Entry {
            prop_nr: 256,
            index,
            proposer: NodeId(0),
            request_id: index,
            kind: slot::EntryKind::Normal,
            payload,
        };
        slot::encode(&e, &mut buf);
        f.write_local(layout::LOG, lay.slot_offset(index), &buf).expect("write slot");
        buf
    };
    write(0, b"a");
    write(1, b"b");
    c.paused = vec![true, true, false];
    c.run_for(5);
    assert_eq!(c.apps[2].commands(), vec![b"a".to_vec()], "the newest entry waits");
    let f = c.replicas[2].as_ref().expect("follower").fabric();
    let mut torn = {
        let mut buf = vec![0u8; cfg.slot_bytes as usize];
        let e = slot::Entry {
            prop_nr: 256,
            index: 2,
            proposer: NodeId(0),
            request_id: 2,
            kind: slot::EntryKind::Normal,
            payload: b"c",
        };
        slot::encode(&e, &mut buf);
        buf
    };
    torn[slot::HEADER_BYTES] ^= 0xff;
    f.write_local(layout::LOG, lay.slot_offset(2), &torn).expect("torn slot");
    c.run_for(5);
    assert_eq!(c.apps[2].commands().len(), 1, "a torn successor proves nothing");
    let f = c.replicas[2].as_ref().expect("follower").fabric();
    torn[slot::HEADER_BYTES] ^= 0xff;
    f.write_local(layout::LOG, lay.slot_offset(2), &torn).expect("whole slot");
    c.run_for(5);
    assert_eq!(c.apps[2].commands(), vec![b"a".to_vec(), b"b".to_vec()], "all but the newest");
    let f = c.replicas[2].as_ref().expect("follower").fabric();
    f.store_u64(layout::LOG, layout::FUO, 3).expect("fuo");
    c.run_for(5);
    assert_eq!(c.apps[2].commands().len(), 3, "the FUO decides the newest as well");
    assert!(mu::regions(&cfg).iter().all(|r| r.len_bytes > 0));
}

/// §5.1 fate sharing: a leader whose replication plane cannot make progress (here its writes
/// never leave the machine) stops heartbeating, so the others elect a leader that can.
#[test]
fn section_5_1_fate_sharing_a_leader_that_cannot_replicate_loses_leadership() {
    let mut c = Cluster::new(3, common::timing(), |_| {});
    c.commit_sequentially(0, 1, 5);
    c.world.hold_outgoing(NodeId(0));
    c.propose(0, 6, b"stuck").expect("queued");
    c.run_until(50_000, "a leader that can replicate", |c| c.status(1).role == Role::Leader);
    c.commit_sequentially(1, 100, 5);
    assert!(c.committed(0).iter().all(|&id| id != 6), "the stuck request never committed there");
}

#[test]
fn standing_a_new_cluster_starts_only_once_every_member_is_up() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.crash(2);
    c.run_for(5_000);
    assert!((0..2).all(|i| !c.status(i).voter && c.status(i).role == Role::Follower), "{:?}", c.status(0));
    c.restart(2);
    c.commit_sequentially(0, 1, 3);
    assert!((0..3).all(|i| c.status(i).voter));
}

/// The case the fault harness caught: a leader commits on itself and one follower; that
/// follower restarts with fresh memory and the leader pauses. Counted as voters, the two
/// restarted replicas would elect one of themselves and fill the committed slots anew. As
/// recovering replicas they elect nobody until the leader returns, promotes them, and every
/// replica applies the same commands.
#[test]
fn standing_replicas_restarted_with_fresh_memory_cannot_elect_a_leader_that_forgot() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.commit_sequentially(0, 1, 5);
    c.crash(1);
    c.commit_sequentially(0, 6, 5);
    c.restart(1);
    c.paused[0] = true;
    c.crash(2);
    c.restart(2);
    c.run_for(5_000);
    for i in 1..3 {
        let s = c.status(i);
        assert!(!s.voter && s.role == Role::Follower, "replica {i} must recover, not lead: {s:?}");
        assert_eq!(s.applied, 0, "replica {i} applied slots the paused leader committed differently: {s:?}");
    }
    c.paused[0] = false;
    c.run_until(20_000, "promotion", |c| (1..3).all(|i| c.status(i).voter));
    // Leadership may move while peers' scores of the paused leader recover: let it settle.
    c.run_for(20_000);
    let leader = (0..3).find(|&i| c.status(i).role == Role::Leader).expect("a leader");
    c.commit_sequentially(leader, 11, 1);
    c.run_until(20_000, "convergence", |c| c.converged_with(leader));
    assert_eq!(c.apps[leader].commands(), payloads(1..12), "no committed command lost or repeated");
}

/// A follower that restarts while the leader keeps its term rejoins that term: the leader does
/// not mistake the ack of the follower's previous run for a grant of the new one, asks again,
/// and brings it back as a recovering follower until it promotes it.
#[test]
fn standing_a_follower_restarted_under_the_same_leader_rejoins_and_is_promoted() {
    let mut c = Cluster::new(3, SimConfig::reliable(), |_| {});
    c.commit_sequentially(0, 1, 5);
    assert!(c.status(2).voter);
    let terms = c.status(0).terms_led;
    c.crash(2);
    c.commit_sequentially(0, 6, 5);
    c.restart(2);
    c.run_until(50_000, "the restarted follower's promotion", |c| c.status(2).voter);
    let s = c.status(0);
    assert!(s.role == Role::Leader && s.terms_led == terms, "the leader kept its term: {s:?}");
    c.commit_sequentially(0, 11, 1);
    c.run_until(20_000, "convergence", |c| c.converged_with(0));
    assert_eq!(c.apps[2].commands(), payloads(1..12));
}

/// Polls replicas `polled` at irregular intervals (1 to `max_gap_us` simulated microseconds,
/// from `seed`), as a runtime's background thread that parks between polls does, for
/// `us` microseconds or until `done` holds; returns whether it came to hold.
fn run_jittered(
    c: &mut Cluster,
    polled: &[usize],
    seed: u64,
    max_gap_us: u64,
    us: u64,
    done: impl Fn(&Cluster) -> bool,
) -> bool {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut draw = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        1 + state % max_gap_us
    };
    let mut next: Vec<u64> = polled.iter().map(|_| draw()).collect();
    for _ in 0..us {
        if done(c) {
            return true;
        }
        for (k, &i) in polled.iter().enumerate() {
            c.paused[i] = next[k] != 0;
            next[k] = if next[k] == 0 { draw() - 1 } else { next[k] - 1 };
        }
        c.tick();
    }
    done(c)
}

/// §5.1 with the failure detector's thresholds close together (`microrep bench failover
/// --fail-below 13`: failed after 3 silent periods, live again only above 14 of 15): the
/// leader crashes while both survivors hold each other failed, and each asks for permissions
/// the other will not grant (a replica serves only requesters it holds live). Both stall,
/// fate-share, and fall silent; after the silence each heartbeats for the recovery window.
/// With polls that come at irregular times, as a parking background thread's do, a reader
/// needs the other's counter to move at nearly every read of that window. (This is the
/// reading `docs/BENCHMARKS.md` gives for the unrecovered fail-overs of `microrep bench
/// failover`; the simulator does not reproduce a stall from it: the survivors agree within
/// 0.75 ms in 40 seeds, so the stall's cause is elsewhere.)
#[test]
fn section_5_1_two_survivors_that_hold_each_other_failed_agree_on_a_leader() {
    let close = |c: &mut mu::MuConfig| {
        c.score_fail_below = 13;
        c.score_recover_above = 14;
    };
    for seed in 0..8 {
        let mut c = Cluster::seeded(seed, 3, SimConfig::reliable(), close);
        c.commit_sequentially(0, 1, 3);
        // While 0 leads, replica 2 sees 1 silent, then 1 sees 2 silent (2, paused, does not
        // see 1 come back): each holds the other failed when the leader crashes.
        c.paused[1] = true;
        c.run_for(200);
        c.paused[1] = false;
        c.paused[2] = true;
        c.run_for(200);
        let holds_live = |c: &Cluster, i: usize, peer: u16| {
            c.replicas[i].as_ref().expect("running").detector().is_live(NodeId(peer))
        };
        assert!(!holds_live(&c, 1, 2) && !holds_live(&c, 2, 1), "seed {seed}: each holds the other failed");
        c.crash(0);
        c.paused[2] = false;
        let agreed = |c: &Cluster| (1..3).any(|i| leads_idle(c, i));
        // Polls up to a heartbeat period apart (20 us); 40 seeds took at most 0.75 ms.
        let agreed = run_jittered(&mut c, &[1, 2], seed, 20, 200_000, agreed);
        assert!(agreed, "seed {seed}: no leader within 200 ms; {:?}, {:?}", c.status(1), c.status(2));
    }
}

/// When replica `i`'s background plane may rest until (`Replica::calm_until`).
fn calm(c: &Cluster, i: usize) -> Option<u64> {
    c.replicas[i].as_ref().expect("running").calm_until(c.now)
}

/// `n` replicas that committed a few entries and whose background planes all rest.
fn idle_cluster_at_rest(n: u16) -> Cluster {
    let mut c = Cluster::new(n, SimConfig::reliable(), |_| {});
    c.commit_sequentially(0, 1, 3);
    c.run_until(1_000, "an idle cluster at rest", |c| (0..usize::from(n)).all(|i| calm(c, i).is_some()));
    c
}

/// §5.1 with a runtime that rests while nothing moves (`Replica::calm_until`): an idle cluster
/// is calm between heartbeats; when the leader crashes, the survivors stop being calm before
/// the candidate holds it failed (so the follower polls at its own pace when the candidate's
/// permission request lands), and are calm again once a new leader leads and the crashed
/// replica's score has settled at zero.
#[test]
fn section_5_1_survivors_stop_resting_before_the_candidate_asks_for_permissions() {
    let mut c = idle_cluster_at_rest(3);
    let period = mu::MuConfig::simulated(NodeId(0), 3).heartbeat_period_ns;
    for i in 0..3 {
        let due = calm(&c, i).expect("calm");
        assert!(due > c.now && due <= c.now + period, "replica {i} rests until its next heartbeat");
    }
    c.crash(0);
    let holds_failed = |c: &Cluster, i: usize| !c.replicas[i].as_ref().expect("running").detector().is_live(NodeId(0));
    c.run_until(5_000, "the follower stirs", |c| calm(c, 2).is_none() && !holds_failed(c, 1));
    c.run_until(20_000, "a new leader", |c| leads_idle(c, 1));
    c.run_until(5_000, "rest again", |c| (1..3).all(|i| calm(c, i).is_some()));
    assert!(holds_failed(&c, 1) && holds_failed(&c, 2));
    c.commit_sequentially(1, 10, 2);
}

/// §5.1 in a larger group: a follower that crashes changes no leader, so the survivors go on
/// resting between heartbeats while its score falls (in a group of 105 on two cores some
/// peer's heartbeat is always late, and each one kept every background thread polling).
#[test]
fn section_5_1_a_failing_follower_leaves_the_survivors_resting() {
    let mut c = idle_cluster_at_rest(5);
    c.crash(4);
    let settled = |c: &Cluster, i: usize| c.replicas[i].as_ref().expect("running").detector().settled(NodeId(4));
    c.run_until(5_000, "a survivor rests while the follower's score falls", |c| calm(c, 1).is_some() && !settled(c, 1));
    c.commit_sequentially(0, 10, 3);
}
