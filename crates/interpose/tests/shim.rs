//! The shim loaded into a real process (this test binary, re-run as a small TCP server with
//! `LD_PRELOAD`), talking to a fake wrap node: refused connections never reach the server,
//! committed ones get their id, every byte the server receives (`recv`, `readv`) was first sent
//! to the wrap node and acknowledged, a close is reported, and the activation variable is gone
//! from the server's environment.

use std::io::{BufRead, BufReader, IoSliceMut, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use microrep_interpose_wire::{CONTROL_BYTES, ENV_DIR, HEADER_BYTES, Kind, Reply, Request, Status};

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
