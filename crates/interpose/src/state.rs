//! The shim's process-wide state, all fixed-size and allocation-free after start-up: whether
//! this process is the wrapped server, what each file descriptor is, and the control page
//! shared with the wrap node.

use core::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use microrep_interpose_wire::{
    CONTROL_BYTES, CONTROL_GATE, CONTROL_GATED_CALLS, CONTROL_NAME, CONTROL_REPLAY_READ, CONTROL_REPLAY_SETTLED,
    OutputDigest,
};

/// File descriptors at or above this are never tracked (their connections are refused).
pub(crate) const MAX_FDS: usize = 1 << 16;
/// Longest wrap directory path accepted (the socket path must fit `sun_path`).
pub(crate) const MAX_PATH: usize = 96;

/// What a tracked descriptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fd {
    /// Not a connection the shim acts on.
    Other,
    /// A client connection of the leader: its input is committed before the server sees it.
    Client { conn: u64, broken: bool },
    /// A connection of the local replay agent: passed through, its reads counted.
    Replay,
    /// `/dev/urandom` or `/dev/random`: reads are drawn from the cluster's seed
    /// (`input::draw`).
    Random,
}

const CLIENT: u64 = 1 << 63;
const REPLAY: u64 = 1 << 62;
const BROKEN: u64 = 1 << 61;
const RANDOM: u64 = 1 << 60;
const CONN_MASK: u64 = RANDOM - 1;

impl Fd {
    fn encode(self) -> u64 {
        match self {
            Self::Other => 0,
            Self::Client { conn, broken } => CLIENT | (conn & CONN_MASK) | if broken { BROKEN } else { 0 },
            Self::Replay => REPLAY,
            Self::Random => RANDOM,
        }
    }

    fn decode(word: u64) -> Self {
        if word & CLIENT != 0 {
            Self::Client { conn: word & CONN_MASK, broken: word & BROKEN != 0 }
        } else if word & REPLAY != 0 {
            Self::Replay
        } else if word & RANDOM != 0 {
            Self::Random
        } else {
            Self::Other
        }
    }
}

static TABLE: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
/// Each client descriptor's output digest (`OutputDigest::pack`), for output checking.
static OUTPUT: [[AtomicU64; 2]; MAX_FDS] = [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_FDS];
/// The pid that activated the shim; 0 while inactive.
static ACTIVE_PID: AtomicI32 = AtomicI32::new(0);
/// The wrap node's socket path, NUL-terminated.
static SOCKET_PATH: OnceLock<[u8; MAX_PATH + 16]> = OnceLock::new();
static CONTROL: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
/// The cluster's random seed (`ENV_SEED`), if the wrap node gave one.
static SEED: OnceLock<[u8; 32]> = OnceLock::new();
/// The thread (`pthread_self`) that last read replayed input: memcached accepts on one thread
/// and reads on another, and only the reader's waits say that the input was processed.
static READER: AtomicUsize = AtomicUsize::new(0);

fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions; it reads the calling thread's pointer.
    unsafe { libc::pthread_self() as usize }
}

/// Whether the calling process is the one the wrap node started (not a fork of it, not a
/// program it ran).
pub(crate) fn active() -> bool {
    let pid = ACTIVE_PID.load(Ordering::Relaxed);
    pid != 0 && pid == rustix::process::getpid().as_raw_nonzero().get()
}

/// What `fd` is (always [`Fd::Other`] outside the active process).
pub(crate) fn lookup(fd: c_int) -> Fd {
    let word = usize::try_from(fd).ok().and_then(|i| TABLE.get(i)).map_or(0, |w| w.load(Ordering::Acquire));
    if word == 0 || !active() { Fd::Other } else { Fd::decode(word) }
}

/// Records what `fd` is; false if `fd` is out of the table's range.
pub(crate) fn set(fd: c_int, what: Fd) -> bool {
    match usize::try_from(fd).ok().and_then(|i| TABLE.get(i)) {
        Some(slot) => {
            slot.store(what.encode(), Ordering::Release);
            true
        }
        None => false,
    }
}

/// The output digest of descriptor `fd` (fresh for one never written or out of range).
pub(crate) fn output_digest(fd: c_int) -> OutputDigest {
    let words = usize::try_from(fd).ok().and_then(|i| OUTPUT.get(i));
    OutputDigest::unpack(words.map_or([0, 0], |w| [w[0].load(Ordering::Relaxed), w[1].load(Ordering::Relaxed)]))
}

/// Records the output digest of descriptor `fd` (`None`: a fresh one, for a new connection).
pub(crate) fn set_output_digest(fd: c_int, digest: Option<OutputDigest>) {
    if let Some(words) = usize::try_from(fd).ok().and_then(|i| OUTPUT.get(i)) {
        let packed = digest.map_or([0, 0], |d| d.pack());
        words[0].store(packed[0], Ordering::Relaxed);
        words[1].store(packed[1], Ordering::Relaxed);
    }
}

/// Forgets `fd`, returning what it was.
pub(crate) fn take(fd: c_int) -> Fd {
    let word = usize::try_from(fd).ok().and_then(|i| TABLE.get(i)).map_or(0, |w| w.swap(0, Ordering::AcqRel));
    Fd::decode(word)
}

/// The wrap node's socket path, once activated.
pub(crate) fn socket_path() -> Option<&'static [u8]> {
    let path = SOCKET_PATH.get()?;
    let end = path.iter().position(|&b| b == 0)?;
    path.get(..end)
}

fn control_word(index: usize) -> Option<&'static AtomicU64> {
    let base = CONTROL.load(Ordering::Acquire);
    if base.is_null() || index >= CONTROL_BYTES / 8 {
        return None;
    }
    // SAFETY: `base` maps CONTROL_BYTES for the life of the process (never unmapped), is
    // page-aligned, and index is in range; the wrap node only uses the words atomically.
    Some(unsafe { &*base.add(index) })
}

/// The whole control page, as words (none before activation).
pub(crate) fn control_page() -> Option<&'static [AtomicU64]> {
    let base = CONTROL.load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: as in `control_word`: the mapping holds CONTROL_BYTES / 8 aligned words for the
    // life of the process, only ever used atomically.
    Some(unsafe { core::slice::from_raw_parts(base, CONTROL_BYTES / 8) })
}

/// Bytes the server read on replay-agent connections so far.
pub(crate) fn replay_read() -> Option<u64> {
    Some(control_word(CONTROL_REPLAY_READ)?.load(Ordering::Acquire))
}

/// The cluster's random seed, in the active process only.
pub(crate) fn seed() -> Option<&'static [u8; 32]> {
    SEED.get().filter(|_| active())
}

/// Counts `n` bytes the server read on a replay-agent connection, and records the calling
/// thread as the one that reads replayed input.
pub(crate) fn count_replay_read(n: isize) {
    if let (Ok(n), Some(word)) = (u64::try_from(n), control_word(CONTROL_REPLAY_READ)) {
        READER.store(this_thread(), Ordering::Relaxed);
        word.fetch_add(n, Ordering::AcqRel);
    }
}

/// If the calling thread reads replayed input and has not been seen idle since it last read:
/// the replayed bytes read so far, for [`settle`] once a wait of this thread finds nothing
/// ready.
pub(crate) fn unsettled() -> Option<u64> {
    if READER.load(Ordering::Relaxed) != this_thread() || !active() {
        return None;
    }
    let read = control_word(CONTROL_REPLAY_READ)?.load(Ordering::Acquire);
    let settled = control_word(CONTROL_REPLAY_SETTLED)?.load(Ordering::Acquire);
    (settled < read).then_some(read)
}

/// Records that the server processed the first `read` replayed bytes (its reading thread
/// found nothing ready: an event loop processes what it read before it waits again).
pub(crate) fn settle(read: u64) {
    if let Some(word) = control_word(CONTROL_REPLAY_SETTLED) {
        word.fetch_max(read, Ordering::AcqRel);
    }
}

/// A gated call in progress (see [`enter_gate`]); leaving it is dropping it.
pub(crate) struct GatedCall(&'static AtomicU64);

impl Drop for GatedCall {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Enters a call that reads client input or accepts a client: `None` while the wrap node holds
/// client input back. Dekker with the node's `close_gate`: the count is raised before the gate
/// is read, both sequentially consistent, so either the node sees this call (and waits for
/// it) or this call sees the gate closed. Always open without a control page.
pub(crate) fn enter_gate() -> Option<Option<GatedCall>> {
    let (Some(calls), Some(gate)) = (control_word(CONTROL_GATED_CALLS), control_word(CONTROL_GATE)) else {
        return Some(None);
    };
    calls.fetch_add(1, Ordering::SeqCst);
    let call = GatedCall(calls);
    if gate.load(Ordering::SeqCst) != 0 {
        return None;
    }
    Some(Some(call))
}

/// Why the shim stays inactive in a process the wrap node started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActivateError {
    #[error("{} is longer than {MAX_PATH} bytes", dir.display())]
    PathTooLong { dir: std::path::PathBuf },
    #[error("{}: {source}", path.display())]
    Control { path: std::path::PathBuf, source: std::io::Error },
    #[error("mapping the control page: {0}")]
    Map(rustix::io::Errno),
    #[error("activated twice")]
    Twice,
    #[error("{} is not 64 hexadecimal digits: active, with the kernel's randomness", microrep_interpose_wire::ENV_SEED)]
    Seed,
}

/// Activates the shim for this process if the wrap node's variable is set, then removes the
/// variable. Runs in the library constructor, before the program's `main` (one thread).
pub(crate) fn activate_from_env() -> Result<bool, ActivateError> {
    let var = microrep_interpose_wire::ENV_DIR;
    let Some(dir) = std::env::var_os(var) else { return Ok(false) };
    // SAFETY: the constructor runs before the program's main and its threads; nothing else
    // reads the environment concurrently.
    unsafe { std::env::remove_var(var) };
    let dir = std::path::PathBuf::from(dir);
    let socket = dir.join(microrep_interpose_wire::SOCKET_NAME);
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(socket.as_os_str());
    let mut path = [0u8; MAX_PATH + 16];
    // The last byte stays NUL.
    match path.get_mut(..bytes.len()).filter(|_| bytes.len() < MAX_PATH + 16) {
        Some(prefix) => prefix.copy_from_slice(bytes),
        None => return Err(ActivateError::PathTooLong { dir }),
    }
    let control_path = dir.join(CONTROL_NAME);
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&control_path)
        .map_err(|source| ActivateError::Control { path: control_path, source })?;
    // SAFETY: a fresh shared mapping of a file the wrap node sized to CONTROL_BYTES; it is
    // never unmapped, so the pointer stays valid for the life of the process.
    let page = unsafe {
        rustix::mm::mmap(
            core::ptr::null_mut(),
            CONTROL_BYTES,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &control,
            0,
        )
    }
    .map_err(ActivateError::Map)?;
    CONTROL.store(page.cast(), Ordering::Release);
    SOCKET_PATH.set(path).map_err(|_| ActivateError::Twice)?;
    ACTIVE_PID.store(rustix::process::getpid().as_raw_nonzero().get(), Ordering::Release);
    if let Some(seed) = std::env::var_os(microrep_interpose_wire::ENV_SEED) {
        // SAFETY: as above: still the constructor, before any other thread.
        unsafe { std::env::remove_var(microrep_interpose_wire::ENV_SEED) };
        // A bad seed must not leave the shim inactive (the server would then serve clients
        // unreplicated): it stays active and draws randomness from the kernel.
        let seed = parse_seed(seed.as_encoded_bytes()).ok_or(ActivateError::Seed)?;
        SEED.set(seed).map_err(|_| ActivateError::Twice)?;
    }
    Ok(true)
}

/// 64 hexadecimal digits as 32 bytes.
fn parse_seed(hex: &[u8]) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut seed = [0u8; 32];
    for (byte, pair) in seed.iter_mut().zip(hex.chunks(2)) {
        let digits = core::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(digits, 16).ok()?;
    }
    Some(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_64_hex_digits() {
        let hex = "00ff".repeat(16);
        let seed = parse_seed(hex.as_bytes()).expect("valid");
        assert_eq!(&seed[..2], &[0x00, 0xff]);
        assert_eq!(parse_seed(b"00ff"), None, "too short");
        assert_eq!(parse_seed("zz".repeat(32).as_bytes()), None, "not hex");
        assert_eq!(parse_seed("+1".repeat(32).as_bytes()), None, "a sign is not a digit");
    }

    #[test]
    fn descriptor_states_round_trip() {
        for what in [
            Fd::Other,
            Fd::Replay,
            Fd::Random,
            Fd::Client { conn: 0, broken: false },
            Fd::Client { conn: (1 << 40) | 7, broken: true },
        ] {
            assert_eq!(Fd::decode(what.encode()), what);
        }
    }

    #[test]
    fn inactive_process_tracks_nothing() {
        assert!(set(5, Fd::Client { conn: 9, broken: false }));
        assert_eq!(lookup(5), Fd::Other, "an inactive process acts on no descriptor");
        assert_eq!(take(5), Fd::Client { conn: 9, broken: false });
        assert!(!set(-1, Fd::Replay));
        assert!(!set(MAX_FDS as c_int, Fd::Replay));
    }
}
