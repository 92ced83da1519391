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
        let app = CallbackApp::new(sm).map_err(Error::invalid)?;
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
