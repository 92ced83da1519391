//! Invariant checkers. The [`Ledger`] checks every application online (agreement, validity,
//! no holes, no request committed twice); [`check_history`] checks the clients' history for
//! linearizability once a run ends.

use std::collections::BTreeMap;

use microrep_fabric::NodeId;

use crate::app::{Command, execute};

/// The cluster-wide record of what each log index holds, fed by every replica's application.
#[derive(Debug, Default)]
pub struct Ledger {
    chosen: BTreeMap<u64, Vec<u8>>,
    issued: BTreeMap<(u32, u64), Command>,
    committed_at: BTreeMap<(u32, u64), u64>,
    /// Broken invariants, in the order found.
    pub violations: Vec<String>,
    /// Applications seen (all replicas).
    pub applications: u64,
}

impl Ledger {
    /// Registers a command a client is about to propose (validity: only these may be applied).
    pub fn issue(&mut self, command: Command) {
        self.issued.insert((command.client, command.seq), command);
    }

    /// A replica applied `command` at `index` while expecting `expected_next`.
    pub fn applied(&mut self, node: NodeId, index: u64, expected_next: u64, command: &[u8]) {
        self.applications += 1;
        if index != expected_next {
            self.violations
                .push(format!("no holes: {node} applied index {index} but its next index was {expected_next}"));
        }
        match self.chosen.get(&index) {
            Some(first) if first.as_slice() != command => {
                self.violations.push(format!("agreement: {node} applied a different command at index {index}"));
            }
            Some(_) => {}
            None => {
                self.chosen.insert(index, command.to_vec());
                if command.is_empty() {
                    return;
                }
                match Command::decode(command) {
                    Some(c) if self.issued.get(&(c.client, c.seq)) == Some(&c) => {
                        if let Some(other) = self.committed_at.insert((c.client, c.seq), index) {
                            self.violations.push(format!(
                                "integrity: client {} request {} committed at index {other} and again at {index}",
                                c.client, c.seq
                            ));
                        }
                    }
                    _ => self.violations.push(format!("validity: index {index} holds a command no client issued")),
                }
            }
        }
    }

    /// A replica restored a snapshot at `index` while its next index was `previous_next`.
    pub fn restored(&mut self, node: NodeId, index: u64, previous_next: u64) {
        if index < previous_next {
            self.violations
                .push(format!("{node} restored a snapshot at {index}, behind its next index {previous_next}"));
        }
    }

    /// What was chosen at `index`: `Some(None)` for a no-op, `None` if no replica applied it.
    pub fn chosen(&self, index: u64) -> Option<Option<Command>> {
        self.chosen.get(&index).map(|b| Command::decode(b))
    }

    /// Where a request was committed, if it was.
    pub fn committed_at(&self, client: u32, seq: u64) -> Option<u64> {
        self.committed_at.get(&(client, seq)).copied()
    }

    /// Indices applied by some replica.
    pub fn chosen_len(&self) -> u64 {
        self.chosen.keys().next_back().map_or(0, |&i| i + 1)
    }
}

/// What became of one client operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still waiting.
    Pending,
    /// Committed at `index`, answered `answer`, at `at_ns`.
    Acked {
        /// Log index.
        index: u64,
        /// What the client was told.
        answer: u64,
        /// When.
        at_ns: u64,
    },
    /// The replica it was sent to stopped leading after writing it: it may or may not commit.
    Unknown,
    /// Refused before it was written anywhere: it must never commit.
    NotCommitted,
}

/// One operation of a client history.
#[derive(Clone, Copy, Debug)]
pub struct OpRecord {
    /// The command.
    pub command: Command,
    /// When the client invoked it.
    pub invoke_ns: u64,
    /// What became of it.
    pub outcome: Outcome,
}

/// How much of a history was checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistoryReport {
    /// Operations acknowledged to clients.
    pub acked: usize,
    /// Operations with unknown outcome.
    pub unknown: usize,
    /// Log indices re-executed against the sequential specification.
    pub replayed: u64,
}

/// A history that is not linearizable: which operation, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HistoryViolation(pub String);

/// Linearizability of a replicated-log history: every acknowledged operation sits at its
/// index with the answer the sequential specification gives there, and the index order (the
/// linearization) respects real time: if A was acknowledged before B was invoked, A's index is
/// lower. Operations refused before being written must not be in the log.
pub fn check_history(history: &[OpRecord], ledger: &Ledger) -> Result<HistoryReport, HistoryViolation> {
    let mut state = BTreeMap::new();
    let mut answers = BTreeMap::new();
    let mut replayed = 0;
    while let Some(chosen) = ledger.chosen(replayed) {
        if let Some(c) = chosen {
            answers.insert(replayed, execute(&mut state, c.op));
        }
        replayed += 1;
    }
    let mut report = HistoryReport { replayed, ..HistoryReport::default() };
    let mut acked: Vec<(u64, u64, u64)> = Vec::new();
    for r in history {
        let (client, seq) = (r.command.client, r.command.seq);
        match r.outcome {
            Outcome::Acked { index, answer, at_ns } => {
                report.acked += 1;
                if ledger.committed_at(client, seq) != Some(index) {
                    return Err(HistoryViolation(format!(
                        "client {client} request {seq} was acknowledged at index {index}, which holds another command"
                    )));
                }
                if let Some(&expected) = answers.get(&index)
                    && expected != answer
                {
                    return Err(HistoryViolation(format!(
                        "client {client} request {seq} at index {index} was answered {answer}; the specification says {expected}"
                    )));
                }
                acked.push((index, r.invoke_ns, at_ns));
            }
            Outcome::NotCommitted => {
                if let Some(index) = ledger.committed_at(client, seq) {
                    return Err(HistoryViolation(format!(
                        "client {client} request {seq} was refused, yet committed at index {index}"
                    )));
                }
            }
            Outcome::Unknown => report.unknown += 1,
            Outcome::Pending => {}
        }
    }
    acked.sort_unstable();
    let mut earliest_ack_above = u64::MAX;
    for &(index, invoke_ns, ack_ns) in acked.iter().rev() {
        if earliest_ack_above < invoke_ns {
            return Err(HistoryViolation(format!(
                "real-time order: an operation at a higher index than {index} was acknowledged before the one at {index} was invoked"
            )));
        }
        earliest_ack_above = earliest_ack_above.min(ack_ns);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::Op;

    fn cmd(client: u32, seq: u64, op: Op) -> Command {
        Command { client, seq, op }
    }

    fn ledger_with(commands: &[Command]) -> Ledger {
        let mut l = Ledger::default();
        for (i, c) in commands.iter().enumerate() {
            l.issue(*c);
            l.applied(NodeId(0), i as u64, i as u64, &c.encode());
        }
        l
    }

    #[test]
    fn ledger_catches_disagreement_holes_and_inventions() {
        let put = cmd(1, 1, Op::Put { key: 1, value: 5 });
        let mut l = ledger_with(&[put]);
        assert!(l.violations.is_empty());
        l.applied(NodeId(1), 0, 0, &cmd(1, 2, Op::Get { key: 1 }).encode());
        assert!(l.violations[0].starts_with("agreement"));
        l.applied(NodeId(1), 5, 1, &put.encode());
        assert!(l.violations[1].starts_with("no holes"));
        assert!(l.violations.iter().any(|v| v.starts_with("integrity")), "{:?}", l.violations);
        l.applied(NodeId(2), 6, 6, &cmd(9, 9, Op::Get { key: 0 }).encode());
        assert!(l.violations.iter().any(|v| v.starts_with("validity")));
    }

    #[test]
    fn history_checks_answers_and_real_time_order() {
        let a = cmd(1, 1, Op::Put { key: 1, value: 5 });
        let b = cmd(2, 1, Op::Get { key: 1 });
        let l = ledger_with(&[a, b]);
        let ok = [
            OpRecord { command: a, invoke_ns: 0, outcome: Outcome::Acked { index: 0, answer: 0, at_ns: 10 } },
            OpRecord { command: b, invoke_ns: 5, outcome: Outcome::Acked { index: 1, answer: 5, at_ns: 20 } },
        ];
        assert_eq!(check_history(&ok, &l).map(|r| r.acked), Ok(2));
        let mut wrong_answer = ok;
        wrong_answer[1].outcome = Outcome::Acked { index: 1, answer: 0, at_ns: 20 };
        assert!(check_history(&wrong_answer, &l).is_err());
        let mut stale = ok;
        stale[0].invoke_ns = 30;
        stale[0].outcome = Outcome::Acked { index: 0, answer: 0, at_ns: 40 };
        assert!(
            check_history(&stale, &l).expect_err("b acked before a began, yet ordered after").0.contains("real-time")
        );
        let refused = [OpRecord { command: a, invoke_ns: 0, outcome: Outcome::NotCommitted }];
        assert!(check_history(&refused, &l).is_err());
    }
}
