//! `microrep-faults`: fault testing of a real microrep cluster. Starts `microrep node` processes
//! on the shm or tcp fabric (with `--netns`, each in its own network namespace), runs concurrent
//! RESP clients while a seeded nemesis kills, pauses and restarts replicas and partitions the
//! network, then checks the recorded history for linearizability (porcupine, in
//! `tools/linearizability`), that no acknowledged write was lost, and that the replicas converged.
//! `--target wrap-redis` runs them against an unmodified redis-server replicated by `microrep
//! wrap`, and `--target redis` against one redis-server, the positive control.
//! See docs/RELIABILITY.md.
#![allow(clippy::print_stdout)]

mod applied;
mod artifact;
mod availability;
mod history;
mod membership;
mod nemesis;
mod netns;
mod procs;
mod report;
mod run;
mod summarize;
mod target;
mod verify;
mod workload;
mod wrap;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;

use crate::nemesis::FaultKind;
use crate::report::{Totals, Verdict};
use crate::run::RunParams;
use crate::target::{FabricChoice, TargetKind};

/// Fault testing of real microrep clusters, checked for linearizability.
#[derive(Debug, Parser)]
#[command(name = "microrep-faults", version, about)]
struct Args {
    /// The system under test.
    #[arg(long, value_enum, default_value = "microrep")]
    target: TargetChoice,
    /// The `microrep` binary (default: next to this one; `--target wrap-redis` needs the shim,
    /// libmicrorep_interpose.so, next to it).
    #[arg(long)]
    microrep: Option<PathBuf>,
    /// The `redis-server` binary (`--target redis` and `wrap-redis`).
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    /// The fabric of the microrep cluster.
    #[arg(long, value_enum, default_value = "shm")]
    fabric: FabricChoice,
    /// Run each replica in its own network namespace, joined by a bridge, so that the nemesis
    /// can partition the network (`--fabric tcp` only; needs root, iproute2 and nftables).
    #[arg(long)]
    netns: bool,
    /// Replicas of the microrep cluster (or copies of the wrapped server).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    replicas: u16,
    /// More ids that run as spares (`--target microrep`): the cluster starts with the first
    /// `--replicas` ids as its members (`cluster.initial_members`); spares follow and catch up,
    /// and the `replace-member` fault makes them members in place of others.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=4))]
    spares: u16,
    /// Seed of the first history (the fault schedule and the clients' choices); default: the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Histories to run, with seeds `seed`, `seed + 1`, ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    histories: u64,
    /// Seconds of load and faults per history.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    duration: u64,
    /// Concurrent clients, each with its own connection.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    clients: u64,
    /// Keys of each kind (registers, counters, logs).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    keys_per_kind: u64,
    /// Operations per second per client.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// Milliseconds an operation may take (redirects included) before its outcome is unknown.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    op_timeout_ms: u64,
    /// Most faults per history.
    #[arg(long, default_value_t = 40)]
    max_faults: usize,
    /// Mean milliseconds between two fault starts.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(2..=600_000))]
    fault_gap_ms: u64,
    /// Fault kinds to draw from (comma-separated; default: all but pause-all, kill-majority,
    /// kill-all and replace-member for microrep and wrap-redis, the network kinds only with
    /// `--netns`; none for redis, which only `pause-all` can fault).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    /// Negative control: the fraction of reads whose reply the client replaces with an older
    /// value it read before (stale reads); the checker must report a violation.
    #[arg(long, default_value_t = 0.0)]
    corrupt_reads: f64,
    /// Negative control: run the nodes with this planted protocol bug (e.g. AckBeforeMajority;
    /// `microrep` must be built with the `planted-bugs` feature).
    #[arg(long)]
    planted_bug: Option<String>,
    /// Run the microrep nodes with a durable log (`cluster.durability = "fsync"`, a data
    /// directory each in the history's directory); `kill-all` needs it.
    #[arg(long)]
    durable: bool,
    /// How the microrep nodes' RESP servers propose (`node.mode`): `handover` (the default
    /// of a node's configuration) or `direct` (what `microrep cluster up` runs).
    #[arg(long, value_enum, default_value = "handover")]
    mode: ModeChoice,
    /// Negative controls: stop at the first history with an anomaly and succeed; fail if none of
    /// the `--histories` shows one.
    #[arg(long)]
    expect_anomaly: bool,
    /// The linearizability checker binary (default: built with `go build` from tools/linearizability).
    #[arg(long)]
    checker: Option<PathBuf>,
    /// Seconds the checker may take per history before the result is inconclusive.
    #[arg(long, default_value_t = 300)]
    checker_timeout: u64,
    /// Seconds after which a history is abandoned: processes killed, exit status 2
    /// (default: duration + checker timeout + 120).
    #[arg(long)]
    hard_deadline: Option<u64>,
    /// Delete `history.json` of every history that passed (the other artifacts stay): for long runs.
    #[arg(long)]
    prune_passing: bool,
    /// Run nothing: print the totals over the histories earlier runs left in these artifact
    /// directories (their `seed-N/summary.json`; runs stopped part way included), checking that
    /// the replicas agreed on what they applied where older reports did not.
    #[arg(long, value_name = "DIR", num_args = 1.., conflicts_with_all = RUN_ONLY)]
    summarize: Vec<PathBuf>,
    /// Artifacts directory: one `seed-N/` per history (history.json, checker.txt, nemesis.json,
    /// node logs, summary.json) and `summary.json` with the totals.
    #[arg(long, default_value = "faults-out")]
    out: PathBuf,
}

/// The options that shape a run, meaningless with `--summarize`.
const RUN_ONLY: [&str; 26] = [
    "target",
    "microrep",
    "redis_server",
    "fabric",
    "netns",
    "replicas",
    "spares",
    "seed",
    "histories",
    "duration",
    "clients",
    "keys_per_kind",
    "rate",
    "op_timeout_ms",
    "max_faults",
    "fault_gap_ms",
    "faults",
    "corrupt_reads",
    "planted_bug",
    "durable",
    "expect_anomaly",
    "checker",
    "checker_timeout",
    "hard_deadline",
    "prune_passing",
    "out",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TargetChoice {
    /// A cluster of microrep's own key-value server.
    Microrep,
    /// One redis-server (the positive control).
    Redis,
    /// An unmodified redis-server replicated by `microrep wrap` (shm fabric, one host).
    WrapRedis,
}

/// Why the harness could not run (a history's own failures are in its report instead).
#[derive(Debug, thiserror::Error)]
enum HarnessError {
    #[error(transparent)]
    Summarize(#[from] summarize::SummarizeError),
    #[error("--corrupt-reads must be within 0..=1, not {0}")]
    CorruptReads(f64),
    #[error("creating {}: {source}", path.display())]
    CreateOut { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    ResolveOut { path: PathBuf, source: std::io::Error },
    /// The signal handler could not be installed.
    #[error(transparent)]
    Signals(#[from] microrep_testkit::KitError),
    #[error(transparent)]
    Summary(#[from] artifact::WriteError),
    #[error(
        "--target wrap-redis runs on the shm fabric (microrep wrap is one host), without --fabric tcp or --planted-bug"
    )]
    WrapRedisOptions,
    #[error("--netns needs --target microrep and --fabric tcp")]
    NetnsOptions,
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    #[error("the network fault {0:?} needs --netns")]
    NeedsNetns(FaultKind),
    #[error(
        "kill-all needs --target microrep --durable: without a durable log a cluster all of whose members were killed has \
         lost its state (it stops saying so)"
    )]
    KillAllNeedsDurable,
    #[error("--spares needs --target microrep (membership changes are microrep's)")]
    SparesOptions,
    #[error("replace-member needs --spares 1 or more")]
    ReplaceNeedsSpares,
    #[error("locating myself: {0}")]
    LocateSelf(std::io::Error),
    #[error("no {name} next to {} (build it, or pass --{name} PATH)", me.display())]
    NotNextToMe { name: &'static str, me: PathBuf },
    #[error("running `go build` in {}: {source} (or pass --checker PATH)", dir.display())]
    RunGoBuild { dir: PathBuf, source: std::io::Error },
    #[error("`go build` in {} failed: {status}", dir.display())]
    GoBuild { dir: PathBuf, status: std::process::ExitStatus },
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("microrep-faults: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, HarnessError> {
    if !args.summarize.is_empty() {
        let (_, worst) = summarize::summarize(&args.summarize)?;
        return Ok(ExitCode::from(worst.exit_status()));
    }
    if !(0.0..=1.0).contains(&args.corrupt_reads) {
        return Err(HarnessError::CorruptReads(args.corrupt_reads));
    }
    std::fs::create_dir_all(&args.out).map_err(|source| HarnessError::CreateOut { path: args.out.clone(), source })?;
    let out = args.out.canonicalize().map_err(|source| HarnessError::ResolveOut { path: args.out.clone(), source })?;
    let params = params(args, &out)?;
    microrep_testkit::cleanup::clean_up_on_signals("microrep-faults")?;
    let first = args.seed.unwrap_or_else(clock_seed);
    println!(
        "microrep-faults: {} histories from seed {first}, {} s each, artifacts in {}",
        args.histories,
        args.duration,
        out.display()
    );
    let mut totals = Totals::default();
    let mut worst = Verdict::Pass;
    for seed in first..first.saturating_add(args.histories) {
        let report = run::run_history(&params, seed, &out.join(format!("seed-{seed}")));
        report.print_line();
        totals.add(&report);
        worst = worst.worst(report.verdict);
        if args.expect_anomaly && worst == Verdict::Anomaly {
            break;
        }
    }
    totals.print();
    artifact::write_json(&out.join("summary.json"), &totals)?;
    let code = if args.expect_anomaly {
        if worst == Verdict::Anomaly {
            println!("negative control: an anomaly was found, as expected");
            0
        } else {
            println!("negative control FAILED: no anomaly in {} histories", totals.histories);
            1
        }
    } else {
        worst.exit_status()
    };
    Ok(ExitCode::from(code))
}

fn params(args: &Args, out: &Path) -> Result<RunParams, HarnessError> {
    let target = match args.target {
        TargetChoice::Microrep => TargetKind::Microrep {
            binary: match &args.microrep {
                Some(path) => path.clone(),
                None => next_to_me("microrep")?,
            },
            replicas: args.replicas,
            spares: args.spares,
            planted_bug: args.planted_bug.clone(),
            fabric: args.fabric,
            netns: args.netns,
            durable: args.durable,
            mode: match args.mode {
                ModeChoice::Handover => microrep::config::AttachMode::Handover,
                ModeChoice::Direct => microrep::config::AttachMode::Direct,
            },
        },
        TargetChoice::Redis => TargetKind::Redis { binary: args.redis_server.clone() },
        TargetChoice::WrapRedis => {
            if args.fabric != FabricChoice::Shm || args.planted_bug.is_some() {
                return Err(HarnessError::WrapRedisOptions);
            }
            TargetKind::WrapRedis {
                microrep: match &args.microrep {
                    Some(path) => path.clone(),
                    None => next_to_me("microrep")?,
                },
                redis: args.redis_server.clone(),
                replicas: args.replicas,
            }
        }
    };
    if args.netns {
        if args.target != TargetChoice::Microrep || args.fabric != FabricChoice::Tcp {
            return Err(HarnessError::NetnsOptions);
        }
        if let Some(missing) = netns::missing_prerequisite() {
            return Err(missing.into());
        }
        netns::remove_stale()?;
    } else if let Some(&kind) = args.faults.iter().find(|k| k.is_network()) {
        return Err(HarnessError::NeedsNetns(kind));
    }
    let faults = match (args.faults.is_empty(), args.target) {
        (true, TargetChoice::Microrep) if args.netns => [&FaultKind::DEFAULT[..], &FaultKind::NETWORK[..]].concat(),
        (true, TargetChoice::Microrep | TargetChoice::WrapRedis) => FaultKind::DEFAULT.to_vec(),
        _ => args.faults.clone(),
    };
    if faults.contains(&FaultKind::KillAll) && !(args.durable && args.target == TargetChoice::Microrep) {
        return Err(HarnessError::KillAllNeedsDurable);
    }
    if args.spares > 0 && args.target != TargetChoice::Microrep {
        return Err(HarnessError::SparesOptions);
    }
    if faults.contains(&FaultKind::ReplaceMember) && args.spares == 0 {
        return Err(HarnessError::ReplaceNeedsSpares);
    }
    let checker = match &args.checker {
        Some(path) => path.clone(),
        None => build_checker(out)?,
    };
    let checker_timeout = Duration::from_secs(args.checker_timeout);
    Ok(RunParams {
        target,
        duration: Duration::from_secs(args.duration),
        clients: args.clients as usize,
        keys_per_kind: args.keys_per_kind as usize,
        rate: args.rate,
        op_timeout: Duration::from_millis(args.op_timeout_ms),
        max_faults: args.max_faults,
        mean_fault_gap: Duration::from_millis(args.fault_gap_ms),
        faults,
        corrupt_reads: args.corrupt_reads,
        checker,
        checker_timeout,
        hard_deadline: Duration::from_secs(args.hard_deadline.unwrap_or(args.duration + args.checker_timeout + 120)),
        prune_passing: args.prune_passing,
    })
}

fn clock_seed() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    now.as_secs() % 1_000_000
}

fn next_to_me(name: &'static str) -> Result<PathBuf, HarnessError> {
    let me = std::env::current_exe().map_err(HarnessError::LocateSelf)?;
    let path = me.with_file_name(name);
    if path.is_file() { Ok(path) } else { Err(HarnessError::NotNextToMe { name, me }) }
}

/// Builds the Go checker from the source tree into `out` (the Go build cache makes this quick
/// after the first time).
fn build_checker(out: &Path) -> Result<PathBuf, HarnessError> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/linearizability");
    let binary = out.join("linearizability");
    let status = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(".")
        .current_dir(&source)
        .status()
        .map_err(|e| HarnessError::RunGoBuild { dir: source.clone(), source: e })?;
    if status.success() { Ok(binary) } else { Err(HarnessError::GoBuild { dir: source, status }) }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_options_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn summarize_takes_directories_and_refuses_the_options_of_a_run() {
        let args = Args::try_parse_from(["microrep-faults", "--summarize", "a", "b"]).expect("parses");
        assert_eq!(args.summarize, [PathBuf::from("a"), PathBuf::from("b")]);
        for run_only in [["--seed", "3"], ["--out", "x"], ["--replicas", "5"]] {
            let err = Args::try_parse_from(["microrep-faults", "--summarize", "a", run_only[0], run_only[1]])
                .expect_err("a run's option with --summarize");
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{run_only:?}");
        }
        let err = Args::try_parse_from(["microrep-faults", "--summarize"]).expect_err("no directory");
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn wrap_redis_refuses_what_microrep_wrap_cannot_do() {
        for extra in [["--fabric", "tcp"], ["--planted-bug", "AckBeforeMajority"]] {
            let argv = ["microrep-faults", "--target", "wrap-redis", "--microrep", "/bin/true", extra[0], extra[1]];
            let args = Args::try_parse_from(argv).expect("parses");
            let err = params(&args, Path::new("/nonexistent")).expect_err("refused");
            assert!(matches!(err, HarnessError::WrapRedisOptions), "{err}");
        }
        let argv = ["microrep-faults", "--target", "wrap-redis", "--microrep", "/bin/true", "--netns"];
        let err = params(&Args::try_parse_from(argv).expect("parses"), Path::new("/nonexistent")).expect_err("refused");
        assert!(matches!(err, HarnessError::NetnsOptions), "{err}");
    }

    #[test]
    fn membership_changes_need_spares_of_a_microrep_cluster() {
        let refused = |extra: &[&str]| {
            let argv = [&["microrep-faults", "--microrep", "/bin/true", "--checker", "/bin/true"], extra].concat();
            params(&Args::try_parse_from(argv).expect("parses"), Path::new("/nonexistent")).expect_err("refused")
        };
        let err = refused(&["--faults", "replace-member,kill-leader"]);
        assert!(matches!(err, HarnessError::ReplaceNeedsSpares), "{err}");
        let err = refused(&["--spares", "1", "--target", "redis"]);
        assert!(matches!(err, HarnessError::SparesOptions), "{err}");
        let argv = ["microrep-faults", "--microrep", "/bin/true", "--checker", "/bin/true", "--spares", "1"];
        let extra = ["--faults", "replace-member,pause-leader"];
        let p = params(&Args::try_parse_from([&argv[..], &extra[..]].concat()).expect("parses"), Path::new("/x"))
            .expect("accepted");
        assert!(matches!(p.target, TargetKind::Microrep { replicas: 3, spares: 1, .. }), "{:?}", p.target);
        let defaults = params(&Args::try_parse_from(argv).expect("parses"), Path::new("/x")).expect("accepted");
        assert!(!defaults.faults.contains(&FaultKind::ReplaceMember), "not drawn unless named");
    }
}

/// `--mode`: how the nodes' servers propose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ModeChoice {
    Handover,
    Direct,
}
