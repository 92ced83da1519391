//! Multicast groups on real fabrics: members on their own poll threads in one process, over
//! shm and over tcp on loopback, each sending from its own application thread.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use microrep::config::ThreadConfig;
use microrep::multicast::{MulticastNode, MulticastNodeError, MulticastSendError, shm_fabric, tcp_fabric};
use microrep_core::multicast::{DeliveryBatch, FailureDetection, GroupConfig, MulticastError, Phase, SendError};
use microrep_fabric::{Fabric, NodeId};

type Log = Arc<Mutex<Vec<(NodeId, u64, Vec<u8>)>>>;

/// Removes a shm cluster directory when the test ends, passing or not.
struct ShmDir(PathBuf);

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn groups(n: u16, window: u32) -> Vec<GroupConfig> {
    groups_of(n, window, 64)
}

fn groups_of(n: u16, window: u32, max_payload_bytes: u32) -> Vec<GroupConfig> {
    let members: Vec<NodeId> = (0..n).map(NodeId).collect();
    members.iter().map(|&me| GroupConfig::single(me, members.clone(), window, max_payload_bytes)).collect()
}

/// Short tails: every message copied at each step.
fn short_tail(i: u32) -> usize {
    (i % 5) as usize
}

/// A group of `n` members with `detection`, each started on the shm fabric under `dir`: their
/// configurations, nodes and delivery logs.
fn detected_group(
    dir: &ShmDir,
    n: u16,
    detection: FailureDetection,
) -> (Vec<GroupConfig>, Vec<MulticastNode>, Vec<Log>) {
    let groups: Vec<GroupConfig> =
        groups(n, 8).into_iter().map(|g| GroupConfig { failure_detection: Some(detection), ..g }).collect();
    let fabrics: Vec<_> = groups.iter().map(|g| shm_fabric(&dir.0, g).expect("shm fabric")).collect();
    let (nodes, logs) = start(fabrics, groups.clone());
    (groups, nodes, logs)
}

/// Starts one node per fabric, each logging what it delivers.
fn start<F>(fabrics: Vec<F>, groups: Vec<GroupConfig>) -> (Vec<MulticastNode>, Vec<Log>)
where
    F: Fabric + Send + 'static,
    F::Endpoint: Send,
{
    let logs: Vec<Log> = groups.iter().map(|_| Log::default()).collect();
    let nodes = fabrics
        .into_iter()
        .zip(groups)
        .zip(&logs)
        .map(|((fabric, group), log)| {
            let log = Arc::clone(log);
            let upcall = move |batch: DeliveryBatch<'_>| {
                let mut log = log.lock().expect("log");
                for m in batch.messages {
                    log.push((m.sender, m.seq, m.payload.to_vec()));
                }
            };
            MulticastNode::start(fabric, group, ThreadConfig::default(), upcall).expect("start")
        })
        .collect();
    (nodes, logs)
}

/// Every node sends `per_node` messages from its own thread (retrying a full window), then
/// every node must deliver all of them in one order. Message `i` is the sender's id, `i`, and
/// `tail(i)` bytes of `i as u8`.
fn all_send_and_agree(nodes: Vec<MulticastNode>, logs: &[Log], per_node: u32, tail: fn(u32) -> usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let nodes: Vec<Arc<MulticastNode>> = nodes.into_iter().map(Arc::new).collect();
    std::thread::scope(|s| {
        for node in &nodes {
            s.spawn(move || {
                let mut i = 0u32;
                while i < per_node {
                    // Lengths vary, so that a send into a recycled buffer that kept a longer
                    // payload's bytes would show.
                    let tail = vec![i as u8; tail(i)];
                    let payload = [node.id().0.to_le_bytes().as_slice(), &i.to_le_bytes(), &tail].concat();
                    match node.send(0, &payload) {
                        Ok(_) => i += 1,
                        Err(MulticastSendError::Send(SendError::WindowFull(0))) => {
                            assert!(Instant::now() < deadline, "window never freed");
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("send: {e}"),
                    }
                }
            });
        }
    });
    let total = per_node as usize * nodes.len();
    while logs.iter().any(|l| l.lock().expect("log").len() < total) {
        assert!(Instant::now() < deadline, "not every message delivered in time");
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = logs[0].lock().expect("log").clone();
    for log in &logs[1..] {
        assert_eq!(*log.lock().expect("log"), first, "every member delivers the same order");
    }
    // Each sender's messages arrive in its sending order, exactly once.
    for node in &nodes {
        let id = node.id();
        let mine: Vec<u32> = first
            .iter()
            .filter(|(sender, _, _)| *sender == id)
            .map(|(_, _, p)| {
                let i = u32::from_le_bytes([p[2], p[3], p[4], p[5]]);
                assert!(p[6..] == vec![i as u8; tail(i)], "message {i}'s payload, exactly");
                i
            })
            .collect();
        assert_eq!(mine, (0..per_node).collect::<Vec<_>>());
    }
    for node in nodes {
        let node = Arc::into_inner(node).expect("senders are done");
        // The counters are published after the poll whose upcall delivered the last message
        // returns: wait for it (bounded) rather than race it.
        while (node.stats().delivered as usize) < total {
            assert!(Instant::now() < deadline, "the counters never showed every delivery");
            std::thread::yield_now();
        }
        assert_eq!(node.stats().delivered as usize, total, "delivered exactly once");
        node.stop().expect("clean stop");
    }
}

#[test]
fn three_members_on_shm_deliver_one_order() {
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-test-{}", std::process::id())));
    let groups = groups(3, 8);
    let fabrics: Vec<_> = groups.iter().map(|g| shm_fabric(&dir.0, g).expect("shm fabric")).collect();
    let (nodes, logs) = start(fabrics, groups);
    all_send_and_agree(nodes, &logs, 2_000, short_tail);
}

#[test]
fn long_and_short_messages_mixed_in_one_ring_arrive_whole_in_one_order() {
    // Long payloads are handed to the ring in their buffers and delivered where they landed,
    // short ones copied at each step: a ring holds both at once, and buffers are reused.
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-test-long-{}", std::process::id())));
    let groups = groups_of(3, 8, 10_240);
    let fabrics: Vec<_> = groups.iter().map(|g| shm_fabric(&dir.0, g).expect("shm fabric")).collect();
    let (nodes, logs) = start(fabrics, groups);
    all_send_and_agree(nodes, &logs, 600, |i| [0, 3, 9_000, 1_500, 4_000, 10_234][(i % 6) as usize]);
}

/// A sender whose peer does not poll fills its ring (`window` messages) and its outbox (another
/// `window`), and is then refused with back-pressure; nothing refused or queued is lost: once
/// the peer runs, both deliver every accepted message, in order.
#[test]
fn a_sender_whose_peer_does_not_poll_is_refused_after_two_windows_and_loses_nothing() {
    const WINDOW: u32 = 4;
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-full-{}", std::process::id())));
    let groups = groups(2, WINDOW);
    let fabrics: Vec<_> = groups.iter().map(|g| shm_fabric(&dir.0, g).expect("shm fabric")).collect();
    let mut fabrics = fabrics.into_iter();
    let (first, second) = (fabrics.next().expect("fabric 0"), fabrics.next().expect("fabric 1"));
    let (mut nodes, mut logs) = start(vec![first], vec![groups[0].clone()]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut accepted = 0u32;
    loop {
        match nodes[0].send(0, &accepted.to_le_bytes()) {
            Ok(()) => accepted += 1,
            Err(MulticastSendError::Send(SendError::WindowFull(0))) => {
                // Refused only when the outbox is full: a window queued beside the ring's.
                if nodes[0].stats().sent >= u64::from(WINDOW) {
                    break;
                }
                assert!(Instant::now() < deadline, "the ring never filled");
                std::thread::yield_now();
            }
            Err(e) => panic!("send: {e}"),
        }
        assert!(accepted <= 2 * WINDOW, "more accepted than the ring and the outbox hold");
    }
    assert_eq!(accepted, 2 * WINDOW, "a full ring and a full outbox, then refusals");
    let (more_nodes, more_logs) = start(vec![second], vec![groups[1].clone()]);
    nodes.extend(more_nodes);
    logs.extend(more_logs);
    let expected: Vec<Vec<u8>> = (0..accepted).map(|i| i.to_le_bytes().to_vec()).collect();
    for log in &logs {
        loop {
            let delivered: Vec<Vec<u8>> = log.lock().expect("log").iter().map(|(_, _, p)| p.clone()).collect();
            if delivered.len() == expected.len() {
                assert_eq!(delivered, expected, "every accepted message, in sending order");
                break;
            }
            assert!(delivered.len() < expected.len(), "delivered more than was accepted");
            assert!(Instant::now() < deadline, "not every accepted message delivered in time");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for node in nodes {
        node.stop().expect("clean stop");
    }
}

#[test]
fn three_members_on_tcp_loopback_deliver_one_order() {
    let groups = groups(3, 8);
    let any = "127.0.0.1:0".parse().expect("address");
    let fabrics: Vec<_> = groups.iter().map(|g| tcp_fabric("mcast-test", any, g).expect("tcp fabric")).collect();
    for a in &fabrics {
        for b in &fabrics {
            if a.node_id() != b.node_id() {
                a.set_peer_addr(b.node_id(), b.local_addr()).expect("peer address");
            }
        }
    }
    let (nodes, logs) = start(fabrics, groups);
    all_send_and_agree(nodes, &logs, 500, short_tail);
}

#[test]
fn a_send_from_the_upcall_goes_out_since_no_lock_is_held_while_polling() {
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-upcall-{}", std::process::id())));
    let groups = groups(2, 4);
    let fabrics: Vec<_> = groups.iter().map(|g| shm_fabric(&dir.0, g).expect("shm fabric")).collect();
    let cell: Arc<Mutex<Option<Arc<MulticastNode>>>> = Arc::default();
    let seen: Log = Log::default();
    let mut fabrics = fabrics.into_iter();
    let (f0, f1) = (fabrics.next().expect("fabric 0"), fabrics.next().expect("fabric 1"));
    let (c, log) = (Arc::clone(&cell), Arc::clone(&seen));
    let upcall = move |batch: DeliveryBatch<'_>| {
        for m in batch.messages {
            log.lock().expect("log").push((m.sender, m.seq, m.payload.to_vec()));
            if m.payload == b"ping" {
                let node = c.lock().expect("cell").clone().expect("node 0 is set before the ping");
                node.send(0, b"pong").expect("a send from the upcall");
            }
        }
    };
    let node0 = Arc::new(MulticastNode::start(f0, groups[0].clone(), ThreadConfig::default(), upcall).expect("start"));
    *cell.lock().expect("cell") = Some(Arc::clone(&node0));
    let node1 =
        MulticastNode::start(f1, groups[1].clone(), ThreadConfig::default(), |_: DeliveryBatch<'_>| {}).expect("start");
    node1.send(0, b"ping").expect("send");
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().expect("log").len() < 2 {
        assert!(Instant::now() < deadline, "the pong never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    let payloads: Vec<Vec<u8>> = seen.lock().expect("log").iter().map(|e| e.2.clone()).collect();
    assert_eq!(payloads, vec![b"ping".to_vec(), b"pong".to_vec()]);
    // Break the cycle node0 -> upcall -> cell -> node0 before stopping.
    cell.lock().expect("cell").take();
    node1.stop().expect("stop");
    Arc::into_inner(node0).expect("only owner").stop().expect("stop");
}

#[test]
fn a_stopped_member_is_detected_and_the_others_run_the_next_view_with_the_same_messages() {
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-view-{}", std::process::id())));
    // Generous detection so that a descheduled thread on a busy machine is not taken for dead.
    let detection = FailureDetection::new(1_000_000, 2_000_000_000, 3, 0);
    let (_groups, mut nodes, logs) = detected_group(&dir, 3, detection);
    for i in 0..300u32 {
        let node = &nodes[(i % 3) as usize];
        let deadline = Instant::now() + Duration::from_secs(60);
        while node.send(0, &i.to_le_bytes()).is_err() {
            assert!(Instant::now() < deadline, "window never freed");
            std::thread::yield_now();
        }
    }
    // Member 2 stops (its fabric closes): 0 and 1 must wedge, clean up and agree.
    nodes.pop().expect("member 2").stop().expect("stop");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !nodes.iter().all(|n| n.view().0 == 1 && n.phase() == Phase::Running) {
        assert!(
            Instant::now() < deadline,
            "the next view does not run: {:?}",
            nodes.iter().map(|n| (n.view(), n.phase())).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for node in &nodes {
        assert_eq!(node.view(), (1, vec![NodeId(0), NodeId(1)]));
    }
    // Sends queued in the outbox during the change go out in view 1 (node 2's are lost with
    // it): wait until the survivors' logs settle to one (they must be equal).
    while *logs[0].lock().expect("log") != *logs[1].lock().expect("log") {
        assert!(Instant::now() < deadline, "the survivors' deliveries differ");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (l0, l2) = (logs[0].lock().expect("log").clone(), logs[2].lock().expect("log").clone());
    assert!(l2.len() <= l0.len() && l2[..] == l0[..l2.len()], "and everything the stopped member delivered");
    // The survivors go on in the new view (behind what was still queued).
    nodes[0].send(0, b"next view").expect("send in view 1");
    let has = |l: &Log| l.lock().expect("log").iter().filter(|e| e.2 == b"next view").count();
    while has(&logs[0]) == 0 || has(&logs[1]) == 0 {
        assert!(Instant::now() < deadline, "no delivery in the new view");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!((has(&logs[0]), has(&logs[1])), (1, 1), "delivered once at each survivor");
    for node in nodes {
        node.stop().expect("stop");
    }
}

#[test]
fn a_joiner_that_asks_itself_gets_in_without_a_proposer() {
    // No member proposes the joiner (as when its proposer failed before anyone saw the
    // request): it leaves its request in a member's mailbox after its timeout, and the group
    // lets it in.
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-ask-{}", std::process::id())));
    let detection = FailureDetection::new(1_000_000, 2_000_000_000, 3, 1024);
    let (groups, nodes, _logs) = detected_group(&dir, 2, detection);
    let template = GroupConfig { me: NodeId(2), ..groups[0].clone() };
    let fabric = shm_fabric(&dir.0, &template).expect("joiner fabric");
    let joiner = MulticastNode::join_asking(
        fabric,
        template,
        &[0],
        Duration::from_millis(5),
        Duration::from_secs(60),
        ThreadConfig::default(),
        |_: DeliveryBatch<'_>| {},
    )
    .expect("join");
    joiner.wait_joined().expect("the joiner gets in");
    let all = [&nodes[0], &nodes[1], &joiner];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all.iter().all(|n| n.view().0 == 1 && n.phase() == Phase::Running) {
        assert!(
            Instant::now() < deadline,
            "the joiner never got in: {:?}",
            all.iter().map(|n| (n.view(), n.phase())).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for node in all {
        assert_eq!(node.view(), (1, vec![NodeId(0), NodeId(1), NodeId(2)]));
    }
    joiner.stop().expect("stop");
    for node in nodes {
        node.stop().expect("stop");
    }
}

#[test]
fn a_joiner_that_nobody_proposes_and_that_does_not_ask_gives_up_and_says_why() {
    // As when its proposer failed before anyone saw the request, and it does not ask itself:
    // it stops after its bound with a typed error instead of joining for good.
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-give-up-{}", std::process::id())));
    let detection = FailureDetection::new(1_000_000, 2_000_000_000, 3, 1024);
    let (groups, nodes, _logs) = detected_group(&dir, 2, detection);
    let template = GroupConfig { me: NodeId(2), ..groups[0].clone() };
    let fabric = shm_fabric(&dir.0, &template).expect("joiner fabric");
    let give_up_after = Duration::from_millis(200);
    let joiner =
        MulticastNode::join(fabric, template, give_up_after, ThreadConfig::default(), |_: DeliveryBatch<'_>| {})
            .expect("join");
    let waited = match joiner.wait_joined() {
        Err(MulticastNodeError::Multicast(MulticastError::JoinTimedOut { waited_ns, asks: 0 })) => waited_ns,
        other => panic!("the joiner should have given up: {other:?}"),
    };
    assert!(waited >= 200_000_000, "not before its bound: {waited} ns");
    assert!(matches!(joiner.failure(), Some(MulticastError::JoinTimedOut { .. })));
    assert!(matches!(joiner.stop(), Err(MulticastNodeError::Multicast(MulticastError::JoinTimedOut { .. }))));
    for node in nodes {
        assert_eq!(node.view(), (0, vec![NodeId(0), NodeId(1)]), "the group never changed");
        node.stop().expect("stop");
    }
}

#[test]
fn a_member_whose_view_lost_its_majority_stops_and_says_why() {
    // Two of three members stop: the third cannot install a view without them, and stops
    // with the members it suspects instead of staying wedged for good.
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-mcast-majority-{}", std::process::id())));
    let detection = FailureDetection::new(1_000_000, 500_000_000, 3, 1024);
    let (_groups, mut nodes, _logs) = detected_group(&dir, 3, detection);
    for _ in 0..2 {
        nodes.pop().expect("a member").stop().expect("stop");
    }
    let survivor = nodes.pop().expect("member 0");
    let deadline = Instant::now() + Duration::from_secs(60);
    while survivor.failure().is_none() {
        assert!(Instant::now() < deadline, "member 0 never stopped: {:?}", survivor.phase());
        std::thread::sleep(Duration::from_millis(1));
    }
    let expected = MulticastError::MajorityLost {
        epoch: 0,
        members: vec![NodeId(0), NodeId(1), NodeId(2)],
        suspected: vec![NodeId(1), NodeId(2)],
    };
    assert_eq!(survivor.failure(), Some(expected.clone()));
    assert_eq!(survivor.view().0, 0, "no view without a majority");
    assert!(matches!(survivor.send(0, b"x"), Err(MulticastSendError::Stopped)));
    assert!(matches!(survivor.stop(), Err(MulticastNodeError::Multicast(e)) if e == expected));
}
