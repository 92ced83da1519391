//! `microrep-multicast-sim`: runs many seeded multicast-group simulations and reports any
//! broken invariant with the command that replays it.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use microrep_multicast_sim::{Failure, Options, run};

/// Simulate atomic multicast groups under faults, seed by seed.
#[derive(Debug, Parser)]
#[command(name = "microrep-multicast-sim", version)]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Run exactly this one seed (overrides --seeds/--start), e.g. to replay a failure; prints
    /// its report.
    #[arg(long)]
    seed: Option<u64>,
    /// Run without injected faults.
    #[arg(long)]
    no_faults: bool,
    /// Simulated microseconds of sending and faults per run.
    #[arg(long, default_value_t = microrep_multicast_sim::run::DEFAULT_FAULT_PHASE_NS / 1_000, value_parser = clap::value_parser!(u64).range(10..=100_000_000))]
    fault_phase_us: u64,
    /// Most messages sent per stage of a run.
    #[arg(long, default_value_t = 200)]
    messages: u32,
    /// No failure detection or crashes (static views only).
    #[arg(long)]
    no_views: bool,
    /// The spaced schedule of the first multi-view simulator (one event per stage; a second
    /// crash only after agreement), under which the older regression seeds were found.
    #[arg(long)]
    spaced: bool,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Run with a planted protocol bug (built with the `planted-bugs` feature).
    #[cfg(feature = "planted-bugs")]
    #[arg(long, value_parser = parse_bug)]
    bug: Option<microrep_core::multicast::PlantedBug>,
}

/// A `--bug` that names no planted bug.
#[cfg(feature = "planted-bugs")]
#[derive(Debug, thiserror::Error)]
#[error("unknown bug `{0}`; one of {all:?}", all = microrep_core::multicast::PlantedBug::ALL)]
struct UnknownBug(String);

#[cfg(feature = "planted-bugs")]
fn parse_bug(name: &str) -> Result<microrep_core::multicast::PlantedBug, UnknownBug> {
    use microrep_core::multicast::PlantedBug;
    PlantedBug::ALL
        .into_iter()
        .find(|b| format!("{b:?}").eq_ignore_ascii_case(name))
        .ok_or_else(|| UnknownBug(name.into()))
}

#[derive(Default)]
struct Totals {
    runs: u64,
    sent: u64,
    delivered: u64,
    nulls: u64,
    writes: u64,
    pauses: u64,
    slow: u64,
    crashes: u64,
    events_in_change: u64,
    joins: u64,
    partitions: u64,
    views: u64,
    multi_view: u64,
    ballots: u64,
    adopted: u64,
    at_receipt: u64,
    in_place: u64,
    thresholds_apart: u64,
    pulled: u64,
    restarts: u64,
    barriers: u64,
    takeovers: u64,
    lost_requests: u64,
    join_asks: u64,
    joins_given_up: u64,
    majority_lost: u64,
    /// Runs in which a view change took more than one ballot.
    retried: u64,
    sim_ns: u64,
    failures: Vec<Failure>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = Options {
        faults: !args.no_faults,
        fault_phase_ns: args.fault_phase_us * 1_000,
        messages: args.messages,
        views: !args.no_views,
        spaced: args.spaced,
        #[cfg(feature = "planted-bugs")]
        bug: args.bug,
    };
    if let Some(seed) = args.seed {
        return match run(seed, &options) {
            Ok(report) => {
                println!("seed {seed}: ok {report:?}");
                ExitCode::SUCCESS
            }
            Err(failure) => {
                println!("VIOLATION {failure}");
                ExitCode::FAILURE
            }
        };
    }
    let (start, count) = (args.start, args.seeds);
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)).max(1);
    let next = AtomicU64::new(start);
    let done = AtomicU64::new(0);
    let totals = Mutex::new(Totals::default());
    let began = Instant::now();
    eprintln!("microrep-multicast-sim: seeds {start}..{}, {threads} threads", start + count);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= start + count {
                        break;
                    }
                    let result = run(seed, &options);
                    let mut t = totals.lock().expect("totals poisoned");
                    t.runs += 1;
                    match result {
                        Ok(r) => {
                            t.sent += r.sent;
                            t.delivered += r.delivered;
                            t.nulls += r.nulls;
                            t.writes += r.writes;
                            t.pauses += r.pauses;
                            t.slow += u64::from(r.slow_member);
                            t.crashes += r.crashes;
                            t.events_in_change += r.events_in_change;
                            t.joins += r.joins;
                            t.partitions += u64::from(r.partition);
                            t.views += r.views;
                            t.multi_view += u64::from(r.views >= 2);
                            t.ballots += r.ballots;
                            t.at_receipt += r.at_receipt;
                            t.in_place += r.in_place;
                            t.thresholds_apart += u64::from(r.thresholds_apart);
                            t.pulled += u64::from(r.pulled);
                            t.restarts += r.restarts;
                            t.barriers += r.barriers;
                            t.takeovers += r.takeovers;
                            t.lost_requests += r.lost_requests;
                            t.join_asks += r.join_asks;
                            t.joins_given_up += r.joins_given_up;
                            t.majority_lost += r.majority_lost;
                            t.adopted += r.adopted;
                            t.retried += u64::from(r.ballots > r.views);
                            t.sim_ns += r.end_ns;
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
    println!("runs: {}  violations: {}  wall time: {:.1} s", t.runs, t.failures.len(), began.elapsed().as_secs_f64());
    println!(
        "messages sent: {}  deliveries: {}  nulls: {}  writes: {}  pauses: {}  runs with a slow member: {}  simulated time: {:.2} s",
        t.sent,
        t.delivered,
        t.nulls,
        t.writes,
        t.pauses,
        t.slow,
        t.sim_ns as f64 / 1e9
    );
    println!(
        "crashes: {}  events armed by a change under way: {}  joins: {}  partitioned runs: {}  views installed: {}  runs with two or more view changes: {}",
        t.crashes, t.events_in_change, t.joins, t.partitions, t.views, t.multi_view
    );
    println!(
        "ballots: {}  runs where a change took more than one ballot: {}  proposals adopting an earlier ballot's value: {}  fresh-SST barriers: {}  state sections taken over: {}  subgroups delivering at receipt: {}  subgroups delivering in place: {}  runs with members' copy thresholds apart: {}  runs with rings pulled: {}  crashed nodes restarted at once: {}",
        t.ballots,
        t.retried,
        t.adopted,
        t.barriers,
        t.takeovers,
        t.at_receipt,
        t.in_place,
        t.thresholds_apart,
        t.pulled,
        t.restarts
    );
    println!(
        "join requests lost with their sponsor: {}  requests joiners left in a mailbox: {}  joiners that gave up: {}  members stopped without a majority: {}",
        t.lost_requests, t.join_asks, t.joins_given_up, t.majority_lost
    );
    let mut failures = t.failures;
    failures.sort_by_key(|f| f.seed);
    for f in &failures {
        println!("VIOLATION {f}");
    }
    if failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
