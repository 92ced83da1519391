//! The native part of the `microrep` Python package (`microrep._native`, PyO3 with the stable
//! ABI): configurations, nodes running a state machine written in Python, proposals, and the
//! exceptions they raise. The package's `microrep/__init__.py` re-exports it and adds
//! `LocalCluster`; see docs/PYTHON.md.

mod app;
mod config;
mod errors;
mod node;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::PyConfig>()?;
    m.add_class::<node::PyNode>()?;
    m.add_class::<node::PyPending>()?;
    m.add_class::<node::PyCommitted>()?;
    m.add_class::<app::PyIndex>()?;
    m.add_function(wrap_pyfunction!(node::close_all, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
