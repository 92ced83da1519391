//! `microrep wrap` around a real, unmodified memcached (Debian's 1.6.18, `-t 1 -R 100000`), which
//! accepts on its main thread and reads on a worker thread: text and binary protocol writes
//! through the leader reach every copy, pipelined writes from several connections apply in one
//! order everywhere, a killed leader's successor holds every acknowledged `set`, with the same
//! CAS tokens, and a deposed leader's copy is discarded and rebuilt from the log. Each copy is read directly over UDP (`-U {port}`), which the shim
//! does not interpose: reads only, not replicated. Skipped, saying so, where memcached is not
//! installed (a failure under CI).

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use support::{Wrap, one_cluster};

/// Client ports of this test binary's run (TCP and UDP): below Linux's ephemeral range
/// (32768..), away from the cluster tests' (20000..29000) and the redis wrap tests' ranges.
fn base_port() -> u16 {
    32_200 + (std::process::id() % 500) as u16
}

fn start() -> Wrap {
    // -R: every request a read brought is served before other connections (docs/WRAP.md).
    let mut memcached = vec!["memcached", "-t", "1", "-R", "100000", "-p", "{port}", "-U", "{port}", "-l", "127.0.0.1"];
    if rustix::process::geteuid().is_root() {
        memcached.extend(["-u", "root"]);
    }
    Wrap::start(3, base_port(), &[], &memcached)
}

/// A wrapped memcached cluster serving through its leader, this test binary's only cluster
/// while `_one` is held.
struct Started {
    _one: std::sync::MutexGuard<'static, ()>,
    wrap: Wrap,
    replicas: Vec<(u32, PathBuf)>,
    leader: usize,
}

/// Starts the cluster and waits for its leader; `None` (the test skips, saying so) where
/// memcached is not installed outside CI.
fn started() -> Option<Started> {
    if support::server_missing("memcached") {
        return None;
    }
    let one = one_cluster();
    let mut wrap = start();
    let replicas = wrap.replicas(3);
    let leader = wrap.leader(&[0, 1, 2], answers);
    Some(Started { _one: one, wrap, replicas, leader })
}

/// A text-protocol connection.
struct Text(TcpStream);

impl Text {
    fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self(s))
    }

    /// Sends `request` and reads until the reply ends with `end` (`Err` if the server closes).
    fn call(&mut self, request: &[u8], end: &[u8]) -> std::io::Result<Vec<u8>> {
        self.0.write_all(request)?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        while !reply.ends_with(end) {
            match self.0.read(&mut buf)? {
                0 => return Err(ErrorKind::UnexpectedEof.into()),
                n => reply.extend_from_slice(&buf[..n]),
            }
        }
        Ok(reply)
    }

    fn set(&mut self, key: &str, value: &str) -> std::io::Result<Vec<u8>> {
        self.call(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes(), b"\r\n")
    }
}

/// Whether the server at `addr` answers `version` (followers close client connections).
fn answers(addr: SocketAddr) -> bool {
    Text::connect(addr).and_then(|mut c| c.call(b"version\r\n", b"\r\n")).is_ok_and(|r| r.starts_with(b"VERSION"))
}

fn value_of(key: &str, value: &str) -> String {
    format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len())
}

/// `gets KEY` on the copy listening on UDP `port`, directly (the shim leaves UDP alone): the
/// reply's text, `VALUE key flags bytes cas` and the data, or `END` alone.
fn copy_gets(port: u16, key: &str) -> Result<String, String> {
    let udp = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    udp.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    // The frame header: request id, sequence number, datagrams in the message, reserved.
    let mut request = vec![0, 1, 0, 0, 0, 1, 0, 0];
    request.extend_from_slice(format!("gets {key}\r\n").as_bytes());
    udp.send_to(&request, ("127.0.0.1", port)).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 2048];
    let n = udp.recv(&mut buf).map_err(|e| format!("UDP port {port}: {e}"))?;
    let reply = buf.get(8..n).ok_or("a short datagram")?;
    Ok(String::from_utf8_lossy(reply).into_owned())
}

/// Waits until the copies of `replicas` hold `value` under each of `keys` with one CAS token
/// each, the same on every copy.
fn converged(wrap: &mut Wrap, replicas: &[usize], keys: &[(String, String)]) {
    let ports: Vec<u16> = replicas.iter().map(|&i| wrap.addr(i).port()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (key, value) in keys {
        loop {
            let replies: Vec<Result<String, String>> = ports.iter().map(|&p| copy_gets(p, key)).collect();
            let agreed = replies.windows(2).all(|w| w[0] == w[1]);
            let held = replies.iter().all(|r| {
                r.as_ref().is_ok_and(|r| {
                    r.starts_with(&format!("VALUE {key} 0 {} ", value.len()))
                        && r.ends_with(&format!("\r\n{value}\r\nEND\r\n"))
                })
            });
            if agreed && held {
                break;
            }
            assert!(Instant::now() < deadline, "copies disagree on {key}: {replies:?}\n{}", wrap.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A binary-protocol request: opcode, key, extras, value.
fn binary(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
    let body = (extras.len() + key.len() + value.len()) as u32;
    let mut packet = vec![0x80, opcode];
    packet.extend_from_slice(&(key.len() as u16).to_be_bytes());
    packet.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    packet.extend_from_slice(&body.to_be_bytes());
    packet.extend_from_slice(&[0; 12]);
    packet.extend_from_slice(extras);
    packet.extend_from_slice(key);
    packet.extend_from_slice(value);
    packet
}

/// Reads one binary-protocol response: (status, value).
fn binary_response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut header = [0u8; 24];
    s.read_exact(&mut header).expect("a binary response header");
    assert_eq!(header[0], 0x81, "a response");
    let status = u16::from_be_bytes([header[6], header[7]]);
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let skip = usize::from(header[4]) + usize::from(u16::from_be_bytes([header[2], header[3]]));
    let mut rest = vec![0u8; body];
    s.read_exact(&mut rest).expect("a binary response body");
    (status, rest.split_off(skip))
}

#[test]
fn text_and_binary_writes_through_the_leader_reach_every_copy() {
    let Some(Started { _one, mut wrap, replicas, leader }) = started() else { return };
    let mut c = Text::connect(wrap.addr(leader)).expect("connect to the leader");
    let mut keys: Vec<(String, String)> = (0..150).map(|i| (format!("key:{i}"), format!("value-{i}"))).collect();
    for (k, v) in &keys {
        assert_eq!(c.set(k, v).expect("set"), b"STORED\r\n", "set {k}");
    }
    // Pipelined: 50 commands in one write, read by the worker in one or several reads.
    let pipelined: String = (0..50).map(|i| format!("set pipe:{i} 0 0 1\r\n{}\r\n", i % 10)).collect();
    let replies = c.call(pipelined.as_bytes(), &b"STORED\r\n".repeat(50)).expect("pipelined sets");
    assert_eq!(replies, b"STORED\r\n".repeat(50));
    keys.extend((0..50).map(|i| (format!("pipe:{i}"), format!("{}", i % 10))));
    assert_eq!(c.call(b"append key:0 0 0 4\r\n-end\r\n", b"\r\n").expect("append"), b"STORED\r\n");
    assert_eq!(c.call(b"set n 0 0 2\r\n40\r\nincr n 2\r\n", b"42\r\n").expect("incr"), b"STORED\r\n42\r\n");
    keys[0].1.push_str("-end");
    keys.push(("n".into(), "42".into()));
    // The binary protocol, on a connection of its own: SET with flags 0 and no expiry, GET.
    let mut b = TcpStream::connect(wrap.addr(leader)).expect("connect");
    b.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    b.write_all(&binary(0x01, b"bin", &[0; 8], b"binary-value")).expect("binary SET");
    assert_eq!(binary_response(&mut b).0, 0, "binary SET succeeds");
    b.write_all(&binary(0x00, b"bin", &[], &[])).expect("binary GET");
    assert_eq!(binary_response(&mut b), (0, b"binary-value".to_vec()));
    keys.push(("bin".into(), "binary-value".into()));
    assert_eq!(c.call(b"get key:0\r\n", b"END\r\n").expect("get"), value_of("key:0", "value-0-end").as_bytes());
    converged(&mut wrap, &[0, 1, 2], &keys);
    for follower in (0..3).filter(|&i| i != leader) {
        assert!(!answers(wrap.addr(follower)), "follower {follower} served a client");
    }
    wrap.assert_cleaned_up(&replicas);
}

#[test]
fn pipelined_appends_from_several_connections_apply_in_one_order() {
    let Some(Started { _one, mut wrap, replicas, leader }) = started() else { return };
    let addr = wrap.addr(leader);
    let mut c = Text::connect(addr).expect("connect to the leader");
    let mut keys = Vec::new();
    for round in 0..5 {
        let key = format!("mixed:{round}");
        assert_eq!(c.set(&key, "-").expect("set"), b"STORED\r\n");
        // Three connections each pipeline 150 appends to the same key at once: the value records
        // the order in which the leader's memcached served them, which the log must reproduce.
        let writers: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|tag| {
                let key = key.clone();
                std::thread::spawn(move || {
                    let batch: String = (0..150).map(|_| format!("append {key} 0 0 1\r\n{tag}\r\n")).collect();
                    let mut w = Text::connect(addr).expect("connect to the leader");
                    let replies = w.call(batch.as_bytes(), &b"STORED\r\n".repeat(150)).expect("appends");
                    assert_eq!(replies, b"STORED\r\n".repeat(150));
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        let got =
            String::from_utf8(c.call(format!("get {key}\r\n").as_bytes(), b"END\r\n").expect("get")).expect("text");
        let value = got.split("\r\n").nth(1).expect("a value").to_string();
        assert_eq!(value.len(), 451, "every append applied once");
        keys.push((key, value));
    }
    converged(&mut wrap, &[0, 1, 2], &keys);
    wrap.assert_cleaned_up(&replicas);
}

/// Writes `set k<i> 0 0 .. v<i>` one at a time, reconnecting to whichever replica answers when
/// its connection fails, until `stop` (or 20,000 keys); records the acknowledged ones.
fn writer(addrs: Vec<SocketAddr>, acked: Arc<Mutex<Vec<u32>>>, stop: Arc<AtomicBool>) {
    let mut conn: Option<Text> = None;
    for i in 0..20_000u32 {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while conn.is_none() && Instant::now() < deadline && !stop.load(Ordering::Acquire) {
            conn = addrs.iter().find(|&&a| answers(a)).and_then(|&a| Text::connect(a).ok());
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let Some(c) = conn.as_mut() else { return };
        match c.set(&format!("k{i}"), &format!("v{i}")) {
            Ok(reply) if reply == b"STORED\r\n" => acked.lock().unwrap_or_else(PoisonError::into_inner).push(i),
            _ => conn = None,
        }
    }
}

/// Waits until `acked` holds at least `n` keys.
fn await_acked(wrap: &mut Wrap, acked: &Mutex<Vec<u32>>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap_or_else(PoisonError::into_inner).len() < n {
        assert!(Instant::now() < deadline, "the writer got fewer than {n} sets acknowledged:\n{}", wrap.output());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_leaders_successor_holds_every_acknowledged_set() {
    let Some(Started { _one, mut wrap, replicas, leader }) = started() else { return };
    // A CAS token handed out by the leader stays valid on its successor: the copies apply the
    // same operations in the same order, so they number their items alike.
    let mut c = Text::connect(wrap.addr(leader)).expect("connect to the leader");
    assert_eq!(c.set("token", "before").expect("set"), b"STORED\r\n");
    let gets = String::from_utf8(c.call(b"gets token\r\n", b"END\r\n").expect("gets")).expect("text");
    let cas = gets.split("\r\n").next().and_then(|l| l.split(' ').nth(4)).expect("a CAS token").to_string();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let addrs = (0..3).map(|i| wrap.addr(i)).collect();
    let writing = {
        let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || writer(addrs, acked, stop))
    };
    await_acked(&mut wrap, &acked, 100);
    let pid = rustix::process::Pid::from_raw(replicas[leader].0 as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL the leader");
    let before = acked.lock().unwrap_or_else(PoisonError::into_inner).len();
    await_acked(&mut wrap, &acked, before + 100);
    stop.store(true, Ordering::Release);
    writing.join().expect("writer");
    assert!(c.call(b"version\r\n", b"\r\n").is_err(), "a client of the killed leader sees its connection closed");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let successor = wrap.leader(&survivors, answers);
    let mut s = Text::connect(wrap.addr(successor)).expect("connect to the successor");
    let acked = acked.lock().unwrap_or_else(PoisonError::into_inner).clone();
    for &i in &acked {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        let got = s.call(format!("get {k}\r\n").as_bytes(), b"END\r\n").expect("get");
        assert_eq!(String::from_utf8_lossy(&got), value_of(&k, &v), "acknowledged {k} lost");
    }
    let swap = s.call(format!("cas token 0 0 5 {cas}\r\nafter\r\n").as_bytes(), b"\r\n").expect("cas");
    assert_eq!(swap, b"STORED\r\n", "the old leader's CAS token on its successor");
    let mut keys: Vec<(String, String)> = acked.iter().map(|i| (format!("k{i}"), format!("v{i}"))).collect();
    keys.push(("token".into(), "after".into()));
    converged(&mut wrap, &survivors, &keys);
    // The killed replica is restarted empty and replays the log (never recycled here).
    wrap.wait_for_line(&format!("replica {leader}: restarted"));
    converged(&mut wrap, &[0, 1, 2], &keys);
    wrap.assert_cleaned_up(&replicas);
}

#[test]
fn a_deposed_leader_stops_its_copy_and_replays_the_log() {
    let Some(Started { _one, mut wrap, replicas, leader }) = started() else { return };
    let mut keys: Vec<(String, String)> = (0..50).map(|i| (format!("old:{i}"), format!("a{i}"))).collect();
    let mut c = Text::connect(wrap.addr(leader)).expect("connect to the leader");
    for (k, v) in &keys {
        assert_eq!(c.set(k, v).expect("set"), b"STORED\r\n", "set {k}");
    }
    // Stopped (not killed), the leader's replica is suspected and replaced; its server lives on.
    let pid = rustix::process::Pid::from_raw(replicas[leader].0 as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("SIGSTOP the leader");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let successor = wrap.leader(&survivors, answers);
    let mut s = Text::connect(wrap.addr(successor)).expect("connect to the successor");
    for i in 0..50 {
        let (k, v) = (format!("new:{i}"), format!("b{i}"));
        assert_eq!(s.set(&k, &v).expect("set"), b"STORED\r\n", "set {k}");
        keys.push((k, v));
    }
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("SIGCONT");
    // It finds itself deposed with a copy that served clients: it stops, is restarted empty and
    // replays the log (young enough to hold every entry).
    wrap.wait_for_line(&format!("replica {leader}: lost leadership after serving clients"));
    wrap.wait_for_line(&format!("replica {leader}: restarted"));
    converged(&mut wrap, &[0, 1, 2], &keys);
    wrap.assert_cleaned_up(&replicas);
}
