//! A test cluster's directory (shm segments, data), removed at the end of the test.

use std::path::PathBuf;

/// Removes its directory when dropped.
pub(crate) struct Dir(pub(crate) PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
