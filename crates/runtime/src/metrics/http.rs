//! The metrics listener: a thread of its own answering `GET /metrics` with a minimal HTTP/1.1
//! responder, one connection at a time, closing each after its response. A scraper that is
//! slow to send or to read holds only this thread, and for at most [`IO_TIMEOUT`] per
//! operation; the node's threads never wait for it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest wait for one read or write of a scraper's connection.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest request head read.
const MAX_HEAD: usize = 8192;

/// The OpenMetrics text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running metrics listener; dropping it stops its thread.
#[derive(Debug)]
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `render()` at `/metrics` on `listener` from a thread named `name`.
    pub(crate) fn start(
        listener: TcpListener,
        name: String,
        render: impl Fn() -> String + Send + 'static,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name(name).spawn(move || serve(&listener, &flag, &render))?;
        Ok(Self { addr, stop, thread: Some(thread) })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
        }
        if let Err(e) = TcpStream::connect_timeout(&wake, IO_TIMEOUT) {
            // The thread then stops at its next connection; do not wait for one.
            tracing::warn!(addr = %wake, error = %e, "cannot wake the metrics thread; leaving it");
            return;
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the metrics thread panicked");
        }
    }
}

fn serve(listener: &TcpListener, stop: &AtomicBool, render: &dyn Fn() -> String) {
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        match stream {
            Ok(stream) => {
                if let Err(e) = answer(stream, render) {
                    tracing::debug!(error = %e, "a metrics scrape failed");
                }
            }
            // Out of descriptors, or a connection reset before it was accepted: the next
            // accept may work.
            Err(e) => tracing::warn!(error = %e, "accepting a metrics connection"),
        }
    }
}

/// Reads one request head and answers it.
fn answer(mut stream: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return respond(&mut stream, "431 Request Header Fields Too Large", "text/plain", b"", false);
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let with_body = method == "GET";
    if !with_body && method != "HEAD" {
        return respond(&mut stream, "405 Method Not Allowed", "text/plain", b"only GET and HEAD\n", true);
    }
    match path {
        "/metrics" => respond(&mut stream, "200 OK", CONTENT_TYPE, render().as_bytes(), with_body),
        "/" => respond(&mut stream, "200 OK", "text/plain", b"microrep: metrics at /metrics\n", with_body),
        _ => respond(&mut stream, "404 Not Found", "text/plain", b"not found; metrics are at /metrics\n", with_body),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if with_body {
        stream.write_all(body)?;
    }
    stream.flush()?;
    stream.shutdown(Shutdown::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s.write_all(request.as_bytes()).expect("send");
        let mut reply = String::new();
        s.read_to_string(&mut reply).expect("reply");
        reply
    }

    #[test]
    fn answers_metrics_head_unknown_paths_and_methods_and_stops_when_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = MetricsServer::start(listener, "metrics-test".into(), || "m 1\n# EOF\n".into()).expect("start");
        let addr = server.addr();
        let reply = request(addr, "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains(CONTENT_TYPE) && reply.contains("Content-Length: 10\r\n"), "{reply}");
        assert!(reply.ends_with("\r\n\r\nm 1\n# EOF\n"), "{reply}");
        let reply = request(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n") && reply.ends_with("\r\n\r\n"), "{reply}");
        assert!(request(addr, "GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(request(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        // A scraper that connects and says nothing holds the thread for IO_TIMEOUT at most.
        let silent = TcpStream::connect(addr).expect("connect");
        drop(server);
        drop(silent);
        assert!(TcpStream::connect(addr).is_err(), "the listener is closed once the server is dropped");
    }
}
