//! The plain TCP baseline of `microrep bench replication --fabric tcp`: a ping-pong on loopback
//! with what one replication round puts on the wire of one follower. The client sends a request
//! of the payload's size and blocks until an 8-byte reply arrives, as the tcp fabric's WRITE is
//! answered by an 8-byte acknowledgement from the follower's NIC thread; with 3 replicas a commit
//! waits for one follower's acknowledgement (the leader is the rest of the majority). Blocking
//! sockets with `TCP_NODELAY`; the echo server runs in another process than the measuring
//! leader (the benchmark's driver), as the followers do.
//!
//! Wire: the client opens with its request size (u32, little endian), then sends requests of
//! exactly that many bytes; the server answers each with the number of bytes it has read on the
//! connection so far (u64, little endian), so the client can check that no byte was lost or
//! merged into the wrong request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// The largest request the server accepts (the benchmark's largest payload).
pub(crate) const MAX_REQUEST: u32 = 65_536;

/// The reply's size: the tcp fabric's acknowledgement of a WRITE is as small.
pub(crate) const REPLY_BYTES: usize = 8;

/// Why the ping-pong baseline failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PingPongError {
    #[error("ping-pong: {0}")]
    Io(#[from] std::io::Error),
    #[error("ping-pong: connecting to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("ping-pong: request size {0} is outside 1..={MAX_REQUEST}")]
    Size(u32),
    #[error("ping-pong: request of {request} bytes on a {size}-byte connection")]
    WrongSize { request: usize, size: usize },
    #[error("ping-pong: the server acknowledged {acknowledged} bytes, {sent} were sent")]
    Lost { acknowledged: u64, sent: u64 },
}

/// A loopback server answering each request with an 8-byte reply, one thread per connection;
/// stopped and joined when dropped (connection threads end when their client closes).
pub(crate) struct PingPongServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl PingPongServer {
    /// Listens on an ephemeral port of 127.0.0.1.
    pub(crate) fn start() -> Result<Self, PingPongError> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if flag.load(Ordering::Acquire) {
                    break;
                }
                match stream {
                    Ok(stream) => {
                        std::thread::spawn(move || serve(stream));
                    }
                    Err(e) => tracing::warn!("ping-pong server: accept failed: {e}"),
                }
            }
        });
        Ok(Self { addr, stop, acceptor: Some(acceptor) })
    }

    /// Where clients connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for PingPongServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the acceptor, which then sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Serves one connection until its client closes it or breaks the protocol.
fn serve(mut stream: TcpStream) {
    if let Err(e) = serve_requests(&mut stream) {
        tracing::warn!("ping-pong server: dropping a connection: {e}");
    }
}

fn serve_requests(stream: &mut TcpStream) -> Result<(), PingPongError> {
    stream.set_nodelay(true)?;
    let mut header = [0u8; 4];
    if stream.read_exact(&mut header).is_err() {
        return Ok(()); // closed before a request size: the acceptor's own wake-up, say
    }
    let size = u32::from_le_bytes(header);
    if size == 0 || size > MAX_REQUEST {
        return Err(PingPongError::Size(size));
    }
    let mut request = vec![0u8; size as usize];
    let mut received = 0u64;
    loop {
        match stream.read_exact(&mut request) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        received += u64::from(size);
        stream.write_all(&received.to_le_bytes())?;
    }
}

/// A client connection for one request size.
pub(crate) struct PingPong {
    stream: TcpStream,
    size: usize,
    sent: u64,
}

impl PingPong {
    /// Connects to `addr` for requests of `size` bytes.
    pub(crate) fn connect(addr: SocketAddr, size: u32) -> Result<Self, PingPongError> {
        if size == 0 || size > MAX_REQUEST {
            return Err(PingPongError::Size(size));
        }
        let mut stream = TcpStream::connect(addr).map_err(|source| PingPongError::Connect { addr, source })?;
        stream.set_nodelay(true)?;
        stream.write_all(&size.to_le_bytes())?;
        Ok(Self { stream, size: size as usize, sent: 0 })
    }

    /// Sends `request` (exactly the connection's size) and waits for its reply.
    pub(crate) fn round_trip(&mut self, request: &[u8]) -> Result<(), PingPongError> {
        if request.len() != self.size {
            return Err(PingPongError::WrongSize { request: request.len(), size: self.size });
        }
        self.stream.write_all(request)?;
        self.sent += self.size as u64;
        let mut reply = [0u8; REPLY_BYTES];
        self.stream.read_exact(&mut reply)?;
        let acknowledged = u64::from_le_bytes(reply);
        if acknowledged != self.sent {
            return Err(PingPongError::Lost { acknowledged, sent: self.sent });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_is_acknowledged_with_the_bytes_received_so_far() {
        let server = PingPongServer::start().expect("server");
        for size in [1, 8, 4096, MAX_REQUEST] {
            let mut client = PingPong::connect(server.addr(), size).expect("connect");
            for i in 0..20u8 {
                client.round_trip(&vec![i; size as usize]).expect("round trip");
            }
            assert_eq!(client.sent, 20 * u64::from(size));
        }
    }

    #[test]
    fn a_request_of_the_wrong_size_is_refused_before_sending() {
        let server = PingPongServer::start().expect("server");
        let mut client = PingPong::connect(server.addr(), 8).expect("connect");
        let err = client.round_trip(&[0; 9]).expect_err("9 bytes on an 8-byte connection");
        assert!(matches!(err, PingPongError::WrongSize { request: 9, size: 8 }), "{err}");
        client.round_trip(&[0; 8]).expect("the connection still works");
    }

    #[test]
    fn sizes_out_of_range_are_refused_by_client_and_server() {
        let server = PingPongServer::start().expect("server");
        assert!(matches!(PingPong::connect(server.addr(), 0), Err(PingPongError::Size(0))));
        assert!(matches!(PingPong::connect(server.addr(), MAX_REQUEST + 1), Err(PingPongError::Size(_))));
        // A raw client announcing a bad size: the server closes the connection without a reply.
        let mut raw = TcpStream::connect(server.addr()).expect("connect");
        raw.write_all(&(MAX_REQUEST + 1).to_le_bytes()).expect("header");
        let mut buf = [0u8; 1];
        assert_eq!(raw.read(&mut buf).expect("read until close"), 0);
    }

    #[test]
    fn a_short_request_is_not_acknowledged() {
        let server = PingPongServer::start().expect("server");
        let mut raw = TcpStream::connect(server.addr()).expect("connect");
        raw.write_all(&16u32.to_le_bytes()).expect("header");
        raw.write_all(&[7; 15]).expect("15 of 16 bytes");
        raw.shutdown(std::net::Shutdown::Write).expect("half-close");
        let mut rest = Vec::new();
        raw.read_to_end(&mut rest).expect("read until close");
        assert!(rest.is_empty(), "the server answered an incomplete request: {rest:?}");
    }
}
