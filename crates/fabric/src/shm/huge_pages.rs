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
            libc::mmap(std::ptr::null_mut(), len + huge, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
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

/// The `huge=` policy of the tmpfs that holds `dir` ("never" when the mount does not name
/// one), or `None` if `dir` is not on a tmpfs or the mount table cannot be read.
pub fn tmpfs_huge_policy(dir: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let dir = dir.canonicalize().ok()?;
    huge_policy_in(&mounts, &dir)
}

/// [`tmpfs_huge_policy`] given the text of a mount table: the policy of the deepest mount
/// point above `dir` (the last listed if stacked), when it is a tmpfs.
fn huge_policy_in(mounts: &str, dir: &Path) -> Option<String> {
    let mut best: Option<(usize, &str, &str)> = None;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(point), Some(fs), Some(options)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let depth = Path::new(point).components().count();
        if dir.starts_with(point) && best.is_none_or(|(d, _, _)| depth >= d) {
            best = Some((depth, fs, options));
        }
    }
    let (_, fs, options) = best?;
    (fs == "tmpfs").then(|| {
        let huge = options.split(',').find_map(|o| o.strip_prefix("huge="));
        huge.unwrap_or("never").to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
sysfs /sys sysfs rw,nosuid 0 0
/dev/vda1 / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime,size=100k 0 0
tmpfs /dev/shm tmpfs rw,relatime,size=100k,huge=advise 0 0
tmpfs /run tmpfs rw,nosuid,size=10k 0 0
";

    #[test]
    fn the_deepest_last_mount_above_a_directory_decides() {
        assert_eq!(huge_policy_in(MOUNTS, Path::new("/dev/shm/microrep-x")).as_deref(), Some("advise"));
        assert_eq!(huge_policy_in(MOUNTS, Path::new("/run/user")).as_deref(), Some("never"));
        assert_eq!(huge_policy_in(MOUNTS, Path::new("/home/me")), None, "not a tmpfs");
        assert_eq!(huge_policy_in(MOUNTS, Path::new("/dev/shmem")), None, "a path prefix is no mount point");
    }

    #[test]
    fn this_machines_dev_shm_has_a_policy() {
        let policy = tmpfs_huge_policy(Path::new("/dev/shm")).expect("/dev/shm is a tmpfs");
        assert!(["never", "always", "within_size", "advise"].contains(&policy.as_str()), "{policy}");
    }
}
