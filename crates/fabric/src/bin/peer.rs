//! `microrep-fabric-peer`: one shm fabric node in its own process, driven by line commands on
//! stdin, for the multi-process conformance tests, the benchmarks and the fabric demo.
//!
//! Usage: `microrep-fabric-peer DIR NODE MAX_NODES REGION...` where REGION is `ID:LEN:POLICY`
//! (POLICY one of `never`, `granted`, `always`); with `MICROREP_SHM_SYMMETRIC_FENCES` set in the
//! environment the node uses symmetric fences (`ShmConfig::symmetric_fences`). Prints `ready` once started, then answers each
//! command with one line starting `ok` or `err`:
//!
//! | command | effect |
//! |---|---|
//! | `grant R W` / `revoke R W` | grant or revoke writer W on local region R (`ok fast`/`ok slow`) |
//! | `connect P` | open an endpoint to node P |
//! | `write P R OFF TEXT` | one signaled WRITE of TEXT's bytes |
//! | `read R OFF LEN` | local bytes as text (lossy UTF-8) |
//! | `write-loop P R OFF LEN MAX` | writes records `seq` = 1, 2, ... (LEN bytes, every 8-byte word = seq) until one fails or MAX were written; prints `started` after the first, then `ok LAST_OK_SEQ ERROR` |
//! | `quit` | exit |

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::ExitCode;

use microrep_fabric::shm::{ShmConfig, ShmEndpoint, ShmFabric};
use microrep_fabric::{Endpoint, Fabric, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

fn parse_region(arg: &str) -> Result<RegionSpec, String> {
    let parts: Vec<&str> = arg.split(':').collect();
    let [id, len, policy] = parts[..] else {
        return Err(format!("region `{arg}` is not ID:LEN:POLICY"));
    };
    let policy = match policy {
        "never" => RemoteWrite::Never,
        "granted" => RemoteWrite::Granted,
        "always" => RemoteWrite::Always,
        other => return Err(format!("unknown policy `{other}` (never, granted, always)")),
    };
    let id = id.parse().map_err(|e| format!("region id `{id}`: {e}"))?;
    let len = len.parse().map_err(|e| format!("region length `{len}`: {e}"))?;
    Ok(RegionSpec::new(RegionId(id), len, policy))
}

struct Peer {
    fabric: ShmFabric,
    endpoints: BTreeMap<u16, ShmEndpoint>,
}

fn num<T: std::str::FromStr>(word: Option<&str>, what: &str) -> Result<T, String> {
    word.ok_or_else(|| format!("missing {what}"))?.parse().map_err(|_| format!("bad {what}"))
}

impl Peer {
    fn endpoint(&mut self, peer: u16) -> Result<&mut ShmEndpoint, String> {
        if !self.endpoints.contains_key(&peer) {
            let ep = self.fabric.connect(NodeId(peer)).map_err(|e| e.to_string())?;
            self.endpoints.insert(peer, ep);
        }
        self.endpoints.get_mut(&peer).ok_or_else(|| "no endpoint".to_string())
    }

    fn handle(&mut self, line: &str, out: &mut impl Write) -> Result<String, String> {
        let mut words = line.split_whitespace();
        match words.next().unwrap_or("") {
            "grant" => {
                let (r, w) = (num(words.next(), "region")?, num(words.next(), "writer")?);
                self.fabric.grant_write(RegionId(r), NodeId(w)).map_err(|e| e.to_string())?;
                Ok("ok".into())
            }
            "revoke" => {
                let (r, w) = (num(words.next(), "region")?, num(words.next(), "writer")?);
                let path = self.fabric.revoke_write(RegionId(r), NodeId(w)).map_err(|e| e.to_string())?;
                Ok(format!("ok {path:?}").to_lowercase())
            }
            "connect" => {
                self.endpoint(num(words.next(), "peer")?)?;
                Ok("ok".into())
            }
            "write" => {
                let (p, r, off): (u16, u16, u64) =
                    (num(words.next(), "peer")?, num(words.next(), "region")?, num(words.next(), "offset")?);
                let text = words.next().unwrap_or("");
                let ep = self.endpoint(p)?;
                ep.reconnect().map_err(|e| e.to_string())?;
                ep.post_write(1, RemoteAddr::new(RegionId(r), off), text.as_bytes(), PostFlags::SIGNALED)
                    .map_err(|e| e.to_string())?;
                match ep.poll_completion().map(|c| c.status) {
                    Some(Ok(())) => Ok("ok".into()),
                    Some(Err(e)) => Ok(format!("ok failed {e:?}")),
                    None => Err("no completion".into()),
                }
            }
            "read" => {
                let (r, off, len): (u16, u64, usize) =
                    (num(words.next(), "region")?, num(words.next(), "offset")?, num(words.next(), "length")?);
                let mut buf = vec![0u8; len];
                self.fabric.read_local(RegionId(r), off, &mut buf).map_err(|e| e.to_string())?;
                Ok(format!("ok {}", String::from_utf8_lossy(&buf)))
            }
            "write-loop" => {
                let (p, r, off, len, max): (u16, u16, u64, usize, u64) = (
                    num(words.next(), "peer")?,
                    num(words.next(), "region")?,
                    num(words.next(), "offset")?,
                    num(words.next(), "length")?,
                    num(words.next(), "max")?,
                );
                self.write_loop(p, RemoteAddr::new(RegionId(r), off), len, max, out)
            }
            other => Err(format!("unknown command `{other}`")),
        }
    }

    fn write_loop(
        &mut self,
        peer: u16,
        dst: RemoteAddr,
        len: usize,
        max: u64,
        out: &mut impl Write,
    ) -> Result<String, String> {
        let ep = self.endpoint(peer)?;
        ep.reconnect().map_err(|e| e.to_string())?;
        let mut record = vec![0u8; len];
        let mut last_ok = 0u64;
        for seq in 1..=max {
            for word in record.chunks_exact_mut(8) {
                word.copy_from_slice(&seq.to_le_bytes());
            }
            ep.post_write(seq, dst, &record, PostFlags::SIGNALED).map_err(|e| e.to_string())?;
            match ep.poll_completion().map(|c| c.status) {
                Some(Ok(())) => last_ok = seq,
                Some(Err(e)) => return Ok(format!("ok {last_ok} {e:?}")),
                None => return Err("no completion".into()),
            }
            if seq == 1 {
                writeln!(out, "started").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
            }
        }
        Ok(format!("ok {last_ok} none"))
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err("usage: microrep-fabric-peer DIR NODE MAX_NODES ID:LEN:POLICY...".into());
    }
    let node = NodeId(args[1].parse().map_err(|e| format!("node `{}`: {e}", args[1]))?);
    let max_nodes = args[2].parse().map_err(|e| format!("max nodes `{}`: {e}", args[2]))?;
    let regions = args[3..].iter().map(|a| parse_region(a)).collect::<Result<Vec<_>, _>>()?;
    let mut config = ShmConfig::new(&args[0], node, max_nodes, &regions);
    config.symmetric_fences = std::env::var_os("MICROREP_SHM_SYMMETRIC_FENCES").is_some();
    let fabric = ShmFabric::start(config).map_err(|e| e.to_string())?;
    let mut peer = Peer { fabric, endpoints: BTreeMap::new() };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "ready").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim() == "quit" {
            break;
        }
        let reply = peer.handle(&line, &mut out).unwrap_or_else(|e| format!("err {e}"));
        writeln!(out, "{reply}").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("microrep-fabric-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
