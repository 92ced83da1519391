//! `microrep demo`: two processes on the shm fabric. A *target* registers a log region; this
//! process, the *writer*, appends checksummed entries into it with one-sided WRITEs, the way a
//! Mu leader appends to a follower's log. The demo walks through the fabric contract: no write
//! without a grant, fast writes once granted, a revoke that stops the writer, a crash that
//! surfaces as error completions.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use microrep_fabric::shm::{ShmConfig, ShmFabric};
use microrep_fabric::{
    Endpoint, Fabric, FabricError, NodeId, OpError, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite,
};
use microrep_testkit::KitError;
use microrep_testkit::child::Guarded;
use microrep_testkit::scratch::ScratchDir;

const LOG: RegionId = RegionId(0);
const SLOT_BYTES: usize = 64;
const SLOTS: u64 = 4096;
const TARGET: NodeId = NodeId(0);
const WRITER: NodeId = NodeId(1);

/// Arguments of `microrep demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Log entries to append.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    entries: u64,
    /// Cluster directory (default: a fresh one under /dev/shm, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Arguments of the hidden target process.
#[derive(Debug, clap::Args)]
pub(crate) struct TargetArgs {
    #[arg(long)]
    dir: PathBuf,
}

fn regions() -> [RegionSpec; 1] {
    [RegionSpec::new(LOG, SLOTS * SLOT_BYTES as u64, RemoteWrite::Granted)]
}

/// A log slot: sequence number, checksum over (sequence, payload), payload.
fn encode_slot(seq: u64) -> [u8; SLOT_BYTES] {
    let mut slot = [0u8; SLOT_BYTES];
    slot[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in slot[12..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    let crc = microrep_fabric::checksum::crc32c_append(microrep_fabric::checksum::crc32c(&slot[..8]), &slot[12..]);
    slot[8..12].copy_from_slice(&crc.to_le_bytes());
    slot
}

fn decode_slot(slot: &[u8]) -> Option<u64> {
    let seq = u64::from_le_bytes(slot[..8].try_into().ok()?);
    let crc = u32::from_le_bytes(slot[8..12].try_into().ok()?);
    (microrep_fabric::checksum::crc32c_append(microrep_fabric::checksum::crc32c(&slot[..8]), &slot[12..]) == crc)
        .then_some(seq)
}

/// Why the demo (or its target process) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The scratch directory could not be made.
    #[error(transparent)]
    Kit(#[from] KitError),
    /// The target's stdin or stdout (its command channel) failed.
    #[error("the target's command channel: {0}")]
    Channel(std::io::Error),
    #[error("locating microrep: {0}")]
    LocateExe(std::io::Error),
    #[error("the target process: {0}")]
    SpawnTarget(KitError),
    #[error("the target process has no piped {0}")]
    NoPipe(&'static str),
    #[error("target failed to start: {0}")]
    TargetNotReady(String),
    #[error("the target process exited")]
    TargetExited,
    /// The target answered a command with an error line.
    #[error("the target refused {command:?}: {answer}")]
    Refused { command: String, answer: String },
    #[error("no completion, though the shm fabric completes writes at once")]
    NoCompletion,
    #[error("recording a latency: {0}")]
    Record(#[from] hdrhistogram::RecordError),
    #[error("write {seq} failed: {source}")]
    Write { seq: u64, source: OpError },
    #[error("a write after the revoke was not refused")]
    NotRevoked,
    #[error("killing the target: {0}")]
    Kill(std::io::Error),
    #[error("reconnecting to a dead target succeeded")]
    ReconnectedToDead,
}

/// The target process: registers the log and obeys `grant`, `revoke`, `verify N`, `quit`.
pub(crate) fn run_target(args: &TargetArgs) -> Result<(), DemoError> {
    let fabric = ShmFabric::start(ShmConfig::new(&args.dir, TARGET, 2, &regions()))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut reply = |line: String| writeln!(out, "{line}").and_then(|()| out.flush()).map_err(DemoError::Channel);
    reply("ready".into())?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(DemoError::Channel)?;
        let mut words = line.split_whitespace();
        let answer = match words.next() {
            Some("grant") => fabric.grant_write(LOG, WRITER).map(|()| "ok".to_string()),
            Some("revoke") => fabric.revoke_write(LOG, WRITER).map(|path| format!("ok {path:?}")),
            Some("verify") => {
                let written: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let mut buf = vec![0u8; (SLOTS as usize) * SLOT_BYTES];
                fabric.read_local(LOG, 0, &mut buf).map(|()| {
                    let (mut good, mut bad) = (0, 0);
                    for (index, slot) in buf.chunks_exact(SLOT_BYTES).enumerate() {
                        let index = index as u64;
                        match decode_slot(slot) {
                            Some(seq) if seq % SLOTS == index && seq < written => good += 1,
                            // Slots never written stay zero.
                            None if index >= written && slot.iter().all(|&b| b == 0) => {}
                            _ => bad += 1,
                        }
                    }
                    format!("ok {good} {bad}")
                })
            }
            Some("quit") | None => break,
            Some(other) => Ok(format!("err unknown command {other}")),
        };
        reply(answer.unwrap_or_else(|e| format!("err {e}")))?;
    }
    Ok(())
}

/// The target child process, killed and reaped if the demo stops early.
struct Target {
    child: Guarded,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn spawn(dir: &std::path::Path) -> Result<Self, DemoError> {
        let exe = std::env::current_exe().map_err(DemoError::LocateExe)?;
        let mut command = Command::new(exe);
        command.arg("demo-target").arg("--dir").arg(dir).stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = Guarded::spawn(&mut command, Duration::ZERO).map_err(DemoError::SpawnTarget)?;
        let stdin = child.child().stdin.take().ok_or(DemoError::NoPipe("stdin"))?;
        let stdout = BufReader::new(child.child().stdout.take().ok_or(DemoError::NoPipe("stdout"))?);
        let mut target = Self { child, stdin, stdout };
        match target.read_line()? {
            line if line == "ready" => Ok(target),
            other => Err(DemoError::TargetNotReady(other)),
        }
    }

    fn read_line(&mut self) -> Result<String, DemoError> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(DemoError::Channel)?;
        if line.is_empty() {
            return Err(DemoError::TargetExited);
        }
        Ok(line.trim_end().to_string())
    }

    fn call(&mut self, command: &str) -> Result<String, DemoError> {
        writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush()).map_err(DemoError::Channel)?;
        let line = self.read_line()?;
        match line.strip_prefix("ok") {
            Some(rest) => Ok(rest.trim().to_string()),
            None => Err(DemoError::Refused { command: command.to_string(), answer: line }),
        }
    }
}

fn write_slot<E: Endpoint>(ep: &mut E, seq: u64) -> Result<Result<(), OpError>, DemoError> {
    let offset = (seq % SLOTS) * SLOT_BYTES as u64;
    ep.post_write(seq, RemoteAddr::new(LOG, offset), &encode_slot(seq), PostFlags::SIGNALED)?;
    ep.poll_completion().map(|c| c.status).ok_or(DemoError::NoCompletion)
}

/// Runs the demo.
pub(crate) fn run(args: &DemoArgs) -> Result<(), DemoError> {
    let Some(dir) = &args.dir else {
        let scratch = ShmConfig::default_dir(&format!("demo-{}", std::process::id()));
        let scratch = ScratchDir::new(scratch)?;
        return demo(args, scratch.path());
    };
    let removed = ShmFabric::remove_stale(dir)?;
    if removed > 0 {
        println!("removed {removed} stale segment(s) from {}", dir.display());
    }
    demo(args, dir)
}

fn demo(args: &DemoArgs, dir: &std::path::Path) -> Result<(), DemoError> {
    println!("microrep fabric demo: shm backend, cluster directory {}", dir.display());
    let mut target = Target::spawn(dir)?;
    let writer = ShmFabric::start(ShmConfig::new(dir, WRITER, 2, &[]))?;
    let mut ep = writer.connect(TARGET)?;
    println!(
        "  target pid {} holds a {} KiB log; writer is this process",
        target.child.child().id(),
        SLOTS * 64 / 1024
    );

    println!("1. write before any grant");
    println!("   -> {:?} (a stale leader cannot write)", write_slot(&mut ep, 0)?);
    ep.reconnect()?;

    target.call("grant")?;
    println!("2. target grants write access; appending {} entries of {SLOT_BYTES} B", args.entries);
    let clock = quanta::Clock::new();
    let mut latency = microrep_testkit::hist::latency_ns();
    let started = Instant::now();
    for seq in 0..args.entries {
        let t0 = clock.raw();
        let status = write_slot(&mut ep, seq)?;
        latency.record(clock.delta_as_nanos(t0, clock.raw()).max(1))?;
        status.map_err(|source| DemoError::Write { seq, source })?;
        if (seq + 1) % (args.entries / 4).max(1) == 0 {
            println!("   {:>3}% written", (seq + 1) * 100 / args.entries);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "   write latency p50 {} ns, p99 {} ns, p99.9 {} ns; {:.1} M writes/s",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.value_at_quantile(0.999),
        args.entries as f64 / secs / 1e6
    );
    let verified = target.call(&format!("verify {}", args.entries))?;
    println!("3. target checks every slot's checksum: {verified} (valid, corrupt)");

    println!("4. target revokes write access: {}", target.call("revoke")?);
    let after = write_slot(&mut ep, args.entries)?;
    println!("   next write -> {after:?}; target re-checks: {}", target.call(&format!("verify {}", args.entries))?);
    if after != Err(OpError::PermissionDenied) {
        return Err(DemoError::NotRevoked);
    }

    target.call("grant")?;
    ep.reconnect()?;
    println!("5. target grants again, then crashes (SIGKILL)");
    target.child.child().kill().map_err(DemoError::Kill)?;
    target.child.child().wait().map_err(DemoError::Kill)?;
    // The writer learns of the death from its watcher thread (pidfd); wait for that, bounded.
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = write_slot(&mut ep, args.entries + 1)?;
        if status.is_err() || Instant::now() > deadline {
            break status;
        }
        std::thread::yield_now();
    };
    println!("   next write -> {status:?}");
    match ep.reconnect() {
        Ok(()) => return Err(DemoError::ReconnectedToDead),
        Err(e) => println!("   reconnect -> {e}"),
    }
    println!("done.");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_detect_corruption() {
        let mut slot = encode_slot(12345);
        assert_eq!(decode_slot(&slot), Some(12345));
        slot[40] ^= 1;
        assert_eq!(decode_slot(&slot), None);
        assert_eq!(decode_slot(&[0u8; SLOT_BYTES]), None, "an empty slot is not a valid entry");
    }
}
