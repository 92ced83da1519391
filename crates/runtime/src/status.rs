//! A node's status as `microrep status` shows it: the protocol state, the application digest,
//! and the recent leader changes (fail-overs).

use std::borrow::Cow;
use std::collections::VecDeque;

use microrep_core::mu::{Configuration, Role, Status};
use microrep_fabric::NodeId;
use serde::{Deserialize, Serialize};

/// Leader changes kept in the status.
const HISTORY: usize = 16;

/// One change of the leader this node believes in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderChange {
    /// Milliseconds since the node started.
    pub at_ms: u64,
    /// The new leader.
    pub leader: u16,
}

/// A node's status, as `MICROREP.STATUS` and `microrep status` carry it in JSON; clients
/// read it back with serde (a field added later is ignored by older clients).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node.
    pub node: u16,
    /// Its role.
    #[serde(serialize_with = "role_name", deserialize_with = "role_from_name")]
    pub role: Role,
    /// The replica it believes leads (from its failure detector).
    pub leader: Option<u16>,
    /// What its replication plane is doing.
    pub phase: Cow<'static, str>,
    /// Its current proposal number.
    pub proposal_number: u64,
    /// First undecided offset of its log.
    pub fuo: u64,
    /// Next index it applies.
    pub applied: u64,
    /// Its log's recycling point (the log head).
    pub tail: u64,
    /// Followers that granted it write permission (when leading).
    pub confirmed: Vec<u16>,
    /// Proposals queued in the protocol core.
    pub pending: usize,
    /// Times it became leader.
    pub terms_led: u64,
    /// Prepare phases it ran.
    pub prepares: u64,
    /// Whether it recovers from a start with fresh memory: it follows and catches up but counts
    /// in no quorum until a leader promotes it (or, in a new cluster, every member is up).
    pub recovering: bool,
    /// The application's state digest, if it computes one.
    pub digest: Option<String>,
    /// The cluster configuration's fingerprint.
    pub fingerprint: String,
    /// Milliseconds since the node started (as of this status).
    pub uptime_ms: u64,
    /// Recent leader changes, oldest first.
    pub leader_changes: VecDeque<LeaderChange>,
    /// Why the node stopped, if it did.
    pub fatal: Option<String>,
    /// The members of the configuration it applied last (`microrep member`).
    #[serde(default)]
    pub members: Vec<u16>,
    /// How many membership changes made that configuration.
    #[serde(default)]
    pub epoch: u64,
    /// Whether it rests between heartbeats: the cluster has been idle, and it heartbeats at
    /// `cluster.timing.idle_heartbeat_us` (a proposal wakes it).
    #[serde(default)]
    pub resting: bool,
}

fn role_from_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
    let name = String::deserialize(d)?;
    match name.to_ascii_lowercase().as_str() {
        "follower" => Ok(Role::Follower),
        "candidate" => Ok(Role::Candidate),
        "leader" => Ok(Role::Leader),
        _ => Err(serde::de::Error::unknown_variant(&name, &["follower", "candidate", "leader"])),
    }
}

fn role_name<S: serde::Serializer>(role: &Role, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match role {
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Leader => "leader",
    })
}

impl NodeStatus {
    pub(crate) fn new(node: NodeId, fingerprint: u64) -> Self {
        Self {
            node: node.0,
            role: Role::Follower,
            leader: None,
            phase: Cow::Borrowed("starting"),
            proposal_number: 0,
            fuo: 0,
            applied: 0,
            tail: 0,
            confirmed: Vec::new(),
            pending: 0,
            terms_led: 0,
            prepares: 0,
            recovering: true,
            digest: None,
            fingerprint: format!("{fingerprint:016x}"),
            uptime_ms: 0,
            leader_changes: VecDeque::new(),
            fatal: None,
            members: Vec::new(),
            epoch: 0,
            resting: false,
        }
    }

    /// Records the configuration applied.
    pub(crate) fn set_configuration(&mut self, configuration: Configuration) {
        self.members = configuration.members.iter().map(|id| id.0).collect();
        self.epoch = configuration.epoch;
    }

    /// The configuration recorded.
    pub(crate) fn configuration(&self) -> Configuration {
        Configuration { members: self.members.iter().map(|&id| NodeId(id)).collect(), epoch: self.epoch }
    }

    pub(crate) fn refresh(&mut self, core: &Status, digest: Option<u64>, now_ns: u64) {
        self.role = core.role;
        self.phase = Cow::Borrowed(core.phase.as_str());
        self.proposal_number = core.proposal_number;
        self.fuo = core.fuo;
        self.applied = core.applied;
        self.tail = core.tail;
        self.confirmed = core.confirmed.iter().map(|n| n.0).collect();
        self.pending = core.pending;
        self.terms_led = core.terms_led;
        self.prepares = core.prepares;
        self.recovering = !core.voter;
        self.set_configuration(core.configuration);
        self.digest = digest.map(|d| format!("{d:016x}"));
        self.uptime_ms = now_ns / 1_000_000;
    }

    pub(crate) fn leader_changed(&mut self, leader: NodeId, now_ns: u64) {
        self.leader = Some(leader.0);
        if self.leader_changes.len() == HISTORY {
            self.leader_changes.pop_front();
        }
        self.leader_changes.push_back(LeaderChange { at_ms: now_ns / 1_000_000, leader: leader.0 });
    }

    /// The status as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_json_reads_back_as_the_same_status() {
        let mut status = NodeStatus::new(NodeId(2), 0xfeed);
        status.role = Role::Leader;
        status.leader_changed(NodeId(2), 5_000_000);
        status.digest = Some("00ab".into());
        let back: NodeStatus = serde_json::from_str(&status.to_json()).expect("reads back");
        assert_eq!(back, status);
        let mut json: serde_json::Value = serde_json::from_str(&status.to_json()).expect("json");
        json["role"] = "Leader".into();
        json["added_by_a_newer_node"] = 1.into();
        let lenient: NodeStatus = serde_json::from_value(json.clone()).expect("case and unknown fields");
        assert_eq!(lenient.role, Role::Leader);
        json["role"] = "king".into();
        assert!(serde_json::from_value::<NodeStatus>(json).is_err(), "an unknown role is an error");
    }
}
