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
    /// Whether a dial to the peer is under way in the background: it is polled on every call,
    /// not once per `retry_ns` (polling one costs nothing, and a peer that is up must not
    /// look silent for a whole retry interval while its connection is already set up).
    dialing: Vec<bool>,
    retry_ns: u64,
    auto_reconnect: bool,
}

impl<E: Endpoint> Links<E> {
    /// Links of `me` in a cluster of `replicas`, retrying failed connections every `retry_ns`.
    pub(super) fn new(me: NodeId, replicas: u16, retry_ns: u64, auto_reconnect: bool) -> Self {
        let n = usize::from(replicas);
        Self {
            me,
            endpoints: (0..n).map(|_| None).collect(),
            next_attempt_ns: vec![0; n],
            dialing: vec![false; n],
            retry_ns,
            auto_reconnect,
        }
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

    /// (Re)connects the endpoint to `peer` if it is not ready and an attempt is due. An endpoint
    /// whose peer process is gone ([`Endpoint::peer_gone`]) counts as not ready although no
    /// operation on it failed yet: nothing posted on it could land, and reconnecting it here
    /// rather than after a failed post lets the first post reach the peer's next run (a new
    /// leader's permission request to a follower restarted since it last wrote to it). Never waits
    /// for a peer that does not answer (`try_connect`, `try_reconnect`): a polling thread
    /// blocked on a frozen or partitioned peer stops heartbeating and looks dead itself.
    pub(super) fn reconnect<F: Fabric<Endpoint = E>>(&mut self, fabric: &F, peer: NodeId, now: u64) {
        let i = usize::from(peer.0);
        let usable = self.endpoints[i].as_ref().is_some_and(|ep| ep.state() == EndpointState::Ready && !ep.peer_gone());
        if !usable && (self.dialing[i] || now >= self.next_attempt_ns[i]) {
            self.next_attempt_ns[i] = now + self.retry_ns;
            self.dialing[i] = match &mut self.endpoints[i] {
                Some(ep) => ep.try_reconnect() == Ok(false),
                slot @ None => match fabric.try_connect(peer) {
                    Ok(endpoint) => {
                        *slot = endpoint;
                        slot.is_none()
                    }
                    Err(_) => false,
                },
            };
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

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use microrep_fabric::tcp::{TcpConfig, TcpFabric};
    use microrep_fabric::{RegionId, RegionSpec, RemoteWrite};

    use super::*;

    fn start(cluster: &str, id: u16, peers: &[(u16, SocketAddr)]) -> TcpFabric {
        let regions = [RegionSpec::new(RegionId(0), 64, RemoteWrite::Always)];
        let config = TcpConfig::new(cluster, NodeId(id), 2, SocketAddr::from(([127, 0, 0, 1], 0)), &regions)
            .with_peers(peers.iter().map(|&(p, a)| (NodeId(p), a)));
        TcpFabric::start(config).expect("start")
    }

    /// A relay to `target` that holds the first connection until `go` fires: a peer slow to
    /// answer the handshake.
    fn held_relay(target: SocketAddr, go: mpsc::Receiver<()>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (inbound, _) = listener.accept().expect("accept");
            go.recv().expect("go");
            let outbound = TcpStream::connect(target).expect("target");
            let pipe = |mut from: TcpStream, mut to: TcpStream| {
                std::thread::spawn(move || std::io::copy(&mut from, &mut to));
            };
            pipe(inbound.try_clone().expect("clone"), outbound.try_clone().expect("clone"));
            pipe(outbound, inbound);
        });
        addr
    }

    /// A booting cluster: the first dial to a live peer is still under way when `ready`
    /// returns. It must be polled again at once, not a retry interval later (the heartbeats of
    /// the whole interval would be counted as silence, and a live peer taken for dead).
    #[test]
    fn a_dial_under_way_is_polled_without_waiting_for_the_retry_interval() {
        let cluster = format!("links-dial-{}", std::process::id());
        let target = start(&cluster, 0, &[]);
        let (go, held) = mpsc::channel();
        let fabric = start(&cluster, 1, &[(0, held_relay(target.local_addr(), held))]);
        let mut links = Links::new(NodeId(1), 2, u64::MAX / 2, true);
        // The same `now` throughout: no retry is ever due.
        assert!(links.ready(&fabric, NodeId(0), 1).is_none(), "the handshake is held");
        go.send(()).expect("release");
        let deadline = Instant::now() + Duration::from_secs(30);
        while links.ready(&fabric, NodeId(0), 1).is_none() {
            assert!(Instant::now() < deadline, "the dial under way was never polled again");
            std::thread::yield_now();
        }
    }
}
