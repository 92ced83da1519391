//! `libmicrorep_interpose.so`: loaded with `LD_PRELOAD` into an unmodified server by
//! `microrep wrap`, it makes the server on the leader see only input that Mu committed, and
//! lets a follower's copy see only its local replay agent. See docs/WRAP.md.
//!
//! It acts on connections accepted from a listening TCP socket, in the process the wrap node
//! started (named by the `MICROREP_WRAP_DIR` variable at load time, then removed from its
//! environment; a forked child, such as a Redis BGSAVE, has another pid and proposes nothing).
//! While the server processes one log entry's input it reads that entry's time and draws
//! randomness from the cluster's seed (`input`, docs/WRAP.md "Time and randomness").
//! Hooks never allocate, print or panic: state lives in fixed tables, the next definitions of
//! the interposed functions are looked up once, and the shim's own I/O uses raw system calls.

mod channel;
mod classify;
// Exported by symbol name (`no_mangle`) to the dynamic linker, not by Rust path.
#[allow(unreachable_pub)]
#[cfg(not(test))]
mod hooks;
#[allow(unreachable_pub)]
#[cfg(not(test))]
mod hooks_time_random;
#[cfg_attr(test, allow(dead_code))]
mod input;
// Unit tests build without the hooks (they would stand in front of the test binary's own
// libc calls), so some of what only the hooks call is unused there.
#[cfg_attr(test, allow(dead_code))]
mod intercept;
#[cfg_attr(test, allow(dead_code))]
mod real;
#[cfg_attr(test, allow(dead_code))]
mod state;

/// The library constructor: activates the shim if this is the wrapped process, and looks up
/// the interposed functions before the program runs.
extern "C" fn init() {
    if let Err(why) = state::activate_from_env() {
        // The constructor runs before main, outside any hook: printing is safe here.
        #[allow(clippy::print_stderr)]
        {
            match why {
                state::ActivateError::Seed => eprintln!("microrep-interpose: {why}"),
                _ => eprintln!("microrep-interpose: not active: {why}"),
            }
        }
    }
    real::resolve_all();
    real::resolve_fopen();
    // SAFETY: registers a handler that only stores to an atomic, in the constructor.
    unsafe { libc::pthread_atfork(None, None, Some(input::end_in_child)) };
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
