//! Atomic multicast groups on real fabrics: a [`MulticastNode`] runs one group member
//! ([`microrep_core::multicast::Member`]) on a poll thread with the runtime's idle policy
//! (bounded spinning, then yielding, then parking: never a spinning thread per member on a
//! small machine), and lets any thread send.
//!
//! The poll thread owns the member: no lock is held while it posts writes (DESIGN.md asks the
//! SST's lock to be released before posting). A send builds the payload in a recycled buffer,
//! queues it in a small **outbox** (one bounded queue per subgroup, `window` payloads) under a
//! lock held only to push the buffer, and wakes the poll thread. At the start of each poll the
//! poll thread takes everything queued under that lock (moving buffers, copying nothing) and
//! copies it into the rings with the lock released (one copy more than the core's zero-copy
//! `reserve`). So a send never waits for a poll or for the poll thread's copies, a send from
//! the delivery upcall is fine, and a full outbox is back-pressure ([`SendError::WindowFull`]).
//! Sends made while the view changes wait in the outbox and go out in the next view. The
//! counters ([`MulticastNode::stats`]) are published under a lock of their own, and the status
//! only when the view or the phase changes, so a sender and the poll thread share no lock per
//! poll.
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

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use microrep_core::multicast::{
    Deliver, GroupConfig, JoinError, Member, MulticastError, Phase, SLOT_HEADER_BYTES, SendError, Stats, regions,
};
use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::tcp::{TcpConfig, TcpFabric};
use microrep_fabric::{Fabric, FabricError, NodeId};

use crate::config::ThreadConfig;
use crate::idle::{Backoff, Parker};

/// A multicast node could not start, stopped with an error, or refused a join.
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
    /// The member refused to propose a join.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// The poll thread has stopped (after an error).
    #[error("the poll thread has stopped")]
    Stopped,
}

/// A send was refused.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum MulticastSendError {
    /// Refused: no such subgroup, not a sender in the current view, too long, or the outbox
    /// of the subgroup is full ([`SendError::WindowFull`]: retry; back-pressure).
    #[error(transparent)]
    Send(#[from] SendError),
    /// The poll thread has stopped (after an error); nothing would be pushed.
    #[error("the poll thread has stopped")]
    Stopped,
}

/// What the poll thread publishes for other threads when the view or the phase changes.
#[derive(Clone, Debug)]
struct Status {
    me: NodeId,
    epoch: u64,
    members: Vec<NodeId>,
    phase: Phase,
    /// The poll thread has ended, and the error that ended it, if any.
    ended: bool,
    failure: Option<MulticastError>,
}

impl Status {
    fn of<F: Fabric>(member: &Member<F>) -> Self {
        let config = member.config();
        Self {
            me: config.me,
            epoch: member.epoch(),
            members: config.members.clone(),
            phase: member.phase(),
            ended: false,
            failure: None,
        }
    }
}

/// Per subgroup: whether `member` sends there in its current view, its window and largest
/// payload (what a send checks).
fn send_rights<F: Fabric>(member: &Member<F>) -> Vec<(bool, usize, usize)> {
    let config = member.config();
    config
        .subgroups
        .iter()
        .map(|s| (s.senders.contains(&config.me), s.window as usize, s.max_payload_bytes as usize))
        .collect()
}

/// Payloads of at least this many bytes are handed to the ring in their buffer
/// (`Member::send_owned`, no copy, one write each) on a fabric that writes from memory (shm,
/// verbs; not tcp, whose writes are frames); shorter ones are copied into it, so that several
/// go out in one write (docs/BENCHMARKS.md, "Multicast sends without the copy into
/// the ring").
const HAND_OVER_FROM_BYTES: usize = 2048;

/// Payload buffers kept for reuse (a window's worth of large payloads is a few MiB).
const SPARE_BUFFERS: usize = 256;

type JoinCommand = (NodeId, Vec<usize>, mpsc::Sender<Result<(), JoinError>>);

/// What a send needs, under one lock: the queues and what the sender may send.
struct Outbox {
    /// Per subgroup: messages waiting for the poll thread, each [`SLOT_HEADER_BYTES`] of room
    /// for the slot header and then the payload.
    queues: Vec<VecDeque<Vec<u8>>>,
    /// Per subgroup: whether this member sends there in the current view, its window and
    /// largest payload ([`send_rights`], renewed when the view changes).
    subgroups: Vec<(bool, usize, usize)>,
    /// The poll thread has ended: nothing queued would be pushed.
    ended: bool,
}

struct Shared {
    outbox: Mutex<Outbox>,
    /// Payloads in the outbox's queues (raised under its lock, cleared under it when the poll
    /// thread takes them), so that a poll with nothing queued takes no lock.
    queued: AtomicUsize,
    /// Per subgroup: payloads sent and not yet in the ring (queued, or taken by the poll
    /// thread and waiting for room): the outbox's bound.
    backlog: Vec<AtomicUsize>,
    /// The member's counters as of its last poll that did something.
    stats: Mutex<Stats>,
    /// Buffers of payloads the poll thread moved into the ring, for the next sends: a send
    /// then neither allocates nor zeroes a buffer of the subgroup's largest payload.
    spare: ArrayQueue<Vec<u8>>,
    /// Published when the view or the phase changes, and when the poll thread ends.
    status: Mutex<Status>,
    /// Notified when `status` changes phase or the poll thread ends.
    changed: Condvar,
    joins: Mutex<Vec<JoinCommand>>,
    stop: AtomicBool,
    parker: OnceLock<Arc<Parker>>,
}

impl Shared {
    fn wake(&self) {
        if let Some(parker) = self.parker.get() {
            parker.wake();
        }
    }
}

/// One member of a multicast group, polled by its own thread (see the module docs).
pub struct MulticastNode {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Result<(), MulticastError>>>,
}

impl std::fmt::Debug for MulticastNode {
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

/// Starts `group.me`'s verbs fabric (a build with the `verbs` feature) with the group's
/// regions, its bootstrap listener on `listen` (port 0 picks one) and its peers' listeners in
/// `peers` (members in one process share one table, each adding itself as it starts). Each
/// endpoint's staging ring holds the largest region, so one push of a whole ring (or a
/// state-transfer section) is one WRITE.
#[cfg(feature = "verbs")]
pub fn verbs_fabric(
    listen: SocketAddr,
    peers: microrep_fabric::verbs::PeerTable,
    group: &GroupConfig,
) -> Result<microrep_fabric::verbs::VerbsFabric, FabricError> {
    let specs = regions(group);
    let mut config = microrep_fabric::verbs::VerbsConfig::new(group.me, max_nodes(group), &specs, listen, peers);
    let largest = specs.iter().map(|s| s.len_bytes).max().unwrap_or(0);
    config.staging_bytes = config.staging_bytes.max(usize::try_from(largest).unwrap_or(usize::MAX));
    // One endpoint per peer (the locked-memory check counts a staging ring for each).
    config.endpoints = group.members.len().saturating_sub(1).max(1);
    microrep_fabric::verbs::VerbsFabric::start(config)
}

/// Node ids the fabric addresses: the members', or, when views change (joiners may have any
/// id), every id the fabric allows.
fn max_nodes(group: &GroupConfig) -> u16 {
    if group.failure_detection.is_some() {
        return microrep_fabric::layout::MAX_NODES;
    }
    group.members.iter().map(|n| n.0).max().map_or(1, |m| m.saturating_add(1))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic on the poll thread is reported by `stop`; the guarded values stay usable.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl MulticastNode {
    /// Creates the member on `fabric` (connecting to its peers) and starts its poll thread,
    /// which calls `deliver` with every batch of delivered messages.
    pub fn start<F>(
        fabric: F,
        group: GroupConfig,
        thread: ThreadConfig,
        deliver: impl Deliver + Send + 'static,
    ) -> Result<Self, MulticastNodeError>
    where
        F: Fabric + Send + 'static,
        F::Endpoint: Send,
    {
        Self::run(Member::new(fabric, group)?, thread, deliver)
    }

    /// Starts a member that joins a running group ([`Member::join`]): `template` is the group's
    /// configuration with `me` this node. It runs once a member proposes it
    /// ([`MulticastNode::propose_join`]) and its state has arrived ([`Deliver::restore`]). If
    /// that has not happened `give_up_after` after it started (its request was lost with the
    /// member that proposed it, say), its poll thread stops with
    /// [`MulticastError::JoinTimedOut`]: [`MulticastNode::wait_joined`] returns it.
    pub fn join<F>(
        fabric: F,
        template: GroupConfig,
        give_up_after: Duration,
        thread: ThreadConfig,
        deliver: impl Deliver + Send + 'static,
    ) -> Result<Self, MulticastNodeError>
    where
        F: Fabric + Send + 'static,
        F::Endpoint: Send,
    {
        Self::run(Member::join(fabric, template, nanos(give_up_after))?, thread, deliver)
    }

    /// Starts a joiner that also asks the group itself ([`Member::ask_to_join`]): with no state
    /// `retry_after` after it starts or last asked, it leaves its request (as a member and
    /// sender of `subgroups`) with the next member of `template`, so a request lost with the
    /// member that proposed it does not leave it waiting. A refusal stops the poll thread with
    /// [`MulticastError::JoinRefused`], and no state `give_up_after` after it started (the
    /// members of `template` are gone, say) with [`MulticastError::JoinTimedOut`]
    /// ([`MulticastNode::wait_joined`] returns either).
    pub fn join_asking<F>(
        fabric: F,
        template: GroupConfig,
        subgroups: &[usize],
        retry_after: Duration,
        give_up_after: Duration,
        thread: ThreadConfig,
        deliver: impl Deliver + Send + 'static,
    ) -> Result<Self, MulticastNodeError>
    where
        F: Fabric + Send + 'static,
        F::Endpoint: Send,
    {
        let mut member = Member::join(fabric, template, nanos(give_up_after))?;
        member.ask_to_join(subgroups, nanos(retry_after))?;
        Self::run(member, thread, deliver)
    }

    fn run<F>(
        mut member: Member<F>,
        thread: ThreadConfig,
        mut deliver: impl Deliver + Send + 'static,
    ) -> Result<Self, MulticastNodeError>
    where
        F: Fabric + Send + 'static,
        F::Endpoint: Send,
    {
        let rights = send_rights(&member);
        let count = rights.len();
        let shared = Arc::new(Shared {
            outbox: Mutex::new(Outbox { queues: vec![VecDeque::new(); count], subgroups: rights, ended: false }),
            queued: AtomicUsize::new(0),
            backlog: (0..count).map(|_| AtomicUsize::new(0)).collect(),
            stats: Mutex::new(member.stats()),
            spare: ArrayQueue::new(SPARE_BUFFERS),
            status: Mutex::new(Status::of(&member)),
            changed: Condvar::new(),
            joins: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            parker: OnceLock::new(),
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let s = Arc::clone(&shared);
        let name = format!("mcast-{}", member.config().me.0);
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            // Marks the thread ended however it ends (a panicking upcall included), so that
            // `wait_joined` never waits for a thread that is gone.
            let mut ended = Ended { shared: &s, failure: None };
            if let Err(e) = Backoff::pin(&thread) {
                tracing::warn!("multicast poll thread: {e}");
            }
            let mut backoff = Backoff::new(&thread);
            let _ = s.parker.set(backoff.parker());
            let _ = ready_tx.send(());
            let polled = poll_loop(&s, &mut member, &mut deliver, &mut backoff);
            ended.failure = polled.as_ref().err().cloned();
            polled
        })?;
        // The thread signals once its parker is set; if it died first, `stop` reports it.
        let _ = ready_rx.recv();
        Ok(Self { shared, thread: Some(handle) })
    }
}

/// Polls until told to stop or a poll fails, publishing the status after each poll that did
/// something.
fn poll_loop<F: Fabric>(
    s: &Shared,
    member: &mut Member<F>,
    deliver: &mut impl Deliver,
    backoff: &mut Backoff,
) -> Result<(), MulticastError> {
    let mut taken = Taken::new(s.backlog.len());
    let (mut epoch, mut phase) = (member.epoch(), member.phase());
    while !s.stop.load(Ordering::Acquire) {
        for (node, subgroups, reply) in std::mem::take(&mut *lock(&s.joins)) {
            let _ = reply.send(member.propose_join(node, &subgroups));
        }
        let mut work = taken.feed(s, member);
        work |= member.poll(crate::monotonic_ns(), deliver)?;
        if work {
            *lock(&s.stats) = member.stats();
            if epoch != member.epoch() || phase != member.phase() {
                (epoch, phase) = (member.epoch(), member.phase());
                lock(&s.outbox).subgroups = send_rights(member);
                *lock(&s.status) = Status::of(member);
                s.changed.notify_all();
            }
            backoff.reset();
        } else {
            backoff.pause();
        }
    }
    Ok(())
}

/// Publishes the end of the poll thread, and the error that ended it, when dropped.
struct Ended<'a> {
    shared: &'a Shared,
    failure: Option<MulticastError>,
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        lock(&self.shared.outbox).ended = true;
        let mut status = lock(&self.shared.status);
        status.ended = true;
        status.failure = self.failure.take();
        drop(status);
        self.shared.changed.notify_all();
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The messages the poll thread took from the outbox and has not yet put into a ring.
struct Taken {
    /// Per subgroup, oldest first (as in [`Outbox::queues`]).
    queues: Vec<VecDeque<Vec<u8>>>,
    /// Payloads in `queues`, so that a poll with nothing held visits no queue.
    held: usize,
}

impl Taken {
    fn new(subgroups: usize) -> Self {
        Self { queues: vec![VecDeque::new(); subgroups], held: 0 }
    }

    /// Takes what is queued (moving buffers under the outbox's lock), then copies what it
    /// holds into the member's rings, each subgroup's in order, while they have room. True if
    /// a payload went into a ring.
    fn feed<F: Fabric>(&mut self, shared: &Shared, member: &mut Member<F>) -> bool {
        if shared.queued.load(Ordering::Acquire) != 0 {
            let mut outbox = lock(&shared.outbox);
            for (queue, mine) in outbox.queues.iter_mut().zip(&mut self.queues) {
                self.held += queue.len();
                mine.append(queue);
            }
            shared.queued.store(0, Ordering::Release);
        }
        if self.held == 0 {
            return false;
        }
        let mut moved = false;
        for (subgroup, queue) in self.queues.iter_mut().enumerate() {
            while let Some(message) = queue.front_mut() {
                // A long payload goes into the ring as it is (its buffer has room for the slot
                // header), a short one is copied so that it joins a run of slots in one write;
                // on a fabric whose writes copy into frames anyway (tcp), every one is.
                let long = message.len() - SLOT_HEADER_BYTES as usize >= HAND_OVER_FROM_BYTES;
                let sent = if long && member.fabric().lends_local_bytes() {
                    member.send_owned(subgroup, message)
                } else {
                    member.send(subgroup, &message[SLOT_HEADER_BYTES as usize..])
                };
                match sent {
                    Ok(_) => moved = true,
                    // Room or a running view comes later; the payload waits.
                    Err(SendError::WindowFull(_) | SendError::ViewChanging(_)) => break,
                    // Not a sender any more (the view changed since it was queued): dropped.
                    Err(e) => tracing::warn!("multicast: a queued message is dropped: {e}"),
                }
                // The buffer the ring gave back for a payload handed over (or the copied
                // payload's own); a full pool drops it, an empty one is not worth keeping.
                if let Some(buf) = queue.pop_front().filter(|b| b.capacity() > 0) {
                    let _ = shared.spare.push(buf);
                }
                self.held -= 1;
                shared.backlog[subgroup].fetch_sub(1, Ordering::Release);
            }
        }
        moved
    }
}

impl MulticastNode {
    /// This node's id.
    pub fn id(&self) -> NodeId {
        lock(&self.shared.status).me
    }

    /// Queues `payload` for `subgroup` (see the module docs). Fails at once if the subgroup
    /// does not exist, this member does not send there, the payload is too long, or the
    /// outbox holds a window of messages already (retry: back-pressure).
    pub fn send(&self, subgroup: usize, payload: &[u8]) -> Result<(), MulticastSendError> {
        self.send_with(subgroup, |buf| {
            let n = payload.len().min(buf.len());
            buf[..n].copy_from_slice(&payload[..n]);
            payload.len()
        })
    }

    /// Like [`MulticastNode::send`], building the message in a buffer of the subgroup's
    /// largest payload: `build` writes it and returns its length.
    pub fn send_with(&self, subgroup: usize, build: impl FnOnce(&mut [u8]) -> usize) -> Result<(), MulticastSendError> {
        let (sends, window, max) = {
            let outbox = lock(&self.shared.outbox);
            if outbox.ended {
                return Err(MulticastSendError::Stopped);
            }
            *outbox.subgroups.get(subgroup).ok_or(SendError::NoSuchSubgroup(subgroup))?
        };
        if !sends {
            return Err(SendError::NotASender(subgroup).into());
        }
        // The common case of back-pressure costs no buffer.
        if self.shared.backlog[subgroup].load(Ordering::Acquire) >= window {
            return Err(SendError::WindowFull(subgroup).into());
        }
        // A recycled buffer is zeroed only past its last payload's length. Its first bytes are
        // room for the slot header (`Member::send_owned`).
        let header = SLOT_HEADER_BYTES as usize;
        let mut buf = self.shared.spare.pop().unwrap_or_default();
        buf.resize(header + max, 0);
        let len = build(&mut buf[header..]);
        if len > max {
            return Err(SendError::TooLong { len, max }.into());
        }
        buf.truncate(header + len);
        {
            let mut outbox = lock(&self.shared.outbox);
            if self.shared.backlog[subgroup].load(Ordering::Acquire) >= window {
                drop(outbox);
                let _ = self.shared.spare.push(buf);
                return Err(SendError::WindowFull(subgroup).into());
            }
            outbox.queues[subgroup].push_back(buf);
            self.shared.backlog[subgroup].fetch_add(1, Ordering::AcqRel);
            self.shared.queued.fetch_add(1, Ordering::Release);
        }
        self.shared.wake();
        Ok(())
    }

    /// Asks the group to add `node` as a member and sender of `subgroups`
    /// ([`Member::propose_join`]); waits for the poll thread's answer.
    pub fn propose_join(&self, node: NodeId, subgroups: &[usize]) -> Result<(), MulticastNodeError> {
        let (tx, rx) = mpsc::channel();
        lock(&self.shared.joins).push((node, subgroups.to_vec(), tx));
        self.shared.wake();
        match rx.recv() {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(MulticastNodeError::Stopped),
        }
    }

    /// Where the member stands in a view change (with failure detection configured).
    pub fn phase(&self) -> Phase {
        lock(&self.shared.status).phase.clone()
    }

    /// The current view's number (0 for the first) and members.
    pub fn view(&self) -> (u64, Vec<NodeId>) {
        let status = lock(&self.shared.status);
        (status.epoch, status.members.clone())
    }

    /// The member's counters (as of its last poll that did something).
    pub fn stats(&self) -> Stats {
        *lock(&self.shared.stats)
    }

    /// The error that stopped the poll thread, if it stopped on one: a joiner refused or timed
    /// out ([`MulticastError::JoinRefused`], [`MulticastError::JoinTimedOut`]), a member whose
    /// view lost its majority ([`MulticastError::MajorityLost`]), a fabric failure.
    pub fn failure(&self) -> Option<MulticastError> {
        lock(&self.shared.status).failure.clone()
    }

    /// Waits until this joiner runs in a view (its state arrived), or returns why it never
    /// will: the error that stopped its poll thread ([`MulticastNode::failure`]), or
    /// [`MulticastNodeError::Stopped`]. Bounded: a joiner gives up after the time it was
    /// started with. A member that is not a joiner returns at once.
    pub fn wait_joined(&self) -> Result<(), MulticastNodeError> {
        let mut status = lock(&self.shared.status);
        loop {
            if let Some(failure) = &status.failure {
                return Err(failure.clone().into());
            }
            if status.ended {
                return Err(MulticastNodeError::Stopped);
            }
            if status.phase != Phase::Joining {
                return Ok(());
            }
            status = self.shared.changed.wait(status).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Stops the poll thread; returns the error that stopped it earlier, if any.
    pub fn stop(mut self) -> Result<(), MulticastNodeError> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), MulticastNodeError> {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        match self.thread.take() {
            Some(handle) => match handle.join() {
                Ok(result) => Ok(result?),
                Err(_) => Err(MulticastNodeError::PollThreadPanicked),
            },
            None => Ok(()),
        }
    }
}

impl Drop for MulticastNode {
    fn drop(&mut self) {
        if let Err(e) = self.halt() {
            tracing::warn!("multicast node stopped with an error: {e}");
        }
    }
}
