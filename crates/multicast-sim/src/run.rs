//! One seeded run: draw a group, drive it through a fault phase and a liveness phase, check.

use microrep_core::multicast::{
    DeliveryBatch, FailureDetection, GroupConfig, Member, Phase, SendError, SubgroupConfig, region,
};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimConfig, SimFabric, SimWorld};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::{Checker, Sent, Violation};

/// Default length of the fault phase, in simulated nanoseconds.
pub const DEFAULT_FAULT_PHASE_NS: u64 = 2_000_000;
/// Simulated time the liveness phase may take before it counts as a violation.
pub const LIVENESS_BUDGET_NS: u64 = 200_000_000;

/// What a run does besides what its seed draws.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Inject faults (delays, failures, torn writes, paused members, slow senders).
    pub faults: bool,
    /// Simulated nanoseconds of sending (and faults).
    pub fault_phase_ns: u64,
    /// Most messages sent in a run.
    pub messages: u32,
    /// Let half the seeds run with failure detection, and half of those crash a member
    /// (view change with ragged-edge cleanup).
    pub views: bool,
    /// A planted protocol bug every member runs with.
    #[cfg(feature = "planted-bugs")]
    pub bug: Option<microrep_core::multicast::PlantedBug>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            faults: true,
            fault_phase_ns: DEFAULT_FAULT_PHASE_NS,
            messages: 200,
            views: true,
            #[cfg(feature = "planted-bugs")]
            bug: None,
        }
    }
}

impl Options {
    /// The command that runs `seed` with these options.
    pub fn replay_command(&self, seed: u64) -> String {
        let defaults = Self::default();
        #[cfg_attr(not(feature = "planted-bugs"), allow(unused_mut))]
        let mut features = String::new();
        let mut flags = format!("--seed {seed}");
        if !self.faults {
            flags.push_str(" --no-faults");
        }
        if self.fault_phase_ns != defaults.fault_phase_ns {
            flags.push_str(&format!(" --fault-phase-us {}", self.fault_phase_ns / 1_000));
        }
        if self.messages != defaults.messages {
            flags.push_str(&format!(" --messages {}", self.messages));
        }
        if !self.views {
            flags.push_str(" --no-views");
        }
        #[cfg(feature = "planted-bugs")]
        if let Some(bug) = self.bug {
            features.push_str(" --features planted-bugs");
            flags.push_str(&format!(" --bug {bug:?}"));
        }
        format!("cargo run --release -p microrep-multicast-sim{features} -- {flags}")
    }
}

/// What a passing run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Members of the group.
    pub members: usize,
    /// Subgroups.
    pub subgroups: usize,
    /// Messages sent.
    pub sent: u64,
    /// Deliveries (messages × members that delivered them).
    pub delivered: u64,
    /// Null messages added by slow-order senders.
    pub nulls: u64,
    /// WRITEs posted.
    pub writes: u64,
    /// Members paused (writes held) during the fault phase.
    pub pauses: u64,
    /// Whether one member was a slow poller.
    pub slow_member: bool,
    /// Whether the members ran failure detection.
    pub detection: bool,
    /// Whether a member crashed.
    pub crash: bool,
    /// Whether the group was partitioned in two (for good).
    pub partition: bool,
    /// Whether a view was installed (after a crash or a suspicion).
    pub view_installed: bool,
    /// Simulated end time.
    pub end_ns: u64,
    /// Digest of the fabric's event trace: equal digests, equal runs.
    pub trace_digest: u64,
}

/// A broken invariant, with what replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// Simulated time of the detection.
    pub at_ns: u64,
    /// What broke.
    pub violation: Violation,
    /// The command that replays the run.
    pub replay: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} at {} ns: {} (replay: {})", self.seed, self.at_ns, self.violation, self.replay)
    }
}

/// Draws the group of a seed: 2 to 5 members, 1 to 3 subgroups of random members and senders.
fn draw_group(rng: &mut ChaCha8Rng) -> GroupConfig {
    let n = rng.random_range(2..=5u16);
    let members: Vec<NodeId> = (0..n).map(NodeId).collect();
    let subgroups = (0..rng.random_range(1..=3))
        .map(|_| {
            let sub_members: Vec<NodeId> = loop {
                let pick: Vec<NodeId> = members.iter().copied().filter(|_| rng.random_bool(0.7)).collect();
                if pick.len() >= 2 {
                    break pick;
                }
            };
            let senders: Vec<NodeId> = loop {
                let pick: Vec<NodeId> = sub_members.iter().copied().filter(|_| rng.random_bool(0.6)).collect();
                if !pick.is_empty() {
                    break pick;
                }
            };
            SubgroupConfig {
                members: sub_members,
                senders,
                window: rng.random_range(1..=8),
                max_payload_bytes: 8 * rng.random_range(1..=8),
            }
        })
        .collect();
    // Built from `single` so that the optional planted-bug field takes its default whatever
    // features the core was built with.
    GroupConfig { subgroups, ..GroupConfig::single(NodeId(0), members, 1, 8) }
}

fn draw_fabric(rng: &mut ChaCha8Rng, faults: bool) -> SimConfig {
    if !faults {
        return SimConfig::reliable();
    }
    SimConfig {
        latency_min_ns: 500,
        latency_max_ns: rng.random_range(500..=5_000),
        delay_prob: rng.random_range(0.0..0.1),
        delay_max_ns: 200_000,
        fail_prob: rng.random_range(0.0..0.02),
        torn_write_prob: rng.random_range(0.1..0.6),
        peer_timeout_ns: 1_000_000,
        preempt_prob: 0.0,
        preempt_max_ns: 0,
    }
}

struct Sim {
    seed: u64,
    replay: String,
    rng: ChaCha8Rng,
    world: SimWorld,
    config: GroupConfig,
    members: Vec<Member<SimFabric>>,
    checker: Checker,
    now: u64,
    report: Report,
    crashed: Vec<bool>,
    /// The side of each member once the group is partitioned.
    sides: Option<Vec<bool>>,
}

impl Sim {
    fn fail(&self, violation: Violation) -> Failure {
        Failure { seed: self.seed, at_ns: self.now, violation, replay: self.replay.clone() }
    }

    /// Polls member `m` and checks what it delivered; returns whether the poll did anything.
    fn poll(&mut self, m: usize) -> Result<bool, Failure> {
        let mut batch_log: Vec<(usize, NodeId, u64, Vec<u8>)> = Vec::new();
        let mut upcall = |batch: DeliveryBatch<'_>| {
            for msg in batch.messages {
                batch_log.push((batch.subgroup, msg.sender, msg.seq, msg.payload.to_vec()));
            }
        };
        let work = match self.members[m].poll(self.now, &mut upcall) {
            Ok(work) => work,
            Err(e) => return Err(self.fail(Violation::Poll(e.to_string()))),
        };
        let me = self.config.members[m];
        for (subgroup, sender, seq, payload) in batch_log {
            self.report.delivered += 1;
            if let Err(v) = self.checker.delivered(subgroup, me, sender, seq, &payload) {
                return Err(self.fail(v));
            }
            // The oracle: every member of the subgroup holds the message (stability); in a
            // view change's cleanup, every member of the new view.
            let sub = &self.config.subgroups[subgroup];
            let rank = sub.senders.iter().position(|&s| s == sender).expect("validated sender");
            let index = seq / sub.senders.len() as u64;
            let holders: Vec<NodeId> = match self.members[m].phase() {
                Phase::Installed(view) => sub.members.iter().copied().filter(|x| view.members.contains(x)).collect(),
                _ => sub.members.clone(),
            };
            for &other in &holders {
                let o = self.config.members.iter().position(|&x| x == other).expect("member");
                if self.members[o].received(subgroup, rank) <= index {
                    return Err(self.fail(Violation::Stability { subgroup, member: me, seq, missing_at: other }));
                }
            }
        }
        Ok(work)
    }

    /// Polls every member once, then lets 500 ns pass; returns whether any poll did anything.
    fn round(&mut self) -> Result<bool, Failure> {
        let mut work = false;
        for m in 0..self.members.len() {
            if !self.crashed[m] {
                work |= self.poll(m)?;
            }
        }
        self.advance(500);
        Ok(work)
    }

    /// Sends one message from a random sender of a random subgroup, if its ring has room.
    fn send(&mut self) {
        let subgroup = self.rng.random_range(0..self.config.subgroups.len());
        let sub = &self.config.subgroups[subgroup];
        let sender = *sub.senders.choose(&mut self.rng).expect("validated: senders");
        let m = self.config.members.iter().position(|&x| x == sender).expect("member");
        if self.crashed[m] {
            return;
        }
        let len = self.rng.random_range(1..=sub.max_payload_bytes as usize);
        let payload: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
        let result = if self.rng.random_bool(0.5) {
            self.members[m].send(subgroup, &payload)
        } else {
            // Zero-copy: build in the slot.
            self.members[m].reserve(subgroup).and_then(|mut slot| {
                slot.payload_mut()[..len].copy_from_slice(&payload);
                slot.commit(len)
            })
        };
        match result {
            Ok(seq) => {
                self.checker.sent(subgroup, seq, Sent { sender, payload });
                self.report.sent += 1;
            }
            Err(SendError::WindowFull(_) | SendError::ViewChanging(_)) => {}
            Err(e) => panic!("seed {}: send refused: {e}", self.seed),
        }
    }

    fn all_delivered(&self) -> bool {
        self.config.subgroups.iter().enumerate().all(|(s, sub)| {
            let sent = self.checker.sent_count(s);
            sub.members.iter().all(|&m| self.checker.delivered_count(s, m) == sent)
        })
    }

    fn finish(mut self) -> Report {
        self.report.writes = self.members.iter().map(|m| m.stats().writes).sum();
        self.report.nulls = self.members.iter().map(|m| m.stats().nulls_sent).sum();
        self.report.end_ns = self.now;
        self.report.trace_digest = self.world.trace_digest();
        self.report
    }

    fn view_change_started(&self) -> bool {
        self.crashed.iter().any(|&c| c)
            || self.sides.is_some()
            || self.members.iter().any(|m| m.phase() != Phase::Running)
    }

    /// On each side of a partition (or in the whole group), with a majority of the view alive
    /// there, every live member installed a view or was excluded; without one, every live
    /// member is wedged (no view may be installed).
    fn views_settled(&self) -> bool {
        let n = self.members.len();
        let sides: Vec<Vec<usize>> = match &self.sides {
            Some(side) => {
                vec![(0..n).filter(|&m| side[m]).collect(), (0..n).filter(|&m| !side[m]).collect()]
            }
            None => vec![(0..n).collect()],
        };
        sides.iter().all(|members| {
            let live: Vec<Phase> =
                members.iter().filter(|&&m| !self.crashed[m]).map(|&m| self.members[m].phase()).collect();
            // After a partition, suspicions a moment apart may leave the sides wedged on
            // different sets, which this slice never reconciles: only safety is required
            // there (every member stopped, at most one view).
            if 2 * live.len() > n && self.sides.is_none() {
                live.iter().all(|p| matches!(p, Phase::Installed(_) | Phase::Excluded))
            } else {
                live.iter().all(|p| *p != Phase::Running)
            }
        })
    }

    /// Virtual synchrony: one view at most, of a majority; its members delivered the same
    /// messages, including every message any member (crashed or excluded) delivered.
    fn check_views(&self) -> Result<(), Failure> {
        let installed: Vec<(NodeId, microrep_core::multicast::View)> = self
            .members
            .iter()
            .zip(&self.config.members)
            .filter_map(|(m, &id)| match m.phase() {
                Phase::Installed(view) => Some((id, view)),
                _ => None,
            })
            .collect();
        let Some((first_id, first)) = installed.first() else { return Ok(()) };
        for (id, view) in &installed {
            if view.members != first.members {
                return Err(self.fail(Violation::VirtualSynchrony(format!(
                    "{id} installed {view:?}, {first_id} installed {first:?}"
                ))));
            }
            if !view.members.contains(id) {
                return Err(self.fail(Violation::VirtualSynchrony(format!("{id} installed a view without itself"))));
            }
        }
        if 2 * first.members.len() <= self.members.len() {
            return Err(self.fail(Violation::VirtualSynchrony(format!("a minority view {:?}", first.members))));
        }
        let installed_ids: Vec<NodeId> = installed.iter().map(|(id, _)| *id).collect();
        for (s, sub) in self.config.subgroups.iter().enumerate() {
            let most = sub.members.iter().map(|&m| self.checker.delivered_count(s, m)).max().unwrap_or(0);
            for &m in sub.members.iter().filter(|m| installed_ids.contains(m)) {
                let count = self.checker.delivered_count(s, m);
                if count != most {
                    return Err(self.fail(Violation::VirtualSynchrony(format!(
                        "subgroup {s}: {m} of the new view delivered {count} messages, another member {most}"
                    ))));
                }
            }
        }
        Ok(())
    }

    fn advance(&mut self, ns: u64) {
        self.now += ns;
        self.world.advance_to(self.now);
    }
}

/// Runs seed `seed` under `options`.
pub fn run(seed: u64, options: &Options) -> Result<Report, Failure> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    #[cfg_attr(not(feature = "planted-bugs"), allow(unused_mut))]
    let mut config = draw_group(&mut rng);
    let detection = options.views && rng.random_bool(0.5);
    if detection {
        // Suspicion far above the longest pause (300 µs) plus delay (200 µs): crashes are
        // found, pauses rarely taken for one.
        config.failure_detection = Some(FailureDetection { heartbeat_period_ns: 20_000, suspect_after_ns: 2_000_000 });
    }
    #[cfg(feature = "planted-bugs")]
    {
        config.planted_bug = options.bug;
    }
    let world = SimWorld::new(seed, draw_fabric(&mut rng, options.faults));
    let spec = region(&config);
    let fabrics: Vec<SimFabric> =
        config.members.iter().map(|&me| world.add_node(me, &[spec]).expect("a fresh world takes every node")).collect();
    let members: Vec<Member<SimFabric>> = fabrics
        .into_iter()
        .zip(&config.members)
        .map(|(fabric, &me)| Member::new(fabric, GroupConfig { me, ..config.clone() }).expect("a drawn group is valid"))
        .collect();
    let n = members.len();
    let slow = (options.faults && rng.random_bool(0.5)).then(|| rng.random_range(0..n));
    let crash = (detection && options.faults && rng.random_bool(0.5)).then(|| {
        (rng.random_range(0..n), rng.random_range(options.fault_phase_ns / 10..=options.fault_phase_ns * 3 / 4))
    });
    let partition = (detection && options.faults && crash.is_none() && rng.random_bool(0.5)).then(|| {
        let side: Vec<bool> = loop {
            let side: Vec<bool> = (0..n).map(|_| rng.random_bool(0.5)).collect();
            if side.iter().any(|&a| a) && side.iter().any(|&a| !a) {
                break side;
            }
        };
        (side, rng.random_range(options.fault_phase_ns / 10..=options.fault_phase_ns * 3 / 4))
    });
    let mut sim = Sim {
        seed,
        replay: options.replay_command(seed),
        checker: Checker::new(config.subgroups.len()),
        report: Report {
            members: n,
            subgroups: config.subgroups.len(),
            slow_member: slow.is_some(),
            detection,
            crash: crash.is_some(),
            partition: partition.is_some(),
            ..Report::default()
        },
        rng,
        world,
        config,
        members,
        now: 0,
        crashed: vec![false; n],
        sides: None,
    };
    let mut held_until: Vec<Option<u64>> = vec![None; n];

    // Fault phase: sends, polls in random order, pauses, a slow member.
    while sim.now < options.fault_phase_ns {
        let step = sim.rng.random_range(100..1_000);
        sim.advance(step);
        for (m, until) in held_until.iter_mut().enumerate() {
            if until.is_some_and(|t| t <= sim.now) {
                *until = None;
                sim.world.release_outgoing(NodeId(m as u16));
            }
        }
        if let Some((m, at)) = crash
            && at <= sim.now
            && !sim.crashed[m]
        {
            sim.crashed[m] = true;
            sim.world.crash(NodeId(m as u16));
        }
        if let Some((side, at)) = &partition
            && *at <= sim.now
            && sim.sides.is_none()
        {
            // A partition for good: every link between the two sides is held both ways.
            for a in (0..n).filter(|&m| side[m]) {
                for b in (0..n).filter(|&m| !side[m]) {
                    sim.world.hold_link(NodeId(a as u16), NodeId(b as u16));
                    sim.world.hold_link(NodeId(b as u16), NodeId(a as u16));
                }
            }
            sim.sides = Some(side.clone());
        }
        let action = sim.rng.random_range(0..100);
        if action < 25 && sim.report.sent < u64::from(options.messages) {
            sim.send();
        } else if action < 26 && options.faults {
            let m = sim.rng.random_range(0..n);
            if held_until[m].is_none() {
                held_until[m] = Some(sim.now + sim.rng.random_range(1_000..300_000));
                sim.world.hold_outgoing(NodeId(m as u16));
                sim.report.pauses += 1;
            }
        } else {
            let m = sim.rng.random_range(0..n);
            if sim.crashed[m] || (slow == Some(m) && sim.rng.random_range(0..20) != 0) {
                continue;
            }
            sim.poll(m)?;
        }
    }

    // Liveness phase: a reliable fabric, no pauses, every member polled in turn.
    sim.world.set_config(SimConfig::reliable());
    for (m, until) in held_until.iter_mut().enumerate() {
        if until.take().is_some() {
            sim.world.release_outgoing(NodeId(m as u16));
        }
    }
    let deadline = sim.now + LIVENESS_BUDGET_NS;
    loop {
        let changing = sim.view_change_started();
        if (changing && sim.views_settled()) || (!changing && sim.all_delivered()) {
            break;
        }
        if sim.now > deadline {
            let missing: Vec<String> = sim
                .config
                .subgroups
                .iter()
                .enumerate()
                .map(|(s, sub)| {
                    let counts: Vec<usize> = sub.members.iter().map(|&m| sim.checker.delivered_count(s, m)).collect();
                    format!("subgroup {s}: sent {} delivered {counts:?}", sim.checker.sent_count(s))
                })
                .collect();
            let phases: Vec<Phase> = sim.members.iter().map(Member::phase).collect();
            return Err(sim.fail(Violation::Liveness(format!(
                "not every message delivered or view installed: {}; phases {phases:?}",
                missing.join("; ")
            ))));
        }
        sim.round()?;
    }
    if sim.view_change_started() {
        if sim.sides.is_some() {
            // Give a majority side time to finish its cleanup before the checks.
            for _ in 0..10_000 {
                sim.round()?;
            }
        }
        sim.check_views()?;
        sim.report.view_installed = sim.members.iter().any(|m| matches!(m.phase(), Phase::Installed(_)));
        return Ok(sim.finish());
    }
    if detection {
        // Heartbeats never stop: an idle group with failure detection is not quiet.
        return Ok(sim.finish());
    }
    // Quiescence: once a round finds nothing to do and nothing is in flight, an idle group
    // posts nothing more, however long it is polled.
    let deadline = sim.now + LIVENESS_BUDGET_NS;
    loop {
        // Nothing in flight before the round (so nothing lands unseen), and the round found
        // nothing to do.
        let in_flight = sim.world.pending_ops();
        let work = sim.round()?;
        if !work && in_flight == 0 && sim.members.iter().all(Member::is_idle) {
            break;
        }
        if sim.now > deadline {
            return Err(sim.fail(Violation::Liveness("the group never went idle".into())));
        }
    }
    let writes: u64 = sim.members.iter().map(|m| m.stats().writes).sum();
    for _ in 0..50 {
        sim.round()?;
    }
    let after: u64 = sim.members.iter().map(|m| m.stats().writes).sum();
    if after != writes {
        return Err(sim.fail(Violation::Liveness(format!("an idle group posted {} more writes", after - writes))));
    }
    Ok(sim.finish())
}
