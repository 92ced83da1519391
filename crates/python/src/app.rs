//! A state machine written in Python (an object with `apply`, `snapshot` and `restore`
//! methods, and optionally `digest`) as the runtime's `Apply`.

use microrep::{Apply, Index, RestoreError};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Where a command was committed: its log entry and its position in that entry's batch.
#[pyclass(name = "Index", module = "microrep", frozen, eq, hash, ord)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PyIndex {
    /// The log index of the entry.
    #[pyo3(get)]
    entry: u64,
    /// The command's position in the entry (0 for an entry of one command).
    #[pyo3(get)]
    position: u32,
}

impl From<Index> for PyIndex {
    fn from(i: Index) -> Self {
        Self { entry: i.entry, position: i.position }
    }
}

#[pymethods]
impl PyIndex {
    pub(crate) fn __repr__(&self) -> String {
        format!("Index(entry={}, position={})", self.entry, self.position)
    }
}

/// The Python object every replica applies commands to.
#[derive(Debug)]
pub(crate) struct PyApp {
    app: Py<PyAny>,
    has_digest: bool,
}

impl PyApp {
    /// Checks that `app` has the methods a state machine needs.
    pub(crate) fn new(app: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut missing = Vec::new();
        for name in ["apply", "snapshot", "restore"] {
            if !app.getattr(name).is_ok_and(|m| m.is_callable()) {
                missing.push(name);
            }
        }
        if !missing.is_empty() {
            let kind = app.get_type().name()?;
            let missing = missing.join(", ");
            return Err(PyTypeError::new_err(format!("the state machine ({kind}) lacks the method(s) {missing}")));
        }
        let has_digest = app.getattr("digest").is_ok_and(|m| m.is_callable());
        Ok(Self { app: app.clone().unbind(), has_digest })
    }
}

/// Reports an exception raised by a callback the way Python reports one it cannot raise
/// (`sys.unraisablehook`): nobody called the callback from Python.
fn report(py: Python<'_>, e: PyErr, app: &Bound<'_, PyAny>) {
    e.write_unraisable(py, Some(app));
}

impl Apply for PyApp {
    fn apply(&mut self, index: Index, command: &[u8], reply: &mut Vec<u8>) {
        Python::attach(|py| {
            let app = self.app.bind(py);
            let result = app.call_method1("apply", (PyIndex::from(index), PyBytes::new(py, command)));
            let bytes = result.and_then(|r| if r.is_none() { Ok(Vec::new()) } else { r.extract::<Vec<u8>>() });
            match bytes {
                Ok(bytes) => reply.extend_from_slice(&bytes),
                Err(e) => report(py, e, app),
            }
        });
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        Python::attach(|py| {
            let app = self.app.bind(py);
            match app.call_method0("snapshot").and_then(|s| s.extract::<Vec<u8>>()) {
                Ok(bytes) => out.extend_from_slice(&bytes),
                Err(e) => report(py, e, app),
            }
        });
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        Python::attach(|py| {
            let app = self.app.bind(py);
            app.call_method1("restore", (PyBytes::new(py, snapshot),))
                .map(drop)
                .map_err(|e| RestoreError::Application(format!("restore raised {e}")))
        })
    }

    fn digest(&self) -> Option<u64> {
        if !self.has_digest {
            return None;
        }
        Python::attach(|py| {
            let app = self.app.bind(py);
            match app.call_method0("digest").and_then(|d| d.extract::<Option<u64>>()) {
                Ok(d) => d,
                Err(e) => {
                    report(py, e, app);
                    None
                }
            }
        })
    }
}
