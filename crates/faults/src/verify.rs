//! The checks after the load stops: final reads of every key, no acknowledged write lost,
//! replicas converged (equal `applied` and `digest`), and the porcupine linearizability checker.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::history::{OpKind, OpRecord, Outcome};
use crate::target::{NodeStatus, StatusError, Target};
use crate::workload::{Client, KeyKind, TOKEN_END};

/// Reads every key once through the leader (retrying refusals until `deadline`). Every attempt
/// joins the history; returns the successful read of each key.
pub(crate) fn final_reads(client: &mut Client<'_>, keys: &[String], deadline: Instant) -> (Vec<OpRecord>, Vec<String>) {
    let mut attempts = Vec::new();
    let mut unread = Vec::new();
    for key in keys {
        loop {
            let op = client.invoke(OpKind::Get, key.clone(), None);
            let ok = op.outcome == Outcome::Ok;
            attempts.push(op);
            if ok {
                break;
            }
            if Instant::now() >= deadline {
                unread.push(key.clone());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (attempts, unread)
}

/// Acknowledged writes missing from the final state (and final values no write produced),
/// checked directly from the history: a second, plainer statement of what linearizability of
/// the final reads implies, which names the lost write.
pub(crate) fn lost_writes(history: &[OpRecord], finals: &[OpRecord]) -> Vec<String> {
    let mut by_key: HashMap<&str, Vec<&OpRecord>> = HashMap::new();
    for op in history {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let mut problems = Vec::new();
    for fin in finals.iter().filter(|f| f.op == OpKind::Get && f.outcome == Outcome::Ok) {
        let ops = by_key.get(fin.key.as_str()).map_or(&[][..], Vec::as_slice);
        match KeyKind::of(&fin.key) {
            Some(KeyKind::Counter) => check_counter(&fin.key, ops, &fin.result, &mut problems),
            Some(KeyKind::Log) => check_log(&fin.key, ops, &fin.result, &mut problems),
            Some(KeyKind::Register) => check_register(&fin.key, ops, &fin.result, &mut problems),
            None => {}
        }
    }
    problems
}

fn count(ops: &[&OpRecord], kind: OpKind, outcome: Outcome) -> u64 {
    ops.iter().filter(|o| o.op == kind && o.outcome == outcome).count() as u64
}

fn check_counter(key: &str, ops: &[&OpRecord], fin: &Value, problems: &mut Vec<String>) {
    let value = match fin {
        Value::Null => Some(0),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    };
    let (acked, unknown) = (count(ops, OpKind::Incr, Outcome::Ok), count(ops, OpKind::Incr, Outcome::Info));
    match value {
        Some(v) if v < acked => problems.push(format!("{key}: final value {v} < {acked} acknowledged increments")),
        Some(v) if v > acked + unknown => {
            problems.push(format!("{key}: final value {v} > {acked} acknowledged + {unknown} unknown increments"))
        }
        Some(_) => {}
        None => problems.push(format!("{key}: final value {fin} is not a counter")),
    }
}

fn check_log(key: &str, ops: &[&OpRecord], fin: &Value, problems: &mut Vec<String>) {
    let text = fin.as_str().unwrap_or("");
    let mut present: BTreeMap<&str, u32> = BTreeMap::new();
    for token in text.split_terminator(TOKEN_END) {
        *present.entry(token).or_default() += 1;
    }
    let attempted: HashMap<&str, Outcome> = ops
        .iter()
        .filter(|o| o.op == OpKind::Append && o.outcome != Outcome::Fail)
        .filter_map(|o| Some((o.arg.as_deref()?.trim_end_matches(TOKEN_END), o.outcome)))
        .collect();
    for (token, n) in &present {
        if !attempted.contains_key(token) {
            problems.push(format!("{key}: final value holds {token:?}, which no append wrote"));
        } else if *n > 1 {
            problems.push(format!("{key}: final value holds {token:?} {n} times"));
        }
    }
    // Appends acknowledged after every delete that may have run must all be there.
    if ops.iter().any(|o| o.op == OpKind::Del && o.outcome == Outcome::Info) {
        return;
    }
    let last_delete = ops.iter().filter(|o| o.op == OpKind::Del && o.outcome == Outcome::Ok).map(|o| o.return_ns).max();
    for op in ops.iter().filter(|o| o.op == OpKind::Append && o.outcome == Outcome::Ok) {
        let token = op.arg.as_deref().unwrap_or("").trim_end_matches(TOKEN_END);
        if last_delete.is_none_or(|d| op.call_ns > d) && !present.contains_key(token) {
            problems.push(format!("{key}: acknowledged append {token:?} is missing from the final value"));
        }
    }
}

fn check_register(key: &str, ops: &[&OpRecord], fin: &Value, problems: &mut Vec<String>) {
    let Some(value) = fin.as_str() else { return };
    let writer =
        ops.iter().find(|o| o.op == OpKind::Set && o.outcome != Outcome::Fail && o.arg.as_deref() == Some(value));
    let Some(writer) = writer else {
        problems.push(format!("{key}: final value {value:?} was never written"));
        return;
    };
    if writer.outcome == Outcome::Ok {
        // Overwritten for sure: another acknowledged write began after this one returned.
        if let Some(later) = ops.iter().find(|o| {
            matches!(o.op, OpKind::Set | OpKind::Del) && o.outcome == Outcome::Ok && o.call_ns > writer.return_ns
        }) {
            problems.push(format!(
                "{key}: final value {value:?}, but the acknowledged {:?} of client {} came after it (lost)",
                later.op, later.client
            ));
        }
    }
}

/// Whether the replicas converged, and what each one reported last.
#[derive(Debug, Serialize)]
pub(crate) struct Convergence {
    pub(crate) converged: bool,
    pub(crate) statuses: Vec<Result<NodeStatus, StatusError>>,
    /// Removed members that stopped only now and were started again as spares, and why any
    /// could not be.
    pub(crate) restarted: Vec<usize>,
    pub(crate) restart_errors: Vec<String>,
}

/// Waits until every node, spares included, reports the same `applied`, `digest` and
/// configuration (members and epoch). A removed member asked to leave that stops only now is
/// started again as a spare.
pub(crate) fn convergence(target: &Target, deadline: Instant) -> Convergence {
    let (mut restarted, mut restart_errors) = (Vec::new(), Vec::new());
    loop {
        match target.restart_departed(&BTreeSet::new()) {
            Ok(started) => restarted.extend(started),
            Err(e) => restart_errors.push(e.to_string()),
        }
        let statuses: Vec<Result<NodeStatus, StatusError>> =
            (0..target.nodes.len()).map(|i| target.status(i, Duration::from_millis(500))).collect();
        let first = statuses.first().and_then(|s| s.as_ref().ok());
        let converged = first
            .is_some_and(|f| f.digest.is_some() && statuses.iter().all(|s| s.as_ref().is_ok_and(|s| same_state(f, s))));
        if converged || Instant::now() >= deadline {
            return Convergence { converged, statuses, restarted, restart_errors };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether two nodes applied as far, to the same state, under the same configuration.
fn same_state(a: &NodeStatus, b: &NodeStatus) -> bool {
    (a.applied, &a.digest, &a.members, a.epoch) == (b.applied, &b.digest, &b.members, b.epoch)
}

/// The porcupine checker's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Linearizability {
    Linearizable,
    NotLinearizable,
    Inconclusive,
    CheckerFailed,
}

/// Runs the checker on `history`, its report into `report`, the HTML view of a violation into
/// `html`.
pub(crate) fn check_linearizability(
    checker: &Path,
    history: &Path,
    report: &Path,
    html: &Path,
    timeout: Duration,
) -> Linearizability {
    let output = Command::new(checker)
        .arg("-timeout")
        .arg(format!("{}s", timeout.as_secs().max(1)))
        .arg("-html")
        .arg(html)
        .arg(history)
        .output();
    let (verdict, text) = match output {
        Ok(out) => {
            let verdict = match out.status.code() {
                Some(0) => Linearizability::Linearizable,
                Some(1) => Linearizability::NotLinearizable,
                Some(3) => Linearizability::Inconclusive,
                _ => Linearizability::CheckerFailed,
            };
            (verdict, [out.stdout, out.stderr].concat())
        }
        Err(e) => (Linearizability::CheckerFailed, format!("running {}: {e}\n", checker.display()).into_bytes()),
    };
    if verdict == Linearizability::Linearizable {
        let _ = std::fs::remove_file(html);
    }
    let _ = std::fs::write(report, text);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: OpKind, key: &str, arg: Option<&str>, span: (u64, u64), outcome: Outcome, result: Value) -> OpRecord {
        OpRecord {
            client: 0,
            op: kind,
            key: key.into(),
            arg: arg.map(Into::into),
            call_ns: span.0,
            return_ns: span.1,
            outcome,
            result,
            error: None,
        }
    }

    fn get(key: &str, value: Value) -> OpRecord {
        op(OpKind::Get, key, None, (1000, 1001), Outcome::Ok, value)
    }

    /// Two nodes converged only if they also hold the same configuration: a replica that took a
    /// membership entry for a no-op has the same state but other members or another epoch.
    #[test]
    fn convergence_needs_the_same_configuration_too() {
        let status = |members: &str, epoch: u64| -> NodeStatus {
            serde_json::from_str(&format!(
                r#"{{"node":0,"role":"follower","leader":1,"phase":"follow","proposal_number":1,"fuo":9,"applied":9,
                    "tail":0,"confirmed":[],"pending":0,"terms_led":0,"prepares":0,"recovering":false,
                    "digest":"ab12","fingerprint":"00","uptime_ms":5,"leader_changes":[],"fatal":null,
                    "members":[{members}],"epoch":{epoch}}}"#
            ))
            .expect("a status")
        };
        assert!(same_state(&status("0,1,3", 2), &status("0,1,3", 2)));
        assert!(!same_state(&status("0,1,3", 2), &status("0,1,2", 2)), "other members");
        assert!(!same_state(&status("0,1,3", 2), &status("0,1,3", 4)), "another epoch");
    }

    #[test]
    fn counters_account_for_every_acknowledged_increment() {
        let h = vec![
            op(OpKind::Incr, "c0", None, (0, 1), Outcome::Ok, Value::from(1)),
            op(OpKind::Incr, "c0", None, (2, 3), Outcome::Ok, Value::from(2)),
            op(OpKind::Incr, "c0", None, (4, 5), Outcome::Info, Value::Null),
        ];
        assert!(lost_writes(&h, &[get("c0", Value::from("2"))]).is_empty());
        assert!(lost_writes(&h, &[get("c0", Value::from("3"))]).is_empty());
        assert_eq!(lost_writes(&h, &[get("c0", Value::from("1"))]).len(), 1, "an increment was lost");
        assert_eq!(lost_writes(&h, &[get("c0", Value::from("4"))]).len(), 1, "an increment ran twice");
    }

    #[test]
    fn logs_hold_every_acknowledged_append_once() {
        let h = vec![
            op(OpKind::Append, "a0", Some("0.1,"), (0, 1), Outcome::Ok, Value::from(4)),
            op(OpKind::Append, "a0", Some("0.2,"), (2, 3), Outcome::Info, Value::Null),
            op(OpKind::Append, "a0", Some("0.3,"), (4, 5), Outcome::Fail, Value::Null),
        ];
        assert!(lost_writes(&h, &[get("a0", Value::from("0.1,"))]).is_empty());
        assert!(lost_writes(&h, &[get("a0", Value::from("0.1,0.2,"))]).is_empty());
        assert_eq!(lost_writes(&h, &[get("a0", Value::Null)]).len(), 1, "0.1 lost");
        assert_eq!(lost_writes(&h, &[get("a0", Value::from("0.1,0.3,"))]).len(), 1, "a failed append applied");
        assert_eq!(lost_writes(&h, &[get("a0", Value::from("0.1,0.1,"))]).len(), 1, "applied twice");
    }

    #[test]
    fn registers_hold_the_last_acknowledged_write() {
        let h = vec![
            op(OpKind::Set, "r0", Some("a"), (0, 1), Outcome::Ok, Value::from("OK")),
            op(OpKind::Set, "r0", Some("b"), (2, 3), Outcome::Ok, Value::from("OK")),
            op(OpKind::Set, "r0", Some("c"), (4, 5), Outcome::Fail, Value::Null),
        ];
        assert!(lost_writes(&h, &[get("r0", Value::from("b"))]).is_empty());
        assert_eq!(lost_writes(&h, &[get("r0", Value::from("a"))]).len(), 1, "b was lost");
        assert_eq!(lost_writes(&h, &[get("r0", Value::from("c"))]).len(), 1, "a failed write applied");
        assert_eq!(lost_writes(&h, &[get("r0", Value::from("z"))]).len(), 1, "never written");
    }
}
