//! One simulated run: a cluster of Mu replicas on the sim fabric, clients, a nemesis, and the
//! checkers after every step. Everything random comes from the seed, so a failing seed replays
//! exactly.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use microrep_core::mu::{self, Event, InvariantViolation, InvariantWatch, MuConfig, ProposeError, Replica};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimConfig, SimFabric, SimWorld};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::app::{Command, KvApp, Op};
use crate::check::{HistoryReport, HistoryViolation, Ledger, OpRecord, Outcome, check_history};
use crate::nemesis::{Fault, FaultCounts, Nemesis};
use crate::options::{CLIENT_TIMEOUT_NS, SimOptions};

/// A run that passed every check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    /// The history's figures.
    pub history: HistoryReport,
    /// Faults injected, by kind.
    pub faults: FaultCounts,
    /// Terms led, summed over replicas (leader changes + 1).
    pub terms: u64,
    /// Snapshot restores by replicas that fell behind.
    pub restores: u64,
    /// `ClusterLost` reports: every member restarted with fresh memory (possible only
    /// without `bounded_amnesia`).
    pub clusters_lost: u64,
    /// The longest stretch of the fault phase without an acknowledged operation, from the
    /// first acknowledgement to the end of the fault phase.
    pub max_gap_ns: u64,
    /// Membership changes applied (`SimOptions::membership`).
    pub membership_changes: u64,
    /// Replica polls, and those of a replica resting between heartbeats at an idle stride
    /// (`SimOptions::idle_stride`).
    pub polls: u64,
    /// See `polls`.
    pub resting_polls: u64,
    /// Membership changes the leader refused (a joiner not caught up, a change under way...).
    pub membership_refused: u64,
    /// Highest index applied.
    pub log_length: u64,
    /// Simulated time at the end.
    pub end_ns: u64,
    /// Digest of every fabric event (equal digests: the same run, bit for bit).
    pub trace_digest: u64,
}

/// A broken invariant, with what it takes to replay it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// Cluster size.
    pub replicas: u16,
    /// Simulated time of detection.
    pub at_ns: u64,
    /// The invariant and what broke it.
    pub message: String,
    /// Options besides the seed and size the replay needs (e.g. ` --restarts`).
    pub replay_flags: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} ({} replicas) at {} us: {}\n  replay: microrep-sim --seed {} --replicas {}{}",
            self.seed,
            self.replicas,
            self.at_ns / 1000,
            self.message,
            self.seed,
            self.replicas,
            self.replay_flags
        )
    }
}

fn fault_fabric(preempt: f64) -> SimConfig {
    let config = SimConfig { delay_prob: 0.01, delay_max_ns: 100_000, fail_prob: 0.002, ..SimConfig::faulty() };
    if preempt > 0.0 { SimConfig { preempt_prob: preempt, preempt_max_ns: 50_000, ..config } } else { config }
}

struct Node {
    replica: Option<Replica<SimFabric>>,
    app: KvApp,
    paused_until: Option<u64>,
    /// When a crashed replica comes back with empty memory (restarts on).
    restart_at: Option<u64>,
    /// Restarted with empty memory during the fault phase: counted among the replicas that lost
    /// their memory (`SimOptions::bounded_amnesia`).
    amnesic: bool,
    /// The cluster generation it last became a voter of, kept across restarts as a runtime
    /// with a data directory keeps it (`MuConfig::generation`).
    generation: u64,
    /// The invariants across this run of the replica's polls.
    watch: InvariantWatch,
}

struct Client {
    target: NodeId,
    seq: u64,
    outstanding: Option<usize>,
    next_issue_ns: u64,
    acked_in_liveness: bool,
}

/// Why a run fails: the first broken invariant, or a cluster that did not settle in time
/// (becomes [`Failure::message`]).
#[derive(Debug, thiserror::Error)]
enum Violation {
    /// The first violation the ledger recorded (agreement, validity, ...).
    #[error("{0}")]
    Ledger(String),
    #[error(
        "availability: no operation acknowledged for {} us (from {} us), with process faults on a minority",
        .gap_ns / 1_000,
        .from_ns / 1_000
    )]
    Availability { gap_ns: u64, from_ns: u64 },
    /// Each replica's state when the liveness phase ran out.
    #[error(
        "liveness: not settled {limit_ms} ms after faults stopped (acked top {acked_top}; {})",
        .replicas.join("; ")
    )]
    Stuck { limit_ms: u64, acked_top: u64, replicas: Vec<String> },
    #[error("replica {replica} broke an invariant: {source}")]
    Invariant { replica: usize, source: InvariantViolation },
    #[error("a Committed event without an application")]
    CommittedUnapplied,
    #[error("replica {replica} reported generation {generation:x} lost, though at most a minority lost its memory")]
    ClusterLost { replica: usize, generation: u64 },
    #[error(transparent)]
    History(#[from] HistoryViolation),
    #[error("convergence: replica {replica} holds a different state at index {index}")]
    Divergence { replica: usize, index: u64 },
    #[error("configurations: replica {replica} changed to {got} at index {index}, another to {expected}")]
    Configuration { replica: usize, index: u64, got: String, expected: String },
}

/// The state of one run.
struct Run {
    seed: u64,
    options: SimOptions,
    world: SimWorld,
    rng: ChaCha8Rng,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    ledger: Rc<RefCell<Ledger>>,
    history: Vec<OpRecord>,
    requests: BTreeMap<u64, (usize, usize)>,
    next_request: u64,
    now: u64,
    report: RunReport,
    events: Vec<Event>,
    /// Held links and when each is released: (at, from, to).
    held_links: Vec<(u64, NodeId, NodeId)>,
    /// When an operation was last acknowledged during the fault phase.
    last_ack_ns: Option<u64>,
    /// A stretch without acknowledgements beyond `SimOptions::max_gap_ns`, found as a client
    /// completed.
    gap_violation: Option<Violation>,
    /// The configuration each `Membership` entry made, as the first replica to apply it
    /// reported it.
    configurations: BTreeMap<u64, mu::Configuration>,
    /// When the next membership change is asked for (`SimOptions::membership`).
    next_change_ns: u64,
}

/// Simulates `seed` with `options`; `Err` names the first broken invariant.
pub fn run(seed: u64, options: &SimOptions) -> Result<RunReport, Failure> {
    let mut run = Run::new(seed, options.clone());
    run.execute().map_err(|violation| Failure {
        seed,
        replicas: options.replicas,
        at_ns: run.now,
        message: violation.to_string(),
        replay_flags: options.replay_flags(),
    })?;
    Ok(run.report)
}

impl Run {
    fn new(seed: u64, options: SimOptions) -> Self {
        let fabric = if options.faults { fault_fabric(options.preempt) } else { SimConfig::reliable() };
        let fabric = SimConfig { instant_prob: options.instant, ..fabric };
        let world = SimWorld::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5151, fabric);
        let ledger = Rc::new(RefCell::new(Ledger::default()));
        let n = options.replicas;
        let nodes = (0..n)
            .map(|i| {
                let config = Self::config(&options, NodeId(i));
                let fabric = world.add_cluster_node(NodeId(i), n, &mu::regions(&config)).expect("sim node");
                let replica = Replica::new(fabric, config, 0).expect("valid sim configuration");
                Node {
                    replica: Some(replica),
                    app: KvApp::new(NodeId(i), ledger.clone()),
                    paused_until: None,
                    restart_at: None,
                    watch: InvariantWatch::default(),
                    amnesic: false,
                    generation: 0,
                }
            })
            .collect();
        let clients = (0..options.clients)
            .map(|_| Client {
                target: NodeId(0),
                seq: 0,
                outstanding: None,
                next_issue_ns: 0,
                acked_in_liveness: false,
            })
            .collect();
        Self {
            seed,
            world,
            rng: ChaCha8Rng::seed_from_u64(seed),
            nodes,
            clients,
            ledger,
            history: Vec::new(),
            requests: BTreeMap::new(),
            next_request: 1,
            now: 0,
            report: RunReport::default(),
            events: Vec::new(),
            held_links: Vec::new(),
            last_ack_ns: None,
            gap_violation: None,
            configurations: BTreeMap::new(),
            next_change_ns: 300_000,
            options,
        }
    }

    fn config(options: &SimOptions, node: NodeId) -> MuConfig {
        let mut config = MuConfig::simulated(node, options.replicas);
        if options.membership {
            config.members = mu::MemberSet::first(options.replicas.saturating_sub(2).max(1));
        }
        if let Some(grace) = options.join_grace_heartbeats {
            config.join_grace_heartbeats = grace;
        }
        config.recycle_wait_ns = options.recycle_wait_ns;
        config.idle_stride = options.idle_stride;
        #[cfg(feature = "planted-bugs")]
        {
            config.planted_bug = options.bug;
        }
        config
    }

    fn execute(&mut self) -> Result<(), Violation> {
        let o = &self.options;
        let max_faults = if o.faults { o.max_faults } else { 0 };
        let mut nemesis = Nemesis::new(self.seed, o.replicas, o.fault_phase_ns, max_faults, o.restarts, o.swarm);
        let fault_end = self.options.fault_phase_ns;
        let deadline = fault_end + self.options.liveness_limit_ns;
        let mut liveness = false;
        loop {
            self.now += self.rng.random_range(200..2_000);
            self.world.advance_to(self.now);
            if !liveness && self.now >= fault_end {
                liveness = true;
                self.note_gap(fault_end)?;
                self.world.set_config(SimConfig::reliable());
                self.release_links(u64::MAX);
                for i in 0..self.nodes.len() {
                    self.resume(i);
                    if self.nodes[i].restart_at.is_some() {
                        self.restart(i);
                    }
                    self.nodes[i].amnesic = false;
                }
            }
            if !liveness {
                for fault in nemesis.due(self.now, &self.live_leader()) {
                    self.inject(fault, &mut nemesis);
                }
                self.change_membership();
            }
            self.resume_due();
            self.release_links(self.now);
            self.restart_due();
            self.poll_replicas()?;
            // Preempted replicas moved the fabric's time on.
            self.now = self.now.max(self.world.now());
            self.drive_clients(liveness);
            if let Some(v) = self.ledger.borrow().violations.first() {
                return Err(Violation::Ledger(v.clone()));
            }
            if let Some(v) = self.gap_violation.take() {
                return Err(v);
            }
            if liveness && self.settled() {
                break;
            }
            if self.now > deadline {
                return Err(self.stuck_report());
            }
        }
        self.report.end_ns = self.now;
        self.report.trace_digest = self.world.trace_digest();
        self.report.log_length = self.ledger.borrow().chosen_len();
        self.report.history = check_history(&self.history, &self.ledger.borrow())?;
        self.check_convergence()
    }

    /// The replica most replicas believe leads (for the nemesis to target).
    fn live_leader(&self) -> Option<NodeId> {
        self.nodes.iter().filter_map(|n| n.replica.as_ref()).map(|r| r.status().leader).min()
    }

    fn inject(&mut self, fault: Fault, nemesis: &mut Nemesis) {
        if let Fault::Link { from, to, for_ns, both_ways } = fault {
            tracing::debug!(?fault, now = self.now, "nemesis");
            self.report.faults.record(&fault);
            let directions = if both_ways { vec![(from, to), (to, from)] } else { vec![(from, to)] };
            for (a, b) in directions {
                self.world.hold_link(a, b);
                self.held_links.push((self.now + for_ns, a, b));
            }
            return;
        }
        self.heal_amnesia();
        let heals = self.options.amnesia_heals;
        let down = self
            .nodes
            .iter()
            .filter(|n| n.replica.is_none() || n.paused_until.is_some() || (heals && n.amnesic))
            .count();
        // With membership changes a configuration may have three members: one of them down at
        // most.
        let size = if self.options.membership { 3 } else { self.options.replicas };
        let minority = usize::from(size - 1) / 2;
        let node = fault.node();
        let i = usize::from(node.0);
        if down >= minority || self.nodes[i].replica.is_none() || self.nodes[i].paused_until.is_some() {
            return;
        }
        if matches!(fault, Fault::Crash { .. }) && !self.may_lose_memory(i, minority) {
            return;
        }
        tracing::debug!(?fault, now = self.now, "nemesis");
        self.report.faults.record(&fault);
        match fault {
            Fault::Crash { .. } => {
                self.world.crash(node);
                self.nodes[i].replica = None;
                self.nodes[i].restart_at = nemesis.restart_delay().map(|d| self.now + d);
                for c in 0..self.clients.len() {
                    if self.clients[c].target == node {
                        self.resolve(c, Outcome::Unknown);
                    }
                }
            }
            Fault::Pause { for_ns, hold_writes, .. } => {
                self.nodes[i].paused_until = Some(self.now + for_ns);
                if hold_writes {
                    self.world.hold_outgoing(node);
                }
            }
            Fault::Link { .. } => {}
        }
    }

    /// Releases the held links due by `now`.
    fn release_links(&mut self, now: u64) {
        let world = &self.world;
        self.held_links.retain(|&(at, from, to)| {
            if at <= now {
                world.release_link(from, to);
            }
            at > now
        });
    }

    /// Whether crashing replica `i` keeps the replicas that lost their memory in the fault
    /// phase within a minority (always true unless `SimOptions::bounded_amnesia`).
    fn may_lose_memory(&self, i: usize, minority: usize) -> bool {
        let lost = self.nodes.iter().filter(|n| n.replica.is_none() || n.amnesic).count();
        !self.nodes[i].amnesic && lost < minority
    }

    /// With `amnesia_heals`: restarted replicas that are voters again no longer count as having
    /// lost their memory.
    fn heal_amnesia(&mut self) {
        if !self.options.amnesia_heals {
            return;
        }
        for n in &mut self.nodes {
            if n.amnesic && n.replica.as_ref().is_some_and(|r| r.status().voter) {
                n.amnesic = false;
            }
        }
    }

    fn resume(&mut self, i: usize) {
        if self.nodes[i].paused_until.take().is_some() {
            self.world.release_outgoing(NodeId(i as u16));
        }
    }

    fn resume_due(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused_until.is_some_and(|t| t <= self.now) {
                self.resume(i);
            }
        }
    }

    fn restart_due(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].restart_at.is_some_and(|t| t <= self.now) {
                self.restart(i);
            }
        }
    }

    /// Brings crashed replica `i` back as a fresh process: zeroed regions on the fabric (a new
    /// incarnation, which operations posted to the old one never reach), a new replica and a
    /// new, empty copy of the application.
    fn restart(&mut self, i: usize) {
        self.nodes[i].restart_at = None;
        let node = NodeId(i as u16);
        let mut config = Self::config(&self.options, node);
        let fabric = self.world.restart(node, &mu::regions(&config)).expect("a crashed sim node restarts");
        tracing::debug!(%node, incarnation = fabric.incarnation(), now = self.now, "restart with empty memory");
        // A new run of the replica: a promotion meant for the old one must not apply to it.
        config.incarnation |= u64::from(fabric.incarnation()) << 16;
        config.generation = self.nodes[i].generation;
        let replica = Replica::new(fabric, config, self.now).expect("valid sim configuration");
        let n = &mut self.nodes[i];
        n.replica = Some(replica);
        n.watch = InvariantWatch::default();
        n.app = KvApp::new(node, self.ledger.clone());
        n.amnesic = self.options.bounded_amnesia;
        self.report.faults.restarts += 1;
    }

    fn poll_replicas(&mut self) -> Result<(), Violation> {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.shuffle(&mut self.rng);
        for i in order {
            let node = &mut self.nodes[i];
            if node.paused_until.is_some() {
                continue;
            }
            let Some(replica) = node.replica.as_mut() else { continue };
            // Swarm testing polls the planes as separate actors: now and then only one runs.
            match if self.options.swarm { self.rng.random_range(0..6) } else { 2 } {
                0 => replica.poll_background(self.now),
                1 => replica.poll_replication(self.now, &mut node.app, &mut self.events),
                // With an idle stride, a resting background plane is left alone as the runtime
                // leaves it (every seed without one replays as it did before).
                _ if self.options.idle_stride > 1 => replica.poll_resting(self.now, &mut node.app, &mut self.events),
                _ => replica.poll(self.now, &mut node.app, &mut self.events),
            }
            node.watch.check(replica).map_err(|source| Violation::Invariant { replica: i, source })?;
            self.report.polls += 1;
            self.report.resting_polls += u64::from(replica.resting());
            let answers: BTreeMap<u64, u64> = node.app.answers.drain(..).collect();
            for event in std::mem::take(&mut self.events) {
                match event {
                    Event::Committed { request_id, .. } | Event::Failed { request_id, .. }
                        if !self.requests.contains_key(&request_id) => {}
                    Event::Committed { request_id, index } => {
                        let answer = *answers.get(&index).ok_or(Violation::CommittedUnapplied)?;
                        self.complete(request_id, Outcome::Acked { index, answer, at_ns: self.now });
                    }
                    Event::Failed { request_id, maybe_committed } => {
                        let outcome = if maybe_committed { Outcome::Unknown } else { Outcome::NotCommitted };
                        self.complete(request_id, outcome);
                    }
                    Event::Restored { .. } => self.report.restores += 1,
                    Event::RestartedFromDisk { .. } => {}
                    Event::LeaderChanged { .. } => {}
                    Event::Voter { generation } => self.nodes[i].generation = generation,
                    Event::ClusterLost { generation } if self.options.bounded_amnesia => {
                        return Err(Violation::ClusterLost { replica: i, generation });
                    }
                    Event::ClusterLost { .. } => self.report.clusters_lost += 1,
                    Event::MembershipChanged { index, configuration } => {
                        self.check_configuration(i, index, configuration)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every replica that applies the `Membership` entry at `index` must reach the same
    /// configuration.
    fn check_configuration(&mut self, i: usize, index: u64, got: mu::Configuration) -> Result<(), Violation> {
        match self.configurations.get(&index) {
            Some(&expected) if expected != got => Err(Violation::Configuration {
                replica: i,
                index,
                got: format!("{} (epoch {})", got.members, got.epoch),
                expected: format!("{} (epoch {})", expected.members, expected.epoch),
            }),
            Some(_) => Ok(()),
            None => {
                self.configurations.insert(index, got);
                self.report.membership_changes += 1;
                Ok(())
            }
        }
    }

    /// With `SimOptions::membership`: asks the replica that leads to add a joiner or remove a
    /// member (three stay at least), now and then.
    fn change_membership(&mut self) {
        if !self.options.membership || self.now < self.next_change_ns {
            return;
        }
        self.next_change_ns = self.now + self.rng.random_range(20_000..200_000);
        let capacity = self.options.replicas;
        let leader = self
            .nodes
            .iter_mut()
            .filter(|n| n.paused_until.is_none())
            .filter_map(|n| n.replica.as_mut())
            .find(|r| r.status().role == mu::Role::Leader);
        let Some(leader) = leader else { return };
        let members = leader.status().configuration.members;
        let id = NodeId(self.rng.random_range(0..capacity));
        let change = if members.contains(id) {
            if members.len() <= 3 {
                return;
            }
            mu::MembershipChange::Remove(id)
        } else {
            mu::MembershipChange::Add(id)
        };
        let request_id = self.next_request;
        self.next_request += 1;
        match leader.propose_membership(request_id, change) {
            Ok(()) => tracing::debug!(%change, now = self.now, "membership change proposed"),
            Err(e) => {
                tracing::debug!(%change, error = %e, now = self.now, "membership change refused");
                self.report.membership_refused += 1;
            }
        }
    }

    fn complete(&mut self, request_id: u64, outcome: Outcome) {
        let Some(&(client, record)) = self.requests.get(&request_id) else { return };
        if self.clients[client].outstanding == Some(record) {
            self.resolve(client, outcome);
        }
    }

    /// Measures the stretch without an acknowledged operation that ends at `now` (fault phase
    /// only), and fails the run if it exceeds `max_gap_ns`.
    fn note_gap(&mut self, now: u64) -> Result<(), Violation> {
        let Some(last) = self.last_ack_ns.replace(now) else { return Ok(()) };
        let gap = now - last;
        self.report.max_gap_ns = self.report.max_gap_ns.max(gap);
        match self.options.max_gap_ns {
            Some(max) if gap > max => Err(Violation::Availability { gap_ns: gap, from_ns: last }),
            _ => Ok(()),
        }
    }

    /// With `max_gap_ns`, clients give up on a request after [`CLIENT_TIMEOUT_NS`] (its outcome
    /// is unknown) and try the next replica, as real clients do: otherwise a client whose
    /// leader is paused waits out the pause, and the measure would be the pause's length rather
    /// than the cluster's.
    fn time_out(&mut self, c: usize) {
        let Some(record) = self.clients[c].outstanding.filter(|_| self.options.max_gap_ns.is_some()) else { return };
        if self.history[record].invoke_ns + CLIENT_TIMEOUT_NS <= self.now {
            self.resolve(c, Outcome::Unknown);
            let target = usize::from(self.clients[c].target.0);
            self.clients[c].target = NodeId(((target + 1) % self.nodes.len()) as u16);
        }
    }

    fn resolve(&mut self, client: usize, outcome: Outcome) {
        let Some(record) = self.clients[client].outstanding.take() else { return };
        self.history[record].outcome = outcome;
        if matches!(outcome, Outcome::Acked { .. })
            && self.now < self.options.fault_phase_ns
            && let Err(e) = self.note_gap(self.now)
        {
            self.gap_violation.get_or_insert(e);
        }
        let think = self.rng.random_range(0..20_000);
        self.clients[client].next_issue_ns = self.now + think;
        if self.options.idle_stride > 1 && self.rng.random_ratio(1, 16) {
            // A lull: every client pauses, so that the cluster goes idle and rests.
            let until = self.now + self.rng.random_range(400_000..3_000_000);
            for c in &mut self.clients {
                c.next_issue_ns = c.next_issue_ns.max(until);
            }
        }
        let c = &mut self.clients[client];
        if matches!(outcome, Outcome::Acked { .. }) && self.now >= self.options.fault_phase_ns {
            c.acked_in_liveness = true;
        }
    }

    fn drive_clients(&mut self, liveness: bool) {
        for c in 0..self.clients.len() {
            self.time_out(c);
            let client = &self.clients[c];
            if client.outstanding.is_some() || client.next_issue_ns > self.now || (liveness && client.acked_in_liveness)
            {
                continue;
            }
            let target = usize::from(client.target.0);
            let usable = self.nodes[target].paused_until.is_none() && self.nodes[target].replica.is_some();
            if !usable {
                self.clients[c].target = NodeId(((target + 1) % self.nodes.len()) as u16);
                continue;
            }
            let key = self.rng.random_range(0..4u8);
            let op =
                if self.rng.random_bool(0.5) { Op::Put { key, value: self.rng.random() } } else { Op::Get { key } };
            let command = Command { client: c as u32, seq: self.clients[c].seq + 1, op };
            let request_id = self.next_request;
            let replica = self.nodes[target].replica.as_mut().expect("usable");
            match replica.propose(request_id, &command.encode()) {
                Ok(()) => {
                    self.next_request += 1;
                    self.clients[c].seq += 1;
                    self.ledger.borrow_mut().issue(command);
                    self.history.push(OpRecord { command, invoke_ns: self.now, outcome: Outcome::Pending });
                    self.requests.insert(request_id, (c, self.history.len() - 1));
                    self.clients[c].outstanding = Some(self.history.len() - 1);
                }
                Err(ProposeError::NotLeader { leader }) => {
                    self.clients[c].target = leader;
                    self.clients[c].next_issue_ns = self.now + 5_000;
                }
                Err(_) => self.clients[c].next_issue_ns = self.now + 20_000,
            }
        }
    }

    /// Liveness reached: no client waits, each got an operation acknowledged after the faults,
    /// and every live replica applied everything acknowledged.
    fn settled(&self) -> bool {
        let clients_done = self.clients.iter().all(|c| c.outstanding.is_none() && c.acked_in_liveness);
        let top = self.acked_top();
        clients_done && self.nodes.iter().filter(|n| n.replica.is_some()).all(|n| n.app.next_index() >= top)
    }

    fn acked_top(&self) -> u64 {
        self.history
            .iter()
            .filter_map(|r| match r.outcome {
                Outcome::Acked { index, .. } => Some(index + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    fn stuck_report(&self) -> Violation {
        let replicas = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match &n.replica {
                Some(r) => {
                    let s = r.status();
                    format!(
                        "{i}: {:?} ({}) leader {} fuo {} applied {} tail {} pending {}{}{}",
                        s.role,
                        s.phase,
                        s.leader.0,
                        s.fuo,
                        s.applied,
                        s.tail,
                        s.pending,
                        if s.voter { "" } else { " recovering" },
                        if self.options.membership {
                            format!(" members {} epoch {}", s.configuration.members, s.configuration.epoch)
                        } else {
                            String::new()
                        }
                    )
                }
                None => format!("{i}: crashed"),
            })
            .collect();
        Violation::Stuck { limit_ms: self.options.liveness_limit_ns / 1_000_000, acked_top: self.acked_top(), replicas }
    }

    /// Live replicas that applied the same prefix hold the same state.
    fn check_convergence(&mut self) -> Result<(), Violation> {
        let mut by_index: BTreeMap<u64, u64> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate().filter(|(_, n)| n.replica.is_some()) {
            if let Some(&digest) = by_index.get(&n.app.next_index())
                && digest != n.app.digest()
            {
                return Err(Violation::Divergence { replica: i, index: n.app.next_index() });
            }
            by_index.insert(n.app.next_index(), n.app.digest());
        }
        self.report.terms = self.nodes.iter().filter_map(|n| n.replica.as_ref()).map(|r| r.status().terms_led).sum();
        Ok(())
    }
}
