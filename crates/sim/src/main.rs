//! `microrep-sim`: runs many seeded cluster simulations and reports any broken invariant with
//! the command that replays it.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::{CommandFactory, Parser};
use microrep_sim::nemesis::FaultCounts;
use microrep_sim::{Failure, SimOptions, run};

/// Simulate Mu clusters under faults, seed by seed.
#[derive(Debug, Parser)]
#[command(name = "microrep-sim", version)]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Run exactly this one seed (overrides --seeds/--start), e.g. to replay a failure.
    #[arg(long)]
    seed: Option<u64>,
    /// Cluster sizes, used in turn by successive seeds (each from 1 to 255).
    #[arg(long, value_delimiter = ',', default_value = "3,5,7", value_parser = clap::value_parser!(u16).range(1..256))]
    replicas: Vec<u16>,
    /// Run without injected faults.
    #[arg(long)]
    no_faults: bool,
    /// Restart crashed replicas, after a seeded delay, with empty memory under the same id.
    #[arg(long)]
    restarts: bool,
    /// With --restarts: at most a minority of replicas lose their memory while faults are
    /// injected (every chosen value survives somewhere, so a correct protocol must pass).
    #[arg(long, requires = "restarts")]
    bounded_amnesia: bool,
    /// With --bounded-amnesia: a restarted replica counts as down until it is a voter again,
    /// then no longer counts against the bound (as the fault harness's nemesis counts it), so
    /// any number of replicas may lose their memory one after another.
    #[arg(long, requires = "bounded_amnesia")]
    amnesia_heals: bool,
    /// During the fault phase, deschedule a replica for up to 50 us before this fraction of
    /// the reads of its own memory (e.g. 0.01), so that peers' writes land between two reads of
    /// one poll, as on a real, overloaded machine.
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    preempt: f64,
    /// Make this fraction of fabric operations instant (e.g. 0.5): they take effect and
    /// complete within their post call, as WRITEs on shm do, so that a leader commits in the
    /// poll that proposed, as it does on shm.
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    instant: f64,
    /// Simulated microseconds during which faults are injected.
    #[arg(long, default_value_t = microrep_sim::DEFAULT_FAULT_PHASE_NS / 1_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    fault_phase_us: u64,
    /// Most process faults per run (each run draws from one to this many).
    #[arg(long, default_value_t = microrep_sim::DEFAULT_MAX_FAULTS, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_faults: u32,
    /// Heartbeat periods a (re)started replica waits before it may lead (default: the
    /// simulated preset's 0).
    #[arg(long)]
    join_grace: Option<u32>,
    /// The leader recycles only what every confirmed follower applied, and leaves a follower
    /// behind only once the log is full and it has applied nothing for this many simulated
    /// microseconds (`MuConfig::recycle_wait_ns`; default 0: Mu's majority rule).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..2_000))]
    recycle_wait_us: Option<u64>,
    /// While idle, replicas heartbeat once every this many periods (`MuConfig::idle_stride`;
    /// default 1: every period); clients then pause together now and then so that the
    /// cluster goes idle.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    idle_stride: u8,
    /// Swarm testing: each seed draws its own fault mix, link faults (partitions, one-way
    /// reachability, clogged links) included, and polls each replica's planes as separate actors.
    #[arg(long)]
    swarm: bool,
    /// Availability under minority faults: fail a run whose clients go longer than this many
    /// simulated microseconds without an acknowledged operation during the fault phase (the
    /// nemesis keeps process faults on a minority; meant for runs without --swarm's link
    /// faults). Without it the longest stretches are only reported.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_gap_us: Option<u64>,
    /// Membership changes under the faults: the last two ids start as joiners, and the leader
    /// is asked now and then to add a joiner or remove a member (three stay at least); use
    /// sizes of 5 and more.
    #[arg(long)]
    membership: bool,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Run with a planted protocol bug (built with the `planted-bugs` feature).
    #[cfg(feature = "planted-bugs")]
    #[arg(long, value_parser = parse_bug)]
    bug: Option<microrep_core::mu::PlantedBug>,
}

/// A value of an option that clap could not take.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("`{text}` is not a number: {source}")]
    NotANumber { text: String, source: std::num::ParseFloatError },
    #[error("{0} is not a probability in [0, 1]")]
    NotAProbability(f64),
    #[cfg(feature = "planted-bugs")]
    #[error("unknown bug `{0}`; one of {all:?}", all = microrep_core::mu::PlantedBug::ALL)]
    UnknownBug(String),
}

fn parse_probability(text: &str) -> Result<f64, ArgError> {
    let p: f64 = text.parse().map_err(|source| ArgError::NotANumber { text: text.into(), source })?;
    if (0.0..=1.0).contains(&p) { Ok(p) } else { Err(ArgError::NotAProbability(p)) }
}

#[cfg(feature = "planted-bugs")]
fn parse_bug(name: &str) -> Result<microrep_core::mu::PlantedBug, ArgError> {
    microrep_core::mu::PlantedBug::ALL
        .into_iter()
        .find(|b| format!("{b:?}").eq_ignore_ascii_case(name))
        .ok_or_else(|| ArgError::UnknownBug(name.into()))
}

#[derive(Default)]
struct Totals {
    runs: u64,
    acked: u64,
    unknown: u64,
    faults: FaultCounts,
    restores: u64,
    polls: u64,
    resting_polls: u64,
    clusters_lost: u64,
    membership_changes: u64,
    membership_refused: u64,
    terms: u64,
    log_entries: u64,
    sim_ns: u64,
    /// Each passing run's longest stretch without an acknowledgement in the fault phase, and
    /// its seed.
    gaps: Vec<(u64, u64)>,
    failures: Vec<Failure>,
}

fn options(args: &Args, seed: u64) -> SimOptions {
    let replicas = args.replicas[(seed % args.replicas.len() as u64) as usize];
    #[cfg_attr(not(feature = "planted-bugs"), allow(unused_mut))]
    let mut options = SimOptions {
        faults: !args.no_faults,
        restarts: args.restarts,
        bounded_amnesia: args.bounded_amnesia,
        amnesia_heals: args.amnesia_heals,
        preempt: args.preempt,
        instant: args.instant,
        fault_phase_ns: args.fault_phase_us * 1_000,
        max_faults: args.max_faults,
        join_grace_heartbeats: args.join_grace,
        recycle_wait_ns: args.recycle_wait_us.map_or(0, |us| us * 1_000),
        idle_stride: args.idle_stride,
        swarm: args.swarm,
        membership: args.membership,
        max_gap_ns: args.max_gap_us.map(|us| us * 1_000),
        ..SimOptions::new(replicas)
    };
    #[cfg(feature = "planted-bugs")]
    {
        options.bug = args.bug;
    }
    options
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "error".into()))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .init();
    let args = Args::parse();
    if let Some(small) = args.replicas.iter().find(|&&n| args.membership && n < 5) {
        // Two of the ids start as joiners: below 5 the members cannot survive one crash, and
        // every such seed would fail its liveness check for that alone.
        Args::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                format!("--membership needs cluster sizes of at least 5 (got {small} in --replicas)"),
            )
            .exit();
    }
    let (start, count) = args.seed.map_or((args.start, args.seeds), |s| (s, 1));
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)).max(1);
    let next = AtomicU64::new(start);
    let done = AtomicU64::new(0);
    let totals = Mutex::new(Totals::default());
    let began = Instant::now();
    eprintln!("microrep-sim: seeds {start}..{} on replicas {:?}, {threads} threads", start + count, args.replicas);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= start + count {
                        break;
                    }
                    let result = run(seed, &options(&args, seed));
                    let mut t = totals.lock().expect("totals poisoned");
                    t.runs += 1;
                    match result {
                        Ok(r) => {
                            t.acked += r.history.acked as u64;
                            t.unknown += r.history.unknown as u64;
                            t.faults += r.faults;
                            t.restores += r.restores;
                            t.polls += r.polls;
                            t.resting_polls += r.resting_polls;
                            t.clusters_lost += r.clusters_lost;
                            t.membership_changes += r.membership_changes;
                            t.membership_refused += r.membership_refused;
                            t.terms += r.terms;
                            t.log_entries += r.log_length;
                            t.sim_ns += r.end_ns;
                            t.gaps.push((r.max_gap_ns, seed));
                        }
                        Err(f) => {
                            eprintln!("VIOLATION {f}");
                            t.failures.push(f);
                        }
                    }
                    drop(t);
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if count >= 20 && n.is_multiple_of((count / 20).max(1)) {
                        eprintln!("  {n}/{count} seeds ({:.0} s)", began.elapsed().as_secs_f64());
                    }
                }
            });
        }
    });
    let t = totals.into_inner().expect("totals poisoned");
    let f = t.faults;
    println!("runs: {}  violations: {}  wall time: {:.1} s", t.runs, t.failures.len(), began.elapsed().as_secs_f64());
    println!(
        "operations acknowledged: {}  unknown outcome: {}  log entries: {}  simulated time: {:.2} s",
        t.acked,
        t.unknown,
        t.log_entries,
        t.sim_ns as f64 / 1e9
    );
    println!(
        "faults: {} leader crashes, {} follower crashes, {} leader pauses, {} follower pauses; {} snapshot restores; {} terms led",
        f.leader_crashes, f.follower_crashes, f.leader_pauses, f.follower_pauses, t.restores, t.terms
    );
    if args.idle_stride > 1 {
        let share = 100.0 * t.resting_polls as f64 / t.polls.max(1) as f64;
        println!("replica polls while resting between heartbeats at an idle stride: {share:.1}%");
    }
    if args.swarm {
        println!("link faults (partitions, one-way, clogs): {}", f.link_faults);
    }
    if args.restarts {
        println!(
            "restarts with empty memory: {}; runs whose every member lost its memory (reported ClusterLost): {}",
            f.restarts, t.clusters_lost
        );
    }
    if args.membership {
        println!(
            "membership changes applied: {}; refused by the leader (joiner not caught up, change under way...): {}",
            t.membership_changes, t.membership_refused
        );
    }
    let mut gaps = t.gaps;
    gaps.sort_unstable();
    if let Some(&(max, seed)) = gaps.last() {
        let at = |q: f64| gaps[((gaps.len() - 1) as f64 * q) as usize].0 / 1_000;
        println!(
            "longest stretch without an acknowledged operation in the fault phase, per run: p50 {} us, p99 {} us, max {} us (seed {seed})",
            at(0.5),
            at(0.99),
            max / 1_000
        );
    }
    for failure in t.failures.iter().take(10) {
        println!("{failure}");
    }
    if t.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
