//! The error replies of the replication protocol, typed: the server produces its refusals
//! from [`ErrorReply`] and every client ([`crate::session`], `microrep-faults`) reads them back
//! with [`ErrorReply::parse`], so the text and its meaning are defined once.
//!
//! | reply | executed? | what a client does |
//! |---|---|---|
//! | `-NOTLEADER <id> <host:port>` | no | go to the named leader |
//! | `-NOLEADER <text>` | no | try the next member after a short pause (an election runs) |
//! | `-TRYAGAIN <text>` | no | retry the same member after a short pause (the leader's queue was full) |
//! | `-UNKNOWN <text>` | maybe | stop: report the outcome as unknown (a retry could apply it twice) |
//! | `-ERR <text>` and anything else | no | stop: the command was refused |

use std::fmt;
use std::net::SocketAddr;

/// An error reply of the KV server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorReply {
    /// Not the leader; the leader is believed to be replica `id` at `addr` (`None`: not parsed).
    NotLeader {
        /// The leader's replica id.
        id: Option<u16>,
        /// The leader's client address.
        addr: Option<SocketAddr>,
    },
    /// No leader is known (an election is running); not executed.
    NoLeader,
    /// The leader had too many commands waiting; not executed, retry later.
    TryAgain,
    /// Leadership changed while the command replicated: it may or may not have executed.
    Unknown(String),
    /// Any other error (`ERR ...`, application errors): not executed.
    Other(String),
}

impl ErrorReply {
    /// Reads an error reply's text (without the leading `-`).
    pub fn parse(text: &str) -> Self {
        let mut words = text.splitn(2, ' ');
        let rest = || text.split_once(' ').map_or("", |(_, r)| r).to_string();
        match words.next() {
            Some("NOTLEADER") => {
                let mut fields = text.split_whitespace().skip(1);
                let id = fields.next().and_then(|w| w.parse().ok());
                Self::NotLeader { id, addr: fields.next().and_then(|w| w.parse().ok()) }
            }
            Some("NOLEADER") => Self::NoLeader,
            Some("TRYAGAIN") => Self::TryAgain,
            Some("UNKNOWN") => Self::Unknown(rest()),
            _ => Self::Other(text.to_string()),
        }
    }

    /// Whether the command certainly did not execute.
    pub fn not_executed(&self) -> bool {
        !matches!(self, Self::Unknown(_))
    }
}

impl fmt::Display for ErrorReply {
    /// The reply's text as the server sends it (without the leading `-`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotLeader { id, addr } => {
                let id = id.map_or_else(|| "?".to_string(), |i| i.to_string());
                let addr = addr.map_or_else(|| "?".to_string(), |a| a.to_string());
                write!(f, "NOTLEADER {id} {addr}")
            }
            Self::NoLeader => f.write_str("NOLEADER no leader is elected yet; retry"),
            Self::TryAgain => f.write_str("TRYAGAIN too many commands are waiting; retry"),
            Self::Unknown(why) => write!(f, "UNKNOWN {why}"),
            Self::Other(text) => f.write_str(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reply_reads_back_as_itself() {
        let addr: SocketAddr = "127.0.0.1:7001".parse().expect("an address");
        for reply in [
            ErrorReply::NotLeader { id: Some(1), addr: Some(addr) },
            ErrorReply::NotLeader { id: None, addr: None },
            ErrorReply::NoLeader,
            ErrorReply::TryAgain,
            ErrorReply::Unknown("leadership lost".into()),
            ErrorReply::Other("ERR wrong number of arguments".into()),
        ] {
            assert_eq!(ErrorReply::parse(&reply.to_string()), reply);
        }
        assert_eq!(ErrorReply::parse("NOTLEADER 1"), ErrorReply::NotLeader { id: Some(1), addr: None });
        assert_eq!(ErrorReply::parse(""), ErrorReply::Other(String::new()));
        assert!(!ErrorReply::Unknown(String::new()).not_executed());
        assert!(ErrorReply::TryAgain.not_executed());
    }
}
