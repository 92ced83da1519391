//! The RESP parsers' promises, checked on any bytes: shared by the property tests in the
//! default `cargo test` run and the cargo-fuzz targets `resp_request` and `resp_reply`
//! (`fuzz/`). Not an API.

use crate::client::{self, Value};
use crate::resp::{self, MAX_ARGS};

/// Longest input whose every prefix is parsed too (the check is quadratic).
const PREFIX_CHECK_MAX: usize = 4096;

/// Parses `data` (byte 0 bounds each argument, `max_bulk`; the rest is what a client sent) as
/// client input; panics if the parser panics, consumes bytes it was not
/// given, returns more than its bounds, returns a request that re-encodes to other arguments,
/// or reports anything but "need more bytes" for a prefix of a whole request.
pub fn resp_request(data: &[u8]) {
    let [bound, buf @ ..] = data else { return };
    let max_bulk = usize::from(*bound);
    let Ok(Some((args, used))) = resp::parse(buf, max_bulk) else { return };
    assert!(0 < used && used <= buf.len(), "consumed {used} of {} bytes", buf.len());
    assert!(args.len() <= MAX_ARGS, "{} arguments", args.len());
    if buf[0] == b'*' {
        assert!(args.iter().all(|a| a.len() <= max_bulk), "an argument above max_bulk");
    }
    let mut encoded = Vec::new();
    resp::array(&mut encoded, args.len());
    for arg in &args {
        resp::bulk(&mut encoded, Some(arg));
    }
    let again = resp::parse(&encoded, max_bulk.max(args.iter().map(Vec::len).max().unwrap_or(0)));
    assert_eq!(again, Ok(Some((args, encoded.len()))), "the request does not survive re-encoding");
    if used <= PREFIX_CHECK_MAX {
        for cut in 0..used {
            assert_eq!(resp::parse(&buf[..cut], max_bulk), Ok(None), "prefix of {cut} bytes");
        }
    }
}

/// Reads `data` as a server's replies with the client's parser; panics if it panics, consumes
/// nothing, or returns a reply that does not survive encoding and reading again.
pub fn resp_reply(data: &[u8]) {
    let mut rest = data;
    while !rest.is_empty() {
        let before = rest.len();
        let Ok(value) = client::read_value(&mut rest) else { return };
        assert!(rest.len() < before, "a reply from no bytes");
        let mut encoded = Vec::new();
        encode_value(&mut encoded, &value);
        assert_eq!(client::read_value(&mut &encoded[..]).ok(), Some(value), "the reply does not survive re-encoding");
    }
}

fn encode_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Simple(text) => resp::simple(out, text),
        Value::Error(text) => {
            out.push(b'-');
            out.extend_from_slice(text.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Value::Integer(n) => resp::integer(out, *n),
        Value::Bulk(bytes) => resp::bulk(out, bytes.as_deref()),
        Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Value::Array(Some(items)) => {
            resp::array(out, items.len());
            items.iter().for_each(|item| encode_value(out, item));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Requests as clients send them (arrays and inline), then a few bytes overwritten.
    fn mutated_requests() -> impl Strategy<Value = Vec<u8>> {
        let args = proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..5);
        let flips = proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3);
        (any::<u8>(), any::<bool>(), args, flips).prop_map(|(bound, inline, args, flips)| {
            let mut data = vec![bound];
            if inline {
                let words: Vec<Vec<u8>> = args.iter().map(|a| a.iter().map(|&b| b'a' + b % 26).collect()).collect();
                data.extend(words.join(&b' '));
                data.extend_from_slice(b"\r\n");
            } else {
                resp::array(&mut data, args.len());
                for arg in &args {
                    resp::bulk(&mut data, Some(arg));
                }
            }
            for (at, byte) in flips {
                let len = data.len();
                data[1 + at % (len - 1)] = byte;
            }
            data
        })
    }

    proptest! {
        /// Byte soup from RESP's own alphabet.
        #[test]
        fn any_bytes_keep_the_parser_promises(data in proptest::collection::vec(prop_oneof![Just(b'*'), Just(b'$'), Just(b'\r'), Just(b'\n'), Just(b'1'), Just(b'-'), any::<u8>()], 0..96)) {
            resp_request(&data);
        }

        /// Byte soup from RESP's own alphabet, read as replies.
        #[test]
        fn any_bytes_keep_the_reply_parser_promises(data in proptest::collection::vec(prop_oneof![Just(b'*'), Just(b'$'), Just(b'+'), Just(b'\r'), Just(b'\n'), Just(b'1'), Just(b'-'), any::<u8>()], 0..96)) {
            resp_reply(&data);
        }

        /// Well-formed requests, corrupted.
        #[test]
        fn mutated_requests_keep_the_parser_promises(data in mutated_requests()) {
            resp_request(&data);
        }
    }
}
