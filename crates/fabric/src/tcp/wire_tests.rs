//! Decoder tests: round trips at every split point, and malformed or hostile input rejected
//! without a panic.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const MAX_PAYLOAD: usize = 4096;

fn write_frame(wr_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = Header { region: 3, wr_id, offset: 80, ..Header::new(Kind::Write) };
    encode(&mut out, &header, payload);
    out
}

/// Feeds `bytes` in pieces of the given sizes; returns the decoded (kind, wr_id, payload) or the
/// first error.
fn decode_in_pieces(bytes: &[u8], pieces: &[usize]) -> Result<Vec<(Kind, u64, Vec<u8>)>, WireError> {
    let mut decoder = Decoder::new(MAX_PAYLOAD);
    let mut frames = Vec::new();
    let mut at = 0;
    let mut sizes = pieces.iter().copied().cycle();
    while at < bytes.len() {
        let spare = decoder.spare();
        let n = sizes.next().unwrap_or(1).clamp(1, spare.len()).min(bytes.len() - at);
        spare[..n].copy_from_slice(&bytes[at..at + n]);
        decoder.filled(n);
        at += n;
        assert!(decoder.buf.len() <= FRAME_OVERHEAD + MAX_PAYLOAD, "the decoder buffers at most one frame");
        while let Some(frame) = decoder.next()? {
            frames.push((frame.header.kind, frame.header.wr_id, frame.payload.to_vec()));
        }
    }
    Ok(frames)
}

#[test]
fn frames_round_trip_across_any_split() {
    let mut stream = write_frame(1, b"hello");
    stream.extend(write_frame(2, &[]));
    stream.extend(write_frame(3, &[7; MAX_PAYLOAD]));
    let expected = vec![(Kind::Write, 1, b"hello".to_vec()), (Kind::Write, 2, vec![]), (Kind::Write, 3, vec![7; 4096])];
    for piece in [1, 2, 3, 7, 31, 32, 33, 100, 5000, 1 << 20] {
        assert_eq!(decode_in_pieces(&stream, &[piece]), Ok(expected.clone()), "pieces of {piece}");
    }
}

#[test]
fn every_corrupted_byte_is_rejected_or_waits() {
    let frame = write_frame(9, b"payload bytes");
    for at in 0..frame.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = frame.clone();
            bad[at] ^= flip;
            match decode_in_pieces(&bad, &[bad.len()]) {
                Err(_) => {}
                // A corrupted length can make the frame look incomplete: nothing is delivered.
                Ok(frames) => assert!(frames.is_empty(), "byte {at} ^ {flip:#x} decoded as {frames:?}"),
            }
        }
    }
}

#[test]
fn lengths_out_of_range_are_rejected_before_buffering() {
    let mut short = write_frame(1, b"x");
    short[..4].copy_from_slice(&5u32.to_le_bytes());
    assert_eq!(decode_in_pieces(&short, &[64]), Err(WireError::TooShort(5)));
    let mut huge = write_frame(1, b"x");
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode_in_pieces(&huge, &[64]), Err(WireError::Oversize { .. })));
    let oversize = write_frame(1, &[0; MAX_PAYLOAD + 1]);
    assert!(matches!(decode_in_pieces(&oversize, &[64]), Err(WireError::Oversize { .. })));
}

#[test]
fn unknown_kinds_statuses_and_bad_shapes_are_rejected() {
    let reframe = |mutate: &dyn Fn(&mut Vec<u8>)| {
        let mut frame = write_frame(1, b"");
        mutate(&mut frame);
        let body = frame.len() - 4;
        let crc = crate::checksum::crc32c(&frame[..body]);
        frame[body..].copy_from_slice(&crc.to_le_bytes());
        decode_in_pieces(&frame, &[frame.len()])
    };
    assert_eq!(reframe(&|f| f[4] = 42), Err(WireError::UnknownKind(42)));
    assert_eq!(reframe(&|f| f[5] = 9), Err(WireError::UnknownStatus(9)));
    assert!(matches!(reframe(&|f| f[5] = 1), Err(WireError::Malformed { kind: Kind::Write, .. })));
    assert!(matches!(reframe(&|f| f[4] = Kind::Hello as u8), Err(WireError::Malformed { kind: Kind::Hello, .. })));
    let mut addressed_hello = Vec::new();
    Hello { cluster_id: 1, node: 0, max_nodes: 3, max_op_bytes: 64 }.encode(&mut addressed_hello);
    addressed_hello[24] = 234;
    let body = addressed_hello.len() - 4;
    let crc = crate::checksum::crc32c(&addressed_hello[..body]);
    addressed_hello[body..].copy_from_slice(&crc.to_le_bytes());
    assert!(
        matches!(decode_in_pieces(&addressed_hello, &[64]), Err(WireError::Malformed { kind: Kind::Hello, .. })),
        "regression (property tests): a Hello with header fields set was accepted"
    );
    let mut read_with_payload = Vec::new();
    encode(&mut read_with_payload, &Header::new(Kind::Read), b"x");
    assert!(matches!(decode_in_pieces(&read_with_payload, &[64]), Err(WireError::Malformed { kind: Kind::Read, .. })));
    let mut data_len_mismatch = Vec::new();
    encode(&mut data_len_mismatch, &Header { arg: 4, ..Header::new(Kind::ReadData) }, b"abc");
    assert!(matches!(
        decode_in_pieces(&data_len_mismatch, &[64]),
        Err(WireError::Malformed { kind: Kind::ReadData, .. })
    ));
}

#[test]
fn handshakes_round_trip_and_reject_garbage() {
    let hello = Hello { cluster_id: 0xfeed, node: 2, max_nodes: 5, max_op_bytes: 1 << 20 };
    let regions = [
        RegionSpec::new(RegionId(0), 4096, RemoteWrite::Granted),
        RegionSpec::new(RegionId(7), 64, RemoteWrite::Always),
        RegionSpec::new(RegionId(9), 8, RemoteWrite::Never),
    ];
    let mut out = Vec::new();
    hello.encode(&mut out);
    hello.encode_ack(&regions, &mut out);
    Hello::encode_refusal("wrong cluster", &mut out);
    let mut decoder = Decoder::new(MAX_PAYLOAD);
    let spare = decoder.spare();
    spare[..out.len()].copy_from_slice(&out);
    decoder.filled(out.len());
    let frame = decoder.next().expect("valid").expect("whole");
    assert_eq!(Hello::decode(&frame), Ok(hello));
    assert_eq!(Hello::decode_ack(&frame), Err(WireError::Unexpected(Kind::Hello)));
    let frame = decoder.next().expect("valid").expect("whole");
    assert_eq!(Hello::decode_ack(&frame), Ok((hello, regions.to_vec())));
    let frame = decoder.next().expect("valid").expect("whole");
    assert_eq!(Hello::decode_ack(&frame), Err(WireError::Refused("wrong cluster".into())));

    let mut bad_magic = [0u8; HELLO_LEN];
    hello.write(&mut bad_magic);
    bad_magic[0] ^= 1;
    assert!(matches!(Hello::read(Kind::Hello, &bad_magic), Err(WireError::Malformed { .. })));
    let ack_with = |count: u32, extra: &[u8]| {
        let mut body = vec![0u8; HELLO_LEN];
        hello.write(&mut body);
        body.extend_from_slice(&count.to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(extra);
        let mut frame = Vec::new();
        encode(&mut frame, &Header::new(Kind::HelloAck), &body);
        let mut decoder = Decoder::new(MAX_PAYLOAD);
        decoder.spare()[..frame.len()].copy_from_slice(&frame);
        decoder.filled(frame.len());
        let frame = decoder.next().expect("valid").expect("whole");
        Hello::decode_ack(&frame).map(|(_, r)| r)
    };
    assert!(ack_with(u32::MAX, &[]).is_err(), "region count overflow");
    assert!(ack_with(1, &[0; 8]).is_err(), "truncated table");
    let mut entry = [0u8; REGION_ENTRY_LEN];
    entry[2] = 7;
    entry[8..].copy_from_slice(&64u64.to_le_bytes());
    assert!(ack_with(1, &entry).is_err(), "unknown policy");
    entry[2] = 1;
    entry[8..].copy_from_slice(&12u64.to_le_bytes());
    assert!(ack_with(1, &entry).is_err(), "unaligned region length");
    entry[8..].copy_from_slice(&64u64.to_le_bytes());
    assert_eq!(ack_with(1, &entry), Ok(vec![RegionSpec::new(RegionId(0), 64, RemoteWrite::Granted)]));
}

/// Random bytes, and valid frames with random corruption, fed in random pieces: the decoder
/// returns frames or an error and never panics (and, checked in `decode_in_pieces`, never
/// buffers more than one frame).
#[test]
fn random_input_never_panics() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..2000 {
        let mut bytes: Vec<u8> = if case % 2 == 0 {
            (0..rng.random_range(0..600)).map(|_| rng.random()).collect()
        } else {
            let payload: Vec<u8> = (0..rng.random_range(0..300)).map(|_| rng.random()).collect();
            write_frame(case, &payload)
        };
        for _ in 0..rng.random_range(0..4) {
            if !bytes.is_empty() {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
        }
        let pieces: Vec<usize> = (0..4).map(|_| rng.random_range(1..80)).collect();
        if let Ok(frames) = decode_in_pieces(&bytes, &pieces) {
            assert!(frames.iter().all(|(_, _, p)| p.len() <= MAX_PAYLOAD));
        }
    }
}

/// A frame of `kind` shaped as the decoder expects: requests carry no status, Hello a
/// handshake body, Read, Reset and WriteAck no payload, ReadData as many bytes as announced.
fn shaped_frame(out: &mut Vec<u8>, kind: Kind, status: Status, header: Header, payload: &[u8]) {
    let request = matches!(kind, Kind::Hello | Kind::Write | Kind::Read | Kind::Reset);
    let status = if request { Status::Ok } else { status };
    let header = Header { kind, status, arg: if kind == Kind::ReadData { 0 } else { header.arg }, ..header };
    match kind {
        Kind::Hello => {
            Hello { cluster_id: header.wr_id, node: header.region, max_nodes: 3, max_op_bytes: header.arg }.encode(out)
        }
        Kind::HelloAck if status == Status::Ok => {
            let hello = Hello { cluster_id: header.wr_id, node: header.region, max_nodes: 3, max_op_bytes: 64 };
            let regions: Vec<RegionSpec> = payload
                .iter()
                .take(MAX_REGIONS)
                .enumerate()
                .map(|(i, &b)| RegionSpec::new(RegionId(i as u16), u64::from(b) * 8 + 8, RemoteWrite::Granted))
                .collect();
            hello.encode_ack(&regions, out);
        }
        Kind::Read | Kind::Reset | Kind::WriteAck => encode(out, &header, &[]),
        Kind::ReadData if status != Status::Ok => encode(out, &header, &[]),
        Kind::ReadData => encode(out, &Header { arg: payload.len() as u32, ..header }, payload),
        _ => encode(out, &header, payload),
    }
}

/// A stream of valid frames of every kind and status, then a few bytes overwritten.
fn mutated_stream() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let frame =
        (1u8..=7, 0u8..=3, any::<u16>(), any::<u64>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..80));
    let flips = proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3);
    (any::<u8>(), proptest::collection::vec(frame, 1..5), flips).prop_map(|(mode, frames, flips)| {
        let mut out = vec![mode, 64];
        for (kind, status, region, wr_id, arg, payload) in frames {
            let kind = Kind::from_byte(kind).expect("1..=7 are kinds");
            let status = Status::from_byte(status).expect("0..=3 are statuses");
            shaped_frame(&mut out, kind, status, Header { region, wr_id, arg, ..Header::new(kind) }, &payload);
        }
        for (at, byte) in flips {
            let len = out.len();
            out[2 + at % (len - 2)] = byte;
        }
        out
    })
}

proptest::proptest! {
    /// Byte soup fed in any piece size: the decoder keeps its promises (`check::frames`).
    #[test]
    fn any_bytes_keep_the_decoder_promises(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1024)) {
        check::frames(&data);
    }

    /// Frames of every kind with corrupted bytes, checksums repaired or not.
    #[test]
    fn mutated_frames_keep_the_decoder_promises(data in mutated_stream()) {
        check::frames(&data);
    }
}
