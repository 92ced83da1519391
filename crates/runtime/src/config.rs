//! The node configuration: one TOML file with a `[cluster]` part, which every member must hold
//! identically (checked through its [`ClusterConfig::fingerprint`]), and a `[node]` part for
//! this process. Command-line overrides (`key.path=value`) apply before validation, and every
//! error names the key at fault. The keys are documented in `docs/CONFIG.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use microrep_core::mu::{self, MuConfig};
use microrep_fabric::NodeId;
use serde::{Deserialize, Serialize};

use crate::idle::IdlePolicy;
use crate::realtime::Realtime;

/// A configuration that cannot be used; `key` is the dotted path of the offending setting.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{key}: {problem}")]
pub struct ConfigError {
    /// Dotted path of the key, e.g. `cluster.members[2].client`.
    pub key: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, problem: impl Into<String>) -> Self {
        Self { key: key.into(), problem: problem.into() }
    }
}

/// A whole configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// What all members share.
    pub cluster: ClusterConfig,
    /// This process.
    pub node: NodeConfig,
}

/// The part every member must agree on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Names the cluster (letters, digits, `-`, `_`; at most 64).
    pub name: String,
    /// The fabric the replicas share.
    #[serde(default)]
    pub fabric: FabricKind,
    /// Directory of the shm fabric's segments (default `/dev/shm/microrep-NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_dir: Option<PathBuf>,
    /// The replicas; ids must be `0..members.len()`. With `initial_members`, the ids not in it
    /// are spares: they run as joiners until `microrep member add` makes them members.
    pub members: Vec<Member>,
    /// The ids that form the cluster when it first starts (default: every member). From then
    /// on the members come from the log (`microrep member add|remove|replace`, docs/CONFIG.md
    /// "Membership changes"). Not rendered when absent, so the fingerprint of a cluster without
    /// it is what it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_members: Option<Vec<u16>>,
    /// The replicated log.
    #[serde(default)]
    pub log: LogConfig,
    /// Failure detection and protocol timeouts.
    #[serde(default)]
    pub timing: TimingConfig,
    /// Whether every member keeps a durable log of the committed entries (`node.data_dir/log`). Not
    /// rendered at its default, so the fingerprint of a cluster without it is what it was.
    #[serde(default, skip_serializing_if = "Durability::is_none")]
    pub durability: Durability,
}

/// Whether a cluster's members persist the committed entries (`cluster.durability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// State lives in fabric memory only: a cluster all of whose members restarted has lost it
    /// (with `node.data_dir`, it stops saying so instead of starting empty).
    #[default]
    None,
    /// Every member appends each committed entry to a local log with group commit and
    /// `fdatasync` (needs `node.data_dir`) before applying it; an entry is applied, and a
    /// command acknowledged, only once a majority of the members synced it, and a cluster all of whose members were killed comes back with
    /// every acknowledged write.
    Fsync,
}

impl Durability {
    fn is_none(&self) -> bool {
        *self == Self::None
    }
}

/// Which fabric carries the one-sided operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricKind {
    /// Processes on one host sharing memory files.
    #[default]
    Shm,
    /// Any hosts over TCP: each node's NIC thread serves its peers' one-sided operations
    /// (every member needs a `fabric` address).
    Tcp,
    /// RDMA NICs or soft-RoCE through libibverbs (a build with the `verbs` feature): every
    /// member needs a `fabric` address, where its bootstrap listener exchanges queue-pair
    /// addresses with its peers; the device is chosen by `node.verbs`.
    Verbs,
}

impl FabricKind {
    /// The fabric's name in the configuration file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shm => "shm",
            Self::Tcp => "tcp",
            Self::Verbs => "verbs",
        }
    }

    /// Whether members need a `fabric` address.
    fn addressed(self) -> bool {
        matches!(self, Self::Tcp | Self::Verbs)
    }
}

impl std::fmt::Display for FabricKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One replica of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Its id.
    pub id: u16,
    /// Where its clients connect (`host:port`); named in redirects to the leader.
    pub client: String,
    /// Where its fabric listens for peers (`host:port`): the tcp fabric's NIC thread, the verbs
    /// fabric's bootstrap listener. Not used by shm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
}

/// The replicated log's shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Bytes per slot, header included: bounds one command (or one batch).
    pub slot_bytes: u32,
    /// Slots in the circular log.
    pub slots: u32,
    /// Bytes reserved for the snapshot a lagging replica restores from.
    pub snapshot_bytes: u32,
    /// Applied entries between snapshots.
    pub snapshot_every: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { slot_bytes: 1024, slots: 4096, snapshot_bytes: 1 << 20, snapshot_every: 1024 }
    }
}

/// Failure detection and timeouts (Mu §5.1). The defaults suit processes sharing a small
/// machine: descheduling for a few hundred microseconds must not look like a failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingConfig {
    /// Period of heartbeat increments and of the pull-score reads.
    pub heartbeat_us: u64,
    /// While the cluster is idle (no work for 16 heartbeats), replicas heartbeat, and read each
    /// other's heartbeats, at this period instead: a whole number of `heartbeat_us` periods
    /// (rounded down; more than 255 of them is refused). Unset: [`DEFAULT_IDLE_HEARTBEAT_US`],
    /// or 255 heartbeats if those are shorter. An idle node then wakes about 30 times a second
    /// at the defaults instead of 1000. The price: a leader that crashes while idle is noticed
    /// up to this much later, and work arriving at an idle cluster is covered by fast detection
    /// only once the leader's next heartbeat announces it. 0 (or anything below
    /// `heartbeat_us`): heartbeat every period, idle or not. See
    /// [`TimingConfig::idle_heartbeat_us`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_heartbeat_us: Option<u64>,
    /// A live peer is declared failed when its score (0..=15) drops below this.
    pub score_fail_below: u8,
    /// A failed peer is declared recovered when its score rises above this.
    pub score_recover_above: u8,
    /// A leader making no progress this long stops heartbeating (fate sharing).
    pub fate_share_timeout_us: u64,
    /// How long a replica that fate-shared stays out of the running.
    pub fate_share_cooldown_us: u64,
    /// How long a would-be leader waits for permission acks before asking again.
    pub permission_timeout_us: u64,
    /// How long one quorum round may wait for a majority.
    pub round_timeout_us: u64,
    /// How often the leader recycles log slots.
    pub recycle_period_us: u64,
    /// 0: the leader recycles what a majority applied, and a slower follower restores a
    /// snapshot. Otherwise it recycles only what every confirmed follower applied, and leaves
    /// one behind only when the log is full and it applied nothing for this long (below
    /// `fate_share_timeout_us`).
    pub recycle_wait_us: u64,
    /// How often an idle follower checks whether it fell behind the log.
    pub lag_check_period_us: u64,
}

impl Default for TimingConfig {
    fn default() -> Self {
        Self {
            heartbeat_us: 1000,
            idle_heartbeat_us: None,
            score_fail_below: 2,
            score_recover_above: 6,
            fate_share_timeout_us: 50_000,
            fate_share_cooldown_us: 200_000,
            permission_timeout_us: 5000,
            round_timeout_us: 10_000,
            recycle_period_us: 1000,
            recycle_wait_us: 0,
            lag_check_period_us: 5000,
        }
    }
}

/// The idle heartbeat period when `cluster.timing.idle_heartbeat_us` is unset (capped at 255
/// heartbeats): an idle node wakes about 30 times a second, and costs about what an idle
/// redis-server costs (docs/BENCHMARKS.md, "An idle node's threads wake only for heartbeats").
pub const DEFAULT_IDLE_HEARTBEAT_US: u64 = 32_000;

impl TimingConfig {
    /// How long a live peer (score 15) stays silent before it is declared failed while the
    /// cluster is busy: `16 - score_fail_below` heartbeat periods.
    pub fn detection(&self) -> std::time::Duration {
        let periods = 16u64.saturating_sub(u64::from(self.score_fail_below));
        std::time::Duration::from_micros(periods.saturating_mul(self.heartbeat_us))
    }

    /// The idle heartbeat period in effect: the one set, else [`DEFAULT_IDLE_HEARTBEAT_US`]
    /// or 255 heartbeats, whichever is shorter.
    pub fn idle_heartbeat_us(&self) -> u64 {
        self.idle_heartbeat_us.unwrap_or_else(|| DEFAULT_IDLE_HEARTBEAT_US.min(255 * self.heartbeat_us))
    }
}

/// How a proposing thread gets its command replicated (Mu §7.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// The proposing thread runs the replication plane itself until its command commits: the
    /// lowest latency for one application thread.
    Direct,
    /// The proposing thread hands the command to the replication thread through a lock-free
    /// queue; commands waiting together are batched into one log entry.
    #[default]
    Handover,
}

/// One poll-loop thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThreadConfig {
    /// What the thread does when a poll finds no work.
    pub idle: IdlePolicy,
    /// Idle polls spent spinning before yielding (`backoff` only).
    pub spin_polls: u32,
    /// Idle polls spent yielding before parking (`backoff` only).
    pub yield_polls: u32,
    /// Longest park between polls, in microseconds (`park` and `backoff`).
    pub park_us: u32,
    /// With `backoff`: consecutive parks double from `park_us` up to this many microseconds,
    /// so a thread idle for long (a follower of a quiet cluster) wakes rarely; work found starts
    /// over at `park_us`. At most `park_us`: no growth.
    pub park_max_us: u32,
    /// Pins the thread to this CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<usize>,
    /// Runs the thread under the real-time policy `SCHED_FIFO` (`"auto"`: at priority 1 where
    /// the process may, else at normal priority with a warning; a number 1-99: at that priority
    /// or not at all; `"off"`), so that it preempts every normal thread when it wakes:
    /// heartbeats and permission grants then keep time on a machine with fewer cores than busy
    /// threads. Only for the background thread, parking when idle (`idle = "park"`; `"auto"`
    /// keeps a background thread that spins or yields at normal priority): a thread that spins,
    /// yields or polls on while it has work would keep normal threads, other replicas'
    /// included, off its cpu (the replication thread does the last). A fixed priority needs
    /// `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` (e.g. `ulimit -r`); without them the node refuses to
    /// start, with the reason. The background thread's default is `"auto"`, the replication
    /// thread's `"off"` (see [`crate::realtime`]).
    pub realtime_priority: Realtime,
}

impl ThreadConfig {
    fn replication() -> Self {
        Self {
            idle: IdlePolicy::Backoff,
            spin_polls: 64,
            yield_polls: 2000,
            park_us: 50,
            park_max_us: 1000,
            cpu: None,
            realtime_priority: Realtime::Off,
        }
    }

    fn background() -> Self {
        Self {
            idle: IdlePolicy::Park,
            spin_polls: 0,
            yield_polls: 0,
            park_us: 100,
            park_max_us: 100,
            cpu: None,
            realtime_priority: Realtime::Auto,
        }
    }
}

impl Default for ThreadConfig {
    fn default() -> Self {
        Self::replication()
    }
}

/// A `[node.replication]` or `[node.background]` table as written: a field left out takes that
/// thread's own default. (Through `ThreadConfig`'s `Default`, a background table that set only
/// `cpu` got the replication thread's backoff, which spins and yields, instead of parking.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThreadTable {
    idle: Option<IdlePolicy>,
    spin_polls: Option<u32>,
    yield_polls: Option<u32>,
    park_us: Option<u32>,
    park_max_us: Option<u32>,
    cpu: Option<usize>,
    realtime_priority: Option<Realtime>,
}

impl ThreadTable {
    fn over(self, base: ThreadConfig) -> ThreadConfig {
        ThreadConfig {
            idle: self.idle.unwrap_or(base.idle),
            spin_polls: self.spin_polls.unwrap_or(base.spin_polls),
            yield_polls: self.yield_polls.unwrap_or(base.yield_polls),
            park_us: self.park_us.unwrap_or(base.park_us),
            park_max_us: self.park_max_us.unwrap_or(base.park_max_us),
            cpu: self.cpu.or(base.cpu),
            realtime_priority: self.realtime_priority.unwrap_or(base.realtime_priority),
        }
    }
}

fn replication_thread<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ThreadConfig, D::Error> {
    ThreadTable::deserialize(d).map(|t| t.over(ThreadConfig::replication()))
}

fn background_thread<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ThreadConfig, D::Error> {
    ThreadTable::deserialize(d).map(|t| t.over(ThreadConfig::background()))
}

/// The RDMA device a verbs node uses (`node.verbs`), and its transport's retries. Per node: the
/// devices of different hosts may differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerbsSettings {
    /// The device (`ibv_devices`, `rdma link`), e.g. `rxe0` or `mlx5_0`; none: the first one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The device port, from 1.
    pub port: u8,
    /// The GID index (`show_gids`, `ibv_devinfo -v`); none: a RoCE v2 GID of an IPv4 address,
    /// else any RoCE v2 GID, else the first non-empty one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u16>,
    /// Retransmissions before an operation to a silent peer fails (0..=7).
    pub retry_count: u8,
    /// Local ACK timeout exponent: a retransmission after 4.096 us * 2^exp (0..=31).
    pub ack_timeout_exp: u8,
}

impl Default for VerbsSettings {
    fn default() -> Self {
        Self { device: None, port: 1, gid_index: None, retry_count: 7, ack_timeout_exp: 14 }
    }
}

impl VerbsSettings {
    /// The highest GID index the fabric takes.
    pub const GID_INDEX_MAX: u16 = 255;

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: String| Err(ConfigError::new(format!("node.verbs.{key}"), problem));
        if self.device.as_deref().is_some_and(|d| d.is_empty() || d.len() > 64 || d.contains(char::is_whitespace)) {
            return bad("device", "must be a device name such as \"rxe0\" (ibv_devices lists them)".into());
        }
        if self.port == 0 {
            return bad("port", "must be at least 1 (device ports count from 1)".into());
        }
        if let Some(index) = self.gid_index.filter(|&i| i > Self::GID_INDEX_MAX) {
            return bad("gid_index", format!("is {index}; it must be in 0..={}", Self::GID_INDEX_MAX));
        }
        if self.retry_count > 7 {
            return bad("retry_count", format!("is {}; RC transports retry at most 7 times", self.retry_count));
        }
        if self.ack_timeout_exp > 31 {
            return bad("ack_timeout_exp", format!("is {}; it must be in 0..=31", self.ack_timeout_exp));
        }
        Ok(())
    }
}

/// The part of the configuration that belongs to this process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Which member this process is.
    pub id: u16,
    /// Address the client server listens on (default: the member's `client`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Direct or handover attachment of proposing threads.
    #[serde(default)]
    pub mode: AttachMode,
    /// Most commands batched into one log entry (handover mode).
    #[serde(default = "default_max_batch")]
    pub max_batch: u32,
    /// Commands that may wait for the replication thread at once.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: u32,
    /// How long `propose` waits for its command to commit before giving up.
    #[serde(default = "default_propose_timeout_ms")]
    pub propose_timeout_ms: u64,
    /// The replication-plane thread.
    #[serde(default = "ThreadConfig::replication", deserialize_with = "replication_thread")]
    pub replication: ThreadConfig,
    /// The background-plane thread.
    #[serde(default = "ThreadConfig::background", deserialize_with = "background_thread")]
    pub background: ThreadConfig,
    /// A deliberate protocol mutation by name (negative controls of the fault tests only;
    /// needs the `planted-bugs` feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planted_bug: Option<String>,
    /// Where the node appends its structured events, one JSON object a line
    /// (`microrep::events`; none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<PathBuf>,
    /// Where the node keeps what must outlive it: the cluster generation it belongs to
    /// (`DATA_DIR/generation`). With one, a cluster all of whose members restarted stops with
    /// an error naming its generation instead of starting again empty (none by default: the
    /// node keeps nothing, and such a cluster starts again empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Forget the remembered generation and take part in bootstrapping a new, empty cluster
    /// (`--force-new`): for a cluster that lost its state, once an operator decided so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_new: bool,
    /// Cut a durable log damaged in a synced record at the damage (the damaged segment kept
    /// beside it) and recover the rest from the peers, instead of stopping with an error
    /// (`--repair-log`): once an operator decided this disk is not to be trusted past it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair_log: bool,
    /// Where the node serves Prometheus metrics over HTTP (`host:port`, e.g. `127.0.0.1:9100`;
    /// port 0 picks a free one); none by default: no listener, and nothing counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// The RDMA device and transport settings (`fabric = "verbs"` only; defaults without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbs: Option<VerbsSettings>,
}

fn default_max_batch() -> u32 {
    64
}

fn default_queue_capacity() -> u32 {
    4096
}

fn default_propose_timeout_ms() -> u64 {
    1000
}

impl NodeConfig {
    /// Defaults for member `id`.
    pub fn new(id: u16) -> Self {
        Self {
            id,
            listen: None,
            mode: AttachMode::default(),
            max_batch: default_max_batch(),
            queue_capacity: default_queue_capacity(),
            propose_timeout_ms: default_propose_timeout_ms(),
            replication: ThreadConfig::replication(),
            background: ThreadConfig::background(),
            planted_bug: None,
            events: None,
            data_dir: None,
            force_new: false,
            repair_log: false,
            metrics: None,
            verbs: None,
        }
    }
}

impl Config {
    /// Reads `path`, applies `overrides` (each `dotted.key=value`, the value in TOML syntax or a
    /// bare string), and validates the result.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("(file)", format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text, overrides)
    }

    /// Parses TOML `text` with `overrides` (see [`Config::load`]) and validates it.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let config: Self = if overrides.is_empty() {
            toml::from_str(text).map_err(|e| toml_error(&e))?
        } else {
            let mut table: toml::Table = toml::from_str(text).map_err(|e| toml_error(&e))?;
            for o in overrides {
                apply_override(&mut table, o)?;
            }
            let merged = toml::to_string(&table).map_err(|e| ConfigError::new("(overrides)", e.to_string()))?;
            toml::from_str(&merged).map_err(|e| toml_error(&e))?
        };
        config.validate()?;
        Ok(config)
    }

    /// Renders the configuration as TOML (what `microrep cluster up` writes for each node).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }

    /// Checks everything that a type cannot; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.cluster.validate()?;
        let n = self.cluster.members.len();
        let node = &self.node;
        if usize::from(node.id) >= n {
            return Err(ConfigError::new("node.id", format!("is {}; the cluster has members 0..{n}", node.id)));
        }
        if let Some(listen) = &node.listen {
            parse_addr("node.listen", listen)?;
        }
        self.metrics_addr()?;
        match (&node.verbs, self.cluster.fabric) {
            (Some(verbs), FabricKind::Verbs) => verbs.validate()?,
            (Some(_), fabric) => {
                return Err(ConfigError::new(
                    "node.verbs",
                    format!("applies to fabric = \"verbs\" only (this cluster's is \"{fabric}\")"),
                ));
            }
            (None, _) => {}
        }
        if node.max_batch == 0 || node.max_batch > 4096 {
            return Err(ConfigError::new("node.max_batch", format!("is {}; it must be in 1..=4096", node.max_batch)));
        }
        if node.queue_capacity == 0 {
            return Err(ConfigError::new("node.queue_capacity", "must be positive"));
        }
        if self.cluster.durability == Durability::Fsync && node.data_dir.is_none() {
            return Err(ConfigError::new(
                "node.data_dir",
                "is required with cluster.durability = \"fsync\" (the durable log lives there)",
            ));
        }
        if node.propose_timeout_ms == 0 {
            return Err(ConfigError::new("node.propose_timeout_ms", "must be positive"));
        }
        for (key, thread) in [("node.replication", &node.replication), ("node.background", &node.background)] {
            if thread.park_us == 0 && matches!(thread.idle, IdlePolicy::Park | IdlePolicy::Backoff) {
                return Err(ConfigError::new(format!("{key}.park_us"), "must be positive when the thread parks"));
            }
            match thread.realtime_priority {
                Realtime::Priority(p) if !(1..=99).contains(&p) => {
                    return Err(ConfigError::new(
                        format!("{key}.realtime_priority"),
                        format!("is {p}; it must be \"off\", \"auto\" or in 1..=99"),
                    ));
                }
                Realtime::Priority(_) | Realtime::Auto if key == "node.replication" => {
                    return Err(ConfigError::new(
                        format!("{key}.realtime_priority"),
                        "is for the background thread only: the replication thread polls without pausing while it \
                         has work (a leader waiting for permission acks has), and at real-time priority it would keep \
                         the threads that grant them off its cpu",
                    ));
                }
                Realtime::Priority(_) if thread.idle != IdlePolicy::Park => {
                    return Err(ConfigError::new(
                        format!("{key}.realtime_priority"),
                        "needs idle = \"park\": a real-time thread that spins or yields keeps normal threads off its cpu",
                    ));
                }
                _ => {}
            }
        }
        self.mu_config().map(|_| ())
    }

    /// The Mu settings of this node.
    pub fn mu_config(&self) -> Result<MuConfig, ConfigError> {
        let c = &self.cluster;
        let t = &c.timing;
        let us = |v: u64| v.saturating_mul(1000);
        let replicas = u16::try_from(c.members.len()).unwrap_or(u16::MAX);
        #[cfg_attr(not(feature = "planted-bugs"), allow(unused_mut))]
        let mut mu = MuConfig {
            slot_bytes: c.log.slot_bytes,
            log_slots: c.log.slots,
            snapshot_bytes: c.log.snapshot_bytes,
            snapshot_every: c.log.snapshot_every,
            heartbeat_period_ns: us(t.heartbeat_us),
            idle_stride: idle_stride(t)?,
            score_fail_below: t.score_fail_below,
            score_recover_above: t.score_recover_above,
            join_grace_heartbeats: 2 * (u32::from(t.score_recover_above) + 2),
            fate_share_timeout_ns: us(t.fate_share_timeout_us),
            fate_share_cooldown_ns: us(t.fate_share_cooldown_us),
            permission_timeout_ns: us(t.permission_timeout_us),
            round_timeout_ns: us(t.round_timeout_us),
            recycle_period_ns: us(t.recycle_period_us),
            recycle_wait_ns: us(t.recycle_wait_us),
            lag_check_period_ns: us(t.lag_check_period_us),
            max_pending: self.node.queue_capacity as usize,
            durable: c.durability == Durability::Fsync,
            members: c.initial_member_set(),
            ..MuConfig::new(NodeId(self.node.id), replicas)
        };
        match self.node.planted_bug.as_deref() {
            None => {}
            #[cfg(feature = "planted-bugs")]
            Some(name) => {
                let bug = microrep_core::mu::PlantedBug::ALL.into_iter().find(|b| format!("{b:?}") == name);
                mu.planted_bug = Some(bug.ok_or_else(|| ConfigError::new("node.planted_bug", "no such bug"))?);
            }
            #[cfg(not(feature = "planted-bugs"))]
            Some(_) => {
                return Err(ConfigError::new("node.planted_bug", "this build has no planted bugs"));
            }
        }
        mu.validate().map_err(|e| ConfigError::new(mu_key(e.key), e.problem))?;
        Ok(mu)
    }

    /// Where the node serves its metrics, if it does (`node.metrics`).
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.node.metrics.as_deref().map(|addr| parse_addr("node.metrics", addr)).transpose()
    }

    /// The address clients of this node connect to.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        match &self.node.listen {
            Some(listen) => parse_addr("node.listen", listen),
            None => self.cluster.client_addr(self.node.id),
        }
    }
}

impl ClusterConfig {
    /// A cluster of `replicas` members with client ports `base_port..`, on loopback.
    pub fn local(name: &str, replicas: u16, base_port: u16) -> Self {
        Self {
            name: name.into(),
            fabric: FabricKind::Shm,
            shm_dir: None,
            members: (0..replicas)
                .map(|id| Member { id, client: format!("127.0.0.1:{}", base_port.saturating_add(id)), fabric: None })
                .collect(),
            initial_members: None,
            log: LogConfig::default(),
            timing: TimingConfig::default(),
            durability: Durability::None,
        }
    }

    /// A 64-bit hash of this part's canonical TOML rendering: equal on every member of a
    /// correctly configured cluster.
    pub fn fingerprint(&self) -> u64 {
        let canonical = toml::to_string(self).unwrap_or_default();
        xxhash_rust::xxh3::xxh3_64(canonical.as_bytes()).max(1)
    }

    /// The shm fabric's directory.
    pub fn shm_dir(&self) -> PathBuf {
        self.shm_dir.clone().unwrap_or_else(|| microrep_fabric::shm::ShmConfig::default_dir(&self.name))
    }

    /// Where the fabric of member `id` listens (tcp and verbs fabrics).
    pub fn fabric_addr(&self, id: u16) -> Result<SocketAddr, ConfigError> {
        let i = usize::from(id);
        let key = format!("cluster.members[{i}].fabric");
        let addr =
            self.members.get(i).and_then(|m| m.fabric.as_deref()).ok_or_else(|| ConfigError::new(&key, "missing"))?;
        parse_addr(&key, addr)
    }

    /// Where clients of member `id` connect.
    pub fn client_addr(&self, id: u16) -> Result<SocketAddr, ConfigError> {
        let i = usize::from(id);
        let member = self.members.get(i).ok_or_else(|| ConfigError::new("node.id", "no such member"))?;
        parse_addr(&format!("cluster.members[{i}].client"), &member.client)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(ConfigError::new("cluster.name", "must be 1..=64 letters, digits, '-' or '_'"));
        }
        if self.members.is_empty() || self.members.len() > usize::from(microrep_fabric::layout::MAX_NODES) {
            return Err(ConfigError::new("cluster.members", "must list 1..=256 replicas"));
        }
        for (i, m) in self.members.iter().enumerate() {
            if usize::from(m.id) != i {
                return Err(ConfigError::new(
                    format!("cluster.members[{i}].id"),
                    format!("is {}; members must be listed with ids 0, 1, 2... in order", m.id),
                ));
            }
            parse_addr(&format!("cluster.members[{i}].client"), &m.client)?;
            let key = format!("cluster.members[{i}].fabric");
            match (&m.fabric, self.fabric.addressed()) {
                (Some(addr), true) => drop(parse_addr(&key, addr)?),
                (None, true) => {
                    return Err(ConfigError::new(key, format!("is required with fabric = \"{}\"", self.fabric)));
                }
                (Some(_), false) => {
                    return Err(ConfigError::new(key, "applies to fabric = \"tcp\" or \"verbs\" only"));
                }
                (None, false) => {}
            }
        }
        if let Some(initial) = &self.initial_members {
            let n = self.members.len();
            if initial.is_empty() {
                return Err(ConfigError::new("cluster.initial_members", "must name at least one member"));
            }
            for (i, &id) in initial.iter().enumerate() {
                if usize::from(id) >= n {
                    return Err(ConfigError::new(
                        format!("cluster.initial_members[{i}]"),
                        format!("is {id}; the cluster's ids are 0..{n}"),
                    ));
                }
                if initial[..i].contains(&id) {
                    return Err(ConfigError::new(format!("cluster.initial_members[{i}]"), format!("repeats {id}")));
                }
            }
        }
        Ok(())
    }

    /// The members the cluster starts with (`initial_members`, or every id).
    pub fn initial_member_set(&self) -> mu::MemberSet {
        match &self.initial_members {
            Some(ids) => ids.iter().map(|&id| NodeId(id)).collect(),
            None => mu::MemberSet::first(u16::try_from(self.members.len()).unwrap_or(u16::MAX)),
        }
    }
}

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|e| ConfigError::new(key, format!("{value:?} is not an address like 127.0.0.1:6380 ({e})")))
}

/// `MuConfig::idle_stride` from `cluster.timing.idle_heartbeat_us`: how many heartbeats fit in
/// it (rounded down; 1, no resting, below one), refused beyond the 255 the heartbeat word
/// can announce rather than silently shortened.
fn idle_stride(t: &TimingConfig) -> Result<u8, ConfigError> {
    if t.heartbeat_us == 0 {
        // Refused as `cluster.timing.heartbeat_us` by the Mu checks.
        return Ok(1);
    }
    let stride = t.idle_heartbeat_us() / t.heartbeat_us;
    u8::try_from(stride.max(1)).map_err(|_| {
        ConfigError::new(
            "cluster.timing.idle_heartbeat_us",
            format!(
                "is {}; it may be at most 255 heartbeats ({} us at heartbeat_us = {}), or 0 to never rest",
                t.idle_heartbeat_us(),
                255 * t.heartbeat_us,
                t.heartbeat_us
            ),
        )
    })
}

/// The config key of a Mu setting named in a [`microrep_core::mu::ConfigError`].
fn mu_key(field: &str) -> String {
    let key = match field {
        "replicas" => "cluster.members",
        "node" => "node.id",
        "slot_bytes" => "cluster.log.slot_bytes",
        "log_slots" => "cluster.log.slots",
        "snapshot_bytes" => "cluster.log.snapshot_bytes",
        "snapshot_every" => "cluster.log.snapshot_every",
        "max_pending" => "node.queue_capacity",
        "heartbeat_period_ns" => "cluster.timing.heartbeat_us",
        "idle_stride" => "cluster.timing.idle_heartbeat_us",
        "score_recover_above" => "cluster.timing.score_recover_above",
        other => return format!("cluster.timing.{}_us", other.trim_end_matches("_ns")),
    };
    key.to_string()
}

/// A TOML syntax or type error; its text shows the line and the key.
fn toml_error(e: &toml::de::Error) -> ConfigError {
    ConfigError::new("(toml)", e.to_string().trim_end().to_string())
}

/// Sets `dotted.key=value` in `table`; `value` is TOML (`3`, `true`, `"x"`) or a bare string.
fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| ConfigError::new(assignment, "an override must look like key.path=value"))?;
    let (key, raw) = (key.trim(), raw.trim());
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    };
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().filter(|p| !p.is_empty()).ok_or_else(|| ConfigError::new(key, "empty key"))?;
    let mut here = table;
    for part in parts {
        let entry = here.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = entry.as_table_mut().ok_or_else(|| ConfigError::new(key, format!("{part} is not a table")))?;
    }
    here.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests;
