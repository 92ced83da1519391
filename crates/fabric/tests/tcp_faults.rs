//! tcp backend faults on loopback: hostile bytes at a node's NIC, a peer that stops answering, a
//! peer that never finishes the handshake, a node of another cluster, a stopped node, and the
//! flush-until-reconnect rule after a denied write (with a real NIC and a scripted one).
//!
//! The frames are built here byte by byte from the documented wire format (`tcp::wire`), so the
//! tests also pin that format.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use microrep_fabric::tcp::{TcpConfig, TcpFabric, TcpTimeouts};
use microrep_fabric::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, OpError, PostFlags, RegionId, RegionSpec,
    RemoteAddr, RemoteWrite,
};

const LOG: RegionId = RegionId(0);
const OPEN: RegionId = RegionId(1);
const MAGIC: &[u8; 8] = b"MRTCP\0\0\x01";
/// Bounds every wait; only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(20);

fn regions() -> [RegionSpec; 2] {
    [RegionSpec::new(LOG, 4096, RemoteWrite::Granted), RegionSpec::new(OPEN, 4096, RemoteWrite::Always)]
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn start(cluster: &str, id: u16, peers: &[(u16, SocketAddr)], timeouts: TcpTimeouts) -> TcpFabric {
    let mut config = TcpConfig::new(cluster, NodeId(id), 3, loopback(), &regions())
        .with_peers(peers.iter().map(|&(p, a)| (NodeId(p), a)));
    config.timeouts = timeouts;
    TcpFabric::start(config).expect("start")
}

fn frame(kind: u8, status: u8, region: u16, wr_id: u64, offset: u64, arg: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&(32 + payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&[kind, status]);
    f.extend_from_slice(&region.to_le_bytes());
    f.extend_from_slice(&wr_id.to_le_bytes());
    f.extend_from_slice(&offset.to_le_bytes());
    f.extend_from_slice(&arg.to_le_bytes());
    f.extend_from_slice(payload);
    let crc = microrep_fabric::checksum::crc32c(&f);
    f.extend_from_slice(&crc.to_le_bytes());
    f
}

fn hello_body(cluster: &str, node: u16) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&TcpConfig::cluster_id_of(cluster).to_le_bytes());
    b.extend_from_slice(&node.to_le_bytes());
    b.extend_from_slice(&3u16.to_le_bytes());
    b.extend_from_slice(&(1u32 << 20).to_le_bytes());
    b
}

fn hello(cluster: &str, node: u16) -> Vec<u8> {
    frame(1, 0, 0, 0, 0, 0, &hello_body(cluster, node))
}

/// Reads until the peer closes the connection; fails the test if it stays open.
fn expect_closed(mut stream: TcpStream, what: &str) -> Vec<u8> {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut got = Vec::new();
    match stream.read_to_end(&mut got) {
        Ok(_) => got,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
        Err(e) => panic!("{what}: the NIC kept the connection open ({e})"),
    }
}

fn send(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(bytes).expect("send");
    stream
}

fn wait_completion<E: Endpoint>(ep: &mut E) -> Completion {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(c) = ep.poll_completion() {
            return c;
        }
        assert!(Instant::now() < deadline, "no completion within {DEADLINE:?}: the endpoint hangs");
        std::thread::yield_now();
    }
}

#[test]
fn hostile_bytes_are_dropped_and_the_nic_keeps_serving() {
    let cluster = format!("hostile-{}", std::process::id());
    let target = start(&cluster, 0, &[], TcpTimeouts::default());
    let addr = target.local_addr();
    let valid_hello = hello(&cluster, 1);
    let with_hello = |tail: Vec<u8>| [valid_hello.clone(), tail].concat();
    let mut bad_crc = frame(3, 0, 1, 1, 0, 0, b"bad crc");
    bad_crc[30] ^= 1;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("length below a header", 4u32.to_le_bytes().to_vec()),
        ("oversize length", u32::MAX.to_le_bytes().to_vec()),
        ("a large frame before the handshake", (64u32 << 10).to_le_bytes().to_vec()),
        ("request before the handshake", frame(3, 0, 1, 1, 0, 0, b"early")),
        ("bad crc after the handshake", with_hello(bad_crc)),
        ("unknown region", with_hello(frame(3, 0, 9, 1, 0, 0, b"x"))),
        ("write past the region", with_hello(frame(3, 0, 1, 1, 4090, 0, b"12345678"))),
        ("offset overflow", with_hello(frame(3, 0, 1, 1, u64::MAX - 2, 0, b"12345678"))),
        ("read past the region", with_hello(frame(4, 0, 1, 1, 4000, 200, b""))),
        ("response sent to a NIC", with_hello(frame(6, 0, 1, 1, 0, 0, b""))),
        ("second handshake", with_hello(valid_hello.clone())),
    ];
    for (what, bytes) in cases {
        expect_closed(send(addr, &bytes), what);
    }
    let refusal = expect_closed(send(addr, &hello("another-cluster", 1)), "wrong cluster");
    assert!(refusal.len() > 32 && refusal[5] == 3, "a refused handshake gets a rejection frame: {refusal:?}");
    assert!(String::from_utf8_lossy(&refusal).contains("cluster id"), "the refusal says why");
    expect_closed(send(addr, &hello(&cluster, 0)), "a peer claiming the NIC's own id");

    let mut zero = [0u8; 4096];
    target.read_local(OPEN, 0, &mut zero).expect("read");
    assert!(zero.iter().all(|&b| b == 0), "no hostile frame wrote anything");
    let writer = start(&cluster, 1, &[(0, addr)], TcpTimeouts::default());
    let mut ep = writer.connect(NodeId(0)).expect("the NIC still accepts peers");
    ep.post_write(1, RemoteAddr::new(OPEN, 8), b"still serving", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut ep).status, Ok(()));
    let mut got = [0u8; 13];
    target.read_local(OPEN, 8, &mut got).expect("read");
    assert_eq!(&got, b"still serving");
}

/// The HelloAck of a fake node 0 with one always-writable 4 KiB region 0.
fn fake_nic_ack(cluster: &str) -> Vec<u8> {
    let mut body = hello_body(cluster, 0);
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&[0; 4]);
    body.extend_from_slice(&[0, 0, 2, 0, 0, 0, 0, 0]);
    body.extend_from_slice(&4096u64.to_le_bytes());
    frame(2, 0, 0, 0, 0, 0, &body)
}

/// A fake peer that completes the handshake and then reads requests without ever answering
/// (a frozen process or a one-way partition).
fn silent_peer(cluster: &str) -> (SocketAddr, std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
    let listener = TcpListener::bind(loopback()).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let ack = fake_nic_ack(cluster);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut hello = [0u8; 56];
        stream.read_exact(&mut hello).expect("hello");
        stream.write_all(&ack).expect("ack");
        // Hold the connection open, answering nothing, until the test ends.
        let _ = stopped.recv_timeout(DEADLINE);
    });
    (addr, thread, stop)
}

#[test]
fn a_peer_that_stops_answering_fails_operations_within_the_request_timeout() {
    let cluster = format!("silent-{}", std::process::id());
    let (addr, peer, stop) = silent_peer(&cluster);
    let timeouts = TcpTimeouts { connect: Duration::from_secs(5), request: Duration::from_millis(200) };
    let writer = start(&cluster, 1, &[(0, addr)], timeouts);
    let mut ep = writer.connect(NodeId(0)).expect("handshake with the fake peer");
    ep.post_write(1, RemoteAddr::new(RegionId(0), 0), b"lost", PostFlags::SIGNALED).expect("post");
    ep.post_write(2, RemoteAddr::new(RegionId(0), 8), b"lost too", PostFlags::NONE).expect("post");
    let first = wait_completion(&mut ep);
    assert_eq!((first.wr_id, first.status), (1, Err(OpError::PeerUnreachable)));
    let second = wait_completion(&mut ep);
    assert_eq!((second.wr_id, second.status), (2, Err(OpError::Flushed)));
    assert_eq!(ep.state(), EndpointState::Error);
    let _ = stop.send(());
    peer.join().expect("fake peer");
    assert!(ep.reconnect().is_err(), "the fake peer accepts one connection only");
}

#[test]
fn a_peer_that_never_answers_the_handshake_times_out() {
    // The kernel completes TCP connections into the backlog of a listener that never accepts.
    let listener = TcpListener::bind(loopback()).expect("bind");
    let timeouts = TcpTimeouts { connect: Duration::from_millis(200), request: Duration::from_secs(1) };
    let writer =
        start(&format!("mute-{}", std::process::id()), 1, &[(0, listener.local_addr().expect("addr"))], timeouts);
    let err = writer.connect(NodeId(0)).expect_err("no handshake answer");
    assert!(matches!(err, FabricError::PeerUnreachable(NodeId(0), _)), "{err}");
    assert!(matches!(writer.connect(NodeId(2)), Err(FabricError::PeerUnreachable(NodeId(2), _))), "no address");
}

/// Calls `step` until it returns `Some`, failing the test at the deadline.
fn until<T>(what: &str, mut step: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(done) = step() {
            return done;
        }
        assert!(Instant::now() < deadline, "{what}: not within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn try_connect_never_waits_for_a_peer_that_does_not_answer_the_handshake() {
    let listener = TcpListener::bind(loopback()).expect("bind");
    let timeouts = TcpTimeouts { connect: Duration::from_millis(300), request: Duration::from_secs(1) };
    let mute = listener.local_addr().expect("addr");
    let writer = start(&format!("try-mute-{}", std::process::id()), 1, &[(0, mute)], timeouts);
    // The handshake cannot complete (nobody reads it): the first call returns at once, empty.
    assert!(writer.try_connect(NodeId(0)).expect("dial started").is_none());
    // Once the dial timed out in the background, a later call reports its failure.
    let err = until("the background dial fails", || writer.try_connect(NodeId(0)).err());
    assert!(matches!(err, FabricError::PeerUnreachable(NodeId(0), _)), "{err}");
    drop(listener);
}

#[test]
fn try_connect_and_try_reconnect_reach_a_live_peer() {
    let cluster = format!("try-live-{}", std::process::id());
    let target = start(&cluster, 0, &[], TcpTimeouts::default());
    let writer = start(&cluster, 1, &[(0, target.local_addr())], TcpTimeouts::default());
    let mut ep = until("connected", || writer.try_connect(NodeId(0)).expect("no dial error"));
    ep.post_write(1, RemoteAddr::new(OPEN, 0), b"hello", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut ep).status, Ok(()));
    // A peer that restarts on another port: the dead connection is replaced in the background.
    let restarted = start(&cluster, 0, &[], TcpTimeouts::default());
    drop(target);
    ep.post_write(2, RemoteAddr::new(OPEN, 0), b"lost", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut ep).status, Err(OpError::PeerUnreachable));
    writer.set_peer_addr(NodeId(0), restarted.local_addr()).expect("new address");
    until("reconnected", || ep.try_reconnect().expect("no dial error").then_some(()));
    assert_eq!(ep.state(), EndpointState::Ready);
    write_lands(&mut ep, 3, &restarted);
}

#[test]
fn nodes_of_different_clusters_refuse_each_other() {
    let a = start(&format!("left-{}", std::process::id()), 0, &[], TcpTimeouts::default());
    let b = start(&format!("right-{}", std::process::id()), 1, &[(0, a.local_addr())], TcpTimeouts::default());
    let err = b.connect(NodeId(0)).expect_err("different clusters");
    assert!(err.to_string().contains("cluster id"), "the error names the cause: {err}");
}

#[test]
fn a_stopped_node_fails_its_own_endpoints_and_refuses_to_connect() {
    let cluster = format!("stop-{}", std::process::id());
    let target = start(&cluster, 0, &[], TcpTimeouts::default());
    let writer = start(&cluster, 1, &[(0, target.local_addr())], TcpTimeouts::default());
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    drop(writer);
    ep.post_write(1, RemoteAddr::new(OPEN, 0), b"x", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut ep).status, Err(OpError::PeerUnreachable));
    assert!(ep.reconnect().is_err());
}

/// Waits until `n` completions arrived (or fails the test at the deadline).
fn wait_completions<E: Endpoint>(ep: &mut E, n: usize) -> Vec<Completion> {
    (0..n).map(|_| wait_completion(ep)).collect()
}

#[test]
fn a_denied_write_flushes_what_follows_until_reconnect_and_spares_other_endpoints() {
    let cluster = format!("flush-{}", std::process::id());
    let target = start(&cluster, 0, &[], TcpTimeouts::default());
    let writer = start(&cluster, 1, &[(0, target.local_addr())], TcpTimeouts::default());
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    let mut other_plane = writer.connect(NodeId(0)).expect("second endpoint to the same peer");
    ep.post_write(0, RemoteAddr::new(LOG, 0), b"denied", PostFlags::NONE).expect("post");
    for i in 1..=100u64 {
        ep.post_write(i, RemoteAddr::new(OPEN, 8 * i), &i.to_le_bytes(), PostFlags::SIGNALED).expect("post");
    }
    let denied = wait_completion(&mut ep);
    assert_eq!((denied.wr_id, denied.status), (0, Err(OpError::PermissionDenied)));
    // Reconnect while answers to the later writes may still be on their way: each is reported
    // exactly once, flushed, in posting order.
    ep.reconnect().expect("reconnect");
    let flushed = wait_completions(&mut ep, 100);
    assert_eq!(flushed.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (1..=100).collect::<Vec<_>>());
    assert!(flushed.iter().all(|c| c.status == Err(OpError::Flushed)), "{flushed:?}");
    other_plane.post_write(1, RemoteAddr::new(OPEN, 0), b"plane b", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut other_plane).status, Ok(()), "a failure on one endpoint spares the others");
    ep.post_write(101, RemoteAddr::new(OPEN, 4000), b"after", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut ep).status, Ok(()));
    assert!(ep.poll_completion().is_none(), "no completion is reported twice");
    let mut open = [0u8; 4096];
    target.read_local(OPEN, 0, &mut open).expect("read");
    assert_eq!(&open[..7], b"plane b");
    assert!(open[8..808].iter().all(|&b| b == 0), "no write behind the denied one landed");
    assert_eq!(&open[4000..4005], b"after");
}

/// A scripted NIC checks the flush path exactly: the peer denied a write while later writes
/// are still unanswered; they are reported `Flushed` once each, before anything posted later,
/// and the peer's own `Flushed` answers, arriving after the reconnect, are consumed silently.
#[test]
fn flushed_writes_complete_once_in_posting_order_and_late_answers_are_skipped() {
    const LATER: u64 = 20;
    let cluster = format!("scripted-{}", std::process::id());
    let listener = TcpListener::bind(loopback()).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let ack = fake_nic_ack(&cluster);
    let (go, went) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let mut buf = vec![0u8; 56];
        s.read_exact(&mut buf).expect("hello");
        s.write_all(&ack).expect("ack");
        buf.resize(40 * (1 + LATER as usize), 0);
        s.read_exact(&mut buf).expect("the denied write and the later ones");
        s.write_all(&frame(6, 1, 0, 0, 0, 0, &[])).expect("deny write 0");
        went.recv_timeout(DEADLINE).expect("the test reconnected");
        for wr_id in 1..=LATER {
            s.write_all(&frame(6, 2, 0, wr_id, 8 * wr_id, 0, &[])).expect("late flushed answer");
        }
        let mut reset = [0u8; 32];
        s.read_exact(&mut reset).expect("reset");
        assert_eq!(reset[4], 5, "reconnect on a live connection sends Reset");
        buf.resize(40, 0);
        s.read_exact(&mut buf).expect("the write after the reconnect");
        s.write_all(&frame(6, 0, 0, LATER + 1, 0, 0, &[])).expect("ok");
        let mut end = Vec::new();
        let _ = s.read_to_end(&mut end);
    });

    let writer = start(&cluster, 1, &[(0, addr)], TcpTimeouts::default());
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    for wr_id in 0..=LATER {
        ep.post_write(wr_id, RemoteAddr::new(RegionId(0), 8 * wr_id), &[1; 8], PostFlags::SIGNALED).expect("post");
    }
    let denied = wait_completion(&mut ep);
    assert_eq!((denied.wr_id, denied.status), (0, Err(OpError::PermissionDenied)));
    assert_eq!(ep.state(), EndpointState::Error);
    let in_error = 1000;
    ep.post_write(in_error, RemoteAddr::new(RegionId(0), 0), &[3; 8], PostFlags::NONE).expect("post in error");
    ep.reconnect().expect("reconnect on the live connection");
    let reported: Vec<Completion> = std::iter::from_fn(|| ep.poll_completion()).collect();
    let in_order: Vec<u64> = (1..=LATER).chain([in_error]).collect();
    assert_eq!(reported.iter().map(|c| c.wr_id).collect::<Vec<_>>(), in_order, "flushes complete in posting order");
    assert!(reported.iter().all(|c| c.status == Err(OpError::Flushed)));
    go.send(()).expect("peer waits");
    ep.post_write(LATER + 1, RemoteAddr::new(RegionId(0), 0), &[2; 8], PostFlags::SIGNALED).expect("post");
    let after = wait_completion(&mut ep);
    assert_eq!((after.wr_id, after.status), (LATER + 1, Ok(())), "late answers were consumed, not reported");
    assert!(ep.poll_completion().is_none());
    drop(ep);
    peer.join().expect("scripted peer");
}

/// Mu's leader change on real threads: two writers stream writes into their own slots of a
/// granted region while the target revokes one of them from another thread. After
/// `revoke_write` returns, the revoked writer's slot never changes again, holds a whole record,
/// and that record is the last one its writer saw acknowledged; the other writer is unaffected.
#[test]
fn revoking_one_streaming_writer_stops_it_exactly_and_spares_the_other() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    const SLOT: usize = 512;
    let cluster = format!("leaders-{}", std::process::id());
    let target = start(&cluster, 0, &[], TcpTimeouts::default());
    let peers = [(0, target.local_addr())];
    let writers =
        [start(&cluster, 1, &peers, TcpTimeouts::default()), start(&cluster, 2, &peers, TcpTimeouts::default())];
    let slot_of = |writer: NodeId| u64::from(writer.0 - 1) * 1024;
    let slot = |writer: NodeId| {
        let mut buf = vec![0u8; SLOT];
        target.read_local(LOG, slot_of(writer), &mut buf).expect("read");
        buf
    };
    for round in 0..20u64 {
        let base = round << 32;
        for w in [1, 2] {
            target.grant_write(LOG, NodeId(w)).expect("grant");
        }
        let stop = AtomicBool::new(false);
        let acked = [AtomicU64::new(0), AtomicU64::new(0)];
        let at_revoke = std::thread::scope(|s| {
            for (writer, acked) in writers.iter().zip(&acked) {
                let stop = &stop;
                s.spawn(move || {
                    let mut ep = writer.connect(NodeId(0)).expect("connect");
                    let at = RemoteAddr::new(LOG, slot_of(writer.node_id()));
                    let (mut posted, mut done, mut failed) = (0u64, 0u64, false);
                    let deadline = Instant::now() + DEADLINE;
                    loop {
                        if !stop.load(Ordering::Relaxed) && !failed && posted - done < 8 {
                            posted += 1;
                            let record: Vec<u8> = (0..SLOT / 8).flat_map(|_| (base + posted).to_le_bytes()).collect();
                            ep.post_write(base + posted, at, &record, PostFlags::SIGNALED).expect("post");
                        }
                        while let Some(c) = ep.poll_completion() {
                            done += 1;
                            match c.status {
                                Ok(()) if !failed => acked.store(c.wr_id, Ordering::Release),
                                Ok(()) => panic!("round {round}: a success after a failure"),
                                Err(_) => failed = true,
                            }
                        }
                        if (failed || stop.load(Ordering::Relaxed)) && done == posted {
                            return;
                        }
                        assert!(Instant::now() < deadline, "round {round}: writes never completed");
                        std::thread::yield_now();
                    }
                });
            }
            let deadline = Instant::now() + DEADLINE;
            let progressed = |i: usize, beyond: u64| {
                while acked[i].load(Ordering::Acquire) < beyond {
                    assert!(Instant::now() < deadline, "round {round}: writer {} made no progress", i + 1);
                    std::thread::yield_now();
                }
            };
            progressed(0, base + 1 + round % 7);
            target.revoke_write(LOG, NodeId(1)).expect("revoke");
            let at_revoke = slot(NodeId(1));
            progressed(1, acked[1].load(Ordering::Acquire).max(base) + 20);
            stop.store(true, Ordering::Relaxed);
            at_revoke
        });
        assert_eq!(slot(NodeId(1)), at_revoke, "round {round}: a write of the revoked writer landed after the revoke");
        let first = &at_revoke[..8];
        assert!(at_revoke.chunks_exact(8).all(|w| w == first), "round {round}: torn record at revoke");
        let seen = u64::from_le_bytes(first.try_into().expect("8 bytes"));
        assert_eq!(seen, acked[0].load(Ordering::Acquire), "round {round}: memory is not the last acknowledged write");
        assert!(acked[1].load(Ordering::Acquire) >= base + 20, "round {round}: the other writer was stopped too");
    }
}

/// A peer whose node stopped (its process killed, say) is known to be gone before any
/// operation to it fails: the NIC thread read the end of the connection. The same endpoint
/// then reaches the peer's next run.
#[test]
fn a_stopped_peer_is_gone_before_an_operation_fails_and_its_next_run_is_reached() {
    let cluster = format!("gone-{}", std::process::id());
    let target = start(&cluster, 0, &[], TcpTimeouts::default());
    let writer = start(&cluster, 1, &[(0, target.local_addr())], TcpTimeouts::default());
    let mut ep = writer.connect(NodeId(0)).expect("connect");
    ep.post_write(1, RemoteAddr::new(OPEN, 0), b"hello", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(&mut ep).status, Ok(()));
    assert!(!ep.peer_gone());
    drop(target);
    until("the end of the connection is seen", || ep.peer_gone().then_some(()));
    assert_eq!(ep.state(), EndpointState::Ready, "no operation failed yet");
    let restarted = start(&cluster, 0, &[], TcpTimeouts::default());
    writer.set_peer_addr(NodeId(0), restarted.local_addr()).expect("new address");
    ep.reconnect().expect("reconnect to the next run");
    assert!(!ep.peer_gone());
    write_lands(&mut ep, 2, &restarted);
}

/// Writes to `target` through `ep`, which must succeed and land in `target`'s memory.
fn write_lands<E: Endpoint>(ep: &mut E, wr_id: u64, target: &TcpFabric) {
    ep.post_write(wr_id, RemoteAddr::new(OPEN, 0), b"again", PostFlags::SIGNALED).expect("post");
    assert_eq!(wait_completion(ep).status, Ok(()));
    let mut got = [0u8; 5];
    target.read_local(OPEN, 0, &mut got).expect("read");
    assert_eq!(&got, b"again");
}
