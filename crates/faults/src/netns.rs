//! A private network of namespaces for one history (`--netns`): replica `i` lives alone in
//! namespace `<prefix>-<i>` with address 10.77.0.(i+1) on its `eth0`, whose veth peer `h<i>` is a
//! port of bridge `br0` in a hub namespace `<prefix>-hub` (10.77.0.254). The harness's own
//! threads (clients, nemesis, status queries) move into the hub, so nothing is added to the
//! host's namespace and the addresses cannot clash with anything, not even with another run.
//!
//! Two kinds of network fault:
//! - a **partition**: nftables rules in the hub's bridge table drop frames between two sets of
//!   replicas, silently as a switch would, while clients in the hub still reach every replica
//!   (a partitioned old leader keeps its clients);
//! - a **link down**: the hub's end of a replica's veth goes down; the replica is cut off from
//!   everyone, clients included.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables).

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;
use std::process::Command;

/// The private subnet 10.77.0.0/24 (only inside the namespaces of one history).
const SUBNET: [u8; 3] = [10, 77, 0];
/// The hub's address, from which clients connect.
const HUB_HOST: u8 = 254;
/// Every namespace name starts with this, then the pid of the harness that made it.
const NAME_PREFIX: &str = "mrf";
/// The bridge-family nftables table and chain of partitions in the hub.
const TABLE: &str = "microrep_partitions";
const CHAIN: &str = "forward";

/// The namespaces of one history.
#[derive(Debug)]
pub(crate) struct Network {
    hub: String,
    replicas: Vec<String>,
}

/// Why the namespaces, links or partitions of `--netns` could not be made or undone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetnsError {
    #[error("--netns needs root (network namespaces)")]
    NotRoot,
    #[error("--netns needs `{tool}` (Debian package {package})")]
    MissingTool { tool: &'static str, package: &'static str },
    #[error("running {program}: {source}")]
    Run { program: String, source: std::io::Error },
    /// A command exited with an error; `stderr` is what it said.
    #[error("{command}: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("no namespace names")]
    NoNames,
    #[error("nft printed no rule handle: {0}")]
    NoRuleHandle(String),
    #[error("opening {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("entering namespace {name}: {source}")]
    Enter { name: String, source: rustix::io::Errno },
}

/// Why `--netns` cannot run here, if it cannot.
pub(crate) fn missing_prerequisite() -> Option<NetnsError> {
    if !rustix::process::geteuid().is_root() {
        return Some(NetnsError::NotRoot);
    }
    for (tool, arg, package) in [("ip", "-V", "iproute2"), ("nft", "--version", "nftables")] {
        if Command::new(tool).arg(arg).output().is_err() {
            return Some(NetnsError::MissingTool { tool, package });
        }
    }
    None
}

fn run(program: &str, args: &[&str]) -> Result<String, NetnsError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| NetnsError::Run { program: program.to_string(), source })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let command = format!("{program} {}", args.join(" "));
        Err(NetnsError::Failed { command, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Deletes network namespace `name` (processes still inside keep it alive until they end).
pub(crate) fn delete(name: &str) -> Result<(), NetnsError> {
    run("ip", &["netns", "del", name]).map(drop)
}

/// Deletes the namespaces left by harness runs that no longer exist (killed before cleaning up).
pub(crate) fn remove_stale() -> Result<(), NetnsError> {
    let listing = run("ip", &["netns", "list"])?;
    for name in listing.lines().filter_map(|line| line.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix(NAME_PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete(name)?;
        }
    }
    Ok(())
}

impl Network {
    /// The namespace names of `replicas` replicas for this process and `tag`, hub first.
    pub(crate) fn names(tag: &str, replicas: usize) -> Vec<String> {
        let prefix = format!("{NAME_PREFIX}{}-{tag}", std::process::id());
        std::iter::once(format!("{prefix}-hub")).chain((0..replicas).map(|i| format!("{prefix}-{i}"))).collect()
    }

    /// Creates the namespaces `names` (from [`Network::names`]), the bridge and the links. On
    /// error, whatever was created is left for the caller to delete (it knows the names).
    pub(crate) fn create(names: &[String]) -> Result<Self, NetnsError> {
        let (hub, replicas) = names.split_first().ok_or(NetnsError::NoNames)?;
        for name in names {
            run("ip", &["netns", "add", name])?;
        }
        let hub_ip = |args: &[&str]| run("ip", &[&["-n", hub.as_str()], args].concat());
        hub_ip(&["link", "add", "br0", "type", "bridge"])?;
        hub_ip(&["addr", "add", &format!("{}/24", host(HUB_HOST)), "dev", "br0"])?;
        hub_ip(&["link", "set", "br0", "up"])?;
        hub_ip(&["link", "set", "lo", "up"])?;
        for (i, ns) in replicas.iter().enumerate() {
            let port = format!("h{i}");
            hub_ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
            hub_ip(&["link", "set", &port, "master", "br0"])?;
            hub_ip(&["link", "set", &port, "up"])?;
            let address = format!("{}/24", Self::replica_ip(i));
            run("ip", &["-n", ns, "addr", "add", &address, "dev", "eth0"])?;
            run("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let network = Self { hub: hub.clone(), replicas: replicas.to_vec() };
        network.nft(&format!(
            "add table bridge {TABLE}; add chain bridge {TABLE} {CHAIN} {{ type filter hook forward priority 0; }}"
        ))?;
        Ok(network)
    }

    /// Replica `i`'s address.
    pub(crate) fn replica_ip(i: usize) -> IpAddr {
        host(u8::try_from(i + 1).expect("at most 9 replicas"))
    }

    /// The command prefix that runs a program inside replica `i`'s namespace (`ip netns exec`
    /// execs the program, so the child's pid is the program's).
    pub(crate) fn exec_prefix(&self, i: usize) -> Vec<String> {
        vec!["netns".into(), "exec".into(), self.replicas[i].clone()]
    }

    /// Moves the calling thread into the hub namespace; threads it spawns afterwards start there.
    pub(crate) fn enter_hub(&self) -> Result<(), NetnsError> {
        enter(&self.hub)
    }

    /// Cuts replicas `cut` off from replicas `rest` in both directions; returns the handles of
    /// the rules, for [`Network::heal`].
    pub(crate) fn partition(&self, cut: &[usize], rest: &[usize]) -> Result<Vec<u64>, NetnsError> {
        let set = |nodes: &[usize]| {
            let ips: Vec<String> = nodes.iter().map(|&i| Self::replica_ip(i).to_string()).collect();
            format!("{{ {} }}", ips.join(", "))
        };
        let mut handles = Vec::new();
        for (from, to) in [(cut, rest), (rest, cut)] {
            let rule = format!("add rule bridge {TABLE} {CHAIN} ip saddr {} ip daddr {} drop", set(from), set(to));
            let echoed = self.nft_echo(&rule)?;
            let handle = rule_handle(&echoed).ok_or(NetnsError::NoRuleHandle(echoed))?;
            handles.push(handle);
        }
        Ok(handles)
    }

    /// Deletes the partition rules `handles`.
    pub(crate) fn heal(&self, handles: &[u64]) -> Result<(), NetnsError> {
        for handle in handles {
            self.nft(&format!("delete rule bridge {TABLE} {CHAIN} handle {handle}"))?;
        }
        Ok(())
    }

    /// Sets the link of replica `i` up or down.
    pub(crate) fn set_link(&self, i: usize, up: bool) -> Result<(), NetnsError> {
        let state = if up { "up" } else { "down" };
        run("ip", &["-n", &self.hub, "link", "set", &format!("h{i}"), state]).map(drop)
    }

    fn nft(&self, script: &str) -> Result<String, NetnsError> {
        run("ip", &["netns", "exec", &self.hub, "nft", script])
    }

    fn nft_echo(&self, script: &str) -> Result<String, NetnsError> {
        run("ip", &["netns", "exec", &self.hub, "nft", "--echo", "--handle", script])
    }
}

/// Moves the calling thread into network namespace `name` (a thread's sockets live in its
/// namespace; the rest of the process stays where it was).
fn enter(name: &str) -> Result<(), NetnsError> {
    let path = format!("/run/netns/{name}");
    let ns = std::fs::File::open(&path).map_err(|source| NetnsError::Open { path: path.clone(), source })?;
    rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
        .map_err(|source| NetnsError::Enter { name: name.to_string(), source })
}

fn host(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], last))
}

/// The handle in nft's echo of an added rule (`... drop # handle 7`).
fn rule_handle(echo: &str) -> Option<u64> {
    echo.lines().find_map(|line| line.rsplit_once("# handle ")?.1.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_handle_in_nfts_echo() {
        let echo = "add rule bridge t forward ip saddr 10.77.0.1 ip daddr { 10.77.0.2, 10.77.0.3 } drop # handle 12\n\
                    # new generation 3 by process 26581 (nft)\n";
        assert_eq!(rule_handle(echo), Some(12));
        assert_eq!(rule_handle("# new generation 3\n"), None);
    }

    #[test]
    fn names_carry_the_pid_the_tag_and_the_role() {
        let names = Network::names("s7", 3);
        let pid = std::process::id();
        assert_eq!(
            names,
            [format!("mrf{pid}-s7-hub"), format!("mrf{pid}-s7-0"), format!("mrf{pid}-s7-1"), format!("mrf{pid}-s7-2")]
        );
        assert_eq!(Network::replica_ip(0).to_string(), "10.77.0.1");
    }

    /// Builds a network of two replicas and checks that a partition stops traffic between them
    /// but not from the hub, and that healing restores it. Needs root, `ip` and `nft`; without
    /// them it says why and checks nothing.
    #[test]
    fn a_partition_cuts_replicas_apart_but_not_from_the_hub() {
        if let Some(why) = missing_prerequisite() {
            eprintln!("skipped: {why}");
            return;
        }
        let names = Network::names("unit", 2);
        // The round trip runs (and may panic) on its own thread, so the namespaces are deleted
        // before the test fails.
        let result = std::thread::spawn({
            let names = names.clone();
            move || partition_round_trip(&names)
        })
        .join();
        for name in &names {
            let _ = delete(name);
        }
        result.expect("partition round trip");
    }

    fn partition_round_trip(names: &[String]) {
        let network = Network::create(names).expect("network");
        // A listener in replica 1's namespace, made by a thread that moved there.
        let ns1 = names[2].clone();
        let listener = std::thread::spawn(move || {
            enter(&ns1).expect("enter replica 1's namespace");
            std::net::TcpListener::bind((Network::replica_ip(1), 9000)).expect("listen")
        })
        .join()
        .expect("listener thread");
        // Whether a thread in namespace `ns` can connect to the listener. Dropped SYNs are
        // retried for seconds, so a blocked connect fails only by timing out: the bound is
        // generous (a slow machine must not look partitioned) and only a hang reaches it.
        let from_ns = |ns: String| {
            std::thread::spawn(move || {
                enter(&ns).expect("enter the namespace");
                let addr = std::net::SocketAddr::new(Network::replica_ip(1), 9000);
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)).is_ok()
            })
            .join()
            .expect("connect thread")
        };
        let (hub, r0) = (names[0].clone(), names[1].clone());
        assert!(from_ns(r0.clone()) && from_ns(hub.clone()), "no connectivity before the partition");
        let handles = network.partition(&[0], &[1]).expect("partition");
        assert!(!from_ns(r0.clone()), "replica 0 reached replica 1 through the partition");
        assert!(from_ns(hub.clone()), "the partition cut the hub off");
        network.heal(&handles).expect("heal");
        assert!(from_ns(r0), "no connectivity after the heal");
        network.set_link(1, false).expect("link down");
        assert!(!from_ns(hub.clone()), "the hub reached a replica whose link is down");
        network.set_link(1, true).expect("link up");
        drop(listener);
    }
}
