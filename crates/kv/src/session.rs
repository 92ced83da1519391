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

use crate::client::{Client, Value};
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

/// A client connection that follows the leader.
#[derive(Debug)]
pub struct Session {
    members: Vec<SocketAddr>,
    target: SocketAddr,
    client: Option<Client>,
    moves: u64,
}

impl Session {
    /// A session over the members' client addresses that first tries `members[first % len]`.
    /// Panics if `members` is empty.
    pub fn new(members: Vec<SocketAddr>, first: usize) -> Self {
        assert!(!members.is_empty(), "a session needs at least one member");
        let target = members[first % members.len()];
        Self { members, target, client: None, moves: 0 }
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
                None => match Client::connect(self.target, remaining.min(CONNECT_TIMEOUT)) {
                    Ok(client) => client,
                    Err(e) => {
                        last_refusal = format!("connecting to {}: {e}", self.target);
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
                ErrorReply::NotLeader { addr: Some(leader), .. } if leader != self.target => self.go_to(leader),
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
}
