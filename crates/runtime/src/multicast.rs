//! Atomic multicast groups on real fabrics: a [`MulticastNode`] runs one group member
//! ([`microrep_core::multicast::Member`]) on a poll thread with the runtime's idle policy
//! (bounded spinning, then yielding, then parking: never a spinning thread per member on a
//! small machine), and lets any thread send.
//!
//! Sends lock the member for the time of building the message in its ring slot (zero-copy)
//! and wake the poll thread; the poll thread locks it for one poll, posting the batched
//! writes and calling the delivery upcall. The upcall runs on the poll thread with the member
//! locked, so it must not send: a send from it is refused with
//! [`MulticastSendError::FromUpcall`] rather than deadlocking.
//!
//! # Example: a group of three in one process on the shm fabric
//! ```
//! use std::sync::{Arc, Mutex};
//! use microrep::config::ThreadConfig;
//! use microrep::multicast::{MulticastNode, shm_fabric};
//! use microrep_core::multicast::{DeliveryBatch, GroupConfig};
//! use microrep_fabric::NodeId;
//!
//! let dir = std::env::temp_dir().join(format!("microrep-mcast-doc-{}", std::process::id()));
//! let members: Vec<NodeId> = (0..3).map(NodeId).collect();
//! let groups: Vec<GroupConfig> =
//!     members.iter().map(|&me| GroupConfig::single(me, members.clone(), 16, 64)).collect();
//! // Every member's fabric first (a member connects to its peers when it starts).
//! let fabrics: Vec<_> = groups.iter().map(|g| shm_fabric(&dir, g).expect("fabric")).collect();
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let nodes: Vec<_> = fabrics
//!     .into_iter()
//!     .zip(groups)
//!     .map(|(fabric, group)| {
//!         let seen = Arc::clone(&seen);
//!         let me = group.me;
//!         let upcall = move |batch: DeliveryBatch<'_>| {
//!             for m in batch.messages {
//!                 seen.lock().expect("seen").push((me, m.seq, m.payload.to_vec()));
//!             }
//!         };
//!         MulticastNode::start(fabric, group, ThreadConfig::default(), upcall).expect("start")
//!     })
//!     .collect();
//! nodes[1].send(0, b"hello").expect("send");
//! while seen.lock().expect("seen").len() < 3 {
//!     std::thread::yield_now();
//! }
//! assert!(seen.lock().expect("seen").iter().all(|(_, seq, payload)| *seq == 1 && payload == b"hello"));
//! for node in nodes {
//!     node.stop().expect("clean stop");
//! }
//! std::fs::remove_dir_all(&dir).expect("cleanup");
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, ThreadId};

use microrep_core::multicast::{Deliver, GroupConfig, Member, MulticastError, Phase, SendError, Stats, regions};
use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::tcp::{TcpConfig, TcpFabric};
use microrep_fabric::{Fabric, FabricError, NodeId};

use crate::config::ThreadConfig;
use crate::idle::{Backoff, Parker};

/// A multicast node could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum MulticastNodeError {
    /// The member refused its configuration or fabric, or a poll failed.
    #[error(transparent)]
    Multicast(#[from] MulticastError),
    /// The fabric could not be started.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The poll thread could not be spawned.
    #[error("spawning the poll thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// The poll thread panicked (the delivery upcall, or a violated invariant of the core).
    #[error("the poll thread panicked")]
    PollThreadPanicked,
}

/// A send was refused.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum MulticastSendError {
    /// The member refused it (full window, not a sender, too long...).
    #[error(transparent)]
    Send(#[from] SendError),
    /// Called from the delivery upcall, which runs with the member locked.
    #[error("a send from the delivery upcall would deadlock")]
    FromUpcall,
    /// The poll thread has stopped (after an error); nothing would be pushed.
    #[error("the poll thread has stopped")]
    Stopped,
}

struct Shared<F: Fabric> {
    member: Mutex<Member<F>>,
    stop: AtomicBool,
    parker: OnceLock<Arc<Parker>>,
    poll_thread: OnceLock<ThreadId>,
}

/// One member of a multicast group, polled by its own thread (see the module docs).
pub struct MulticastNode<F: Fabric> {
    shared: Arc<Shared<F>>,
    thread: Option<JoinHandle<Result<(), MulticastError>>>,
}

impl<F: Fabric> std::fmt::Debug for MulticastNode<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MulticastNode").field("running", &self.thread.is_some()).finish_non_exhaustive()
    }
}

/// Starts `group.me`'s shm fabric in `dir` with the group's SST region. Start every member's
/// fabric before any [`MulticastNode::start`]: a member connects to its peers when it starts.
pub fn shm_fabric(dir: &Path, group: &GroupConfig) -> Result<ShmFabric, FabricError> {
    let mut config = ShmConfig::new(dir, group.me, max_nodes(group), &regions(group));
    config.connect_timeout = std::time::Duration::from_secs(30);
    ShmFabric::start(config)
}

/// Starts `group.me`'s tcp fabric listening on `listen` with the group's SST region; give it
/// the peers' addresses with [`TcpFabric::set_peer_addr`] before [`MulticastNode::start`].
pub fn tcp_fabric(cluster: &str, listen: SocketAddr, group: &GroupConfig) -> Result<TcpFabric, FabricError> {
    let specs = regions(group);
    let mut config = TcpConfig::new(cluster, group.me, max_nodes(group), listen, &specs);
    // Room for one push of a whole ring (or of a state-transfer chunk).
    let largest = specs.iter().map(|s| s.len_bytes).max().unwrap_or(0);
    let largest = u32::try_from(largest).unwrap_or(u32::MAX).saturating_add(64);
    config.max_op_bytes = config.max_op_bytes.max(largest).min(TcpConfig::MAX_OP_BYTES);
    TcpFabric::start(config)
}

/// Node ids the fabric addresses: the members', or, when views change (joiners may have any
/// id), every id the fabric allows.
fn max_nodes(group: &GroupConfig) -> u16 {
    if group.failure_detection.is_some() {
        return microrep_fabric::layout::MAX_NODES;
    }
    group.members.iter().map(|n| n.0).max().map_or(1, |m| m.saturating_add(1))
}

impl<F> MulticastNode<F>
where
    F: Fabric + Send + 'static,
    F::Endpoint: Send,
{
    /// Creates the member on `fabric` (connecting to its peers) and starts its poll thread,
    /// which calls `deliver` with every batch of delivered messages.
    pub fn start(
        fabric: F,
        group: GroupConfig,
        thread: ThreadConfig,
        mut deliver: impl Deliver + Send + 'static,
    ) -> Result<Self, MulticastNodeError> {
        let member = Member::new(fabric, group)?;
        let shared = Arc::new(Shared {
            member: Mutex::new(member),
            stop: AtomicBool::new(false),
            parker: OnceLock::new(),
            poll_thread: OnceLock::new(),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let s = Arc::clone(&shared);
        let name = format!("mcast-{}", s.lock().config().me.0);
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            if let Err(e) = Backoff::pin(&thread) {
                tracing::warn!("multicast poll thread: {e}");
            }
            let mut backoff = Backoff::new(&thread);
            let _ = s.parker.set(backoff.parker());
            let _ = s.poll_thread.set(std::thread::current().id());
            let _ = ready_tx.send(());
            while !s.stop.load(Ordering::Acquire) {
                let work = s.lock().poll(crate::monotonic_ns(), &mut deliver)?;
                if work {
                    backoff.reset();
                } else {
                    backoff.pause();
                }
            }
            Ok(())
        })?;
        // The thread signals once its parker is set; if it died first, `stop` reports it.
        let _ = ready_rx.recv();
        Ok(Self { shared, thread: Some(handle) })
    }
}

impl<F: Fabric> Shared<F> {
    fn lock(&self) -> MutexGuard<'_, Member<F>> {
        // A panic while locked is reported by `stop`; the member's state stays consistent
        // enough to read its counters.
        self.member.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<F: Fabric> MulticastNode<F> {
    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.shared.lock().config().me
    }

    /// Sends `payload` to `subgroup`; returns its sequence number. A full window is
    /// [`SendError::WindowFull`]: retry once peers have received (back-pressure).
    pub fn send(&self, subgroup: usize, payload: &[u8]) -> Result<u64, MulticastSendError> {
        self.send_with(subgroup, |buf| {
            let n = payload.len().min(buf.len());
            buf[..n].copy_from_slice(&payload[..n]);
            payload.len()
        })
    }

    /// Zero-copy send: `build` writes the message into the ring slot and returns its length.
    pub fn send_with(
        &self,
        subgroup: usize,
        build: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u64, MulticastSendError> {
        if self.shared.poll_thread.get() == Some(&std::thread::current().id()) {
            return Err(MulticastSendError::FromUpcall);
        }
        if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
            return Err(MulticastSendError::Stopped);
        }
        let seq = {
            let mut member = self.shared.lock();
            let mut slot = member.reserve(subgroup)?;
            let len = build(slot.payload_mut());
            slot.commit(len)?
        };
        if let Some(parker) = self.shared.parker.get() {
            parker.wake();
        }
        Ok(seq)
    }

    /// Where the member stands in a view change (with failure detection configured).
    pub fn phase(&self) -> Phase {
        self.shared.lock().phase()
    }

    /// The current view's number (0 for the first) and members.
    pub fn view(&self) -> (u64, Vec<NodeId>) {
        let member = self.shared.lock();
        (member.epoch(), member.config().members.clone())
    }

    /// The member's counters.
    pub fn stats(&self) -> Stats {
        self.shared.lock().stats()
    }

    /// Stops the poll thread; returns the error that stopped it earlier, if any.
    pub fn stop(mut self) -> Result<(), MulticastNodeError> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), MulticastNodeError> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(parker) = self.shared.parker.get() {
            parker.wake();
        }
        match self.thread.take() {
            Some(handle) => match handle.join() {
                Ok(result) => Ok(result?),
                Err(_) => Err(MulticastNodeError::PollThreadPanicked),
            },
            None => Ok(()),
        }
    }
}

impl<F: Fabric> Drop for MulticastNode<F> {
    fn drop(&mut self) {
        if let Err(e) = self.halt() {
            tracing::warn!("multicast node stopped with an error: {e}");
        }
    }
}
