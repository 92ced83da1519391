//! The checkers: they see every delivery batch and, as an oracle, every member's state.

use std::collections::{HashMap, HashSet};

use microrep_fabric::NodeId;

/// A sent message, as the checker remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Who sent it.
    pub sender: NodeId,
    /// The sender's view (epoch) when it sent it.
    pub epoch: u64,
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
    /// In a subgroup that delivers at receipt, a member delivered a sender's messages out of
    /// the order they were sent in.
    SenderOrder {
        /// Subgroup.
        subgroup: usize,
        /// Member.
        member: NodeId,
        /// The sender.
        sender: NodeId,
    },
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
            Self::SenderOrder { subgroup, member, sender } => {
                write!(f, "sender order: {member} delivered {sender}'s messages of subgroup {subgroup} out of order")
            }
        }
    }
}

/// A message's identity: the first 8 bytes of every payload the simulator sends.
pub fn message_id(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.get(..8)?.try_into().ok()?))
}

/// The delivered orders and the sent messages of one run, across views.
#[derive(Debug, Default)]
pub struct Checker {
    /// Per (epoch, subgroup): the order as first delivered, (sender, seq).
    order: HashMap<(u64, usize), Vec<(NodeId, u64)>>,
    /// Per (epoch, subgroup, member): how many messages it delivered and its last seq.
    progress: HashMap<(u64, usize, NodeId), (usize, Option<u64>)>,
    /// Per (subgroup, member): the ids it delivered, in any view.
    seen: HashMap<(usize, NodeId), HashSet<u64>>,
    /// Per (epoch, subgroup): the ids anyone delivered in that view.
    delivered_in: HashMap<(u64, usize), HashSet<u64>>,
    /// Per message id: the subgroup and the message sent.
    sent: HashMap<u64, (usize, Sent)>,
    /// Subgroups that deliver at receipt (`Delivery::Unordered`): no total order, no
    /// agreement at a view change; each sender's messages in its order, at most once.
    at_receipt: HashSet<usize>,
    /// Per (subgroup, member, sender), in a subgroup that delivers at receipt: the id of the
    /// last message delivered (ids rise in sending order).
    last_from: HashMap<(usize, NodeId, NodeId), u64>,
}

impl Checker {
    /// A checker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Subgroup `subgroup` delivers at receipt.
    pub fn at_receipt(&mut self, subgroup: usize) {
        self.at_receipt.insert(subgroup);
    }

    /// Whether `subgroup` delivers at receipt.
    pub fn is_at_receipt(&self, subgroup: usize) -> bool {
        self.at_receipt.contains(&subgroup)
    }

    /// Records a sent message (its payload starts with its id).
    pub fn sent(&mut self, subgroup: usize, sent: Sent) {
        let id = message_id(&sent.payload).expect("the simulator's payloads start with an id");
        let previous = self.sent.insert(id, (subgroup, sent));
        assert!(previous.is_none(), "message id {id} sent twice");
    }

    /// The ids of the messages sent in `subgroup` by `senders`.
    pub fn sent_by(&self, subgroup: usize, senders: &[NodeId]) -> HashSet<u64> {
        self.sent
            .iter()
            .filter(|(_, (s, m))| *s == subgroup && senders.contains(&m.sender))
            .map(|(&id, _)| id)
            .collect()
    }

    /// The ids of the messages sent in `subgroup` by `senders` in view `epoch`.
    pub fn sent_by_in(&self, subgroup: usize, senders: &[NodeId], epoch: u64) -> HashSet<u64> {
        self.sent
            .iter()
            .filter(|(_, (s, m))| *s == subgroup && senders.contains(&m.sender) && m.epoch == epoch)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Messages sent in `subgroup`.
    pub fn sent_count(&self, subgroup: usize) -> usize {
        self.sent.values().filter(|(s, _)| *s == subgroup).count()
    }

    /// Messages `member` delivered in `subgroup`, in every view.
    pub fn delivered_count(&self, subgroup: usize, member: NodeId) -> usize {
        self.seen.get(&(subgroup, member)).map_or(0, HashSet::len)
    }

    /// The ids anyone delivered in `subgroup` in view `epoch`.
    pub fn delivered_in(&self, epoch: u64, subgroup: usize) -> Option<&HashSet<u64>> {
        self.delivered_in.get(&(epoch, subgroup))
    }

    /// Checks one delivered message against the view's order, the sent messages and the
    /// member's own history (agreement, no duplicates across views, validity).
    pub fn delivered(
        &mut self,
        epoch: u64,
        subgroup: usize,
        member: NodeId,
        sender: NodeId,
        seq: u64,
        payload: &[u8],
    ) -> Result<(), Violation> {
        let validity = |detail: String| Violation::Validity { subgroup, member, seq, detail };
        let Some(id) = message_id(payload) else { return Err(validity("shorter than a message id".into())) };
        match self.sent.get(&id) {
            None => return Err(validity(format!("no message {id} was sent"))),
            Some((s, _)) if *s != subgroup => return Err(validity(format!("message {id} was sent to subgroup {s}"))),
            Some((_, sent)) if sent.sender != sender => {
                return Err(validity(format!("sent by {}, delivered as from {sender}", sent.sender)));
            }
            Some((_, sent)) if sent.payload != payload => {
                return Err(validity(format!(
                    "{} bytes sent, {} bytes delivered, first difference at byte {}",
                    sent.payload.len(),
                    payload.len(),
                    sent.payload.iter().zip(payload).take_while(|(a, b)| a == b).count()
                )));
            }
            Some(_) => {}
        }
        if self.at_receipt.contains(&subgroup) {
            let seen = self.seen.entry((subgroup, member)).or_default();
            if !seen.insert(id) {
                return Err(Violation::Duplicate { subgroup, member, seq });
            }
            let last = self.last_from.entry((subgroup, member, sender)).or_insert(id);
            if *last > id {
                return Err(Violation::SenderOrder { subgroup, member, sender });
            }
            *last = id;
            self.delivered_in.entry((epoch, subgroup)).or_default().insert(id);
            return Ok(());
        }
        let (count, last) = self.progress.entry((epoch, subgroup, member)).or_insert((0, None));
        let seen = self.seen.entry((subgroup, member)).or_default();
        if last.is_some_and(|last| seq <= last) || seen.contains(&id) {
            return Err(Violation::Duplicate { subgroup, member, seq });
        }
        let order = self.order.entry((epoch, subgroup)).or_default();
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
        seen.insert(id);
        self.delivered_in.entry((epoch, subgroup)).or_default().insert(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(sender: u16, id: u64, tail: &[u8]) -> Sent {
        Sent { sender: NodeId(sender), epoch: 0, payload: [&id.to_le_bytes()[..], tail].concat() }
    }

    #[test]
    fn each_checker_can_fail() {
        let mut c = Checker::new();
        let (a, b) = (sent(0, 1, b"a"), sent(1, 2, b"b"));
        c.sent(0, a.clone());
        c.sent(0, b.clone());
        c.delivered(0, 0, NodeId(0), NodeId(0), 0, &a.payload).expect("valid");
        assert!(matches!(c.delivered(0, 0, NodeId(0), NodeId(0), 0, &a.payload), Err(Violation::Duplicate { .. })));
        assert!(matches!(c.delivered(1, 0, NodeId(0), NodeId(0), 4, &a.payload), Err(Violation::Duplicate { .. })));
        assert!(matches!(c.delivered(0, 0, NodeId(1), NodeId(1), 1, &b.payload), Err(Violation::Agreement { .. })));
        assert!(matches!(
            c.delivered(0, 0, NodeId(2), NodeId(0), 0, &sent(0, 1, b"x").payload),
            Err(Violation::Validity { .. })
        ));
        assert!(matches!(c.delivered(0, 0, NodeId(2), NodeId(1), 0, &a.payload), Err(Violation::Validity { .. })));
        assert!(matches!(c.delivered(0, 1, NodeId(2), NodeId(0), 0, &a.payload), Err(Violation::Validity { .. })));
        assert!(matches!(
            c.delivered(0, 0, NodeId(2), NodeId(0), 7, &sent(0, 9, b"").payload),
            Err(Violation::Validity { .. })
        ));
        c.delivered(0, 0, NodeId(1), NodeId(0), 0, &a.payload).expect("same order");
        c.delivered(0, 0, NodeId(1), NodeId(1), 1, &b.payload).expect("same order");
        assert_eq!((c.delivered_count(0, NodeId(1)), c.sent_count(0)), (2, 2));
        assert_eq!(c.delivered_in(0, 0).map(HashSet::len), Some(2));
    }

    #[test]
    fn at_receipt_only_each_senders_order_and_at_most_once_count() {
        let mut c = Checker::new();
        c.at_receipt(1);
        let (a, b, x) = (sent(0, 1, b"a"), sent(0, 2, b"b"), sent(1, 3, b"x"));
        for m in [&a, &b, &x] {
            c.sent(1, m.clone());
        }
        // Members may interleave senders differently and see seqs out of order.
        c.delivered(0, 1, NodeId(5), NodeId(1), 1, &x.payload).expect("x first");
        c.delivered(0, 1, NodeId(5), NodeId(0), 0, &a.payload).expect("then a");
        c.delivered(0, 1, NodeId(6), NodeId(0), 2, &b.payload).expect("b without a: a may be lost");
        assert!(matches!(c.delivered(0, 1, NodeId(6), NodeId(0), 0, &a.payload), Err(Violation::SenderOrder { .. })));
        assert!(matches!(c.delivered(1, 1, NodeId(5), NodeId(1), 1, &x.payload), Err(Violation::Duplicate { .. })));
    }
}
