//! verbs-specific behaviour beyond the conformance suite: Mu §5.2's fast and slow revocation paths,
//! per-region permissions over one endpoint, MR re-registration, typed start-up errors, and one
//! node handle shared by threads. Needs an RDMA device (soft-RoCE will do: scripts/verbs-test.sh
//! runs this in a VM); without one each test prints why and passes, unless
//! MICROREP_REQUIRE_RDMA=1.
#![cfg(feature = "verbs")]

use microrep_fabric::conformance::Harness;
use microrep_fabric::conformance::{LOG, OPEN, READ_ONLY, SCRATCH, regions};
use microrep_fabric::verbs::{VerbsConfig, VerbsFabric, VerbsHarness, VerbsTestEndpoint, VerbsTestNode, skip_reason};
use microrep_fabric::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, OpError, PostFlags, RegionId, RemoteAddr,
    RevokePath,
};

fn skip() -> bool {
    skip_reason().inspect(|why| eprintln!("{why}")).is_some()
}

fn pair(h: &mut VerbsHarness) -> (VerbsTestNode, VerbsTestNode, VerbsTestEndpoint) {
    let target = h.start(NodeId(0), 3, &regions()).expect("start target");
    let writer = h.start(NodeId(1), 3, &regions()).expect("start writer");
    let ep = writer.connect(NodeId(0)).expect("connect");
    (target, writer, ep)
}

/// Posts one signaled write and returns its status once the harness settled.
fn write(
    h: &mut VerbsHarness,
    ep: &mut VerbsTestEndpoint,
    region: RegionId,
    offset: u64,
    data: &[u8],
) -> Result<(), OpError> {
    ep.post_write(7, RemoteAddr::new(region, offset), data, PostFlags::SIGNALED).expect("post write");
    h.settle();
    let done: Vec<Completion> = std::iter::from_fn(|| ep.poll_completion()).collect();
    assert_eq!(done.len(), 1, "one completion per signaled write: {done:?}");
    done[0].status
}

fn read_word(node: &VerbsTestNode, region: RegionId, offset: u64) -> u64 {
    node.load_u64(region, offset).expect("load")
}

/// Mu §5.2: the fast path (QP access flags) stops the writer; once a denied write has moved the
/// target's QP to the error state (soft-RoCE does), the next revoke takes the slow path (RESET,
/// INIT, RTR, RTS), and the connection still works after the writer reconnects.
#[test]
fn revoke_fast_path_then_slow_path() {
    if skip() {
        return;
    }
    let mut h = VerbsHarness::new();
    let (target, _writer, mut ep) = pair(&mut h);
    let on_rxe = target.fabric().device().0.starts_with("rxe");
    target.grant_write(LOG, NodeId(1)).expect("grant");
    assert_eq!(write(&mut h, &mut ep, LOG, 0, &1u64.to_le_bytes()), Ok(()));
    assert_eq!(target.revoke_write(LOG, NodeId(1)), Ok(RevokePath::Fast), "a QP in RTS takes the fast path");
    assert_eq!(write(&mut h, &mut ep, LOG, 0, &2u64.to_le_bytes()), Err(OpError::PermissionDenied));
    assert_eq!(ep.state(), EndpointState::Error);
    assert_eq!(read_word(&target, LOG, 0), 1, "a write after the revoke landed");
    let path = target.revoke_write(LOG, NodeId(1)).expect("revoke again");
    if on_rxe {
        assert_eq!(path, RevokePath::Slow, "soft-RoCE leaves the responder QP in error after a denied write");
    }
    ep.reconnect().expect("reconnect after the slow path");
    assert_eq!(write(&mut h, &mut ep, LOG, 0, &3u64.to_le_bytes()), Err(OpError::PermissionDenied));
    assert_eq!(read_word(&target, LOG, 0), 1, "still revoked after the slow path");
    target.grant_write(LOG, NodeId(1)).expect("grant");
    ep.reconnect().expect("reconnect");
    assert_eq!(write(&mut h, &mut ep, LOG, 0, &4u64.to_le_bytes()), Ok(()));
    assert_eq!(read_word(&target, LOG, 0), 4);
}

/// Revoking the log leaves the always-writable region writable through the same endpoint (each
/// granted region has its own lane), and READs of the revoked region still work.
#[test]
fn revoking_one_region_leaves_the_others_writable() {
    if skip() {
        return;
    }
    let mut h = VerbsHarness::new();
    let (target, writer, mut ep) = pair(&mut h);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    assert_eq!(write(&mut h, &mut ep, LOG, 8, &5u64.to_le_bytes()), Ok(()));
    target.revoke_write(LOG, NodeId(1)).expect("revoke");
    assert_eq!(write(&mut h, &mut ep, OPEN, 0, &6u64.to_le_bytes()), Ok(()), "the open lane is not revoked");
    assert_eq!(read_word(&target, OPEN, 0), 6);
    ep.post_read(8, RemoteAddr::new(LOG, 8), 8, SCRATCH, 0, PostFlags::SIGNALED).expect("post read");
    h.settle();
    assert_eq!(ep.poll_completion().map(|c| c.status), Some(Ok(())), "a revoked region stays readable");
    assert_eq!(read_word(&writer, SCRATCH, 0), 5);
    assert_eq!(write(&mut h, &mut ep, READ_ONLY, 0, &7u64.to_le_bytes()), Err(OpError::PermissionDenied));
}

/// MR re-registration is measured where the device implements it and reported unsupported on
/// soft-RoCE, which does not.
#[test]
fn rereg_mr_is_measured_or_reported_unsupported() {
    if skip() {
        return;
    }
    let mut h = VerbsHarness::new();
    let node = h.start(NodeId(0), 1, &regions()).expect("start");
    let result = node.fabric().rereg_mr_probe(1 << 20);
    eprintln!("ibv_rereg_mr of 1 MiB on {}: {result:?}", node.fabric().device().0);
    if node.fabric().device().0.starts_with("rxe") {
        assert!(matches!(result, Err(FabricError::Unsupported { .. })), "{result:?}");
    } else {
        assert!(result.is_ok(), "{result:?}");
    }
}

/// Bad device, GID index and oversized writes are typed errors, not panics.
#[test]
fn start_up_and_post_errors_are_typed() {
    if skip() {
        return;
    }
    let h = VerbsHarness::new();
    let mut config = h.config(NodeId(0), 2, &regions());
    config.device = Some("no-such-device".into());
    assert!(matches!(VerbsFabric::start(config), Err(FabricError::NoRdmaDevice(_))));
    let mut config = h.config(NodeId(0), 2, &regions());
    config.gid_index = Some(250);
    assert!(matches!(VerbsFabric::start(config), Err(FabricError::NoRdmaDevice(_))));
    let mut config: VerbsConfig = h.config(NodeId(0), 2, &regions());
    config.queue_depth = 0;
    assert!(matches!(VerbsFabric::start(config), Err(FabricError::InvalidLayout(_))));

    let mut h = VerbsHarness::tuned(|c| c.staging_bytes = 4096);
    let (target, _writer, mut ep) = pair(&mut h);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    let big = vec![1u8; 8192];
    let e = ep.post_write(1, RemoteAddr::new(LOG, 0), &big, PostFlags::SIGNALED);
    assert!(matches!(e, Err(FabricError::Unsupported { .. })), "{e:?}");
    assert_eq!(write(&mut h, &mut ep, LOG, 0, &[2u8; 4096]), Ok(()), "a write the staging ring fits");
}

/// One node handle serves two threads that connect and write concurrently (the runtime's
/// replication and background planes).
#[test]
fn one_handle_serves_two_threads() {
    if skip() {
        return;
    }
    let mut h = VerbsHarness::new();
    let target = h.start(NodeId(0), 3, &regions()).expect("start target");
    let writer = VerbsFabric::start(h.config(NodeId(1), 3, &regions())).expect("start writer");
    target.grant_write(LOG, NodeId(1)).expect("grant");
    std::thread::scope(|s| {
        for (plane, region) in [(0u64, LOG), (1, OPEN)] {
            let writer = &writer;
            s.spawn(move || {
                let mut ep = writer.connect(NodeId(0)).expect("connect");
                for i in 1..=500u64 {
                    ep.post_write(i, RemoteAddr::new(region, 8 * plane), &i.to_le_bytes(), PostFlags::SIGNALED)
                        .expect("post");
                    let deadline = std::time::Instant::now() + ep.failure_bound();
                    let done = loop {
                        if let Some(c) = ep.poll_completion() {
                            break c;
                        }
                        assert!(std::time::Instant::now() < deadline, "no completion for write {i}");
                        std::thread::yield_now();
                    };
                    assert_eq!((done.wr_id, done.status), (i, Ok(())));
                }
            });
        }
    });
    assert_eq!(read_word(&target, LOG, 0), 500);
    assert_eq!(read_word(&target, OPEN, 8), 500);
}

/// Staging bytes are freed by completions, and unsignaled WRITEs make none: WRITEs that fill the
/// staging ring before any of them is signaled must not leave the ring full for good. A writer
/// that retries on `QueueFull` gets every WRITE posted, and every one lands. (Before the fix the
/// fifth 16 KiB WRITE into a 64 KiB ring was refused forever: found with multicast over
/// soft-RoCE.)
#[test]
fn unsignaled_writes_that_fill_the_staging_ring_do_not_stall_it() {
    if skip() {
        return;
    }
    let mut h = VerbsHarness::tuned(|c| c.staging_bytes = 64 << 10);
    let (target, _writer, mut ep) = pair(&mut h);
    target.grant_write(LOG, NodeId(1)).expect("grant");
    const CHUNK: u64 = 16 << 10;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut refused = 0u64;
    for i in 0..64u64 {
        let data = vec![i as u8 + 1; CHUNK as usize];
        loop {
            match ep.post_write(i, RemoteAddr::new(LOG, i * CHUNK), &data, PostFlags::NONE) {
                Ok(()) => break,
                Err(FabricError::QueueFull { .. }) => {
                    refused += 1;
                    assert!(std::time::Instant::now() < deadline, "WRITE {i} never found room in the staging ring");
                    while ep.poll_completion().is_some() {}
                    std::thread::yield_now();
                }
                Err(e) => panic!("post: {e}"),
            }
        }
    }
    h.settle();
    assert!(refused > 0, "the ring filled up (the case under test)");
    for i in 0..64u64 {
        let mut landed = vec![0u8; CHUNK as usize];
        target.read_local(LOG, i * CHUNK, &mut landed).expect("read");
        assert!(landed.iter().all(|&b| b == i as u8 + 1), "WRITE {i} landed whole");
    }
    assert_ne!(ep.state(), EndpointState::Error);
}
