//! The decoder's promises, checked on any byte stream: shared by the property tests in the
//! default `cargo test` run and the cargo-fuzz target `tcp_frames` (`fuzz/`).
//!
//! Input layout: byte 0 picks the receive piece size and whether checksums are repaired (so
//! the fuzzer gets past the CRC to the shape checks), byte 1 the payload bound; the rest is the
//! stream.

use super::{Decoder, FRAME_OVERHEAD, Frame, Hello, Kind, encode};

/// Feeds `data` to a [`Decoder`] and panics if it breaks a promise: it buffers at most one
/// frame, every frame it returns re-encodes to exactly the bytes it consumed, handshakes that
/// decode re-encode to the same values, and it never panics.
pub(crate) fn frames(data: &[u8]) {
    let [mode, bound, stream @ ..] = data else { return };
    let piece = usize::from(mode & 0x7f) + 1;
    let max_payload = usize::from(*bound) * 64;
    let mut stream = stream.to_vec();
    if mode & 0x80 != 0 {
        repair_checksums(&mut stream);
    }
    let mut decoder = Decoder::new(max_payload);
    let (mut fed, mut consumed) = (0, 0);
    while fed < stream.len() {
        let spare = decoder.spare();
        let n = piece.min(spare.len()).min(stream.len() - fed);
        spare[..n].copy_from_slice(&stream[fed..fed + n]);
        decoder.filled(n);
        fed += n;
        assert!(decoder.buf.len() <= FRAME_OVERHEAD + max_payload, "buffers at most one frame");
        loop {
            match decoder.next() {
                Ok(Some(frame)) => {
                    let len = FRAME_OVERHEAD + frame.payload.len();
                    assert!(frame.payload.len() <= max_payload, "payload above the bound");
                    check_frame(&frame, &stream[consumed..consumed + len]);
                    consumed += len;
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// A decoded frame re-encodes to its bytes; a handshake re-decodes to the same values.
fn check_frame(frame: &Frame<'_>, bytes: &[u8]) {
    let mut again = Vec::new();
    encode(&mut again, &frame.header, frame.payload);
    assert_eq!(again, bytes, "the frame re-encodes differently");
    match frame.header.kind {
        Kind::Hello => {
            if let Ok(hello) = Hello::decode(frame) {
                let mut out = Vec::new();
                hello.encode(&mut out);
                assert_eq!(&out[..], bytes, "a Hello re-encodes differently");
            }
        }
        Kind::HelloAck => {
            if let Ok((hello, regions)) = Hello::decode_ack(frame) {
                let mut out = Vec::new();
                hello.encode_ack(&regions, &mut out);
                let mut decoder = Decoder::new(out.len());
                decoder.spare()[..out.len()].copy_from_slice(&out);
                decoder.filled(out.len());
                let again = decoder.next().expect("an encoded ack decodes").expect("whole");
                assert_eq!(Hello::decode_ack(&again), Ok((hello, regions)), "a HelloAck does not round-trip");
            }
        }
        _ => {}
    }
}

/// Rewrites the CRC of every frame whose length field fits in the stream.
fn repair_checksums(stream: &mut [u8]) {
    let mut at = 0;
    while stream.len() - at >= FRAME_OVERHEAD {
        let len = u32::from_le_bytes(stream[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len < FRAME_OVERHEAD || len > stream.len() - at {
            return;
        }
        let crc = crate::checksum::crc32c(&stream[at..at + len - 4]);
        stream[at + len - 4..at + len].copy_from_slice(&crc.to_le_bytes());
        at += len;
    }
}
