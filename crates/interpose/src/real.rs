//! The definitions the hooks stand in front of (libc's), found with `dlsym(RTLD_NEXT)` once
//! (in the library constructor, or at first use if a hook runs before it) and kept as
//! addresses in atomics.

use core::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t};

/// One symbol's next definition: 0 until looked up, 1 if there is none.
struct Slot {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Slot {
    const fn new(name: &'static CStr) -> Self {
        Self { name, addr: AtomicUsize::new(0) }
    }

    fn get(&self) -> Option<usize> {
        let mut addr = self.addr.load(Ordering::Acquire);
        if addr == 0 {
            // SAFETY: `name` is NUL-terminated; dlsym with RTLD_NEXT only reads it.
            let found = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
            addr = if found == 0 { 1 } else { found };
            self.addr.store(addr, Ordering::Release);
        }
        (addr != 1).then_some(addr)
    }
}

fn fail_enosys() {
    // SAFETY: errno is this thread's own variable.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

macro_rules! real {
    ($($name:ident = $sym:literal: fn($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[allow(non_upper_case_globals)]
        mod slots {
            $(pub(super) static $name: super::Slot = super::Slot::new($sym);)*
        }

        /// Looks every symbol up now (from the constructor, before the server runs).
        pub(crate) fn resolve_all() {
            $(slots::$name.get();)*
        }

        $(
            /// Calls the next definition of the symbol of this name (ENOSYS if there is none).
            ///
            /// # Safety
            /// The caller keeps the C function's contract for the arguments.
            pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
                match slots::$name.get() {
                    Some(addr) => {
                        // SAFETY: `addr` is the next definition of this very symbol, whose C
                        // type is this signature; the caller keeps its contract.
                        unsafe {
                            let f = core::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> $ret>(addr);
                            f($($arg),*)
                        }
                    }
                    None => {
                        fail_enosys();
                        -1
                    }
                }
            }
        )*
    };
}

real! {
    accept = c"accept": fn(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    accept4 = c"accept4": fn(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    read = c"read": fn(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    __read_chk = c"__read_chk": fn(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t;
    readv = c"readv": fn(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    recv = c"recv": fn(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    __recv_chk = c"__recv_chk": fn(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    recvfrom = c"recvfrom": fn(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    recvmsg = c"recvmsg": fn(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    close = c"close": fn(fd: c_int) -> c_int;
    write = c"write": fn(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    writev = c"writev": fn(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    send = c"send": fn(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    sendto = c"sendto": fn(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
    sendmsg = c"sendmsg": fn(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    epoll_wait = c"epoll_wait": fn(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait = c"epoll_pwait": fn(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const libc::sigset_t) -> c_int;
    poll = c"poll": fn(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
    select = c"select": fn(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int;
    time = c"time": fn(t: *mut libc::time_t) -> libc::time_t;
    gettimeofday = c"gettimeofday": fn(tv: *mut libc::timeval, tz: *mut c_void) -> c_int;
    clock_gettime = c"clock_gettime": fn(clock: libc::clockid_t, ts: *mut libc::timespec) -> c_int;
    getrandom = c"getrandom": fn(buf: *mut c_void, len: size_t, flags: libc::c_uint) -> ssize_t;
    getentropy = c"getentropy": fn(buf: *mut c_void, len: size_t) -> c_int;
    nanosleep = c"nanosleep": fn(req: *const libc::timespec, rem: *mut libc::timespec) -> c_int;
    clock_nanosleep = c"clock_nanosleep": fn(clock: libc::clockid_t, flags: c_int, req: *const libc::timespec, rem: *mut libc::timespec) -> c_int;
    usleep = c"usleep": fn(usec: libc::useconds_t) -> c_int;
    open = c"open": fn(path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    open64 = c"open64": fn(path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int;
}

/// `fopen` and `fopen64`'s next definitions (they return a pointer, null when missing).
static FOPEN: Slot = Slot::new(c"fopen");
static FOPEN64: Slot = Slot::new(c"fopen64");

/// Looks `fopen` and `fopen64` up now (from the constructor).
pub(crate) fn resolve_fopen() {
    FOPEN.get();
    FOPEN64.get();
}

/// Calls the next definition of `fopen` (`large`: `fopen64`); null with ENOSYS if none.
///
/// # Safety
/// As for libc's `fopen`.
pub(crate) unsafe fn fopen(large: bool, path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE {
    match if large { FOPEN64.get() } else { FOPEN.get() } {
        Some(addr) => {
            // SAFETY: `addr` is the next definition of fopen (or fopen64), of this C type; the
            // caller keeps its contract.
            unsafe {
                let f = core::mem::transmute::<
                    usize,
                    unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> *mut libc::FILE,
                >(addr);
                f(path, mode)
            }
        }
        None => {
            fail_enosys();
            core::ptr::null_mut()
        }
    }
}
