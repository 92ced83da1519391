//! Deterministic simulation of whole microrep clusters.
//!
//! A run ([`run::run`]) puts N Mu replicas on one seeded [`microrep_fabric::sim::SimWorld`],
//! drives them and a few clients with a seeded scheduler while a nemesis crashes and pauses
//! replicas (optionally restarting crashed ones with empty memory) and the fabric delays,
//! fails and tears operations; checkers run after every step (agreement, validity, no holes,
//! no duplicate commits) and at the end (linearizability of the client history, liveness once
//! faults stop, convergence). The same seed replays the same run bit for bit.

pub mod app;
pub mod check;
pub mod nemesis;
pub mod options;
pub mod run;

pub use options::{DEFAULT_FAULT_PHASE_NS, DEFAULT_MAX_FAULTS, SimOptions};
pub use run::{Failure, RunReport, run};
