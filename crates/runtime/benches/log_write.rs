//! The durable log's group commit, timed five ways in one run: `pwrite` + `fdatasync` (what the
//! writer does) next to io_uring (a write linked to a data sync, one `io_uring_enter`), with and
//! without a registered file, and the two one-call forms of "write, then sync its data"
//! (`RWF_DSYNC`), with and without io_uring (issue 19 §2: does io_uring pay here?).
//!
//! ```text
//! cargo bench -p microrep --bench log_write -- [--seconds S] [--tmpfs DIR] [--disk DIR]
//!     [--records 1,8,64] [--sizes 64,1024] [--json]
//!     [--methods pwrite,pwritev2-dsync,uring,uring-fixed,uring-dsync]
//! ```
//!
//! `--seconds` is per method and point (default 2); `--tmpfs` defaults to `/dev/shm`, `--disk`
//! to the temporary directory (the filesystem of each is printed: check it is a real disk's).
//!
//! Each group commit appends N records of S payload bytes (a 40-byte header and the payload
//! padded to 8 bytes each, as `durable::record` lays them out) at the end of a growing file in ONE
//! write, then syncs the file's data; the next commit starts only after the sync returned, as in
//! `durable::writer`. A sample is one commit, write + sync, timed with the TSC clock into an
//! HdrHistogram; a commit whose write or sync failed is recorded too and counted as failed. Every
//! commit is a sample (no warm-up is dropped). Each method appends to its own file; a file that
//! reaches 64 MiB is truncated to empty and synced, untimed (the writer starts a new segment at a
//! checkpoint). "commits/s" is samples over the summed commit time (one commit at a time).
//!
//! - `pwrite`: `FileExt::write_all_at` + `File::sync_data` (two syscalls).
//! - `uring`: a `Write` entry with `IO_LINK` and an `Fsync` entry with `DATASYNC`, pushed
//!   together, one `submit_and_wait(2)` (one syscall, unless interrupted).
//! - `uring-fixed`: the same with the file registered (`register_files`, `types::Fixed`).
//! - `pwritev2-dsync`: one `pwritev2(RWF_DSYNC)` (the write is durable on return, as after
//!   `fdatasync`): one syscall without io_uring.
//! - `uring-dsync`: one `Write` entry with `RWF_DSYNC`, one `submit_and_wait(1)`.
//!
//! "vcs/commit" is the benchmarking thread's voluntary context switches per commit
//! (`/proc/thread-self/status`, read around each block): how often a commit put it to sleep.
//!
//! For every (directory, records, size) point the methods alternate in ten blocks of S/10 seconds
//! each, the first method rotating from block to block, so that machine drift hits all alike. The
//! files live in a `log-write-<pid>` directory made inside each directory given and removed at the
//! end. If an io_uring cannot be set up (EPERM, ENOSYS: a kernel or a container without it), its
//! rows say so with the error and `pwrite` is measured alone.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use io_uring::{IoUring, opcode, squeue, types};
use rustix::io::{Errno, ReadWriteFlags};

const BLOCKS: usize = 10;
const HEADER_BYTES: usize = 40;
const SEGMENT_BYTES: u64 = 64 << 20;
const WRITE: u64 = 1;
const SYNC: u64 = 2;

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

/// How a group commit reaches the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Pwrite,
    PwriteDsync,
    Uring,
    UringFixed,
    UringDsync,
}

impl Method {
    const ALL: [Self; 5] = [Self::Pwrite, Self::PwriteDsync, Self::Uring, Self::UringFixed, Self::UringDsync];

    fn name(self) -> &'static str {
        match self {
            Self::Pwrite => "pwrite",
            Self::PwriteDsync => "pwritev2-dsync",
            Self::Uring => "uring",
            Self::UringFixed => "uring-fixed",
            Self::UringDsync => "uring-dsync",
        }
    }

    fn parse(name: &str) -> Self {
        Self::ALL.into_iter().find(|m| m.name() == name).unwrap_or_else(|| panic!("unknown method {name:?}"))
    }

    fn uses_ring(self) -> bool {
        matches!(self, Self::Uring | Self::UringFixed | Self::UringDsync)
    }
}

/// One method's file, ring (for io_uring) and results at one point.
struct Lane {
    method: Method,
    file: File,
    ring: Option<IoUring>,
    len: u64,
    index: u64,
    hist: Histogram<u64>,
    failed: u64,
    /// Summed commit time, ns.
    busy_ns: u64,
    /// Voluntary context switches of this thread during this lane's blocks.
    switches: u64,
    /// Why the method could not run here, if it could not.
    unavailable: Option<String>,
}

impl Lane {
    fn new(method: Method, path: &Path) -> Self {
        let file = File::options().read(true).write(true).create(true).truncate(true).open(path).unwrap();
        let mut lane = Self {
            method,
            file,
            ring: None,
            len: 0,
            index: 0,
            hist: hist(),
            failed: 0,
            busy_ns: 0,
            switches: 0,
            unavailable: None,
        };
        if method.uses_ring() {
            match IoUring::new(8) {
                Ok(ring) => {
                    if method == Method::UringFixed
                        && let Err(e) = ring.submitter().register_files(&[lane.file.as_raw_fd()])
                    {
                        lane.unavailable = Some(format!("register_files: {e}"));
                    }
                    lane.ring = Some(ring);
                }
                Err(e) => lane.unavailable = Some(format!("io_uring_setup: {e}")),
            }
        }
        lane
    }

    /// One group commit of `buf` at the end of the file: written whole, then synced.
    fn commit(&mut self, buf: &[u8]) -> io::Result<()> {
        let (raw, len) = (self.file.as_raw_fd(), buf.len() as u32);
        let dsync = ReadWriteFlags::DSYNC.bits() as i32;
        let ring = self.ring.as_mut();
        match (self.method, ring) {
            (Method::Pwrite, _) => {
                self.file.write_all_at(buf, self.len)?;
                self.file.sync_data()
            }
            (Method::PwriteDsync, _) => {
                let n = rustix::io::pwritev2(&self.file, &[io::IoSlice::new(buf)], self.len, ReadWriteFlags::DSYNC)?;
                if n == buf.len() { Ok(()) } else { Err(short(n as i32, buf.len())) }
            }
            (Method::Uring, Some(ring)) => {
                let fd = types::Fd(raw);
                let write = opcode::Write::new(fd, buf.as_ptr(), len).offset(self.len).build();
                let sync = opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build();
                uring_commit(ring, write, Some(sync), buf.len())
            }
            (Method::UringFixed, Some(ring)) => {
                let fd = types::Fixed(0);
                let write = opcode::Write::new(fd, buf.as_ptr(), len).offset(self.len).build();
                let sync = opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build();
                uring_commit(ring, write, Some(sync), buf.len())
            }
            (Method::UringDsync, Some(ring)) => {
                let write =
                    opcode::Write::new(types::Fd(raw), buf.as_ptr(), len).offset(self.len).rw_flags(dsync).build();
                uring_commit(ring, write, None, buf.len())
            }
            (_, None) => Err(io::Error::other("no ring")),
        }
    }
}

fn short(written: i32, len: usize) -> io::Error {
    io::Error::new(io::ErrorKind::WriteZero, format!("short write: {written} of {len}"))
}

/// Submits `write`, linked to `sync` if there is one, and waits for their completions. Returns
/// only once the kernel is done with the buffer the write entry points to.
fn uring_commit(ring: &mut IoUring, write: squeue::Entry, sync: Option<squeue::Entry>, len: usize) -> io::Result<()> {
    let mut entries = vec![write.user_data(WRITE)];
    if let Some(sync) = sync {
        entries[0] = entries[0].clone().flags(squeue::Flags::IO_LINK);
        entries.push(sync.user_data(SYNC));
    }
    // SAFETY: the write entry points into the caller's `buf`, which outlives this call, and this
    // call returns only after every completion was reaped (or aborts the process), so the kernel
    // never reads the buffer after it is gone. The fd, or registered file 0, stays open for as
    // long as the ring (both are owned by the same `Lane`).
    unsafe { ring.submission().push_multiple(&entries) }.expect("an empty ring of 8 has room for two entries");
    let (mut written, mut synced) = (None, if entries.len() == 1 { Some(0) } else { None });
    while written.is_none() || synced.is_none() {
        let want = usize::from(written.is_none()) + usize::from(synced.is_none());
        match ring.submit_and_wait(want) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if [Errno::BUSY, Errno::AGAIN].iter().any(|x| e.raw_os_error() == Some(x.raw_os_error())) => {}
            Err(e) => {
                // The entries may be in flight and pointing at the buffer: unwinding would free it.
                eprintln!("io_uring_enter failed with a commit in flight: {e}");
                std::process::abort();
            }
        }
        for cqe in ring.completion() {
            match cqe.user_data() {
                WRITE => written = Some(cqe.result()),
                SYNC => synced = Some(cqe.result()),
                other => unreachable!("completion of unknown entry {other}"),
            }
        }
    }
    let (written, synced) = (written.unwrap(), synced.unwrap());
    if written < 0 {
        return Err(io::Error::from_raw_os_error(-written));
    }
    if written as usize != len {
        return Err(short(written, len));
    }
    if synced < 0 {
        return Err(io::Error::from_raw_os_error(-synced));
    }
    Ok(())
}

/// Encodes `records` records of `size` payload bytes as one group-commit write starting at file
/// offset `start` with log index `index`, laid out as `durable::record` does (the checksum is
/// left zero: it costs CPU before the write, not I/O).
fn encode(buf: &mut Vec<u8>, records: usize, size: usize, start: u64, index: u64) {
    buf.clear();
    let padded = size.div_ceil(8) * 8;
    for i in 0..records {
        let at = start + buf.len() as u64;
        buf.extend_from_slice(&(size as u32).to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        buf.extend_from_slice(b"MRDL");
        buf.extend_from_slice(&[2, 0, 0, 0]);
        buf.extend_from_slice(&(index + i as u64).to_le_bytes());
        buf.extend_from_slice(&at.to_le_bytes());
        buf.extend_from_slice(&start.to_le_bytes());
        buf.extend((0..size).map(|b| (b as u8) ^ (index as u8)));
        buf.resize(buf.len() + padded - size, 0);
    }
    debug_assert_eq!(buf.len(), records * (HEADER_BYTES + padded));
}

/// Runs every lane for `seconds` in all, alternating in [`BLOCKS`] blocks.
fn run_point(lanes: &mut [Lane], records: usize, size: usize, seconds: f64, clock: &quanta::Clock) {
    let mut buf = Vec::new();
    let per_block_ns = (seconds * 1e9 / BLOCKS as f64) as u64;
    for block in 0..BLOCKS {
        for k in 0..lanes.len() {
            let lane = &mut lanes[(block + k) % lanes.len()];
            if lane.unavailable.is_some() {
                continue;
            }
            let switches = voluntary_switches();
            let begin = clock.raw();
            while clock.delta_as_nanos(begin, clock.raw()) < per_block_ns {
                if lane.len >= SEGMENT_BYTES {
                    lane.file.set_len(0).unwrap();
                    lane.file.sync_all().unwrap();
                    lane.len = 0;
                }
                encode(&mut buf, records, size, lane.len, lane.index);
                let t0 = clock.raw();
                let result = lane.commit(&buf);
                let ns = clock.delta_as_nanos(t0, clock.raw()).max(1);
                lane.hist.saturating_record(ns);
                lane.busy_ns += ns;
                match result {
                    Ok(()) => {
                        lane.len += buf.len() as u64;
                        lane.index += records as u64;
                    }
                    Err(e) => {
                        if lane.failed == 0 {
                            eprintln!("{}: commit failed: {e}", lane.method.name());
                        }
                        lane.failed += 1;
                    }
                }
            }
            lane.switches += voluntary_switches() - switches;
        }
    }
}

/// This thread's voluntary context switches so far.
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The filesystem `dir` is on, by its magic number.
fn fs_type(dir: &Path) -> String {
    match rustix::fs::statfs(dir) {
        Ok(s) => match (s.f_type as u64) & 0xffff_ffff {
            0x0102_1994 => "tmpfs".into(),
            0xef53 => "ext2/3/4".into(),
            0x5846_5342 => "xfs".into(),
            0x9123_683e => "btrfs".into(),
            0x794c_7630 => "overlayfs".into(),
            0x6969 => "nfs".into(),
            other => format!("fs magic {other:#x}"),
        },
        Err(e) => format!("statfs failed: {e}"),
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).unwrap_or_else(|e| e.to_string())
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).map(|i| args.get(i + 1).map(String::as_str).expect(name))
}

fn list<T>(args: &[String], name: &str, default: &str, parse: impl Fn(&str) -> T) -> Vec<T> {
    arg(args, name).unwrap_or(default).split(',').map(|s| parse(s.trim())).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let seconds: f64 = arg(&args, "--seconds").map_or(2.0, |s| s.parse().unwrap());
    let tmpfs = PathBuf::from(arg(&args, "--tmpfs").unwrap_or("/dev/shm"));
    let disk = arg(&args, "--disk").map_or_else(std::env::temp_dir, PathBuf::from);
    let records = list(&args, "--records", "1,8,64", |s| s.parse::<usize>().unwrap());
    let sizes = list(&args, "--sizes", "64,1024", |s| s.parse::<usize>().unwrap());
    let methods = list(&args, "--methods", "pwrite,pwritev2-dsync,uring,uring-fixed,uring-dsync", Method::parse);
    let clock = quanta::Clock::new();

    let load_before = loadavg();
    let dirs: Vec<(&str, PathBuf)> = [("tmpfs", tmpfs), ("disk", disk)]
        .into_iter()
        .map(|(label, parent)| {
            let dir = parent.join(format!("log-write-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            (label, dir)
        })
        .collect();
    if !json {
        println!("load before: {load_before}");
        for (label, dir) in &dirs {
            println!("{label}: {} ({})", dir.display(), fs_type(dir));
        }
        println!(
            "dir   recs  bytes method         commits/s    p50 us    p99 us  p99.9 us     max us  samples failed vcs/commit"
        );
    }
    for (label, dir) in &dirs {
        for &n in &records {
            for &size in &sizes {
                let mut lanes: Vec<Lane> =
                    methods.iter().map(|&m| Lane::new(m, &dir.join(format!("{}.log", m.name())))).collect();
                run_point(&mut lanes, n, size, seconds, &clock);
                for lane in &lanes {
                    report(label, n, size, lane, json);
                }
                drop(lanes);
                for m in &methods {
                    std::fs::remove_file(dir.join(format!("{}.log", m.name()))).unwrap();
                }
            }
        }
    }
    for (_, dir) in &dirs {
        std::fs::remove_dir(dir).unwrap();
    }
    let load_after = loadavg();
    if !json {
        let busy = |l: &str| l.split(' ').next().and_then(|x| x.parse::<f64>().ok()).is_some_and(|x| x > 1.5);
        let mark = if busy(&load_before) || busy(&load_after) { " (busy: 1-min load > 1.5)" } else { "" };
        println!("load after: {load_after}{mark}");
    } else {
        println!("{{\"load_before\":{load_before:?},\"load_after\":{load_after:?}}}");
    }
}

fn report(dir: &str, records: usize, size: usize, lane: &Lane, json: bool) {
    let h = &lane.hist;
    let name = lane.method.name();
    if let Some(why) = &lane.unavailable {
        if json {
            println!(
                "{{\"dir\":\"{dir}\",\"records\":{records},\"bytes\":{size},\"method\":\"{name}\",\"unavailable\":{why:?}}}"
            );
        } else {
            println!("{dir:<5} {records:>4} {size:>6} {name:<14} unavailable: {why}");
        }
        return;
    }
    let rate = if lane.busy_ns == 0 { 0.0 } else { h.len() as f64 * 1e9 / lane.busy_ns as f64 };
    if json {
        println!(
            "{{\"dir\":\"{dir}\",\"records\":{records},\"bytes\":{size},\"method\":\"{name}\",\"commits_per_s\":{rate:.0},\"p50_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{},\"samples\":{},\"failed\":{},\"voluntary_switches\":{}}}",
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            h.len(),
            lane.failed,
            lane.switches
        );
    } else {
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        println!(
            "{dir:<5} {records:>4} {size:>6} {name:<14} {rate:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>8} {:>6} {:>10.2}",
            q(0.5),
            q(0.99),
            q(0.999),
            h.max() as f64 / 1000.0,
            h.len(),
            lane.failed,
            lane.switches as f64 / h.len().max(1) as f64
        );
    }
}
