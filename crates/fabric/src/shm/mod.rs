//! The `shm` backend: nodes are processes on one host; each node's regions live in one
//! shared-memory file (a *segment*) that peers map and write directly.
//!
//! * **Rendezvous**: a cluster directory (by default under `/dev/shm`) holds `node-N.shm`, the
//!   segment of node N, published by an atomic rename once initialised, and `node-N.lock`, an
//!   `flock` the node holds while it runs. A lock that can be taken proves the segment beside it
//!   was left by a crashed run: it is removed, never reused.
//! * **Writes and reads** are copies by the initiating process into or out of the peer's mapping,
//!   so they complete at once; completions are queued locally.
//! * **Permissions** (Mu §5.2) use DESIGN.md's design (a): a grant word and an in-flight word per
//!   (region, writer) with Dekker ordering (see `PermSlot`). `revoke_write` clears the grant and
//!   waits for an in-flight copy to finish. A writer stalled inside a copy (SIGSTOP, or starved
//!   of CPU) past `revoke_fence_timeout` is *fenced*: killed through its pidfd, which is safe
//!   because it can only be a stale leader, and reported as [`crate::RevokePath::Slow`]. A
//!   writer that died mid-copy counts as finished; its write may be torn, as a crashed NIC's
//!   would be, and protocols checksum what they read.
//! * **Failure**: a watcher thread sleeps on peers' pidfds and flags a peer that exits; a peer
//!   that closes cleanly marks its segment closed. Both make operations to it complete with
//!   [`crate::OpError::PeerUnreachable`], and its endpoints report
//!   [`crate::Endpoint::peer_gone`] before any fails. An exited process not reaped yet counts as
//!   dead, and a reconnect fails without mapping anything while the dead run's file is still
//!   the one published under its id.

mod endpoint;
mod fence;
mod handshake;
mod huge_pages;
mod process;
mod segment;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use endpoint::ShmEndpoint;
pub use huge_pages::huge_pages_granted;
use process::{DeathWatcher, NodeLock, ProcessHandle, Watched};
use segment::{Owner, Segment, SegmentError};

use crate::conformance::Harness;
use crate::{Fabric, FabricError, NodeId, RegionId, RegionSpec, RemoteWrite, RevokePath, layout};

/// The tracing target of the warning logged when a writer stalled mid-write is fenced
/// (SIGKILLed; it names the process `pid=N`), a target of its own so that an operator can keep
/// it whatever else the filter drops. Tools learn of fencings through [`ShmConfig::on_fence`]
/// (the runtime turns them into `fenced` events), not from this line.
pub const FENCING_LOG_TARGET: &str = "microrep_fabric::fencing";

/// Configuration of one shm node.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Cluster directory shared by all nodes (created if missing).
    pub dir: PathBuf,
    /// This node.
    pub node: NodeId,
    /// Cluster size bound: node ids are `0..max_nodes`.
    pub max_nodes: u16,
    /// Regions to register.
    pub regions: Vec<RegionSpec>,
    /// How long `connect` waits for a peer's segment to appear.
    pub connect_timeout: Duration,
    /// How long `revoke_write` waits for a writer's in-flight copy before fencing the writer.
    pub revoke_fence_timeout: Duration,
    /// Completions an endpoint can hold before posting fails with `QueueFull`.
    pub queue_depth: usize,
    /// Use sequentially consistent fences on both sides of the permission handshake even where
    /// the kernel offers `membarrier` (whose IPIs a deployment with isolated cores may not want).
    /// Costs writers one locked instruction each.
    pub symmetric_fences: bool,
    /// Told of every writer this node fences (its id and pid), before the SIGKILL, so that a
    /// node can report the fencing in its structured events.
    pub on_fence: Option<FenceHook>,
}

/// A callback for fenced writers: `(writer, pid)`.
#[derive(Clone)]
pub struct FenceHook(Arc<dyn Fn(NodeId, i32) + Send + Sync>);

impl FenceHook {
    /// Wraps `hook`.
    pub fn new(hook: impl Fn(NodeId, i32) + Send + Sync + 'static) -> Self {
        Self(Arc::new(hook))
    }
}

impl std::fmt::Debug for FenceHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FenceHook")
    }
}

impl ShmConfig {
    /// A configuration with default timeouts (connect 5 s, revoke fence 2 ms) and queue depth.
    pub fn new(dir: impl Into<PathBuf>, node: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> Self {
        Self {
            dir: dir.into(),
            node,
            max_nodes,
            regions: regions.to_vec(),
            connect_timeout: Duration::from_secs(5),
            revoke_fence_timeout: Duration::from_millis(2),
            queue_depth: 1024,
            symmetric_fences: false,
            on_fence: None,
        }
    }

    /// The conventional cluster directory for `cluster` under `/dev/shm`.
    pub fn default_dir(cluster: &str) -> PathBuf {
        PathBuf::from("/dev/shm").join(format!("microrep-{cluster}"))
    }
}

fn segment_path(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("node-{}.shm", node.0))
}

fn lock_path(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("node-{}.lock", node.0))
}

/// Why a link to a peer could not be opened (yet: the peer may still be starting).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The segment file of one id names another node.
    #[error("{} claims to be {node}", path.display())]
    Impostor { path: PathBuf, node: NodeId },
    #[error("{peer} was started for a cluster of {max_nodes} nodes")]
    SmallerCluster { peer: NodeId, max_nodes: u16 },
    #[error("{} is stale: pid {pid} no longer runs", path.display())]
    Stale { path: PathBuf, pid: i32 },
    #[error("{} was closed", path.display())]
    Closed { path: PathBuf },
    /// The file is still the segment of a process known to have exited or closed: the peer's
    /// id has not started again yet.
    #[error("{} still belongs to the run that ended", path.display())]
    Ended { path: PathBuf },
}

/// A peer's mapped segment plus the liveness of its process.
#[derive(Debug)]
pub(crate) struct PeerLink {
    segment: Segment,
    /// The segment file's (device, inode): a new run of the peer publishes another file.
    file: (u64, u64),
    watched: Arc<Watched>,
    /// Whether writes to this peer may use the light fence (see `fence`).
    light_fence: bool,
}

impl PeerLink {
    /// Whether operations may still reach the peer.
    pub(crate) fn usable(&self) -> bool {
        self.watched.alive.load(Ordering::Relaxed)
            && self.segment.state().load(Ordering::Relaxed) == segment::STATE_LIVE
    }
}

/// State shared by a node's fabric handle and its endpoints.
#[derive(Debug)]
pub(crate) struct Local {
    config: ShmConfig,
    segment: Segment,
    path: PathBuf,
    watcher: DeathWatcher,
    links: Mutex<BTreeMap<NodeId, Arc<PeerLink>>>,
    _lock: NodeLock,
}

impl Local {
    fn incarnation(&self) -> u64 {
        self.segment.owner().incarnation
    }

    /// The link to `peer`, opened (waiting up to the connect timeout if `wait`) or reused.
    ///
    /// The link table is locked only to look up and to insert, never while waiting for the
    /// peer, so that other threads of this node keep using their links meanwhile.
    fn link(&self, peer: NodeId, wait: bool) -> Result<Arc<PeerLink>, FabricError> {
        layout::check_peer(self.config.node, peer, self.config.max_nodes)?;
        let known = self.links.lock().expect("link table poisoned").get(&peer).cloned();
        if let Some(link) = known.as_ref().filter(|l| l.usable()) {
            return Ok(Arc::clone(link));
        }
        // While the file published under the peer's id is the one of the run that ended, there
        // is nothing new to link to: a look at the file, instead of mapping it again (and
        // unmapping it, whose TLB flush interrupts every CPU running a thread of this process)
        // only to find its owner gone, every time a caller retries.
        let ended = known.map(|l| l.file);
        let deadline = Instant::now() + if wait { self.config.connect_timeout } else { Duration::ZERO };
        let mut pause = Duration::from_micros(50);
        let link = loop {
            match self.open_link(peer, ended) {
                Ok(link) => break link,
                Err(why) if Instant::now() >= deadline => {
                    return Err(FabricError::PeerUnreachable(peer, why.to_string()));
                }
                // Control path only: back off while the peer starts up.
                Err(_) => std::thread::sleep(pause),
            }
            pause = (pause * 2).min(Duration::from_millis(20));
        };
        let mut links = self.links.lock().expect("link table poisoned");
        // Another thread may have opened one meanwhile: every endpoint shares the same link.
        if let Some(existing) = links.get(&peer).filter(|l| l.usable()) {
            return Ok(Arc::clone(existing));
        }
        let link = Arc::new(link);
        links.insert(peer, Arc::clone(&link));
        Ok(link)
    }

    /// Opens a link to `peer`'s segment, unless the file is still `ended`, that of a run that
    /// ended.
    fn open_link(&self, peer: NodeId, ended: Option<(u64, u64)>) -> Result<PeerLink, LinkError> {
        let path = segment_path(&self.config.dir, peer);
        let opened = Segment::open_rw(&path).map_err(SegmentError::Io)?;
        let meta = opened.metadata().map_err(SegmentError::Io)?;
        // Mapped below and kept mapped by the link: its inode cannot be reused meanwhile.
        let file = (meta.dev(), meta.ino());
        if ended == Some(file) {
            return Err(LinkError::Ended { path });
        }
        let segment = Segment::open_file(&path, &opened)?;
        let owner = segment.owner();
        if owner.node != peer {
            return Err(LinkError::Impostor { path, node: owner.node });
        }
        if self.config.node.0 >= segment.max_nodes() {
            return Err(LinkError::SmallerCluster { peer, max_nodes: segment.max_nodes() });
        }
        let Some(process) = ProcessHandle::open(owner.pid, owner.pid_start_ticks) else {
            return Err(LinkError::Stale { path, pid: owner.pid });
        };
        if segment.state().load(Ordering::Acquire) != segment::STATE_LIVE {
            return Err(LinkError::Closed { path });
        }
        let light_fence = owner.fence_mode == fence::FenceMode::Asymmetric
            && self.segment.owner().fence_mode == fence::FenceMode::Asymmetric;
        Ok(PeerLink { segment, file, watched: self.watcher.watch(process), light_fence })
    }

    /// Waits for `writer`'s copy into `slot` to finish, fencing it if it stalls (see module docs).
    fn await_writer(
        &self,
        region: RegionId,
        writer: NodeId,
        slot: &segment::PermSlot,
    ) -> Result<RevokePath, FabricError> {
        let start = Instant::now();
        let mut spins = 0u32;
        let tag = loop {
            let tag = handshake::copy_in_flight(&slot.in_flight);
            if tag == 0 {
                return Ok(RevokePath::Fast);
            }
            if start.elapsed() >= self.config.revoke_fence_timeout {
                break tag;
            }
            spins += 1;
            if spins < 256 { std::hint::spin_loop() } else { std::thread::yield_now() }
        };
        let fail = |reason: String| FabricError::RevokeFailed { peer: writer, region, reason };
        let link = match self.link(writer, false) {
            // The in-flight writer is not the current incarnation of that id: it has died.
            Ok(link) if link.segment.owner().incarnation != tag => return Ok(RevokePath::Fast),
            Ok(link) => link,
            Err(_) => return Ok(RevokePath::Fast),
        };
        let process = &link.watched.process;
        if process.pid() == std::process::id() as i32 {
            return Err(fail(format!(
                "the writer is this process and stayed inside a copy for {:?}",
                self.config.revoke_fence_timeout
            )));
        }
        if handshake::copy_in_flight(&slot.in_flight) != tag {
            return Ok(RevokePath::Fast);
        }
        tracing::warn!(
            target: FENCING_LOG_TARGET,
            %writer,
            %region,
            pid = process.pid(),
            "shm fabric: fencing a writer stalled mid-write"
        );
        if let Some(hook) = &self.config.on_fence {
            (hook.0)(writer, process.pid());
        }
        process.kill()?;
        if process.wait_exit(Duration::from_secs(5)) {
            Ok(RevokePath::Slow)
        } else {
            Err(fail(format!("pid {} did not exit after SIGKILL", process.pid())))
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.segment.mark_closed();
        // We hold the node lock, so the file at `path` is ours.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A node on the shm fabric.
#[derive(Debug)]
pub struct ShmFabric {
    local: Arc<Local>,
}

impl ShmFabric {
    /// Registers this node's regions and publishes its segment in the cluster directory.
    ///
    /// Fails with [`FabricError::AlreadyRunning`] if a live process runs this node id; removes a
    /// segment left behind by a crashed run of it.
    pub fn start(config: ShmConfig) -> Result<Self, FabricError> {
        layout::validate_membership(config.node, config.max_nodes)?;
        layout::validate_specs(&config.regions)?;
        if config.queue_depth == 0 {
            return Err(FabricError::InvalidLayout("queue_depth must be at least 1".into()));
        }
        std::fs::create_dir_all(&config.dir)
            .map_err(|e| FabricError::os(format!("creating {}", config.dir.display()), e))?;
        let path = segment_path(&config.dir, config.node);
        let Some(lock) = NodeLock::try_acquire(&lock_path(&config.dir, config.node))? else {
            let pid = Segment::open(&path).map(|s| s.owner().pid).unwrap_or(0);
            return Err(FabricError::AlreadyRunning { node: config.node, pid });
        };
        if path.exists() {
            tracing::warn!(path = %path.display(), "shm fabric: removing a segment left by a crashed run");
        }
        let (pid, pid_start_ticks) = process::this_process()?;
        let fence_mode = if config.symmetric_fences { fence::FenceMode::Symmetric } else { fence::process_mode() };
        let owner =
            Owner { node: config.node, fence_mode, pid, pid_start_ticks, incarnation: rand::random::<u64>() | 1 };
        let tmp = config.dir.join(format!("node-{}.shm.{:x}.tmp", config.node.0, owner.incarnation));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| FabricError::os(format!("creating {}", tmp.display()), e))?;
        let published = Segment::create(&file, owner, config.max_nodes, &config.regions).and_then(|seg| {
            std::fs::rename(&tmp, &path).map(|()| seg).map_err(|e| FabricError::os("publishing segment", e))
        });
        let segment = match published {
            Ok(segment) => segment,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let watcher = DeathWatcher::start()?;
        let local = Local { config, segment, path, watcher, links: Mutex::new(BTreeMap::new()), _lock: lock };
        Ok(Self { local: Arc::new(local) })
    }

    /// Removes segments and locks in `dir` left by nodes that no longer run; returns how many
    /// segments were removed. Live nodes' files are untouched.
    pub fn remove_stale(dir: &Path) -> Result<usize, FabricError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(FabricError::os(format!("listing {}", dir.display()), e)),
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix("node-")?.strip_suffix(".lock")?.parse().ok())
            else {
                continue;
            };
            // Holding the lock proves the owner is gone; dropping it removes the lock file.
            if NodeLock::try_acquire(&entry.path())?.is_some()
                && std::fs::remove_file(segment_path(dir, NodeId(id))).is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn own_slot(&self, region: RegionId, peer: NodeId) -> Result<&segment::PermSlot, FabricError> {
        layout::check_peer(self.local.config.node, peer, self.local.config.max_nodes)?;
        let (index, placed) = self.local.segment.region(region)?;
        if placed.spec.remote_write != RemoteWrite::Granted {
            return Err(FabricError::NotGrantable { region });
        }
        Ok(self.local.segment.perm_slot(index, peer))
    }

    /// The incarnation tag a stalled copy of `writer` into `region` left, if any (diagnostics and
    /// tests: shows a writer paused mid-copy).
    pub fn writer_in_flight(&self, region: RegionId, writer: NodeId) -> Result<Option<u64>, FabricError> {
        let tag = handshake::copy_in_flight(&self.own_slot(region, writer)?.in_flight);
        Ok((tag != 0).then_some(tag))
    }
}

impl Fabric for ShmFabric {
    type Endpoint = ShmEndpoint;

    fn node_id(&self) -> NodeId {
        self.local.config.node
    }

    fn connect(&self, peer: NodeId) -> Result<ShmEndpoint, FabricError> {
        let link = self.local.link(peer, true)?;
        Ok(ShmEndpoint::new(Arc::clone(&self.local), link))
    }

    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        handshake::grant(&self.own_slot(region, peer)?.granted);
        Ok(())
    }

    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
        let slot = self.own_slot(region, peer)?;
        // The revoker's side of the handshake: withdraw the grant, fence (for light-fenced
        // writers too), then look for a copy that saw the grant still set.
        handshake::withdraw(&slot.granted);
        fence::heavy_barrier(self.local.segment.owner().fence_mode).map_err(|e| FabricError::os("membarrier", e))?;
        self.local.await_writer(region, peer, slot)
    }

    fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
        Ok(self.local.segment.region(region)?.1.spec.len_bytes)
    }

    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let src = self.local.segment.bytes_ptr(region, offset, buf.len() as u64)?;
        // SAFETY: `src` is valid for buf.len() bytes (bounds checked), `buf` is a distinct local
        // buffer; concurrent remote writes only make the copied bytes unspecified.
        unsafe { segment::copy_shared(src, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    unsafe fn local_bytes(&self, region: RegionId, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let src = self.local.segment.bytes_ptr(region, offset, len as u64)?;
        // SAFETY: `src` is valid for `len` bytes (bounds checked) for as long as the mapping,
        // which `self` owns, lives; nobody changes them while the slice lives (the caller's
        // contract).
        Ok(Cow::Borrowed(unsafe { std::slice::from_raw_parts(src, len) }))
    }

    fn lends_local_bytes(&self) -> bool {
        true
    }

    /// True: a peer's segment is mapped by every endpoint to it (see [`ShmEndpoint`]).
    fn lends_peer_memory(&self) -> bool {
        true
    }

    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let dst = self.local.segment.bytes_ptr(region, offset, data.len() as u64)?;
        // SAFETY: `dst` is valid for data.len() bytes (bounds checked) and cannot overlap `data`,
        // which is process-private memory.
        unsafe { segment::copy_shared(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        Ok(u64::from_le(self.local.segment.word(region, offset)?.load(Ordering::Acquire)))
    }

    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
        self.local.segment.word(region, offset)?.store(value.to_le(), Ordering::Release);
        Ok(())
    }
}

/// Conformance harness: every node in this process, in a fresh directory removed on drop.
#[derive(Debug)]
pub struct ShmHarness {
    dir: PathBuf,
}

impl ShmHarness {
    /// A harness whose cluster directory is unique to this process and `name`.
    pub fn new(name: &str) -> Self {
        let dir = ShmConfig::default_dir(&format!("test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self { dir }
    }

    /// The cluster directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Harness for ShmHarness {
    type F = ShmFabric;

    fn start(&mut self, id: NodeId, max_nodes: u16, regions: &[RegionSpec]) -> Result<ShmFabric, FabricError> {
        let mut config = ShmConfig::new(&self.dir, id, max_nodes, regions);
        config.connect_timeout = Duration::from_millis(200);
        ShmFabric::start(config)
    }

    fn settle(&mut self) {}

    fn crash(&mut self, node: ShmFabric) {
        drop(node);
    }
}

impl Drop for ShmHarness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
