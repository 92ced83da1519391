//! Replica processes of the benchmarks that drive Mu's core directly (one thread polling both
//! planes, as the paper's measurements do), and the helpers that start and reap them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use microrep_core::mu::{self, MuConfig, Role, StateMachine};
use microrep_fabric::NodeId;
use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::tcp::{TcpConfig, TcpFabric};

/// Where a replica process finds its cluster (internal arguments).
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicaArgs {
    #[arg(long)]
    pub(crate) dir: PathBuf,
    #[arg(long)]
    pub(crate) id: u16,
    #[arg(long)]
    pub(crate) replicas: u16,
    /// Use the tcp fabric on loopback, replica i listening on TCP_BASE_PORT + i.
    #[arg(long)]
    pub(crate) tcp_base_port: Option<u16>,
}

impl ReplicaArgs {
    /// Starts this replica's shm fabric node with the regions of `cfg`.
    pub(crate) fn start_fabric(&self, cfg: &MuConfig) -> Result<ShmFabric, String> {
        let shm = ShmConfig::new(&self.dir, NodeId(self.id), self.replicas, &mu::regions(cfg));
        ShmFabric::start(shm).map_err(|e| e.to_string())
    }

    /// Starts this replica's tcp fabric node on loopback, from `base_port`.
    pub(crate) fn start_tcp(&self, cfg: &MuConfig, base_port: u16) -> Result<TcpFabric, String> {
        let addr = |i: u16| std::net::SocketAddr::from(([127, 0, 0, 1], base_port.saturating_add(i)));
        let peers = (0..self.replicas).filter(|&p| p != self.id).map(|p| (NodeId(p), addr(p)));
        let tcp =
            TcpConfig::new("bench", NodeId(self.id), self.replicas, addr(self.id), &mu::regions(cfg)).with_peers(peers);
        TcpFabric::start(tcp).map_err(|e| e.to_string())
    }
}

/// Mu settings for processes sharing a small machine: a heartbeat every millisecond (failure
/// declared after about six silent ones), so that descheduling does not look like failure.
pub(crate) fn config(node: NodeId, replicas: u16) -> MuConfig {
    MuConfig {
        log_slots: 4096,
        snapshot_every: 1024,
        heartbeat_period_ns: 1_000_000,
        fate_share_timeout_ns: 50_000_000,
        fate_share_cooldown_ns: 200_000_000,
        permission_timeout_ns: 5_000_000,
        round_timeout_ns: 10_000_000,
        recycle_period_ns: 1_000_000,
        lag_check_period_ns: 5_000_000,
        ..MuConfig::new(node, replicas)
    }
}

/// The demo application: counts commands and folds them into a CRC32C digest.
#[derive(Debug, Default)]
pub(crate) struct Digest {
    commands: u64,
    crc: u32,
}

impl StateMachine for Digest {
    fn apply(&mut self, _index: u64, command: &[u8]) {
        self.commands += 1;
        self.crc = crc32c::crc32c_append(self.crc, command);
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.commands.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    fn restore(&mut self, _index: u64, s: &[u8]) -> Result<(), String> {
        let bytes: [u8; 12] = s.try_into().map_err(|_| format!("snapshot of {} bytes, expected 12", s.len()))?;
        self.commands = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| "short")?);
        self.crc = u32::from_le_bytes(bytes[8..].try_into().map_err(|_| "short")?);
        Ok(())
    }
}

/// The poll loop's idle policy: a leader yields (others may run, it comes back at once); a
/// follower, which Mu's one-sided writes do not need on the critical path, sleeps briefly,
/// well within a heartbeat period. Several replicas share two cores here, so nobody spins.
pub(crate) fn pause_between_polls(status: &mu::Status) {
    if status.role == Role::Follower {
        std::thread::sleep(Duration::from_micros(50));
    } else {
        std::thread::yield_now();
    }
}

/// A child process killed and reaped when dropped.
pub(crate) struct Reaper(pub(crate) Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts replica `id` of `replicas` as `microrep SUBCOMMAND --id .. --replicas .. --dir ..
/// EXTRA..`, with piped stdin and stdout.
pub(crate) fn spawn_replica(
    subcommand: &str,
    id: u16,
    replicas: u16,
    dir: &Path,
    extra: &[String],
) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating microrep: {e}"))?;
    Command::new(exe)
        .args([subcommand, "--id", &id.to_string(), "--replicas", &replicas.to_string()])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting replica {id}: {e}"))
}

/// Starts `microrep ARGS..` with piped stdin and stdout; its stdout lines are sent to `lines`
/// tagged with `id` (by a thread that ends with the process). `log` sets its `RUST_LOG`.
/// Stops `child`: SIGTERM, then SIGKILL if it has not exited within `grace`; reaps it either way.
pub(crate) fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub(crate) fn spawn_tagged(
    args: &[&std::ffi::OsStr],
    id: u16,
    lines: &std::sync::mpsc::Sender<(u16, String)>,
    log: Option<&str>,
) -> Result<Child, String> {
    use std::io::BufRead;
    let exe = std::env::current_exe().map_err(|e| format!("locating microrep: {e}"))?;
    let mut command = Command::new(exe);
    if let Some(filter) = log {
        command.env("RUST_LOG", filter);
    }
    let mut child = command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting process {id}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let tx = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((id, line)).is_err() {
                break;
            }
        }
    });
    Ok(child)
}

/// Writes one config file per member of `cluster` into `dir` (`node-ID.toml`).
pub(crate) fn write_configs(
    dir: &Path,
    cluster: &microrep::config::ClusterConfig,
    node: impl Fn(u16) -> microrep::config::NodeConfig,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    (0..cluster.members.len() as u16)
        .map(|id| {
            let config = microrep::Config { cluster: cluster.clone(), node: node(id) };
            let path = dir.join(format!("node-{id}.toml"));
            std::fs::write(&path, config.to_toml()).map_err(|e| format!("writing {}: {e}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// The replicated application of the runtime benchmarks: counts commands, replies nothing.
#[derive(Debug, Default)]
pub(crate) struct Count(u64);

impl microrep::Apply for Count {
    fn apply(&mut self, _index: microrep::Index, _command: &[u8], _reply: &mut Vec<u8>) {
        self.0 += 1;
    }
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
    }
    fn restore(&mut self, s: &[u8]) -> Result<(), String> {
        self.0 = u64::from_le_bytes(s.try_into().map_err(|_| "bad snapshot")?);
        Ok(())
    }
}
