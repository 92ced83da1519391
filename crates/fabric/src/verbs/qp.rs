//! Reliable-connected queue pairs: creation and the RESET -> INIT -> RTR -> RTS state machine.

use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, ModifyQueuePairError, QueuePair, QueuePairAttribute, QueuePairAttributeMask, QueuePairState,
};

use super::VerbsConfig;
use super::device::Device;
use crate::FabricError;

/// What a peer needs to connect its QP to one of ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpAddress {
    pub(crate) qpn: u32,
    /// The first packet sequence number this side sends.
    pub(crate) psn: u32,
    pub(crate) lid: u16,
    pub(crate) gid: Gid,
    pub(crate) mtu: Mtu,
}

/// A fresh 24-bit packet sequence number.
pub(crate) fn fresh_psn() -> u32 {
    rand::random::<u32>() & 0x00ff_ffff
}

/// Remote access rights of a QP: READ always, WRITE when `write`.
pub(crate) fn remote_access(write: bool) -> AccessFlags {
    if write { AccessFlags::RemoteRead | AccessFlags::RemoteWrite } else { AccessFlags::RemoteRead }
}

/// Creates an RC QP on `cq` with `depth` send slots, asking for `inline_bytes` of inline data and
/// falling back to less when the device refuses. Returns the QP and the inline size it got.
pub(crate) fn create(
    device: &Device,
    cq: &Arc<BasicCompletionQueue>,
    depth: u32,
    inline_bytes: u32,
) -> Result<(BasicQueuePair, u32), FabricError> {
    let mut inline = inline_bytes;
    loop {
        let mut builder = device.pd.create_qp_builder();
        builder
            .setup_max_send_wr(depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(inline)
            .setup_send_cq(GenericCompletionQueue::from(Arc::clone(cq)))
            .setup_recv_cq(GenericCompletionQueue::from(Arc::clone(cq)));
        match builder.build() {
            Ok(qp) => return Ok((qp, inline)),
            Err(_) if inline > 0 => inline /= 2,
            Err(e) => return Err(verbs_error(&device.name, "creating a queue pair", &e)),
        }
    }
}

/// Takes `qp` from any state to RTS, connected to `remote`, sending from `local_psn`, with remote
/// `access` (RESET, INIT, RTR, RTS; Mu §5.2's slow path is exactly this cycle).
pub(crate) fn cycle_to_rts(
    qp: &mut BasicQueuePair,
    device: &Device,
    config: &VerbsConfig,
    local_psn: u32,
    remote: &QpAddress,
    access: AccessFlags,
) -> Result<(), FabricError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| FabricError::Os {
        context: format!("{}: moving a queue pair to {what}", device.name),
        kind: std::io::ErrorKind::Other,
        message: e.to_string(),
    };
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Reset);
    qp.modify(&attr).map_err(|e| fail("RESET", &e))?;

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init).setup_pkey_index(0).setup_port(device.port).setup_access_flags(access);
    qp.modify(&attr).map_err(|e| fail("INIT", &e))?;

    let mut av = AddressHandleAttribute::new();
    av.setup_dest_lid(remote.lid)
        .setup_port(device.port)
        .setup_service_level(0)
        .setup_grh_src_gid_index(device.gid_index)
        .setup_grh_dest_gid(&remote.gid)
        .setup_grh_hop_limit(64);
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(device.mtu.min(remote.mtu))
        .setup_dest_qp_num(remote.qpn)
        .setup_rq_psn(remote.psn)
        .setup_max_dest_read_atomic(device.max_rd_atomic)
        .setup_min_rnr_timer(12)
        .setup_address_vector(&av);
    qp.modify(&attr).map_err(|e| fail("RTR", &e))?;

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(local_psn)
        .setup_timeout(config.ack_timeout_exp)
        .setup_retry_cnt(config.retry_count)
        .setup_rnr_retry(7)
        .setup_max_read_atomic(device.max_rd_atomic);
    qp.modify(&attr).map_err(|e| fail("RTS", &e))
}

/// Moves `qp` to the error state: outstanding work completes with flush errors.
pub(crate) fn to_error(qp: &mut BasicQueuePair) {
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Error);
    // A QP that cannot even be moved to ERR is already unusable; the caller reconnects anyway.
    let _ = qp.modify(&attr);
}

/// Changes only the remote access flags of a QP in RTS (Mu §5.2's fast path).
pub(crate) fn set_access(qp: &mut BasicQueuePair, access: AccessFlags) -> Result<(), ModifyQueuePairError> {
    let mut attr = QueuePairAttribute::new();
    attr.setup_access_flags(access);
    qp.modify(&attr)
}

/// The QP's current state as the device sees it (not libibverbs' cached copy).
pub(crate) fn state(qp: &BasicQueuePair) -> QueuePairState {
    match qp.query(QueuePairAttributeMask::State) {
        Ok((attr, _)) => attr.state(),
        Err(_) => QueuePairState::Unknown,
    }
}

/// The next PSN this QP expects to receive.
pub(crate) fn receive_psn(qp: &BasicQueuePair) -> Option<u32> {
    qp.query(QueuePairAttributeMask::ReceiveQueuePacketSequenceNumber).ok().map(|(attr, _)| attr.rq_psn())
}

pub(crate) fn verbs_error(device: &str, what: &str, e: &dyn std::error::Error) -> FabricError {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    FabricError::Os { context: format!("{device}: {what}"), kind: std::io::ErrorKind::Other, message }
}
