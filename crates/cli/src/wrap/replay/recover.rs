//! The replay agent's side of state transfer (`wrap/transfer.rs`): as a donor it stops at a
//! cut and has its server write its state; as a recipient it restarts its server from a
//! donor's state and replays what follows the cut.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use microrep::Index;

use super::{Agent, CatchUpError, PATIENCE, REBUILD_RETRY, Replayed, Unrecoverable, connect, server_caught_up};
use crate::wrap::entry::{Discard, Origin};
use crate::wrap::output::ConnOutput;
use crate::wrap::redis::{self, Admin, RedisError, UnknownClient};
use crate::wrap::replica::say;
use crate::wrap::server::ServerError;
use crate::wrap::transfer::{self, Checkpoint, DONOR_PATIENCE, DonateError, Donated, FetchError, Hook, Request};

/// How long a restarted server may take to load its state.
const LOADING_PATIENCE: Duration = Duration::from_secs(120);
/// How long a leader waits for its server's calls reading client input to finish before it
/// gives up a cut (and tries again 50 ms later).
const GATE_PATIENCE: Duration = Duration::from_millis(200);

/// Why a connection of the agent's own to its server (for the hook's commands, or a session
/// open at a cut) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error("connecting to the server: {0}")]
    Connect(std::io::Error),
    #[error("the server did not accept the agent's connection")]
    NotAccepted,
    /// The server exited while the agent waited for it (it could not listen, or crashed).
    #[error("the server exited ({0})")]
    Exited(String),
    /// Making the connection blocking, with timeouts.
    #[error("setting up the agent's connection: {0}")]
    Setup(std::io::Error),
    #[error(transparent)]
    Redis(#[from] RedisError),
}

/// Why the replay agent could not take a checkpoint of its copy, or install a peer's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransferError {
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error(transparent)]
    CatchUp(#[from] CatchUpError),
    #[error("copying {} to {}: {source}", from.display(), to.display())]
    CopyState { from: PathBuf, to: PathBuf, source: std::io::Error },
    #[error("this leader's copy is not in order with the log")]
    OutOfOrder,
    #[error(transparent)]
    UnknownClient(#[from] UnknownClient),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("moving the state to {}: {source}", file.display())]
    MoveState { file: PathBuf, source: std::io::Error },
    #[error("re-establishing connection {conn}: {source}")]
    Reestablish { conn: u64, source: std::io::Error },
    #[error("the restarted server: {0}")]
    NotLoaded(AdminError),
}

impl Agent<'_> {
    /// Marks the copy for replacement by a peer's state, which [`Agent::rebuild_when_due`]
    /// fetches: from now on it is sent no input, serves no one and donates nothing. Without a
    /// state-transfer hook it can never be replaced: the replica stops, saying why.
    pub(super) fn discard(&mut self, why: Discard) {
        if self.transfer.hook == Hook::None {
            let e = Unrecoverable { why };
            tracing::error!("{e}");
            *self.progress.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            return;
        }
        if self.stale.is_none() {
            tracing::warn!(handled = ?self.cursor.handled(), "discarding this copy ({why}); it gets a peer's state");
        }
        self.stale = Some(Instant::now());
        self.progress.stale.store(true, Ordering::Release);
    }

    /// Replaces a discarded copy with a peer's state at a cut at or after the last entry handled,
    /// asking again every [`REBUILD_RETRY`] while no peer gives one (the node keeps its log and
    /// its vote meanwhile).
    pub(super) fn rebuild_when_due(&mut self) {
        if self.stale.is_none_or(|due| Instant::now() < due) {
            return;
        }
        match self.recover(self.cursor.handled()) {
            Ok(Donated { checkpoint, donor }) => {
                self.stale = None;
                self.progress.stale.store(false, Ordering::Release);
                self.progress.rebuilt.fetch_add(1, Ordering::Relaxed);
                let at = checkpoint.cut.map_or_else(|| "the start".into(), |c| format!("entry {}", c.entry));
                say(&format!("replica {}: copy rebuilt from {donor}'s state at {at}", self.origin.replica));
            }
            Err(e) => {
                tracing::warn!("rebuilding this copy: {e}; asking again in {REBUILD_RETRY:?}");
                self.stale = Some(Instant::now() + REBUILD_RETRY);
            }
        }
    }

    /// Opens a connection to the server like a replayed one, waiting until it was accepted.
    /// While the server is not listening yet (it may be loading its state), tries again, for
    /// at most [`LOADING_PATIENCE`], unless it exited meanwhile.
    fn open(&self) -> Result<Replayed, AdminError> {
        let deadline = Instant::now() + LOADING_PATIENCE;
        let (stream, port) = loop {
            match connect(self.port, self.progress, Duration::from_millis(500)) {
                Ok(connected) => break connected,
                Err(e) if Instant::now() > deadline => return Err(AdminError::Connect(e)),
                Err(e) => match self.transfer.server.exited() {
                    Some(status) => return Err(AdminError::Exited(status)),
                    None if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                    None => return Err(AdminError::Connect(e)),
                },
            }
        };
        let deadline = Instant::now() + PATIENCE;
        while !self.progress.accepted(port) {
            if Instant::now() > deadline {
                return Err(AdminError::NotAccepted);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // A connection opened by the agent itself, or re-opened mid-stream by a state
        // transfer: its output is not the leader's from the first byte, so it is not compared.
        Ok(Replayed::new(stream, port, ConnOutput::unaligned()))
    }

    /// The agent's connection for the hook's commands.
    fn admin(&mut self) -> Result<&mut Admin, AdminError> {
        let admin = match self.admin.take() {
            Some(admin) => admin,
            None => Admin::new(self.open()?.stream).map_err(AdminError::Setup)?,
        };
        Ok(self.admin.insert(admin))
    }

    /// Runs `f` on the admin connection; counts the bytes it sent as replayed input.
    fn with_admin<T>(
        &mut self,
        f: impl FnOnce(&mut Admin, &mut u64) -> Result<T, RedisError>,
    ) -> Result<T, AdminError> {
        let mut sent = 0;
        let result = self.admin().and_then(|admin| Ok(f(admin, &mut sent)?));
        self.progress.written.fetch_add(sent, Ordering::AcqRel);
        if result.is_err() {
            self.admin = None;
        }
        result
    }

    /// Answers the checkpoints peers asked for: once the agent handled the entry each needs,
    /// at the first clean cut (retried every 50 ms), or with an error after its deadline.
    pub(super) fn donate(&mut self) {
        self.asked.extend(self.transfer.requests.try_iter().map(|r| (r, Instant::now() + DONOR_PATIENCE)));
        if self.asked.is_empty() || Instant::now() < self.next_checkpoint {
            return;
        }
        for (request, deadline) in std::mem::take(&mut self.asked) {
            let reached = request.upto.is_none_or(|upto| self.cursor.handled().is_some_and(|h| h >= upto));
            let answer = match self.transfer.hook {
                Hook::None => Some(Err(DonateError::NoHook)),
                Hook::Redis if self.stale.is_some() => Some(Err(DonateError::AgentRebuilding)),
                Hook::Redis if reached => match self.checkpoint(&request) {
                    Ok(Some(checkpoint)) => Some(Ok(checkpoint)),
                    Ok(None) if Instant::now() < deadline => None,
                    Ok(None) => Some(Err(DonateError::NoCleanCut)),
                    Err(e) => Some(Err(e.into())),
                },
                Hook::Redis if Instant::now() > deadline => Some(Err(DonateError::NotReached(request.upto))),
                Hook::Redis => None,
            };
            match answer {
                Some(answer) => {
                    let _ = request.reply.send(answer);
                }
                None => self.asked.push((request, deadline)),
            }
        }
        self.next_checkpoint = Instant::now() + Duration::from_millis(50);
    }

    /// Has the server write its state to the request's destination at a cut; `None` if no clean
    /// cut could be taken now (a connection inside `MULTI`, blocked, or holding part of a
    /// command; a leader's client input that would not stop).
    fn checkpoint(&mut self, request: &Request) -> Result<Option<Checkpoint>, TransferError> {
        if request.of_leader {
            return self.leader_checkpoint(&request.dest);
        }
        let dest = &request.dest;
        server_caught_up(&self.control, self.progress, PATIENCE)?;
        let ports: HashMap<u16, u64> = self.conns.iter().map(|(&id, c)| (c.port, id)).collect();
        let Some(sessions) = self.with_admin(|admin, sent| admin.sessions(&ports, sent))? else {
            return Ok(None);
        };
        let file = self.with_admin(Admin::save)?;
        copy_state(&file, dest)?;
        tracing::info!(cut = ?self.cursor.handled(), sessions = sessions.len(), "state transfer: checkpoint given");
        Ok(Some(Checkpoint { cut: self.cursor.handled(), sessions }))
    }

    /// A serving leader's checkpoint. Its copy executes clients' input as it commits, so the
    /// cut is a moment: client input is held back (the shim neither reads from clients nor
    /// accepts them), then `CLIENT LIST` and `SAVE` run back to back; the cut is the last entry
    /// applied, which must be the same before and after (a client's close, which is not held
    /// back, may commit meanwhile: then no cut is taken) with the copy in order there (it
    /// executed exactly the log up to it).
    fn leader_checkpoint(&mut self, dest: &Path) -> Result<Option<Checkpoint>, TransferError> {
        let file = self.state_file()?;
        self.admin()?; // Opened first: its accept would be held back too.
        let control = Arc::clone(&self.control);
        let Some(held) = control.hold_clients(GATE_PATIENCE) else { return Ok(None) };
        let copy = Arc::clone(&self.transfer.copy);
        let before = copy.position();
        if copy.diverged() || !before.is_some_and(|p| p.in_order) {
            return Err(TransferError::OutOfOrder);
        }
        let list = self.with_admin(Admin::list_and_save)?;
        copy_state(&file, dest)?;
        let after = copy.position();
        drop(held);
        let (Some(cut), true) = (before, before == after) else { return Ok(None) };
        let agent: HashMap<u16, u64> =
            self.progress.ports.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(&p, _)| (p, 0)).collect();
        let clients = self.progress.clients.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(sessions) = redis::parse_leader_sessions(&list, self.port, &clients, &agent)? else { return Ok(None) };
        tracing::info!(cut = ?cut.last, sessions = sessions.len(), "state transfer: checkpoint given by the leader");
        Ok(Some(Checkpoint { cut: Some(cut.last), sessions }))
    }

    /// Gives the server a peer's state from a cut at or after `upto`, then replays from the
    /// cut on: the server is restarted from the peer's state file, as a new copy (a fresh
    /// origin: the old copy's entries after the cut are replayed to it), and the connections
    /// open at the cut are opened again in their sessions.
    fn recover(&mut self, upto: Option<Index>) -> Result<Donated, TransferError> {
        let file = self.state_file()?;
        let incoming = self.transfer.dir.join("incoming.state");
        let donated = transfer::fetch(&self.transfer.peers, upto, &incoming)?;
        let checkpoint = &donated.checkpoint;
        tracing::info!(cut = ?checkpoint.cut, sessions = checkpoint.sessions.len(), "state transfer: restarting the server");
        self.admin = None;
        self.conns.clear();
        self.last = None;
        self.progress.open.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.progress.clients.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.progress.ports.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let (control, progress) = (&self.control, self.progress);
        self.transfer.server.restart(|| -> Result<(), TransferError> {
            std::fs::rename(&incoming, &file)
                .map_err(|source| TransferError::MoveState { file: file.clone(), source })?;
            control.reset();
            progress.written.store(0, Ordering::Release);
            Ok(())
        })?;
        self.input_times = 0;
        self.origin = Origin::fresh(self.origin.replica);
        self.transfer.copy.set(self.origin);
        self.await_loaded()?;
        for session in &checkpoint.sessions {
            let mut conn = self.open()?;
            let input = redis::reestablish(session);
            conn.write_all(&input).map_err(|source| TransferError::Reestablish { conn: session.conn, source })?;
            progress.written.fetch_add(input.len() as u64, Ordering::AcqRel);
            self.conns.insert(session.conn, conn);
            progress.open.lock().unwrap_or_else(PoisonError::into_inner).push(session.conn);
        }
        server_caught_up(&self.control, progress, PATIENCE)?;
        for conn in self.conns.values_mut() {
            conn.drain();
            conn.differed.clear();
        }
        self.cursor.installed(checkpoint.cut);
        progress.applied.store(checkpoint.cut.map_or(0, |c| c.entry), Ordering::Release);
        tracing::info!(cut = ?checkpoint.cut, "state transfer: done; replaying from the cut");
        Ok(donated)
    }

    /// Where the server loads its state from at start, asked once (a server that exited is
    /// started again, empty, to be asked).
    fn state_file(&mut self) -> Result<PathBuf, TransferError> {
        if let Some(file) = &self.state_file {
            return Ok(file.clone());
        }
        let file = match self.with_admin(Admin::state_file) {
            Ok(file) => file,
            Err(e) => {
                let Some(status) = self.transfer.server.exited() else { return Err(e.into()) };
                tracing::info!("the server exited ({status}); starting it empty to learn where it keeps its state");
                self.transfer.server.restart(|| Ok::<_, ServerError>(()))?;
                self.await_loaded()?;
                self.with_admin(Admin::state_file)?
            }
        };
        self.state_file = Some(file.clone());
        Ok(file)
    }

    /// Waits until the restarted server loaded its state (Redis answers `-LOADING` until then).
    fn await_loaded(&mut self) -> Result<(), TransferError> {
        let deadline = Instant::now() + LOADING_PATIENCE;
        loop {
            match self.with_admin(Admin::loaded) {
                Ok(()) => return Ok(()),
                Err(e @ AdminError::Exited(_)) => return Err(TransferError::NotLoaded(e)),
                Err(e) if Instant::now() > deadline => return Err(TransferError::NotLoaded(e)),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// Copies the state file `from` the server to `to`, where the asker reads it.
fn copy_state(from: &Path, to: &Path) -> Result<(), TransferError> {
    std::fs::copy(from, to).map(drop).map_err(|source| TransferError::CopyState {
        from: from.into(),
        to: to.into(),
        source,
    })
}
