//! [`Member`]: one member of a multicast group, a sans-IO state machine polled by its owner.
//!
//! One poll evaluates Derecho's predicates for every subgroup the member is in, each step
//! batched as Spindle does:
//!
//! 1. **receive**: for every peer sender, read its `sent_num` guard from the local SST and
//!    take in every message below it: a short one copied out, a long one noted where it lies
//!    (nulls need nothing);
//! 2. **deliver**: find every sequence number that every member has received (stability: the
//!    minimum of the `received` counters of all members' rows) and hand all of them to one
//!    upcall, a long payload read where it landed in the sender's ring (whose slot the sender
//!    reuses only once every member has delivered it: the `delivered` counters);
//! 3. **null-send**: a sender that has received a message it would precede in the round-robin
//!    order, and has nothing of its own there, adds nulls to its stream (one counter raise);
//! 4. **push**: per peer, at most two WRITEs of the ring's newly committed slots (two when the
//!    run wraps), then one WRITE of this member's counter block (sent_num, received,
//!    delivered), only if it changed. The block goes after the slots on the same FIFO
//!    endpoint: that order makes `sent_num` the slots' guard.
//!
//! Where the fabric lends a peer's memory (shm), rings are **pulled** instead: the sender
//! writes its new slots once, into its own row, before its counter blocks go out, and a
//! receiver reads them, and delivers long ones in place, in the sender's memory
//! (docs/MULTICAST.md, "Rings pulled from the sender's memory").

use microrep_fabric::{Endpoint, EndpointState, Fabric, FabricError, NodeId, RegionSpec, RemoteAddr};

use super::api::{Deliver, JoinError, MulticastError, SendError, Stats};
use super::ask::{Asking, GiveUp};
use super::config::{ConfigError, GroupConfig};
use super::idle::Quiet;
use super::layout::{Layout, SLOT_HEADER_BYTES, SST_REGION, SubgroupLayout, rank_of};
use super::next::JoinRequest;
use super::predicates::RingAt;
use super::smc::{Inbox, SenderRing, seq_of};
use super::transfer::{StateLayout, Transfer};
use super::view::{Phase, ViewState};

pub(super) use super::predicates::post;

/// An endpoint to one peer and whether it needs a reconnect.
#[derive(Debug)]
pub(super) struct Link<E> {
    pub(super) peer: NodeId,
    /// `None` until a connection is made: a view may name a member that failed before this
    /// member connected to it (it is removed by the next change).
    pub(super) ep: Option<E>,
    pub(super) broken: bool,
}

impl<E: Endpoint> Link<E> {
    /// A link to `peer`, connected now if it answers, else on a later poll.
    pub(super) fn open<F: Fabric<Endpoint = E>>(fabric: &F, peer: NodeId) -> Result<Self, MulticastError> {
        let ep = match fabric.try_connect(peer) {
            Ok(ep) => ep,
            Err(FabricError::PeerUnreachable(..)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Self { peer, broken: ep.is_none(), ep })
    }
}

/// What one peer has been sent of this member's part of a subgroup.
#[derive(Debug)]
pub(super) struct PeerPush {
    pub(super) link: usize,
    /// Real messages of this member's ring written to the peer.
    pub(super) real_pushed: u64,
    /// The counter-block version last written to the peer.
    pub(super) version_pushed: Option<u64>,
}

/// A member's state in one subgroup it belongs to.
#[derive(Debug)]
pub(super) struct Subgroup {
    pub(super) index: usize,
    pub(super) layout: SubgroupLayout,
    /// Group rows of the subgroup's members other than this one.
    pub(super) peer_rows: Vec<usize>,
    /// Group row of each sender rank.
    pub(super) sender_rows: Vec<usize>,
    pub(super) sender_ids: Vec<NodeId>,
    /// Pulled rings (a fabric that lends a peer's memory, shm): per sender rank, the link
    /// whose endpoint reads that sender's ring in the sender's own memory, `None` at this
    /// member's own rank. Empty when rings are pushed: each sender writes its slots into every
    /// member's copy of its row, as Derecho's SST does over RDMA.
    pub(super) sender_links: Vec<Option<usize>>,
    /// Pulled: real messages of this member's ring written into its own SST row, where its
    /// peers read them.
    pub(super) local_pushed: u64,
    pub(super) my_row: usize,
    pub(super) my_rank: Option<usize>,
    pub(super) ring: Option<SenderRing>,
    /// Per sender rank; `None` at this member's own rank.
    pub(super) inboxes: Vec<Option<Inbox>>,
    /// Sequence numbers delivered (real and null).
    pub(super) delivered: u64,
    /// Raised whenever the counter block changes.
    pub(super) version: u64,
    /// The stream length (`sent_num`) in the block of that version.
    pub(super) stream_len_pushed: u64,
    pub(super) pushes: Vec<PeerPush>,
    /// Scratch of the delivery step: stable prefix and messages taken per sender rank.
    pub(super) stable: Vec<u64>,
    pub(super) taken: Vec<usize>,
}

/// One member of a multicast group over fabric `F` (see the module docs).
#[derive(Debug)]
pub struct Member<F: Fabric> {
    pub(super) fabric: F,
    /// The current view (its `me` is this member).
    pub(super) config: GroupConfig,
    /// The current view's number: 0 for the first, one more at each change.
    pub(super) epoch: u64,
    pub(super) layout: Layout,
    /// One per peer of the current view; kept across views (their FIFO order is what makes a
    /// fresh SST safe: `next.rs`).
    pub(super) links: Vec<Link<F::Endpoint>>,
    pub(super) subgroups: Vec<Option<Subgroup>>,
    /// Which subgroups a poll may skip (`idle.rs`).
    quiet: Quiet,
    pub(super) stats: Stats,
    pub(super) view: Option<ViewState>,
    /// Installed and not yet running: the next view's configuration.
    pub(super) next: Option<GroupConfig>,
    /// State this member owes a joiner.
    pub(super) transfers: Vec<Transfer>,
    /// A joiner before its state arrived: the group's template configuration.
    pub(super) joining: Option<GroupConfig>,
    pub(super) state_layout: Option<StateLayout>,
    /// A joiner asking for itself (`ask.rs`).
    pub(super) asking: Option<Asking<F::Endpoint>>,
    /// A joiner's bound on waiting for its state (`ask.rs`).
    pub(super) give_up: Option<GiveUp>,
    /// Why this member stopped for good (a joiner that gave up, a member that lost its
    /// view's majority): every later poll returns it.
    stopped: Option<MulticastError>,
    /// The link of the last refusal posted to a joiner (`ask.rs`).
    pub(super) refusal_link: Option<Link<F::Endpoint>>,
}

/// A reserved ring slot: build the message in place, then [`SlotWriter::commit`] it.
/// Dropping it without committing sends nothing.
#[derive(Debug)]
pub struct SlotWriter<'a> {
    ring: &'a mut SenderRing,
    rank: usize,
    senders: u64,
    stats: &'a mut Stats,
}

impl SlotWriter<'_> {
    /// The slot's payload bytes (the subgroup's `max_payload_bytes` of them).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.ring.reserve().expect("a SlotWriter exists only for a free slot")
    }

    /// Marks the first `len` bytes ready to send; returns the message's sequence number. The
    /// next poll pushes it.
    pub fn commit(self, len: usize) -> Result<u64, SendError> {
        self.commit_with(len, |ring| ring.commit(len))
    }

    /// Commits a message of `len` payload bytes with `commit` if it fits the slot.
    fn commit_with(self, len: usize, commit: impl FnOnce(&mut SenderRing) -> u64) -> Result<u64, SendError> {
        let max = self.ring.max_payload_bytes();
        if len > max {
            return Err(SendError::TooLong { len, max });
        }
        let index = commit(self.ring);
        self.stats.sent += 1;
        Ok(seq_of(index, self.rank, self.senders))
    }
}

impl<F: Fabric> Member<F> {
    /// A member on `fabric`, which must have registered [`super::regions`] of `config`; the
    /// regions must be zeroed at start (a fresh registration is).
    pub fn new(fabric: F, config: GroupConfig) -> Result<Self, MulticastError> {
        config.validate()?;
        let mut member = Self::on(fabric, config)?;
        if member.config.failure_detection.is_some() {
            for &peer in member.config.members.iter().filter(|&&m| m != member.config.me) {
                member.fabric.grant_write(SST_REGION, peer)?;
            }
        }
        member.open_epoch(0, member.config.clone())?;
        Ok(member)
    }

    /// A member that joins a running group: `template` is the group's configuration (its ring
    /// geometry and failure detection must be the group's; its member list is not used), with
    /// `me` this node. It waits ([`Phase::Joining`]) until a member proposes it
    /// ([`Member::propose_join`]) or, if told to, its own request is taken
    /// ([`Member::ask_to_join`]), the group installs a view with it, and its state arrives. If
    /// its state has not arrived `give_up_after_ns` (of the clock passed to [`Member::poll`])
    /// after its first poll, it stops: the poll returns [`MulticastError::JoinTimedOut`] (a
    /// request lost with the member that proposed it would otherwise leave it waiting for
    /// good). A joiner the group admitted just before it gave up is a member that failed to
    /// the group, and the next change removes it.
    pub fn join(fabric: F, template: GroupConfig, give_up_after_ns: u64) -> Result<Self, MulticastError> {
        if template.failure_detection.is_none() {
            return Err(ConfigError::Detection("a joiner needs failure detection (views change)").into());
        }
        // Until its state arrives the joiner is alone in no subgroup (the template's geometry
        // still sizes its regions).
        let empty = |s: &super::config::SubgroupConfig| super::config::SubgroupConfig {
            members: Vec::new(),
            senders: Vec::new(),
            ..s.clone()
        };
        let placeholder = GroupConfig {
            members: vec![template.me],
            subgroups: template.subgroups.iter().map(empty).collect(),
            ..template.clone()
        };
        placeholder.validate_view()?;
        let mut member = Self::on(fabric, placeholder)?;
        member.joining = Some(template);
        member.give_up = Some(GiveUp::after(give_up_after_ns));
        Ok(member)
    }

    fn on(fabric: F, config: GroupConfig) -> Result<Self, MulticastError> {
        if fabric.node_id() != config.me {
            return Err(MulticastError::Fabric(FabricError::InvalidLayout(format!(
                "the configuration is for {} but the fabric is {}",
                config.me,
                fabric.node_id()
            ))));
        }
        for spec in super::regions(&config) {
            check_region(&fabric, spec)?;
        }
        Ok(Self {
            layout: Layout::of_epoch(&config, 0),
            state_layout: StateLayout::new(&config),
            fabric,
            config,
            epoch: 0,
            links: Vec::new(),
            subgroups: Vec::new(),
            quiet: Quiet::default(),
            stats: Stats::default(),
            view: None,
            next: None,
            transfers: Vec::new(),
            joining: None,
            asking: None,
            give_up: None,
            stopped: None,
            refusal_link: None,
        })
    }

    /// Starts view `epoch` of `config` on a fresh SST: its layout, its links (an endpoint kept
    /// for each peer already linked), its subgroups and its view state.
    pub(super) fn open_epoch(&mut self, epoch: u64, config: GroupConfig) -> Result<(), MulticastError> {
        let layout = Layout::of_epoch(&config, epoch);
        let row_of = |node| rank_of(&config.members, node).expect("validated: subgroup members are group members");
        let my_row = row_of(config.me);
        let mut old_links = std::mem::take(&mut self.links);
        let mut links: Vec<Link<F::Endpoint>> = Vec::new();
        let mut link_to = |peer: NodeId, links: &mut Vec<Link<F::Endpoint>>| -> Result<usize, MulticastError> {
            if let Some(i) = links.iter().position(|l| l.peer == peer) {
                return Ok(i);
            }
            let link = match old_links.iter().position(|l| l.peer == peer) {
                Some(i) => old_links.swap_remove(i),
                None => Link::open(&self.fabric, peer)?,
            };
            links.push(link);
            Ok(links.len() - 1)
        };
        let mut subgroups = Vec::with_capacity(config.subgroups.len());
        for (index, sub) in config.subgroups.iter().enumerate() {
            if !sub.members.contains(&config.me) {
                subgroups.push(None);
                continue;
            }
            let sub_layout = layout.subgroups[index].clone();
            let mut pushes = Vec::new();
            let mut peer_rows = Vec::new();
            for &peer in sub.members.iter().filter(|&&m| m != config.me) {
                pushes.push(PeerPush { link: link_to(peer, &mut links)?, real_pushed: 0, version_pushed: None });
                peer_rows.push(row_of(peer));
            }
            let my_rank = rank_of(&sub.senders, config.me);
            let pull = self.fabric.lends_peer_memory() && self.fabric.lends_local_bytes();
            let mut sender_links = Vec::new();
            if pull {
                for &sender in &sub.senders {
                    sender_links.push(if sender == config.me { None } else { Some(link_to(sender, &mut links)?) });
                }
            }
            // A fabric that cannot lend its memory (tcp) would copy at delivery anyway: every
            // message is copied at receipt there, and its slot reused on receipt.
            let copy_at_receipt =
                if self.fabric.lends_local_bytes() { sub.copy_at_receipt_bytes as usize } else { usize::MAX };
            let max_payload = sub.max_payload_bytes as usize;
            let inboxes = (0..sub.senders.len())
                .map(|rank| {
                    (Some(rank) != my_rank).then(|| Inbox::new(sub_layout.window, max_payload, copy_at_receipt))
                })
                .collect();
            subgroups.push(Some(Subgroup {
                index,
                peer_rows,
                sender_rows: sub.senders.iter().map(|&s| row_of(s)).collect(),
                sender_ids: sub.senders.clone(),
                sender_links,
                local_pushed: 0,
                my_row,
                my_rank,
                ring: my_rank.map(|_| SenderRing::new(sub_layout.window, sub_layout.slot_bytes, copy_at_receipt)),
                inboxes,
                delivered: 0,
                version: 0,
                stream_len_pushed: 0,
                pushes,
                stable: vec![0; sub.senders.len()],
                taken: vec![0; sub.senders.len()],
                layout: sub_layout,
            }));
        }
        let view = match config.failure_detection {
            Some(detection) => {
                // Everyone watches everyone's heartbeat: a link to every member.
                for &peer in config.members.iter().filter(|&&m| m != config.me) {
                    link_to(peer, &mut links)?;
                }
                Some(ViewState::new(detection, my_row, config.members.len(), links.len()))
            }
            None => None,
        };
        self.links = links;
        self.quiet = Quiet::new(&subgroups, &layout);
        self.subgroups = subgroups;
        self.view = view;
        self.layout = layout;
        self.config = config;
        self.epoch = epoch;
        Ok(())
    }

    /// The current view's configuration.
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// The current view's number (0 for the first; a joiner's first is the view it joined).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Asks the group to add `node` as a member, and a sender, of `subgroups`: the group
    /// wedges, cleans up as for a failure and installs a view with `node` last, which gets its
    /// state from the members ([`Member::join`] on `node`'s side). One join at a time.
    pub fn propose_join(&mut self, node: NodeId, subgroups: &[usize]) -> Result<(), JoinError> {
        let detection = self.config.failure_detection.ok_or(JoinError::StaticGroup)?;
        let view = self.view.as_mut().ok_or(JoinError::StaticGroup)?;
        if let Some(pending) = JoinRequest::from_word(view.join()) {
            return Err(JoinError::Pending(pending.node));
        }
        if self.joining.is_some() || view.phase != Phase::Running {
            return Err(JoinError::NotRunning);
        }
        if self.config.members.contains(&node) {
            return Err(JoinError::AlreadyMember(node));
        }
        if self.config.members.len() >= detection.max_members {
            return Err(JoinError::Full(detection.max_members));
        }
        if let Some(&bad) = subgroups.iter().find(|&&s| s >= self.config.subgroups.len()) {
            return Err(JoinError::NoSuchSubgroup(bad));
        }
        let word = JoinRequest::new(node, subgroups).word();
        assert!(view.propose_join(word), "checked: running with no join pending");
        Ok(())
    }

    /// This member's counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The fabric handle.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// Sequence numbers of `subgroup` delivered here (nulls included); 0 if not a member.
    pub fn delivered(&self, subgroup: usize) -> u64 {
        self.subgroups.get(subgroup).and_then(Option::as_ref).map_or(0, |s| s.delivered)
    }

    /// The prefix of sender `rank`'s stream in `subgroup` this member holds (for a sender's own
    /// rank, every message it has committed or nulled); 0 if not a member.
    pub fn received(&self, subgroup: usize, rank: usize) -> u64 {
        let Some(sub) = self.subgroups.get(subgroup).and_then(Option::as_ref) else { return 0 };
        if sub.my_rank == Some(rank) {
            return sub.ring.as_ref().map_or(0, SenderRing::stream_len);
        }
        sub.inboxes.get(rank).and_then(Option::as_ref).map_or(0, |inbox| inbox.received)
    }

    /// What `node` has delivered in `subgroup` as far as this member knows: its own count, or
    /// the `delivered` counter of the node's SST row as last pushed here (a lower bound).
    /// `None` if either is not a member of the subgroup.
    pub fn delivered_by(&self, subgroup: usize, node: NodeId) -> Result<Option<u64>, MulticastError> {
        let Some(sub) = self.subgroups.get(subgroup).and_then(Option::as_ref) else { return Ok(None) };
        if node == self.config.me {
            return Ok(Some(sub.delivered));
        }
        if !self.config.subgroups[subgroup].members.contains(&node) {
            return Ok(None);
        }
        let row = rank_of(&self.config.members, node).expect("subgroup members are group members");
        Ok(Some(self.fabric.load_u64(SST_REGION, sub.layout.delivered_at(&self.layout, row))?))
    }

    /// Whether every peer has been written everything this member has to say (no slot or
    /// counter change waits to be pushed): a group whose members are all idle sends nothing.
    pub fn is_idle(&self) -> bool {
        self.subgroups.iter().flatten().all(|sub| {
            let committed = sub.ring.as_ref().map_or(0, SenderRing::committed);
            sub.pushes.iter().all(|p| p.real_pushed == committed && p.version_pushed == Some(sub.version))
        })
    }

    /// Reserves the next slot of this member's ring in `subgroup` (zero-copy send).
    pub fn reserve(&mut self, subgroup: usize) -> Result<SlotWriter<'_>, SendError> {
        let sub = self
            .subgroups
            .get_mut(subgroup)
            .ok_or(SendError::NoSuchSubgroup(subgroup))?
            .as_mut()
            .ok_or(SendError::NotASender(subgroup))?;
        let (Some(rank), Some(ring)) = (sub.my_rank, sub.ring.as_mut()) else {
            return Err(SendError::NotASender(subgroup));
        };
        if self.view.as_ref().is_some_and(|v| v.phase != Phase::Running) || self.joining.is_some() {
            return Err(SendError::ViewChanging(subgroup));
        }
        if ring.reserve().is_none() {
            return Err(SendError::WindowFull(subgroup));
        }
        self.quiet.unsettle(subgroup);
        Ok(SlotWriter { ring, rank, senders: sub.layout.senders, stats: &mut self.stats })
    }

    /// Copies `payload` into the next slot and commits it; returns its sequence number.
    pub fn send(&mut self, subgroup: usize, payload: &[u8]) -> Result<u64, SendError> {
        let mut slot = self.reserve(subgroup)?;
        let buf = slot.payload_mut();
        if payload.len() > buf.len() {
            return Err(SendError::TooLong { len: payload.len(), max: buf.len() });
        }
        buf[..payload.len()].copy_from_slice(payload);
        slot.commit(payload.len())
    }

    /// Commits `message` to the next slot without copying it: [`SLOT_HEADER_BYTES`] bytes of
    /// room for the slot header, then the payload. On success `message` holds the buffer the
    /// slot held before (empty if none), for reuse; on an error it is unchanged. The push
    /// writes such a message on its own rather than in a run of slots, so it pays for large
    /// messages (a copy saved) more than small ones (writes not batched).
    pub fn send_owned(&mut self, subgroup: usize, message: &mut Vec<u8>) -> Result<u64, SendError> {
        let room = SLOT_HEADER_BYTES as usize;
        let len = message.len().checked_sub(room).ok_or(SendError::NoHeaderRoom { len: message.len(), room })?;
        self.reserve(subgroup)?.commit_with(len, |ring| ring.commit_owned(message))
    }

    /// One round of the poll loop (module docs) at time `now_ns` (any monotonic clock; only
    /// failure detection reads it). Returns whether it did anything, so that an idle policy
    /// can back off. A member that stopped for good ([`MulticastError::JoinTimedOut`],
    /// [`MulticastError::MajorityLost`]) posts nothing more and returns that error again.
    pub fn poll(&mut self, now_ns: u64, deliver: &mut impl Deliver) -> Result<bool, MulticastError> {
        if let Some(stopped) = &self.stopped {
            return Err(stopped.clone());
        }
        let polled = self.poll_once(now_ns, deliver);
        if let Err(error @ (MulticastError::JoinTimedOut { .. } | MulticastError::MajorityLost { .. })) = &polled {
            self.stopped = Some(error.clone());
        }
        polled
    }

    fn poll_once(&mut self, now_ns: u64, deliver: &mut impl Deliver) -> Result<bool, MulticastError> {
        if self.joining.is_some() {
            if self.poll_joining(deliver)? {
                self.asking = None;
                self.give_up = None;
                return Ok(true);
            }
            return self.wait_for_state(now_ns);
        }
        let mut work = self.poll_links()?;
        work |= self.push_transfers()?;
        let phase = self.view.as_ref().map_or(&Phase::Running, |v| &v.phase);
        let running = *phase == Phase::Running;
        let pushing = running || matches!(phase, Phase::Wedged | Phase::Installed(_));
        let ctx = Ctx { fabric: &self.fabric, layout: &self.layout, config: &self.config, epoch: self.epoch };
        // Reading slots past the guard is the planted bug's point: no skipping on guards then.
        let may_skip = running && !ctx.config.bug(super::planted::PlantedBug::NoGuard);
        self.quiet.begin_poll();
        for index in 0..self.subgroups.len() {
            if may_skip && self.quiet.skip(ctx.fabric, index)? {
                continue;
            }
            let Some(sub) = self.subgroups[index].as_mut() else { continue };
            if running {
                work |= sub.receive(&ctx, &self.links)?;
                work |= sub.deliver(&ctx, &self.links, deliver, &mut self.stats, None)?;
                work |= sub.null_send(&mut self.stats);
            }
            if pushing {
                // Wedged: the final counters still go out, before `wedged` does; installed:
                // the counters after cleanup, before `trimmed` does.
                work |= sub.push(&ctx, &mut self.links, &mut self.stats)?;
            }
            if running {
                self.quiet.update(sub, ctx.config.subgroups[index].delivery);
            }
        }
        if let Some(view) = &mut self.view {
            let installed = matches!(view.phase, Phase::Installed(_));
            work |= view.step(now_ns, &ctx, &mut self.subgroups, &mut self.links, deliver, &mut self.stats)?;
            if let (false, Phase::Installed(next)) = (installed, &view.phase) {
                let next = next.clone();
                self.install(next, deliver)?;
            }
        }
        work |= self.answer_mailbox()?;
        if self.next.is_some() && self.may_leave()? {
            self.transition()?;
            work = true;
        }
        Ok(work)
    }

    /// Where this member stands in a view change ([`Phase::Running`] without failure
    /// detection).
    pub fn phase(&self) -> Phase {
        if self.joining.is_some() {
            return Phase::Joining;
        }
        self.view.as_ref().map_or(Phase::Running, |v| v.phase.clone())
    }

    /// The members this member suspects.
    pub fn suspected(&self) -> Vec<NodeId> {
        let set = self.view.as_ref().map_or(0, ViewState::suspected);
        self.config.members.iter().enumerate().filter(|&(r, _)| set & (1 << r) != 0).map(|(_, &m)| m).collect()
    }

    /// Drains completions; reconnects failed endpoints, after which everything not yet freed
    /// is written again (a failed WRITE and every one behind it did not land).
    fn poll_links(&mut self) -> Result<bool, MulticastError> {
        let mut work = false;
        let fabric = &self.fabric;
        let ctx = Ctx { fabric, layout: &self.layout, config: &self.config, epoch: self.epoch };
        let running = self.view.as_ref().is_none_or(|v| v.phase == Phase::Running);
        for (index, link) in self.links.iter_mut().enumerate() {
            let reconnected = match &mut link.ep {
                Some(ep) => {
                    while let Some(completion) = ep.poll_completion() {
                        work = true;
                        if completion.status.is_err() {
                            link.broken = true;
                        }
                    }
                    if ep.state() == EndpointState::Error {
                        link.broken = true;
                    }
                    link.broken
                        && keep_pulled_rings(&ctx, running, &mut self.subgroups, index, ep)?
                        && ep.reconnect().is_ok()
                }
                None => {
                    link.ep = fabric.try_connect(link.peer).ok().flatten();
                    link.ep.is_some()
                }
            };
            if reconnected {
                link.broken = false;
                work = true;
                self.stats.reconnects += 1;
                self.quiet.unsettle_all();
                if let Some(view) = &mut self.view {
                    view.reset_link(index);
                }
                for transfer in self.transfers.iter_mut().filter(|t| t.joiner == link.peer) {
                    transfer.rewind();
                }
                for sub in self.subgroups.iter_mut().flatten() {
                    let freed = sub.ring.as_ref().map_or(0, SenderRing::freed);
                    for push in sub.pushes.iter_mut().filter(|p| p.link == index) {
                        push.real_pushed = freed;
                        push.version_pushed = None;
                    }
                }
            }
        }
        Ok(work)
    }
}

/// Before the link `index`, failed, is reconnected (which may reach its peer's next
/// incarnation, whose memory holds nothing of the old one's rings): whether every ring pulled
/// through it was received up to its guard, after taking in what fits, while the view runs
/// (after it stopped nothing more is delivered in it); if so, what is held in place is copied
/// out, and the link may reconnect. If not (an inbox full of messages not yet delivered, some
/// copied out at receipt and so already reused by their sender), it waits: delivery makes
/// room, and the old memory stays readable meanwhile.
fn keep_pulled_rings<F: Fabric>(
    ctx: &Ctx<'_, F>,
    running: bool,
    subgroups: &mut [Option<Subgroup>],
    index: usize,
    ep: &F::Endpoint,
) -> Result<bool, MulticastError> {
    for sub in subgroups.iter_mut().flatten() {
        for rank in 0..sub.sender_links.len() {
            if !running || sub.sender_links[rank] != Some(index) {
                continue;
            }
            sub.receive_from(ctx, rank, &RingAt::Sender(ep))?;
            let sent = ctx.fabric.load_u64(SST_REGION, sub.layout.sent_at(ctx.layout, sub.sender_rows[rank]))?;
            if sub.inboxes[rank].as_ref().is_some_and(|inbox| inbox.received < sent) {
                return Ok(false);
            }
        }
    }
    for sub in subgroups.iter_mut().flatten() {
        for rank in 0..sub.sender_links.len() {
            if sub.sender_links[rank] != Some(index) {
                continue;
            }
            let Some(inbox) = sub.inboxes[rank].as_mut() else { continue };
            inbox.copy_out_in_place(|at, out| {
                // SAFETY: a message held in place is not rewritten before this member's
                // counters say it was delivered, and it is still pending here.
                out.copy_from_slice(&unsafe { ep.peer_bytes(RemoteAddr::new(SST_REGION, at), out.len()) }?);
                Ok::<(), FabricError>(())
            })?;
        }
    }
    Ok(true)
}

/// What a subgroup step reads besides its own state.
pub(super) struct Ctx<'a, F> {
    pub(super) fabric: &'a F,
    pub(super) layout: &'a Layout,
    pub(super) config: &'a GroupConfig,
    pub(super) epoch: u64,
}

/// Checks that `fabric` registered `spec`'s region, large enough.
fn check_region<F: Fabric>(fabric: &F, spec: RegionSpec) -> Result<(), MulticastError> {
    let len = fabric.region_len(spec.id)?;
    if len < spec.len_bytes {
        return Err(MulticastError::Fabric(FabricError::InvalidLayout(format!(
            "{} is {len} bytes; this group needs {}",
            spec.id, spec.len_bytes
        ))));
    }
    Ok(())
}
