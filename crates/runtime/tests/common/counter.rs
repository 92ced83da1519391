//! A state machine for tests: it counts applied commands and replies with the new count.

use microrep::{Apply, Index};

/// Counts applied commands; the reply is the new count.
#[derive(Default)]
pub(crate) struct Counter(pub(crate) u64);

impl Apply for Counter {
    fn apply(&mut self, _index: Index, _command: &[u8], reply: &mut Vec<u8>) {
        self.0 += 1;
        reply.extend_from_slice(&self.0.to_le_bytes());
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), microrep::RestoreError> {
        let bytes = snapshot.try_into().map_err(|_| microrep::RestoreError::Application("8 bytes".into()))?;
        self.0 = u64::from_le_bytes(bytes);
        Ok(())
    }
}
