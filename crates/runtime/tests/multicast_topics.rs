//! Pub/sub topics on shm, one test per promise: unordered (each publisher's order, all of
//! them), atomic (one order everywhere), volatile storage (a late joiner gets the history
//! first), logged storage (a restarted member replays its log first).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use microrep::multicast::MulticastSendError;
use microrep::multicast::shm_fabric;
use microrep::multicast_topics::{Qos, TopicError, TopicEvent, TopicNode, TopicSpec, topic_group};
use microrep_core::multicast::{FailureDetection, SendError};
use microrep_fabric::NodeId;

/// (topic, publisher, payload, replayed)
type Seen = Arc<Mutex<Vec<(String, Option<NodeId>, Vec<u8>, bool)>>>;

/// Removes a directory when the test ends, passing or not.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    Dir(PathBuf::from(format!("/dev/shm/microrep-topics-{name}-{}", std::process::id())))
}

fn detection() -> FailureDetection {
    // Generous: a descheduled thread on a busy machine is not taken for dead.
    FailureDetection::new(1_000_000, 5_000_000_000, 4, 1 << 16)
}

fn start(
    shm: &Dir,
    logs: Option<&PathBuf>,
    me: u16,
    members: &[u16],
    topics: &[TopicSpec],
    join: bool,
) -> (TopicNode, Seen) {
    let members: Vec<NodeId> = members.iter().map(|&m| NodeId(m)).collect();
    let group = topic_group(NodeId(me), members, topics, detection()).expect("group");
    let fabric = shm_fabric(&shm.0, &group).expect("fabric");
    let seen = Seen::default();
    let log = Arc::clone(&seen);
    let handler = move |event: TopicEvent<'_>| {
        if let TopicEvent::Message { topic, publisher, payload, replayed } = event {
            log.lock().expect("seen").push((topic.to_string(), publisher, payload.to_vec(), replayed));
        }
    };
    // A joiner that is not in after two minutes stops with an error instead of waiting.
    let join = join.then_some(Duration::from_secs(120));
    let node = TopicNode::start(fabric, group, topics, logs.map(|l| l.join(me.to_string())).as_deref(), join, handler)
        .expect("topic node");
    (node, seen)
}

/// Starts every member of `members` (fabrics are created inside, each before its node, and a
/// node connects to peers with a timeout, so they may start in turn).
fn start_all(shm: &Dir, logs: Option<&PathBuf>, members: &[u16], topics: &[TopicSpec]) -> Vec<(TopicNode, Seen)> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            members.iter().map(|&m| s.spawn(move || start(shm, logs, m, members, topics, false))).collect();
        handles.into_iter().map(|h| h.join().expect("start")).collect()
    })
}

fn publish(node: &TopicNode, topic: &str, payload: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match node.publish(topic, payload) {
            Ok(()) => return,
            Err(TopicError::Send(MulticastSendError::Send(SendError::WindowFull(_)))) => {
                assert!(Instant::now() < deadline, "the outbox never drained");
                std::thread::yield_now();
            }
            Err(e) => panic!("publish: {e}"),
        }
    }
}

fn of(seen: &Seen, topic: &str) -> Vec<(Option<NodeId>, Vec<u8>, bool)> {
    seen.lock().expect("seen").iter().filter(|e| e.0 == topic).map(|e| (e.1, e.2.clone(), e.3)).collect()
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn unordered_atomic_and_volatile_topics_keep_their_promises_and_a_joiner_gets_the_history() {
    let shm = dir("qos");
    let topics = [
        TopicSpec::new("u", Qos::Unordered),
        TopicSpec::new("a", Qos::Atomic),
        TopicSpec::new("v", Qos::VolatileStorage),
    ];
    let nodes = start_all(&shm, None, &[0, 1, 2], &topics);
    std::thread::scope(|s| {
        for (i, (node, _)) in nodes.iter().enumerate() {
            s.spawn(move || {
                for n in 0..40u8 {
                    for topic in ["u", "a", "v"] {
                        publish(node, topic, &[i as u8, n]);
                    }
                }
            });
        }
    });
    for topic in ["u", "a", "v"] {
        wait_for(topic, || nodes.iter().all(|(_, seen)| of(seen, topic).len() == 120));
    }
    let first = |topic| of(&nodes[0].1, topic);
    for (_, seen) in &nodes {
        assert_eq!(of(seen, "a"), first("a"), "atomic: one order everywhere");
        assert_eq!(of(seen, "v"), first("v"), "volatile: one order everywhere");
        for publisher in 0..3u8 {
            let mine: Vec<u8> = of(seen, "u").iter().filter(|e| e.1[0] == publisher).map(|e| e.1[1]).collect();
            assert_eq!(mine, (0..40).collect::<Vec<u8>>(), "unordered: each publisher's messages, in its order");
        }
    }
    // A late joiner: the volatile topic's history first (replayed), then new messages.
    let (joiner, joined) = std::thread::scope(|s| {
        // The joiner's template lists it; its view comes from the members.
        let handle = s.spawn(|| start(&shm, None, 3, &[0, 1, 2, 3], &topics, true));
        nodes[1].0.propose_join(NodeId(3)).expect("propose");
        handle.join().expect("joiner")
    });
    joiner.node().wait_joined().expect("the joiner gets in");
    wait_for("the joiner's history", || of(&joined, "v").len() == 120);
    let history: Vec<Vec<u8>> = of(&joined, "v").iter().map(|e| e.1.clone()).collect();
    assert_eq!(history, first("v").iter().map(|e| e.1.clone()).collect::<Vec<_>>());
    assert!(of(&joined, "v").iter().all(|e| e.2 && e.0.is_none()), "history is marked replayed");
    assert!(of(&joined, "a").is_empty(), "an atomic topic keeps no history");
    wait_for("the joiner to run", || {
        joiner.node().view().1.contains(&NodeId(3)) && nodes.iter().all(|(n, _)| n.node().view().1.len() == 4)
    });
    publish(&nodes[2].0, "v", b"after");
    wait_for("the new message", || of(&joined, "v").len() == 121);
    assert_eq!(of(&joined, "v")[120], (Some(NodeId(2)), b"after".to_vec(), false));
    joiner.stop().expect("stop");
    for (node, _) in nodes {
        node.stop().expect("stop");
    }
}

#[test]
fn a_logged_topic_is_synced_before_delivery_and_replayed_after_a_restart() {
    let logs = dir("logs");
    let topics = [TopicSpec::new("l", Qos::LoggedStorage)];
    let first_run = dir("run1");
    let nodes = start_all(&first_run, Some(&logs.0), &[0, 1], &topics);
    for n in 0..20u8 {
        publish(&nodes[(n % 2) as usize].0, "l", &[n]);
    }
    wait_for("delivery", || nodes.iter().all(|(_, seen)| of(seen, "l").len() == 20));
    let delivered: Vec<Vec<u8>> = of(&nodes[0].1, "l").iter().map(|e| e.1.clone()).collect();
    for (node, _) in nodes {
        node.stop().expect("stop");
    }
    // Everything delivered was on disk first: a fresh group on the same logs replays it.
    let second_run = dir("run2");
    let nodes = start_all(&second_run, Some(&logs.0), &[0, 1], &topics);
    for (_, seen) in &nodes {
        let replayed = of(seen, "l");
        assert_eq!(replayed.iter().map(|e| e.1.clone()).collect::<Vec<_>>(), delivered);
        assert!(replayed.iter().all(|e| e.2), "replayed from the log");
    }
    publish(&nodes[0].0, "l", b"new");
    wait_for("a new message", || nodes.iter().all(|(_, seen)| of(seen, "l").len() == 21));
    for (node, _) in nodes {
        node.stop().expect("stop");
    }
    assert!(matches!(TopicSpec::parse("l=durable"), Err(TopicError::BadQos(_))));
}
