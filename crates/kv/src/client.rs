//! The one blocking RESP2 client of the workspace: what `microrep cluster up`, `microrep
//! status`, the benchmarks, the fault harness and the tests use to talk to a server.
//!
//! Every reply is read with bounds (line length, bulk size, array length, nesting depth) and the
//! CRLF after a bulk string is checked, so a broken or hostile server gives a typed
//! [`RespError`], never a panic, an unbounded allocation or a desynchronised stream.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::reply::ErrorReply;

/// Longest bulk string accepted in a reply.
pub const BULK_BYTES_MAX: usize = 512 << 20;
/// Most elements accepted in one array reply.
pub const ARRAY_LEN_MAX: usize = 1 << 20;
/// Deepest nesting of arrays accepted.
pub const DEPTH_MAX: usize = 4;
/// Longest line (simple string, error, integer, length header) accepted.
pub const LINE_BYTES_MAX: usize = 64 << 10;

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+text`
    Simple(String),
    /// `-text`
    Error(String),
    /// `:n`
    Integer(i64),
    /// `$len` bytes, or `$-1`
    Bulk(Option<Vec<u8>>),
    /// `*n` values, or `*-1`
    Array(Option<Vec<Value>>),
}

impl Value {
    /// The error reply, typed, if this is one.
    pub fn error(&self) -> Option<ErrorReply> {
        match self {
            Self::Error(e) => Some(ErrorReply::parse(e)),
            _ => None,
        }
    }
}

/// Why a reply could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// The socket failed or timed out.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The server closed the connection.
    #[error("connection closed by the server")]
    Closed,
    /// The bytes are not RESP2 within the client's bounds.
    #[error("protocol: {0}")]
    Protocol(&'static str),
}

impl From<RespError> for io::Error {
    fn from(e: RespError) -> Self {
        match e {
            RespError::Io(e) => e,
            RespError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, e),
            RespError::Protocol(_) => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// One connection.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
    out: Vec<u8>,
}

impl Client {
    /// Connects to `addr` within `timeout`; every later read and write times out after
    /// `timeout` too (see [`Client::set_timeout`]).
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        let client = Self { reader: BufReader::new(stream), addr, out: Vec::new() };
        client.set_timeout(timeout)?;
        Ok(client)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bounds each later read and write by `timeout` (at least a millisecond).
    pub fn set_timeout(&self, timeout: Duration) -> io::Result<()> {
        let timeout = timeout.max(Duration::from_millis(1));
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        self.reader.get_ref().set_write_timeout(Some(timeout))
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Value, RespError> {
        self.send(args)?;
        self.flush()?;
        self.read()
    }

    /// Buffers one command, an array of bulk strings (pipelining: several `send`s, one
    /// `flush`, as many `read`s).
    pub fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        crate::resp::array(&mut self.out, args.len());
        for arg in args {
            crate::resp::bulk(&mut self.out, Some(arg));
        }
        Ok(())
    }

    /// Writes the buffered commands.
    pub fn flush(&mut self) -> io::Result<()> {
        let written = self.reader.get_mut().write_all(&self.out);
        self.out.clear();
        written
    }

    /// Reads one reply.
    pub fn read(&mut self) -> Result<Value, RespError> {
        read_value(&mut self.reader)
    }
}

/// Reads one reply from `r` within the client's bounds.
pub fn read_value(r: &mut impl BufRead) -> Result<Value, RespError> {
    read_nested(r, 0)
}

fn read_line(r: &mut impl BufRead) -> Result<String, RespError> {
    let mut line = Vec::new();
    let n = r.by_ref().take(LINE_BYTES_MAX as u64 + 2).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(RespError::Closed);
    }
    if !line.ends_with(b"\r\n") {
        return Err(if line.ends_with(b"\n") || n > LINE_BYTES_MAX {
            RespError::Protocol("line without CRLF, or too long")
        } else {
            RespError::Closed
        });
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| RespError::Protocol("line is not UTF-8"))
}

/// A length header: `-1` is `None`, anything else negative or above `max` an error.
fn parse_len(text: &str, max: usize) -> Result<Option<usize>, RespError> {
    match text.parse::<i64>().map_err(|_| RespError::Protocol("bad length"))? {
        -1 => Ok(None),
        n => match usize::try_from(n) {
            Ok(n) if n <= max => Ok(Some(n)),
            _ => Err(RespError::Protocol("length out of bounds")),
        },
    }
}

fn read_nested(r: &mut impl BufRead, depth: usize) -> Result<Value, RespError> {
    let line = read_line(r)?;
    let Some(kind) = line.chars().next() else {
        return Err(RespError::Protocol("empty line"));
    };
    let rest = &line[kind.len_utf8()..];
    match kind {
        '+' => Ok(Value::Simple(rest.to_string())),
        '-' => Ok(Value::Error(rest.to_string())),
        ':' => rest.parse().map(Value::Integer).map_err(|_| RespError::Protocol("bad integer")),
        '$' => {
            let Some(len) = parse_len(rest, BULK_BYTES_MAX)? else {
                return Ok(Value::Bulk(None));
            };
            let mut data = Vec::new();
            let got = r.by_ref().take(len as u64 + 2).read_to_end(&mut data)?;
            if got < len + 2 {
                return Err(RespError::Closed);
            }
            if !data.ends_with(b"\r\n") {
                return Err(RespError::Protocol("bulk string without CRLF"));
            }
            data.truncate(len);
            Ok(Value::Bulk(Some(data)))
        }
        '*' => {
            if depth >= DEPTH_MAX {
                return Err(RespError::Protocol("arrays nested too deep"));
            }
            let Some(len) = parse_len(rest, ARRAY_LEN_MAX)? else {
                return Ok(Value::Array(None));
            };
            let items = (0..len).map(|_| read_nested(r, depth + 1)).collect::<Result<_, _>>()?;
            Ok(Value::Array(Some(items)))
        }
        _ => Err(RespError::Protocol("unknown reply type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Value, RespError> {
        read_value(&mut BufReader::new(bytes))
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(parse(b"+OK\r\n").ok(), Some(Value::Simple("OK".into())));
        let redirect = parse(b"-NOTLEADER 1 127.0.0.1:7001\r\n").expect("an error reply");
        assert_eq!(redirect, Value::Error("NOTLEADER 1 127.0.0.1:7001".into()));
        let addr = "127.0.0.1:7001".parse().ok();
        assert_eq!(redirect.error(), Some(ErrorReply::NotLeader { id: Some(1), addr }));
        assert_eq!(parse(b":-42\r\n").ok(), Some(Value::Integer(-42)));
        assert_eq!(parse(b"$3\r\na\rb\r\n").ok(), Some(Value::Bulk(Some(b"a\rb".to_vec()))));
        assert_eq!(parse(b"$-1\r\n").ok(), Some(Value::Bulk(None)));
        assert_eq!(
            parse(b"*2\r\n:1\r\n$-1\r\n").ok(),
            Some(Value::Array(Some(vec![Value::Integer(1), Value::Bulk(None)])))
        );
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut client = Client::connect(addr, Duration::from_millis(50)).expect("connect");
        let _accepted = listener.accept().expect("accept");
        match client.call(&[b"GET", b"k"]) {
            Err(RespError::Io(e)) => {
                assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    /// The hardening the old kv client lacked: unbounded lines, unbounded nesting, and no check
    /// of the CRLF after a bulk string.
    #[test]
    fn rejects_malformed_replies() {
        let long_line = [b"+".as_slice(), &vec![b'a'; LINE_BYTES_MAX + 8], b"\r\n"].concat();
        for bad in [
            &b"?x\r\n"[..],
            b"+OK\n",
            b":abc\r\n",
            b"$-2\r\n",
            b"$99999999999\r\n",
            b"$3\r\nabcd\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"\r\n",
            &long_line,
        ] {
            assert!(matches!(parse(bad), Err(RespError::Protocol(_))), "{:?} accepted", String::from_utf8_lossy(bad));
        }
        assert!(matches!(parse(b""), Err(RespError::Closed)));
        assert!(matches!(parse(b"+OK"), Err(RespError::Closed)));
        assert!(matches!(parse(b"$5\r\nab"), Err(RespError::Closed)));
    }
}
