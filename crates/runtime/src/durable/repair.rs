//! Repair of a damaged durable log (`microrep node --repair-log`): an operator's choice, never
//! automatic, since damage to a synced record means the disk or something beside the node
//! wrote where it should not.
//!
//! The damaged segment is copied aside first (`NAME.damaged-SECONDS`, never deleted), then cut
//! at the first damaged record: truncated there, or removed if its checkpoint is damaged (an
//! older segment, if one is left, is then the log). The node starts with what precedes the
//! damage and recovers the rest from its peers like a member restarted with a shorter disk.
//! That is safe for the cluster's acknowledged writes as long as a majority's disks are intact
//! (this disk no longer counts as one): the whole-cluster restart starts from the most
//! durable member (`microrep_core::mu::plane::bootstrap`), never from this one if another holds more.

use std::path::Path;

use super::DurableError;
use super::recover::{self, Recovered};

/// Recovers the log in `dir` as [`recover::recover`] does, cutting damaged segments as the
/// module documentation says until what is left recovers. Returns what was recovered and a
/// line per repair made.
pub(crate) fn recover_repairing(dir: &Path) -> Result<(Option<Recovered>, Vec<String>), DurableError> {
    let mut repairs = Vec::new();
    // Each cut removes a segment or shortens the newest one below the damage: bounded by the
    // segments and the records there are.
    loop {
        match recover::recover(dir) {
            Err(DurableError::Corrupt { path, offset, why }) => repairs.push(cut(dir, &path, offset, &why)?),
            other => return other.map(|r| (r, repairs)),
        }
    }
}

fn cut(dir: &Path, segment: &Path, offset: u64, why: &str) -> Result<String, DurableError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DurableError::Io { path, source }
    };
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let name = segment.file_name().map_or_else(|| "segment".into(), |n| n.to_string_lossy().into_owned());
    let aside = segment.with_file_name(format!("{name}.damaged-{secs}"));
    std::fs::copy(segment, &aside).map_err(io(&aside))?;
    let what = if offset == 0 {
        std::fs::remove_file(segment).map_err(io(segment))?;
        "its checkpoint is damaged: the segment is removed"
    } else {
        let file = std::fs::OpenOptions::new().write(true).open(segment).map_err(io(segment))?;
        file.set_len(offset).and_then(|()| file.sync_all()).map_err(io(segment))?;
        "truncated there"
    };
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    let line = format!(
        "durable log {}, offset {offset}: {why}; {what} (the damaged file is kept as {}); the entries after it \
         will be recovered from the peers",
        segment.display(),
        aside.display()
    );
    tracing::warn!("{line}");
    Ok(line)
}
