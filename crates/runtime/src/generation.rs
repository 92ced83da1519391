//! The cluster generation a node remembers across restarts (`node.data_dir`), so that a
//! cluster all of whose members restarted does not silently start again empty
//! (`microrep_core::mu::plane::bootstrap`).
//!
//! The file `DATA_DIR/generation` holds one line: the generation in 16 hexadecimal digits. It
//! is written when the node becomes a voter of a generation it did not remember (a bootstrap
//! or a promotion), through a temporary file, `fsync`, a rename and an `fsync` of the
//! directory, so that a crash leaves the old file or the new one.

use std::io::Write;
use std::path::{Path, PathBuf};

const FILE: &str = "generation";

/// Why the remembered generation could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// The data directory or the file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not hold a generation.
    #[error("{path}: expected one line of 16 hexadecimal digits (a cluster generation), found {found:?}")]
    Malformed {
        /// The path.
        path: PathBuf,
        /// What it held (its first 40 characters).
        found: String,
    },
}

/// The remembered generation of one node, and where it lives.
#[derive(Debug)]
pub(crate) struct GenerationFile {
    path: Option<PathBuf>,
    remembered: u64,
}

impl GenerationFile {
    /// Reads the generation remembered in `data_dir` (0 if none is, if there is no data
    /// directory, or with `force_new`: the node then takes part in bootstrapping a new
    /// cluster). Creates the directory.
    pub(crate) fn open(data_dir: Option<&Path>, force_new: bool) -> Result<Self, GenerationError> {
        let Some(dir) = data_dir else {
            return Ok(Self { path: None, remembered: 0 });
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(FILE);
        let remembered = match std::fs::read_to_string(&path) {
            Ok(_) if force_new => 0,
            Ok(text) => parse(&text).ok_or_else(|| GenerationError::Malformed {
                path: path.clone(),
                found: text.chars().take(40).collect(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(GenerationError::Io { path, source }),
        };
        Ok(Self { path: Some(path), remembered })
    }

    /// The generation remembered (0: none).
    pub(crate) fn remembered(&self) -> u64 {
        self.remembered
    }

    /// Where it is kept, if anywhere.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Remembers `generation` durably (nothing without a data directory, or if it is the one
    /// remembered already).
    pub(crate) fn remember(&mut self, generation: u64) -> Result<(), GenerationError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if generation == self.remembered {
            return Ok(());
        }
        let temporary = path.with_extension("new");
        let mut file = std::fs::File::create(&temporary).map_err(io(&temporary))?;
        writeln!(file, "{generation:016x}").and_then(|()| file.sync_all()).map_err(io(&temporary))?;
        std::fs::rename(&temporary, path).map_err(io(path))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        self.remembered = generation;
        Ok(())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GenerationError + '_ {
    move |source| GenerationError::Io { path: path.to_path_buf(), source }
}

fn parse(text: &str) -> Option<u64> {
    let digits = text.trim_end_matches('\n');
    (digits.len() == 16).then(|| u64::from_str_radix(digits, 16).ok()).flatten().filter(|&g| g != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("microrep-generation-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_generation_is_remembered_across_opens_and_forgotten_with_force_new() {
        let dir = scratch("roundtrip");
        let mut file = GenerationFile::open(Some(&dir), false).expect("open");
        assert_eq!(file.remembered(), 0, "a new data directory remembers nothing");
        file.remember(0x00ab_cdef_0123_4567).expect("remember");
        assert_eq!(std::fs::read_to_string(dir.join(FILE)).expect("read"), "00abcdef01234567\n");
        assert_eq!(GenerationFile::open(Some(&dir), false).expect("reopen").remembered(), 0x00ab_cdef_0123_4567);
        assert_eq!(GenerationFile::open(Some(&dir), true).expect("force").remembered(), 0);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_damaged_file_is_an_error_that_names_it() {
        let dir = scratch("damaged");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for bad in ["", "12\n", "zzzzzzzzzzzzzzzz\n", "0000000000000000\n"] {
            std::fs::write(dir.join(FILE), bad).expect("write");
            let e = GenerationFile::open(Some(&dir), false).expect_err(bad);
            assert!(e.to_string().contains("generation") && e.to_string().contains(&dir.display().to_string()), "{e}");
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn without_a_data_directory_nothing_is_kept() {
        let mut file = GenerationFile::open(None, false).expect("open");
        file.remember(7).expect("nothing to write");
        assert_eq!((file.remembered(), file.path()), (0, None));
    }
}
