//! `microrep bench multicast --processes`: every member in its own process on the shm fabric
//! (`microrep bench-multicast-member`, spawned like the other benchmarks' replicas), driven
//! over its stdin and stdout:
//!
//! ```text
//! member -> parent   ready                      its node runs
//! parent -> member   go                         send for --millis (senders)
//! member -> parent   sent N NS                  N messages in NS ns of sending
//! parent -> member   expect TOTAL               wait until TOTAL are delivered here
//! member -> parent   hist VALUE COUNT ...       its latency histogram, one line per value
//! member -> parent   done DELIVERED NULLS WRITES RECONNECTS
//! parent -> member   quit                       stop (after every member is done, so that no
//!                                               member leaves while others still need it)
//! ```
//!
//! Latency needs one clock across processes: each payload of 8 bytes or more starts with
//! CLOCK_MONOTONIC at the send, in ns, and each member records its delivery time minus that
//! (smaller payloads: throughput only).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ChildStdin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use microrep::config::ThreadConfig;
use microrep::multicast::{MulticastNode, MulticastSendError, shm_fabric};
use microrep_core::multicast::{DeliveryBatch, SendError};
use microrep_testkit::child::Guarded;

use crate::bench_multicast::{
    MulticastArgs, MulticastBenchError, Point, Rings, ShmDir, Waiter, group_configs, hist, paced,
};
use crate::procs::{self, ReplicaArgs};

/// Internal: one member process of `microrep bench multicast --processes`.
#[derive(Debug, clap::Args)]
pub(crate) struct MemberArgs {
    #[command(flatten)]
    member: ReplicaArgs,
    #[arg(long)]
    senders: u16,
    #[arg(long)]
    size: u32,
    #[arg(long)]
    window: u32,
    #[arg(long)]
    copy_at_receipt_bytes: u32,
    #[arg(long)]
    outstanding: u32,
    #[arg(long)]
    subgroups: u32,
    #[arg(long)]
    millis: u64,
    /// Member 0 sends one message every this many microseconds; 0: it never sends.
    #[arg(long)]
    slow_sender_us: Option<u64>,
}

/// A member process: the protocol of the module docs.
pub(crate) fn run_member(args: &MemberArgs) -> Result<(), MulticastBenchError> {
    let (me, members) = (args.member.id, args.member.replicas);
    let rings = Rings { window: args.window, copy_at_receipt: args.copy_at_receipt_bytes };
    let group = group_configs(rings, args.subgroups, members, args.senders, args.size).swap_remove(me as usize);
    let fabric = shm_fabric(&args.member.dir, &group)?;
    let delivered = Arc::new(AtomicU64::new(0));
    let own = Arc::new(AtomicU64::new(0));
    let waiter = Arc::new(Waiter::new());
    let latency = Arc::new(Mutex::new(hist()?));
    let upcall = {
        let (delivered, own, latency) = (Arc::clone(&delivered), Arc::clone(&own), Arc::clone(&latency));
        let waiter = Arc::clone(&waiter);
        let me = group.me;
        move |batch: DeliveryBatch<'_>| {
            let now = microrep::monotonic_ns();
            let mut latency = latency.lock().expect("histogram");
            for m in batch.messages {
                if let Some(stamp) = m.payload.get(..8) {
                    let sent = u64::from_le_bytes(stamp.try_into().expect("8 bytes"));
                    let _ = latency.record(now.saturating_sub(sent).max(1));
                }
                if m.sender == me {
                    waiter.delivered(own.fetch_add(1, Ordering::SeqCst) + 1);
                }
            }
            delivered.fetch_add(batch.messages.len() as u64, Ordering::Release);
        }
    };
    let node = MulticastNode::start(fabric, group, ThreadConfig::default(), upcall)?;
    let mut out = std::io::stdout().lock();
    let mut commands = std::io::stdin().lock().lines();
    let mut next =
        || commands.next().transpose().map_err(MulticastBenchError::Pipe)?.ok_or(MulticastBenchError::ParentGone);
    writeln!(out, "ready").map_err(MulticastBenchError::Pipe)?;
    while next()? != "go" {}
    let (mut sent, began) = (0u64, Instant::now());
    if me < args.senders {
        let mut payload = vec![0xabu8; args.size as usize];
        let pace = if me == 0 { args.slow_sender_us } else { None };
        while began.elapsed() < Duration::from_millis(args.millis) {
            if !paced(pace, sent) {
                continue;
            }
            let outstanding = u64::from(args.outstanding);
            if sent - own.load(Ordering::Acquire) >= outstanding {
                waiter.wait(&own, sent - outstanding / 2);
                continue;
            }
            if let Some(stamp) = payload.get_mut(..8) {
                stamp.copy_from_slice(&microrep::monotonic_ns().to_le_bytes());
            }
            match node.send(0, &payload) {
                Ok(_) => sent += 1,
                Err(MulticastSendError::Send(SendError::WindowFull(_))) => std::thread::yield_now(),
                Err(e) => return Err(e.into()),
            }
        }
    }
    writeln!(out, "sent {sent} {}", began.elapsed().as_nanos()).map_err(MulticastBenchError::Pipe)?;
    let total = loop {
        if let Some(total) = next()?.strip_prefix("expect ") {
            break total.parse::<u64>().map_err(|_| MulticastBenchError::BadLine(total.to_string()))?;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivered.load(Ordering::Acquire) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    for value in latency.lock().map_err(|_| MulticastBenchError::Poisoned)?.iter_recorded() {
        writeln!(out, "hist {} {}", value.value_iterated_to(), value.count_at_value())
            .map_err(MulticastBenchError::Pipe)?;
    }
    let stats = node.stats();
    let delivered = delivered.load(Ordering::Acquire);
    let done = format!("done {delivered} {} {} {}", stats.nulls_sent, stats.writes, stats.reconnects);
    writeln!(out, "{done}").map_err(MulticastBenchError::Pipe)?;
    drop(out);
    while next()? != "quit" {}
    node.stop()?;
    Ok(())
}

/// One point with every member in its own process (module docs).
pub(crate) fn run_processes(
    args: &MulticastArgs,
    members: u16,
    senders: u16,
    size: u32,
) -> Result<Point, MulticastBenchError> {
    let dir = ShmDir(PathBuf::from(format!("/dev/shm/microrep-bench-mcast-procs-{}", std::process::id())));
    let millis = args.millis;
    let mut extra: Vec<String> = [
        ("--senders", senders.to_string()),
        ("--size", size.to_string()),
        ("--window", args.window.to_string()),
        ("--copy-at-receipt-bytes", args.copy_at_receipt_bytes.to_string()),
        ("--outstanding", args.outstanding.unwrap_or(args.window).max(1).to_string()),
        ("--subgroups", args.subgroups.to_string()),
        ("--millis", millis.to_string()),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value])
    .collect();
    if let Some(us) = args.slow_sender_us {
        extra.extend(["--slow-sender-us".to_string(), us.to_string()]);
    }
    let children: Vec<Guarded> = (0..members)
        .map(|id| procs::spawn_replica("bench-multicast-member", id, members, &dir.0, &extra))
        .collect::<Result<_, _>>()?;
    let (tx, rx) = mpsc::channel();
    let mut inputs: Vec<ChildStdin> = Vec::with_capacity(children.len());
    let mut children = children;
    for (id, child) in children.iter_mut().enumerate() {
        let out = child.child().stdout.take().ok_or(MulticastBenchError::NoPipe(id))?;
        inputs.push(child.child().stdin.take().ok_or(MulticastBenchError::NoPipe(id))?);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((id, line)).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let budget = Duration::from_secs(120) + Duration::from_millis(millis);
    let deadline = Instant::now() + budget;
    let recv = || {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .map_err(|_| MulticastBenchError::MemberSilent(budget))
    };
    let tell = |inputs: &mut [ChildStdin], line: &str| -> Result<(), MulticastBenchError> {
        inputs.iter_mut().try_for_each(|i| writeln!(i, "{line}").map_err(MulticastBenchError::Pipe))
    };
    let mut ready = 0;
    while ready < members {
        ready += u16::from(recv()?.1 == "ready");
    }
    tell(&mut inputs, "go")?;
    let (mut reported, mut sent, mut sending_ns) = (0, 0u64, 0u64);
    while reported < members {
        let (_, line) = recv()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if let ["sent", n, ns] = words.as_slice() {
            let parse = |w: &str| w.parse::<u64>().map_err(|_| MulticastBenchError::BadLine(line.clone()));
            sent += parse(n)?;
            sending_ns = sending_ns.max(parse(ns)?);
            reported += 1;
        }
    }
    tell(&mut inputs, &format!("expect {sent}"))?;
    let (mut done, mut counts, mut nulls, mut writes, mut reconnects) = (0, Vec::new(), 0, 0, 0);
    let mut latency = hist()?;
    while done < members {
        let (_, line) = recv()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let parse = |w: &str| w.parse::<u64>().map_err(|_| MulticastBenchError::BadLine(line.clone()));
        match words.as_slice() {
            ["hist", value, count] => latency.record_n(parse(value)?, parse(count)?)?,
            ["done", delivered, n, w, r] => {
                counts.push(parse(delivered)?);
                nulls += parse(n)?;
                writes += parse(w)?;
                reconnects += parse(r)?;
                done += 1;
            }
            _ => {}
        }
    }
    // The members stop on `quit`; dropping their guards reaps them (SIGKILL if still there).
    tell(&mut inputs, "quit")?;
    drop(children);
    Ok(Point {
        sent,
        delivered_min: counts.iter().copied().min().unwrap_or(0),
        lost: counts.iter().map(|&c| sent.saturating_sub(c)).sum(),
        elapsed: Duration::from_nanos(sending_ns.max(1)),
        hist: latency,
        nulls,
        writes,
        reconnects,
    })
}
