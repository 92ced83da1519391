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
use std::collections::btree_map::Entry;
use std::io::{BufRead, Write};
use std::num::ParseIntError;
use std::process::ExitCode;

use microrep_fabric::shm::{ShmConfig, ShmEndpoint, ShmFabric};
use microrep_fabric::{
    Endpoint, Fabric, FabricError, NodeId, PostFlags, RegionId, RegionSpec, RemoteAddr, RemoteWrite,
};

/// Why the peer could not start, a command failed (answered `err TEXT`), or stdio failed.
#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error("usage: microrep-fabric-peer DIR NODE MAX_NODES ID:LEN:POLICY...")]
    Usage,
    #[error("region `{0}` is not ID:LEN:POLICY")]
    NotRegion(String),
    #[error("unknown policy `{0}` (never, granted, always)")]
    UnknownPolicy(String),
    /// A number of the command line.
    #[error("{what} `{value}`: {source}")]
    BadArg { what: &'static str, value: String, source: ParseIntError },
    #[error("missing {0}")]
    Missing(&'static str),
    /// A number of a command.
    #[error("bad {0}")]
    Bad(&'static str),
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("no completion")]
    NoCompletion,
    #[error("{0}")]
    Stdio(#[from] std::io::Error),
}

/// Parses the number `value` of the command-line argument `what`.
fn arg<T: std::str::FromStr<Err = ParseIntError>>(value: &str, what: &'static str) -> Result<T, PeerError> {
    value.parse().map_err(|source| PeerError::BadArg { what, value: value.into(), source })
}

fn parse_region(text: &str) -> Result<RegionSpec, PeerError> {
    let parts: Vec<&str> = text.split(':').collect();
    let [id, len, policy] = parts[..] else {
        return Err(PeerError::NotRegion(text.into()));
    };
    let policy = match policy {
        "never" => RemoteWrite::Never,
        "granted" => RemoteWrite::Granted,
        "always" => RemoteWrite::Always,
        other => return Err(PeerError::UnknownPolicy(other.into())),
    };
    Ok(RegionSpec::new(RegionId(arg(id, "region id")?), arg(len, "region length")?, policy))
}

struct Peer {
    fabric: ShmFabric,
    endpoints: BTreeMap<u16, ShmEndpoint>,
}

fn num<T: std::str::FromStr>(word: Option<&str>, what: &'static str) -> Result<T, PeerError> {
    word.ok_or(PeerError::Missing(what))?.parse().map_err(|_| PeerError::Bad(what))
}

impl Peer {
    fn endpoint(&mut self, peer: u16) -> Result<&mut ShmEndpoint, PeerError> {
        match self.endpoints.entry(peer) {
            Entry::Occupied(ep) => Ok(ep.into_mut()),
            Entry::Vacant(slot) => Ok(slot.insert(self.fabric.connect(NodeId(peer))?)),
        }
    }

    fn handle(&mut self, line: &str, out: &mut impl Write) -> Result<String, PeerError> {
        let mut words = line.split_whitespace();
        match words.next().unwrap_or("") {
            "grant" => {
                let (r, w) = (num(words.next(), "region")?, num(words.next(), "writer")?);
                self.fabric.grant_write(RegionId(r), NodeId(w))?;
                Ok("ok".into())
            }
            "revoke" => {
                let (r, w) = (num(words.next(), "region")?, num(words.next(), "writer")?);
                let path = self.fabric.revoke_write(RegionId(r), NodeId(w))?;
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
                ep.reconnect()?;
                ep.post_write(1, RemoteAddr::new(RegionId(r), off), text.as_bytes(), PostFlags::SIGNALED)?;
                match ep.poll_completion().map(|c| c.status) {
                    Some(Ok(())) => Ok("ok".into()),
                    Some(Err(e)) => Ok(format!("ok failed {e:?}")),
                    None => Err(PeerError::NoCompletion),
                }
            }
            "read" => {
                let (r, off, len): (u16, u64, usize) =
                    (num(words.next(), "region")?, num(words.next(), "offset")?, num(words.next(), "length")?);
                let mut buf = vec![0u8; len];
                self.fabric.read_local(RegionId(r), off, &mut buf)?;
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
            other => Err(PeerError::UnknownCommand(other.into())),
        }
    }

    fn write_loop(
        &mut self,
        peer: u16,
        dst: RemoteAddr,
        len: usize,
        max: u64,
        out: &mut impl Write,
    ) -> Result<String, PeerError> {
        let ep = self.endpoint(peer)?;
        ep.reconnect()?;
        let mut record = vec![0u8; len];
        let mut last_ok = 0u64;
        for seq in 1..=max {
            for word in record.chunks_exact_mut(8) {
                word.copy_from_slice(&seq.to_le_bytes());
            }
            ep.post_write(seq, dst, &record, PostFlags::SIGNALED)?;
            match ep.poll_completion().map(|c| c.status) {
                Some(Ok(())) => last_ok = seq,
                Some(Err(e)) => return Ok(format!("ok {last_ok} {e:?}")),
                None => return Err(PeerError::NoCompletion),
            }
            if seq == 1 {
                writeln!(out, "started").and_then(|()| out.flush())?;
            }
        }
        Ok(format!("ok {last_ok} none"))
    }
}

fn run() -> Result<(), PeerError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err(PeerError::Usage);
    }
    let node = NodeId(arg(&args[1], "node")?);
    let max_nodes = arg(&args[2], "max nodes")?;
    let regions = args[3..].iter().map(|a| parse_region(a)).collect::<Result<Vec<_>, _>>()?;
    let mut config = ShmConfig::new(&args[0], node, max_nodes, &regions);
    config.symmetric_fences = std::env::var_os("MICROREP_SHM_SYMMETRIC_FENCES").is_some();
    let fabric = ShmFabric::start(config)?;
    let mut peer = Peer { fabric, endpoints: BTreeMap::new() };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "ready").and_then(|()| out.flush())?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim() == "quit" {
            break;
        }
        let reply = peer.handle(&line, &mut out).unwrap_or_else(|e| format!("err {e}"));
        writeln!(out, "{reply}").and_then(|()| out.flush())?;
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
