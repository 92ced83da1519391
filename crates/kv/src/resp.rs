//! RESP2, the Redis protocol: incremental parsing of client requests and encoding of replies.
//!
//! Requests are arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or inline commands
//! (`GET k\r\n`). The parser never trusts a length: every count and size is bounded, and a
//! malformed request is a [`ParseError`] after which the connection is closed (as Redis does),
//! so a client can never desynchronise the stream.

/// Largest number of arguments in one request.
pub const MAX_ARGS: usize = 4096;
/// Largest inline command line.
pub const MAX_INLINE: usize = 64 * 1024;

/// Why a request cannot be parsed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// A line that should start an array or bulk string does not.
    #[error("expected '{expected}', got {got:?}")]
    Unexpected {
        /// What the protocol requires here.
        expected: char,
        /// The byte found.
        got: char,
    },
    /// A length or count is not a number in range.
    #[error("invalid {what} length")]
    BadLength {
        /// Which length.
        what: &'static str,
    },
    /// A bulk string is not followed by CRLF.
    #[error("bulk string not terminated by CRLF")]
    Unterminated,
    /// A line exceeds the limit without a CRLF.
    #[error("line longer than {MAX_INLINE} bytes")]
    LineTooLong,
}

/// A whole request: its arguments and how many input bytes it took.
pub type Request = (Vec<Vec<u8>>, usize);

/// Parses one request from the front of `buf`.
///
/// Returns `Ok(Some((args, consumed)))` for a whole request, `Ok(None)` if more bytes are
/// needed, and an error if the bytes can never form a request. `max_bulk` bounds each argument.
pub fn parse(buf: &[u8], max_bulk: usize) -> Result<Option<Request>, ParseError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return parse_inline(buf);
    }
    let Some((count, mut at)) = line(buf, 0)? else { return Ok(None) };
    let count = number(&count[1..], "multibulk")?;
    if count > MAX_ARGS as i64 {
        return Err(ParseError::BadLength { what: "multibulk" });
    }
    let mut args = Vec::with_capacity(count.max(0) as usize);
    for _ in 0..count.max(0) {
        let Some((header, body)) = line(buf, at)? else { return Ok(None) };
        if header[0] != b'$' {
            return Err(ParseError::Unexpected { expected: '$', got: char::from(header[0]) });
        }
        let len = number(&header[1..], "bulk")?;
        if len < 0 || len as usize > max_bulk {
            return Err(ParseError::BadLength { what: "bulk" });
        }
        let end = body + len as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ParseError::Unterminated);
        }
        args.push(buf[body..end].to_vec());
        at = end + 2;
    }
    Ok(Some((args, at)))
}

/// An inline command: words separated by spaces, ended by a newline.
fn parse_inline(buf: &[u8]) -> Result<Option<Request>, ParseError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > MAX_INLINE { Err(ParseError::LineTooLong) } else { Ok(None) };
    };
    if nl > MAX_INLINE {
        return Err(ParseError::LineTooLong);
    }
    let text = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let args: Vec<Vec<u8>> = text.split(|&b| b == b' ').filter(|w| !w.is_empty()).map(<[u8]>::to_vec).collect();
    if args.len() > MAX_ARGS {
        return Err(ParseError::BadLength { what: "inline" });
    }
    Ok(Some((args, nl + 1)))
}

/// The line starting at `from` (without CRLF) and the offset after it.
fn line(buf: &[u8], from: usize) -> Result<Option<(&[u8], usize)>, ParseError> {
    let rest = &buf[from..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(0) => Err(ParseError::BadLength { what: "empty" }),
        Some(end) => Ok(Some((&rest[..end], from + end + 2))),
        None if rest.len() > 32 => Err(ParseError::LineTooLong),
        None => Ok(None),
    }
}

fn number(digits: &[u8], what: &'static str) -> Result<i64, ParseError> {
    std::str::from_utf8(digits).ok().and_then(|s| s.parse().ok()).ok_or(ParseError::BadLength { what })
}

/// Appends `+text\r\n`.
pub fn simple(out: &mut Vec<u8>, text: &str) {
    out.push(b'+');
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `-text\r\n` (line breaks in `text` become spaces).
pub fn error(out: &mut Vec<u8>, text: &str) {
    out.push(b'-');
    out.extend(text.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(b"\r\n");
}

/// Appends `:n\r\n`.
pub fn integer(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(format!(":{n}\r\n").as_bytes());
}

/// Appends a bulk string, or the null bulk string for `None`.
pub fn bulk(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        Some(v) => {
            out.extend_from_slice(format!("${}\r\n", v.len()).as_bytes());
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        None => out.extend_from_slice(b"$-1\r\n"),
    }
}

/// Appends an array header of `n` elements.
pub fn array(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(format!("*{n}\r\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn parses_arrays_inline_and_partial_input() {
        let req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*1\r\n$4\r\nPING\r\n";
        let (a, used) = parse(req, 100).expect("ok").expect("whole");
        assert_eq!(a, args(&["SET", "k", "hello"]));
        assert_eq!(parse(&req[used..], 100), Ok(Some((args(&["PING"]), 14))));
        for cut in 1..used {
            assert_eq!(parse(&req[..cut], 100), Ok(None), "prefix of {cut} bytes");
        }
        assert_eq!(parse(b"get  k\r\nrest", 100), Ok(Some((args(&["get", "k"]), 8))));
        assert_eq!(parse(b"*0\r\n", 100), Ok(Some((vec![], 4))));
    }

    #[test]
    fn rejects_malformed_and_hostile_input() {
        assert!(matches!(parse(b"*2\r\n+OK\r\n", 100), Err(ParseError::Unexpected { .. })));
        assert!(parse(b"*x\r\n", 100).is_err());
        assert!(parse(b"*99999999\r\n", 100).is_err());
        assert!(parse(b"*1\r\n$-5\r\n", 100).is_err());
        assert!(parse(b"*1\r\n$200\r\n", 100).is_err(), "bulk above the limit");
        assert_eq!(parse(b"*1\r\n$1\r\nab\r\n", 100), Err(ParseError::Unterminated));
        assert_eq!(parse(&[b'*'; 40], 100), Err(ParseError::LineTooLong));
        assert_eq!(parse(&vec![b'a'; MAX_INLINE + 1], 100), Err(ParseError::LineTooLong));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A deterministic stream of pseudo-random requests and byte soup.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut buf = Vec::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(b"*$\r\n0123-x "[(x % 11) as usize]);
            }
            if let Ok(Some((_, used))) = parse(&buf, 16) {
                assert!(used <= buf.len());
            }
        }
    }

    #[test]
    fn encodes_replies() {
        let mut out = Vec::new();
        simple(&mut out, "OK");
        error(&mut out, "ERR bad\r\nthing");
        integer(&mut out, -3);
        bulk(&mut out, Some(b"v"));
        bulk(&mut out, None);
        array(&mut out, 2);
        assert_eq!(out, b"+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n$-1\r\n*2\r\n");
    }
}
