//! The test kit: what `microrep` (cluster up, status, every benchmark) and `microrep-faults`
//! share to launch clusters and talk to them, so that each concern is written once.
//!
//! * [`procs`]: a table of child processes started, killed, paused, resumed and restarted by
//!   index, always reaped; [`child::Guarded`] for a single child. Both register their pids in a
//!   [`cleanup::PidRegistry`], so a [`cleanup::Cleanup`] guard, a watchdog or the signal handler
//!   of [`cleanup::clean_up_on_signals`] can kill them all.
//! * [`scratch::ScratchDir`]: a directory removed when dropped (and on SIGINT/SIGTERM/SIGHUP),
//!   so a panic leaves no `/dev/shm` segments behind.
//! * [`cluster`]: a typed cluster description whose node configuration files are written
//!   through [`microrep::Config`], never formatted by hand.
//! * [`hist`]: the one latency histogram constructor.
//! * [`client`], [`session`], [`reply`]: the RESP client, its redirect rule set and the typed
//!   error replies (they live in `microrep-kv` because its server produces those replies).

pub mod child;
pub mod cleanup;
pub mod cluster;
pub mod hist;
pub mod procs;
pub mod scratch;

pub use microrep_kv::{client, reply, session};

/// Why the kit could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// A program could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file or directory could not be created, written or read.
    #[error("{path}: {source}")]
    File {
        /// Which.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Process `0` of a table is not running (it cannot be signalled).
    #[error("process {0} is not running")]
    NotRunning(usize),
    /// Process `0` of a table is running already (it cannot be started).
    #[error("process {0} is already running")]
    AlreadyRunning(usize),
    /// A signal could not be delivered.
    #[error("signalling process {index}: {source}")]
    Signal {
        /// The process's index.
        index: usize,
        /// Why.
        source: rustix::io::Errno,
    },
    /// The signal handler could not be installed.
    #[error("installing the signal handler: {0}")]
    Handler(#[from] ctrlc::Error),
}

impl KitError {
    fn file(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::File { path: path.to_path_buf(), source }
    }
}
