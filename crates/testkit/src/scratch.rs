//! Scratch directories removed by a guard, so that no exit path (an error, a panic, a signal)
//! leaves files or `/dev/shm` segments behind.

use std::path::{Path, PathBuf};

use crate::KitError;
use crate::cleanup::{Cleanup, PidRegistry};

/// A directory created empty and removed with its contents when dropped; the signal handler
/// of [`crate::cleanup::clean_up_on_signals`] removes it too.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    // Unregisters before the removal.
    _registered: crate::cleanup::Registered,
    _cleanup: Cleanup,
}

impl ScratchDir {
    /// Creates `path` (and its parents), replacing whatever a crashed run left there.
    pub fn new(path: PathBuf) -> Result<Self, KitError> {
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(KitError::file(&path))?;
        }
        std::fs::create_dir_all(&path).map_err(KitError::file(&path))?;
        let cleanup = Cleanup { pids: PidRegistry::default(), dirs: vec![path.clone()], hooks: Vec::new() };
        Ok(Self { path, _registered: cleanup.register(), _cleanup: cleanup })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_dir_is_fresh_and_gone_after_a_panic() {
        let path = std::env::temp_dir().join(format!("microrep-testkit-scratch-{}", std::process::id()));
        std::fs::create_dir_all(&path).expect("leftover dir");
        std::fs::write(path.join("stale"), b"x").expect("leftover file");
        let inside = path.clone();
        let panicked = std::thread::spawn(move || {
            let dir = ScratchDir::new(inside).expect("scratch");
            assert!(!dir.path().join("stale").exists(), "a leftover of a crashed run is replaced");
            std::fs::write(dir.path().join("segment"), b"data").expect("write");
            panic!("a test fails while the directory holds files");
        })
        .join();
        assert!(panicked.is_err());
        assert!(!path.exists(), "unwinding removed the directory");
    }
}
