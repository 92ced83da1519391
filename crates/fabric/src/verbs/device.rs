//! Opening the RDMA device: which device and port, which GID, and what the device can do.

use std::sync::Arc;

use sideway::ibverbs::address::{Gid, GidType};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer, Mtu, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::VerbsConfig;
use crate::FabricError;

/// An opened device with the facts the backend needs about it.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) context: Arc<DeviceContext>,
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    pub(crate) gid: Gid,
    pub(crate) lid: u16,
    pub(crate) mtu: Mtu,
    /// Outstanding RDMA READs a QP may have (and accept) at once.
    pub(crate) max_rd_atomic: u8,
}

impl Device {
    /// Opens the configured device (or the first one) and checks it can serve `config`.
    pub(crate) fn open(config: &VerbsConfig, largest_region: u64) -> Result<Self, FabricError> {
        let list = DeviceList::new().map_err(|e| {
            // ENOSYS: the kernel has no RDMA (no ib_uverbs); no libibverbs gives another error.
            let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string);
            let wanted = config.device.as_deref().map_or_else(String::new, |name| format!(" to find {name}"));
            FabricError::NoRdmaDevice(format!(
                "cannot list RDMA devices{wanted} ({why}): this host needs an RDMA NIC or a soft-RoCE device \
                 (`rdma link add rxe0 type rxe netdev eth0`), the kernel's ib_uverbs module and \
                 rdma-core's libibverbs"
            ))
        })?;
        let device = match &config.device {
            Some(name) => list.iter().find(|d| d.name() == *name).ok_or_else(|| {
                let found: Vec<String> = list.iter().map(|d| d.name()).collect();
                FabricError::NoRdmaDevice(format!("device {name} not found (found: {found:?})"))
            })?,
            None => list.iter().next().ok_or_else(|| {
                FabricError::NoRdmaDevice(
                    "no device found (no RDMA NIC, and no soft-RoCE device: `rdma link add rxe0 type rxe netdev eth0`)"
                        .into(),
                )
            })?,
        };
        let name = device.name();
        let context = device.open().map_err(|e| FabricError::NoRdmaDevice(format!("cannot open {name}: {e}")))?;
        let attr = context.query_device().map_err(|e| FabricError::NoRdmaDevice(format!("querying {name}: {e}")))?;
        let unsupported = |feature: String| FabricError::Unsupported { device: name.clone(), feature };
        if attr.max_qp_wr() < config.queue_depth as i32 {
            return Err(unsupported(format!(
                "queue depth {} (its max_qp_wr is {})",
                config.queue_depth,
                attr.max_qp_wr()
            )));
        }
        if attr.max_mr_size() < largest_region {
            return Err(unsupported(format!("a {largest_region}-byte memory region (max {})", attr.max_mr_size())));
        }
        if attr.max_qp_rd_atom() < 1 || attr.max_qp_init_rd_atom() < 1 {
            return Err(unsupported("RDMA READ (max_qp_rd_atom is 0)".into()));
        }
        let max_rd_atomic = attr.max_qp_rd_atom().min(attr.max_qp_init_rd_atom()).min(16) as u8;
        let port_attr = context
            .query_port(config.port)
            .map_err(|e| FabricError::NoRdmaDevice(format!("{name} port {}: {e}", config.port)))?;
        if port_attr.port_state() != PortState::Active {
            return Err(FabricError::NoRdmaDevice(format!(
                "{name} port {} is {:?}, not active (is its network interface up?)",
                config.port,
                port_attr.port_state()
            )));
        }
        let (gid_index, gid) = choose_gid(&context, &name, config)?;
        let pd = context.alloc_pd().map_err(|e| FabricError::NoRdmaDevice(format!("{name}: allocating a PD: {e}")))?;
        let lid = if port_attr.link_layer() == LinkLayer::InfiniBand { port_attr.lid() } else { 0 };
        Ok(Self {
            name,
            pd,
            context,
            port: config.port,
            gid_index,
            gid,
            lid,
            mtu: port_attr.active_mtu(),
            max_rd_atomic,
        })
    }
}

/// The configured GID index, or else the best one: a RoCE v2 GID of an IPv4 address (routable,
/// what perftest's `-x` picks on soft-RoCE), then any RoCE v2 GID, then any non-zero GID.
fn choose_gid(context: &DeviceContext, name: &str, config: &VerbsConfig) -> Result<(u8, Gid), FabricError> {
    if let Some(index) = config.gid_index {
        let gid = context
            .query_gid(config.port, u32::from(index))
            .map_err(|e| FabricError::NoRdmaDevice(format!("{name}: GID index {index}: {e}")))?;
        if gid.is_zero() {
            return Err(FabricError::NoRdmaDevice(format!("{name}: GID index {index} is empty")));
        }
        return Ok((index, gid));
    }
    let table = context.query_gid_table().map_err(|e| FabricError::NoRdmaDevice(format!("{name}: GID table: {e}")))?;
    let on_port =
        |e: &&sideway::ibverbs::address::GidEntry| e.port_num() == u32::from(config.port) && !e.gid().is_zero();
    let ipv4 = |g: &Gid| g.raw[..10].iter().all(|&b| b == 0) && g.raw[10] == 0xff && g.raw[11] == 0xff;
    let best = table
        .iter()
        .filter(on_port)
        .find(|e| e.gid_type() == GidType::RoceV2 && ipv4(&e.gid()))
        .or_else(|| table.iter().filter(on_port).find(|e| e.gid_type() == GidType::RoceV2))
        .or_else(|| table.iter().find(on_port));
    let entry = best.ok_or_else(|| FabricError::NoRdmaDevice(format!("{name} port {} has no GID", config.port)))?;
    let index = u8::try_from(entry.gid_index())
        .map_err(|_| FabricError::NoRdmaDevice(format!("{name}: GID index {} too large", entry.gid_index())))?;
    Ok((index, entry.gid()))
}
