//! Which descriptors the shim acts on: connections accepted from a listening TCP socket (IPv4
//! or IPv6). Unix sockets, UDP, pipes, eventfds and files are left alone.

use core::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;

use rustix::net::{AddressFamily, SocketType, sockopt};

/// Whether `fd` is a TCP (stream, IPv4 or IPv6) socket.
pub(crate) fn is_tcp(fd: c_int) -> bool {
    if fd < 0 {
        return false;
    }
    // SAFETY: only borrowed for the two getsockopt calls below, while the caller's descriptor
    // is open (a closed or non-socket descriptor just makes them fail).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let inet = matches!(sockopt::socket_domain(fd), Ok(AddressFamily::INET | AddressFamily::INET6));
    inet && sockopt::socket_type(fd) == Ok(SocketType::STREAM)
}

/// The peer of connected socket `fd`: its port, and whether it is on loopback.
pub(crate) fn peer(fd: c_int) -> Option<(u16, bool)> {
    if fd < 0 {
        return None;
    }
    // SAFETY: as in `is_tcp`: borrowed for one getpeername call on the caller's descriptor.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let addr = SocketAddr::try_from(rustix::net::getpeername(fd).ok()??).ok()?;
    let loopback = match addr.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    };
    Some((addr.port(), loopback))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn tcp_listeners_and_their_connections_are_tcp() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        assert!(is_tcp(listener.as_raw_fd()));
        assert!(is_tcp(server.as_raw_fd()));
        let port = client.local_addr().expect("addr").port();
        assert_eq!(peer(server.as_raw_fd()), Some((port, true)));
    }

    #[test]
    fn other_descriptors_are_not() {
        let dir = std::env::temp_dir().join(format!("interpose-classify-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let unix = UnixListener::bind(&dir).expect("bind unix");
        let (a, _b) = UnixStream::pair().expect("pair");
        let udp = UdpSocket::bind("127.0.0.1:0").expect("udp");
        let (pipe_r, pipe_w) = rustix::pipe::pipe().expect("pipe");
        let file = std::fs::File::open("/proc/self/status").expect("file");
        for fd in [unix.as_raw_fd(), a.as_raw_fd(), udp.as_raw_fd(), pipe_r.as_raw_fd(), pipe_w.as_raw_fd()] {
            assert!(!is_tcp(fd), "fd {fd}");
        }
        assert!(!is_tcp(file.as_raw_fd()));
        assert!(!is_tcp(-1));
        assert_eq!(peer(a.as_raw_fd()), None, "a unix peer has no port");
        std::fs::remove_file(&dir).expect("cleanup");
    }
}
