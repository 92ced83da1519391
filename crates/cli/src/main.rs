//! `microrep`: the command-line entry point.
//!
//! Subcommands print human-readable progress to stdout and errors to stderr; library crates
//! never print or exit (STYLE.md rule 8).

mod bench;
mod bench_durable;
mod bench_etcd;
mod bench_failover;
mod bench_multicast;
mod bench_multicast_procs;
mod bench_pingpong;
mod bench_resp;
mod bench_runtime;
mod cluster;
mod demo;
mod load;
mod member;
mod node;
mod procs;
mod status;
mod topic;
mod wrap;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Microsecond-scale replication for microsecond applications.
#[derive(Debug, Parser)]
#[command(name = "microrep", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks, printed as tables (or JSON lines) of HdrHistogram percentiles.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Local clusters of replicas.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Shows the one-sided fabric between two processes: permissions, writes, revocation, crash.
    Demo(demo::DemoArgs),
    /// Internal: the target node of `microrep demo`, driven over stdin.
    #[command(hide = true)]
    DemoTarget(demo::TargetArgs),
    /// Internal: one replica process of `microrep bench throughput` and `groups`.
    #[command(hide = true)]
    BenchRuntimeNode(bench_runtime::RuntimeNodeArgs),
    /// Internal: one replica process of `microrep bench failover`.
    #[command(hide = true)]
    BenchFailoverNode(bench_failover::FailoverNodeArgs),
    /// Internal: one replica process of `microrep bench replication`.
    #[command(hide = true)]
    BenchNode(bench::BenchNodeArgs),
    /// Internal: one member process of `microrep bench multicast --processes`.
    #[command(hide = true)]
    BenchMulticastMember(bench_multicast_procs::MemberArgs),
    /// Membership changes of a running cluster: `microrep member add|remove|replace`.
    #[command(subcommand)]
    Member(member::MemberCommand),
    /// Runs one replica of the key-value example (RESP server) from a config file.
    Node(node::NodeArgs),
    /// Shows every member's role, leader, proposal number, FUO, log head and recent fail-overs.
    Status(status::StatusArgs),
    /// Publish/subscribe on multicast topics: `microrep topic pub|sub` (docs/MULTICAST.md).
    #[command(subcommand)]
    Topic(topic::TopicCommand),
    /// Replicates an unmodified server: `microrep wrap -- redis-server --port {port}`.
    Wrap(wrap::WrapArgs),
    /// Internal: one replica process of `microrep wrap`.
    #[command(hide = true)]
    WrapReplica(wrap::replica::ReplicaArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Replication latency: the leader proposes in a loop (one outstanding), replicas in
    /// separate processes on the shm (or tcp) fabric, next to applying the command unreplicated
    /// (and, on tcp, next to a plain TCP ping-pong of the same payload).
    Replication(bench::ReplicationArgs),
    /// Fail-over time: leader failures (SIGKILL, SIGSTOP) injected into a cluster of
    /// processes, split into detection and permission switch.
    Failover(bench_failover::FailoverArgs),
    /// The key-value example through RESP, replicated next to unreplicated (shm or tcp fabric).
    Resp(bench_resp::RespArgs),
    /// Replicated SETs through RESP next to PUTs of a 3-member etcd cluster, same clients and
    /// value size, on loopback (needs etcd-server and tools/etcdbench; see scripts/bench-etcd.sh).
    Etcd(bench_etcd::EtcdArgs),
    /// Throughput and latency over batch sizes and outstanding entries (handover mode).
    Throughput(bench_runtime::ThroughputArgs),
    /// Commit latency over group sizes from 3 to 105 replicas (direct mode).
    Groups(bench_runtime::GroupsArgs),
    /// The durable log's cost: the same cluster and load in memory, with logs on tmpfs and
    /// with logs on a disk, side by side.
    Durability(bench_durable::DurabilityArgs),
    /// Atomic multicast: delivery latency and messages/s over group sizes, senders and message
    /// sizes, next to memcpy bandwidth measured in the same run.
    Multicast(bench_multicast::MulticastArgs),
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Starts a local cluster of key-value replicas (one `microrep node` process each, on the
    /// shm, tcp or verbs fabric), runs a demo load through the leader, checks that nothing acknowledged was lost
    /// and that every replica holds the same state; `--serve` keeps it up until Ctrl-C.
    Up(cluster::UpArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file stays plain text for grep and tools.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("microrep: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command; each module's typed error becomes text only here, for `main` to print.
fn run(command: Command) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        Command::Bench(BenchCommand::Replication(args)) => cleaned_up_on_signals(|| bench::replication(&args))?,
        Command::BenchNode(args) => bench::run_node(&args)?,
        Command::Bench(BenchCommand::Failover(args)) => cleaned_up_on_signals(|| bench_failover::failover(&args))?,
        Command::BenchFailoverNode(args) => bench_failover::run_node(&args)?,
        Command::Bench(BenchCommand::Resp(args)) => cleaned_up_on_signals(|| bench_resp::resp(&args))?,
        Command::Bench(BenchCommand::Etcd(args)) => bench_etcd::etcd(&args)?,
        Command::Bench(BenchCommand::Throughput(args)) => cleaned_up_on_signals(|| bench_runtime::throughput(&args))?,
        Command::Bench(BenchCommand::Groups(args)) => cleaned_up_on_signals(|| bench_runtime::groups(&args))?,
        Command::Bench(BenchCommand::Durability(args)) => bench_durable::durability(&args)?,
        Command::Bench(BenchCommand::Multicast(args)) => cleaned_up_on_signals(|| bench_multicast::multicast(&args))?,
        Command::BenchMulticastMember(args) => bench_multicast_procs::run_member(&args)?,
        Command::BenchRuntimeNode(args) => bench_runtime::run_node(&args)?,
        Command::Cluster(ClusterCommand::Up(args)) => cluster::up(&args)?,
        Command::Member(command) => member::run(&command)?,
        Command::Node(args) => node::run(&args)?,
        Command::Status(args) => status::run(&args)?,
        Command::Topic(command) => topic::run(&command)?,
        Command::Demo(args) => cleaned_up_on_signals(|| demo::run(&args))?,
        Command::DemoTarget(args) => demo::run_target(&args)?,
        Command::Wrap(args) => wrap::run(&args)?,
        Command::WrapReplica(args) => wrap::replica::run(&args)?,
    }
    Ok(())
}

/// Runs a command that starts child processes and has no signal handler of its own, so that
/// SIGINT, SIGTERM or SIGHUP kills its children and removes its scratch directories
/// (`microrep_testkit::cleanup`) instead of leaving them behind.
fn cleaned_up_on_signals<E: std::error::Error + 'static>(
    run: impl FnOnce() -> Result<(), E>,
) -> Result<(), Box<dyn std::error::Error>> {
    microrep_testkit::cleanup::clean_up_on_signals("microrep")?;
    Ok(run()?)
}
