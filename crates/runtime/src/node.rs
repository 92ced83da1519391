//! A running replica: a replication-plane thread and a background-plane thread over one fabric
//! handle, and the handle applications propose through.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use microrep_core::mu::slot::Frame;
use microrep_core::mu::{self, BackgroundPlane, LocalLogGate, MuConfig, ReplicationPlane};
use microrep_fabric::{Fabric, FabricError, NodeId, RegionSpec};

use crate::api::{Apply, Committed, ProposeError};
use crate::config::{AttachMode, Config, ConfigError, ThreadConfig};
use crate::durable::DurableLog;
use crate::engine::{Drive, Engine};
use crate::events::{EventLog, NodeEvent};
use crate::generation::GenerationFile;
use crate::identity::{self, IdentityCheck};
use crate::idle::{Backoff, Parker, RESTING_PARK_MAX};
use crate::metrics::{LeaderWatch, MetricsServer, NodeMetrics};
use crate::status::NodeStatus;
use crate::ticket::Ticket;
use crate::watchers::Watchers;

const NO_LEADER: u32 = u32::MAX;

/// How long [`Pending::wait`] spins in handover mode: a commit on shm takes about a
/// microsecond, so most waits end here.
const WAIT_SPIN_NS: u64 = 4_000;
/// Until when [`Pending::wait`] yields in handover mode before it parks.
const WAIT_YIELD_NS: u64 = 30_000;
/// The longest one park of [`Pending::wait`] (the replication thread wakes it when the outcome
/// is known; the bound only rechecks stopping and the deadline).
const WAIT_PARK: Duration = Duration::from_micros(200);

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The fabric refused.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The configured fabric is not in this build (a cargo feature left out).
    #[error(
        "this build has no {fabric} fabric: build it with the cargo feature `{fabric}` (e.g. `cargo build --release -p microrep-cli --features {fabric}`, which needs libclang-dev; see docs/INSTALL.md)"
    )]
    NotBuilt {
        /// The fabric `cluster.fabric` names.
        fabric: crate::config::FabricKind,
    },
    /// The protocol core refused the configuration or the fabric's layout.
    #[error(transparent)]
    Mu(#[from] mu::MuError),
    /// A thread could not be started.
    #[error("starting the {name} thread: {source}")]
    Thread {
        /// The thread's role (replication, background, metrics).
        name: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The events file could not be opened.
    #[error(transparent)]
    Events(#[from] crate::events::EventsError),
    /// The remembered cluster generation could not be read.
    #[error(transparent)]
    Generation(#[from] crate::generation::GenerationError),
    /// The durable log could not be opened or recovered (`cluster.durability`).
    #[error(transparent)]
    Durable(#[from] crate::durable::DurableError),
    /// The metrics listener (`node.metrics`) could not be bound or started.
    #[error("cannot serve metrics on {addr} (node.metrics): {source}")]
    Metrics {
        /// The configured address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The regions a node with `config` registers on its fabric.
pub fn regions(config: &Config) -> Result<Vec<RegionSpec>, ConfigError> {
    let mu = config.mu_config()?;
    let mut regions = mu::regions(&mu).to_vec();
    regions.push(identity::region(mu.replicas));
    Ok(regions)
}

/// What a proposer submits.
pub(crate) enum Submitted<'a> {
    /// One command, which the engine may batch with others into one entry.
    Command(&'a [u8]),
    /// A whole entry its proposer encoded with `batch::encode_batch` (`Node::submit_batch`), in
    /// a frame the leader seals and writes to the logs as it is.
    Batch(Frame),
}

/// A command handed to the replication thread, or a whole entry its proposer encoded.
pub(crate) struct Request {
    pub(crate) entry: Queued,
    pub(crate) ticket: Arc<Ticket>,
}

/// What a [`Request`] carries.
pub(crate) enum Queued {
    Command(Vec<u8>),
    Batch(Frame),
}

impl Request {
    /// The command, unless the request is a whole entry.
    pub(crate) fn command(&self) -> Option<&[u8]> {
        match &self.entry {
            Queued::Command(command) => Some(command),
            Queued::Batch(_) => None,
        }
    }
}

/// What the node's threads and handles share.
pub(crate) struct Shared {
    pub(crate) mu: MuConfig,
    pub(crate) max_batch: AtomicUsize,
    pub(crate) queue: ArrayQueue<Request>,
    pub(crate) stalled: AtomicBool,
    /// Whether the replication plane had work under way at some poll since the background
    /// thread last read (and cleared) this (see `mu::ReplicationFacts`).
    pub(crate) busy: AtomicBool,
    /// Whether the background plane rests between heartbeats at a stride above 1 (see
    /// `mu::MuConfig::idle_stride`): the replication thread wakes it when work arrives.
    pub(crate) resting: AtomicBool,
    /// Whether this replica may be chosen to lead (`Node::set_candidate`).
    candidate: AtomicBool,
    leader: AtomicU32,
    /// The background plane's detection rounds (`BackgroundPlane::rounds`).
    detector_rounds: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds when the background plane last changed its leader.
    leader_since: AtomicU64,
    stop: AtomicBool,
    direct_active: AtomicUsize,
    mode: AttachMode,
    timeout: Duration,
    clock: quanta::Clock,
    start: u64,
    status: Mutex<NodeStatus>,
    replication_parker: OnceLock<Arc<Parker>>,
    /// Wakes the background thread, which rests until its next heartbeat while all is calm.
    background_parker: OnceLock<Arc<Parker>>,
    /// What the metrics count, if the node serves them (`node.metrics`).
    pub(crate) metrics: Option<NodeMetrics>,
    /// The replicas the background plane's failure detector holds live.
    pub(crate) live: Arc<mu::SharedMembers>,
    /// Whether this replica is a member as of the last configuration it applied.
    member: AtomicBool,
    /// The log index of the `Membership` entry that removed this replica, `NOT_REMOVED` while
    /// it was not removed.
    removed_at: AtomicU64,
    /// Whether its owner was asked to stop this replica, which is not a member (`Node::leave`).
    leave_requested: AtomicBool,
    /// Threads to unpark when the leader, the resting flag, a fatal error, a removal or a
    /// request to leave changes (`Node::unpark_on_change`).
    watchers: Watchers,
    /// The payload bytes of the last batch `Node::submit_batch` encoded: the next batch's frame
    /// is made that large.
    batch_bytes_hint: AtomicUsize,
}

/// `Shared::removed_at` of a replica that was not removed.
const NOT_REMOVED: u64 = u64::MAX;

impl Shared {
    pub(crate) fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.start, self.clock.raw())
    }

    /// Wakes the background thread if it rests at an idle stride: a proposal arrived, and it
    /// goes back to heartbeating every period now, not at its next idle tick (one relaxed load
    /// per proposal otherwise). Called before the replication thread is woken: the cleared
    /// flag is what lets that thread's resting park end (see `replication_loop`).
    fn wake_resting_background(&self) {
        if self.resting.load(Ordering::Relaxed)
            && self.resting.swap(false, Ordering::SeqCst)
            && let Some(parker) = self.background_parker.get()
        {
            parker.wake();
        }
    }

    /// The background plane's detection rounds so far.
    pub(crate) fn detector_rounds(&self) -> u64 {
        self.detector_rounds.load(Ordering::Acquire)
    }

    /// The leader the background plane chose, once it chose one.
    pub(crate) fn leader(&self) -> Option<NodeId> {
        let l = self.leader.load(Ordering::Acquire);
        (l != NO_LEADER).then_some(NodeId(l as u16))
    }

    pub(crate) fn with_status<R>(&self, f: impl FnOnce(&mut NodeStatus) -> R) -> R {
        f(&mut self.status.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn record_leader_change(&self, leader: NodeId) {
        let now = self.now();
        self.with_status(|s| s.leader_changed(leader, now));
        if let Some(metrics) = &self.metrics {
            metrics.leader_changed();
        }
    }

    /// The status as of now.
    fn status(&self) -> NodeStatus {
        let mut status = self.with_status(|s| s.clone());
        status.leader = self.leader().map(|l| l.0);
        status.uptime_ms = self.now() / 1_000_000;
        status.resting = self.resting.load(Ordering::Relaxed);
        status
    }

    /// Counts `error` as the outcome of a proposal, and returns it.
    fn refuse(&self, error: ProposeError) -> ProposeError {
        if let Some(metrics) = &self.metrics {
            metrics.refused(&error);
        }
        error
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Records whether this replica is a member after the `Membership` entry at `index`; a
    /// member that is one no longer was removed there.
    pub(crate) fn set_member(&self, member: bool, index: u64) {
        let was = self.member.swap(member, Ordering::AcqRel);
        if was && !member {
            self.removed_at.store(index, Ordering::Release);
            self.watchers.changed();
        } else if member {
            self.removed_at.store(NOT_REMOVED, Ordering::Release);
        }
    }

    pub(crate) fn fail(&self, why: String) {
        tracing::error!("{why}");
        self.with_status(|s| s.fatal = Some(why));
        self.stop.store(true, Ordering::Release);
        self.watchers.changed();
    }
}

type SharedEngine = Arc<Mutex<Box<dyn Drive>>>;

fn lock(engine: &SharedEngine) -> MutexGuard<'_, Box<dyn Drive>> {
    engine.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running replica. Cheap to share between threads (`&Node` proposes).
///
/// Dropping it stops its threads; proposals still waiting fail with
/// [`ProposeError::Shutdown`].
pub struct Node {
    shared: Arc<Shared>,
    engine: SharedEngine,
    threads: Vec<JoinHandle<()>>,
    metrics: Option<MetricsServer>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("node", &self.shared.mu.node).field("mode", &self.shared.mode).finish()
    }
}

impl Node {
    /// Starts replica `config.node.id` on `fabric`, which must have registered
    /// [`regions`]`(config)`, applying committed commands to `app`.
    pub fn start<F, A>(config: &Config, fabric: F, app: A) -> Result<Self, StartError>
    where
        F: Fabric + Send + Sync + 'static,
        F::Endpoint: Send + 'static,
        A: Apply,
    {
        config.validate()?;
        let generation = GenerationFile::open(config.node.data_dir.as_deref(), config.node.force_new)?;
        let mu = MuConfig { generation: generation.remembered(), ..config.mu_config()? };
        if fabric.node_id() != mu.node {
            return Err(ConfigError {
                key: "node.id".into(),
                problem: format!("differs from the fabric's {}", fabric.node_id()),
            }
            .into());
        }
        // Let the core check the layout of its regions.
        for spec in mu::regions(&mu) {
            let len = fabric.region_len(spec.id)?;
            if len != spec.len_bytes {
                return Err(FabricError::InvalidLayout(format!(
                    "{} is {len} bytes; the config needs {}",
                    spec.id, spec.len_bytes
                ))
                .into());
            }
        }
        let fingerprint = config.cluster.fingerprint();
        let identity = IdentityCheck::new(&fabric, mu.replicas, fingerprint)?;
        let metrics_listener = match config.metrics_addr()? {
            Some(addr) => {
                Some(std::net::TcpListener::bind(addr).map_err(|source| StartError::Metrics { addr, source })?)
            }
            None => None,
        };
        let clock = quanta::Clock::new();
        let start = clock.raw();
        let node = &config.node;
        let shared = Arc::new(Shared {
            max_batch: AtomicUsize::new(node.max_batch as usize),
            queue: ArrayQueue::new(node.queue_capacity as usize),
            stalled: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            resting: AtomicBool::new(false),
            live: mu::SharedMembers::new(mu::MemberSet::first(mu.replicas)),
            member: AtomicBool::new(mu.members.contains(mu.node)),
            removed_at: AtomicU64::new(NOT_REMOVED),
            leave_requested: AtomicBool::new(false),
            watchers: Watchers::default(),
            batch_bytes_hint: AtomicUsize::new(0),
            candidate: AtomicBool::new(true),
            leader: AtomicU32::new(NO_LEADER),
            detector_rounds: AtomicU64::new(0),
            leader_since: AtomicU64::new(monotonic_ns()),
            stop: AtomicBool::new(false),
            direct_active: AtomicUsize::new(0),
            mode: node.mode,
            timeout: Duration::from_millis(node.propose_timeout_ms),
            clock,
            start,
            status: Mutex::new(NodeStatus::new(mu.node, fingerprint)),
            replication_parker: OnceLock::new(),
            background_parker: OnceLock::new(),
            metrics: metrics_listener.is_some().then(NodeMetrics::new),
            mu: mu.clone(),
        });
        let metrics = match metrics_listener {
            Some(listener) => {
                let s = Arc::clone(&shared);
                let render =
                    move || s.metrics.as_ref().map(|m| crate::metrics::render(m, s.status())).unwrap_or_default();
                let server = MetricsServer::start(listener, format!("microrep-metrics-{}", mu.node.0), render)
                    .map_err(|source| StartError::Thread { name: "metrics", source })?;
                tracing::info!(addr = %server.addr(), "serving metrics");
                Some(server)
            }
            None => None,
        };
        let durable = match config.node.data_dir.as_deref().filter(|_| mu.durable) {
            Some(data_dir) => {
                let dir = data_dir.join("log");
                if config.node.force_new {
                    DurableLog::discard(&dir)?;
                }
                let initial = || {
                    let mut state = Vec::new();
                    app.snapshot(&mut state);
                    state
                };
                // The writer wakes the replication thread when its log is synced further: a parked
                // follower pushes its durable index at once, a leader acknowledges at once.
                let s = Arc::clone(&shared);
                let synced = move || {
                    if let Some(parker) = s.replication_parker.get() {
                        parker.wake();
                    }
                };
                let initial_configuration = mu::Configuration { members: mu.members, epoch: 0 };
                let repair = config.node.repair_log;
                Some(DurableLog::open(&dir, mu.node.0, (initial_configuration, initial), repair, Box::new(synced))?)
            }
            None => None,
        };
        // Without a durable log nobody waits for a follower's replication thread: the leader's
        // WRITEs commit by themselves, and applying may lag (see `replication_loop`).
        let followers_unhurried = durable.is_none();
        let events = EventLog::open(node.events.as_deref())?;
        events.emit(NodeEvent::Start { node: mu.node.0, pid: std::process::id() });
        let fabric = Arc::new(fabric);
        let gate = LocalLogGate::new();
        let members = mu::SharedMembers::new(mu.members);
        let background = BackgroundPlane::new(&mu, gate.clone(), members.clone());
        let owner = Arc::clone(&gate);
        let plane = ReplicationPlane::new(&mu, gate, members, shared.now());
        let engine: SharedEngine = Arc::new(Mutex::new(Box::new(Engine::new(
            Arc::clone(&fabric),
            plane,
            app,
            Arc::clone(&shared),
            events,
            generation,
            durable,
        )?)));
        let mut threads = Vec::new();
        let spawn = |name: &'static str, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(format!("microrep-{name}-{}", mu.node.0))
                .spawn(body)
                .map_err(|source| StartError::Thread { name, source })
        };
        let (s, e, cfg) = (Arc::clone(&shared), Arc::clone(&engine), node.replication.clone());
        threads.push(spawn("replication", Box::new(move || replication_loop(&s, &e, &cfg, followers_unhurried)))?);
        let mut cfg = node.background.clone();
        cfg.realtime_priority = cfg.realtime_priority.for_detection(config.cluster.timing.detection());
        let s = Arc::clone(&shared);
        let bg = spawn(
            "background",
            Box::new(move || background_loop(&s, &*fabric, Planes { plane: background, identity, gate: owner }, &cfg)),
        );
        match bg {
            Ok(t) => threads.push(t),
            Err(err) => {
                shared.stop.store(true, Ordering::Release);
                threads.into_iter().for_each(|t| drop(t.join()));
                return Err(err);
            }
        }
        Ok(Self { shared, engine, threads, metrics })
    }

    /// Proposes `command` and waits until it commits (or fails, see [`ProposeError`]).
    pub fn propose(&self, command: &[u8]) -> Result<Committed, ProposeError> {
        self.submit(command)?.wait()
    }

    /// Proposes `command` without waiting: several may be outstanding at once, and in handover
    /// mode those waiting together are batched into one log entry (Mu §7.4).
    pub fn submit(&self, command: &[u8]) -> Result<Pending, ProposeError> {
        self.submit_entry(Submitted::Command(command))
    }

    /// Proposes what `submitted` carries (a batch's frame is handed over without a copy).
    pub(crate) fn submit_entry(&self, submitted: Submitted<'_>) -> Result<Pending, ProposeError> {
        let shared = &self.shared;
        if shared.stopping() {
            return Err(shared.refuse(ProposeError::Shutdown));
        }
        if let Some(leader) = shared.leader().filter(|&l| l != shared.mu.node) {
            return Err(shared.refuse(ProposeError::NotLeader { leader: Some(leader) }));
        }
        let now = shared.now();
        let ticket = Ticket::for_current_thread(now);
        let deadline = now + shared.timeout.as_nanos() as u64;
        let engine = match shared.mode {
            AttachMode::Direct => {
                shared.direct_active.fetch_add(1, Ordering::AcqRel);
                lock(&self.engine).submit(submitted, Arc::clone(&ticket));
                shared.wake_resting_background();
                Some(Arc::clone(&self.engine))
            }
            AttachMode::Handover => {
                let entry = match submitted {
                    Submitted::Command(command) => Queued::Command(command.to_vec()),
                    Submitted::Batch(frame) => Queued::Batch(frame),
                };
                let request = Request { entry, ticket: Arc::clone(&ticket) };
                shared.queue.push(request).map_err(|_| shared.refuse(ProposeError::Backlogged))?;
                shared.wake_resting_background();
                if let Some(parker) = shared.replication_parker.get() {
                    parker.wake();
                }
                None
            }
        };
        Ok(Pending { ticket, shared: Arc::clone(shared), engine, deadline })
    }

    /// The most bytes one log entry carries (a batch's encoding included, see
    /// [`Node::submit_batch`]).
    pub fn max_entry_bytes(&self) -> usize {
        self.shared.mu.max_payload_bytes()
    }

    /// Asks the cluster, through this replica (which must lead), to make one membership change
    /// (`mu::membership`), and waits until it is applied here or refused. Adding a replica is
    /// refused until it is a caught-up follower of this leader ("replica 3 is still catching
    /// up"): retry. Returns the configuration this replica applied after it; if the change
    /// found the configuration already changed by another, that configuration does not hold
    /// it, and the caller may ask again.
    pub fn change_membership(&self, change: mu::MembershipChange) -> Result<mu::Configuration, ProposeError> {
        let shared = &self.shared;
        if shared.stopping() {
            return Err(ProposeError::Shutdown);
        }
        if let Some(leader) = shared.leader().filter(|&l| l != shared.mu.node) {
            return Err(ProposeError::NotLeader { leader: Some(leader) });
        }
        let now = shared.now();
        let ticket = Ticket::for_current_thread(now);
        lock(&self.engine).change_membership(change, Arc::clone(&ticket));
        if let Some(parker) = shared.replication_parker.get() {
            parker.wake();
        }
        let deadline = now + shared.timeout.as_nanos() as u64;
        Pending { ticket, shared: Arc::clone(shared), engine: None, deadline }.wait()?;
        Ok(self.configuration())
    }

    /// How proposing threads attach to replication (`node.mode`).
    pub fn attach_mode(&self) -> AttachMode {
        self.shared.mode
    }

    /// The configuration this replica applied last.
    pub fn configuration(&self) -> mu::Configuration {
        self.shared.with_status(|s| s.configuration())
    }

    /// The index of the `Membership` entry that removed this replica from the cluster, if one
    /// did while it ran: it no longer counts in quorums or leads, and follows as a spare. (A
    /// replica started afresh replays its earlier removals too, so a removal alone is no
    /// reason to stop: see [`Node::leave`].)
    pub fn removed_at(&self) -> Option<u64> {
        Some(self.shared.removed_at.load(Ordering::Acquire)).filter(|&i| i != NOT_REMOVED)
    }

    /// Asks this replica's owner to stop it, which is allowed only once its configuration no
    /// longer holds it (`microrep member remove` sends it after the removal): a member's
    /// departure would take a vote from its cluster without changing the majority it needs.
    pub fn leave(&self) -> Result<(), String> {
        let configuration = self.configuration();
        if configuration.members.contains(self.id()) {
            return Err(format!(
                "replica {} is a member (members {}): remove it first (microrep member remove)",
                self.id().0,
                configuration.members
            ));
        }
        self.shared.leave_requested.store(true, Ordering::Release);
        self.shared.watchers.changed();
        Ok(())
    }

    /// Unparks `thread` whenever what [`Node::leader`], [`Node::resting`], [`Node::fatal`],
    /// [`Node::removed_at`] or [`Node::leaving`] return may have changed, so that a thread
    /// watching them can park between changes (`std::thread::park_timeout`) instead of waking
    /// now and then to look: an idle node then costs nothing for being watched. Unparks may
    /// also come without a change.
    pub fn unpark_on_change(&self, thread: std::thread::Thread) {
        self.shared.watchers.add(thread);
    }

    /// The payload bytes of the last batch encoded (see `batch_bytes_hint`), at most one
    /// entry's.
    pub(crate) fn batch_bytes_hint(&self) -> usize {
        self.shared.batch_bytes_hint.load(Ordering::Relaxed).min(self.max_entry_bytes())
    }

    /// Records the payload bytes of a batch just encoded.
    pub(crate) fn note_batch_bytes(&self, bytes: usize) {
        if self.shared.batch_bytes_hint.load(Ordering::Relaxed) != bytes {
            self.shared.batch_bytes_hint.store(bytes, Ordering::Relaxed);
        }
    }

    /// Whether [`Node::leave`] was asked: the owner stops the node.
    pub fn leaving(&self) -> bool {
        self.shared.leave_requested.load(Ordering::Acquire)
    }

    /// Changes the most commands batched into one log entry (handover mode), at once.
    pub fn set_max_batch(&self, max_batch: u32) {
        self.shared.max_batch.store(max_batch.clamp(1, 4096) as usize, Ordering::Relaxed);
    }

    /// Whether this replica may be chosen to lead (true at start). An application that cannot
    /// serve for a while (a wrapped server's copy being rebuilt) sets false: the replica stays
    /// a voter that accepts and applies the leader's entries, but it steps aside if it leads,
    /// and neither it nor its peers choose it while another live voter can lead. Which replica
    /// leads never bears on safety (Mu §5.1); this is a liveness hint.
    pub fn set_candidate(&self, candidate: bool) {
        self.shared.candidate.store(candidate, Ordering::Release);
    }

    /// The node's current status.
    pub fn status(&self) -> NodeStatus {
        self.shared.status()
    }

    /// Where the node serves its Prometheus metrics (`node.metrics`), if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::addr)
    }

    /// Adds the application's counter `name` to this node's metrics: `read` gives its value,
    /// called only when a scraper asks (keep the count in an atomic the application already
    /// updates). The exposition names it `name_total`. Without `node.metrics` nothing is served,
    /// but the name is still checked.
    pub fn register_counter(
        &self,
        name: &str,
        help: &str,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Result<(), crate::MetricNameError> {
        match &self.shared.metrics {
            Some(metrics) => metrics.register_counter(name, help, Box::new(read)),
            None => crate::metrics::check_name(name),
        }
    }

    /// The node's metrics in the OpenMetrics text format, as `GET /metrics` serves them; `None`
    /// without `node.metrics` (nothing is counted then).
    pub fn metrics_text(&self) -> Option<String> {
        self.shared.metrics.as_ref().map(|m| crate::metrics::render(m, self.shared.status()))
    }

    /// This replica's id.
    pub fn id(&self) -> NodeId {
        self.shared.mu.node
    }

    /// The replica this one believes leads.
    pub fn leader(&self) -> Option<NodeId> {
        self.shared.leader()
    }

    /// Whether this replica rests between heartbeats: the cluster has been idle, and it
    /// heartbeats at `cluster.timing.idle_heartbeat_us` instead of every `heartbeat_us` (a
    /// proposal wakes it at once).
    pub fn resting(&self) -> bool {
        self.shared.resting.load(Ordering::Relaxed)
    }

    /// The leader this replica believes in, and when (CLOCK_MONOTONIC nanoseconds, comparable
    /// across processes of one host) its failure detector chose it: the moment a fail-over's
    /// detection ends.
    pub fn leader_since(&self) -> (Option<NodeId>, u64) {
        let since = self.shared.leader_since.load(Ordering::Acquire);
        (self.shared.leader(), since)
    }

    /// Why the node stopped on its own (a configuration mismatch with a peer), if it did.
    pub fn fatal(&self) -> Option<String> {
        self.shared.with_status(|s| s.fatal.clone())
    }

    /// Stops the threads and waits for them; with a durable log, what the node applied is
    /// synced first.
    pub fn shutdown(mut self) {
        self.stop_threads(true);
    }

    /// Stops the threads; with `flush`, the durable log syncs what is queued first, otherwise
    /// it is dropped as a kill would drop it.
    fn stop_threads(&mut self, flush: bool) {
        self.metrics = None;
        self.shared.stop.store(true, Ordering::Release);
        for parker in [&self.shared.replication_parker, &self.shared.background_parker] {
            if let Some(parker) = parker.get() {
                parker.wake();
            }
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a node thread panicked");
            }
        }
        let mut engine = lock(&self.engine);
        engine.fail_all(ProposeError::Shutdown);
        engine.stop_log(flush);
    }
}

/// Dropping a node without [`Node::shutdown`] stops it as a kill would: entries applied but
/// not yet synced to the durable log are not written (none was acknowledged).
impl Drop for Node {
    fn drop(&mut self) {
        self.stop_threads(false);
    }
}

/// A proposal whose outcome is not known yet.
pub struct Pending {
    ticket: Arc<Ticket>,
    shared: Arc<Shared>,
    engine: Option<SharedEngine>,
    deadline: u64,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("done", &self.ticket.is_done()).finish()
    }
}

impl Pending {
    /// Waits for the outcome. In direct mode the calling thread drives replication meanwhile.
    /// In handover mode it spins for the first 4 µs, yields until 30 µs, then parks until the
    /// replication thread completes the proposal: on a small machine a waiter must not hold the
    /// core the replication threads need for longer than a commit usually takes.
    pub fn wait(self) -> Result<Committed, ProposeError> {
        let started = self.shared.now();
        loop {
            if let Some(outcome) = self.ticket.take() {
                return outcome.map_err(|e| self.shared.refuse(e));
            }
            if self.shared.stopping() {
                return Err(self.shared.refuse(ProposeError::Shutdown));
            }
            let now = self.shared.now();
            if now > self.deadline {
                return Err(self.shared.refuse(ProposeError::Timeout));
            }
            match &self.engine {
                Some(engine) => {
                    lock(engine).poll(now);
                }
                None => match now - started {
                    waited if waited < WAIT_SPIN_NS => std::hint::spin_loop(),
                    waited if waited < WAIT_YIELD_NS => std::thread::yield_now(),
                    _ => self.ticket.park_until_done(WAIT_PARK),
                },
            }
        }
    }

    /// The outcome if it is known, without waiting.
    pub fn try_take(&self) -> Option<Result<Committed, ProposeError>> {
        self.ticket.take().map(|outcome| outcome.map_err(|e| self.shared.refuse(e)))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.engine.is_some() {
            self.shared.direct_active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn pin_or_fail(shared: &Shared, config: &ThreadConfig) -> bool {
    match Backoff::pin(config) {
        Ok(()) => true,
        Err(e) => {
            shared.fail(e.to_string());
            false
        }
    }
}

/// The replication thread: polls the engine unless a direct-mode proposer is doing so. With
/// `followers_unhurried`, while another replica leads, an idle poll parks at once instead of
/// spinning and yielding first: a follower only applies what the leader's WRITEs committed
/// without it, and its spinning took a core the leader's threads need on a small machine. A
/// leader change wakes it (the background thread's parker call). Meanwhile it also runs under
/// `SCHED_BATCH`: its wake-ups (thousands a second under load) then wait for the running
/// thread's turn to end instead of preempting it, which is often the leader's; it runs under
/// `SCHED_OTHER` again as soon as no other replica leads.
fn replication_loop(shared: &Shared, engine: &SharedEngine, config: &ThreadConfig, followers_unhurried: bool) {
    let mut backoff = Backoff::new(config);
    let _ = shared.replication_parker.set(backoff.parker());
    if !pin_or_fail(shared, config) {
        return;
    }
    let (mut batch_scheduled, mut batch_refused) = (false, false);
    while !shared.stopping() {
        if shared.direct_active.load(Ordering::Acquire) > 0 {
            backoff.pause();
            continue;
        }
        let following = followers_unhurried && shared.leader().is_some_and(|leader| leader != shared.mu.node);
        if following != batch_scheduled && !batch_refused {
            batch_scheduled = crate::idle::schedule_as_batch(following);
            if batch_scheduled != following {
                // Asked once: a refused change is not retried on every poll.
                tracing::warn!(
                    batch = following,
                    "the kernel refused to change the replication thread's scheduling policy"
                );
                batch_refused = true;
            }
        }
        let worked = lock(engine).poll(shared.now());
        if worked {
            backoff.reset();
        } else if shared.resting.load(Ordering::SeqCst) {
            // Resting: until a proposal or the background thread ends the rest (or the leader
            // changes), this thread has nothing to do (see `RESTING_PARK_MAX`).
            backoff.rest_unless(RESTING_PARK_MAX, || !shared.resting.load(Ordering::SeqCst));
        } else if following {
            backoff.pause_unhurried();
        } else if shared.leader() == Some(shared.mu.node) {
            // Leading with nothing in flight (a poll with a proposal or a round in flight
            // counts as work): proposals wake this thread.
            backoff.pause_idle();
        } else {
            backoff.pause();
        }
    }
}

/// What the background thread polls.
struct Planes<E> {
    plane: BackgroundPlane<E>,
    identity: IdentityCheck<E>,
    /// Who may write the local log (read for the metrics' permission revocations).
    gate: Arc<LocalLogGate>,
}

/// The background thread: heartbeats, failure detection, permissions (Mu §5), and the
/// cluster-fingerprint check.
fn background_loop<F: Fabric>(shared: &Shared, fabric: &F, planes: Planes<F::Endpoint>, config: &ThreadConfig) {
    let Planes { mut plane, mut identity, gate } = planes;
    let mut backoff = Backoff::new(config);
    let _ = shared.background_parker.set(backoff.parker());
    let mut watch = LeaderWatch::default();
    if !pin_or_fail(shared, config) {
        return;
    }
    while !shared.stopping() {
        let now = shared.now();
        plane.set_candidate(shared.candidate.load(Ordering::Acquire));
        let rounds = plane.rounds();
        // A proposer that found this plane resting cleared the flag and woke it: work arrived.
        let proposed = plane.resting() && !shared.resting.load(Ordering::Relaxed);
        let facts = mu::ReplicationFacts {
            stalled: shared.stalled.load(Ordering::Relaxed),
            busy: proposed || (shared.busy.load(Ordering::Relaxed) && shared.busy.swap(false, Ordering::Relaxed)),
        };
        plane.poll(fabric, now, facts);
        if shared.resting.load(Ordering::Relaxed) != plane.resting() {
            shared.resting.store(plane.resting(), Ordering::SeqCst);
            if !plane.resting()
                && let Some(parker) = shared.replication_parker.get()
            {
                parker.wake();
            }
            shared.watchers.changed();
        }
        let chosen = plane.leader(now);
        if let Some(metrics) = &shared.metrics {
            watch.poll(metrics, plane.detector(), chosen, gate.owner(), now);
        }
        let leader = u32::from(chosen.0);
        if shared.leader.load(Ordering::Acquire) != leader {
            shared.leader_since.store(monotonic_ns(), Ordering::Release);
            shared.leader.store(leader, Ordering::Release);
            if let Some(parker) = shared.replication_parker.get() {
                parker.wake();
            }
            shared.watchers.changed();
        }
        // After the leader: a replication plane that reads these rounds, then the leader, sees
        // this choice or a later one.
        shared.live.set(plane.detector().live_set());
        shared.detector_rounds.store(plane.rounds(), Ordering::Release);
        if let Err(why) = identity.poll(fabric, now) {
            shared.fail(why.to_string());
            break;
        }
        if plane.rounds() != rounds {
            // A heartbeat tick posted READs of every peer, which on shm have completed already:
            // take them into the view before resting.
            continue;
        }
        // While nothing moves, sleep until the next heartbeat tick (or identity check): an idle
        // node's background thread wakes once per period instead of every few microseconds.
        let now = shared.now();
        // Resting at an idle stride, the identity checks wait for a tick (they are due every
        // 100 ms and have no hurry).
        let identity_due = if plane.resting() { u64::MAX } else { identity.next_due(now) };
        match plane.calm_until(now).map(|t| t.min(identity_due)) {
            Some(due) if due > now => backoff.rest(Duration::from_nanos(due - now)),
            _ => backoff.pause(),
        }
    }
}
