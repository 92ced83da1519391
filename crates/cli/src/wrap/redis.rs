//! The state-transfer hook for Redis: a copy's state is its RDB file, written by `SAVE` at a
//! cut in the log and loaded by a restarted server at start; a connection open at the cut is
//! re-established on the restarted copy with its database (`SELECT`), name and protocol
//! version, read from `CLIENT LIST`. A cut with a connection inside `MULTI` or blocked (its
//! queued commands or pending pop live only in that server) is not taken: the donor waits
//! for a clean one. Per-connection state that `CLIENT LIST` does not show (`WATCH`,
//! subscriptions, `CLIENT TRACKING`, `CLIENT REPLY`) is not carried over (docs/WRAP.md).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// A connection open at a cut, and what a fresh server needs to continue it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) conn: u64,
    pub(crate) db: u32,
    pub(crate) resp: u8,
    pub(crate) name: String,
}

/// A RESP reply, as far as the hook reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

/// Why a reply could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplyError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a reply line is not UTF-8")]
    NotUtf8,
    #[error("the server closed the connection")]
    Closed,
    #[error("bad reply line {line:?}: {source}")]
    BadNumber { line: String, source: std::num::ParseIntError },
    /// A line of an unknown kind, or arrays nested too deep.
    #[error("unexpected reply line {0:?}")]
    Unexpected(String),
}

/// Why a command of the hook failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedisError {
    #[error("sending to the server: {0}")]
    Send(std::io::Error),
    #[error("reading the server's reply: {0}")]
    Reply(#[from] ReplyError),
    /// The server answered an error reply to `command`.
    #[error("{command}: {message}")]
    Refused { command: String, message: String },
    #[error("unexpected reply {0:?}")]
    Unexpected(Value),
    /// A configuration value came as an array whose second item is not a bulk string.
    #[error("unexpected reply {0:?}")]
    UnexpectedItems(Vec<Value>),
    /// `CLIENT LIST` and `SAVE` sent together did not give a list and a simple string.
    #[error("unexpected replies ({0:?}, {1:?})")]
    UnexpectedReplies(Value, Value),
    #[error("state transfer needs appendonly no (a restarted server would load its AOF)")]
    AppendOnly,
}

/// A client of a serving leader's server that the log does not know: a peer given this
/// server's state would drop its input while this server executes it.
#[derive(Debug, thiserror::Error)]
#[error("client port {port} is on the server but not in the log")]
pub(crate) struct UnknownClient {
    pub(crate) port: u16,
}

/// Reads one reply (nested at most 8 deep).
fn read_value(r: &mut impl BufRead, depth: u32) -> Result<Value, ReplyError> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    let text = std::str::from_utf8(&line).map_err(|_| ReplyError::NotUtf8)?.trim_end();
    let (kind, rest) = text.split_at_checked(1).ok_or(ReplyError::Closed)?;
    let number = || rest.parse::<i64>().map_err(|source| ReplyError::BadNumber { line: text.into(), source });
    match kind {
        "+" => Ok(Value::Simple(rest.into())),
        "-" => Ok(Value::Error(rest.into())),
        ":" => number().map(Value::Integer),
        "$" => match usize::try_from(number()?) {
            Err(_) => Ok(Value::Bulk(None)),
            Ok(len) => {
                let mut bytes = vec![0u8; len + 2];
                r.read_exact(&mut bytes)?;
                bytes.truncate(len);
                Ok(Value::Bulk(Some(bytes)))
            }
        },
        "*" if depth < 8 => match usize::try_from(number()?) {
            Err(_) => Ok(Value::Array(None)),
            Ok(n) => (0..n).map(|_| read_value(r, depth + 1)).collect::<Result<_, _>>().map(|v| Value::Array(Some(v))),
        },
        _ => Err(ReplyError::Unexpected(text.into())),
    }
}

/// A blocking connection of the replay agent to its own server (the shim lets it through as
/// one of the agent's), for the hook's commands.
pub(crate) struct Admin {
    reader: BufReader<TcpStream>,
}

/// Encodes a command as a RESP array of bulk strings.
pub(crate) fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

impl Admin {
    pub(crate) fn new(stream: TcpStream) -> std::io::Result<Self> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        Ok(Self { reader: BufReader::new(stream) })
    }

    /// Whether the server has loaded its data (`DBSIZE` is refused with `-LOADING` before).
    pub(crate) fn loaded(&mut self, sent: &mut u64) -> Result<(), RedisError> {
        self.call(&[b"DBSIZE"], sent).map(drop)
    }

    /// Sends one command and reads its reply, adding the bytes sent to `sent` (the server
    /// reads them as replayed input, which the agent counts).
    fn call(&mut self, args: &[&[u8]], sent: &mut u64) -> Result<Value, RedisError> {
        let bytes = command(args);
        self.reader.get_mut().write_all(&bytes).map_err(RedisError::Send)?;
        *sent += bytes.len() as u64;
        match read_value(&mut self.reader, 0)? {
            Value::Error(message) => {
                let command = String::from_utf8_lossy(args.first().copied().unwrap_or_default()).into_owned();
                Err(RedisError::Refused { command, message })
            }
            reply => Ok(reply),
        }
    }

    fn text(&mut self, args: &[&[u8]], sent: &mut u64) -> Result<String, RedisError> {
        match self.call(args, sent)? {
            Value::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Value::Simple(s) => Ok(s),
            Value::Array(Some(items)) => match items.get(1) {
                Some(Value::Bulk(Some(b))) => Ok(String::from_utf8_lossy(b).into_owned()),
                _ => Err(RedisError::UnexpectedItems(items)),
            },
            other => Err(RedisError::Unexpected(other)),
        }
    }

    /// Where the server writes and reads its RDB file. A server with `appendonly yes` loads
    /// its AOF at start, not the RDB: refused.
    pub(crate) fn state_file(&mut self, sent: &mut u64) -> Result<PathBuf, RedisError> {
        if self.text(&[b"CONFIG", b"GET", b"appendonly"], sent)? == "yes" {
            return Err(RedisError::AppendOnly);
        }
        let dir = self.text(&[b"CONFIG", b"GET", b"dir"], sent)?;
        let file = self.text(&[b"CONFIG", b"GET", b"dbfilename"], sent)?;
        Ok(PathBuf::from(dir).join(file))
    }

    /// The sessions of the agent's connections (`ports`: local port → connection id), or
    /// `None` if one is inside `MULTI` or blocked.
    pub(crate) fn sessions(
        &mut self,
        ports: &HashMap<u16, u64>,
        sent: &mut u64,
    ) -> Result<Option<Vec<Session>>, RedisError> {
        let list = self.text(&[b"CLIENT", b"LIST"], sent)?;
        Ok(parse_sessions(&list, ports))
    }

    /// `CLIENT LIST` and `SAVE`, written in one piece so that the server reads both at once and
    /// runs them back to back, with no other client's input between them: the list and the
    /// saved state are of one moment. Returns the list.
    pub(crate) fn list_and_save(&mut self, sent: &mut u64) -> Result<String, RedisError> {
        let mut bytes = command(&[b"CLIENT", b"LIST"]);
        bytes.extend(command(&[b"SAVE"]));
        self.reader.get_mut().write_all(&bytes).map_err(RedisError::Send)?;
        *sent += bytes.len() as u64;
        let list = read_value(&mut self.reader, 0)?;
        let saved = read_value(&mut self.reader, 0)?;
        let refused = |command: &str, message| RedisError::Refused { command: command.into(), message };
        match (list, saved) {
            (Value::Bulk(Some(list)), Value::Simple(_)) => Ok(String::from_utf8_lossy(&list).into_owned()),
            (Value::Error(e), _) => Err(refused("CLIENT LIST", e)),
            (_, Value::Error(e)) => Err(refused("SAVE", e)),
            (list, saved) => Err(RedisError::UnexpectedReplies(list, saved)),
        }
    }

    /// Writes the RDB file (`SAVE`); returns its path.
    pub(crate) fn save(&mut self, sent: &mut u64) -> Result<PathBuf, RedisError> {
        let file = self.state_file(sent)?;
        self.call(&[b"SAVE"], sent)?;
        Ok(file)
    }
}

/// One connection of a `CLIENT LIST`.
struct Listed<'a>(HashMap<&'a str, &'a str>);

impl<'a> Listed<'a> {
    fn parse(line: &'a str) -> Self {
        Self(line.split(' ').filter_map(|f| f.split_once('=')).collect())
    }

    /// The port of an address field (`addr`: the client's, `laddr`: the server's).
    fn port(&self, field: &str) -> Option<u16> {
        self.0.get(field).and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok())
    }

    fn flags(&self) -> &str {
        self.0.get("flags").copied().unwrap_or_default()
    }

    /// Closed or being closed by the server: the input that follows for it is dropped, as that
    /// server did.
    fn closing(&self) -> bool {
        self.flags().contains('c') || self.flags().contains('A')
    }

    /// Inside `MULTI`, blocked, or holding part of a command: state that lives only in that
    /// server, so no cut is taken here.
    fn busy(&self) -> bool {
        let number = |key: &str| self.0.get(key).and_then(|v| v.parse::<i64>().ok());
        self.flags().contains('x')
            || self.flags().contains('b')
            || number("multi").is_some_and(|m| m != -1)
            || number("qbuf").is_some_and(|q| q > 0)
    }

    fn session(&self, conn: u64) -> Session {
        let number = |key: &str| self.0.get(key).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
        let name = self.0.get("name").copied().unwrap_or_default().to_string();
        Session { conn, db: number("db"), resp: number("resp").clamp(2, 3) as u8, name }
    }
}

/// Reads a follower's `CLIENT LIST`: the sessions of the connections in `ports` (local port →
/// connection id), or `None` if one is busy (see [`Listed::busy`]).
fn parse_sessions(list: &str, ports: &HashMap<u16, u64>) -> Option<Vec<Session>> {
    let mut sessions = Vec::new();
    for listed in list.lines().map(Listed::parse) {
        let Some(&conn) = listed.port("addr").and_then(|p| ports.get(&p)) else { continue };
        if listed.closing() {
            continue;
        }
        if listed.busy() {
            return None;
        }
        sessions.push(listed.session(conn));
    }
    Some(sessions)
}

/// Reads a serving leader's `CLIENT LIST`: the sessions of its clients on the server's `port`
/// (`clients`: the client's port → connection id; the agent's own connections, `agent`, are
/// left out), `None` if one is busy. A client the log does not know is an error.
pub(crate) fn parse_leader_sessions(
    list: &str,
    port: u16,
    clients: &HashMap<u16, u64>,
    agent: &HashMap<u16, u64>,
) -> Result<Option<Vec<Session>>, UnknownClient> {
    let mut sessions = Vec::new();
    for listed in list.lines().map(Listed::parse).filter(|l| l.port("laddr") == Some(port)) {
        let Some(client) = listed.port("addr") else { continue };
        if agent.contains_key(&client) || listed.closing() {
            continue;
        }
        let Some(&conn) = clients.get(&client) else {
            return Err(UnknownClient { port: client });
        };
        if listed.busy() {
            return Ok(None);
        }
        sessions.push(listed.session(conn));
    }
    Ok(Some(sessions))
}

/// The input that puts a fresh connection in `session`'s state; its replies are discarded.
pub(crate) fn reestablish(session: &Session) -> Vec<u8> {
    let mut out = Vec::new();
    if session.db != 0 {
        out.extend(command(&[b"SELECT", session.db.to_string().as_bytes()]));
    }
    if !session.name.is_empty() {
        out.extend(command(&[b"CLIENT", b"SETNAME", session.name.as_bytes()]));
    }
    if session.resp == 3 {
        out.extend(command(&[b"HELLO", b"3"]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read() {
        let mut r: &[u8] = b"+OK\r\n-ERR no\r\n:5\r\n$3\r\nabc\r\n$-1\r\n*2\r\n$3\r\ndir\r\n$4\r\n/tmp\r\n";
        let bulk = |s: &str| Value::Bulk(Some(s.as_bytes().to_vec()));
        let want = [
            Value::Simple("OK".into()),
            Value::Error("ERR no".into()),
            Value::Integer(5),
            bulk("abc"),
            Value::Bulk(None),
        ];
        for w in want {
            assert_eq!(read_value(&mut r, 0).ok(), Some(w));
        }
        assert_eq!(read_value(&mut r, 0).ok(), Some(Value::Array(Some(vec![bulk("dir"), bulk("/tmp")]))));
        assert!(matches!(read_value(&mut r, 0), Err(ReplyError::Closed)), "end of input");
        let mut bad: &[u8] = b":x\r\n?\r\n";
        let e = read_value(&mut bad, 0).expect_err("not a number");
        assert_eq!(e.to_string(), r#"bad reply line ":x": invalid digit found in string"#);
        assert_eq!(read_value(&mut bad, 0).expect_err("unknown kind").to_string(), r#"unexpected reply line "?""#);
    }

    #[test]
    fn commands_are_resp_arrays() {
        assert_eq!(command(&[b"SELECT", b"3"]), b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n");
    }

    #[test]
    fn client_list_gives_the_sessions_of_the_agents_connections() {
        let line = |port: u16, flags: &str, db: u32, multi: i32, name: &str| {
            format!(
                "id=7 addr=127.0.0.1:{port} laddr=127.0.0.1:6380 fd=9 name={name} age=1 idle=0 flags={flags} db={db} \
                 sub=0 psub=0 ssub=0 multi={multi} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=1024 rbp=0 obl=0 \
                 oll=0 omem=0 tot-mem=1 events=r cmd=get user=default redir=-1 resp=2\n"
            )
        };
        let ports: HashMap<u16, u64> = [(40001, 4096), (40002, 8192), (40003, 12288)].into_iter().collect();
        let list =
            [line(40001, "N", 2, -1, "w1"), line(40002, "c", 0, -1, ""), line(50000, "N", 5, -1, "admin")].concat();
        assert_eq!(
            parse_sessions(&list, &ports),
            Some(vec![Session { conn: 4096, db: 2, resp: 2, name: "w1".into() }]),
            "the closing connection and the one not the agent's are left out"
        );
        let in_multi = [line(40001, "x", 0, 2, ""), line(40003, "N", 0, -1, "")].concat();
        assert_eq!(parse_sessions(&in_multi, &ports), None);
        assert_eq!(parse_sessions(&line(40003, "b", 0, -1, ""), &ports), None, "blocked");
        let partial = line(40003, "N", 0, -1, "").replace("qbuf=0", "qbuf=12");
        assert_eq!(parse_sessions(&partial, &ports), None, "part of a command in the query buffer");
    }

    #[test]
    fn a_leaders_client_list_gives_its_clients_sessions_and_refuses_unknown_clients() {
        let line = |port: u16, laddr: &str, flags: &str| {
            format!("id=3 addr=127.0.0.1:{port} laddr={laddr} fd=8 name=c flags={flags} db=1 multi=-1 qbuf=0 resp=3\n")
        };
        let clients: HashMap<u16, u64> = [(51000, 4096), (51001, 8192)].into_iter().collect();
        let agent: HashMap<u16, u64> = [(52000, 0)].into_iter().collect();
        let list = [
            line(51000, "127.0.0.1:6380", "N"),
            line(51001, "127.0.0.1:6380", "c"),
            line(52000, "127.0.0.1:6380", "N"),
            line(0, "/tmp/admin.sock:0", "N"),
        ]
        .concat();
        let want = vec![Session { conn: 4096, db: 1, resp: 3, name: "c".into() }];
        assert_eq!(parse_leader_sessions(&list, 6380, &clients, &agent).ok(), Some(Some(want)));
        let stranger = line(53000, "127.0.0.1:6380", "N");
        let e = parse_leader_sessions(&stranger, 6380, &clients, &agent).expect_err("unknown client");
        assert_eq!(e.to_string(), "client port 53000 is on the server but not in the log");
        let blocked = line(51000, "127.0.0.1:6380", "b");
        assert_eq!(parse_leader_sessions(&blocked, 6380, &clients, &agent).ok(), Some(None));
    }

    #[test]
    fn sessions_restore_database_name_and_protocol() {
        let s = Session { conn: 1, db: 3, resp: 3, name: "worker".into() };
        let mut want = command(&[b"SELECT", b"3"]);
        want.extend(command(&[b"CLIENT", b"SETNAME", b"worker"]));
        want.extend(command(&[b"HELLO", b"3"]));
        assert_eq!(reestablish(&s), want);
        assert!(reestablish(&Session { conn: 2, db: 0, resp: 2, name: String::new() }).is_empty());
    }
}
