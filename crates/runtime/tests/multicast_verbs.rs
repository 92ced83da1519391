//! Multicast over the verbs fabric (a build with the `verbs` feature:
//! `cargo test -p microrep --features verbs --test multicast_verbs`). Without an RDMA device the
//! test skips, unless `MICROREP_REQUIRE_RDMA=1` (the soft-RoCE VM slice, scripts/verbs-test.sh,
//! sets it). Three members, each a poll thread with its own verbs node, deliver one order; then
//! one stops and the other two detect it, revoke its write access over RDMA, agree on the next
//! view and deliver in it.
#![cfg(feature = "verbs")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use microrep::config::ThreadConfig;
use microrep::multicast::{MulticastNode, MulticastSendError, verbs_fabric};
use microrep_core::multicast::{DeliveryBatch, FailureDetection, GroupConfig, Phase, SendError};
use microrep_fabric::NodeId;
use microrep_fabric::verbs::{PeerTable, skip_reason};

type Log = Arc<Mutex<Vec<Vec<u8>>>>;

/// Polls `done` until it holds, failing with `what` after two minutes (the VM emulates its CPUs).
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn three_members_over_verbs_deliver_one_order_and_run_the_next_view_without_a_stopped_one() {
    if let Some(why) = skip_reason() {
        eprintln!("{why}");
        return;
    }
    // A member silent for 3 s is taken for failed: generous for a VM emulating its CPUs.
    let detection = FailureDetection::new(1_000_000, 3_000_000_000, 3, 0);
    let members: Vec<NodeId> = (0..3).map(NodeId).collect();
    let groups: Vec<GroupConfig> = members
        .iter()
        .map(|&me| GroupConfig {
            failure_detection: Some(detection),
            ..GroupConfig::single(me, members.clone(), 8, 64)
        })
        .collect();
    let peers = PeerTable::new();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let fabrics: Vec<_> = groups.iter().map(|g| verbs_fabric(any, peers.clone(), g).expect("verbs fabric")).collect();
    let logs: Vec<Log> = groups.iter().map(|_| Log::default()).collect();
    let mut nodes: Vec<MulticastNode> = fabrics
        .into_iter()
        .zip(groups)
        .zip(&logs)
        .map(|((fabric, group), log)| {
            let log = Arc::clone(log);
            let upcall = move |batch: DeliveryBatch<'_>| {
                log.lock().expect("log").extend(batch.messages.iter().map(|m| m.payload.to_vec()));
            };
            MulticastNode::start(fabric, group, ThreadConfig::default(), upcall).expect("start")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..300u32 {
        let node = &nodes[(i % 3) as usize];
        loop {
            match node.send(0, &i.to_le_bytes()) {
                Ok(()) => break,
                Err(MulticastSendError::Send(SendError::WindowFull(_))) => {
                    assert!(Instant::now() < deadline, "the window never freed");
                    std::thread::yield_now();
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    let len = |l: &Log| l.lock().expect("log").len();
    wait_for("every member delivers all 300 messages", || logs.iter().all(|l| len(l) == 300));
    let first = logs[0].lock().expect("log").clone();
    for log in &logs[1..] {
        assert_eq!(*log.lock().expect("log"), first, "one order at every member");
    }
    nodes.pop().expect("member 2").stop().expect("stop");
    wait_for("members 0 and 1 run view 1", || nodes.iter().all(|n| n.view().0 == 1 && n.phase() == Phase::Running));
    for node in &nodes {
        assert_eq!(node.view(), (1, vec![NodeId(0), NodeId(1)]));
    }
    nodes[1].send(0, b"next view").expect("send in view 1");
    let has = |l: &Log| l.lock().expect("log").iter().any(|p| p == b"next view");
    wait_for("both deliver in view 1", || has(&logs[0]) && has(&logs[1]));
    assert_eq!(*logs[0].lock().expect("log"), *logs[1].lock().expect("log"));
    for node in nodes {
        node.stop().expect("stop");
    }
}
