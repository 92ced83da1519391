//! Nodes of one process on the shm fabric: proposals in both attach modes, batching,
//! convergence, fail-over when the leader stops, and the cluster-fingerprint check.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use microrep::config::{AttachMode, ClusterConfig, NodeConfig};
use microrep::events::NodeEvent;
use microrep::{Apply, Committed, Config, Configuration, Index, MembershipChange, Node, NodeId, ProposeError};

/// Appends every command to a journal the test can inspect and replies with the command's
/// position in it; digest = (length, CRC of the journal).
#[derive(Default)]
struct Journal {
    entries: Arc<Mutex<Vec<Vec<u8>>>>,
    crc: u32,
}

impl Apply for Journal {
    fn apply(&mut self, _index: Index, command: &[u8], reply: &mut Vec<u8>) {
        let mut entries = self.entries.lock().expect("journal");
        entries.push(command.to_vec());
        self.crc = microrep_fabric::checksum::crc32c_append(self.crc, command);
        reply.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        for e in self.entries.lock().expect("journal").iter() {
            out.extend_from_slice(&(e.len() as u32).to_le_bytes());
            out.extend_from_slice(e);
        }
    }

    fn restore(&mut self, mut s: &[u8]) -> Result<(), microrep::RestoreError> {
        let bad = |why: &str| microrep::RestoreError::Application(why.into());
        let mut entries = self.entries.lock().expect("journal");
        entries.clear();
        self.crc = 0;
        while let Some((len, rest)) = s.split_at_checked(4) {
            let len = u32::from_le_bytes(len.try_into().map_err(|_| bad("len"))?) as usize;
            let (e, rest) = rest.split_at_checked(len).ok_or_else(|| bad("truncated"))?;
            entries.push(e.to_vec());
            self.crc = microrep_fabric::checksum::crc32c_append(self.crc, e);
            s = rest;
        }
        Ok(())
    }

    fn digest(&self) -> Option<u64> {
        Some((self.entries.lock().expect("journal").len() as u64) << 32 | u64::from(self.crc))
    }
}

/// A local cluster of `replicas` named after `name` and this process, on shm in its own
/// directory (removed when the `Dir` is dropped).
fn local_config(name: &str, replicas: u16) -> (ClusterConfig, Dir) {
    let name = format!("{name}-{}", std::process::id());
    let mut config = ClusterConfig::local(&name, replicas, 1);
    let dir = microrep_fabric::shm::ShmConfig::default_dir(&name);
    config.shm_dir = Some(dir.clone());
    (config, Dir(dir))
}

/// A cluster directory removed at the end of the test.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Shared = Arc<Mutex<Vec<Vec<u8>>>>;

/// Nodes of one cluster, their journals, and what clients were told.
struct TestCluster {
    config: ClusterConfig,
    nodes: Vec<Option<Node>>,
    journals: Vec<Shared>,
    /// Committed commands with the journal position their reply named.
    acked: Vec<(Vec<u8>, u64)>,
    /// Commands whose outcome is unknown: each may be in the journal at most once.
    unknown: Vec<Vec<u8>>,
    _dir: Dir,
}

impl TestCluster {
    fn new(name: &str, replicas: u16, mode: AttachMode) -> Self {
        let (mut config, dir) = local_config(name, replicas);
        // Tests run in parallel in debug builds on small, busy machines: a replica descheduled
        // for tens of milliseconds should rarely look dead. (When it does, leadership changes
        // and some outcomes become unknown, which the checks below allow.)
        config.timing.heartbeat_us = 5000;
        Self::with_config(config, mode, dir)
    }

    fn with_config(config: ClusterConfig, mode: AttachMode, dir: Dir) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let mut cluster =
            Self { nodes: Vec::new(), journals: Vec::new(), acked: Vec::new(), unknown: Vec::new(), config, _dir: dir };
        for id in 0..cluster.config.members.len() as u16 {
            let node = cluster.start(id, &cluster.config.clone(), mode);
            cluster.nodes.push(Some(node));
        }
        cluster
    }

    fn start(&mut self, id: u16, cluster: &ClusterConfig, mode: AttachMode) -> Node {
        let journal = Journal::default();
        self.journals.push(Arc::clone(&journal.entries));
        std::fs::create_dir_all(&self._dir.0).expect("cluster directory");
        let events = Some(self._dir.0.join(format!("node-{id}.events.jsonl")));
        let node = NodeConfig { mode, events, ..NodeConfig::new(id) };
        microrep::start_on_shm(&Config { cluster: cluster.clone(), node }, journal).expect("start node")
    }

    /// Proposes through whichever node leads, following redirects; `None` if the outcome is
    /// unknown.
    fn propose(&mut self, command: &[u8]) -> Option<Committed> {
        let mut at = self.nodes.iter().position(Option::is_some).expect("a live node");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "no leader committed {command:?}");
            let Some(node) = &self.nodes[at] else {
                at = (at + 1) % self.nodes.len();
                continue;
            };
            let outcome = node.propose(command);
            if let Some(c) = self.record(command, outcome.clone()) {
                return Some(c);
            }
            match outcome {
                Err(ProposeError::NotLeader { leader: Some(l) }) => at = usize::from(l.0),
                Err(ProposeError::NotLeader { leader: None } | ProposeError::Backlogged) => std::thread::yield_now(),
                Err(e) if e.outcome_unknown() => return None,
                other => panic!("proposing {command:?}: {other:?}"),
            }
        }
    }

    /// Notes what a client learnt of `command`.
    fn record(&mut self, command: &[u8], outcome: Result<Committed, ProposeError>) -> Option<Committed> {
        match outcome {
            Ok(c) => {
                let position = u64::from_le_bytes(c.reply.as_slice().try_into().expect("8-byte reply"));
                self.acked.push((command.to_vec(), position));
                Some(c)
            }
            Err(e) if e.outcome_unknown() => {
                self.unknown.push(command.to_vec());
                None
            }
            Err(_) => None,
        }
    }

    fn leader(&self) -> &Node {
        let mut found = None;
        eventually("a leader", || {
            found = self.nodes.iter().flatten().find(|n| n.leader() == Some(n.id()));
            found.is_some()
        });
        found.expect("leader")
    }

    /// Waits until every live replica holds the same journal, then checks it against what
    /// clients were told: every acked command once, at the position its reply named; every
    /// unknown one at most once; nothing else.
    fn check(&self) {
        let live: Vec<&Shared> =
            self.nodes.iter().zip(&self.journals).filter(|(n, _)| n.is_some()).map(|(_, j)| j).collect();
        let snapshot = |j: &Shared| j.lock().expect("journal").clone();
        eventually("convergence", || {
            let first = snapshot(live[0]);
            first.len() >= self.acked.len() && live.iter().all(|j| snapshot(j) == first)
        });
        let journal = snapshot(live[0]);
        for (command, position) in &self.acked {
            assert_eq!(journal.iter().filter(|c| *c == command).count(), 1, "acked {command:?} not applied once");
            assert_eq!(&journal[*position as usize - 1], command, "reply named the wrong position");
        }
        for command in &journal {
            let acked = self.acked.iter().any(|(c, _)| c == command);
            let unknown = self.unknown.iter().filter(|c| *c == command).count();
            assert!(acked || unknown > 0, "{command:?} was applied but never proposed");
            assert!(journal.iter().filter(|c| *c == command).count() <= 1, "{command:?} applied twice");
        }
    }
}

/// Waits (bounded) until `done` holds.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// An idle cluster rests between heartbeats (`cluster.timing.idle_heartbeat_us`), and a
/// proposal puts its leader back to a heartbeat every period before it is committed. (With
/// 20 ms heartbeats a rest needs 16 quiet ones, so the check right after the commit has 320 ms
/// of margin on a busy machine.)
#[test]
fn an_idle_cluster_rests_between_heartbeats_and_a_proposal_wakes_its_leader() {
    let (mut config, dir) = local_config("idle", 3);
    config.timing.heartbeat_us = 20_000;
    config.timing.idle_heartbeat_us = Some(60_000);
    let mut c = TestCluster::with_config(config, AttachMode::Handover, dir);
    c.propose(b"first").expect("committed");
    eventually("every node rests", || c.nodes.iter().flatten().all(Node::resting));
    assert!(c.nodes.iter().flatten().all(|n| n.status().resting), "the status says so");
    let leader = usize::from(c.leader().id().0);
    let committed = c.nodes[leader].as_ref().expect("leader").propose(b"second");
    assert!(c.record(b"second", committed).is_some(), "committed by the resting leader");
    assert!(!c.nodes[leader].as_ref().expect("leader").resting(), "the proposal woke the leader's heartbeats");
    c.check();
}

#[test]
fn direct_mode_commits_in_order_and_replicas_converge() {
    let mut c = TestCluster::new("direct", 3, AttachMode::Direct);
    for i in 0..500u64 {
        if let Some(done) = c.propose(&i.to_le_bytes()) {
            assert_eq!(done.index.position, 0, "direct mode proposes one command per entry");
        }
    }
    assert!(!c.acked.is_empty());
    c.check();
}

/// `microrep::events`: each node reports its start and every entry it applied (the same
/// entries, by digest, on every replica).
#[test]
fn every_node_reports_its_start_and_the_entries_it_applied() {
    let mut c = TestCluster::new("events", 3, AttachMode::Direct);
    for i in 0..50u64 {
        c.propose(&i.to_le_bytes());
    }
    c.check();
    let dir = c._dir.0.clone();
    let paths: Vec<_> = (0..3).map(|id| dir.join(format!("node-{id}.events.jsonl"))).collect();
    c.nodes.iter_mut().for_each(|n| drop(n.take()));
    let mut applied: Vec<Vec<(u64, Option<String>)>> = Vec::new();
    for (id, path) in paths.iter().enumerate() {
        let events = microrep::events::read(path).expect("events");
        assert_eq!(events[0], NodeEvent::Start { node: id as u16, pid: std::process::id() }, "node {id}");
        let mine: Vec<(u64, Option<String>)> = events
            .into_iter()
            .filter_map(|e| match e {
                NodeEvent::Applied { index, digest } => Some((index, digest)),
                _ => None,
            })
            .collect();
        assert!(mine.windows(2).all(|w| w[1].0 == w[0].0 + 1), "node {id} applies consecutive indices");
        assert!(mine.iter().filter(|(_, d)| d.is_some()).count() >= c.acked.len(), "node {id} applied every command");
        applied.push(mine);
    }
    let shortest = applied.iter().map(Vec::len).min().expect("three nodes");
    assert!(applied.iter().all(|a| a[..shortest] == applied[0][..shortest]), "the replicas applied the same entries");
}

#[test]
fn handover_mode_batches_concurrent_proposals() {
    let mut c = TestCluster::new("handover", 3, AttachMode::Handover);
    c.propose(b"first");
    let leader = c.leader();
    // Eight threads with 32 outstanding proposals each: the replication thread finds many
    // waiting at once and packs them into shared entries.
    let outcomes: Vec<(Vec<u8>, Result<Committed, ProposeError>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8u8)
            .map(|t| {
                s.spawn(move || {
                    let mut outcomes = Vec::new();
                    for round in 0..10u8 {
                        let pending: Vec<_> = (0..32u8)
                            .filter_map(|i| {
                                let command = vec![t, round, i];
                                leader.submit(&command).ok().map(|p| (command, p))
                            })
                            .collect();
                        outcomes.extend(pending.into_iter().map(|(command, p)| (command, p.wait())));
                    }
                    outcomes
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("worker")).collect()
    });
    let batched = outcomes.iter().filter(|(_, o)| o.as_ref().is_ok_and(|c| c.index.position > 0)).count();
    assert!(batched > 0, "no two proposals ever shared an entry");
    for (command, outcome) in outcomes {
        c.record(&command, outcome);
    }
    c.check();
}

/// `Node::submit_batch`: a batch commits as one entry whose commands the journal holds in
/// the batch's order, each with its own reply, in both modes and (handover) mixed with single
/// proposals that the replication thread batches around it.
#[test]
fn a_batch_commits_as_one_entry_with_every_reply_among_single_proposals() {
    for mode in [AttachMode::Direct, AttachMode::Handover] {
        let mut c = TestCluster::new(&format!("batch-{mode:?}"), 3, mode);
        c.propose(b"first");
        let leader = c.leader();
        type Outcomes = Vec<(Vec<Vec<u8>>, Result<microrep::BatchCommitted, ProposeError>)>;
        let (singles, batches): (Vec<_>, Outcomes) = std::thread::scope(|s| {
            let singles = s.spawn(|| {
                let pending: Vec<_> =
                    (0..64u8).filter_map(|i| leader.submit(&[b's', i]).ok().map(|p| (i, p))).collect();
                pending.into_iter().map(|(i, p)| (vec![b's', i], p.wait())).collect::<Vec<_>>()
            });
            let batches = (0..20u8)
                .map(|round| {
                    let commands: Vec<Vec<u8>> = (0..50u8).map(|i| vec![b'b', round, i]).collect();
                    let outcome = leader.propose_batch(commands.iter().map(Vec::as_slice));
                    (commands, outcome)
                })
                .collect();
            (singles.join().expect("singles"), batches)
        });
        for (command, outcome) in singles {
            c.record(&command, outcome);
        }
        for (commands, mut outcome) in batches {
            // Leadership may move on a busy machine: a refused batch (none of it committed) is
            // made again at the replica that leads now.
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Err(ProposeError::NotLeader { .. } | ProposeError::Backlogged) = outcome {
                assert!(Instant::now() < deadline, "{mode:?}: no leader took a batch");
                outcome = c.leader().propose_batch(commands.iter().map(Vec::as_slice));
            }
            match outcome {
                Ok(batch) => {
                    assert_eq!(batch.len(), commands.len());
                    let replies: Vec<_> = batch.iter().collect();
                    assert_eq!(replies.len(), commands.len(), "one reply per command");
                    let first = u64::from_le_bytes(replies[0].1.try_into().expect("8-byte reply"));
                    for (position, (command, (index, reply))) in commands.iter().zip(replies).enumerate() {
                        assert_eq!(index, Index { entry: batch.entry(), position: position as u32 });
                        let at = u64::from_le_bytes(reply.try_into().expect("8-byte reply"));
                        assert_eq!(at, first + position as u64, "a batch applies as one run of commands");
                        c.record(command, Ok(Committed { index, reply: reply.to_vec() }));
                    }
                }
                Err(e) if e.outcome_unknown() => c.unknown.extend(commands),
                Err(e) => panic!("{mode:?}: batch refused: {e}"),
            }
        }
        c.check();
    }
}

#[test]
fn oversized_overfull_and_empty_batches_are_handled_without_harm() {
    let mut c = TestCluster::new("batch-limits", 1, AttachMode::Handover);
    c.propose(b"warm up");
    let max = c.leader().max_entry_bytes();
    let big = vec![7u8; max / 2];
    let leader = c.leader();
    let refused = leader.submit_batch([big.as_slice(), big.as_slice()]).map(|_| ());
    assert!(matches!(refused, Err(ProposeError::TooLarge { len, max: m }) if len > max && m == max), "{refused:?}");
    let overfull = vec![&b""[..]; 65_536];
    assert_eq!(
        leader.submit_batch(overfull).map(|_| ()),
        Err(ProposeError::TooManyCommands { count: 65_536, max: 65_535 })
    );
    let empty = leader.propose_batch([]).expect("an empty batch commits");
    assert!(empty.is_empty() && empty.iter().next().is_none(), "{empty:?}");
    let fits = vec![&big[..max / 2 - 16]];
    let one = leader.propose_batch(fits).expect("a batch that fits commits");
    assert_eq!(one.len(), 1);
    let (index, reply) = one.iter().next().expect("its reply");
    c.record(&big[..max / 2 - 16], Ok(Committed { index, reply: reply.to_vec() }));
    c.propose(b"after");
    assert_eq!(c.acked.len(), 3);
    c.check();
}

#[test]
fn a_stopped_leader_is_replaced_and_no_commit_is_lost() {
    let mut c = TestCluster::new("failover", 3, AttachMode::Handover);
    for i in 0..100u64 {
        c.propose(&i.to_le_bytes());
    }
    let old = c.leader().id();
    c.nodes[usize::from(old.0)].take().expect("leader").shutdown();
    for i in 100..200u64 {
        c.propose(&i.to_le_bytes());
    }
    let new = c.leader();
    assert_ne!(new.id(), old);
    assert!(new.status().leader_changes.iter().any(|change| change.leader == new.id().0));
    c.check();
}

/// `Node::unpark_on_change`: a thread that watches a follower parks until the follower's
/// leader changes (it parks an hour at a time, so without the unpark this test hangs).
#[test]
fn a_watching_thread_is_unparked_when_its_nodes_leader_changes() {
    let mut c = TestCluster::new("watch", 3, AttachMode::Handover);
    c.propose(b"first");
    let old = c.leader().id();
    let follower = (0..3).find(|&i| i != usize::from(old.0)).expect("a follower");
    eventually("the follower knows the leader", || c.nodes[follower].as_ref().expect("follower").leader() == Some(old));
    let leader = c.nodes[usize::from(old.0)].take().expect("leader");
    let watched = c.nodes[follower].as_ref().expect("follower");
    std::thread::scope(|scope| {
        let (ready, registered) = std::sync::mpsc::channel();
        let watcher = scope.spawn(move || {
            watched.unpark_on_change(std::thread::current());
            ready.send(()).expect("the test waits");
            while watched.leader() == Some(old) {
                std::thread::park_timeout(std::time::Duration::from_secs(3600));
            }
        });
        registered.recv().expect("the watcher registered");
        leader.shutdown();
        watcher.join().expect("the watcher saw the new leader");
    });
    assert_ne!(c.nodes[follower].as_ref().expect("follower").leader(), Some(old));
}

#[test]
fn a_leader_that_stops_being_a_candidate_steps_aside_and_keeps_applying() {
    let mut c = TestCluster::new("abstain", 3, AttachMode::Direct);
    for i in 0..50u64 {
        c.propose(&i.to_le_bytes());
    }
    let old = c.leader().id();
    let claims =
        |c: &TestCluster, id: NodeId| c.nodes[usize::from(id.0)].as_ref().is_some_and(|n| n.leader() == Some(id));
    c.nodes[usize::from(old.0)].as_ref().expect("leader").set_candidate(false);
    // Both sides of the hand-over: `TestCluster::leader` takes the first replica that claims to
    // lead, which would be the abstainer for as long as its own view still names itself.
    eventually("another leader, and the abstainer no longer leading", || {
        c.nodes.iter().flatten().any(|n| n.id() != old && n.leader() == Some(n.id())) && !claims(&c, old)
    });
    for i in 50..150u64 {
        c.propose(&i.to_le_bytes());
    }
    assert!(!claims(&c, old), "the replica that abstains does not lead again");
    assert_ne!(c.leader().id(), old);
    c.check();
}

#[test]
fn members_with_different_cluster_configs_refuse_to_run() {
    let (config, dir) = local_config("fingerprint", 2);
    let mut c = TestCluster::with_config(config.clone(), AttachMode::Handover, dir);
    // Restart member 1 with a different heartbeat.
    c.nodes[1].take().expect("node 1").shutdown();
    let mut other = config;
    other.timing.heartbeat_us += 1;
    let b = c.start(1, &other, AttachMode::Handover);
    let a = c.nodes[0].as_ref().expect("node 0");
    eventually("a fingerprint mismatch", || a.fatal().is_some() && b.fatal().is_some());
    let why = a.fatal().expect("fatal");
    assert!(why.contains("[cluster] configuration differs"), "{why}");
    assert_eq!(a.propose(b"x"), Err(ProposeError::Shutdown));
}

#[test]
fn oversized_commands_are_refused_without_harm() {
    let mut c = TestCluster::new("oversize", 1, AttachMode::Handover);
    c.propose(b"warm up");
    let big = vec![7u8; c.config.log.slot_bytes as usize];
    assert!(matches!(c.leader().propose(&big), Err(ProposeError::TooLarge { .. })));
    c.propose(b"after");
    assert_eq!(c.acked.len(), 2);
    c.check();
}

/// Asks the leader for `change` until it is in effect, proposing a command through the
/// cluster between attempts (a joiner catching up, a new term starting: the leader refuses
/// and the client asks again).
fn change_under_load(c: &mut TestCluster, change: MembershipChange, load: &mut u64) -> Configuration {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "{change} not done");
        *load += 1;
        c.propose(&load.to_le_bytes());
        match c.leader().change_membership(change) {
            Ok(configuration) => {
                let wanted = matches!(change, MembershipChange::Add(_));
                if configuration.members.contains(change.node()) == wanted {
                    return configuration;
                }
            }
            Err(ProposeError::Membership(why)) => {
                let retry = ["catching up", "not a follower", "not live", "under way", "starting its term"];
                assert!(retry.iter().any(|r| why.contains(r)), "{change} refused: {why}");
            }
            Err(e) => assert!(
                matches!(e, ProposeError::NotLeader { .. } | ProposeError::Timeout | ProposeError::Unknown),
                "{change}: {e}"
            ),
        }
    }
}

/// Issue 19 §1: a spare joins a running cluster and the leader leaves it, with commands
/// committed between every step; every acknowledged command is applied once, in the same order,
/// by every replica still running, the removed replica learns it was removed, and the
/// configuration is the same everywhere.
#[test]
fn a_spare_joins_and_the_leader_leaves_under_load() {
    let (mut config, dir) = local_config("membership", 4);
    config.timing.heartbeat_us = 5000;
    config.initial_members = Some(vec![0, 1, 2]);
    let mut c = TestCluster::with_config(config, AttachMode::Handover, dir);
    let mut load = 0u64;
    let added = change_under_load(&mut c, MembershipChange::Add(NodeId(3)), &mut load);
    assert_eq!(added.members.iter().map(|n| n.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
    let leaver = c.leader().id();
    let left = change_under_load(&mut c, MembershipChange::Remove(leaver), &mut load);
    assert!(!left.members.contains(leaver) && left.members.len() == 3);
    let removed = c.nodes[usize::from(leaver.0)].take().expect("the leaver runs");
    eventually("the leaver learns it was removed", || removed.removed_at().is_some());
    for _ in 0..50 {
        load += 1;
        c.propose(&load.to_le_bytes());
    }
    assert!(c.leader().id() != leaver, "a replica that left leads");
    c.check();
    eventually("every replica applied the configuration", || {
        c.nodes.iter().flatten().all(|n| n.configuration() == left)
    });
}
