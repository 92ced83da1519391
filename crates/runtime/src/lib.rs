//! microrep: replicate a deterministic application with Mu (OSDI'20) over a one-sided fabric.
//!
//! A [`Node`] is one replica: a replication-plane thread that appends commands to the
//! followers' logs with one-sided writes and applies committed ones, and a background-plane
//! thread that runs heartbeats, leader election and write permissions. The application
//! implements [`Apply`]; every replica applies the same commands in the same order.
//! Proposing threads attach in one of two modes ([`config::AttachMode`], Mu §7.1): **direct**
//! (the proposing thread drives replication itself: lowest latency) or **handover** (a
//! lock-free queue to the replication thread, which batches waiting commands into one entry).
//! A proposer with many commands at hand passes them together: [`Node::submit_batch`] makes
//! them one log entry with one completion ([`BatchCommitted`]), in either mode.
//!
//! # Example: three replicas in one process on the shm fabric
//! ```
//! use microrep::{Apply, Config, Index, Node, ProposeError, RestoreError};
//! use microrep::config::{ClusterConfig, NodeConfig};
//!
//! /// A counter: every command adds its first byte.
//! #[derive(Default)]
//! struct Counter(u64);
//!
//! impl Apply for Counter {
//!     fn apply(&mut self, _index: Index, command: &[u8], reply: &mut Vec<u8>) {
//!         self.0 += u64::from(command[0]);
//!         reply.extend_from_slice(&self.0.to_le_bytes());
//!     }
//!     fn snapshot(&self, out: &mut Vec<u8>) {
//!         out.extend_from_slice(&self.0.to_le_bytes());
//!     }
//!     fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
//!         let bytes = snapshot.try_into().map_err(|_| RestoreError::Length { got: snapshot.len(), expected: "8 bytes" })?;
//!         self.0 = u64::from_le_bytes(bytes);
//!         Ok(())
//!     }
//! }
//!
//! let dir = std::env::temp_dir().join(format!("microrep-doc-{}", std::process::id()));
//! let mut cluster = ClusterConfig::local("doc", 3, 16_380);
//! cluster.shm_dir = Some(dir.clone());
//! let nodes: Vec<Node> = (0..3)
//!     .map(|id| {
//!         let config = Config { cluster: cluster.clone(), node: NodeConfig::new(id) };
//!         microrep::start_on_shm(&config, Counter::default()).expect("start")
//!     })
//!     .collect();
//!
//! // Replica 0 (the lowest live id) becomes leader; while the cluster starts, proposals may
//! // be refused until it has acquired its followers' write permissions.
//! let reply = loop {
//!     match nodes[0].propose(&[5]) {
//!         Ok(committed) => break committed.reply,
//!         Err(ProposeError::NotLeader { .. } | ProposeError::Backlogged) => std::thread::yield_now(),
//!         Err(e) => panic!("{e}"),
//!     }
//! };
//! assert_eq!(reply, 5u64.to_le_bytes());
//! // Every replica applied it (or soon will); a follower's propose fails with NotLeader.
//! drop(nodes);
//! std::fs::remove_dir_all(&dir).expect("cleanup");
//! ```

mod api;
mod batch;
mod batch_submit;
pub mod config;
mod counter;
mod durable;
mod engine;
pub mod events;
mod generation;
mod identity;
pub mod idle;
mod metrics;
pub mod multicast;
pub mod multicast_topics;
mod node;
pub mod realtime;
mod status;
mod ticket;
#[cfg(feature = "verbs")]
mod verbs;
mod watchers;

pub use api::{Apply, Committed, Index, ProposeError, RestoreError};
pub use batch_submit::{BatchCommitted, MAX_BATCH_COMMANDS, PendingBatch, batch_entry_bytes};
pub use config::{Config, ConfigError};
pub use counter::Counter;
pub use durable::DurableError;
pub use generation::GenerationError;
pub use metrics::MetricNameError;
pub use microrep_core::mu::{Configuration, MemberSet, MembershipChange};
pub use microrep_fabric::NodeId;
pub use node::{Node, Pending, StartError, monotonic_ns, regions};
pub use status::{LeaderChange, NodeStatus};
#[cfg(feature = "verbs")]
pub use verbs::{start_on_verbs, verbs_config};

use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::tcp::{TcpConfig, TcpFabric};

/// Starts `config`'s node on the fabric its `cluster.fabric` names.
pub fn start<A: Apply>(config: &Config, app: A) -> Result<Node, StartError> {
    match config.cluster.fabric {
        config::FabricKind::Shm => start_on_shm(config, app),
        config::FabricKind::Tcp => start_on_tcp(config, app),
        #[cfg(feature = "verbs")]
        config::FabricKind::Verbs => start_on_verbs(config, app),
        #[cfg(not(feature = "verbs"))]
        config::FabricKind::Verbs => Err(StartError::NotBuilt { fabric: config::FabricKind::Verbs }),
    }
}

/// Starts `config`'s node on the tcp fabric (`cluster.members[*].fabric` addresses).
pub fn start_on_tcp<A: Apply>(config: &Config, app: A) -> Result<Node, StartError> {
    config.validate()?;
    let cluster = &config.cluster;
    let replicas = cluster.members.len() as u16;
    let me = config.node.id;
    let peers = (0..replicas).filter(|&p| p != me).map(|p| Ok((NodeId(p), cluster.fabric_addr(p)?)));
    let peers: Vec<(NodeId, std::net::SocketAddr)> = peers.collect::<Result<_, ConfigError>>()?;
    let mut tcp = TcpConfig::new(&cluster.name, NodeId(me), replicas, cluster.fabric_addr(me)?, &regions(config)?)
        .with_peers(peers);
    // Room for the largest operation Mu posts: a snapshot READ.
    tcp.max_op_bytes = tcp.max_op_bytes.max(cluster.log.snapshot_bytes.saturating_add(4096));
    Node::start(config, TcpFabric::start(tcp)?, app)
}

/// Starts `config`'s node on the shm fabric (in `cluster.shm_dir`), applying commands to `app`.
pub fn start_on_shm<A: Apply>(config: &Config, app: A) -> Result<Node, StartError> {
    config.validate()?;
    let dir = config.cluster.shm_dir();
    let replicas = config.cluster.members.len() as u16;
    let mut shm = ShmConfig::new(dir, NodeId(config.node.id), replicas, &regions(config)?);
    // The poll loops retry unreachable peers themselves; a connect that waited for a peer
    // would stall heartbeats meanwhile.
    shm.connect_timeout = std::time::Duration::ZERO;
    let events = events::EventLog::open(config.node.events.as_deref())?;
    if events.is_on() {
        shm.on_fence = Some(microrep_fabric::shm::FenceHook::new(move |writer, pid| {
            events.emit(events::NodeEvent::Fenced { writer: writer.0, pid });
        }));
    }
    Node::start(config, ShmFabric::start(shm)?, app)
}
