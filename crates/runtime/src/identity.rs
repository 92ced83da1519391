//! The cluster-fingerprint check: every node publishes the fingerprint of its `[cluster]`
//! configuration in a small region, and reads each peer's with a one-sided READ as soon as the
//! peer is reachable. A mismatch stops the node: members that disagree on the log's shape or
//! the timeouts must not replicate together. It works the same on every fabric.

use microrep_fabric::{
    Endpoint, Fabric, FabricError, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite,
};

/// The region holding, at word 0, this node's fingerprint and, at word 1 + peer, the place
/// where the READ of that peer's fingerprint lands. Peers only read it.
pub(crate) const IDENTITY: RegionId = RegionId(8);

/// How often an unchecked peer is tried again.
const RETRY_NS: u64 = 10_000_000;

/// The region spec for a cluster of `replicas`.
pub(crate) fn region(replicas: u16) -> RegionSpec {
    RegionSpec::new(IDENTITY, 8 * (1 + u64::from(replicas)), RemoteWrite::Never)
}

#[derive(Debug)]
enum Peer<E> {
    Unchecked { next_try_ns: u64 },
    Reading(E),
    Checked,
}

/// Checks peers' fingerprints from the background thread.
#[derive(Debug)]
pub(crate) struct IdentityCheck<E> {
    me: NodeId,
    fingerprint: u64,
    peers: Vec<Peer<E>>,
}

impl<E: Endpoint> IdentityCheck<E> {
    /// Publishes `fingerprint` in the local region and prepares to check every peer.
    pub(crate) fn new<F: Fabric<Endpoint = E>>(
        fabric: &F,
        replicas: u16,
        fingerprint: u64,
    ) -> Result<Self, FabricError> {
        fabric.store_u64(IDENTITY, 0, fingerprint)?;
        let me = fabric.node_id();
        let peers = (0..replicas).map(|p| if p == me.0 { Peer::Checked } else { Peer::Unchecked { next_try_ns: 0 } });
        Ok(Self { me, fingerprint, peers: peers.collect() })
    }

    /// Advances the checks; returns an error naming the first peer found to differ.
    pub(crate) fn poll<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) -> Result<(), String> {
        for (id, peer) in self.peers.iter_mut().enumerate() {
            let node = NodeId(id as u16);
            match peer {
                Peer::Checked => {}
                Peer::Unchecked { next_try_ns } if now >= *next_try_ns => {
                    let dst = 8 * (1 + id as u64);
                    let posted = fabric.connect(node).and_then(|mut ep| {
                        ep.post_read(0, RemoteAddr::new(IDENTITY, 0), 8, IDENTITY, dst, PostFlags::SIGNALED)?;
                        Ok(ep)
                    });
                    *peer = match posted {
                        Ok(ep) => Peer::Reading(ep),
                        Err(_) => Peer::Unchecked { next_try_ns: now + RETRY_NS },
                    };
                }
                Peer::Unchecked { .. } => {}
                Peer::Reading(ep) => match ep.poll_completion() {
                    None => {}
                    Some(c) if c.status.is_err() => *peer = Peer::Unchecked { next_try_ns: now + RETRY_NS },
                    Some(_) => {
                        let theirs = fabric.load_u64(IDENTITY, 8 * (1 + id as u64)).map_err(|e| e.to_string())?;
                        if theirs == 0 {
                            // The peer has started its fabric but not published yet.
                            *peer = Peer::Unchecked { next_try_ns: now + RETRY_NS / 10 };
                        } else if theirs != self.fingerprint {
                            return Err(format!(
                                "{node}'s [cluster] configuration differs from {}'s (fingerprint {theirs:016x}, \
                                 ours {:016x}): every member must use the same [cluster] part",
                                self.me, self.fingerprint
                            ));
                        } else {
                            tracing::debug!(peer = id, "cluster fingerprint matches");
                            *peer = Peer::Checked;
                        }
                    }
                },
            }
        }
        Ok(())
    }

    /// Whether every peer has been checked.
    pub(crate) fn done(&self) -> bool {
        self.peers.iter().all(|p| matches!(p, Peer::Checked))
    }
}
