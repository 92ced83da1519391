//! The status every entry point returns, the calling thread's last error message, and the
//! guard that keeps panics from crossing the FFI boundary.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use microrep::ProposeError;

/// What a call did. `MICROREP_OK` is 0; on any other status the calling thread's
/// `microrep_last_error()` says why.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum microrep_status {
    /// Success.
    MICROREP_OK = 0,
    /// `microrep_pending_poll`: the outcome is not known yet.
    MICROREP_PENDING = 1,
    /// This replica does not lead; nothing was written. `microrep_node_leader` names the
    /// replica it believes leads, if any.
    MICROREP_NOT_LEADER = 2,
    /// Leadership was lost while replicating: the command may or may not commit.
    MICROREP_UNKNOWN = 3,
    /// No outcome within `node.propose_timeout_ms`: the command may still commit.
    MICROREP_TIMEOUT = 4,
    /// Nothing was written: the command does not fit in a log slot, or the application's
    /// state outgrew `cluster.log.snapshot_bytes` (the message says which).
    MICROREP_TOO_LARGE = 5,
    /// Too many proposals are waiting; nothing was written. Retry later.
    MICROREP_BACKLOGGED = 6,
    /// The node is shutting down; the command may have been written.
    MICROREP_SHUTDOWN = 7,
    /// A pointer was null, a string was not UTF-8, or a handle was used after it was spent.
    MICROREP_INVALID_ARGUMENT = 8,
    /// The configuration is invalid; the message names the key at fault.
    MICROREP_CONFIG = 9,
    /// The node did not start (fabric, threads, events file).
    MICROREP_START = 10,
    /// A bug in microrep: a panic was caught at the boundary.
    MICROREP_PANIC = 11,
}

/// A failure: its status and message.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) status: microrep_status,
    pub(crate) message: String,
}

impl Error {
    pub(crate) fn new(status: microrep_status, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(microrep_status::MICROREP_INVALID_ARGUMENT, message)
    }
}

impl From<ProposeError> for Error {
    fn from(e: ProposeError) -> Self {
        use microrep_status::*;
        let status = match e {
            ProposeError::NotLeader { .. } => MICROREP_NOT_LEADER,
            ProposeError::Unknown => MICROREP_UNKNOWN,
            ProposeError::Timeout => MICROREP_TIMEOUT,
            ProposeError::TooLarge { .. }
            | ProposeError::TooManyCommands { .. }
            | ProposeError::StateTooLarge { .. } => MICROREP_TOO_LARGE,
            ProposeError::Backlogged => MICROREP_BACKLOGGED,
            ProposeError::Shutdown => MICROREP_SHUTDOWN,
            // The C API proposes no membership changes; a refusal would be a bad request.
            ProposeError::Membership(_) => MICROREP_INVALID_ARGUMENT,
        };
        Self::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with an interior NUL is cut there rather than lost.
    let cut = message.split('\0').next().unwrap_or_default();
    let c = CString::new(cut).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `body` for an entry point: its error becomes the status and the thread's last error,
/// and a panic is caught (`MICROREP_PANIC`) instead of unwinding into C.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Error>) -> microrep_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => microrep_status::MICROREP_OK,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            set_last_error(&format!("internal error (please report): {what}"));
            microrep_status::MICROREP_PANIC
        }
    }
}

/// The message of the calling thread's last failed call ("" if none failed yet). The string
/// stays valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn microrep_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static, NUL-terminated name for `status` ("MICROREP_OK", ...).
#[unsafe(no_mangle)]
pub extern "C" fn microrep_status_name(status: microrep_status) -> *const c_char {
    use microrep_status::*;
    let name: &'static std::ffi::CStr = match status {
        MICROREP_OK => c"MICROREP_OK",
        MICROREP_PENDING => c"MICROREP_PENDING",
        MICROREP_NOT_LEADER => c"MICROREP_NOT_LEADER",
        MICROREP_UNKNOWN => c"MICROREP_UNKNOWN",
        MICROREP_TIMEOUT => c"MICROREP_TIMEOUT",
        MICROREP_TOO_LARGE => c"MICROREP_TOO_LARGE",
        MICROREP_BACKLOGGED => c"MICROREP_BACKLOGGED",
        MICROREP_SHUTDOWN => c"MICROREP_SHUTDOWN",
        MICROREP_INVALID_ARGUMENT => c"MICROREP_INVALID_ARGUMENT",
        MICROREP_CONFIG => c"MICROREP_CONFIG",
        MICROREP_START => c"MICROREP_START",
        MICROREP_PANIC => c"MICROREP_PANIC",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last_error() -> String {
        // SAFETY: microrep_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(microrep_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let status = guard(|| panic!("boom {}", 7));
        assert_eq!(status, microrep_status::MICROREP_PANIC);
        assert_eq!(last_error(), "internal error (please report): boom 7");
    }

    #[test]
    fn an_error_sets_the_message_and_success_keeps_it() {
        let status = guard(|| Err(ProposeError::TooLarge { len: 9, max: 4 }.into()));
        assert_eq!(status, microrep_status::MICROREP_TOO_LARGE);
        assert_eq!(last_error(), "command of 9 bytes exceeds the limit of 4 bytes");
        assert_eq!(guard(|| Ok(())), microrep_status::MICROREP_OK);
        assert_eq!(last_error(), "command of 9 bytes exceeds the limit of 4 bytes");
    }

    #[test]
    fn messages_with_a_nul_are_cut_there() {
        guard(|| Err(Error::invalid("before\0after")));
        assert_eq!(last_error(), "before");
    }

    #[test]
    fn every_status_has_its_name() {
        // SAFETY: microrep_status_name returns a static NUL-terminated string.
        let name = |s| unsafe { CStr::from_ptr(microrep_status_name(s)) }.to_str().map(str::to_owned);
        assert_eq!(name(microrep_status::MICROREP_NOT_LEADER).as_deref(), Ok("MICROREP_NOT_LEADER"));
        assert_eq!(name(microrep_status::MICROREP_PANIC).as_deref(), Ok("MICROREP_PANIC"));
    }
}
