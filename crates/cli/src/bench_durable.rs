//! `microrep bench durability`: what the durable log (`cluster.durability = "fsync"`) costs,
//! side by side in one run: the same three-replica cluster and closed-loop load in memory only,
//! with the log on tmpfs (the `fdatasync` path without a device), and with the log on a disk.
//! Latency is measured at the proposer (submit to acknowledgement) into one HdrHistogram per
//! mode; acknowledgements wait for a majority of synced logs, so group commit is what keeps
//! throughput up (each `fdatasync` covers every entry that arrived while the previous one ran).
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep::config::{ClusterConfig, Durability, NodeConfig};
use microrep::{Config, Counter, Node, ProposeError};

/// Arguments of `microrep bench durability`.
#[derive(Debug, clap::Args)]
pub(crate) struct DurabilityArgs {
    /// Client threads, one proposal outstanding each.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// Measuring time per mode, in seconds (after a warm-up of a tenth of it).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// Bytes per command.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(8..=900))]
    payload: u32,
    /// Where the tmpfs mode keeps the logs.
    #[arg(long, default_value = "/dev/shm")]
    tmpfs_dir: PathBuf,
    /// Where the disk mode keeps the logs (a directory on the disk to measure).
    #[arg(long, default_value = ".")]
    disk_dir: PathBuf,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DurabilityBenchError {
    #[error("node {node} of the {mode} cluster did not start: {source}")]
    Start { mode: &'static str, node: u16, source: microrep::StartError },
    #[error("the {mode} cluster elected no leader within 30 s")]
    NoLeader { mode: &'static str },
    #[error("the {mode} cluster stopped: {why}")]
    Fatal { mode: &'static str, why: String },
}

/// One mode's figures.
struct Measured {
    mode: &'static str,
    latency: Histogram<u64>,
    acked: u64,
    failed: u64,
    timed_out: u64,
    /// Proposals a former leader refused (the client then follows the new one).
    redirected: u64,
    seconds: f64,
    entries: u64,
}

/// Runs the three modes one after the other and prints them side by side.
pub(crate) fn durability(args: &DurabilityArgs) -> Result<(), DurabilityBenchError> {
    let modes: [(&'static str, Option<&Path>); 3] =
        [("memory", None), ("fsync tmpfs", Some(&args.tmpfs_dir)), ("fsync disk", Some(&args.disk_dir))];
    let mut results = Vec::new();
    for (mode, dir) in modes {
        println!("measuring {mode}{}", dir.map(|d| format!(" (logs in {})", d.display())).unwrap_or_default());
        results.push(measure(args, mode, dir)?);
    }
    println!(
        "\n{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>7} {:>9} {:>10}",
        "mode", "ops/s", "p50 us", "p99 us", "p99.9 us", "max us", "cmd/entry", "failed", "timed out", "redirected"
    );
    for m in &results {
        let us = |q: f64| m.latency.value_at_quantile(q) as f64 / 1_000.0;
        println!(
            "{:<12} {:>10.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.1} {:>7} {:>9} {:>10}",
            m.mode,
            m.acked as f64 / m.seconds,
            us(0.5),
            us(0.99),
            us(0.999),
            m.latency.max() as f64 / 1_000.0,
            m.acked as f64 / m.entries.max(1) as f64,
            m.failed,
            m.timed_out,
            m.redirected
        );
    }
    Ok(())
}

fn measure(args: &DurabilityArgs, mode: &'static str, dir: Option<&Path>) -> Result<Measured, DurabilityBenchError> {
    let name = format!("bench-durable-{}-{}", mode.replace(' ', "-"), std::process::id());
    let mut cluster = ClusterConfig::local(&name, 3, 1);
    let shm = microrep_fabric::shm::ShmConfig::default_dir(&name);
    cluster.shm_dir = Some(shm.clone());
    let data = dir.map(|d| d.join(&name));
    if data.is_some() {
        cluster.durability = Durability::Fsync;
    }
    let _cleanup = Cleanup([Some(shm), data.clone()]);
    let nodes: Vec<Node> = (0..3u16)
        .map(|id| {
            let node =
                NodeConfig { data_dir: data.as_ref().map(|d| d.join(format!("node-{id}"))), ..NodeConfig::new(id) };
            microrep::start_on_shm(&Config { cluster: cluster.clone(), node }, Counter::default())
                .map_err(|source| DurabilityBenchError::Start { mode, node: id, source })
        })
        .collect::<Result<_, _>>()?;
    let first = leader(&nodes, mode)?;
    let command = vec![7u8; args.payload as usize];
    let warm_up = Duration::from_millis(args.seconds * 100);
    let measure = Duration::from_secs(args.seconds);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let entries_before = std::sync::Mutex::new(0);
    let per_client: Vec<(Histogram<u64>, [u64; 4])> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..args.clients)
            .map(|_| {
                s.spawn(|| {
                    let mut latency = microrep_testkit::hist::latency_ns();
                    // Acknowledged, failed, timed out, redirected.
                    let mut counts = [0u64; 4];
                    let mut target = first;
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        let outcome = nodes[target].propose(&command);
                        let measured = at.duration_since(started) >= warm_up;
                        let kind = match outcome {
                            Ok(_) => {
                                if measured {
                                    let _ = latency.record(at.elapsed().as_nanos() as u64);
                                }
                                0
                            }
                            Err(ProposeError::Timeout) => 2,
                            Err(ProposeError::NotLeader { leader }) => {
                                target = leader.map_or(target, |l| usize::from(l.0));
                                std::thread::yield_now();
                                3
                            }
                            Err(_) => 1,
                        };
                        if measured {
                            counts[kind] += 1;
                        }
                    }
                    (latency, counts)
                })
            })
            .collect();
        std::thread::sleep(warm_up);
        *entries_before.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = nodes[first].status().applied;
        std::thread::sleep(measure);
        stop.store(true, Ordering::Relaxed);
        clients.into_iter().map(|c| c.join().expect("a client thread panicked")).collect()
    });
    let seconds = started.elapsed().saturating_sub(warm_up).as_secs_f64();
    let before = *entries_before.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let entries = nodes[first].status().applied.saturating_sub(before);
    if let Some(why) = nodes.iter().find_map(Node::fatal) {
        return Err(DurabilityBenchError::Fatal { mode, why });
    }
    let mut latency = microrep_testkit::hist::latency_ns();
    let mut counts = [0u64; 4];
    for (h, c) in per_client {
        let _ = latency.add(&h);
        counts.iter_mut().zip(c).for_each(|(sum, n)| *sum += n);
    }
    nodes.into_iter().for_each(Node::shutdown);
    let [acked, failed, timed_out, redirected] = counts;
    Ok(Measured { mode, latency, acked, failed, timed_out, redirected, seconds, entries })
}

/// The index of the node that leads, once one acknowledged a proposal.
fn leader(nodes: &[Node], mode: &'static str) -> Result<usize, DurabilityBenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for (i, node) in nodes.iter().enumerate() {
            match node.propose(&[0; 8]) {
                Ok(_) => return Ok(i),
                Err(ProposeError::NotLeader { .. } | ProposeError::Backlogged | ProposeError::Unknown) => {}
                Err(e) => return Err(DurabilityBenchError::Fatal { mode, why: e.to_string() }),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(DurabilityBenchError::NoLeader { mode })
}

/// Removes a mode's shm segments and logs when it ends.
struct Cleanup([Option<PathBuf>; 2]);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in self.0.iter().flatten() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
