//! Scenario tests of the multicast core on the simulated fabric (reliable and faulty), named
//! after what they show. Larger randomized runs live in `microrep-multicast-sim`.

use microrep_core::multicast::{
    Delivery, DeliveryBatch, FailureDetection, GroupConfig, Member, MulticastError, Phase, SLOT_HEADER_BYTES,
    SendError, SubgroupConfig, regions,
};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimConfig, SimFabric, SimWorld};

type Log = Vec<(usize, NodeId, u64, Vec<u8>)>;

struct Group {
    world: SimWorld,
    members: Vec<Member<SimFabric>>,
    logs: Vec<Log>,
}

fn ids(v: &[u16]) -> Vec<NodeId> {
    v.iter().map(|&i| NodeId(i)).collect()
}

impl Group {
    fn new(seed: u64, sim: SimConfig, config: &GroupConfig) -> Self {
        Self::each_configured(seed, sim, config, |_, _| {})
    }

    /// A group whose member `m` runs `config` as changed by `adjust(m, ..)`.
    fn each_configured(
        seed: u64,
        sim: SimConfig,
        config: &GroupConfig,
        adjust: impl Fn(usize, &mut GroupConfig),
    ) -> Self {
        let world = SimWorld::new(seed, sim);
        let fabrics: Vec<_> =
            config.members.iter().map(|&id| world.add_node(id, &regions(config)).expect("add node")).collect();
        let members = fabrics
            .into_iter()
            .zip(&config.members)
            .enumerate()
            .map(|(m, (fabric, &me))| {
                let mut own = GroupConfig { me, ..config.clone() };
                adjust(m, &mut own);
                Member::new(fabric, own).expect("member")
            })
            .collect::<Vec<_>>();
        let logs = vec![Vec::new(); members.len()];
        Self { world, members, logs }
    }

    /// Member `m` polls once at `now`, its deliveries going to its log.
    fn poll_at(&mut self, m: usize, now: u64) {
        let log = &mut self.logs[m];
        let mut upcall = |batch: DeliveryBatch<'_>| {
            for msg in batch.messages {
                log.push((batch.subgroup, msg.sender, msg.seq, msg.payload.to_vec()));
            }
        };
        self.members[m].poll(now, &mut upcall).expect("poll");
    }

    /// One round: every member polls once, then 500 ns of simulated time pass.
    fn round(&mut self) {
        let now = self.world.now();
        for m in 0..self.members.len() {
            self.poll_at(m, now);
        }
        self.world.advance_to(now + 500);
    }

    /// Only member `m` polls, then 2 µs pass (its writes land: a reliable fabric's latency is
    /// 1 µs).
    fn poll_one(&mut self, m: usize) {
        let now = self.world.now();
        self.poll_at(m, now);
        self.world.advance_to(now + 2_000);
    }

    /// Rounds until `done` holds, at most `max` of them.
    fn run_until(&mut self, max: u32, done: impl Fn(&Self) -> bool) {
        for _ in 0..max {
            if done(self) {
                return;
            }
            self.round();
        }
        panic!("not done after {max} rounds");
    }
}

fn delivered_count(group: &Group, member: usize, subgroup: usize) -> usize {
    group.logs[member].iter().filter(|e| e.0 == subgroup).count()
}

#[test]
fn every_member_delivers_every_message_in_one_round_robin_order() {
    let config = GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 4, 16);
    let mut group = Group::new(1, SimConfig::reliable(), &config);
    let mut sent = 0;
    for _ in 0..10_000 {
        if sent >= 30 {
            break;
        }
        for (i, member) in group.members.iter_mut().enumerate() {
            if member.send(0, &[i as u8, sent as u8]).is_ok() {
                sent += 1;
            }
        }
        group.round();
    }
    assert_eq!(sent, 30);
    group.run_until(10_000, |g| (0..3).all(|m| delivered_count(g, m, 0) == sent));
    assert_eq!(group.logs[0], group.logs[1]);
    assert_eq!(group.logs[0], group.logs[2]);
    let seqs: Vec<u64> = group.logs[0].iter().map(|e| e.2).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "sequence numbers rise: {seqs:?}");
    for (_, sender, seq, payload) in &group.logs[0] {
        assert_eq!(u64::from(sender.0), seq % 3, "seq = index × senders + rank");
        assert_eq!(payload[0] as u16, sender.0);
    }
    // Each member's delivered counter reaches its peers' SST copies.
    group.run_until(10_000, |g| {
        let own = g.members[1].delivered(0);
        g.members[0].delivered_by(0, NodeId(1)).expect("load") == Some(own)
    });
    assert_eq!(group.members[0].delivered_by(0, NodeId(7)), Ok(None), "not a member");
}

#[test]
fn an_idle_sender_sends_nulls_so_the_order_moves_and_an_idle_group_goes_quiet() {
    let config = GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 2, 8);
    let mut group = Group::new(2, SimConfig::reliable(), &config);
    // Only member 2 sends: 0 and 1 precede it in every round and must null-send.
    let mut sent = 0;
    for _ in 0..10_000 {
        if sent >= 20 {
            break;
        }
        match group.members[2].send(0, &[sent as u8]) {
            Ok(_) => sent += 1,
            Err(SendError::WindowFull(0)) => {}
            Err(e) => panic!("{e}"),
        }
        group.round();
    }
    group.run_until(10_000, |g| (0..3).all(|m| delivered_count(g, m, 0) == 20));
    assert!(group.members[0].stats().nulls_sent >= 20);
    assert_eq!(group.members[2].stats().nulls_sent, 0, "the last rank never precedes anyone");
    // Quiescent: once everything is pushed, polls post no more writes.
    group.run_until(1_000, |g| g.members.iter().all(Member::is_idle) && g.world.pending_ops() == 0);
    let writes: Vec<u64> = group.members.iter().map(|m| m.stats().writes).collect();
    for _ in 0..100 {
        group.round();
    }
    assert_eq!(writes, group.members.iter().map(|m| m.stats().writes).collect::<Vec<_>>());
}

#[test]
fn a_window_of_one_wraps_the_ring_many_times_with_back_pressure() {
    let config = GroupConfig::single(NodeId(0), ids(&[0, 1]), 1, 8);
    let mut group = Group::new(3, SimConfig::reliable(), &config);
    let mut sent = [0u32; 2];
    let mut refused = 0;
    for _ in 0..100_000 {
        if sent.iter().sum::<u32>() >= 200 {
            break;
        }
        for (i, member) in group.members.iter_mut().enumerate() {
            match member.send(0, &sent[i].to_le_bytes()) {
                Ok(_) => sent[i] += 1,
                Err(SendError::WindowFull(_)) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        group.round();
    }
    assert_eq!(sent.iter().sum::<u32>(), 200);
    assert!(refused > 0, "a one-slot ring refuses until its message is received everywhere");
    group.run_until(10_000, |g| (0..2).all(|m| delivered_count(g, m, 0) == 200));
    assert_eq!(group.logs[0], group.logs[1]);
}

/// Member 0 sends two 16-byte messages in a window of two; member 2 and then member 0 deliver
/// them while member 1 has received both and delivered neither. Members' `copy_at_receipt_bytes`
/// are `copy_at_receipt`. Returns the group and what a third send of member 0 gives then.
fn two_received_one_member_behind(copy_at_receipt: [u32; 3], sim: SimConfig) -> (Group, Result<u64, SendError>) {
    let mut config = GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 2, 16);
    config.subgroups[0].senders.truncate(1);
    let mut group = Group::each_configured(5, sim, &config, |m, own| {
        own.subgroups[0].copy_at_receipt_bytes = copy_at_receipt[m];
    });
    for n in 0..2u8 {
        group.members[0].send(0, &[b'a' + n; 16]).expect("a free slot");
    }
    group.poll_one(0);
    // Member 1 receives both before member 2 has: nothing is stable for it to deliver yet.
    group.poll_one(1);
    assert_eq!(delivered_count(&group, 1, 0), 0);
    // Member 2 receives, sees member 1's receipt, and delivers both; then the sender does.
    group.poll_one(2);
    group.poll_one(0);
    assert_eq!(delivered_count(&group, 2, 0), 2);
    assert_eq!(delivered_count(&group, 0, 0), 2);
    let third = group.members[0].send(0, &[b'c'; 16]);
    (group, third)
}

#[test]
fn a_sender_reuses_no_slot_of_a_message_delivered_in_place_before_every_member_delivered_it() {
    // Long messages are delivered where they landed in the sender's ring: a slot is free only
    // once every member has delivered its message, not merely received it.
    sender_holds_slots_until_member_1_delivers([0; 3], SimConfig::reliable());
}

#[test]
fn receivers_that_pull_a_ring_from_its_senders_memory_hold_its_slots_until_every_member_delivered() {
    // With a fabric that lends a peer's memory (shm), receivers read the ring where the sender
    // wrote it, and deliver long messages from there: the same rule keeps them intact.
    let pulled = sender_holds_slots_until_member_1_delivers([0; 3], lending(SimConfig::reliable()));
    let pushed = sender_holds_slots_until_member_1_delivers([0; 3], SimConfig::reliable());
    // And no slot went to a peer: the sender WROTE only its counter blocks (three 32-byte
    // slots to each of two peers are 192 bytes that pushing writes and pulling does not).
    let written = |g: &Group| g.members[0].stats().write_bytes;
    assert!(written(&pulled) + 192 <= written(&pushed), "pulled {} pushed {}", written(&pulled), written(&pushed));
}

#[test]
fn members_configured_to_copy_at_receipt_follow_a_sender_that_holds_its_slots_until_delivered() {
    // The receivers would copy 16-byte messages out, the sender holds their slots until every
    // member delivered them: the sender's choice rules the slot's reuse either way.
    sender_holds_slots_until_member_1_delivers([0, 16, 16], SimConfig::reliable());
}

fn sender_holds_slots_until_member_1_delivers(copy_at_receipt: [u32; 3], sim: SimConfig) -> Group {
    let (mut group, third) = two_received_one_member_behind(copy_at_receipt, sim);
    assert_eq!(third, Err(SendError::WindowFull(0)), "member 1 has delivered neither");
    group.poll_one(1);
    let payloads: Vec<Vec<u8>> = group.logs[1].iter().map(|e| e.3.clone()).collect();
    assert_eq!(payloads, vec![vec![b'a'; 16], vec![b'b'; 16]], "delivered as sent");
    group.poll_one(0);
    group.members[0].send(0, &[b'c'; 16]).expect("member 1's delivery freed a slot");
    group.run_until(10_000, |g| (0..3).all(|m| delivered_count(g, m, 0) == 3));
    assert_eq!(group.logs[0], group.logs[1]);
    assert_eq!(group.logs[0], group.logs[2]);
    group
}

#[test]
fn a_sender_reuses_the_slot_of_a_message_copied_out_at_receipt_once_every_member_received_it() {
    sender_reuses_slots_once_received_and_member_1_delivers_the_copies([16; 3]);
}

#[test]
fn members_configured_to_deliver_in_place_copy_what_their_sender_frees_at_receipt() {
    // The sender copies 16-byte messages out at receipt, the receivers would read them in
    // place: the sender's choice, carried in each slot's header, is the one they follow.
    sender_reuses_slots_once_received_and_member_1_delivers_the_copies([16, 0, 0]);
}

fn sender_reuses_slots_once_received_and_member_1_delivers_the_copies(copy_at_receipt: [u32; 3]) {
    let (mut group, third) = two_received_one_member_behind(copy_at_receipt, SimConfig::reliable());
    assert!(third.is_ok(), "short messages are copied out at receipt: {third:?}");
    // The third message lands in the first one's slot before member 1 delivers the first.
    group.poll_one(0);
    group.poll_one(1);
    group.run_until(10_000, |g| (0..3).all(|m| delivered_count(g, m, 0) == 3));
    let payloads: Vec<Vec<u8>> = group.logs[1].iter().map(|e| e.3.clone()).collect();
    assert_eq!(payloads, vec![vec![b'a'; 16], vec![b'b'; 16], vec![b'c'; 16]], "copies, as sent");
    assert_eq!(group.logs[0], group.logs[1]);
    assert_eq!(group.logs[0], group.logs[2]);
}

#[test]
fn a_message_handed_over_whole_is_refused_without_header_room_or_past_the_slot_and_kept() {
    let config = GroupConfig::single(NodeId(0), ids(&[0, 1]), 2, 16);
    let mut group = Group::new(6, SimConfig::reliable(), &config);
    let room = SLOT_HEADER_BYTES as usize;
    let mut short = vec![7u8; room - 1];
    assert_eq!(group.members[0].send_owned(0, &mut short), Err(SendError::NoHeaderRoom { len: room - 1, room }));
    assert_eq!(short, vec![7u8; room - 1], "a refused message is left as it was");
    let mut long = vec![7u8; room + 17];
    assert_eq!(group.members[0].send_owned(0, &mut long), Err(SendError::TooLong { len: 17, max: 16 }));
    assert_eq!(long.len(), room + 17);
    let mut message = [vec![0u8; room], b"hi".to_vec()].concat();
    assert_eq!(group.members[0].send_owned(0, &mut message), Ok(0));
    assert!(message.is_empty(), "the slot held no buffer before: an empty one comes back");
    group.run_until(10_000, |g| (0..2).all(|m| delivered_count(g, m, 0) == 1));
    assert_eq!(group.logs[1][0].3, b"hi".to_vec());
}

#[test]
fn subgroups_overlap_and_a_non_sender_still_gates_stability() {
    let config = GroupConfig {
        me: NodeId(0),
        members: ids(&[0, 1, 2, 3]),
        subgroups: vec![
            SubgroupConfig {
                members: ids(&[0, 1, 2]),
                senders: ids(&[0, 1]),
                window: 3,
                max_payload_bytes: 8,
                delivery: Delivery::Ordered,
                copy_at_receipt_bytes: microrep_core::multicast::COPY_AT_RECEIPT_BYTES,
            },
            SubgroupConfig {
                members: ids(&[1, 2, 3]),
                senders: ids(&[3]),
                window: 2,
                max_payload_bytes: 24,
                delivery: Delivery::Ordered,
                copy_at_receipt_bytes: microrep_core::multicast::COPY_AT_RECEIPT_BYTES,
            },
        ],
        failure_detection: None,
        #[cfg(feature = "planted-bugs")]
        planted_bug: None,
    };
    let mut group = Group::new(4, SimConfig::reliable(), &config);
    assert_eq!(group.members[2].send(0, b"x"), Err(SendError::NotASender(0)));
    assert_eq!(group.members[0].send(1, b"x"), Err(SendError::NotASender(1)));
    assert_eq!(group.members[3].send(1, &[0; 25]), Err(SendError::TooLong { len: 25, max: 24 }));
    // Member 2 only receives in subgroup 0: hold its writes back and nothing is delivered there.
    group.world.hold_outgoing(NodeId(2));
    group.members[0].send(0, b"a").expect("send");
    group.members[1].send(0, b"b").expect("send");
    group.members[3].send(1, b"zero-copy").expect("send");
    for _ in 0..200 {
        group.round();
    }
    assert_eq!(delivered_count(&group, 0, 0), 0, "not stable while member 2's receipt is unknown");
    group.world.release_outgoing(NodeId(2));
    group.run_until(10_000, |g| {
        (0..3).all(|m| delivered_count(g, m, 0) == 2) && (1..4).all(|m| delivered_count(g, m, 1) == 1)
    });
    assert_eq!(group.logs[3], vec![(1, NodeId(3), 0, b"zero-copy".to_vec())]);
    let first: Vec<_> = group.logs[0].clone();
    assert_eq!(first, vec![(0, NodeId(0), 0, b"a".to_vec()), (0, NodeId(1), 1, b"b".to_vec())]);
}

#[test]
fn a_faulty_fabric_with_torn_writes_and_failed_operations_still_agrees() {
    faulty_fabric_agrees(GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 4, 64), SimConfig::faulty());
}

#[test]
fn rings_pulled_from_their_senders_memory_agree_over_a_faulty_fabric_and_reconnects() {
    // Every message held in place in its sender's memory: a failed link's reconnect first
    // takes in what the guard covers and copies out what is held.
    let mut config = GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 4, 64);
    config.subgroups[0].copy_at_receipt_bytes = 0;
    faulty_fabric_agrees(config, lending(SimConfig::faulty()));
}

fn faulty_fabric_agrees(config: GroupConfig, sim: SimConfig) {
    let mut group = Group::new(5, sim, &config);
    let mut sent = 0u32;
    for _ in 0..100_000 {
        if sent >= 150 {
            break;
        }
        for member in &mut group.members {
            let mut slot = match member.reserve(0) {
                Ok(slot) => slot,
                Err(SendError::WindowFull(_)) => continue,
                Err(e) => panic!("{e}"),
            };
            let len = 8 + (sent as usize % 50);
            for (i, b) in slot.payload_mut()[..len].iter_mut().enumerate() {
                *b = (sent as usize + i) as u8;
            }
            slot.commit(len).expect("commit");
            sent += 1;
        }
        group.round();
    }
    assert_eq!(sent, 150);
    group.run_until(200_000, |g| (0..3).all(|m| delivered_count(g, m, 0) == 150));
    assert_eq!(group.logs[0], group.logs[1]);
    assert_eq!(group.logs[0], group.logs[2]);
    assert!(group.members.iter().any(|m| m.stats().reconnects > 0), "the faulty preset failed some operation");
}

/// `sim` lending peers' memory, as shm does: receivers pull each sender's ring.
fn lending(sim: SimConfig) -> SimConfig {
    SimConfig { lend_peer_memory: true, ..sim }
}

fn with_detection(config: GroupConfig) -> GroupConfig {
    let detection = FailureDetection::new(10_000, 200_000, config.members.len(), 0);
    GroupConfig { failure_detection: Some(detection), ..config }
}

#[test]
fn a_crash_wedges_the_group_which_delivers_to_the_ragged_edge_and_runs_the_next_view() {
    crash_wedges_delivers_to_the_ragged_edge_and_runs_the_next_view(1024, SimConfig::reliable(), false);
}

#[test]
fn survivors_deliver_a_crashed_senders_messages_from_its_memory_to_the_ragged_edge() {
    // Rings pulled, every message held in place: what the crashed member sent is delivered
    // from its memory, which stays readable after it died (shm: its segment's mapping).
    crash_wedges_delivers_to_the_ragged_edge_and_runs_the_next_view(0, lending(SimConfig::reliable()), false);
}

#[test]
fn a_crashed_sender_restarted_at_once_does_not_replace_the_messages_held_from_its_old_life() {
    // The links to it reconnect to the new incarnation, whose memory holds none of the old
    // ring: before that, the survivors copy out what they hold in place.
    crash_wedges_delivers_to_the_ragged_edge_and_runs_the_next_view(0, lending(SimConfig::reliable()), true);
}

fn crash_wedges_delivers_to_the_ragged_edge_and_runs_the_next_view(
    copy_at_receipt: u32,
    sim: SimConfig,
    restart: bool,
) {
    let mut config = with_detection(GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 4, 8));
    config.subgroups[0].copy_at_receipt_bytes = copy_at_receipt;
    if restart {
        // Suspicion after 5 ms: first the survivors' WRITEs to the dead member time out
        // (1 ms), and their links reconnect, reaching its next incarnation.
        config.failure_detection = Some(FailureDetection::new(10_000, 5_000_000, 3, 0));
    }
    let mut group = Group::new(6, sim, &config);
    let mut sent = 0u32;
    for _ in 0..100 {
        for member in &mut group.members {
            if member.send(0, &sent.to_le_bytes()).is_ok() {
                sent += 1;
            }
        }
        group.round();
    }
    // Member 2 dies with messages in flight; 0 and 1 (a majority) must agree on what is left.
    group.world.crash(NodeId(2));
    let _restarted = restart.then(|| group.world.restart(NodeId(2), &regions(&config)).expect("restart"));
    let survivors = [0usize, 1];
    for _ in 0..100_000 {
        if survivors.iter().all(|&m| group.members[m].epoch() == 1) {
            break;
        }
        let now = group.world.now();
        for &m in &survivors {
            group.poll_at(m, now);
        }
        group.world.advance_to(now + 500);
    }
    for &m in &survivors {
        assert_eq!(group.members[m].epoch(), 1, "no view installed and run: {:?}", group.members[m].phase());
        assert_eq!(group.members[m].config().members, ids(&[0, 1]));
        assert_eq!(group.members[m].phase(), Phase::Running);
    }
    assert_eq!(group.logs[0], group.logs[1], "the survivors delivered the same messages");
    let mut payloads: Vec<&[u8]> = group.logs[0].iter().map(|e| &e.3[..]).collect();
    payloads.sort_unstable();
    payloads.dedup();
    assert_eq!(payloads.len(), group.logs[0].len(), "each message's own bytes (every one sent differs)");
    assert!(group.logs[2].len() <= group.logs[0].len(), "whatever the dead member delivered, they did too");
    assert_eq!(group.logs[2][..], group.logs[0][..group.logs[2].len()]);
    assert!(group.members[0].suspected().is_empty(), "a fresh view suspects no one");
}

#[test]
fn a_minority_never_installs_a_view() {
    let config = with_detection(GroupConfig::single(NodeId(0), ids(&[0, 1]), 4, 8));
    let mut group = Group::new(7, SimConfig::reliable(), &config);
    group.members[0].send(0, b"a").expect("send");
    for _ in 0..100 {
        group.round();
    }
    group.world.crash(NodeId(1));
    let mut stopped = None;
    for _ in 0..2_000 {
        let now = group.world.now();
        if let Err(e) = group.members[0].poll(now, &mut |_: DeliveryBatch<'_>| {}) {
            stopped = Some(e);
            break;
        }
        group.world.advance_to(now + 500);
    }
    // One of two is no majority: wedged, no view installed, and then stopped with the reason.
    assert_eq!(group.members[0].phase(), Phase::Wedged);
    assert_eq!(group.members[0].epoch(), 0, "no view installed");
    let expected = MulticastError::MajorityLost { epoch: 0, members: ids(&[0, 1]), suspected: ids(&[1]) };
    assert_eq!(stopped, Some(expected.clone()), "a member without a majority stops with the reason");
    let again = group.members[0].poll(group.world.now(), &mut |_: DeliveryBatch<'_>| {});
    assert_eq!(again, Err(expected), "and says so again");
}

#[test]
fn an_unordered_subgroup_delivers_at_receipt_in_each_senders_order() {
    let mut config = GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 4, 8);
    config.subgroups[0].delivery = Delivery::Unordered;
    let mut group = Group::new(8, SimConfig::reliable(), &config);
    // Member 2's receipts never arrive: an ordered subgroup would deliver nothing.
    group.world.hold_outgoing(NodeId(2));
    for i in 0..3u8 {
        group.members[0].send(0, &[0, i]).expect("send");
        group.members[1].send(0, &[1, i]).expect("send");
    }
    group.run_until(1_000, |g| (0..2).all(|m| delivered_count(g, m, 0) == 6));
    for log in &group.logs[..2] {
        for sender in 0..2u8 {
            let mine: Vec<u8> = log.iter().filter(|e| e.3[0] == sender).map(|e| e.3[1]).collect();
            assert_eq!(mine, vec![0, 1, 2], "each sender's messages in its order, once");
        }
    }
    assert_eq!(delivered_count(&group, 2, 0), 6, "member 2 receives and delivers too");
    group.members[0].send(0, &[0, 3]).expect("a fourth slot");
    assert_eq!(
        group.members[0].send(0, &[0, 4]),
        Err(SendError::WindowFull(0)),
        "a slot is freed only once every member received it"
    );
}

#[test]
fn subgroups_idle_for_long_wake_on_the_first_message_in_either_order() {
    // 20 subgroups of all three members; every poll skips the settled ones (`idle.rs`). A
    // message in any of them, sent by any member, after any time idle, must still be received
    // and delivered everywhere, in one order, and a window of one must keep cycling.
    let mut config = GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 1, 8);
    let template = config.subgroups[0].clone();
    config.subgroups = vec![template; 20];
    let mut group = Group::new(31, SimConfig::reliable(), &config);
    for round in 0..4u8 {
        for _ in 0..200 {
            group.round();
        }
        for (sender, subgroup) in [(0, 19), (2, 7), (1, 0), (1, 19)] {
            for i in 0..3u8 {
                let mut sent = false;
                for _ in 0..1_000 {
                    if group.members[sender].send(subgroup, &[round, sender as u8, i]).is_ok() {
                        sent = true;
                        break;
                    }
                    group.round();
                }
                assert!(sent, "the window of subgroup {subgroup} never freed");
            }
        }
        let expected = 12 * (usize::from(round) + 1);
        group.run_until(20_000, |g| (0..3).all(|m| g.logs[m].len() == expected));
    }
    for subgroup in 0..20 {
        let of = |m: usize| group.logs[m].iter().filter(|e| e.0 == subgroup).cloned().collect::<Vec<_>>();
        assert_eq!(of(0), of(1), "subgroup {subgroup}");
        assert_eq!(of(0), of(2), "subgroup {subgroup}");
    }
}
