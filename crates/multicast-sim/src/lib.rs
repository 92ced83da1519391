//! Deterministic simulation of atomic multicast groups (`microrep_core::multicast`).
//!
//! A run ([`run()`]) draws a group from its seed (2 to 5 members, 1 to 3 overlapping subgroups,
//! senders and non-senders, ring windows of 1 to 8 slots, payloads up to 64 bytes), puts the
//! members on one seeded [`microrep_fabric::sim::SimWorld`] and drives them with a seeded
//! scheduler while the fabric delays, fails and tears writes, members are paused (their
//! writes held) and some senders are slow (polled rarely). Checkers run after every poll
//! ([`check`]): agreement on one total order per subgroup, no duplicates, validity (only sent
//! messages, byte for byte, each by its sender), and stability (a member delivers a message
//! only once every member of the subgroup has received it). After the fault phase a liveness
//! phase requires every member to deliver every sent message, and the group then to go
//! quiet. The same seed replays the same run bit for bit.

pub mod check;
mod joiners;
pub mod run;
mod schedule;
mod sim;

pub use run::{Failure, Options, Report, rings_pulled, run};
