//! One replica of `microrep wrap` (`microrep wrap-replica`, started by the supervisor): a Mu
//! node whose state machine is the replay agent, the socket the shim talks to, and the server
//! copy, started with the shim preloaded. Its main thread watches leadership: a replica that
//! becomes leader first applies everything committed before it, then lets clients in.
#![allow(clippy::print_stdout)]

use std::hash::BuildHasher;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use microrep::{Config, ProposeError};
use microrep_interpose_wire::{CONTROL_BYTES, CONTROL_NAME, ENV_DIR, SOCKET_NAME};

use super::entry::{Origin, Tag, WrapApp};
use super::replay::{self, Control, Progress};
use super::shim::{self, Role, Shared};

/// Arguments of `microrep wrap-replica` (internal).
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicaArgs {
    /// This replica's node configuration.
    #[arg(long)]
    config: PathBuf,
    /// Working directory of the server copy; also holds the shim's socket and control page.
    #[arg(long)]
    dir: PathBuf,
    /// The port the server copy listens on (loopback is enough for the replay agent).
    #[arg(long)]
    port: u16,
    /// The shim library.
    #[arg(long)]
    preload: PathBuf,
    /// The server command, placeholders already substituted.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Runs the replica until SIGTERM, its server's exit, or a loss of leadership after serving.
pub(crate) fn run(args: &ReplicaArgs) -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| format!("prctl: {e}"))?;
    let config = Config::load(&args.config, &[]).map_err(|e| format!("{}: {e}", args.config.display()))?;
    let id = config.node.id;
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("creating {}: {e}", args.dir.display()))?;
    let control_path = args.dir.join(CONTROL_NAME);
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&control_path)
        .and_then(|f| f.set_len(CONTROL_BYTES as u64).map(|()| f))
        .map_err(|e| format!("{}: {e}", control_path.display()))?;
    let socket_path = args.dir.join(SOCKET_NAME);
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path).map_err(|e| format!("{}: {e}", socket_path.display()))?;
    let nonce = std::collections::hash_map::RandomState::new().hash_one((std::process::id(), microrep::monotonic_ns()));
    let me = Origin { replica: id, nonce };
    let (tx, rx) = mpsc::channel();
    let stranded = Arc::new(AtomicBool::new(false));
    let app = WrapApp { me, replay: tx, applied: 0, stranded: Arc::clone(&stranded) };
    let node = microrep::start(&config, app).map_err(|e| e.to_string())?;
    let progress = Arc::new(Progress::default());
    let agent = Arc::clone(&progress);
    let port = args.port;
    let agent_control = Control(control.try_clone().map_err(|e| e.to_string())?);
    std::thread::Builder::new()
        .name("wrap-replay".into())
        .spawn(move || replay::run(port, agent_control, &rx, &agent))
        .map_err(|e| e.to_string())?;
    let shared = Arc::new(Shared::new(node, me, progress));
    let handlers = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("wrap-shim".into())
        .spawn(move || shim::serve(&listener, &handlers))
        .map_err(|e| e.to_string())?;
    let stop = crate::node::stop_on_signal()?;
    let mut server = spawn_server(args)?;
    say(&format!(
        "replica {id}: server pid {}, port {}, log {}",
        server.id(),
        args.port,
        args.dir.join("server.log").display()
    ));
    let result = watch(&shared, &mut server, &stop, &stranded, &Control(control), args.port);
    stop_server(&mut server);
    let _ = std::fs::remove_file(&socket_path);
    let _ = std::fs::remove_file(&control_path);
    result
}

fn spawn_server(args: &ReplicaArgs) -> Result<Child, String> {
    let (program, rest) = args.command.split_first().ok_or("no server command")?;
    let log = std::fs::File::create(args.dir.join("server.log")).map_err(|e| format!("server.log: {e}"))?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let preload = match std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        Some(other) => {
            let mut joined = args.preload.clone().into_os_string();
            joined.push(":");
            joined.push(other);
            joined
        }
        None => args.preload.clone().into_os_string(),
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .current_dir(&args.dir)
        .env("LD_PRELOAD", preload)
        .env(ENV_DIR, &args.dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: prctl(PR_SET_PDEATHSIG) is one system call.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
    command.spawn().map_err(|e| format!("starting {program}: {e}"))
}

fn stop_server(server: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(server.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = server.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = server.kill();
    let _ = server.wait();
}

fn watch(
    shared: &Shared,
    server: &mut Child,
    stop: &AtomicBool,
    stranded: &AtomicBool,
    control: &Control,
    port: u16,
) -> Result<(), String> {
    let id = shared.me.replica;
    while !stop.load(Ordering::Acquire) {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(format!("replica {id}: the server exited ({status})"));
        }
        if let Some(why) = shared.node.fatal() {
            return Err(format!("replica {id}: the node stopped: {why}"));
        }
        if stranded.load(Ordering::Acquire) {
            return Err(format!(
                "replica {id}: fell behind the leader's recycled log; its server copy cannot be brought up to \
                 date without a state transfer (not implemented yet); stopping this copy"
            ));
        }
        if shared.diverged.load(Ordering::Acquire) {
            return Err(format!(
                "replica {id}: a client's input may commit without its server having seen it; stopping this copy"
            ));
        }
        let leading = shared.node.leader() == Some(shared.node.id());
        match shared.role() {
            Role::Following if leading && promote(shared, control)? => {
                say(&format!("replica {id}: leader, serving clients on port {port}"));
            }
            Role::Serving if !leading => {
                if shared.delivered.load(Ordering::Acquire) {
                    return Err(format!(
                        "replica {id}: lost leadership after serving clients; its server copy is stopped \
                         (restoring it from a healthy replica is not implemented yet)"
                    ));
                }
                shared.set_role(Role::Following);
                say(&format!("replica {id}: following"));
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Makes a new leader's server current before clients reach it: commits a barrier, waits
/// until the replay agent handled everything up to it and the server processed all replayed
/// input, then retires the old leader's connections through the log. False if leadership
/// moved on meanwhile.
fn promote(shared: &Shared, control: &Control) -> Result<bool, String> {
    shared.set_role(Role::Promoting);
    tracing::debug!("replica {}: leader; committing the promotion barrier", shared.me.replica);
    let deadline = Instant::now() + Duration::from_secs(30);
    let follow = || {
        shared.set_role(Role::Following);
        Ok(false)
    };
    let barrier = loop {
        match shared.propose(Tag::Barrier, 0, &[]) {
            Ok(reply) => break reply.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes),
            Err(ProposeError::NotLeader { .. }) => return follow(),
            Err(e) if Instant::now() > deadline => return Err(format!("the promotion barrier did not commit: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    tracing::info!("replica {}: promotion barrier at entry {barrier}", shared.me.replica);
    while shared.progress.applied.load(Ordering::Acquire) < barrier {
        if Instant::now() > deadline {
            return Err("the replay agent did not reach the promotion barrier within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    replay::server_caught_up(control, &shared.progress, Duration::from_secs(30))
        .map_err(|e| format!("promotion: the server did not consume the replayed input within 30 s: {e}"))?;
    tracing::info!("replica {}: the server consumed every replayed input", shared.me.replica);
    for conn in shared.progress.open_connections() {
        match shared.propose(Tag::Close, conn, &[]) {
            Ok(_) => {}
            Err(ProposeError::NotLeader { .. }) => return follow(),
            Err(e) => return Err(format!("retiring connection {conn}: {e}")),
        }
    }
    shared.set_role(Role::Serving);
    Ok(true)
}
