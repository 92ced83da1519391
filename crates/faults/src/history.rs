//! The client history, in the JSON format `tools/linearizability` reads (its README.md
//! documents every field).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::artifact::WriteError;

/// The operation a client invoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OpKind {
    Get,
    Set,
    Incr,
    Append,
    Del,
}

/// What the client learnt about an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Outcome {
    /// It took effect; `result` is the reply.
    Ok,
    /// It certainly did not take effect.
    Fail,
    /// Unknown: it may take effect at any time after its call.
    Info,
}

/// One operation of the history.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct OpRecord {
    pub(crate) client: usize,
    pub(crate) op: OpKind,
    pub(crate) key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) arg: Option<String>,
    pub(crate) call_ns: u64,
    pub(crate) return_ns: u64,
    pub(crate) outcome: Outcome,
    /// `get`: string or null; `incr`/`append`/`del`: integer; `set`: "OK".
    pub(crate) result: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// The harness's one monotonic clock: nanoseconds since the history began.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }

    pub(crate) fn now_ns(self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Counts of a history's operations by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct OutcomeCounts {
    pub(crate) ok: u64,
    pub(crate) fail: u64,
    pub(crate) info: u64,
}

impl OutcomeCounts {
    pub(crate) fn of(ops: &[OpRecord]) -> Self {
        let mut c = Self::default();
        for op in ops {
            match op.outcome {
                Outcome::Ok => c.ok += 1,
                Outcome::Fail => c.fail += 1,
                Outcome::Info => c.info += 1,
            }
        }
        c
    }

    pub(crate) fn total(self) -> u64 {
        self.ok + self.fail + self.info
    }
}

/// Writes `ops` as the checker's JSON document.
pub(crate) fn write(path: &Path, ops: &[OpRecord]) -> Result<(), WriteError> {
    #[derive(Serialize)]
    struct Doc<'a> {
        operations: &'a [OpRecord],
    }
    let file = std::fs::File::create(path).map_err(WriteError::at(path))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut out, &Doc { operations: ops })
        .map_err(std::io::Error::from)
        .map_err(WriteError::at(path))?;
    std::io::Write::flush(&mut out).map_err(WriteError::at(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_in_the_checker_format() {
        let op = OpRecord {
            client: 3,
            op: OpKind::Append,
            key: "a0".into(),
            arg: Some("x".into()),
            call_ns: 5,
            return_ns: 9,
            outcome: Outcome::Ok,
            result: serde_json::json!(4),
            error: None,
        };
        let text = serde_json::to_string(&op).expect("serialisable");
        assert_eq!(
            text,
            r#"{"client":3,"op":"append","key":"a0","arg":"x","call_ns":5,"return_ns":9,"outcome":"ok","result":4}"#
        );
    }
}
