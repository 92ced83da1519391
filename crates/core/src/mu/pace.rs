//! Heartbeat pacing (Mu §5.1, extended): an idle cluster heartbeats, and reads heartbeats, once
//! every `MuConfig::idle_stride` periods instead of every period.
//!
//! An idle node's CPU is its number of wake-ups (docs/BENCHMARKS.md, "Where an idle node's
//! heartbeat wake-up goes"), and pull-score detection needs a reader to wake as often as the
//! counter it reads moves. So each replica publishes, in the top byte of its heartbeat word,
//! its *stride*: the number of periods within which its next increment is due. A reader judges
//! each peer at that peer's pace: a READ that finds the counter unchanged before the promised
//! increment was due counts for nothing, neither heard nor silence; once it was due, silence
//! counts as it always did. A promise is made with the increment that carries it, so a reader
//! never judges a peer by a stride the peer did not announce first; going back to stride 1 needs
//! no announcement (increments only come sooner).
//!
//! Which stride a replica takes is decided at each tick (`BackgroundPlane`): 1 unless its
//! replication plane has been quiet (no work under way, its log's first undecided offset
//! unmoved) for [`IDLE_AFTER_TICKS`] ticks and its view of the leader is calm; then a leader
//! takes `idle_stride` and a follower the stride its leader publishes (no more), so a follower
//! never reads its leader more slowly than the leader promised. A leader whose promised
//! increment does not come (or whose heartbeat READ stays in flight a whole period) makes each
//! of its followers hurry: back to a tick every period, where every READ is judged again, so
//! a crashed idle leader is found at most one stride late.
//!
//! A resting peer's increment may come a little late without counting as silence: its timer
//! wakes a thread that slept for many periods, and on a small or virtual machine such a wake-up
//! comes hundreds of microseconds late often enough that, at a 100 us heartbeat whose score
//! tolerates three silent periods, idle leaders were taken for failed dozens of times a minute
//! (docs/BENCHMARKS.md, "An idle node's threads wake only for heartbeats"). So silence counts
//! only [`rest_grace_periods`] after the increment was due; in between, a reader that finds the
//! counter unchanged hurries (reads every period) without counting it.
//!
//! What it costs is bounded: a failure of an idle leader is noticed up to `idle_stride` periods
//! and its grace later than in a busy cluster, and a permission request made to a resting peer
//! is served at its next tick (a requester waits that much longer,
//! `LocalLogGate::peers_rest_ns`).

use microrep_fabric::NodeId;

use super::MuConfig;

/// Bits of the heartbeat word below the stride: the counter.
const STRIDE_SHIFT: u32 = 56;
/// Ticks with a quiet replication plane after which a replica may rest between heartbeats.
pub(super) const IDLE_AFTER_TICKS: u32 = 16;

/// The periods after a peer's promised increment was due during which its silence does not
/// count yet: an eighth of its stride (none for strides below 8, so a busy peer is judged as
/// in Mu).
pub(super) fn rest_grace_periods(stride: u8) -> u64 {
    u64::from(stride / 8)
}

/// The heartbeat word: the `counter`, with the `stride` in its top byte.
pub(super) fn heartbeat_word(counter: u64, stride: u8) -> u64 {
    u64::from(stride) << STRIDE_SHIFT | counter & ((1 << STRIDE_SHIFT) - 1)
}

/// The stride a heartbeat word announces (1 for a word without one).
pub(super) fn stride_of(word: u64) -> u8 {
    ((word >> STRIDE_SHIFT) as u8).max(1)
}

#[derive(Clone, Copy, Debug)]
struct PeerPace {
    /// The stride its last heartbeat that moved announced.
    stride: u8,
    /// When the READ in flight was posted.
    posted_ns: u64,
    /// When its next increment is due, by its last announcement.
    due_ns: u64,
    /// A READ posted from then on that finds the counter unchanged counts as silence (the due
    /// time and the rest's grace).
    judged_from_ns: u64,
    /// Whether the last READ that counted found silence.
    missed: bool,
    /// Whether the last READ found the counter unchanged after it was due, within the grace.
    late: bool,
}

/// One replica's stride and its view of every peer's.
#[derive(Clone, Debug)]
pub(super) struct Pace {
    period_ns: u64,
    idle_stride: u8,
    stride: u8,
    last_tick_ns: u64,
    fuo_seen: u64,
    quiet_ticks: u32,
    peers: Vec<PeerPace>,
}

impl Pace {
    /// Every replica starts at stride 1, and holds every peer to it.
    pub(super) fn new(config: &MuConfig) -> Self {
        let peer = PeerPace { stride: 1, posted_ns: 0, due_ns: 0, judged_from_ns: 0, missed: false, late: false };
        Self {
            period_ns: config.heartbeat_period_ns,
            idle_stride: config.idle_stride,
            stride: 1,
            last_tick_ns: 0,
            fuo_seen: 0,
            quiet_ticks: 0,
            peers: vec![peer; usize::from(config.replicas)],
        }
    }

    /// This replica's stride, as its last heartbeat published it.
    pub(super) fn stride(&self) -> u8 {
        self.stride
    }

    /// The stride `peer` last announced.
    pub(super) fn peer_stride(&self, peer: NodeId) -> u8 {
        self.peers[usize::from(peer.0)].stride
    }

    /// A tick at `now`: `quiet` says whether the replication plane has no work under way, `fuo`
    /// is the local log's first undecided offset, and `resting` the stride this replica would
    /// take if it has been quiet long enough (1 when its view is not calm). Returns the stride
    /// to publish with this tick's heartbeat; the next tick is due that many periods on.
    pub(super) fn tick(&mut self, now: u64, quiet: bool, fuo: u64, resting: u8) -> u8 {
        if quiet && fuo == self.fuo_seen {
            self.quiet_ticks = self.quiet_ticks.saturating_add(1);
        } else {
            self.quiet_ticks = 0;
        }
        self.fuo_seen = fuo;
        self.last_tick_ns = now;
        self.stride = if self.quiet_ticks >= IDLE_AFTER_TICKS { resting.clamp(1, self.idle_stride) } else { 1 };
        self.stride
    }

    /// When the next tick is due after one at `last_tick_ns` at this stride.
    pub(super) fn next_tick_ns(&self) -> u64 {
        self.last_tick_ns + u64::from(self.stride) * self.period_ns
    }

    /// When the next tick is due if this replica stops resting now: one period after the last.
    pub(super) fn hurried_tick_ns(&self) -> u64 {
        self.last_tick_ns + self.period_ns
    }

    /// A heartbeat READ of `peer` was posted at `now`.
    pub(super) fn posted(&mut self, peer: NodeId, now: u64) {
        self.peers[usize::from(peer.0)].posted_ns = now;
    }

    /// Judges the READ of `peer` that completed: `word` is what it read (`None`: the READ
    /// failed), `moved` whether that differs from the previous word. Returns whether the
    /// detector should count it: a moved counter always, silence only once the peer's
    /// promised increment was due and its grace ([`rest_grace_periods`]) over.
    pub(super) fn judge(&mut self, peer: NodeId, word: Option<u64>, moved: bool) -> bool {
        let period = self.period_ns;
        let p = &mut self.peers[usize::from(peer.0)];
        match word {
            Some(w) if moved => {
                p.stride = stride_of(w);
                p.due_ns = p.posted_ns + u64::from(p.stride) * period;
                p.judged_from_ns = p.due_ns + rest_grace_periods(p.stride) * period;
                p.missed = false;
                p.late = false;
                true
            }
            Some(_) if p.posted_ns < p.judged_from_ns => {
                p.late = p.posted_ns >= p.due_ns;
                false
            }
            _ => {
                p.missed = true;
                true
            }
        }
    }

    /// `peer` was counted silent without a READ (one still in flight at the next tick, or one
    /// that could not be posted).
    pub(super) fn silent(&mut self, peer: NodeId) {
        self.peers[usize::from(peer.0)].missed = true;
    }

    /// Whether a READ of `peer` posted a period or more before `now` is still in flight: a sign
    /// of trouble, as a READ completes within microseconds (or fails) on every fabric.
    pub(super) fn overdue(&self, peer: NodeId, in_flight: bool, now: u64) -> bool {
        in_flight && now >= self.peers[usize::from(peer.0)].posted_ns + self.period_ns
    }

    /// Whether the last READ of `peer` that counted found silence, or the last one found its
    /// promised increment late (within the grace): either way, a reason to hurry.
    pub(super) fn missed(&self, peer: NodeId) -> bool {
        let p = &self.peers[usize::from(peer.0)];
        p.missed || p.late
    }

    /// The longest a peer `live` holds live may rest between ticks, by its last announcement: how
    /// much later than usual a permission request may be served.
    pub(super) fn rest_ns(&self, live: impl Fn(NodeId) -> bool) -> u64 {
        let rest =
            |(i, p): (usize, &PeerPace)| (live(NodeId(i as u16))).then(|| u64::from(p.stride - 1) * self.period_ns);
        self.peers.iter().enumerate().filter_map(rest).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: u64 = 1_000;

    fn pace(idle_stride: u8) -> Pace {
        let mut config = MuConfig::new(NodeId(0), 3);
        config.heartbeat_period_ns = PERIOD;
        config.idle_stride = idle_stride;
        Pace::new(&config)
    }

    #[test]
    fn the_stride_rides_above_the_counter() {
        let word = heartbeat_word(41, 16);
        assert_eq!((stride_of(word), word & 0xff_ffff), (16, 41));
        assert_eq!(stride_of(7), 1, "a word without a stride announces 1");
        assert_eq!(heartbeat_word(1 << 56 | 5, 2), heartbeat_word(5, 2), "the counter never reaches the stride");
    }

    #[test]
    fn a_replica_rests_only_after_enough_quiet_ticks_and_wakes_with_the_first_busy_one() {
        let mut p = pace(16);
        let mut now = PERIOD;
        assert_eq!(p.tick(now, true, 9, 16), 1, "the log moved since the start");
        for tick in 1..IDLE_AFTER_TICKS {
            now += PERIOD;
            assert_eq!(p.tick(now, true, 9, 16), 1, "quiet tick {tick}");
        }
        assert_eq!(p.tick(now + PERIOD, true, 9, 16), 16);
        assert_eq!(p.next_tick_ns(), now + 17 * PERIOD);
        assert_eq!(p.hurried_tick_ns(), now + 2 * PERIOD);
        assert_eq!(p.tick(now + 17 * PERIOD, true, 9, 40), 16, "never beyond idle_stride");
        assert_eq!(p.tick(now + 33 * PERIOD, true, 10, 16), 1, "the log moved");
        assert_eq!(p.tick(now + 34 * PERIOD, false, 10, 16), 1, "work under way");
        let mut off = pace(1);
        for _ in 0..2 * IDLE_AFTER_TICKS {
            assert_eq!(off.tick(now, true, 9, 16), 1, "idle_stride 1 never rests");
        }
    }

    #[test]
    fn silence_counts_only_once_the_promised_increment_was_due() {
        let mut p = pace(16);
        let peer = NodeId(1);
        p.posted(peer, 0);
        assert!(p.judge(peer, Some(heartbeat_word(1, 4)), true));
        assert_eq!(p.peer_stride(peer), 4);
        for at in [PERIOD, 2 * PERIOD, 3 * PERIOD] {
            p.posted(peer, at);
            assert!(!p.judge(peer, Some(heartbeat_word(1, 4)), false), "not due at {at}");
            assert!(!p.missed(peer));
        }
        p.posted(peer, 4 * PERIOD);
        assert!(p.judge(peer, Some(heartbeat_word(1, 4)), false), "due");
        assert!(p.missed(peer));
        p.posted(peer, 5 * PERIOD);
        assert!(p.judge(peer, Some(heartbeat_word(1, 4)), false), "a broken promise: every READ counts");
        p.posted(peer, 6 * PERIOD);
        assert!(p.judge(peer, None, false), "a failed READ always counts");
        assert!(p.judge(peer, Some(heartbeat_word(2, 1)), true));
        assert!(!p.missed(peer));
        p.posted(peer, 7 * PERIOD);
        assert!(p.judge(peer, Some(heartbeat_word(2, 1)), false), "stride 1: every period is due");
    }

    #[test]
    fn a_resting_peers_late_increment_makes_its_reader_hurry_and_counts_only_after_the_grace() {
        let mut p = pace(32);
        let peer = NodeId(1);
        p.posted(peer, 0);
        assert!(p.judge(peer, Some(heartbeat_word(1, 32)), true));
        assert_eq!(rest_grace_periods(32), 4);
        p.posted(peer, 31 * PERIOD);
        assert!(!p.judge(peer, Some(heartbeat_word(1, 32)), false), "not due");
        assert!(!p.missed(peer), "no reason to hurry before it is due");
        for at in [32, 33, 35] {
            p.posted(peer, at * PERIOD);
            assert!(!p.judge(peer, Some(heartbeat_word(1, 32)), false), "late by {} periods: graced", at - 32);
            assert!(p.missed(peer), "late: hurry");
        }
        p.posted(peer, 36 * PERIOD);
        assert!(p.judge(peer, Some(heartbeat_word(1, 32)), false), "past the grace: silence counts");
        p.posted(peer, 37 * PERIOD);
        assert!(p.judge(peer, Some(heartbeat_word(2, 32)), true), "it came");
        assert!(!p.missed(peer));
        assert_eq!(rest_grace_periods(7), 0, "a busy or barely resting peer gets none");
    }

    #[test]
    fn the_longest_rest_is_that_of_a_live_peer() {
        let mut p = pace(16);
        for (peer, stride) in [(1, 4), (2, 16)] {
            p.posted(NodeId(peer), 0);
            p.judge(NodeId(peer), Some(heartbeat_word(1, stride)), true);
        }
        assert_eq!(p.rest_ns(|_| true), 15 * PERIOD);
        assert_eq!(p.rest_ns(|n| n != NodeId(2)), 3 * PERIOD);
        assert_eq!(p.rest_ns(|_| false), 0);
    }
}
