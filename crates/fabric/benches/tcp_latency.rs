//! tcp fabric WRITE round-trip latency next to a plain TCP ping-pong of the same payload, in one
//! run, on loopback.
//!
//! `cargo bench -p microrep-fabric --bench tcp_latency [-- --iters N] [-- --json]`
//!
//! Ours: two tcp fabric nodes in this process (each with its NIC thread); the benchmark thread
//! posts one signaled WRITE and polls until its completion arrives, timed with the TSC clock.
//! Baseline: a plain `TcpStream` pair with `TCP_NODELAY`; the client writes the payload, a server
//! thread reads exactly that many bytes and answers 8 bytes (as the NIC answers a WRITE with an
//! acknowledgement), and the client reads them. Ours and the baseline alternate in blocks so that
//! machine drift hits both alike.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use hdrhistogram::Histogram;
use microrep_fabric::tcp::{TcpConfig, TcpFabric};
use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

const LOG: RegionId = RegionId(0);
const REGION_LEN: u64 = 1 << 20;
const SIZES: [usize; 4] = [8, 64, 512, 4096];
const BLOCKS: usize = 10;

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).unwrap()
}

/// A server thread that reads `size`-byte messages and acknowledges each with 8 bytes, until the
/// client closes the connection.
fn ping_pong_server(size: usize) -> (TcpStream, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.set_nodelay(true).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    server.set_nodelay(true).unwrap();
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; size];
        while server.read_exact(&mut buf).is_ok() {
            if server.write_all(&[1; 8]).is_err() {
                return;
            }
        }
    });
    (client, thread)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let iters: usize = args.iter().position(|a| a == "--iters").map_or(20_000, |i| args[i + 1].parse().unwrap());
    let per_block = (iters / BLOCKS).max(1);

    let regions = [RegionSpec::new(LOG, REGION_LEN, RemoteWrite::Granted)];
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let cluster = format!("bench-{}", std::process::id());
    let target = TcpFabric::start(TcpConfig::new(&cluster, NodeId(0), 2, loopback, &regions)).unwrap();
    let me = TcpFabric::start(
        TcpConfig::new(&cluster, NodeId(1), 2, loopback, &regions).with_peers([(NodeId(0), target.local_addr())]),
    )
    .unwrap();
    target.grant_write(LOG, NodeId(1)).unwrap();
    let mut ep = me.connect(NodeId(0)).unwrap();
    let clock = quanta::Clock::new();
    let src = vec![0xa5u8; 4096];
    let mut ack = [0u8; 8];
    let mut rows = Vec::new();

    for &size in &SIZES {
        let (mut client, server) = ping_pong_server(size);
        let (mut ours, mut base) = (hist(), hist());
        for _ in 0..BLOCKS {
            for i in 0..per_block {
                let offset = ((i * 4096) as u64) % (REGION_LEN - 4096);
                let t0 = clock.raw();
                ep.post_write(i as u64, RemoteAddr::new(LOG, offset), &src[..size], PostFlags::SIGNALED).unwrap();
                let c = loop {
                    match ep.poll_completion() {
                        Some(c) => break c,
                        None => std::thread::yield_now(),
                    }
                };
                let t1 = clock.raw();
                assert!(c.status.is_ok(), "{c:?}");
                ours.record(clock.delta_as_nanos(t0, t1).max(1)).unwrap();
            }
            for _ in 0..per_block {
                let t0 = clock.raw();
                client.write_all(&src[..size]).unwrap();
                client.read_exact(&mut ack).unwrap();
                let t1 = clock.raw();
                base.record(clock.delta_as_nanos(t0, t1).max(1)).unwrap();
            }
        }
        drop(client);
        server.join().unwrap();
        rows.push(("write", size, "microrep tcp", ours));
        rows.push(("write", size, "tcp ping-pong", base));
    }
    report(&rows, json);
}

fn report(rows: &[(&str, usize, &str, Histogram<u64>)], json: bool) {
    if !json {
        println!(
            "{:<6} {:>6} {:<14} {:>8} {:>8} {:>9} {:>9} {:>8}",
            "op", "bytes", "impl", "p50 us", "p99 us", "p99.9 us", "max us", "samples"
        );
    }
    for (op, size, name, h) in rows {
        let us = |ns: u64| ns as f64 / 1000.0;
        let q = |p: f64| us(h.value_at_quantile(p));
        if json {
            println!(
                "{{\"op\":\"{op}\",\"bytes\":{size},\"impl\":\"{name}\",\"p50_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{},\"samples\":{}}}",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max(),
                h.len()
            );
        } else {
            println!(
                "{op:<6} {size:>6} {name:<14} {:>8.1} {:>8.1} {:>9.1} {:>9.1} {:>8}",
                q(0.5),
                q(0.99),
                q(0.999),
                us(h.max()),
                h.len()
            );
        }
    }
}
