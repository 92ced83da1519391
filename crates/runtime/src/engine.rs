//! The replication side of a node: Mu's replication plane, the application behind it, and the
//! proposals waiting for their outcome. Whoever holds the engine's lock polls it: the
//! replication thread, or a proposing thread in direct mode (Mu §7.1).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use microrep_core::mu::slot::Frame;
use microrep_core::mu::{self, Event, LeaderView, ReplicationPlane, StateMachine};
use microrep_fabric::Fabric;

use crate::api::{Apply, Committed, Index, ProposeError};
use crate::batch::{self, BatchWriter};
use crate::durable::{DurableError, DurableLog, Kind, Recovered, Sink};
use crate::events::{EventLog, NodeEvent};
use crate::generation::GenerationFile;
use crate::metrics::SwitchClock;
use crate::node::{Queued, Request, Shared, Submitted};
use crate::ticket::Ticket;

/// An engine with its fabric and application types erased, so that a non-generic node handle
/// and proposing threads can drive it.
pub(crate) trait Drive: Send {
    /// Moves queued requests into the log, polls the plane once, completes proposals whose
    /// outcome is known. Returns whether anything happened (the caller then polls again at
    /// once instead of pausing).
    fn poll(&mut self, now: u64) -> bool;

    /// Proposes one command, or with `batch` one entry the caller encoded with
    /// `batch::encode_batch` (direct mode).
    fn submit(&mut self, submitted: Submitted<'_>, ticket: Arc<Ticket>);

    /// Refreshes the shared status.
    fn publish_status(&mut self, now: u64);

    /// Proposes a membership change (`mu::membership`); the ticket completes once it is applied
    /// here (or with why it was refused).
    fn change_membership(&mut self, change: mu::MembershipChange, ticket: Arc<Ticket>);

    /// Fails every proposal still waiting (the node stops).
    fn fail_all(&mut self, error: ProposeError);

    /// Stops the durable log's writer, if the node keeps one: with `flush` after it synced
    /// what is queued, otherwise at once (see `DurableLog::stop`).
    fn stop_log(&mut self, flush: bool);
}

/// Adapts an [`Apply`] to Mu's [`StateMachine`]: unpacks batches, keeps the replies the local
/// proposers wait for, and appends the committed entries the core hands it (before applying
/// them) to the durable log if there is one.
struct AppAdapter<A> {
    app: A,
    events: EventLog,
    collect: bool,
    replies: Replies,
    scratch: Vec<u8>,
    /// The durable log's queue: every committed entry, every snapshot taken or restored.
    log: Option<Sink>,
    /// The index the next entry applied will have (a snapshot's index).
    next: u64,
}

impl<A: Apply> StateMachine for AppAdapter<A> {
    fn apply(&mut self, entry: u64, command: &[u8]) {
        if self.events.is_on() {
            let digest = Some(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(command)));
            self.events.emit(NodeEvent::Applied { index: entry, digest });
        }
        let Self { app, collect, replies, scratch, .. } = self;
        let decoded = batch::for_each(command, |position, cmd| {
            let index = Index { entry, position };
            scratch.clear();
            app.apply(index, cmd, scratch);
            if *collect {
                replies.push(index, scratch);
            }
        });
        if let Err(e) = decoded {
            // Every replica decodes the same bytes, so every replica skips this entry alike.
            tracing::error!(entry, error = %e, "skipping a malformed log entry");
        }
        self.next = entry + 1;
    }

    fn skip(&mut self, index: u64) {
        self.events.emit(NodeEvent::Applied { index, digest: None });
        self.next = index + 1;
    }

    fn persist(&mut self, index: u64, command: Option<&[u8]>) {
        if let Some(log) = &self.log {
            match command {
                Some(command) => log.entry(index, Kind::Entry, command),
                None => log.entry(index, Kind::Skip, &[]),
            }
        }
    }

    fn persist_membership(&mut self, index: u64, configuration: mu::Configuration) {
        if let Some(log) = &self.log {
            log.entry(index, Kind::Membership, &configuration.to_bytes());
        }
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        self.app.snapshot(out);
    }

    fn restore(&mut self, index: u64, snapshot: &[u8]) -> Result<(), mu::RestoreError> {
        self.app.restore(snapshot)?;
        self.next = index;
        Ok(())
    }

    /// Every snapshot the core takes (every `snapshot_every` entries) or restores from a peer
    /// is a checkpoint: the durable log starts again from it.
    fn checkpoint(&self, index: u64, configuration: mu::Configuration, state: &[u8]) {
        if let Some(log) = &self.log {
            log.checkpoint(index, configuration, state);
        }
    }
}

impl<A: Apply> AppAdapter<A> {
    /// Restores what `recovered` holds (the checkpoint, then the entries after it) without
    /// appending it to the log again. Returns the index below which everything is applied and
    /// the configuration there (`initial` if the log holds none).
    fn replay(
        &mut self,
        recovered: Recovered,
        initial: mu::Configuration,
    ) -> Result<(u64, mu::Configuration), DurableError> {
        let end = recovered.end();
        let (path, index) = (recovered.path.clone(), recovered.checkpoint);
        self.app.restore(&recovered.state).map_err(|source| DurableError::Restore { path, index, source })?;
        let mut configuration = recovered.configuration.unwrap_or(initial);
        for (i, (kind, payload)) in recovered.entries.into_iter().enumerate() {
            let index = recovered.checkpoint + i as u64;
            match kind {
                Kind::Entry => StateMachine::apply(self, index, &payload),
                Kind::Membership => {
                    // Recovery accepts only membership records whose configuration is valid.
                    configuration = mu::Configuration::from_bytes(&payload).unwrap_or(configuration);
                    StateMachine::skip(self, index);
                }
                Kind::Skip | Kind::Checkpoint | Kind::InitialCheckpoint => StateMachine::skip(self, index),
            }
        }
        self.next = end;
        Ok((end, configuration))
    }
}

/// The proposers waiting for one log entry: one per command of an entry the engine batched,
/// or the one proposer of an entry it encoded itself (`Node::submit_batch`), whose reply holds
/// every command's.
struct Waiting {
    tickets: Vec<Arc<Ticket>>,
    batch: bool,
}

impl Waiting {
    fn fail(&self, error: &ProposeError) {
        self.tickets.iter().for_each(|t| t.complete(Err(error.clone())));
    }
}

/// Where the bytes of an entry to propose are.
enum EntrySource {
    /// The engine's batch writer.
    Writer,
    /// The engine's single-command buffer.
    Single,
    /// A batch its proposer encoded and handed over: its frame becomes the entry's.
    Handed(Frame),
}

/// The replies the commands applied in one poll gave, in the order they were applied (so by
/// entry, then by position), in one buffer.
#[derive(Debug, Default)]
struct Replies {
    bytes: Vec<u8>,
    /// Each command's index and where its reply ends in `bytes` (it starts where the previous
    /// one ends).
    marks: Vec<(Index, usize)>,
}

impl Replies {
    fn push(&mut self, index: Index, reply: &[u8]) {
        self.bytes.extend_from_slice(reply);
        self.marks.push((index, self.bytes.len()));
    }

    /// The range of `marks` that entry `entry` applied.
    fn of_entry(&self, entry: u64) -> std::ops::Range<usize> {
        let start = self.marks.partition_point(|(i, _)| i.entry < entry);
        let end = start + self.marks[start..].partition_point(|(i, _)| i.entry == entry);
        start..end
    }

    fn span(&self, mark: usize) -> std::ops::Range<usize> {
        let start = mark.checked_sub(1).map_or(0, |m| self.marks[m].1);
        start..self.marks[mark].1
    }

    /// The reply of the command at `at`, among the marks `of` (empty if it gave none).
    fn reply(&self, of: &std::ops::Range<usize>, at: Index) -> &[u8] {
        // Positions are applied in order, so the command at position p is usually mark p.
        let direct = of.start + at.position as usize;
        let mark = if of.contains(&direct) && self.marks[direct].0 == at {
            Some(direct)
        } else {
            self.marks[of.clone()].iter().position(|(i, _)| *i == at).map(|m| of.start + m)
        };
        mark.map_or(&[][..], |m| &self.bytes[self.span(m)])
    }

    /// The replies of the marks `of`, encoded for `BatchCommitted`: each as its length (u32
    /// LE) and its bytes.
    fn encode(&self, of: std::ops::Range<usize>) -> Vec<u8> {
        if of.is_empty() {
            return Vec::new();
        }
        // The replies of consecutive marks are consecutive in `bytes`.
        let mut start = self.span(of.start).start;
        let end = self.marks[of.end - 1].1;
        let mut out = Vec::with_capacity(4 * of.len() + (end - start));
        for &(_, reply_end) in &self.marks[of] {
            out.extend_from_slice(&((reply_end - start) as u32).to_le_bytes());
            out.extend_from_slice(&self.bytes[start..reply_end]);
            start = reply_end;
        }
        out
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.marks.clear();
    }
}

/// The replication side of one node.
pub(crate) struct Engine<F: Fabric, A> {
    fabric: Arc<F>,
    plane: ReplicationPlane<F::Endpoint>,
    app: AppAdapter<A>,
    shared: Arc<Shared>,
    inflight: HashMap<u64, Waiting>,
    next_request: u64,
    events: Vec<Event>,
    writer: BatchWriter,
    entry: Vec<u8>,
    group: Vec<Request>,
    staged: Option<Request>,
    max_entry: usize,
    next_status_ns: u64,
    generation: GenerationFile,
    switch: SwitchClock,
    /// The durable log (`cluster.durability = "fsync"`).
    durable: Option<DurableLog>,
}

impl<F, A> Engine<F, A>
where
    F: Fabric + Send + Sync + 'static,
    F::Endpoint: Send + 'static,
    A: Apply,
{
    /// The engine of a node. With a durable log, what it recovered is restored into `app` and
    /// the plane starts from it (`ReplicationPlane::restore_durable`).
    pub(crate) fn new(
        fabric: Arc<F>,
        mut plane: ReplicationPlane<F::Endpoint>,
        app: A,
        shared: Arc<Shared>,
        events: EventLog,
        generation: GenerationFile,
        durable: Option<(DurableLog, Option<Recovered>)>,
    ) -> Result<Self, DurableError> {
        let mu = &shared.mu;
        // Request ids name proposals of this incarnation only: start from the wall clock, so
        // that an entry proposed by an earlier incarnation of this node is never mistaken
        // for one of ours.
        let epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        let mut app = AppAdapter {
            app,
            events,
            collect: false,
            replies: Replies::default(),
            scratch: Vec::new(),
            log: None,
            next: 0,
        };
        let durable = match durable {
            Some((log, recovered)) => {
                let initial = mu::Configuration { members: plane.initial_members(), epoch: 0 };
                let (end, configuration) =
                    recovered.map(|r| app.replay(r, initial)).transpose()?.unwrap_or((0, initial));
                app.log = log.sink();
                if end > 0 {
                    tracing::info!(index = end, members = %configuration.members, epoch = configuration.epoch, "restored from the durable log");
                }
                plane.restore_durable(&*fabric, &app, end, configuration);
                Some(log)
            }
            None => None,
        };
        Ok(Self {
            max_entry: mu.max_payload_bytes(),
            fabric,
            switch: SwitchClock::new(plane.applied()),
            plane,
            app,
            inflight: HashMap::new(),
            next_request: epoch,
            events: Vec::new(),
            writer: BatchWriter::default(),
            entry: Vec::new(),
            group: Vec::new(),
            staged: None,
            shared,
            next_status_ns: 0,
            generation,
            durable,
        })
    }

    /// Proposes the entry `source` names for `waiting`'s proposers.
    fn propose_entry(&mut self, waiting: Waiting, source: EntrySource) {
        let id = self.next_request;
        self.next_request += 1;
        let proposed = match source {
            EntrySource::Writer => self.plane.propose(id, self.writer.bytes()),
            EntrySource::Single => self.plane.propose(id, &self.entry),
            EntrySource::Handed(frame) => self.plane.propose_framed(id, frame),
        };
        match proposed {
            Ok(()) => {
                self.inflight.insert(id, waiting);
            }
            Err(e) => {
                let error = match e {
                    mu::ProposeError::NotLeader { leader } => ProposeError::NotLeader { leader: Some(leader) },
                    mu::ProposeError::TooLarge { len, max } => ProposeError::TooLarge { len, max },
                    mu::ProposeError::Backlogged { .. } => ProposeError::Backlogged,
                    mu::ProposeError::StateTooLarge { state, limit } => ProposeError::StateTooLarge { state, limit },
                    mu::ProposeError::Membership(why) => ProposeError::Membership(why),
                };
                waiting.fail(&error);
            }
        }
    }

    /// Proposes a batch entry of `len` bytes its proposer encoded (`Node::submit_batch`),
    /// alone.
    fn propose_encoded(&mut self, len: usize, entry: EntrySource, ticket: Arc<Ticket>) {
        if len > self.max_entry {
            ticket.complete(Err(ProposeError::TooLarge { len, max: self.max_entry }));
            return;
        }
        self.propose_entry(Waiting { tickets: vec![ticket], batch: true }, entry);
    }

    /// Moves queued requests into log entries: alone, or batched up to `max_batch` commands
    /// that fit in one slot together. Returns whether there were any.
    fn drain_queue(&mut self) -> bool {
        let mut any = false;
        while let Some(first) = self.staged.take().or_else(|| self.shared.queue.pop()) {
            any = true;
            let first = match first {
                Request { entry: Queued::Batch(frame), ticket } => {
                    self.propose_encoded(frame.payload().len(), EntrySource::Handed(frame), ticket);
                    continue;
                }
                command => command,
            };
            let len = first.command().map_or(0, <[u8]>::len);
            if len + 1 > self.max_entry {
                first.ticket.complete(Err(ProposeError::TooLarge { len, max: self.max_entry - 1 }));
                continue;
            }
            let mut size = batch::BATCH_HEADER + batch::PER_COMMAND + len;
            self.group.push(first);
            let max_batch = self.shared.max_batch.load(Ordering::Relaxed);
            while self.group.len() < max_batch {
                let Some(next) = self.shared.queue.pop() else { break };
                let fits = next.command().is_some_and(|command| {
                    size += batch::PER_COMMAND + command.len();
                    size <= self.max_entry
                });
                if !fits {
                    self.staged = Some(next);
                    break;
                }
                self.group.push(next);
            }
            let group = std::mem::take(&mut self.group);
            let is_batch = group.len() > 1;
            if is_batch {
                self.writer.start();
                group.iter().filter_map(Request::command).for_each(|command| self.writer.push(command));
            } else {
                batch::encode_single(group[0].command().unwrap_or_default(), &mut self.entry);
            }
            let tickets = group.into_iter().map(|r| r.ticket).collect();
            let source = if is_batch { EntrySource::Writer } else { EntrySource::Single };
            self.propose_entry(Waiting { tickets, batch: false }, source);
        }
        any
    }

    fn handle_events(&mut self) {
        for event in self.events.drain(..) {
            match event {
                Event::Committed { request_id, index } => {
                    let Some(waiting) = self.inflight.remove(&request_id) else { continue };
                    if let Some(metrics) = &self.shared.metrics {
                        let now = self.shared.now();
                        for ticket in &waiting.tickets {
                            metrics.committed(now.saturating_sub(ticket.submitted_ns()));
                        }
                    }
                    let replies = self.app.replies.of_entry(index);
                    if waiting.batch {
                        let at = Index { entry: index, position: 0 };
                        for ticket in waiting.tickets {
                            let reply = self.app.replies.encode(replies.clone());
                            ticket.complete(Ok(Committed { index: at, reply }));
                        }
                        continue;
                    }
                    for (position, ticket) in waiting.tickets.into_iter().enumerate() {
                        let at = Index { entry: index, position: position as u32 };
                        let reply = self.app.replies.reply(&replies, at).to_vec();
                        ticket.complete(Ok(Committed { index: at, reply }));
                    }
                }
                Event::Failed { request_id, maybe_committed } => {
                    let Some(waiting) = self.inflight.remove(&request_id) else { continue };
                    let leader = self.shared.leader().filter(|&l| l != self.shared.mu.node);
                    let error =
                        if maybe_committed { ProposeError::Unknown } else { ProposeError::NotLeader { leader } };
                    waiting.fail(&error);
                }
                Event::LeaderChanged { leader } => {
                    self.app.events.emit(NodeEvent::LeaderChange { leader: leader.0 });
                    self.shared.record_leader_change(leader);
                    if let Some(metrics) = &self.shared.metrics {
                        self.switch.leader_changed(metrics, self.plane.applied());
                    }
                }
                Event::Voter { generation } => {
                    tracing::info!(generation = format_args!("{generation:016x}"), "a voter of the cluster");
                    // Once per bootstrap or promotion: a file write and two fsyncs here.
                    if let Err(e) = self.generation.remember(generation) {
                        self.shared.fail(format!("cannot remember the cluster generation: {e}"));
                    }
                }
                Event::ClusterLost { generation } => self.shared.fail(cluster_lost(generation, &self.generation)),
                Event::RestartedFromDisk { index, generation } => tracing::info!(
                    index,
                    generation = format_args!("{generation:016x}"),
                    "every member restarted: this node had the most durable state and leads the others back"
                ),
                Event::MembershipChanged { index, configuration } => {
                    let member = configuration.members.contains(self.shared.mu.node);
                    tracing::info!(index, members = %configuration.members, epoch = configuration.epoch, member, "configuration changed");
                    self.app.events.emit(NodeEvent::Membership {
                        index,
                        members: configuration.members.iter().map(|id| id.0).collect(),
                    });
                    self.shared.set_member(member, index);
                    self.shared.with_status(|s| s.set_configuration(configuration));
                }
                Event::Restored { index, from } => {
                    tracing::info!(index, from = from.0, "restored a snapshot");
                    self.app.events.emit(NodeEvent::Restore { index, from: from.0 });
                }
            }
        }
        self.app.replies.clear();
    }
}

/// Why a node stops when its cluster lost its state (see `Event::ClusterLost`).
fn cluster_lost(generation: u64, file: &GenerationFile) -> String {
    let which = if generation == 0 { String::new() } else { format!(" of generation {generation:016x}") };
    let kept = file.path().map_or_else(
        || "this node keeps no data directory (node.data_dir)".to_string(),
        |p| format!("this node's generation file is {}", p.display()),
    );
    format!(
        "the cluster{which} lost its state: every member is live and none is a voter, so every member restarted \
         without its log (microrep keeps the log in memory). Starting it again would start an empty cluster and \
         silently lose every acknowledged write, so this node stops ({kept}). To start a new, empty cluster, \
         start every member with --force-new (node.force_new = true)."
    )
}

impl<F, A> Drive for Engine<F, A>
where
    F: Fabric + Send + Sync + 'static,
    F::Endpoint: Send + 'static,
    A: Apply,
{
    fn poll(&mut self, now: u64) -> bool {
        let mut worked = self.drain_queue();
        if let Some(log) = &self.durable {
            let durable = log.durable();
            worked |= durable != self.plane.durable();
            self.plane.set_durable(durable);
            if let Some(why) = log.failure() {
                self.shared.fail(why);
            }
        }
        let rounds = self.shared.detector_rounds();
        let view = LeaderView {
            leader: self.shared.leader().unwrap_or(self.shared.mu.node),
            rounds,
            live: self.shared.live.get(),
        };
        let applied = self.plane.applied();
        self.app.collect = !self.inflight.is_empty();
        self.plane.poll(&*self.fabric, now, view, &mut self.app, &mut self.events);
        worked |= !self.events.is_empty() || self.plane.applied() != applied || self.plane.is_busy();
        self.handle_events();
        if let Some(metrics) = &self.shared.metrics {
            self.switch.poll(metrics, self.plane.applied(), now);
        }
        let stalled = self.plane.stalled(now);
        if stalled != self.shared.stalled.load(Ordering::Relaxed) {
            self.shared.stalled.store(stalled, Ordering::Relaxed);
        }
        // Set while busy, cleared by the background thread when it reads it: one store per
        // background poll at most, not two per commit.
        if self.plane.is_busy() && !self.shared.busy.load(Ordering::Relaxed) {
            self.shared.busy.store(true, Ordering::Relaxed);
        }
        if now >= self.next_status_ns {
            self.publish_status(now);
        }
        worked
    }

    fn submit(&mut self, submitted: Submitted<'_>, ticket: Arc<Ticket>) {
        let command = match submitted {
            Submitted::Batch(frame) => {
                return self.propose_encoded(frame.payload().len(), EntrySource::Handed(frame), ticket);
            }
            Submitted::Command(command) => command,
        };
        if command.len() + 1 > self.max_entry {
            ticket.complete(Err(ProposeError::TooLarge { len: command.len(), max: self.max_entry - 1 }));
            return;
        }
        batch::encode_single(command, &mut self.entry);
        self.propose_entry(Waiting { tickets: vec![ticket], batch: false }, EntrySource::Single);
    }

    fn change_membership(&mut self, change: mu::MembershipChange, ticket: Arc<Ticket>) {
        let id = self.next_request;
        self.next_request += 1;
        match self.plane.propose_membership(id, change) {
            Ok(()) => {
                self.inflight.insert(id, Waiting { tickets: vec![ticket], batch: false });
            }
            Err(mu::ProposeError::NotLeader { leader }) => {
                ticket.complete(Err(ProposeError::NotLeader { leader: Some(leader) }));
            }
            Err(mu::ProposeError::Backlogged { .. }) => ticket.complete(Err(ProposeError::Backlogged)),
            Err(mu::ProposeError::Membership(why)) => ticket.complete(Err(ProposeError::Membership(why))),
            Err(e) => ticket.complete(Err(ProposeError::Membership(e.to_string()))),
        }
    }

    fn publish_status(&mut self, now: u64) {
        self.next_status_ns = now + 10_000_000;
        let core = self.plane.status();
        let digest = self.app.app.digest();
        self.shared.with_status(|s| s.refresh(&core, digest, now));
    }

    fn stop_log(&mut self, flush: bool) {
        if let Some(log) = self.durable.as_mut() {
            log.stop(flush);
        }
    }

    fn fail_all(&mut self, error: ProposeError) {
        for (_, waiting) in self.inflight.drain() {
            waiting.fail(&error);
        }
        while let Some(r) = self.staged.take().or_else(|| self.shared.queue.pop()) {
            r.ticket.complete(Err(error.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_encode_as_lengths_and_bytes_for_one_entry_of_several() {
        let mut replies = Replies::default();
        let at = |entry, position| Index { entry, position };
        replies.push(at(4, 0), b"old");
        replies.push(at(5, 0), b"ab");
        replies.push(at(5, 1), b"");
        replies.push(at(5, 2), b"cde");
        replies.push(at(6, 0), b"next");
        let of = replies.of_entry(5);
        assert_eq!(of, 1..4);
        assert_eq!(
            replies.encode(of.clone()),
            [&2u32.to_le_bytes()[..], b"ab", &0u32.to_le_bytes(), &3u32.to_le_bytes(), b"cde"].concat()
        );
        assert_eq!(replies.reply(&of, at(5, 2)), b"cde");
        assert!(replies.encode(replies.of_entry(9)).is_empty());
    }
}
