//! The checkers: they see every delivery batch and, as an oracle, every member's state.

use std::collections::HashMap;

use microrep_fabric::NodeId;

/// A sent message, as the checker remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Who sent it.
    pub sender: NodeId,
    /// Its bytes.
    pub payload: Vec<u8>,
}

/// What a checker found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two members delivered different messages at the same position of a subgroup's order.
    Agreement {
        /// Subgroup.
        subgroup: usize,
        /// Position in the delivered order (0 = first message).
        position: usize,
        /// What the first member to deliver it had there: (sender, seq).
        first: (NodeId, u64),
        /// What this member has there.
        this: (NodeId, u64),
        /// This member.
        member: NodeId,
    },
    /// A member delivered sequence numbers out of order or twice.
    Duplicate {
        /// Subgroup.
        subgroup: usize,
        /// Member.
        member: NodeId,
        /// The repeated or backwards seq.
        seq: u64,
    },
    /// A delivered message that was never sent, or with other bytes or another sender.
    Validity {
        /// Subgroup.
        subgroup: usize,
        /// Member.
        member: NodeId,
        /// Its seq.
        seq: u64,
        /// What went wrong.
        detail: String,
    },
    /// A member delivered a message some member of the subgroup had not received.
    Stability {
        /// Subgroup.
        subgroup: usize,
        /// The delivering member.
        member: NodeId,
        /// The message's seq.
        seq: u64,
        /// A member without it.
        missing_at: NodeId,
    },
    /// After the faults stopped, the members did not all deliver every sent message, or the
    /// group kept writing once idle.
    Liveness(String),
    /// After a view change: members of the new view delivered different messages, missed one
    /// another member delivered, or two views (or a minority view) were installed.
    VirtualSynchrony(String),
    /// A member's poll returned an error.
    Poll(String),
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Agreement { subgroup, position, first, this, member } => write!(
                f,
                "agreement: subgroup {subgroup} position {position}: {member} delivered (from {}, seq {}) where another delivered (from {}, seq {})",
                this.0, this.1, first.0, first.1
            ),
            Self::Duplicate { subgroup, member, seq } => {
                write!(f, "duplicate: {member} delivered seq {seq} of subgroup {subgroup} again or out of order")
            }
            Self::Validity { subgroup, member, seq, detail } => {
                write!(f, "validity: {member} delivered seq {seq} of subgroup {subgroup}: {detail}")
            }
            Self::Stability { subgroup, member, seq, missing_at } => write!(
                f,
                "stability: {member} delivered seq {seq} of subgroup {subgroup} before {missing_at} received it"
            ),
            Self::Liveness(detail) => write!(f, "liveness: {detail}"),
            Self::VirtualSynchrony(detail) => write!(f, "virtual synchrony: {detail}"),
            Self::Poll(detail) => write!(f, "poll error: {detail}"),
        }
    }
}

/// The delivered orders and the sent messages of one run.
#[derive(Debug, Default)]
pub struct Checker {
    /// Per subgroup: the order as first delivered, (sender, seq).
    order: Vec<Vec<(NodeId, u64)>>,
    /// Per (subgroup, member): how many messages it delivered and its last seq.
    progress: HashMap<(usize, NodeId), (usize, Option<u64>)>,
    /// Per (subgroup, seq): the message sent.
    sent: HashMap<(usize, u64), Sent>,
}

impl Checker {
    /// A checker for `subgroups` subgroups.
    pub fn new(subgroups: usize) -> Self {
        Self { order: vec![Vec::new(); subgroups], ..Self::default() }
    }

    /// Records a sent message.
    pub fn sent(&mut self, subgroup: usize, seq: u64, sent: Sent) {
        let previous = self.sent.insert((subgroup, seq), sent);
        assert!(previous.is_none(), "the core returned seq {seq} of subgroup {subgroup} twice");
    }

    /// Messages sent in `subgroup`.
    pub fn sent_count(&self, subgroup: usize) -> usize {
        self.sent.keys().filter(|k| k.0 == subgroup).count()
    }

    /// Messages `member` delivered in `subgroup`.
    pub fn delivered_count(&self, subgroup: usize, member: NodeId) -> usize {
        self.progress.get(&(subgroup, member)).map_or(0, |p| p.0)
    }

    /// Checks one delivered message against the order, the sent messages and the member's own
    /// history (agreement, no duplicates, validity).
    pub fn delivered(
        &mut self,
        subgroup: usize,
        member: NodeId,
        sender: NodeId,
        seq: u64,
        payload: &[u8],
    ) -> Result<(), Violation> {
        let (count, last) = self.progress.entry((subgroup, member)).or_insert((0, None));
        if last.is_some_and(|last| seq <= last) {
            return Err(Violation::Duplicate { subgroup, member, seq });
        }
        let validity = |detail: String| Violation::Validity { subgroup, member, seq, detail };
        match self.sent.get(&(subgroup, seq)) {
            None => return Err(validity("no such message was sent".into())),
            Some(sent) if sent.sender != sender => {
                return Err(validity(format!("sent by {}, delivered as from {sender}", sent.sender)));
            }
            Some(sent) if sent.payload != payload => {
                return Err(validity(format!(
                    "{} bytes sent, {} bytes delivered, first difference at byte {}",
                    sent.payload.len(),
                    payload.len(),
                    sent.payload.iter().zip(payload).take_while(|(a, b)| a == b).count()
                )));
            }
            Some(_) => {}
        }
        let order = &mut self.order[subgroup];
        let position = *count;
        match order.get(position) {
            None => order.push((sender, seq)),
            Some(&first) if first != (sender, seq) => {
                return Err(Violation::Agreement { subgroup, position, first, this: (sender, seq), member });
            }
            Some(_) => {}
        }
        *count += 1;
        *last = Some(seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(sender: u16, payload: &[u8]) -> Sent {
        Sent { sender: NodeId(sender), payload: payload.to_vec() }
    }

    #[test]
    fn each_checker_can_fail() {
        let mut c = Checker::new(1);
        c.sent(0, 0, sent(0, b"a"));
        c.sent(0, 1, sent(1, b"b"));
        c.delivered(0, NodeId(0), NodeId(0), 0, b"a").expect("valid");
        assert!(matches!(c.delivered(0, NodeId(0), NodeId(0), 0, b"a"), Err(Violation::Duplicate { .. })));
        assert!(matches!(c.delivered(0, NodeId(1), NodeId(1), 1, b"b"), Err(Violation::Agreement { .. })));
        assert!(matches!(c.delivered(0, NodeId(2), NodeId(0), 0, b"x"), Err(Violation::Validity { .. })));
        assert!(matches!(c.delivered(0, NodeId(2), NodeId(1), 0, b"a"), Err(Violation::Validity { .. })));
        assert!(matches!(c.delivered(0, NodeId(2), NodeId(0), 7, b"a"), Err(Violation::Validity { .. })));
        c.delivered(0, NodeId(1), NodeId(0), 0, b"a").expect("same order");
        c.delivered(0, NodeId(1), NodeId(1), 1, b"b").expect("same order");
        assert_eq!((c.delivered_count(0, NodeId(1)), c.sent_count(0)), (2, 2));
    }
}
