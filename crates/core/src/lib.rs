//! microrep's protocol cores: sans-IO state machines driven by `poll(now, ..)` calls, generic
//! over the one-sided [`microrep_fabric::Fabric`]. They never touch threads, clocks, sockets or
//! randomness: time comes in as an argument, so the simulator drives the very same code as the
//! runtime.
//!
//! * [`mu`]: Mu state machine replication (OSDI'20).
//! * [`multicast`]: atomic multicast over a shared state table (Derecho + Spindle).

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod mu;
pub mod multicast;
