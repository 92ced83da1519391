//! One history: start the target, run clients and the nemesis for the duration, heal, read
//! every key, check, clean up. Every step is bounded; the processes and the shm directory are
//! removed on every exit path (the [`Cleanup`] guard) and by the watchdog at the hard deadline.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use microrep_testkit::cleanup::{Cleanup, Hook, PidRegistry};

use crate::applied;
use crate::artifact;
use crate::availability;
use crate::history::{self, Clock, OpRecord, Outcome, OutcomeCounts};
use crate::nemesis::{self, FaultKind, Played, ScheduleParams};
use crate::netns::Network;
use crate::report::{HistoryReport, Verdict};
use crate::target::{self, FabricChoice, Target, TargetKind};
use crate::verify::{self, Linearizability};
use crate::workload::{self, Client, WorkloadConfig};

/// Everything one history needs besides its seed.
#[derive(Clone, Debug)]
pub(crate) struct RunParams {
    pub(crate) target: TargetKind,
    pub(crate) duration: Duration,
    pub(crate) clients: usize,
    pub(crate) keys_per_kind: usize,
    pub(crate) rate: u32,
    pub(crate) op_timeout: Duration,
    pub(crate) max_faults: usize,
    pub(crate) mean_fault_gap: Duration,
    pub(crate) faults: Vec<FaultKind>,
    pub(crate) corrupt_reads: f64,
    pub(crate) checker: PathBuf,
    pub(crate) checker_timeout: Duration,
    /// Past this, the watchdog kills everything and exits the process.
    pub(crate) hard_deadline: Duration,
    /// Delete the history of a history that passed (long runs), keeping the summaries.
    pub(crate) prune_passing: bool,
}

/// How long start-up, the final reads and convergence may each take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs one history with `seed`, its artifacts in `dir`.
pub(crate) fn run_history(p: &RunParams, seed: u64, dir: &Path) -> HistoryReport {
    let mut report = HistoryReport::new(seed, p);
    if let Err(e) = std::fs::create_dir_all(dir) {
        report.errors.push(format!("creating {}: {e}", dir.display()));
        return report;
    }
    let name = format!("faults-{}-{seed}", std::process::id());
    let pids = PidRegistry::default();
    let shm_dir =
        matches!(p.target, TargetKind::Microrep { fabric: FabricChoice::Shm, .. } | TargetKind::WrapRedis { .. })
            .then(|| target::shm_dir(&name));
    let namespaces = match p.target {
        TargetKind::Microrep { netns: true, replicas, spares, .. } => {
            Network::names(&format!("s{seed}"), (replicas + spares).into())
        }
        _ => Vec::new(),
    };
    let hooks = namespaces.iter().map(|name| delete_namespace(name.clone())).collect();
    let cleanup = Cleanup { pids: pids.clone(), dirs: shm_dir.into_iter().collect(), hooks };
    let under_way = cleanup.register();
    let (done, watchdog) = arm_watchdog(p.hard_deadline, cleanup.clone());
    let started = Instant::now();
    if namespaces.is_empty() {
        start_and_drive(p, seed, dir, &name, pids, None, &mut report);
    } else {
        // The harness's threads of this history live in the hub namespace of its network: the
        // thread that starts the target and the clients and nemesis it spawns.
        let namespaces = &namespaces;
        let panicked = std::thread::scope(|s| {
            s.spawn(|| match Network::create(namespaces).and_then(|net| net.enter_hub().map(|()| net)) {
                Ok(network) => start_and_drive(p, seed, dir, &name, pids, Some(network), &mut report),
                Err(e) => report.errors.push(format!("creating the network namespaces: {e}")),
            })
            .join()
            .is_err()
        });
        if panicked {
            report.errors.push("the history's driver thread panicked".into());
        }
    }
    cleanup.run();
    drop(under_way);
    let _ = done.send(());
    let _ = watchdog.join();
    if matches!(p.target, TargetKind::Microrep { .. }) && report.errors.is_empty() {
        match applied::check_dir(dir, report.nodes()) {
            Ok(check) => report.add_applied(check),
            Err(e) => report.errors.push(format!("checking what the replicas applied: {e}")),
        }
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.finish();
    if p.prune_passing && report.verdict == Verdict::Pass {
        let _ = std::fs::remove_file(dir.join("history.json"));
    }
    if let Err(e) = artifact::write_json(&dir.join("summary.json"), &report) {
        report.errors.push(e.to_string());
    }
    report
}

fn start_and_drive(
    p: &RunParams,
    seed: u64,
    dir: &Path,
    name: &str,
    pids: PidRegistry,
    network: Option<Network>,
    report: &mut HistoryReport,
) {
    let target = match Target::start(p.target.clone(), dir, name, pids, network) {
        Ok(target) => target,
        Err(e) => return report.errors.push(format!("starting the target: {e}")),
    };
    if !target.is_wrapped() {
        return drive(p, seed, dir, &target, report);
    }
    // Wrapped replicas that exit on their own are restarted throughout, the checks at the end
    // included (an old leader resumed by the last heal exits, and must come back to converge).
    let stop = AtomicBool::new(false);
    let clock = Clock::start();
    std::thread::scope(|s| {
        let supervisor = s.spawn(|| crate::wrap::supervise(&target, dir, clock, &stop));
        drive(p, seed, dir, &target, report);
        stop.store(true, Ordering::Relaxed);
        match supervisor.join() {
            Ok(exits) => report.self_restarts = exits,
            Err(_) => report.errors.push("the replicas' supervisor panicked".into()),
        }
    });
    // The copies' logs live in the scratch directory, which the clean-up removes.
    for (i, replica) in target.wrap_dirs().iter().enumerate() {
        let _ = std::fs::copy(replica.join("server.log"), dir.join(format!("server-{i}.log")));
    }
}

/// The cleanup hook that deletes network namespace `name` if it exists.
fn delete_namespace(name: String) -> Hook {
    std::sync::Arc::new(move || {
        if Path::new("/run/netns").join(&name).exists()
            && let Err(e) = crate::netns::delete(&name)
        {
            eprintln!("microrep-faults: cleanup: {e}");
        }
    })
}

/// Past `limit`, runs `cleanup` (kills every process of the run, removes its directories and
/// namespaces) and exits (status 2).
fn arm_watchdog(limit: Duration, cleanup: Cleanup) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            cleanup.run();
            eprintln!("microrep-faults: hard deadline of {limit:?} passed; processes killed, exiting");
            std::process::exit(2);
        }
        // The history ended first and ran its own cleanup: dropping this clone runs it again,
        // which finds nothing left to do.
    });
    (tx, handle)
}

fn drive(p: &RunParams, seed: u64, dir: &Path, target: &Target, report: &mut HistoryReport) {
    if let Err(e) = target.wait_ready(Instant::now() + PHASE_TIMEOUT) {
        report.errors.push(format!("target not ready: {e}"));
        return;
    }
    let faults = {
        let params = ScheduleParams {
            replicas: target.initial_members,
            duration_ms: p.duration.as_millis() as u64,
            max_faults: p.max_faults,
            mean_gap_ms: p.mean_fault_gap.as_millis() as u64,
            kinds: p.faults.clone(),
        };
        nemesis::schedule(seed, &params)
    };
    write_json(&dir.join("schedule.json"), &faults, report);
    let cfg = WorkloadConfig {
        nodes: target.nodes.clone(),
        keys_per_kind: p.keys_per_kind,
        op_timeout: p.op_timeout,
        rate: p.rate,
        corrupt_reads: p.corrupt_reads,
        confirm_connections: target.is_wrapped(),
    };
    let clock = Clock::start();
    let stop_clients = AtomicBool::new(false);
    let stop_nemesis = AtomicBool::new(false);
    let ids = AtomicUsize::new(p.clients);
    let start = Instant::now();
    let (mut ops, played) = std::thread::scope(|s| {
        let nemesis = s.spawn(|| nemesis::play(target, &faults, clock, start, &stop_nemesis));
        let clients: Vec<_> = (0..p.clients)
            .map(|i| {
                let (cfg, stop, ids) = (&cfg, &stop_clients, &ids);
                s.spawn(move || {
                    let mut client = Client::new(i, seed, cfg, clock);
                    let ops = client.run(stop, ids);
                    (ops, client.unexpected_replies)
                })
            })
            .collect();
        std::thread::sleep(p.duration);
        stop_nemesis.store(true, Ordering::Relaxed);
        let played = nemesis
            .join()
            .unwrap_or_else(|_| Played { errors: vec!["the nemesis panicked".into()], ..Played::default() });
        stop_clients.store(true, Ordering::Relaxed);
        let mut ops = Vec::new();
        for c in clients {
            match c.join() {
                Ok((mut client_ops, unexpected)) => {
                    ops.append(&mut client_ops);
                    report.unexpected_replies += unexpected;
                }
                Err(_) => report.errors.push("a client thread panicked".into()),
            }
        }
        (ops, played)
    });
    target.reap_exited();
    let fenced = target.procs().fenced;
    if fenced > 0 {
        eprintln!(
            "{fenced} nodes were fenced (SIGKILLed by a peer's revoke while stalled mid-write, as the shm fabric does); restarted"
        );
    }
    // A wrapped replica's own exits are the supervisor's (restarted, and reported apart).
    for exit in target.procs().exits.iter().filter(|_| !target.is_wrapped()) {
        report
            .anomalies
            .push(format!("node {} {} without being killed (see node-{}.log)", exit.index, exit.status, exit.index));
    }
    record_nemesis(&played, dir, report);
    report.outcomes = OutcomeCounts::of(&ops);
    let oks: Vec<u64> = ops.iter().filter(|o| o.outcome == Outcome::Ok).map(|o| o.return_ns).collect();
    let load_ns = u64::try_from(p.duration.as_nanos()).unwrap_or(u64::MAX);
    report.availability = Some(availability::measure(&oks, &played.timeline(), load_ns));
    let during_majority_loss = acknowledged_within(&ops, &played.windows(FaultKind::KillMajority));
    if during_majority_loss > 0 {
        report.anomalies.push(format!(
            "{during_majority_loss} operations were acknowledged while a majority was down (invoked after the kill, answered before the restart)"
        ));
    }
    verify_end(p, dir, target, clock, &ids, &mut ops, report);
    if report.spares > 0 {
        let mut changes = played.changes.clone();
        changes.add(&target.departures.counts(&target.procs()));
        report.membership = Some(changes);
    }
}

/// Operations acknowledged whose whole interval lies inside one of `windows`.
fn acknowledged_within(ops: &[OpRecord], windows: &[(u64, u64)]) -> usize {
    ops.iter()
        .filter(|o| o.outcome == Outcome::Ok && windows.iter().any(|&(from, to)| o.call_ns > from && o.return_ns < to))
        .count()
}

fn record_nemesis(played: &Played, dir: &Path, report: &mut HistoryReport) {
    write_json(&dir.join("nemesis.json"), played, report);
    report.faults = played.injected.clone();
    report.stale_leader_wakeups = played.stale_leader_wakeups;
    report.errors.extend(played.errors.iter().map(|e| format!("nemesis: {e}")));
}

/// Final reads, checks and convergence, once every fault healed.
fn verify_end(
    p: &RunParams,
    dir: &Path,
    target: &Target,
    clock: Clock,
    ids: &AtomicUsize,
    ops: &mut Vec<OpRecord>,
    report: &mut HistoryReport,
) {
    let healed = Instant::now();
    let deadline = healed + PHASE_TIMEOUT;
    if let Err(e) = target.wait_ready(deadline) {
        report.anomalies.push(format!("no leader after the faults healed: {e}"));
    }
    report.phases.leader_after_heal_s = healed.elapsed().as_secs_f64();
    let cfg = WorkloadConfig {
        nodes: target.nodes.clone(),
        keys_per_kind: p.keys_per_kind,
        op_timeout: p.op_timeout,
        rate: 1,
        corrupt_reads: 0.0,
        confirm_connections: target.is_wrapped(),
    };
    let mut reader = Client::new(p.clients, 0, &cfg, clock);
    reader.set_id(ids.fetch_add(1, Ordering::Relaxed));
    let (finals, unread) = verify::final_reads(&mut reader, &workload::keys(p.keys_per_kind), deadline);
    if !unread.is_empty() {
        report.anomalies.push(format!("final reads failed before the deadline for {unread:?}"));
    }
    report.phases.final_reads_s = healed.elapsed().as_secs_f64() - report.phases.leader_after_heal_s;
    report.lost_writes = verify::lost_writes(ops, &finals);
    ops.extend(finals);
    let history_path = dir.join("history.json");
    if let Err(e) = history::write(&history_path, ops) {
        report.errors.push(e.to_string());
        return;
    }
    let checking = Instant::now();
    report.linearizability = Some(verify::check_linearizability(
        &p.checker,
        &history_path,
        &dir.join("checker.txt"),
        &dir.join("violation.html"),
        p.checker_timeout,
    ));
    report.phases.checker_s = checking.elapsed().as_secs_f64();
    if report.linearizability == Some(Linearizability::NotLinearizable) {
        report.anomalies.push(format!("not linearizable: see {}", dir.join("checker.txt").display()));
    }
    if target.is_wrapped() {
        let asked = Instant::now();
        let (converged, digests) = crate::wrap::converged(target.wrap_dirs(), asked + PHASE_TIMEOUT);
        report.phases.convergence_s = asked.elapsed().as_secs_f64();
        report.converged = Some(converged);
        if !converged {
            // As text, the way convergence.json records them.
            let texts: Vec<Result<&str, String>> =
                digests.iter().map(|d| d.as_deref().map_err(ToString::to_string)).collect();
            report.anomalies.push(format!("the server copies' DEBUG DIGEST differ: {texts:?}"));
        }
        write_json(&dir.join("convergence.json"), &digests, report);
    }
    if target.is_microrep() {
        let asked = Instant::now();
        let convergence = verify::convergence(target, asked + PHASE_TIMEOUT);
        report.phases.convergence_s = asked.elapsed().as_secs_f64();
        report.converged = Some(convergence.converged);
        if !convergence.converged {
            report.anomalies.push("replicas did not converge to one applied index, digest and configuration".into());
        }
        report
            .errors
            .extend(convergence.restart_errors.iter().map(|e| format!("starting a removed member again: {e}")));
        for status in convergence.statuses.iter().flatten() {
            if let Some(fatal) = &status.fatal {
                report.anomalies.push(format!("node {} stopped: {fatal}", status.node));
            }
        }
        write_json(&dir.join("convergence.json"), &convergence, report);
    }
}

/// Writes an artifact; failing to is one of the history's errors.
fn write_json(path: &Path, value: &impl serde::Serialize, report: &mut HistoryReport) {
    if let Err(e) = artifact::write_json(path, value) {
        report.errors.push(e.to_string());
    }
}
