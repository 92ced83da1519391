//! The server copy of one wrap replica: started with the shim preloaded and a death signal tied
//! to the wrap node, stopped, and restarted empty or from a peer's state (`transfer`).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use microrep_interpose_wire::{ENV_DIR, ENV_SEED};

/// Why the server copy could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerError {
    /// A restart raced the replica's exit, which stopped the server for good.
    #[error("the replica is stopping")]
    Stopping,
    #[error("no server command")]
    NoCommand,
    #[error("server.log: {0}")]
    Log(std::io::Error),
    #[error("starting {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
}

/// How to start the server, and the running process.
#[derive(Debug)]
pub(crate) struct Server {
    command: Vec<String>,
    dir: PathBuf,
    preload: PathBuf,
    /// The cluster's random seed (64 hex digits), which every copy's shim draws from.
    seed: Option<String>,
    /// The running server; `None` once stopped for good (no restart after that).
    child: Mutex<Option<Child>>,
    stopped: std::sync::atomic::AtomicBool,
}

impl Server {
    /// Starts `command` in `dir` with `preload` preloaded, and `seed` for its randomness.
    pub(crate) fn start(
        command: Vec<String>,
        dir: PathBuf,
        preload: PathBuf,
        seed: Option<String>,
    ) -> Result<Self, ServerError> {
        let server = Self { command, dir, preload, seed, child: Mutex::new(None), stopped: Default::default() };
        let child = server.spawn()?;
        *server.lock() = Some(child);
        Ok(server)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The running server's process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// Whether the server exited, and how.
    pub(crate) fn exited(&self) -> Option<String> {
        match self.lock().as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Ok(None)) => None,
            Some(Err(e)) => Some(e.to_string()),
            None => Some("not running".into()),
        }
    }

    /// Stops the server (SIGTERM, SIGKILL after 5 s) and reaps it, for good: a later
    /// [`Server::restart`] (the replay agent's, racing the replica's exit) starts nothing.
    pub(crate) fn stop(&self) {
        let mut slot = self.lock();
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        if let Some(mut child) = slot.take() {
            stop(&mut child, Duration::from_secs(5));
        }
    }

    /// Kills the server at once (its state is about to be replaced: it must not save on the
    /// way out), runs `prepare` (which puts the new state in place), and starts it again.
    pub(crate) fn restart<E: From<ServerError>>(&self, prepare: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut slot = self.lock();
        if self.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ServerError::Stopping.into());
        }
        if let Some(mut child) = slot.take() {
            stop(&mut child, Duration::ZERO);
        }
        prepare()?;
        *slot = Some(self.spawn()?);
        Ok(())
    }

    fn spawn(&self) -> Result<Child, ServerError> {
        let (program, rest) = self.command.split_first().ok_or(ServerError::NoCommand)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(ServerError::Log)?;
        let log2 = log.try_clone().map_err(ServerError::Log)?;
        let preload = match std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
            Some(other) => {
                let mut joined = self.preload.clone().into_os_string();
                joined.push(":");
                joined.push(other);
                joined
            }
            None => self.preload.clone().into_os_string(),
        };
        let mut command = Command::new(program);
        command
            .args(rest)
            .current_dir(&self.dir)
            .env("LD_PRELOAD", preload)
            .env(ENV_DIR, &self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        if let Some(seed) = &self.seed {
            command.env(ENV_SEED, seed);
        }
        let parent = rustix::process::getpid();
        // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls
        // are allowed: prctl(PR_SET_PDEATHSIG) and getppid are one system call each. A parent
        // that died before the prctl would never send the signal: then the child gives up.
        unsafe {
            command.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                    .map_err(std::io::Error::from)?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("the wrap node exited"));
                }
                Ok(())
            });
        }
        command.spawn().map_err(|source| ServerError::Spawn { program: program.clone(), source })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SIGTERM, SIGKILL after `grace` (at once if zero), and reap.
fn stop(child: &mut Child, grace: Duration) {
    if !grace.is_zero() {
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}
