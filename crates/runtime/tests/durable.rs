//! The durable log on shm (`cluster.durability = "fsync"`): every member killed at once and
//! restarted comes back with every acknowledged write; a member killed alone restarts from its
//! disk and recovers the rest from its peers; a damaged log stops the node with an error naming
//! the file and the offset; membership changes survive a whole-cluster kill. A kill is a drop
//! without `shutdown`: nothing the writer had not synced is written afterwards.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use microrep::config::{ClusterConfig, Durability, NodeConfig};
use microrep::{
    Apply, Config, Configuration, Index, MemberSet, MembershipChange, Node, NodeId, ProposeError, StartError,
};

/// The commands applied, in order. A command is a nonzero id; 0 reads: its reply lists every id
/// applied so far.
#[derive(Default)]
struct Ledger(Vec<u64>);

fn ids(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

impl Apply for Ledger {
    fn apply(&mut self, _index: Index, command: &[u8], reply: &mut Vec<u8>) {
        let id = u64::from_le_bytes(command.try_into().expect("an 8-byte command"));
        if id == 0 {
            self.snapshot(reply);
        } else {
            self.0.push(id);
        }
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        self.0.iter().for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), microrep::RestoreError> {
        if !snapshot.len().is_multiple_of(8) {
            return Err(microrep::RestoreError::Application("not a list of ids".into()));
        }
        self.0 = ids(snapshot);
        Ok(())
    }
}

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
    fn new(name: &str, durability: Durability) -> Self {
        Self::with_ids(name, durability, 3, None)
    }

    /// `ids` replicas, every one started; members `initial_members` (default: all).
    fn with_ids(name: &str, durability: Durability, ids: u16, initial_members: Option<Vec<u16>>) -> Self {
        let name = format!("durable-{name}-{}", std::process::id());
        let mut config = ClusterConfig::local(&name, ids, 1);
        config.initial_members = initial_members;
        let root = microrep_fabric::shm::ShmConfig::default_dir(&name);
        config.shm_dir = Some(root.join("shm"));
        config.timing.heartbeat_us = 5000;
        // Checkpoints every 32 entries: segments rotate many times per test.
        config.log.slots = 128;
        config.log.snapshot_every = 32;
        config.durability = durability;
        let mut c = Self { config, root, nodes: Vec::new() };
        c.nodes = (0..ids).map(|id| Some(c.start(id).expect("start"))).collect();
        c
    }

    fn start(&self, id: u16) -> Result<Node, StartError> {
        self.start_with(id, false)
    }

    /// Starts replica `id`, with `--repair-log` if `repair_log`.
    fn start_with(&self, id: u16, repair_log: bool) -> Result<Node, StartError> {
        let data_dir = Some(self.root.join(format!("node-{id}")));
        let node = NodeConfig { data_dir, repair_log, ..NodeConfig::new(id) };
        microrep::start_on_shm(&Config { cluster: self.config.clone(), node }, Ledger::default())
    }

    /// Kills every member (drops it without `shutdown`), then starts every member again.
    fn kill_all_and_restart(&mut self) {
        self.nodes.iter_mut().for_each(|n| drop(n.take()));
        self.nodes = (0..self.nodes.len() as u16).map(|id| Some(self.start(id).expect("restart"))).collect();
    }

    /// Waits until every replica applied `configuration`.
    fn everyone_applied(&self, configuration: Configuration) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes.iter().flatten().all(|n| n.configuration() == configuration) {
            assert!(Instant::now() < deadline, "a restarted replica lost a membership change");
            std::thread::yield_now();
        }
    }

    /// Asks whichever member leads for `change` until it is in effect, as `microrep member`
    /// does (a spare catching up, a term starting: the leader refuses and it asks again).
    fn change(&self, change: MembershipChange) -> Configuration {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "{change} not done");
            for node in self.nodes.iter().flatten() {
                match node.change_membership(change) {
                    Ok(c) if c.members.contains(change.node()) == matches!(change, MembershipChange::Add(_)) => {
                        return c;
                    }
                    Ok(_) | Err(ProposeError::NotLeader { .. } | ProposeError::Timeout | ProposeError::Unknown) => {}
                    Err(ProposeError::Membership(why)) => {
                        let retry = ["catching up", "not a follower", "not live", "under way", "starting its term"];
                        assert!(retry.iter().any(|r| why.contains(r)), "{change} refused: {why}");
                    }
                    Err(e) => panic!("{change}: {e}"),
                }
            }
            std::thread::yield_now();
        }
    }

    /// Proposes `id` through whichever member leads until its outcome is known: true if it was
    /// acknowledged, false if its outcome is unknown (it may or may not have been applied).
    fn propose(&self, id: u64) -> (bool, Vec<u8>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "no leader took {id}");
            for node in self.nodes.iter().flatten() {
                assert!(node.fatal().is_none(), "{:?}", node.fatal());
                match node.propose(&id.to_le_bytes()) {
                    Ok(c) => return (true, c.reply),
                    Err(ProposeError::NotLeader { .. } | ProposeError::Backlogged) => std::thread::yield_now(),
                    Err(e) if e.outcome_unknown() && id != 0 => return (false, Vec::new()),
                    Err(e) if e.outcome_unknown() => {}
                    Err(e) => panic!("propose {id}: {e}"),
                }
            }
        }
    }

    /// The ids applied, as the leader's state machine holds them.
    fn read(&self) -> Vec<u64> {
        ids(&self.propose(0).1)
    }
}

/// Writes `ids`, returning those acknowledged.
fn write(c: &Cluster, ids: std::ops::Range<u64>) -> BTreeSet<u64> {
    ids.filter(|&id| c.propose(id).0).collect()
}

fn check(applied: &[u64], acknowledged: &BTreeSet<u64>) {
    let unique: BTreeSet<u64> = applied.iter().copied().collect();
    assert_eq!(unique.len(), applied.len(), "a command applied twice: {applied:?}");
    let lost: Vec<&u64> = acknowledged.iter().filter(|id| !unique.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?} ({} applied)", applied.len());
}

#[test]
fn every_member_killed_and_restarted_comes_back_with_every_acknowledged_write() {
    let mut c = Cluster::new("all", Durability::Fsync);
    let mut acknowledged = write(&c, 1..101);
    assert!(acknowledged.len() >= 90, "only {} of 100 acknowledged", acknowledged.len());
    c.kill_all_and_restart();
    check(&c.read(), &acknowledged);
    // Again, with writes in between, across more checkpoints.
    acknowledged.extend(write(&c, 101..201));
    c.kill_all_and_restart();
    let applied = c.read();
    check(&applied, &acknowledged);
    acknowledged.extend(write(&c, 201..211));
    check(&c.read(), &acknowledged);
}

#[test]
fn without_a_durable_log_the_same_kill_stops_the_cluster_instead_of_starting_it_empty() {
    let mut c = Cluster::new("none", Durability::None);
    write(&c, 1..11);
    c.kill_all_and_restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.nodes.iter().flatten().any(|n| n.fatal().is_none()) {
        assert!(Instant::now() < deadline, "a member went on after losing the cluster's state");
        std::thread::yield_now();
    }
}

#[test]
fn a_member_killed_alone_restarts_from_its_disk_and_recovers_the_rest_from_its_peers() {
    let mut c = Cluster::new("alone", Durability::Fsync);
    let mut acknowledged = write(&c, 1..41);
    let leader = c.nodes.iter().flatten().find_map(Node::leader).expect("a leader");
    let follower = (0..3u16).find(|&id| id != leader.0).expect("a follower");
    drop(c.nodes[usize::from(follower)].take());
    acknowledged.extend(write(&c, 41..121));
    c.nodes[usize::from(follower)] = Some(c.start(follower).expect("restart"));
    let restarted = c.nodes[usize::from(follower)].as_ref().expect("restarted");
    let deadline = Instant::now() + Duration::from_secs(30);
    while restarted.status().recovering {
        assert!(Instant::now() < deadline, "the restarted member was not promoted");
        assert!(restarted.fatal().is_none(), "{:?}", restarted.fatal());
        std::thread::yield_now();
    }
    acknowledged.extend(write(&c, 121..131));
    // Its state matches the leader's: the whole cluster killed now still loses nothing, even
    // counting on its disk.
    c.kill_all_and_restart();
    check(&c.read(), &acknowledged);
}

/// The file offset of each write's first entry record in a segment, in order (the record
/// layout of `durable::record`: a 40-byte header with the payload's length at 0 and the
/// offset of the write it belongs to at 32, the payload padded to 8 bytes; the checkpoint
/// first).
fn entry_writes(bytes: &[u8]) -> Vec<usize> {
    let word =
        |at: usize, n: usize| bytes.get(at..at + n).map(|b| b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)));
    let mut starts = Vec::new();
    let (mut at, mut batch) = (0, None);
    while let (Some(len), Some(this)) = (word(at, 4), word(at + 32, 8)) {
        if at > 0 && batch != Some(this) {
            starts.push(at);
        }
        batch = Some(this);
        at += 40 + (len as usize).next_multiple_of(8);
    }
    starts
}

/// The newest segment of replica `id`'s log.
fn newest_segment(c: &Cluster, id: u16) -> PathBuf {
    let log = c.root.join(format!("node-{id}")).join("log");
    std::fs::read_dir(&log)
        .expect("log directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .expect("a segment")
}

#[test]
fn a_damaged_durable_log_is_a_start_error_naming_the_file_and_offset() {
    let mut c = Cluster::new("damaged", Durability::Fsync);
    write(&c, 1..41);
    c.nodes.iter_mut().for_each(|n| drop(n.take()));
    let segment = newest_segment(&c, 1);
    let mut bytes = std::fs::read(&segment).expect("read");
    // The checkpoint's payload.
    bytes[41] ^= 0xff;
    std::fs::write(&segment, &bytes).expect("damage");
    let e = c.start(1).expect_err("a damaged log");
    let text = e.to_string();
    assert!(text.contains(&segment.display().to_string()) && text.contains("offset 0"), "{text}");
    assert!(text.contains("--repair-log"), "the error names the way out: {text}");
    assert_eq!(std::fs::read(&segment).expect("read"), bytes, "the damaged file was left as it was");
}

/// `--repair-log`: a member whose log is damaged, in its checkpoint or in an entry synced
/// before later ones, is cut at the damage (the damaged file kept beside it), starts, and
/// recovers the rest from its peers; a whole-cluster kill afterwards still loses nothing.
#[test]
fn a_damaged_durable_log_is_cut_at_the_damage_with_repair_log_and_the_rest_recovered_from_peers() {
    for (name, damage_checkpoint) in [("repair-entry", false), ("repair-checkpoint", true)] {
        let mut c = Cluster::new(name, Durability::Fsync);
        let mut acknowledged = write(&c, 1..41);
        // Damage in an entry counts as damage only if a later write follows it (otherwise it
        // is a torn last write, and truncated): write until replica 1 synced two writes.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut next = 1000;
        while entry_writes(&std::fs::read(newest_segment(&c, 1)).expect("read")).len() < 2 {
            assert!(Instant::now() < deadline, "{name}: replica 1 synced no second write");
            acknowledged.extend(write(&c, next..next + 1));
            next += 1;
        }
        drop(c.nodes[1].take());
        let segment = newest_segment(&c, 1);
        let mut bytes = std::fs::read(&segment).expect("read");
        // The checkpoint's payload, or the index field of the first write's first entry
        // (entries may be no-ops, without payload; the checksum covers the header too).
        let at = if damage_checkpoint { 41 } else { entry_writes(&bytes)[0] + 16 };
        bytes[at] ^= 0xff;
        std::fs::write(&segment, &bytes).expect("damage");
        assert!(c.start(1).is_err(), "{name}: a damaged log stops the node without --repair-log");
        c.nodes[1] = Some(c.start_with(1, true).expect("repaired"));
        let kept: Vec<PathBuf> = std::fs::read_dir(segment.parent().expect("log dir"))
            .expect("log dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains(".damaged-"))
            .collect();
        assert_eq!(kept.len(), 1, "{name}: the damaged file is kept aside");
        assert_eq!(std::fs::read(&kept[0]).expect("read"), bytes, "{name}: kept as it was");
        acknowledged.extend(write(&c, 41..61));
        let repaired = c.nodes[1].as_ref().expect("replica 1");
        let deadline = Instant::now() + Duration::from_secs(30);
        while repaired.status().recovering {
            assert!(Instant::now() < deadline, "{name}: the repaired member was not promoted");
            std::thread::yield_now();
        }
        c.kill_all_and_restart();
        check(&c.read(), &acknowledged);
    }
}

#[test]
fn a_member_whose_disk_was_lost_comes_back_empty_and_the_others_restart_the_cluster() {
    let mut c = Cluster::new("disk-lost", Durability::Fsync);
    let acknowledged = write(&c, 1..61);
    c.nodes.iter_mut().for_each(|n| drop(n.take()));
    // Member 2's machine is replaced: no log, no generation.
    std::fs::remove_dir_all(c.root.join("node-2")).expect("remove a data directory");
    c.nodes = (0..3).map(|id| Some(c.start(id).expect("restart"))).collect();
    check(&c.read(), &acknowledged);
    let replaced = c.nodes[2].as_ref().expect("member 2");
    let deadline = Instant::now() + Duration::from_secs(30);
    while replaced.status().recovering {
        assert!(Instant::now() < deadline, "the replaced member was not promoted");
        std::thread::yield_now();
    }
}

/// Issue 19: membership changes on a durable cluster. A spare joins and a member leaves; then
/// every replica is killed and restarted: each restores the configuration its own log holds,
/// the cluster restarts from the most durable member of it with every acknowledged write, and
/// the removed member stays out.
#[test]
fn membership_changes_survive_a_whole_cluster_kill() {
    let mut c = Cluster::with_ids("members", Durability::Fsync, 4, Some(vec![0, 1, 2]));
    let mut acknowledged = write(&c, 1..41);
    c.change(MembershipChange::Add(NodeId(3)));
    acknowledged.extend(write(&c, 41..61));
    let after = c.change(MembershipChange::Remove(NodeId(0)));
    let want = Configuration { members: [1, 2, 3].map(NodeId).into_iter().collect::<MemberSet>(), epoch: 2 };
    assert_eq!(after, want);
    acknowledged.extend(write(&c, 61..101));
    c.kill_all_and_restart();
    check(&c.read(), &acknowledged);
    c.everyone_applied(want);
    acknowledged.extend(write(&c, 101..121));
    check(&c.read(), &acknowledged);
    // A change right before the kill, after the last checkpoint (one every 32 entries): the
    // logs hold it as a membership record.
    let back = c.change(MembershipChange::Add(NodeId(0)));
    assert_eq!(back, Configuration { members: MemberSet::first(4), epoch: 3 });
    c.kill_all_and_restart();
    check(&c.read(), &acknowledged);
    c.everyone_applied(back);
}
