//! Starting a node on the verbs fabric (`cluster.fabric = "verbs"`, a build with the `verbs`
//! feature): the device settings of `node.verbs`, the members' bootstrap addresses, and the
//! endpoints Mu opens, which the fabric's locked-memory check counts.

use microrep_fabric::NodeId;
use microrep_fabric::verbs::{PeerTable, VerbsConfig, VerbsFabric};

use crate::api::Apply;
use crate::config::{Config, ConfigError, VerbsSettings};
use crate::node::{Node, StartError, regions};

/// The verbs fabric's configuration for `config`'s node: its regions, its bootstrap listener on
/// its member's `fabric` address and its peers' on theirs, and the device of `node.verbs`.
pub fn verbs_config(config: &Config) -> Result<VerbsConfig, ConfigError> {
    config.validate()?;
    let cluster = &config.cluster;
    let replicas = cluster.members.len() as u16;
    let me = config.node.id;
    let peers = PeerTable::new();
    for p in (0..replicas).filter(|&p| p != me) {
        peers.insert(NodeId(p), cluster.fabric_addr(p)?);
    }
    let mut verbs = VerbsConfig::new(NodeId(me), replicas, &regions(config)?, cluster.fabric_addr(me)?, peers);
    let settings = config.node.verbs.clone().unwrap_or_default();
    verbs.device = settings.device;
    verbs.port = settings.port;
    // Validation bounded it by VerbsSettings::GID_INDEX_MAX, which is u8::MAX.
    verbs.gid_index = settings.gid_index.map(|i| u8::try_from(i).expect("validated gid_index"));
    verbs.retry_count = settings.retry_count;
    verbs.ack_timeout_exp = settings.ack_timeout_exp;
    // Each peer is reached by the replication plane, the background plane and the identity
    // check, each through an endpoint of its own.
    verbs.endpoints = 3 * usize::from(replicas.saturating_sub(1));
    Ok(verbs)
}

const _: () = assert!(VerbsSettings::GID_INDEX_MAX <= u8::MAX as u16);

/// Starts `config`'s node on the verbs fabric, applying commands to `app`.
pub fn start_on_verbs<A: Apply>(config: &Config, app: A) -> Result<Node, StartError> {
    let verbs = verbs_config(config)?;
    Node::start(config, VerbsFabric::start(verbs)?, app)
}
