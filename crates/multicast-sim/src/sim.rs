//! The state of one run: the members (joiners included), their applications, the checker, and
//! the checks made after every poll and at every installed view.

use std::collections::HashMap;

use microrep_core::multicast::{
    Deliver, DeliveryBatch, GroupConfig, Member, MulticastError, Phase, SLOT_HEADER_BYTES, SendError, View,
};
use microrep_fabric::NodeId;
use microrep_fabric::sim::{SimFabric, SimWorld};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::{Checker, Sent, Violation, message_id};
use crate::run::{Failure, Report};
use crate::schedule::Armed;

/// Most nodes a run creates, joiners included: the group's `max_members`.
const JOINED_NODES_MAX: usize = 8;
/// A joiner without its state asks a member itself after this long, and again each time it
/// passes (`Member::ask_to_join`): above the suspicion timeout, so a request not lost is
/// usually admitted first.
pub(crate) const JOIN_RETRY_NS: u64 = 4_000_000;
/// A joiner that asks for itself and has no state this long after its first poll gives up
/// (`Member::join`): five rounds of asking each of up to five template members, and half the
/// liveness phase's budget, so that a joiner the group cannot reach has given up before a
/// stage must have settled.
pub(crate) const ASKING_GIVE_UP_NS: u64 = 100_000_000;
/// A joiner that does not ask gives up sooner (10 suspicion timeouts): if its request was
/// lost, nothing changes by waiting.
pub(crate) const PLAIN_GIVE_UP_NS: u64 = 20_000_000;
/// Mixed into a seed for the stream that draws which join requests are lost.
const LOST_REQUEST_STREAM: u64 = 0x6c6f_7374_5f6a_6f69;
/// Mixed into a seed for the stream that draws which joiners do not ask for themselves.
const PLAIN_JOINER_STREAM: u64 = 0x706c_6169_6e5f_6a6e;
/// Mixed into a seed and a member id for the stream that draws that member's own
/// `copy_at_receipt_bytes` when members are configured apart.
const OWN_THRESHOLD_STREAM: u64 = 0x6f77_6e5f_7468_7265;
/// Mixed into a seed for the stream that draws which crashed nodes restart at once.
const RESTART_STREAM: u64 = 0x7265_7374_6172_7473;

/// What one member's application saw: its state is, per subgroup, the ids of the messages it
/// delivered (restored from a member's snapshot on a joiner).
#[derive(Debug, Default)]
pub(crate) struct App {
    pub(crate) history: HashMap<usize, Vec<u64>>,
    events: Vec<Event>,
}

#[derive(Debug)]
enum Event {
    Delivered { epoch: u64, subgroup: usize, sender: NodeId, seq: u64, payload: Vec<u8> },
    Installed(View),
}

impl Deliver for App {
    fn deliver(&mut self, batch: DeliveryBatch<'_>) {
        for m in batch.messages {
            let history = self.history.entry(batch.subgroup).or_default();
            history.extend(message_id(m.payload));
            self.events.push(Event::Delivered {
                epoch: batch.epoch,
                subgroup: batch.subgroup,
                sender: m.sender,
                seq: m.seq,
                payload: m.payload.to_vec(),
            });
        }
    }

    fn view_installed(&mut self, view: &View) {
        self.events.push(Event::Installed(view.clone()));
    }

    fn snapshot(&mut self, subgroup: usize, out: &mut Vec<u8>) {
        for id in self.history.get(&subgroup).into_iter().flatten() {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }

    fn restore(&mut self, subgroup: usize, state: &[u8]) {
        let ids = state.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
        self.history.insert(subgroup, ids.collect());
    }
}

/// One node of the run: a member or a joiner, and whether it crashed.
pub(crate) struct Node {
    pub(crate) id: NodeId,
    pub(crate) member: Member<SimFabric>,
    pub(crate) app: App,
    pub(crate) crashed: bool,
    /// A joiner the group refused, and why.
    pub(crate) refused: Option<microrep_core::multicast::JoinError>,
    /// A joiner that asks for itself (`Member::ask_to_join`); one that does not waits for its
    /// proposer's request or gives up.
    pub(crate) asks: bool,
    /// Why the node stopped for good (a joiner that gave up, a member without a majority).
    pub(crate) stopped: Option<MulticastError>,
}

impl Node {
    /// Neither crashed nor stopped.
    pub(crate) fn up(&self) -> bool {
        !self.crashed && self.stopped.is_none()
    }
}

/// What the first member to install a view saw, to compare the others with.
struct Installed {
    members: Vec<NodeId>,
    /// Per subgroup of the old view: the history of its first member to install.
    histories: HashMap<usize, Vec<u64>>,
}

pub(crate) struct Sim {
    pub(crate) seed: u64,
    pub(crate) replay: String,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) world: SimWorld,
    /// The configuration every node (and joiner) starts from.
    pub(crate) template: GroupConfig,
    /// Whether members draw their own `copy_at_receipt_bytes` ([`member_config`]).
    apart: bool,
    pub(crate) nodes: Vec<Node>,
    pub(crate) checker: Checker,
    pub(crate) now: u64,
    pub(crate) report: Report,
    /// Members of each view, by epoch (0: the first).
    pub(crate) views: Vec<Vec<NodeId>>,
    installed: HashMap<u64, Installed>,
    /// Events waiting for a view change (`schedule.rs`).
    pub(crate) armed: Vec<Armed>,
    /// Usually spare a crash that would leave the latest view without a live majority (four
    /// times in five), so that most runs with several failures go on to further views.
    pub(crate) keep_majority: bool,
    /// Each view's configuration (with some member's `me`), as first seen.
    pub(crate) configs: HashMap<u64, GroupConfig>,
    next_id: u64,
    /// Draws which join requests are lost (their sponsor fails at once).
    lose: ChaCha8Rng,
    /// Draws which joiners do not ask for themselves.
    plain: ChaCha8Rng,
    /// With rings pulled: draws which crashed nodes restart at once, as a process that comes
    /// back under its id (a new incarnation with fresh memory, running no member yet), so
    /// that its peers' failed links reconnect to memory that holds none of the old rings.
    restarts: Option<ChaCha8Rng>,
    /// The fabric handles of those restarted nodes.
    restarted: Vec<SimFabric>,
}

impl Sim {
    /// A simulation of `template`'s group; with `apart`, each member draws its own
    /// `copy_at_receipt_bytes` per subgroup (a configuration members need not share).
    pub(crate) fn new(
        seed: u64,
        replay: String,
        rng: ChaCha8Rng,
        world: SimWorld,
        template: GroupConfig,
        apart: bool,
    ) -> Self {
        // Every fabric first: a member connects to its peers when it is created.
        let specs = microrep_core::multicast::regions(&template);
        let world_lends = world.config().lend_peer_memory;
        let fabrics: Vec<SimFabric> =
            template.members.iter().map(|&id| world.add_node(id, &specs).expect("fresh node")).collect();
        let nodes = fabrics
            .into_iter()
            .zip(&template.members)
            .map(|(fabric, &id)| {
                let config = member_config(&template, id, apart.then_some(seed));
                let member = Member::new(fabric, config).expect("a drawn group is valid");
                Node { id, member, app: App::default(), crashed: false, refused: None, asks: false, stopped: None }
            })
            .collect();
        let views = vec![template.members.clone()];
        let mut checker = Checker::new();
        for (s, sub) in template.subgroups.iter().enumerate() {
            if sub.delivery == microrep_core::multicast::Delivery::Unordered {
                checker.at_receipt(s);
            }
        }
        Self {
            seed,
            replay,
            rng,
            world,
            template,
            apart,
            nodes,
            checker,
            now: 0,
            report: Report::default(),
            views,
            installed: HashMap::new(),
            configs: HashMap::new(),
            armed: Vec::new(),
            keep_majority: false,
            next_id: 0,
            lose: ChaCha8Rng::seed_from_u64(seed ^ LOST_REQUEST_STREAM),
            plain: ChaCha8Rng::seed_from_u64(seed ^ PLAIN_JOINER_STREAM),
            restarts: world_lends.then(|| ChaCha8Rng::seed_from_u64(seed ^ RESTART_STREAM)),
            restarted: Vec::new(),
        }
    }

    pub(crate) fn fail(&self, violation: Violation) -> Failure {
        Failure { seed: self.seed, at_ns: self.now, violation, replay: self.replay.clone() }
    }

    pub(crate) fn index(&self, id: NodeId) -> usize {
        self.nodes.iter().position(|n| n.id == id).expect("a known node")
    }

    /// Nodes neither crashed nor stopped.
    pub(crate) fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.up())
    }

    /// Polls node `i` and checks what it delivered and installed.
    pub(crate) fn poll(&mut self, i: usize) -> Result<bool, Failure> {
        let node = &mut self.nodes[i];
        let work = match node.member.poll(self.now, &mut node.app) {
            Ok(work) => work,
            Err(MulticastError::JoinRefused(why)) if node.member.phase() == Phase::Joining => {
                // Told why not: an answer, not a fault.
                node.refused = Some(why);
                return Ok(false);
            }
            Err(error @ MulticastError::JoinTimedOut { .. }) if node.member.phase() == Phase::Joining => {
                self.report.joins_given_up += 1;
                self.nodes[i].stopped = Some(error);
                return self.check_gave_up(i).map(|()| false);
            }
            Err(error @ MulticastError::MajorityLost { .. }) => {
                self.report.majority_lost += 1;
                self.check_majority_lost(i, &error)?;
                self.nodes[i].stopped = Some(error);
                return Ok(false);
            }
            Err(e) => return Err(self.fail(Violation::Poll(e.to_string()))),
        };
        if self.nodes[i].member.phase() != Phase::Joining {
            let member = &self.nodes[i].member;
            self.configs.entry(member.epoch()).or_insert_with(|| member.config().clone());
        }
        let events = std::mem::take(&mut self.nodes[i].app.events);
        // A cleanup's deliveries come before the install in the same poll: the oracle needs
        // the view they clean up for.
        let installing: Option<View> = events.iter().find_map(|e| match e {
            Event::Installed(view) => Some(view.clone()),
            Event::Delivered { .. } => None,
        });
        for event in events {
            match event {
                Event::Delivered { epoch, subgroup, sender, seq, payload } => {
                    self.report.delivered += 1;
                    let me = self.nodes[i].id;
                    if let Err(v) = self.checker.delivered(epoch, subgroup, me, sender, seq, &payload) {
                        return Err(self.fail(v));
                    }
                    let next = installing.as_ref().filter(|v| v.epoch == epoch + 1).map(|v| &v.members);
                    self.check_stable(i, epoch, subgroup, sender, seq, next)?;
                }
                Event::Installed(view) => self.check_install(i, &view)?,
            }
        }
        Ok(work)
    }

    /// The oracle: every member of the subgroup in this view holds the message (stability);
    /// once a next view is installed (the delivery may be its cleanup), every member of it.
    fn check_stable(
        &self,
        i: usize,
        epoch: u64,
        subgroup: usize,
        sender: NodeId,
        seq: u64,
        installing: Option<&Vec<NodeId>>,
    ) -> Result<(), Failure> {
        if self.checker.is_at_receipt(subgroup) {
            // Delivered at receipt: no stability to check.
            return Ok(());
        }
        let config = self.configs.get(&epoch).expect("a view's configuration is seen before its deliveries");
        let sub = &config.subgroups[subgroup];
        let rank = sub.senders.iter().position(|&s| s == sender).expect("validated sender");
        let index = seq / sub.senders.len() as u64;
        let next_view = installing.or(self.views.get(epoch as usize + 1));
        for &other in sub.members.iter().filter(|m| next_view.is_none_or(|v| v.contains(m))) {
            let o = &self.nodes[self.index(other)];
            // A member that already runs a later view holds nothing of this one any more.
            if o.crashed || o.member.epoch() != epoch {
                continue;
            }
            if o.member.received(subgroup, rank) <= index {
                let member = self.nodes[i].id;
                return Err(self.fail(Violation::Stability { subgroup, member, seq, missing_at: other }));
            }
        }
        Ok(())
    }

    /// Virtual synchrony at an install: one view per epoch, of a majority of the old one, with
    /// the installer in it; per subgroup, every member of the old view that installed it
    /// delivered the same messages (the same history), and a joiner starts from that history.
    fn check_install(&mut self, i: usize, view: &View) -> Result<(), Failure> {
        let me = self.nodes[i].id;
        let vs = |detail: String| Violation::VirtualSynchrony(detail);
        if !view.members.contains(&me) {
            return Err(self.fail(vs(format!("{me} installed view {} without itself", view.epoch))));
        }
        let Some(old) = self.views.get(view.epoch as usize - 1).cloned() else {
            return Err(self.fail(vs(format!("{me} installed view {} before view {}", view.epoch, view.epoch - 1))));
        };
        let stay = view.members.iter().filter(|m| old.contains(m)).count();
        if 2 * stay <= old.len() {
            return Err(self.fail(vs(format!("view {} {:?} keeps a minority of {old:?}", view.epoch, view.members))));
        }
        let joiner = view.joined == Some(me);
        // A member compares the subgroups it was in; a joiner (called once it runs the view)
        // the subgroups it entered.
        let config = self.nodes[i].member.config();
        // Subgroups that deliver at receipt promise no agreement at a view change.
        let histories: HashMap<usize, Vec<u64>> = (0..view.delivered.len())
            .filter(|&s| !self.checker.is_at_receipt(s))
            .filter(|&s| if joiner { config.subgroups[s].members.contains(&me) } else { view.delivered[s].is_some() })
            .map(|s| (s, self.nodes[i].app.history.get(&s).cloned().unwrap_or_default()))
            .collect();
        match self.installed.get_mut(&view.epoch) {
            None => {
                if view.epoch as usize != self.views.len() {
                    return Err(self.fail(vs(format!("view {} installed out of turn", view.epoch))));
                }
                self.views.push(view.members.clone());
                let histories = if joiner { HashMap::new() } else { histories };
                self.installed.insert(view.epoch, Installed { members: view.members.clone(), histories });
                return Ok(());
            }
            Some(first) => {
                if first.members != view.members {
                    let detail = format!(
                        "{me} installed {:?} as view {}, another {:?}",
                        view.members, view.epoch, first.members
                    );
                    return Err(self.fail(vs(detail)));
                }
                for (s, history) in histories {
                    if joiner && !first.histories.contains_key(&s) {
                        // Every old member of the subgroup failed: its state is lost, and the
                        // joiner starts from an empty one (nothing survives to agree with).
                        continue;
                    }
                    let reference = first.histories.entry(s).or_insert_with(|| history.clone());
                    if *reference != history {
                        let detail = format!(
                            "subgroup {s}: {me} {} view {} with {} messages, another with {}",
                            if joiner { "joined" } else { "installed" },
                            view.epoch,
                            history.len(),
                            reference.len()
                        );
                        return Err(self.fail(vs(detail)));
                    }
                }
            }
        }
        Ok(())
    }

    /// After the run: every message anyone delivered in a view is in the history its
    /// successor's members agreed on (nothing delivered, even by a failed member, is lost).
    pub(crate) fn check_nothing_lost(&self) -> Result<(), Failure> {
        for (&epoch, installed) in &self.installed {
            for (&s, history) in &installed.histories {
                let Some(delivered) = self.checker.delivered_in(epoch - 1, s) else { continue };
                let mut lost: Vec<&u64> = delivered.iter().filter(|id| !history.contains(id)).collect();
                lost.sort_unstable();
                if let Some(id) = lost.first() {
                    return Err(self.fail(Violation::VirtualSynchrony(format!(
                        "subgroup {s}: message {id} was delivered in view {} but is not in view {epoch}'s history",
                        epoch - 1
                    ))));
                }
            }
        }
        Ok(())
    }

    /// Polls every live node once, then lets 500 ns pass; returns whether any poll did anything.
    pub(crate) fn round(&mut self) -> Result<bool, Failure> {
        self.round_by(500)
    }

    /// Polls every live node once, then lets `ns` pass.
    pub(crate) fn round_by(&mut self, ns: u64) -> Result<bool, Failure> {
        self.fire_armed();
        let mut work = false;
        for i in 0..self.nodes.len() {
            if self.nodes[i].up() {
                work |= self.poll(i)?;
            }
        }
        self.advance(ns);
        Ok(work)
    }

    /// Sends one message (an id, then random bytes) from a random sender of a random subgroup
    /// of a random live member's view, if its ring has room.
    pub(crate) fn send(&mut self) {
        let live: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].up()).collect();
        let Some(&i) = live.choose(&mut self.rng) else { return };
        let config = self.nodes[i].member.config().clone();
        let subgroup = self.rng.random_range(0..config.subgroups.len());
        if !config.subgroups[subgroup].senders.contains(&self.nodes[i].id) {
            return;
        }
        let max = config.subgroups[subgroup].max_payload_bytes as usize;
        let len = self.rng.random_range(8..=max);
        let mut payload: Vec<u8> = self.next_id.to_le_bytes().to_vec();
        payload.extend((8..len).map(|_| self.rng.random::<u8>()));
        let member = &mut self.nodes[i].member;
        let epoch = member.epoch();
        let result = if self.rng.random_bool(0.5) {
            member.send(subgroup, &payload)
        } else if self.next_id.is_multiple_of(2) {
            // Zero-copy: build in the slot.
            member.reserve(subgroup).and_then(|mut slot| {
                slot.payload_mut()[..len].copy_from_slice(&payload);
                slot.commit(len)
            })
        } else {
            // Handed over whole, pushed from its own buffer (chosen by the id, so that the
            // seed's draws stay as they were).
            let mut message = vec![0; SLOT_HEADER_BYTES as usize];
            message.extend_from_slice(&payload);
            member.send_owned(subgroup, &mut message)
        };
        match result {
            Ok(_) => {
                self.next_id += 1;
                self.checker.sent(subgroup, Sent { sender: self.nodes[i].id, epoch, payload });
                self.report.sent += 1;
            }
            Err(SendError::WindowFull(_) | SendError::ViewChanging(_)) => {}
            Err(e) => panic!("seed {}: send refused: {e}", self.seed),
        }
    }

    pub(crate) fn advance(&mut self, ns: u64) {
        self.now += ns;
        self.world.advance_to(self.now);
    }

    /// A joiner with a fresh id, proposed by a random running member, entering random
    /// subgroups. Returns false if no member could propose it.
    pub(crate) fn join(&mut self) -> bool {
        if self.nodes.len() >= JOINED_NODES_MAX {
            // Views never fill up (`FailureDetection::max_members`), so a proposed join is
            // always possible.
            return false;
        }
        let id = NodeId(self.nodes.iter().map(|n| n.id.0).max().unwrap_or(0) + 1);
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].up() && self.nodes[i].member.phase() == Phase::Running)
            .collect();
        let Some(&sponsor) = running.choose(&mut self.rng) else { return false };
        let subgroups: Vec<usize> = (0..self.template.subgroups.len()).filter(|_| self.rng.random_bool(0.6)).collect();
        if self.nodes[sponsor].member.propose_join(id, &subgroups).is_err() {
            return false;
        }
        let fabric = self.world.add_node(id, &microrep_core::multicast::regions(&self.template)).expect("fresh id");
        // Half the joiners do not ask: one whose request is lost must give up, not wait.
        let asks = self.plain.random_bool(0.5);
        let give_up_ns = if asks { ASKING_GIVE_UP_NS } else { PLAIN_GIVE_UP_NS };
        let mut member =
            Member::join(fabric, member_config(&self.template, id, self.apart.then_some(self.seed)), give_up_ns)
                .expect("joiner");
        if asks {
            member.ask_to_join(&subgroups, JOIN_RETRY_NS).expect("the template's subgroups");
        }
        let sponsor = self.nodes[sponsor].id;
        self.nodes.push(Node { id, member, app: App::default(), crashed: false, refused: None, asks, stopped: None });
        self.report.joins += 1;
        // Lose the request one time in four (a stream of its own, so the seed's other draws
        // stay as they were): the sponsor fails before any member saw it, if the latest view
        // keeps a live majority without it.
        let latest = self.views.last().expect("the first view");
        let up = |m: &NodeId| *m != sponsor && self.nodes.iter().any(|n| n.id == *m && n.up());
        if self.lose.random_bool(0.25) && 2 * latest.iter().filter(|m| up(m)).count() > latest.len() {
            self.crash(sponsor);
            self.report.lost_requests += 1;
        }
        true
    }

    /// Crashes a random live node.
    pub(crate) fn crash_one(&mut self) {
        let live: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].up()).collect();
        if let Some(&i) = live.choose(&mut self.rng) {
            let id = self.nodes[i].id;
            if !self.spare(id) {
                self.crash(id);
            }
        }
    }

    /// Whether crashing `id` would leave the latest view without a live majority, and this
    /// run spares such crashes (see [`Sim::keep_majority`]).
    pub(crate) fn spare(&mut self, id: NodeId) -> bool {
        let latest = self.views.last().expect("the first view");
        let up = |n: &Node| n.up() && n.id != id && n.member.phase() != Phase::Excluded;
        let alive = latest.iter().filter(|&&m| self.nodes.iter().any(|n| n.id == m && up(n))).count();
        self.keep_majority && 2 * alive <= latest.len() && self.rng.random_bool(0.8)
    }

    /// Crashes node `id`.
    pub(crate) fn crash(&mut self, id: NodeId) {
        let i = self.index(id);
        self.nodes[i].crashed = true;
        self.world.crash(id);
        self.report.crashes += 1;
        if let Some(restarts) = &mut self.restarts
            && restarts.random_bool(0.5)
        {
            let specs = microrep_core::multicast::regions(&self.template);
            self.restarted.push(self.world.restart(id, &specs).expect("a crashed node restarts"));
            self.report.restarts += 1;
        }
    }
}

/// A fresh generator for a seed's scheduling choices.
pub(crate) fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Member `id`'s configuration: `template`'s, or, for a seed whose members are configured
/// apart, with its own `copy_at_receipt_bytes` per subgroup drawn from `apart_seed` and `id`.
fn member_config(template: &GroupConfig, id: NodeId, apart_seed: Option<u64>) -> GroupConfig {
    let mut config = GroupConfig { me: id, ..template.clone() };
    if let Some(seed) = apart_seed {
        let mut own = ChaCha8Rng::seed_from_u64(seed ^ OWN_THRESHOLD_STREAM ^ u64::from(id.0));
        for sub in &mut config.subgroups {
            sub.copy_at_receipt_bytes = own.random_range(0..=sub.max_payload_bytes);
        }
    }
    config
}
