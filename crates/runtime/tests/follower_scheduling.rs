//! A follower's replication thread (no durable log: nobody waits for it) runs under
//! `SCHED_BATCH`, so that its wake-ups do not preempt the leader's threads; the thread of a
//! replica that leads runs under `SCHED_OTHER`, a follower that becomes leader included.
//! Alone in its test binary: it counts every replication thread of the process.

use std::time::{Duration, Instant};

use microrep::config::{ClusterConfig, NodeConfig};
use microrep::{Config, Node};

#[path = "common/dir.rs"]
mod dir;
use dir::Dir;
use microrep::Counter;

/// The scheduling policy of every replication thread of this process, in thread-id order.
fn replication_policies() -> Vec<i32> {
    let mut policies = Vec::new();
    let mut tasks: Vec<_> = std::fs::read_dir("/proc/self/task").expect("tasks").flatten().collect();
    tasks.sort_by_key(|t| t.file_name());
    for task in tasks {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // Thread names are cut to 15 bytes: "microrep-replication-N" reads "microrep-replic".
        if comm.trim_end() != "microrep-replic" {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // Fields after the parenthesised name start at field 3; the policy is field 41.
        let after_name = &stat[stat.rfind(')').expect("stat has a name") + 2..];
        let policy = after_name.split(' ').nth(41 - 3).expect("policy field").parse().expect("a number");
        policies.push(policy);
    }
    policies
}

/// Waits (bounded) until the replication threads run under `other` threads of
/// `SCHED_OTHER` and `batch` of `SCHED_BATCH`.
fn wait_for_policies(other: usize, batch: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let policies = replication_policies();
        let count = |policy| policies.iter().filter(|&&p| p == policy).count();
        if (count(libc::SCHED_OTHER), count(libc::SCHED_BATCH)) == (other, batch) && policies.len() == other + batch {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replication threads' policies {policies:?}, wanted {other} other, {batch} batch"
        );
        std::thread::yield_now();
    }
}

fn leader_of(nodes: &[Option<Node>]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = nodes.iter().flatten();
        if let Some(leader) = live.clone().find(|n| n.leader() == Some(n.id()))
            && live.clone().all(|n| n.leader() == Some(leader.id()))
        {
            return usize::from(leader.id().0);
        }
        assert!(Instant::now() < deadline, "no leader every live node agrees on");
        std::thread::yield_now();
    }
}

/// Commits `command` through whichever node leads, asking again while leadership moves.
fn commit(nodes: &[Option<Node>], command: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = nodes[leader_of(nodes)].as_ref().expect("a live leader").propose(command) {
        assert!(Instant::now() < deadline, "no commit of {command:?}: {e}");
    }
}

#[test]
fn followers_replication_threads_run_as_batch_and_a_new_leaders_runs_as_other() {
    let name = format!("sched-{}", std::process::id());
    let mut cluster = ClusterConfig::local(&name, 3, 1);
    let dir = Dir(microrep_fabric::shm::ShmConfig::default_dir(&name));
    cluster.shm_dir = Some(dir.0.clone());
    cluster.timing.heartbeat_us = 5000;
    let start = |id| {
        let config = Config { cluster: cluster.clone(), node: NodeConfig::new(id) };
        Some(microrep::start_on_shm(&config, Counter::default()).expect("start node"))
    };
    let mut nodes: Vec<Option<Node>> = (0..3).map(start).collect();
    commit(&nodes, b"x");
    wait_for_policies(1, 2);

    let leader = leader_of(&nodes);
    nodes[leader].take().expect("leader").shutdown();
    commit(&nodes, b"y");
    wait_for_policies(1, 1);
}
