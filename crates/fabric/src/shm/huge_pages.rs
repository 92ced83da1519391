//! Transparent huge pages for shared-memory segments.
//!
//! A SIGKILLed process's exit tears down the page tables of its own segment and of its peers'
//! (about 1 ms at 4 KiB pages for three 6 MB segments, spent on a core the survivors need for
//! their fail-over, docs/BENCHMARKS.md). With 2 MiB pages there are 512 times fewer entries.
//! Every mapping of a segment asks for them; the tmpfs holding the segments decides: a mount
//! with `huge=advise` (or `within_size`, `always`) grants them, the default `huge=never`
//! does not (`mount -o remount,huge=advise /dev/shm`, docs/ARCHITECTURE.md).

use std::path::Path;

use memmap2::{Advice, MmapRaw};

/// A segment file's length is a multiple of a PMD-sized huge page, so that its last page can
/// be a huge one too.
pub(crate) const HUGE_PAGE: u64 = 2 << 20;

/// Asks for transparent huge pages on a segment mapping. A kernel without them refuses the
/// advice, and the mapping keeps 4 KiB pages.
pub(crate) fn advise(map: &MmapRaw) {
    if let Err(e) = map.advise(Advice::HugePage) {
        tracing::debug!(error = %e, "no transparent huge pages for a shared-memory segment");
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
