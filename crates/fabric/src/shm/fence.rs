//! The store-load fence of the permission handshake (`PermSlot`), made asymmetric when the
//! kernel allows it.
//!
//! Dekker's protocol needs a full fence between the writer's store of `in_flight` and its load
//! of `granted`, and another between the revoker's store and load. Writes happen millions of
//! times per second, revocations once per leader change, so the writer's fence is moved to the
//! revoker: with `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` the kernel makes every running
//! thread of every registered process execute a full barrier (and a thread not running passes
//! one when it is scheduled), so the writer needs only a compiler fence. This is the
//! asymmetric fence of liburcu and folly. Where the kernel lacks it (old kernels, seccomp
//! filters) both sides use sequentially consistent operations.
//!
//! A segment records its owner's mode; a writer uses the light fence only towards targets that
//! will issue the heavy one, so mixed modes stay correct.

use std::sync::OnceLock;

use rustix::thread::{MembarrierCommand, membarrier, membarrier_query};

/// How this process orders the permission handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FenceMode {
    /// Both sides use SeqCst operations.
    Symmetric = 0,
    /// Writers use a compiler fence; revokers issue `membarrier`.
    Asymmetric = 1,
}

impl FenceMode {
    pub(crate) fn from_code(code: u32) -> Self {
        if code == Self::Asymmetric as u32 { Self::Asymmetric } else { Self::Symmetric }
    }
}

/// This process's mode: registers for global expedited membarriers on first use.
pub(crate) fn process_mode() -> FenceMode {
    static MODE: OnceLock<FenceMode> = OnceLock::new();
    *MODE.get_or_init(|| {
        let supported = membarrier_query();
        let usable = supported.contains_command(MembarrierCommand::GlobalExpedited)
            && supported.contains_command(MembarrierCommand::RegisterGlobalExpedited)
            && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
            && membarrier(MembarrierCommand::GlobalExpedited).is_ok();
        if usable { FenceMode::Asymmetric } else { FenceMode::Symmetric }
    })
}

/// The revoker's side, for a node in `mode`: a full barrier on every registered process's
/// running threads.
pub(crate) fn heavy_barrier(mode: FenceMode) -> std::io::Result<()> {
    match mode {
        FenceMode::Asymmetric => membarrier(MembarrierCommand::GlobalExpedited).map_err(Into::into),
        FenceMode::Symmetric => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_is_stable_and_the_heavy_barrier_works_in_it() {
        let mode = process_mode();
        assert_eq!(process_mode(), mode, "the mode is decided once per process");
        heavy_barrier(mode).expect("the barrier of the chosen mode must be usable");
        heavy_barrier(FenceMode::Symmetric).expect("the symmetric mode needs no system call");
        assert_eq!(FenceMode::from_code(mode as u32), mode);
        assert_eq!(FenceMode::from_code(7), FenceMode::Symmetric, "unknown codes fall back to the safe mode");
    }
}
