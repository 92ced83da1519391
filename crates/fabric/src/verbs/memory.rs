//! Registered memory: page-aligned anonymous mappings pinned as memory regions (MRs).
//!
//! # Memory model
//! Once registered, the bytes of a region are shared with the NIC, which writes them by DMA (or,
//! on soft-RoCE, by a kernel `memcpy` in softirq context) whenever a peer's WRITE arrives, at any
//! moment and concurrently with this process. The compiler knows nothing of those writes, so Rust
//! code never forms a reference (`&[u8]`, `&mut [u8]`) to registered bytes: it copies them in or
//! out through raw pointers ([`Registered::copy_out`], [`Registered::copy_in`]), and the 8-byte
//! words that carry protocol state are accessed as atomics ([`Registered::word`]). A copy may see a
//! remote write partly applied, in any byte order; protocols checksum what they read (the fabric
//! contract in docs/ARCHITECTURE.md). A completion polled from the CQ orders the NIC's writes of
//! the completed READ before the poll (libibverbs issues the needed barrier), so a READ's
//! destination may be copied out once its completion has been seen.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use memmap2::MmapMut;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use crate::FabricError;

/// A page-aligned anonymous mapping registered with the device. Fields drop in order: the MR is
/// deregistered before the mapping is unmapped.
#[derive(Debug)]
pub(crate) struct Registered {
    mr: Arc<MemoryRegion>,
    _map: MmapMut,
    base: *mut u8,
    len: usize,
}

// SAFETY: `base` points into `map`, which this struct owns and never moves or shrinks; all
// accesses through it are raw-pointer copies or atomics, which are sound from any thread.
unsafe impl Send for Registered {}
// SAFETY: as for `Send`: shared access only uses raw-pointer copies and atomics (see the
// module's memory model), never references to the bytes.
unsafe impl Sync for Registered {}

impl Registered {
    /// Maps `len` zeroed bytes and registers them with `access`.
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<Self, FabricError> {
        let mut map = MmapMut::map_anon(len.max(8)).map_err(|e| FabricError::os("mapping a region", e))?;
        let base = map.as_mut_ptr();
        // SAFETY: `base..base + len` is a live mapping owned by the returned value, which keeps it
        // mapped for as long as the MR exists (the MR field drops first).
        let mr = unsafe { pd.reg_mr(base as usize, len.max(8), access) }.map_err(|e| register_error(len, &e))?;
        Ok(Self { mr, _map: map, base, len })
    }

    /// The address the NIC uses for byte `offset` (no bounds check: callers checked it).
    pub(crate) fn addr(&self, offset: u64) -> u64 {
        self.base as u64 + offset
    }

    /// The key local work requests name this memory with.
    pub(crate) fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The key peers name this memory with.
    pub(crate) fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// The `struct ibv_mr *` of this registration, for verbs sideway does not wrap.
    pub(crate) fn raw_mr(&self) -> *mut std::ffi::c_void {
        // SAFETY: only the pointer value is taken; the MR outlives every use the caller makes of
        // it while `self` is alive.
        unsafe { self.mr.mr() }.as_ptr().cast()
    }

    /// Copies `buf.len()` bytes at `offset` out (bounds checked by the caller).
    pub(crate) fn copy_out(&self, offset: usize, buf: &mut [u8]) {
        assert!(offset.checked_add(buf.len()).is_some_and(|end| end <= self.len), "copy_out out of bounds");
        // SAFETY: the source range is inside the mapping (asserted), the destination is a
        // distinct Rust buffer; concurrent NIC writes may tear the copy, which is the documented
        // semantics (module docs), and no reference to the shared bytes is created.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset), buf.as_mut_ptr(), buf.len()) }
    }

    /// The `len` bytes at `offset`, lent in place (bounds checked by the caller).
    ///
    /// # Safety
    ///
    /// Neither the NIC nor a local write may change them while the slice lives.
    pub(crate) unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "slice out of bounds");
        // SAFETY: the range is inside the mapping (asserted), which lives as long as `self`; the
        // bytes do not change while the slice lives (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.base.add(offset), len) }
    }

    /// Copies `data` in at `offset` (bounds checked by the caller).
    pub(crate) fn copy_in(&self, offset: usize, data: &[u8]) {
        assert!(offset.checked_add(data.len()).is_some_and(|end| end <= self.len), "copy_in out of bounds");
        // SAFETY: the destination range is inside the mapping (asserted) and `data` is a distinct
        // Rust buffer; raw-pointer copy, no reference to the shared bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) }
    }

    /// The 8-byte word at `offset` (8-aligned and in bounds, checked by the caller).
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len, "word out of bounds or misaligned");
        // SAFETY: the mapping is page-aligned, so `base + offset` is 8-aligned (asserted) and in
        // bounds; the mapping lives as long as `self`; every access to shared words goes through
        // atomics (the NIC's writes are outside the Rust memory model, as documented above).
        unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) }
    }
}

/// Maps a failed registration to a typed error: ENOMEM/EPERM mostly mean the memlock limit.
fn register_error(len: usize, e: &sideway::ibverbs::memory_region::RegisterMemoryRegionError) -> FabricError {
    let io = match &e.0 {
        sideway::ibverbs::memory_region::RegisterMemoryRegionErrorKind::Ibverbs(io) => Some(io),
        _ => None,
    };
    match io.and_then(std::io::Error::raw_os_error) {
        Some(code) if code == libc::ENOMEM || code == libc::EPERM => {
            FabricError::MemlockTooLow { limit_bytes: memlock_limit().unwrap_or(0), needed_bytes: len as u64 }
        }
        _ => FabricError::Os {
            context: format!("registering {len} bytes of memory"),
            kind: io.map_or(std::io::ErrorKind::Other, std::io::Error::kind),
            message: io.map_or_else(|| e.to_string(), ToString::to_string),
        },
    }
}

/// This process's soft locked-memory limit (RLIMIT_MEMLOCK, `ulimit -l`) in bytes, `None` when
/// unlimited.
pub fn memlock_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Memlock).current
}
