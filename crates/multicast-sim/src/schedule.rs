//! What happens to the group in each stage of a run: events at drawn times of the sending
//! phase, and events armed to fire once a view change is under way (a member wedged, or one
//! installed), so that failures and joins overlap the changes they and others cause.
//!
//! Two schedules. **Overlapping** (the default): up to three events per stage (crashes, a crash
//! of the change's leader, joins, a partition in the last stage), half of them within 50 µs of
//! the first, and sometimes an armed event (a crash, a leader crash or a join, up to 200 µs
//! after the trigger). **Spaced** (`Options::spaced`): the schedule the view work was first
//! simulated with, one event per stage, a second crash only once a member installed (after
//! agreement); its seeds draw exactly what they drew then, so the seeds that failed while the
//! view work was built replay the same faults.

use microrep_core::multicast::Phase;
use microrep_fabric::NodeId;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::sim::Sim;

/// One thing that happens to the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A random live member crashes.
    Crash,
    /// The lowest-ranked live member of the latest view (the leader of a change) crashes.
    CrashLeader,
    /// A running member proposes a fresh node, which starts joining.
    Join,
    /// The group is cut in two for good.
    Partition,
}

/// What arms an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// Some live member is wedged (a change is being agreed).
    Wedged,
    /// Some live member installed the next view (its cleanup is under way).
    Installed,
}

/// An event that fires `delay_ns` after its trigger is first seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Armed {
    pub(crate) trigger: Trigger,
    pub(crate) event: Event,
    pub(crate) delay_ns: u64,
    /// When it fires, once triggered.
    pub(crate) fire_at: Option<u64>,
}

/// One stage's events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stage {
    /// The first event, at a drawn time.
    pub(crate) first: Option<Event>,
    /// More events, each within 50 µs of the first (`true`) or at its own drawn time.
    pub(crate) more: Vec<(bool, Event)>,
    /// Events armed when the stage starts.
    pub(crate) armed: Vec<Armed>,
}

/// The spaced schedule: the draws of the first multi-view simulator, in the same order.
pub(crate) fn draw_spaced(rng: &mut ChaCha8Rng, stages: usize, detection: bool, faults: bool) -> Vec<Stage> {
    (0..stages)
        .map(|stage| {
            if !detection || !faults || rng.random_bool(0.25) {
                return Stage::default();
            }
            let (first, armed) = match rng.random_range(0..8) {
                0..=3 => {
                    let then = rng.random_bool(0.25);
                    let arm = Armed { trigger: Trigger::Installed, event: Event::Crash, delay_ns: 0, fire_at: None };
                    (Event::Crash, then.then_some(arm).into_iter().collect())
                }
                4..=5 => (Event::Join, Vec::new()),
                // A partition ends the run: only in its last stage.
                _ if stage + 1 == stages => (Event::Partition, Vec::new()),
                _ => (Event::Join, Vec::new()),
            };
            Stage { first: Some(first), more: Vec::new(), armed }
        })
        .collect()
}

/// The overlapping schedule (module docs).
pub(crate) fn draw_overlapping(rng: &mut ChaCha8Rng, stages: usize, detection: bool, faults: bool) -> Vec<Stage> {
    (0..stages)
        .map(|stage| {
            let mut drawn = Stage::default();
            if !detection || !faults {
                return drawn;
            }
            let last = stage + 1 == stages;
            if rng.random_bool(0.8) {
                for k in 0..rng.random_range(1..=3) {
                    let event = match rng.random_range(0..10) {
                        0..=4 => Event::Crash,
                        5 => Event::CrashLeader,
                        9 if last => Event::Partition,
                        _ => Event::Join,
                    };
                    if k == 0 {
                        drawn.first = Some(event);
                    } else {
                        drawn.more.push((rng.random_bool(0.5), event));
                    }
                }
            }
            if rng.random_bool(0.4) {
                let trigger = if rng.random_bool(0.5) { Trigger::Wedged } else { Trigger::Installed };
                let event = match rng.random_range(0..4) {
                    0..=1 => Event::Crash,
                    2 => Event::CrashLeader,
                    _ => Event::Join,
                };
                drawn.armed.push(Armed { trigger, event, delay_ns: rng.random_range(0..=200_000), fire_at: None });
            }
            drawn
        })
        .collect()
}

impl Sim {
    /// Makes `event` happen; returns whether it partitioned the group.
    pub(crate) fn happen(&mut self, event: Event) -> bool {
        match event {
            Event::Crash => {
                self.crash_one();
            }
            Event::CrashLeader => {
                let latest = self.views.last().expect("the first view").clone();
                if let Some(&leader) = latest.iter().find(|&&m| self.live().any(|n| n.id == m))
                    && !self.spare(leader)
                {
                    self.crash(leader);
                }
            }
            Event::Join => {
                self.join();
            }
            Event::Partition => {
                if !self.report.partition {
                    self.partition();
                    self.report.partition = true;
                }
                return true;
            }
        }
        false
    }

    /// Fires the armed events whose trigger was seen and whose delay passed.
    pub(crate) fn fire_armed(&mut self) {
        let wedged = self.live().any(|n| n.member.phase() == Phase::Wedged);
        let installed = self.live().any(|n| matches!(n.member.phase(), Phase::Installed(_)));
        let mut due = Vec::new();
        let now = self.now;
        self.armed.retain_mut(|armed| {
            let triggered = match armed.trigger {
                Trigger::Wedged => wedged,
                Trigger::Installed => installed,
            };
            if armed.fire_at.is_none() && triggered {
                armed.fire_at = Some(now + armed.delay_ns);
            }
            let fire = armed.fire_at.is_some_and(|at| at <= now);
            if fire {
                due.push(armed.event);
            }
            !fire
        });
        for event in due {
            self.report.events_in_change += 1;
            self.happen(event);
        }
    }

    /// Partitions the group in two for good: every link between the two sides is held both
    /// ways.
    fn partition(&mut self) {
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let side: Vec<bool> = loop {
            let side: Vec<bool> = ids.iter().map(|_| self.rng.random_bool(0.5)).collect();
            if side.iter().any(|&a| a) && side.iter().any(|&a| !a) {
                break side;
            }
        };
        for (a, _) in ids.iter().zip(&side).filter(|(_, s)| **s) {
            for (b, _) in ids.iter().zip(&side).filter(|(_, s)| !**s) {
                self.world.hold_link(*a, *b);
                self.world.hold_link(*b, *a);
            }
        }
    }
}
