//! The shim's one connection to its wrap node: a unix stream socket opened at first use,
//! guarded by a spin lock (a server may read from several threads), written and read with
//! raw system calls (rustix), so that nothing here allocates or goes through the hooks.

use core::ffi::c_int;
use std::io::IoSlice;
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use microrep_interpose_wire::{HEADER_BYTES, Reply, Request};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SendAncillaryBuffer, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use crate::state;

/// Most payload pieces one request carries.
pub(crate) const MAX_PIECES: usize = 16;

static FD: AtomicI32 = AtomicI32::new(-1);
static LOCK: AtomicBool = AtomicBool::new(false);

struct Guard;

impl Guard {
    fn take() -> Self {
        while LOCK.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        Self
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
    }
}

/// Whether `fd` is the channel's own socket (the server must not close it under us).
pub(crate) fn is_channel(fd: c_int) -> bool {
    fd >= 0 && FD.load(Ordering::Relaxed) == fd
}

fn connect() -> Option<c_int> {
    let path = state::socket_path()?;
    let addr = SocketAddrUnix::new(path).ok()?;
    let sock = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None).ok()?;
    rustix::net::connect(&sock, &addr).ok()?;
    Some(sock.into_raw_fd())
}

fn disconnect(fd: c_int) {
    FD.store(-1, Ordering::Relaxed);
    // SAFETY: `fd` is the channel socket this module opened and nobody else owns.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
}

fn send_all(fd: BorrowedFd<'_>, mut parts: &mut [IoSlice<'_>]) -> Result<(), Errno> {
    while !parts.is_empty() {
        match rustix::net::sendmsg(fd, parts, &mut SendAncillaryBuffer::default(), SendFlags::NOSIGNAL) {
            Ok(0) => return Err(Errno::PIPE),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn recv_exact(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<(), Errno> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        match rustix::io::read(fd, rest) {
            Ok(0) => return Err(Errno::PIPE),
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends `request` with `payload` (at most [`MAX_PIECES`] pieces) and waits for the reply;
/// `None` if the wrap node cannot be reached (the caller refuses).
pub(crate) fn request(request: Request, payload: &[IoSlice<'_>]) -> Option<Reply> {
    let _guard = Guard::take();
    let mut fd = FD.load(Ordering::Relaxed);
    if fd < 0 {
        fd = connect()?;
        FD.store(fd, Ordering::Relaxed);
    }
    let header = request.encode();
    let mut parts = [IoSlice::new(&[]); MAX_PIECES + 1];
    let mut count = 0;
    for (slot, piece) in parts.iter_mut().zip(core::iter::once(IoSlice::new(&header)).chain(payload.iter().copied())) {
        *slot = piece;
        count += 1;
    }
    // SAFETY: `fd` is the open channel socket, owned by this module; the lock is held.
    let sock = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut reply = [0u8; HEADER_BYTES];
    let outcome = send_all(sock, parts.get_mut(..count)?).and_then(|()| recv_exact(sock, &mut reply));
    match outcome.ok().and_then(|()| Reply::decode(&reply).ok()) {
        Some(reply) => Some(reply),
        None => {
            disconnect(fd);
            None
        }
    }
}
