//! Proposing many commands as one log entry, with one completion slot for all of them (issue
//! 18: the per-command costs of `submit`, a ticket, a queue slot and a wake-up each, are paid
//! once per batch). The commands commit together or not at all: they are one entry.

use crate::api::{Committed, Index, ProposeError};
use crate::batch::{self, BATCH_HEADER, MAX_COMMANDS, PER_COMMAND};
use microrep_core::mu::slot::Frame;

use crate::node::{Node, Pending, Submitted};

/// The most commands one batch holds.
pub const MAX_BATCH_COMMANDS: usize = MAX_COMMANDS;

/// The bytes a batch of `commands` commands, `command_bytes` bytes in all, takes in its log
/// entry: it fits if this is at most [`Node::max_entry_bytes`].
pub fn batch_entry_bytes(commands: usize, command_bytes: usize) -> usize {
    BATCH_HEADER + commands * PER_COMMAND + command_bytes
}

impl Node {
    /// Proposes `commands` as one log entry, without waiting; [`PendingBatch::wait`] gives
    /// every command's reply. The encoded batch (3 bytes, then 4 bytes and the bytes of each
    /// command) must fit [`Node::max_entry_bytes`], and hold at most 65,535 commands. An empty
    /// batch commits an entry that applies nothing.
    pub fn submit_batch<'a>(&self, commands: impl IntoIterator<Item = &'a [u8]>) -> Result<PendingBatch, ProposeError> {
        // Sized like the last batch, whose size the next one usually shares: a frame that grew
        // while the batch was encoded reallocated and copied about its size again.
        let mut entry = Frame::with_capacity(self.batch_bytes_hint());
        let count = batch::encode_batch(commands, &mut entry)
            .ok_or(ProposeError::TooManyCommands { count: MAX_COMMANDS + 1, max: MAX_COMMANDS })?;
        let len = entry.payload().len();
        self.note_batch_bytes(len);
        if len > self.max_entry_bytes() {
            return Err(ProposeError::TooLarge { len, max: self.max_entry_bytes() });
        }
        let pending = self.submit_entry(Submitted::Batch(entry))?;
        Ok(PendingBatch { pending, count })
    }

    /// Proposes `commands` as one log entry and waits until it commits (see
    /// [`Node::submit_batch`]).
    pub fn propose_batch<'a>(
        &self,
        commands: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<BatchCommitted, ProposeError> {
        self.submit_batch(commands)?.wait()
    }
}

/// A batch whose outcome is not known yet.
#[derive(Debug)]
pub struct PendingBatch {
    pending: Pending,
    count: usize,
}

impl PendingBatch {
    /// How many commands the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the batch holds no command.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Waits for the outcome, the same for every command of the batch.
    pub fn wait(self) -> Result<BatchCommitted, ProposeError> {
        let count = self.count;
        self.pending.wait().map(|c| BatchCommitted::new(c, count))
    }

    /// The outcome if it is known, without waiting.
    pub fn try_take(&self) -> Option<Result<BatchCommitted, ProposeError>> {
        self.pending.try_take().map(|outcome| outcome.map(|c| BatchCommitted::new(c, self.count)))
    }
}

/// A committed batch: the log entry that holds it, and each command's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchCommitted {
    entry: u64,
    count: usize,
    /// Each reply as its length (u32 LE) and its bytes, in command order.
    replies: Vec<u8>,
}

impl BatchCommitted {
    fn new(committed: Committed, count: usize) -> Self {
        Self { entry: committed.index.entry, count, replies: committed.reply }
    }

    /// The log index of the entry that holds the batch.
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// How many commands committed.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the batch held no command.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Each command's index and reply, in the order the batch held them.
    pub fn iter(&self) -> impl Iterator<Item = (Index, &[u8])> + '_ {
        let mut rest = self.replies.as_slice();
        (0..self.count as u32).map(move |position| {
            let len = rest
                .split_first_chunk::<4>()
                .map_or(0, |(len, _)| u32::from_le_bytes(*len) as usize)
                .min(rest.len().saturating_sub(4));
            let reply = rest.get(4..4 + len).unwrap_or_default();
            rest = rest.get(4 + len..).unwrap_or_default();
            (Index { entry: self.entry, position }, reply)
        })
    }
}
