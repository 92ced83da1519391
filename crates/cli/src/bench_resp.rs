//! `microrep bench resp`: the key-value example through its RESP front end, replicated (a
//! cluster of `microrep node` processes, shm or tcp fabric) next to the same server over an
//! unreplicated store, in one invocation. Each of `--clients` clients sends SETs (and GETs) one at
//! a time and times each round trip; with `--redis-benchmark`, redis-benchmark also runs against
//! both. `microrep bench etcd` uses the same cluster and clients.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep::config::{AttachMode, ClusterConfig, FabricKind, NodeConfig};
use microrep_kv::client::{Client, RespError, Value};
use microrep_kv::reply::ErrorReply;
use microrep_kv::{KvError, KvNode};
use microrep_testkit::KitError;
use microrep_testkit::child::Guarded;
use microrep_testkit::cluster::write_configs;
use microrep_testkit::hist;
use microrep_testkit::scratch::ScratchDir;

use crate::load::{self, LoadError};
use crate::procs::{self, SpawnError};

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
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=MAX_VALUE as i64))]
    value: u32,
    /// Concurrent clients, each with its own connection and one request at a time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    clients: u16,
    /// The fabric between the replicas: shm, or tcp on loopback.
    #[arg(long, default_value = "shm", value_parser = ["shm", "tcp"])]
    fabric: String,
    /// Client port of replica 0 (replica i: BASE_PORT + i; the unreplicated server: BASE_PORT + 100;
    /// with `--fabric tcp`, the fabric of replica i listens on BASE_PORT + 200 + i).
    #[arg(long, default_value_t = 16380, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    base_port: u16,
    /// How the server's thread proposes (Mu §7.1): `direct` (the server's thread replicates
    /// each turn's commands itself, as batch entries; what `microrep cluster up` runs) or
    /// `handover` (the replication thread batches what the event loop handed it).
    #[arg(long, default_value = "direct", value_parser = ["handover", "direct"])]
    mode: String,
    /// Also run redis-benchmark (from redis-tools) at 1, 8 and 32 clients against both servers
    /// and a plain redis-server (if installed), taking turns.
    #[arg(long)]
    redis_benchmark: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// The largest value: a SET must fit one slot of the default log (1 KiB, header included).
pub(crate) const MAX_VALUE: u32 = 900;

/// Why the RESP benchmark failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RespBenchError {
    #[error("{addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("{addr}: {source}")]
    Call { addr: SocketAddr, source: RespError },
    /// The server answered with an error reply.
    #[error("{addr}: {reply}")]
    Refused { addr: SocketAddr, reply: String },
    #[error("recording a latency: {0}")]
    Record(#[from] hdrhistogram::RecordError),
    #[error("adding latencies: {0}")]
    Add(#[from] hdrhistogram::AdditionError),
    #[error("a client panicked")]
    Panicked,
    /// A member has no valid client address.
    #[error(transparent)]
    Member(#[from] microrep::ConfigError),
    /// The scratch directory or the configuration files could not be written.
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The unreplicated baseline server did not start.
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("running redis-benchmark (apt install redis-tools): {0}")]
    RedisBenchmark(std::io::Error),
}

/// Most redirects one request follows before the block fails.
const MAX_REDIRECTS: u32 = 3;

/// One client's share of a block: `n` commands one at a time, each timed, sent to `addr`; a
/// `-NOTLEADER` reply naming the leader sends the client there and the command again (it was not
/// executed), its latency counted from the first attempt.
fn time(addr: SocketAddr, command: &[u8], n: u64, value: &[u8], keys: &str) -> Result<Histogram<u64>, RespBenchError> {
    let connect = |addr| {
        Client::connect(addr, Duration::from_secs(10)).map_err(|source| RespBenchError::Connect { addr, source })
    };
    let (mut addr, mut client) = (addr, connect(addr)?);
    let mut h = hist::latency_ns();
    for i in 0..n {
        let key = format!("{keys}:{}", i % 1000);
        let t0 = Instant::now();
        let mut redirects = 0;
        loop {
            let reply = if command == b"SET" {
                client.call(&[b"SET", key.as_bytes(), value])
            } else {
                client.call(&[command, key.as_bytes()])
            }
            .map_err(|source| RespBenchError::Call { addr, source })?;
            match (reply.error(), &reply) {
                (Some(ErrorReply::NotLeader { addr: Some(leader), .. }), _) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    (addr, client) = (leader, connect(leader)?);
                }
                (_, Value::Error(reply)) => return Err(RespBenchError::Refused { addr, reply: reply.clone() }),
                _ => break,
            }
        }
        h.record(t0.elapsed().as_nanos().max(1) as u64)?;
    }
    Ok(h)
}

/// `n` commands split across `clients` concurrent clients (threads, each its own connection, one
/// command at a time), client `c` starting at `addrs[c % addrs.len()]` and following redirects
/// to the leader: every round trip's latency, and the block's wall-clock time.
pub(crate) fn timed_block(
    addrs: &[SocketAddr],
    command: &[u8],
    n: u64,
    clients: u16,
    value: &[u8],
) -> Result<(Histogram<u64>, Duration), RespBenchError> {
    let started = Instant::now();
    let shares: Vec<Result<Histogram<u64>, RespBenchError>> = std::thread::scope(|s| {
        let k = u64::from(clients);
        let workers: Vec<_> = (0..k)
            .map(|c| {
                let share = n / k + u64::from(c < n % k);
                let addr = addrs[c as usize % addrs.len()];
                s.spawn(move || time(addr, command, share, value, &format!("key{c}")))
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(Err(RespBenchError::Panicked))).collect()
    });
    let elapsed = started.elapsed();
    let mut total = hist::latency_ns();
    for h in shares {
        total.add(h?)?;
    }
    Ok((total, elapsed))
}

/// A replicated key-value cluster of `microrep node` processes on loopback, stopped and reaped
/// when dropped (remove its directory after dropping it).
pub(crate) struct RespCluster {
    _nodes: Vec<Guarded>,
    /// The nodes' stdout lines: kept open so that the nodes can print (they stop on a broken pipe).
    _lines: mpsc::Receiver<(u16, String)>,
    /// The leader's client address.
    pub(crate) leader: SocketAddr,
    /// Every member's client address.
    pub(crate) members: Vec<SocketAddr>,
}

impl RespCluster {
    /// Starts `replicas` members (client ports `base_port + i`; on tcp, fabric ports
    /// `base_port + 200 + i`) with their configs and shm segments in `dir`, and finds the leader.
    pub(crate) fn start(
        name: &str,
        dir: &std::path::Path,
        replicas: u16,
        base_port: u16,
        fabric: &str,
        mode: AttachMode,
    ) -> Result<Self, RespBenchError> {
        let mut cluster = ClusterConfig::local(name, replicas, base_port);
        cluster.shm_dir = Some(dir.to_path_buf());
        if fabric == "tcp" {
            cluster.fabric = FabricKind::Tcp;
            for m in &mut cluster.members {
                m.fabric = Some(format!("127.0.0.1:{}", base_port.saturating_add(200 + m.id)));
            }
        }
        let members: Vec<SocketAddr> = (0..replicas).map(|i| cluster.client_addr(i)).collect::<Result<_, _>>()?;
        let (tx, lines) = mpsc::channel();
        let node = |id| NodeConfig { mode, ..NodeConfig::new(id) };
        let nodes: Vec<Guarded> = write_configs(dir, &cluster, node)?
            .iter()
            .enumerate()
            .map(|(id, path)| {
                let a = ["node".as_ref(), "--config".as_ref(), path.as_os_str(), "--exit-with-parent".as_ref()];
                procs::spawn_tagged(&a, id as u16, &tx, Some("error"), Duration::ZERO)
            })
            .collect::<Result<_, _>>()?;
        // Leadership may move once more right after start (the lowest id becomes eligible
        // after its join grace): measure once one replica has led for 300 ms.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut leader = load::find_leader(&members, Duration::from_secs(60))?;
        let mut since = Instant::now();
        while since.elapsed() < Duration::from_millis(300) {
            std::thread::sleep(Duration::from_millis(20));
            let now = load::find_leader(&members, deadline.saturating_duration_since(Instant::now()))?;
            if now != leader {
                (leader, since) = (now, Instant::now());
            }
        }
        Ok(Self { _nodes: nodes, _lines: lines, leader: members[leader], members })
    }
}

/// Runs the benchmark.
pub(crate) fn resp(args: &RespArgs) -> Result<(), RespBenchError> {
    let name = format!("bench-resp-{}", std::process::id());
    let dir = ScratchDir::new(microrep_fabric::shm::ShmConfig::default_dir(&name))?;
    drive(args, &name, dir.path())
}

fn drive(args: &RespArgs, name: &str, dir: &std::path::Path) -> Result<(), RespBenchError> {
    let mode = if args.mode == "direct" { AttachMode::Direct } else { AttachMode::Handover };
    let cluster = RespCluster::start(name, dir, args.replicas, args.base_port, &args.fabric, mode)?;
    let leader = cluster.leader;
    let local = SocketAddr::from(([127, 0, 0, 1], args.base_port + 100));
    let baseline = KvNode::start_unreplicated(local, 1024)?;
    let value = vec![b'v'; args.value as usize];
    if !args.json {
        eprintln!(
            "microrep bench resp: {} replicas on {} (leader {leader}, {} mode), {} B values, {} client(s)",
            args.replicas, args.fabric, args.mode, args.value, args.clients
        );
        println!(
            "{:<5} {:<13} {:>10} {:>10} {:>10} {:>8}",
            "cmd", "server", "p50 us", "p99 us", "p99.9 us", "requests"
        );
    }
    for command in [&b"SET"[..], b"GET"] {
        // Alternate blocks so that both servers see the same machine conditions.
        let (mut ours, mut base) = (hist::latency_ns(), hist::latency_ns());
        while ours.len() < args.requests {
            let block = 1000.min(args.requests - ours.len());
            ours.add(timed_block(&[leader], command, block, args.clients, &value)?.0)?;
            base.add(timed_block(&[baseline.addr()], command, block, args.clients, &value)?.0)?;
        }
        for (server, h) in [("microrep", &ours), ("unreplicated", &base)] {
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            let cmd = String::from_utf8_lossy(command);
            if args.json {
                println!(
                    "{{\"bench\":\"resp\",\"fabric\":\"{}\",\"replicas\":{},\"clients\":{},\"value_bytes\":{},\"command\":\"{cmd}\",\"server\":\"{server}\",\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"requests\":{}}}",
                    args.fabric,
                    args.replicas,
                    args.clients,
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
        redis_benchmarks(args, leader, baseline.addr())?;
    }
    Ok(())
}

/// A plain redis-server beside the two, if one is installed; killed when dropped.
struct PlainRedis(std::process::Child);

impl Drop for PlainRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// redis-benchmark (SET and GET, 20,000 requests each) against the replicated leader, the
/// unreplicated server and a plain redis-server (BASE_PORT + 150, if `redis-server` is
/// installed) at 1, 8 and 32 clients, the servers taking turns at each count.
fn redis_benchmarks(args: &RespArgs, leader: SocketAddr, unreplicated: SocketAddr) -> Result<(), RespBenchError> {
    let plain_port = args.base_port + 150;
    let plain = Command::new("redis-server")
        .args(["--port", &plain_port.to_string(), "--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()
        .map(PlainRedis);
    let plain_addr = SocketAddr::from(([127, 0, 0, 1], plain_port));
    if plain.is_some() && load::find_leader(&[plain_addr], Duration::from_secs(10)).is_err() {
        eprintln!("microrep bench resp: the plain redis-server did not answer; its rows are left out");
    }
    let mut servers = vec![("microrep", leader), ("unreplicated", unreplicated)];
    if plain.is_some() {
        servers.push(("redis-server", plain_addr));
    } else {
        eprintln!("microrep bench resp: no redis-server installed; no plain redis-server rows");
    }
    for clients in [1u32, 8, 32] {
        for &(server, addr) in &servers {
            let out = Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-t", "set,get", "-n", "20000"])
                .args(["-c", &clients.to_string(), "-d", &args.value.to_string(), "-q"])
                .output()
                .map_err(RespBenchError::RedisBenchmark)?;
            let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            // Error replies and failed requests show as lines naming an error: counted beside
            // every row, never dropped.
            let errors = text.split(['\r', '\n']).filter(|l| l.to_ascii_lowercase().contains("error")).count();
            for line in text.split(['\r', '\n']).filter(|l| l.contains("requests per second") && !l.contains("rps=")) {
                if args.json {
                    println!(
                        "{{\"bench\":\"redis-benchmark\",\"server\":\"{server}\",\"clients\":{clients},\"result\":\"{}\",\"error_lines\":{errors}}}",
                        line.trim()
                    );
                } else {
                    println!(
                        "redis-benchmark {server:<12} {clients:>2} clients: {} (error lines: {errors})",
                        line.trim()
                    );
                }
            }
        }
    }
    Ok(())
}
