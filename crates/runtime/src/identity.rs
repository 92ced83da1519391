//! The cluster-fingerprint check: every node publishes the fingerprint of its `[cluster]`
//! configuration in a small region, and reads each peer's with a one-sided READ as soon as the
//! peer is reachable, and again every [`RECHECK_NS`] (a peer may restart with another
//! configuration). A mismatch stops the node: members that disagree on the log's shape or the
//! timeouts must not replicate together. It works the same on every fabric.

use microrep_fabric::{
    Endpoint, Fabric, FabricError, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite,
};

/// The region holding, at word 0, this node's fingerprint and, at word 1 + peer, the place
/// where the READ of that peer's fingerprint lands. Peers only read it.
pub(crate) const IDENTITY: RegionId = RegionId(8);

/// How often an unreachable peer is tried again.
const RETRY_NS: u64 = 10_000_000;
/// How often a checked peer is checked again.
pub(crate) const RECHECK_NS: u64 = 100_000_000;

/// The region spec for a cluster of `replicas`.
pub(crate) fn region(replicas: u16) -> RegionSpec {
    RegionSpec::new(IDENTITY, 8 * (1 + u64::from(replicas)), RemoteWrite::Never)
}

/// Why the fingerprint check stops the node.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdentityError {
    #[error(
        "{peer}'s [cluster] configuration differs from {me}'s (fingerprint {theirs:016x}, ours {ours:016x}): \
         every member must use the same [cluster] part"
    )]
    Differs { peer: NodeId, me: NodeId, theirs: u64, ours: u64 },
    /// The landed fingerprint could not be read from the local region.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

#[derive(Debug)]
enum Peer<E> {
    Me,
    /// No endpoint: connect at `next_try_ns`.
    Unchecked {
        next_try_ns: u64,
    },
    /// Connected, checked (or the peer had not published yet): READ again at `next_read_ns`.
    /// The endpoint is kept between checks: on verbs a connection costs queue pairs, a
    /// registered staging ring and a bootstrap exchange on this thread, and connecting anew for
    /// every recheck starved the heartbeats (each replica took its peers for dead). A peer that
    /// restarts fails the next READ, and is connected to again.
    Idle {
        ep: E,
        next_read_ns: u64,
    },
    Reading(E),
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
        let peers = (0..replicas).map(|p| if p == me.0 { Peer::Me } else { Peer::Unchecked { next_try_ns: 0 } });
        Ok(Self { me, fingerprint, peers: peers.collect() })
    }

    /// When [`Self::poll`] next has something to do: at once while a READ is in flight (or a
    /// connection is being dialed), otherwise at the earliest retry or recheck.
    pub(crate) fn next_due(&self, now: u64) -> u64 {
        let due = |peer: &Peer<E>| match *peer {
            Peer::Me => u64::MAX,
            Peer::Unchecked { next_try_ns } => next_try_ns,
            Peer::Idle { next_read_ns, .. } => next_read_ns,
            Peer::Reading(_) => now,
        };
        self.peers.iter().map(due).min().unwrap_or(u64::MAX)
    }

    /// Advances the checks; returns an error naming the first peer found to differ (the node
    /// then stops, so the peer's state is left as it is).
    pub(crate) fn poll<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, now: u64) -> Result<(), IdentityError> {
        for (id, slot) in self.peers.iter_mut().enumerate() {
            let node = NodeId(id as u16);
            let dst = 8 * (1 + id as u64);
            let retry = Peer::Unchecked { next_try_ns: now + RETRY_NS };
            *slot = match std::mem::replace(slot, Peer::Me) {
                Peer::Me => Peer::Me,
                Peer::Unchecked { next_try_ns } if now >= next_try_ns => {
                    // Never waits for a peer that does not answer (`try_connect`): this runs on
                    // the background plane's thread, and a second there without heartbeats makes
                    // this replica look dead (a restarted replica checking a killed or paused
                    // peer stalled a 5-replica tcp cluster for seconds).
                    match fabric.try_connect(node).and_then(|ep| ep.map(|ep| read(ep, dst)).transpose()) {
                        Ok(Some(ep)) => Peer::Reading(ep),
                        // Dialing in the background: the next poll takes the connection.
                        Ok(None) => Peer::Unchecked { next_try_ns: now },
                        Err(_) => retry,
                    }
                }
                Peer::Idle { ep, next_read_ns } if now >= next_read_ns => read(ep, dst).map_or(retry, Peer::Reading),
                Peer::Reading(mut ep) => match ep.poll_completion() {
                    None => Peer::Reading(ep),
                    Some(c) if c.status.is_err() => retry,
                    Some(_) => match fabric.load_u64(IDENTITY, dst)? {
                        // The peer has started its fabric but not published yet.
                        0 => Peer::Idle { ep, next_read_ns: now + RETRY_NS / 10 },
                        theirs if theirs != self.fingerprint => {
                            return Err(IdentityError::Differs {
                                peer: node,
                                me: self.me,
                                theirs,
                                ours: self.fingerprint,
                            });
                        }
                        _ => Peer::Idle { ep, next_read_ns: now + RECHECK_NS },
                    },
                },
                waiting => waiting,
            };
        }
        Ok(())
    }
}

/// Posts the READ of a peer's fingerprint into word `dst` of the local identity region.
fn read<E: Endpoint>(mut ep: E, dst: u64) -> Result<E, FabricError> {
    ep.post_read(0, RemoteAddr::new(IDENTITY, 0), 8, IDENTITY, dst, PostFlags::SIGNALED)?;
    Ok(ep)
}
