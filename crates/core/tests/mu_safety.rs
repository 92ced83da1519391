//! The interleavings that a reading of the core found could break safety (issue: "three
//! suspected safety holes"), each replayed step by step on the simulated fabric. Every test
//! builds the state the interleaving reaches by letting the cluster run, writing by hand only
//! what a leader that is about to crash would have written, then checks that no replica
//! applies anything but the chosen value.

mod common;

use common::Cluster;
use microrep_core::mu::{Role, Stage, layout, slot};
use microrep_fabric::sim::SimConfig;
use microrep_fabric::{Fabric, NodeId};

/// The encoded slot of `index` holding `payload`, proposed by `proposer` at `prop_nr`.
fn encoded(index: u64, prop_nr: u64, proposer: u16, request_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; common::config(NodeId(0), 5).slot_bytes as usize];
    let entry =
        slot::Entry { prop_nr, index, proposer: NodeId(proposer), request_id, kind: slot::EntryKind::Normal, payload };
    slot::encode(&entry, &mut buf);
    buf
}

/// Lands `slot` at log `index` of replica `i`, as a WRITE of a leader would.
fn land(c: &Cluster, i: usize, index: u64, slot: &[u8]) {
    let f = c.replicas[i].as_ref().expect("running").fabric();
    let offset = layout::Layout::new(&common::config(NodeId(0), 5)).slot_offset(index);
    f.write_local(layout::LOG, offset, slot).expect("slot write");
}

/// Raises replica `i`'s minProposal to `prop_nr`, as a leader's prepare would.
fn promise(c: &Cluster, i: usize, prop_nr: u64) {
    let f = c.replicas[i].as_ref().expect("running").fabric();
    f.store_u64(layout::LOG, layout::MIN_PROPOSAL, prop_nr).expect("minProposal write");
}

/// The command replica `i` applied at `index`, if it applied a command there.
fn applied_at(c: &Cluster, i: usize, index: u64) -> Option<Vec<u8>> {
    c.apps[i].applied.iter().find(|(at, _)| *at == index).map(|(_, command)| command.clone())
}

/// Five replicas, leader 0 idle after committing a few commands; returns the first free index.
/// The replicas in `paused` stop after their first poll (they have published their
/// incarnation, so they become voters, but serve no permission request).
fn quiet_five(seed: u64, fabric: SimConfig, paused: &[usize]) -> (Cluster, u64) {
    let mut c = Cluster::seeded(seed, 5, fabric, |_| {});
    c.tick();
    for &i in paused {
        c.paused[i] = true;
    }
    c.run_until(20_000, "bootstrap", |c| (0..5).filter(|i| !c.paused[*i]).all(|i| c.status(i).voter));
    c.commit_sequentially(0, 1, 3);
    c.run_until(20_000, "a quiet cluster", |c| {
        let fuo = c.status(0).fuo;
        c.status(0).phase == Stage::Idle && (0..5).filter(|i| !c.paused[*i]).all(|i| c.status(i).applied == fuo)
    });
    let j = c.status(0).fuo;
    (c, j)
}

/// Hole 1, a torn re-accept (5 replicas): leader 0 committed `v` at `j` with acks from 1 and
/// 2 and crashed before its FUO or entry `j + 1` reached anyone. Replica 1 leads, its prepare
/// adopts `v` and re-accepts it at a higher ballot with torn writes, and crashes `cut` fabric
/// events into that accept. Replica 2 is then the only live replica that held `v`; whatever
/// the cut, it must still hold it, and the new leader (whichever of 2-4) must commit `v` at `j`.
#[test]
fn listing_2_a_leader_crashing_inside_a_torn_re_accept_never_erases_a_chosen_value() {
    let torn = SimConfig { torn_write_prob: 1.0, ..SimConfig::reliable() };
    for (seed, cut) in (0..8).flat_map(|seed| (0..24).map(move |cut| (seed, cut))) {
        let (mut c, j) = quiet_five(seed, torn.clone(), &[]);
        let v = encoded(j, c.status(0).proposal_number, 0, 77, b"chosen");
        for i in 0..3 {
            land(&c, i, j, &v);
        }
        c.crash(0);
        c.run_until(100_000, "replica 1 re-accepts", |c| c.status(1).phase == Stage::Accept);
        for _ in 0..cut {
            c.world.step();
        }
        c.crash(1);
        // Any of 2-4 may win (leader stickiness keeps whichever first took permissions).
        c.run_until(200_000, "one of 2-4 leads", |c| (2..5).any(|i| c.status(i).role == Role::Leader));
        let leader = (2..5).find(|&i| c.status(i).role == Role::Leader).expect("a leader");
        c.commit_sequentially(leader, 100, 1);
        c.run_until(50_000, "every live replica applies", |c| (2..5).all(|i| c.status(i).applied > j + 1));
        for i in 2..5 {
            assert_eq!(
                applied_at(&c, i, j).as_deref(),
                Some(&b"chosen"[..]),
                "seed {seed}, cut {cut}: replica {i} lost it"
            );
        }
    }
}

/// Hole 2, growing the confirmed set without a new prepare (A.4.4, A.4.5(b)): leader 0 leads
/// with followers 1-3 in omit-prepare mode; follower 4 was slow. A rival, replica 3, took
/// permissions from 1, 3 and 4 and committed `w` at the next index `k`. Follower 4 then grants
/// 0 and joins its confirmed set, and 1 and 3 crash. Leader 0's next accept at `k`, to 2 and 4,
/// would reach a majority with its own value: it must prepare again, find `w` in 4's log and
/// commit `w` at `k`.
#[test]
fn appendix_a_4_5_a_grown_follower_makes_the_leader_prepare_again() {
    let (mut c, k) = quiet_five(7, SimConfig::reliable(), &[4]);
    assert!(!c.status(0).confirmed.contains(&NodeId(4)), "follower 4 must join late");
    let rival = ((c.status(0).proposal_number >> 8) + 1) << 8 | 3;
    let w = encoded(k, rival, 3, 55, b"rival's");
    land(&c, 4, k, &w);
    promise(&c, 4, rival);
    c.paused[4] = false;
    c.run_until(100_000, "follower 4 joins", |c| c.status(0).confirmed.contains(&NodeId(4)));
    for i in [1, 3] {
        land(&c, i, k, &w);
        promise(&c, i, rival);
        c.crash(i);
    }
    c.propose(0, 200, b"mine").expect("leader 0 takes the request");
    c.run_until(200_000, "leader 0 commits", |c| c.committed(0).contains(&200));
    assert_eq!(applied_at(&c, 0, k).as_deref(), Some(&b"rival's"[..]), "a second value was chosen at {k}");
    c.run_until(50_000, "the followers apply", |c| [2, 4].iter().all(|&i| c.status(i).applied > k + 1));
    for i in [2, 4] {
        assert_eq!(applied_at(&c, i, k).as_deref(), Some(&b"rival's"[..]));
    }
}
