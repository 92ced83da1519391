//! Pull-score failure detection and leader choice (Mu §5.1).
//!
//! Every replica increments a heartbeat counter in its CONTROL region; every other replica READs
//! it once per period. A counter that moved raises the peer's score, one that did not (or a
//! failed READ) lowers it; scores stay in `0..=score_max`. A live peer whose score drops below
//! `score_fail_below` is failed; a failed peer whose score climbs above `score_recover_above`
//! is live again. The gap between the two thresholds is the hysteresis that keeps a slow peer
//! from flapping. The leader is the lowest-id live replica (Mu's rule); with leader stickiness
//! (`MuConfig::sticky_leader`) the lowest-id live replica that says it leads comes first.

use microrep_fabric::NodeId;

use super::MuConfig;

#[derive(Clone, Copy, Debug)]
struct PeerScore {
    last_counter: Option<u64>,
    score: u8,
    live: bool,
    /// Whether it may lead: a recovering replica may not (see `standing`).
    voter: bool,
    /// Whether it says it leads, with the proposal number of its term (0 while acquiring), as
    /// its `LEADING` word was last read.
    leading: Option<u64>,
}

/// Scores of every replica as seen from one replica.
#[derive(Clone, Debug)]
pub struct PullScore {
    me: NodeId,
    peers: Vec<PeerScore>,
    score_max: u8,
    fail_below: u8,
    recover_above: u8,
    no_hysteresis: bool,
    sticky: bool,
}

impl PullScore {
    /// Every peer starts live with a middling score, so a cluster that boots together agrees on
    /// replica 0 at once, and a peer that never heartbeats is failed within a few periods.
    pub fn new(config: &MuConfig) -> Self {
        let start = PeerScore {
            last_counter: None,
            score: config.score_recover_above + 1,
            live: true,
            voter: true,
            leading: None,
        };
        Self {
            me: config.node,
            peers: vec![start; usize::from(config.replicas)],
            score_max: config.score_max,
            fail_below: config.score_fail_below,
            recover_above: config.score_recover_above,
            no_hysteresis: config.bug(super::planted::PlantedBug::NoScoreHysteresis),
            sticky: config.sticky_leader,
        }
    }

    /// Records one READ of `peer`'s heartbeat: `Some(counter)` or `None` if the READ failed.
    /// Returns whether the peer's liveness changed.
    pub fn observe(&mut self, peer: NodeId, counter: Option<u64>) -> bool {
        let moved = counter.is_some_and(|c| self.moved(peer, c));
        let p = &mut self.peers[usize::from(peer.0)];
        if counter.is_some() {
            p.last_counter = counter;
        }
        p.score = if moved { (p.score + 1).min(self.score_max) } else { p.score.saturating_sub(1) };
        let was = p.live;
        if p.live && p.score < self.fail_below {
            p.live = false;
        } else if !p.live && (p.score > self.recover_above || (self.no_hysteresis && p.score >= self.fail_below)) {
            p.live = true;
        }
        was != p.live
    }

    /// Whether `counter` differs from the last counter read from `peer` (or is its first).
    pub fn moved(&self, peer: NodeId, counter: u64) -> bool {
        self.peers[usize::from(peer.0)].last_counter != Some(counter)
    }

    /// Records whether `peer` is a candidate (a voter that does not abstain) and whether it
    /// says it leads (as its heartbeat READ found it).
    pub fn set_standing(&mut self, peer: NodeId, voter: bool, leading: Option<u64>) {
        let p = &mut self.peers[usize::from(peer.0)];
        p.voter = voter;
        p.leading = leading;
    }

    /// The leader: among the live voters and this replica (which counts itself as both), with
    /// stickiness on, the one that says it leads the newest term (the highest proposal number;
    /// `me_leading` for this one), the lowest id among equal claims; failing that the lowest id.
    /// Of two replicas that both say they lead, the newer term wins: a leader paused long enough
    /// to be replaced wakes claiming its old term, and must follow its successor (preferring the
    /// lower id there made it take leadership back, a duel).
    pub fn leader(&self, me_leading: Option<u64>) -> NodeId {
        let me = usize::from(self.me.0);
        let candidate = |i: usize, p: &PeerScore| i == me || (p.live && p.voter);
        let claim = |i: usize, p: &PeerScore| if i == me { me_leading } else { p.leading };
        self.newest_claim(|i, p| candidate(i, p).then(|| claim(i, p)).flatten())
            .or_else(|| self.first(candidate))
            .unwrap_or(self.me)
    }

    /// With stickiness, the replica whose `claim` names the highest proposal number (the lowest
    /// id among equals); `None` without stickiness or claims.
    fn newest_claim(&self, claim: impl Fn(usize, &PeerScore) -> Option<u64>) -> Option<NodeId> {
        let newest = self.peers.iter().enumerate().filter_map(|(i, p)| claim(i, p).map(|t| (t, std::cmp::Reverse(i))));
        newest.max().filter(|_| self.sticky).map(|(_, std::cmp::Reverse(i))| NodeId(i as u16))
    }

    /// A leader other than this replica: a live voter as [`Self::leader`] would choose it;
    /// failing that the lowest-id live peer (whose standing may not be known yet: a cluster
    /// bootstrapping together); this one if no peer is live.
    pub fn leader_among_peers(&self) -> NodeId {
        self.other_candidate().or_else(|| self.live_peer(false)).unwrap_or(self.me)
    }

    /// The live voter other than this one that [`Self::leader`] would choose, if any.
    pub fn other_candidate(&self) -> Option<NodeId> {
        let me = usize::from(self.me.0);
        self.newest_claim(|i, p| if i != me && p.live && p.voter { p.leading } else { None })
            .or_else(|| self.live_peer(true))
    }

    /// The lowest id whose score passes `pick`.
    fn first(&self, pick: impl Fn(usize, &PeerScore) -> bool) -> Option<NodeId> {
        self.peers.iter().enumerate().find(|&(i, p)| pick(i, p)).map(|(i, _)| NodeId(i as u16))
    }

    fn live_peer(&self, voter: bool) -> Option<NodeId> {
        let me = usize::from(self.me.0);
        self.first(|i, p| i != me && p.live && (p.voter || !voter))
    }

    /// The replicas considered live, this one included.
    pub fn live_set(&self) -> super::MemberSet {
        (0..self.peers.len()).map(|i| NodeId(i as u16)).filter(|&p| self.is_live(p)).collect()
    }

    /// Whether `peer` is considered live.
    pub fn is_live(&self, peer: NodeId) -> bool {
        peer == self.me || self.peers[usize::from(peer.0)].live
    }

    /// The current score of `peer`.
    pub fn score(&self, peer: NodeId) -> u8 {
        self.peers[usize::from(peer.0)].score
    }

    /// Whether `peer` is not on its way to being failed or live again: a live peer's score is
    /// in the upper half of the way from `score_max` down to `score_fail_below` (a READ that
    /// missed one heartbeat, as the scheduler makes some miss, does not count), a failed peer's
    /// is zero (every READ of it lately found its counter still). This replica is settled.
    pub fn settled(&self, peer: NodeId) -> bool {
        let high = self.score_max - (self.score_max - self.fail_below) / 2;
        let p = &self.peers[usize::from(peer.0)];
        peer == self.me || if p.live { p.score >= high } else { p.score == 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> PullScore {
        PullScore::new(&MuConfig::new(NodeId(2), 3))
    }

    /// A score between its bounds is a peer on its way to failing or coming back: the
    /// background plane polls at its own pace then. One missed heartbeat does not count.
    #[test]
    fn a_peer_is_settled_only_while_not_on_its_way_to_failing_or_back() {
        let mut d = detector();
        assert!(!d.settled(NodeId(0)), "scores start in the middle");
        assert!(d.settled(NodeId(2)), "this replica");
        for counter in 1..=20 {
            d.observe(NodeId(0), Some(counter));
            d.observe(NodeId(1), Some(counter));
        }
        assert!(d.settled(NodeId(0)) && d.settled(NodeId(1)), "both counters moved at every READ");
        d.observe(NodeId(0), Some(20));
        assert!(d.settled(NodeId(0)), "one missed heartbeat");
        let mut misses = 1;
        while d.settled(NodeId(0)) {
            d.observe(NodeId(0), Some(20));
            misses += 1;
        }
        assert!(d.is_live(NodeId(0)), "unsettled before it is failed");
        assert!(d.settled(NodeId(1)), "a peer's misses leave the others settled");
        assert_eq!(misses, 7, "the upper half of the way from 15 down to 2");
        while d.is_live(NodeId(0)) {
            d.observe(NodeId(0), Some(20));
        }
        assert!(!d.settled(NodeId(0)), "failed, on its way to zero");
        while d.score(NodeId(0)) > 0 {
            d.observe(NodeId(0), None);
        }
        assert!(d.settled(NodeId(0)), "failed and still");
        d.observe(NodeId(0), Some(21));
        assert!(!d.settled(NodeId(0)), "coming back");
    }

    #[test]
    fn section_5_1_lowest_live_replica_leads() {
        let mut d = detector();
        assert_eq!(d.leader(None), NodeId(0));
        for _ in 0..20 {
            d.observe(NodeId(0), Some(5));
        }
        assert!(!d.is_live(NodeId(0)), "a counter that never moves means failure");
        assert_eq!(d.leader(None), NodeId(1));
    }

    #[test]
    fn section_5_1_scores_have_hysteresis() {
        let mut d = detector();
        let mut counter = 0;
        while d.is_live(NodeId(0)) {
            d.observe(NodeId(0), Some(counter));
        }
        assert_eq!(d.score(NodeId(0)), 1, "failed just below the failure threshold");
        let mut rises = 0;
        while !d.is_live(NodeId(0)) {
            counter += 1;
            d.observe(NodeId(0), Some(counter));
            rises += 1;
        }
        assert_eq!(d.score(NodeId(0)), 7, "recovered just above the recovery threshold");
        assert_eq!(rises, 6, "a failed peer must beat steadily before it leads again");
        for _ in 0..40 {
            counter += 1;
            d.observe(NodeId(0), Some(counter));
        }
        assert_eq!(d.score(NodeId(0)), 15, "scores are capped");
    }

    #[test]
    fn section_5_1_a_fate_sharing_replica_does_not_choose_itself() {
        let d = PullScore::new(&MuConfig::new(NodeId(0), 3));
        assert_eq!(d.leader(None), NodeId(0));
        assert_eq!(d.leader_among_peers(), NodeId(1));
    }

    /// Of two live replicas that both say they lead, the newer term wins, not the lower id: a
    /// leader woken from a pause claims its old term and must follow its successor.
    #[test]
    fn section_5_1_of_two_claims_the_newer_term_leads() {
        let mut d = PullScore::new(&MuConfig::new(NodeId(0), 3));
        d.set_standing(NodeId(1), true, Some(0x0501));
        assert_eq!(d.leader(Some(0x0400)), NodeId(1), "this replica's claim is older");
        assert_eq!(d.leader(Some(0x0600)), NodeId(0), "this replica's claim is newer");
        assert_eq!(d.leader(None), NodeId(1));
        d.set_standing(NodeId(2), true, Some(0x0502));
        assert_eq!(d.leader(None), NodeId(2));
        assert_eq!(d.other_candidate(), Some(NodeId(2)));
        d.set_standing(NodeId(2), false, Some(0x0502));
        assert_eq!(d.leader(None), NodeId(1), "a replica that abstains or recovers is no candidate");
    }

    #[test]
    fn failed_reads_count_as_silence() {
        let mut d = detector();
        for _ in 0..10 {
            d.observe(NodeId(1), None);
        }
        assert!(!d.is_live(NodeId(1)));
        assert!(d.is_live(NodeId(2)), "a replica never suspects itself");
    }
}
