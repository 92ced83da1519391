//! A replicated key-value server that speaks a subset of RESP2, so that `redis-cli` and
//! `redis-benchmark` work against it: PING, GET, SET, DEL, EXISTS, INCR, APPEND, MGET, MSET,
//! DBSIZE, plus `MICROREP.STATUS` (the node's status as JSON).
//!
//! Every command but PING goes through the replicated log on the leader, reads included, so
//! every reply is linearizable. A follower answers `-NOTLEADER <id> <host:port>` naming the
//! leader (or `-NOLEADER` while none is known); a command whose outcome is unknown after a
//! leader change gets `-UNKNOWN`. Malformed requests get an error reply and close the
//! connection (as Redis does); they never reach the log.

pub mod client;
mod event_loop;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod reply;
pub mod resp;
pub mod server;
pub mod session;
pub mod sessions;
pub mod store;
mod turn;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use microrep::{Config, Node};

pub use server::{Backend, ServerContext};
pub use store::KvStore;

/// Why a key-value node could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] microrep::ConfigError),
    /// The client address cannot be listened on.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The replica did not start.
    #[error(transparent)]
    Start(#[from] microrep::StartError),
    /// The server thread could not be started.
    #[error("starting the server thread: {0}")]
    Thread(std::io::Error),
    /// The server failed.
    #[error("server: {0}")]
    Server(std::io::Error),
    /// The server thread panicked.
    #[error("the server thread panicked")]
    Panicked,
}

/// A replica of the key-value store with its RESP server running.
#[derive(Debug)]
pub struct KvNode {
    node: Option<Arc<Node>>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Ends the server's wait for events once `stop` is set.
    waker: Arc<mio::Waker>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl KvNode {
    /// Starts the replica of `config` on its configured fabric and its server on the configured
    /// client address.
    pub fn start(config: &Config) -> Result<Self, KvError> {
        let listen = config.listen_addr()?;
        let listener = TcpListener::bind(listen).map_err(|source| KvError::Listen { addr: listen, source })?;
        let node = Arc::new(microrep::start(config, KvStore::default())?);
        let members = config.cluster.members.iter().map(|m| m.client.clone()).collect();
        let backend = Backend::Replicated(Arc::clone(&node));
        Self::serve(listener, backend, members, config.cluster.log.slot_bytes as usize, Some(node))
    }

    /// Starts the same server on `listen` over an unreplicated store (a baseline).
    pub fn start_unreplicated(listen: SocketAddr, max_bulk: usize) -> Result<Self, KvError> {
        let listener = TcpListener::bind(listen).map_err(|source| KvError::Listen { addr: listen, source })?;
        let backend = Backend::Unreplicated(Arc::default());
        Self::serve(listener, backend, Vec::new(), max_bulk, None)
    }

    fn serve(
        listener: TcpListener,
        backend: Backend,
        members: Vec<String>,
        max_bulk: usize,
        node: Option<Arc<Node>>,
    ) -> Result<Self, KvError> {
        let addr = listener.local_addr().map_err(KvError::Thread)?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = ServerContext { backend, members: Arc::new(members), max_bulk, stop: Arc::clone(&stop) };
        let poll = mio::Poll::new().map_err(KvError::Thread)?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), event_loop::WAKE).map_err(KvError::Thread)?);
        let server = std::thread::Builder::new()
            .name("microrep-resp".into())
            .spawn(move || event_loop::serve(listener, poll, ctx))
            .map_err(KvError::Thread)?;
        Ok(Self { node, addr, stop, waker, server: Some(server) })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The replica (none for an unreplicated server).
    pub fn node(&self) -> Option<&Node> {
        self.node.as_deref()
    }

    /// Stops serving and waits for the server's threads.
    pub fn stop(mut self) -> Result<(), KvError> {
        self.stop_server()
    }

    fn stop_server(&mut self) -> Result<(), KvError> {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.waker.wake() {
            // Not expected (an eventfd write); the server then waits for its next event.
            tracing::warn!("waking the RESP server to stop: {e}");
        }
        match self.server.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => Err(KvError::Server(e)),
            Some(Err(_)) => Err(KvError::Panicked),
            _ => Ok(()),
        }
    }
}

impl Drop for KvNode {
    fn drop(&mut self) {
        let _ = self.stop_server();
    }
}
