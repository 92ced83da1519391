//! `microrep wrap -- SERVER ARGS..`: transparent replication of an unmodified server. One Mu
//! replica process (`wrap/replica.rs`) per copy of the server, which it starts with the shim
//! (`libmicrorep_interpose.so`) preloaded; clients talk to the leader's copy, whose input is
//! committed through the log before the server sees it, and followers' copies are fed the same
//! input by their replay agents. See docs/WRAP.md.
#![allow(clippy::print_stdout)]

mod control;
mod entry;
mod input_clock;
mod output;
mod redis;
mod replay;
pub(crate) mod replica;
mod server;
mod shim;
mod transfer;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use microrep::ConfigError;
use microrep::config::{AttachMode, ClusterConfig, NodeConfig};
use microrep::idle::IdlePolicy;
use microrep_fabric::FabricError;

use crate::node::SignalHandlerError;

/// Arguments of `microrep wrap`.
#[derive(Debug, clap::Args)]
pub(crate) struct WrapArgs {
    /// Copies of the server (Mu replicas).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=255))]
    replicas: u16,
    /// Port of replica 0's server; replica i gets BASE_PORT + i in place of `{port}`.
    #[arg(long, default_value_t = 6380, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    base_port: u16,
    /// Scratch directory (replicas' working directories, shm segments); default: a fresh one
    /// under /dev/shm, removed on exit.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The shim library (default: libmicrorep_interpose.so beside the microrep binary, or in
    /// ../lib/ from it).
    #[arg(long)]
    preload: Option<PathBuf>,
    /// Overrides a key of every replica's configuration (docs/CONFIG.md), e.g.
    /// `--set cluster.timing.heartbeat_us=20000`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// How a copy that needs the server's state (restarted, or behind the recycled log) gets
    /// it from a peer; default: `redis` for redis-server, else `none` (docs/WRAP.md).
    #[arg(long, value_enum)]
    state_transfer: Option<transfer::Hook>,
    /// Output checking: followers compare what their copy answers with what the leader's
    /// answered (CRC-64 over 4 KiB buckets, through the log) and report a difference
    /// (`report`), or also rebuild the copy that differs (`repair`). Servers whose replies
    /// depend on time, randomness or each copy's own settings differ without diverging
    /// (docs/WRAP.md, "Output checking").
    #[arg(long, value_enum, default_value = "report")]
    output_check: output::OutputCheck,
    /// Serve each replica's Prometheus metrics (docs/METRICS.md): replica i on
    /// 127.0.0.1:(METRICS_BASE_PORT + i). `microrep_commit_latency_seconds` on the leader is the
    /// time each intercepted input spent in consensus.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1024..))]
    metrics_base_port: Option<u16>,
    /// Write the configurations into `--dir` and print each replica's `microrep wrap-replica`
    /// command as one JSON object a line (`id`, `port`, `dir`, `program`, `args`) instead of
    /// starting them: for a harness that starts, kills and restarts the replicas itself
    /// (`microrep-faults --target wrap-redis`). Nothing is removed on exit.
    #[arg(long, requires = "dir")]
    print_replicas: bool,
    /// The server command; `{port}` becomes the replica's port and `{dir}` its working
    /// directory.
    #[arg(last = true, required = true, value_name = "SERVER ARGS")]
    command: Vec<String>,
}

/// Why `microrep wrap` could not start its replicas, or stopped supervising them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WrapError {
    #[error("no server command after --")]
    NoCommand,
    #[error(
        "the server command must contain {{port}} (each replica's server needs its own port), \
         e.g. `microrep wrap -- redis-server --port {{port}}`"
    )]
    NoPort,
    /// A path (with '/') that is not an executable file.
    #[error("server binary {0} not found")]
    NoProgram(String),
    #[error("server binary {0} not found in PATH")]
    NotInPath(String),
    #[error("locating microrep: {0}")]
    Exe(std::io::Error),
    #[error(
        "the shim {} does not exist: build it with `cargo build --release -p microrep-interpose` \
         (or name it with --preload)",
        .0.display()
    )]
    NoShim(PathBuf),
    #[error("{}: {source}", path.display())]
    Shim { path: PathBuf, source: std::io::Error },
    #[error("--base-port {base_port} leaves no room for {replicas} replicas")]
    PortRange { base_port: u16, replicas: u16 },
    #[error("port {port} is not free ({source}); choose others with --base-port")]
    PortTaken { port: u16, source: std::io::Error },
    #[error("--metrics-base-port {metrics} leaves no room for {replicas} replicas")]
    MetricsPortRange { metrics: u16, replicas: u16 },
    #[error(
        "--metrics-base-port {metrics} overlaps the servers' ports {base_port}..{}: choose ports apart",
        base_port + replicas
    )]
    MetricsOverlap { metrics: u16, base_port: u16, replicas: u16 },
    #[error("metrics port {port} is not free ({source}); choose others with --metrics-base-port")]
    MetricsPortTaken { port: u16, source: std::io::Error },
    #[error("--set: {0}")]
    Override(ConfigError),
    #[error("writing {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("creating {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    /// The shm segments a previous run left could not be removed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(transparent)]
    Signal(#[from] SignalHandlerError),
    #[error("starting replica {id}: {source}")]
    Start { id: u16, source: std::io::Error },
    #[error("restarting replica {id}: {source}")]
    Restart { id: u16, source: std::io::Error },
}

/// Removes what `microrep wrap` created when dropped: the whole scratch directory if it chose
/// it, else the shm segments and node configurations it put into the caller's directory.
struct Scratch {
    dir: PathBuf,
    ours: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.ours {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        let _ = std::fs::remove_dir_all(self.dir.join("fabric"));
        let configs = std::fs::read_dir(&self.dir).into_iter().flatten().flatten();
        for entry in configs.filter(|e| e.file_name().to_string_lossy().ends_with(".toml")) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A replica process: SIGTERM, then SIGKILL after 10 s, and reaped, when dropped.
struct Replica {
    id: u16,
    child: Child,
    command: Command,
    started: Instant,
    /// How long to wait before the next restart (doubles while restarts fail quickly).
    backoff: Duration,
    /// When an exited replica starts again.
    restart_at: Option<Instant>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        crate::procs::terminate(&mut self.child, Duration::from_secs(10));
    }
}

/// Finds `program` as the shell would: a path if it contains '/', else in `PATH`.
fn find_program(program: &str) -> Result<PathBuf, WrapError> {
    let executable = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&match p.metadata() {
            Ok(m) if m.is_file() => m.permissions(),
            _ => return false,
        }) & 0o111
            != 0
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if executable(&path) { Ok(path) } else { Err(WrapError::NoProgram(program.into())) };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| WrapError::NotInPath(program.into()))
}

/// The shim beside the `microrep` binary (a cargo build), or in `../lib/` from it (the release
/// layout of scripts/release.sh); the former when neither exists, for the error to name.
fn default_preload() -> Result<PathBuf, WrapError> {
    let exe = std::env::current_exe().map_err(WrapError::Exe)?;
    let beside = exe.with_file_name(SHIM);
    let in_lib = exe.parent().and_then(Path::parent).map(|prefix| prefix.join("lib").join(SHIM));
    Ok(in_lib.filter(|lib| !beside.is_file() && lib.is_file()).unwrap_or(beside))
}

/// The shim's file name.
const SHIM: &str = "libmicrorep_interpose.so";

/// The server command of replica `id`, placeholders substituted.
fn command_for(template: &[String], port: u16, dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    template.iter().map(|a| a.replace("{port}", &port.to_string()).replace("{dir}", &dir)).collect()
}

/// Checks the arguments before anything starts; returns the shim's path.
fn validate(args: &WrapArgs) -> Result<PathBuf, WrapError> {
    let program = args.command.first().ok_or(WrapError::NoCommand)?;
    if !args.command.iter().any(|a| a.contains("{port}")) {
        return Err(WrapError::NoPort);
    }
    find_program(program)?;
    let preload = match &args.preload {
        Some(p) => p.clone(),
        None => default_preload()?,
    };
    if !preload.is_file() {
        return Err(WrapError::NoShim(preload));
    }
    let preload = preload.canonicalize().map_err(|source| WrapError::Shim { path: preload.clone(), source })?;
    if args.base_port.checked_add(args.replicas).is_none() {
        return Err(WrapError::PortRange { base_port: args.base_port, replicas: args.replicas });
    }
    for i in 0..args.replicas {
        let port = args.base_port + i;
        TcpListener::bind(("127.0.0.1", port)).map_err(|source| WrapError::PortTaken { port, source })?;
    }
    if let Some(metrics) = args.metrics_base_port {
        check_metrics_ports(metrics, args.base_port, args.replicas)?;
        for i in 0..args.replicas {
            let port = metrics + i;
            TcpListener::bind(("127.0.0.1", port)).map_err(|source| WrapError::MetricsPortTaken { port, source })?;
        }
    }
    Ok(preload)
}

/// Replica i serves its metrics on `metrics + i`: the range must fit and miss the servers'.
fn check_metrics_ports(metrics: u16, base_port: u16, replicas: u16) -> Result<(), WrapError> {
    let end = metrics.checked_add(replicas).ok_or(WrapError::MetricsPortRange { metrics, replicas })?;
    if metrics < base_port + replicas && base_port < end {
        return Err(WrapError::MetricsOverlap { metrics, base_port, replicas });
    }
    Ok(())
}

/// Writes each replica's configuration (`node-ID.toml` in `dir`), with `overrides` applied.
/// Above this many replicas, replication threads park as soon as a poll finds nothing to do.
const LARGE_GROUP: usize = 9;

fn write_configs(
    dir: &Path,
    cluster: &ClusterConfig,
    metrics_base_port: Option<u16>,
    overrides: &[String],
) -> Result<Vec<PathBuf>, WrapError> {
    (0..cluster.members.len() as u16)
        .map(|id| {
            let mut node = NodeConfig { mode: AttachMode::Direct, ..NodeConfig::new(id) };
            node.metrics = metrics_base_port.map(|base| format!("127.0.0.1:{}", base + id));
            if cluster.members.len() > LARGE_GROUP {
                // Each replica's replication thread spins and yields thousands of times before
                // it parks: with tens of replicas on a few cores those yields are the machine's
                // work. Followers are off the commit path (the leader WRITEs into their logs),
                // so they park at once.
                node.replication.idle = IdlePolicy::Park;
                node.replication.park_us = 1000;
            }
            let text = microrep::Config { cluster: cluster.clone(), node }.to_toml();
            let config = microrep::Config::parse(&text, overrides).map_err(WrapError::Override)?;
            let path = dir.join(format!("node-{id}.toml"));
            match std::fs::write(&path, config.to_toml()) {
                Ok(()) => Ok(path),
                Err(source) => Err(WrapError::Write { path, source }),
            }
        })
        .collect()
}

/// Runs `microrep wrap`.
pub(crate) fn run(args: &WrapArgs) -> Result<(), WrapError> {
    let preload = validate(args)?;
    let name = format!("wrap-{}", std::process::id());
    let (dir, ours) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (microrep_fabric::shm::ShmConfig::default_dir(&name), true),
    };
    std::fs::create_dir_all(&dir).map_err(|source| WrapError::CreateDir { path: dir.clone(), source })?;
    let scratch = (!args.print_replicas).then(|| Scratch { dir: dir.clone(), ours });
    let fabric_dir = dir.join("fabric");
    microrep_fabric::shm::ShmFabric::remove_stale(&fabric_dir)?;
    let mut cluster = ClusterConfig::local(&name, args.replicas, args.base_port);
    cluster.shm_dir = Some(fabric_dir);
    // One intercepted read (at most 4 KiB) per entry, with room for the entry's header. Mu
    // recycles the log only up to its last snapshot, and a replica behind the recycled log
    // would need the server's state (not transferable yet): a long log, recycled in halves,
    // lets a replica that was descheduled for a while catch up by copy.
    cluster.log.slot_bytes = 8192;
    cluster.log.slots = 8192;
    cluster.log.snapshot_every = 4096;
    // Failure detection for copies of a server sharing a small, busy machine with their
    // replicas: a replica silent for about 700 ms (not 13 ms) is suspected. A false suspicion
    // costs a wrapped cluster its leader's copy (docs/WRAP.md), so stability comes first: at
    // 5 ms the leader of Redis's suite was deposed within seconds at load averages of 9 to 16,
    // at 20 ms after 22 s of the whole suite.
    cluster.timing.heartbeat_us = 50_000;
    cluster.timing.fate_share_timeout_us = 250_000;
    cluster.timing.fate_share_cooldown_us = 1_000_000;
    cluster.timing.permission_timeout_us = 25_000;
    cluster.timing.round_timeout_us = 50_000;
    // A follower that the leader recycled past would need a state transfer: the leader
    // recycles only what every live follower applied, and leaves one behind only when the log
    // is full and it applied nothing for 150 ms (below the 250 ms of fate sharing).
    cluster.timing.recycle_wait_us = 150_000;
    let configs = write_configs(&dir, &cluster, args.metrics_base_port, &args.overrides)?;
    let commands = replica_commands(args, &dir, &configs, &preload)?;
    if args.print_replicas {
        for (id, (port, workdir, command)) in commands.iter().enumerate() {
            let line = serde_json::json!({
                "id": id,
                "port": port,
                "dir": workdir,
                "program": command.get_program().to_string_lossy(),
                "args": command.get_args().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
            });
            println!("{line}");
        }
        return Ok(());
    }
    let stop = crate::node::stop_flag()?;
    println!(
        "microrep wrap: {} replicas of `{}` on the shm fabric, files in {}",
        args.replicas,
        args.command.join(" "),
        dir.display()
    );
    for warning in server_warnings(&args.command) {
        eprintln!("microrep wrap: warning: {warning}");
    }
    let mut replicas = Vec::new();
    for (id, (port, workdir, mut command)) in commands.into_iter().enumerate() {
        let id = id as u16;
        let child = command.spawn().map_err(|source| WrapError::Start { id, source })?;
        println!("replica {id}: pid {}, port {port}, dir {}", child.id(), workdir.display());
        if let Some(base) = args.metrics_base_port {
            println!("replica {id}: metrics at http://127.0.0.1:{}/metrics", base + id);
        }
        let (started, backoff) = (Instant::now(), Duration::from_secs(1));
        replicas.push(Replica { id, child, command, started, backoff, restart_at: None });
    }
    println!("status: microrep status --config {}", dir.join("node-0.toml").display());
    let result = supervise(&mut replicas, &stop);
    println!("stopping");
    drop(replicas);
    drop(scratch);
    result
}

/// Each replica's `microrep wrap-replica` command, with its port and working directory
/// (created).
fn replica_commands(
    args: &WrapArgs,
    dir: &Path,
    configs: &[PathBuf],
    preload: &Path,
) -> Result<Vec<(u16, PathBuf, Command)>, WrapError> {
    let hook = args.state_transfer.unwrap_or_else(|| default_hook(&args.command));
    let exe = std::env::current_exe().map_err(WrapError::Exe)?;
    let seed = write_seed(dir)?;
    let mut commands = Vec::new();
    for (id, config) in configs.iter().enumerate() {
        let id = id as u16;
        let port = args.base_port + id;
        let workdir = dir.join(format!("replica-{id}"));
        std::fs::create_dir_all(&workdir).map_err(|source| WrapError::CreateDir { path: workdir.clone(), source })?;
        let mut command = Command::new(&exe);
        command
            .arg("wrap-replica")
            .arg("--config")
            .arg(config)
            .arg("--dir")
            .arg(&workdir)
            .args(["--port", &port.to_string()])
            .arg("--preload")
            .arg(preload)
            .arg("--state-transfer")
            .arg(match hook {
                transfer::Hook::Redis => "redis",
                transfer::Hook::None => "none",
            })
            .arg("--random-seed")
            .arg(&seed)
            .arg("--output-check")
            .arg(match args.output_check {
                output::OutputCheck::Off => "off",
                output::OutputCheck::Report => "report",
                output::OutputCheck::Repair => "repair",
            })
            .arg("--")
            .args(command_for(&args.command, port, &workdir))
            .stdin(Stdio::null());
        commands.push((port, workdir, command));
    }
    Ok(commands)
}

/// The state socket of replica `id` of a wrapped cluster whose configuration file is `config`
/// (`microrep wrap` writes `node-ID.toml` beside each replica's `replica-ID/`), if it exists.
pub(crate) fn state_socket(config: &Path, id: u16) -> Option<PathBuf> {
    let path = config.parent()?.join(format!("replica-{id}")).join(transfer::SOCKET_NAME);
    path.exists().then_some(path)
}

/// A wrap replica's status, asked on its state socket: one line of JSON (its node's status,
/// the replica's role, whether its copy is current, and what output checking found).
pub(crate) fn ask_status(socket: &Path) -> std::io::Result<String> {
    use std::io::{BufRead, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"status\n")?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line)?;
    Ok(line)
}

/// Draws the cluster's random seed from the kernel and writes it, as 64 hexadecimal digits,
/// to `DIR/random-seed` (readable by its owner only): every copy draws its randomness from it.
fn write_seed(dir: &Path) -> Result<PathBuf, WrapError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("random-seed");
    let write = |source| WrapError::Write { path: path.clone(), source };
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(write)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(hex.as_bytes()))
        .map_err(write)?;
    Ok(path)
}

/// The file name of the server program.
fn program_name(command: &[String]) -> String {
    command
        .first()
        .map(|p| Path::new(p).file_name().unwrap_or_default().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The state-transfer hook for `command`: Redis's for redis-server, else none.
fn default_hook(command: &[String]) -> transfer::Hook {
    if program_name(command) == "redis-server" { transfer::Hook::Redis } else { transfer::Hook::None }
}

/// Options of a known server without which its copies may diverge (docs/WRAP.md, memcached).
fn server_warnings(command: &[String]) -> Vec<&'static str> {
    if program_name(command) != "memcached" {
        return Vec::new();
    }
    let args = command.get(1..).unwrap_or_default();
    let one_thread = args.windows(2).any(|w| matches!(w[0].as_str(), "-t" | "--threads") && w[1] == "1")
        || args.iter().any(|a| a == "-t1" || a == "--threads=1");
    let per_event = args.iter().any(|a| a.starts_with("-R") || a.starts_with("--max-reqs-per-event"));
    let mut warnings = Vec::new();
    if !one_thread {
        warnings.push("memcached reads clients on several worker threads unless given `-t 1`: the copies may diverge");
    }
    if !per_event {
        warnings.push(
            "memcached serves at most 20 requests of a connection before turning to others (`-R`), in an order the \
             log does not record: with pipelining clients on several connections the copies may diverge; give it \
             `-R 100000`",
        );
    }
    warnings
}

/// Restarts replicas that exit (a copy restarted empty gets the server's state through the
/// log or from a peer), after a pause that doubles, up to 30 s, while a replica keeps exiting
/// within a minute of its start; until Ctrl-C / SIGTERM.
fn supervise(replicas: &mut [Replica], stop: &AtomicBool) -> Result<(), WrapError> {
    while !stop.load(Ordering::Acquire) {
        for r in replicas.iter_mut() {
            if let (None, Ok(Some(status))) = (r.restart_at, r.child.try_wait()) {
                if r.started.elapsed() > Duration::from_secs(60) {
                    r.backoff = Duration::from_secs(1);
                }
                println!("replica {} (pid {}) exited ({status}); restarting it in {:?}", r.id, r.child.id(), r.backoff);
                r.restart_at = Some(Instant::now() + r.backoff);
                r.backoff = (r.backoff * 2).min(Duration::from_secs(30));
            }
            if r.restart_at.is_some_and(|at| Instant::now() >= at) {
                r.restart_at = None;
                r.started = Instant::now();
                match r.command.spawn() {
                    Ok(child) => {
                        println!("replica {}: restarted, pid {}", r.id, child.id());
                        r.child = child;
                    }
                    Err(source) => return Err(WrapError::Restart { id: r.id, source }),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_substituted() {
        let t: Vec<String> = ["redis-server", "--port", "{port}", "--dir", "{dir}"].map(String::from).to_vec();
        assert_eq!(command_for(&t, 6381, Path::new("/x/r1")), ["redis-server", "--port", "6381", "--dir", "/x/r1"]);
    }

    #[test]
    fn memcached_without_one_thread_or_a_large_batch_is_warned_about() {
        let command = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(server_warnings(&command(&["/usr/bin/memcached", "-p", "{port}"])).len(), 2);
        let warned = server_warnings(&command(&["memcached", "-t", "1", "-p", "{port}"]));
        assert!(warned.len() == 1 && warned[0].contains("-R 100000"), "{warned:?}");
        assert!(server_warnings(&command(&["memcached", "-t", "1", "-R", "100000"])).is_empty());
        assert!(server_warnings(&command(&["redis-server", "--port", "{port}"])).is_empty());
    }

    #[test]
    fn metrics_ports_must_fit_and_miss_the_servers_ports() {
        assert!(check_metrics_ports(9100, 6380, 3).is_ok());
        assert!(check_metrics_ports(6383, 6380, 3).is_ok(), "just above the servers' ports");
        assert!(check_metrics_ports(6377, 6380, 3).is_ok(), "just below");
        for overlapping in [6378, 6380, 6382] {
            let e = check_metrics_ports(overlapping, 6380, 3).expect_err("overlaps");
            assert_eq!(
                e.to_string(),
                format!("--metrics-base-port {overlapping} overlaps the servers' ports 6380..6383: choose ports apart")
            );
        }
        let e = check_metrics_ports(65534, 6380, 3).expect_err("past the last port");
        assert_eq!(e.to_string(), "--metrics-base-port 65534 leaves no room for 3 replicas");
    }

    #[test]
    fn missing_programs_are_named() {
        let e = find_program("no-such-server-xyz").expect_err("absent");
        assert_eq!(e.to_string(), "server binary no-such-server-xyz not found in PATH");
        assert!(find_program("/bin/sh").is_ok());
        let e = find_program("/nonexistent/sh").expect_err("absent");
        assert_eq!(e.to_string(), "server binary /nonexistent/sh not found");
    }
}
