//! The wrap node's end of the shim's socket: answers each intercepted call of the server, on
//! the leader by proposing it through Mu and answering once it committed.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use microrep::{Node, ProposeError};
use microrep_interpose_wire::{HEADER_BYTES, Kind, MAX_DATA, OutputBucket, Reply, Request, Status};

use super::entry::{self, CurrentCopy, Tag, Verdict};
use super::input_clock;
use super::output::{self, OutputCheck, Reported};
use super::replay::Progress;

/// The replica's role as the shim sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Role {
    /// Replaying committed input; external clients are refused.
    Following = 0,
    /// Leader, applying what was committed before it (clients still refused).
    Promoting = 1,
    /// Leader: clients' input is proposed, and delivered once committed.
    Serving = 2,
}

/// What the monitor and the shim's handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) node: Node,
    /// The origin of the copy the server holds now.
    pub(crate) copy: Arc<CurrentCopy>,
    pub(crate) progress: Arc<Progress>,
    role: AtomicU8,
    /// Set once a client's input was proposed: from then on this server copy holds input that
    /// only the shim delivered, and losing leadership makes it unusable (docs/WRAP.md).
    pub(crate) delivered: AtomicBool,
    /// Whether output is checked.
    pub(crate) output_check: OutputCheck,
    /// The leader's output buckets waiting for their `Check` entry.
    pub(crate) reported: Reported,
}

impl Shared {
    pub(crate) fn new(node: Node, copy: Arc<CurrentCopy>, progress: Arc<Progress>, output_check: OutputCheck) -> Self {
        Self {
            node,
            copy,
            progress,
            role: AtomicU8::new(Role::Following as u8),
            delivered: AtomicBool::new(false),
            output_check,
            reported: Reported::default(),
        }
    }

    pub(crate) fn role(&self) -> Role {
        match self.role.load(Ordering::Acquire) {
            2 => Role::Serving,
            1 => Role::Promoting,
            _ => Role::Following,
        }
    }

    pub(crate) fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Release);
    }

    /// Proposes an entry, retrying while the queue is full; the committed reply.
    pub(crate) fn propose(&self, tag: Tag, conn: u64, data: &[u8]) -> Result<Vec<u8>, ProposeError> {
        self.propose_encoded(&entry::encode(tag, self.copy.get(), conn, data))
    }

    fn propose_encoded(&self, command: &[u8]) -> Result<Vec<u8>, ProposeError> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.node.propose(command) {
                Ok(committed) => return Ok(committed.reply),
                Err(ProposeError::Backlogged) if Instant::now() < deadline => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
    }
}

/// Accepts the server's shim connections (one per server process) until `stop`.
pub(crate) fn serve(listener: &UnixListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let shared = Arc::clone(shared);
                std::thread::spawn(move || {
                    if let Err(e) = handle_connection(stream, &shared) {
                        tracing::debug!("shim connection ended: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::error!("accepting the shim's connection: {e}");
                return;
            }
        }
    }
}

fn handle_connection(mut stream: UnixStream, shared: &Shared) -> std::io::Result<()> {
    let mut header = [0u8; HEADER_BYTES];
    let mut data = vec![0u8; MAX_DATA];
    loop {
        stream.read_exact(&mut header)?;
        let request = Request::decode(&header)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        let payload = match request.kind {
            Kind::Data => {
                let bytes = data.get_mut(..request.len as usize).unwrap_or_default();
                stream.read_exact(bytes)?;
                &*bytes
            }
            Kind::Output => {
                let bytes = data.get_mut(..request.len as usize).unwrap_or_default();
                stream.read_exact(bytes)?;
                &*bytes
            }
            Kind::Accept | Kind::Close => &[],
        };
        let reply = answer(shared, request, payload);
        stream.write_all(&reply.encode())?;
    }
}

const REFUSED: Reply = Reply { status: Status::Refused, value: 0 };

/// A serving leader's copy completed an output bucket on connection `conn`: every
/// [`output::CHECK_EVERY`] buckets, and at the connection's last, they go into the log for the
/// followers to compare (docs/WRAP.md, "Output checking").
fn report_output(shared: &Shared, conn: u64, payload: &[u8]) {
    if shared.output_check == OutputCheck::Off || shared.role() != Role::Serving {
        return;
    }
    let Some(bucket) = payload.try_into().ok().map(OutputBucket::decode) else { return };
    if let Some(due) = shared.reported.add(conn, bucket) {
        propose_check(shared, conn, &due);
    }
}

fn propose_check(shared: &Shared, conn: u64, buckets: &[OutputBucket]) {
    if let Err(e) = shared.propose(Tag::Check, conn, &output::encode(buckets)) {
        tracing::debug!("output check of connection {conn} not committed: {e}");
    }
}

fn answer(shared: &Shared, request: Request, payload: &[u8]) -> Reply {
    if request.kind == Kind::Accept
        && request.len == 1
        && u16::try_from(request.value).is_ok_and(|port| shared.progress.accepting_agent_port(port))
    {
        return Reply { status: Status::Replay, value: 0 };
    }
    if request.kind == Kind::Output {
        report_output(shared, request.value, payload);
        return Reply { status: Status::Committed, value: 0 };
    }
    if shared.role() != Role::Serving {
        return REFUSED;
    }
    shared.delivered.store(true, Ordering::Release);
    if request.kind == Kind::Close && shared.output_check != OutputCheck::Off {
        // The buckets still waiting go into the log before the close, while followers still
        // hold the connection to compare them.
        if let Some(waiting) = shared.reported.take(request.value) {
            propose_check(shared, request.value, &waiting);
        }
    }
    let (tag, conn) = match request.kind {
        Kind::Accept => (Tag::Accept, 0),
        Kind::Data => (Tag::Data, request.value),
        Kind::Close => (Tag::Close, request.value),
        Kind::Output => return REFUSED,
    };
    // Input is given a time, which every copy's server reads while it processes it.
    let time_ns = (tag == Tag::Data).then(|| shared.copy.input_clock.next(input_clock::wall_clock_ns()));
    let proposed = match time_ns {
        Some(time_ns) => shared.propose_encoded(&entry::encode_data(shared.copy.get(), conn, time_ns, payload)),
        None => shared.propose(tag, conn, payload),
    };
    match proposed {
        Ok(reply) if Verdict::of_reply(&reply) == Verdict::InOrder => {
            let mut clients = shared.progress.clients.lock().unwrap_or_else(PoisonError::into_inner);
            let value = match tag {
                Tag::Accept => {
                    let id = reply.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
                    // The client's port (loopback or not: a port alone names it here).
                    clients.insert(request.value as u16, id);
                    id
                }
                Tag::Close => {
                    clients.retain(|_, &mut id| id != conn);
                    0
                }
                Tag::Data => time_ns.unwrap_or(0),
                Tag::Barrier | Tag::Check => 0,
            };
            Reply { status: Status::Committed, value }
        }
        Ok(_) => {
            tracing::warn!(
                "{:?} on connection {conn} committed after entries this copy did not see (another leader's): \
                 not delivered, and the copy is rebuilt",
                request.kind
            );
            shared.copy.diverge();
            REFUSED
        }
        Err(e) => {
            tracing::warn!("{:?} on connection {conn} not committed: {e}", request.kind);
            if e.outcome_unknown() {
                shared.copy.diverge();
            }
            REFUSED
        }
    }
}
