//! A ready-made state machine for load tests, benchmarks and examples: it counts the commands
//! it applies and answers each with the new count.

use crate::api::{Apply, Index, RestoreError};

/// Counts applied commands (whatever they hold); each reply is the new count, 8 bytes little
/// endian. Its snapshot is the count.
#[derive(Debug, Default)]
pub struct Counter(pub u64);

impl Apply for Counter {
    fn apply(&mut self, _index: Index, _command: &[u8], reply: &mut Vec<u8>) {
        self.0 += 1;
        reply.extend_from_slice(&self.0.to_le_bytes());
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        let bytes =
            snapshot.try_into().map_err(|_| RestoreError::Length { got: snapshot.len(), expected: "8 bytes" })?;
        self.0 = u64::from_le_bytes(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_replies_and_restores_its_count_but_not_a_damaged_snapshot() {
        let mut c = Counter::default();
        let mut reply = Vec::new();
        c.apply(Index { entry: 1, position: 0 }, b"x", &mut reply);
        c.apply(Index { entry: 1, position: 0 }, b"", &mut reply);
        assert_eq!(reply, [1u64.to_le_bytes(), 2u64.to_le_bytes()].concat());
        let mut snapshot = Vec::new();
        c.snapshot(&mut snapshot);
        let mut restored = Counter::default();
        restored.restore(&snapshot).expect("restore");
        assert_eq!(restored.0, 2);
        assert!(restored.restore(&snapshot[..7]).is_err(), "7 bytes are no count");
        assert_eq!(restored.0, 2, "a refused snapshot changes nothing");
    }
}
