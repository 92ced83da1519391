//! An shm endpoint: one-sided operations are copies into or out of the peer's mapped segment,
//! done by the posting thread, so each completes before `post_*` returns.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::handshake::{self, WriterFence};
use super::segment::{copy_shared, prefetch_for_write};
use super::{Local, PeerLink};
use crate::{
    Completion, Endpoint, EndpointState, FabricError, NodeId, OpError, OpKind, PostFlags, RegionId, RemoteAddr,
    RemoteWrite,
};

/// An endpoint (queue pair) of the shm backend.
#[derive(Debug)]
pub struct ShmEndpoint {
    local: Arc<Local>,
    link: Arc<PeerLink>,
    peer: NodeId,
    state: EndpointState,
    completions: VecDeque<Completion>,
}

impl ShmEndpoint {
    pub(super) fn new(local: Arc<Local>, link: Arc<PeerLink>) -> Self {
        let peer = link.segment.owner().node;
        let depth = local.config.queue_depth;
        Self { local, link, peer, state: EndpointState::Ready, completions: VecDeque::with_capacity(depth) }
    }

    fn reserve(&self) -> Result<(), FabricError> {
        if self.completions.len() >= self.local.config.queue_depth {
            return Err(FabricError::QueueFull { peer: self.peer, depth: self.local.config.queue_depth });
        }
        Ok(())
    }

    /// Records the outcome of an operation; a failure moves the endpoint to the error state.
    fn finish(&mut self, wr_id: u64, kind: OpKind, status: Result<(), OpError>, flags: PostFlags) {
        if status.is_err() {
            self.state = EndpointState::Error;
        }
        if status.is_err() || flags.is_signaled() {
            self.completions.push_back(Completion { wr_id, kind, status });
        }
    }

    /// Why an operation cannot start, if it cannot.
    fn blocked(&self) -> Option<OpError> {
        if self.state == EndpointState::Error {
            Some(OpError::Flushed)
        } else if !self.link.usable() {
            Some(OpError::PeerUnreachable)
        } else {
            None
        }
    }

    /// Copies `data` to `dst` under the permission protocol of `PermSlot`.
    fn write_guarded(
        &self,
        dst: *mut u8,
        data: &[u8],
        region_index: usize,
        policy: RemoteWrite,
    ) -> Result<(), OpError> {
        match policy {
            RemoteWrite::Never => Err(OpError::PermissionDenied),
            RemoteWrite::Always => {
                // SAFETY: `dst` was bounds checked for data.len() bytes of the peer's mapping,
                // which `self.link` keeps mapped; `data` is private memory, so no overlap.
                unsafe { copy_shared(data.as_ptr(), dst, data.len()) };
                Ok(())
            }
            RemoteWrite::Granted => {
                let slot = self.link.segment.perm_slot(region_index, self.local.config.node);
                // The writer's side of the handshake (Mu §5.2: the check a NIC makes at the
                // target when the write arrives). The revoker's membarrier supplies the hardware
                // fence of a light-fenced writer (see `fence`).
                let fence = if self.link.light_fence { WriterFence::Light } else { WriterFence::Full };
                if !handshake::enter(&slot.granted, &slot.in_flight, self.local.incarnation(), fence) {
                    return Err(OpError::PermissionDenied);
                }
                // SAFETY: as above; the revoker waits for `in_flight` to drop before returning.
                unsafe { copy_shared(data.as_ptr(), dst, data.len()) };
                handshake::leave(&slot.in_flight);
                Ok(())
            }
        }
    }
}

impl Endpoint for ShmEndpoint {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError> {
        let (index, policy, ptr) = self.link.segment.locate(dst.region, dst.offset, data.len() as u64)?;
        self.reserve()?;
        let status = match self.blocked() {
            Some(err) => Err(err),
            None => self.write_guarded(ptr, data, index, policy),
        };
        self.finish(wr_id, OpKind::Write, status, flags);
        Ok(())
    }

    fn post_read(
        &mut self,
        wr_id: u64,
        src: RemoteAddr,
        len: u32,
        local_region: RegionId,
        local_offset: u64,
        flags: PostFlags,
    ) -> Result<(), FabricError> {
        let from = self.link.segment.bytes_ptr(src.region, src.offset, u64::from(len))?;
        let to = self.local.segment.bytes_ptr(local_region, local_offset, u64::from(len))?;
        self.reserve()?;
        let status = match self.blocked() {
            Some(err) => Err(err),
            None => {
                // SAFETY: both ranges were bounds checked inside their mappings, which this
                // endpoint keeps alive; they are different segments (a node never connects to
                // itself), so they do not overlap.
                unsafe { copy_shared(from, to, len as usize) };
                Ok(())
            }
        };
        self.finish(wr_id, OpKind::Read, status, flags);
        Ok(())
    }

    /// The peer's segment is mapped here. Its file is never truncated or reused (a restarted
    /// peer publishes a new one), so the mapping stays readable after the peer dies, for as
    /// long as this endpoint holds it.
    fn peer_load_u64(&self, src: RemoteAddr) -> Result<u64, FabricError> {
        Ok(u64::from_le(self.link.segment.word(src.region, src.offset)?.load(Ordering::Acquire)))
    }

    unsafe fn peer_bytes(&self, src: RemoteAddr, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let from = self.link.segment.bytes_ptr(src.region, src.offset, len as u64)?;
        // SAFETY: `from` is valid for `len` bytes (bounds checked) for as long as the mapping,
        // which `self.link` holds and `&self` keeps from being replaced by a reconnect, lives;
        // nobody changes them while the slice lives (the caller's contract).
        Ok(Cow::Borrowed(unsafe { std::slice::from_raw_parts(from, len) }))
    }

    fn prefetch_write(&mut self, dst: RemoteAddr, len: u32) {
        if let Ok((_, _, ptr)) = self.link.segment.locate(dst.region, dst.offset, u64::from(len)) {
            prefetch_for_write(ptr, len as usize);
        }
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    fn state(&self) -> EndpointState {
        self.state
    }

    fn peer_gone(&self) -> bool {
        !self.link.usable()
    }

    fn reconnect(&mut self) -> Result<(), FabricError> {
        if !self.link.usable() {
            self.link = self.local.link(self.peer, false)?;
        }
        self.state = EndpointState::Ready;
        Ok(())
    }
}
