//! State transfer between wrap replicas: a replica whose server copy cannot be brought up to
//! date from the log (it restarted after the log was recycled, or fell behind it) asks a
//! following peer for a checkpoint. The peer's replay agent stops at a cut in the log (at or
//! after the entry the asker needs), has its server write its state (the hook, e.g. Redis's
//! `SAVE`), copies the file to the asker, and answers with the cut and the sessions of the
//! connections open there. The asker restarts its server from the file, re-establishes the
//! sessions, and replays the entries after the cut.
//!
//! Each wrap node listens on `state.sock` in its directory; one request and one answer per
//! connection, in lines:
//!
//! ```text
//! -> checkpoint ENTRY POSITION DEST [any]    (or "checkpoint - - DEST": no entry needed yet;
//!                                            "any": a serving leader may answer too)
//! <- cut ENTRY POSITION                      (or "cut - -": before the first entry)
//! <- session CONN DB RESP NAME-IN-HEX        (one per open connection)
//! <- end
//! <- error TEXT                              (instead, on failure)
//! ```
//!
//! The socket also answers `status` with one line of JSON: the node's status, the replica's
//! role (`following`, `promoting`, `serving`), what output checking found (`output`: buckets
//! that matched the leader's and that differed) and whether its copy holds the data
//! (`copy_current`: false until it handled an entry past the first or installed a peer's state),
//! for a harness that must not take down the copies holding the data.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::time::Duration;

use microrep::Index;

use super::redis::Session;
use super::replay::TransferError;
use super::shim::{Role, Shared};

/// The wrap node's state socket, in its directory.
pub(crate) const SOCKET_NAME: &str = "state.sock";

/// How a wrapped server's state is saved and loaded (docs/WRAP.md, state transfer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Hook {
    /// `SAVE` on the donor, the RDB file loaded by the restarted server; sessions from
    /// `CLIENT LIST` (crates/cli/src/wrap/redis.rs).
    Redis,
    /// No state transfer: a replica that needs one stops with an error saying so.
    None,
}

/// A checkpoint, and who gave it (for the replica's story: "replica 1, the serving leader").
#[derive(Debug)]
pub(crate) struct Donated {
    pub(crate) checkpoint: Checkpoint,
    pub(crate) donor: String,
}

/// What a donor hands over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// The last entry the donor's server had processed (`None`: no entry yet).
    pub(crate) cut: Option<Index>,
    pub(crate) sessions: Vec<Session>,
}

/// A checkpoint asked of this replica's agent.
#[derive(Debug)]
pub(crate) struct Request {
    /// Asked of a serving leader: its copy takes input from clients, which it must hold back
    /// for the cut (`Control::hold_clients`).
    pub(crate) of_leader: bool,
    /// The cut must be at or after this entry.
    pub(crate) upto: Option<Index>,
    /// Where the state file goes.
    pub(crate) dest: PathBuf,
    pub(crate) reply: Sender<Result<Checkpoint, DonateError>>,
}

/// Why this replica gives no checkpoint; sent to the asker as the text of an `error` line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DonateError {
    /// Answered by the state socket at once: the agent may itself be waiting for a peer.
    #[error("its copy is being rebuilt")]
    Rebuilding,
    /// Asked without `any` while serving, or while promoting.
    #[error("not a follower")]
    NotFollower,
    #[error("the replay agent stopped")]
    AgentStopped,
    #[error("the replay agent did not answer")]
    AgentSilent,
    #[error("unknown request {0}")]
    UnknownRequest(String),
    #[error("this replica has no state-transfer hook")]
    NoHook,
    /// Found by the agent, which was asked before the copy was discarded.
    #[error("this replica's copy is being rebuilt")]
    AgentRebuilding,
    #[error("this replica did not reach entry {0:?} in time")]
    NotReached(Option<Index>),
    #[error("no cut without a connection inside MULTI or blocked")]
    NoCleanCut,
    #[error(transparent)]
    Checkpoint(#[from] TransferError),
}

/// An index of a request or an answer that is not `ENTRY POSITION` in numbers.
#[derive(Debug, thiserror::Error)]
#[error("bad index {entry} {position}: {source}")]
pub(crate) struct IndexError {
    entry: String,
    position: String,
    source: std::num::ParseIntError,
}

/// Why a peer gave no checkpoint: it could not be asked, refused, or answered badly.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AskError {
    /// Connecting to its state socket or sending the request.
    #[error("{0}")]
    Connect(std::io::Error),
    #[error("the donor closed the connection")]
    Closed,
    #[error("reading the donor's answer: {0}")]
    Read(std::io::Error),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("bad session {line}: {source}")]
    Session { line: String, source: std::num::ParseIntError },
    #[error("bad hex {0}")]
    Hex(String),
    /// The text of the donor's `error` line (a [`DonateError`] on its side).
    #[error("the donor: {0}")]
    Refused(String),
    #[error("unexpected line from the donor: {0}")]
    Unexpected(String),
}

/// One peer that gave no checkpoint, asked with `any` or not.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {error}", peer.display(), if *any { " any" } else { "" })]
pub(crate) struct Refusal {
    peer: PathBuf,
    any: bool,
    error: AskError,
}

/// No peer gave a checkpoint: why each did not.
#[derive(Debug, thiserror::Error)]
#[error("no peer gave a checkpoint ({})", joined(.0))]
pub(crate) struct FetchError(Vec<Refusal>);

fn joined(refusals: &[Refusal]) -> String {
    refusals.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Why a request on the state socket went unanswered.
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    #[error("reading the request: {0}")]
    Read(std::io::Error),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("writing the answer: {0}")]
    Write(std::io::Error),
}

/// How long a donor may take (waiting for its agent to reach the entry, and for a clean cut).
pub(crate) const DONOR_PATIENCE: Duration = Duration::from_secs(60);

fn index_text(index: Option<Index>) -> String {
    index.map_or_else(|| "- -".into(), |i| format!("{} {}", i.entry, i.position))
}

fn parse_index(entry: &str, position: &str) -> Result<Option<Index>, IndexError> {
    if entry == "-" {
        return Ok(None);
    }
    let bad = |source| IndexError { entry: entry.into(), position: position.into(), source };
    Ok(Some(Index { entry: entry.parse().map_err(bad)?, position: position.parse().map_err(bad)? }))
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "-".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<String, AskError> {
    if text == "-" {
        return Ok(String::new());
    }
    let bytes: Result<Vec<u8>, _> = (0..text.len())
        .step_by(2)
        .map(|i| text.get(i..i + 2).ok_or(()).and_then(|h| u8::from_str_radix(h, 16).map_err(|_| ())))
        .collect();
    bytes.map(|b| String::from_utf8_lossy(&b).into_owned()).map_err(|()| AskError::Hex(text.into()))
}

/// Encodes an answer.
fn encode(answer: &Result<Checkpoint, DonateError>) -> String {
    match answer {
        Ok(c) => {
            let mut out = format!("cut {}\n", index_text(c.cut));
            for s in &c.sessions {
                out.push_str(&format!("session {} {} {} {}\n", s.conn, s.db, s.resp, hex(s.name.as_bytes())));
            }
            out.push_str("end\n");
            out
        }
        Err(e) => format!("error {}\n", e.to_string().replace('\n', " ")),
    }
}

/// Decodes an answer.
fn decode(reader: &mut impl BufRead) -> Result<Checkpoint, AskError> {
    let mut checkpoint = Checkpoint { cut: None, sessions: Vec::new() };
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(AskError::Closed),
            Ok(_) => {}
            Err(e) => return Err(AskError::Read(e)),
        }
        let text = line.trim_end();
        let words: Vec<&str> = text.split_whitespace().collect();
        let bad = |source| AskError::Session { line: text.into(), source };
        match words.as_slice() {
            ["cut", entry, position] => checkpoint.cut = parse_index(entry, position)?,
            ["session", conn, db, resp, name] => checkpoint.sessions.push(Session {
                conn: conn.parse().map_err(bad)?,
                db: db.parse().map_err(bad)?,
                resp: resp.parse().map_err(bad)?,
                name: unhex(name)?,
            }),
            ["end"] => return Ok(checkpoint),
            ["error", ..] => return Err(AskError::Refused(text.trim_start_matches("error ").into())),
            _ => return Err(AskError::Unexpected(text.into())),
        }
    }
}

/// Answers checkpoint requests on `listener` by handing them to the agent (`requests`): a
/// following replica donates; a serving leader only when asked with `any`, after the followers
/// (it holds its clients' input back while it saves).
pub(crate) fn serve(listener: &UnixListener, shared: &Arc<Shared>, requests: &Sender<Request>) {
    for stream in listener.incoming().flatten() {
        let (shared, requests) = (Arc::clone(shared), requests.clone());
        std::thread::spawn(move || {
            if let Err(e) = answer(stream, &shared, &requests) {
                tracing::warn!("state transfer request: {e}");
            }
        });
    }
}

fn answer(stream: UnixStream, shared: &Shared, requests: &Sender<Request>) -> Result<(), AnswerError> {
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).map_err(AnswerError::Read)?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let result = match words.as_slice() {
        // Answered here, not by the agent: a stale copy's agent may itself be waiting for a
        // peer's checkpoint (two copies being rebuilt asked each other and waited a minute).
        ["checkpoint", ..] if shared.progress.stale() => Err(DonateError::Rebuilding),
        ["checkpoint", entry, position, dest, rest @ ..]
            if shared.role() == Role::Following || (shared.role() == Role::Serving && rest == ["any"]) =>
        {
            let (tx, rx) = channel();
            let upto = parse_index(entry, position)?;
            let of_leader = shared.role() == Role::Serving;
            let request = Request { of_leader, upto, dest: PathBuf::from(dest), reply: tx };
            match requests.send(request) {
                Ok(()) => {
                    rx.recv_timeout(DONOR_PATIENCE + Duration::from_secs(5)).unwrap_or(Err(DonateError::AgentSilent))
                }
                Err(_) => Err(DonateError::AgentStopped),
            }
        }
        ["checkpoint", ..] => Err(DonateError::NotFollower),
        ["status"] => {
            let role = match shared.role() {
                Role::Following => "following",
                Role::Promoting => "promoting",
                Role::Serving => "serving",
            };
            // The agent handled an entry past the first (the log holds what came before) or
            // installed a peer's state, the copy is not being rebuilt, and nothing failed.
            let progress = &shared.progress;
            let applied = progress.applied.load(std::sync::atomic::Ordering::Acquire);
            let current = applied > 0 && !progress.stale() && progress.failure().is_none();
            let (matched, differed) = (&progress.output.matched, &progress.output.differed);
            let output = serde_json::json!({
                "buckets_matched": matched.load(std::sync::atomic::Ordering::Relaxed),
                "buckets_differed": differed.load(std::sync::atomic::Ordering::Relaxed),
            });
            let status = serde_json::json!({
                "node": shared.node.status(), "role": role, "copy_current": current, "output": output,
            });
            return (&stream).write_all(format!("{status}\n").as_bytes()).map_err(AnswerError::Write);
        }
        _ => Err(DonateError::UnknownRequest(line.trim_end().into())),
    };
    tracing::info!(ok = result.is_ok(), "state transfer: answered a checkpoint request");
    (&stream).write_all(encode(&result).as_bytes()).map_err(AnswerError::Write)
}

/// Asks the peers in `peers` (their directories), in turn, for a checkpoint at or after
/// `upto`, written to `dest`: the followers first, then anyone (a serving leader gives one when
/// no follower can: two copies needing state at once, with only the leader's current).
pub(crate) fn fetch(peers: &[PathBuf], upto: Option<Index>, dest: &Path) -> Result<Donated, FetchError> {
    let mut refusals = Vec::new();
    for (peer, any) in peers.iter().map(|p| (p, false)).chain(peers.iter().map(|p| (p, true))) {
        let whom = if any { " any" } else { "" };
        let asked = UnixStream::connect(peer.join(SOCKET_NAME)).and_then(|mut s| {
            s.set_read_timeout(Some(DONOR_PATIENCE + Duration::from_secs(10)))?;
            writeln!(s, "checkpoint {} {}{whom}", index_text(upto), dest.display())?;
            Ok(s)
        });
        match asked.map_err(AskError::Connect).and_then(|s| decode(&mut BufReader::new(s))) {
            Ok(checkpoint) => {
                let name = peer.file_name().map_or_else(|| peer.display().to_string(), |n| n.to_string_lossy().into());
                let name = name.replace('-', " ");
                let donor = if any { format!("{name}, the serving leader") } else { name };
                return Ok(Donated { checkpoint, donor });
            }
            Err(error) => refusals.push(Refusal { peer: peer.clone(), any, error }),
        }
    }
    Err(FetchError(refusals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let c = Checkpoint {
            cut: Some(Index { entry: 4097, position: 3 }),
            sessions: vec![
                Session { conn: 4096, db: 2, resp: 3, name: "a b".into() },
                Session { conn: 8192, db: 0, resp: 2, name: String::new() },
            ],
        };
        assert_eq!(decode(&mut encode(&Ok(c.clone())).as_bytes()).ok(), Some(c));
        let none = Checkpoint { cut: None, sessions: Vec::new() };
        assert_eq!(decode(&mut encode(&Ok(none.clone())).as_bytes()).ok(), Some(none));
        let refused = DonateError::UnknownRequest("stat\nus".into());
        let e = decode(&mut encode(&Err(refused)).as_bytes()).expect_err("error");
        assert_eq!(e.to_string(), "the donor: unknown request stat us");
        assert!(matches!(decode(&mut "cut 1\n".as_bytes()), Err(AskError::Unexpected(line)) if line == "cut 1"));
        assert!(matches!(decode(&mut "cut 1 2\n".as_bytes()), Err(AskError::Closed)), "no end");
        let e = decode(&mut "session 1 x 2 -\n".as_bytes()).expect_err("bad session");
        assert_eq!(e.to_string(), "bad session session 1 x 2 -: invalid digit found in string");
    }

    #[test]
    fn a_failed_fetch_says_why_each_peer_gave_nothing() {
        let dir = std::env::temp_dir().join(format!("microrep-transfer-{}", std::process::id()));
        let peers = [dir.join("replica-1"), dir.join("replica-2")];
        let e = fetch(&peers, None, &dir.join("incoming.state")).expect_err("no peer listens");
        let text = e.to_string();
        assert!(text.starts_with("no peer gave a checkpoint ("), "{text}");
        let one = format!("{}: ", peers[0].display());
        let any = format!("; {} any: ", peers[1].display());
        assert!(text.contains(&one) && text.contains(&any) && text.matches("; ").count() == 3, "{text}");
    }
}
