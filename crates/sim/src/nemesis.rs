//! The nemesis: a seeded schedule of process faults (crashes, pauses, pauses in the middle of
//! posting writes), with swarm testing link faults too (partitions, one-way reachability,
//! clogged links), and, with restarts on, when each crashed replica comes back with empty
//! memory. Fabric faults (delays, failed completions, torn writes) come from the sim fabric's
//! own configuration. The runner never lets more than a minority be down at once (link faults
//! take nobody down: safety must hold through any of them).

use microrep_fabric::NodeId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One process fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The replica's process dies; its memory is gone.
    Crash {
        /// Whom.
        node: NodeId,
        /// Whether it was the leader.
        leader: bool,
    },
    /// The replica stops running for `for_ns` (SIGSTOP, a long GC, a descheduled thread) while
    /// its NIC keeps serving peers; with `hold_writes` its posted but unstarted writes wait too
    /// (stopped in the middle of posting).
    Pause {
        /// Whom.
        node: NodeId,
        /// How long.
        for_ns: u64,
        /// Whether its outgoing operations are held as well.
        hold_writes: bool,
        /// Whether it was the leader.
        leader: bool,
    },
    /// Operations `from` posts to `to` wait for `for_ns` (and the other way too if
    /// `both_ways`): a partition between two replicas, one-way reachability (`from` suspects
    /// `to` while everyone else hears it), or, when short, a clogged link.
    Link {
        /// The held direction's sender.
        from: NodeId,
        /// The held direction's target.
        to: NodeId,
        /// How long.
        for_ns: u64,
        /// Whether `to` → `from` is held as well.
        both_ways: bool,
    },
}

impl Fault {
    /// The replica it strikes.
    pub fn node(&self) -> NodeId {
        match *self {
            Self::Crash { node, .. } | Self::Pause { node, .. } => node,
            Self::Link { from, .. } => from,
        }
    }
}

/// Faults injected, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Crashes of the leader.
    pub leader_crashes: u64,
    /// Crashes of a follower.
    pub follower_crashes: u64,
    /// Pauses of the leader long enough for another to be elected.
    pub leader_pauses: u64,
    /// Other pauses.
    pub follower_pauses: u64,
    /// Crashed replicas brought back with empty memory (`SimOptions::restarts`).
    pub restarts: u64,
    /// Links held (partitions, one-way reachability, clogging; swarm testing).
    pub link_faults: u64,
}

impl FaultCounts {
    /// Counts one injected fault.
    pub fn record(&mut self, fault: &Fault) {
        match *fault {
            Fault::Crash { leader: true, .. } => self.leader_crashes += 1,
            Fault::Crash { leader: false, .. } => self.follower_crashes += 1,
            Fault::Pause { leader: true, .. } => self.leader_pauses += 1,
            Fault::Pause { leader: false, .. } => self.follower_pauses += 1,
            Fault::Link { .. } => self.link_faults += 1,
        }
    }
}

impl std::ops::AddAssign for FaultCounts {
    fn add_assign(&mut self, o: Self) {
        self.leader_crashes += o.leader_crashes;
        self.follower_crashes += o.follower_crashes;
        self.leader_pauses += o.leader_pauses;
        self.follower_pauses += o.follower_pauses;
        self.restarts += o.restarts;
        self.link_faults += o.link_faults;
    }
}

#[derive(Clone, Copy, Debug)]
enum Planned {
    CrashLeader,
    CrashFollower,
    PauseLeader {
        for_ns: u64,
        hold_writes: bool,
    },
    PauseFollower {
        for_ns: u64,
    },
    /// A follower cannot reach the leader, or the leader a follower (one way).
    LeaderLink {
        for_ns: u64,
        from_leader: bool,
    },
    /// Two replicas cannot reach each other.
    Partition {
        for_ns: u64,
    },
    /// A short one-way hold between two replicas.
    Clog {
        for_ns: u64,
    },
}

/// The fault kinds, in the order swarm testing draws them.
const KINDS: usize = 7;

/// Swarm testing (Groce et al., ISSTA 2012): each seed runs a fault mix of its own, a random
/// subset of the kinds, so that rare combinations (a leader's link held while a follower
/// pauses, and nothing else) are not drowned out by the average mix.
#[derive(Clone, Copy, Debug)]
struct Swarm {
    enabled: [bool; KINDS],
}

impl Swarm {
    /// Every process fault kind, no link faults: the mix of runs without swarm testing.
    fn classic() -> Self {
        Self { enabled: [true, true, true, true, false, false, false] }
    }

    fn draw(rng: &mut ChaCha8Rng) -> Self {
        let mut enabled = [false; KINDS];
        while !enabled.iter().any(|&e| e) {
            enabled.iter_mut().for_each(|e| *e = rng.random_bool(0.5));
        }
        Self { enabled }
    }

    fn plan(&self, rng: &mut ChaCha8Rng) -> Planned {
        let kinds: Vec<usize> = (0..KINDS).filter(|&k| self.enabled[k]).collect();
        match kinds[rng.random_range(0..kinds.len())] {
            0 => Planned::CrashLeader,
            1 => Planned::CrashFollower,
            2 => {
                Planned::PauseLeader { for_ns: rng.random_range(500_000..3_000_000), hold_writes: rng.random_bool(0.5) }
            }
            3 => Planned::PauseFollower { for_ns: rng.random_range(100_000..3_000_000) },
            4 => {
                Planned::LeaderLink { for_ns: rng.random_range(100_000..3_000_000), from_leader: rng.random_bool(0.3) }
            }
            5 => Planned::Partition { for_ns: rng.random_range(100_000..3_000_000) },
            _ => Planned::Clog { for_ns: rng.random_range(5_000..300_000) },
        }
    }
}

/// Shortest and longest time a crashed replica stays down before it restarts: from well
/// under the failure detector's reaction (peers may not notice the crash at all) to several
/// leader elections.
pub const RESTART_DELAY_NS: std::ops::Range<u64> = 10_000..3_000_000;

/// The fault schedule of one run.
#[derive(Debug)]
pub struct Nemesis {
    plan: Vec<(u64, Planned)>,
    replicas: u16,
    rng: ChaCha8Rng,
    /// Draws restart delays; its own generator, so that turning restarts on leaves the fault
    /// schedule of a seed as it was.
    restart_rng: Option<ChaCha8Rng>,
}

impl Nemesis {
    /// From one to `max_faults` faults at random times of the first `phase_ns` (none if
    /// `max_faults` is 0); crashed replicas come back after [`Nemesis::restart_delay`] if
    /// `restarts`. With `swarm`, the seed draws which fault kinds it runs, link faults
    /// included; without, the schedule is the one every seed had before swarm testing.
    pub fn new(seed: u64, replicas: u16, phase_ns: u64, max_faults: u32, restarts: bool, swarm: bool) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfa17);
        let count = if max_faults > 0 && replicas > 1 { rng.random_range(1..=max_faults) } else { 0 };
        let mix = if swarm { Swarm::draw(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x5a42)) } else { Swarm::classic() };
        let mut plan: Vec<(u64, Planned)> = (0..count)
            .map(|_| {
                let at = rng.random_range(phase_ns / 10..phase_ns);
                let kind = if swarm {
                    mix.plan(&mut rng)
                } else {
                    match rng.random_range(0..6) {
                        0 => Planned::CrashLeader,
                        1 => Planned::CrashFollower,
                        2 | 3 => Planned::PauseLeader {
                            for_ns: rng.random_range(500_000..3_000_000),
                            hold_writes: rng.random_bool(0.5),
                        },
                        _ => Planned::PauseFollower { for_ns: rng.random_range(100_000..3_000_000) },
                    }
                };
                (at, kind)
            })
            .collect();
        plan.sort_by_key(|&(at, _)| std::cmp::Reverse(at));
        let restart_rng = restarts.then(|| ChaCha8Rng::seed_from_u64(seed ^ 0x0e57_a127));
        Self { plan, replicas, rng, restart_rng }
    }

    /// How long a replica that crashes now stays down before it restarts with empty memory;
    /// `None` if crashes are crash-stop (restarts off).
    pub fn restart_delay(&mut self) -> Option<u64> {
        self.restart_rng.as_mut().map(|rng| rng.random_range(RESTART_DELAY_NS))
    }

    /// Faults due by `now`, aimed using the current `leader`.
    pub fn due(&mut self, now: u64, leader: &Option<NodeId>) -> Vec<Fault> {
        let mut out = Vec::new();
        while self.plan.last().is_some_and(|&(at, _)| at <= now) {
            let Some((_, planned)) = self.plan.pop() else { break };
            let leader = leader.unwrap_or(NodeId(0));
            let follower = NodeId((leader.0 + self.rng.random_range(1..self.replicas)) % self.replicas);
            let mut other = || NodeId((follower.0 + self.rng.random_range(1..self.replicas)) % self.replicas);
            out.push(match planned {
                Planned::CrashLeader => Fault::Crash { node: leader, leader: true },
                Planned::CrashFollower => Fault::Crash { node: follower, leader: false },
                Planned::PauseLeader { for_ns, hold_writes } => {
                    Fault::Pause { node: leader, for_ns, hold_writes, leader: true }
                }
                Planned::PauseFollower { for_ns } => {
                    Fault::Pause { node: follower, for_ns, hold_writes: false, leader: false }
                }
                Planned::LeaderLink { for_ns, from_leader: true } => {
                    Fault::Link { from: leader, to: follower, for_ns, both_ways: false }
                }
                Planned::LeaderLink { for_ns, from_leader: false } => {
                    Fault::Link { from: follower, to: leader, for_ns, both_ways: false }
                }
                Planned::Partition { for_ns } => Fault::Link { from: follower, to: other(), for_ns, both_ways: true },
                Planned::Clog { for_ns } => Fault::Link { from: follower, to: other(), for_ns, both_ways: false },
            });
        }
        out
    }
}
