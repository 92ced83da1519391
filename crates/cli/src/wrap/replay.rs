//! The replay agent: feeds committed entries that this replica's server did not see through
//! the shim to that server, over one loopback connection per connection id, in log order;
//! drains the replies and digests them per connection, to compare them with the leader's
//! (output checking, `wrap/output.rs`; the replies are never sent anywhere).

use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

use microrep_interpose_wire::InputTime;

use super::control::Control;
use super::entry::{Committed, CurrentCopy, Discard, Origin, Tag, Work};
use super::output::{self, ConnOutput, Counts, Mismatch, OutputCheck};
use super::redis::Admin;
use super::server::Server;
use super::transfer::{Hook, Request};
use cursor::Cursor;

mod cursor;
mod recover;

pub(crate) use recover::TransferError;

/// A copy that must be discarded but can never be replaced: the replica stops.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{why}, and the server has no state-transfer hook (--state-transfer): it cannot be brought up to date")]
pub(crate) struct Unrecoverable {
    pub(crate) why: Discard,
}

/// The server did not take the input replayed to it in time: how far it got.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CatchUpError {
    #[error("the server read {read} of the {written} bytes replayed to it")]
    Unread { read: u64, written: u64 },
    #[error("the server processed {settled} of the {written} bytes replayed to it")]
    Unprocessed { settled: u64, written: u64 },
}

/// What the agent shares with the wrap node's other threads.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// The log index of the last entry the agent handled.
    pub(crate) applied: AtomicU64,
    /// Bytes the agent wrote to the server.
    pub(crate) written: AtomicU64,
    /// Local ports of the agent's connections (the shim lets these through), and whether
    /// the server accepted each yet.
    pub(crate) ports: Mutex<HashMap<u16, bool>>,
    /// Connection ids the agent holds open.
    pub(crate) open: Mutex<Vec<u64>>,
    /// A serving leader's client connections: the client's port → connection id (a leader's
    /// checkpoint names the sessions of its clients by connection id).
    pub(crate) clients: Mutex<HashMap<u16, u64>>,
    /// Set when the server copy could not be given the state it needs and never can be (no
    /// state-transfer hook): the replica stops.
    pub(crate) failed: Mutex<Option<Unrecoverable>>,
    /// While set, the copy is being replaced by a peer's state (docs/WRAP.md, "Rebuilding a
    /// copy"): it neither serves, nor donates, nor is sent input.
    pub(crate) stale: std::sync::atomic::AtomicBool,
    /// What output checking found.
    pub(crate) output: Counts,
    /// Times the copy was replaced by a peer's state.
    pub(crate) rebuilt: AtomicU64,
}

impl Progress {
    /// Whether `port` is one of the agent's connections, which the server is accepting.
    pub(crate) fn accepting_agent_port(&self, port: u16) -> bool {
        match self.ports.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&port) {
            Some(accepted) => {
                *accepted = true;
                true
            }
            None => false,
        }
    }

    fn accepted(&self, port: u16) -> bool {
        self.ports.lock().unwrap_or_else(PoisonError::into_inner).get(&port).copied().unwrap_or(true)
    }

    pub(crate) fn open_connections(&self) -> Vec<u64> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(crate) fn failure(&self) -> Option<Unrecoverable> {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(crate) fn stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }
}

/// One replayed connection.
struct Replayed {
    stream: TcpStream,
    port: u16,
    /// The copy's replies, digested for output checking.
    output: ConnOutput,
    /// Buckets of those replies that differed from the leader's, not reported yet.
    differed: Vec<Mismatch>,
    /// Where replies are read into (allocated once, not zeroed per read).
    buf: Box<[u8]>,
}

impl Replayed {
    fn new(stream: TcpStream, port: u16, output: ConnOutput) -> Self {
        Self { stream, port, output, differed: Vec::new(), buf: vec![0u8; 16 << 10].into_boxed_slice() }
    }

    /// Reads whatever replies are waiting, without blocking; true once the server closed.
    fn drain(&mut self) -> bool {
        let Self { stream, output, differed, buf, .. } = self;
        loop {
            match stream.read(buf) {
                Ok(0) => return true,
                Ok(n) => {
                    let got = buf.get(..n).unwrap_or_default();
                    differed.extend(output.answered(got));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    /// Closes gracefully: once the server accepted the connection, sends end-of-file after the
    /// replayed input and waits (at most `patience`) until the server, having read it all,
    /// closes its end. Closing first could reset the connection and discard input the server
    /// has not read yet. Returns what output checking found.
    fn close(mut self, progress: &Progress, patience: Duration) -> (ConnOutput, Vec<Mismatch>) {
        let deadline = Instant::now() + patience;
        while !progress.accepted(self.port) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = rustix::net::shutdown(self.stream.as_fd(), rustix::net::Shutdown::Write);
        while !self.drain() && Instant::now() < deadline {
            let mut fds = [PollFd::new(&self.stream, PollFlags::IN)];
            let timeout = rustix::time::Timespec { tv_sec: 0, tv_nsec: 10_000_000 };
            let _ = rustix::event::poll(&mut fds, Some(&timeout));
        }
        progress.ports.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.port);
        let last = self.output.closed();
        self.differed.extend(last);
        (self.output, self.differed)
    }

    /// Writes all of `data`, draining replies whenever the server is not reading.
    fn write_all(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            match self.stream.write(data) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.drain();
                    let mut fds = [PollFd::new(&self.stream, PollFlags::OUT | PollFlags::IN)];
                    let timeout = rustix::time::Timespec { tv_sec: 0, tv_nsec: 10_000_000 };
                    rustix::event::poll(&mut fds, Some(&timeout)).map_err(std::io::Error::from)?;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Opens a loopback connection to the server on `port`, registering its local port before
/// connecting (so that the shim, asked about the accept, already knows it). Retries while the
/// server is not listening yet, for at most `patience`.
fn connect(port: u16, progress: &Progress, patience: Duration) -> std::io::Result<(TcpStream, u16)> {
    let deadline = Instant::now() + patience;
    loop {
        let sock = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
        rustix::net::bind(&sock, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        let local = rustix::net::getsockname(&sock)?;
        let local = std::net::SocketAddr::try_from(local).map_err(std::io::Error::from)?;
        progress.ports.lock().unwrap_or_else(PoisonError::into_inner).insert(local.port(), false);
        match rustix::net::connect(&sock, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
            Ok(()) => {
                let stream = TcpStream::from(sock);
                stream.set_nodelay(true)?;
                stream.set_nonblocking(true)?;
                return Ok((stream, local.port()));
            }
            Err(e) => {
                progress.ports.lock().unwrap_or_else(PoisonError::into_inner).remove(&local.port());
                if e != rustix::io::Errno::CONNREFUSED || Instant::now() > deadline {
                    return Err(e.into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Waits until the server read every byte the agent wrote; false after `patience`.
fn consumed(control: &Control, progress: &Progress, patience: Duration) -> bool {
    let written = progress.written.load(Ordering::Acquire);
    let deadline = Instant::now() + patience;
    let mut tries = 0u32;
    while control.replay_read() < written {
        if Instant::now() > deadline {
            return false;
        }
        tries += 1;
        if tries < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    true
}

/// How long the agent waits for the server to take replayed input before it goes on (a server
/// busy in a script only reads again after Redis's busy-reply-threshold, 5 s).
const PATIENCE: Duration = Duration::from_secs(10);

/// What the agent needs to give its server another copy's state, or give its own.
pub(crate) struct Transfer {
    /// Whether this copy's output is compared with the leader's, and what a difference does.
    pub(crate) output_check: OutputCheck,
    /// The origin of the copy the server holds now; a rebuilt copy gets a fresh one.
    pub(crate) copy: Arc<CurrentCopy>,
    pub(crate) hook: Hook,
    /// Checkpoints peers ask of this replica.
    pub(crate) requests: Receiver<Request>,
    pub(crate) server: Arc<Server>,
    /// The peers' directories (their state sockets), to ask for a checkpoint.
    pub(crate) peers: Vec<PathBuf>,
    /// This replica's directory.
    pub(crate) dir: PathBuf,
}

/// How long a copy that needs a peer's state waits before asking again when no peer gave it.
const REBUILD_RETRY: Duration = Duration::from_secs(1);

/// The replay agent: its connections, and the connection of the last entry it replayed.
struct Agent<'a> {
    port: u16,
    /// The origin of the copy it feeds: entries of this origin were delivered by the shim.
    origin: Origin,
    /// While the copy must be replaced by a peer's state: when to ask next.
    stale: Option<Instant>,
    progress: &'a Progress,
    control: Arc<Control>,
    conns: BTreeMap<u64, Replayed>,
    last: Option<u64>,
    /// Input-time records published to the shim since the server (re)started.
    input_times: u64,
    /// The last entry handled, and the entries inside the copy's state.
    cursor: Cursor,
    transfer: Transfer,
    /// The agent's connection for the hook's commands, opened when first needed.
    admin: Option<Admin>,
    /// Where the server loads its state from, once asked.
    state_file: Option<PathBuf>,
    /// Checkpoints asked of this replica, waiting for its agent to reach them or for a clean
    /// cut, with their deadlines.
    asked: Vec<(Request, Instant)>,
    /// When the next attempt at a clean cut may be made.
    next_checkpoint: Instant,
}

/// The agent's thread: handles committed entries in order until the channel closes.
pub(crate) fn run(port: u16, control: Arc<Control>, entries: &Receiver<Work>, progress: &Progress, transfer: Transfer) {
    let mut agent = Agent {
        port,
        origin: transfer.copy.get(),
        stale: None,
        progress,
        control,
        conns: BTreeMap::new(),
        last: None,
        input_times: 0,
        cursor: Cursor::default(),
        transfer,
        admin: None,
        state_file: None,
        asked: Vec::new(),
        next_checkpoint: Instant::now(),
    };
    // Waits 2 ms for work while there is some about, up to 20 ms once idle: a peer's request
    // for a checkpoint (its own channel), replies to drain and a due rebuild are looked at
    // between waits.
    let mut quiet = 0u32;
    loop {
        let wait = if quiet < 10 { Duration::from_millis(2) } else { Duration::from_millis(20) };
        let work = entries.recv_timeout(wait);
        quiet = if work.is_ok() || !agent.asked.is_empty() || agent.stale.is_some() { 0 } else { quiet + 1 };
        match work {
            Ok(work) => {
                // Whatever else is queued is handled before the replies are looked at: one
                // poll of the connections per run of entries, not per entry.
                let more = std::iter::from_fn(|| entries.try_recv().ok()).take(MAX_RUN);
                for work in std::iter::once(work).chain(more) {
                    agent.work(work);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        agent.rebuild_when_due();
        agent.donate();
        agent.drain_ready();
        agent.check_output();
    }
}

/// The most entries the agent handles before it looks at the replies again.
const MAX_RUN: usize = 256;

impl Agent<'_> {
    fn work(&mut self, work: Work) {
        let progress = self.progress;
        match work {
            Work::Entry(committed) => {
                if !self.cursor.arrived(committed.index) {
                    return;
                }
                if self.stale.is_none()
                    && let Err(e) = self.handle(&committed)
                {
                    tracing::error!("replaying entry {}: {e}", committed.index.entry);
                }
                progress.applied.store(committed.index.entry, Ordering::Release);
            }
            Work::Restore { upto } => {
                if self.cursor.restored(upto) {
                    self.discard(Discard::BehindRecycledLog);
                } else {
                    tracing::info!(?upto, handled = ?self.cursor.handled(), "Mu restored a snapshot this copy holds already; it keeps its state");
                }
            }
            Work::Rebuild { why } => self.discard(why),
        }
    }

    /// Drains the connections with replies (or an end) waiting, found by one poll of them all
    /// instead of one read per connection.
    fn drain_ready(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let ready: Vec<u64> = {
            let (ids, mut fds): (Vec<u64>, Vec<PollFd<'_>>) =
                self.conns.iter().map(|(&id, c)| (id, PollFd::new(&c.stream, PollFlags::IN))).unzip();
            let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
            if rustix::event::poll(&mut fds, Some(&zero)).is_err() {
                // Read every connection instead, as before the poll.
                ids
            } else {
                ids.into_iter().zip(&fds).filter(|(_, fd)| !fd.revents().is_empty()).map(|(id, _)| id).collect()
            }
        };
        for id in ready {
            if let Some(c) = self.conns.get_mut(&id) {
                c.drain();
            }
        }
    }
    /// Keeps the order across connections: before input goes to another connection than the
    /// last, the server must have read everything written so far, so that it reads (and, being
    /// an event loop that processes what it reads, executes) inputs in log order, as the
    /// leader's server did. Within one connection TCP keeps the order.
    fn switch_to(&mut self, conn: u64) {
        if self.last != Some(conn) && !consumed(&self.control, self.progress, PATIENCE) {
            tracing::warn!(
                "the server did not read replayed input within {PATIENCE:?}; order across connections may differ"
            );
        }
        self.last = Some(conn);
    }

    fn handle(&mut self, committed: &Committed) -> std::io::Result<()> {
        let entry = &committed.entry;
        let progress = self.progress;
        match entry.tag {
            Tag::Barrier => {}
            Tag::Accept if entry.origin == self.origin => {}
            Tag::Accept => {
                self.switch_to(entry.conn);
                let (stream, local) = connect(self.port, progress, Duration::from_secs(30))?;
                let deadline = Instant::now() + PATIENCE;
                while !progress.accepted(local) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_micros(20));
                }
                self.conns.insert(entry.conn, Replayed::new(stream, local, ConnOutput::default()));
                progress.open.lock().unwrap_or_else(PoisonError::into_inner).push(entry.conn);
            }
            Tag::Data if self.conns.contains_key(&entry.conn) => {
                self.switch_to(entry.conn);
                if let Some(c) = self.conns.get_mut(&entry.conn) {
                    // The server reads these bytes at their input time (docs/WRAP.md, "Time
                    // and randomness").
                    let end = progress.written.load(Ordering::Acquire) + entry.data.len() as u64;
                    let time = InputTime { end, time_ns: entry.time_ns };
                    if !self.control.publish_input_time(self.input_times, time, PATIENCE) {
                        tracing::warn!("the server did not read replayed input within {PATIENCE:?}; input time lost");
                    }
                    self.input_times += 1;
                    c.write_all(&entry.data)?;
                    progress.written.fetch_add(entry.data.len() as u64, Ordering::AcqRel);
                }
            }
            Tag::Data if entry.origin == self.origin => {}
            Tag::Data => tracing::warn!("data for connection {} that this replica never opened", entry.conn),
            Tag::Close => {
                if self.conns.contains_key(&entry.conn) {
                    self.switch_to(entry.conn);
                }
                if let Some(c) = self.conns.remove(&entry.conn) {
                    progress.open.lock().unwrap_or_else(PoisonError::into_inner).retain(|&id| id != entry.conn);
                    let (mut output, differed) = c.close(progress, PATIENCE);
                    progress.output.add(&mut output);
                    self.output_differed(entry.conn, &differed);
                }
            }
            Tag::Check if entry.origin == self.origin => {}
            Tag::Check => {
                let Some(buckets) = output::decode(&entry.data) else {
                    tracing::error!("a malformed output check for connection {}", entry.conn);
                    return Ok(());
                };
                if let Some(c) = self.conns.get_mut(&entry.conn) {
                    let differed = c.output.checked(&buckets);
                    c.differed.extend(differed);
                }
            }
        }
        Ok(())
    }

    /// Reports what each connection's output checking found since it was last asked.
    fn check_output(&mut self) {
        let found: Vec<(u64, Vec<Mismatch>)> = self
            .conns
            .iter_mut()
            .map(|(&id, c)| {
                self.progress.output.add(&mut c.output);
                (id, std::mem::take(&mut c.differed))
            })
            .collect();
        for (conn, differed) in found {
            self.output_differed(conn, &differed);
        }
    }

    /// This copy's output on `conn` differed from the leader's: reported, and with
    /// `--output-check repair` the copy is rebuilt from a peer's state.
    fn output_differed(&mut self, conn: u64, differed: &[Mismatch]) {
        let Some(first) = differed.first() else { return };
        let ours = first.ours.map_or_else(|| "nothing".into(), |b| format!("{} bytes, crc {:016x}", b.len, b.crc));
        tracing::error!(
            "output check: connection {conn}, bucket {} ({} bytes from byte {}): the leader wrote crc {:016x}, this \
             copy {ours} ({} buckets differ); this copy diverged",
            first.leader.bucket,
            first.leader.len,
            first.leader.bucket * microrep_interpose_wire::OUTPUT_BUCKET_BYTES,
            first.leader.crc,
            differed.len()
        );
        if self.transfer.output_check == OutputCheck::Repair && self.stale.is_none() {
            self.discard(Discard::OutputDiffered(conn));
        }
    }
}

/// Waits until the server has read everything the agent wrote and its reading thread has gone
/// back to waiting with nothing ready since (so it has processed it); after `patience`, an
/// error saying how far it got.
pub(crate) fn server_caught_up(control: &Control, progress: &Progress, patience: Duration) -> Result<(), CatchUpError> {
    let deadline = Instant::now() + patience;
    let written = progress.written.load(Ordering::Acquire);
    if !consumed(control, progress, patience) {
        return Err(CatchUpError::Unread { read: control.replay_read(), written });
    }
    while control.settled() < written {
        if Instant::now() > deadline {
            return Err(CatchUpError::Unprocessed { settled: control.settled(), written });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}
