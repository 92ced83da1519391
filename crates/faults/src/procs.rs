//! The processes under test: spawned, killed, paused, resumed and restarted by index, always
//! reaped. A [`PidRegistry`] lists every live child so that a [`Cleanup`] guard (dropped on
//! every exit path, panics included) or the hard-deadline watchdog can kill them all without
//! taking any lock a stuck thread might hold. SIGINT, SIGTERM and SIGHUP run the cleanups of
//! the histories under way before the harness exits ([`clean_up_on_signals`]).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::process::{Pid, Signal, kill_process};

/// What the shm fabric logs when it fences a writer stalled mid-write, naming it `pid=N`.
const FENCING_MESSAGE: &str = "fencing a writer stalled mid-write";

/// The tracing directive that keeps the fencing line in a node's log whatever else is filtered.
pub(crate) fn fencing_directive() -> String {
    format!("{}=warn", microrep_fabric::shm::FENCING_LOG_TARGET)
}

/// The line the harness writes into a process's log before each start, followed by the
/// incarnation's number (1 for the first start), so that readers of the log can tell the
/// incarnations apart.
pub(crate) const START_MARKER: &str = "==> microrep-faults: starting incarnation";

/// The pids of every child not yet reaped.
#[derive(Clone, Debug, Default)]
pub(crate) struct PidRegistry(Arc<Mutex<BTreeSet<i32>>>);

impl PidRegistry {
    fn add(&self, pid: i32) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(pid);
    }

    fn remove(&self, pid: i32) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&pid);
    }

    /// SIGKILLs every registered child (stopped ones too: SIGKILL needs no SIGCONT).
    pub(crate) fn kill_all(&self) {
        let pids: Vec<i32> = self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().copied().collect();
        for pid in pids.into_iter().filter_map(Pid::from_raw) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// Kills every registered child and removes scratch directories and network namespaces when
/// dropped.
#[derive(Debug)]
pub(crate) struct Cleanup {
    pub(crate) pids: PidRegistry,
    pub(crate) dirs: Vec<PathBuf>,
    pub(crate) namespaces: Vec<String>,
}

impl Cleanup {
    pub(crate) fn run(&self) {
        self.pids.kill_all();
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
        for name in &self.namespaces {
            if std::path::Path::new("/run/netns").join(name).exists() {
                if let Err(e) = crate::netns::delete(name) {
                    eprintln!("microrep-faults: cleanup: {e}");
                }
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.run();
    }
}

/// What the cleanups of the histories under way remove, by history, for the signal handler.
type Removals = (PidRegistry, Vec<PathBuf>, Vec<String>);
static UNDER_WAY: Mutex<Vec<(u64, Removals)>> = Mutex::new(Vec::new());

/// Keeps a history's cleanup where the signal handler finds it, until dropped.
#[derive(Debug)]
pub(crate) struct UnderWay(u64);

impl UnderWay {
    /// Registers `cleanup` for history `seed`.
    pub(crate) fn register(seed: u64, cleanup: &Cleanup) -> Self {
        let removals = (cleanup.pids.clone(), cleanup.dirs.clone(), cleanup.namespaces.clone());
        UNDER_WAY.lock().unwrap_or_else(PoisonError::into_inner).push((seed, removals));
        Self(seed)
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        UNDER_WAY.lock().unwrap_or_else(PoisonError::into_inner).retain(|(seed, _)| *seed != self.0);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: kills the processes of every history under way (paused ones
/// included, which would otherwise never see a signal), removes their directories and
/// namespaces, and exits with status 130.
pub(crate) fn clean_up_on_signals() -> Result<(), String> {
    ctrlc::set_handler(|| {
        let under_way = std::mem::take(&mut *UNDER_WAY.lock().unwrap_or_else(PoisonError::into_inner));
        for (_, (pids, dirs, namespaces)) in under_way {
            // Dropping the guard runs it.
            drop(Cleanup { pids, dirs, namespaces });
        }
        eprintln!("microrep-faults: interrupted; processes killed and scratch state removed");
        std::process::exit(130);
    })
    .map_err(|e| format!("installing the signal handler: {e}"))
}

/// How one process is started.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    /// stdout and stderr are appended here (across restarts).
    pub(crate) log: PathBuf,
    /// Environment variables set for the process (on top of the harness's own).
    pub(crate) env: Vec<(OsString, OsString)>,
}

#[derive(Debug)]
struct Slot {
    spec: Spec,
    child: Option<Child>,
    paused: bool,
    starts: u32,
}

/// An unexpected end of a process (not one the nemesis killed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exit {
    pub(crate) index: usize,
    pub(crate) status: String,
}

/// The processes of one target, by index.
#[derive(Debug)]
pub(crate) struct Procs {
    slots: Vec<Slot>,
    pids: PidRegistry,
    /// Processes that ended without being killed, noticed by [`Procs::reap_exited`].
    pub(crate) exits: Vec<Exit>,
    /// Processes SIGKILLed by a peer: the shm fabric fences a writer stalled mid-write when a
    /// revoke cannot wait for it (docs/ARCHITECTURE.md), so a paused leader may die, and so may
    /// one starved of CPU (its peer's log names it). Fenced running processes restart at once.
    pub(crate) fenced: u32,
}

impl Procs {
    pub(crate) fn new(specs: Vec<Spec>, pids: PidRegistry) -> Self {
        let slots = specs.into_iter().map(|spec| Slot { spec, child: None, paused: false, starts: 0 }).collect();
        Self { slots, pids, exits: Vec::new(), fenced: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Starts process `i` (it must not be running).
    pub(crate) fn start(&mut self, i: usize) -> Result<(), String> {
        let slot = &mut self.slots[i];
        if slot.child.is_some() {
            return Err(format!("process {i} is already running"));
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&slot.spec.log)
            .map_err(|e| format!("opening {}: {e}", slot.spec.log.display()))?;
        writeln!(log, "{START_MARKER} {}", slot.starts + 1)
            .map_err(|e| format!("writing {}: {e}", slot.spec.log.display()))?;
        let log2 = log.try_clone().map_err(|e| format!("log {}: {e}", slot.spec.log.display()))?;
        let child = Command::new(&slot.spec.program)
            .args(&slot.spec.args)
            .envs(slot.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", slot.spec.program.display()))?;
        self.pids.add(Pid::from_child(&child).as_raw_nonzero().get());
        slot.child = Some(child);
        slot.paused = false;
        slot.starts += 1;
        Ok(())
    }

    fn signal(&self, i: usize, signal: Signal) -> Result<(), String> {
        let child = self.slots[i].child.as_ref().ok_or_else(|| format!("process {i} is not running"))?;
        kill_process(Pid::from_child(child), signal).map_err(|e| format!("signalling process {i}: {e}"))
    }

    /// SIGKILLs process `i` and reaps it.
    pub(crate) fn kill(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, Signal::KILL)?;
        let slot = &mut self.slots[i];
        if let Some(mut child) = slot.child.take() {
            let _ = child.wait();
            self.pids.remove(Pid::from_child(&child).as_raw_nonzero().get());
        }
        slot.paused = false;
        Ok(())
    }

    /// SIGSTOPs process `i`.
    pub(crate) fn pause(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, Signal::STOP)?;
        self.slots[i].paused = true;
        Ok(())
    }

    /// SIGCONTs process `i`, or restarts it if it was fenced while paused.
    pub(crate) fn resume(&mut self, i: usize) -> Result<(), String> {
        self.reap_one(i);
        if self.slots[i].child.is_none() {
            return self.start(i);
        }
        self.signal(i, Signal::CONT)?;
        self.slots[i].paused = false;
        Ok(())
    }

    pub(crate) fn is_running(&self, i: usize) -> bool {
        self.slots[i].child.is_some()
    }

    pub(crate) fn is_paused(&self, i: usize) -> bool {
        self.slots[i].paused
    }

    /// Running and not paused.
    pub(crate) fn is_up(&self, i: usize) -> bool {
        self.is_running(i) && !self.is_paused(i)
    }

    /// Reaps processes that ended on their own and records them in `exits` (or in `fenced`,
    /// restarting those that were running).
    pub(crate) fn reap_exited(&mut self) {
        for i in 0..self.slots.len() {
            self.reap_one(i);
        }
    }

    fn reap_one(&mut self, index: usize) {
        use std::os::unix::process::ExitStatusExt;
        let slot = &mut self.slots[index];
        let Some(child) = slot.child.as_mut() else { return };
        let Ok(Some(status)) = child.try_wait() else { return };
        let pid = Pid::from_child(child).as_raw_nonzero().get();
        self.pids.remove(pid);
        slot.child = None;
        let paused = std::mem::take(&mut slot.paused);
        if status.signal() != Some(9) || !(paused || self.fenced_by_a_peer(pid)) {
            self.exits.push(Exit { index, status: describe(status) });
            return;
        }
        self.fenced += 1;
        if !paused {
            // Fenced while running (starved of CPU mid-write): back at once, as after a crash.
            if let Err(e) = self.start(index) {
                self.exits.push(Exit { index, status: format!("was fenced and could not restart: {e}") });
            }
        }
    }

    /// Whether a peer's log says it fenced process `pid` (the shm fabric names the pid; the
    /// line may carry terminal colour codes).
    fn fenced_by_a_peer(&self, pid: i32) -> bool {
        let needle = format!("pid={pid}");
        self.slots.iter().any(|slot| {
            std::fs::read_to_string(&slot.spec.log).is_ok_and(|log| {
                log.lines()
                    .filter(|line| line.contains(FENCING_MESSAGE))
                    .any(|line| strip_colours(line).trim_end().ends_with(&needle))
            })
        })
    }

    /// Kills and reaps every process.
    pub(crate) fn kill_all(&mut self) {
        for i in 0..self.slots.len() {
            if self.is_running(i) {
                let _ = self.kill(i);
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// `line` without ANSI escape sequences (`ESC [ ... letter`).
pub(crate) fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &std::path::Path) -> Spec {
        Spec { program: "sleep".into(), args: vec!["30".into()], log: dir.join("sleep.log"), env: Vec::new() }
    }

    #[test]
    fn processes_are_killed_paused_restarted_and_reaped() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let pids = PidRegistry::default();
        {
            let mut procs = Procs::new(vec![sleeper(&dir), sleeper(&dir)], pids.clone());
            procs.start(0).expect("start 0");
            procs.start(1).expect("start 1");
            assert!(procs.start(1).is_err(), "a running process cannot be started twice");
            procs.pause(0).expect("pause");
            assert!(procs.is_running(0) && !procs.is_up(0));
            procs.resume(0).expect("resume");
            assert!(procs.is_up(0));
            procs.kill(1).expect("kill");
            assert!(!procs.is_running(1));
            assert!(procs.pause(1).is_err(), "a killed process cannot be paused");
            procs.start(1).expect("restart");
            assert_eq!(pids.0.lock().expect("lock").len(), 2);
            procs.reap_exited();
            assert!(procs.exits.is_empty(), "nothing ended on its own");
        }
        assert!(pids.0.lock().expect("lock").is_empty(), "dropping Procs reaps every child");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_process_a_peer_says_it_fenced_is_restarted_not_reported() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-fenced-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let pids = PidRegistry::default();
        let mut procs = Procs::new(vec![sleeper(&dir)], pids.clone());
        procs.start(0).expect("start");
        let pid = Pid::from_child(procs.slots[0].child.as_ref().expect("running")).as_raw_nonzero().get();
        let line =
            format!("WARN shm fabric: {FENCING_MESSAGE} writer=node 0 \u{1b}[3mpid\u{1b}[0m\u{1b}[2m=\u{1b}[0m{pid}\n");
        std::fs::write(&procs.slots[0].spec.log, line).expect("write log");
        kill_process(Pid::from_raw(pid).expect("pid"), Signal::KILL).expect("kill");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while procs.fenced == 0 && std::time::Instant::now() < deadline {
            procs.reap_exited();
            std::thread::yield_now();
        }
        assert_eq!((procs.fenced, procs.exits.len()), (1, 0), "fenced, not an unexpected exit");
        assert!(procs.is_up(0), "restarted at once");
        drop(procs);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unexpected_exit_is_recorded() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-exit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let spec = Spec { program: "false".into(), args: vec![], log: dir.join("false.log"), env: Vec::new() };
        let mut procs = Procs::new(vec![spec], PidRegistry::default());
        procs.start(0).expect("start");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while procs.exits.is_empty() && std::time::Instant::now() < deadline {
            procs.reap_exited();
            std::thread::yield_now();
        }
        assert_eq!(procs.exits, [Exit { index: 0, status: "exited with status 1".into() }]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
