//! What the hooks do with a descriptor once they know what it is: the decisions, apart from
//! the C signatures (in `hooks`), so that they are written once for every variant.

use core::ffi::c_int;
use std::io::IoSlice;

use libc::iovec;
use microrep_interpose_wire::{Kind, MAX_DATA, OutputBucket, Request, Status};

use crate::channel::{self, MAX_PIECES};
use crate::state::{self, Fd};
use crate::{classify, input};

/// Sets the calling thread's errno and returns -1.
pub(crate) fn fail(errno: c_int) -> isize {
    // SAFETY: errno is this thread's own variable.
    unsafe { *libc::__errno_location() = errno };
    -1
}

/// Waits until the wrap node lets client input through (see `state::enter_gate`): the gated
/// call to hold until the input committed, or `Err` for a non-blocking descriptor, whose
/// caller fails with `EAGAIN` (it polls again; a single-threaded server must not block here,
/// as the node needs it to answer the commands that end the wait).
pub(crate) fn pass_gate(fd: c_int) -> Result<Option<state::GatedCall>, ()> {
    loop {
        if let Some(call) = state::enter_gate() {
            return Ok(call);
        }
        // SAFETY: F_GETFL on the caller's descriptor takes no pointer.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || flags & libc::O_NONBLOCK != 0 {
            return Err(());
        }
        // The system call itself: libc's nanosleep is the shim's own hook, which would count
        // this pause into an input window's time.
        let _ = rustix::thread::nanosleep(&rustix::thread::Timespec { tv_sec: 0, tv_nsec: 200_000 });
    }
}

/// Before `accept` on `listener`: the gated call an accept of a client holds (see
/// [`pass_gate`]); nothing to hold outside the wrapped process or on other listeners.
pub(crate) fn accept_gate(listener: c_int) -> Result<Option<state::GatedCall>, ()> {
    if !state::active() || !classify::is_tcp(listener) {
        return Ok(None);
    }
    pass_gate(listener)
}

/// Whether the server may keep a connection it just accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Keep,
    Refuse,
}

/// Decides about descriptor `conn` that `accept` returned for `listener`: a TCP client of
/// the leader is committed (its id is the log index of the accept), the local replay agent's
/// connections pass, anything else on a TCP listener is refused.
pub(crate) fn accepted(listener: c_int, conn: c_int) -> Verdict {
    state::set(conn, Fd::Other);
    if !state::active() || !classify::is_tcp(listener) {
        return Verdict::Keep;
    }
    let Some((port, loopback)) = classify::peer(conn) else { return Verdict::Refuse };
    let request = Request { kind: Kind::Accept, len: u32::from(loopback), value: u64::from(port) };
    let what = match channel::request(request, &[]).map(|r| (r.status, r.value)) {
        Some((Status::Committed, id)) => {
            state::set_output_digest(conn, None);
            Fd::Client { conn: id, broken: false }
        }
        Some((Status::Replay, _)) => Fd::Replay,
        _ => return Verdict::Refuse,
    };
    if state::set(conn, what) { Verdict::Keep } else { Verdict::Refuse }
}

/// Hands `n` bytes the server read on client connection `conn` (descriptor `fd`) to the wrap
/// node and returns `n` once committed; if they cannot be, the connection is broken: this read
/// and every later one fail with ECONNRESET.
pub(crate) fn commit(fd: c_int, conn: u64, data: &[IoSlice<'_>], n: isize) -> isize {
    let request = Request { kind: Kind::Data, len: n as u32, value: conn };
    match channel::request(request, data) {
        Some(reply) if reply.status == Status::Committed => {
            input::begin(reply.value);
            n
        }
        _ => {
            state::set(fd, Fd::Client { conn, broken: true });
            fail(libc::ECONNRESET)
        }
    }
}

/// Before the real `close(fd)`: forgets the descriptor, orders a client's close through the
/// log, and counts a replay connection's unread input as taken. False if the descriptor is the shim's own channel, which the server must not close.
pub(crate) fn closing(fd: c_int) -> bool {
    if channel::is_channel(fd) && state::active() {
        return false;
    }
    match state::take(fd) {
        Fd::Client { conn, .. } if state::active() => {
            if let Some(last) = state::output_digest(fd).partial() {
                report_output(conn, last);
            }
            channel::request(Request { kind: Kind::Close, len: 0, value: conn }, &[]);
        }
        Fd::Replay if state::active() => {
            // Replayed input the server closes without reading counts as taken: the agent waits
            // for it before replaying on another connection.
            // SAFETY: borrowed for one ioctl while the caller's descriptor is still open.
            let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            if let Ok(unread) = rustix::io::ioctl_fionread(sock) {
                state::count_replay_read(unread as isize);
            }
        }
        _ => {}
    }
    true
}

/// Tells the wrap node that connection `conn`'s output completed (or, closing, ended) `bucket`.
fn report_output(conn: u64, bucket: OutputBucket) {
    let request = Request { kind: Kind::Output, len: OutputBucket::BYTES as u32, value: conn };
    channel::request(request, &[IoSlice::new(&bucket.encode())]);
}

/// After the server wrote `n` bytes from `data` to `fd`: a client connection's output is
/// digested, and each bucket it completes reported (output checking; docs/WRAP.md).
pub(crate) fn wrote<'a>(fd: c_int, data: impl IntoIterator<Item = &'a [u8]>, n: isize) {
    let Ok(mut left) = usize::try_from(n) else { return };
    let Fd::Client { conn, broken: false } = state::lookup(fd) else { return };
    let mut digest = state::output_digest(fd);
    for piece in data {
        if left == 0 {
            break;
        }
        let bytes = piece.get(..left.min(piece.len())).unwrap_or_default();
        left -= bytes.len();
        digest.feed(bytes, |bucket| report_output(conn, bucket));
    }
    state::set_output_digest(fd, Some(digest));
}

/// A read of replayed input on a replay-agent connection, made by `call(len)` for at most
/// `count` bytes: shortened to the end of the entry the next byte belongs to, whose input time
/// the server then sees (`input`).
fn replayed(count: usize, call: impl FnOnce(usize) -> isize) -> isize {
    let (len, time_ns) = input::replay_read_len(count);
    let n = call(len);
    if n > 0 {
        input::begin(time_ns);
    }
    state::count_replay_read(n);
    n
}

/// A read of `count` bytes into `buf` from `/dev/urandom`: drawn from the cluster's seed, or
/// made by `call` without one.
fn random(buf: *mut u8, count: usize, call: impl FnOnce(usize) -> isize) -> isize {
    if buf.is_null() || count == 0 {
        return call(count);
    }
    // SAFETY: read's contract: `buf` holds `count` writable bytes.
    let out = unsafe { core::slice::from_raw_parts_mut(buf, count) };
    if input::draw(out) { count as isize } else { call(count) }
}

/// A read of at most `count` bytes into `buf` on `fd`, made by `call(len)`.
pub(crate) fn single(fd: c_int, buf: *mut u8, count: usize, call: impl FnOnce(usize) -> isize) -> isize {
    match state::lookup(fd) {
        Fd::Other => call(count),
        Fd::Replay => replayed(count, call),
        Fd::Random => random(buf, count, call),
        Fd::Client { broken: true, .. } => fail(libc::ECONNRESET),
        Fd::Client { conn, .. } => {
            let Ok(_call) = pass_gate(fd) else { return fail(libc::EAGAIN) };
            let n = call(count.min(MAX_DATA));
            if n <= 0 || buf.is_null() {
                return n;
            }
            // SAFETY: the call just wrote `n` (> 0, at most `count`) bytes at `buf`, a buffer
            // the caller gave for at least `count` bytes.
            let data = unsafe { core::slice::from_raw_parts(buf, n as usize) };
            commit(fd, conn, &[IoSlice::new(data)], n)
        }
    }
}

/// The first entries of `iov`, shortened so that they add up to at most `limit` bytes, copied
/// into `out`; returns how many.
pub(crate) fn cap(iov: &[iovec], limit: usize, out: &mut [iovec; MAX_PIECES]) -> usize {
    let mut room = limit;
    let mut used = 0;
    for (slot, v) in out.iter_mut().zip(iov) {
        if room == 0 {
            break;
        }
        let len = v.iov_len.min(room);
        *slot = iovec { iov_base: v.iov_base, iov_len: len };
        room -= len;
        used += 1;
    }
    used
}

/// The first `n` bytes held by `iov`, as slices in `out`; returns how many.
///
/// # Safety
/// Each entry of `iov` points to `iov_len` initialised bytes that outlive `'a`.
pub(crate) unsafe fn filled<'a>(iov: &[iovec], mut n: usize, out: &mut [IoSlice<'a>; MAX_PIECES]) -> usize {
    let mut used = 0;
    for (slot, v) in out.iter_mut().zip(iov) {
        if n == 0 {
            break;
        }
        let len = v.iov_len.min(n);
        // SAFETY: the caller guarantees `len <= iov_len` initialised bytes at `iov_base`.
        *slot = IoSlice::new(unsafe { core::slice::from_raw_parts(v.iov_base.cast::<u8>(), len) });
        n -= len;
        used += 1;
    }
    used
}

/// A scattered read into `iov` on `fd`, made by `call(iov, count)`.
pub(crate) fn vectored(fd: c_int, iov: &[iovec], call: impl FnOnce(*const iovec, c_int) -> isize) -> isize {
    let mut capped = [iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; MAX_PIECES];
    match state::lookup(fd) {
        Fd::Other => call(iov.as_ptr(), iov.len() as c_int),
        Fd::Replay => replayed(usize::MAX, |len| {
            let k = cap(iov, len, &mut capped);
            call(capped.as_ptr(), k as c_int)
        }),
        Fd::Random => {
            // The first buffer only: a shorter read is legal.
            let first = iov.iter().find(|v| v.iov_len > 0);
            random(first.map_or(core::ptr::null_mut(), |v| v.iov_base.cast()), first.map_or(0, |v| v.iov_len), |_| {
                call(iov.as_ptr(), iov.len() as c_int)
            })
        }
        Fd::Client { broken: true, .. } => fail(libc::ECONNRESET),
        Fd::Client { conn, .. } => {
            let Ok(_call) = pass_gate(fd) else { return fail(libc::EAGAIN) };
            let k = cap(iov, MAX_DATA, &mut capped);
            let n = call(capped.as_ptr(), k as c_int);
            if n <= 0 {
                return n;
            }
            let mut parts = [IoSlice::new(&[]); MAX_PIECES];
            // SAFETY: the call filled the first `n` bytes of the capped entries, which point
            // into the caller's buffers, alive for this call.
            let used = unsafe { filled(capped.get(..k).unwrap_or_default(), n as usize, &mut parts) };
            commit(fd, conn, parts.get(..used).unwrap_or_default(), n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(buf: &mut [u8]) -> iovec {
        iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }
    }

    #[test]
    fn capping_keeps_at_most_max_data_bytes() {
        let (mut a, mut b, mut c) = (vec![0u8; 100], vec![0u8; MAX_DATA], vec![0u8; 10]);
        let v = [iov(&mut a), iov(&mut b), iov(&mut c)];
        let mut out = [iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; MAX_PIECES];
        let k = cap(&v, MAX_DATA, &mut out);
        assert_eq!(k, 2);
        assert_eq!(out[0].iov_len, 100);
        assert_eq!(out[1].iov_len, MAX_DATA - 100);
        let many: Vec<iovec> = (0..40).map(|_| iov(&mut c)).collect();
        assert_eq!(cap(&many, usize::MAX, &mut out), MAX_PIECES, "never more entries than the request carries");
        assert_eq!(cap(&v, 0, &mut out), 0, "nothing to read");
        assert_eq!((cap(&v, 104, &mut out), out[1].iov_len), (2, 4), "an entry's end cuts the read");
    }

    #[test]
    fn filled_slices_cover_exactly_the_bytes_read() {
        let (mut a, mut b) = (b"hello ".to_vec(), b"world!".to_vec());
        let v = [iov(&mut a), iov(&mut b)];
        let mut out = [IoSlice::new(&[]); MAX_PIECES];
        // SAFETY: both entries point into live vectors.
        let used = unsafe { filled(&v, 8, &mut out) };
        let bytes: Vec<u8> = out[..used].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(bytes, b"hello wo");
    }

    #[test]
    fn an_inactive_process_passes_reads_and_accepts_through() {
        let mut buf = [0u8; 8];
        let n = single(3, buf.as_mut_ptr(), 8, |len| len as isize);
        assert_eq!(n, 8, "untracked descriptors are read as asked");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let _c = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (s, _) = listener.accept().expect("accept");
        use std::os::fd::AsRawFd;
        assert_eq!(accepted(listener.as_raw_fd(), s.as_raw_fd()), Verdict::Keep);
        assert!(closing(s.as_raw_fd()));
    }
}
