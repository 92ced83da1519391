//! One seeded run: draw a group, drive it through a fault phase and a liveness phase, check.

use microrep_core::multicast::{Delivery, FailureDetection, GroupConfig, Phase, SubgroupConfig};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimConfig, SimWorld};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::Violation;
use crate::schedule::{Event, Stage, draw_overlapping, draw_spaced};
use crate::sim::{Sim, rng};

/// Default length of the fault phase, in simulated nanoseconds.
pub const DEFAULT_FAULT_PHASE_NS: u64 = 2_000_000;
/// Simulated time the liveness phase may take before it counts as a violation.
pub const LIVENESS_BUDGET_NS: u64 = 200_000_000;
/// Mixed into a seed for the stream that draws which subgroups deliver at receipt.
const AT_RECEIPT_STREAM: u64 = 0x6174_5f72_6563_6569;
/// Mixed into a seed for the stream that draws which messages are delivered in place.
const IN_PLACE_STREAM: u64 = 0x696e_5f70_6c61_6365;
/// Mixed into a seed for the stream that draws whether peers' rings are pulled.
const PULL_STREAM: u64 = 0x7075_6c6c_5f72_696e;

/// What a run does besides what its seed draws.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Inject faults (delays, failures, torn writes, paused members, slow senders).
    pub faults: bool,
    /// Simulated nanoseconds of sending (and faults).
    pub fault_phase_ns: u64,
    /// Most messages sent in each stage of a run.
    pub messages: u32,
    /// Let half the seeds run with failure detection, through 1 to 4 stages that each may
    /// crash members, add some, or partition the group (view changes with ragged-edge
    /// cleanup, joins with state transfer), overlapping the changes they cause (`schedule.rs`).
    pub views: bool,
    /// The spaced schedule of the first multi-view simulator (one event per stage, a second
    /// crash only after agreement), for the seeds found with it.
    pub spaced: bool,
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
            spaced: false,
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
        if self.spaced {
            flags.push_str(" --spaced");
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
    /// Subgroups that deliver at receipt (`Delivery::Unordered`).
    pub at_receipt: u64,
    /// Subgroups whose messages may be delivered in place (some payload is longer than
    /// `copy_at_receipt_bytes`).
    pub in_place: u64,
    /// Whether each member drew its own `copy_at_receipt_bytes` (the template's are then
    /// only the first draw's).
    pub thresholds_apart: bool,
    /// Whether the simulated fabric lent peers' memory, so that receivers read each sender's
    /// ring in the sender's own memory (shm's way) instead of their pushed copies.
    pub pulled: bool,
    /// Crashed nodes restarted at once under their id (pulled runs only; `sim.rs`).
    pub restarts: u64,
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
    /// Members crashed.
    pub crashes: u64,
    /// Members that joined (proposed).
    pub joins: u64,
    /// Events armed by a view change under way (a crash, a leader's crash or a join while a
    /// member was wedged or had installed).
    pub events_in_change: u64,
    /// Whether the group was partitioned in two (for good).
    pub partition: bool,
    /// Views installed after the first (the last epoch reached).
    pub views: u64,
    /// Ballots started by leaders of view changes (`Stats::ballots`, all nodes).
    pub ballots: u64,
    /// Proposals that took an earlier ballot's accepted value (`Stats::adopted`).
    pub adopted: u64,
    /// Fresh-SST barriers at installs (`Stats::barriers`).
    pub barriers: u64,
    /// Sections of a joiner's state written in place of a suspected writer (`Stats::takeovers`).
    pub takeovers: u64,
    /// Join requests lost with their sponsor (crashed as it proposed).
    pub lost_requests: u64,
    /// Requests joiners left in a member's mailbox themselves (`Stats::join_asks`).
    pub join_asks: u64,
    /// Joiners that gave up (`MulticastError::JoinTimedOut`).
    pub joins_given_up: u64,
    /// Members that stopped for want of a majority (`MulticastError::MajorityLost`).
    pub majority_lost: u64,
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
                delivery: Delivery::Ordered,
                copy_at_receipt_bytes: microrep_core::multicast::COPY_AT_RECEIPT_BYTES,
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
        instant_prob: 0.0,
        lend_peer_memory: false,
    }
}

/// How the liveness phase of a stage ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    /// Every live member runs the same view and holds every message its senders sent.
    Done,
    /// Too few members are left for a majority: every one that has not failed stopped
    /// (`MulticastError::MajorityLost`), as required, and every joiner gave up.
    NoMajority,
}

impl Sim {
    /// Whether the stage's liveness phase is over (see [`Settled`]).
    fn settled(&self) -> Option<Settled> {
        // Excluded members, and joiners the group gave up on (a failure cut their state
        // transfer short, so the view after theirs removed them), are out.
        let latest = self.views.last().expect("the first view");
        let live: Vec<_> = self
            .live()
            .filter(|n| match n.member.phase() {
                Phase::Excluded => false,
                Phase::Joining => self.awaited(n, latest),
                _ => true,
            })
            .collect();
        let Some(first) = live.first() else {
            // Every member failed, or stopped for want of a majority of its view
            // (`MulticastError::MajorityLost`, checked when it stops: `joiners.rs`). The group
            // has ended, and nobody waits for good: every node still up was left out or
            // refused (a joiner gives up, asking or not).
            let waiting = self.live().any(|n| n.member.phase() != Phase::Excluded && n.refused.is_none());
            return (!waiting).then_some(Settled::NoMajority);
        };
        let (epoch, config) = (first.member.epoch(), first.member.config());
        let running = live.iter().all(|n| n.member.phase() == Phase::Running && n.member.epoch() == epoch);
        if !running {
            // Changing views, or a joiner still waiting. A group without a majority does not
            // stay here: its members stop (above).
            return None;
        }
        if config.members.iter().any(|m| !live.iter().any(|n| n.id == *m)) {
            return None;
        }
        for (s, sub) in config.subgroups.iter().enumerate() {
            // At receipt: at most once, so only what was sent in this view is owed, and
            // members' histories may differ in what earlier views lost and in interleaving.
            let at_receipt = self.checker.is_at_receipt(s);
            let needed = if at_receipt {
                self.checker.sent_by_in(s, &sub.senders, epoch)
            } else {
                self.checker.sent_by(s, &sub.senders)
            };
            let mut reference: Option<&[u64]> = None;
            for node in live.iter().filter(|n| sub.members.contains(&n.id)) {
                let history = node.app.history.get(&s).map_or(&[][..], Vec::as_slice);
                let disagrees = !at_receipt && reference.is_some_and(|r| r != history);
                if disagrees || !needed.iter().all(|id| history.contains(id)) {
                    return None;
                }
                reference.get_or_insert(history);
            }
        }
        Some(Settled::Done)
    }

    fn liveness_failure(&self) -> Failure {
        let phases: Vec<String> =
            self.live().map(|n| format!("{}: view {} {:?}", n.id, n.member.epoch(), n.member.phase())).collect();
        let counts: Vec<String> = (0..self.template.subgroups.len())
            .map(|s| {
                let counts: Vec<usize> = self.live().map(|n| n.app.history.get(&s).map_or(0, Vec::len)).collect();
                format!("subgroup {s}: sent {} histories {counts:?}", self.checker.sent_count(s))
            })
            .collect();
        self.fail(Violation::Liveness(format!(
            "not every message delivered or view run: {}; {}; {} crashes, {} events during a change, {} joins",
            counts.join("; "),
            phases.join(", "),
            self.report.crashes,
            self.report.events_in_change,
            self.report.joins
        )))
    }

    fn finish(mut self) -> Result<Report, Failure> {
        self.check_nothing_lost()?;
        self.report.writes = self.nodes.iter().map(|n| n.member.stats().writes).sum();
        self.report.nulls = self.nodes.iter().map(|n| n.member.stats().nulls_sent).sum();
        self.report.ballots = self.nodes.iter().map(|n| n.member.stats().ballots).sum();
        self.report.adopted = self.nodes.iter().map(|n| n.member.stats().adopted).sum();
        self.report.barriers = self.nodes.iter().map(|n| n.member.stats().barriers).sum();
        self.report.takeovers = self.nodes.iter().map(|n| n.member.stats().takeovers).sum();
        self.report.join_asks = self.nodes.iter().map(|n| n.member.stats().join_asks).sum();
        self.report.views = self.views.len() as u64 - 1;
        self.report.end_ns = self.now;
        self.report.trace_digest = self.world.trace_digest();
        Ok(self.report)
    }
}

/// Whether seed `seed`'s fabric lends peers' memory, so that receivers pull each sender's ring
/// from the sender's own memory as on shm: half the seeds, drawn from a stream of their own so
/// that a seed's other draws stay as they were.
pub fn rings_pulled(seed: u64) -> bool {
    ChaCha8Rng::seed_from_u64(seed ^ PULL_STREAM).random_bool(0.5)
}

/// Runs seed `seed` under `options`.
pub fn run(seed: u64, options: &Options) -> Result<Report, Failure> {
    let mut rng = rng(seed);
    #[cfg_attr(not(feature = "planted-bugs"), allow(unused_mut))]
    let mut config = draw_group(&mut rng);
    // A quarter of the subgroups deliver at receipt, drawn from a stream of their own so that
    // the rest of a seed's draws (and its regression meaning) stay as they were.
    let mut modes = ChaCha8Rng::seed_from_u64(seed ^ AT_RECEIPT_STREAM);
    for sub in &mut config.subgroups {
        if modes.random_bool(0.25) {
            sub.delivery = Delivery::Unordered;
        }
    }
    // Every message delivered in place, none, or those above a drawn length: likewise.
    let mut copies = ChaCha8Rng::seed_from_u64(seed ^ IN_PLACE_STREAM);
    for sub in &mut config.subgroups {
        sub.copy_at_receipt_bytes = match copies.random_range(0..3) {
            0 => 0,
            1 => sub.max_payload_bytes,
            _ => copies.random_range(0..sub.max_payload_bytes),
        };
    }
    // A third of the seeds configure each member's threshold apart (a sender's choice travels
    // in the slot header, so members need not agree on it).
    let apart = copies.random_bool(1.0 / 3.0);
    let detection = options.views && rng.random_bool(0.5);
    if detection {
        // Suspicion far above the longest pause (300 µs) plus delay (200 µs): crashes are
        // found, pauses rarely taken for one. Room for joiners and their state.
        config.failure_detection = Some(FailureDetection::new(20_000, 2_000_000, 8, 1 << 15));
    }
    #[cfg(feature = "planted-bugs")]
    {
        config.planted_bug = options.bug;
    }
    let mut fabric = draw_fabric(&mut rng, options.faults);
    fabric.lend_peer_memory = rings_pulled(seed);
    let world = SimWorld::new(seed, fabric.clone());
    let n = config.members.len();
    let slow = (options.faults && rng.random_bool(0.5)).then(|| NodeId(rng.random_range(0..n) as u16));
    let stages = if detection && options.faults { rng.random_range(1..=4) } else { 1 };
    let draw = if options.spaced { draw_spaced } else { draw_overlapping };
    let schedule = draw(&mut rng, stages, detection, options.faults);
    let mut sim = Sim::new(seed, options.replay_command(seed), rng, world, config.clone(), apart);
    sim.keep_majority = !options.spaced;
    sim.report = Report {
        members: n,
        subgroups: config.subgroups.len(),
        at_receipt: config.subgroups.iter().filter(|s| s.delivery == Delivery::Unordered).count() as u64,
        in_place: config.subgroups.iter().filter(|s| s.copy_at_receipt_bytes < s.max_payload_bytes).count() as u64,
        thresholds_apart: apart,
        pulled: fabric.lend_peer_memory,
        slow_member: slow.is_some(),
        detection,
        ..Report::default()
    };
    for events in schedule {
        let partitioned = stage(&mut sim, options, fabric.clone(), events, slow)?;
        if partitioned {
            // Safety only: the sides may stay wedged; give a majority side time to go on.
            for _ in 0..20_000 {
                sim.round()?;
            }
            return sim.finish();
        }
        match settle(&mut sim)? {
            Settled::Done => {}
            Settled::NoMajority => return sim.finish(),
        }
    }
    if detection {
        // Heartbeats never stop: an idle group with failure detection is not quiet.
        return sim.finish();
    }
    quiesce(&mut sim)?;
    sim.finish()
}

/// One stage's sending phase under faults, with its event; returns whether it partitioned
/// the group.
fn stage(
    sim: &mut Sim,
    options: &Options,
    fabric: SimConfig,
    events: Stage,
    slow: Option<NodeId>,
) -> Result<bool, Failure> {
    let lend_peer_memory = fabric.lend_peer_memory;
    sim.world.set_config(fabric);
    let start = sim.now;
    let end = start + options.fault_phase_ns;
    let draw_at =
        |sim: &mut Sim| start + sim.rng.random_range(options.fault_phase_ns / 10..=options.fault_phase_ns * 3 / 4);
    let at = draw_at(sim);
    let mut pending: Vec<(u64, Event)> = events.first.map(|e| (at, e)).into_iter().collect();
    for (clustered, event) in events.more {
        let time = if clustered { at + sim.rng.random_range(0..=50_000) } else { draw_at(sim) };
        pending.push((time, event));
    }
    sim.armed.extend(events.armed);
    let mut sent = 0u32;
    let mut held_until: Vec<(NodeId, u64)> = Vec::new();
    let mut partitioned = false;
    while sim.now < end {
        let step = sim.rng.random_range(100..1_000);
        sim.advance(step);
        let now = sim.now;
        held_until.retain(|&(node, until)| {
            let release = until <= now;
            if release {
                sim.world.release_outgoing(node);
            }
            !release
        });
        while let Some(i) = pending.iter().position(|&(time, _)| time <= sim.now) {
            let (_, event) = pending.remove(i);
            partitioned |= sim.happen(event);
        }
        sim.fire_armed();
        let action = sim.rng.random_range(0..100);
        if action < 25 && sent < options.messages {
            sim.send();
            sent += 1;
        } else if action < 26 && options.faults {
            let i = sim.rng.random_range(0..sim.nodes.len());
            let node = sim.nodes[i].id;
            if !held_until.iter().any(|&(n, _)| n == node) {
                held_until.push((node, sim.now + sim.rng.random_range(1_000..300_000)));
                sim.world.hold_outgoing(node);
                sim.report.pauses += 1;
            }
        } else {
            let i = sim.rng.random_range(0..sim.nodes.len());
            if !sim.nodes[i].up() || (slow == Some(sim.nodes[i].id) && sim.rng.random_range(0..20) != 0) {
                continue;
            }
            sim.poll(i)?;
        }
    }
    // The liveness phase: a reliable fabric, no pauses.
    sim.world.set_config(SimConfig { lend_peer_memory, ..SimConfig::reliable() });
    for (node, _) in held_until {
        sim.world.release_outgoing(node);
    }
    Ok(partitioned)
}

/// Polls every member in turn until the stage settles, within [`LIVENESS_BUDGET_NS`].
fn settle(sim: &mut Sim) -> Result<Settled, Failure> {
    let deadline = sim.now + LIVENESS_BUDGET_NS;
    loop {
        if let Some(settled) = sim.settled() {
            return Ok(settled);
        }
        if sim.now > deadline {
            return Err(sim.liveness_failure());
        }
        // Only joiners left (the members failed or stopped): they ask every few milliseconds
        // or wait to give up, so time may pass in larger steps.
        let joiners_only = sim.live().all(|n| matches!(n.member.phase(), Phase::Joining | Phase::Excluded));
        sim.round_by(if joiners_only { 100_000 } else { 500 })?;
    }
}

/// Quiescence: once a round finds nothing to do and nothing is in flight, an idle group posts
/// nothing more, however long it is polled.
fn quiesce(sim: &mut Sim) -> Result<(), Failure> {
    let deadline = sim.now + LIVENESS_BUDGET_NS;
    loop {
        // Nothing in flight before the round (so nothing lands unseen), and the round found
        // nothing to do.
        let in_flight = sim.world.pending_ops();
        let work = sim.round()?;
        if !work && in_flight == 0 && sim.nodes.iter().all(|n| n.member.is_idle()) {
            break;
        }
        if sim.now > deadline {
            return Err(sim.fail(Violation::Liveness("the group never went idle".into())));
        }
    }
    let writes: u64 = sim.nodes.iter().map(|n| n.member.stats().writes).sum();
    for _ in 0..50 {
        sim.round()?;
    }
    let after: u64 = sim.nodes.iter().map(|n| n.member.stats().writes).sum();
    if after != writes {
        return Err(sim.fail(Violation::Liveness(format!("an idle group posted {} more writes", after - writes))));
    }
    Ok(())
}
