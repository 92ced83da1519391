//! Membership changes under the nemesis (issue 19 §4; docs/RELIABILITY.md, "Membership
//! changes"). The `replace-member` fault asks the leader, over RESP as `microrep member` does
//! (`MICROREP.MEMBER ADD|REMOVE id`), to add a running spare and then to remove a random member
//! (the leader, sometimes), asking again while the answer is one that passes (the spare still
//! catching up, another change or a new term under way, leadership moving, an unknown outcome)
//! until the fault's time is up. A removed member's process stops by itself with status 0;
//! [`Departures`] tells that exit from a crash and starts the node again as a spare (fresh
//! memory, the same configuration), so the cluster keeps its size and its spares.

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
    /// Removed members whose process then stopped by itself (status 0).
    pub(crate) stopped: u64,
    /// Stopped members started again as spares.
    pub(crate) restarted: u64,
    /// Removed members still running at the end of the history (they never learned it).
    pub(crate) not_stopped: u64,
}

impl ChangeCounts {
    /// One line for the console.
    pub(crate) fn describe(&self) -> String {
        format!(
            "added {}, removed {} ({} leaders), refused {} (asked again {} times); removed members stopped {}, \
             started again as spares {}, still running at the end {}",
            self.added,
            self.removed,
            self.removed_leaders,
            self.refused,
            self.retried,
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

/// Refusals that pass (the core's `propose_membership`): the joiner catches up or starts
/// following, a change or a new term is under way.
const PASSING_REFUSALS: [&str; 4] = [
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
/// it was made; `Err` why not (`maybe_made`: a request may still take effect).
fn make(target: &Target, change: Change, deadline: Instant, counts: &mut ChangeCounts) -> Result<String, Refusal> {
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
            Answer::Refused(why) => return Err(Refusal { why, maybe_made }),
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
    Err(Refusal { why: format!("not made in time; last answer: {last}"), maybe_made })
}

/// Why a change was not made.
#[derive(Debug)]
struct Refusal {
    why: String,
    maybe_made: bool,
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
                r.note = format!("add {spare}: {}", refusal.why);
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
    // Expected from before the request: the node may stop before the answer arrives.
    let pid = target.procs().pid(leaving);
    target.departures.begin(leaving, pid);
    let made = make(target, Change::Remove(leaving), deadline, &mut r.counts);
    let pid = target.procs().pid(leaving);
    target.departures.end(leaving, pid, made.as_ref().map_or_else(|refusal| refusal.maybe_made, |_| true));
    match made {
        Ok(how) => {
            r.counts.removed += 1;
            r.counts.removed_leaders += u64::from(leader);
            r.removed = Some(leaving);
            let role = if leader { " (the leader)" } else { "" };
            r.note.push_str(&format!("; removed {leaving}{role}: {how}"));
        }
        Err(refusal) => {
            r.counts.refused += 1;
            r.note.push_str(&format!("; remove {leaving}: {}", refusal.why));
        }
    }
    r
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

/// The members being removed and those that stopped after their removal. A removed member's
/// process is expected to exit with status 0, once: the incarnation that ran when the removal
/// was asked or when it was known to be made, or any incarnation while it was under way (a
/// killed member restarted before its removal committed learns it then). An incarnation
/// started after the removal was made is a spare, and its exit a crash.
#[derive(Debug, Default)]
pub(crate) struct Departures(Mutex<Book>);

#[derive(Debug, Default)]
struct Book {
    leaving: BTreeMap<usize, Leaving>,
    /// Removed nodes that stopped and were not started again yet.
    stopped: BTreeSet<usize>,
    counts: ChangeCounts,
}

/// A member being removed, or removed and not stopped yet.
#[derive(Debug, Default)]
struct Leaving {
    /// The removal was asked and its outcome is not known yet.
    under_way: bool,
    /// The processes that may stop.
    pids: BTreeSet<i32>,
}

impl Departures {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The removal of `node`, whose process is `pid` (if it runs), is about to be asked.
    pub(crate) fn begin(&self, node: usize, pid: Option<i32>) {
        let mut book = self.book();
        let leaving = book.leaving.entry(node).or_default();
        leaving.under_way = true;
        leaving.pids.extend(pid);
    }

    /// The removal of `node` ended: made or maybe made (`may_stop`), its process now `pid`;
    /// otherwise nothing is expected of the node any more. A node that stopped meanwhile was
    /// removed for good: a process of it now is a spare started afresh.
    pub(crate) fn end(&self, node: usize, pid: Option<i32>, may_stop: bool) {
        let mut book = self.book();
        if !may_stop {
            book.leaving.remove(&node);
        } else if let Some(leaving) = book.leaving.get_mut(&node) {
            leaving.under_way = false;
            leaving.pids.extend(pid);
        }
    }

    /// Whether node `node` is being removed, or removed and not stopped yet.
    pub(crate) fn is_leaving(&self, node: usize) -> bool {
        self.book().leaving.contains_key(&node)
    }

    /// Moves out of `exits[from..]` the clean exits of the processes expected to stop; `pids`
    /// are the processes' pids before they were reaped.
    pub(crate) fn take_exits(&self, exits: &mut Vec<Exit>, from: usize, pids: &[Option<i32>]) {
        let mut book = self.book();
        let mut i = from;
        while i < exits.len() {
            let node = exits[i].index;
            let pid = pids.get(node).copied().flatten();
            let expected =
                book.leaving.get(&node).is_some_and(|l| l.under_way || pid.is_some_and(|pid| l.pids.contains(&pid)));
            if expected && exits[i].status == CLEAN_EXIT {
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

    /// What the departures came to; `procs` tells which removed members still run.
    pub(crate) fn counts(&self, procs: &Procs) -> ChangeCounts {
        let book = self.book();
        let running =
            |node: usize, l: &Leaving| node < procs.len() && procs.pid(node).is_some_and(|pid| l.pids.contains(&pid));
        let not_stopped = book.leaving.iter().filter(|&(&node, l)| running(node, l)).count() as u64;
        ChangeCounts { not_stopped, ..book.counts.clone() }
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
        for refused in [
            "ERR membership change refused: replica 2 is the last member: a cluster needs one",
            "ERR membership change refused: not supported yet with a durable log (cluster.durability = \"fsync\")",
            "ERR unknown command",
        ] {
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
    fn only_clean_exits_of_incarnations_that_were_members_are_departures() {
        let departures = Departures::default();
        // Node 1 ran as 101 when its removal was asked and made.
        departures.begin(1, Some(101));
        departures.end(1, Some(101), true);
        // Node 2 was dead when its removal was asked, ran as 202 when it was made (restarted
        // meanwhile), and now runs as 302, started afresh after it stopped: a spare.
        departures.begin(2, None);
        departures.end(2, Some(202), true);
        // Node 3's removal was refused: nothing is expected of it.
        departures.begin(3, Some(103));
        departures.end(3, Some(103), false);
        assert!(departures.is_leaving(1) && departures.is_leaving(2) && !departures.is_leaving(3));
        let pids = [Some(100), Some(101), Some(302), Some(103)];
        let mut exits = vec![exit(9, CLEAN_EXIT), exit(0, CLEAN_EXIT), exit(1, CLEAN_EXIT), exit(2, CLEAN_EXIT)];
        exits.push(exit(3, CLEAN_EXIT));
        departures.take_exits(&mut exits, 1, &pids);
        assert_eq!(exits, [exit(9, CLEAN_EXIT), exit(0, CLEAN_EXIT), exit(2, CLEAN_EXIT), exit(3, CLEAN_EXIT)]);
        // While a removal is under way, whichever incarnation runs may stop (node 0 as 400, a
        // restart the harness made meanwhile); a crash while stopping is a crash.
        departures.begin(0, Some(100));
        let mut crashed = vec![exit(0, "exited with status 101")];
        departures.take_exits(&mut crashed, 0, &[Some(400)]);
        assert_eq!(crashed.len(), 1);
        let mut stopped = vec![exit(0, CLEAN_EXIT)];
        departures.take_exits(&mut stopped, 0, &[Some(400)]);
        assert!(stopped.is_empty());
        // Its removal's answer comes once it was started again as a spare (500): that process
        // was never a member, and must not stop.
        departures.end(0, Some(500), true);
        assert!(!departures.is_leaving(0));
        let procs = Procs::new(Vec::new(), PidRegistry::default());
        let counts = departures.counts(&procs);
        assert_eq!((counts.stopped, counts.restarted, counts.not_stopped), (2, 0, 0));
    }

    #[test]
    fn stopped_nodes_start_again_unless_a_fault_holds_them() {
        let dir = std::env::temp_dir().join(format!("microrep-faults-departures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let sleeper =
            Spec { program: "sleep".into(), args: vec!["30".into()], log: dir.join("sleep.log"), env: Vec::new() };
        let mut procs = Procs::new(vec![sleeper; 3], PidRegistry::default());
        let departures = Departures::default();
        // Nodes 1 and 2 stopped after their removal (as reaped exits say).
        for (node, pid) in [(1, 11), (2, 12)] {
            departures.begin(node, Some(pid));
            departures.end(node, Some(pid), true);
        }
        let mut exits = vec![exit(1, CLEAN_EXIT), exit(2, CLEAN_EXIT)];
        departures.take_exits(&mut exits, 0, &[None, Some(11), Some(12)]);
        assert!(exits.is_empty());
        let held = departures.restart(&mut procs, &BTreeSet::from([2])).expect("restart");
        assert_eq!(held, [1]);
        assert!(procs.is_running(1) && !procs.is_running(2));
        assert_eq!(departures.restart(&mut procs, &BTreeSet::new()).expect("restart"), [2]);
        assert!(departures.restart(&mut procs, &BTreeSet::new()).expect("restart").is_empty(), "once each");
        // Node 1 is removed again and has not stopped: it still runs at the end.
        departures.begin(1, procs.pid(1));
        departures.end(1, procs.pid(1), true);
        let counts = departures.counts(&procs);
        assert_eq!((counts.stopped, counts.restarted, counts.not_stopped), (2, 2, 1));
        drop(procs);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
