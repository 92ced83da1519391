//! Huge pages for shared-memory segments, and the mapping that holds them.
//!
//! A SIGKILLed process's exit tears down the page tables of its own segment and of its peers'
//! (about 1 ms at 4 KiB pages for three 6 MB segments, spent on a core the survivors need for
//! their fail-over, docs/BENCHMARKS.md). With 2 MiB pages there are 512 times fewer entries.
//!
//! Every mapping starts at a 2 MiB boundary (the kernel places a tmpfs file there only when
//! its mount allows huge pages) and asks for them with `MADV_HUGEPAGE`. Then the segment's
//! creator fills every page and collapses them into huge ones (`MADV_COLLAPSE`, Linux 6.1 and
//! later), which the kernel grants whatever the tmpfs's `huge=` option, unless
//! `/sys/kernel/mm/transparent_hugepage/shmem_enabled` says `deny`. A peer's mapping then
//! maps the huge pages whole (its own `MADV_COLLAPSE` makes sure of it). A kernel or file
//! system without them keeps 4 KiB pages: each refusal is logged at debug level and nothing
//! else changes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

/// A segment file's length is a multiple of a PMD-sized huge page, so that its last page can
/// be a huge one too.
pub(crate) const HUGE_PAGE: u64 = 2 << 20;

/// A shared, read-write mapping of a whole segment file, starting at a huge-page boundary.
#[derive(Debug)]
pub(crate) struct SegmentMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes; every access goes through
// raw pointers whose users synchronise with atomics (segment.rs), as with `memmap2::MmapRaw`,
// which is Send and Sync for the same reason.
unsafe impl Send for SegmentMapping {}
// SAFETY: as for Send.
unsafe impl Sync for SegmentMapping {}

impl SegmentMapping {
    /// Maps all of `file` (its length taken now) shared and read-write.
    pub(crate) fn map(file: &File) -> std::io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty segment file"));
        }
        let huge = HUGE_PAGE as usize;
        // SAFETY: an anonymous, inaccessible reservation at an address the kernel chooses
        // touches no existing mapping.
        let reserved = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + huge,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if reserved == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let start = (reserved as usize).next_multiple_of(huge);
        let lead = start - reserved as usize;
        // SAFETY: [start, start + len) lies inside the reservation made above, which this
        // function owns; MAP_FIXED replaces only that part of it.
        let mapped = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        let error = (mapped == libc::MAP_FAILED).then(std::io::Error::last_os_error);
        // SAFETY: the parts before and after the file mapping are the rest of the reservation,
        // owned here and referenced by nothing (the whole of it when the file mapping failed).
        unsafe {
            match error {
                Some(_) => libc::munmap(reserved, len + huge),
                None => {
                    libc::munmap(reserved, lead);
                    libc::munmap((start + len) as *mut libc::c_void, huge - lead)
                }
            };
        }
        if let Some(e) = error {
            return Err(e);
        }
        let ptr = NonNull::new(mapped.cast::<u8>()).expect("mmap never maps page zero here");
        let mapping = Self { ptr, len };
        mapping.advise(libc::MADV_HUGEPAGE, "MADV_HUGEPAGE");
        Ok(mapping)
    }

    /// Fills every page and turns them into huge pages (see the module documentation). Only
    /// the creator calls it, before the segment is published.
    pub(crate) fn fill_with_huge_pages(&self) {
        if self.advise(libc::MADV_POPULATE_WRITE, "MADV_POPULATE_WRITE") {
            self.use_huge_pages();
        }
    }

    /// Maps the file's huge pages whole (`MADV_COLLAPSE`; collapses its pages first if they are
    /// not huge yet).
    pub(crate) fn use_huge_pages(&self) {
        self.advise(libc::MADV_COLLAPSE, "MADV_COLLAPSE");
    }

    fn advise(&self, advice: libc::c_int, name: &str) -> bool {
        // SAFETY: the range is exactly this mapping; the advice values used here change how
        // it is backed, never its contents.
        let rc = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, advice) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            tracing::debug!(%error, advice = name, "a shared-memory segment keeps 4 KiB pages");
        }
        rc == 0
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for SegmentMapping {
    fn drop(&mut self) {
        // SAFETY: the range is this mapping, which nothing uses any more (Segment hands out
        // pointers into it only while it lives).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Whether segments created in `dir` get huge pages on this machine: maps a probe file of one
/// huge page there as a segment is mapped, and reads `/proc/self/smaps` for it.
pub fn huge_pages_granted(dir: &Path) -> std::io::Result<bool> {
    let path = dir.join(format!(".microrep-huge-page-probe-{}", std::process::id()));
    let file = File::options().read(true).write(true).create_new(true).open(&path)?;
    let mapped = file.set_len(HUGE_PAGE).and_then(|()| SegmentMapping::map(&file));
    let _ = std::fs::remove_file(&path);
    let mapping = mapped?;
    mapping.fill_with_huge_pages();
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    Ok(pmd_mapped_kb(&smaps, mapping.as_ptr() as usize).is_some_and(|kb| kb * 1024 == HUGE_PAGE))
}

/// The `ShmemPmdMapped` kilobytes of the mapping that starts at `addr`, given the text of an
/// smaps file (a mapping's block runs from its address line to its `VmFlags` line).
pub(crate) fn pmd_mapped_kb(smaps: &str, addr: usize) -> Option<u64> {
    let start = format!("{addr:x}-");
    let block = smaps.lines().skip_while(|l| !l.starts_with(&start)).take_while(|l| !l.starts_with("VmFlags:"));
    block
        .filter_map(|l| l.strip_prefix("ShmemPmdMapped:"))
        .find_map(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// Whether this kernel turns shared memory into huge pages on request at all: a memfd of one
/// huge page, mapped on a huge-page boundary and filled, collapsed by hand (no code of this
/// module involved). Kernels before 6.1, some kernel configurations before file and shmem
/// collapse no longer needed `CONFIG_READ_ONLY_THP_FOR_FS`, and `shmem_enabled = deny` refuse;
/// the tests expect huge pages exactly where this succeeds.
#[cfg(test)]
pub(crate) fn kernel_collapses_shmem() -> bool {
    let huge = HUGE_PAGE as usize;
    let Ok(fd) = rustix::fs::memfd_create("microrep-collapse-check", rustix::fs::MemfdFlags::CLOEXEC) else {
        return false;
    };
    if rustix::fs::ftruncate(&fd, HUGE_PAGE).is_err() {
        return false;
    }
    // SAFETY: a fresh anonymous reservation, unmapped below together with what replaced its
    // aligned middle; nothing else refers to any of it.
    unsafe {
        let reserved =
            libc::mmap(std::ptr::null_mut(), 2 * huge, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        if reserved == libc::MAP_FAILED {
            return false;
        }
        let start = (reserved as usize).next_multiple_of(huge) as *mut libc::c_void;
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        let mapped = libc::mmap(start, huge, libc::PROT_READ | libc::PROT_WRITE, flags, fd.as_raw_fd(), 0);
        let collapsed = mapped != libc::MAP_FAILED
            && libc::madvise(start, huge, libc::MADV_POPULATE_WRITE) == 0
            && libc::madvise(start, huge, libc::MADV_COLLAPSE) == 0;
        libc::munmap(reserved, 2 * huge);
        collapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000200000 rw-s 00000000 00:1b 42 /dev/shm/a
Rss:                2048 kB
ShmemPmdMapped:        0 kB
VmFlags: rd wr sh mr mw me ms
7f0000200000-7f0000400000 rw-s 00000000 00:1b 43 /dev/shm/b
Rss:                2048 kB
ShmemPmdMapped:     2048 kB
VmFlags: rd wr sh mr mw me ms hg
";

    #[test]
    fn the_pmd_mapped_size_is_read_from_the_mappings_own_block() {
        assert_eq!(pmd_mapped_kb(SMAPS, 0x7f00_0000_0000), Some(0));
        assert_eq!(pmd_mapped_kb(SMAPS, 0x7f00_0020_0000), Some(2048));
        assert_eq!(pmd_mapped_kb(SMAPS, 0x7f00_0040_0000), None, "no such mapping");
    }

    /// On a tmpfs, even one mounted `huge=never` (Debian's `/dev/shm`), wherever the kernel
    /// collapses shared memory at all; never on a disk file system.
    #[test]
    fn dev_shm_grants_huge_pages_and_a_disk_does_not() {
        assert_eq!(huge_pages_granted(Path::new("/dev/shm")).expect("probe /dev/shm"), kernel_collapses_shmem());
        let disk = std::env::current_dir().expect("cwd");
        assert!(!huge_pages_granted(&disk).expect("probe the working directory"), "{}", disk.display());
    }
}
