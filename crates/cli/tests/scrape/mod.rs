//! A Prometheus scrape over plain HTTP, for the tests of `--metrics-base-port` and
//! `node.metrics`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET /metrics` from `addr`: the whole reply, checked to be a 200.
pub(crate) fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reply");
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    reply
}

/// One metric's value from a scraped page (the first sample named exactly `name`).
#[allow(dead_code, reason = "not every test binary reads single values")]
pub(crate) fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
