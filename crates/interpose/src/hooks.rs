//! The exported C functions that stand in front of libc's. Each converts its arguments and
//! calls into `intercept`; descriptors the shim does not track cost one table load.

use core::ffi::{c_int, c_void};

use libc::{iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t};

use crate::intercept::{self, Verdict};
use crate::{input, real, state};

fn accept_loop(listener: c_int, call: impl Fn() -> c_int) -> c_int {
    loop {
        let Ok(_call) = intercept::accept_gate(listener) else { return intercept::fail(libc::EAGAIN) as c_int };
        let fd = call();
        if fd < 0 || intercept::accepted(listener, fd) == Verdict::Keep {
            return fd;
        }
        // SAFETY: `fd` was just returned by accept and is refused: nothing else knows it.
        unsafe { real::close(fd) };
    }
}

/// `accept(2)`.
///
/// # Safety
/// As for libc's `accept`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    accept_loop(fd, || unsafe { real::accept(fd, addr, len) })
}

/// `accept4(2)`.
///
/// # Safety
/// As for libc's `accept4`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    accept_loop(fd, || unsafe { real::accept4(fd, addr, len, flags) })
}

/// `read(2)`.
///
/// # Safety
/// As for libc's `read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's buffer, with a length no greater than it gave.
    intercept::single(fd, buf.cast(), count, |len| unsafe { real::read(fd, buf, len) })
}

/// glibc's fortified `read`.
///
/// # Safety
/// As for glibc's `__read_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t {
    if count > buflen {
        // SAFETY: glibc's own check reports the overflow (and aborts).
        return unsafe { real::__read_chk(fd, buf, count, buflen) };
    }
    // SAFETY: the caller's buffer, with a length no greater than it gave.
    intercept::single(fd, buf.cast(), count, |len| unsafe { real::read(fd, buf, len) })
}

/// `recv(2)`.
///
/// # Safety
/// As for libc's `recv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    if flags & libc::MSG_PEEK != 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::recv(fd, buf, len, flags) };
    }
    // SAFETY: the caller's buffer, with a length no greater than it gave.
    intercept::single(fd, buf.cast(), len, |n| unsafe { real::recv(fd, buf, n, flags) })
}

/// glibc's fortified `recv`.
///
/// # Safety
/// As for glibc's `__recv_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    if len > buflen || flags & libc::MSG_PEEK != 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::__recv_chk(fd, buf, len, buflen, flags) };
    }
    // SAFETY: the caller's buffer, with a length no greater than it gave.
    intercept::single(fd, buf.cast(), len, |n| unsafe { real::recv(fd, buf, n, flags) })
}

/// `recvfrom(2)`.
///
/// # Safety
/// As for libc's `recvfrom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if flags & libc::MSG_PEEK != 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::recvfrom(fd, buf, len, flags, addr, alen) };
    }
    // SAFETY: the caller's buffer, with a length no greater than it gave.
    intercept::single(fd, buf.cast(), len, |n| unsafe { real::recvfrom(fd, buf, n, flags, addr, alen) })
}

/// The caller's scatter list as a slice (empty if absent).
///
/// # Safety
/// `iov` points to `count` entries (when not null and `count` is positive).
unsafe fn entries<'a>(iov: *const iovec, count: usize) -> &'a [iovec] {
    if iov.is_null() || count == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { core::slice::from_raw_parts(iov, count) }
}

/// `readv(2)`.
///
/// # Safety
/// As for libc's `readv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    if iovcnt < 0 {
        // SAFETY: the caller's arguments, passed on unchanged (the kernel reports EINVAL).
        return unsafe { real::readv(fd, iov, iovcnt) };
    }
    // SAFETY: readv's contract: `iov` holds `iovcnt` entries.
    let list = unsafe { entries(iov, iovcnt as usize) };
    // SAFETY: `v` holds `n` entries into the caller's buffers.
    intercept::vectored(fd, list, |v, n| unsafe { real::readv(fd, v, n) })
}

/// `recvmsg(2)`.
///
/// # Safety
/// As for libc's `recvmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() || flags & libc::MSG_PEEK != 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::recvmsg(fd, msg, flags) };
    }
    // SAFETY: recvmsg's contract: `msg` is a valid header whose `msg_iov` holds `msg_iovlen`
    // entries.
    let list = unsafe { entries((*msg).msg_iov, (*msg).msg_iovlen) };
    intercept::vectored(fd, list, |v, n| {
        // SAFETY: a copy of the caller's header with (possibly) a shortened scatter list into
        // the same buffers; the fields recvmsg sets are copied back.
        unsafe {
            let mut local = *msg;
            local.msg_iov = v.cast_mut();
            local.msg_iovlen = n as usize;
            let got = real::recvmsg(fd, &mut local, flags);
            (*msg).msg_namelen = local.msg_namelen;
            (*msg).msg_controllen = local.msg_controllen;
            (*msg).msg_flags = local.msg_flags;
            got
        }
    })
}

/// A byte slice over `len` bytes at `buf` (empty for a null pointer).
///
/// # Safety
/// `buf` is null or points to `len` initialised bytes that outlive `'a`.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), len) }
}

/// The caller's gather list, as byte slices.
///
/// # Safety
/// `iov` is null or holds `count` entries, each pointing to `iov_len` initialised bytes that
/// outlive `'a`.
unsafe fn gathered<'a>(iov: *const iovec, count: usize) -> impl Iterator<Item = &'a [u8]> {
    // SAFETY: guaranteed by the caller.
    let list = unsafe { entries(iov, count) };
    // SAFETY: each entry is valid for `iov_len` bytes (the caller's guarantee).
    list.iter().map(|v| unsafe { bytes(v.iov_base, v.iov_len) })
}

/// `write(2)`: a client's output on the leader is digested (output checking).
///
/// # Safety
/// As for libc's `write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { real::write(fd, buf, count) };
    // SAFETY: the caller's buffer of `count` bytes, of which the call wrote `n`.
    intercept::wrote(fd, [unsafe { bytes(buf, count) }], n);
    n
}

/// `writev(2)`.
///
/// # Safety
/// As for libc's `writev`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { real::writev(fd, iov, iovcnt) };
    // SAFETY: writev's contract: `iov` holds `iovcnt` valid entries.
    intercept::wrote(fd, unsafe { gathered(iov, usize::try_from(iovcnt).unwrap_or(0)) }, n);
    n
}

/// `send(2)`.
///
/// # Safety
/// As for libc's `send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { real::send(fd, buf, len, flags) };
    // SAFETY: the caller's buffer of `len` bytes.
    intercept::wrote(fd, [unsafe { bytes(buf, len) }], n);
    n
}

/// `sendto(2)`.
///
/// # Safety
/// As for libc's `sendto`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { real::sendto(fd, buf, len, flags, addr, alen) };
    // SAFETY: the caller's buffer of `len` bytes.
    intercept::wrote(fd, [unsafe { bytes(buf, len) }], n);
    n
}

/// `sendmsg(2)`.
///
/// # Safety
/// As for libc's `sendmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { real::sendmsg(fd, msg, flags) };
    if !msg.is_null() {
        // SAFETY: sendmsg's contract: `msg` is a valid header whose `msg_iov` holds
        // `msg_iovlen` entries.
        intercept::wrote(fd, unsafe { gathered((*msg).msg_iov, (*msg).msg_iovlen) }, n);
    }
    n
}

/// `close(2)`.
///
/// # Safety
/// As for libc's `close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !intercept::closing(fd) {
        return 0;
    }
    // SAFETY: the caller's descriptor, passed on unchanged.
    unsafe { real::close(fd) }
}

/// Before a readiness wait of the thread that reads replayed input, if it read some since it
/// was last seen idle: `probe` polls without blocking. Nothing ready means the server processed
/// everything it read (an event loop processes what it reads before it waits again), which the
/// shim records for the wrap node (promotion and state transfer wait for it). Something ready
/// (or an error) is returned to the caller as an early end of its wait.
fn probe_idle(probe: impl FnOnce() -> c_int) -> Option<c_int> {
    input::end_on_this_thread();
    let read = state::unsettled()?;
    let n = probe();
    if n == 0 {
        state::settle(read);
        return None;
    }
    Some(n)
}

/// `epoll_wait(2)`.
///
/// # Safety
/// As for libc's `epoll_wait`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int {
    // SAFETY: the caller's arguments, with no timeout.
    if let Some(n) = probe_idle(|| unsafe { real::epoll_wait(epfd, events, max, 0) }) {
        return n;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real::epoll_wait(epfd, events, max, timeout) }
}

/// `epoll_pwait(2)`.
///
/// # Safety
/// As for libc's `epoll_pwait`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's arguments, with no timeout.
    if let Some(n) = probe_idle(|| unsafe { real::epoll_pwait(epfd, events, max, 0, mask) }) {
        return n;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real::epoll_pwait(epfd, events, max, timeout, mask) }
}

/// `poll(2)`.
///
/// # Safety
/// As for libc's `poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's arguments, with no timeout (a later call sets every `revents` again).
    if let Some(n) = probe_idle(|| unsafe { real::poll(fds, nfds, 0) }) {
        return n;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real::poll(fds, nfds, timeout) }
}

/// A copy of the caller's descriptor set, if any.
///
/// # Safety
/// `set` is null or points to a valid `fd_set`.
unsafe fn copy_set(set: *const libc::fd_set) -> Option<libc::fd_set> {
    // SAFETY: guaranteed by the caller.
    (!set.is_null()).then(|| unsafe { *set })
}

/// `select(2)`.
///
/// # Safety
/// As for libc's `select`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    let probe = || {
        // SAFETY: select's contract: each set is null or valid. The probe selects on copies
        // (select overwrites its sets) and hands the result back only if something was ready.
        unsafe {
            let mut sets = [copy_set(r), copy_set(w), copy_set(e)];
            let [pr, pw, pe] = sets.each_mut().map(|s| s.as_mut().map_or(core::ptr::null_mut(), |s| s as *mut _));
            let mut zero = libc::timeval { tv_sec: 0, tv_usec: 0 };
            let got = real::select(n, pr, pw, pe, &mut zero);
            if got != 0 {
                for (dest, copy) in [r, w, e].into_iter().zip(sets) {
                    if let Some(copy) = copy {
                        *dest = copy;
                    }
                }
            }
            got
        }
    };
    if let Some(got) = probe_idle(probe) {
        return got;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real::select(n, r, w, e, t) }
}
