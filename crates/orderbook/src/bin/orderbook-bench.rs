//! `orderbook-bench`: latency of the order book executed in place (unreplicated) against the
//! same order flow replicated by microrep (a local cluster on the shm fabric), side by side in
//! one run, alternating rounds. Every order is counted: a failed proposal is reported, never
//! dropped from the table.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use microrep::Index;
use microrep::config::AttachMode;
use microrep_orderbook::local::LocalCluster;
use microrep_orderbook::{Command, OrderFlow, Outcome, ReplicatedBook};

#[derive(Debug, Parser)]
#[command(about = "Order book latency, unreplicated against replicated by microrep, in one run")]
struct Args {
    /// Orders per round and kind.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    orders: u64,
    /// Rounds of each kind, alternating (the machine's drift shows up as spread between rounds).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Orders executed before each round is measured.
    #[arg(long, default_value_t = 5_000)]
    warmup: u64,
    /// Seed of the order flow (the same flow for both kinds).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replicas of the replicated book.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    replicas: u16,
    /// Heartbeat period of the replicas, microseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_us: u64,
    /// One JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
}

/// One measured round.
struct Row {
    kind: &'static str,
    round: u64,
    latency: Histogram<u64>,
    elapsed: Duration,
    failed: u64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Runs `warmup + orders` commands of a fresh flow through `execute`, timing the last `orders`.
fn round(args: &Args, kind: &'static str, n: u64, mut execute: impl FnMut(&Command) -> Option<Outcome>) -> Row {
    let mut flow = OrderFlow::new(args.seed);
    let mut latency = histogram();
    let mut failed = 0;
    let mut started = Instant::now();
    for i in 0..args.warmup + args.orders {
        if i == args.warmup {
            started = Instant::now();
        }
        let command = flow.next_command();
        let t = Instant::now();
        let outcome = execute(&command);
        let ns = t.elapsed().as_nanos() as u64;
        match outcome {
            Some(outcome) => flow.observe(&outcome),
            None if i >= args.warmup => failed += 1,
            None => {}
        }
        if i >= args.warmup {
            latency.saturating_record(ns.max(1));
        }
    }
    Row { kind, round: n, latency, elapsed: started.elapsed(), failed }
}

fn print(rows: &[Row], args: &Args) {
    let us = |ns: u64| ns as f64 / 1000.0;
    if !args.json {
        println!("| kind | round | orders | orders/s | p50 µs | p99 µs | p99.9 µs | max µs | failed |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    }
    for r in rows {
        let h = &r.latency;
        let rate = args.orders as f64 / r.elapsed.as_secs_f64();
        let (p50, p99, p999, max) =
            (h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.value_at_quantile(0.999), h.max());
        if args.json {
            let row = serde_json::json!({
                "kind": r.kind, "round": r.round, "orders": args.orders, "orders_per_s": rate,
                "p50_ns": p50, "p99_ns": p99, "p999_ns": p999, "max_ns": max, "failed": r.failed,
                "replicas": args.replicas, "seed": args.seed,
            });
            println!("{row}");
        } else {
            println!(
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {} |",
                r.kind,
                r.round,
                args.orders,
                rate,
                us(p50),
                us(p99),
                us(p999),
                us(max),
                r.failed
            );
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let name = format!("orderbook-bench-{}", std::process::id());
    let mut cluster = LocalCluster::start(&name, args.replicas, AttachMode::Direct, args.heartbeat_us)?;
    cluster.await_leader(Duration::from_secs(10)).ok_or("no replica led within 10 s")?;
    let mut rows = Vec::new();
    for n in 1..=args.rounds {
        let mut book = ReplicatedBook::default();
        let mut entry = 0;
        let mut reply = Vec::new();
        rows.push(round(&args, "unreplicated", n, |command| {
            entry += 1;
            reply.clear();
            book.execute(Index { entry, position: 0 }, &command.encode(), &mut reply);
            Outcome::decode(&reply).ok()
        }));
        rows.push(round(&args, "replicated", n, |command| cluster.propose(command).ok().map(|(_, o)| o)));
    }
    print(&rows, &args);
    // The followers apply behind the leader: wait (bounded) until they caught up.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut digests = cluster.digests();
    while !digests.windows(2).all(|w| w[0] == w[1]) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        digests = cluster.digests();
    }
    if !args.json {
        let agree = if digests.windows(2).all(|w| w[0] == w[1]) { "agree" } else { "DIFFER after 30 s" };
        println!("\nreplicas (entries applied, digest), {agree}: {digests:?}");
    }
    Ok(())
}
