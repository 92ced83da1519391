//! The configuration handle: parsed from TOML (docs/CONFIG.md), loaded from a file, or a local
//! shm cluster; any key can then be set.

use std::ffi::c_char;

use microrep::Config;
use microrep::config::{ClusterConfig, NodeConfig};

use crate::bytes::{microrep_buffer, str_arg, write_out};
use crate::error::{Error, guard, microrep_status};

/// A validated node configuration. Create it with `microrep_config_parse`, `_load` or `_local`;
/// free it with `microrep_config_free`.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct microrep_config {
    pub(crate) config: Config,
}

fn config_error(e: microrep::ConfigError) -> Error {
    Error::new(microrep_status::MICROREP_CONFIG, format!("invalid configuration: {e}"))
}

/// Hands `config` to the caller through `out`.
///
/// # Safety
/// Unless null, `out` is writable.
unsafe fn give(config: Config, out: *mut *mut microrep_config) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::invalid("out is null"));
    }
    let handle = Box::into_raw(Box::new(microrep_config { config }));
    // SAFETY: `out` is non-null and writable (the caller's contract).
    unsafe { write_out(out, handle, "out") }
}

/// Parses TOML `toml` (the format of docs/CONFIG.md) into `*out`.
///
/// # Safety
/// `toml` is a NUL-terminated string; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_config_parse(toml: *const c_char, out: *mut *mut microrep_config) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let text = unsafe { str_arg(toml, "toml") }?;
        let config = Config::parse(text, &[]).map_err(config_error)?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { give(config, out) }
    })
}

/// Reads the TOML file at `path` into `*out`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_config_load(path: *const c_char, out: *mut *mut microrep_config) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        let config = Config::load(path.as_ref(), &[]).map_err(config_error)?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { give(config, out) }
    })
}

/// A cluster of `replicas` members on the shm fabric of this host (directory
/// `/dev/shm/microrep-NAME` unless `cluster.shm_dir` is set), with defaults for every other
/// key; this node is member 0 (set `node.id` for the others).
///
/// # Safety
/// `name` is a NUL-terminated string; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_config_local(
    name: *const c_char,
    replicas: u16,
    out: *mut *mut microrep_config,
) -> microrep_status {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let name = unsafe { str_arg(name, "name") }?;
        let config = Config { cluster: ClusterConfig::local(name, replicas, 6380), node: NodeConfig::new(0) };
        config.validate().map_err(config_error)?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { give(config, out) }
    })
}

/// Sets the dotted `key` to `value` (TOML syntax, `3`, `true`, `"x"`, or a bare string), as
/// `microrep node --set key=value` does. On error the configuration is unchanged.
///
/// # Safety
/// `config` is a live handle; `key` and `value` are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_config_set(
    config: *mut microrep_config,
    key: *const c_char,
    value: *const c_char,
) -> microrep_status {
    guard(|| {
        // SAFETY: a live handle or null (the caller's contract).
        let handle = unsafe { config.as_mut() }.ok_or_else(|| Error::invalid("config is null"))?;
        // SAFETY: forwarded from the caller's contract.
        let (key, value) = unsafe { (str_arg(key, "key")?, str_arg(value, "value")?) };
        let set = Config::parse(&handle.config.to_toml(), &[format!("{key}={value}")]).map_err(config_error)?;
        handle.config = set;
        Ok(())
    })
}

/// The configuration as TOML text, NUL-terminated, into `*out` (free with
/// `microrep_buffer_free`).
///
/// # Safety
/// `config` is a live handle; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_config_to_toml(
    config: *const microrep_config,
    out: *mut microrep_buffer,
) -> microrep_status {
    guard(|| {
        // SAFETY: a live handle or null (the caller's contract).
        let handle = unsafe { config.as_ref() }.ok_or_else(|| Error::invalid("config is null"))?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { write_out(out, microrep_buffer::from_text(handle.config.to_toml()), "out") }
    })
}

/// Frees `config` (null is ignored). Nodes started from it keep their own copy.
///
/// # Safety
/// `config` is null or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_config_free(config: *mut microrep_config) {
    if !config.is_null() {
        // SAFETY: a handle from `give`'s `Box::into_raw`, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(config) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::microrep_last_error;
    use std::ffi::CStr;

    fn last_error() -> String {
        // SAFETY: microrep_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(microrep_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_local_config_takes_settings_and_refuses_bad_ones_by_key() {
        let mut c = std::ptr::null_mut();
        // SAFETY: valid strings and out-pointers; `c` is freed once at the end.
        unsafe {
            assert_eq!(microrep_config_local(c"capi-unit".as_ptr(), 3, &mut c), microrep_status::MICROREP_OK);
            assert_eq!(microrep_config_set(c, c"node.id".as_ptr(), c"2".as_ptr()), microrep_status::MICROREP_OK);
            assert_eq!((*c).config.node.id, 2);
            let status = microrep_config_set(c, c"node.id".as_ptr(), c"7".as_ptr());
            assert_eq!(status, microrep_status::MICROREP_CONFIG);
            assert_eq!(last_error(), "invalid configuration: node.id: is 7; the cluster has members 0..3");
            assert_eq!((*c).config.node.id, 2, "a refused setting leaves the config unchanged");
            let mut text = microrep_buffer::EMPTY;
            assert_eq!(microrep_config_to_toml(c, &mut text), microrep_status::MICROREP_OK);
            let toml = CStr::from_ptr(text.data.cast()).to_str().expect("utf8").to_owned();
            crate::bytes::microrep_buffer_free(&mut text);
            let mut parsed = std::ptr::null_mut();
            let cs = std::ffi::CString::new(toml).expect("no NUL");
            assert_eq!(microrep_config_parse(cs.as_ptr(), &mut parsed), microrep_status::MICROREP_OK);
            assert_eq!((*parsed).config, (*c).config);
            microrep_config_free(parsed);
            microrep_config_free(c);
        }
    }

    #[test]
    fn parse_errors_and_missing_files_say_what_is_wrong() {
        let mut c = std::ptr::null_mut();
        // SAFETY: valid strings and out-pointers; nothing is allocated on these failures.
        unsafe {
            assert_eq!(
                microrep_config_parse(c"[cluster]\nname = 3".as_ptr(), &mut c),
                microrep_status::MICROREP_CONFIG
            );
            assert!(last_error().contains("line 2, column 8"), "{}", last_error());
            let status = microrep_config_load(c"/nonexistent/microrep.toml".as_ptr(), &mut c);
            assert_eq!(status, microrep_status::MICROREP_CONFIG);
            assert!(last_error().contains("cannot read /nonexistent/microrep.toml"), "{}", last_error());
            assert_eq!(microrep_config_parse(std::ptr::null(), &mut c), microrep_status::MICROREP_INVALID_ARGUMENT);
            assert_eq!(last_error(), "toml is null");
        }
        assert!(c.is_null());
    }
}
