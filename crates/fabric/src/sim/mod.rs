//! A deterministic, seeded, single-threaded simulation of the fabric, with fault injection.
//!
//! A [`SimWorld`] holds every node's memory and every endpoint's queue. Operations progress only
//! when the world is stepped, in (simulated time, creation order), and each random choice
//! (latencies, delays, transport failures, how a write is torn) comes from one seeded ChaCha8
//! generator: the same seed and the same calls give the same run, which is what lets a failing
//! cluster simulation be replayed exactly.
//!
//! How the simulator keeps the fabric contract (see the crate docs and `docs/ARCHITECTURE.md`):
//! * **FIFO**: an endpoint's next operation reaches its target only after the previous one has
//!   finished applying, and completions are delivered in post order. Endpoints interleave freely.
//! * **Permissions at the target**: a write is checked when its first byte lands, like an RDMA
//!   NIC does, so a write posted before a revocation but arriving after it fails with
//!   [`crate::OpError::PermissionDenied`]. A torn write already partly applied when a revocation
//!   happens is finished before the revocation returns.
//! * **Torn writes**: with [`SimConfig::torn_write_prob`] a write lands in 2..=4 pieces in random
//!   order at distinct times; READs and local reads in between see it partly applied.
//! * **Failures**: injected transport errors, crashes (operations to a crashed node time out after
//!   [`SimConfig::peer_timeout_ns`]), paused senders ([`SimWorld::hold_outgoing`]).

mod calls;
mod config;
mod digest;
mod engine;
mod fabric;
mod harness;
mod state;
mod world;

#[cfg(test)]
mod tests;

pub use calls::QUEUE_DEPTH;
pub use config::{SimConfig, SimConfigError};
pub use fabric::{SimEndpoint, SimFabric};
pub use harness::SimHarness;
pub use world::SimWorld;
