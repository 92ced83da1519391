//! The replicated commands of one turn of the event loop, from all its clients, proposed
//! together once the turn has read every ready client: as few log entries as fit (Mu §7.4's
//! batching, done by the serving thread itself, so direct mode batches without a hand-off to
//! the replication thread). Entries are proposed in the order their commands were read, so a
//! client's pipelined commands commit in its order.

use std::cell::RefCell;
use std::rc::Rc;

use microrep::{BatchCommitted, MAX_BATCH_COMMANDS, Node, Pending, PendingBatch, ProposeError, batch_entry_bytes};

/// One log entry's commands, shared by the replies waiting for it.
#[derive(Debug)]
pub(crate) struct Group {
    state: RefCell<State>,
}

#[derive(Debug)]
enum State {
    /// Read this turn, not proposed yet: the commands back to back, and where each ends.
    Open { bytes: Vec<u8>, ends: Vec<usize> },
    /// Proposed alone (a single-command entry).
    Single(Pending),
    /// Proposed as a batch.
    Batch(PendingBatch),
    /// Committed: each command's reply, taken once by the reply that waits for it.
    Committed(Vec<Option<Vec<u8>>>),
    /// Refused, or its outcome unknown: the same for every command.
    Failed(ProposeError),
}

impl Group {
    /// `command` proposed at once, alone (handover mode, see [`Turn`]).
    pub(crate) fn proposed(node: &Node, command: &[u8]) -> Rc<Self> {
        let state = node.submit(command).map_or_else(State::Failed, State::Single);
        Rc::new(Self { state: RefCell::new(state) })
    }

    /// Command `position`'s reply, waiting for the entry to commit if it has not yet (in
    /// direct mode the calling thread drives replication meanwhile).
    pub(crate) fn reply(&self, position: usize) -> Result<Vec<u8>, ProposeError> {
        let mut state = self.state.borrow_mut();
        *state = match std::mem::replace(&mut *state, State::Failed(ProposeError::Unknown)) {
            State::Single(pending) => settle(pending.wait().map(|c| vec![Some(c.reply)])),
            State::Batch(pending) => settle(pending.wait().map(|c| replies(&c))),
            other => other,
        };
        match &mut *state {
            State::Committed(replies) => replies.get_mut(position).and_then(Option::take).ok_or(ProposeError::Unknown),
            State::Failed(e) => Err(e.clone()),
            // Taken before its turn proposed the group (the event loop never does): the
            // command may yet be proposed, so its outcome is unknown, never a wrong reply.
            State::Open { .. } | State::Single(_) | State::Batch(_) => Err(ProposeError::Unknown),
        }
    }
}

fn settle(outcome: Result<Vec<Option<Vec<u8>>>, ProposeError>) -> State {
    outcome.map_or_else(State::Failed, State::Committed)
}

fn replies(committed: &BatchCommitted) -> Vec<Option<Vec<u8>>> {
    committed.iter().map(|(_, reply)| Some(reply.to_vec())).collect()
}

/// The groups of the turn being read. Only direct mode collects them: in handover mode each
/// command is proposed as soon as it is read ([`Group::proposed`]), because the replication
/// thread batches what waits in its queue and starts on the first command while this thread
/// still reads the next clients (a turn's batch measured slower there at 32 clients,
/// docs/BENCHMARKS.md).
#[derive(Debug, Default)]
pub(crate) struct Turn {
    open: Vec<Rc<Group>>,
}

impl Turn {
    /// Adds `command` to the turn, to the last group if the batch still fits `max_entry`
    /// bytes, else to a new one (a group of one command is proposed as a single-command
    /// entry, so a command too long for any batch still gets the log's own error). Returns
    /// the group and the command's position in it.
    pub(crate) fn add(&mut self, command: &[u8], max_entry: usize) -> (Rc<Group>, usize) {
        if let Some(group) = self.open.last()
            && let State::Open { bytes, ends } = &mut *group.state.borrow_mut()
        {
            let fits = batch_entry_bytes(ends.len() + 1, bytes.len() + command.len()) <= max_entry;
            if fits && ends.len() < MAX_BATCH_COMMANDS {
                bytes.extend_from_slice(command);
                ends.push(bytes.len());
                return (Rc::clone(group), ends.len() - 1);
            }
        }
        let group =
            Rc::new(Group { state: RefCell::new(State::Open { bytes: command.to_vec(), ends: vec![command.len()] }) });
        self.open.push(Rc::clone(&group));
        (group, 0)
    }

    /// Proposes every group read so far, in order, without waiting.
    pub(crate) fn propose(&mut self, node: &Node) {
        for group in self.open.drain(..) {
            let mut state = group.state.borrow_mut();
            let State::Open { bytes, ends } = &*state else { continue };
            let proposed = if ends.len() == 1 {
                node.submit(bytes).map(State::Single)
            } else {
                node.submit_batch(split(bytes, ends)).map(State::Batch)
            };
            *state = proposed.unwrap_or_else(State::Failed);
        }
    }
}

/// The commands of an open group: `bytes` cut at `ends`.
fn split<'a>(bytes: &'a [u8], ends: &'a [usize]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let starts = std::iter::once(0).chain(ends.iter().copied());
    starts.zip(ends.iter().copied()).map(move |(start, end)| &bytes[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(group: &Group) -> Vec<Vec<u8>> {
        match &*group.state.borrow() {
            State::Open { bytes, ends } => split(bytes, ends).map(<[u8]>::to_vec).collect(),
            _ => panic!("not open"),
        }
    }

    #[test]
    fn commands_share_a_group_while_the_batch_fits_the_entry() {
        let mut turn = Turn::default();
        // Two 10-byte commands take 3 + 2 * (4 + 10) = 31 bytes as a batch.
        let max = batch_entry_bytes(2, 20);
        let (a, at_a) = turn.add(b"aaaaaaaaaa", max);
        let (b, at_b) = turn.add(b"bbbbbbbbbb", max);
        let (c, at_c) = turn.add(b"c", max);
        assert!(Rc::ptr_eq(&a, &b) && !Rc::ptr_eq(&b, &c));
        assert_eq!((at_a, at_b, at_c), (0, 1, 0));
        assert_eq!(commands(&a), vec![b"aaaaaaaaaa".to_vec(), b"bbbbbbbbbb".to_vec()]);
        assert_eq!(commands(&c), vec![b"c".to_vec()]);
        assert_eq!(turn.open.len(), 2);
    }

    #[test]
    fn a_command_too_long_for_a_batch_is_a_group_of_its_own() {
        let mut turn = Turn::default();
        let max = 16;
        // 12 bytes: no batch holds it (3 + 4 + 12 > 16), a single-command entry does (1 + 12).
        let (small, _) = turn.add(b"s", max);
        let (long, at) = turn.add(&[7; 12], max);
        let (next, at_next) = turn.add(b"t", max);
        assert!(!Rc::ptr_eq(&small, &long) && !Rc::ptr_eq(&long, &next));
        assert_eq!((at, at_next), (0, 0));
        assert_eq!(commands(&long), vec![vec![7; 12]]);
    }

    #[test]
    fn a_reply_taken_before_its_turn_was_proposed_is_unknown_not_a_wrong_answer() {
        let mut turn = Turn::default();
        let (group, at) = turn.add(b"x", 64);
        assert_eq!(group.reply(at), Err(ProposeError::Unknown));
    }
}
