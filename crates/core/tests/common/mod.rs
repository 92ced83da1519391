//! A small cluster of Mu replicas on the simulated fabric, stepped in 1 us ticks, for scenario
//! tests named after the paper's sections. (The full fault-injecting simulator with checkers is
//! the `microrep-sim` crate.) Each test crate uses a part of it.
#![allow(dead_code)]

use std::cell::RefCell;

use microrep_core::mu::{
    self, Configuration, Event, MuConfig, ProposeError, Replica, RestoreError, StateMachine, Status,
};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimConfig, SimFabric, SimWorld};

/// An application that records what it applied.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Recorder {
    /// (index, command) in application order.
    pub(crate) applied: Vec<(u64, Vec<u8>)>,
    /// Snapshots restored, by index.
    pub(crate) restored_at: Vec<u64>,
    /// With a durable log: what was handed to it, as (index, command) of the commands up to
    /// `persisted_end` (a restored snapshot counts as everything it holds).
    pub(crate) persisted: Vec<(u64, Vec<u8>)>,
    /// The index below which every entry was handed to the durable log.
    pub(crate) persisted_end: u64,
    /// With a durable log: the configurations handed to it, as (index, configuration as of
    /// that index): a membership entry at `i` gives `i + 1`, a checkpoint at `c` gives `c`.
    pub(crate) disk_configurations: RefCell<Vec<(u64, Configuration)>>,
}

impl Recorder {
    /// The commands, in order, without indices.
    pub(crate) fn commands(&self) -> Vec<Vec<u8>> {
        self.applied.iter().map(|(_, c)| c.clone()).collect()
    }

    /// The configuration a disk holding what this replica handed to its log below `disk`
    /// holds as of `disk`, if it holds one.
    pub(crate) fn configuration_on_disk(&self, disk: u64) -> Option<Configuration> {
        let held = self.disk_configurations.borrow();
        held.iter().filter(|(at, _)| *at <= disk).max_by_key(|(at, _)| *at).map(|&(_, c)| c)
    }
}

impl StateMachine for Recorder {
    fn apply(&mut self, index: u64, command: &[u8]) {
        self.applied.push((index, command.to_vec()));
    }

    fn persist(&mut self, index: u64, command: Option<&[u8]>) {
        if let Some(command) = command {
            self.persisted.push((index, command.to_vec()));
        }
        self.persisted_end = index + 1;
    }

    fn persist_membership(&mut self, index: u64, configuration: Configuration) {
        self.disk_configurations.borrow_mut().push((index + 1, configuration));
        self.persisted_end = index + 1;
    }

    fn checkpoint(&self, index: u64, configuration: Configuration, _state: &[u8]) {
        self.disk_configurations.borrow_mut().push((index, configuration));
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        for (index, command) in &self.applied {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&(command.len() as u32).to_le_bytes());
            out.extend_from_slice(command);
        }
    }

    fn restore(&mut self, index: u64, mut bytes: &[u8]) -> Result<(), RestoreError> {
        let malformed = |got| RestoreError::Length { got, expected: "(8 + 4 + n)-byte records" };
        let total = bytes.len();
        let mut applied = Vec::new();
        while !bytes.is_empty() {
            let (header, rest) = bytes.split_at_checked(12).ok_or(malformed(total))?;
            let at = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(header[8..].try_into().expect("4 bytes")) as usize;
            let (command, rest) = rest.split_at_checked(len).ok_or(malformed(total))?;
            applied.push((at, command.to_vec()));
            bytes = rest;
        }
        self.persisted.retain(|(i, _)| *i >= index);
        self.persisted.splice(0..0, applied.iter().cloned());
        self.persisted_end = self.persisted_end.max(index);
        self.applied = applied;
        self.restored_at.push(index);
        Ok(())
    }
}

/// A cluster under test.
pub(crate) struct Cluster {
    pub(crate) world: SimWorld,
    pub(crate) replicas: Vec<Option<Replica<SimFabric>>>,
    pub(crate) apps: Vec<Recorder>,
    pub(crate) events: Vec<Vec<Event>>,
    pub(crate) paused: Vec<bool>,
    pub(crate) now: u64,
    /// Poll as the runtime does (`Replica::poll_resting`): a background plane that rests is not
    /// polled until its rest is over.
    pub(crate) rests: bool,
}

/// Settings for scenario tests: the simulation preset with a 32-slot log, snapshots every 8.
pub(crate) fn config(node: NodeId, replicas: u16) -> MuConfig {
    MuConfig { log_slots: 32, snapshot_every: 8, snapshot_bytes: 1 << 16, ..MuConfig::simulated(node, replicas) }
}

impl Cluster {
    /// `n` replicas on a world with `fabric` behaviour, built with `configure` applied to each
    /// replica's configuration.
    pub(crate) fn new(n: u16, fabric: SimConfig, configure: impl Fn(&mut MuConfig)) -> Self {
        Self::seeded(7, n, fabric, configure)
    }

    /// Like [`Cluster::new`], with the fabric's random choices drawn from `seed`.
    pub(crate) fn seeded(seed: u64, n: u16, fabric: SimConfig, configure: impl Fn(&mut MuConfig)) -> Self {
        let world = SimWorld::new(seed, fabric);
        let replicas = (0..n)
            .map(|i| {
                let mut c = config(NodeId(i), n);
                configure(&mut c);
                let f = world.add_cluster_node(NodeId(i), n, &mu::regions(&c)).expect("node");
                Some(Replica::new(f, c, 0).expect("replica"))
            })
            .collect();
        let n = usize::from(n);
        Self {
            world,
            replicas,
            apps: vec![Recorder::default(); n],
            events: vec![Vec::new(); n],
            paused: vec![false; n],
            now: 0,
            rests: false,
        }
    }

    /// Advances one microsecond and polls every running replica.
    pub(crate) fn tick(&mut self) {
        self.now += 1_000;
        self.world.advance_to(self.now);
        for i in 0..self.replicas.len() {
            if self.paused[i] {
                continue;
            }
            if let Some(r) = self.replicas[i].as_mut() {
                if self.rests {
                    r.poll_resting(self.now, &mut self.apps[i], &mut self.events[i]);
                } else {
                    r.poll(self.now, &mut self.apps[i], &mut self.events[i]);
                }
            }
        }
    }

    /// Ticks until `done` holds; panics after `limit_us` simulated microseconds.
    pub(crate) fn run_until(&mut self, limit_us: u64, what: &str, mut done: impl FnMut(&Self) -> bool) {
        for _ in 0..limit_us {
            if done(self) {
                return;
            }
            self.tick();
        }
        panic!("{what}: not reached within {limit_us} us; statuses: {:?}", self.statuses());
    }

    /// Ticks for `us` simulated microseconds.
    pub(crate) fn run_for(&mut self, us: u64) {
        for _ in 0..us {
            self.tick();
        }
    }

    /// Replica `i`'s status.
    pub(crate) fn status(&self, i: usize) -> Status {
        self.replicas[i].as_ref().expect("running").status()
    }

    fn statuses(&self) -> Vec<Option<Status>> {
        self.replicas.iter().map(|r| r.as_ref().map(Replica::status)).collect()
    }

    /// Proposes on replica `i`.
    pub(crate) fn propose(&mut self, i: usize, request_id: u64, payload: &[u8]) -> Result<(), ProposeError> {
        self.replicas[i].as_mut().expect("running").propose(request_id, payload)
    }

    /// Crashes replica `i`.
    pub(crate) fn crash(&mut self, i: usize) {
        self.world.crash(NodeId(i as u16));
        self.replicas[i] = None;
    }

    /// Brings crashed replica `i` back as a new run with fresh memory: zeroed regions, an empty
    /// application, a new incarnation.
    pub(crate) fn restart(&mut self, i: usize) {
        let (node, n) = (NodeId(i as u16), self.replicas.len() as u16);
        let c = MuConfig { incarnation: self.now | 1 << 40, ..config(node, n) };
        let f = self.world.add_cluster_node(node, n, &mu::regions(&c)).expect("restart");
        self.replicas[i] = Some(Replica::new(f, c, self.now).expect("replica"));
        self.apps[i] = Recorder::default();
        self.events[i].clear();
        self.paused[i] = false;
    }

    /// Waits until every running replica counts in quorums (a new cluster: once all are up).
    pub(crate) fn bootstrapped(&mut self) {
        self.run_until(20_000, "bootstrap", |c| c.replicas.iter().flatten().all(|r| r.status().voter));
    }

    /// Request ids replica `i` reported committed.
    pub(crate) fn committed(&self, i: usize) -> Vec<u64> {
        self.events[i]
            .iter()
            .filter_map(|e| match e {
                Event::Committed { request_id, .. } => Some(*request_id),
                _ => None,
            })
            .collect()
    }

    /// Waits for replica `i` to lead, then proposes `count` commands one at a time, each after
    /// the previous committed, ids starting at `first_id`.
    /// Ticks until a running replica leads, idle; returns it. With leader stickiness the
    /// replica leading after a fault need not be the lowest live id.
    pub(crate) fn settled_leader(&mut self) -> usize {
        let leading = |c: &Self, i: usize| {
            c.replicas[i].is_some() && c.status(i).role == mu::Role::Leader && c.status(i).phase == mu::Stage::Idle
        };
        self.run_until(50_000, "a settled leader", |c| (0..c.replicas.len()).any(|i| leading(c, i)));
        (0..self.replicas.len()).find(|&i| leading(self, i)).expect("a leader")
    }

    pub(crate) fn commit_sequentially(&mut self, i: usize, first_id: u64, count: u64) {
        for id in first_id..first_id + count {
            // As a client would: a proposal that failed without being written (its replica
            // stepped down before writing it) is proposed again once the replica leads.
            loop {
                self.run_until(20_000, "leadership", |c| c.status(i).role == mu::Role::Leader);
                self.propose(i, id, &id.to_le_bytes()).expect("propose");
                self.run_until(20_000, "commit", |c| c.committed(i).contains(&id) || c.failed_unwritten(i, id));
                if self.committed(i).contains(&id) {
                    break;
                }
                self.events[i].retain(|e| !matches!(e, Event::Failed { request_id, .. } if *request_id == id));
            }
        }
    }

    /// Whether replica `i` reported request `id` failed without being written anywhere.
    fn failed_unwritten(&self, i: usize, id: u64) -> bool {
        self.events[i]
            .iter()
            .any(|e| matches!(e, Event::Failed { request_id, maybe_committed: false } if *request_id == id))
    }

    /// Whether every running replica applied the same commands as replica `reference`.
    pub(crate) fn converged_with(&self, reference: usize) -> bool {
        let want = self.apps[reference].commands();
        self.replicas.iter().zip(&self.apps).filter(|(r, _)| r.is_some()).all(|(_, a)| a.commands() == want)
    }
}

/// Random latencies, occasional long delays and torn writes, but no failed operations.
pub(crate) fn timing() -> SimConfig {
    SimConfig { fail_prob: 0.0, delay_prob: 0.01, delay_max_ns: 100_000, ..SimConfig::faulty() }
}
