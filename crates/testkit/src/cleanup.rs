//! Killing every child and removing every scratch directory on every exit path: the end of a
//! scope ([`Cleanup`] is a `Drop` guard), a watchdog (it can run a clone of the guard without
//! taking any lock a stuck thread might hold), and SIGINT, SIGTERM or SIGHUP
//! ([`clean_up_on_signals`]).

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rustix::process::{Pid, Signal, kill_process};

use crate::KitError;

/// The pids of a set of children not yet reaped.
#[derive(Clone, Debug, Default)]
pub struct PidRegistry(Arc<Mutex<BTreeSet<i32>>>);

impl PidRegistry {
    /// The registry of children that belong to no [`Cleanup`] of their own ([`crate::child`]);
    /// the signal handler kills them too.
    pub fn global() -> &'static Self {
        static GLOBAL: OnceLock<PidRegistry> = OnceLock::new();
        GLOBAL.get_or_init(Self::default)
    }

    pub(crate) fn add(&self, pid: i32) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(pid);
    }

    pub(crate) fn remove(&self, pid: i32) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&pid);
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, pid: i32) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).contains(&pid)
    }

    /// How many children are registered.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no child is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// SIGKILLs every registered child (stopped ones too: SIGKILL needs no SIGCONT). Their
    /// owners still reap them.
    pub fn kill_all(&self) {
        let pids: Vec<i32> = self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().copied().collect();
        for pid in pids.into_iter().filter_map(Pid::from_raw) {
            // A child that exited meanwhile is simply gone.
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// Something else to undo at cleanup (e.g. delete a network namespace).
pub type Hook = Arc<dyn Fn() + Send + Sync>;

/// Kills every registered child, removes the directories and runs the hooks when dropped or
/// [run](Cleanup::run). Cloning it gives a guard for the same things (for a watchdog).
#[derive(Clone, Default)]
pub struct Cleanup {
    /// The children to kill.
    pub pids: PidRegistry,
    /// The directories to remove.
    pub dirs: Vec<PathBuf>,
    /// What else to undo, after the kills and removals.
    pub hooks: Vec<Hook>,
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cleanup")
            .field("pids", &self.pids)
            .field("dirs", &self.dirs)
            .field("hooks", &self.hooks.len())
            .finish()
    }
}

impl Cleanup {
    /// Kills, removes, runs the hooks. Safe to run more than once.
    pub fn run(&self) {
        self.pids.kill_all();
        for dir in &self.dirs {
            // Already gone, or never made: nothing to remove.
            let _ = std::fs::remove_dir_all(dir);
        }
        for hook in &self.hooks {
            hook();
        }
    }

    /// Keeps a clone of this guard where the signal handler finds it, until the returned
    /// value is dropped.
    pub fn register(&self) -> Registered {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let parts = Parts { pids: self.pids.clone(), dirs: self.dirs.clone(), hooks: self.hooks.clone() };
        under_way().push((id, parts));
        Registered(id)
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.run();
    }
}

/// What a registered [`Cleanup`] undoes, without its `Drop` (the scope's own guard runs it).
struct Parts {
    pids: PidRegistry,
    dirs: Vec<PathBuf>,
    hooks: Vec<Hook>,
}

fn under_way() -> std::sync::MutexGuard<'static, Vec<(u64, Parts)>> {
    static UNDER_WAY: Mutex<Vec<(u64, Parts)>> = Mutex::new(Vec::new());
    UNDER_WAY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A [`Cleanup`] the signal handler runs, until this is dropped.
#[derive(Debug)]
pub struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        under_way().retain(|(id, _)| *id != self.0);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: runs every registered [`Cleanup`] (killing paused children
/// too, which would otherwise never see a signal), kills the children of
/// [`PidRegistry::global`], says so on stderr naming `program`, and exits with status 130.
/// Install it once, at the start of `main`.
pub fn clean_up_on_signals(program: &'static str) -> Result<(), KitError> {
    ctrlc::set_handler(move || {
        let all = std::mem::take(&mut *under_way());
        for (_, Parts { pids, dirs, hooks }) in all {
            // Dropping the guard runs it.
            drop(Cleanup { pids, dirs, hooks });
        }
        PidRegistry::global().kill_all();
        eprintln!("{program}: interrupted; processes killed and scratch state removed");
        std::process::exit(130);
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cleanup_kills_removes_and_runs_its_hooks_once_dropped() {
        let dir = std::env::temp_dir().join(format!("microrep-testkit-cleanup-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("inner")).expect("scratch dir");
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pids = PidRegistry::default();
        pids.add(child.id() as i32);
        let ran = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = Arc::clone(&ran);
        let hook: Hook = Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let cleanup = Cleanup { pids, dirs: vec![dir.clone()], hooks: vec![hook] };
        let registered = cleanup.register();
        drop(registered);
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 0, "unregistering runs nothing");
        drop(cleanup);
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(!dir.exists(), "the directory is removed");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().expect("reap").signal(), Some(9), "the child was SIGKILLed");
    }
}
