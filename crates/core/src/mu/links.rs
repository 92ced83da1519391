//! One plane's endpoints to its peers, connected lazily and reconnected after failures.

use microrep_fabric::{Completion, Endpoint, EndpointState, Fabric, NodeId};

/// Endpoints of one plane, indexed by peer id.
///
/// With `auto_reconnect` off, a failed endpoint stays failed until [`Links::reconnect`]: the
/// replication plane must first learn of the failure (its completion), because operations
/// posted after a reconnect would otherwise land behind one that never did, breaking the
/// FIFO order the protocol relies on.
#[derive(Debug)]
pub(super) struct Links<E> {
    me: NodeId,
    endpoints: Vec<Option<E>>,
    next_attempt_ns: Vec<u64>,
    retry_ns: u64,
    auto_reconnect: bool,
}

impl<E: Endpoint> Links<E> {
    /// Links of `me` in a cluster of `replicas`, retrying failed connections every `retry_ns`.
    pub(super) fn new(me: NodeId, replicas: u16, retry_ns: u64, auto_reconnect: bool) -> Self {
        let n = usize::from(replicas);
        Self { me, endpoints: (0..n).map(|_| None).collect(), next_attempt_ns: vec![0; n], retry_ns, auto_reconnect }
    }

    /// Peers other than this replica.
    pub(super) fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.endpoints.len() as u16).map(NodeId).filter(move |&p| p != self.me)
    }

    /// The endpoint to `peer` if it is connected and not failed, connecting (and with
    /// `auto_reconnect`, reconnecting) if due.
    pub(super) fn ready<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, peer: NodeId, now: u64) -> Option<&mut E> {
        let i = usize::from(peer.0);
        if self.auto_reconnect || self.endpoints[i].is_none() {
            self.reconnect(fabric, peer, now);
        }
        self.endpoints[i].as_mut().filter(|ep| ep.state() == EndpointState::Ready)
    }

    /// (Re)connects the endpoint to `peer` if it is not ready and an attempt is due. Never waits
    /// for a peer that does not answer (`try_connect`, `try_reconnect`): a polling thread
    /// blocked on a frozen or partitioned peer stops heartbeating and looks dead itself.
    pub(super) fn reconnect<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, peer: NodeId, now: u64) {
        let i = usize::from(peer.0);
        let usable = self.endpoints[i].as_ref().is_some_and(|ep| ep.state() == EndpointState::Ready);
        if !usable && now >= self.next_attempt_ns[i] {
            self.next_attempt_ns[i] = now + self.retry_ns;
            match &mut self.endpoints[i] {
                Some(ep) => {
                    let _ = ep.try_reconnect();
                }
                slot @ None => *slot = fabric.try_connect(peer).ok().flatten(),
            }
        }
    }

    /// Takes every available completion, tagged with its peer.
    pub(super) fn drain(&mut self, out: &mut Vec<(NodeId, Completion)>) {
        for (i, ep) in self.endpoints.iter_mut().enumerate() {
            if let Some(ep) = ep {
                while let Some(c) = ep.poll_completion() {
                    out.push((NodeId(i as u16), c));
                }
            }
        }
    }
}
