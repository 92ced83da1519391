//! One client's view of a cluster, with the one redirect rule set of the workspace: a
//! connection to the member it believes leads, moved along `-NOTLEADER` redirects, and every
//! command classified as done, certainly not done, or unknown ([`crate::reply`] tells which
//! reply means what). Used by `microrep cluster up`'s load and by the fault harness.
//!
//! A command whose request may have reached a server is never sent again: a lost reply or an
//! `-UNKNOWN` ends it as [`Executed::Unknown`] (a retry could apply it twice). Refusals that
//! prove it did not execute (`-NOTLEADER`, `-NOLEADER`, `-TRYAGAIN`, a failed connect) are
//! retried, bounded by the deadline and by [`ATTEMPTS_MAX`] requests.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::client::{Client, RespError, Value};
use crate::reply::ErrorReply;

/// Most requests one command sends (redirects and retries included).
pub const ATTEMPTS_MAX: u32 = 256;
/// Longest wait for a TCP connection.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Pause before retrying when no leader is known, a leader is backlogged or no member
/// accepts connections, so a client does not spin during an election or a restart.
const RETRY_BACKOFF: Duration = Duration::from_millis(10);

/// What became of one command.
#[derive(Debug, PartialEq, Eq)]
pub enum Executed {
    /// The server executed it and replied (never an error reply).
    Done(Value),
    /// It certainly did not execute: refused (`-ERR`, or only redirects until the deadline) or
    /// never sent. Carries the last reason.
    Failed(String),
    /// It may or may not have executed: a request was sent and no reply came back, or the
    /// server said `-UNKNOWN`.
    Unknown(String),
}

/// Why a connection to a member could not be had (the command was never sent).
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("connecting to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("{addr}: PING replied {reply:?}")]
    Ping { addr: SocketAddr, reply: Value },
    #[error("{addr} refused the connection: {source}")]
    Refused { addr: SocketAddr, source: RespError },
}

/// A client connection that follows the leader.
#[derive(Debug)]
pub struct Session {
    members: Vec<SocketAddr>,
    target: SocketAddr,
    client: Option<Client>,
    moves: u64,
    confirm: bool,
    /// The member a connection last failed to, until one to it succeeds: a redirect to it is stale
    /// (the redirecting member has not noticed yet that it is down), so it is waited out like
    /// `-NOLEADER` rather than followed at once, back and forth.
    unreachable: Option<SocketAddr>,
}

impl Session {
    /// A session over the members' client addresses that first tries `members[first % len]`.
    /// Panics if `members` is empty.
    pub fn new(members: Vec<SocketAddr>, first: usize) -> Self {
        assert!(!members.is_empty(), "a session needs at least one member");
        let target = members[first % members.len()];
        Self { members, target, client: None, moves: 0, confirm: false, unreachable: None }
    }

    /// Confirms every new connection with a `PING` before a command is sent on it, for servers
    /// whose followers refuse a client by closing its connection (`microrep wrap`): a
    /// connection closed, or not answered within the connect timeout, before the `PING`'s
    /// reply is then a refusal (the command was never sent, so it is retried elsewhere), not a
    /// lost reply (unknown).
    pub fn confirming_connections(mut self) -> Self {
        self.confirm = true;
        self
    }

    /// The index in `members` of the member the session talks to.
    pub fn current(&self) -> usize {
        self.members.iter().position(|a| *a == self.target).unwrap_or(0)
    }

    /// Redirects followed and members given up on (fail-overs seen by this client).
    pub fn moves(&self) -> u64 {
        self.moves
    }

    fn next_member(&mut self) {
        self.go_to(self.members[(self.current() + 1) % self.members.len()]);
    }

    fn go_to(&mut self, addr: SocketAddr) {
        self.client = None;
        self.target = addr;
        self.moves += 1;
    }

    /// A new connection to the current member, confirmed if the session confirms connections.
    fn connect(&self, timeout: Duration) -> Result<Client, ConnectError> {
        let addr = self.target;
        let mut client = Client::connect(addr, timeout).map_err(|source| ConnectError::Connect { addr, source })?;
        if self.confirm {
            let ping = client.set_timeout(timeout).map_err(Into::into).and_then(|()| client.call(&[b"PING"]));
            match ping {
                Ok(Value::Simple(pong)) if pong == "PONG" => {}
                Ok(reply) => return Err(ConnectError::Ping { addr, reply }),
                Err(source) => return Err(ConnectError::Refused { addr, source }),
            }
        }
        Ok(client)
    }

    /// Sends one command, following redirects, until it is done, certainly refused, unknown,
    /// or `deadline` passes.
    pub fn execute(&mut self, args: &[&[u8]], deadline: Instant) -> Executed {
        let mut last_refusal = String::from("deadline passed before any request");
        for _ in 0..ATTEMPTS_MAX {
            let Some(remaining) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                break;
            };
            let mut client = match self.client.take() {
                Some(client) => client,
                None => match self.connect(remaining.min(CONNECT_TIMEOUT)) {
                    Ok(client) => {
                        self.unreachable = self.unreachable.filter(|&a| a != self.target);
                        client
                    }
                    Err(e) => {
                        last_refusal = e.to_string();
                        self.unreachable = Some(self.target);
                        self.next_member();
                        if self.current() == 0 {
                            std::thread::sleep(RETRY_BACKOFF.min(remaining));
                        }
                        continue;
                    }
                },
            };
            // From here on the request may reach the server: a lost reply makes it unknown. The
            // next command tries another member: this one may be dead, paused or deposed.
            let reply = client.set_timeout(remaining).map_err(Into::into).and_then(|()| client.call(args));
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    self.next_member();
                    return Executed::Unknown(format!("{}: {e}", client.addr()));
                }
            };
            self.client = Some(client);
            let Value::Error(text) = reply else {
                return Executed::Done(reply);
            };
            match ErrorReply::parse(&text) {
                ErrorReply::NotLeader { addr: Some(leader), .. }
                    if leader != self.target && Some(leader) != self.unreachable =>
                {
                    self.go_to(leader);
                }
                ErrorReply::NotLeader { .. } | ErrorReply::NoLeader => {
                    self.next_member();
                    std::thread::sleep(RETRY_BACKOFF.min(remaining));
                }
                ErrorReply::TryAgain => std::thread::sleep(RETRY_BACKOFF.min(remaining)),
                ErrorReply::Unknown(_) => return Executed::Unknown(text),
                ErrorReply::Other(_) => return Executed::Failed(text),
            }
            last_refusal = text;
        }
        Executed::Failed(last_refusal)
    }

    /// Runs one command exactly once through the client session `id` (see
    /// [`crate::sessions`]), as its command number `seq` (1, 2, ... per `id`): wrapped in
    /// `MICROREP.SESSION`, it is sent again after an unknown outcome, since the server applies
    /// it at most once and answers a retry with the first reply. `Unknown` only if `deadline`
    /// passes first.
    pub fn execute_once(&mut self, id: &[u8], seq: u64, args: &[&[u8]], deadline: Instant) -> Executed {
        let seq = seq.to_string();
        let wrapped: Vec<&[u8]> =
            [b"MICROREP.SESSION".as_slice(), id, seq.as_bytes()].into_iter().chain(args.iter().copied()).collect();
        loop {
            match self.execute(&wrapped, deadline) {
                Executed::Unknown(why) if Instant::now() < deadline => {
                    tracing::debug!(why, "retrying a session command whose outcome is unknown");
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// A member that accepts connections and closes them unread, as a wrapped follower does.
    fn closing_member() -> (SocketAddr, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serve = std::thread::spawn(move || {
            for _ in 0..2 {
                drop(listener.accept().expect("accept"));
            }
        });
        (addr, serve)
    }

    /// A member answering `+PONG` to a PING and `:1` to anything else, on one connection,
    /// returning the commands' names it saw.
    fn serving_member() -> (SocketAddr, std::thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serve = std::thread::spawn(move || {
            let (conn, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut seen = Vec::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                let args: usize = line.trim_end().trim_start_matches('*').parse().expect("array");
                let mut words = Vec::new();
                for _ in 0..args {
                    line.clear();
                    reader.read_line(&mut line).expect("length");
                    let len: usize = line.trim_end().trim_start_matches('$').parse().expect("bulk");
                    let mut word = vec![0; len + 2];
                    reader.read_exact(&mut word).expect("word");
                    words.push(String::from_utf8_lossy(&word[..len]).into_owned());
                }
                let reply: &[u8] = if words[0] == "PING" { b"+PONG\r\n" } else { b":1\r\n" };
                (&conn).write_all(reply).expect("reply");
                seen.push(words[0].clone());
                line.clear();
            }
            seen
        });
        (addr, serve)
    }

    #[test]
    fn a_confirmed_connection_tells_a_refusal_from_a_lost_reply() {
        let deadline = || Instant::now() + Duration::from_secs(10);
        let (closing, closer) = closing_member();
        let (serving, server) = serving_member();
        let mut session = Session::new(vec![closing, serving], 0).confirming_connections();
        assert_eq!(session.execute(&[b"INCR", b"c"], deadline()), Executed::Done(Value::Integer(1)));
        assert_eq!(session.current(), 1, "moved on from the member that closed the connection");
        assert_eq!(session.execute(&[b"INCR", b"c"], deadline()), Executed::Done(Value::Integer(1)));
        drop(session);
        assert_eq!(server.join().expect("server"), ["PING", "INCR", "INCR"], "one PING per connection");
        let mut plain = Session::new(vec![closing, serving], 0);
        let executed = plain.execute(&[b"INCR", b"c"], deadline());
        assert!(
            matches!(executed, Executed::Unknown(_)),
            "without confirmation a closed connection is unknown: {executed:?}"
        );
        closer.join().expect("closer");
    }
}
