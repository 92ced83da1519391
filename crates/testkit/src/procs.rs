//! A table of processes under test: spawned, killed, paused, resumed and restarted by index,
//! always reaped, each appending its output to its own log across restarts. Every live child is
//! in the table's [`PidRegistry`], so a [`crate::cleanup::Cleanup`] guard or a watchdog can kill
//! them all without taking the table's lock (which a stuck thread might hold).
//!
//! Children are forked by one thread of the table's, which lives as long as the table: a child
//! that asks for a parent-death signal (`PR_SET_PDEATHSIG`, as `microrep wrap-replica` does)
//! gets it when the *thread* that forked it exits, so a process restarted by a short-lived
//! thread (a nemesis) would otherwise be signalled when that thread ends.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;

use rustix::process::{Pid, Signal, kill_process};

use crate::KitError;
use crate::cleanup::PidRegistry;

/// The line written into a process's log before each start, followed by the incarnation's
/// number (1 for the first start), so that readers of the log can tell incarnations apart.
/// (The text predates the kit: logs of older runs stay readable.)
pub const START_MARKER: &str = "==> microrep-faults: starting incarnation";

/// How one process is started.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// stdout and stderr are appended here (across restarts).
    pub log: PathBuf,
    /// Environment variables set for the process (on top of the parent's).
    pub env: Vec<(OsString, OsString)>,
}

#[derive(Debug)]
struct Slot {
    spec: Spec,
    child: Option<Child>,
    paused: bool,
    starts: u32,
}

/// An unexpected end of a process (not one the table killed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The process's index.
    pub index: usize,
    /// How it ended, in words.
    pub status: String,
}

/// Tells whether a peer fenced (SIGKILLed) the process with this pid.
pub type FenceCheck = Box<dyn Fn(i32) -> bool + Send>;

/// A command to spawn, and where its child goes.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The thread that forks the table's children (see the module's documentation).
struct Spawner {
    requests: Option<mpsc::Sender<SpawnRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    fn new() -> Self {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        let thread = std::thread::Builder::new()
            .name("procs-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .ok();
        Self { requests: thread.is_some().then_some(requests), thread }
    }

    /// Spawns `command` on the spawner's thread (on the caller's if that thread could not be
    /// created).
    fn spawn(&self, mut command: Command) -> std::io::Result<Child> {
        let Some(requests) = &self.requests else { return command.spawn() };
        let (reply, child) = mpsc::channel();
        requests.send((command, reply)).map_err(|_| std::io::Error::other("the spawner thread ended"))?;
        child.recv().map_err(|_| std::io::Error::other("the spawner thread ended"))?
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The processes of one cluster, by index.
pub struct Procs {
    slots: Vec<Slot>,
    spawner: Spawner,
    pids: PidRegistry,
    fenced_by_peer: FenceCheck,
    /// Processes that ended without being killed, noticed by [`Procs::reap_exited`].
    pub exits: Vec<Exit>,
    /// Processes SIGKILLed while paused, or by a peer as [`Procs::with_fence_check`] tells
    /// (the shm fabric fences a writer stalled mid-write when a revoke cannot wait for it):
    /// counted here, not in `exits`. Fenced running processes restart at once.
    pub fenced: u32,
}

impl std::fmt::Debug for Procs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Procs")
            .field("slots", &self.slots)
            .field("exits", &self.exits)
            .field("fenced", &self.fenced)
            .finish()
    }
}

impl Procs {
    /// A table of `specs`, none started, registering its children in `pids`.
    pub fn new(specs: Vec<Spec>, pids: PidRegistry) -> Self {
        let slots = specs.into_iter().map(|spec| Slot { spec, child: None, paused: false, starts: 0 }).collect();
        Self { slots, spawner: Spawner::new(), pids, fenced_by_peer: Box::new(|_| false), exits: Vec::new(), fenced: 0 }
    }

    /// Counts a running process SIGKILLed while `check(pid)` holds as fenced by a peer (and
    /// restarts it) instead of an unexpected exit.
    pub fn with_fence_check(mut self, check: FenceCheck) -> Self {
        self.fenced_by_peer = check;
        self
    }

    /// How many processes the table holds.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table holds no process.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The pid of process `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<i32> {
        self.slots[i].child.as_ref().map(|c| Pid::from_child(c).as_raw_nonzero().get())
    }

    /// Starts process `i` (it must not be running).
    pub fn start(&mut self, i: usize) -> Result<(), KitError> {
        let slot = &mut self.slots[i];
        if slot.child.is_some() {
            return Err(KitError::AlreadyRunning(i));
        }
        let path = &slot.spec.log;
        let mut log = OpenOptions::new().create(true).append(true).open(path).map_err(KitError::file(path))?;
        writeln!(log, "{START_MARKER} {}", slot.starts + 1).map_err(KitError::file(path))?;
        let log2 = log.try_clone().map_err(KitError::file(path))?;
        let mut command = Command::new(&slot.spec.program);
        command
            .args(&slot.spec.args)
            .envs(slot.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = self
            .spawner
            .spawn(command)
            .map_err(|source| KitError::Spawn { program: slot.spec.program.display().to_string(), source })?;
        self.pids.add(Pid::from_child(&child).as_raw_nonzero().get());
        slot.child = Some(child);
        slot.paused = false;
        slot.starts += 1;
        Ok(())
    }

    fn signal(&self, i: usize, signal: Signal) -> Result<(), KitError> {
        let child = self.slots[i].child.as_ref().ok_or(KitError::NotRunning(i))?;
        kill_process(Pid::from_child(child), signal).map_err(|source| KitError::Signal { index: i, source })
    }

    /// SIGKILLs process `i` and reaps it.
    pub fn kill(&mut self, i: usize) -> Result<(), KitError> {
        self.signal(i, Signal::KILL)?;
        let slot = &mut self.slots[i];
        if let Some(mut child) = slot.child.take() {
            // SIGKILL was delivered: the wait returns; its status is ours, not news.
            let _ = child.wait();
            self.pids.remove(Pid::from_child(&child).as_raw_nonzero().get());
        }
        slot.paused = false;
        Ok(())
    }

    /// SIGSTOPs process `i`.
    pub fn pause(&mut self, i: usize) -> Result<(), KitError> {
        self.signal(i, Signal::STOP)?;
        self.slots[i].paused = true;
        Ok(())
    }

    /// SIGCONTs process `i`, or restarts it if it was fenced while paused.
    pub fn resume(&mut self, i: usize) -> Result<(), KitError> {
        self.reap_one(i);
        if self.slots[i].child.is_none() {
            return self.start(i);
        }
        self.signal(i, Signal::CONT)?;
        self.slots[i].paused = false;
        Ok(())
    }

    /// Whether process `i` runs (paused or not).
    pub fn is_running(&self, i: usize) -> bool {
        self.slots[i].child.is_some()
    }

    /// Whether process `i` is paused.
    pub fn is_paused(&self, i: usize) -> bool {
        self.slots[i].paused
    }

    /// Running and not paused.
    pub fn is_up(&self, i: usize) -> bool {
        self.is_running(i) && !self.is_paused(i)
    }

    /// Reaps processes that ended on their own and records them in `exits` (or in `fenced`,
    /// restarting those that were running).
    pub fn reap_exited(&mut self) {
        for i in 0..self.slots.len() {
            self.reap_one(i);
        }
    }

    fn reap_one(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        let Some(child) = slot.child.as_mut() else { return };
        let Ok(Some(status)) = child.try_wait() else { return };
        let pid = Pid::from_child(child).as_raw_nonzero().get();
        self.pids.remove(pid);
        slot.child = None;
        let paused = std::mem::take(&mut slot.paused);
        let killed = status.signal() == Some(Signal::KILL.as_raw());
        if !killed || !(paused || (self.fenced_by_peer)(pid)) {
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

    /// Kills and reaps every process.
    pub fn kill_all(&mut self) {
        for i in 0..self.slots.len() {
            if self.is_running(i) {
                // Running was just checked; a failed kill leaves nothing else to do.
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

fn describe(status: ExitStatus) -> String {
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

    fn scratch(what: &str) -> crate::scratch::ScratchDir {
        crate::scratch::ScratchDir::new(
            std::env::temp_dir().join(format!("microrep-testkit-{what}-{}", std::process::id())),
        )
        .expect("scratch dir")
    }

    #[test]
    fn processes_are_killed_paused_restarted_and_reaped() {
        let dir = scratch("procs");
        let pids = PidRegistry::default();
        {
            let mut procs = Procs::new(vec![sleeper(dir.path()), sleeper(dir.path())], pids.clone());
            procs.start(0).expect("start 0");
            procs.start(1).expect("start 1");
            assert!(matches!(procs.start(1), Err(KitError::AlreadyRunning(1))));
            procs.pause(0).expect("pause");
            assert!(procs.is_running(0) && !procs.is_up(0));
            procs.resume(0).expect("resume");
            assert!(procs.is_up(0));
            procs.kill(1).expect("kill");
            assert!(!procs.is_running(1));
            assert!(matches!(procs.pause(1), Err(KitError::NotRunning(1))));
            procs.start(1).expect("restart");
            assert_eq!(pids.len(), 2);
            procs.reap_exited();
            assert!(procs.exits.is_empty(), "nothing ended on its own");
        }
        assert!(pids.is_empty(), "dropping Procs reaps every child");
        let log = std::fs::read_to_string(dir.path().join("sleep.log")).expect("log");
        assert_eq!(log.lines().filter(|l| l.starts_with(START_MARKER)).count(), 3, "one marker per start");
    }

    #[test]
    fn a_process_a_peer_says_it_fenced_is_restarted_not_reported() {
        let dir = scratch("fenced");
        let victim = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let seen = std::sync::Arc::clone(&victim);
        let mut procs = Procs::new(vec![sleeper(dir.path())], PidRegistry::default())
            .with_fence_check(Box::new(move |pid| pid == seen.load(std::sync::atomic::Ordering::Relaxed)));
        procs.start(0).expect("start");
        let pid = procs.pid(0).expect("running");
        victim.store(pid, std::sync::atomic::Ordering::Relaxed);
        kill_process(Pid::from_raw(pid).expect("pid"), Signal::KILL).expect("kill");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while procs.fenced == 0 && std::time::Instant::now() < deadline {
            procs.reap_exited();
            std::thread::yield_now();
        }
        assert_eq!((procs.fenced, procs.exits.len()), (1, 0), "fenced, not an unexpected exit");
        assert!(procs.is_up(0), "restarted at once");
    }

    /// A child whose parent-death signal is tied to the thread that forked it outlives a
    /// short-lived thread that started it: the table's own thread forked it.
    #[test]
    fn a_child_started_by_a_thread_that_ends_keeps_running() {
        let dir = scratch("pdeathsig");
        // USR1 (the parent-death signal) would be taken before TERM when both are pending:
        // the exit status says which came.
        let script = "trap 'kill $!; exit 3' USR1; trap 'kill $!; exit 4' TERM; echo ready; sleep 30 & wait";
        let spec = Spec {
            program: "setpriv".into(),
            args: ["--pdeathsig", "USR1", "sh", "-c", script].map(Into::into).to_vec(),
            log: dir.path().join("child.log"),
            env: Vec::new(),
        };
        let mut procs = Procs::new(vec![spec], PidRegistry::default());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let ready = || std::fs::read_to_string(dir.path().join("child.log")).is_ok_and(|l| l.contains("ready"));
        // The starter thread lives until the child has its parent-death signal and traps set.
        let starter = std::thread::scope(|s| {
            s.spawn(|| {
                procs.start(0).expect("start");
                while !ready() {
                    assert!(std::time::Instant::now() < deadline, "the child never set its traps");
                    std::thread::yield_now();
                }
                rustix::thread::gettid()
            })
            .join()
            .expect("starter")
        });
        // The starter's task is gone once its exit signalled the children it forked.
        let task = format!("/proc/self/task/{}", starter.as_raw_nonzero());
        while std::path::Path::new(&task).exists() {
            assert!(std::time::Instant::now() < deadline, "the starter thread's task never went");
            std::thread::yield_now();
        }
        let pid = Pid::from_raw(procs.pid(0).expect("running")).expect("pid");
        kill_process(pid, Signal::TERM).expect("SIGTERM");
        let status = procs.slots[0].child.as_mut().expect("child").wait().expect("wait");
        assert_eq!(status.code(), Some(4), "the child saw only our SIGTERM, no parent-death signal");
        procs.slots[0].child = None;
    }

    #[test]
    fn an_unexpected_exit_is_recorded() {
        let dir = scratch("exit");
        let spec = Spec { program: "false".into(), args: vec![], log: dir.path().join("false.log"), env: Vec::new() };
        let mut procs = Procs::new(vec![spec], PidRegistry::default());
        procs.start(0).expect("start");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while procs.exits.is_empty() && std::time::Instant::now() < deadline {
            procs.reap_exited();
            std::thread::yield_now();
        }
        assert_eq!(procs.exits, [Exit { index: 0, status: "exited with status 1".into() }]);
    }
}
