//! `microrep bench resp`: the key-value example through its RESP front end, replicated (a
//! cluster of `microrep node` processes) next to the same server over an unreplicated store, in
//! one invocation. One client sends SETs (and GETs) one at a time and times each round trip;
//! with `--redis-benchmark`, redis-benchmark also runs against both.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep::config::{ClusterConfig, NodeConfig};
use microrep_kv::KvNode;
use microrep_kv::client::{Client, Value};

use crate::{load, procs};

/// Arguments of `microrep bench resp`.
#[derive(Debug, clap::Args)]
pub(crate) struct RespArgs {
    /// Replicas (processes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    replicas: u16,
    /// Requests timed per command and server.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    requests: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=900))]
    value: u32,
    /// Client port of replica 0 (replica i: BASE_PORT + i; the unreplicated server: BASE_PORT + 100).
    #[arg(long, default_value_t = 16380, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    base_port: u16,
    /// Also run redis-benchmark (from redis-tools) against both servers.
    #[arg(long)]
    redis_benchmark: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

fn time(addr: SocketAddr, command: &[u8], n: u64, value: &[u8]) -> Result<Histogram<u64>, String> {
    let mut client = Client::connect(addr, Duration::from_secs(10)).map_err(|e| format!("{addr}: {e}"))?;
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).map_err(|e| e.to_string())?;
    for i in 0..n {
        let key = format!("key:{}", i % 1000);
        let t0 = Instant::now();
        let reply = if command == b"SET" {
            client.call(&[b"SET", key.as_bytes(), value])
        } else {
            client.call(&[command, key.as_bytes()])
        }
        .map_err(|e| e.to_string())?;
        h.record(t0.elapsed().as_nanos().max(1) as u64).map_err(|e| e.to_string())?;
        if let Value::Error(e) = reply {
            return Err(format!("{addr}: {e}"));
        }
    }
    Ok(h)
}

/// Runs the benchmark.
pub(crate) fn resp(args: &RespArgs) -> Result<(), String> {
    let name = format!("bench-resp-{}", std::process::id());
    let dir = microrep_fabric::shm::ShmConfig::default_dir(&name);
    microrep_fabric::shm::ShmFabric::remove_stale(&dir).map_err(|e| e.to_string())?;
    let result = drive(args, &name, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn drive(args: &RespArgs, name: &str, dir: &std::path::Path) -> Result<(), String> {
    let mut cluster = ClusterConfig::local(name, args.replicas, args.base_port);
    cluster.shm_dir = Some(dir.to_path_buf());
    let members: Vec<SocketAddr> =
        (0..args.replicas).map(|i| cluster.client_addr(i).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let (tx, _lines) = mpsc::channel();
    let _nodes: Vec<procs::Reaper> = procs::write_configs(dir, &cluster, NodeConfig::new)?
        .iter()
        .enumerate()
        .map(|(id, path)| {
            let a = ["node".as_ref(), "--config".as_ref(), path.as_os_str(), "--exit-with-parent".as_ref()];
            procs::spawn_tagged(&a, id as u16, &tx, Some("error")).map(procs::Reaper)
        })
        .collect::<Result<_, _>>()?;
    let leader = members[load::find_leader(&members, Duration::from_secs(60))?];
    let local: SocketAddr = format!("127.0.0.1:{}", args.base_port + 100).parse().map_err(|e| format!("{e}"))?;
    let baseline = KvNode::start_unreplicated(local, 1024)?;
    let value = vec![b'v'; args.value as usize];
    if !args.json {
        eprintln!(
            "microrep bench resp: {} replicas (leader {leader}), {} B values, one client",
            args.replicas, args.value
        );
        println!(
            "{:<5} {:<13} {:>10} {:>10} {:>10} {:>8}",
            "cmd", "server", "p50 us", "p99 us", "p99.9 us", "requests"
        );
    }
    for command in [&b"SET"[..], b"GET"] {
        // Alternate blocks so that both servers see the same machine conditions.
        let (mut ours, mut base) =
            (Histogram::<u64>::new(3).map_err(|e| e.to_string())?, Histogram::new(3).map_err(|e| e.to_string())?);
        let block = 1000.min(args.requests);
        while ours.len() < args.requests {
            ours.add(time(leader, command, block, &value)?).map_err(|e| e.to_string())?;
            base.add(time(baseline.addr(), command, block, &value)?).map_err(|e| e.to_string())?;
        }
        for (server, h) in [("microrep", &ours), ("unreplicated", &base)] {
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            let cmd = String::from_utf8_lossy(command);
            if args.json {
                println!(
                    "{{\"bench\":\"resp\",\"replicas\":{},\"value_bytes\":{},\"command\":\"{cmd}\",\"server\":\"{server}\",\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"requests\":{}}}",
                    args.replicas,
                    args.value,
                    us(0.5),
                    us(0.99),
                    us(0.999),
                    h.len()
                );
            } else {
                println!(
                    "{cmd:<5} {server:<13} {:>10.1} {:>10.1} {:>10.1} {:>8}",
                    us(0.5),
                    us(0.99),
                    us(0.999),
                    h.len()
                );
            }
        }
    }
    if args.redis_benchmark {
        for (server, addr) in [("microrep", leader), ("unreplicated", baseline.addr())] {
            let out = Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-t", "set,get", "-n", "20000", "-c", "8"])
                .args(["-d", &args.value.to_string(), "-q"])
                .output()
                .map_err(|e| format!("running redis-benchmark (apt install redis-tools): {e}"))?;
            for line in
                String::from_utf8_lossy(&out.stdout).split(['\r', '\n']).filter(|l| l.contains("requests per second"))
            {
                println!("redis-benchmark {server}: {}", line.trim());
            }
        }
    }
    Ok(())
}
