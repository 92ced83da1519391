//! `microrep bench failover`: fail-over time of a Mu cluster of processes on the shm fabric.
//!
//! The leader proposes in a loop (direct mode). Before each failure the benchmark waits until
//! every replica runs and is a voter, a leader has committed, and no replica was elected for
//! [`STABLE`]. It then injects a failure into the leader (SIGKILL, or SIGSTOP for a pause) and
//! times, on CLOCK_MONOTONIC shared by the processes: **detection**, from the failure to the
//! moment the next replica's failure detector makes it leader, and **switch**, from there to its
//! first commit (permission switch, catch-up, prepare). Every failure is counted: one followed
//! by no commit within [`GIVE_UP`] is reported as unrecovered, and one recovered only after
//! [`SLOW`] is counted as slow (and is in the percentiles). One that hit a leader deposed just
//! before (another replica's election, from before the failure, was reported only after it) is
//! counted as moved: there was no fail-over to time. A killed replica is restarted and a
//! paused one resumed after each round.
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use microrep::config::{ClusterConfig, NodeConfig};
use microrep::idle::IdlePolicy;
use microrep::realtime::{self, Realtime};
use microrep::{Config, monotonic_ns};
use microrep_testkit::child::Guarded;
use microrep_testkit::cluster::write_configs;
use microrep_testkit::hist;
use rustix::process::{Pid, Signal, kill_process};

use crate::procs::{self, SpawnError};

/// While this file exists in the cluster's directory, a leading replica does not propose
/// (`--idle-before-ms`).
const QUIET_FILE: &str = "quiet";
/// How long no replica may be elected before a failure is injected: one leader is stable.
const STABLE: Duration = Duration::from_millis(100);
/// A fail-over slower than this is slow (the goal: none).
const SLOW: Duration = Duration::from_secs(1);
/// A failure followed by no commit within this is unrecovered.
const GIVE_UP: Duration = Duration::from_secs(10);

/// Arguments of `microrep bench failover`.
#[derive(Debug, clap::Args)]
pub(crate) struct FailoverArgs {
    /// Replicas (processes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(3..=9))]
    replicas: u16,
    /// Failures to inject (half SIGKILL, half SIGSTOP with `--kind both`).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    failures: u32,
    /// Which failures: kill, stop or both (alternating).
    #[arg(long, default_value = "both", value_parser = ["kill", "stop", "both"])]
    kind: String,
    /// Heartbeat period in microseconds. The defaults of this and `--fail-below` are the fast
    /// fail-over profile of docs/CONFIG.md (detection after about 3 heartbeats, 300 us); a
    /// node's own defaults (1,000 us, 2) detect a failure in about 14 ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    heartbeat_us: u64,
    /// A peer is failed when its score (0..=15) drops below this: a live peer (score 15) is
    /// declared failed after 16 - FAIL_BELOW silent heartbeats.
    #[arg(long, default_value_t = 13, value_parser = clap::value_parser!(u8).range(1..=13))]
    fail_below: u8,
    /// Idle policy of the background threads: park (woken by timers; the default) or yield.
    #[arg(long, default_value = "park", value_parser = ["park", "yield"])]
    background_idle: String,
    /// Real-time priority of every replica's background thread, the config's
    /// `node.background.realtime_priority`: auto (the node's default: SCHED_FIFO at priority 1
    /// where the process may, else normal priority), off, or a priority 1-99 (needs
    /// `--background-idle park` and CAP_SYS_NICE or an RLIMIT_RTPRIO). The table's header says
    /// what auto gives on this machine
    #[arg(long, default_value = "auto", value_parser = parse_realtime)]
    background_realtime: Realtime,
    /// Before each failure the leader stops proposing for this many milliseconds, so that the
    /// cluster goes idle and rests between heartbeats (`cluster.timing.idle_heartbeat_us`:
    /// unset, 32 ms or 255 heartbeats, whichever is shorter, 25.5 ms at this benchmark's
    /// 100 us; a rest begins after 16 quiet heartbeats): the fail-over of an idle
    /// leader. Each idle stretch is longer by a share of one idle heartbeat period that differs
    /// from failure to failure, so that failures strike at every point of the resting
    /// heartbeats' period (a fixed stretch struck at one point every time). 0 (the default):
    /// the leader proposes until it fails.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    idle_before_ms: u64,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write every sample (kind, detection ns, switch ns) as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
}

/// Arguments of one benchmark replica (internal).
#[derive(Debug, clap::Args)]
pub(crate) struct FailoverNodeArgs {
    #[arg(long)]
    config: PathBuf,
}

/// Why the fail-over benchmark (or one of its replicas) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FailoverError {
    #[error("prctl: {0}")]
    Prctl(rustix::io::Errno),
    #[error("{}: {source}", path.display())]
    Config { path: PathBuf, source: microrep::ConfigError },
    #[error(transparent)]
    Start(#[from] microrep::StartError),
    #[error("writing to stdout: {0}")]
    Stdout(std::io::Error),
    #[error("replica process {0} has no valid pid")]
    BadPid(u32),
    #[error("kill: {0}")]
    Kill(rustix::io::Errno),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("not reached within {0:?}")]
    NotReached(Duration),
    #[error("every replica exited")]
    AllExited,
    /// Stale shm segments could not be removed.
    #[error(transparent)]
    Fabric(#[from] microrep_fabric::FabricError),
    /// The configuration files could not be written.
    #[error(transparent)]
    Kit(#[from] microrep_testkit::KitError),
    /// Each replica's last reported state, with whether it is a voter.
    #[error(
        "round {round}: the cluster did not settle on a stable leader with every replica a voter within 30 s: {}",
        states.join(" ")
    )]
    Unsettled { round: u32, states: Vec<String> },
    #[error("no leader")]
    NoLeader,
    #[error("writing {}: {source}", path.display())]
    Csv { path: PathBuf, source: std::io::Error },
    #[error("the idle flag {}: {source}", path.display())]
    Quiet { path: PathBuf, source: std::io::Error },
    #[error("recording a latency: {0}")]
    Record(#[from] hdrhistogram::RecordError),
}

/// One replica: proposes in a loop while it leads; prints `elected T` when its detector made it
/// leader at T, and `commit T` at its first commit since. It ends quietly once the benchmark
/// reading its reports is gone (the benchmark stops its replicas when it is done, and one may
/// still be reporting as it does).
pub(crate) fn run_node(args: &FailoverNodeArgs) -> Result<(), FailoverError> {
    match serve_node(args) {
        Err(FailoverError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

fn serve_node(args: &FailoverNodeArgs) -> Result<(), FailoverError> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).map_err(FailoverError::Prctl)?;
    let config = Config::load(&args.config, &[])
        .map_err(|source| FailoverError::Config { path: args.config.clone(), source })?;
    let node = microrep::start(&config, procs::Count::default())?;
    let me = node.id();
    let quiet = args.config.with_file_name(QUIET_FILE);
    let mut out = std::io::stdout().lock();
    let (mut reported_term, mut committing, mut reported_voter) = (None, false, None);
    let mut reported_state = String::new();
    loop {
        let status = node.status();
        let voter = !status.recovering;
        if reported_voter != Some(voter) {
            writeln!(out, "voter {}", u8::from(voter)).and_then(|()| out.flush()).map_err(FailoverError::Stdout)?;
            reported_voter = Some(voter);
        }
        // For the report of a failure that was not recovered: what each replica was doing.
        let state =
            format!("{:?} {} leader {:?} confirmed {:?}", status.role, status.phase, status.leader, status.confirmed);
        if state != reported_state {
            writeln!(out, "state {state}").and_then(|()| out.flush()).map_err(FailoverError::Stdout)?;
            reported_state = state;
        }
        let (leader, since) = node.leader_since();
        if leader != Some(me) {
            committing = false;
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        if reported_term != Some(since) {
            writeln!(out, "elected {since}").and_then(|()| out.flush()).map_err(FailoverError::Stdout)?;
            (reported_term, committing) = (Some(since), false);
        }
        if committing && quiet.exists() {
            // The driver wants an idle cluster before its next failure.
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        match node.propose(b"x") {
            // The first commit since the election or since a failure (a paused leader that
            // resumes keeps its view of the leader, but must win its followers back).
            Ok(_) if !committing => {
                writeln!(out, "commit {}", monotonic_ns()).and_then(|()| out.flush()).map_err(FailoverError::Stdout)?;
                committing = true;
            }
            // Keep the log moving at a moderate rate, as a leader with clients would.
            Ok(_) => std::thread::sleep(Duration::from_micros(100)),
            Err(_) => committing = false,
        }
    }
}

/// A replica process, SIGKILLed and reaped when dropped, and the config it restarts with.
struct Replica {
    path: PathBuf,
    child: Guarded,
}

fn signal(child: &Child, sig: Signal) -> Result<(), FailoverError> {
    let pid = Pid::from_raw(child.id() as i32).ok_or(FailoverError::BadPid(child.id()))?;
    kill_process(pid, sig).map_err(FailoverError::Kill)
}

fn spawn(path: &Path, id: u16, tx: &mpsc::Sender<(u16, String)>) -> Result<Guarded, SpawnError> {
    // Fencing a paused leader is expected here; keep the children's logs to errors.
    let args = ["bench-failover-node".as_ref(), "--config".as_ref(), path.as_os_str()];
    let log = std::env::var("MICROREP_BENCH_LOG").unwrap_or_else(|_| "error".into());
    procs::spawn_tagged(&args, id, tx, Some(&log), Duration::ZERO)
}

/// A sample: detection and switch times in nanoseconds.
struct Sample {
    kind: &'static str,
    detection: u64,
    switch: u64,
}

/// A replica's latest term as leader: when it was elected and when it first committed.
#[derive(Clone, Copy, Debug, Default)]
struct Term {
    elected: u64,
    committed: Option<u64>,
}

/// The cluster's state as its replicas report it.
struct Watch {
    rx: Receiver<(u16, String)>,
    terms: Vec<Term>,
    voters: Vec<bool>,
    /// Each replica's last reported role, phase, leader and confirmed set.
    states: Vec<String>,
    last_election: Instant,
}

impl Watch {
    /// Reads reports until `done` holds (checked at least every 10 ms) or `timeout` passes.
    fn until(&mut self, timeout: Duration, mut done: impl FnMut(&Self) -> bool) -> Result<(), FailoverError> {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FailoverError::NotReached(timeout));
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(10))) {
                Ok((id, line)) => self.note(usize::from(id), &line),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(FailoverError::AllExited),
            }
        }
        Ok(())
    }

    fn note(&mut self, id: usize, line: &str) {
        let t = &mut self.terms[id];
        match line.split_once(' ').map(|(k, v)| (k, v.parse::<u64>())) {
            Some(("elected", Ok(at))) => {
                *t = Term { elected: at, committed: None };
                self.last_election = Instant::now();
            }
            Some(("commit", Ok(at))) => t.committed = Some(at),
            Some(("voter", Ok(v))) => self.voters[id] = v == 1,
            _ => {
                if let Some(state) = line.strip_prefix("state ") {
                    self.states[id] = state.to_string();
                }
            }
        }
    }

    /// The replica that reports leading (it holds its permissions and caught up), and that
    /// every other replica follows.
    fn leader(&self) -> Option<usize> {
        let leading: Vec<usize> = (0..self.states.len()).filter(|&i| self.states[i].starts_with("Leader ")).collect();
        let &[leader] = leading.as_slice() else { return None };
        let followed = format!("leader Some({leader}) ");
        let all_follow = (0..self.states.len()).all(|i| i == leader || self.states[i].contains(&followed));
        all_follow.then_some(leader)
    }

    /// Every replica is a voter, one leads, every other follows it, and nobody was elected
    /// for [`STABLE`].
    fn stable(&self) -> bool {
        self.voters.iter().all(|&v| v) && self.leader().is_some() && self.last_election.elapsed() >= STABLE
    }
}

/// What became of one injected failure.
enum Outcome {
    Recovered(Sample),
    Unrecovered {
        kind: &'static str,
    },
    /// Another replica had been elected just before the failure was injected (its report
    /// arrived only after): the failure hit a deposed leader, and there is no fail-over to time.
    Moved {
        kind: &'static str,
    },
}

impl Outcome {
    /// The kind of failure injected: `kill` or `stop`.
    fn kind(&self) -> &'static str {
        match self {
            Outcome::Recovered(s) => s.kind,
            Outcome::Unrecovered { kind } | Outcome::Moved { kind } => kind,
        }
    }
}

/// `--background-realtime`: off, auto or a priority 1-99.
fn parse_realtime(s: &str) -> Result<Realtime, String> {
    match s.parse()? {
        Realtime::Priority(p) if !(1..=99).contains(&p) => Err(format!("{p} is not in 1..=99")),
        r => Ok(r),
    }
}

/// How the replicas' background threads run, for the table's header: what `auto` gives here,
/// with failure detection after `detection` of silence.
fn realtime_header(setting: Realtime, idle: &str, detection: Duration) -> String {
    match setting.for_detection(detection) {
        Realtime::Off if setting == Realtime::Auto => " at normal priority (auto: detection is not tight)".to_string(),
        Realtime::Off => " at normal priority".to_string(),
        Realtime::Priority(p) => format!(" at real-time priority {p}"),
        Realtime::Auto if idle != "park" => " at normal priority (auto: the thread yields)".to_string(),
        Realtime::Auto => match realtime::permitted(realtime::AUTO_PRIORITY) {
            Ok(()) => format!(" at real-time priority {} (auto)", realtime::AUTO_PRIORITY),
            Err(e) => format!(" at normal priority (auto: {e})"),
        },
    }
}

/// Runs the benchmark.
pub(crate) fn failover(args: &FailoverArgs) -> Result<(), FailoverError> {
    let name = format!("bench-failover-{}", std::process::id());
    let dir = microrep_fabric::shm::ShmConfig::default_dir(&name);
    microrep_fabric::shm::ShmFabric::remove_stale(&dir)?;
    let result = drive(args, &name, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn drive(args: &FailoverArgs, name: &str, dir: &Path) -> Result<(), FailoverError> {
    let mut cluster = ClusterConfig::local(name, args.replicas, 1);
    cluster.shm_dir = Some(dir.to_path_buf());
    cluster.timing.heartbeat_us = args.heartbeat_us;
    cluster.timing.score_fail_below = args.fail_below;
    cluster.timing.score_recover_above = args.fail_below + 1;
    let node = |id| {
        let mut n = NodeConfig::new(id);
        n.mode = microrep::config::AttachMode::Direct;
        // The background plane runs at least twice per heartbeat period.
        n.background.idle = if args.background_idle == "yield" { IdlePolicy::Yield } else { IdlePolicy::Park };
        n.background.park_us = (args.heartbeat_us / 2).max(1) as u32;
        n.background.realtime_priority = args.background_realtime;
        n
    };
    let paths = write_configs(dir, &cluster, node)?;
    let (tx, rx) = mpsc::channel();
    let mut replicas: Vec<Replica> = paths
        .iter()
        .enumerate()
        .map(|(id, p)| Ok(Replica { path: p.clone(), child: spawn(p, id as u16, &tx)? }))
        .collect::<Result<_, SpawnError>>()?;
    let n = usize::from(args.replicas);
    let mut watch = Watch {
        rx,
        terms: vec![Term::default(); n],
        voters: vec![false; n],
        states: vec![String::new(); n],
        last_election: Instant::now(),
    };
    if !args.json {
        eprintln!(
            "microrep bench failover: {} replicas, heartbeat {} us, failed below score {}, background {}{}, {} failures ({}{}), huge pages for the segments: {}",
            args.replicas,
            args.heartbeat_us,
            args.fail_below,
            args.background_idle,
            realtime_header(args.background_realtime, &args.background_idle, cluster.timing.detection()),
            args.failures,
            args.kind,
            if args.idle_before_ms > 0 {
                format!(", each after {} ms idle", args.idle_before_ms)
            } else {
                String::new()
            },
            match microrep_fabric::shm::huge_pages_granted(dir) {
                Ok(true) => "granted".to_string(),
                Ok(false) => "refused (4 KiB pages)".to_string(),
                Err(e) => format!("unknown ({e})"),
            }
        );
    }
    let mut outcomes = Vec::new();
    let mut fenced = 0;
    for round in 0..args.failures {
        // Settle: every replica runs (one paused mid-write is fenced, that is SIGKILLed, by a
        // revoke, possibly only after it resumed: restart it whenever it exits) and is a voter,
        // and one leader is stable.
        let settle_by = Instant::now() + Duration::from_secs(30);
        loop {
            for (id, r) in replicas.iter_mut().enumerate() {
                if let Ok(Some(_)) = r.child.child().try_wait() {
                    fenced += 1;
                    watch.voters[id] = false;
                    watch.states[id].clear();
                    r.child = spawn(&r.path, id as u16, &tx)?;
                }
            }
            if watch.until(Duration::from_millis(500), Watch::stable).is_ok() {
                break;
            }
            if Instant::now() >= settle_by {
                let states: Vec<String> =
                    watch.states.iter().zip(&watch.voters).map(|(s, v)| format!("[{s}; voter {v}]")).collect();
                return Err(FailoverError::Unsettled { round, states });
            }
        }
        let leader = watch.leader().ok_or(FailoverError::NoLeader)?;
        let kind = match (args.kind.as_str(), round % 2) {
            ("kill", _) | ("both", 0) => "kill",
            _ => "stop",
        };
        let terms_before = watch.terms.clone();
        let quiet = dir.join(QUIET_FILE);
        if args.idle_before_ms > 0 {
            std::fs::write(&quiet, b"").map_err(|source| FailoverError::Quiet { path: quiet.clone(), source })?;
            // The idle stretch is the workload here, not a synchronisation; spread over one idle
            // period by a multiplicative hash of the round.
            let period_us = cluster.timing.idle_heartbeat_us().max(1);
            let spread_us = (u64::from(round) * 0x9e37_79b9) % period_us;
            std::thread::sleep(Duration::from_millis(args.idle_before_ms) + Duration::from_micros(spread_us));
        }
        let t0 = monotonic_ns();
        signal(replicas[leader].child.child(), if kind == "kill" { Signal::KILL } else { Signal::STOP })?;
        if args.idle_before_ms > 0 {
            std::fs::remove_file(&quiet).map_err(|source| FailoverError::Quiet { path: quiet.clone(), source })?;
        }
        // The successor: another replica elected after the failure that has committed; or one
        // whose election before the failure had not been reported yet.
        let (mut successor, mut moved) = (None, false);
        let waited = watch.until(GIVE_UP, |w| {
            let t = &w.terms;
            let other = |i: usize| i != leader;
            successor = (0..t.len()).find(|&i| other(i) && t[i].elected >= t0 && t[i].committed.is_some());
            moved = (0..t.len()).any(|i| other(i) && t[i].elected != terms_before[i].elected && t[i].elected < t0);
            successor.is_some() || moved
        });
        outcomes.push(match (waited, successor.map(|i| watch.terms[i])) {
            _ if moved => Outcome::Moved { kind },
            (Ok(()), Some(Term { elected, committed: Some(committed) })) => {
                Outcome::Recovered(Sample { kind, detection: elected - t0, switch: committed.saturating_sub(elected) })
            }
            _ => Outcome::Unrecovered { kind },
        });
        let late = match outcomes.last() {
            Some(Outcome::Unrecovered { .. }) => Some(format!("was followed by no commit within {GIVE_UP:?}")),
            Some(Outcome::Moved { .. }) => Some("hit a deposed leader: another replica had been elected before".into()),
            Some(Outcome::Recovered(s)) if s.detection + s.switch > SLOW.as_nanos() as u64 => Some(format!(
                "was followed by a commit only after {:.1} ms (detection {:.1}, switch {:.1})",
                (s.detection + s.switch) as f64 / 1e6,
                s.detection as f64 / 1e6,
                s.switch as f64 / 1e6
            )),
            _ => None,
        };
        if let Some(late) = late {
            eprintln!("  failure {} ({kind} of replica {leader}) {late}", round + 1);
            for (id, state) in watch.states.iter().enumerate() {
                eprintln!("    replica {id}: {state}");
            }
        }
        watch.terms[leader] = Term::default();
        match kind {
            "kill" => {
                watch.voters[leader] = false;
                let _ = replicas[leader].child.child().wait();
                replicas[leader].child = spawn(&replicas[leader].path, leader as u16, &tx)?;
            }
            _ => signal(replicas[leader].child.child(), Signal::CONT)?,
        }
        if !args.json && (round + 1) % 20 == 0 {
            eprintln!("  {} failures injected", round + 1);
        }
    }
    if fenced > 0 && !args.json {
        eprintln!("{fenced} paused leaders were fenced (SIGKILLed) by a revoke because they stopped mid-write");
    }
    report(args, &outcomes)
}

fn report(args: &FailoverArgs, outcomes: &[Outcome]) -> Result<(), FailoverError> {
    let samples: Vec<&Sample> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Recovered(s) => Some(s),
            Outcome::Unrecovered { .. } | Outcome::Moved { .. } => None,
        })
        .collect();
    if let Some(path) = &args.csv {
        let mut csv = String::from("kind,detection_ns,switch_ns\n");
        for s in &samples {
            csv.push_str(&format!("{},{},{}\n", s.kind, s.detection, s.switch));
        }
        std::fs::write(path, csv).map_err(|source| FailoverError::Csv { path: path.clone(), source })?;
    }
    if !args.json {
        println!(
            "{:<5} {:<10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>6} {:>11} {:>5}",
            "kind", "part", "p50 us", "p99 us", "p99.9 us", "max us", "recovered", "slow", "unrecovered", "moved"
        );
    }
    for kind in ["kill", "stop", "all"] {
        let mine: Vec<&Sample> = samples.iter().copied().filter(|s| kind == "all" || s.kind == kind).collect();
        let of_kind = || outcomes.iter().filter(|o| kind == "all" || o.kind() == kind);
        let unrecovered = of_kind().filter(|o| matches!(o, Outcome::Unrecovered { .. })).count();
        let moved = of_kind().filter(|o| matches!(o, Outcome::Moved { .. })).count();
        if mine.is_empty() && unrecovered == 0 && moved == 0 {
            continue;
        }
        let slow = mine.iter().filter(|s| s.detection + s.switch > SLOW.as_nanos() as u64).count();
        for (part, value) in [
            ("detection", (|s: &Sample| s.detection) as fn(&Sample) -> u64),
            ("switch", |s| s.switch),
            ("total", |s| s.detection + s.switch),
        ] {
            let mut h = hist::latency_ns();
            for s in &mine {
                h.record(value(s).max(1))?;
            }
            let us = |q: f64| if h.is_empty() { f64::NAN } else { h.value_at_quantile(q) as f64 / 1000.0 };
            let max = if h.is_empty() { f64::NAN } else { h.max() as f64 / 1000.0 };
            if args.json {
                println!(
                    "{{\"bench\":\"failover\",\"replicas\":{},\"heartbeat_us\":{},\"kind\":\"{kind}\",\"part\":\"{part}\",\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"max_us\":{:.1},\"recovered\":{},\"slow\":{slow},\"unrecovered\":{unrecovered},\"moved\":{moved}}}",
                    args.replicas,
                    args.heartbeat_us,
                    us(0.5),
                    us(0.99),
                    us(0.999),
                    max,
                    h.len()
                );
            } else {
                println!(
                    "{kind:<5} {part:<10} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9} {slow:>6} {unrecovered:>11} {moved:>5}",
                    us(0.5),
                    us(0.99),
                    us(0.999),
                    max,
                    h.len()
                );
            }
        }
    }
    if !args.json {
        eprintln!(
            "recovered: followed by a commit within {GIVE_UP:?} (in the percentiles); slow: of those, after more than {SLOW:?}; unrecovered: no commit within {GIVE_UP:?}; moved: another replica had been elected just before the failure (not reported yet), so the failure hit a deposed leader and there was no fail-over to time (not in the percentiles)"
        );
    }
    Ok(())
}
