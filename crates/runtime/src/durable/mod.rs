//! The durable log (`cluster.durability = "fsync"`): every committed entry, before the node
//! applies it, and every snapshot it takes or restores (a checkpoint), appended to
//! `DATA_DIR/log/` by a writer thread with group commit and `fdatasync`, so that a cluster all
//! of whose members were killed comes back with every acknowledged write (see
//! `microrep_core::mu::plane::durable` for the protocol side).
//!
//! - [`record`]: the checksummed, length-prefixed record format;
//! - [`recover`]: the latest valid checkpoint and the entries after it, a torn tail truncated,
//!   damage reported with its file and offset;
//! - [`repair`]: `--repair-log`, a damaged log cut at the damage, the rest recovered from peers;
//! - [`writer`]: group commit over a [`disk::Disk`];
//! - `crash_tests`: every crash state of the writer's write/fsync trace is recovered without
//!   losing a synced record or accepting a damaged one.
//!
//! The node feeds the log from its state machine adapter (`StateMachine::persist`, in index
//! order, in `Engine`), and tells the core how far it is synced before every poll
//! (`ReplicationPlane::set_durable`); the core applies only what a majority synced.

mod disk;
mod record;
mod recover;
mod repair;
mod writer;

#[cfg(test)]
mod crash_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use microrep_core::mu::Configuration;

pub(crate) use record::Kind;
pub(crate) use recover::Recovered;

use disk::FsDisk;
use writer::{Message, Progress, Writer};

/// Why the durable log could not be opened, recovered or kept.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// A file or the directory could not be read or written.
    #[error("durable log {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A record that was synced is damaged: the log is left as it is for an operator.
    #[error(
        "durable log {path}, offset {offset}: {why}. The file is left as it is; restore it from a backup, or \
         start the node with --repair-log (node.repair_log) to cut the log there and recover the rest from its peers"
    )]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Where in it.
        offset: u64,
        /// What is wrong.
        why: String,
    },
    /// The writer thread could not be started.
    #[error("starting the durable log's writer thread: {0}")]
    Thread(std::io::Error),
    /// The application refused the recovered checkpoint.
    #[error("durable log {path}: the application refused the checkpoint at index {index}: {source}")]
    Restore {
        /// The segment holding the checkpoint.
        path: PathBuf,
        /// The checkpoint's index.
        index: u64,
        /// Why.
        source: crate::RestoreError,
    },
}

/// Where the node appends the committed entries: a cloneable handle to the writer's queue.
#[derive(Clone, Debug)]
pub(crate) struct Sink(Sender<Message>);

impl Sink {
    /// Queues the entry applied at `index`. A writer that stopped on an error has reported it
    /// (see [`DurableLog::failure`]); nothing more is persisted then.
    pub(crate) fn entry(&self, index: u64, kind: Kind, payload: &[u8]) {
        let _stopped = self.0.send(Message::Entry { index, kind, payload: payload.to_vec() });
    }

    /// Queues a checkpoint: the configuration as of `index` and the application's state after
    /// applying every entry below it.
    pub(crate) fn checkpoint(&self, index: u64, configuration: Configuration, state: &[u8]) {
        let _stopped = self.0.send(Message::Checkpoint { index, payload: checkpoint_payload(configuration, state) });
    }
}

/// A `Kind::Checkpoint` record's payload: the configuration, then the state.
fn checkpoint_payload(configuration: Configuration, state: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(Configuration::BYTES + state.len());
    payload.extend_from_slice(&configuration.to_bytes());
    payload.extend_from_slice(state);
    payload
}

/// A node's durable log: its writer thread and its progress.
#[derive(Debug)]
pub(crate) struct DurableLog {
    sink: Option<Sink>,
    progress: Arc<Progress>,
    thread: Option<JoinHandle<()>>,
    dir: PathBuf,
}

impl DurableLog {
    /// Opens the log in `dir`: recovers it (what it returns alongside), or creates it with the
    /// application's initial state (`initial_state`) and the initial configuration as the
    /// checkpoint at 0. The writer calls `synced` each time the durable index grows.
    ///
    /// With `repair` (`node.repair_log`), a damaged log is cut at the damage instead of being
    /// an error (see [`repair`]).
    pub(crate) fn open(
        dir: &Path,
        node: u16,
        (initial_configuration, initial_state): (Configuration, impl FnOnce() -> Vec<u8>),
        repair: bool,
        synced: Box<dyn Fn() + Send>,
    ) -> Result<(Self, Option<Recovered>), DurableError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DurableError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let recovered = if repair { repair::recover_repairing(dir)?.0 } else { recover::recover(dir)? };
        let disk = FsDisk::new(dir);
        let writer = match &recovered {
            Some(r) => {
                let segments = recover::segments(dir)?.into_iter().map(|(i, _)| i).collect();
                let entries = (r.checkpoint..).zip(&r.entries).map(|(i, (k, p))| (i, *k, p.clone())).collect();
                Writer::open(disk, r.segment.0, r.segment.1, entries, segments)
            }
            None => Writer::create(disk, 0, &checkpoint_payload(initial_configuration, &initial_state())),
        }
        .map_err(io(dir))?;
        let progress = Arc::new(Progress::default());
        progress.durable.store(writer.durable(), Ordering::Release);
        let (sender, receiver) = mpsc::channel();
        let shared = Arc::clone(&progress);
        let thread = std::thread::Builder::new()
            .name(format!("microrep-log-{node}"))
            .spawn(move || writer::run(writer, &receiver, &shared, &*synced))
            .map_err(DurableError::Thread)?;
        let log = Self { sink: Some(Sink(sender)), progress, thread: Some(thread), dir: dir.to_path_buf() };
        Ok((log, recovered))
    }

    /// Sets a log aside (`--force-new`): renamed `log.discarded-SECONDS` beside it, never
    /// deleted.
    pub(crate) fn discard(dir: &Path) -> Result<(), DurableError> {
        if !dir.exists() {
            return Ok(());
        }
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let aside = dir.with_file_name(format!("log.discarded-{secs}"));
        tracing::warn!(log = %dir.display(), aside = %aside.display(), "--force-new: the durable log is set aside");
        std::fs::rename(dir, &aside).map_err(|source| DurableError::Io { path: aside, source })
    }

    /// The handle the state machine adapter appends through.
    pub(crate) fn sink(&self) -> Option<Sink> {
        self.sink.clone()
    }

    /// Every entry below this index is synced.
    pub(crate) fn durable(&self) -> u64 {
        self.progress.durable.load(Ordering::Acquire)
    }

    /// Why the writer stopped, if an I/O error stopped it.
    pub(crate) fn failure(&self) -> Option<String> {
        self.progress.failure().map(|e| format!("the durable log in {} failed: {e}", self.dir.display()))
    }

    /// Stops the writer. With `flush`, after it persisted everything queued (a clean stop);
    /// without, at once, dropping what is queued as a SIGKILL would (queued messages were
    /// never written; a write under way completes).
    pub(crate) fn stop(&mut self, flush: bool) {
        if !flush {
            self.progress.abandon.store(true, Ordering::Release);
        }
        if let Some(Sink(sender)) = self.sink.take() {
            let _stopped = sender.send(Message::Stop);
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the durable log's writer thread panicked");
        }
    }
}

impl Drop for DurableLog {
    fn drop(&mut self) {
        self.stop(false);
    }
}
