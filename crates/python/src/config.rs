//! `microrep.Config`: a validated node configuration (docs/CONFIG.md).

use std::path::PathBuf;

use microrep::Config;
use microrep::config::{ClusterConfig, NodeConfig};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::errors::ConfigError;

/// A validated configuration of one node: parse TOML, load a file, or describe a local shm
/// cluster, then `set` any key.
#[pyclass(name = "Config", module = "microrep")]
#[derive(Debug)]
pub(crate) struct PyConfig {
    pub(crate) config: Config,
}

fn config_error(e: microrep::ConfigError) -> PyErr {
    ConfigError::new_err(format!("invalid configuration: {e}"))
}

/// A Python value as a TOML value: bools, integers and strings.
fn toml_value(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(b.is_true().to_string());
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(value.extract::<i64>()?.to_string());
    }
    if let Ok(s) = value.cast::<PyString>() {
        // A JSON string literal is a TOML basic string.
        return serde_json::to_string(&s.to_cow()?).map_err(|e| PyTypeError::new_err(e.to_string()));
    }
    let kind = value.get_type().name()?;
    Err(PyTypeError::new_err(format!("a setting is a bool, an int or a str, not {kind}")))
}

#[pymethods]
impl PyConfig {
    /// Parses TOML text in the format of docs/CONFIG.md.
    #[staticmethod]
    fn parse(text: &str) -> PyResult<Self> {
        Ok(Self { config: Config::parse(text, &[]).map_err(config_error)? })
    }

    /// Reads a TOML file.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        Ok(Self { config: Config::load(&path, &[]).map_err(config_error)? })
    }

    /// A cluster of `replicas` members on this host's shm fabric (in `shm_dir`, default
    /// /dev/shm/microrep-NAME), defaults elsewhere; this node is member 0.
    #[staticmethod]
    #[pyo3(signature = (name, replicas, shm_dir=None))]
    fn local(name: &str, replicas: u16, shm_dir: Option<PathBuf>) -> PyResult<Self> {
        let mut cluster = ClusterConfig::local(name, replicas, 6380);
        cluster.shm_dir = shm_dir;
        let config = Config { cluster, node: NodeConfig::new(0) };
        config.validate().map_err(config_error)?;
        Ok(Self { config })
    }

    /// Sets the dotted `key` (e.g. "cluster.timing.heartbeat_us") to a bool, int or str, as
    /// `microrep node --set` does; the configuration is unchanged if the result is invalid.
    fn set(&mut self, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = toml_value(value)?;
        self.config = Config::parse(&self.config.to_toml(), &[format!("{key}={value}")]).map_err(config_error)?;
        Ok(())
    }

    /// A copy for member `node_id` of the same cluster.
    fn with_node(&self, node_id: u16) -> PyResult<Self> {
        let mut config = self.config.clone();
        config.node.id = node_id;
        config.validate().map_err(config_error)?;
        Ok(Self { config })
    }

    /// This node's member id.
    #[getter]
    fn node_id(&self) -> u16 {
        self.config.node.id
    }

    /// How many members the cluster has.
    #[getter]
    fn replicas(&self) -> usize {
        self.config.cluster.members.len()
    }

    /// The shm fabric's directory.
    #[getter]
    fn shm_dir(&self) -> PathBuf {
        self.config.cluster.shm_dir()
    }

    /// The configuration as TOML.
    fn to_toml(&self) -> String {
        self.config.to_toml()
    }

    fn __repr__(&self) -> String {
        let c = &self.config;
        format!("Config(cluster={:?}, replicas={}, node_id={})", c.cluster.name, c.cluster.members.len(), c.node.id)
    }
}
