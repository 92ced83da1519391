//! Log entries that carry one command or a batch of them (Mu §7.4: batching amortises one
//! replication round over many commands).
//!
//! ```text
//! single: [0u8] command bytes
//! batch:  [1u8] count: u16 LE, then count times (len: u32 LE, command bytes)
//! ```
//!
//! Every replica decodes the same bytes the same way, so a malformed entry (which the slot
//! checksum makes all but impossible, short of a leader of another version) is skipped by all
//! of them alike.

use microrep_core::mu::slot::Frame;

const SINGLE: u8 = 0;
const BATCH: u8 = 1;
/// Bytes a batch adds in front of its commands.
pub(crate) const BATCH_HEADER: usize = 3;
/// Bytes a batch adds per command.
pub(crate) const PER_COMMAND: usize = 4;

/// Why an entry could not be decoded.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// The entry is empty.
    #[error("empty entry")]
    Empty,
    /// The first byte is no known format.
    #[error("unknown entry format {0}")]
    UnknownFormat(u8),
    /// A length runs past the end of the entry.
    #[error("batch truncated at command {0}")]
    Truncated(usize),
    /// Bytes follow the last command.
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
}

/// Writes a single-command entry into `out`.
pub(crate) fn encode_single(command: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(SINGLE);
    out.extend_from_slice(command);
}

/// The most commands one batch entry carries.
pub(crate) const MAX_COMMANDS: usize = u16::MAX as usize;

/// Writes a batch entry of `commands` into `out`'s payload; returns how many there are, or
/// `None` if they are more than [`MAX_COMMANDS`] (`out` then holds a partial entry).
pub(crate) fn encode_batch<'a>(commands: impl IntoIterator<Item = &'a [u8]>, out: &mut Frame) -> Option<usize> {
    out.clear();
    out.extend_from_slice(&[BATCH, 0, 0]);
    let mut count = 0usize;
    for command in commands {
        count += 1;
        if count > MAX_COMMANDS {
            return None;
        }
        out.extend_from_slice(&(command.len() as u32).to_le_bytes());
        out.extend_from_slice(command);
    }
    out.payload_mut()[1..3].copy_from_slice(&(count as u16).to_le_bytes());
    Some(count)
}

/// Builds a batch entry one command at a time.
#[derive(Debug, Default)]
pub(crate) struct BatchWriter {
    buf: Vec<u8>,
    count: u16,
}

impl BatchWriter {
    /// Starts an empty batch.
    pub(crate) fn start(&mut self) {
        self.buf.clear();
        self.buf.extend_from_slice(&[BATCH, 0, 0]);
        self.count = 0;
    }

    /// Appends `command` (the caller checked the entry's size against the slot).
    pub(crate) fn push(&mut self, command: &[u8]) {
        self.buf.extend_from_slice(&(command.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(command);
        self.count += 1;
        self.buf[1..3].copy_from_slice(&self.count.to_le_bytes());
    }

    /// The encoded entry.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Calls `each(position, command)` for every command of `entry`, in order.
///
/// Checks the whole entry before the first call, so a malformed entry applies nothing.
pub(crate) fn for_each(entry: &[u8], mut each: impl FnMut(u32, &[u8])) -> Result<(), DecodeError> {
    let (&format, body) = entry.split_first().ok_or(DecodeError::Empty)?;
    match format {
        SINGLE => {
            each(0, body);
            Ok(())
        }
        BATCH => {
            let count = walk(body, |_, _| {})?;
            debug_assert!(count <= usize::from(u16::MAX));
            walk(body, |i, command| each(i, command)).map(|_| ())
        }
        other => Err(DecodeError::UnknownFormat(other)),
    }
}

/// Visits the commands of a batch body; returns how many there are.
fn walk(body: &[u8], mut each: impl FnMut(u32, &[u8])) -> Result<usize, DecodeError> {
    let (count, mut rest) = body.split_at_checked(2).ok_or(DecodeError::Truncated(0))?;
    let count = usize::from(u16::from_le_bytes([count[0], count[1]]));
    for i in 0..count {
        let (len, after) = rest.split_at_checked(PER_COMMAND).ok_or(DecodeError::Truncated(i))?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let (command, after) = after.split_at_checked(len).ok_or(DecodeError::Truncated(i))?;
        each(i as u32, command);
        rest = after;
    }
    if rest.is_empty() { Ok(count) } else { Err(DecodeError::Trailing(rest.len())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(entry: &[u8]) -> Result<Vec<(u32, Vec<u8>)>, DecodeError> {
        let mut out = Vec::new();
        for_each(entry, |i, c| out.push((i, c.to_vec())))?;
        Ok(out)
    }

    #[test]
    fn single_and_batch_round_trip() {
        let mut buf = Vec::new();
        encode_single(b"set a 1", &mut buf);
        assert_eq!(decode(&buf), Ok(vec![(0, b"set a 1".to_vec())]));

        let mut w = BatchWriter::default();
        w.start();
        for c in [&b"x"[..], b"", b"yz"] {
            w.push(c);
        }
        assert_eq!(w.bytes().len(), BATCH_HEADER + 3 * PER_COMMAND + 3);
        assert_eq!(decode(w.bytes()), Ok(vec![(0, b"x".to_vec()), (1, vec![]), (2, b"yz".to_vec())]));
    }

    #[test]
    fn an_encoded_batch_decodes_as_the_writer_s() {
        let mut w = BatchWriter::default();
        w.start();
        let commands = [&b"x"[..], b"", b"yz"];
        commands.iter().for_each(|c| w.push(c));
        let mut out = Frame::new();
        assert_eq!(encode_batch(commands, &mut out), Some(3));
        assert_eq!(out.payload(), w.bytes());
        assert_eq!(encode_batch([], &mut out), Some(0));
        assert_eq!(decode(out.payload()), Ok(vec![]), "an empty batch applies nothing");
        let many = vec![&b""[..]; MAX_COMMANDS + 1];
        assert_eq!(encode_batch(many[..MAX_COMMANDS].iter().copied(), &mut out), Some(MAX_COMMANDS));
        assert_eq!(encode_batch(many, &mut out), None, "one more than a count holds");
    }

    #[test]
    fn malformed_entries_apply_nothing() {
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(decode(&[7, 1, 2]), Err(DecodeError::UnknownFormat(7)));
        assert_eq!(decode(&[BATCH, 1]), Err(DecodeError::Truncated(0)));
        // Two commands announced, the second runs past the end.
        assert_eq!(decode(&[BATCH, 2, 0, 1, 0, 0, 0, b'a', 9, 0, 0, 0, b'b']), Err(DecodeError::Truncated(1)));
        assert_eq!(decode(&[BATCH, 0, 0, 0xff]), Err(DecodeError::Trailing(1)));
        let mut calls = 0;
        let _ = for_each(&[BATCH, 2, 0, 1, 0, 0, 0, b'a', 9, 0, 0, 0], |_, _| calls += 1);
        assert_eq!(calls, 0, "a malformed batch must apply none of its commands");
    }
}
