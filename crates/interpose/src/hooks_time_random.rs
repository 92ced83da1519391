//! The exported clock and randomness functions (docs/WRAP.md, "Time and randomness"): inside
//! an input window (`input`) the wall clock reads the entry's input time; randomness is drawn
//! from the cluster's seed, so every copy draws the same bytes. A sleep inside a window moves
//! its time on by the time asked (every copy sleeps alike). Monotonic and CPU-time clocks are
//! each machine's own.

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};

use libc::{size_t, ssize_t};

use crate::state::{self, Fd};
use crate::{input, real};

/// Whether `clock` reads the wall clock.
fn wall_clock(clock: libc::clockid_t) -> bool {
    clock == libc::CLOCK_REALTIME || clock == libc::CLOCK_REALTIME_COARSE
}

/// `time(2)`.
///
/// # Safety
/// As for libc's `time`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn time(t: *mut libc::time_t) -> libc::time_t {
    let Some(ns) = input::now_ns() else {
        // SAFETY: the caller's argument, passed on unchanged.
        return unsafe { real::time(t) };
    };
    let secs = (ns / 1_000_000_000) as libc::time_t;
    if !t.is_null() {
        // SAFETY: time's contract: a non-null `t` points to a writable time_t.
        unsafe { *t = secs };
    }
    secs
}

/// `gettimeofday(2)`.
///
/// # Safety
/// As for libc's `gettimeofday`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gettimeofday(tv: *mut libc::timeval, tz: *mut c_void) -> c_int {
    let Some(ns) = input::now_ns().filter(|_| !tv.is_null()) else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::gettimeofday(tv, tz) };
    };
    // SAFETY: gettimeofday's contract: a non-null `tv` points to a writable timeval.
    unsafe {
        (*tv).tv_sec = (ns / 1_000_000_000) as libc::time_t;
        (*tv).tv_usec = ((ns % 1_000_000_000) / 1_000) as libc::suseconds_t;
    }
    if tz.is_null() {
        0
    } else {
        // SAFETY: the caller's time zone pointer, filled by the real call (no timeval asked).
        unsafe { real::gettimeofday(core::ptr::null_mut(), tz) }
    }
}

/// `clock_gettime(2)`.
///
/// # Safety
/// As for libc's `clock_gettime`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_gettime(clock: libc::clockid_t, ts: *mut libc::timespec) -> c_int {
    let Some(ns) = input::now_ns().filter(|_| wall_clock(clock) && !ts.is_null()) else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::clock_gettime(clock, ts) };
    };
    // SAFETY: clock_gettime's contract: `ts` (checked non-null) points to a writable timespec.
    unsafe {
        (*ts).tv_sec = (ns / 1_000_000_000) as libc::time_t;
        (*ts).tv_nsec = (ns % 1_000_000_000) as libc::c_long;
    }
    0
}

fn nanos(t: &libc::timespec) -> u64 {
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// How a sleep ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    /// A signal woke it: the kernel wrote the remainder to `rem` (if given).
    Interrupted,
    Failed,
}

/// How long a relative sleep of `req` lasted.
///
/// # Safety
/// `req` is null or valid; `rem` is null or, for an interrupted sleep, written by it.
unsafe fn slept(req: *const libc::timespec, rem: *const libc::timespec, outcome: Outcome) -> u64 {
    if req.is_null() || outcome == Outcome::Failed {
        return 0;
    }
    // SAFETY: guaranteed by the caller.
    let asked = nanos(unsafe { &*req });
    if outcome == Outcome::Completed {
        return asked;
    }
    if rem.is_null() {
        return 0;
    }
    // SAFETY: guaranteed by the caller: an interrupted sleep wrote the remainder.
    asked.saturating_sub(nanos(unsafe { &*rem }))
}

fn outcome(error: c_int) -> Outcome {
    match error {
        0 => Outcome::Completed,
        libc::EINTR => Outcome::Interrupted,
        _ => Outcome::Failed,
    }
}

/// `nanosleep(2)`: inside an input window, the window's time moves on by the time slept.
///
/// # Safety
/// As for libc's `nanosleep`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nanosleep(req: *const libc::timespec, rem: *mut libc::timespec) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let got = unsafe { real::nanosleep(req, rem) };
    // SAFETY: errno is this thread's own variable.
    let error = if got == 0 { 0 } else { unsafe { *libc::__errno_location() } };
    // SAFETY: `req` was valid for the call; `rem` written if it was interrupted.
    input::slept(unsafe { slept(req, rem, outcome(error)) });
    got
}

/// `clock_nanosleep(2)`: a relative sleep inside an input window moves the window's time on.
///
/// # Safety
/// As for libc's `clock_nanosleep`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_nanosleep(
    clock: libc::clockid_t,
    flags: c_int,
    req: *const libc::timespec,
    rem: *mut libc::timespec,
) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let got = unsafe { real::clock_nanosleep(clock, flags, req, rem) };
    if flags & libc::TIMER_ABSTIME == 0 {
        // SAFETY: as for `nanosleep` (this call returns the error instead of setting errno).
        input::slept(unsafe { slept(req, rem, outcome(got)) });
    }
    got
}

/// `usleep(3)`: inside an input window, the window's time moves on by the time slept.
///
/// # Safety
/// As for libc's `usleep`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn usleep(usec: libc::useconds_t) -> c_int {
    // SAFETY: no pointer argument.
    let got = unsafe { real::usleep(usec) };
    if got == 0 {
        input::slept(u64::from(usec) * 1_000);
    }
    got
}

/// `len` writable bytes at `buf`, if any.
///
/// # Safety
/// `buf` is null or points to `len` writable bytes.
unsafe fn out<'a>(buf: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    // SAFETY: guaranteed by the caller.
    (!buf.is_null() && len > 0).then(|| unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// `getrandom(2)`.
///
/// # Safety
/// As for libc's `getrandom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrandom(buf: *mut c_void, len: size_t, flags: c_uint) -> ssize_t {
    // SAFETY: getrandom's contract: `buf` holds `len` writable bytes.
    if unsafe { out(buf, len) }.is_some_and(input::draw) {
        return len as ssize_t;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real::getrandom(buf, len, flags) }
}

/// `getentropy(3)`.
///
/// # Safety
/// As for libc's `getentropy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getentropy(buf: *mut c_void, len: size_t) -> c_int {
    // SAFETY: getentropy's contract: `buf` holds `len` writable bytes (at most 256, which
    // the real call checks when there is no seed).
    if len <= 256 && unsafe { out(buf, len) }.is_some_and(input::draw) {
        return 0;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real::getentropy(buf, len) }
}

/// Whether `path` names a kernel randomness device.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn random_device(path: *const c_char) -> bool {
    if path.is_null() || state::seed().is_none() {
        return false;
    }
    // SAFETY: guaranteed by the caller.
    let path = unsafe { CStr::from_ptr(path) }.to_bytes();
    path == b"/dev/urandom" || path == b"/dev/random"
}

fn opened(fd: c_int, random: bool) -> c_int {
    if fd >= 0 {
        state::set(fd, if random { Fd::Random } else { Fd::Other });
    }
    fd
}

/// `open(2)` (its mode is read only with `O_CREAT` or `O_TMPFILE`, which callers pass then; on
/// the 64-bit ABIs this library is built for, a variadic argument travels like a fixed one).
///
/// # Safety
/// As for libc's `open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: the caller's arguments; `path` is NUL-terminated by open's contract.
    unsafe { opened(real::open(path, flags, mode), random_device(path)) }
}

/// `open64(2)`.
///
/// # Safety
/// As for libc's `open64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: as for `open`.
    unsafe { opened(real::open64(path, flags, mode), random_device(path)) }
}

/// The read function of a randomness device opened with `fopen`: draws from the seed.
unsafe extern "C" fn cookie_read(_cookie: *mut c_void, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: stdio hands its own buffer of `len` writable bytes.
    if unsafe { out(buf.cast(), len) }.is_some_and(input::draw) { len as ssize_t } else { -1 }
}

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieFunctions {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

unsafe extern "C" {
    /// glibc's `fopencookie(3)`.
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, functions: CookieFunctions) -> *mut libc::FILE;
}

/// `fopen` of a randomness device: a stream whose reads draw from the seed (glibc reads a
/// `FILE` with its internal `read`, which no preloaded library sees). Like `fopen`, this
/// allocates the stream.
///
/// # Safety
/// `mode` is a NUL-terminated string.
unsafe fn random_stream(mode: *const c_char) -> *mut libc::FILE {
    let functions = CookieFunctions { read: Some(cookie_read), write: None, seek: None, close: None };
    // SAFETY: a valid mode string (the caller's), no cookie state, and functions that never
    // touch the cookie.
    unsafe { fopencookie(core::ptr::null_mut(), mode, functions) }
}

/// `fopen(3)`.
///
/// # Safety
/// As for libc's `fopen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: fopen's contract: both strings are NUL-terminated.
    unsafe { if random_device(path) { random_stream(mode) } else { real::fopen(false, path, mode) } }
}

/// `fopen64(3)`.
///
/// # Safety
/// As for libc's `fopen64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: as for `fopen`.
    unsafe { if random_device(path) { random_stream(mode) } else { real::fopen(true, path, mode) } }
}
