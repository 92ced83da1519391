//! Recovery: the latest valid checkpoint and the entries after it.
//!
//! The log is a directory of segments `segment-INDEX.log`, each a checkpoint taken at INDEX
//! followed by the entries INDEX, INDEX + 1... The writer syncs one group-commit write at a
//! time and issues the next only after `fdatasync` returned, so a crash can damage only the
//! last write of the newest segment: some of its blocks missing, torn or persisted out of
//! order. Recovery therefore:
//!
//! - takes the newest segment. Its checkpoint is whole: the writer syncs it under a temporary
//!   name before renaming it into place (temporary files are ignored here), so a damaged one is
//!   damage, and an error;
//! - reads entries until the first record that is not whole. If a whole record of a *later*
//!   write (its batch offset lies after the damaged record) follows, the damaged record was
//!   synced before that write was issued: damage, not a crash, and an error naming the file and
//!   offset. Otherwise it is the torn tail of the last write, and the file is truncated there.
//!
//! A synced write damaged afterwards and never followed by another write looks like a torn
//! last write and is truncated: no checksum can tell the two apart without a later write.

use std::path::{Path, PathBuf};

use microrep_core::mu::Configuration;

use super::DurableError;
use super::record::{self, Kind};

/// The file name of the segment starting with a checkpoint at `index`.
pub(crate) fn segment_name(index: u64) -> String {
    format!("segment-{index:020}.log")
}

fn segment_index(name: &str) -> Option<u64> {
    name.strip_prefix("segment-")?.strip_suffix(".log")?.parse().ok()
}

/// The segments in `dir`, oldest first.
pub(crate) fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, DurableError> {
    let io = |source| DurableError::Io { path: dir.to_path_buf(), source };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if let Some(index) = entry.file_name().to_str().and_then(segment_index) {
            found.push((index, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// What recovery found: the state at `checkpoint` and the entries after it, in order.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// The checkpoint's index: every entry below it is in `state`.
    pub(crate) checkpoint: u64,
    /// The application's snapshot at `checkpoint`.
    pub(crate) state: Vec<u8>,
    /// The configuration at `checkpoint`; `None` for a log written before logs recorded them
    /// (then the initial one).
    pub(crate) configuration: Option<Configuration>,
    /// Entries from `checkpoint` on: (kind, payload); `Kind::Skip` entries have no payload.
    pub(crate) entries: Vec<(Kind, Vec<u8>)>,
    /// The segment to append to, and its length after recovery.
    pub(crate) segment: (u64, u64),
    /// That segment's file.
    pub(crate) path: PathBuf,
}

impl Recovered {
    /// The index below which every entry is recovered.
    pub(crate) fn end(&self) -> u64 {
        self.checkpoint + self.entries.len() as u64
    }
}

/// Recovers the log in `dir`; `None` if it holds no segment.
pub(crate) fn recover(dir: &Path) -> Result<Option<Recovered>, DurableError> {
    let Some((index, path)) = segments(dir)?.pop() else { return Ok(None) };
    let bytes = std::fs::read(&path).map_err(|source| DurableError::Io { path: path.clone(), source })?;
    match record::decode(&bytes, 0) {
        Ok(r) if r.kind == Kind::InitialCheckpoint && r.index == index => {
            read_entries(&path, &bytes, (index, None), r.payload.to_vec(), r.len).map(Some)
        }
        Ok(r) if r.kind == Kind::Checkpoint && r.index == index => {
            let parsed = r.payload.split_at_checked(Configuration::BYTES);
            match parsed.and_then(|(c, state)| Some((Configuration::from_bytes(c)?, state))) {
                Some((c, state)) => read_entries(&path, &bytes, (index, Some(c)), state.to_vec(), r.len).map(Some),
                None => Err(corrupt(&path, 0, "the checkpoint's configuration is not valid")),
            }
        }
        Ok(_) => Err(corrupt(&path, 0, "the first record is not this segment's checkpoint")),
        Err(_) => Err(corrupt(&path, 0, "the checkpoint is damaged")),
    }
}

fn corrupt(path: &Path, offset: u64, why: &str) -> DurableError {
    DurableError::Corrupt { path: path.to_path_buf(), offset, why: why.to_string() }
}

fn read_entries(
    path: &Path,
    bytes: &[u8],
    (checkpoint, configuration): (u64, Option<Configuration>),
    state: Vec<u8>,
    first: u64,
) -> Result<Recovered, DurableError> {
    let mut entries = Vec::new();
    let mut at = first;
    while at < bytes.len() as u64 {
        let expected = checkpoint + entries.len() as u64;
        match record::decode(bytes, at) {
            Ok(r) if !r.kind.is_checkpoint() && r.index == expected => {
                if r.kind == Kind::Membership && Configuration::from_bytes(r.payload).is_none() {
                    return Err(corrupt(path, at, "a membership record whose configuration is not valid"));
                }
                entries.push((r.kind, r.payload.to_vec()));
                at += r.len;
            }
            Ok(r) => {
                let why = format!("a {:?} record for index {} where entry {expected} belongs", r.kind, r.index);
                return Err(corrupt(path, at, &why));
            }
            Err(_) => {
                if let Some(later) = later_write(bytes, at) {
                    let why = format!(
                        "a damaged record, followed by a whole record at offset {later} written after it was synced"
                    );
                    return Err(corrupt(path, at, &why));
                }
                tracing::warn!(segment = %path.display(), offset = at, "a torn last write: truncated");
                let file = std::fs::OpenOptions::new().write(true).open(path);
                file.and_then(|f| f.set_len(at).and_then(|()| f.sync_all()))
                    .map_err(|source| DurableError::Io { path: path.to_path_buf(), source })?;
                break;
            }
        }
    }
    let segment = (checkpoint, at.min(bytes.len() as u64));
    Ok(Recovered { checkpoint, state, configuration, entries, segment, path: path.to_path_buf() })
}

/// The offset of a whole record after `damaged` that belongs to a later write than any record
/// at `damaged` could (its write started after `damaged`), if there is one.
fn later_write(bytes: &[u8], damaged: u64) -> Option<u64> {
    (damaged + 8..bytes.len() as u64).step_by(8).find(|&at| record::decode(bytes, at).is_ok_and(|r| r.batch > damaged))
}
