//! What a history found, and the totals over many: written as `summary.json` per history and
//! printed as one line each plus a total.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::applied::AppliedCheck;
use crate::availability::Availability;
use crate::history::OutcomeCounts;
use crate::membership::ChangeCounts;
use crate::nemesis::FaultKind;
use crate::run::RunParams;
use crate::target::{FabricChoice, TargetKind};
use crate::verify::Linearizability;

/// The verdict on one history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Verdict {
    /// Every check passed.
    Pass,
    /// A check found an anomaly (the system under test is wrong).
    Anomaly,
    /// The checker gave no answer in time; nothing wrong was found.
    Inconclusive,
    /// The harness could not do its job (start-up, checker failure, ...).
    Error,
}

/// One history's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct HistoryReport {
    pub(crate) seed: u64,
    pub(crate) target: String,
    pub(crate) replicas: usize,
    /// Ids beyond the initial members, running as spares (absent in older reports).
    #[serde(default)]
    pub(crate) spares: usize,
    pub(crate) duration_s: f64,
    pub(crate) elapsed_s: f64,
    pub(crate) outcomes: OutcomeCounts,
    pub(crate) faults: BTreeMap<FaultKind, u64>,
    pub(crate) stale_leader_wakeups: u64,
    pub(crate) unexpected_replies: u64,
    pub(crate) linearizability: Option<Linearizability>,
    pub(crate) lost_writes: Vec<String>,
    pub(crate) converged: Option<bool>,
    /// Whether the replicas applied the same entry at every index (absent in reports written
    /// before the check existed).
    #[serde(default)]
    pub(crate) applied: Option<AppliedCheck>,
    pub(crate) anomalies: Vec<String>,
    pub(crate) errors: Vec<String>,
    pub(crate) verdict: Verdict,
    pub(crate) phases: Phases,
    /// The longest stretches without a successful operation (absent in reports written before
    /// it was measured).
    #[serde(default)]
    pub(crate) availability: Option<Availability>,
    /// Replicas that exited on their own and were restarted, with why (wrap-redis: by design,
    /// a deposed leader that had served stops its copy).
    #[serde(default)]
    pub(crate) self_restarts: Vec<String>,
    /// Membership changes made and refused, with spares (absent otherwise).
    #[serde(default)]
    pub(crate) membership: Option<ChangeCounts>,
}

/// Seconds spent in each phase after the load, for spotting slow recoveries.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Phases {
    /// From the end of the faults until a node said it leads.
    pub(crate) leader_after_heal_s: f64,
    /// Reading every key once.
    pub(crate) final_reads_s: f64,
    /// Running the linearizability checker.
    pub(crate) checker_s: f64,
    /// Until every replica reported the same applied index and digest.
    pub(crate) convergence_s: f64,
}

impl Verdict {
    /// The worse of two verdicts: an anomaly over an error over an inconclusive check.
    pub(crate) fn worst(self, other: Self) -> Self {
        match (self, other) {
            (Self::Anomaly, _) | (_, Self::Anomaly) => Self::Anomaly,
            (Self::Error, _) | (_, Self::Error) => Self::Error,
            (Self::Inconclusive, _) | (_, Self::Inconclusive) => Self::Inconclusive,
            _ => Self::Pass,
        }
    }

    /// The exit status of a run whose worst history had this verdict.
    pub(crate) fn exit_status(self) -> u8 {
        match self {
            Self::Pass => 0,
            Self::Anomaly => 1,
            Self::Error => 2,
            Self::Inconclusive => 3,
        }
    }
}

impl HistoryReport {
    pub(crate) fn new(seed: u64, p: &RunParams) -> Self {
        let (target, replicas, spares) = match &p.target {
            TargetKind::Microrep { replicas, spares, planted_bug, fabric, durable, mode, .. } => {
                let mut name = String::from("microrep");
                if *fabric == FabricChoice::Tcp {
                    name.push_str("/tcp");
                }
                if *mode == microrep::config::AttachMode::Direct {
                    name.push_str("+direct");
                }
                if *durable {
                    name.push_str("+durable");
                }
                if let Some(bug) = planted_bug {
                    name.push_str(&format!("+{bug}"));
                }
                (name, usize::from(*replicas), usize::from(*spares))
            }
            TargetKind::Redis { .. } => ("redis".to_string(), 1, 0),
            TargetKind::WrapRedis { replicas, .. } => ("wrap-redis".to_string(), usize::from(*replicas), 0),
        };
        Self {
            seed,
            target,
            replicas,
            spares,
            duration_s: p.duration.as_secs_f64(),
            elapsed_s: 0.0,
            outcomes: OutcomeCounts::default(),
            faults: BTreeMap::new(),
            stale_leader_wakeups: 0,
            unexpected_replies: 0,
            linearizability: None,
            lost_writes: Vec::new(),
            converged: None,
            applied: None,
            anomalies: Vec::new(),
            errors: Vec::new(),
            verdict: Verdict::Error,
            phases: Phases::default(),
            availability: None,
            self_restarts: Vec::new(),
            membership: None,
        }
    }

    /// Every node the history ran: the initial members and the spares.
    pub(crate) fn nodes(&self) -> usize {
        self.replicas + self.spares
    }

    /// Folds the findings into `anomalies` and sets the verdict.
    pub(crate) fn finish(&mut self) {
        if self.unexpected_replies > 0 {
            self.anomalies.push(format!("{} replies of an unexpected type", self.unexpected_replies));
        }
        self.anomalies.extend(self.lost_writes.iter().map(|l| format!("lost write: {l}")));
        if self.linearizability == Some(Linearizability::CheckerFailed) {
            self.errors.push("the linearizability checker failed (see checker.txt)".into());
        }
        self.verdict = if !self.anomalies.is_empty() {
            Verdict::Anomaly
        } else if !self.errors.is_empty() || self.linearizability.is_none() {
            Verdict::Error
        } else if self.linearizability == Some(Linearizability::Inconclusive) {
            Verdict::Inconclusive
        } else {
            Verdict::Pass
        };
    }

    /// Records the agreement check: a disagreement is an anomaly, a replica it could not see
    /// (no `apply` line in its log) a failure of the harness.
    pub(crate) fn add_applied(&mut self, check: AppliedCheck) {
        if !check.agrees() {
            self.anomalies.push(format!(
                "replicas applied different entries at {} indices; {}",
                check.disagreeing_indices,
                check.disagreements.join("; ")
            ));
        }
        for node in &check.silent_nodes {
            self.errors.push(format!("node {node} logged no applied entry, so the agreement check could not see it"));
        }
        self.applied = Some(check);
    }

    fn faults_total(&self) -> u64 {
        self.faults.values().sum()
    }

    /// One line for the console.
    pub(crate) fn print_line(&self) {
        println!(
            "seed {:>6}  {:<9}  ops {:>6} (ok {}, fail {}, info {})  faults {:>3}  {:?}  {:.1}s",
            self.seed,
            self.target,
            self.outcomes.total(),
            self.outcomes.ok,
            self.outcomes.fail,
            self.outcomes.info,
            self.faults_total(),
            self.verdict,
            self.elapsed_s
        );
        if !self.self_restarts.is_empty() {
            println!("    replicas that exited on their own and were restarted: {}", self.self_restarts.len());
        }
        if let Some(m) = &self.membership {
            println!("    membership: {}", m.describe());
        }
        if let Some(a) = &self.availability {
            println!(
                "    no success for {} ms at most (from {} ms); {} ms at most after a fault healed (at {} ms)",
                a.longest_gap_ms, a.longest_gap_at_ms, a.longest_after_heal_ms, a.longest_after_heal_at_ms
            );
        }
        const SHOWN: usize = 8;
        for a in self.anomalies.iter().take(SHOWN) {
            println!("    anomaly: {a}");
        }
        if self.anomalies.len() > SHOWN {
            println!("    ... {} more anomalies in summary.json", self.anomalies.len() - SHOWN);
        }
        for e in &self.errors {
            println!("    error: {e}");
        }
    }
}

/// Totals over every history of an invocation.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Totals {
    pub(crate) histories: u64,
    pub(crate) outcomes: OutcomeCounts,
    pub(crate) faults: BTreeMap<FaultKind, u64>,
    pub(crate) stale_leader_wakeups: u64,
    /// Replicas that exited on their own and were restarted (wrap-redis).
    pub(crate) self_restarts: u64,
    /// Membership changes made and refused (histories with spares).
    pub(crate) membership: ChangeCounts,
    pub(crate) by_verdict: BTreeMap<String, u64>,
    pub(crate) anomalous_seeds: Vec<u64>,
    /// Histories whose replicas' applied entries were compared (crate::applied).
    pub(crate) applied_checked: u64,
    /// Log indices applied by more than one replica (or incarnation) and compared, over them.
    pub(crate) applied_compared: u64,
    /// How restarted replicas caught up (copies of the log, or a snapshot first), and how often
    /// running ones restored a snapshot after falling behind the recycled log.
    pub(crate) restarts_by_log_copy: u64,
    pub(crate) restarts_by_snapshot: u64,
    pub(crate) lapped_by_snapshot: u64,
    /// The longest time each phase took in any history.
    pub(crate) slowest: Phases,
    /// The longest stretch without success after a fault healed, in any history: (ms, seed).
    pub(crate) longest_after_heal: Option<(u64, u64)>,
    /// The longest stretch without success, in any history: (ms, seed).
    pub(crate) longest_gap: Option<(u64, u64)>,
}

impl Totals {
    pub(crate) fn add(&mut self, r: &HistoryReport) {
        self.histories += 1;
        self.outcomes.ok += r.outcomes.ok;
        self.outcomes.fail += r.outcomes.fail;
        self.outcomes.info += r.outcomes.info;
        for (kind, n) in &r.faults {
            *self.faults.entry(*kind).or_default() += n;
        }
        self.stale_leader_wakeups += r.stale_leader_wakeups;
        self.self_restarts += r.self_restarts.len() as u64;
        if let Some(m) = &r.membership {
            self.membership.add(m);
        }
        let verdict = serde_json::to_value(r.verdict).ok().and_then(|v| v.as_str().map(str::to_string));
        *self.by_verdict.entry(verdict.unwrap_or_default()).or_default() += 1;
        if r.verdict == Verdict::Anomaly {
            self.anomalous_seeds.push(r.seed);
        }
        if let Some(applied) = &r.applied {
            self.applied_checked += 1;
            self.applied_compared += applied.compared;
            self.restarts_by_log_copy += applied.restarts_by_log_copy;
            self.restarts_by_snapshot += applied.restarts_by_snapshot;
            self.lapped_by_snapshot += applied.lapped_by_snapshot;
        }
        if let Some(a) = &r.availability {
            let longer = |have: Option<(u64, u64)>, ms: u64| have.is_none_or(|(m, _)| ms > m).then_some((ms, r.seed));
            self.longest_after_heal =
                longer(self.longest_after_heal, a.longest_after_heal_ms).or(self.longest_after_heal);
            self.longest_gap = longer(self.longest_gap, a.longest_gap_ms).or(self.longest_gap);
        }
        let (s, p) = (&mut self.slowest, &r.phases);
        s.leader_after_heal_s = s.leader_after_heal_s.max(p.leader_after_heal_s);
        s.final_reads_s = s.final_reads_s.max(p.final_reads_s);
        s.checker_s = s.checker_s.max(p.checker_s);
        s.convergence_s = s.convergence_s.max(p.convergence_s);
    }

    pub(crate) fn print(&self) {
        println!(
            "\n{} histories, {} operations (ok {}, fail {}, info {})",
            self.histories,
            self.outcomes.total(),
            self.outcomes.ok,
            self.outcomes.fail,
            self.outcomes.info
        );
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| {
                format!(
                    "{}: {n}",
                    serde_json::to_value(k).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
                )
            })
            .collect();
        println!("faults: {} ({})", self.faults.values().sum::<u64>(), faults.join(", "));
        println!("paused leaders woken after a new leader was elected: {}", self.stale_leader_wakeups);
        if self.self_restarts > 0 {
            println!("replicas that exited on their own and were restarted: {}", self.self_restarts);
        }
        if self.membership != ChangeCounts::default() {
            println!("membership: {}", self.membership.describe());
        }
        println!(
            "applied entries compared across replicas: {} in {} histories",
            self.applied_compared, self.applied_checked
        );
        println!(
            "restarted replicas caught up by log copy: {}, by snapshot: {}; lagging replicas restored a snapshot: {}",
            self.restarts_by_log_copy, self.restarts_by_snapshot, self.lapped_by_snapshot
        );
        println!("verdicts: {:?}", self.by_verdict);
        let s = &self.slowest;
        println!(
            "slowest after the faults: leader {:.1}s, final reads {:.1}s, checker {:.1}s, convergence {:.1}s",
            s.leader_after_heal_s, s.final_reads_s, s.checker_s, s.convergence_s
        );
        if let (Some((heal_ms, heal_seed)), Some((gap_ms, gap_seed))) = (self.longest_after_heal, self.longest_gap) {
            println!(
                "longest without success after a fault healed: {heal_ms} ms (seed {heal_seed}); longest without success: {gap_ms} ms (seed {gap_seed})"
            );
        }
        if !self.anomalous_seeds.is_empty() {
            println!("seeds with anomalies: {:?}", self.anomalous_seeds);
        }
    }
}
