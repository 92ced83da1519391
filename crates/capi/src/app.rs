//! The application's state machine as C callbacks, adapted to the runtime's `Apply`.

use std::ffi::c_void;

use microrep::{Apply, Index, RestoreError};

use crate::bytes::microrep_bytes;

/// Where a command was committed: its log entry and its position in that entry's batch.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct microrep_index {
    /// The log index of the entry.
    pub entry: u64,
    /// The command's position inside the entry (0 for an entry of one command).
    pub position: u32,
}

impl From<Index> for microrep_index {
    fn from(i: Index) -> Self {
        Self { entry: i.entry, position: i.position }
    }
}

/// Applies the committed `command` (`len` bytes) at `index`; appends the reply for its
/// proposer to `reply` with `microrep_bytes_append`.
#[allow(non_camel_case_types)]
pub type microrep_apply_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        index: microrep_index,
        command: *const u8,
        len: usize,
        reply: *mut microrep_bytes,
    ),
>;

/// Appends the whole state to `out` with `microrep_bytes_append`.
#[allow(non_camel_case_types)]
pub type microrep_snapshot_fn = Option<unsafe extern "C" fn(user: *mut c_void, out: *mut microrep_bytes)>;

/// Replaces the whole state with `snapshot` (`len` bytes). Returns 0 if it did; any other
/// value refuses the snapshot (the state must then be unchanged).
#[allow(non_camel_case_types)]
pub type microrep_restore_fn = Option<unsafe extern "C" fn(user: *mut c_void, snapshot: *const u8, len: usize) -> i32>;

/// Writes a digest of the state to `*out` and returns true, or returns false for none.
#[allow(non_camel_case_types)]
pub type microrep_digest_fn = Option<unsafe extern "C" fn(user: *mut c_void, out: *mut u64) -> bool>;

/// Releases `user` once the library no longer calls back with it.
#[allow(non_camel_case_types)]
pub type microrep_free_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// The application every replica runs, as callbacks sharing the `user` context.
///
/// `apply`, `snapshot` and `restore` are required; `digest` and `free_user` may be null. The
/// callbacks run on the node's own threads (or on a proposing thread in direct mode), never
/// two at once for one node; they must not unwind (C++ exceptions, longjmp) out of the call,
/// and must not call back into the node that called them.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct microrep_state_machine {
    /// Passed to every callback.
    pub user: *mut c_void,
    /// Applies a committed command.
    pub apply: microrep_apply_fn,
    /// Serialises the state (state transfer to a replica that fell behind).
    pub snapshot: microrep_snapshot_fn,
    /// Replaces the state with a snapshot.
    pub restore: microrep_restore_fn,
    /// Optional: a digest of the state, shown in the node's status.
    pub digest: microrep_digest_fn,
    /// Optional: called once with `user` when the node is freed (or failed to start).
    pub free_user: microrep_free_fn,
}

/// A state machine without some of its required callbacks, named.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("state machine callback(s) missing: {}", .0.join(", "))]
pub(crate) struct MissingCallbacks(Vec<&'static str>);

/// The callbacks as an `Apply`; calls `free_user` when dropped.
#[derive(Debug)]
pub(crate) struct CallbackApp {
    sm: microrep_state_machine,
}

// SAFETY: the header's contract for `microrep_state_machine`: the callbacks may be called with
// `user` from threads other than the one that started the node (never two at once, which
// `Apply`'s `&mut self` ensures).
unsafe impl Send for CallbackApp {}

impl CallbackApp {
    /// Takes ownership of `sm` (its `free_user` runs when this is dropped); refuses one without
    /// its required callbacks.
    pub(crate) fn new(sm: microrep_state_machine) -> Result<Self, MissingCallbacks> {
        let app = Self { sm };
        let missing: Vec<&'static str> = [
            ("apply", app.sm.apply.is_none()),
            ("snapshot", app.sm.snapshot.is_none()),
            ("restore", app.sm.restore.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect();
        if missing.is_empty() { Ok(app) } else { Err(MissingCallbacks(missing)) }
    }
}

impl Apply for CallbackApp {
    fn apply(&mut self, index: Index, command: &[u8], reply: &mut Vec<u8>) {
        if let Some(apply) = self.sm.apply {
            let user = self.sm.user;
            microrep_bytes::lend(reply, |reply| {
                // SAFETY: the callback contract: `command` is readable for its length and
                // `reply` is a live writer during the call.
                unsafe { apply(user, index.into(), command.as_ptr(), command.len(), reply) }
            });
        }
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        if let Some(snapshot) = self.sm.snapshot {
            let user = self.sm.user;
            // SAFETY: as in `apply`: `out` is a live writer during the call.
            microrep_bytes::lend(out, |out| unsafe { snapshot(user, out) });
        }
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        let Some(restore) = self.sm.restore else { return Err(RestoreError::Application("no restore".into())) };
        // SAFETY: `snapshot` is readable for its length during the call.
        match unsafe { restore(self.sm.user, snapshot.as_ptr(), snapshot.len()) } {
            0 => Ok(()),
            code => Err(RestoreError::Application(format!("the restore callback refused the snapshot ({code})"))),
        }
    }

    fn digest(&self) -> Option<u64> {
        let digest = self.sm.digest?;
        let mut out = 0u64;
        // SAFETY: `out` is a writable u64 for the duration of the call.
        unsafe { digest(self.sm.user, &mut out) }.then_some(out)
    }
}

impl Drop for CallbackApp {
    fn drop(&mut self) {
        if let Some(free_user) = self.sm.free_user {
            // SAFETY: the node no longer calls back with `user`: this runs once, when the app is
            // dropped.
            unsafe { free_user(self.sm.user) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::microrep_bytes_append;

    /// A sum of the commands' first bytes.
    #[derive(Default)]
    struct Sum {
        total: u64,
        freed: bool,
    }

    unsafe extern "C" fn apply(
        user: *mut c_void,
        index: microrep_index,
        cmd: *const u8,
        len: usize,
        reply: *mut microrep_bytes,
    ) {
        // SAFETY: the tests pass a live `Sum` as user; cmd holds len >= 1 bytes.
        let (sum, first) = unsafe { (&mut *user.cast::<Sum>(), *cmd) };
        assert_eq!(len, 1);
        sum.total += u64::from(first) + index.entry * 1000;
        let bytes = sum.total.to_le_bytes();
        // SAFETY: `reply` is the writer of this call; `bytes` is 8 readable bytes.
        assert!(unsafe { microrep_bytes_append(reply, bytes.as_ptr(), bytes.len()) });
    }

    unsafe extern "C" fn snapshot(user: *mut c_void, out: *mut microrep_bytes) {
        // SAFETY: the tests pass a live `Sum` as user.
        let bytes = unsafe { &*user.cast::<Sum>() }.total.to_le_bytes();
        // SAFETY: `out` is the writer of this call.
        unsafe { microrep_bytes_append(out, bytes.as_ptr(), bytes.len()) };
    }

    unsafe extern "C" fn restore(user: *mut c_void, data: *const u8, len: usize) -> i32 {
        if len != 8 {
            return 22;
        }
        // SAFETY: data holds 8 bytes; user is a live `Sum`.
        unsafe {
            let bytes: [u8; 8] = std::slice::from_raw_parts(data, 8).try_into().expect("8 bytes");
            (*user.cast::<Sum>()).total = u64::from_le_bytes(bytes);
        }
        0
    }

    unsafe extern "C" fn free_user(user: *mut c_void) {
        // SAFETY: the tests pass a live `Sum` as user.
        unsafe { (*user.cast::<Sum>()).freed = true };
    }

    fn machine(sum: &mut Sum) -> microrep_state_machine {
        microrep_state_machine {
            user: std::ptr::from_mut(sum).cast(),
            apply: Some(apply),
            snapshot: Some(snapshot),
            restore: Some(restore),
            digest: None,
            free_user: Some(free_user),
        }
    }

    #[test]
    fn callbacks_apply_snapshot_restore_and_free_once() {
        let mut sum = Sum::default();
        let mut app = CallbackApp::new(machine(&mut sum)).expect("complete");
        let mut reply = Vec::new();
        app.apply(Index { entry: 2, position: 0 }, &[5], &mut reply);
        assert_eq!(reply, 2005u64.to_le_bytes());
        let mut snap = Vec::new();
        app.snapshot(&mut snap);
        assert_eq!(snap, 2005u64.to_le_bytes());
        assert_eq!(app.restore(&7u64.to_le_bytes()), Ok(()));
        let refused = app.restore(b"short").expect_err("refused");
        assert_eq!(
            refused.to_string(),
            RestoreError::Application("the restore callback refused the snapshot (22)".into()).to_string()
        );
        assert_eq!(app.digest(), None);
        drop(app);
        assert_eq!(sum.total, 7);
        assert!(sum.freed);
    }

    #[test]
    fn missing_callbacks_are_named_and_user_is_still_freed() {
        let mut sum = Sum::default();
        let incomplete = microrep_state_machine { snapshot: None, restore: None, ..machine(&mut sum) };
        let e = CallbackApp::new(incomplete).expect_err("incomplete");
        assert_eq!(e, MissingCallbacks(vec!["snapshot", "restore"]));
        assert_eq!(e.to_string(), "state machine callback(s) missing: snapshot, restore");
        assert!(sum.freed);
    }
}
