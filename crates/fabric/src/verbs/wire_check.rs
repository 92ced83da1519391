//! The bootstrap decoders' promises, checked on any bytes: shared by the property tests in the
//! default `cargo test --features verbs` run and the cargo-fuzz target `verbs_bootstrap`.

use super::{Reply, decode_reply, decode_request, encode_reply, encode_request};

/// Decodes `data` as a request and as a reply; panics if either decoder panics or if a
/// message it accepts does not survive encoding and decoding again unchanged (a refusal's
/// reason is cut to its bound, so only its prefix survives).
pub(crate) fn bootstrap(data: &[u8]) {
    if let Ok((header, request)) = decode_request(data) {
        assert_eq!(decode_request(&encode_request(header, &request)), Ok((header, request)), "request round trip");
    }
    if let Ok(reply) = decode_reply(data) {
        let again = decode_reply(&encode_reply(&reply)).expect("an encoded reply decodes");
        match (&reply, &again) {
            (Reply::Refused(sent), Reply::Refused(got)) => assert!(sent.starts_with(got.as_str()), "refusal cut"),
            _ => assert_eq!(again, reply, "reply round trip"),
        }
    }
}
