//! What a poll-loop thread does when a poll finds nothing to do.
//!
//! On a machine with a core per thread, spinning gives the lowest latency. On a small machine it
//! is a disaster: a spinning thread takes the core another replica's thread needs, and latency
//! grows by scheduler quanta (milliseconds). The default therefore backs off: a few spins, then
//! yields (other threads run, this one returns at once when nobody else wants the core), then
//! parks for a bounded time. Work found resets the backoff. A parked thread can be woken early
//! by the thread that hands it work.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::ThreadConfig;
use crate::realtime::RealtimeError;

/// The idle behaviour of one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdlePolicy {
    /// Busy-poll: lowest latency, one core per thread.
    Spin,
    /// Yield the core to any runnable thread, then poll again.
    Yield,
    /// Park up to `park_us` (woken early when work arrives).
    Park,
    /// Spin `spin_polls` times, yield `yield_polls` times, then park up to `park_us`.
    #[default]
    Backoff,
}

/// Lets other threads wake a parked poll loop.
#[derive(Debug)]
pub(crate) struct Parker {
    thread: Thread,
    parked: AtomicBool,
}

impl Parker {
    /// A parker for the calling thread.
    pub(crate) fn current() -> Arc<Self> {
        Arc::new(Self { thread: std::thread::current(), parked: AtomicBool::new(false) })
    }

    /// Wakes the thread if it is parked (a cheap load otherwise).
    pub(crate) fn wake(&self) {
        if self.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
    }

    /// Parks the calling thread (which must be this parker's) for up to `timeout`, unless
    /// `done` holds once the thread counts as parked: a waker that made `done` true before
    /// its [`Self::wake`] (with SeqCst) either is seen here or sees the thread parked.
    pub(crate) fn park_unless(&self, timeout: Duration, done: impl Fn() -> bool) {
        self.parked.store(true, Ordering::SeqCst);
        if !done() {
            std::thread::park_timeout(timeout);
        }
        self.parked.store(false, Ordering::SeqCst);
    }

    /// Parks the calling thread (which must be this parker's) for up to `timeout`.
    pub(crate) fn park(&self, timeout: Duration) {
        self.parked.store(true, Ordering::SeqCst);
        std::thread::park_timeout(timeout);
        self.parked.store(false, Ordering::SeqCst);
    }
}

/// The longest an unhurried thread parks while idle ([`Backoff::pause_unhurried`]): an idle
/// follower's replication thread wakes about 100 times a second instead of 1,000, and begins
/// applying at most this late when entries come again (a leader change wakes it at once).
pub(crate) const UNHURRIED_PARK_MAX: Duration = Duration::from_millis(10);

/// The longest the replication thread parks while its cluster rests between heartbeats (see
/// `mu::MuConfig::idle_stride`). Nothing wakes it sooner but what ends the rest: a proposal,
/// the background thread when it stops resting (its leader announced work, a peer missed a
/// heartbeat or came back) or changes its leader. What the thread does
/// periodically on its own (a leader's keepalive, a follower's check that it is not behind)
/// runs at most this late while the cluster rests: an idle node's replication thread wakes 4
/// times a second instead of once per idle heartbeat.
pub(crate) const RESTING_PARK_MAX: Duration = Duration::from_millis(250);

/// The idle state of one poll loop.
#[derive(Debug)]
pub(crate) struct Backoff {
    policy: IdlePolicy,
    spin_polls: u32,
    yield_polls: u32,
    park: Duration,
    park_max: Duration,
    /// The next park's length (`backoff`: doubles up to `park_max` while idle).
    next_park: Duration,
    idle_polls: u32,
    parker: Arc<Parker>,
}

impl Backoff {
    /// The backoff of the calling thread under `config`. The thread's timed parks end on time
    /// from now on (see [`precise_timers`]).
    pub(crate) fn new(config: &ThreadConfig) -> Self {
        precise_timers();
        Self {
            policy: config.idle,
            spin_polls: config.spin_polls,
            yield_polls: config.yield_polls,
            park: Duration::from_micros(u64::from(config.park_us)),
            park_max: Duration::from_micros(u64::from(config.park_max_us.max(config.park_us))),
            next_park: Duration::from_micros(u64::from(config.park_us)),
            idle_polls: 0,
            parker: Parker::current(),
        }
    }

    /// A handle other threads use to wake this loop.
    pub(crate) fn parker(&self) -> Arc<Parker> {
        Arc::clone(&self.parker)
    }

    /// The last poll did work: the next idle pause starts over with spinning.
    pub(crate) fn reset(&mut self) {
        self.idle_polls = 0;
        self.next_park = self.park;
    }

    /// The last poll found nothing to do: pause according to the policy.
    pub(crate) fn pause(&mut self) {
        self.pause_up_to(self.park_max);
    }

    /// [`Backoff::pause`] for a thread that is idle until someone wakes it (a leader with no
    /// request in flight: a proposal, a leader change or a synced log wakes it): after the
    /// spins and yields, its parks grow past the policy's longest, up to [`UNHURRIED_PARK_MAX`].
    /// Its periodic duties (keepalives, recycling, asking a returning follower back) run at
    /// most that late while nothing else happens.
    pub(crate) fn pause_idle(&mut self) {
        self.pause_up_to(self.park_max.max(UNHURRIED_PARK_MAX));
    }

    fn pause_up_to(&mut self, park_max: Duration) {
        match self.policy {
            IdlePolicy::Spin => std::hint::spin_loop(),
            IdlePolicy::Yield => std::thread::yield_now(),
            IdlePolicy::Park => self.parker.park(self.park),
            IdlePolicy::Backoff => {
                self.idle_polls = self.idle_polls.saturating_add(1);
                if self.idle_polls <= self.spin_polls {
                    std::hint::spin_loop();
                } else if self.idle_polls - self.spin_polls <= self.yield_polls {
                    std::thread::yield_now();
                } else {
                    self.parker.park(self.next_park);
                    self.next_park = (self.next_park * 2).min(park_max);
                }
            }
        }
    }

    /// The last poll found nothing to do, and nobody waits for this thread's next work (a
    /// follower's entries only need applying): park at once, without the spins and yields of
    /// `backoff`, for the policy's park, doubling while idle up to [`UNHURRIED_PARK_MAX`] (or
    /// the policy's longest park, if longer). A thread configured to spin or yield pauses as
    /// usual.
    pub(crate) fn pause_unhurried(&mut self) {
        match self.policy {
            IdlePolicy::Spin | IdlePolicy::Yield => self.pause(),
            IdlePolicy::Park | IdlePolicy::Backoff => {
                self.parker.park(self.next_park);
                self.next_park = (self.next_park * 2).min(self.park_max.max(UNHURRIED_PARK_MAX));
            }
        }
    }

    /// Nothing is due for `quiet` (the caller knows when its next work is): a thread that may
    /// park parks that long (woken early by its parker); one configured to spin or yield
    /// pauses as usual.
    pub(crate) fn rest(&mut self, quiet: Duration) {
        match self.policy {
            IdlePolicy::Spin | IdlePolicy::Yield => self.pause(),
            IdlePolicy::Park | IdlePolicy::Backoff => {
                self.reset();
                self.parker.park(quiet);
            }
        }
    }

    /// Nothing is due until another thread wakes this one, which it does once `done` holds
    /// (see [`Parker::park_unless`]): a thread that may park parks up to `longest`; one
    /// configured to spin or yield pauses as usual.
    pub(crate) fn rest_unless(&mut self, longest: Duration, done: impl Fn() -> bool) {
        match self.policy {
            IdlePolicy::Spin | IdlePolicy::Yield => self.pause(),
            IdlePolicy::Park | IdlePolicy::Backoff => {
                self.reset();
                self.parker.park_unless(longest, done);
            }
        }
    }

    /// Pins the calling thread to its cpu and gives it its real-time priority, as far as the
    /// config asks for them (`auto` never fails: see [`crate::realtime`]).
    pub(crate) fn pin(config: &ThreadConfig) -> Result<(), PinError> {
        config.realtime_priority.apply(config.idle == IdlePolicy::Park)?;
        let Some(cpu) = config.cpu else { return Ok(()) };
        let mut set = rustix::thread::CpuSet::new();
        if cpu >= rustix::thread::CpuSet::MAX_CPU {
            return Err(PinError::OutOfRange(cpu));
        }
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).map_err(|source| PinError::Affinity { cpu, source })
    }
}

/// Runs the calling thread under `SCHED_BATCH` (`batch`) or `SCHED_OTHER`, and returns
/// whether it now runs under `SCHED_BATCH`. A batch thread's wake-ups do not preempt the
/// thread running on the core it wakes on.
pub(crate) fn schedule_as_batch(batch: bool) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if batch { libc::SCHED_BATCH } else { libc::SCHED_OTHER };
    // SAFETY: `param` is a valid `sched_param` that outlives the call; pid 0 names the calling
    // thread.
    let ok = unsafe { libc::sched_setscheduler(0, policy, &param) } == 0;
    batch == ok
}

/// Sets the calling thread's timer slack (how late the kernel may end a timed sleep, to batch
/// wake-ups; 50 µs by default) to 1 ns. A poll loop rests until its next heartbeat tick, and a
/// 100 µs heartbeat period would otherwise stretch by up to half: failure detection counts
/// periods.
fn precise_timers() {
    if let Err(error) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1)) {
        tracing::debug!(%error, "a poll loop keeps the default timer slack");
    }
}

/// Why a thread could not be pinned to its configured cpu or given its real-time priority.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PinError {
    #[error("cpu {0} is out of range")]
    OutOfRange(usize),
    #[error("pinning to cpu {cpu}: {source}")]
    Affinity { cpu: usize, source: rustix::io::Errno },
    #[error(transparent)]
    Realtime(#[from] RealtimeError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_unparks_a_parked_thread() {
        let config = ThreadConfig { idle: IdlePolicy::Park, park_us: 60_000_000, ..ThreadConfig::default() };
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let mut backoff = Backoff::new(&config);
            tx.send(backoff.parker()).expect("send parker");
            backoff.pause();
        });
        let parker = rx.recv().expect("parker");
        // Wake until the thread is gone: a wake before it parks is lost, so repeat; a broken
        // wake would leave the thread parked for a minute and this loop spinning meanwhile.
        while !handle.is_finished() {
            parker.wake();
            std::thread::yield_now();
        }
        handle.join().expect("parked thread");
    }

    /// How the replication thread rests while its cluster does: another thread clears the flag,
    /// then wakes it; whichever comes first of its check and its park, it does not sleep on
    /// (else this test parks an hour).
    #[test]
    fn a_resting_thread_ends_its_rest_when_another_clears_its_flag_and_wakes_it() {
        // A rest whose flag is already cleared does not park at all.
        Backoff::new(&ThreadConfig::default()).rest_unless(Duration::from_secs(3600), || true);
        let resting = Arc::new(AtomicBool::new(true));
        let (tx, rx) = std::sync::mpsc::channel();
        let rester = {
            let resting = Arc::clone(&resting);
            std::thread::spawn(move || {
                let mut backoff = Backoff::new(&ThreadConfig::default());
                tx.send(backoff.parker()).expect("the test waits");
                while resting.load(Ordering::SeqCst) {
                    backoff.rest_unless(Duration::from_secs(3600), || !resting.load(Ordering::SeqCst));
                }
            })
        };
        let parker = rx.recv().expect("the rester started");
        resting.store(false, Ordering::SeqCst);
        parker.wake();
        rester.join().expect("the rester ended its rest");
    }

    #[test]
    fn a_thread_checks_whether_it_is_done_after_it_counts_as_parked() {
        let parker = Parker::current();
        // The check must come after the flag a waker reads (else a wake-up between the two
        // is lost), and a thread that is done does not park (else this test sleeps an hour).
        parker.park_unless(Duration::from_secs(3600), || parker.parked.load(Ordering::SeqCst));
        assert!(!parker.parked.load(Ordering::SeqCst), "counts as running again");
    }

    #[test]
    fn an_unhurried_thread_parks_at_once_and_longer_while_idle_and_starts_over_after_work() {
        let config = ThreadConfig { park_us: 50, park_max_us: 1000, ..ThreadConfig::default() };
        let mut backoff = Backoff::new(&config);
        backoff.pause_unhurried();
        assert_eq!((backoff.idle_polls, backoff.next_park), (0, Duration::from_micros(100)), "no spin, parked");
        // 100 µs doubles past 10 ms within 7 parks; 9 more must leave it at the bound (a cap
        // at park_max_us would stop at 1 ms, no cap would pass 10 ms).
        (0..9).for_each(|_| backoff.pause_unhurried());
        assert_eq!(backoff.next_park, UNHURRIED_PARK_MAX, "past park_max_us, up to its own bound");
        backoff.reset();
        assert_eq!(backoff.next_park, Duration::from_micros(50));
    }

    #[test]
    fn an_idle_leader_spins_and_yields_first_then_parks_longer_than_park_max() {
        let config = ThreadConfig {
            idle: IdlePolicy::Backoff,
            spin_polls: 2,
            yield_polls: 1,
            park_us: 50,
            park_max_us: 1000,
            ..ThreadConfig::default()
        };
        let mut backoff = Backoff::new(&config);
        (0..3).for_each(|_| backoff.pause_idle());
        assert_eq!(backoff.next_park, Duration::from_micros(50), "spins and yields first, no park yet");
        // 50 µs doubles past 10 ms within 8 parks; 9 leave it at the bound (a cap at
        // park_max_us would stop at 1 ms, no cap would pass 10 ms).
        (0..9).for_each(|_| backoff.pause_idle());
        assert_eq!(backoff.next_park, UNHURRIED_PARK_MAX, "past park_max_us, up to the idle bound");
        backoff.reset();
        (0..12).for_each(|_| backoff.pause());
        assert_eq!(backoff.next_park, Duration::from_micros(1000), "a busy thread's parks stop at park_max_us");
    }

    #[test]
    fn a_poll_loops_thread_rests_with_precise_timers() {
        let slack = std::thread::spawn(|| {
            let _backoff = Backoff::new(&ThreadConfig::default());
            rustix::thread::current_timer_slack().expect("timer slack")
        });
        assert_eq!(slack.join().expect("thread"), 1, "1 ns instead of the default 50 µs");
    }

    #[test]
    fn backoff_escalates_and_resets() {
        let config = ThreadConfig {
            idle: IdlePolicy::Backoff,
            spin_polls: 2,
            yield_polls: 1,
            park_us: 1,
            park_max_us: 5,
            cpu: None,
            realtime_priority: crate::realtime::Realtime::Off,
        };
        let mut b = Backoff::new(&config);
        for _ in 0..5 {
            b.pause();
        }
        assert_eq!(b.idle_polls, 5);
        // Two parks so far (polls 4 and 5): 1 us, then 2 us; the next is 4, then at most 5.
        assert_eq!(b.next_park, Duration::from_micros(4));
        b.pause();
        b.pause();
        assert_eq!(b.next_park, Duration::from_micros(5), "parks grow up to park_max_us");
        b.reset();
        assert_eq!(b.idle_polls, 0);
        assert_eq!(b.next_park, Duration::from_micros(1), "work found starts over");
    }

    /// A rest (the caller knows nothing is due for a while) is not an idle poll: the backoff
    /// starts over after it, so the poll after a heartbeat tick spins before it parks again.
    #[test]
    fn a_rest_starts_the_backoff_over() {
        let config = ThreadConfig {
            idle: IdlePolicy::Backoff,
            spin_polls: 0,
            yield_polls: 0,
            park_us: 1,
            park_max_us: 8,
            cpu: None,
            realtime_priority: crate::realtime::Realtime::Off,
        };
        let mut b = Backoff::new(&config);
        for _ in 0..4 {
            b.pause();
        }
        assert_eq!(b.next_park, Duration::from_micros(8));
        b.rest(Duration::from_micros(1));
        assert_eq!((b.idle_polls, b.next_park), (0, Duration::from_micros(1)));
    }
}
