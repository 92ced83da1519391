//! The RESP server's one thread: an event loop over every client connection (mio). Each turn
//! reads what every ready client sent, then proposes all of their replicated commands together,
//! as few log entries as fit (`turn`), before it waits for any reply, as Redis's single thread
//! serves many clients; then it writes each client's replies in request order.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token};

use crate::resp;
use crate::server::{Backend, Connection, MAX_CONNECTIONS, ServerContext};
use crate::turn::Turn;

const LISTENER: Token = Token(0);
/// The token of the waker that [`crate::KvNode`] uses to end a turn when it sets `stop`.
pub(crate) const WAKE: Token = Token(usize::MAX);
/// Most bytes read from one client in one turn: a client that sends without pause cannot
/// keep the others waiting (what it sent beyond is read next turn).
const READ_BUDGET: usize = 1 << 20;
/// A client whose unwritten replies exceed this is not read until they are written
/// (a client that pipelines without reading cannot make the server buffer without bound).
const OUTPUT_LIMIT: usize = 4 << 20;
/// How long a turn waits for events after an accept failed for want of resources (a full
/// descriptor table): the connections still waiting raise no new event, so they are tried
/// again after this. Otherwise an idle server waits for events without a timeout (`stop`
/// wakes it through [`WAKE`]) and costs nothing between requests.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// One client: its socket and its requests.
struct Client<'a> {
    stream: TcpStream,
    conn: Connection<'a>,
    /// Whether the socket is registered for writability (replies wait to be written).
    writing: bool,
    /// The client closed its end, asked to quit, or failed: close once the replies are out.
    closing: bool,
    /// Input may be waiting that this turn did not read (the read budget ran out).
    unread: bool,
    /// Not read until its replies are written (the output limit).
    paused: bool,
    /// The socket reported its read side closed, or an error: read until the end (or the
    /// error) rather than stopping at a short read.
    drain: bool,
}

impl Client<'_> {
    /// Reads what the client sent (up to the budget) and starts every whole request in it.
    fn read_and_start(&mut self, chunk: &mut [u8], turn: &mut Turn) {
        self.unread = false;
        if self.closing {
            return;
        }
        if self.conn.output.len() > OUTPUT_LIMIT {
            // Read again once a writable event let the replies out (`finish_and_write`).
            self.paused = true;
            return;
        }
        let mut read = 0;
        loop {
            if read >= READ_BUDGET {
                self.unread = true;
                break;
            }
            match self.stream.read(chunk) {
                Ok(0) => {
                    self.closing = true;
                    break;
                }
                Ok(n) => {
                    read += n;
                    self.conn.input.extend_from_slice(&chunk[..n]);
                    if n < chunk.len() && !self.drain {
                        // A short read took all the socket held: the registration is
                        // edge-triggered, so whatever arrives later raises a new event, and a
                        // read now would only return WouldBlock (one system call per request
                        // saved). An end that arrived with the data is flagged on this
                        // event (`drain`) and read to.
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!("reading from a client: {e}");
                    self.closing = true;
                    break;
                }
            }
        }
        if self.conn.handle_input(turn) {
            self.closing = true;
        }
    }

    /// Waits for this client's replies, writes what the socket takes, and registers for
    /// writability if some are left. Returns whether the client is done with.
    fn finish_and_write(&mut self, registry: &Registry, token: Token) -> bool {
        self.conn.finish_replies();
        while !self.conn.output.is_empty() {
            match self.stream.write(&self.conn.output) {
                Ok(0) => return true,
                Ok(n) => {
                    self.conn.output.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!("writing to a client: {e}");
                    return true;
                }
            }
        }
        if self.paused && self.conn.output.len() <= OUTPUT_LIMIT {
            self.paused = false;
            self.unread = true;
        }
        let pending = !self.conn.output.is_empty();
        if pending != self.writing {
            let interest = if pending { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            if registry.reregister(&mut self.stream, token, interest).is_err() {
                return true;
            }
            self.writing = pending;
        }
        self.closing && !pending
    }
}

/// Serves clients on `listener` until `ctx.stop` is set (and `poll`'s waker registered as
/// [`WAKE`] woken).
pub(crate) fn serve(listener: std::net::TcpListener, mut poll: Poll, ctx: ServerContext) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(listener);
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut clients: HashMap<Token, Client<'_>> = HashMap::new();
    let mut next_token = 1usize;
    let mut events = Events::with_capacity(1024);
    let mut chunk = vec![0u8; 64 << 10];
    let mut active: Vec<Token> = Vec::new();
    let mut turn = Turn::default();
    let mut accept_failed = false;
    while !ctx.stop.load(Ordering::Acquire) {
        // Clients with input left over from the last turn are served again without waiting.
        active.clear();
        active.extend(clients.iter().filter(|(_, c)| c.unread).map(|(&t, _)| t));
        let timeout = match (active.is_empty(), accept_failed) {
            (false, _) => Some(Duration::ZERO),
            (true, true) => Some(ACCEPT_RETRY),
            (true, false) => None,
        };
        match poll.poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if accept_failed || events.iter().any(|e| e.token() == LISTENER) {
            accept_failed = !accept_all(&listener, poll.registry(), &ctx, &mut clients, &mut next_token);
        }
        for event in events.iter().filter(|e| e.token() != LISTENER && e.token() != WAKE) {
            active.push(event.token());
            if (event.is_read_closed() || event.is_error())
                && let Some(client) = clients.get_mut(&event.token())
            {
                client.drain = true;
            }
        }
        active.sort_unstable();
        active.dedup();
        // Every request of this turn is started before any reply is waited for.
        for token in &active {
            if let Some(client) = clients.get_mut(token) {
                client.read_and_start(&mut chunk, &mut turn);
            }
        }
        if let Backend::Replicated(node) = &ctx.backend {
            turn.propose(node);
        }
        for &token in &active {
            let done = clients.get_mut(&token).is_none_or(|c| c.finish_and_write(poll.registry(), token));
            if done && let Some(mut client) = clients.remove(&token) {
                let _ = poll.registry().deregister(&mut client.stream);
            }
        }
    }
    Ok(())
}

/// Accepts every waiting connection; beyond [`MAX_CONNECTIONS`] a client gets an error and
/// is closed. False if an accept failed with connections possibly still waiting.
fn accept_all<'a>(
    listener: &TcpListener,
    registry: &Registry,
    ctx: &'a ServerContext,
    clients: &mut HashMap<Token, Client<'a>>,
    next_token: &mut usize,
) -> bool {
    loop {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("accept: {e}");
                return false;
            }
        };
        if clients.len() >= MAX_CONNECTIONS {
            let mut out = Vec::new();
            resp::error(&mut out, "ERR max number of clients reached");
            let _ = stream.write(&out);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let token = Token(*next_token);
        *next_token += 1;
        if let Err(e) = registry.register(&mut stream, token, Interest::READABLE) {
            tracing::warn!("registering a client: {e}");
            continue;
        }
        let client = Client {
            stream,
            conn: Connection::new(ctx),
            writing: false,
            closing: false,
            unread: true,
            paused: false,
            drain: false,
        };
        clients.insert(token, client);
    }
}
