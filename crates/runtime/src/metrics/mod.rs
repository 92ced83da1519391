//! A node's Prometheus metrics (`node.metrics`). Threads that already do the work count it in
//! atomics: the engine where it completes proposals (two relaxed additions per committed
//! command, no lock, no allocation), proposing threads where they are refused, the background
//! thread where it changes the leader or the owner of the local log. Everything else is read
//! from the node's status when scraped, on the metrics thread (`http`), which renders the
//! OpenMetrics text with `prometheus-client` (`render`). docs/METRICS.md lists the metrics.

mod app;
mod histogram;
mod http;
mod render;

use std::sync::atomic::{AtomicU64, Ordering};

use microrep_core::mu::PullScore;
use microrep_fabric::NodeId;

use crate::api::ProposeError;
use app::AppCounters;
pub use app::MetricNameError;
pub(crate) use app::check_name;
use histogram::Histogram;
pub(crate) use http::MetricsServer;
pub(crate) use render::render;

/// The `kind` label of each refusal counter, in the order of [`refusal`].
const REFUSALS: [&str; 9] = [
    "not_leader",
    "backlogged",
    "too_large",
    "state_too_large",
    "unknown",
    "timeout",
    "shutdown",
    "membership",
    "too_many_commands",
];

/// Which refusal counter `error` increments.
fn refusal(error: &ProposeError) -> usize {
    match error {
        ProposeError::NotLeader { .. } => 0,
        ProposeError::Backlogged => 1,
        ProposeError::TooLarge { .. } => 2,
        ProposeError::StateTooLarge { .. } => 3,
        ProposeError::Unknown => 4,
        ProposeError::Timeout => 5,
        ProposeError::Shutdown => 6,
        ProposeError::Membership(_) => 7,
        ProposeError::TooManyCommands { .. } => 8,
    }
}

/// What the node's threads count for the metrics; times are in the node's clock
/// (`Shared::now`, nanoseconds since the node started).
#[derive(Debug)]
pub(crate) struct NodeMetrics {
    /// Submit to commit of commands proposed on this node; its count is the commit counter.
    commit_latency: Histogram,
    refused: [AtomicU64; REFUSALS.len()],
    leader_changes: AtomicU64,
    revocations: AtomicU64,
    detection: Histogram,
    switch: Histogram,
    last_detection_ns: AtomicU64,
    last_switch_ns: AtomicU64,
    /// When the background plane last chose a leader.
    leader_chosen_at: AtomicU64,
    /// The application's own counters (`Node::register_counter`).
    app: AppCounters,
}

impl NodeMetrics {
    pub(crate) fn new() -> Self {
        Self {
            commit_latency: Histogram::new(),
            refused: std::array::from_fn(|_| AtomicU64::new(0)),
            leader_changes: AtomicU64::new(0),
            revocations: AtomicU64::new(0),
            detection: Histogram::new(),
            switch: Histogram::new(),
            last_detection_ns: AtomicU64::new(0),
            last_switch_ns: AtomicU64::new(0),
            leader_chosen_at: AtomicU64::new(0),
            app: AppCounters::default(),
        }
    }

    /// Adds the application's counter `name`, read by `read` at each scrape.
    pub(crate) fn register_counter(
        &self,
        name: &str,
        help: &str,
        read: Box<dyn Fn() -> u64 + Send + Sync>,
    ) -> Result<(), MetricNameError> {
        self.app.register(name, help, read)
    }

    /// A command proposed here committed `ns` nanoseconds after it was submitted.
    pub(crate) fn committed(&self, ns: u64) {
        self.commit_latency.record(ns);
    }

    /// A proposal made here failed with `error`.
    pub(crate) fn refused(&self, error: &ProposeError) {
        self.refused[refusal(error)].fetch_add(1, Ordering::Relaxed);
    }

    /// The replication plane followed a new leader (as `NodeStatus::leader_changes` records).
    pub(crate) fn leader_changed(&self) {
        self.leader_changes.fetch_add(1, Ordering::Relaxed);
    }

    /// When the background plane last chose a leader.
    pub(crate) fn leader_chosen_at(&self) -> u64 {
        self.leader_chosen_at.load(Ordering::Acquire)
    }

    /// The first entry applied after a fail-over, `ns` after its new leader was chosen.
    pub(crate) fn switched(&self, ns: u64) {
        self.switch.record(ns);
        self.last_switch_ns.store(ns, Ordering::Relaxed);
    }
}

/// The background thread's view of the leader and of the local log's owner, for the fail-over
/// detection time and the permission revocations.
#[derive(Debug, Default)]
pub(crate) struct LeaderWatch {
    leader: Option<NodeId>,
    score: u8,
    /// The last poll at which the leader's score had not dropped.
    heard_at: u64,
    owner: Option<NodeId>,
}

impl LeaderWatch {
    /// Notes the background plane's state after a poll at `now`: `leader` is its choice,
    /// `owner` the replica allowed to write the local log. Call it before publishing a new
    /// leader, so that the engine finds the time it was chosen.
    pub(crate) fn poll(
        &mut self,
        metrics: &NodeMetrics,
        detector: &PullScore,
        leader: NodeId,
        owner: Option<NodeId>,
        now: u64,
    ) {
        if owner != self.owner {
            if self.owner.is_some_and(|old| owner.is_some_and(|new| new != old)) {
                metrics.revocations.fetch_add(1, Ordering::Relaxed);
            }
            self.owner = owner;
        }
        let score = detector.score(leader);
        match self.leader {
            Some(old) if old == leader => {
                if score >= self.score {
                    self.heard_at = now;
                }
            }
            old => {
                metrics.leader_chosen_at.store(now, Ordering::Release);
                // A fail-over only if the old leader was declared failed (not, say, a lower
                // id that came back, or this replica stepping down).
                if old.is_some_and(|old| !detector.is_live(old)) {
                    let ns = now.saturating_sub(self.heard_at);
                    metrics.detection.record(ns);
                    metrics.last_detection_ns.store(ns, Ordering::Relaxed);
                }
                self.leader = Some(leader);
                self.heard_at = now;
            }
        }
        self.score = score;
    }
}

/// The engine's clock of a fail-over's switch: from the moment a new leader was chosen to the
/// first entry this replica applies after it. A leader change is a fail-over only if this
/// replica applied an entry since the change before it (or since it started): the leader it
/// leaves was established. Choosing the first leader after start is none, whether or not the
/// replication plane reported it (it starts following replica 0 without an event), and
/// neither is a second change before anything applied: the clock keeps running from the
/// first.
#[derive(Debug)]
pub(crate) struct SwitchClock {
    /// The applied index at the last leader change, or at start.
    applied_at_change: u64,
    /// (when the new leader was chosen, the applied index then).
    running: Option<(u64, u64)>,
}

impl SwitchClock {
    /// A clock for a replica that starts with `applied` entries applied.
    pub(crate) fn new(applied: u64) -> Self {
        Self { applied_at_change: applied, running: None }
    }

    /// The replication plane followed a new leader; `applied` is its applied index.
    pub(crate) fn leader_changed(&mut self, metrics: &NodeMetrics, applied: u64) {
        let established = applied > self.applied_at_change;
        self.applied_at_change = applied;
        if established && self.running.is_none() {
            self.running = Some((metrics.leader_chosen_at(), applied));
        }
    }

    /// After a poll at `now` that left the applied index at `applied`.
    pub(crate) fn poll(&mut self, metrics: &NodeMetrics, applied: u64, now: u64) {
        if let Some((chosen_at, from)) = self.running
            && applied > from
        {
            metrics.switched(now.saturating_sub(chosen_at));
            self.running = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_propose_error_has_its_own_refusal_kind() {
        let errors = [
            ProposeError::NotLeader { leader: None },
            ProposeError::Backlogged,
            ProposeError::TooLarge { len: 2, max: 1 },
            ProposeError::StateTooLarge { state: 2, limit: 1 },
            ProposeError::Unknown,
            ProposeError::Timeout,
            ProposeError::Shutdown,
            ProposeError::Membership("refused".to_string()),
            ProposeError::TooManyCommands { count: 2, max: 1 },
        ];
        let kinds: Vec<usize> = errors.iter().map(refusal).collect();
        assert_eq!(kinds, (0..REFUSALS.len()).collect::<Vec<_>>());
    }

    #[test]
    fn detection_runs_from_the_failed_leaders_first_stalled_read_and_owner_changes_are_revocations() {
        let metrics = NodeMetrics::new();
        let mut detector = PullScore::new(&microrep_core::mu::MuConfig::new(NodeId(2), 3));
        let mut watch = LeaderWatch::default();
        let (old, new) = (NodeId(0), NodeId(1));
        watch.poll(&metrics, &detector, old, None, 0);
        watch.poll(&metrics, &detector, old, Some(old), 5);
        detector.observe(old, Some(1));
        watch.poll(&metrics, &detector, old, Some(old), 10);
        let mut now = 10;
        while detector.is_live(old) {
            detector.observe(old, Some(1));
            now += 10;
            watch.poll(&metrics, &detector, old, Some(old), now);
        }
        watch.poll(&metrics, &detector, new, Some(new), now + 5);
        let detection = metrics.detection.snapshot();
        assert_eq!(detection.count, 1);
        assert_eq!(metrics.last_detection_ns.load(Ordering::Relaxed), now + 5 - 10, "from the last read that moved");
        assert_eq!(metrics.leader_chosen_at(), now + 5);
        assert_eq!(metrics.revocations.load(Ordering::Relaxed), 1, "the first owner revoked nobody");
        // A leader that steps aside while live is no failure to detect.
        watch.poll(&metrics, &detector, NodeId(2), Some(new), now + 10);
        assert_eq!(metrics.detection.snapshot().count, 1);
    }

    #[test]
    fn a_switch_is_timed_from_the_leader_choice_to_the_next_applied_entry() {
        let metrics = NodeMetrics::new();
        let mut clock = SwitchClock::new(0);
        clock.leader_changed(&metrics, 0);
        clock.poll(&metrics, 5, 100);
        assert_eq!(metrics.switch.snapshot().count, 0, "the first leader is no fail-over");
        metrics.leader_chosen_at.store(1_000, Ordering::Release);
        clock.leader_changed(&metrics, 5);
        clock.poll(&metrics, 5, 2_000);
        clock.poll(&metrics, 6, 4_000);
        clock.poll(&metrics, 7, 9_000);
        assert_eq!(metrics.switch.snapshot().count, 1);
        assert_eq!(metrics.last_switch_ns.load(Ordering::Relaxed), 3_000);
    }

    #[test]
    fn leaving_the_leader_followed_from_start_is_a_fail_over_but_flapping_before_any_entry_is_not() {
        let metrics = NodeMetrics::new();
        // Restored 3 entries; replica 0 leads from start (no change reported), 4 more apply.
        let mut clock = SwitchClock::new(3);
        clock.poll(&metrics, 7, 100);
        metrics.leader_chosen_at.store(1_000, Ordering::Release);
        clock.leader_changed(&metrics, 7);
        // Another change before anything applied: the fail-over still runs from the first.
        metrics.leader_chosen_at.store(1_500, Ordering::Release);
        clock.leader_changed(&metrics, 7);
        clock.poll(&metrics, 8, 2_500);
        assert_eq!(metrics.switch.snapshot().count, 1);
        assert_eq!(metrics.last_switch_ns.load(Ordering::Relaxed), 1_500);
        let mut restarted = SwitchClock::new(3);
        restarted.leader_changed(&metrics, 3);
        restarted.poll(&metrics, 4, 3_000);
        assert_eq!(metrics.switch.snapshot().count, 1, "a restart's first leader is none");
    }
}
