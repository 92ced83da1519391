//! The exceptions microrep raises, one per way a call fails, under `microrep.Error`.

use microrep::ProposeError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(microrep, Error, PyException, "Every error microrep raises.");
create_exception!(microrep, ConfigError, Error, "An invalid configuration; the message names the key at fault.");
create_exception!(microrep, StartError, Error, "A node did not start (fabric, threads, events file).");
create_exception!(
    microrep,
    NotLeaderError,
    Error,
    "This replica does not lead; nothing was written. `leader` is the replica believed to lead, or None."
);
create_exception!(
    microrep,
    OutcomeUnknownError,
    Error,
    "The command may or may not commit (leadership was lost while replicating it)."
);
create_exception!(
    microrep,
    ProposeTimeoutError,
    OutcomeUnknownError,
    "No outcome within node.propose_timeout_ms; the command may still commit."
);
create_exception!(
    microrep,
    ShutdownError,
    OutcomeUnknownError,
    "The node is shutting down or closed; the command may have been written."
);
create_exception!(
    microrep,
    TooLargeError,
    Error,
    "Nothing was written: the command does not fit in a log slot, or the state outgrew cluster.log.snapshot_bytes."
);
create_exception!(microrep, BackloggedError, Error, "Too many proposals are waiting; nothing was written.");

/// The exception for a failed proposal.
pub(crate) fn propose_error(py: Python<'_>, e: ProposeError) -> PyErr {
    let message = e.to_string();
    match e {
        ProposeError::NotLeader { leader } => {
            let err = NotLeaderError::new_err(message);
            if let Err(e) = err.value(py).setattr("leader", leader.map(|l| l.0)) {
                return e;
            }
            err
        }
        ProposeError::Unknown => OutcomeUnknownError::new_err(message),
        ProposeError::Timeout => ProposeTimeoutError::new_err(message),
        ProposeError::Shutdown => ShutdownError::new_err(message),
        ProposeError::TooLarge { .. } | ProposeError::TooManyCommands { .. } | ProposeError::StateTooLarge { .. } => {
            TooLargeError::new_err(message)
        }
        ProposeError::Backlogged => BackloggedError::new_err(message),
        // The Python API proposes no membership changes; a refusal would be a plain error.
        ProposeError::Membership(_) => Error::new_err(message),
    }
}

/// Adds the exceptions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("StartError", py.get_type::<StartError>())?;
    m.add("NotLeaderError", py.get_type::<NotLeaderError>())?;
    m.add("OutcomeUnknownError", py.get_type::<OutcomeUnknownError>())?;
    m.add("ProposeTimeoutError", py.get_type::<ProposeTimeoutError>())?;
    m.add("ShutdownError", py.get_type::<ShutdownError>())?;
    m.add("TooLargeError", py.get_type::<TooLargeError>())?;
    m.add("BackloggedError", py.get_type::<BackloggedError>())?;
    Ok(())
}
