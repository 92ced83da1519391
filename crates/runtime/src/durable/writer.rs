//! The log writer: one thread, group commit. It takes every message waiting, encodes them as
//! one write, `fdatasync`s, and only then publishes the new durable index; the next write is
//! issued after that (so a crash can damage only the last write, see `recover`). A checkpoint
//! starts a new segment: the old one is synced first; the checkpoint, with the entries the log
//! holds after its index, is written to a temporary file, synced, and renamed into place (so a
//! segment is never seen without its checkpoint or those entries), the rename made durable with
//! an `fsync` of the directory before anything in it counts; then older segments are removed.
//! An I/O error stops the writer for good (a failed `fdatasync` is never retried: the kernel
//! may have dropped the pages it failed to write).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Mutex, PoisonError};

use super::disk::Disk;
use super::record::{self, Kind};
use super::recover::segment_name;

/// Most bytes one group-commit write gathers before it is issued.
const BATCH_BYTES_MAX: usize = 4 << 20;

/// What the node asks the writer to persist, in apply order.
#[derive(Debug)]
pub(crate) enum Message {
    /// The entry applied at `index` (`Kind::Entry` with its bytes, `Kind::Skip`, or
    /// `Kind::Membership` with the configuration it leaves).
    Entry { index: u64, kind: Kind, payload: Vec<u8> },
    /// A `Kind::Checkpoint` payload: the configuration as of `index`, then the application's
    /// snapshot after applying every entry below `index`.
    Checkpoint { index: u64, payload: Vec<u8> },
    /// The node stops: persist what came before (unless abandoned), then exit.
    Stop,
}

/// What the writer and the node share.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Every entry below this index is synced.
    pub(crate) durable: AtomicU64,
    /// Set when the node is killed: queued messages are dropped, as a SIGKILL would lose them.
    pub(crate) abandon: AtomicBool,
    /// Why the writer stopped, if an I/O error stopped it.
    pub(crate) failure: Mutex<Option<String>>,
}

impl Progress {
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The segment being appended to.
struct Current<F> {
    index: u64,
    file: F,
    len: u64,
}

/// The writer's state over a `Disk`.
pub(crate) struct Writer<D: Disk> {
    disk: D,
    current: Current<D::File>,
    /// The index the next entry must have.
    next: u64,
    /// The segments in the directory (their checkpoint indices), the current one included.
    segments: Vec<u64>,
    /// The entries of the current segment (after its checkpoint): a checkpoint taken at an
    /// index below `next` (the application applies what the log already holds) starts the new
    /// segment with the entries from its index on.
    entries: Vec<(u64, Kind, Vec<u8>)>,
    buf: Vec<u8>,
}

impl<D: Disk> Writer<D> {
    /// A writer appending to segment `index` (of `len` bytes, already synced, holding
    /// `entries` after its checkpoint); `segments` lists every segment in the directory.
    pub(crate) fn open(
        mut disk: D,
        index: u64,
        len: u64,
        entries: Vec<(u64, Kind, Vec<u8>)>,
        segments: Vec<u64>,
    ) -> std::io::Result<Self> {
        let file = disk.open(&segment_name(index))?;
        let next = index + entries.len() as u64;
        Ok(Self { disk, current: Current { index, file, len }, next, segments, entries, buf: Vec::new() })
    }

    /// A writer of a new log whose first segment holds `payload` as the checkpoint at `index`,
    /// synced before this returns.
    pub(crate) fn create(mut disk: D, index: u64, payload: &[u8]) -> std::io::Result<Self> {
        let current = start_segment(&mut disk, index, payload, &[])?;
        disk.sync_dir()?;
        Ok(Self { disk, current, next: index, segments: vec![index], entries: Vec::new(), buf: Vec::new() })
    }

    /// The index below which everything handed to [`Writer::write`] is synced.
    pub(crate) fn durable(&self) -> u64 {
        self.next
    }

    /// Persists `batch` as one group commit: written, synced, the directory synced if a
    /// segment was started, older segments removed. Returns the new durable index.
    pub(crate) fn write(&mut self, batch: Vec<Message>) -> std::io::Result<u64> {
        self.buf.clear();
        let mut start = self.current.len;
        let mut started = None;
        for message in batch {
            match message {
                Message::Entry { index, kind, payload } => {
                    debug_assert_eq!(index, self.next, "entries reach the log in index order");
                    let at = start + self.buf.len() as u64;
                    record::encode(kind, index, &payload, at, start, &mut self.buf);
                    self.entries.push((index, kind, payload));
                    self.next = index + 1;
                }
                // A snapshot at the current segment's own index adds nothing (a restart that
                // applied nothing since).
                Message::Checkpoint { index, .. } if index == self.current.index && self.next == index => {}
                Message::Stop => {}
                Message::Checkpoint { index, payload } => {
                    self.flush()?;
                    self.disk.sync_data(&mut self.current.file)?;
                    // Entries the log holds from the checkpoint on are carried into the new
                    // segment, inside it before it gets its name (a snapshot from a peer past
                    // them drops them all).
                    self.entries.retain(|(i, ..)| *i >= index);
                    self.current = start_segment(&mut self.disk, index, &payload, &self.entries)?;
                    self.segments.push(index);
                    start = self.current.len;
                    if self.entries.is_empty() {
                        self.next = index;
                    }
                    started = Some(index);
                }
            }
        }
        self.flush()?;
        self.disk.sync_data(&mut self.current.file)?;
        if let Some(index) = started {
            self.disk.sync_dir()?;
            self.remove_older_than(index);
        }
        Ok(self.next)
    }

    /// Writes what was encoded since the last flush at the end of the current segment.
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.disk.write_at(&mut self.current.file, self.current.len, &self.buf)?;
            self.current.len += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Removes the segments a synced checkpoint at `index` superseded. A failure only leaves
    /// a file that recovery never reads (it takes the newest whole checkpoint); it is tried
    /// again after the next checkpoint.
    fn remove_older_than(&mut self, index: u64) {
        let mut kept = Vec::with_capacity(1);
        for old in std::mem::take(&mut self.segments) {
            if old < index {
                match self.disk.remove(&segment_name(old)) {
                    Ok(()) => continue,
                    Err(e) => tracing::warn!(segment = old, error = %e, "an old log segment could not be removed"),
                }
            }
            kept.push(old);
        }
        self.segments = kept;
    }
}

/// A new segment holding the checkpoint (`index`, `payload`) and the `carried` entries after it:
/// written under a temporary name, synced, renamed into place, so that the segment is never
/// seen without them. The rename is durable only after the caller's `sync_dir`.
fn start_segment<D: Disk>(
    disk: &mut D,
    index: u64,
    payload: &[u8],
    carried: &[(u64, Kind, Vec<u8>)],
) -> std::io::Result<Current<D::File>> {
    let (name, temporary) = (segment_name(index), format!("{}.new", segment_name(index)));
    let mut file = disk.create(&temporary)?;
    let mut buf = Vec::new();
    record::encode(Kind::Checkpoint, index, payload, 0, 0, &mut buf);
    for (i, kind, payload) in carried {
        let at = buf.len() as u64;
        record::encode(*kind, *i, payload, at, 0, &mut buf);
    }
    disk.write_at(&mut file, 0, &buf)?;
    disk.sync_data(&mut file)?;
    disk.rename(&temporary, &name)?;
    Ok(Current { index, file, len: buf.len() as u64 })
}

/// The writer thread's loop: waits for a message, takes every one waiting (up to
/// [`BATCH_BYTES_MAX`]), writes them as one group commit, publishes the durable index. Stops at
/// [`Message::Stop`] (after writing what came before it, unless the log was abandoned) or when
/// every sender is gone. Calls `synced` after each publication.
pub(crate) fn run<D: Disk>(
    mut writer: Writer<D>,
    messages: &Receiver<Message>,
    progress: &Progress,
    synced: &dyn Fn(),
) {
    while let Ok(first) = messages.recv() {
        let mut stop = matches!(first, Message::Stop);
        let mut batch = vec![first];
        let mut bytes = 0;
        while !stop && bytes < BATCH_BYTES_MAX {
            match messages.try_recv() {
                Ok(message) => {
                    bytes += match &message {
                        Message::Entry { payload, .. } => payload.len(),
                        Message::Checkpoint { payload, .. } => payload.len(),
                        Message::Stop => 0,
                    };
                    stop = matches!(message, Message::Stop);
                    batch.push(message);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        if progress.abandon.load(Ordering::Acquire) {
            return;
        }
        match writer.write(batch) {
            Ok(durable) => {
                progress.durable.store(durable, Ordering::Release);
                synced();
            }
            Err(e) => {
                tracing::error!(error = %e, "the durable log cannot be written");
                *progress.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                return;
            }
        }
        if stop {
            return;
        }
    }
}
