//! A node's shared-memory segment: one file holding a header, the permission table and the
//! registered regions, mapped by the node and by every peer that talks to it.
//!
//! ```text
//! 0          SegmentHeader (one page)
//! 4096       PermSlot[region_count][max_nodes]   64 B each: grant word + in-flight word
//! page-up    region 0 bytes, region 1 bytes, ...  (each page aligned)
//! ```
//!
//! All accesses go through raw pointers into the mapping and never form Rust references to
//! shared bytes, because other processes write them concurrently (like a NIC's DMA into a
//! registered buffer). Only the header's fixed fields are read as plain values, after the file
//! was published by rename with those fields already written.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::fence::FenceMode;
use super::huge_pages::{self, SegmentMapping};

use crate::layout::{self, MAX_REGIONS};
use crate::{FabricError, NodeId, RegionId, RegionSpec, RemoteWrite};

const MAGIC: u64 = u64::from_le_bytes(*b"MICROREP");
const VERSION: u32 = 1;
const PAGE: u64 = 4096;
const HEADER_LEN: u64 = PAGE;

/// Segment life cycle, in [`SegmentHeader::state`].
pub(crate) const STATE_LIVE: u64 = 1;
pub(crate) const STATE_CLOSED: u64 = 2;

/// One region's entry in the header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RegionEntry {
    id: u16,
    remote_write: u16,
    _pad: u32,
    len_bytes: u64,
    offset: u64,
}
const _: () = assert!(size_of::<RegionEntry>() == 24);

/// The first page of a segment.
#[repr(C)]
#[derive(Debug)]
struct SegmentHeader {
    magic: u64,
    version: u32,
    node_id: u16,
    max_nodes: u16,
    pid: i32,
    region_count: u32,
    /// Start time of `pid` in clock ticks since boot (`/proc/PID/stat` field 22): a pid alone
    /// can be reused by an unrelated process after a crash.
    pid_start_ticks: u64,
    /// Random, non-zero; differs for every start of a node id.
    incarnation: u64,
    /// `STATE_LIVE` while the node runs, `STATE_CLOSED` after a clean close.
    state: AtomicU64,
    file_len: u64,
    /// The owner's [`FenceMode`] (whether it issues membarriers when revoking).
    fence_mode: u32,
    _reserved: u32,
    regions: [RegionEntry; MAX_REGIONS],
}
const _: () = assert!(size_of::<SegmentHeader>() == 64 + 24 * MAX_REGIONS);
const _: () = assert!(size_of::<SegmentHeader>() as u64 <= HEADER_LEN);

/// The permission state of one (region, writer) pair, on its own cache line.
///
/// Mu §5.2 relies on the NIC checking write permission at the target when a write arrives. A
/// process copying into shared memory can only check *before* copying, so writer and revoker
/// run Dekker's protocol on these two words (`handshake`, model-checked with loom): the writer
/// publishes `in_flight` then checks `granted`; the revoker clears `granted` then waits for
/// `in_flight` to drop. One of them always sees the other.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct PermSlot {
    /// Non-zero while the writer may write.
    pub(crate) granted: AtomicU64,
    /// The writer's incarnation while it is inside a copy, zero otherwise.
    pub(crate) in_flight: AtomicU64,
}
const _: () = assert!(size_of::<PermSlot>() == 64);

/// Identity and liveness facts about the process that owns a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) node: NodeId,
    pub(crate) fence_mode: FenceMode,
    pub(crate) pid: i32,
    pub(crate) pid_start_ticks: u64,
    pub(crate) incarnation: u64,
}

/// A region as placed in a segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlacedRegion {
    pub(crate) spec: RegionSpec,
    pub(crate) offset: u64,
}

/// Why a peer's segment file could not be mapped: unreadable, or its header is corrupt or
/// foreign.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentError {
    /// Opening, sizing or mapping the file.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{} is {file_len} bytes, shorter than a header", path.display())]
    Short { path: PathBuf, file_len: u64 },
    #[error("{} is not a microrep v{VERSION} segment", path.display())]
    Foreign { path: PathBuf },
    #[error("{} has an inconsistent header", path.display())]
    Inconsistent { path: PathBuf },
    #[error("{} has an unknown region policy", path.display())]
    UnknownPolicy { path: PathBuf },
    #[error("{} places a region outside the file", path.display())]
    RegionOutside { path: PathBuf },
    /// The regions or the membership the header describes are invalid.
    #[error(transparent)]
    Layout(#[from] FabricError),
}

/// A mapped segment (own or a peer's).
#[derive(Debug)]
pub(crate) struct Segment {
    map: SegmentMapping,
    owner: Owner,
    max_nodes: u16,
    regions: Vec<PlacedRegion>,
}

fn round_up_page(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

fn policy_code(p: RemoteWrite) -> u16 {
    match p {
        RemoteWrite::Never => 0,
        RemoteWrite::Granted => 1,
        RemoteWrite::Always => 2,
    }
}

fn policy_from_code(c: u16) -> Option<RemoteWrite> {
    match c {
        0 => Some(RemoteWrite::Never),
        1 => Some(RemoteWrite::Granted),
        2 => Some(RemoteWrite::Always),
        _ => None,
    }
}

impl Segment {
    /// Sizes `file`, maps it and writes a fresh header for `owner` (state LIVE, all grants off).
    pub(crate) fn create(file: &File, owner: Owner, max_nodes: u16, specs: &[RegionSpec]) -> Result<Self, FabricError> {
        layout::validate_specs(specs)?;
        layout::validate_membership(owner.node, max_nodes)?;
        let table_len = (specs.len() as u64) * u64::from(max_nodes) * size_of::<PermSlot>() as u64;
        let mut next = round_up_page(HEADER_LEN + table_len);
        let mut regions = Vec::with_capacity(specs.len());
        for spec in specs {
            regions.push(PlacedRegion { spec: *spec, offset: next });
            next = round_up_page(next + spec.len_bytes);
        }
        let next = next.div_ceil(huge_pages::HUGE_PAGE) * huge_pages::HUGE_PAGE;
        file.set_len(next).map_err(|e| FabricError::os("sizing shared-memory segment", e))?;
        let map = SegmentMapping::map(file).map_err(|e| FabricError::os("mapping shared-memory segment", e))?;
        map.fill_with_huge_pages();
        let mut entries = [RegionEntry::default(); MAX_REGIONS];
        for (entry, placed) in entries.iter_mut().zip(&regions) {
            *entry = RegionEntry {
                id: placed.spec.id.0,
                remote_write: policy_code(placed.spec.remote_write),
                _pad: 0,
                len_bytes: placed.spec.len_bytes,
                offset: placed.offset,
            };
        }
        let header = SegmentHeader {
            magic: MAGIC,
            version: VERSION,
            node_id: owner.node.0,
            max_nodes,
            pid: owner.pid,
            region_count: specs.len() as u32,
            pid_start_ticks: owner.pid_start_ticks,
            incarnation: owner.incarnation,
            state: AtomicU64::new(STATE_LIVE),
            file_len: next,
            fence_mode: owner.fence_mode as u32,
            _reserved: 0,
            regions: entries,
        };
        // SAFETY: the mapping is at least HEADER_LEN bytes, page aligned, and not yet published
        // (the file is renamed into place only after this), so no other process accesses it.
        unsafe { map.as_mut_ptr().cast::<SegmentHeader>().write(header) };
        Ok(Self { map, owner, max_nodes, regions })
    }

    /// Maps a published segment file and validates its header against the file (a corrupt or
    /// foreign file is rejected, never trusted for offsets).
    pub(crate) fn open(path: &Path) -> Result<Self, SegmentError> {
        Self::open_file(path, &Self::open_rw(path)?)
    }

    /// Opens the file at `path` for mapping with [`Segment::open_file`].
    pub(crate) fn open_rw(path: &Path) -> std::io::Result<File> {
        File::options().read(true).write(true).open(path)
    }

    /// Maps `file`, opened from `path` (named in errors).
    pub(crate) fn open_file(path: &Path, file: &File) -> Result<Self, SegmentError> {
        let file_len = file.metadata()?.len();
        if file_len < HEADER_LEN {
            return Err(SegmentError::Short { path: path.into(), file_len });
        }
        let map = SegmentMapping::map(file)?;
        map.use_huge_pages();
        // SAFETY: the mapping holds at least HEADER_LEN bytes; the fixed fields were written
        // before the file was published and never change afterwards, so reading them as plain
        // values races with nothing (`state` is read separately, atomically).
        let h = unsafe { std::ptr::read(map.as_ptr().cast::<SegmentHeader>()) };
        if h.magic != MAGIC || h.version != VERSION {
            return Err(SegmentError::Foreign { path: path.into() });
        }
        if h.file_len != file_len || h.region_count as usize > MAX_REGIONS {
            return Err(SegmentError::Inconsistent { path: path.into() });
        }
        let owner = Owner {
            node: NodeId(h.node_id),
            fence_mode: FenceMode::from_code(h.fence_mode),
            pid: h.pid,
            pid_start_ticks: h.pid_start_ticks,
            incarnation: h.incarnation,
        };
        let table_end = HEADER_LEN + u64::from(h.region_count) * u64::from(h.max_nodes) * size_of::<PermSlot>() as u64;
        let mut regions = Vec::with_capacity(h.region_count as usize);
        for e in &h.regions[..h.region_count as usize] {
            let remote_write =
                policy_from_code(e.remote_write).ok_or_else(|| SegmentError::UnknownPolicy { path: path.into() })?;
            let end = e.offset.saturating_add(e.len_bytes);
            if e.offset < table_end || end > file_len || e.offset % PAGE != 0 {
                return Err(SegmentError::RegionOutside { path: path.into() });
            }
            let spec = RegionSpec::new(RegionId(e.id), e.len_bytes, remote_write);
            regions.push(PlacedRegion { spec, offset: e.offset });
        }
        let specs: Vec<RegionSpec> = regions.iter().map(|r| r.spec).collect();
        layout::validate_specs(&specs)?;
        layout::validate_membership(owner.node, h.max_nodes)?;
        Ok(Self { map, owner, max_nodes: h.max_nodes, regions })
    }

    pub(crate) fn owner(&self) -> Owner {
        self.owner
    }

    pub(crate) fn max_nodes(&self) -> u16 {
        self.max_nodes
    }

    pub(crate) fn state(&self) -> &AtomicU64 {
        let offset = std::mem::offset_of!(SegmentHeader, state);
        // SAFETY: `state` lies inside the mapped header, is 8-byte aligned (repr(C) at a page
        // aligned base) and is only ever accessed atomically by every process.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(offset).cast()) }
    }

    /// Marks a clean close so peers stop using the segment.
    pub(crate) fn mark_closed(&self) {
        self.state().store(STATE_CLOSED, Ordering::SeqCst);
    }

    /// Finds a region by id.
    pub(crate) fn region(&self, region: RegionId) -> Result<(usize, PlacedRegion), FabricError> {
        // Not `ok_or`: see `layout::find_spec` (an error built and dropped on every lookup).
        match self.regions.iter().position(|r| r.spec.id == region) {
            Some(i) => Ok((i, self.regions[i])),
            None => Err(FabricError::UnknownRegion { node: self.owner.node, region }),
        }
    }

    /// The permission slot of (`region_index`, `writer`).
    pub(crate) fn perm_slot(&self, region_index: usize, writer: NodeId) -> &PermSlot {
        assert!(region_index < self.regions.len() && writer.0 < self.max_nodes);
        let index = region_index * usize::from(self.max_nodes) + usize::from(writer.0);
        let offset = HEADER_LEN as usize + index * size_of::<PermSlot>();
        // SAFETY: the table lies between the header and the first region (checked in `open`,
        // constructed so in `create`), slots are 64-byte aligned and only accessed atomically.
        unsafe { &*self.map.as_ptr().add(offset).cast::<PermSlot>() }
    }

    /// A raw pointer to `len` bytes at `offset` of `region`, after a bounds check.
    pub(crate) fn bytes_ptr(&self, region: RegionId, offset: u64, len: u64) -> Result<*mut u8, FabricError> {
        self.locate(region, offset, len).map(|(_, _, ptr)| ptr)
    }

    /// Like [`Self::bytes_ptr`], also returning the region's index and remote-write policy
    /// (one lookup on the write path).
    pub(crate) fn locate(
        &self,
        region: RegionId,
        offset: u64,
        len: u64,
    ) -> Result<(usize, RemoteWrite, *mut u8), FabricError> {
        let (index, placed) = self.region(region)?;
        layout::check_bounds(self.owner.node, region, placed.spec.len_bytes, offset, len)?;
        // SAFETY: placed.offset + offset + len <= file_len (checked above and in `open`), so the
        // pointer stays inside the mapping.
        let ptr = unsafe { self.map.as_mut_ptr().add((placed.offset + offset) as usize) };
        Ok((index, placed.spec.remote_write, ptr))
    }

    /// The atomic word at `offset` of `region`, after alignment and bounds checks.
    pub(crate) fn word(&self, region: RegionId, offset: u64) -> Result<&AtomicU64, FabricError> {
        let (_, placed) = self.region(region)?;
        layout::check_word(self.owner.node, region, placed.spec.len_bytes, offset)?;
        // SAFETY: in bounds and 8-byte aligned (regions are page aligned, offset % 8 == 0); the
        // word is shared memory that stays mapped as long as `self`.
        Ok(unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add((placed.offset + offset) as usize).cast()) })
    }
}

/// The most cache lines [`prefetch_for_write`] asks for.
pub(crate) const PREFETCH_MAX_LINES: usize = 8;

/// Asks this CPU for the cache lines of `ptr[..len]` in a state it may write (x86
/// `PREFETCHW`, Arm `PRFM PSTL1KEEP`; nothing elsewhere). The lines of a follower's next log
/// slot are cold when the leader writes them (last written a lap ago): without the hint each
/// write's stores wait in the store buffer for their lines one after another (in a group of
/// 105 the leader's writes stalled on their first store, the store buffer full of the
/// previous writes' stores). Only the first [`PREFETCH_MAX_LINES`] lines are asked for: a
/// core tracks about ten outstanding fills, so each prefetch beyond them waits for an earlier
/// fill, and a copy that large streams its lines anyway (`rep movsb`); prefetching all of a
/// 17 KiB entry took 6% of the machine's cycles in `bench throughput`, stalled on the fills.
pub(crate) fn prefetch_for_write(ptr: *const u8, len: usize) {
    const LINE: usize = 64;
    let first = ptr as usize & !(LINE - 1);
    let end = (ptr as usize + len).min(first + PREFETCH_MAX_LINES * LINE);
    for line in (first..end).step_by(LINE) {
        prefetch_line_for_write(line as *const u8);
    }
}

#[cfg(target_arch = "x86_64")]
fn prefetch_line_for_write(line: *const u8) {
    // SAFETY: a prefetch reads and writes no memory and never faults, whatever the address
    // (Intel SDM, PREFETCHW; CPUs without it execute the encoding as a NOP).
    unsafe { std::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly)) }
}

#[cfg(target_arch = "aarch64")]
fn prefetch_line_for_write(line: *const u8) {
    // SAFETY: a prefetch hint reads and writes no memory and never faults, whatever the
    // address (Arm ARM, PRFM).
    unsafe { std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) line, options(nostack, preserves_flags, readonly)) }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn prefetch_line_for_write(_line: *const u8) {}

/// Copies `len` bytes between raw locations of shared memory.
///
/// # Safety
/// `src` must be valid for `len` reads and `dst` for `len` writes, and the ranges must not
/// overlap. Other processes may access either range concurrently; the bytes are then unspecified
/// (a torn copy), which callers detect with checksums.
pub(crate) unsafe fn copy_shared(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `/proc/self/smaps` that describe the mapping starting at `addr` (each
    /// block ends with its `VmFlags` line).
    fn smaps_block(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
        let start = format!("{addr:x}-");
        let mut block: Vec<String> = Vec::new();
        for line in smaps.lines().skip_while(|l| !l.starts_with(&start)) {
            block.push(line.to_string());
            if line.starts_with("VmFlags:") {
                break;
            }
        }
        assert!(!block.is_empty(), "no mapping starts at {addr:x}");
        block
    }

    fn field<'a>(block: &'a [String], name: &str) -> &'a str {
        block.iter().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("no {name} in {block:?}")).trim()
    }

    /// Huge pages even on a tmpfs mounted `huge=never` (Debian's `/dev/shm`), wherever the
    /// kernel collapses shared memory at all.
    #[test]
    fn a_segment_spans_whole_huge_pages_mapped_whole_by_its_creator_and_a_peer() {
        let collapsible = huge_pages::kernel_collapses_shmem();
        let path = Path::new("/dev/shm").join(format!("microrep-segment-huge-{}", std::process::id()));
        let file = File::options().read(true).write(true).create_new(true).open(&path).expect("create");
        let owner =
            Owner { node: NodeId(1), fence_mode: FenceMode::Symmetric, pid: 1, pid_start_ticks: 1, incarnation: 1 };
        let specs = [RegionSpec::new(RegionId(0), 5 << 20, RemoteWrite::Granted)];
        let created = Segment::create(&file, owner, 3, &specs);
        let opened = Segment::open(&path);
        let _ = std::fs::remove_file(&path);
        let (created, opened) = (created.expect("create the segment"), opened.expect("open the segment"));
        let len = file.metadata().expect("metadata").len();
        assert_eq!(len, 6 << 20, "header, table and 5 MiB rounded up to whole 2 MiB pages");
        assert_eq!(opened.regions.len(), 1);
        for map in [&created.map, &opened.map] {
            assert_eq!(map.as_ptr() as u64 % huge_pages::HUGE_PAGE, 0, "a mapping starts on a huge page");
            let block = smaps_block(map.as_ptr() as usize);
            assert!(field(&block, "VmFlags:").split_whitespace().any(|f| f == "hg"), "no MADV_HUGEPAGE: {block:?}");
            if collapsible {
                let smaps = block.join("\n");
                let pmd = huge_pages::pmd_mapped_kb(&smaps, map.as_ptr() as usize);
                assert_eq!(pmd, Some(6144), "not mapped by huge pages: {block:?}");
            }
        }
    }
}
