//! What one simulated run simulates ([`SimOptions`]), and the command-line flags that replay it.

/// Simulated time during which faults are injected, by default.
pub const DEFAULT_FAULT_PHASE_NS: u64 = 6_000_000;
/// Most faults per run, by default.
pub const DEFAULT_MAX_FAULTS: u32 = 5;
/// With `SimOptions::max_gap_ns`: how long a client waits for a request before giving up.
pub const CLIENT_TIMEOUT_NS: u64 = 500_000;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Cluster size.
    pub replicas: u16,
    /// Concurrent clients, one operation outstanding each.
    pub clients: u32,
    /// Simulated time during which faults are injected.
    pub fault_phase_ns: u64,
    /// Most process faults the nemesis plans in the fault phase (each run draws from one to
    /// this many).
    pub max_faults: u32,
    /// Longest the liveness phase may take before the run fails.
    pub liveness_limit_ns: u64,
    /// Whether to inject faults at all.
    pub faults: bool,
    /// Whether crashed replicas come back, after a seeded delay, as fresh replicas with empty
    /// memory under the same id (amnesia). Off, crashes are crash-stop and every seed replays
    /// as it did before restarts existed.
    pub restarts: bool,
    /// With restarts: at most a minority of replicas lose their memory during the fault phase
    /// (a replica restarted empty counts as crashed, for crashes only, until the faults stop;
    /// pauses follow the usual rule). Every chosen value then survives in some replica, so a
    /// correct protocol must pass. Without it a restarted replica counts as down only from its
    /// crash to its restart, and a majority can lose its memory one replica at a time, which
    /// no protocol survives without losing the values only they held.
    pub bounded_amnesia: bool,
    /// With `bounded_amnesia`: a restarted replica stops counting against the bound once it is a
    /// voter again (a leader brought it up to date and promoted it), and until then it counts as
    /// down for every fault, as the fault harness's nemesis counts it. Replicas may then lose
    /// their memory one after another without limit, as long as at most a minority are down or
    /// recovering at any moment: the protocol must restore every chosen value to a promoted
    /// replica before another may be lost.
    pub amnesia_heals: bool,
    /// With what probability a replica is descheduled (for up to 50 us) before each read of
    /// its own memory during the fault phase (`SimConfig::preempt_prob`), so that peers' writes
    /// land between two reads of one poll. 0: never.
    pub preempt: f64,
    /// With what probability a fabric operation is instant: it takes effect and completes
    /// within its post call, as a WRITE on shm does (`SimConfig::instant_prob`), so that a
    /// leader can commit in the poll that proposed, as it does on shm. 0: never.
    pub instant: f64,
    /// Overrides `MuConfig::join_grace_heartbeats` (the simulated preset's is 0).
    pub join_grace_heartbeats: Option<u32>,
    /// `MuConfig::recycle_wait_ns` (0: Mu's majority rule, as every seed ran before).
    pub recycle_wait_ns: u64,
    /// `MuConfig::idle_stride` (1: heartbeat every period, as every seed ran before). Above 1,
    /// clients also pause together now and then (lulls of 0.4 to 3 ms), so that the cluster
    /// goes idle and rests between heartbeats, and faults strike resting replicas.
    pub idle_stride: u8,
    /// Swarm testing: each seed draws its own mix of fault kinds, link faults included
    /// (partitions, one-way reachability, clogged links), and each replica's two planes are
    /// polled as separate actors (a step may run one plane of a replica and not the other, as
    /// the runtime's two threads may). Off, every seed replays as it did before.
    pub swarm: bool,
    /// Availability under minority faults: a run whose clients go longer than this without an
    /// acknowledged operation during the fault phase (once one was acknowledged) fails. The
    /// nemesis keeps process faults on a minority; link faults (`swarm`) may cut off a
    /// majority, so the check suits runs without them. `None`: only measured.
    pub max_gap_ns: Option<u64>,
    /// Membership changes under faults (`mu::membership`): the cluster starts with the ids
    /// `0..replicas - 2` as members and the last two as joiners, and during the fault phase the
    /// leader is asked, about every 100 us, to add a joiner or remove a member (keeping three
    /// at least). The checkers also compare every replica's configuration after each change.
    pub membership: bool,
    /// A deliberate protocol bug to run with (checker tests).
    #[cfg(feature = "planted-bugs")]
    pub bug: Option<microrep_core::mu::PlantedBug>,
}

impl SimOptions {
    /// Defaults: `replicas` replicas, 3 clients, 6 ms of faults, up to 40 ms to recover.
    pub fn new(replicas: u16) -> Self {
        Self {
            replicas,
            clients: 3,
            fault_phase_ns: DEFAULT_FAULT_PHASE_NS,
            max_faults: DEFAULT_MAX_FAULTS,
            liveness_limit_ns: 40_000_000,
            faults: true,
            restarts: false,
            bounded_amnesia: false,
            amnesia_heals: false,
            preempt: 0.0,
            instant: 0.0,
            join_grace_heartbeats: None,
            recycle_wait_ns: 0,
            idle_stride: 1,
            swarm: false,
            max_gap_ns: None,
            membership: false,
            #[cfg(feature = "planted-bugs")]
            bug: None,
        }
    }
}

impl SimOptions {
    /// The command-line options besides `--seed` and `--replicas` that select these options.
    pub(crate) fn replay_flags(&self) -> String {
        let mut flags = String::new();
        if !self.faults {
            flags.push_str(" --no-faults");
        }
        if self.restarts {
            flags.push_str(" --restarts");
        }
        if self.bounded_amnesia {
            flags.push_str(" --bounded-amnesia");
        }
        if self.amnesia_heals {
            flags.push_str(" --amnesia-heals");
        }
        if self.preempt > 0.0 {
            flags.push_str(&format!(" --preempt {}", self.preempt));
        }
        if self.instant > 0.0 {
            flags.push_str(&format!(" --instant {}", self.instant));
        }
        if self.swarm {
            flags.push_str(" --swarm");
        }
        if self.membership {
            flags.push_str(" --membership");
        }
        if let Some(gap) = self.max_gap_ns {
            flags.push_str(&format!(" --max-gap-us {}", gap / 1_000));
        }
        if let Some(grace) = self.join_grace_heartbeats {
            flags.push_str(&format!(" --join-grace {grace}"));
        }
        if self.recycle_wait_ns > 0 {
            flags.push_str(&format!(" --recycle-wait-us {}", self.recycle_wait_ns / 1_000));
        }
        if self.idle_stride > 1 {
            flags.push_str(&format!(" --idle-stride {}", self.idle_stride));
        }
        if self.fault_phase_ns != DEFAULT_FAULT_PHASE_NS {
            flags.push_str(&format!(" --fault-phase-us {}", self.fault_phase_ns / 1_000));
        }
        if self.max_faults != DEFAULT_MAX_FAULTS {
            flags.push_str(&format!(" --max-faults {}", self.max_faults));
        }
        flags
    }
}
