//! The demo load of `microrep cluster up`: RESP clients writing unique keys, incrementing a
//! shared counter and reading their own writes, with the checks that nothing acknowledged was
//! lost.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep_kv::client::Value;
use microrep_kv::session::{Executed, Session};

/// How a command ended, for the load: a reply (application errors included) or unknown.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Reply(Value),
    Unknown,
}

/// Runs `args` on the leader within `timeout`. A command certainly refused is sent again
/// until the deadline (it did not execute), unless the refusal is an application error, which
/// is the command's reply.
fn call(session: &mut Session, args: &[&[u8]], timeout: Duration) -> Result<Outcome, LoadError> {
    let deadline = Instant::now() + timeout;
    loop {
        match session.execute(args, deadline) {
            Executed::Done(value) => return Ok(Outcome::Reply(value)),
            Executed::Unknown(_) => return Ok(Outcome::Unknown),
            Executed::Failed(text) if text.starts_with("ERR ") => return Ok(Outcome::Reply(Value::Error(text))),
            Executed::Failed(_) if Instant::now() < deadline => {}
            Executed::Failed(why) => return Err(LoadError::NoLeader { timeout, why }),
        }
    }
}

/// Why the demo load failed, or found a write lost.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// Commands were refused until the deadline; `why` is the session's last refusal.
    #[error("no leader answered within {timeout:?}: {why}")]
    NoLeader { timeout: Duration, why: String },
    #[error("unexpected reply to {command}: {outcome:?}")]
    Unexpected { command: &'static str, outcome: Outcome },
    /// A read did not return what was acknowledged.
    #[error("{what}: expected {want:?}, got {got:?}")]
    Mismatch { what: String, want: Value, got: Value },
    #[error("GET counter: {0}")]
    Counter(std::num::ParseIntError),
    #[error("counter is {counter}, but {acked} INCRs were acknowledged and {unknown} had unknown outcomes")]
    Increments { counter: u64, acked: u64, unknown: u64 },
    #[error("interrupted")]
    Interrupted,
    #[error("a client panicked")]
    Panicked,
    #[error("recording a latency: {0}")]
    Record(#[from] hdrhistogram::RecordError),
    #[error("adding the clients' latencies: {0}")]
    Add(#[from] hdrhistogram::AdditionError),
}

/// What the clients saw.
#[derive(Debug)]
pub(crate) struct LoadReport {
    latency: Histogram<u64>,
    elapsed: Duration,
    /// Keys written and acknowledged, with their values.
    acked: Vec<(String, String)>,
    incr_acked: u64,
    incr_unknown: u64,
    unknown: u64,
    moves: u64,
}

/// The member that answers as leader, found by following redirects.
/// DBSIZE only reads, so an unknown outcome (leadership moved mid-call) is simply asked again.
pub(crate) fn find_leader(members: &[SocketAddr], timeout: Duration) -> Result<usize, LoadError> {
    let deadline = Instant::now() + timeout;
    let mut session = Session::new(members.to_vec(), 0);
    match read(&mut session, &[b"DBSIZE"], deadline.saturating_duration_since(Instant::now()))? {
        Outcome::Reply(Value::Integer(_)) => Ok(session.current()),
        outcome => Err(LoadError::Unexpected { command: "DBSIZE", outcome }),
    }
}

/// Calls a command that only reads, asking again while its outcome is unknown (leadership moved
/// mid-call), until `timeout`.
fn read(session: &mut Session, args: &[&[u8]], timeout: Duration) -> Result<Outcome, LoadError> {
    let deadline = Instant::now() + timeout;
    loop {
        match call(session, args, timeout)? {
            Outcome::Unknown if Instant::now() < deadline => std::thread::yield_now(),
            outcome => return Ok(outcome),
        }
    }
}

fn expect(what: impl FnOnce() -> String, got: Value, want: Value) -> Result<(), LoadError> {
    if got == want { Ok(()) } else { Err(LoadError::Mismatch { what: what(), want, got }) }
}

/// One client's share of the load.
fn client(
    members: &[SocketAddr],
    id: u16,
    ops: u64,
    done: &AtomicU64,
    stop: &AtomicBool,
) -> Result<LoadReport, LoadError> {
    let mut session = Session::new(members.to_vec(), 0);
    let timeout = Duration::from_secs(30);
    let mut r = LoadReport::new();
    let mut last_set: Option<(String, String, bool)> = None;
    for j in 0..ops {
        if stop.load(Ordering::Acquire) {
            return Err(LoadError::Interrupted);
        }
        let start = Instant::now();
        let outcome = match j % 4 {
            2 => {
                let o = call(&mut session, &[b"INCR", b"counter"], timeout)?;
                match &o {
                    Outcome::Reply(Value::Integer(_)) => r.incr_acked += 1,
                    Outcome::Unknown => r.incr_unknown += 1,
                    Outcome::Reply(_) => return Err(LoadError::Unexpected { command: "INCR", outcome: o }),
                }
                o
            }
            3 => match &last_set {
                Some((key, value, acked)) => {
                    let o = call(&mut session, &[b"GET", key.as_bytes()], timeout)?;
                    if let (Outcome::Reply(got), true) = (&o, acked) {
                        // Linearizability: a read after an acknowledged write sees it.
                        let want = Value::Bulk(Some(value.clone().into_bytes()));
                        expect(|| format!("GET {key}"), got.clone(), want)?;
                    }
                    o
                }
                None => call(&mut session, &[b"PING"], timeout)?,
            },
            _ => {
                let (key, value) = (format!("c{id}:{j}"), format!("v{j}"));
                let o = call(&mut session, &[b"SET", key.as_bytes(), value.as_bytes()], timeout)?;
                let acked = o == Outcome::Reply(Value::Simple("OK".into()));
                if acked {
                    r.acked.push((key.clone(), value.clone()));
                }
                last_set = Some((key, value, acked));
                o
            }
        };
        if outcome == Outcome::Unknown {
            r.unknown += 1;
        } else {
            r.latency.record(start.elapsed().as_nanos().max(1) as u64)?;
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    r.moves = session.moves();
    Ok(r)
}

/// Runs `ops` commands from `clients` concurrent clients.
pub(crate) fn run(
    members: &[SocketAddr],
    ops: u64,
    clients: u16,
    done: &AtomicU64,
    stop: &AtomicBool,
) -> Result<LoadReport, LoadError> {
    let started = Instant::now();
    let reports: Vec<Result<LoadReport, LoadError>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..clients)
            .map(|id| {
                let share = ops / u64::from(clients) + u64::from(u64::from(id) < ops % u64::from(clients));
                s.spawn(move || client(members, id, share, done, stop))
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(Err(LoadError::Panicked))).collect()
    });
    let mut total = LoadReport::new();
    for r in reports {
        let r = r?;
        total.latency.add(&r.latency)?;
        total.acked.extend(r.acked);
        total.incr_acked += r.incr_acked;
        total.incr_unknown += r.incr_unknown;
        total.unknown += r.unknown;
        total.moves += r.moves;
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

impl LoadReport {
    fn new() -> Self {
        Self {
            latency: microrep_testkit::hist::latency_ns(),
            elapsed: Duration::ZERO,
            acked: Vec::new(),
            incr_acked: 0,
            incr_unknown: 0,
            unknown: 0,
            moves: 0,
        }
    }

    /// Prints throughput and latency percentiles.
    pub(crate) fn print(&self) {
        let n = self.latency.len();
        let us = |q: f64| self.latency.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "done: {n} commands answered in {:.2} s ({:.0}/s); latency at the client p50 {:.1} us, p99 {:.1} us, \
             p99.9 {:.1} us, max {:.1} us",
            self.elapsed.as_secs_f64(),
            n as f64 / self.elapsed.as_secs_f64().max(1e-9),
            us(0.5),
            us(0.99),
            us(0.999),
            self.latency.max() as f64 / 1000.0
        );
        if self.unknown > 0 || self.moves > 0 {
            println!(
                "clients moved to another replica {} times; {} commands had an unknown outcome (leader lost mid-command)",
                self.moves, self.unknown
            );
        }
    }

    /// Reads every acknowledged key back from the leader, and checks the shared counter.
    pub(crate) fn check_reads_back(&self, members: &[SocketAddr]) -> Result<(), LoadError> {
        let mut session = Session::new(members.to_vec(), 0);
        let timeout = Duration::from_secs(30);
        for chunk in self.acked.chunks(32) {
            let mut args: Vec<&[u8]> = vec![b"MGET"];
            args.extend(chunk.iter().map(|(k, _)| k.as_bytes()));
            let values = match read(&mut session, &args, timeout)? {
                Outcome::Reply(Value::Array(Some(values))) => values,
                outcome => return Err(LoadError::Unexpected { command: "MGET of acknowledged keys", outcome }),
            };
            for ((key, want), got) in chunk.iter().zip(values) {
                let want = Value::Bulk(Some(want.clone().into_bytes()));
                expect(|| format!("acknowledged write of {key}"), got, want)?;
            }
        }
        let counter = match read(&mut session, &[b"GET", b"counter"], timeout)? {
            Outcome::Reply(Value::Bulk(Some(v))) => {
                String::from_utf8_lossy(&v).parse::<u64>().map_err(LoadError::Counter)?
            }
            Outcome::Reply(Value::Bulk(None)) => 0,
            outcome => return Err(LoadError::Unexpected { command: "GET counter", outcome }),
        };
        if counter < self.incr_acked || counter > self.incr_acked + self.incr_unknown {
            return Err(LoadError::Increments { counter, acked: self.incr_acked, unknown: self.incr_unknown });
        }
        println!(
            "checked: all {} acknowledged writes read back; counter {counter} = {} acknowledged INCRs (+{} unknown)",
            self.acked.len(),
            self.incr_acked,
            counter - self.incr_acked
        );
        Ok(())
    }
}
