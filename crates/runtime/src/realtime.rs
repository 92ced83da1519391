//! Real-time scheduling of the background thread (`node.background.realtime_priority`).
//!
//! Mu detects a failed leader when its heartbeat counter stops moving for a few periods. On a
//! machine with fewer cores than busy threads, a live replica's heartbeat thread can be kept off
//! the cpu for that long (by another replica's spinning thread, or by the kernel tearing down a
//! killed process), and its peers then take it for failed: false suspicions, duels and slow
//! fail-overs (docs/BENCHMARKS.md, "Where a kill's slow switches come from"). Under `SCHED_FIFO`
//! the thread preempts every normal thread when it wakes. It parks between heartbeats, so it
//! takes little cpu; corosync runs its heartbeat at real-time priority by default for the same
//! reason. Its price: each wake-up preempts whatever runs on its cpu, often a leader's
//! replication thread in the middle of a commit (a commit's p99.9 at 3 replicas measured 25-30
//! µs against 3-15 µs). `auto`, the background thread's default, therefore asks for it only when
//! failure detection is tight, under [`AUTO_BELOW_DETECTION`] of silence (the fast fail-over
//! profile: 300 µs), where a normal thread's wait for a cpu looks like a failure; it runs at
//! normal priority, with a warning, where the process may not have it.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The priority `auto` asks for: the lowest real-time one, above every normal thread and below
/// any real-time thread an operator runs.
pub const AUTO_PRIORITY: u8 = 1;

/// `auto` gives real-time priority only to a node that declares a peer failed after less
/// silence than this: a few of the scheduler's time slices on a busy machine. The node's
/// default detection (14 ms) is above it, the fast fail-over profile's (300 µs) below.
pub const AUTO_BELOW_DETECTION: Duration = Duration::from_millis(5);

/// Whether a thread runs under the real-time policy `SCHED_FIFO`. Written in a config as `"off"`,
/// `"auto"` or a priority (1-99).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Realtime {
    /// Normal priority (`SCHED_OTHER`).
    #[default]
    Off,
    /// `SCHED_FIFO` at priority 1 where the process may (root, `CAP_SYS_NICE` or an
    /// `RLIMIT_RTPRIO`), else normal priority and a warning; only for a thread that parks, on a
    /// node whose failure detection is tight ([`Realtime::for_detection`]).
    Auto,
    /// `SCHED_FIFO` at this priority (1-99), or the node refuses to start and says why.
    Priority(u8),
}

/// Why a thread did not get the real-time priority it was configured with.
#[derive(Debug, thiserror::Error)]
#[error(
    "real-time priority {priority} (SCHED_FIFO): {source}; it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least {priority} (ulimit -r)"
)]
pub struct RealtimeError {
    /// The priority asked for.
    pub priority: u8,
    /// What the kernel said.
    #[source]
    pub source: std::io::Error,
}

impl Realtime {
    /// This setting on a node that declares a peer failed after `detection` of silence: `auto`
    /// becomes `off` unless that is under [`AUTO_BELOW_DETECTION`].
    pub fn for_detection(self, detection: Duration) -> Realtime {
        match self {
            Realtime::Auto if detection >= AUTO_BELOW_DETECTION => Realtime::Off,
            r => r,
        }
    }

    /// Applies this setting to the calling thread, which parks when idle (`parks`; `auto` leaves
    /// a thread that spins or yields at normal priority). `auto` without the permission logs a
    /// warning and succeeds; a fixed priority without it is an error.
    pub(crate) fn apply(self, parks: bool) -> Result<(), RealtimeError> {
        match self {
            Realtime::Off => Ok(()),
            Realtime::Auto if !parks => Ok(()),
            Realtime::Auto => {
                if let Err(e) = set_fifo(AUTO_PRIORITY) {
                    tracing::warn!(
                        "the background thread runs at normal priority: {e}. Heartbeats may then miss their \
                         time when busy threads outnumber cores, and fail-overs take longer \
                         (node.background.realtime_priority = \"off\" silences this)"
                    );
                }
                Ok(())
            }
            Realtime::Priority(p) => set_fifo(p),
        }
    }
}

/// Whether this process may run a thread under `SCHED_FIFO` at `priority`: tried on a thread
/// that ends at once.
pub fn permitted(priority: u8) -> Result<(), RealtimeError> {
    std::thread::spawn(move || set_fifo(priority)).join().unwrap_or(Ok(()))
}

/// Puts the calling thread under `SCHED_FIFO` at `priority`; threads it creates and processes it
/// forks start at normal priority (`SCHED_RESET_ON_FORK`).
fn set_fifo(priority: u8) -> Result<(), RealtimeError> {
    let param = libc::sched_param { sched_priority: i32::from(priority) };
    // SAFETY: `param` is a valid `sched_param` that outlives the call; pid 0 names the calling
    // thread (Linux schedules threads, not processes).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) } != 0 {
        return Err(RealtimeError { priority, source: std::io::Error::last_os_error() });
    }
    Ok(())
}

impl fmt::Display for Realtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Realtime::Off => f.write_str("off"),
            Realtime::Auto => f.write_str("auto"),
            Realtime::Priority(p) => write!(f, "{p}"),
        }
    }
}

impl std::str::FromStr for Realtime {
    type Err = String;

    /// `off`, `auto` or a priority; the range (1-99) is checked by the config's validation.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Realtime::Off),
            "auto" => Ok(Realtime::Auto),
            n => n.parse().map(Realtime::Priority).map_err(|_| format!("{s:?} is not \"off\", \"auto\" or 1-99")),
        }
    }
}

impl Serialize for Realtime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Realtime::Priority(p) => s.serialize_u8(*p),
            word => s.serialize_str(&word.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Realtime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Setting;
        impl Visitor<'_> for Setting {
            type Value = Realtime;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"off\", \"auto\" or a priority 1-99")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Realtime, E> {
                u8::try_from(v).map(Realtime::Priority).map_err(|_| E::custom(format!("{v} is not in 1..=99")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Realtime, E> {
                u8::try_from(v).map(Realtime::Priority).map_err(|_| E::custom(format!("{v} is not in 1..=99")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Realtime, E> {
                match v {
                    "off" | "auto" => v.parse().map_err(E::custom),
                    _ => Err(E::custom(format!("{v:?} is not \"off\", \"auto\" or a priority 1-99"))),
                }
            }
        }
        d.deserialize_any(Setting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_written_and_read_back_as_a_word_or_a_number() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct T {
            r: Realtime,
        }
        for r in [Realtime::Off, Realtime::Auto, Realtime::Priority(7)] {
            let text = toml::to_string(&T { r }).expect("render");
            assert_eq!(toml::from_str::<T>(&text).expect("parse"), T { r }, "{text}");
            assert_eq!(r.to_string().parse::<Realtime>(), Ok(r));
        }
        assert_eq!(toml::to_string(&T { r: Realtime::Auto }).expect("render").trim(), "r = \"auto\"");
        for bad in ["r = \"fast\"", "r = 300", "r = -1", "r = 1.5"] {
            assert!(toml::from_str::<T>(bad).is_err(), "{bad}");
        }
        assert!("fast".parse::<Realtime>().expect_err("not a setting").contains("\"fast\""));
    }

    /// Runs `setting` on a fresh thread that parks (or not) and returns the policy it ended with.
    fn policy_after(setting: Realtime, parks: bool) -> Result<i32, RealtimeError> {
        std::thread::spawn(move || {
            // SAFETY: querying the calling thread's policy has no preconditions.
            setting.apply(parks).map(|()| unsafe { libc::sched_getscheduler(0) })
        })
        .join()
        .expect("thread")
    }

    #[test]
    fn auto_runs_a_parking_thread_under_sched_fifo_where_permitted_and_never_fails() {
        let fifo = libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK;
        let expected = if permitted(AUTO_PRIORITY).is_ok() { fifo } else { libc::SCHED_OTHER };
        assert_eq!(policy_after(Realtime::Auto, true).expect("auto never fails"), expected);
        assert_eq!(policy_after(Realtime::Auto, false).expect("auto"), libc::SCHED_OTHER, "a thread that spins");
        assert_eq!(policy_after(Realtime::Off, true).expect("off"), libc::SCHED_OTHER);
        match policy_after(Realtime::Priority(2), true) {
            Ok(policy) => assert_eq!(policy, fifo),
            Err(e) => {
                // An unprivileged run: the refusal names what to grant.
                assert_eq!(e.priority, 2);
                assert!(e.to_string().contains("CAP_SYS_NICE"), "{e}");
            }
        }
    }

    #[test]
    fn auto_is_real_time_only_where_failure_detection_is_tight() {
        let tight = AUTO_BELOW_DETECTION - Duration::from_micros(1);
        assert_eq!(Realtime::Auto.for_detection(tight), Realtime::Auto);
        assert_eq!(Realtime::Auto.for_detection(AUTO_BELOW_DETECTION), Realtime::Off);
        for r in [Realtime::Off, Realtime::Priority(3)] {
            assert_eq!(r.for_detection(AUTO_BELOW_DETECTION), r, "only auto depends on detection");
            assert_eq!(r.for_detection(tight), r);
        }
    }

    #[test]
    fn a_thread_started_by_a_real_time_thread_runs_at_normal_priority() {
        let child = std::thread::spawn(|| {
            Realtime::Auto.apply(true).expect("auto");
            // SAFETY: querying the calling thread's policy has no preconditions.
            std::thread::spawn(|| unsafe { libc::sched_getscheduler(0) }).join().expect("child")
        });
        assert_eq!(child.join().expect("thread"), libc::SCHED_OTHER);
    }
}
