//! Prometheus metrics (`node.metrics`): a 3-replica cluster on shm commits commands, then its
//! replicas are scraped over loopback and the OpenMetrics text is parsed; a fail-over shows in
//! the survivors' metrics; an address that cannot be bound stops the start with a clear error.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use microrep::config::{ClusterConfig, NodeConfig};
use microrep::{Apply, Config, Index, Node, NodeId, ProposeError, StartError};

#[path = "common/dir.rs"]
mod dir;
use dir::Dir;

/// Sums the first byte of every command.
#[derive(Default)]
struct Sum(u64);

impl Apply for Sum {
    fn apply(&mut self, _index: Index, command: &[u8], reply: &mut Vec<u8>) {
        self.0 += u64::from(command[0]);
        reply.extend_from_slice(&self.0.to_le_bytes());
    }
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
    }
    fn restore(&mut self, s: &[u8]) -> Result<(), microrep::RestoreError> {
        let bytes = s.try_into().map_err(|_| microrep::RestoreError::Length { got: s.len(), expected: "8 bytes" })?;
        self.0 = u64::from_le_bytes(bytes);
        Ok(())
    }
}

fn cluster(name: &str) -> (ClusterConfig, Dir) {
    let name = format!("{name}-{}", std::process::id());
    let mut config = ClusterConfig::local(&name, 3, 1);
    let dir = microrep_fabric::shm::ShmConfig::default_dir(&name);
    config.shm_dir = Some(dir.clone());
    // Debug builds on a small, busy machine: a descheduled replica should rarely look dead.
    config.timing.heartbeat_us = 5000;
    (config, Dir(dir))
}

fn start(cluster: &ClusterConfig, id: u16, metrics: Option<&str>) -> Result<Node, StartError> {
    let node = NodeConfig { metrics: metrics.map(String::from), ..NodeConfig::new(id) };
    microrep::start_on_shm(&Config { cluster: cluster.clone(), node }, Sum::default())
}

/// Polls `check` until it holds, for 60 s at most.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// GETs `path` from `addr`: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/openmetrics-text\r\n\r\n").expect("send");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// Scrapes `node`'s metrics: every sample by its series (`name{labels}`), and the metric
/// families the `# TYPE` lines declare.
fn scrape(node: &Node) -> (HashMap<String, f64>, HashMap<String, String>) {
    let addr = node.metrics_addr().expect("the node serves metrics");
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.ends_with("# EOF\n"), "an OpenMetrics exposition ends with # EOF:\n{body}");
    let (mut samples, mut types) = (HashMap::new(), HashMap::new());
    for line in body.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (name, kind) = declared.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_string(), kind.to_string());
        } else if !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
            let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
            assert!(samples.insert(series.to_string(), value).is_none(), "{series} appears twice");
        }
    }
    (samples, types)
}

fn propose_at_leader(nodes: &[Option<Node>], command: &[u8]) -> usize {
    let mut leader = None;
    eventually("a commit", || {
        for (i, node) in nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            match node.propose(command) {
                Ok(_) => leader = Some(i),
                Err(ProposeError::NotLeader { .. } | ProposeError::Backlogged) => continue,
                Err(e) if e.outcome_unknown() => continue,
                Err(e) => panic!("{e}"),
            }
            return true;
        }
        false
    });
    leader.expect("a leader")
}

#[test]
fn a_scrape_shows_commits_latency_leader_role_log_and_fail_over() {
    let (cluster, _dir) = cluster("metrics");
    let mut nodes: Vec<Option<Node>> =
        (0..3).map(|id| Some(start(&cluster, id, Some("127.0.0.1:0")).expect("start"))).collect();
    let mut leader = 0;
    for _ in 0..50 {
        leader = propose_at_leader(&nodes, &[1]);
    }
    let node = nodes[leader].as_ref().expect("leader");
    let (root, _) = get(node.metrics_addr().expect("addr"), "/");
    assert_eq!(root, "HTTP/1.1 200 OK");
    assert_eq!(get(node.metrics_addr().expect("addr"), "/other").0, "HTTP/1.1 404 Not Found");
    // The status the log gauges come from is refreshed every 10 ms.
    let mut m = HashMap::new();
    eventually("the log gauges", || {
        m = scrape(node).0;
        m["microrep_log_applied"] >= 50.0
    });
    let (_, types) = scrape(node);
    for (name, kind) in [
        ("microrep_commits", "counter"),
        ("microrep_commit_latency_seconds", "histogram"),
        ("microrep_proposals_refused", "counter"),
        ("microrep_leader_changes", "counter"),
        ("microrep_leader", "gauge"),
        ("microrep_role", "gauge"),
        ("microrep_failover_detection_seconds", "histogram"),
        ("microrep_failover_switch_seconds", "histogram"),
        ("microrep_permission_revocations", "counter"),
        ("microrep_log_fuo", "gauge"),
        ("microrep_log_tail", "gauge"),
        ("microrep_recovering", "gauge"),
    ] {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
    }
    // Every command this test made committed at the leader it was made on; commands that
    // committed elsewhere (before the leader settled) are not this node's.
    let commits = m["microrep_commits_total"];
    assert!((1.0..=50.0).contains(&commits), "{commits}");
    assert_eq!(m["microrep_commit_latency_seconds_count"], commits);
    assert_eq!(m["microrep_commit_latency_seconds_bucket{le=\"+Inf\"}"], commits);
    assert!(m["microrep_commit_latency_seconds_sum"] > 0.0);
    // Leadership may move on a busy machine; it settles, on this node or another.
    eventually("a leader's role and id", || {
        nodes.iter().flatten().any(|n| {
            let m = scrape(n).0;
            m["microrep_role{role=\"leader\"}"] == 1.0 && m["microrep_leader"] == f64::from(n.id().0)
        })
    });
    assert_eq!(m["microrep_recovering"], 0.0);
    assert!(m["microrep_log_fuo"] >= m["microrep_log_applied"]);
    assert!(m["microrep_leader_changes_total"] >= 1.0);
    assert!(m.contains_key("microrep_proposals_refused_total{kind=\"timeout\"}"));
    // A replica has one role at a time.
    for n in nodes.iter().flatten() {
        let m = scrape(n).0;
        let roles: f64 =
            ["follower", "candidate", "leader"].iter().map(|r| m[&format!("microrep_role{{role=\"{r}\"}}")]).sum();
        assert_eq!(roles, 1.0);
    }
    // Another commit moves the counter of the node it was made on (which, on a busy machine,
    // may be a new leader). It is made again until every node holds that node for the leader:
    // stopping a node that no longer led (leadership moved on a busy machine right after its
    // commit) would be no fail-over, and the survivors would have none to measure.
    let mut at = 0;
    eventually("a commit at the leader every node sees", || {
        at = propose_at_leader(&nodes, &[1]);
        nodes.iter().flatten().all(|n| n.leader() == Some(NodeId(at as u16)))
    });
    let before = if at == leader { commits } else { 0.0 };
    assert!(scrape(nodes[at].as_ref().expect("leader")).0["microrep_commits_total"] > before);

    // Fail-over: the leader (the node that just committed) stops; a survivor detects it,
    // switches, and commits.
    nodes[at] = None;
    let next = propose_at_leader(&nodes, &[2]);
    let survivor = nodes[next].as_ref().expect("new leader");
    eventually("the fail-over metrics", || {
        let m = scrape(survivor).0;
        m["microrep_failover_detection_seconds_count"] >= 1.0
            && m["microrep_failover_switch_seconds_count"] >= 1.0
            && m["microrep_failover_last_detection_seconds"] > 0.0
            && m["microrep_failover_last_switch_seconds"] > 0.0
    });
    eventually("the survivor's log granted to the new leader", || {
        scrape(survivor).0["microrep_permission_revocations_total"] >= 1.0
    });
}

#[test]
fn no_metrics_without_the_setting() {
    let (cluster, _dir) = cluster("metrics-off");
    let node = start(&cluster, 0, None).expect("start");
    assert_eq!(node.metrics_addr(), None);
    assert_eq!(node.metrics_text(), None);
}

#[test]
fn an_address_in_use_is_a_clear_error() {
    let (cluster, _dir) = cluster("metrics-bind");
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let e = start(&cluster, 0, Some(&addr)).expect_err("the address is taken");
    assert!(matches!(e, StartError::Metrics { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&addr) && text.contains("node.metrics") && text.contains("in use"), "{text}");
}
