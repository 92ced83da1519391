//! Typed cluster descriptions. Node configuration files are always rendered from
//! [`microrep::Config`] (never formatted by hand), so every value is escaped by the TOML
//! serializer and checked by the same validation `microrep node` applies when it loads them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use microrep::Config;
use microrep::config::{ClusterConfig, Durability, FabricKind, LogConfig, Member, NodeConfig, TimingConfig};

use crate::KitError;

/// Where a cluster's fabric lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FabricSpec {
    /// The shm fabric, its segments in `dir`.
    Shm {
        /// The cluster directory.
        dir: PathBuf,
    },
    /// The tcp fabric: member `i` listens for its peers on `nics[i]`.
    Tcp {
        /// Each member's fabric address.
        nics: Vec<SocketAddr>,
    },
}

/// A cluster of KV replicas: member `i` serves clients on `clients[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// The cluster's name.
    pub name: String,
    /// Each member's client address.
    pub clients: Vec<SocketAddr>,
    /// The fabric.
    pub fabric: FabricSpec,
}

impl ClusterSpec {
    /// The cluster part of every member's configuration (default log and timing).
    pub fn cluster_config(&self) -> ClusterConfig {
        let nic = |i: usize| match &self.fabric {
            FabricSpec::Shm { .. } => None,
            FabricSpec::Tcp { nics } => nics.get(i).map(SocketAddr::to_string),
        };
        ClusterConfig {
            name: self.name.clone(),
            fabric: match self.fabric {
                FabricSpec::Shm { .. } => FabricKind::Shm,
                FabricSpec::Tcp { .. } => FabricKind::Tcp,
            },
            shm_dir: match &self.fabric {
                FabricSpec::Shm { dir } => Some(dir.clone()),
                FabricSpec::Tcp { .. } => None,
            },
            members: (0..self.clients.len())
                .map(|i| Member { id: i as u16, client: self.clients[i].to_string(), fabric: nic(i) })
                .collect(),
            initial_members: None,
            log: LogConfig::default(),
            timing: TimingConfig::default(),
            durability: Durability::None,
        }
    }
}

/// Writes one configuration file per member of `cluster` into `dir` (`node-ID.toml`), with
/// member `id`'s node part from `node(id)`. The node validates it when it loads it (this
/// process may lack features the node's build has, such as planted bugs).
pub fn write_configs(
    dir: &Path,
    cluster: &ClusterConfig,
    node: impl Fn(u16) -> NodeConfig,
) -> Result<Vec<PathBuf>, KitError> {
    std::fs::create_dir_all(dir).map_err(KitError::file(dir))?;
    (0..cluster.members.len() as u16)
        .map(|id| {
            let config = Config { cluster: cluster.clone(), node: node(id) };
            let path = dir.join(format!("node-{id}.toml"));
            std::fs::write(&path, config.to_toml()).map_err(KitError::file(&path))?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch::ScratchDir;

    fn addrs(base: u16, n: u16) -> Vec<SocketAddr> {
        (0..n).map(|i| SocketAddr::from(([127, 0, 0, 1], base + i))).collect()
    }

    #[test]
    fn configs_are_written_through_the_runtime_and_load_back() {
        let dir =
            ScratchDir::new(std::env::temp_dir().join(format!("microrep-testkit-cluster-{}", std::process::id())))
                .expect("scratch");
        // A quote and a backslash in the path: escaped by the serializer, not by hand.
        let shm = dir.path().join("odd \"name\\");
        let spec =
            ClusterSpec { name: "t".into(), clients: addrs(7000, 3), fabric: FabricSpec::Shm { dir: shm.clone() } };
        let paths = write_configs(dir.path(), &spec.cluster_config(), |id| NodeConfig {
            max_batch: 10 + u32::from(id),
            ..NodeConfig::new(id)
        })
        .expect("write");
        assert_eq!(paths.len(), 3);
        let one = Config::load(&paths[1], &[]).expect("loads back");
        assert_eq!(one.cluster.shm_dir, Some(shm));
        assert_eq!((one.node.id, one.node.max_batch), (1, 11));
        assert_eq!(one.cluster.client_addr(2).expect("member 2"), addrs(7000, 3)[2]);

        let tcp =
            ClusterSpec { name: "t".into(), clients: addrs(7000, 2), fabric: FabricSpec::Tcp { nics: addrs(8000, 2) } };
        let paths = write_configs(&dir.path().join("tcp"), &tcp.cluster_config(), NodeConfig::new).expect("write");
        let zero = Config::load(&paths[0], &[]).expect("loads back");
        assert_eq!(
            (zero.cluster.fabric, zero.cluster.fabric_addr(1).expect("nic")),
            (FabricKind::Tcp, addrs(8000, 2)[1])
        );
    }
}
