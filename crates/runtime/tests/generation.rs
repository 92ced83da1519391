//! Cluster generations (`node.data_dir`): a cluster all of whose members restarted stops with
//! an error naming its generation instead of silently starting again empty; `force_new`
//! starts a new one; a member that restarts alone still recovers from its peers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use microrep::config::{ClusterConfig, NodeConfig};
use microrep::{Config, Node, ProposeError};

use microrep::Counter;

/// The shm segments and the members' data directories, removed at the end.
struct Cluster {
    config: ClusterConfig,
    root: PathBuf,
    nodes: Vec<Option<Node>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Cluster {
    fn new(name: &str) -> Self {
        let name = format!("gen-{name}-{}", std::process::id());
        let mut config = ClusterConfig::local(&name, 3, 1);
        let root = microrep_fabric::shm::ShmConfig::default_dir(&name);
        config.shm_dir = Some(root.join("shm"));
        config.timing.heartbeat_us = 5000;
        let mut c = Self { config, root, nodes: Vec::new() };
        c.nodes = (0..3).map(|id| Some(c.start(id, false))).collect();
        c
    }

    fn data_dir(&self, id: u16) -> PathBuf {
        self.root.join(format!("node-{id}"))
    }

    fn start(&self, id: u16, force_new: bool) -> Node {
        let node = NodeConfig { data_dir: Some(self.data_dir(id)), force_new, ..NodeConfig::new(id) };
        microrep::start_on_shm(&Config { cluster: self.config.clone(), node }, Counter::default()).expect("start")
    }

    /// Stops every member, then starts every member again (fresh memory).
    fn restart_all(&mut self, force_new: bool) {
        self.nodes.iter_mut().for_each(|n| drop(n.take()));
        self.nodes = (0..3).map(|id| Some(self.start(id, force_new))).collect();
    }

    /// Commits one increment through whichever member leads, and checks that the count it
    /// replies is `before` plus one, plus at most the attempts whose outcome was unknown (a
    /// leader change on a busy machine: each may or may not have been applied). The count.
    fn commit(&self, before: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut unknown = 0;
        loop {
            assert!(Instant::now() < deadline, "nothing committed");
            for node in self.nodes.iter().flatten() {
                match node.propose(b"+1") {
                    Ok(c) => {
                        let count = u64::from_le_bytes(c.reply.try_into().expect("8 bytes"));
                        assert!((before + 1..=before + 1 + unknown).contains(&count), "{count} after {before}");
                        return count;
                    }
                    Err(ProposeError::NotLeader { .. } | ProposeError::Backlogged) => std::thread::yield_now(),
                    Err(e) if e.outcome_unknown() => unknown += 1,
                    Err(e) => panic!("propose: {e}"),
                }
            }
        }
    }
}

fn generation_file(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("generation")).ok().map(|g| g.trim_end().to_string())
}

/// Waits (bounded) until every member remembers one generation; returns it.
fn remembered(c: &Cluster) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let files: Vec<Option<String>> = (0..3).map(|id| generation_file(&c.data_dir(id))).collect();
        if let Some(first) = files[0].clone().filter(|f| files.iter().all(|g| g.as_ref() == Some(f))) {
            return first;
        }
        assert!(Instant::now() < deadline, "the members did not all remember one generation: {files:?}");
        std::thread::yield_now();
    }
}

#[test]
fn a_cluster_whose_every_member_restarted_stops_naming_its_generation_instead_of_starting_empty() {
    let mut c = Cluster::new("lost");
    c.commit(0);
    let generation = remembered(&c);
    c.restart_all(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.nodes.iter().flatten().any(|n| n.fatal().is_none()) {
        assert!(Instant::now() < deadline, "a member went on without reporting the loss");
        std::thread::yield_now();
    }
    for node in c.nodes.iter().flatten() {
        let why = node.fatal().expect("stopped");
        assert!(why.contains(&generation) && why.contains("--force-new"), "{why}");
        assert!(
            matches!(node.propose(b"+1"), Err(ProposeError::NotLeader { .. } | ProposeError::Shutdown)),
            "a stopped member took a proposal"
        );
    }
    assert_eq!(
        (0..3).map(|id| generation_file(&c.data_dir(id))).collect::<Vec<_>>(),
        vec![Some(generation.clone()); 3]
    );

    // An operator's decision: a new, empty cluster, of a new generation.
    c.restart_all(true);
    c.commit(0); // the new cluster starts empty
    assert_ne!(remembered(&c), generation);
}

#[test]
fn a_member_that_restarts_alone_recovers_from_its_peers_and_keeps_the_generation() {
    let mut c = Cluster::new("alone");
    let mut count = 0;
    for _ in 0..5 {
        count = c.commit(count);
    }
    let generation = remembered(&c);
    let leader = c.nodes.iter().flatten().find_map(Node::leader).expect("a leader");
    // A follower restarts with fresh memory; it is promoted again by the leader.
    let follower = (0..3u16).find(|&id| id != leader.0).expect("a follower");
    drop(c.nodes[usize::from(follower)].take());
    c.nodes[usize::from(follower)] = Some(c.start(follower, false));
    c.commit(count);
    let restarted = c.nodes[usize::from(follower)].as_ref().expect("restarted");
    let deadline = Instant::now() + Duration::from_secs(30);
    while restarted.status().recovering {
        assert!(Instant::now() < deadline, "the restarted member was not promoted");
        assert!(restarted.fatal().is_none(), "{:?}", restarted.fatal());
        std::thread::yield_now();
    }
    assert_eq!(generation_file(&c.data_dir(follower)), Some(generation));
}

#[test]
fn a_damaged_generation_file_is_a_start_error_that_names_it() {
    let c = Cluster::new("damaged");
    let dir = c.data_dir(7);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("generation"), "not a generation\n").expect("write");
    let mut config = c.config.clone();
    config.shm_dir = Some(c.root.join("other-shm"));
    let node = NodeConfig { data_dir: Some(dir.clone()), ..NodeConfig::new(0) };
    let err = microrep::start_on_shm(&Config { cluster: config, node }, Counter::default()).expect_err("damaged");
    assert!(err.to_string().contains(&dir.join("generation").display().to_string()), "{err}");
}
