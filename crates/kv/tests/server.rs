//! Three KV replicas in one process, driven over RESP like redis-cli would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use microrep::Config;
use microrep::config::{AttachMode, ClusterConfig, FabricKind, Member, NodeConfig};
use microrep_kv::client::{Client, Value};
use microrep_kv::reply::ErrorReply;
use microrep_kv::{KvError, KvNode};

struct Cluster {
    nodes: Vec<KvNode>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn cluster(name: &str) -> Cluster {
    cluster_on(name, FabricKind::Shm, AttachMode::Handover)
}

fn cluster_on(name: &str, fabric: FabricKind, mode: AttachMode) -> Cluster {
    let name = format!("kv-{name}-{}", std::process::id());
    let mut c = ClusterConfig::local(&name, 3, 1);
    let fabric_addr = || (fabric == FabricKind::Tcp).then(|| format!("127.0.0.1:{}", free_port()));
    c.fabric = fabric;
    let dir = microrep_fabric::shm::ShmConfig::default_dir(&name);
    c.shm_dir = Some(dir.clone());
    c.timing.heartbeat_us = 5000;
    // A port found free can be taken by a test running beside this one before the node binds
    // it: the cluster then starts again on other ports.
    for _ in 0..5 {
        c.members = (0..3)
            .map(|id| Member { id, client: format!("127.0.0.1:{}", free_port()), fabric: fabric_addr() })
            .collect();
        let started: Result<Vec<KvNode>, _> = (0..3)
            .map(|id| KvNode::start(&Config { cluster: c.clone(), node: NodeConfig { mode, ..NodeConfig::new(id) } }))
            .collect();
        match started {
            Ok(nodes) => return Cluster { nodes, dir },
            Err(KvError::Listen { source, .. }) if source.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => panic!("start: {e}"),
        }
    }
    panic!("no free client ports in 5 attempts");
}

fn client(addr: SocketAddr) -> Client {
    Client::connect(addr, Duration::from_secs(10)).expect("connect")
}

fn bulk(v: &str) -> Value {
    Value::Bulk(Some(v.as_bytes().to_vec()))
}

/// The leader's address, found by following redirects from node 0.
fn leader(c: &Cluster) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut at = c.nodes[0].addr();
    loop {
        assert!(Instant::now() < deadline, "no leader");
        match client(at).call(&[b"DBSIZE"]).expect("call") {
            Value::Integer(_) => return at,
            other => match other.error() {
                Some(ErrorReply::NotLeader { addr, .. }) => at = addr.expect("leader address in redirect"),
                Some(ErrorReply::NoLeader | ErrorReply::TryAgain | ErrorReply::Unknown(_)) => {}
                _ => panic!("unexpected {other:?}"),
            },
        }
    }
}

#[test]
fn commands_redirects_and_pipelining() {
    commands_redirects_and_pipelining_on(cluster("commands"));
}

#[test]
fn commands_redirects_and_pipelining_over_the_tcp_fabric() {
    commands_redirects_and_pipelining_on(cluster_on("tcp", FabricKind::Tcp, AttachMode::Handover));
}

/// Direct mode: the serving thread proposes each turn's commands as batch entries itself, so
/// the pipelined INCRs below share entries and each reply must come from its own position.
#[test]
fn commands_redirects_and_pipelining_in_direct_mode() {
    commands_redirects_and_pipelining_on(cluster_on("direct", FabricKind::Shm, AttachMode::Direct));
}

/// Whether a reply says that leadership moved (or is moving) under the client.
fn leadership_moved(v: &Value) -> bool {
    matches!(
        v.error(),
        Some(ErrorReply::NotLeader { .. } | ErrorReply::NoLeader | ErrorReply::TryAgain | ErrorReply::Unknown(_))
    )
}

fn commands_redirects_and_pipelining_on(c: Cluster) {
    // A loaded machine can make a replica suspect a live leader: an attempt that meets a
    // leader change is abandoned and made again, on fresh keys, at the new leader. Every
    // assertion holds within one attempt.
    let attempts = 5;
    assert!(
        (0..attempts).any(|attempt| commands_in_one_term(&c, attempt)),
        "leadership moved during each of {attempts} attempts"
    );

    // Every replica converges to the same state digest.
    let digest = |addr| match client(addr).call(&[b"MICROREP.STATUS"]).expect("status") {
        Value::Bulk(Some(json)) => {
            let json = String::from_utf8(json).expect("utf8");
            let at = json.find("\"digest\":\"").expect("digest field") + 10;
            json[at..at + 16].to_string()
        }
        other => panic!("status {other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.nodes.iter().map(|n| digest(n.addr())).collect::<std::collections::HashSet<_>>().len() != 1 {
        assert!(Instant::now() < deadline, "replicas did not converge");
        std::thread::yield_now();
    }
}

/// Commands, pipelining and a follower's redirect at the current leader, on keys of their own;
/// whether it ran to the end (false: leadership moved meanwhile).
fn commands_in_one_term(c: &Cluster, attempt: u32) -> bool {
    commands_at_the_leader(c, attempt).is_some()
}

fn commands_at_the_leader(c: &Cluster, attempt: u32) -> Option<()> {
    let leader = leader(c);
    let mut l = client(leader);
    let key = |name: &str| format!("{name}{attempt}").into_bytes();
    let (k, n, a, b, zz, p) = (key("k"), key("n"), key("a"), key("b"), key("zz"), key("p"));
    let mut call = |args: &[&[u8]]| Some(l.call(args).expect("call")).filter(|v| !leadership_moved(v));
    let Value::Integer(before) = call(&[b"DBSIZE"])? else { panic!("DBSIZE is not an integer") };
    assert_eq!(call(&[b"PING"])?, Value::Simple("PONG".into()));
    assert_eq!(call(&[b"SET", &k, b"v1"])?, Value::Simple("OK".into()));
    assert_eq!(call(&[b"get", &k])?, bulk("v1"));
    assert_eq!(call(&[b"APPEND", &k, b"+"])?, Value::Integer(3));
    assert_eq!(call(&[b"INCR", &n])?, Value::Integer(1));
    assert_eq!(call(&[b"MSET", &a, b"1", &b, b"2"])?, Value::Simple("OK".into()));
    assert_eq!(call(&[b"MGET", &a, &zz, &k])?, Value::Array(Some(vec![bulk("1"), Value::Bulk(None), bulk("v1+")])));
    assert_eq!(call(&[b"EXISTS", &a, &zz])?, Value::Integer(1));
    assert_eq!(call(&[b"DEL", &a, &zz])?, Value::Integer(1));
    assert_eq!(call(&[b"DBSIZE"])?, Value::Integer(before + 3));
    let e = call(&[b"FLUSHALL"])?;
    assert_eq!(e.error(), Some(ErrorReply::Other("ERR unknown command 'FLUSHALL'".into())));

    // Pipelining: 200 INCRs in one write come back in order.
    for _ in 0..200 {
        l.send(&[b"INCR", &p]).expect("send");
    }
    l.flush().expect("flush");
    for i in 1..=200 {
        let reply = l.read().expect("reply");
        if leadership_moved(&reply) {
            return None;
        }
        assert_eq!(reply, Value::Integer(i));
    }

    // Followers redirect to the leader, by id and address.
    let follower = c.nodes.iter().map(KvNode::addr).find(|&a| a != leader).expect("a follower");
    let redirect = client(follower).call(&[b"GET", &k]).expect("redirect");
    match redirect.error() {
        Some(ErrorReply::NotLeader { id: Some(_), addr: Some(a) }) if a == leader => Some(()),
        Some(ErrorReply::NotLeader { .. } | ErrorReply::NoLeader) => None,
        _ => panic!("a follower answered {redirect:?}"),
    }
}

#[test]
fn malformed_requests_get_an_error_and_never_reach_the_log() {
    let c = cluster("malformed");
    let addr = leader(&c);
    let hostile: [&[u8]; 5] = [
        b"*1\r\n$999999999\r\n",
        b"*2\r\n$3\r\nGET\r\n:12\r\n",
        b"*-7\r\n*x\r\n",
        b"*1\r\n$3\r\nGETXX\r\n",
        &[b'*'; 100],
    ];
    for bytes in hostile {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s.write_all(bytes).expect("write");
        let mut reply = Vec::new();
        // The server answers with an error and closes the connection.
        s.read_to_end(&mut reply).expect("read until closed");
        assert!(
            reply.starts_with(b"-ERR"),
            "{:?} -> {:?}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(&reply)
        );
    }
    // What follows goes to whichever replica leads: leadership may move on a busy machine, and
    // a reply saying so makes the step again at the new leader.
    let deadline = Instant::now() + Duration::from_secs(30);
    let at_leader = |command: &[&[u8]]| loop {
        let reply = client(leader(&c)).call(command).expect("call");
        if !leadership_moved(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "leadership kept moving");
    };
    assert_eq!(at_leader(&[b"DBSIZE"]), Value::Integer(0));
    assert_eq!(at_leader(&[b"SET", b"still", b"fine"]), Value::Simple("OK".into()));
    loop {
        let mut s = TcpStream::connect(leader(&c)).expect("connect");
        s.write_all(b"PING\r\nGET still\r\n").expect("inline");
        let mut reply = [0u8; 17];
        s.read_exact(&mut reply).expect("inline replies");
        let moved = [&b"-NOTLEADER"[..], b"-NOLEADER", b"-TRYAGAIN"].iter().any(|e| reply[7..].starts_with(e));
        if !moved {
            assert_eq!(&reply, b"+PONG\r\n$4\r\nfine\r\n");
            break;
        }
        assert!(Instant::now() < deadline, "leadership kept moving");
    }
}

#[test]
fn unreplicated_baseline_serves_the_same_commands() {
    let n = KvNode::start_unreplicated("127.0.0.1:0".parse().expect("addr"), 1024).expect("start");
    let mut l = client(n.addr());
    assert_eq!(l.call(&[b"SET", b"k", b"v"]).expect("set"), Value::Simple("OK".into()));
    assert_eq!(l.call(&[b"GET", b"k"]).expect("get"), bulk("v"));
    assert!(n.node().is_none());
}

/// A client that sends its requests and closes its side at once (the requests and the end of
/// its stream reach the server together) gets every reply, then the server closes: the event
/// loop stops reading a socket at a short read, but reads to the end when the event reports the
/// peer's side closed.
#[test]
fn a_client_that_sends_and_closes_at_once_gets_its_replies_then_the_end() {
    let n = KvNode::start_unreplicated("127.0.0.1:0".parse().expect("addr"), 1024).expect("start");
    for round in 0..20 {
        let mut s = TcpStream::connect(n.addr()).expect("connect");
        s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").expect("requests");
        s.shutdown(std::net::Shutdown::Write).expect("close the writing side");
        // A guard against a hang only: the server answers at once.
        s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap_or_else(|e| panic!("round {round}: the server did not close: {e}"));
        assert_eq!(all, b"+OK\r\n$1\r\nv\r\n", "round {round}");
    }
}

/// The server's one event loop: a client that pipelines thousands of requests without reading
/// the replies is paused at the output limit, never holds the others up, and gets every reply
/// once it reads; many clients at once are all served.
#[test]
fn a_client_that_does_not_read_holds_nobody_up_and_loses_no_reply() {
    let n = KvNode::start_unreplicated("127.0.0.1:0".parse().expect("addr"), 1 << 20).expect("start");
    let value = vec![b'v'; 4096];
    client(n.addr()).call(&[b"SET", b"big", &value]).expect("set");
    const GETS: usize = 5000;
    let mut greedy = TcpStream::connect(n.addr()).expect("connect");
    let mut writer = greedy.try_clone().expect("clone");
    // About 20 MB of replies, five times the output limit; the writer blocks once the server
    // stops reading this client.
    let sender = std::thread::spawn(move || {
        let requests = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(GETS);
        writer.write_all(&requests).expect("pipelined requests");
    });
    let others: Vec<_> = (0..40u32)
        .map(|i| {
            let addr = n.addr();
            std::thread::spawn(move || {
                let mut c = client(addr);
                let key = format!("k{i}");
                for round in 0..20u32 {
                    let v = round.to_string();
                    assert_eq!(
                        c.call(&[b"SET", key.as_bytes(), v.as_bytes()]).expect("set"),
                        Value::Simple("OK".into())
                    );
                    assert_eq!(c.call(&[b"GET", key.as_bytes()]).expect("get"), bulk(&v));
                }
            })
        })
        .collect();
    for other in others {
        other.join().expect("a client beside the greedy one");
    }
    let expected = [format!("${}\r\n", value.len()).into_bytes(), value.clone(), b"\r\n".to_vec()].concat();
    let mut reply = vec![0u8; expected.len()];
    greedy.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    for i in 0..GETS {
        greedy.read_exact(&mut reply).unwrap_or_else(|e| panic!("reply {i}: {e}"));
        assert!(reply == expected, "reply {i} differs");
    }
    sender.join().expect("sender");
}

#[test]
fn a_session_command_retried_across_a_leader_change_is_applied_once() {
    use microrep_kv::session::{Executed, Session};
    let mut c = cluster("sessions");
    let members: Vec<SocketAddr> = c.nodes.iter().map(KvNode::addr).collect();
    let deadline = || Instant::now() + Duration::from_secs(30);
    let first = leader(&c);
    let mut s = Session::new(members.clone(), 0);
    assert_eq!(s.execute_once(b"client-1", 1, &[b"INCR", b"n"], deadline()), Executed::Done(Value::Integer(1)));
    // The client did not learn the outcome (say its connection broke) and sends it again.
    assert_eq!(s.execute_once(b"client-1", 1, &[b"INCR", b"n"], deadline()), Executed::Done(Value::Integer(1)));
    // The leader goes away; the session table is replicated state, so the new leader replays.
    c.nodes.retain(|n| n.addr() != first);
    let mut s = Session::new(members, 0);
    let elected = Instant::now() + Duration::from_secs(30);
    while !matches!(s.execute(&[b"DBSIZE"], deadline()), Executed::Done(_)) {
        assert!(Instant::now() < elected, "no new leader");
    }
    assert_eq!(s.execute_once(b"client-1", 2, &[b"INCR", b"n"], deadline()), Executed::Done(Value::Integer(2)));
    assert_eq!(s.execute_once(b"client-1", 2, &[b"INCR", b"n"], deadline()), Executed::Done(Value::Integer(2)));
    assert_eq!(
        s.execute_once(b"client-1", 3, &[b"GET", b"n"], deadline()),
        Executed::Done(bulk("2")),
        "applied once each"
    );
    match s.execute_once(b"client-1", 1, &[b"INCR", b"n"], deadline()) {
        Executed::Failed(e) => assert!(e.contains("stale sequence 1"), "{e}"),
        other => panic!("a stale sequence number ran: {other:?}"),
    }
}
