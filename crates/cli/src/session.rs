//! A client session against a cluster of KV replicas: finds the leader by following
//! `NOTLEADER` redirects, moves on when a replica dies, and reports commands whose outcome is
//! unknown instead of retrying them (a retry could apply them twice).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use microrep_kv::client::{Client, Value};

/// How a command ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The leader answered (possibly with an application error such as a non-integer INCR).
    Reply(Value),
    /// Leadership changed while it replicated: it may or may not have been applied.
    Unknown,
}

/// A session over the members' client addresses.
#[derive(Debug)]
pub(crate) struct Session {
    members: Vec<SocketAddr>,
    at: usize,
    client: Option<Client>,
    timeout: Duration,
    /// Redirects followed and reconnections made (fail-overs seen by this client).
    pub(crate) moves: u64,
}

impl Session {
    pub(crate) fn new(members: Vec<SocketAddr>, timeout: Duration) -> Self {
        Self { members, at: 0, client: None, timeout, moves: 0 }
    }

    /// The member the session talks to.
    pub(crate) fn current(&self) -> usize {
        self.at
    }

    fn move_to(&mut self, member: usize) {
        self.client = None;
        self.at = member % self.members.len();
        self.moves += 1;
    }

    /// Runs `args` on the leader, waiting for one up to the session timeout.
    pub(crate) fn call(&mut self, args: &[&[u8]]) -> Result<Outcome, String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if Instant::now() > deadline {
                return Err(format!("no leader answered within {:?}", self.timeout));
            }
            let client = match &mut self.client {
                Some(c) => c,
                None => match Client::connect(self.members[self.at], Duration::from_secs(2)) {
                    Ok(c) => self.client.insert(c),
                    Err(_) => {
                        self.move_to(self.at + 1);
                        std::thread::yield_now();
                        continue;
                    }
                },
            };
            match client.call(args) {
                Ok(Value::Error(e)) if e.starts_with("NOTLEADER ") => {
                    let leader = e.split_whitespace().nth(1).and_then(|id| id.parse::<usize>().ok());
                    self.move_to(leader.unwrap_or(self.at + 1));
                }
                Ok(Value::Error(e)) if e.starts_with("NOLEADER") || e.starts_with("TRYAGAIN") => {
                    std::thread::yield_now();
                }
                Ok(Value::Error(e)) if e.starts_with("UNKNOWN") => return Ok(Outcome::Unknown),
                Ok(value) => return Ok(Outcome::Reply(value)),
                // The replica died mid-call: the command may have been applied.
                Err(_) => {
                    self.move_to(self.at + 1);
                    return Ok(Outcome::Unknown);
                }
            }
        }
    }
}
