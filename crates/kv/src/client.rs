//! A small blocking RESP2 client: what `microrep cluster up`, `microrep status`, the benchmarks
//! and the tests use to talk to the server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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
    /// The error text, if this is an error reply.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// One connection.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
}

fn invalid(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.into())
}

impl Client {
    /// Connects to `addr`; every call fails with a timeout after `timeout`.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Self { reader: BufReader::new(stream.try_clone()?), writer: stream, out: Vec::new() })
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> std::io::Result<Value> {
        self.send(args)?;
        self.flush()?;
        self.read()
    }

    /// Buffers one command (pipelining: several `send`s, one `flush`, as many `read`s).
    pub fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        self.out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.out.extend_from_slice(a);
            self.out.extend_from_slice(b"\r\n");
        }
        Ok(())
    }

    /// Writes the buffered commands.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Reads one reply.
    pub fn read(&mut self) -> std::io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        let line = line.strip_suffix("\r\n").ok_or_else(|| invalid("reply line without CRLF"))?;
        let (kind, rest) = line.split_at_checked(1).ok_or_else(|| invalid("empty reply line"))?;
        let number = || rest.parse::<i64>().map_err(|_| invalid(format!("bad number {rest:?}")));
        Ok(match kind {
            "+" => Value::Simple(rest.to_string()),
            "-" => Value::Error(rest.to_string()),
            ":" => Value::Integer(number()?),
            "$" => match number()? {
                -1 => Value::Bulk(None),
                n if (0..=512 << 20).contains(&n) => {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.reader.read_exact(&mut buf)?;
                    buf.truncate(n as usize);
                    Value::Bulk(Some(buf))
                }
                n => return Err(invalid(format!("bulk length {n}"))),
            },
            "*" => match number()? {
                -1 => Value::Array(None),
                n if (0..=1 << 20).contains(&n) => {
                    Value::Array(Some((0..n).map(|_| self.read()).collect::<Result<_, _>>()?))
                }
                n => return Err(invalid(format!("array length {n}"))),
            },
            other => return Err(invalid(format!("unknown reply type {other:?}"))),
        })
    }
}
