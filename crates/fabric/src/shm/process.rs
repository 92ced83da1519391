//! Processes behind segments: who owns a node id (a lock file), whether a peer process still
//! runs (pidfd plus start time, immune to pid reuse), and a watcher that flags dead peers.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fs::FlockOperation;
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::FabricError;

/// Start time of `pid` in clock ticks since boot, or `None` if no such process runs.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; start time is field 22.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Our own process's identity.
pub(crate) fn this_process() -> Result<(i32, u64), FabricError> {
    let pid = std::process::id() as i32;
    let ticks = start_ticks(pid)
        .ok_or_else(|| FabricError::os("reading /proc/self/stat", std::io::Error::other("unparsable")))?;
    Ok((pid, ticks))
}

/// A handle on a live process that stays valid even if the pid is later reused.
#[derive(Debug)]
pub(crate) struct ProcessHandle {
    pid: i32,
    pidfd: OwnedFd,
}

impl ProcessHandle {
    /// Opens a handle on `pid` if it still runs and started at `start_ticks`.
    ///
    /// A process that has exited but was not reaped yet (a zombie) does not run: its pidfd
    /// opens and its start time still reads, but it is already readable.
    pub(crate) fn open(pid: i32, expected_start_ticks: u64) -> Option<Self> {
        let raw = Pid::from_raw(pid)?;
        let pidfd = rustix::process::pidfd_open(raw, PidfdFlags::empty()).ok()?;
        // Check the start time *after* opening the pidfd: if it matches now, the pidfd refers
        // to the process that wrote the segment, whatever happens to the pid number later.
        let handle = (start_ticks(pid)? == expected_start_ticks).then_some(Self { pid, pidfd })?;
        (!handle.wait_exit(Duration::ZERO)).then_some(handle)
    }

    /// The process id.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process has exited (waits at most `timeout`).
    pub(crate) fn wait_exit(&self, timeout: Duration) -> bool {
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let ts =
            rustix::time::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: i64::from(timeout.subsec_nanos()) };
        matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
    }

    /// Sends SIGKILL through the pidfd (no pid-reuse race).
    pub(crate) fn kill(&self) -> Result<(), FabricError> {
        rustix::process::pidfd_send_signal(&self.pidfd, Signal::KILL)
            .map_err(|e| FabricError::os(format!("killing pid {}", self.pid), e))
    }
}

/// Exclusive ownership of a node id in a cluster directory, held for the life of the node.
///
/// An `flock` dies with its process, so a lock that can be taken proves that whatever segment
/// file is left under that id belongs to a crashed run.
#[derive(Debug)]
pub(crate) struct NodeLock {
    path: PathBuf,
    _file: File,
}

impl NodeLock {
    /// Takes the lock at `path`, or returns `None` if a live process holds it.
    pub(crate) fn try_acquire(path: &Path) -> Result<Option<Self>, FabricError> {
        loop {
            let file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| FabricError::os(format!("opening lock {}", path.display()), e))?;
            match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(FabricError::os(format!("locking {}", path.display()), e)),
            }
            // A previous owner may have unlinked the file between our open and our flock; the
            // lock is only ours if the path still names the inode we locked.
            let locked = rustix::fs::fstat(&file).map_err(|e| FabricError::os("fstat lock", e))?;
            match rustix::fs::stat(path) {
                Ok(now) if now.st_ino == locked.st_ino && now.st_dev == locked.st_dev => {
                    return Ok(Some(Self { path: path.to_owned(), _file: file }));
                }
                _ => continue,
            }
        }
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock so no one can lock a file about to vanish
        // unnoticed (they re-check the inode, see `try_acquire`).
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A peer process being watched: `alive` drops to false once it exits.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) alive: AtomicBool,
    pub(crate) process: ProcessHandle,
}

/// One thread per node that sleeps in `poll` on the pidfds of its peers and flags each one that
/// exits. It never spins: it wakes only when a peer dies, a peer is added, or on shutdown.
#[derive(Debug)]
pub(crate) struct DeathWatcher {
    shared: Arc<WatcherShared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct WatcherShared {
    wake: OwnedFd,
    watched: Mutex<Vec<Arc<Watched>>>,
    stop: AtomicBool,
}

impl DeathWatcher {
    pub(crate) fn start() -> Result<Self, FabricError> {
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| FabricError::os("creating eventfd", e))?;
        let shared = Arc::new(WatcherShared { wake, watched: Mutex::new(Vec::new()), stop: AtomicBool::new(false) });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("microrep-shm-watch".into())
            .spawn(move || watch_loop(&for_thread))
            .map_err(|e| FabricError::os("spawning the peer watcher thread", e))?;
        Ok(Self { shared, thread: Some(thread) })
    }

    /// Starts watching `process`; returns the shared liveness flag.
    pub(crate) fn watch(&self, process: ProcessHandle) -> Arc<Watched> {
        let watched = Arc::new(Watched { alive: AtomicBool::new(true), process });
        self.shared.watched.lock().expect("watcher list poisoned").push(Arc::clone(&watched));
        self.shared.notify();
        watched
    }
}

impl WatcherShared {
    fn notify(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

fn watch_loop(shared: &WatcherShared) {
    while !shared.stop.load(Ordering::Acquire) {
        let list: Vec<Arc<Watched>> = shared.watched.lock().expect("watcher list poisoned").clone();
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(list.len() + 1);
        fds.push(PollFd::new(&shared.wake, PollFlags::IN));
        fds.extend(list.iter().map(|w| PollFd::from_borrowed_fd(w.process.pidfd.as_fd(), PollFlags::IN)));
        if rustix::event::poll(&mut fds, None).is_err() {
            continue;
        }
        let mut drained = [0u8; 8];
        let _ = rustix::io::read(&shared.wake, &mut drained);
        let dead: Vec<usize> =
            fds[1..].iter().enumerate().filter(|(_, fd)| !fd.revents().is_empty()).map(|(i, _)| i).collect();
        if dead.is_empty() {
            continue;
        }
        for &i in &dead {
            list[i].alive.store(false, Ordering::Release);
            tracing::info!(pid = list[i].process.pid(), "shm fabric: peer process exited");
        }
        shared.watched.lock().expect("watcher list poisoned").retain(|w| w.alive.load(Ordering::Acquire));
    }
}

impl Drop for DeathWatcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_stable_and_others_absent() {
        let (pid, ticks) = this_process().expect("own stat");
        assert_eq!(start_ticks(pid), Some(ticks));
        assert!(ProcessHandle::open(pid, ticks).is_some());
        assert!(ProcessHandle::open(pid, ticks + 1).is_none(), "a start-time mismatch means pid reuse");
    }

    #[test]
    fn watcher_flags_an_exited_child() {
        let watcher = DeathWatcher::start().expect("watcher");
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = child.id() as i32;
        let handle = ProcessHandle::open(pid, start_ticks(pid).expect("child stat")).expect("pidfd");
        let watched = watcher.watch(handle);
        assert!(watched.alive.load(Ordering::Acquire));
        child.kill().expect("kill child");
        child.wait().expect("reap child");
        // The watcher thread wakes on the pidfd; wait on the same event rather than sleeping.
        assert!(watched.process.wait_exit(Duration::from_secs(10)));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while watched.alive.load(Ordering::Acquire) {
            assert!(std::time::Instant::now() < deadline, "watcher never flagged the dead child");
            std::thread::yield_now();
        }
    }

    #[test]
    fn an_exited_process_not_reaped_yet_is_not_opened() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = child.id() as i32;
        let ticks = start_ticks(pid).expect("child stat");
        let handle = ProcessHandle::open(pid, ticks).expect("a running child opens");
        handle.kill().expect("kill child");
        assert!(handle.wait_exit(Duration::from_secs(10)), "the child exits");
        assert_eq!(start_ticks(pid), Some(ticks), "a zombie still shows its start time");
        assert!(ProcessHandle::open(pid, ticks).is_none(), "a zombie does not run");
        child.wait().expect("reap child");
    }

    #[test]
    fn lock_is_exclusive_until_dropped() {
        let dir = std::env::temp_dir().join(format!("microrep-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("node-0.lock");
        let first = NodeLock::try_acquire(&path).expect("lock").expect("free");
        // flock locks belong to the open file description, so a second open in this process
        // conflicts just as another process would.
        assert!(NodeLock::try_acquire(&path).expect("lock").is_none());
        drop(first);
        assert!(NodeLock::try_acquire(&path).expect("lock").is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
