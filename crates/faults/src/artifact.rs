//! Writing a run's artifacts: the JSON files of each history (`summary.json`, `nemesis.json`,
//! ...) and the run's totals.

use std::path::{Path, PathBuf};

/// An artifact could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing {}: {source}", path.display())]
pub(crate) struct WriteError {
    path: PathBuf,
    source: std::io::Error,
}

impl WriteError {
    /// The error of writing `path`, for `map_err`.
    pub(crate) fn at(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        |source| Self { path: path.to_path_buf(), source }
    }
}

/// Writes `value` to `path` as pretty-printed JSON.
pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), WriteError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::from).map_err(WriteError::at(path))?;
    std::fs::write(path, bytes).map_err(WriteError::at(path))
}
