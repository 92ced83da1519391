//! Replica processes of the benchmarks that drive Mu's core directly (one thread polling both
//! planes, as the paper's measurements do), and how the CLI starts its child processes (held by
//! the test kit's guards: stopped and reaped when dropped).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use microrep_core::mu::{self, MuConfig, Role, StateMachine};
use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::tcp::{TcpConfig, TcpFabric};
use microrep_fabric::{FabricError, NodeId};
use microrep_testkit::KitError;
use microrep_testkit::child::Guarded;

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
    pub(crate) fn start_fabric(&self, cfg: &MuConfig) -> Result<ShmFabric, FabricError> {
        let shm = ShmConfig::new(&self.dir, NodeId(self.id), self.replicas, &mu::regions(cfg));
        ShmFabric::start(shm)
    }

    /// Starts this replica's tcp fabric node on loopback, from `base_port`.
    pub(crate) fn start_tcp(&self, cfg: &MuConfig, base_port: u16) -> Result<TcpFabric, FabricError> {
        let addr = |i: u16| std::net::SocketAddr::from(([127, 0, 0, 1], base_port.saturating_add(i)));
        let peers = (0..self.replicas).filter(|&p| p != self.id).map(|p| (NodeId(p), addr(p)));
        let tcp =
            TcpConfig::new("bench", NodeId(self.id), self.replicas, addr(self.id), &mu::regions(cfg)).with_peers(peers);
        TcpFabric::start(tcp)
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
        self.crc = microrep_fabric::checksum::crc32c_append(self.crc, command);
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.commands.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    fn restore(&mut self, _index: u64, s: &[u8]) -> Result<(), mu::RestoreError> {
        let bytes: [u8; 12] =
            s.try_into().map_err(|_| mu::RestoreError::Length { got: s.len(), expected: "12 bytes" })?;
        let (commands, crc) = bytes.split_at(8);
        self.commands = u64::from_le_bytes(commands.try_into().expect("8 bytes"));
        self.crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
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

/// Stops a child: SIGTERM, then SIGKILL after a grace; reaps it (`wrap` uses it).
pub(crate) use microrep_testkit::child::terminate;

/// Why a child `microrep` process could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    #[error("locating microrep: {0}")]
    LocateExe(std::io::Error),
    #[error("replica {id}: {source}")]
    Replica { id: u16, source: KitError },
    #[error("process {id}: {source}")]
    Process { id: u16, source: KitError },
}

/// Starts replica `id` of `replicas` as `microrep SUBCOMMAND --id .. --replicas .. --dir ..
/// EXTRA..`, with piped stdin and stdout; it is SIGKILLed and reaped when dropped.
pub(crate) fn spawn_replica(
    subcommand: &str,
    id: u16,
    replicas: u16,
    dir: &Path,
    extra: &[String],
) -> Result<Guarded, SpawnError> {
    let exe = std::env::current_exe().map_err(SpawnError::LocateExe)?;
    let mut command = Command::new(exe);
    command
        .args([subcommand, "--id", &id.to_string(), "--replicas", &replicas.to_string()])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    Guarded::spawn(&mut command, Duration::ZERO).map_err(|source| SpawnError::Replica { id, source })
}

/// Starts `microrep ARGS..` with piped stdin and stdout; its stdout lines are sent to `lines`
/// tagged with `id`. `log` sets its `RUST_LOG`. Dropping it gives it `grace` after SIGTERM.
pub(crate) fn spawn_tagged(
    args: &[&std::ffi::OsStr],
    id: u16,
    lines: &std::sync::mpsc::Sender<(u16, String)>,
    log: Option<&str>,
    grace: Duration,
) -> Result<Guarded, SpawnError> {
    let exe = std::env::current_exe().map_err(SpawnError::LocateExe)?;
    let mut command = Command::new(exe);
    if let Some(filter) = log {
        command.env("RUST_LOG", filter);
    }
    command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = Guarded::spawn(&mut command, grace).map_err(|source| SpawnError::Process { id, source })?;
    child.forward_lines(id, lines).map_err(|source| SpawnError::Process { id, source })?;
    Ok(child)
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
    fn restore(&mut self, s: &[u8]) -> Result<(), microrep::RestoreError> {
        let bytes = s.try_into().map_err(|_| microrep::RestoreError::Length { got: s.len(), expected: "8 bytes" })?;
        self.0 = u64::from_le_bytes(bytes);
        Ok(())
    }
}
