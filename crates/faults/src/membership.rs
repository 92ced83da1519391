//! Membership changes under the nemesis (issue 19 §4; docs/RELIABILITY.md, "Membership
//! changes"). The `replace-member` fault asks the leader, over RESP as `microrep member` does
//! (`MICROREP.MEMBER ADD|REMOVE id`), to add a running spare and then to remove a random member
//! (the leader, sometimes), asking again while the answer is one that passes (the spare still
//! catching up, another change or a new term under way, leadership moving, an unknown outcome)
//! until the fault's time is up. A removed member goes on as a spare with its memory; one time
//! in two the fault then asks its node to stop (`MICROREP.LEAVE`, as `microrep member remove`
//! does), which it does with status 0 once it applied its removal: [`Departures`] tells that
//! exit from a crash and starts the node again as a spare (fresh memory, the same
//! configuration). Either way the cluster keeps its size and its spares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use microrep_testkit::KitError;
use microrep_testkit::client::{Client, Value as Reply};
use microrep_testkit::procs::{Exit, Procs};
use microrep_testkit::reply::ErrorReply;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::target::Target;

/// What membership changes did over a history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChangeCounts {
    /// Spares made members.
    pub(crate) added: u64,
    /// Members removed.
    pub(crate) removed: u64,
    /// Of those, members that led when their removal was asked.
    pub(crate) removed_leaders: u64,
    /// Changes not made: refused for good, or still refused (or unanswered) when the fault's
    /// time ran out.
    pub(crate) refused: u64,
    /// Answers after which the change was asked again.
    pub(crate) retried: u64,
    /// Removed members left to follow as spares, with their memory.
    pub(crate) kept: u64,
    /// Removed members whose node accepted `MICROREP.LEAVE`, and of those, the ones whose
    /// process then stopped (status 0).
    pub(crate) asked_to_leave: u64,
    pub(crate) stopped: u64,
    /// Stopped members started again as spares (fresh memory).
    pub(crate) restarted: u64,
    /// Nodes that accepted `MICROREP.LEAVE` and still ran at the end of the history.
    pub(crate) not_stopped: u64,
}

impl ChangeCounts {
    /// One line for the console.
    pub(crate) fn describe(&self) -> String {
        format!(
            "added {}, removed {} ({} leaders), refused {} (asked again {} times); removed members kept as \
             spares {}, asked to leave {}, stopped {}, started again as spares {}, still running after leaving {}",
            self.added,
            self.removed,
            self.removed_leaders,
            self.refused,
            self.retried,
            self.kept,
            self.asked_to_leave,
            self.stopped,
            self.restarted,
            self.not_stopped
        )
    }

    pub(crate) fn add(&mut self, other: &Self) {
        self.added += other.added;
        self.removed += other.removed;
        self.removed_leaders += other.removed_leaders;
        self.refused += other.refused;
        self.retried += other.retried;
        self.kept += other.kept;
        self.asked_to_leave += other.asked_to_leave;
        self.stopped += other.stopped;
        self.restarted += other.restarted;
        self.not_stopped += other.not_stopped;
    }
}

/// One membership change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Add(usize),
    Remove(usize),
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Self::Add(_) => "ADD",
            Self::Remove(_) => "REMOVE",
        }
    }

    fn node(self) -> usize {
        match self {
            Self::Add(n) | Self::Remove(n) => n,
        }
    }

    /// Whether a configuration with `members` already holds the change.
    fn in_effect(self, members: &[u16]) -> bool {
        let member = members.iter().any(|&m| usize::from(m) == self.node());
        member == matches!(self, Self::Add(_))
    }
}

/// What the leader's answer to one request means.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Made (`+OK members 0,1,3 epoch 2`), or found already made by an earlier request.
    Done(String),
    /// Not made, or not known to be: ask again. `maybe_made` when the request may have been
    /// proposed (no reply, `-UNKNOWN`).
    Again { why: String, maybe_made: bool },
    /// Refused for good.
    Refused(String),
}

/// Refusals that pass (the core's `propose_membership`): the joiner catches up, starts
/// following or heartbeating (a spare started a moment ago), a change or a new term is under way.
const PASSING_REFUSALS: [&str; 5] = [
    "is not live: its heartbeat does not advance",
    "is still catching up",
    "is not a follower of this leader yet",
    "another membership change is under way",
    "this leader is still starting its term",
];

/// Refusals that say the change is already in effect (an earlier request of ours whose reply
/// was lost made it).
const ALREADY_MADE: [&str; 2] = ["is already a member", "is not a member"];

/// Reads the reply to `MICROREP.MEMBER`.
fn classify(reply: &Reply) -> Answer {
    let text = match reply {
        Reply::Simple(ok) if ok.starts_with("OK members ") => return Answer::Done(ok.clone()),
        Reply::Error(text) => text,
        other => return Answer::Refused(format!("unexpected reply {other:?}")),
    };
    match ErrorReply::parse(text) {
        ErrorReply::NotLeader { .. } | ErrorReply::NoLeader | ErrorReply::TryAgain => {
            Answer::Again { why: text.clone(), maybe_made: false }
        }
        ErrorReply::Unknown(_) => Answer::Again { why: text.clone(), maybe_made: true },
        ErrorReply::Other(_) if PASSING_REFUSALS.iter().any(|r| text.contains(r)) => {
            Answer::Again { why: text.clone(), maybe_made: false }
        }
        ErrorReply::Other(_) if ALREADY_MADE.iter().any(|r| text.contains(r)) => Answer::Done(text.clone()),
        ErrorReply::Other(_) => Answer::Refused(text.clone()),
    }
}

/// How long a status query may take.
const STATUS_TIMEOUT: Duration = Duration::from_millis(100);
/// How long one request may wait for its reply (the node answers `-UNKNOWN` after its propose
/// timeout, 1 s by default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Between two requests of one change.
const RETRY_GAP: Duration = Duration::from_millis(50);

/// Sends `change` to node `leader`.
fn ask(target: &Target, leader: usize, change: Change) -> Answer {
    let mut client = match Client::connect(target.nodes[leader], REQUEST_TIMEOUT) {
        Ok(client) => client,
        Err(e) => return Answer::Again { why: format!("node {leader}: {e}"), maybe_made: false },
    };
    let id = change.node().to_string();
    match client.call(&[b"MICROREP.MEMBER", change.verb().as_bytes(), id.as_bytes()]) {
        Ok(reply) => classify(&reply),
        Err(e) => Answer::Again { why: format!("node {leader}: {e}"), maybe_made: true },
    }
}

/// Makes `change` through whichever node leads, asking again until `deadline`. `Ok` says how
/// it was made; `Err` why not.
fn make(target: &Target, change: Change, deadline: Instant, counts: &mut ChangeCounts) -> Result<String, String> {
    let mut last = String::from("no request sent");
    let mut maybe_made = false;
    loop {
        let answer = match target.leader_status(STATUS_TIMEOUT) {
            None => Answer::Again { why: "no leader answered MICROREP.STATUS".into(), maybe_made: false },
            Some(s) if change.in_effect(&s.members) => {
                return Ok(format!("in effect at leader {} (epoch {})", s.node, s.epoch));
            }
            Some(_) if Instant::now() >= deadline => break,
            Some(s) => ask(target, usize::from(s.node), change),
        };
        match answer {
            Answer::Done(how) => return Ok(how),
            Answer::Refused(why) => return Err(why),
            Answer::Again { why, maybe_made: maybe } => {
                counts.retried += 1;
                maybe_made |= maybe;
                last = why;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(RETRY_GAP.min(left));
    }
    let maybe = if maybe_made { " (an earlier request of it may still take effect)" } else { "" };
    Err(format!("not made in time{maybe}; last answer: {last}"))
}

/// What one `replace-member` fault did.
#[derive(Debug, Default)]
pub(crate) struct Replacement {
    pub(crate) added: Option<usize>,
    pub(crate) removed: Option<usize>,
    pub(crate) counts: ChangeCounts,
    pub(crate) note: String,
}

/// Adds a running spare (unless the configuration already has more than `size` members, as
/// when an earlier fault's removal ran out of time), then removes a member other than it,
/// chosen with `pick`, all before `deadline`.
pub(crate) fn replace(target: &Target, size: usize, pick: u64, deadline: Instant) -> Replacement {
    let mut rng = ChaCha8Rng::seed_from_u64(pick);
    let mut r = Replacement::default();
    let Some(before) = leader_by(target, deadline) else {
        r.counts.refused += 1;
        r.note = "no leader answered MICROREP.STATUS in time".into();
        return r;
    };
    if before.members.len() <= size {
        let spares = target.spares(&before.members, STATUS_TIMEOUT);
        if spares.is_empty() {
            r.counts.refused += 1;
            r.note = format!("no spare runs (members {:?})", before.members);
            return r;
        }
        let spare = spares[rng.random_range(0..spares.len())];
        match make(target, Change::Add(spare), deadline, &mut r.counts) {
            Ok(how) => {
                r.counts.added += 1;
                r.added = Some(spare);
                r.note = format!("added {spare}: {how}");
            }
            Err(refusal) => {
                r.counts.refused += 1;
                r.note = format!("add {spare}: {refusal}");
                return r;
            }
        }
    }
    // A leader that applied the addition starts a new term: wait for it (or its successor).
    let Some(now) = leader_by(target, deadline) else {
        r.counts.refused += 1;
        r.note.push_str("; remove: no leader answered MICROREP.STATUS in time");
        return r;
    };
    let candidates: Vec<usize> = now.members.iter().map(|&m| usize::from(m)).filter(|&m| Some(m) != r.added).collect();
    if candidates.is_empty() {
        r.note.push_str("; no member to remove");
        return r;
    }
    let leaving = candidates[rng.random_range(0..candidates.len())];
    let leader = usize::from(now.node) == leaving;
    match make(target, Change::Remove(leaving), deadline, &mut r.counts) {
        Ok(how) => {
            r.counts.removed += 1;
            r.counts.removed_leaders += u64::from(leader);
            r.removed = Some(leaving);
            let role = if leader { " (the leader)" } else { "" };
            r.note.push_str(&format!("; removed {leaving}{role}: {how}"));
        }
        Err(refusal) => {
            r.counts.refused += 1;
            r.note.push_str(&format!("; remove {leaving}: {refusal}"));
            return r;
        }
    }
    if rng.random_bool(0.5) {
        r.counts.kept += 1;
        r.note.push_str(&format!("; {leaving} kept as a spare"));
        return r;
    }
    match leave(target, leaving, deadline) {
        Ok(how) => {
            r.counts.asked_to_leave += 1;
            r.note.push_str(&format!("; {leaving} asked to leave: {how}"));
        }
        Err(why) => r.note.push_str(&format!("; {leaving} not asked to leave ({why}): a spare")),
    }
    r
}

/// Asks removed member `node` to stop (`MICROREP.LEAVE`), again while it is still a member in
/// its own configuration (it has not applied its removal yet), until `deadline`. Once asked
/// (accepted, or sent without an answer) its process may stop ([`Departures`]).
fn leave(target: &Target, node: usize, deadline: Instant) -> Result<String, String> {
    loop {
        let pid = {
            let procs = target.procs();
            procs.pid(node).filter(|_| procs.is_up(node))
        };
        let Some(pid) = pid else { return Err("its node is down".into()) };
        // Expected before the request: the node may stop before the answer arrives.
        target.departures.begin(node, pid);
        let (answer, sent) = match Client::connect(target.nodes[node], REQUEST_TIMEOUT) {
            Ok(mut client) => (client.call(&[b"MICROREP.LEAVE"]).map_err(|e| e.to_string()), true),
            Err(e) => (Err(e.to_string()), false),
        };
        let why = match answer {
            Ok(Reply::Simple(ok)) => return Ok(ok),
            Ok(Reply::Error(why)) if why.contains("is a member") => why,
            Ok(other) => format!("unexpected reply {other:?}"),
            // It may stop or not: asked either way.
            Err(e) if sent => return Ok(format!("no answer ({e})")),
            Err(e) => e,
        };
        target.departures.forget(node);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !why.contains("is a member") {
            return Err(why);
        }
        std::thread::sleep(RETRY_GAP.min(left));
    }
}

/// The status of the node that leads, asked until `deadline`.
fn leader_by(target: &Target, deadline: Instant) -> Option<crate::target::NodeStatus> {
    loop {
        if let Some(status) = target.leader_status(STATUS_TIMEOUT) {
            return Some(status);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::sleep(RETRY_GAP.min(left));
    }
}

/// How `microrep_testkit::procs` describes an exit with status 0.
const CLEAN_EXIT: &str = "exited with status 0";

/// Removed members asked to leave, and those that stopped: a node that accepted
/// `MICROREP.LEAVE` (or did not answer it) is expected to exit with status 0, once: the
/// process that was asked. Any other exit is a crash, a restarted spare's included.
#[derive(Debug, Default)]
pub(crate) struct Departures(Mutex<Book>);

#[derive(Debug, Default)]
struct Book {
    /// Nodes asked to leave, with the process that is to stop.
    leaving: BTreeMap<usize, i32>,
    /// Nodes that left and were not started again yet.
    stopped: BTreeSet<usize>,
    counts: ChangeCounts,
}

impl Departures {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Node `node`'s process `pid` is about to be asked to leave.
    pub(crate) fn begin(&self, node: usize, pid: i32) {
        self.book().leaving.insert(node, pid);
    }

    /// Node `node` refused to leave: nothing is expected of it.
    pub(crate) fn forget(&self, node: usize) {
        self.book().leaving.remove(&node);
    }

    /// Whether node `node` was asked to leave and has not stopped yet.
    pub(crate) fn is_leaving(&self, node: usize) -> bool {
        self.book().leaving.contains_key(&node)
    }

    /// Moves out of `exits[from..]` the clean exits of the processes asked to leave; `pids`
    /// are the processes' pids before they were reaped.
    pub(crate) fn take_exits(&self, exits: &mut Vec<Exit>, from: usize, pids: &[Option<i32>]) {
        let mut book = self.book();
        let mut i = from;
        while i < exits.len() {
            let node = exits[i].index;
            let asked = book.leaving.get(&node).is_some_and(|&pid| pids.get(node) == Some(&Some(pid)));
            if asked && exits[i].status == CLEAN_EXIT {
                exits.remove(i);
                book.leaving.remove(&node);
                book.stopped.insert(node);
                book.counts.stopped += 1;
            } else {
                i += 1;
            }
        }
    }

    /// Starts again, as spares, the stopped nodes not in `busy`; returns them.
    pub(crate) fn restart(&self, procs: &mut Procs, busy: &BTreeSet<usize>) -> Result<Vec<usize>, KitError> {
        let mut book = self.book();
        let due: Vec<usize> = book.stopped.iter().copied().filter(|n| !busy.contains(n)).collect();
        let mut started = Vec::new();
        for node in due {
            book.stopped.remove(&node);
            if !procs.is_running(node) {
                procs.start(node)?;
                book.counts.restarted += 1;
                started.push(node);
            }
        }
        Ok(started)
    }

    /// What the departures came to; `procs` tells which nodes asked to leave still run.
    pub(crate) fn counts(&self, procs: &Procs) -> ChangeCounts {
        let book = self.book();
        let running = |(&node, &pid): (&usize, &i32)| node < procs.len() && procs.pid(node) == Some(pid);
        ChangeCounts { not_stopped: book.leaving.iter().filter(|&e| running(e)).count() as u64, ..book.counts.clone() }
    }
}

#[cfg(test)]
mod tests {
    use microrep_testkit::cleanup::PidRegistry;
    use microrep_testkit::procs::Spec;

    use super::*;

    fn error(text: &str) -> Reply {
        Reply::Error(text.into())
    }

    #[test]
    fn answers_that_pass_are_asked_again_and_others_end_the_change() {
        let done = classify(&Reply::Simple("OK members 0,1,3 epoch 2".into()));
        assert_eq!(done, Answer::Done("OK members 0,1,3 epoch 2".into()));
        for passing in [
            "ERR membership change refused: replica 3 is still catching up",
            "ERR membership change refused: replica 2 is not live: its heartbeat does not advance (is it running?)",
            "ERR membership change refused: replica 3 is not a follower of this leader yet (is it running?)",
            "ERR membership change refused: another membership change is under way",
            "ERR membership change refused: this leader is still starting its term",
            "NOTLEADER 1 127.0.0.1:6380",
            "NOLEADER",
            "TRYAGAIN",
        ] {
            assert!(matches!(classify(&error(passing)), Answer::Again { maybe_made: false, .. }), "{passing}");
        }
        let unknown = classify(&error("UNKNOWN leadership lost while replicating"));
        assert!(matches!(unknown, Answer::Again { maybe_made: true, .. }), "{unknown:?}");
        for made in [
            "ERR membership change refused: replica 3 is already a member",
            "ERR membership change refused: replica 1 is not a member",
        ] {
            assert!(matches!(classify(&error(made)), Answer::Done(_)), "{made}");
        }
        for refused in
            ["ERR membership change refused: replica 2 is the last member: a cluster needs one", "ERR unknown command"]
        {
            assert_eq!(classify(&error(refused)), Answer::Refused(refused.into()));
        }
        assert!(matches!(classify(&Reply::Integer(1)), Answer::Refused(_)));
    }

    #[test]
    fn a_change_is_in_effect_when_the_members_say_so() {
        assert!(Change::Add(3).in_effect(&[0, 1, 3]));
        assert!(!Change::Add(3).in_effect(&[0, 1, 2]));
        assert!(Change::Remove(2).in_effect(&[0, 1, 3]));
        assert!(!Change::Remove(1).in_effect(&[0, 1, 3]));
    }

    fn exit(index: usize, status: &str) -> Exit {
        Exit { index, status: status.into() }
    }

    #[test]
    fn only_the_clean_exit_of_a_process_asked_to_leave_is_a_departure() {
        let departures = Departures::default();
        departures.begin(1, 101);
        departures.begin(2, 102);
        departures.begin(3, 103);
        departures.forget(3);
        assert!(departures.is_leaving(1) && departures.is_leaving(2) && !departures.is_leaving(3));
        // Before these were reaped, node 1 ran as 101 (asked), node 2 as 202 (another process
        // than the one asked: a crash), node 3 refused to leave, node 0 was never asked.
        let pids = [Some(100), Some(101), Some(202), Some(103)];
        let mut exits = vec![exit(9, CLEAN_EXIT), exit(0, CLEAN_EXIT), exit(1, CLEAN_EXIT), exit(2, CLEAN_EXIT)];
        exits.push(exit(3, CLEAN_EXIT));
        departures.take_exits(&mut exits, 1, &pids);
        assert_eq!(exits, [exit(9, CLEAN_EXIT), exit(0, CLEAN_EXIT), exit(2, CLEAN_EXIT), exit(3, CLEAN_EXIT)]);
        assert!(!departures.is_leaving(1), "it left");
        // A node that crashes while leaving crashed.
        departures.begin(0, 100);
        let mut crashed = vec![exit(0, "exited with status 101")];
        departures.take_exits(&mut crashed, 0, &pids);
        assert_eq!(crashed.len(), 1);
        let procs = Procs::new(Vec::new(), PidRegistry::default());
        let counts = departures.counts(&procs);
        assert_eq!((counts.stopped, counts.restarted, counts.not_stopped), (1, 0, 0));
    }

    #[test]
    fn stopped_nodes_start_again_unless_a_fault_holds_them() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-departures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let sleeper =
            Spec { program: "sleep".into(), args: vec!["30".into()], log: dir.join("sleep.log"), env: Vec::new() };
        let mut procs = Procs::new(vec![sleeper; 3], PidRegistry::default());
        let departures = Departures::default();
        // Nodes 1 and 2 left (as reaped exits say).
        departures.begin(1, 11);
        departures.begin(2, 12);
        let mut exits = vec![exit(1, CLEAN_EXIT), exit(2, CLEAN_EXIT)];
        departures.take_exits(&mut exits, 0, &[None, Some(11), Some(12)]);
        assert!(exits.is_empty());
        let held = departures.restart(&mut procs, &BTreeSet::from([2])).expect("restart");
        assert_eq!(held, [1]);
        assert!(procs.is_running(1) && !procs.is_running(2));
        assert_eq!(departures.restart(&mut procs, &BTreeSet::new()).expect("restart"), [2]);
        assert!(departures.restart(&mut procs, &BTreeSet::new()).expect("restart").is_empty(), "once each");
        // Node 1 is asked to leave again and has not stopped: it still runs at the end.
        departures.begin(1, procs.pid(1).expect("running"));
        let counts = departures.counts(&procs);
        assert_eq!((counts.stopped, counts.restarted, counts.not_stopped), (2, 2, 1));
        drop(procs);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
