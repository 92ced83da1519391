//! The tcp fabric across network namespaces: two namespaces joined by a veth pair (10.231.0.1 and
//! 10.231.0.2), a node in each, writes and reads across them, a partition (the link set down)
//! that must fail operations with error completions within the request timeout, and a heal after
//! which `reconnect` works again.
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
    let mut config = TcpConfig::new(cluster, NodeId(id), 2, SocketAddr::from((listen, 0)), &regions())
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

#[test]
fn writes_cross_namespaces_fail_under_partition_and_resume_after_reconnect() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("tcp_netns: SKIPPED: {why}; this test needs root and iproute2 to create network namespaces");
        return;
    }
    let id = format!("mrtcp{}", std::process::id());
    let (ns_a, ns_b) = (format!("{id}a"), format!("{id}b"));
    let _namespaces = Namespaces::create(&[ns_a.clone(), ns_b.clone()]).expect("creating network namespaces");
    for step in [
        vec!["-n", &ns_a, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", &ns_b],
        vec!["-n", &ns_a, "addr", "add", "10.231.0.1/24", "dev", "veth0"],
        vec!["-n", &ns_b, "addr", "add", "10.231.0.2/24", "dev", "veth1"],
        vec!["-n", &ns_a, "link", "set", "veth0", "up"],
        vec!["-n", &ns_b, "link", "set", "veth1", "up"],
        vec!["-n", &ns_a, "link", "set", "lo", "up"],
        vec!["-n", &ns_b, "link", "set", "lo", "up"],
    ] {
        ip(&step).expect("configuring the namespaces");
    }

    let cluster = format!("netns-{id}");
    let target = {
        let cluster = cluster.clone();
        Arc::new(in_namespace(&ns_b, move || start(&cluster, 1, [10, 231, 0, 2], &[])))
    };
    target.grant_write(LOG, NodeId(0)).expect("grant");
    let target_addr = target.local_addr();
    let target_in_a = Arc::clone(&target);
    let link_a = ns_a.clone();
    in_namespace(&ns_a, move || {
        let target = target_in_a;
        let writer = start(&cluster, 0, [10, 231, 0, 1], &[(1, target_addr)]);
        let mut ep = writer.connect(NodeId(1)).expect("connect across namespaces");

        ep.post_write(1, RemoteAddr::new(LOG, 0), &record(1), PostFlags::SIGNALED).expect("post");
        assert_eq!(wait_completion(&mut ep).0.status, Ok(()));
        let mut landed = [0u8; 64];
        target.read_local(LOG, 0, &mut landed).expect("read");
        assert_eq!(landed.to_vec(), record(1), "the write landed in the other namespace");
        ep.post_read(2, RemoteAddr::new(LOG, 0), 64, SCRATCH, 0, PostFlags::SIGNALED).expect("post read");
        assert_eq!(wait_completion(&mut ep).0.status, Ok(()));
        let mut read = [0u8; 64];
        writer.read_local(SCRATCH, 0, &mut read).expect("read");
        assert_eq!(read.to_vec(), record(1), "the read returned the other namespace's memory");

        ip(&["-n", &link_a, "link", "set", "veth0", "down"]).expect("partition");
        ep.post_write(3, RemoteAddr::new(LOG, 0), &record(3), PostFlags::SIGNALED).expect("post");
        let (failed, after) = wait_completion(&mut ep);
        assert!(failed.status.is_err(), "a write across a partition must fail: {failed:?}");
        assert_eq!(ep.state(), EndpointState::Error);
        eprintln!("tcp_netns: partitioned write failed with {:?} after {after:?}", failed.status);
        let refused = Instant::now();
        assert!(ep.reconnect().is_err(), "reconnect across a partition must fail");
        eprintln!("tcp_netns: reconnect during the partition failed after {:?}", refused.elapsed());

        ip(&["-n", &link_a, "link", "set", "veth0", "up"]).expect("heal");
        let healed = Instant::now();
        while let Err(e) = ep.reconnect() {
            assert!(healed.elapsed() < DEADLINE, "reconnect after the heal kept failing: {e}");
            // Back off between attempts while the link comes back up (a retry, not a timing check).
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ep.state(), EndpointState::Ready);
        ep.post_write(4, RemoteAddr::new(LOG, 0), &record(4), PostFlags::SIGNALED).expect("post");
        assert_eq!(wait_completion(&mut ep).0.status, Ok(()));
        target.read_local(LOG, 0, &mut landed).expect("read");
        assert_eq!(landed.to_vec(), record(4), "writes land again after the heal");
    });
}
