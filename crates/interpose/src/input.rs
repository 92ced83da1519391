//! The input window and the values a copy sees inside it (docs/WRAP.md, "Time and
//! randomness"): from the moment a read hands the server bytes of one log entry until the
//! reading thread next waits for readiness, that thread's wall clock reads the entry's input
//! time (the leader's choice, logged with it; moved on by whatever the thread sleeps meanwhile,
//! and by each whole 10 ms of CPU time it spends), and randomness is drawn from the cluster's seed
//! at a position named by that time. So every copy, processing the same input, reads the same
//! time and draws the same bytes. Outside a window the clock is the machine's own, and
//! randomness comes from the seed's background stream (the same on every copy as long as they
//! draw alike, as at start-up).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use microrep_interpose_wire::input_time;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::{real, state};

/// The thread inside a window (`pthread_self`), and the window's time (0: none).
static THREAD: AtomicUsize = AtomicUsize::new(0);
static TIME_NS: AtomicU64 = AtomicU64::new(0);
/// Random bytes drawn in the current window, and outside windows (each rounded up to 4).
static DRAWN_IN_WINDOW: AtomicU64 = AtomicU64::new(0);
static DRAWN_OUTSIDE: AtomicU64 = AtomicU64::new(0);
/// The input-time record last found for replayed bytes (where the next search starts).
static REPLAY_RECORD: AtomicU64 = AtomicU64::new(0);

fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions; it reads the calling thread's pointer.
    unsafe { libc::pthread_self() as usize }
}

/// The CPU time the window's thread had used when the window opened, and the monotonic clock
/// then.
static CPU_AT_BEGIN: AtomicU64 = AtomicU64::new(0);
static MONOTONIC_AT_BEGIN: AtomicU64 = AtomicU64::new(0);
/// The window's clock moves on in steps of this much of the thread's CPU time.
const CPU_STEP_NS: u64 = 10_000_000;

/// The calling thread's CPU time (its own clock: a preempted thread's does not move). A
/// system call, unlike the monotonic clock's vDSO read.
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; the next definition, not the shim's own hook.
    if unsafe { real::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// Opens a window at `time_ns` on the calling thread (0 opens none).
pub(crate) fn begin(time_ns: u64) {
    if time_ns == 0 {
        return;
    }
    TIME_NS.store(0, Ordering::Relaxed);
    THREAD.store(this_thread(), Ordering::Relaxed);
    DRAWN_IN_WINDOW.store(0, Ordering::Relaxed);
    CPU_AT_BEGIN.store(thread_cpu_ns(), Ordering::Relaxed);
    MONOTONIC_AT_BEGIN.store(clock_ns(libc::CLOCK_MONOTONIC), Ordering::Relaxed);
    TIME_NS.store(time_ns, Ordering::Release);
}

/// The calling thread waits for readiness: its window, if it has one, ends.
pub(crate) fn end_on_this_thread() {
    if TIME_NS.load(Ordering::Relaxed) != 0 && THREAD.load(Ordering::Relaxed) == this_thread() {
        TIME_NS.store(0, Ordering::Release);
    }
}

/// Ends any window: a forked child (a Redis BGSAVE) keeps the forking thread's identity.
pub(crate) extern "C" fn end_in_child() {
    TIME_NS.store(0, Ordering::Release);
}

/// The calling thread slept `ns` (a `nanosleep` of the server's, `DEBUG SLEEP`): its window's
/// time moves on by as much, the same on every copy (they all sleep as long), so that what the
/// server does after the sleep sees the time pass (a key that expired meanwhile).
pub(crate) fn slept(ns: u64) {
    if let Some(time) = window_ns() {
        TIME_NS.store(time.saturating_add(ns), Ordering::Release);
    }
}

/// The input time of the calling thread's window, if it is in one, with what it slept and
/// whole steps of the CPU time it used since (so that work lasting tens of milliseconds, such as
/// freeing a million-element set, sees time pass, while a command's usual microseconds never
/// move the clock: the same reading on every copy).
pub(crate) fn now_ns() -> Option<u64> {
    let time = window_ns()?;
    // A thread's CPU time grows no faster than the monotonic clock: until a step of it passed
    // since the window opened, no step of CPU time can have, and the CPU clock's system call
    // (several per command of a server that reads the time often) is not needed.
    if clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(MONOTONIC_AT_BEGIN.load(Ordering::Relaxed)) < CPU_STEP_NS {
        return Some(time);
    }
    let used = thread_cpu_ns().saturating_sub(CPU_AT_BEGIN.load(Ordering::Relaxed));
    Some(time.saturating_add(used / CPU_STEP_NS * CPU_STEP_NS))
}

/// The window's input time plus what its thread slept, if the calling thread is in one.
fn window_ns() -> Option<u64> {
    let time = TIME_NS.load(Ordering::Acquire);
    (time != 0 && THREAD.load(Ordering::Relaxed) == this_thread()).then_some(time)
}

/// Before a read of at most `count` replayed bytes: how many to read so that the read stays
/// inside one entry, and that entry's input time (none if the agent published no record).
pub(crate) fn replay_read_len(count: usize) -> (usize, u64) {
    let (Some(page), Some(read)) = (state::control_page(), state::replay_read()) else { return (count, 0) };
    match input_time::find(page, REPLAY_RECORD.load(Ordering::Relaxed), read) {
        Some((record, t)) => {
            REPLAY_RECORD.store(record, Ordering::Relaxed);
            let left = usize::try_from(t.end - read).unwrap_or(usize::MAX);
            (count.min(left), t.time_ns)
        }
        None => (count, 0),
    }
}

/// Fills `buf` from the cluster's seed: in a window, at the window's position of the stream
/// named by its time; outside, in the background stream. False without a seed (the caller
/// draws from the kernel).
pub(crate) fn draw(buf: &mut [u8]) -> bool {
    let Some(seed) = state::seed() else { return false };
    let rounded = (buf.len() as u64).next_multiple_of(4);
    let (stream, at) = match window_ns() {
        Some(time) => (time, DRAWN_IN_WINDOW.fetch_add(rounded, Ordering::Relaxed)),
        None => (0, DRAWN_OUTSIDE.fetch_add(rounded, Ordering::Relaxed)),
    };
    let mut rng = ChaCha20Rng::from_seed(*seed);
    rng.set_stream(stream);
    rng.set_word_pos(u128::from(at / 4));
    rng.fill_bytes(buf);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window is process-wide: one test at a time.
    static ONE_WINDOW: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn ten_milliseconds_of_work_move_the_window_on() {
        let _one = ONE_WINDOW.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::thread::spawn(|| {
            begin(1_000);
            assert_eq!(now_ns(), Some(1_000), "a few microseconds of work: the same time");
            let start = thread_cpu_ns();
            let mut spin = 0u64;
            while thread_cpu_ns() - start < 2 * CPU_STEP_NS {
                spin = std::hint::black_box(spin + 1);
            }
            assert!(now_ns().is_some_and(|t| t >= 1_000 + 2 * CPU_STEP_NS), "{:?}", now_ns());
            end_on_this_thread();
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn a_window_belongs_to_its_thread_and_ends_at_its_wait() {
        let _one = ONE_WINDOW.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        begin(1_000);
        assert_eq!(now_ns(), Some(1_000));
        let other = std::thread::spawn(now_ns).join().expect("thread");
        assert_eq!(other, None, "another thread reads its own clock");
        std::thread::spawn(end_on_this_thread).join().expect("thread");
        assert_eq!(now_ns(), Some(1_000), "another thread's wait ends nothing");
        slept(500);
        assert_eq!(now_ns(), Some(1_500), "a sleep moves the window's time on");
        end_on_this_thread();
        assert_eq!(now_ns(), None);
        slept(500);
        assert_eq!(now_ns(), None, "a sleep outside a window opens none");
        begin(0);
        assert_eq!(now_ns(), None, "no time, no window");
    }
}
