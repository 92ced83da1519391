//! perftest's latency tools (`ib_write_lat`, `ib_read_lat`) as baselines for benchmarks: server
//! and client on the same device over loopback, the way the verbs benchmarks compare themselves.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// perftest's figures for one run, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerftestLatency {
    /// `t_typical`, perftest's median.
    pub p50_ns: u64,
    /// perftest's 99% percentile.
    pub p99_ns: u64,
    /// perftest's 99.9% percentile.
    pub p999_ns: u64,
    /// Iterations measured.
    pub iterations: u64,
}

/// Why perftest gave no figures.
#[derive(Debug, thiserror::Error)]
pub enum PerftestError {
    /// The tool could not be started.
    #[error("{tool}: {source} (is perftest installed?)")]
    Spawn {
        /// The tool.
        tool: String,
        /// Why.
        source: std::io::Error,
    },
    /// The client exited successfully but printed no result line for the size.
    #[error("{0}: no result line")]
    NoResult(String),
    /// The client failed, or hung and was killed, for 20 s of retries.
    #[error("{0} client failed or hung")]
    ClientFailed(String),
}

/// Runs `tool` (e.g. `ib_write_lat`) on `device` with RoCE GID `gid_index` for `size`-byte
/// messages and `iters` iterations, server and client in this host, and parses the client's
/// result line. Bounded: the client is retried for up to 20 s while the server starts
/// listening, each process is killed if it runs past 60 s (perftest's server can hang on
/// soft-RoCE when the client's last packet is lost).
pub fn perftest_latency(
    tool: &str,
    device: &str,
    gid_index: u8,
    size: usize,
    iters: usize,
) -> Result<PerftestLatency, PerftestError> {
    let args = ["-d", device, "-x", &gid_index.to_string(), "-s", &size.to_string(), "-n", &iters.to_string()];
    let spawn = |client: bool| {
        let mut command = Command::new(tool);
        command.args(args).stderr(Stdio::null()).stdout(if client { Stdio::piped() } else { Stdio::null() });
        if client {
            command.arg("127.0.0.1");
        }
        command.spawn().map_err(|source| PerftestError::Spawn { tool: tool.to_string(), source })
    };
    let mut server = spawn(false)?;
    let started = Instant::now();
    let result = loop {
        let mut client = spawn(true)?;
        let status = finish(&mut client, Duration::from_secs(60));
        if status == Some(true) {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut client.stdout.take().expect("piped"), &mut text);
            break parse(&text, size).ok_or_else(|| PerftestError::NoResult(tool.to_string()));
        }
        if status.is_none() || started.elapsed() > Duration::from_secs(20) {
            break Err(PerftestError::ClientFailed(tool.to_string()));
        }
        // The server is not listening yet: a control-path retry, bounded above.
        std::thread::sleep(Duration::from_millis(200));
    };
    finish(&mut server, Duration::from_secs(10));
    result
}

/// Waits up to `limit` for `child`, killing it past that: `Some(success)` if it exited.
fn finish(child: &mut Child, limit: Duration) -> Option<bool> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status.success()),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The figures of the result line: `#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%`.
fn parse(text: &str, size: usize) -> Option<PerftestLatency> {
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(size.to_string().as_str()))?;
    let f: Vec<f64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let ns = |us: f64| (us * 1000.0) as u64;
    (f.len() >= 9).then(|| PerftestLatency {
        p50_ns: ns(f[4]),
        p99_ns: ns(f[7]),
        p999_ns: ns(f[8]),
        iterations: f[1] as u64,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_perftest_result_line() {
        let text = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 8       200          25.71          230.35       30.49    	       36.77       	19.61  		230.35  		231.00 \n";
        let got = super::parse(text, 8).expect("parsed");
        assert_eq!((got.p50_ns, got.p99_ns, got.p999_ns, got.iterations), (30_490, 230_350, 231_000, 200));
        assert!(super::parse(text, 64).is_none());
    }
}
