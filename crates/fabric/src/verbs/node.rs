//! A verbs node: its registered regions, its bootstrap listener, and the target-side QPs its
//! peers' endpoints connect to, with the write grants applied to them (Mu §5.2).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::BasicCompletionQueue;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairState};

use super::device::Device;
use super::memory::{Registered, memlock_limit};
use super::qp::{self, QpAddress};
use super::wire::{self, Header, RemoteRegion, Reply, Request};
use super::{VerbsConfig, VerbsEndpoint};
use crate::{Fabric, FabricError, NodeId, RegionId, RegionSpec, RemoteWrite, RevokePath, layout};

/// A node's handle on the verbs fabric. `Send + Sync`: threads share it (`connect` takes `&self`).
#[derive(Debug)]
pub struct VerbsFabric {
    pub(crate) node: Arc<Node>,
    stop: Arc<AtomicBool>,
    listener: Option<JoinHandle<()>>,
}

/// What a node's handle, its listener thread and its endpoints share.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) config: VerbsConfig,
    pub(crate) device: Device,
    pub(crate) regions: Vec<(RegionSpec, Registered)>,
    pub(crate) listen_addr: std::net::SocketAddr,
    passive: Mutex<Passive>,
    passive_cq: Arc<BasicCompletionQueue>,
}

/// Target-side QPs and the grants that set their access flags.
#[derive(Debug, Default)]
struct Passive {
    next_conn: u64,
    conns: BTreeMap<u64, PassiveConn>,
    grants: BTreeSet<(RegionId, NodeId)>,
}

#[derive(Debug)]
struct PassiveConn {
    peer: NodeId,
    lanes: Vec<PassiveLane>,
}

#[derive(Debug)]
struct PassiveLane {
    /// `None` for the open lane; else the granted region this lane alone may write.
    region: Option<RegionId>,
    qp: BasicQueuePair,
    local_psn: u32,
    remote: QpAddress,
}

impl Passive {
    fn access(&self, region: Option<RegionId>, peer: NodeId) -> AccessFlags {
        qp::remote_access(region.is_none_or(|r| self.grants.contains(&(r, peer))))
    }
}

impl VerbsFabric {
    /// Opens the device, registers the regions, and starts the bootstrap listener.
    pub fn start(config: VerbsConfig) -> Result<Self, FabricError> {
        config.validate()?;
        let largest = config.regions.iter().map(|r| r.len_bytes).max().unwrap_or(8);
        // The device first: on a host without RDMA, that is what to report.
        let device = Device::open(&config, largest)?;
        config.check_memlock(memlock_limit(), rustix::process::geteuid().is_root())?;
        let mut regions = Vec::with_capacity(config.regions.len());
        for spec in &config.regions {
            let mut access = AccessFlags::LocalWrite | AccessFlags::RemoteRead;
            if spec.remote_write != RemoteWrite::Never {
                access |= AccessFlags::RemoteWrite;
            }
            let len =
                usize::try_from(spec.len_bytes).map_err(|_| FabricError::InvalidLayout("region too large".into()))?;
            regions.push((*spec, Registered::new(&device.pd, len, access)?));
        }
        let passive_cq = device
            .context
            .create_cq_builder()
            .setup_cqe(16)
            .build()
            .map_err(|e| qp::verbs_error(&device.name, "creating a completion queue", &e))?;
        let listener =
            TcpListener::bind(config.listen).map_err(|e| FabricError::os("binding the bootstrap listener", e))?;
        let listen_addr = listener.local_addr().map_err(|e| FabricError::os("bootstrap listener address", e))?;
        config.peers.insert(config.node, listen_addr);
        let node = Arc::new(Node {
            config,
            device,
            regions,
            listen_addr,
            passive: Mutex::new(Passive::default()),
            passive_cq,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread_node = Arc::clone(&node);
        let thread_stop = Arc::clone(&stop);
        let listener = std::thread::Builder::new()
            .name(format!("verbs-bootstrap-{}", node.config.node.0))
            .spawn(move || serve(&thread_node, &listener, &thread_stop))
            .map_err(|e| FabricError::os("spawning the bootstrap listener", e))?;
        Ok(Self { node, stop, listener: Some(listener) })
    }

    /// The device in use and its GID index.
    pub fn device(&self) -> (String, u8) {
        (self.node.device.name.clone(), self.node.device.gid_index)
    }

    /// Where this node's bootstrap listener is.
    pub fn bootstrap_addr(&self) -> std::net::SocketAddr {
        self.node.listen_addr
    }

    /// Times re-registering a fresh `len_bytes` memory region to take remote write away
    /// (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`), the MR-based alternative to Mu's QP
    /// access-flag revocation. Soft-RoCE does not implement it: that is reported as
    /// [`FabricError::Unsupported`], as is a libibverbs without the symbol.
    pub fn rereg_mr_probe(&self, len_bytes: usize) -> Result<std::time::Duration, FabricError> {
        super::rereg::probe(&self.node.device, len_bytes)
    }

    fn region(&self, region: RegionId) -> Result<&(RegionSpec, Registered), FabricError> {
        let (i, _) = layout::find_spec(self.node.config.node, &self.node.config.regions, region)?;
        Ok(&self.node.regions[i])
    }

    fn granted_region(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        let (spec, _) = self.region(region)?;
        layout::check_peer(self.node.config.node, peer, self.node.config.max_nodes)?;
        if spec.remote_write != RemoteWrite::Granted {
            return Err(FabricError::NotGrantable { region });
        }
        Ok(())
    }
}

impl Drop for VerbsFabric {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the listener's blocking accept; it sees `stop` and exits.
        let _ = TcpStream::connect_timeout(&self.node.listen_addr, std::time::Duration::from_millis(200));
        if let Some(listener) = self.listener.take() {
            let _ = listener.join();
        }
        self.node.config.peers.remove(self.node.config.node, self.node.listen_addr);
        // Destroying the target-side QPs is what makes peers' operations fail, as after a crash.
        self.node.passive.lock().expect("passive state poisoned").conns.clear();
    }
}

impl Fabric for VerbsFabric {
    type Endpoint = VerbsEndpoint;

    fn node_id(&self) -> NodeId {
        self.node.config.node
    }

    fn connect(&self, peer: NodeId) -> Result<VerbsEndpoint, FabricError> {
        VerbsEndpoint::connect(Arc::clone(&self.node), peer).inspect_err(|e| {
            tracing::debug!(node = self.node.config.node.0, peer = peer.0, error = %e, "connecting failed");
        })
    }

    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        self.granted_region(region, peer)?;
        let mut passive = self.node.passive.lock().expect("passive state poisoned");
        passive.grants.insert((region, peer));
        for lane in lanes_of(&mut passive.conns, peer, region) {
            // A QP not in RTS (in error after a denied write) takes the grant when the writer
            // reconnects, which cycles it with the access flags of the grants at that moment.
            let _ = qp::set_access(&mut lane.qp, qp::remote_access(true));
        }
        Ok(())
    }

    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
        self.granted_region(region, peer)?;
        let node = &self.node;
        let mut passive = node.passive.lock().expect("passive state poisoned");
        passive.grants.remove(&(region, peer));
        let mut path = RevokePath::Fast;
        for lane in lanes_of(&mut passive.conns, peer, region) {
            // Mu §5.2 fast path: clear remote write in the QP's access flags.
            let fast = qp::set_access(&mut lane.qp, qp::remote_access(false));
            if fast.is_ok() && qp::state(&lane.qp) == QueuePairState::ReadyToSend {
                continue;
            }
            // Slow path: cycle the QP through RESET, INIT, RTR, RTS, read-only. Expecting the PSN
            // it expected before keeps the writer's in-flight packets in sequence, so they fail
            // with a remote access error instead of timing out.
            path = RevokePath::Slow;
            let mut remote = lane.remote;
            remote.psn = qp::receive_psn(&lane.qp).unwrap_or(remote.psn);
            let access = qp::remote_access(false);
            if let Err(e) = qp::cycle_to_rts(&mut lane.qp, &node.device, &node.config, lane.local_psn, &remote, access)
            {
                // A QP that cannot come back is left in RESET or ERR, where it takes no writes.
                qp::to_error(&mut lane.qp);
                if qp::state(&lane.qp) != QueuePairState::Error {
                    return Err(FabricError::RevokeFailed { peer, region, reason: e.to_string() });
                }
            }
        }
        Ok(path)
    }

    fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
        Ok(self.region(region)?.0.len_bytes)
    }

    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let (spec, mem) = self.region(region)?;
        layout::check_bounds(self.node.config.node, region, spec.len_bytes, offset, buf.len() as u64)?;
        mem.copy_out(offset as usize, buf);
        Ok(())
    }

    unsafe fn local_bytes(&self, region: RegionId, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, FabricError> {
        let (spec, mem) = self.region(region)?;
        layout::check_bounds(self.node.config.node, region, spec.len_bytes, offset, len as u64)?;
        // SAFETY: in bounds (checked); nobody changes the bytes while the slice lives (the
        // caller's contract).
        Ok(Cow::Borrowed(unsafe { mem.slice(offset as usize, len) }))
    }

    fn lends_local_bytes(&self) -> bool {
        true
    }

    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let (spec, mem) = self.region(region)?;
        layout::check_bounds(self.node.config.node, region, spec.len_bytes, offset, data.len() as u64)?;
        mem.copy_in(offset as usize, data);
        Ok(())
    }

    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        let (spec, mem) = self.region(region)?;
        layout::check_word(self.node.config.node, region, spec.len_bytes, offset)?;
        Ok(u64::from_le(mem.word(offset as usize).load(Ordering::Acquire)))
    }

    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
        let (spec, mem) = self.region(region)?;
        layout::check_word(self.node.config.node, region, spec.len_bytes, offset)?;
        mem.word(offset as usize).store(value.to_le(), Ordering::Release);
        Ok(())
    }
}

fn lanes_of(
    conns: &mut BTreeMap<u64, PassiveConn>,
    peer: NodeId,
    region: RegionId,
) -> impl Iterator<Item = &mut PassiveLane> {
    conns
        .values_mut()
        .filter(move |c| c.peer == peer)
        .flat_map(|c| c.lanes.iter_mut())
        .filter(move |l| l.region == Some(region))
}

/// The listener thread: one bootstrap exchange at a time, each bounded by the connect timeout.
fn serve(node: &Node, listener: &TcpListener, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let timeout = Some(node.config.connect_timeout);
        if stream.set_read_timeout(timeout).and_then(|()| stream.set_write_timeout(timeout)).is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        if let Err(e) = handle(node, &mut stream) {
            tracing::debug!(node = node.config.node.0, error = %e, "bootstrap exchange failed");
        }
    }
}

fn handle(node: &Node, stream: &mut TcpStream) -> std::io::Result<()> {
    let (header, request) = wire::recv_request(stream)?;
    let me = node.config.node;
    if header.to != me || layout::check_peer(me, header.from, node.config.max_nodes).is_err() {
        let why = format!(
            "this is {me} of {} nodes; the request is for {} from {}",
            node.config.max_nodes, header.to, header.from
        );
        return wire::send_reply(stream, &Reply::Refused(why));
    }
    let reply = match request {
        Request::Hello => return accept_connection(node, stream, header),
        Request::Reconnect { conn_id, psns } => reconnect(node, header.from, conn_id, &psns),
        Request::Close { conn_id } => {
            let mut passive = node.passive.lock().expect("passive state poisoned");
            if passive.conns.get(&conn_id).is_some_and(|c| c.peer == header.from) {
                passive.conns.remove(&conn_id);
            }
            Reply::Done
        }
        Request::Accept { .. } => Reply::Refused("Accept outside a connection exchange".into()),
    };
    wire::send_reply(stream, &reply)
}

/// Creates the target-side QPs of a new endpoint: the open lane, then one per granted region.
fn accept_connection(node: &Node, stream: &mut TcpStream, header: Header) -> std::io::Result<()> {
    let refuse = |stream: &mut TcpStream, why: String| wire::send_reply(stream, &Reply::Refused(why));
    let device = &node.device;
    let lane_regions: Vec<Option<RegionId>> = std::iter::once(None)
        .chain(node.config.regions.iter().filter(|r| r.remote_write == RemoteWrite::Granted).map(|r| Some(r.id)))
        .collect();
    let mut lanes = Vec::with_capacity(lane_regions.len());
    for region in &lane_regions {
        match qp::create(device, &node.passive_cq, 1, 0) {
            Ok((qp, _)) => lanes.push((*region, qp, qp::fresh_psn())),
            Err(e) => return refuse(stream, e.to_string()),
        }
    }
    let address = |qp: &BasicQueuePair, psn| QpAddress {
        qpn: qp.qp_number(),
        psn,
        lid: device.lid,
        gid: device.gid,
        mtu: device.mtu,
    };
    let regions = node
        .regions
        .iter()
        .map(|(spec, mem)| RemoteRegion {
            id: spec.id,
            remote_write: spec.remote_write,
            addr: mem.addr(0),
            len: spec.len_bytes,
            rkey: mem.rkey(),
        })
        .collect();
    let conn_id = {
        let mut passive = node.passive.lock().expect("passive state poisoned");
        passive.next_conn += 1;
        passive.next_conn
    };
    let offer_lanes = lanes.iter().map(|(region, qp, psn)| (*region, address(qp, *psn))).collect();
    wire::send_reply(stream, &Reply::Offer { conn_id, regions, lanes: offer_lanes })?;
    let remote = match wire::recv_request(stream)? {
        (h, Request::Accept { lanes: remote }) if h == header && remote.len() == lanes.len() => remote,
        _ => return refuse(stream, "expected an Accept with one QP per offered lane".into()),
    };
    let mut passive = node.passive.lock().expect("passive state poisoned");
    let mut connected = Vec::with_capacity(lanes.len());
    for ((region, mut qp, local_psn), remote) in lanes.into_iter().zip(remote) {
        let access = passive.access(region, header.from);
        if let Err(e) = qp::cycle_to_rts(&mut qp, device, &node.config, local_psn, &remote, access) {
            drop(passive);
            return refuse(stream, e.to_string());
        }
        connected.push(PassiveLane { region, qp, local_psn, remote });
    }
    passive.conns.insert(conn_id, PassiveConn { peer: header.from, lanes: connected });
    drop(passive);
    wire::send_reply(stream, &Reply::Done)
}

/// Cycles an endpoint's target-side QPs to RTS with fresh PSNs and the current grants.
fn reconnect(node: &Node, from: NodeId, conn_id: u64, psns: &[u32]) -> Reply {
    let mut passive = node.passive.lock().expect("passive state poisoned");
    let accesses: Vec<AccessFlags> = match passive.conns.get(&conn_id) {
        Some(conn) if conn.peer == from && conn.lanes.len() == psns.len() => {
            conn.lanes.iter().map(|l| passive.access(l.region, from)).collect()
        }
        _ => return Reply::Refused(format!("no connection {conn_id} from {from} with {} lanes", psns.len())),
    };
    let conn = passive.conns.get_mut(&conn_id).expect("checked above");
    let mut fresh = Vec::with_capacity(psns.len());
    for ((lane, &psn), access) in conn.lanes.iter_mut().zip(psns).zip(accesses) {
        lane.local_psn = qp::fresh_psn();
        lane.remote.psn = psn;
        if let Err(e) = qp::cycle_to_rts(&mut lane.qp, &node.device, &node.config, lane.local_psn, &lane.remote, access)
        {
            return Reply::Refused(e.to_string());
        }
        fresh.push(lane.local_psn);
    }
    Reply::Reconnected { psns: fresh }
}
