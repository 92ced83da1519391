//! Measuring memory-region re-registration (`ibv_rereg_mr`), which sideway does not wrap: the
//! symbol is looked up in libibverbs at run time, and a provider that does not implement the verb
//! (soft-RoCE) is reported as unsupported.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use sideway::ibverbs::AccessFlags;

use super::device::Device;
use super::memory::Registered;
use crate::FabricError;

/// `IBV_REREG_MR_CHANGE_ACCESS` from `<infiniband/verbs.h>`.
const CHANGE_ACCESS: c_int = 1 << 2;

type ReregFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, usize, c_int) -> c_int;

fn rereg_symbol() -> Option<ReregFn> {
    // SAFETY: dlopen with a valid NUL-terminated name; the library stays loaded (libibverbs is
    // never unloaded by this process: sideway's wrapper holds it open too).
    let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: valid handle and NUL-terminated symbol name.
    let symbol = unsafe { libc::dlsym(handle, c"ibv_rereg_mr".as_ptr()) };
    // SAFETY: `ibv_rereg_mr` has this C signature in every libibverbs that exports it
    // (struct ibv_mr *, int flags, struct ibv_pd *, void *addr, size_t length, int access).
    (!symbol.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, ReregFn>(symbol) })
}

/// Registers `len_bytes` with remote read and write, then times re-registering it read-only.
pub(crate) fn probe(device: &Device, len_bytes: usize) -> Result<Duration, FabricError> {
    let unsupported = |feature: String| FabricError::Unsupported { device: device.name.clone(), feature };
    let rereg = rereg_symbol().ok_or_else(|| unsupported("ibv_rereg_mr (not exported by libibverbs)".into()))?;
    let access = AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite;
    let mem = Registered::new(&device.pd, len_bytes, access)?;
    let read_only: c_int = (AccessFlags::LocalWrite | AccessFlags::RemoteRead).bits();
    let started = Instant::now();
    // SAFETY: `mem`'s MR is live and owned here; with CHANGE_ACCESS only, the PD, address and
    // length arguments are ignored (NULL / 0 as the man page allows). On failure the MR is either
    // still valid or unusable; it is deregistered when `mem` drops either way.
    let status =
        unsafe { rereg(mem.raw_mr(), CHANGE_ACCESS, std::ptr::null_mut(), std::ptr::null_mut(), 0, read_only) };
    let took = started.elapsed();
    if status != 0 {
        let errno = std::io::Error::last_os_error();
        return Err(unsupported(format!("ibv_rereg_mr (returned {status}: {errno})")));
    }
    Ok(took)
}
