//! The tcp fabric across network namespaces: three namespaces (10.231.0.1-3) whose veth pairs
//! meet at a bridge in a fourth, a node in each, writes and reads across them, a partition of one
//! node (its link set down) that must fail operations to it with error completions within the
//! request timeout while the others keep working, and a heal after which `reconnect` works.
//!
//! Nodes run as threads of this test process that moved into a namespace with `setns`: a
//! thread's sockets live in its namespace, and the threads it spawns (the NIC thread) inherit
//! it. Needs root and `ip` (iproute2); without them the test prints why and passes without
//! checking anything. The namespaces are deleted by a guard, also when the test fails.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use microrep_fabric::tcp::{TcpConfig, TcpFabric, TcpTimeouts};
use microrep_fabric::{
    Completion, Endpoint, EndpointState, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite,
};

const LOG: RegionId = RegionId(0);
const SCRATCH: RegionId = RegionId(1);
/// Bounds every wait; only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(30);
const TIMEOUTS: TcpTimeouts = TcpTimeouts { connect: Duration::from_millis(500), request: Duration::from_millis(300) };

fn regions() -> [RegionSpec; 2] {
    [RegionSpec::new(LOG, 4096, RemoteWrite::Granted), RegionSpec::new(SCRATCH, 4096, RemoteWrite::Never)]
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Network namespaces deleted on drop (deleting one removes its end of the veth pair too).
struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    fn create(names: &[String]) -> Result<Self, String> {
        let mut made = Self { names: Vec::new() };
        for name in names {
            ip(&["netns", "add", name])?;
            made.names.push(name.clone());
        }
        Ok(made)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("tcp_netns: cleanup failed: {e}");
            }
        }
    }
}

/// Why this test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` command (iproute2) is missing".into());
    }
    None
}

/// Runs `f` on a thread that first moves into network namespace `ns`.
fn in_namespace<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap_or_else(|e| panic!("setns into {path}: {e}"));
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn start(cluster: &str, id: u16, listen: [u8; 4], peers: &[(u16, SocketAddr)]) -> TcpFabric {
    let mut config = TcpConfig::new(cluster, NodeId(id), 3, SocketAddr::from((listen, 0)), &regions())
        .with_peers(peers.iter().map(|&(p, a)| (NodeId(p), a)));
    config.timeouts = TIMEOUTS;
    TcpFabric::start(config).unwrap_or_else(|e| panic!("starting node {id}: {e}"))
}

fn wait_completion<E: Endpoint>(ep: &mut E) -> (Completion, Duration) {
    let start = Instant::now();
    loop {
        if let Some(c) = ep.poll_completion() {
            return (c, start.elapsed());
        }
        assert!(start.elapsed() < DEADLINE, "no completion within {DEADLINE:?}: the endpoint hangs");
        std::thread::yield_now();
    }
}

fn record(seq: u64) -> Vec<u8> {
    (0..8).flat_map(|_| seq.to_le_bytes()).collect()
}

/// Posts a signaled write and returns its completion status and how long it took.
fn write<E: Endpoint>(ep: &mut E, wr_id: u64) -> (Result<(), microrep_fabric::OpError>, Duration) {
    ep.post_write(wr_id, RemoteAddr::new(LOG, 0), &record(wr_id), PostFlags::SIGNALED).expect("post");
    let (done, took) = wait_completion(ep);
    assert_eq!(done.wr_id, wr_id);
    (done.status, took)
}

fn landed(node: &TcpFabric) -> Vec<u8> {
    let mut buf = [0u8; 64];
    node.read_local(LOG, 0, &mut buf).expect("read");
    buf.to_vec()
}

#[test]
fn writes_cross_namespaces_fail_under_partition_and_resume_after_reconnect() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("tcp_netns: SKIPPED: {why}; this test needs root and iproute2 to create network namespaces");
        return;
    }
    // Namespaces a, b, c hold nodes 0, 1, 2 at 10.231.0.1-3; namespace h holds the bridge that
    // joins their veth pairs.
    let id = format!("mrtcp{}", std::process::id());
    let ns = |x: &str| format!("{id}{x}");
    let _namespaces = Namespaces::create(&[ns("h"), ns("a"), ns("b"), ns("c")]).expect("creating namespaces");
    let hub = ns("h");
    ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]).expect("bridge");
    ip(&["-n", &hub, "link", "set", "br0", "up"]).expect("bridge up");
    for (x, addr) in [("a", "10.231.0.1/24"), ("b", "10.231.0.2/24"), ("c", "10.231.0.3/24")] {
        let (port, node_ns) = (format!("port{x}"), ns(x));
        for step in [
            vec!["-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &node_ns],
            vec!["-n", &hub, "link", "set", &port, "master", "br0"],
            vec!["-n", &hub, "link", "set", &port, "up"],
            vec!["-n", &node_ns, "addr", "add", addr, "dev", "eth0"],
            vec!["-n", &node_ns, "link", "set", "eth0", "up"],
            vec!["-n", &node_ns, "link", "set", "lo", "up"],
        ] {
            ip(&step).expect("configuring the namespaces");
        }
    }

    let cluster = format!("netns-{id}");
    let start_in = |x: &str, node: u16, last_octet: u8| {
        let cluster = cluster.clone();
        let node = in_namespace(&ns(x), move || start(&cluster, node, [10, 231, 0, last_octet], &[]));
        node.grant_write(LOG, NodeId(0)).expect("grant");
        Arc::new(node)
    };
    let (b, c) = (start_in("b", 1, 2), start_in("c", 2, 3));
    let peers = [(1, b.local_addr()), (2, c.local_addr())];
    let (cut, partitioned_ns) = (vec!["-n".to_owned(), ns("c"), "link".into(), "set".into(), "eth0".into()], ns("c"));
    in_namespace(&ns("a"), move || {
        let writer = start(&cluster, 0, [10, 231, 0, 1], &peers);
        let mut to_b = writer.connect(NodeId(1)).expect("connect across namespaces");
        let mut to_c = writer.connect(NodeId(2)).expect("connect across namespaces");
        assert_eq!(write(&mut to_b, 1).0, Ok(()));
        assert_eq!(write(&mut to_c, 2).0, Ok(()));
        assert_eq!(landed(&b), record(1), "the write landed in namespace b");
        assert_eq!(landed(&c), record(2), "the write landed in namespace c");
        to_b.post_read(3, RemoteAddr::new(LOG, 0), 64, SCRATCH, 0, PostFlags::SIGNALED).expect("post read");
        assert_eq!(wait_completion(&mut to_b).0.status, Ok(()));
        let mut read = [0u8; 64];
        writer.read_local(SCRATCH, 0, &mut read).expect("read");
        assert_eq!(read.to_vec(), record(1), "the read returned namespace b's memory");

        let link = |state: &str| {
            let args: Vec<&str> = cut.iter().map(String::as_str).chain([state]).collect();
            ip(&args).unwrap_or_else(|e| panic!("setting {partitioned_ns}'s link {state}: {e}"));
        };
        link("down");
        let (status, after) = write(&mut to_c, 4);
        assert!(status.is_err(), "a write across the partition must fail, got {status:?}");
        assert_eq!(to_c.state(), EndpointState::Error);
        eprintln!("tcp_netns: write across the partition failed with {status:?} after {after:?}");
        assert_eq!(write(&mut to_b, 5).0, Ok(()), "the rest of the cluster still works");
        assert_eq!(landed(&b), record(5));
        let refused = Instant::now();
        assert!(to_c.reconnect().is_err(), "reconnect across the partition must fail");
        eprintln!("tcp_netns: reconnect across the partition failed after {:?}", refused.elapsed());

        link("up");
        let healed = Instant::now();
        while let Err(e) = to_c.reconnect() {
            assert!(healed.elapsed() < DEADLINE, "reconnect after the heal kept failing: {e}");
            // Back off between attempts while the link comes back up (a retry, not a timing check).
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(to_c.state(), EndpointState::Ready);
        assert_eq!(write(&mut to_c, 6).0, Ok(()), "writes work again after the heal");
        assert_eq!(landed(&c), record(6));
    });
}
