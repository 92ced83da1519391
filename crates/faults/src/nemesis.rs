//! The nemesis: a fault schedule drawn from the seed before the run (so a seed always gives the
//! same schedule), then played against the processes and, with `--netns`, the network. A
//! schedule never takes down more than a minority at once, counting every fault still active
//! (a node cut off by the network counts as down). Targets are roles ("the leader", "a
//! follower"), resolved when the fault starts; the minority is one of the members of the
//! latest configuration (spares count in no quorum). `replace-member` changes the members
//! themselves (crate::membership), while other faults go on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::history::Clock;
use crate::membership::{self, ChangeCounts, Replacement};
use crate::netns::NetnsError;
use crate::target::{Target, TargetError};

/// The kinds of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FaultKind {
    /// SIGKILL the leader; restart it when the fault heals.
    KillLeader,
    /// SIGKILL one follower; restart it when the fault heals.
    KillFollower,
    /// SIGSTOP the leader; SIGCONT it when the fault heals, usually after a new leader was elected.
    PauseLeader,
    /// SIGSTOP one follower.
    PauseFollower,
    /// SIGKILL a minority (at least two nodes, possibly the leader) at once.
    KillMinority,
    /// SIGSTOP a minority at once.
    PauseMinority,
    /// SIGSTOP every node at once (only when nothing else is down), so that requests time out
    /// and run after the resume: operations of unknown outcome that do take effect. Not in the
    /// default set; the way to fault a single redis-server.
    PauseAll,
    /// SIGKILL a majority at once, followers first (only when nothing else is down): the leader
    /// left alone must acknowledge nothing until they restart, and nothing may be lost. Not in
    /// the default set.
    KillMajority,
    /// SIGKILL every node at once (only when nothing else is down) and restart them all when the
    /// fault heals: with a durable log (`--durable`) the cluster comes back from the disks with
    /// every acknowledged write. Not in the default set.
    KillAll,
    /// Through the leader, add a running spare (`--spares`), then remove a random member (the
    /// leader, sometimes), asking again while the leader refuses for a passing reason, within
    /// the fault's time; the removed member follows as a spare, or, one time in two, is asked
    /// to leave (`MICROREP.LEAVE`): its process stops and is started again as a spare (fresh
    /// memory) when the fault heals. One at a time; not in the default set.
    ReplaceMember,
    /// Cut the leader off from the other replicas while clients still reach it (`--netns`): the
    /// old leader must not acknowledge anything alone, and rejoins when the partition heals.
    PartitionLeader,
    /// Cut a random minority off from the other replicas (`--netns`).
    PartitionMinority,
    /// Take one random node's link down, cutting it off from clients and replicas (`--netns`).
    LinkDown,
}

impl FaultKind {
    /// The kinds drawn when none are named (all but those that take down more than a minority).
    pub(crate) const DEFAULT: [Self; 6] = [
        Self::KillLeader,
        Self::KillFollower,
        Self::PauseLeader,
        Self::PauseFollower,
        Self::KillMinority,
        Self::PauseMinority,
    ];

    /// The network faults, drawn by default with `--netns`.
    pub(crate) const NETWORK: [Self; 3] = [Self::PartitionLeader, Self::PartitionMinority, Self::LinkDown];

    fn kills(self) -> bool {
        matches!(self, Self::KillLeader | Self::KillFollower | Self::KillMinority | Self::KillMajority | Self::KillAll)
    }

    /// Whether the fault is made in the network (and needs `--netns`).
    pub(crate) fn is_network(self) -> bool {
        Self::NETWORK.contains(&self)
    }

    /// What the nemesis does to start the fault and to heal it, as recorded.
    fn actions(self) -> (Step, Step) {
        match self {
            _ if self.kills() => (Step::Kill, Step::Restart),
            Self::PartitionLeader | Self::PartitionMinority => (Step::Partition, Step::Heal),
            Self::LinkDown => (Step::LinkDown, Step::LinkUp),
            Self::ReplaceMember => (Step::Replace, Step::RestartRemoved),
            _ => (Step::Pause, Step::Resume),
        }
    }

    /// Whether the fault may take the leader out, leaving it deposed when it heals.
    fn may_depose(self) -> bool {
        matches!(self, Self::PauseLeader | Self::PartitionLeader | Self::LinkDown)
    }

    /// How many members it takes down at least (a replacement adds one before removing one).
    fn nodes_min(self) -> usize {
        match self {
            Self::KillMinority | Self::PauseMinority => 2,
            Self::ReplaceMember => 0,
            _ => 1,
        }
    }

    /// Whether the fault fits when `down` of `replicas` nodes are down already.
    fn fits(self, replicas: usize, down: usize) -> bool {
        match self {
            Self::PauseAll | Self::KillMajority | Self::KillAll => down == 0,
            _ => down + self.nodes_min() <= replicas.saturating_sub(1) / 2,
        }
    }
}

/// One planned fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) start_ms: u64,
    pub(crate) heal_ms: u64,
    /// How many nodes it takes down.
    pub(crate) nodes: usize,
    /// Chooses among the candidate nodes when the fault starts.
    pub(crate) pick: u64,
}

/// What shapes a schedule.
#[derive(Clone, Debug)]
pub(crate) struct ScheduleParams {
    pub(crate) replicas: usize,
    pub(crate) duration_ms: u64,
    pub(crate) max_faults: usize,
    pub(crate) mean_gap_ms: u64,
    pub(crate) kinds: Vec<FaultKind>,
}

/// Draws the fault schedule of `seed`.
pub(crate) fn schedule(seed: u64, p: &ScheduleParams) -> Vec<Fault> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let minority = p.replicas.saturating_sub(1) / 2;
    let mut faults: Vec<Fault> = Vec::new();
    let mut t = 0;
    // Leave the last quarter second without new faults, so the end is not all start-up.
    let last_start = p.duration_ms.saturating_sub(250);
    while faults.len() < p.max_faults && !p.kinds.is_empty() {
        t += rng.random_range(p.mean_gap_ms / 2..=p.mean_gap_ms * 3 / 2).max(1);
        if t >= last_start {
            break;
        }
        // Faults started earlier only heal from here on, so the budget at `t` holds throughout.
        let down: usize = faults.iter().filter(|f| f.heal_ms > t).map(|f| f.nodes).sum();
        let budget = minority.saturating_sub(down);
        let replacing = faults.iter().any(|f| f.heal_ms > t && f.kind == FaultKind::ReplaceMember);
        let fitting: Vec<FaultKind> = p
            .kinds
            .iter()
            .copied()
            .filter(|&k| k.fits(p.replicas, down) && !(replacing && k == FaultKind::ReplaceMember))
            .collect();
        if fitting.is_empty() {
            continue;
        }
        let kind = fitting[rng.random_range(0..fitting.len())];
        let nodes = match kind {
            FaultKind::PauseAll | FaultKind::KillAll => p.replicas,
            FaultKind::KillMajority => p.replicas / 2 + 1,
            FaultKind::KillMinority | FaultKind::PauseMinority | FaultKind::PartitionMinority => {
                rng.random_range(kind.nodes_min()..=budget)
            }
            FaultKind::ReplaceMember => 0,
            _ => 1,
        };
        let length_ms = rng.random_range(100..=3000);
        faults.push(Fault {
            kind,
            start_ms: t,
            heal_ms: (t + length_ms).min(p.duration_ms),
            nodes,
            pick: rng.random(),
        });
    }
    faults
}

/// One thing the nemesis did, for the run's record. `at_ns` is taken after a fault took effect
/// and before it heals, so the interval between the two lies wholly inside the fault.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Action {
    pub(crate) at_ns: u64,
    pub(crate) fault: usize,
    pub(crate) kind: FaultKind,
    pub(crate) action: Step,
    pub(crate) nodes: Vec<usize>,
    pub(crate) note: String,
}

/// What the nemesis did in one action, as `nemesis.json` records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Step {
    /// SIGKILL (kill faults).
    Kill,
    /// Start again (heals a kill).
    Restart,
    /// SIGSTOP (pause faults).
    Pause,
    /// SIGCONT (heals a pause).
    Resume,
    /// Cut nodes off (partition faults).
    Partition,
    /// Rejoin them (heals a partition).
    Heal,
    /// Take a link down.
    LinkDown,
    /// Bring it back up.
    LinkUp,
    /// Add a spare, then remove a member (replace-member).
    Replace,
    /// Start the removed member again, as a spare (heals a replace-member).
    RestartRemoved,
    /// Not played: no node could take the fault without losing a majority.
    Skipped,
}

/// What a played schedule did.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Played {
    pub(crate) actions: Vec<Action>,
    /// Faults injected, by kind.
    pub(crate) injected: BTreeMap<FaultKind, u64>,
    /// Paused or cut-off leaders back after another node had become leader.
    pub(crate) stale_leader_wakeups: u64,
    /// Membership changes made and refused (replace-member).
    pub(crate) changes: ChangeCounts,
    /// Errors of the nemesis itself (a restart that failed, ...).
    pub(crate) errors: Vec<String>,
}

impl Played {
    /// What the nemesis did and when (ns), each with whether it healed a fault (a restart, a
    /// resume, a healed partition, a link back up); skipped faults are left out.
    pub(crate) fn timeline(&self) -> Vec<(u64, bool)> {
        self.actions
            .iter()
            .filter(|a| a.action != Step::Skipped)
            .map(|a| (a.at_ns, a.action == a.kind.actions().1))
            .collect()
    }

    /// The intervals (ns) during which faults of `kind` were in effect.
    pub(crate) fn windows(&self, kind: FaultKind) -> Vec<(u64, u64)> {
        let start = |a: &Action| a.action == a.kind.actions().0;
        self.actions
            .iter()
            .filter(|a| a.kind == kind && start(a))
            .filter_map(|a| {
                let end = self.actions.iter().find(|b| b.fault == a.fault && !start(b) && b.action != Step::Skipped)?;
                Some((a.at_ns, end.at_ns))
            })
            .collect()
    }
}

/// How long a status query during faults may take.
const STATUS_TIMEOUT: Duration = Duration::from_millis(100);

/// Plays `faults` against `target` until their end or `stop`, then heals everything still down.
pub(crate) fn play(target: &Target, faults: &[Fault], clock: Clock, start: Instant, stop: &AtomicBool) -> Played {
    let mut events: Vec<(u64, usize, bool)> = Vec::new();
    for (i, f) in faults.iter().enumerate() {
        events.push((f.start_ms, i, true));
        events.push((f.heal_ms, i, false));
    }
    events.sort_unstable();
    let mut played = Played::default();
    // Replacements run on threads of their own, so that other faults go on meanwhile.
    std::thread::scope(|scope| {
        let mut active: Vec<Active<'_>> = std::iter::repeat_with(Active::default).take(faults.len()).collect();
        for (at_ms, i, starts) in events {
            while !stop.load(Ordering::Relaxed) {
                let now = start.elapsed();
                let at = Duration::from_millis(at_ms);
                if now >= at {
                    break;
                }
                std::thread::sleep((at - now).min(Duration::from_millis(20)));
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let fault = &faults[i];
            if starts {
                let deadline = start + Duration::from_millis(fault.heal_ms);
                let (taken, note) = inject(scope, target, fault, deadline, &busy(&active), &mut played.errors);
                let action = if taken.is_empty() { Step::Skipped } else { fault.kind.actions().0 };
                if !taken.is_empty() {
                    *played.injected.entry(fault.kind).or_default() += 1;
                }
                let nodes = taken.nodes.clone();
                active[i] = taken;
                played.actions.push(Action { at_ns: clock.now_ns(), fault: i, kind: fault.kind, action, nodes, note });
            } else if !active[i].is_empty() {
                let taken = std::mem::take(&mut active[i]);
                heal_recorded(target, i, fault.kind, taken, &busy(&active), clock, &mut played);
            }
        }
        for i in 0..active.len() {
            if !active[i].is_empty() {
                let taken = std::mem::take(&mut active[i]);
                heal_recorded(target, i, faults[i].kind, taken, &busy(&active), clock, &mut played);
            }
        }
    });
    played
}

/// A fault in effect: the nodes it took down and what undoing it needs.
#[derive(Debug, Default)]
struct Active<'scope> {
    nodes: Vec<usize>,
    /// The leader it took out, if it could leave that leader deposed.
    leader: Option<usize>,
    /// The rules of a partition.
    rules: Vec<u64>,
    /// The replacement under way (replace-member).
    replacing: Option<ScopedJoinHandle<'scope, Replacement>>,
}

impl Active<'_> {
    /// Whether the fault did nothing (skipped, or healed).
    fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.replacing.is_none()
    }
}

/// The nodes taken by the faults in effect.
fn busy(active: &[Active<'_>]) -> BTreeSet<usize> {
    active.iter().flat_map(|a| a.nodes.iter().copied()).collect()
}

/// Heals fault `i`, then starts again the removed members that stopped and that no fault in
/// effect holds (`busy`), and records both.
fn heal_recorded(
    target: &Target,
    i: usize,
    kind: FaultKind,
    taken: Active<'_>,
    busy: &BTreeSet<usize>,
    clock: Clock,
    played: &mut Played,
) {
    let at_ns = clock.now_ns();
    let mut nodes = taken.nodes.clone();
    let mut note = heal(target, kind, taken, played, &mut nodes);
    match target.restart_departed(busy) {
        Ok(started) if !started.is_empty() => note.push_str(&format!("; started again as spares: {started:?}")),
        Ok(_) => {}
        Err(e) => played.errors.push(format!("starting removed members again as spares: {e}")),
    }
    played.actions.push(Action { at_ns, fault: i, kind, action: kind.actions().1, nodes, note });
}

/// Starts one fault, never on a node in `busy` (taken by a fault in effect); returns what it
/// took down (nothing if it could not apply) and a note. A replacement runs on a thread of
/// `scope` until `deadline`.
fn inject<'scope>(
    scope: &'scope Scope<'scope, '_>,
    target: &'scope Target,
    fault: &'scope Fault,
    deadline: Instant,
    busy: &BTreeSet<usize>,
    errors: &mut Vec<String>,
) -> (Active<'scope>, String) {
    // A member that ended on its own is down too (and reported as an anomaly at the end), and
    // so is one not known to be a voter (recovering from a restart, or not answering): it may
    // hold nothing, so taking a majority's worth of voters down with it could lose chosen
    // values. Spares count in no majority and are left alone.
    target.reap_exited();
    let members = target.members(STATUS_TIMEOUT);
    let n = members.len();
    let not_voters = target.not_voters(STATUS_TIMEOUT);
    let up: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&i| target.procs().is_up(i) && !busy.contains(&i) && !not_voters.contains(&i))
        .collect();
    if !fault.kind.fits(n, n - up.len()) {
        let why = format!(
            "{} of {n} members {members:?} already down or not known to be voters ({not_voters:?})",
            n - up.len()
        );
        return (Active::default(), why);
    }
    let leader = target.leader(STATUS_TIMEOUT).filter(|l| !busy.contains(l));
    let mut rng = ChaCha8Rng::seed_from_u64(fault.pick);
    let (nodes, note) = match fault.kind {
        FaultKind::KillLeader | FaultKind::PauseLeader | FaultKind::PartitionLeader => match leader {
            Some(l) => (vec![l], format!("leader {l}")),
            None => (vec![up[rng.random_range(0..up.len())]], "no leader known: a random node".into()),
        },
        FaultKind::KillFollower | FaultKind::PauseFollower => {
            let followers: Vec<usize> = up.iter().copied().filter(|&i| Some(i) != leader).collect();
            if followers.is_empty() {
                return (Active::default(), "no follower up".into());
            }
            (vec![followers[rng.random_range(0..followers.len())]], format!("a follower (leader {leader:?})"))
        }
        FaultKind::LinkDown => {
            let node = up[rng.random_range(0..up.len())];
            let role = if Some(node) == leader { "the leader" } else { "a follower" };
            (vec![node], format!("{role} (leader {leader:?})"))
        }
        FaultKind::PauseAll | FaultKind::KillAll => (up.clone(), format!("all nodes (leader {leader:?})")),
        FaultKind::KillMinority | FaultKind::PauseMinority | FaultKind::PartitionMinority => {
            let mut chosen = up.clone();
            chosen.shuffle(&mut rng);
            chosen.truncate(fault.nodes);
            chosen.sort_unstable();
            let taken = if chosen.iter().any(|&c| Some(c) == leader) { ", taken" } else { "" };
            (chosen, format!("minority (leader {leader:?}{taken})"))
        }
        FaultKind::KillMajority => {
            // Followers first: a leader cut off from its majority is the revealing case (it
            // must not acknowledge anything alone).
            let mut chosen: Vec<usize> = up.iter().copied().filter(|&i| Some(i) != leader).collect();
            chosen.shuffle(&mut rng);
            chosen.extend(leader);
            chosen.truncate(fault.nodes);
            chosen.sort_unstable();
            let kept = if chosen.iter().all(|&c| Some(c) != leader) { ", kept" } else { "" };
            (chosen, format!("majority (leader {leader:?}{kept})"))
        }
        FaultKind::ReplaceMember => {
            let size = target.initial_members;
            let replacing = scope.spawn(move || membership::replace(target, size, fault.pick, deadline));
            let taken = Active { replacing: Some(replacing), ..Active::default() };
            return (taken, format!("adding a spare, then removing a member of {members:?} (leader {leader:?})"));
        }
    };
    let mut taken = Active::default();
    if fault.kind.may_depose() {
        taken.leader = leader.filter(|l| nodes.contains(l));
    }
    if fault.kind.is_network() {
        match cut_off(target, fault.kind, &nodes) {
            Ok(rules) => (taken.nodes, taken.rules) = (nodes, rules),
            Err(e) => errors.push(format!("{:?} of nodes {nodes:?}: {e}", fault.kind)),
        }
        return (taken, note);
    }
    let mut procs = target.procs();
    for &node in &nodes {
        let result = if fault.kind.kills() {
            procs.kill(node).map_err(TargetError::from)
        } else {
            target.pause(&mut procs, node)
        };
        match result {
            Ok(()) => taken.nodes.push(node),
            Err(e) => errors.push(format!("{:?} of node {node}: {e}", fault.kind)),
        }
    }
    (taken, note)
}

/// Why a network fault could not be made or healed.
#[derive(Debug, thiserror::Error)]
enum NetworkFaultError {
    #[error("network faults need --netns")]
    NoNetwork,
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// Cuts `nodes` off in the network: a partition from the other replicas (returning its rules),
/// or the link down.
fn cut_off(target: &Target, kind: FaultKind, nodes: &[usize]) -> Result<Vec<u64>, NetworkFaultError> {
    let network = target.network.as_ref().ok_or(NetworkFaultError::NoNetwork)?;
    if kind == FaultKind::LinkDown {
        nodes.iter().try_for_each(|&node| network.set_link(node, false))?;
        return Ok(Vec::new());
    }
    let rest: Vec<usize> = (0..target.nodes.len()).filter(|i| !nodes.contains(i)).collect();
    Ok(network.partition(nodes, &rest)?)
}

/// Ends one fault: restarts killed nodes, resumes paused ones, heals the network.
/// A leader the fault took out is asked about first: if another node leads by then, the old
/// leader comes back deposed, the case a stale leader must not corrupt.
/// A replacement is waited for (it ends by its deadline), and the nodes it added and removed
/// join `nodes`.
fn heal(target: &Target, kind: FaultKind, taken: Active<'_>, played: &mut Played, nodes: &mut Vec<usize>) -> String {
    if let Some(replacing) = taken.replacing {
        let Ok(r) = replacing.join() else {
            played.errors.push("the replacement's thread panicked".into());
            return String::new();
        };
        played.changes.add(&r.counts);
        nodes.extend(r.added.iter().chain(&r.removed));
        return r.note;
    }
    let mut note = String::new();
    if let Some(old) = taken.leader
        && let Some(new) = target.leaders(STATUS_TIMEOUT).into_iter().find(|&l| l != old)
    {
        played.stale_leader_wakeups += 1;
        note = format!("old leader {old} comes back after node {new} took over");
    }
    if kind.is_network() {
        let healed = match target.network.as_ref() {
            Some(network) if kind == FaultKind::LinkDown => {
                taken.nodes.iter().try_for_each(|&node| network.set_link(node, true)).map_err(Into::into)
            }
            Some(network) => network.heal(&taken.rules).map_err(Into::into),
            None => Err(NetworkFaultError::NoNetwork),
        };
        if let Err(e) = healed {
            played.errors.push(format!("healing {kind:?} of nodes {:?}: {e}", taken.nodes));
        }
        return note;
    }
    let mut procs = target.procs();
    for &node in &taken.nodes {
        let result =
            if kind.kills() { procs.start(node).map_err(TargetError::from) } else { target.resume(&mut procs, node) };
        if let Err(e) = result {
            played.errors.push(format!("healing node {node}: {e}"));
        }
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_recorded_under_their_names() {
        let names: Vec<String> =
            [Step::Kill, Step::LinkDown, Step::LinkUp, Step::Skipped, Step::Replace, Step::RestartRemoved]
                .iter()
                .map(|s| serde_json::to_string(s).expect("json"))
                .collect();
        assert_eq!(
            names,
            ["\"kill\"", "\"link-down\"", "\"link-up\"", "\"skipped\"", "\"replace\"", "\"restart-removed\""]
        );
    }

    fn params(replicas: usize) -> ScheduleParams {
        ScheduleParams {
            replicas,
            duration_ms: 60_000,
            max_faults: 1000,
            mean_gap_ms: 300,
            kinds: FaultKind::DEFAULT.to_vec(),
        }
    }

    fn most_down_at_once(faults: &[Fault]) -> usize {
        faults
            .iter()
            .map(|f| {
                faults.iter().filter(|g| g.start_ms <= f.start_ms && g.heal_ms > f.start_ms).map(|g| g.nodes).sum()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn a_seed_always_gives_the_same_schedule() {
        assert_eq!(schedule(7, &params(5)), schedule(7, &params(5)));
        assert_ne!(schedule(7, &params(5)), schedule(8, &params(5)));
    }

    #[test]
    fn never_more_than_a_minority_down() {
        for seed in 0..200 {
            for replicas in [3, 5] {
                let p = ScheduleParams { kinds: FaultKind::DEFAULT.to_vec(), ..params(replicas) };
                let faults = schedule(seed, &p);
                assert!(!faults.is_empty());
                assert!(most_down_at_once(&faults) <= (replicas - 1) / 2, "seed {seed}, {replicas} replicas");
                assert!(faults.iter().all(|f| f.start_ms < f.heal_ms && f.heal_ms <= 60_000));
            }
        }
    }

    #[test]
    fn bounded_by_max_faults_and_kinds() {
        let p = ScheduleParams { max_faults: 3, kinds: vec![FaultKind::PauseLeader], ..params(3) };
        let faults = schedule(1, &p);
        assert_eq!(faults.len(), 3);
        assert!(faults.iter().all(|f| f.kind == FaultKind::PauseLeader && f.nodes == 1));
        let three = ScheduleParams { kinds: vec![FaultKind::KillMinority], ..params(3) };
        assert!(schedule(1, &three).is_empty(), "3 replicas have no minority of two");
        let five = schedule(1, &ScheduleParams { kinds: vec![FaultKind::KillMinority], ..params(5) });
        assert!(!five.is_empty() && five.iter().all(|f| f.nodes == 2));
    }

    #[test]
    fn kill_all_takes_every_node_alone() {
        let p = ScheduleParams { kinds: vec![FaultKind::KillAll, FaultKind::KillLeader], ..params(3) };
        let faults = schedule(2, &p);
        assert!(faults.iter().any(|f| f.kind == FaultKind::KillAll));
        for f in faults.iter().filter(|f| f.kind == FaultKind::KillAll) {
            assert_eq!(f.nodes, 3);
            let overlapping = faults.iter().filter(|g| g.start_ms < f.heal_ms && f.start_ms < g.heal_ms).count();
            assert_eq!(overlapping, 1, "{f:?}");
        }
    }

    #[test]
    fn kill_majority_takes_a_majority_alone() {
        let p = ScheduleParams { kinds: vec![FaultKind::KillMajority, FaultKind::KillFollower], ..params(5) };
        let faults = schedule(4, &p);
        assert!(faults.iter().any(|f| f.kind == FaultKind::KillMajority));
        for f in faults.iter().filter(|f| f.kind == FaultKind::KillMajority) {
            assert_eq!(f.nodes, 3);
            let overlapping = faults.iter().filter(|g| g.start_ms < f.heal_ms && f.start_ms < g.heal_ms).count();
            assert_eq!(overlapping, 1, "{f:?}");
        }
    }

    #[test]
    fn windows_pair_each_fault_with_its_heal() {
        let action =
            |at_ns, fault, kind, action| Action { at_ns, fault, kind, action, nodes: vec![0], note: String::new() };
        let played = Played {
            actions: vec![
                action(10, 0, FaultKind::KillMajority, Step::Kill),
                action(15, 1, FaultKind::PauseFollower, Step::Pause),
                action(20, 1, FaultKind::PauseFollower, Step::Resume),
                action(30, 0, FaultKind::KillMajority, Step::Restart),
                action(40, 2, FaultKind::KillMajority, Step::Skipped),
            ],
            ..Played::default()
        };
        assert_eq!(played.windows(FaultKind::KillMajority), [(10, 30)]);
        assert_eq!(played.windows(FaultKind::PauseFollower), [(15, 20)]);
    }

    /// A replacement takes no member down (it adds one before it removes one), so the other
    /// faults keep their budget; replacements never overlap (one spare would be in use).
    #[test]
    fn replacements_come_one_at_a_time_beside_the_other_faults() {
        let kinds =
            vec![FaultKind::ReplaceMember, FaultKind::KillLeader, FaultKind::PauseLeader, FaultKind::KillFollower];
        for seed in 0..50 {
            let faults = schedule(seed, &ScheduleParams { kinds: kinds.clone(), ..params(3) });
            let replacements: Vec<&Fault> = faults.iter().filter(|f| f.kind == FaultKind::ReplaceMember).collect();
            assert!(!replacements.is_empty(), "seed {seed}");
            assert!(replacements.iter().all(|f| f.nodes == 0));
            for (a, b) in replacements.iter().zip(replacements.iter().skip(1)) {
                assert!(a.heal_ms <= b.start_ms, "seed {seed}: {a:?} overlaps {b:?}");
            }
            assert!(most_down_at_once(&faults) <= 1, "seed {seed}");
            let overlapped = faults.iter().any(|f| {
                f.kind != FaultKind::ReplaceMember
                    && replacements.iter().any(|r| f.start_ms < r.heal_ms && r.start_ms < f.heal_ms)
            });
            assert!(overlapped, "seed {seed}: other faults go on during replacements");
        }
    }

    #[test]
    fn pause_all_stands_alone() {
        let p = ScheduleParams { kinds: vec![FaultKind::PauseAll, FaultKind::PauseFollower], ..params(5) };
        let faults = schedule(3, &p);
        assert!(faults.iter().any(|f| f.kind == FaultKind::PauseAll && f.nodes == 5));
        for f in faults.iter().filter(|f| f.kind == FaultKind::PauseAll) {
            let overlapping = faults.iter().filter(|g| g.start_ms < f.heal_ms && f.start_ms < g.heal_ms).count();
            assert_eq!(overlapping, 1, "nothing overlaps a pause of every node: {f:?}");
        }
        let single = schedule(3, &ScheduleParams { kinds: vec![FaultKind::PauseAll], ..params(1) });
        assert!(!single.is_empty(), "a single server can be paused");
    }
}
