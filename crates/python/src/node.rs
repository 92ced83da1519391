//! `microrep.Node` (a running replica), `Pending` (a submitted proposal) and `Committed`.
//!
//! Every wait (propose, wait, close) releases the GIL: the replica's own threads take it to
//! call the application, and other Python threads run meanwhile.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use microrep::{Committed, Node, Pending, ProposeError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::app::{PyApp, PyIndex};
use crate::config::PyConfig;
use crate::errors::{ConfigError, Error, StartError, propose_error};

/// Where a node lives: `None` once closed.
type Cell = Mutex<Option<Arc<Node>>>;
/// A node's slot, shared with the registry of open nodes.
type Slot = Arc<Cell>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every node's slot, to close those still open when the interpreter exits (`close_all`).
static OPEN: Mutex<Vec<Weak<Cell>>> = Mutex::new(Vec::new());

/// Stops `node` with the GIL released (its threads may be waiting for it).
fn stop(py: Python<'_>, node: Option<Arc<Node>>) {
    py.detach(move || drop(node));
}

/// Closes every node still open (registered with `atexit` by the package).
#[pyfunction]
pub(crate) fn close_all(py: Python<'_>) {
    let slots: Vec<Slot> = lock(&OPEN).drain(..).filter_map(|w| w.upgrade()).collect();
    for slot in slots {
        let node = lock(&slot).take();
        stop(py, node);
    }
}

/// A committed command: where (`index`), and what the application replied on this replica.
#[pyclass(name = "Committed", module = "microrep", frozen)]
#[derive(Debug)]
pub(crate) struct PyCommitted {
    /// Where it was committed.
    #[pyo3(get)]
    index: PyIndex,
    reply: Vec<u8>,
}

impl From<Committed> for PyCommitted {
    fn from(c: Committed) -> Self {
        Self { index: c.index.into(), reply: c.reply }
    }
}

#[pymethods]
impl PyCommitted {
    /// What `apply` returned on this replica.
    #[getter]
    fn reply<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.reply)
    }

    fn __repr__(&self) -> String {
        format!("Committed(index={}, reply={} bytes)", self.index.__repr__(), self.reply.len())
    }
}

/// One replica of a state machine written in Python: an object with `apply(index, command)`
/// returning the reply (bytes or None), `snapshot()` returning bytes, and `restore(snapshot)`
/// (raise to refuse); optionally `digest()` returning an int. Every replica applies the same
/// commands in the same order, on the node's own thread.
#[pyclass(name = "Node", module = "microrep", weakref)]
#[derive(Debug)]
pub(crate) struct PyNode {
    slot: Slot,
    id: u16,
}

impl PyNode {
    fn node(&self) -> PyResult<Arc<Node>> {
        lock(&self.slot).clone().ok_or_else(|| crate::errors::ShutdownError::new_err("the node is closed"))
    }
}

#[pymethods]
impl PyNode {
    /// Starts the replica `config` describes (its `node_id`), applying commands to `app`.
    #[new]
    fn new(config: PyRef<'_, PyConfig>, app: &Bound<'_, PyAny>) -> PyResult<Self> {
        let app = PyApp::new(app)?;
        let config = &config.config;
        let node = microrep::start(config, app).map_err(|e| match e {
            microrep::StartError::Config(e) => ConfigError::new_err(format!("invalid configuration: {e}")),
            e => StartError::new_err(format!("starting node {}: {e}", config.node.id)),
        })?;
        let slot: Slot = Arc::new(Mutex::new(Some(Arc::new(node))));
        let mut open = lock(&OPEN);
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&slot));
        Ok(Self { slot, id: config.node.id })
    }

    /// Proposes `command` and waits, with the GIL released, until it commits; raises
    /// NotLeaderError, OutcomeUnknownError (ProposeTimeoutError, ShutdownError), TooLargeError
    /// or BackloggedError otherwise.
    fn propose(&self, py: Python<'_>, command: &[u8]) -> PyResult<PyCommitted> {
        let node = self.node()?;
        let outcome = py.detach(|| node.propose(command));
        outcome.map(PyCommitted::from).map_err(|e| propose_error(py, e))
    }

    /// Proposes `commands` (a list of bytes) as one log entry, which commits as a whole or not
    /// at all, and waits with the GIL released; one Committed per command, in order. Raises as
    /// `propose` does, TooLargeError if the batch does not fit one entry.
    fn propose_batch(&self, py: Python<'_>, commands: Vec<Vec<u8>>) -> PyResult<Vec<PyCommitted>> {
        let node = self.node()?;
        let outcome = py.detach(|| node.propose_batch(commands.iter().map(Vec::as_slice)));
        let batch = outcome.map_err(|e| propose_error(py, e))?;
        Ok(batch.iter().map(|(index, reply)| PyCommitted::from(Committed { index, reply: reply.to_vec() })).collect())
    }

    /// Proposes `command` without waiting; several may be outstanding (and are batched
    /// together in handover mode). Refusals that wrote nothing raise here.
    fn submit(&self, py: Python<'_>, command: &[u8]) -> PyResult<PyPending> {
        let pending = self.node()?.submit(command).map_err(|e| propose_error(py, e))?;
        Ok(PyPending { pending: Mutex::new(Some(pending)) })
    }

    /// This replica's member id.
    #[getter]
    fn id(&self) -> u16 {
        self.id
    }

    /// The replica this one believes leads, or None.
    #[getter]
    fn leader(&self) -> PyResult<Option<u16>> {
        Ok(self.node()?.leader().map(|l| l.0))
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.slot).is_none()
    }

    /// The node's status as `microrep status` shows it (a dict: role, leader, applied, digest...).
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = serde_json::to_string(&self.node()?.status()).map_err(|e| Error::new_err(e.to_string()))?;
        py.import("json")?.call_method1("loads", (json,))
    }

    /// Stops the replica (with the GIL released) once proposals in flight on other threads
    /// return; later calls raise ShutdownError. Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let node = lock(&self.slot).take();
        stop(py, node);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("Node(id={}, closed={})", self.id, self.closed())
    }
}

impl Drop for PyNode {
    fn drop(&mut self) {
        let node = lock(&self.slot).take();
        if node.is_some() {
            Python::attach(|py| stop(py, node));
        }
    }
}

/// A submitted proposal: `poll()` for its outcome without waiting, or `wait()`.
#[pyclass(name = "Pending", module = "microrep")]
#[derive(Debug)]
pub(crate) struct PyPending {
    /// `None` once the outcome was collected.
    pending: Mutex<Option<Pending>>,
}

const SPENT: &str = "this proposal's outcome was already collected";

#[pymethods]
impl PyPending {
    /// The Committed outcome if known, None while it is not; raises as `Node.propose` does.
    /// In direct mode only a waiting thread makes progress: use `wait`.
    fn poll(&self, py: Python<'_>) -> PyResult<Option<PyCommitted>> {
        let mut slot = lock(&self.pending);
        let outcome = slot.as_ref().ok_or_else(|| Error::new_err(SPENT))?.try_take();
        let Some(outcome) = outcome else { return Ok(None) };
        *slot = None;
        outcome.map(|c| Some(c.into())).map_err(|e| propose_error(py, e))
    }

    /// Waits, with the GIL released, for the outcome; raises as `Node.propose` does.
    fn wait(&self, py: Python<'_>) -> PyResult<PyCommitted> {
        let pending = lock(&self.pending).take().ok_or_else(|| Error::new_err(SPENT))?;
        let outcome: Result<Committed, ProposeError> = py.detach(|| pending.wait());
        outcome.map(PyCommitted::from).map_err(|e| propose_error(py, e))
    }
}
