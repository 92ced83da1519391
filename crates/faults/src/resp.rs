//! A minimal blocking RESP2 client: one TCP connection, one request at a time, every reply
//! parsed with bounds (length, nesting) so a broken server gives a typed error, never a panic.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Longest bulk string accepted in a reply.
const BULK_BYTES_MAX: usize = 64 << 20;
/// Most elements accepted in one array reply.
const ARRAY_LEN_MAX: usize = 1 << 20;
/// Deepest nesting of arrays accepted.
const DEPTH_MAX: usize = 4;
/// Longest line (simple string, error, integer, length header) accepted.
const LINE_BYTES_MAX: usize = 64 << 10;

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`: the text after the dash.
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nabc`, or `$-1` (None).
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...`, or `*-1` (None).
    Array(Option<Vec<Reply>>),
}

/// Why a reply could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RespError {
    /// The socket failed or timed out.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection.
    #[error("connection closed by the server")]
    Closed,
    /// The bytes are not RESP2 within our bounds.
    #[error("protocol: {0}")]
    Protocol(String),
}

/// A connection to one server.
#[derive(Debug)]
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Conn {
    /// Connects within `timeout`; later requests time out after `timeout` too (see
    /// [`Conn::set_timeout`]).
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        let conn = Self { reader: BufReader::new(stream), addr };
        conn.set_timeout(timeout)?;
        Ok(conn)
    }

    /// The server's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bounds each later read and write by `timeout` (at least a millisecond).
    pub(crate) fn set_timeout(&self, timeout: Duration) -> io::Result<()> {
        let timeout = timeout.max(Duration::from_millis(1));
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        self.reader.get_ref().set_write_timeout(Some(timeout))
    }

    /// Sends one command (an array of bulk strings).
    pub(crate) fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&out)
    }

    /// Reads one reply.
    pub(crate) fn recv(&mut self) -> Result<Reply, RespError> {
        read_reply(&mut self.reader, 0)
    }
}

fn read_line(r: &mut impl BufRead) -> Result<String, RespError> {
    let mut line = Vec::new();
    let n = r.by_ref().take(LINE_BYTES_MAX as u64 + 2).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(RespError::Closed);
    }
    if !line.ends_with(b"\r\n") {
        return Err(RespError::Protocol("line without CRLF, or too long".into()));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| RespError::Protocol("line is not UTF-8".into()))
}

fn parse_len(text: &str, max: usize) -> Result<Option<usize>, RespError> {
    let n: i64 = text.parse().map_err(|_| RespError::Protocol(format!("bad length {text:?}")))?;
    match n {
        -1 => Ok(None),
        n if n < 0 => Err(RespError::Protocol(format!("negative length {n}"))),
        n => {
            let n = usize::try_from(n).map_err(|_| RespError::Protocol(format!("length {n} too large")))?;
            if n > max {
                return Err(RespError::Protocol(format!("length {n} above the bound {max}")));
            }
            Ok(Some(n))
        }
    }
}

fn read_reply(r: &mut impl BufRead, depth: usize) -> Result<Reply, RespError> {
    let line = read_line(r)?;
    let Some(kind) = line.chars().next() else {
        return Err(RespError::Protocol("empty line".into()));
    };
    let rest = &line[kind.len_utf8()..];
    match kind {
        '+' => Ok(Reply::Simple(rest.to_string())),
        '-' => Ok(Reply::Error(rest.to_string())),
        ':' => rest.parse().map(Reply::Int).map_err(|_| RespError::Protocol(format!("bad integer {rest:?}"))),
        '$' => {
            let Some(len) = parse_len(rest, BULK_BYTES_MAX)? else {
                return Ok(Reply::Bulk(None));
            };
            let mut data = vec![0; len + 2];
            r.read_exact(&mut data).map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => RespError::Closed,
                _ => RespError::Io(e),
            })?;
            if !data.ends_with(b"\r\n") {
                return Err(RespError::Protocol("bulk string without CRLF".into()));
            }
            data.truncate(len);
            Ok(Reply::Bulk(Some(data)))
        }
        '*' => {
            if depth >= DEPTH_MAX {
                return Err(RespError::Protocol("arrays nested too deep".into()));
            }
            let Some(len) = parse_len(rest, ARRAY_LEN_MAX)? else {
                return Ok(Reply::Array(None));
            };
            let items = (0..len).map(|_| read_reply(r, depth + 1)).collect::<Result<_, _>>()?;
            Ok(Reply::Array(Some(items)))
        }
        other => Err(RespError::Protocol(format!("unknown reply type {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Reply, RespError> {
        read_reply(&mut BufReader::new(bytes), 0)
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(parse(b"+OK\r\n").ok(), Some(Reply::Simple("OK".into())));
        assert_eq!(
            parse(b"-NOTLEADER 1 127.0.0.1:7001\r\n").ok(),
            Some(Reply::Error("NOTLEADER 1 127.0.0.1:7001".into()))
        );
        assert_eq!(parse(b":-42\r\n").ok(), Some(Reply::Int(-42)));
        assert_eq!(parse(b"$3\r\na\rb\r\n").ok(), Some(Reply::Bulk(Some(b"a\rb".to_vec()))));
        assert_eq!(parse(b"$-1\r\n").ok(), Some(Reply::Bulk(None)));
        assert_eq!(
            parse(b"*2\r\n:1\r\n$-1\r\n").ok(),
            Some(Reply::Array(Some(vec![Reply::Int(1), Reply::Bulk(None)])))
        );
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut conn = Conn::connect(addr, Duration::from_millis(50)).expect("connect");
        let _accepted = listener.accept().expect("accept");
        conn.send(&[b"GET", b"k"]).expect("send");
        match conn.recv() {
            Err(RespError::Io(e)) => {
                assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_replies() {
        for bad in [
            &b"?x\r\n"[..],
            b"+OK\n",
            b":abc\r\n",
            b"$-2\r\n",
            b"$99999999999\r\n",
            b"$3\r\nabcd\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"\r\n",
        ] {
            assert!(matches!(parse(bad), Err(RespError::Protocol(_))), "{:?} accepted", String::from_utf8_lossy(bad));
        }
        assert!(matches!(parse(b""), Err(RespError::Closed)));
        assert!(matches!(parse(b"$5\r\nab"), Err(RespError::Closed)));
    }
}
