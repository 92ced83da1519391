//! The system under test: a local microrep cluster (one `microrep node` process per replica,
//! shm or tcp fabric, RESP2 on loopback, or each replica in its own network namespace), the
//! replicas of `microrep wrap` around an unmodified redis-server (`crate::wrap`), or, as the
//! positive control, one `redis-server`.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use microrep::config::NodeConfig;
use microrep_testkit::KitError;
use microrep_testkit::cleanup::PidRegistry;
use microrep_testkit::client::{Client, RespError, Value as Reply};
use microrep_testkit::cluster::{self, ClusterSpec, FabricSpec};
use microrep_testkit::procs::{Procs, Spec};

use crate::applied;
use crate::membership::Departures;
use crate::netns::Network;
use crate::procs;
use crate::wrap;

/// Which system to test.
#[derive(Clone, Debug)]
pub(crate) enum TargetKind {
    /// `replicas` `microrep node` processes; `planted_bug` names a deliberate protocol bug
    /// (negative control; the binary must be built with the `planted-bugs` feature).
    /// With `netns`, each replica runs in its own network namespace (tcp fabric only). With
    /// `durable`, each keeps a durable log (`cluster.durability = "fsync"`) in a data directory
    /// of its own. `spares` more ids run as spares: `cluster.initial_members` is the first
    /// `replicas` ids (docs/CONFIG.md, "Membership changes").
    Microrep {
        binary: PathBuf,
        replicas: u16,
        spares: u16,
        planted_bug: Option<String>,
        fabric: FabricChoice,
        netns: bool,
        durable: bool,
        /// How the nodes' servers propose (`node.mode`).
        mode: microrep::config::AttachMode,
    },
    /// One `redis-server` without persistence.
    Redis { binary: PathBuf },
    /// `replicas` replicas of `microrep wrap` (the `microrep` binary) around `redis`.
    WrapRedis { microrep: PathBuf, redis: PathBuf, replicas: u16 },
}

/// The fabric the replicas of a microrep cluster share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FabricChoice {
    /// Shared-memory files in /dev/shm.
    Shm,
    /// TCP on loopback, a fabric port per member.
    Tcp,
}

/// Why a target could not be started, signalled or made ready.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("finding free ports: {0}")]
    FreePorts(std::io::Error),
    /// The configuration files could not be written, or a process started or signalled.
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    WrapPlan(#[from] wrap::PlanError),
    #[error(transparent)]
    WrapPause(#[from] wrap::PauseError),
    #[error("process {index} {status} during start-up (see its log)")]
    ExitedDuringStartUp { index: usize, status: String },
    /// The last PING's error, if any was sent (a microrep target is asked for a leader instead).
    #[error(
        "not ready before the deadline ({})",
        last.as_ref().map_or_else(|| "not asked yet".into(), ToString::to_string)
    )]
    NotReady { last: Option<PingError> },
}

/// Why node `node`'s status could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatusError {
    #[error("node {node}: {source}")]
    Connect { node: usize, source: std::io::Error },
    #[error("node {node}: {source}")]
    Call { node: usize, source: RespError },
    #[error("node {node}: bad status: {source}")]
    BadStatus { node: usize, source: serde_json::Error },
    #[error("node {node}: MICROREP.STATUS replied {reply:?}")]
    Unexpected { node: usize, reply: Reply },
    #[error("node {node}: {source}")]
    Wrap { node: usize, source: wrap::ReplicaStatusError },
}

/// Recorded in artifacts (`convergence.json`) as its message.
impl serde::Serialize for StatusError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Why a node did not answer PING.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PingError {
    #[error("connecting: {0}")]
    Connect(std::io::Error),
    #[error("PING: {0}")]
    Call(#[from] RespError),
    #[error("PING replied {0:?}")]
    Unexpected(Reply),
}

/// A replica's answer to `MICROREP.STATUS`.
pub(crate) type NodeStatus = microrep::NodeStatus;

/// Whether `status` says its node leads.
pub(crate) fn is_leader(status: &NodeStatus) -> bool {
    status.role == microrep_core::mu::Role::Leader
}

/// A started target: its processes and where clients connect.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) kind: TargetKind,
    pub(crate) nodes: Vec<SocketAddr>,
    procs: Arc<Mutex<Procs>>,
    /// The namespaces of the replicas, with `--netns`.
    pub(crate) network: Option<Network>,
    /// The replicas' directories, for a wrapped server.
    wrap_dirs: Vec<PathBuf>,
    /// How many members the cluster starts with (the other nodes are spares).
    pub(crate) initial_members: usize,
    /// Members being removed, and removed ones that stopped (crate::membership).
    pub(crate) departures: Departures,
}

/// The port every replica of a namespaced cluster serves clients on (each has its own address).
const NETNS_CLIENT_PORT: u16 = 6379;
/// The port of every namespaced replica's fabric.
const NETNS_FABRIC_PORT: u16 = 7000;

/// The shm fabric's directory of the cluster `name`.
pub(crate) fn shm_dir(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(format!("microrep-{name}"))
}

/// Picks `n` distinct free loopback ports (free when asked; the OS could hand them out again
/// before the servers bind, which shows up as a start-up failure, never as a wrong result).
fn free_ports(n: usize) -> Result<Vec<SocketAddr>, TargetError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr().map(|a| (l, a))))
        .collect::<Result<Vec<_>, _>>()
        .map_err(TargetError::FreePorts)?;
    Ok(listeners.into_iter().map(|(_, addr)| addr).collect())
}

impl Target {
    /// Writes the configuration files into `dir` and starts every process; a namespaced cluster
    /// runs in `network`.
    pub(crate) fn start(
        kind: TargetKind,
        dir: &Path,
        name: &str,
        pids: PidRegistry,
        network: Option<Network>,
    ) -> Result<Self, TargetError> {
        let mut wrap_dirs = Vec::new();
        let (specs, nodes) = match &kind {
            TargetKind::Microrep { binary, replicas, spares, planted_bug, fabric, durable, mode, .. } => {
                let n = usize::from(*replicas + *spares);
                let (nodes, fabric_addrs) = match &network {
                    Some(_) => (0..n)
                        .map(|i| {
                            let ip = Network::replica_ip(i);
                            (SocketAddr::new(ip, NETNS_CLIENT_PORT), SocketAddr::new(ip, NETNS_FABRIC_PORT))
                        })
                        .unzip(),
                    None => {
                        let mut ports = free_ports(2 * n)?;
                        let fabric_addrs = ports.split_off(n);
                        (ports, fabric_addrs)
                    }
                };
                let spec = ClusterSpec {
                    name: name.to_string(),
                    clients: nodes.clone(),
                    fabric: match fabric {
                        FabricChoice::Shm => FabricSpec::Shm { dir: shm_dir(name) },
                        FabricChoice::Tcp => FabricSpec::Tcp { nics: fabric_addrs },
                    },
                };
                let node = |id| NodeConfig {
                    planted_bug: planted_bug.clone(),
                    events: Some(applied::events_path(dir, usize::from(id))),
                    data_dir: durable.then(|| dir.join(format!("node-{id}.data"))),
                    mode: *mode,
                    ..NodeConfig::new(id)
                };
                let mut config = spec.cluster_config();
                if *durable {
                    config.durability = microrep::config::Durability::Fsync;
                }
                if *spares > 0 {
                    config.initial_members = Some((0..*replicas).collect());
                }
                let paths = cluster::write_configs(dir, &config, node)?;
                let mut specs = Vec::new();
                for (id, path) in (0..*replicas + *spares).zip(paths) {
                    let node_args = ["node".into(), "--config".into(), path.into_os_string()];
                    let (program, args) = match &network {
                        Some(net) => {
                            let prefix = net.exec_prefix(usize::from(id)).into_iter().map(Into::into);
                            let program = std::iter::once(binary.clone().into_os_string());
                            ("ip".into(), prefix.chain(program).chain(node_args).collect())
                        }
                        None => (binary.clone(), node_args.to_vec()),
                    };
                    // The nodes inherit the harness's RUST_LOG: it reads their events, not their logs.
                    specs.push(Spec { program, args, log: dir.join(format!("node-{id}.log")), env: Vec::new() });
                }
                (specs, nodes)
            }
            TargetKind::Redis { binary } => {
                let nodes = free_ports(1)?;
                let port = nodes[0].port().to_string();
                let args = ["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
                let spec = Spec {
                    program: binary.clone(),
                    args: args.iter().map(Into::into).collect(),
                    log: dir.join("redis.log"),
                    env: Vec::new(),
                };
                (vec![spec], nodes)
            }
            TargetKind::WrapRedis { microrep, redis, replicas } => {
                let plan = wrap::plan(microrep, redis, *replicas, &shm_dir(name), dir)?;
                wrap_dirs = plan.dirs;
                (plan.specs, plan.nodes)
            }
        };
        let events: Vec<PathBuf> = (0..specs.len()).map(|i| applied::events_path(dir, i)).collect();
        let fenced = Box::new(move |pid| procs::fenced_by_a_peer(&events, pid));
        let mut procs = Procs::new(specs, pids).with_fence_check(fenced);
        for i in 0..procs.len() {
            procs.start(i)?;
        }
        let initial_members = match &kind {
            TargetKind::Microrep { replicas, .. } => usize::from(*replicas),
            _ => nodes.len(),
        };
        let procs = Arc::new(Mutex::new(procs));
        Ok(Self { kind, nodes, procs, network, wrap_dirs, initial_members, departures: Departures::default() })
    }

    /// The processes, for the nemesis.
    pub(crate) fn procs(&self) -> MutexGuard<'_, Procs> {
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_microrep(&self) -> bool {
        matches!(self.kind, TargetKind::Microrep { .. })
    }

    /// Whether this is a wrapped server.
    pub(crate) fn is_wrapped(&self) -> bool {
        matches!(self.kind, TargetKind::WrapRedis { .. })
    }

    /// The wrapped replicas' directories (empty for other targets).
    pub(crate) fn wrap_dirs(&self) -> &[PathBuf] {
        &self.wrap_dirs
    }

    /// Whether the target has replicas that report their status (the nemesis picks leaders
    /// and followers among them).
    fn replicated(&self) -> bool {
        self.is_microrep() || self.is_wrapped()
    }

    /// Asks node `node` for its status (a wrapped replica through its state socket: a copy that
    /// does not hold the data yet counts as recovering).
    pub(crate) fn status(&self, node: usize, timeout: Duration) -> Result<NodeStatus, StatusError> {
        if let Some(dir) = self.wrap_dirs.get(node) {
            return wrap::status(dir, timeout).map_err(|source| StatusError::Wrap { node, source });
        }
        let mut client =
            Client::connect(self.nodes[node], timeout).map_err(|source| StatusError::Connect { node, source })?;
        match client.call(&[b"MICROREP.STATUS"]).map_err(|source| StatusError::Call { node, source })? {
            Reply::Bulk(Some(json)) => {
                serde_json::from_slice(&json).map_err(|source| StatusError::BadStatus { node, source })
            }
            reply => Err(StatusError::Unexpected { node, reply }),
        }
    }

    /// The node that says it leads, among the running and unpaused ones.
    pub(crate) fn leader(&self, timeout: Duration) -> Option<usize> {
        if !self.replicated() {
            return Some(0);
        }
        self.leader_status(timeout).map(|s| usize::from(s.node))
    }

    /// The status of the node that says it leads, among the running and unpaused ones.
    pub(crate) fn leader_status(&self, timeout: Duration) -> Option<NodeStatus> {
        self.up_nodes().into_iter().find_map(|i| self.status(i, timeout).ok().filter(is_leader))
    }

    /// The members of the latest configuration a running node reports (the highest epoch);
    /// the initial members if none reports one (a wrapped server's replicas report none).
    pub(crate) fn members(&self, timeout: Duration) -> Vec<usize> {
        let latest = self
            .up_nodes()
            .into_iter()
            .filter_map(|i| self.status(i, timeout).ok())
            .filter(|s| !s.members.is_empty())
            .max_by_key(|s| s.epoch);
        match latest {
            Some(s) => s.members.iter().map(|&m| usize::from(m)).collect(),
            None => (0..self.initial_members).collect(),
        }
    }

    /// The running, unpaused nodes outside `members` that are not being removed, those that
    /// say they caught up if any do (the leader adds no other).
    pub(crate) fn spares(&self, members: &[u16], timeout: Duration) -> Vec<usize> {
        let outside: Vec<usize> = self
            .up_nodes()
            .into_iter()
            .filter(|&i| !members.iter().any(|&m| usize::from(m) == i) && !self.departures.is_leaving(i))
            .collect();
        let caught_up: Vec<usize> =
            outside.iter().copied().filter(|&i| self.status(i, timeout).is_ok_and(|s| !s.recovering)).collect();
        if caught_up.is_empty() { outside } else { caught_up }
    }

    /// Reaps the processes that ended on their own: a removed member that stopped when asked to
    /// leave departed (crate::membership); any other end is in `procs().exits`.
    pub(crate) fn reap_exited(&self) {
        let mut procs = self.procs();
        let pids: Vec<Option<i32>> = (0..procs.len()).map(|i| procs.pid(i)).collect();
        let from = procs.exits.len();
        procs.reap_exited();
        self.departures.take_exits(&mut procs.exits, from, &pids);
    }

    /// Starts again, as spares, the removed members that stopped, except those in `busy`.
    pub(crate) fn restart_departed(&self, busy: &BTreeSet<usize>) -> Result<Vec<usize>, KitError> {
        self.reap_exited();
        self.departures.restart(&mut self.procs(), busy)
    }

    /// The running, unpaused nodes not known to be voters: those that say they are recovering
    /// from a restart, and those whose status could not be read in time (on an overloaded
    /// machine a recovering node may not answer; counting it as a voter let the nemesis kill
    /// the last replica holding the data, seed 100063).
    pub(crate) fn not_voters(&self, timeout: Duration) -> Vec<usize> {
        if !self.replicated() {
            return Vec::new();
        }
        self.up_nodes().into_iter().filter(|&i| !self.status(i, timeout).is_ok_and(|s| !s.recovering)).collect()
    }

    /// Every node that says it leads (a partitioned old leader may still say so).
    pub(crate) fn leaders(&self, timeout: Duration) -> Vec<usize> {
        self.up_nodes().into_iter().filter(|&i| self.status(i, timeout).is_ok_and(|s| is_leader(&s))).collect()
    }

    /// SIGSTOPs process `i` (a wrapped replica with its server copy).
    pub(crate) fn pause(&self, procs: &mut Procs, i: usize) -> Result<(), TargetError> {
        procs.pause(i)?;
        match procs.pid(i) {
            Some(pid) if self.is_wrapped() => Ok(wrap::pause_descendants(pid)?),
            _ => Ok(()),
        }
    }

    /// SIGCONTs process `i` (a wrapped replica's server copy first), or restarts it if it
    /// was fenced while paused.
    pub(crate) fn resume(&self, procs: &mut Procs, i: usize) -> Result<(), TargetError> {
        if let Some(pid) = procs.pid(i).filter(|_| self.is_wrapped()) {
            wrap::resume_descendants(pid)?;
        }
        Ok(procs.resume(i)?)
    }

    fn up_nodes(&self) -> Vec<usize> {
        let procs = self.procs();
        (0..self.nodes.len()).filter(|&i| procs.is_up(i)).collect()
    }

    /// Waits until the target serves requests: redis answers PING, a microrep node says it
    /// leads, a wrapped copy answers PING (the leader's, once it serves).
    pub(crate) fn wait_ready(&self, deadline: Instant) -> Result<(), TargetError> {
        let mut last = None;
        while Instant::now() < deadline {
            let ready = if self.is_microrep() {
                self.leader(Duration::from_millis(200)).is_some()
            } else {
                self.nodes.iter().any(|&node| ping(node).map_err(|e| last = Some(e)).is_ok())
            };
            if ready {
                return Ok(());
            }
            // A wrapped replica's own exits are the supervisor's to restart (crate::wrap).
            self.reap_exited();
            if let Some(exit) = self.procs().exits.first().filter(|_| !self.is_wrapped()) {
                return Err(TargetError::ExitedDuringStartUp { index: exit.index, status: exit.status.clone() });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(TargetError::NotReady { last })
    }
}

fn ping(addr: SocketAddr) -> Result<(), PingError> {
    let mut client = Client::connect(addr, Duration::from_millis(200)).map_err(PingError::Connect)?;
    match client.call(&[b"PING"])? {
        Reply::Simple(s) if s == "PONG" => Ok(()),
        reply => Err(PingError::Unexpected(reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status as a replica reports it.
    fn status_json(node: u16, role: &str, recovering: bool) -> String {
        format!(
            r#"{{"node":{node},"role":"{role}","leader":0,"phase":"idle","proposal_number":1,"fuo":2,"applied":2,
                "tail":0,"confirmed":[],"pending":0,"terms_led":1,"prepares":1,"recovering":{recovering},
                "digest":"ab12","fingerprint":"00","uptime_ms":5,"leader_changes":[],"fatal":null}}"#
        )
    }

    #[test]
    fn a_status_reads_into_the_runtime_struct() {
        let s: NodeStatus = serde_json::from_str(&status_json(1, "leader", false)).expect("a status");
        assert!(is_leader(&s) && !s.recovering);
        assert_eq!((s.node, s.applied, s.digest.as_deref()), (1, 2, Some("ab12")));
        assert!(serde_json::from_str::<NodeStatus>("{\"node\":1}").is_err(), "a partial status is refused");
    }

    /// A one-connection fake replica: answers `MICROREP.STATUS` with `status`, or with `None`
    /// hangs up without answering (its status cannot be read).
    fn fake_replica(status: Option<String>) -> (SocketAddr, std::thread::JoinHandle<()>) {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serve = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut request = [0u8; 256];
            let _ = conn.read(&mut request).expect("request");
            if let Some(json) = status {
                conn.write_all(format!("${}\r\n{json}\r\n", json.len()).as_bytes()).expect("reply");
            }
        });
        (addr, serve)
    }

    /// Seed 100063: a node whose status cannot be read must not pass for a voter, or the
    /// nemesis may take down the last replica that holds the data.
    #[test]
    fn only_nodes_that_say_they_are_voters_count_as_voters() {
        let replies = [Some(status_json(0, "leader", false)), Some(status_json(1, "follower", true)), None];
        let (nodes, servers): (Vec<SocketAddr>, Vec<_>) = replies.into_iter().map(fake_replica).unzip();
        let log = std::env::temp_dir().join(format!("microrep-faults-voters-{}.log", std::process::id()));
        let sleeper = Spec { program: "sleep".into(), args: vec!["30".into()], log: log.clone(), env: Vec::new() };
        let mut procs = Procs::new(vec![sleeper; 3], PidRegistry::default());
        for i in 0..3 {
            procs.start(i).expect("start a stand-in process");
        }
        let kind = TargetKind::Microrep {
            binary: "microrep".into(),
            replicas: 3,
            spares: 0,
            planted_bug: None,
            fabric: FabricChoice::Shm,
            netns: false,
            durable: false,
            mode: microrep::config::AttachMode::Handover,
        };
        let target = Target {
            kind,
            nodes,
            procs: Arc::new(Mutex::new(procs)),
            network: None,
            wrap_dirs: Vec::new(),
            initial_members: 3,
            departures: Departures::default(),
        };
        // Generous: no answer here depends on time (the silent one hangs up at once).
        assert_eq!(target.not_voters(Duration::from_secs(10)), [1, 2]);
        drop(target);
        for server in servers {
            server.join().expect("fake replica");
        }
        let _ = std::fs::remove_file(log);
    }

    #[test]
    fn writes_one_config_per_member_through_the_runtime() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-configs-{}", std::process::id()));
        let kind = TargetKind::Microrep {
            binary: "true".into(),
            replicas: 2,
            spares: 1,
            planted_bug: None,
            fabric: FabricChoice::Tcp,
            netns: false,
            durable: false,
            mode: microrep::config::AttachMode::Handover,
        };
        std::fs::create_dir_all(&dir).expect("dir");
        let target = Target::start(kind, &dir, "t", PidRegistry::default(), None).expect("start stand-ins");
        let config = microrep::Config::load(&dir.join("node-1.toml"), &[]).expect("a valid config");
        assert_eq!((config.node.id, config.cluster.name.as_str()), (1, "t"));
        assert_eq!(config.cluster.client_addr(0).expect("member 0"), target.nodes[0]);
        assert!(config.cluster.fabric_addr(1).is_ok(), "tcp members name their fabric address");
        // The spare has an id, addresses and a configuration of its own, outside the initial members.
        let spare = microrep::Config::load(&dir.join("node-2.toml"), &[]).expect("the spare's config");
        assert_eq!((target.nodes.len(), target.initial_members), (3, 2));
        assert_eq!(spare.cluster.client_addr(2).expect("id 2"), target.nodes[2]);
        assert_eq!(spare.cluster.initial_members, Some(vec![0, 1]));
        drop(target);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
