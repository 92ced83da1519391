//! Scenario tests of running view after view on the simulated fabric: a member fails and is
//! removed, a new member joins with state transfer, a second and a third change follow, and a
//! member fails during a cleanup. Randomized runs of the same live in `microrep-multicast-sim`.

use microrep_core::multicast::{
    Deliver, DeliveryBatch, FailureDetection, GroupConfig, JoinError, Member, MulticastError, Phase, SendError,
    SubgroupConfig, View, regions,
};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimConfig, SimFabric, SimWorld};

fn ids(v: &[u16]) -> Vec<NodeId> {
    v.iter().map(|&i| NodeId(i)).collect()
}

/// An application whose state is the payloads it delivered (restored from a snapshot on a
/// joiner), and the views it saw installed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct App {
    delivered: Vec<Vec<u8>>,
    views: Vec<(u64, Vec<NodeId>)>,
}

impl Deliver for App {
    fn deliver(&mut self, batch: DeliveryBatch<'_>) {
        self.delivered.extend(batch.messages.iter().map(|m| m.payload.to_vec()));
    }

    fn view_installed(&mut self, view: &View) {
        self.views.push((view.epoch, view.members.clone()));
    }

    fn snapshot(&mut self, _subgroup: usize, out: &mut Vec<u8>) {
        for payload in &self.delivered {
            out.push(payload.len() as u8);
            out.extend_from_slice(payload);
        }
    }

    fn restore(&mut self, _subgroup: usize, mut state: &[u8]) {
        while let Some((&len, rest)) = state.split_first() {
            self.delivered.push(rest[..len as usize].to_vec());
            state = &rest[len as usize..];
        }
    }
}

struct Group {
    world: SimWorld,
    template: GroupConfig,
    members: Vec<Option<(Member<SimFabric>, App)>>,
    /// Per member: why it stopped for good (its polls return that error; it is polled no
    /// more).
    stopped: Vec<Option<MulticastError>>,
}

/// How long a joiner of these tests waits for its state before it gives up (simulated time):
/// far longer than any change here takes.
const GIVE_UP_NS: u64 = 1_000_000_000;

impl Group {
    fn new(seed: u64, n: u16) -> Self {
        Self::with_max_members(seed, n, 6)
    }

    fn with_max_members(seed: u64, n: u16, max_members: usize) -> Self {
        let members = ids(&(0..n).collect::<Vec<_>>());
        let detection = FailureDetection::new(10_000, 200_000, max_members, 4096);
        let template =
            GroupConfig { failure_detection: Some(detection), ..GroupConfig::single(NodeId(0), members.clone(), 4, 8) };
        Self::of(seed, template)
    }

    /// Members `template.members`, each with `template` as its configuration.
    fn of(seed: u64, template: GroupConfig) -> Self {
        let members = template.members.clone();
        let world = SimWorld::new(seed, SimConfig::reliable());
        let fabrics: Vec<_> = members.iter().map(|&id| world.add_node(id, &regions(&template)).expect("add")).collect();
        let members = fabrics
            .into_iter()
            .zip(&members)
            .map(|(fabric, &me)| {
                Some((Member::new(fabric, GroupConfig { me, ..template.clone() }).expect("member"), App::default()))
            })
            .collect();
        Self { world, template, members, stopped: Vec::new() }
    }

    fn member(&mut self, id: u16) -> &mut Member<SimFabric> {
        &mut self.members[id as usize].as_mut().expect("live").0
    }

    fn app(&self, id: u16) -> &App {
        &self.members[id as usize].as_ref().expect("live").1
    }

    fn live(&self) -> Vec<u16> {
        (0..self.members.len() as u16).filter(|&i| self.members[i as usize].is_some()).collect()
    }

    fn crash(&mut self, id: u16) {
        self.world.crash(NodeId(id));
        self.members[id as usize] = None;
    }

    fn add_joiner(&mut self, id: u16) {
        self.add_joiner_giving_up(id, GIVE_UP_NS);
    }

    fn add_joiner_giving_up(&mut self, id: u16, give_up_after_ns: u64) {
        let fabric = self.world.add_node(NodeId(id), &regions(&self.template)).expect("add joiner");
        let template = GroupConfig { me: NodeId(id), ..self.template.clone() };
        let joiner = Member::join(fabric, template, give_up_after_ns).expect("joiner");
        assert_eq!(joiner.phase(), Phase::Joining);
        while self.members.len() <= id as usize {
            self.members.push(None);
        }
        self.members[id as usize] = Some((joiner, App::default()));
    }

    /// Polls every live member that has not stopped once, then lets 500 ns pass. A member
    /// that stops for good (a joiner that gave up, a member without a majority) is noted.
    fn round(&mut self) {
        let now = self.world.now();
        self.stopped.resize(self.members.len(), None);
        for (slot, stopped) in self.members.iter_mut().zip(&mut self.stopped) {
            let Some((member, app)) = slot.as_mut().filter(|_| stopped.is_none()) else { continue };
            match member.poll(now, app) {
                Ok(_) => {}
                Err(e @ (MulticastError::JoinTimedOut { .. } | MulticastError::MajorityLost { .. })) => {
                    *stopped = Some(e);
                }
                Err(e) => panic!("poll: {e}"),
            }
        }
        self.world.advance_to(now + 500);
    }

    /// Rounds until every live member runs view `epoch`.
    fn run_to_epoch(&mut self, epoch: u64) {
        for _ in 0..20_000 {
            if self.members.iter().flatten().all(|(m, _)| m.epoch() == epoch && m.phase() == Phase::Running) {
                return;
            }
            self.round();
        }
        let phases: Vec<_> = self.members.iter().flatten().map(|(m, _)| (m.epoch(), m.phase())).collect();
        panic!("not every member runs view {epoch}: {phases:?}");
    }

    /// Every live member sends `count` messages (retrying a full window), then all deliver.
    fn send_all(&mut self, tag: u8, count: u8) {
        let live = self.live();
        for i in 0..count {
            for &m in &live {
                for _ in 0..10_000 {
                    match self.member(m).send(0, &[tag, m as u8, i]) {
                        Ok(_) => break,
                        Err(SendError::WindowFull(_)) => self.round(),
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }
        for _ in 0..20_000 {
            let first = &self.app(live[0]).delivered;
            let done = first.iter().filter(|p| p[0] == tag).count() == live.len() * count as usize;
            if done && live.iter().all(|&m| self.app(m).delivered == *first) {
                return;
            }
            self.round();
        }
        panic!("not every message of round {tag} delivered alike");
    }
}

#[test]
fn members_run_view_after_view_a_joiner_gets_the_state_and_everyone_agrees() {
    let mut group = Group::new(11, 4);
    group.send_all(1, 10);
    // View 1: member 3 fails.
    group.crash(3);
    group.run_to_epoch(1);
    assert_eq!(group.member(0).config().members, ids(&[0, 1, 2]));
    group.send_all(2, 10);
    // View 2: member 7 joins, with the state of subgroup 0.
    group.add_joiner(7);
    assert_eq!(group.member(1).propose_join(NodeId(0), &[0]), Err(JoinError::AlreadyMember(NodeId(0))));
    assert_eq!(group.member(1).propose_join(NodeId(7), &[3]), Err(JoinError::NoSuchSubgroup(3)));
    group.member(1).propose_join(NodeId(7), &[0]).expect("propose");
    assert_eq!(group.member(1).propose_join(NodeId(8), &[0]), Err(JoinError::Pending(NodeId(7))));
    group.run_to_epoch(2);
    assert_eq!(group.member(7).config().members, ids(&[0, 1, 2, 7]));
    assert_eq!(group.app(7).delivered, group.app(0).delivered, "the joiner starts from the members' state");
    assert_eq!(group.app(7).views, vec![(2, ids(&[0, 1, 2, 7]))]);
    group.send_all(3, 10);
    // View 3: member 1 fails; the joiner is a member like any other.
    group.crash(1);
    group.run_to_epoch(3);
    assert_eq!(group.member(7).config().members, ids(&[0, 2, 7]));
    group.send_all(4, 10);
    let first = group.app(0).clone();
    for m in [2, 7] {
        assert_eq!(group.app(m).delivered, first.delivered);
    }
    assert_eq!(first.views.iter().map(|v| v.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(first.delivered.len(), 4 * 10 + 3 * 10 + 4 * 10 + 3 * 10);
}

#[test]
fn a_member_that_fails_during_the_cleanup_is_removed_by_the_next_change() {
    let mut group = Group::new(12, 5);
    group.send_all(1, 5);
    group.crash(4);
    // Member 3 fails as soon as anyone has installed view 1 (mid-cleanup for the others).
    for _ in 0..20_000 {
        if group.members.iter().flatten().any(|(m, _)| matches!(m.phase(), Phase::Installed(_))) {
            break;
        }
        group.round();
    }
    group.crash(3);
    group.run_to_epoch(2);
    assert_eq!(group.member(0).config().members, ids(&[0, 1, 2]));
    group.send_all(2, 5);
    assert_eq!(group.app(0).delivered, group.app(1).delivered);
    assert_eq!(group.app(0).delivered, group.app(2).delivered);
}

#[test]
fn a_sender_resends_what_the_old_view_did_not_deliver() {
    let mut group = Group::new(13, 3);
    // Member 2's writes are held: member 0's messages cannot be stable when member 2 dies.
    group.world.hold_outgoing(NodeId(2));
    for i in 0..3u8 {
        group.member(0).send(0, &[9, 0, i]).expect("send");
    }
    for _ in 0..50 {
        group.round();
    }
    assert!(group.app(0).delivered.is_empty(), "not stable without member 2's receipt");
    group.crash(2);
    group.run_to_epoch(1);
    for _ in 0..2_000 {
        group.round();
    }
    let expected: Vec<Vec<u8>> = (0..3u8).map(|i| vec![9, 0, i]).collect();
    assert_eq!(group.app(0).delivered, expected, "delivered in the next view, once, in order");
    assert_eq!(group.app(1).delivered, expected);
}

impl Group {
    /// Rounds until each of `members` runs a view of exactly `members`; returns its epoch.
    fn settle_on(&mut self, members: &[u16]) -> u64 {
        let want = ids(members);
        for _ in 0..40_000 {
            let runs = |id: u16| {
                let (m, _) = self.members[id as usize].as_ref().expect("live");
                m.phase() == Phase::Running && m.config().members == want
            };
            if members.iter().all(|&id| runs(id)) {
                return self.members[members[0] as usize].as_ref().expect("live").0.epoch();
            }
            self.round();
        }
        let phases: Vec<_> =
            self.members.iter().flatten().map(|(m, _)| (m.config().me, m.epoch(), m.phase(), m.suspected())).collect();
        panic!("{members:?} never ran a view of themselves: {phases:?}");
    }

    /// Rounds until `pred` holds.
    fn round_until(&mut self, what: &str, pred: impl Fn(&Self) -> bool) {
        for _ in 0..40_000 {
            if pred(self) {
                return;
            }
            self.round();
        }
        panic!("never: {what}");
    }

    fn phase(&self, id: u16) -> Phase {
        self.members[id as usize].as_ref().expect("live").0.phase()
    }

    fn epoch(&self, id: u16) -> u64 {
        self.members[id as usize].as_ref().expect("live").0.epoch()
    }

    fn suspects(&self, id: u16) -> Vec<NodeId> {
        self.members[id as usize].as_ref().expect("live").0.suspected()
    }

    fn stopped(&self, id: u16) -> Option<&MulticastError> {
        self.stopped.get(id as usize).and_then(Option::as_ref)
    }
}

#[test]
fn members_wedged_on_different_suspicions_converge_on_the_leaders_view() {
    // Member 1 stops hearing member 3, and member 2 member 4, at the same moment: each wedges
    // suspecting a different member. (Before the leader-driven agreement each froze its own
    // set and the group stayed wedged for good.)
    let mut group = Group::new(21, 5);
    group.send_all(1, 5);
    group.world.hold_link(NodeId(3), NodeId(1));
    group.world.hold_link(NodeId(4), NodeId(2));
    group.round_until("members 1 and 2 wedge", |g| g.phase(1) == Phase::Wedged && g.phase(2) == Phase::Wedged);
    assert_ne!(group.suspects(1), group.suspects(2), "they wedged on different suspicions");
    let epoch = group.settle_on(&[0, 1, 2]);
    assert_eq!(epoch, 1, "one change takes both suspicions in");
    assert_eq!((group.phase(3), group.phase(4)), (Phase::Excluded, Phase::Excluded));
    group.crash(3);
    group.crash(4);
    group.send_all(2, 5);
}

#[test]
fn a_member_that_fails_while_a_change_is_agreed_is_taken_into_it() {
    // Member 0 stops hearing member 3 and the group wedges suspecting 3; member 4 fails a few
    // heartbeats later, before any member could wedge on it. The change cannot end without
    // 4's final counters, so the leader waits until it suspects 4 too, then proposes both.
    let mut group = Group::new(22, 5);
    group.send_all(1, 5);
    group.world.hold_link(NodeId(3), NodeId(0));
    for _ in 0..60 {
        group.round();
    }
    group.crash(4);
    group.round_until("member 1 wedges", |g| g.phase(1) == Phase::Wedged);
    assert_eq!(group.suspects(1), ids(&[3]), "the change began with member 3 alone");
    let epoch = group.settle_on(&[0, 1, 2]);
    assert_eq!(epoch, 1);
    assert_eq!(group.phase(3), Phase::Excluded);
    group.crash(3);
    group.send_all(2, 5);
}

#[test]
fn a_leader_that_fails_during_the_agreement_is_replaced() {
    let mut group = Group::new(23, 5);
    group.send_all(1, 5);
    group.crash(4);
    // Member 0 leads the change; it fails as soon as every other member has wedged.
    group.round_until("members 1 to 3 wedge", |g| (1..4).all(|m| g.phase(m) == Phase::Wedged));
    group.crash(0);
    let epoch = group.settle_on(&[1, 2, 3]);
    assert!((1..=2).contains(&epoch), "one change, or two if member 0's view was decided first");
    group.send_all(2, 5);
    let first = group.app(1).clone();
    assert_eq!(group.app(2).delivered, first.delivered);
    assert_eq!(group.app(3).delivered, first.delivered);
}

#[test]
fn joins_proposed_by_two_members_at_once_are_both_admitted() {
    // Two proposers, two joiners: the leader's view takes one, and the other proposer (and
    // every member that adopted its request) proposes the other again in the next view.
    let mut group = Group::new(24, 3);
    group.send_all(1, 5);
    group.add_joiner(7);
    group.add_joiner(8);
    group.member(1).propose_join(NodeId(7), &[0]).expect("propose 7");
    group.member(2).propose_join(NodeId(8), &[0]).expect("propose 8");
    let epoch = group.settle_on(&[0, 1, 2, 7, 8]);
    assert_eq!(epoch, 2, "one join per change");
    group.send_all(2, 5);
    for m in [7, 8] {
        assert_eq!(group.app(m).delivered, group.app(0).delivered, "joiner {m} has the state");
    }
}

#[test]
fn a_joiner_whose_request_was_lost_asks_a_member_itself_and_joins() {
    let mut g = Group::new(8, 3);
    g.add_joiner(3);
    g.member(3).ask_to_join(&[0], 1_000_000).expect("a joiner asks");
    g.member(2).propose_join(NodeId(3), &[0]).expect("propose");
    // The proposer fails before any member saw the request: it is lost.
    g.crash(2);
    g.run_to_epoch(2);
    assert_eq!(
        g.app(3).views.last(),
        Some(&(2, ids(&[0, 1, 3]))),
        "removed the failed proposer, then let the joiner in"
    );
    assert_eq!(g.member(3).stats().join_asks, 1, "asked once, after its timeout");
    g.send_all(1, 2);
}

#[test]
fn a_joiner_asking_a_full_group_is_told_why() {
    let mut g = Group::with_max_members(9, 3, 3);
    g.add_joiner(3);
    assert_eq!(g.member(0).ask_to_join(&[0], 1_000), Err(JoinError::NotAJoiner));
    assert_eq!(g.member(3).ask_to_join(&[1], 1_000), Err(JoinError::NoSuchSubgroup(1)));
    g.member(3).ask_to_join(&[0], 1_000).expect("a joiner asks");
    let (joiner, mut app) = g.members[3].take().expect("the joiner");
    let mut joiner = joiner;
    for _ in 0..1_000 {
        match joiner.poll(g.world.now(), &mut app) {
            Ok(_) => g.round(),
            Err(MulticastError::JoinRefused(why)) => {
                assert_eq!(why, JoinError::Full(3));
                assert_eq!(g.member(0).epoch(), 0, "the group did not change");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the joiner was never told");
}

#[test]
fn a_joiner_that_does_not_ask_gives_up_when_its_request_is_lost_and_says_why() {
    let mut g = Group::new(8, 3);
    g.add_joiner_giving_up(3, 5_000_000);
    g.member(2).propose_join(NodeId(3), &[0]).expect("propose");
    // The proposer fails before any member saw the request: it is lost, and the joiner does
    // not ask for itself. (Before the bound it waited in `Phase::Joining` for good.)
    g.crash(2);
    g.round_until("the joiner gives up", |g| g.stopped(3).is_some());
    let Some(MulticastError::JoinTimedOut { waited_ns, asks }) = g.stopped(3).cloned() else {
        panic!("the joiner stopped with {:?}", g.stopped(3));
    };
    assert!(waited_ns >= 5_000_000, "not before its bound: {waited_ns} ns");
    assert_eq!(asks, 0);
    let (joiner, app) = g.members[3].as_mut().expect("the joiner");
    let again = joiner.poll(g.world.now(), app);
    assert_eq!(again, Err(MulticastError::JoinTimedOut { waited_ns, asks }), "stopped for good");
    assert_eq!(g.settle_on(&[0, 1]), 1, "the group went on without the proposer");
}

#[test]
fn a_member_whose_view_lost_its_majority_stops_and_says_why() {
    let mut g = Group::new(14, 3);
    g.send_all(1, 3);
    g.crash(1);
    g.crash(2);
    // Before, member 0 stayed wedged for good: no next view can be agreed without a majority.
    g.round_until("member 0 stops", |g| g.stopped(0).is_some());
    let expected = MulticastError::MajorityLost { epoch: 0, members: ids(&[0, 1, 2]), suspected: ids(&[1, 2]) };
    assert_eq!(g.stopped(0), Some(&expected));
    assert_eq!((g.member(0).epoch(), g.phase(0)), (0, Phase::Wedged), "no view installed without a majority");
    assert_eq!(g.app(0).delivered.len(), 9, "what was delivered stays delivered");
}

#[test]
fn when_every_holder_of_a_joiners_state_fails_the_joiner_gives_up_and_a_group_without_a_majority_stops() {
    // Subgroup 1 is members 0 and 1: they alone hold its state. Joiner 3 enters it; 0 and 1
    // install the view with the joiner, then fail before any of their writes reached it. View
    // 1 is {0, 1, 2, 3}: member 2 runs, the joiner never can, and two of four is no majority.
    // (Before, member 2 stayed wedged and the joiner joining, both for good.)
    let detection = FailureDetection::new(10_000, 200_000, 6, 4096);
    let mut template =
        GroupConfig { failure_detection: Some(detection), ..GroupConfig::single(NodeId(0), ids(&[0, 1, 2]), 4, 8) };
    let pair = SubgroupConfig { members: ids(&[0, 1]), senders: ids(&[0, 1]), ..template.subgroups[0].clone() };
    template.subgroups.push(pair);
    let mut g = Group::of(15, template);
    g.send_all(1, 3);
    g.add_joiner_giving_up(3, 5_000_000);
    g.world.hold_link(NodeId(0), NodeId(3));
    g.world.hold_link(NodeId(1), NodeId(3));
    g.member(0).propose_join(NodeId(3), &[1]).expect("propose");
    let installed = |g: &Group, m: u16| matches!(g.phase(m), Phase::Installed(_)) || g.epoch(m) == 1;
    g.round_until("every member installs view 1", |g| (0..3).all(|m| installed(g, m)));
    g.crash(0);
    g.crash(1);
    g.round_until("member 2 and the joiner stop", |g| g.stopped(2).is_some() && g.stopped(3).is_some());
    let expected = MulticastError::MajorityLost { epoch: 1, members: ids(&[0, 1, 2, 3]), suspected: ids(&[0, 1, 3]) };
    assert_eq!(g.stopped(2), Some(&expected));
    assert!(matches!(g.stopped(3), Some(MulticastError::JoinTimedOut { .. })), "{:?}", g.stopped(3));
}
