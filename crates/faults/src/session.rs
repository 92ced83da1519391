//! One client's view of the cluster: a connection to the node it believes leads, moved along
//! `-NOTLEADER` redirects, and the classification of every request into done, certainly not
//! done (`fail`) or unknown (`info`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};

/// Most requests one operation sends (redirects and retries included).
const ATTEMPTS_MAX: u32 = 32;
/// Longest wait for a TCP connection.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Pause before retrying when no leader is known, so a client does not spin during an election.
const NO_LEADER_BACKOFF: Duration = Duration::from_millis(10);

/// What became of one operation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Executed {
    /// The server executed it and replied (never an error reply).
    Done(Reply),
    /// It certainly did not execute: every request was refused (`-NOTLEADER`, `-NOLEADER`,
    /// another `-ERR`) or never reached a server. Carries the last reason.
    Failed(String),
    /// It may or may not have executed: a request was sent and no reply came back, or the server
    /// said `-UNKNOWN`.
    Unknown(String),
}

/// How the harness reads a RESP error reply (the lead's protocol: see docs/RELIABILITY.md).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ErrorReply {
    /// `-NOTLEADER <id> <host:port>`: not executed; the leader is believed to be there.
    NotLeader(Option<SocketAddr>),
    /// `-NOLEADER ...`: not executed; no leader is known.
    NoLeader,
    /// `-UNKNOWN ...`: the outcome is unknown.
    Unknown,
    /// Any other error: not executed.
    Rejected,
}

impl ErrorReply {
    pub(crate) fn classify(text: &str) -> Self {
        let mut words = text.split_whitespace();
        match words.next() {
            Some("NOTLEADER") => Self::NotLeader(words.nth(1).and_then(|a| a.parse().ok())),
            Some("NOLEADER") => Self::NoLeader,
            Some("UNKNOWN") => Self::Unknown,
            _ => Self::Rejected,
        }
    }
}

/// A client connection that follows the leader.
#[derive(Debug)]
pub(crate) struct Session {
    nodes: Vec<SocketAddr>,
    target: SocketAddr,
    conn: Option<Conn>,
}

impl Session {
    /// A session that first tries `nodes[first % nodes.len()]`.
    pub(crate) fn new(nodes: Vec<SocketAddr>, first: usize) -> Self {
        let target = nodes[first % nodes.len()];
        Self { nodes, target, conn: None }
    }

    fn next_node(&mut self) {
        let i = self.nodes.iter().position(|a| *a == self.target).map_or(0, |i| i + 1);
        self.target = self.nodes[i % self.nodes.len()];
        self.conn = None;
    }

    fn go_to(&mut self, addr: SocketAddr) {
        if addr != self.target {
            self.target = addr;
            self.conn = None;
        }
    }

    /// Sends one command, following redirects, until it is done, certainly refused, or
    /// `deadline` passes.
    pub(crate) fn execute(&mut self, args: &[&[u8]], deadline: Instant) -> Executed {
        let mut last_refusal = String::from("deadline passed before any request");
        for _ in 0..ATTEMPTS_MAX {
            let Some(remaining) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                break;
            };
            let conn = match self.conn.take() {
                Some(conn) => conn,
                None => match Conn::connect(self.target, remaining.min(CONNECT_TIMEOUT)) {
                    Ok(conn) => conn,
                    Err(e) => {
                        last_refusal = format!("connecting to {}: {e}", self.target);
                        self.next_node();
                        continue;
                    }
                },
            };
            let mut conn = conn;
            // From here on the request may reach the server: a lost reply makes it unknown. The
            // next operation tries another node: this one may be dead, paused or deposed.
            if let Err(e) = conn.set_timeout(remaining).and_then(|()| conn.send(args)) {
                self.next_node();
                return Executed::Unknown(format!("sending to {}: {e}", conn.addr()));
            }
            let reply = match conn.recv() {
                Ok(reply) => reply,
                Err(e) => {
                    self.next_node();
                    return Executed::Unknown(format!("reply from {}: {e}", conn.addr()));
                }
            };
            self.conn = Some(conn);
            let Reply::Error(text) = reply else {
                return Executed::Done(reply);
            };
            match ErrorReply::classify(&text) {
                ErrorReply::NotLeader(Some(leader)) if leader != self.target => self.go_to(leader),
                ErrorReply::NotLeader(_) | ErrorReply::NoLeader => {
                    self.next_node();
                    std::thread::sleep(NO_LEADER_BACKOFF.min(remaining));
                }
                ErrorReply::Unknown => return Executed::Unknown(text),
                ErrorReply::Rejected => return Executed::Failed(text),
            }
            last_refusal = text;
        }
        Executed::Failed(last_refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_error_replies() {
        let addr: SocketAddr = "127.0.0.1:7001".parse().expect("an address");
        assert_eq!(ErrorReply::classify("NOTLEADER 1 127.0.0.1:7001"), ErrorReply::NotLeader(Some(addr)));
        assert_eq!(ErrorReply::classify("NOTLEADER 1"), ErrorReply::NotLeader(None));
        assert_eq!(ErrorReply::classify("NOLEADER election in progress"), ErrorReply::NoLeader);
        assert_eq!(ErrorReply::classify("UNKNOWN leadership lost"), ErrorReply::Unknown);
        assert_eq!(ErrorReply::classify("ERR wrong number of arguments"), ErrorReply::Rejected);
        assert_eq!(ErrorReply::classify(""), ErrorReply::Rejected);
    }
}
