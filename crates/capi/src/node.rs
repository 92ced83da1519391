//! The node handle (a running replica) and the pending-proposal handle.

use microrep::{Committed, Node, Pending, ProposeError};

use crate::app::{CallbackApp, microrep_index, microrep_state_machine};
use crate::bytes::{microrep_buffer, slice_arg, write_out};
use crate::config::microrep_config;
use crate::error::{Error, guard, microrep_status};

/// A running replica. Any number of threads may propose through one node at once; free it
/// (`microrep_node_free`) only once no other call on it is running.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct microrep_node {
    node: Node,
}

// Any thread may call a node: the handle must be shareable.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<Node>();
};

/// A proposal submitted with `microrep_node_submit` whose outcome is collected with
/// `microrep_pending_poll` or `microrep_pending_wait`; free it with `microrep_pending_free`.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct microrep_pending {
    /// `None` once its outcome was handed out.
    pending: Option<Pending>,
}

/// A committed command: where, and what the application replied on this replica (free the
/// reply with `microrep_buffer_free`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug)]
pub struct microrep_committed {
    /// Where it was committed.
    pub index: microrep_index,
    /// What the apply callback appended to its reply.
    pub reply: microrep_buffer,
}

/// # Safety
/// Unless null, `node` is a live handle.
unsafe fn node_ref<'a>(node: *const microrep_node) -> Result<&'a Node, Error> {
    // SAFETY: a live handle or null (the caller's contract).
    unsafe { node.as_ref() }.map(|n| &n.node).ok_or_else(|| Error::invalid("node is null"))
}

/// Hands a proposal's outcome to the caller.
///
/// # Safety
/// Unless null, `out` is writable.
unsafe fn deliver(outcome: Result<Committed, ProposeError>, out: *mut microrep_committed) -> Result<(), Error> {
    let committed = outcome?;
    let value = microrep_committed { index: committed.index.into(), reply: microrep_buffer::from_vec(committed.reply) };
    // SAFETY: forwarded from the caller's contract.
    unsafe { write_out(out, value, "out") }
}

/// Starts the replica `config` describes (its `node.id`), applying committed commands through
/// `sm`, into `*out`. Whether or not it starts, `sm.free_user` is called once the library no
/// longer needs `sm.user` (on failure: before this returns).
///
/// # Safety
/// `config` is a live handle; `out` is writable; `sm` keeps the contract of
/// `microrep_state_machine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_start(
    config: *const microrep_config,
    sm: microrep_state_machine,
    out: *mut *mut microrep_node,
) -> microrep_status {
    guard(|| {
        let app = CallbackApp::new(sm).map_err(|e| Error::invalid(e.to_string()))?;
        // SAFETY: a live handle or null (the caller's contract).
        let config = unsafe { config.as_ref() }.ok_or_else(|| Error::invalid("config is null"))?;
        if out.is_null() {
            return Err(Error::invalid("out is null"));
        }
        let node = microrep::start(&config.config, app).map_err(|e| match e {
            microrep::StartError::Config(e) => {
                Error::new(microrep_status::MICROREP_CONFIG, format!("invalid configuration: {e}"))
            }
            e => Error::new(microrep_status::MICROREP_START, format!("starting node {}: {e}", config.config.node.id)),
        })?;
        let handle = Box::into_raw(Box::new(microrep_node { node }));
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { write_out(out, handle, "out") }
    })
}

/// Proposes `command` (`len` bytes) and blocks until it commits, filling `*out`; or fails
/// with `MICROREP_NOT_LEADER`, `_UNKNOWN`, `_TIMEOUT`, `_TOO_LARGE`, `_BACKLOGGED` or
/// `_SHUTDOWN` (see `microrep_status`). In direct mode the calling thread drives replication,
/// and applies commands through the callbacks, while it waits.
///
/// # Safety
/// `node` is a live handle; `command` points to `len` readable bytes (or is null with `len`
/// 0); `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_propose(
    node: *const microrep_node,
    command: *const u8,
    len: usize,
    out: *mut microrep_committed,
) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let (node, command) = unsafe { (node_ref(node)?, slice_arg(command, len, "command")?) };
        if out.is_null() {
            return Err(Error::invalid("out is null"));
        }
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { deliver(node.propose(command), out) }
    })
}

/// Submits `command` without waiting, into `*out`: several may be outstanding at once, and in
/// handover mode those waiting together are batched into one log entry. Refusals that write
/// nothing (`MICROREP_NOT_LEADER`, `_BACKLOGGED`, ...) are returned here.
///
/// # Safety
/// As `microrep_node_propose`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_submit(
    node: *const microrep_node,
    command: *const u8,
    len: usize,
    out: *mut *mut microrep_pending,
) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let (node, command) = unsafe { (node_ref(node)?, slice_arg(command, len, "command")?) };
        if out.is_null() {
            return Err(Error::invalid("out is null"));
        }
        let pending = node.submit(command)?;
        let handle = Box::into_raw(Box::new(microrep_pending { pending: Some(pending) }));
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { write_out(out, handle, "out") }
    })
}

/// # Safety
/// Unless null, `pending` is a live handle used by no other thread.
unsafe fn pending_mut<'a>(pending: *mut microrep_pending) -> Result<&'a mut microrep_pending, Error> {
    // SAFETY: a live handle or null, used by this thread only (the caller's contract).
    unsafe { pending.as_mut() }.ok_or_else(|| Error::invalid("pending is null"))
}

const SPENT: &str = "this proposal's outcome was already collected";

/// The outcome if known: `MICROREP_PENDING` while it is not, else as `microrep_node_propose`.
/// Only in handover mode does an outcome arrive without a thread waiting for it; in direct
/// mode, use `microrep_pending_wait`. After an outcome, the handle is spent.
///
/// # Safety
/// `pending` is a live handle used by no other thread; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_pending_poll(
    pending: *mut microrep_pending,
    out: *mut microrep_committed,
) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let handle = unsafe { pending_mut(pending) }?;
        let outcome = handle.pending.as_ref().ok_or_else(|| Error::invalid(SPENT))?.try_take();
        let Some(outcome) = outcome else {
            return Err(Error::new(microrep_status::MICROREP_PENDING, "the outcome is not known yet"));
        };
        handle.pending = None;
        // SAFETY: forwarded from the caller's contract.
        unsafe { deliver(outcome, out) }
    })
}

/// Blocks until the outcome is known, as `microrep_node_propose`. The handle is then spent.
///
/// # Safety
/// `pending` is a live handle used by no other thread; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_pending_wait(
    pending: *mut microrep_pending,
    out: *mut microrep_committed,
) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let handle = unsafe { pending_mut(pending) }?;
        if out.is_null() {
            return Err(Error::invalid("out is null"));
        }
        let pending = handle.pending.take().ok_or_else(|| Error::invalid(SPENT))?;
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { deliver(pending.wait(), out) }
    })
}

/// Frees `pending` (null is ignored). A proposal freed before its outcome may still commit.
///
/// # Safety
/// `pending` is null or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_pending_free(pending: *mut microrep_pending) {
    if !pending.is_null() {
        // SAFETY: a handle from `microrep_node_submit`'s `Box::into_raw`, freed once.
        drop(unsafe { Box::from_raw(pending) });
    }
}

/// This replica's id, or -1 if `node` is null.
///
/// # Safety
/// `node` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_id(node: *const microrep_node) -> i32 {
    // SAFETY: forwarded from the caller's contract.
    unsafe { node_ref(node) }.map_or(-1, |n| i32::from(n.id().0))
}

/// The replica this one believes leads, or -1 if it knows none (or `node` is null).
///
/// # Safety
/// `node` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_leader(node: *const microrep_node) -> i32 {
    // SAFETY: forwarded from the caller's contract.
    unsafe { node_ref(node) }.ok().and_then(Node::leader).map_or(-1, |l| i32::from(l.0))
}

/// The node's status as a NUL-terminated JSON document (the one `microrep status` shows:
/// role, leader, applied index, digest, ...) into `*out`; free it with `microrep_buffer_free`.
///
/// # Safety
/// `node` is a live handle; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_status_json(
    node: *const microrep_node,
    out: *mut microrep_buffer,
) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let node = unsafe { node_ref(node) }?;
        let json = serde_json::to_string(&node.status())
            .map_err(|e| Error::new(microrep_status::MICROREP_PANIC, format!("rendering the status: {e}")))?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { write_out(out, microrep_buffer::from_text(json), "out") }
    })
}

/// Stops the node's threads, waits for them, then calls the state machine's `free_user`.
/// Proposals still waiting fail with `MICROREP_SHUTDOWN`. Null is ignored.
///
/// # Safety
/// `node` is null or a live handle on which no other call is running, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_node_free(node: *mut microrep_node) {
    if node.is_null() {
        return;
    }
    // SAFETY: a handle from `microrep_node_start`'s `Box::into_raw`, freed once.
    let handle = unsafe { Box::from_raw(node) };
    // Stopping joins threads; a panic there must not unwind into C.
    let _ = guard(|| {
        let microrep_node { node } = *handle;
        node.shutdown();
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use std::ffi::{CStr, CString, c_void};
    use std::ptr::{null, null_mut};

    use super::*;
    use crate::bytes::{microrep_buffer_free, microrep_bytes, microrep_bytes_append};
    use crate::config::{microrep_config_free, microrep_config_local, microrep_config_set};
    use crate::error::microrep_last_error;

    fn last_error() -> String {
        // SAFETY: microrep_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(microrep_last_error()) }.to_string_lossy().into_owned()
    }

    /// Replies with the command's length; no state.
    unsafe extern "C" fn apply(
        _: *mut c_void,
        _: microrep_index,
        _: *const u8,
        len: usize,
        reply: *mut microrep_bytes,
    ) {
        let bytes = (len as u64).to_le_bytes();
        // SAFETY: `reply` is the writer of this call.
        unsafe { microrep_bytes_append(reply, bytes.as_ptr(), bytes.len()) };
    }
    unsafe extern "C" fn snapshot(_: *mut c_void, _: *mut microrep_bytes) {}
    unsafe extern "C" fn restore(_: *mut c_void, _: *const u8, _: usize) -> i32 {
        0
    }
    unsafe extern "C" fn count_free(user: *mut c_void) {
        // SAFETY: the tests pass a live u32 counter as user.
        unsafe { *user.cast::<u32>() += 1 };
    }

    fn machine(freed: &mut u32) -> microrep_state_machine {
        microrep_state_machine {
            user: std::ptr::from_mut(freed).cast(),
            apply: Some(apply),
            snapshot: Some(snapshot),
            restore: Some(restore),
            digest: None,
            free_user: Some(count_free),
        }
    }

    #[test]
    fn null_handles_are_refused_by_name() {
        let mut out = std::mem::MaybeUninit::<microrep_committed>::uninit();
        // SAFETY: every pointer is null or valid; nothing is dereferenced on these failures.
        unsafe {
            let status = microrep_node_propose(null(), b"x".as_ptr(), 1, out.as_mut_ptr());
            assert_eq!(status, microrep_status::MICROREP_INVALID_ARGUMENT);
            assert_eq!(last_error(), "node is null");
            let status = microrep_pending_poll(null_mut(), out.as_mut_ptr());
            assert_eq!(status, microrep_status::MICROREP_INVALID_ARGUMENT);
            assert_eq!(last_error(), "pending is null");
            assert_eq!(microrep_node_leader(null()), -1);
            assert_eq!(microrep_node_id(null()), -1);
            microrep_node_free(null_mut());
            microrep_pending_free(null_mut());
        }
    }

    #[test]
    fn a_node_that_cannot_start_releases_its_user_context() {
        let mut freed = 0u32;
        let mut node = null_mut();
        let incomplete = microrep_state_machine { restore: None, ..machine(&mut freed) };
        // SAFETY: a null config is refused; `node` is writable.
        let status = unsafe { microrep_node_start(null(), incomplete, &mut node) };
        assert_eq!(status, microrep_status::MICROREP_INVALID_ARGUMENT);
        assert_eq!(last_error(), "state machine callback(s) missing: restore");
        assert_eq!(freed, 1);
        // SAFETY: as above.
        let status = unsafe { microrep_node_start(null(), machine(&mut freed), &mut node) };
        assert_eq!(
            (status, last_error().as_str(), freed),
            (microrep_status::MICROREP_INVALID_ARGUMENT, "config is null", 2)
        );
        assert!(node.is_null());
    }

    /// Proposes at node 0 until it leads (bounded).
    ///
    /// # Safety
    /// `node` is a live handle.
    unsafe fn propose_at(node: *const microrep_node, command: &[u8]) -> microrep_committed {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let mut out = std::mem::MaybeUninit::<microrep_committed>::uninit();
            // SAFETY: forwarded; `out` is writable.
            let status = unsafe { microrep_node_propose(node, command.as_ptr(), command.len(), out.as_mut_ptr()) };
            if status == microrep_status::MICROREP_OK {
                // SAFETY: filled on success.
                return unsafe { out.assume_init() };
            }
            assert!(std::time::Instant::now() < deadline, "{status:?}: {}", last_error());
            std::thread::yield_now();
        }
    }

    /// The cluster's directory, removed however the test ends.
    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_pending_proposal_is_collected_once_and_nodes_release_their_users() {
        let name = format!("capi-unit-{}", std::process::id());
        let dir = Dir(std::env::temp_dir().join(&name));
        let mut freed = [0u32; 3];
        let mut config = null_mut();
        let name = CString::new(name).expect("no NUL");
        let shm = CString::new(format!("\"{}\"", dir.0.display())).expect("no NUL");
        // SAFETY: valid strings, live handles, writable out-pointers; every handle is freed once.
        unsafe {
            assert_eq!(microrep_config_local(name.as_ptr(), 3, &mut config), microrep_status::MICROREP_OK);
            assert_eq!(
                microrep_config_set(config, c"cluster.shm_dir".as_ptr(), shm.as_ptr()),
                microrep_status::MICROREP_OK
            );
            let heartbeat = c"cluster.timing.heartbeat_us";
            assert_eq!(
                microrep_config_set(config, heartbeat.as_ptr(), c"10000".as_ptr()),
                microrep_status::MICROREP_OK
            );
            let mut nodes = [null_mut(); 3];
            for (id, (node, freed)) in nodes.iter_mut().zip(freed.iter_mut()).enumerate() {
                let id = CString::new(id.to_string()).expect("no NUL");
                assert_eq!(microrep_config_set(config, c"node.id".as_ptr(), id.as_ptr()), microrep_status::MICROREP_OK);
                assert_eq!(microrep_node_start(config, machine(freed), node), microrep_status::MICROREP_OK);
            }
            microrep_config_free(config);
            let mut first = propose_at(nodes[0], b"abc");
            assert_eq!(std::slice::from_raw_parts(first.reply.data, first.reply.len), 3u64.to_le_bytes());
            microrep_buffer_free(&mut first.reply);

            let mut pending = null_mut();
            let status = microrep_node_submit(nodes[0], b"hello".as_ptr(), 5, &mut pending);
            assert_eq!(status, microrep_status::MICROREP_OK, "{}", last_error());
            let mut out = std::mem::MaybeUninit::<microrep_committed>::uninit();
            assert_eq!(microrep_pending_wait(pending, out.as_mut_ptr()), microrep_status::MICROREP_OK);
            let mut done = out.assume_init();
            assert!(done.index.entry > first.index.entry);
            microrep_buffer_free(&mut done.reply);
            let mut again = std::mem::MaybeUninit::<microrep_committed>::uninit();
            assert_eq!(microrep_pending_poll(pending, again.as_mut_ptr()), microrep_status::MICROREP_INVALID_ARGUMENT);
            assert_eq!(last_error(), "this proposal's outcome was already collected");
            microrep_pending_free(pending);

            let mut status_json = microrep_buffer::EMPTY;
            assert_eq!(microrep_node_status_json(nodes[0], &mut status_json), microrep_status::MICROREP_OK);
            let json = CStr::from_ptr(status_json.data.cast()).to_str().expect("utf8").to_owned();
            microrep_buffer_free(&mut status_json);
            assert!(json.starts_with("{\"node\":0,"), "{json}");
            nodes.into_iter().for_each(|n| microrep_node_free(n));
        }
        assert_eq!(freed, [1, 1, 1]);
    }
}
