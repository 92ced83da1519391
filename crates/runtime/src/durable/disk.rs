//! The file operations the log writer makes, behind a trait so that the crash-consistency test
//! can record them and replay every crash state of the trace (`crash_tests`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A directory of log segments, as the writer uses it.
pub(crate) trait Disk: Send {
    /// An open segment.
    type File: Send;
    /// Creates file `name` empty (truncating a leftover of that name).
    fn create(&mut self, name: &str) -> io::Result<Self::File>;
    /// Opens existing segment `name` to append to it.
    fn open(&mut self, name: &str) -> io::Result<Self::File>;
    /// Writes `data` at `offset` of `file`, whole.
    fn write_at(&mut self, file: &mut Self::File, offset: u64, data: &[u8]) -> io::Result<()>;
    /// `fdatasync`: the file's data, and its length, are on disk when this returns.
    fn sync_data(&mut self, file: &mut Self::File) -> io::Result<()>;
    /// `fsync` of the directory: created and removed names are on disk when this returns.
    fn sync_dir(&mut self) -> io::Result<()>;
    /// Renames `from` to `to` (atomically; durable after [`Disk::sync_dir`]).
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Removes segment `name`.
    fn remove(&mut self, name: &str) -> io::Result<()>;
}

/// The real directory.
#[derive(Debug)]
pub(crate) struct FsDisk {
    dir: PathBuf,
}

impl FsDisk {
    pub(crate) fn new(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf() }
    }
}

impl Disk for FsDisk {
    type File = File;

    fn create(&mut self, name: &str) -> io::Result<File> {
        File::options().read(true).write(true).create(true).truncate(true).open(self.dir.join(name))
    }

    fn open(&mut self, name: &str) -> io::Result<File> {
        File::options().read(true).write(true).open(self.dir.join(name))
    }

    fn write_at(&mut self, file: &mut File, offset: u64, data: &[u8]) -> io::Result<()> {
        file.write_all_at(data, offset)
    }

    fn sync_data(&mut self, file: &mut File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.dir.join(name))
    }
}
