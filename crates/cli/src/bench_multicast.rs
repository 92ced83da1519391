//! `microrep bench multicast`: atomic multicast throughput and delivery latency.
//!
//! Every member of one group runs as a [`MulticastNode`] (its own poll thread, the default
//! backoff idle policy) in this process, on the shm fabric (or tcp on loopback, or verbs over
//! the first RDMA device in a build with the `verbs` feature); each sender
//! has an application thread that sends as fast as its window (and `--outstanding`) allows for
//! `--millis`, then the run waits until every member delivered every message sent. Delivery
//! latency is from just before `send` to each member's upcall, for every message at every
//! member. The memcpy anchor is measured in the same run: one thread copying message-sized
//! chunks between two 64 MiB buffers (larger than the caches).
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use microrep::config::ThreadConfig;
use microrep::multicast::{MulticastNode, MulticastNodeError, MulticastSendError, shm_fabric, tcp_fabric};
use microrep_core::multicast::{COPY_AT_RECEIPT_BYTES, DeliveryBatch, GroupConfig, MulticastError, SendError};
use microrep_fabric::{Fabric, FabricError, NodeId};

/// Arguments of `microrep bench multicast`.
#[derive(Debug, clap::Args)]
pub(crate) struct MulticastArgs {
    /// Group members (threads of this process, each with its own fabric node).
    #[arg(long, value_delimiter = ',', default_value = "3", value_parser = clap::value_parser!(u16).range(2..=16))]
    members: Vec<u16>,
    /// Who sends: `all`, `half` or `one`.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    senders: Vec<Senders>,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1,64,1024,10240",
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    sizes: Vec<u32>,
    /// Ring slots per sender.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) window: u32,
    /// Messages of at most this many bytes are copied out of the ring at receipt, longer ones
    /// delivered in place (`SubgroupConfig::copy_at_receipt_bytes`).
    #[arg(long, default_value_t = COPY_AT_RECEIPT_BYTES)]
    pub(crate) copy_at_receipt_bytes: u32,
    /// Most of a sender's messages not yet delivered at its own member (1: one at a time, for
    /// unloaded latency); default: the window.
    #[arg(long)]
    pub(crate) outstanding: Option<u32>,
    /// Sending time per point, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub(crate) millis: u64,
    /// Subgroups of all members (1 to 50); only the first carries messages, the others are
    /// polled idle (the cost of subgroups a member is in but nobody uses).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub(crate) subgroups: u32,
    /// The first sender sends one message every this many microseconds instead of as fast as
    /// it can; 0 stalls it (it never sends: the others' messages move on its null-sends).
    #[arg(long)]
    pub(crate) slow_sender_us: Option<u64>,
    /// Fabric: `shm`, `tcp` (loopback) or `verbs` (the first RDMA device, bootstrapping over
    /// loopback; a build with the `verbs` feature).
    #[arg(long, default_value = "shm")]
    fabric: FabricChoice,
    /// Every member in its own process (shm only; `microrep bench-multicast-member`), instead
    /// of threads of this one.
    #[arg(long)]
    processes: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead of a throughput run: the CPU cost of one poll of an idle member with
    /// `--subgroups` subgroups (shm, one thread, `--millis` of polling), in ns per poll.
    #[arg(long)]
    idle_poll_cost: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Senders {
    All,
    Half,
    One,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum FabricChoice {
    Shm,
    Tcp,
    Verbs,
}

/// One measured point.
#[derive(Debug)]
pub(crate) struct Point {
    pub(crate) sent: u64,
    pub(crate) delivered_min: u64,
    pub(crate) lost: u64,
    pub(crate) elapsed: Duration,
    pub(crate) hist: Histogram<u64>,
    pub(crate) nulls: u64,
    pub(crate) writes: u64,
    /// Endpoints the members reconnected after a failed operation.
    pub(crate) reconnects: u64,
}

/// Removes a shm cluster directory when the run ends.
pub(crate) struct ShmDir(pub(crate) PathBuf);

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Why the multicast benchmark failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MulticastBenchError {
    #[error("creating a histogram: {0}")]
    Histogram(#[from] hdrhistogram::CreationError),
    #[error("adding latencies: {0}")]
    Add(#[from] hdrhistogram::AdditionError),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(transparent)]
    Member(#[from] MulticastError),
    #[error(transparent)]
    Node(#[from] MulticastNodeError),
    #[error(transparent)]
    Send(#[from] MulticastSendError),
    #[error("a sender panicked")]
    SenderPanicked,
    #[error("a member's histogram is poisoned (its upcall panicked)")]
    Poisoned,
    #[error("--processes runs on the shm fabric only")]
    ProcessesUnsupported,
    #[cfg(not(feature = "verbs"))]
    #[error("this microrep was built without RDMA: build it with `cargo build -p microrep-cli --features verbs`")]
    VerbsNotBuilt,
    #[error("recording latencies: {0}")]
    Record(#[from] hdrhistogram::RecordError),
    #[error(transparent)]
    Spawn(#[from] crate::procs::SpawnError),
    #[error("member process {0} has no stdin or stdout pipe")]
    NoPipe(usize),
    #[error("talking to a member process: {0}")]
    Pipe(std::io::Error),
    #[error("the benchmark's parent process went away")]
    ParentGone,
    #[error("a member process said `{0}`")]
    BadLine(String),
    #[error("a member process said nothing for {0:?} (or exited)")]
    MemberSilent(Duration),
}

pub(crate) fn hist() -> Result<Histogram<u64>, hdrhistogram::CreationError> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3)
}

/// Runs `microrep bench multicast`.
pub(crate) fn multicast(args: &MulticastArgs) -> Result<(), MulticastBenchError> {
    if args.idle_poll_cost {
        return idle_poll_cost(args);
    }
    if args.processes && args.fabric != FabricChoice::Shm {
        return Err(MulticastBenchError::ProcessesUnsupported);
    }
    if !args.json {
        eprintln!(
            "microrep bench multicast: {:?} fabric, window {}, copied at receipt up to {} B, {} ms per point, {} subgroup(s), slow first sender: {:?} us; members and senders in {}",
            args.fabric,
            args.window,
            args.copy_at_receipt_bytes,
            args.millis,
            args.subgroups,
            args.slow_sender_us,
            if args.processes { "a process each" } else { "this process" }
        );
        println!(
            "{:>7} {:>7} {:>7} {:>10} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>6}",
            "members",
            "senders",
            "size B",
            "sent",
            "msgs/s",
            "MB/s",
            "memcpy MB/s",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "lost"
        );
    }
    for &members in &args.members {
        for &senders in &args.senders {
            let sending = match senders {
                Senders::All => members,
                Senders::Half => members.div_ceil(2),
                Senders::One => 1,
            };
            for &size in &args.sizes {
                let memcpy = memcpy_bytes_per_s(size as usize);
                let point = match args.fabric {
                    FabricChoice::Shm if args.processes => {
                        crate::bench_multicast_procs::run_processes(args, members, sending, size)?
                    }
                    FabricChoice::Shm => run_shm(args, members, sending, size)?,
                    FabricChoice::Tcp => run_tcp(args, members, sending, size)?,
                    FabricChoice::Verbs => run_verbs(args, members, sending, size)?,
                };
                report(args, members, sending, size, memcpy, &point);
            }
        }
    }
    Ok(())
}

fn report(args: &MulticastArgs, members: u16, senders: u16, size: u32, memcpy: f64, p: &Point) {
    let secs = p.elapsed.as_secs_f64();
    let rate = p.delivered_min as f64 / secs;
    let mb = rate * f64::from(size) / 1e6;
    let memcpy_mb = memcpy / 1e6;
    // No figure for samples not taken: a point with no delivery prints none.
    let taken = !p.hist.is_empty();
    let ns = |q: f64| if taken { p.hist.value_at_quantile(q).to_string() } else { "null".to_string() };
    let us =
        |q: f64| if taken { format!("{:.1}", p.hist.value_at_quantile(q) as f64 / 1000.0) } else { "-".to_string() };
    if args.json {
        println!(
            "{{\"bench\":\"multicast\",\"fabric\":\"{:?}\",\"processes\":{},\"members\":{members},\"senders\":{senders},\"size\":{size},\"window\":{},\"copy_at_receipt_bytes\":{},\"outstanding\":{},\"subgroups\":{},\"slow_sender_us\":{},\"millis\":{},\"sent\":{},\"delivered_min\":{},\"lost\":{},\"msgs_per_s\":{rate:.0},\"payload_mb_per_s\":{mb:.2},\"memcpy_mb_per_s\":{memcpy_mb:.0},\"pct_of_memcpy\":{:.2},\"p50_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"samples\":{},\"nulls\":{},\"writes\":{},\"reconnects\":{}}}",
            args.fabric,
            args.processes,
            args.window,
            args.copy_at_receipt_bytes,
            args.outstanding.unwrap_or(args.window),
            args.subgroups,
            args.slow_sender_us.map_or("null".to_string(), |us| us.to_string()),
            args.millis,
            p.sent,
            p.delivered_min,
            p.lost,
            100.0 * mb / memcpy_mb,
            ns(0.5),
            ns(0.99),
            ns(0.999),
            p.hist.len(),
            p.nulls,
            p.writes,
            p.reconnects,
        );
    } else {
        println!(
            "{members:>7} {senders:>7} {size:>7} {:>10} {rate:>10.0} {mb:>9.1} {memcpy_mb:>10.0} {:>9} {:>9} {:>9} {:>6}",
            p.sent,
            us(0.5),
            us(0.99),
            us(0.999),
            p.lost
        );
    }
}

/// Bytes per second one thread copies in `chunk`-byte pieces between two 64 MiB buffers.
fn memcpy_bytes_per_s(chunk: usize) -> f64 {
    const LEN: usize = 64 << 20;
    let src = vec![0x5au8; LEN];
    let mut dst = vec![0u8; LEN];
    let chunk = chunk.clamp(1, LEN);
    let began = Instant::now();
    let mut copied = 0u64;
    let mut at = 0;
    while began.elapsed() < Duration::from_millis(200) {
        for _ in 0..1024 {
            if at + chunk > LEN {
                at = 0;
            }
            dst[at..at + chunk].copy_from_slice(&src[at..at + chunk]);
            at += chunk;
            copied += chunk as u64;
        }
        std::hint::black_box(&mut dst);
    }
    copied as f64 / began.elapsed().as_secs_f64()
}

fn groups(args: &MulticastArgs, members: u16, senders: u16, size: u32) -> Vec<GroupConfig> {
    group_configs(
        Rings { window: args.window, copy_at_receipt: args.copy_at_receipt_bytes },
        args.subgroups,
        members,
        senders,
        size,
    )
}

/// The ring geometry of the benchmark's subgroups.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rings {
    pub(crate) window: u32,
    pub(crate) copy_at_receipt: u32,
}

/// Every member's configuration: one group of `members`, `subgroups` subgroups of all of them,
/// the first `senders` sending (only the first subgroup carries messages).
pub(crate) fn group_configs(rings: Rings, subgroups: u32, members: u16, senders: u16, size: u32) -> Vec<GroupConfig> {
    let ids: Vec<NodeId> = (0..members).map(NodeId).collect();
    ids.iter()
        .map(|&me| {
            let mut group = GroupConfig::single(me, ids.clone(), rings.window, size.next_multiple_of(8).max(8));
            group.subgroups[0].senders.truncate(senders as usize);
            group.subgroups[0].copy_at_receipt_bytes = rings.copy_at_receipt;
            let first = group.subgroups[0].clone();
            group.subgroups.resize(subgroups as usize, first);
            group
        })
        .collect()
}

/// Polls member 0 of an idle group of `args.members[0]` members (the others exist, never
/// polled, so nothing changes) for `args.millis` and prints the mean cost of a poll.
fn idle_poll_cost(args: &MulticastArgs) -> Result<(), MulticastBenchError> {
    let members = args.members.first().copied().unwrap_or(3);
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-bench-mcast-idle-{}", std::process::id())));
    let groups = groups(args, members, members, 64);
    let fabrics = groups.iter().map(|g| shm_fabric(&dir.0, g)).collect::<Result<Vec<_>, _>>()?;
    let mut all = fabrics
        .into_iter()
        .zip(groups)
        .map(|(fabric, group)| microrep_core::multicast::Member::new(fabric, group))
        .collect::<Result<Vec<_>, _>>()?;
    let member = &mut all[0];
    let mut upcall = |_: DeliveryBatch<'_>| {};
    let began = Instant::now();
    let mut polls = 0u64;
    while began.elapsed() < Duration::from_millis(args.millis) {
        for _ in 0..1_000 {
            member.poll(0, &mut upcall)?;
        }
        polls += 1_000;
    }
    let ns = began.elapsed().as_nanos() as f64 / polls as f64;
    if args.json {
        println!(
            r#"{{"bench":"multicast_idle_poll","members":{members},"subgroups":{},"polls":{polls},"ns_per_poll":{ns:.1}}}"#,
            args.subgroups
        );
    } else {
        println!("{members} members, {} idle subgroup(s): {polls} polls, {ns:.1} ns per poll", args.subgroups);
    }
    Ok(())
}

fn run_shm(args: &MulticastArgs, members: u16, senders: u16, size: u32) -> Result<Point, MulticastBenchError> {
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-bench-mcast-{}", std::process::id())));
    let groups = groups(args, members, senders, size);
    let fabrics = groups.iter().map(|g| shm_fabric(&dir.0, g)).collect::<Result<Vec<_>, _>>()?;
    run(args, fabrics, groups, senders, size)
}

fn run_tcp(args: &MulticastArgs, members: u16, senders: u16, size: u32) -> Result<Point, MulticastBenchError> {
    let groups = groups(args, members, senders, size);
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let name = format!("bench-mcast-{}", std::process::id());
    let fabrics = groups.iter().map(|g| tcp_fabric(&name, any, g)).collect::<Result<Vec<_>, _>>()?;
    for a in &fabrics {
        for b in &fabrics {
            if a.node_id() != b.node_id() {
                a.set_peer_addr(b.node_id(), b.local_addr())?;
            }
        }
    }
    run(args, fabrics, groups, senders, size)
}

#[cfg(feature = "verbs")]
fn run_verbs(args: &MulticastArgs, members: u16, senders: u16, size: u32) -> Result<Point, MulticastBenchError> {
    let groups = groups(args, members, senders, size);
    let peers = microrep_fabric::verbs::PeerTable::new();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    // Every member's fabric first (each adds its listener to the shared table as it starts).
    let fabrics = groups
        .iter()
        .map(|g| microrep::multicast::verbs_fabric(any, peers.clone(), g))
        .collect::<Result<Vec<_>, _>>()?;
    run(args, fabrics, groups, senders, size)
}

#[cfg(not(feature = "verbs"))]
fn run_verbs(_: &MulticastArgs, _: u16, _: u16, _: u32) -> Result<Point, MulticastBenchError> {
    Err(MulticastBenchError::VerbsNotBuilt)
}

/// Per sender rank: when each of its real messages was sent (by count: the n-th message it
/// sent, nulls not counted), in ns since `epoch`.
struct SendTimes {
    epoch: Instant,
    senders: u64,
    by_rank: Vec<Vec<AtomicU64>>,
    /// Own messages delivered at each sender's own member.
    own_delivered: Vec<AtomicU64>,
    /// Per sender rank: its thread while it waits for its window to drain.
    waiting: Vec<Waiter>,
}

/// Paces the first sender (`--slow-sender-us`) before its next send: sleeps the given
/// microseconds between sends; with 0 it never sends (false, after a millisecond's sleep, so
/// that the caller sees a stop).
pub(crate) fn paced(pace: Option<u64>, sent: u64) -> bool {
    match pace {
        Some(0) => {
            std::thread::sleep(Duration::from_millis(1));
            false
        }
        Some(us) if sent > 0 => {
            std::thread::sleep(Duration::from_micros(us));
            true
        }
        _ => true,
    }
}

/// A sender waiting for its own member to deliver up to `until` of its messages parks (its
/// yielding would take the cores its group's poll threads need); the upcall that delivers the
/// `until`-th wakes it. It waits for half its window, so it is woken once per half window.
pub(crate) struct Waiter {
    thread: OnceLock<std::thread::Thread>,
    /// The own-delivered count it waits for; `u64::MAX` while it does not wait.
    until: AtomicU64,
}

impl Waiter {
    pub(crate) fn new() -> Self {
        Self { thread: OnceLock::new(), until: AtomicU64::new(u64::MAX) }
    }

    /// Parks the calling sender until `delivered` reaches `until` (bounded, so that a stop is
    /// seen).
    pub(crate) fn wait(&self, delivered: &AtomicU64, until: u64) {
        let _ = self.thread.set(std::thread::current());
        self.until.store(until, Ordering::SeqCst);
        if delivered.load(Ordering::SeqCst) < until {
            std::thread::park_timeout(Duration::from_millis(1));
        }
        self.until.store(u64::MAX, Ordering::SeqCst);
    }

    /// Called after `delivered` was raised to `now`.
    pub(crate) fn delivered(&self, now: u64) {
        if now >= self.until.load(Ordering::SeqCst)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }
}

fn run<F>(
    args: &MulticastArgs,
    fabrics: Vec<F>,
    groups: Vec<GroupConfig>,
    senders: u16,
    size: u32,
) -> Result<Point, MulticastBenchError>
where
    F: Fabric + Send + 'static,
    F::Endpoint: Send,
{
    // Enough room for the fastest rate seen here with a wide margin; a sender stops early
    // rather than overflow it.
    let capacity = (args.millis as usize).saturating_mul(20_000).min(50_000_000) / senders as usize;
    let times = Arc::new(SendTimes {
        epoch: Instant::now(),
        senders: u64::from(senders),
        by_rank: (0..senders).map(|_| (0..capacity).map(|_| AtomicU64::new(0)).collect()).collect(),
        own_delivered: (0..senders).map(|_| AtomicU64::new(0)).collect(),
        waiting: (0..senders).map(|_| Waiter::new()).collect(),
    });
    let delivered: Vec<Arc<AtomicU64>> = groups.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let hists: Vec<Arc<Mutex<Histogram<u64>>>> =
        groups.iter().map(|_| hist().map(|h| Arc::new(Mutex::new(h)))).collect::<Result<_, _>>()?;
    let mut nodes = Vec::with_capacity(groups.len());
    for (i, (fabric, group)) in fabrics.into_iter().zip(groups).enumerate() {
        let (times, count, hist) = (Arc::clone(&times), Arc::clone(&delivered[i]), Arc::clone(&hists[i]));
        let me = group.me;
        // Each sender's messages are delivered in its sending order, so the n-th one delivered
        // here is its n-th sent (a sequence number counts nulls too and cannot index).
        let mut delivered_of = vec![0usize; senders as usize];
        let upcall = move |batch: DeliveryBatch<'_>| {
            let now = times.epoch.elapsed().as_nanos() as u64;
            let mut hist = hist.lock().expect("histogram");
            for m in batch.messages {
                let rank = (m.seq % times.senders) as usize;
                let n = delivered_of[rank];
                delivered_of[rank] += 1;
                if let Some(sent) = times.by_rank[rank].get(n) {
                    let _ = hist.record(now.saturating_sub(sent.load(Ordering::Acquire)).max(1));
                }
                if m.sender == me {
                    let now = times.own_delivered[rank].fetch_add(1, Ordering::SeqCst) + 1;
                    times.waiting[rank].delivered(now);
                }
            }
            count.fetch_add(batch.messages.len() as u64, Ordering::Release);
        };
        nodes.push(MulticastNode::start(fabric, group, ThreadConfig::default(), upcall)?);
    }
    let outstanding = u64::from(args.outstanding.unwrap_or(args.window).max(1));
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    let sent: Vec<Result<u64, MulticastBenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes[..senders as usize]
            .iter()
            .enumerate()
            .map(|(rank, node)| {
                let (times, stop) = (&times, &stop);
                s.spawn(move || {
                    let mut n = 0u64;
                    let payload = vec![0xabu8; size as usize];
                    let pace = if rank == 0 { args.slow_sender_us } else { None };
                    while !stop.load(Ordering::Relaxed) && (n as usize) < capacity {
                        if !paced(pace, n) {
                            continue;
                        }
                        let delivered = &times.own_delivered[rank];
                        if n - delivered.load(Ordering::Acquire) >= outstanding {
                            times.waiting[rank].wait(delivered, n - outstanding / 2);
                            continue;
                        }
                        // The send time is stored before the commit, so the upcall sees it.
                        let at = times.epoch.elapsed().as_nanos() as u64;
                        times.by_rank[rank][n as usize].store(at, Ordering::Release);
                        match node.send(0, &payload) {
                            Ok(_) => n += 1,
                            Err(MulticastSendError::Send(SendError::WindowFull(_))) => std::thread::yield_now(),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok(n)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(args.millis));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap_or(Err(MulticastBenchError::SenderPanicked))).collect()
    });
    let sent = sent.into_iter().collect::<Result<Vec<u64>, _>>()?;
    let elapsed = began.elapsed();
    let sent: u64 = sent.iter().sum();
    // Drain: every member must deliver everything sent (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivered.iter().any(|d| d.load(Ordering::Acquire) < sent) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let counts: Vec<u64> = delivered.iter().map(|d| d.load(Ordering::Acquire)).collect();
    let delivered_min = counts.iter().copied().min().unwrap_or(0);
    let mut hist = hist()?;
    for h in &hists {
        hist.add(&*h.lock().map_err(|_| MulticastBenchError::Poisoned)?)?;
    }
    let (mut nulls, mut writes, mut reconnects) = (0, 0, 0);
    for node in nodes {
        let stats = node.stats();
        nulls += stats.nulls_sent;
        writes += stats.writes;
        reconnects += stats.reconnects;
        node.stop()?;
    }
    Ok(Point {
        sent,
        delivered_min,
        lost: counts.iter().map(|&c| sent.saturating_sub(c)).sum(),
        elapsed,
        hist,
        nulls,
        writes,
        reconnects,
    })
}
