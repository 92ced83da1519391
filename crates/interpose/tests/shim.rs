//! The shim loaded into a real process (this test binary, re-run as a small TCP server with
//! `LD_PRELOAD`), talking to a fake wrap node: refused connections never reach the server,
//! committed ones get their id, every byte the server receives (`recv`, `readv`) was first sent
//! to the wrap node and acknowledged, a close is reported, and the activation variable is gone
//! from the server's environment. And, for a server that accepts on one thread and reads on
//! another (memcached), replayed input counts as processed only once the thread that read it
//! waits with nothing ready.

use std::io::{BufRead, BufReader, IoSliceMut, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use microrep_interpose_wire::{
    CONTROL_BYTES, CONTROL_REPLAY_READ, CONTROL_REPLAY_SETTLED, ENV_DIR, HEADER_BYTES, Kind, Reply, Request, Status,
};

const CHILD: &str = "MICROREP_SHIM_TEST_CHILD";

/// A line on the child's stdout, past the test harness's output capture.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()).expect("stdout");
}

/// The server side, run in the child process: accepts one connection, receives two messages
/// (one with `recv`, one with `readv`), echoes what it got to stdout, and closes.
#[test]
fn child_server() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    say(&format!("port {}", listener.local_addr().expect("addr").port()));
    say(&format!("env {:?}", std::env::var_os(ENV_DIR)));
    let (mut conn, _) = listener.accept().expect("accept");
    say("accepted");
    let mut buf = [0u8; 64];
    let n = conn.read(&mut buf).expect("recv");
    say(&format!("got {}", String::from_utf8_lossy(&buf[..n])));
    let (mut a, mut b) = ([0u8; 3], [0u8; 64]);
    let n = conn.read_vectored(&mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)]).expect("readv");
    let both: Vec<u8> = a.iter().chain(b.iter()).take(n).copied().collect();
    say(&format!("got {}", String::from_utf8_lossy(&both)));
    drop(conn);
    say("closed");
}

/// The preloaded server, killed if the test fails.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn shim() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let so = exe.parent().and_then(|d| d.parent()).expect("target dir").join("libmicrorep_interpose.so");
    assert!(so.is_file(), "{} was not built", so.display());
    so
}

/// A fake wrap node: refuses the first accept, commits the rest (connection id 42), and
/// records every request with its payload.
fn fake_wrap_node(listener: UnixListener) -> std::thread::JoinHandle<Vec<(Kind, u64, Vec<u8>)>> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("the shim connects");
        let mut seen = Vec::new();
        let mut header = [0u8; HEADER_BYTES];
        while s.read_exact(&mut header).is_ok() {
            let req = Request::decode(&header).expect("a valid frame");
            let mut payload = vec![0u8; if req.kind == Kind::Data { req.len as usize } else { 0 }];
            s.read_exact(&mut payload).expect("payload");
            let refuse = req.kind == Kind::Accept && !seen.iter().any(|(k, _, _)| *k == Kind::Accept);
            let reply = match (req.kind, refuse) {
                (Kind::Accept, true) => Reply { status: Status::Refused, value: 0 },
                (Kind::Accept, false) => Reply { status: Status::Committed, value: 42 },
                _ => Reply { status: Status::Committed, value: 0 },
            };
            seen.push((req.kind, req.value, payload));
            s.write_all(&reply.encode()).expect("reply");
            if req.kind == Kind::Close {
                break;
            }
        }
        seen
    })
}

#[test]
fn a_preloaded_server_sees_only_acknowledged_input() {
    let dir = std::env::temp_dir().join(format!("interpose-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("shim.ctl"), vec![0u8; CONTROL_BYTES]).expect("control page");
    let node = fake_wrap_node(UnixListener::bind(dir.join("shim.sock")).expect("bind the shim socket"));
    let mut child = Child(
        Command::new(std::env::current_exe().expect("exe"))
            .args(["--exact", "child_server", "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .env(ENV_DIR, &dir)
            .env("LD_PRELOAD", shim())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the preloaded server"),
    );
    let stdout = BufReader::new(child.0.stdout.take().expect("stdout"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let next = |prefix: &str| loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            // The harness may have started the line ("test child_server ... ").
            Ok(line) => {
                if let Some(at) = line.find(prefix) {
                    return line[at..].to_string();
                }
            }
            Err(e) => panic!("no '{prefix}' line from the preloaded server: {e}"),
        }
    };
    let port: u16 = next("port ").trim_start_matches("port ").parse().expect("port");
    assert_eq!(next("env "), "env None", "the activation variable is removed from the server's environment");

    let mut refused = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    refused.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut buf = [0u8; 8];
    assert!(matches!(refused.read(&mut buf), Ok(0) | Err(_)), "a refused connection is closed");
    let mut client = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    next("accepted");
    client.write_all(b"hello").expect("send");
    assert_eq!(next("got "), "got hello");
    client.write_all(b"world!").expect("send");
    assert_eq!(next("got "), "got world!");
    next("closed");
    assert!(child.0.wait().expect("wait").success());

    let seen = node.join().expect("fake node");
    let kinds: Vec<Kind> = seen.iter().map(|(k, _, _)| *k).collect();
    assert_eq!(kinds, [Kind::Accept, Kind::Accept, Kind::Data, Kind::Data, Kind::Close]);
    assert_eq!(seen[1].1, u64::from(client.local_addr().expect("addr").port()), "accepts name the peer's port");
    assert_eq!((seen[2].1, seen[2].2.as_slice()), (42, &b"hello"[..]));
    assert_eq!((seen[3].1, seen[3].2.as_slice()), (42, &b"world!"[..]));
    assert_eq!(seen[4].1, 42);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Waits on `fds` with libc's `poll` (which the shim stands in front of); what it returned.
fn libc_poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> i32 {
    // SAFETY: `fds` is a valid, exclusively borrowed array of its length.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// The other server, run in the child process: accepts a replay-agent connection on the main
/// thread and reads it on a worker thread, memcached's way, each step released by a line on
/// stdin so that the test can read the control page between them.
#[test]
fn child_threaded_server() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    use std::os::fd::AsRawFd;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    say(&format!("port {}", listener.local_addr().expect("addr").port()));
    let (conn, _) = listener.accept().expect("accept");
    let (read_tx, read_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let mut conn = conn;
        let mut buf = [0u8; 64];
        let n = conn.read(&mut buf).expect("read");
        read_tx.send(n).expect("main");
        let mut gate = String::new();
        std::io::stdin().read_line(&mut gate).expect("stdin");
        let fd = conn.as_raw_fd();
        let mut fds = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
        say(&format!("worker woke {}", libc_poll(&mut fds, 10_000)));
        let n = conn.read(&mut buf).expect("read");
        say(&format!("worker read {n}"));
        std::io::stdin().read_line(&mut gate).expect("stdin");
        fds[0].revents = 0;
        say(&format!("worker idle {}", libc_poll(&mut fds, 0)));
    });
    let n = read_rx.recv().expect("worker");
    // The main thread waits with nothing ready: that says nothing about the worker's input.
    say(&format!("main idle {} after the worker read {n}", libc_poll(&mut [], 0)));
    worker.join().expect("worker");
}

/// Answers every accept as the replay agent's.
fn fake_agent_node(listener: UnixListener) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("the shim connects");
        let mut header = [0u8; HEADER_BYTES];
        while s.read_exact(&mut header).is_ok() {
            let req = Request::decode(&header).expect("a valid frame");
            assert_eq!(req.kind, Kind::Accept, "replayed input is not proposed");
            s.write_all(&Reply { status: Status::Replay, value: 0 }.encode()).expect("reply");
        }
    })
}

#[test]
fn replayed_input_settles_when_its_reading_thread_finds_nothing_ready() {
    use std::os::unix::fs::FileExt;
    let dir = std::env::temp_dir().join(format!("interpose-settle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("shim.ctl"), vec![0u8; CONTROL_BYTES]).expect("control page");
    let control = std::fs::File::open(dir.join("shim.ctl")).expect("control page");
    let word = |index: usize| {
        let mut b = [0u8; 8];
        control.read_exact_at(&mut b, index as u64 * 8).expect("read the control page");
        u64::from_le_bytes(b)
    };
    let node = fake_agent_node(UnixListener::bind(dir.join("shim.sock")).expect("bind the shim socket"));
    let mut child = Child(
        Command::new(std::env::current_exe().expect("exe"))
            .args(["--exact", "child_threaded_server", "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .env(ENV_DIR, &dir)
            .env("LD_PRELOAD", shim())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the preloaded server"),
    );
    let mut gate = child.0.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.0.stdout.take().expect("stdout"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let next = |prefix: &str| loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(at) = line.find(prefix) {
                    return line[at..].to_string();
                }
            }
            Err(e) => panic!("no '{prefix}' line from the preloaded server: {e}"),
        }
    };
    let port: u16 = next("port ").trim_start_matches("port ").parse().expect("port");
    let mut agent = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    agent.write_all(b"hello").expect("send");
    assert_eq!(next("main idle "), "main idle 0 after the worker read 5");
    assert_eq!((word(CONTROL_REPLAY_READ), word(CONTROL_REPLAY_SETTLED)), (5, 0), "another thread's wait");
    // Input is ready when the worker waits next: its wait returns it, nothing is settled.
    agent.write_all(b"world!").expect("send");
    gate.write_all(b"go\n").expect("gate");
    assert_eq!(next("worker woke "), "worker woke 1");
    assert_eq!(next("worker read "), "worker read 6");
    assert_eq!((word(CONTROL_REPLAY_READ), word(CONTROL_REPLAY_SETTLED)), (11, 0), "input was ready");
    gate.write_all(b"go\n").expect("gate");
    assert_eq!(next("worker idle "), "worker idle 0");
    assert_eq!(word(CONTROL_REPLAY_SETTLED), 11, "the reading thread found nothing ready");
    assert!(child.0.wait().expect("wait").success());
    drop(agent);
    node.join().expect("fake node");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
