//! The RESP server's requests in front of a replica: what each command does, and the replies
//! in request order. Requests that arrive together (pipelining, or several clients in one
//! turn of the event loop, `event_loop`) are proposed together, batched into as few log
//! entries as fit (`turn`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use std::rc::Rc;

use microrep::config::AttachMode;
use microrep::{Apply, Index, MembershipChange, Node, NodeId, ProposeError};

use crate::reply::ErrorReply;
use crate::turn::{Group, Turn};
use crate::{KvStore, resp, store};

/// Most connections served at once; more are refused with an error.
pub const MAX_CONNECTIONS: usize = 1024;

/// Where commands are executed.
#[derive(Clone, Debug)]
pub enum Backend {
    /// Through the replicated log of this replica.
    Replicated(Arc<Node>),
    /// Directly on a local store, unreplicated: the baseline of `microrep bench resp`.
    Unreplicated(Arc<std::sync::Mutex<KvStore>>),
}

/// What a server needs besides its listener.
#[derive(Clone, Debug)]
pub struct ServerContext {
    /// Where commands run.
    pub backend: Backend,
    /// Client addresses of every member, by id, for redirects.
    pub members: Arc<Vec<String>>,
    /// Largest argument accepted.
    pub max_bulk: usize,
    /// Set to stop serving.
    pub stop: Arc<AtomicBool>,
}

/// A reply in request order: known at once, or waiting for the log (command `.1` of the
/// turn's group `.0`).
enum Reply {
    Ready(Vec<u8>),
    Replicating(Rc<Group>, usize),
}

/// One client's requests and replies, apart from its socket (`event_loop` reads and writes it).
pub(crate) struct Connection<'a> {
    ctx: &'a ServerContext,
    /// Bytes read and not parsed yet (a request cut by the read's end).
    pub(crate) input: Vec<u8>,
    /// Replies encoded and not written yet.
    pub(crate) output: Vec<u8>,
    replies: Vec<Reply>,
    command: Vec<u8>,
}

impl<'a> Connection<'a> {
    pub(crate) fn new(ctx: &'a ServerContext) -> Self {
        Self { ctx, input: Vec::new(), output: Vec::new(), replies: Vec::new(), command: Vec::new() }
    }

    /// Parses every whole request in the input and starts it, adding replicated commands to
    /// `turn` (proposed once the turn has read every client). Returns whether to close.
    pub(crate) fn handle_input(&mut self, turn: &mut Turn) -> bool {
        let mut used = 0;
        let quit = loop {
            match resp::parse(&self.input[used..], self.ctx.max_bulk) {
                Ok(None) => break false,
                Ok(Some((args, n))) => {
                    used += n;
                    if self.request(&args, turn) {
                        break true;
                    }
                }
                Err(e) => {
                    // Redis closes the connection on a protocol error: the stream cannot be
                    // resynchronised.
                    let mut out = Vec::new();
                    resp::error(&mut out, &format!("ERR Protocol error: {e}"));
                    self.replies.push(Reply::Ready(out));
                    break true;
                }
            }
        };
        self.input.drain(..used);
        quit
    }

    /// Starts one request. Returns whether the client asked to close.
    fn request(&mut self, args: &[Vec<u8>], turn: &mut Turn) -> bool {
        let Some(name) = args.first().map(|n| n.to_ascii_uppercase()) else { return false };
        let mut out = Vec::new();
        match name.as_slice() {
            b"PING" => match args.get(1) {
                Some(msg) if args.len() == 2 => resp::bulk(&mut out, Some(msg)),
                None => resp::simple(&mut out, "PONG"),
                Some(_) => resp::error(&mut out, "ERR wrong number of arguments for 'ping' command"),
            },
            b"QUIT" => {
                resp::simple(&mut out, "OK");
                self.replies.push(Reply::Ready(out));
                return true;
            }
            // Asked by redis-benchmark and redis-cli at start; nothing to configure here.
            b"CONFIG" | b"COMMAND" => resp::array(&mut out, 0),
            b"MICROREP.STATUS" => {
                let status = match &self.ctx.backend {
                    Backend::Replicated(node) => node.status().to_json(),
                    Backend::Unreplicated(_) => r#"{"role":"unreplicated"}"#.to_string(),
                };
                resp::bulk(&mut out, Some(status.as_bytes()));
            }
            b"MICROREP.MEMBER" => {
                // A change waits until it is applied: what this client sent before it goes first.
                if let Backend::Replicated(node) = &self.ctx.backend {
                    turn.propose(node);
                }
                self.change_membership(args, &mut out);
            }
            // Asked by `microrep member remove` of the member it removed: the node stops.
            b"MICROREP.LEAVE" => match &self.ctx.backend {
                Backend::Replicated(node) => match node.leave() {
                    Ok(()) => resp::simple(&mut out, "OK stopping"),
                    Err(why) => resp::error(&mut out, &format!("ERR {why}")),
                },
                Backend::Unreplicated(_) => resp::error(&mut out, "ERR an unreplicated server has no members"),
            },
            _ => match (store::encode(args, &mut self.command), &self.ctx.backend) {
                (Err(e), _) => resp::error(&mut out, &e.to_string()),
                (Ok(()), Backend::Replicated(node)) => {
                    let (group, position) = match node.attach_mode() {
                        AttachMode::Direct => turn.add(&self.command, node.max_entry_bytes()),
                        AttachMode::Handover => (Group::proposed(node, &self.command), 0),
                    };
                    self.replies.push(Reply::Replicating(group, position));
                    return false;
                }
                (Ok(()), Backend::Unreplicated(store)) => {
                    let mut store = store.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    store.apply(Index { entry: 0, position: 0 }, &self.command, &mut out);
                }
            },
        }
        self.replies.push(Reply::Ready(out));
        false
    }

    /// `MICROREP.MEMBER ADD|REMOVE <id>`: one membership change through this node, which must
    /// lead (`microrep member`). Replies `+OK members 0,1,3 epoch 2` once it is applied here.
    fn change_membership(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        let Backend::Replicated(node) = &self.ctx.backend else {
            return resp::error(out, "ERR an unreplicated server has no members");
        };
        let op = args.get(1).map(|a| a.to_ascii_uppercase());
        let id = args.get(2).and_then(|a| std::str::from_utf8(a).ok()).and_then(|a| a.parse::<u16>().ok());
        let change = match (op.as_deref(), id, args.len()) {
            (Some(b"ADD"), Some(id), 3) => MembershipChange::Add(NodeId(id)),
            (Some(b"REMOVE"), Some(id), 3) => MembershipChange::Remove(NodeId(id)),
            _ => return resp::error(out, "ERR usage: MICROREP.MEMBER ADD|REMOVE <id>"),
        };
        match node.change_membership(change) {
            Ok(c) => {
                let ids: Vec<String> = c.members.iter().map(|id| id.0.to_string()).collect();
                resp::simple(out, &format!("OK members {} epoch {}", ids.join(","), c.epoch));
            }
            Err(e) => self.refusal(&e, out),
        }
    }

    /// Waits for the replies in request order and encodes them into `output`.
    pub(crate) fn finish_replies(&mut self) {
        for reply in std::mem::take(&mut self.replies) {
            match reply {
                Reply::Ready(bytes) => self.output.extend_from_slice(&bytes),
                Reply::Replicating(group, position) => match group.reply(position) {
                    Ok(reply) => self.output.extend_from_slice(&reply),
                    Err(e) => {
                        let mut out = Vec::new();
                        self.refusal(&e, &mut out);
                        self.output.extend_from_slice(&out);
                    }
                },
            }
        }
    }

    /// The error reply for a proposal that was refused or whose outcome is unknown.
    fn refusal(&self, e: &ProposeError, out: &mut Vec<u8>) {
        let reply = match e {
            ProposeError::NotLeader { leader: Some(l) } => ErrorReply::NotLeader {
                id: Some(l.0),
                addr: self.ctx.members.get(usize::from(l.0)).and_then(|a| a.parse().ok()),
            },
            ProposeError::NotLeader { leader: None } => ErrorReply::NoLeader,
            ProposeError::Backlogged => ErrorReply::TryAgain,
            ProposeError::TooLarge { .. }
            | ProposeError::TooManyCommands { .. }
            | ProposeError::StateTooLarge { .. }
            | ProposeError::Membership(_) => ErrorReply::Other(format!("ERR {e}")),
            ProposeError::Unknown | ProposeError::Timeout | ProposeError::Shutdown => {
                ErrorReply::Unknown(e.to_string())
            }
        };
        let text = reply.to_string();
        resp::error(out, &text);
    }
}
