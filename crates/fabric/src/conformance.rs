//! The fabric conformance suite: one set of checks that every backend must pass.
//!
//! Each check is a function generic over a [`Harness`], which starts nodes of one backend and
//! lets their operations progress. A backend's test file calls every check with its harness
//! (see `tests/conformance.rs`). Checks panic with a message naming the broken rule.

use crate::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, OpError, OpKind, PostFlags, RegionId, RegionSpec,
    RemoteAddr, RemoteWrite,
};

/// Starts nodes of one backend for the conformance checks.
pub trait Harness {
    /// The backend's node handle.
    type F: Fabric;

    /// Starts node `id` of a cluster of `max_nodes`, registering `regions`.
    fn start(&mut self, id: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> Result<Self::F, FabricError>;

    /// Lets every posted operation run until it has completed (a no-op for synchronous backends).
    fn settle(&mut self);

    /// Crashes the node: it stops, and peers' operations to it must fail, not hang.
    fn crash(&mut self, node: Self::F);

    /// Lets in-flight operations make up to `events` steps of progress, so that a check can act
    /// while operations are partly done (a no-op for synchronous backends).
    fn advance(&mut self, events: u32) {
        let _ = events;
    }
}

/// Region written only with a grant (Mu's log).
pub const LOG: RegionId = RegionId(0);
/// Region every peer may write (Mu's background plane).
pub const OPEN: RegionId = RegionId(1);
/// Region peers may only read.
pub const READ_ONLY: RegionId = RegionId(2);
/// Region that receives READs.
pub const SCRATCH: RegionId = RegionId(3);

const LOG_LEN: u64 = 2 << 20;

/// The region layout every check uses.
pub fn regions() -> [RegionSpec; 4] {
    [
        RegionSpec::new(LOG, LOG_LEN, RemoteWrite::Granted),
        RegionSpec::new(OPEN, 4096, RemoteWrite::Always),
        RegionSpec::new(READ_ONLY, 4096, RemoteWrite::Never),
        RegionSpec::new(SCRATCH, LOG_LEN, RemoteWrite::Never),
    ]
}

fn start<H: Harness>(h: &mut H, id: u16) -> H::F {
    h.start(NodeId(id), 3, &regions()).unwrap_or_else(|e| panic!("starting node {id}: {e}"))
}

fn connect<F: Fabric>(f: &F, peer: u16) -> F::Endpoint {
    f.connect(NodeId(peer)).unwrap_or_else(|e| panic!("connecting to node {peer}: {e}"))
}

fn drain<E: Endpoint>(ep: &mut E) -> Vec<Completion> {
    std::iter::from_fn(|| ep.poll_completion()).collect()
}

fn read<F: Fabric>(f: &F, region: RegionId, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    f.read_local(region, offset, &mut buf).expect("local read in bounds");
    buf
}

/// A record whose every 8-byte word holds `seq`: a torn copy shows as unequal words.
fn record(seq: u64, len: usize) -> Vec<u8> {
    (0..len / 8).flat_map(|_| seq.to_le_bytes()).collect()
}

fn record_seq(bytes: &[u8]) -> Option<u64> {
    let mut words = bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
    let first = words.next()?;
    words.all(|w| w == first).then_some(first)
}

fn post_write<E: Endpoint>(ep: &mut E, wr_id: u64, region: RegionId, offset: u64, data: &[u8], flags: PostFlags) {
    ep.post_write(wr_id, RemoteAddr::new(region, offset), data, flags)
        .unwrap_or_else(|e| panic!("posting write {wr_id}: {e}"));
}

/// Writes on one endpoint take effect and complete in posting order.
pub fn fifo_order<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = connect(&writer, 0);
    for i in 1..=200u64 {
        post_write(&mut ep, i, LOG, 64, &i.to_le_bytes(), PostFlags::SIGNALED);
        post_write(&mut ep, 1000 + i, LOG, 8 * (i % 32) + 1024, &i.to_le_bytes(), PostFlags::NONE);
    }
    h.settle();
    let done = drain(&mut ep);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (1..=200).collect::<Vec<_>>(), "signaled completions must arrive in post order, once each");
    assert!(done.iter().all(|c| c.status.is_ok() && c.kind == OpKind::Write));
    assert_eq!(target.load_u64(LOG, 64).expect("word"), 200, "the last write to an address wins");
    for slot in 0..32u64 {
        let last = (1..=200u64).filter(|i| i % 32 == slot).max().expect("some write");
        assert_eq!(target.load_u64(LOG, 1024 + 8 * slot).expect("word"), last, "unsignaled writes land in order");
    }
}

/// A READ posted after a WRITE on the same endpoint sees that write.
pub fn read_your_write<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = connect(&writer, 0);
    for round in 0..50u64 {
        let data = record(round + 1, 256);
        post_write(&mut ep, 2 * round, LOG, 4096, &data, PostFlags::NONE);
        ep.post_read(2 * round + 1, RemoteAddr::new(LOG, 4096), 256, SCRATCH, 512, PostFlags::SIGNALED)
            .expect("post read");
        h.settle();
        let done = drain(&mut ep);
        assert_eq!(done.len(), 1, "one signaled read, no completion for the unsignaled write");
        assert_eq!(done[0].kind, OpKind::Read);
        assert_eq!(done[0].status, Ok(()));
        assert_eq!(read(&writer, SCRATCH, 512, 256), data, "read must return the preceding write");
        // SAFETY: nothing writes the writer's SCRATCH now: its one READ has completed.
        let lent = unsafe { writer.local_bytes(SCRATCH, 512, 256) }.expect("local bytes in bounds");
        assert_eq!(&*lent, &data[..], "local bytes lent in place must be the bytes that landed");
    }
}

/// A backend that lends its peers' memory ([`Fabric::lends_peer_memory`]) gives, through an
/// endpoint, the words and bytes its peer wrote locally, bounds checked, and still after the
/// peer crashed; one that does not refuses both.
pub fn peer_memory_is_lent_or_refused<H: Harness>(h: &mut H) {
    let at = RemoteAddr::new;
    let target = start(h, 0);
    let reader = start(h, 1);
    let data = record(7, 296);
    target.write_local(READ_ONLY, 1024, &data).expect("write local");
    target.store_u64(READ_ONLY, 2048, 0xfeed_f00d).expect("store");
    let ep = connect(&reader, 0);
    if !reader.lends_peer_memory() {
        let e = ep.peer_load_u64(at(READ_ONLY, 2048));
        assert!(matches!(e, Err(FabricError::Unsupported { .. })), "{e:?}");
        // SAFETY: refused before any byte is lent.
        let e = unsafe { ep.peer_bytes(at(READ_ONLY, 1024), 296) }.map(|b| b.len());
        assert!(matches!(e, Err(FabricError::Unsupported { .. })), "{e:?}");
        return;
    }
    let check = |ep: &<H::F as Fabric>::Endpoint| {
        assert_eq!(ep.peer_load_u64(at(READ_ONLY, 2048)).expect("a lent word"), 0xfeed_f00d);
        // SAFETY: the target writes nothing more.
        let lent = unsafe { ep.peer_bytes(at(READ_ONLY, 1024), 296) }.expect("lent bytes");
        assert_eq!(&*lent, &data[..], "the bytes the peer wrote locally");
    };
    check(&ep);
    assert!(matches!(ep.peer_load_u64(at(READ_ONLY, 2052)), Err(FabricError::Misaligned { .. })));
    assert!(matches!(ep.peer_load_u64(at(READ_ONLY, 4096)), Err(FabricError::OutOfBounds { .. })));
    // SAFETY: refused before any byte is lent.
    let e = unsafe { ep.peer_bytes(at(READ_ONLY, 4000), 97) }.map(|b| b.len());
    assert!(matches!(e, Err(FabricError::OutOfBounds { .. })), "{e:?}");
    // SAFETY: as above.
    let e = unsafe { ep.peer_bytes(at(RegionId(9), 0), 1) }.map(|b| b.len());
    assert!(matches!(e, Err(FabricError::UnknownRegion { .. })), "{e:?}");
    h.crash(target);
    check(&ep);
}

/// Without a grant a write fails, lands nowhere, and flushes the endpoint until reconnected.
pub fn write_without_grant_fails_and_never_lands<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    let mut ep = connect(&writer, 0);
    post_write(&mut ep, 1, LOG, 0, b"stale leader", PostFlags::NONE);
    post_write(&mut ep, 2, OPEN, 0, b"flushed", PostFlags::SIGNALED);
    h.settle();
    let done = drain(&mut ep);
    assert_eq!(done.len(), 2, "failures complete even when unsignaled: {done:?}");
    assert_eq!(done[0].status, Err(OpError::PermissionDenied));
    assert_eq!(done[1].status, Err(OpError::Flushed), "operations after a failure are flushed");
    assert_eq!(ep.state(), EndpointState::Error);
    assert_eq!(read(&target, LOG, 0, 12), vec![0; 12], "a denied write must not land");
    assert_eq!(read(&target, OPEN, 0, 7), vec![0; 7], "a flushed write must not land");
    ep.reconnect().expect("reconnect");
    assert_eq!(ep.state(), EndpointState::Ready);
    post_write(&mut ep, 3, OPEN, 0, b"ok", PostFlags::SIGNALED);
    post_write(&mut ep, 4, READ_ONLY, 0, b"no", PostFlags::NONE);
    h.settle();
    let done = drain(&mut ep);
    assert_eq!(done.iter().map(|c| c.status).collect::<Vec<_>>(), vec![Ok(()), Err(OpError::PermissionDenied)]);
    assert_eq!(read(&target, OPEN, 0, 2), b"ok");
    assert_eq!(read(&target, READ_ONLY, 0, 2), vec![0, 0], "read-only regions never take remote writes");
}

/// After `revoke_write` returns no write of the revoked peer lands; a new grant restores access.
pub fn revoke_then_regrant<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = connect(&writer, 0);
    post_write(&mut ep, 1, LOG, 0, &record(1, 64), PostFlags::SIGNALED);
    h.settle();
    assert_eq!(drain(&mut ep)[0].status, Ok(()));
    target.revoke_write(LOG, NodeId(1)).expect("revoke");
    post_write(&mut ep, 2, LOG, 0, &record(2, 64), PostFlags::SIGNALED);
    h.settle();
    assert_eq!(drain(&mut ep)[0].status, Err(OpError::PermissionDenied));
    assert_eq!(record_seq(&read(&target, LOG, 0, 64)), Some(1), "write after revoke landed");
    target.grant_write(LOG, NodeId(1)).expect("re-grant");
    ep.reconnect().expect("reconnect");
    post_write(&mut ep, 3, LOG, 0, &record(3, 64), PostFlags::SIGNALED);
    h.settle();
    assert_eq!(drain(&mut ep)[0].status, Ok(()));
    assert_eq!(record_seq(&read(&target, LOG, 0, 64)), Some(3), "write after re-grant must land");
    assert!(matches!(target.grant_write(OPEN, NodeId(1)), Err(FabricError::NotGrantable { .. })));
    assert!(matches!(target.revoke_write(READ_ONLY, NodeId(1)), Err(FabricError::NotGrantable { .. })));
}

/// Revocations racing with streams of writes: whatever landed is whole, it is exactly what the
/// writer saw succeed, and nothing changes after the revocation returned.
pub fn revoke_races_writes<H: Harness>(h: &mut H, rounds: u32) {
    let target = start(h, 0);
    let writer = start(h, 1);
    let mut ep = connect(&writer, 0);
    let (mut seq, mut landed, mut lcg) = (0u64, 0u64, 0x9e37_79b9_7f4a_7c15u64);
    for round in 0..rounds {
        target.grant_write(LOG, NodeId(1)).expect("grant");
        ep.reconnect().expect("reconnect");
        lcg = lcg.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let (burst, progress) = (1 + (lcg >> 33) % 16, (lcg >> 17) as u32 % 24);
        let first = seq + 1;
        for _ in 0..burst {
            seq += 1;
            post_write(&mut ep, seq, LOG, 0, &record(seq, 512), PostFlags::SIGNALED);
        }
        h.advance(progress);
        target.revoke_write(LOG, NodeId(1)).expect("revoke");
        let at_revoke = read(&target, LOG, 0, 512);
        h.settle();
        let done = drain(&mut ep);
        let oks: Vec<u64> = done.iter().take_while(|c| c.status.is_ok()).map(|c| c.wr_id).collect();
        assert!(done[oks.len()..].iter().all(|c| c.status.is_err()), "round {round}: success after a failure");
        assert_eq!(oks, (first..first + oks.len() as u64).collect::<Vec<_>>(), "round {round}: out of order");
        if let Some(&last) = oks.last() {
            landed = last;
        }
        let seen = record_seq(&at_revoke).unwrap_or_else(|| panic!("round {round}: torn record when revoke returned"));
        assert_eq!(seen, landed, "round {round}: memory at revoke is not the last acknowledged write");
        assert_eq!(read(&target, LOG, 0, 512), at_revoke, "round {round}: a write landed after revoke returned");
    }
}

/// Operations to a crashed peer complete with errors (they never hang), and it cannot be
/// reconnected.
pub fn peer_crash_gives_errors<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    let mut ep = connect(&writer, 0);
    h.crash(target);
    post_write(&mut ep, 1, OPEN, 0, b"anyone there", PostFlags::SIGNALED);
    ep.post_read(2, RemoteAddr::new(OPEN, 0), 8, SCRATCH, 0, PostFlags::SIGNALED).expect("post read");
    h.settle();
    let done = drain(&mut ep);
    assert_eq!(done.len(), 2, "every operation to a dead peer completes: {done:?}");
    assert_eq!(done[0].status, Err(OpError::PeerUnreachable));
    assert!(done[1].status.is_err());
    assert!(ep.reconnect().is_err(), "a dead peer cannot be reconnected");
    assert!(writer.connect(NodeId(0)).is_err(), "a dead peer cannot be connected");
}

/// Megabyte writes and reads arrive intact.
pub fn large_transfers<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = connect(&writer, 0);
    let len = (LOG_LEN / 2) as usize;
    let data: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
    post_write(&mut ep, 1, LOG, 4096, &data, PostFlags::SIGNALED);
    ep.post_read(2, RemoteAddr::new(LOG, 4096), len as u32, SCRATCH, 8, PostFlags::SIGNALED).expect("read");
    h.settle();
    assert!(drain(&mut ep).iter().all(|c| c.status.is_ok()));
    assert!(read(&target, LOG, 4096, len) == data, "large write corrupted");
    assert!(read(&writer, SCRATCH, 8, len) == data, "large read corrupted");
}

/// Unregistered regions, out-of-bounds and misaligned accesses are refused with a typed error
/// and change nothing.
pub fn bad_addresses_rejected<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let mut ep = connect(&writer, 0);
    let at = |region, offset| RemoteAddr::new(region, offset);
    let e = ep.post_write(1, at(RegionId(9), 0), b"x", PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::UnknownRegion { region: RegionId(9), .. })), "{e:?}");
    let e = ep.post_write(2, at(LOG, LOG_LEN - 4), b"12345678", PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::OutOfBounds { .. })), "{e:?}");
    let e = ep.post_write(3, at(LOG, u64::MAX - 2), b"12345678", PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::OutOfBounds { .. })), "offset overflow: {e:?}");
    let e = ep.post_read(4, at(OPEN, 4090), 8, SCRATCH, 0, PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::OutOfBounds { .. })), "{e:?}");
    let e = ep.post_read(5, at(OPEN, 0), 8, SCRATCH, LOG_LEN - 4, PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::OutOfBounds { .. })), "local destination: {e:?}");
    let e = ep.post_read(6, at(OPEN, 0), 8, RegionId(7), 0, PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::UnknownRegion { .. })), "{e:?}");
    h.settle();
    assert!(drain(&mut ep).is_empty(), "rejected posts must not complete");
    assert_eq!(ep.state(), EndpointState::Ready, "a rejected post is the caller's error, not the link's");
    assert!(matches!(target.load_u64(OPEN, 4), Err(FabricError::Misaligned { .. })));
    assert!(matches!(target.store_u64(OPEN, 4096, 1), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(target.read_local(OPEN, 4095, &mut [0; 2]), Err(FabricError::OutOfBounds { .. })));
    // SAFETY: refused before any byte is lent.
    assert!(matches!(unsafe { target.local_bytes(OPEN, 4095, 2) }, Err(FabricError::OutOfBounds { .. })));
    // SAFETY: as above.
    assert!(matches!(unsafe { target.local_bytes(RegionId(5), 0, 1) }, Err(FabricError::UnknownRegion { .. })));
    assert!(matches!(target.write_local(RegionId(5), 0, &[1]), Err(FabricError::UnknownRegion { .. })));
    assert!(matches!(writer.connect(NodeId(1)), Err(FabricError::InvalidPeer { .. })), "connect to self");
    assert!(matches!(writer.connect(NodeId(3)), Err(FabricError::InvalidPeer { .. })), "outside the cluster");
    assert!(matches!(target.grant_write(LOG, NodeId(40)), Err(FabricError::InvalidPeer { .. })));
    assert!(read(&target, LOG, LOG_LEN - 8, 8).iter().all(|&b| b == 0), "nothing was written");
    let dup = [regions()[0], regions()[0]];
    assert!(matches!(h.start(NodeId(2), 3, &dup), Err(FabricError::InvalidLayout(_))));
    assert!(matches!(h.start(NodeId(3), 3, &regions()), Err(FabricError::InvalidLayout(_))));
}

/// A write hint changes nothing: no memory, no completion, no error, whatever the address or
/// grant; the write it announced then lands as any other.
pub fn prefetch_is_only_a_hint<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    let mut ep = connect(&writer, 0);
    let at = |region, offset| RemoteAddr::new(region, offset);
    ep.prefetch_write(at(LOG, 128), 256);
    ep.prefetch_write(at(READ_ONLY, 0), 64);
    ep.prefetch_write(at(LOG, LOG_LEN - 4), 64);
    ep.prefetch_write(at(RegionId(9), 0), 64);
    h.settle();
    assert!(drain(&mut ep).is_empty(), "a hint never completes");
    assert_eq!(ep.state(), EndpointState::Ready, "a hint is no operation that can fail");
    assert!(read(&target, LOG, 0, 512).iter().all(|&b| b == 0), "a hint writes nothing");
    target.grant_write(LOG, NodeId(1)).expect("grant");
    ep.prefetch_write(at(LOG, 128), 256);
    post_write(&mut ep, 1, LOG, 128, &record(7, 256), PostFlags::SIGNALED);
    h.settle();
    assert_eq!(drain(&mut ep).iter().map(|c| c.status).collect::<Vec<_>>(), vec![Ok(())]);
    assert_eq!(record_seq(&read(&target, LOG, 128, 256)), Some(7), "the announced write lands whole");
}

/// Local word accessors agree with remote writes (little-endian, 8-byte aligned).
pub fn words_and_local_access<H: Harness>(h: &mut H) {
    let target = start(h, 0);
    let writer = start(h, 1);
    let mut ep = connect(&writer, 0);
    post_write(&mut ep, 1, OPEN, 16, &0x0102_0304_0506_0708u64.to_le_bytes(), PostFlags::SIGNALED);
    h.settle();
    assert_eq!(drain(&mut ep)[0].status, Ok(()));
    assert_eq!(target.load_u64(OPEN, 16).expect("load"), 0x0102_0304_0506_0708);
    target.store_u64(OPEN, 24, 42).expect("store");
    target.write_local(OPEN, 32, b"local").expect("write");
    ep.post_read(2, RemoteAddr::new(OPEN, 24), 13, SCRATCH, 0, PostFlags::SIGNALED).expect("read");
    h.settle();
    assert_eq!(drain(&mut ep)[0].status, Ok(()));
    let got = read(&writer, SCRATCH, 0, 13);
    assert_eq!(&got[..8], &42u64.to_le_bytes());
    assert_eq!(&got[8..], b"local");
    assert_eq!(target.region_len(LOG).expect("len"), LOG_LEN);
    assert!(target.region_len(RegionId(11)).is_err());
}

/// An endpoint holds a bounded number of completions; posting past it fails cleanly and works
/// again once completions are polled.
pub fn queue_bound<H: Harness>(h: &mut H) {
    let _target = start(h, 0);
    let writer = start(h, 1);
    let mut ep = connect(&writer, 0);
    let mut posted = 0u64;
    let full = loop {
        match ep.post_write(posted, RemoteAddr::new(OPEN, 0), b"x", PostFlags::SIGNALED) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted < 1 << 20, "the endpoint queue is unbounded");
    };
    assert!(matches!(full, FabricError::QueueFull { .. }), "{full:?}");
    h.settle();
    assert_eq!(drain(&mut ep).len() as u64, posted, "every accepted post completes");
    ep.post_write(posted, RemoteAddr::new(OPEN, 0), b"x", PostFlags::SIGNALED).expect("room again");
}

/// Runs every check, each on fresh nodes from `new_harness`.
///
/// With `skip_if: f`, each test first calls `f() -> Option<String>` and, given a reason, prints
/// it and passes without running (for backends that need hardware the host may lack).
#[macro_export]
macro_rules! conformance_tests {
    ($new_harness:expr) => {
        $crate::conformance_tests!($new_harness, skip_if: (|| None::<String>));
    };
    ($new_harness:expr, skip_if: $skip:expr) => {
        #[test]
        fn fifo_order() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::fifo_order(&mut $new_harness("fifo"));
        }
        #[test]
        fn read_your_write() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::read_your_write(&mut $new_harness("ryw"));
        }
        #[test]
        fn write_without_grant_fails_and_never_lands() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::write_without_grant_fails_and_never_lands(&mut $new_harness("nogrant"));
        }
        #[test]
        fn peer_memory_is_lent_or_refused() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::peer_memory_is_lent_or_refused(&mut $new_harness("lend"));
        }
        #[test]
        fn prefetch_is_only_a_hint() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::prefetch_is_only_a_hint(&mut $new_harness("hint"));
        }
        #[test]
        fn revoke_then_regrant() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::revoke_then_regrant(&mut $new_harness("regrant"));
        }
        #[test]
        fn revoke_races_writes() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::revoke_races_writes(&mut $new_harness("race"), 2000);
        }
        #[test]
        fn peer_crash_gives_errors() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::peer_crash_gives_errors(&mut $new_harness("crash"));
        }
        #[test]
        fn large_transfers() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::large_transfers(&mut $new_harness("large"));
        }
        #[test]
        fn bad_addresses_rejected() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::bad_addresses_rejected(&mut $new_harness("bad"));
        }
        #[test]
        fn words_and_local_access() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::words_and_local_access(&mut $new_harness("words"));
        }
        #[test]
        fn queue_bound() {
            if let Some(why) = ($skip)() {
                eprintln!("{why}");
                return;
            }
            $crate::conformance::queue_bound(&mut $new_harness("queue"));
        }
    };
}
