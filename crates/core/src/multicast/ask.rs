//! Joins a joiner asks for itself: the **join mailbox**. A join request is proposed by a member
//! ([`Member::propose_join`]) and spreads once another member adopts it; if its proposer fails
//! before any member saw it, it is lost, and the joiner would wait in [`Phase::Joining`] for
//! good. So a joiner that was told to ask ([`Member::ask_to_join`]) and has no state after
//! `retry_after_ns` writes its request word into the mailbox of a member of its template, the
//! next one (in the template's order, skipping itself) each time the timeout passes again.
//!
//! ```text
//! at the end of the state region (always writable, so a joiner needs no grant):
//!   mailbox  u64  a join request word (next::JoinRequest) a joiner left here; 0: none
//!   answer   u64  at a joiner: why a member refused its request (0: not refused)
//! ```
//!
//! Both are single words, never read torn. A member running in a view reads its mailbox each
//! poll; it proposes the request as its own and empties the mailbox; it leaves it while it
//! cannot propose now (another join pending, a change under way) and empties it if the node is
//! a member already (admitted, or being admitted: its state is coming). A request the group
//! cannot take (the view is full, or it names a subgroup the group lacks) is refused: the member
//! writes the reason into the joiner's answer word and the joiner's poll returns
//! [`MulticastError::JoinRefused`]. Two joiners writing one mailbox leave one request: the
//! other asks again after its timeout, at the next member. A request asked again while the
//! first is still on its way is harmless: requests naming a member are ignored (`view.rs`,
//! `next.rs`), so the node is admitted once.
//!
//! Every joiner also has a bound ([`GiveUp`], from [`Member::join`]): with no state that long
//! after its first poll it stops with [`MulticastError::JoinTimedOut`], asking or not, so no
//! joiner waits for good (a request lost by a joiner that does not ask; a group whose template
//! members all left or failed, which an asking joiner cannot reach).

use microrep_fabric::{Endpoint, Fabric, NodeId, RemoteAddr};

use super::api::{JoinError, MulticastError};
use super::member::{Link, Member, post};
use super::next::JoinRequest;
use super::transfer::STATE_REGION;
use super::view::Phase;

/// A joiner's bound on waiting for its state (module docs).
#[derive(Debug)]
pub(super) struct GiveUp {
    after_ns: u64,
    /// The first poll's time (`None` until then).
    started_ns: Option<u64>,
}

impl GiveUp {
    pub(super) fn after(after_ns: u64) -> Self {
        Self { after_ns, started_ns: None }
    }
}

/// A joiner's asking state.
#[derive(Debug)]
pub(super) struct Asking<E> {
    word: u64,
    retry_after_ns: u64,
    /// When to ask next (`None` until the first poll starts the clock).
    next_at_ns: Option<u64>,
    /// Asks made, to pick the next member of the template.
    asked: usize,
    /// The link to the member last asked.
    link: Option<Link<E>>,
}

/// A refusal word: bit 63, the reason in bits 32..40, its value in bits 0..32.
fn refusal_word(error: &JoinError) -> Option<u64> {
    let (kind, value) = match *error {
        JoinError::Full(max) => (1, max as u64),
        JoinError::NoSuchSubgroup(s) => (2, s as u64),
        _ => return None,
    };
    Some(1 << 63 | kind << 32 | value)
}

/// The refusal an answer word names (`None`: the word is 0, no refusal).
fn refusal(word: u64) -> Option<JoinError> {
    if word == 0 {
        return None;
    }
    let value = (word & 0xffff_ffff) as usize;
    Some(if (word >> 32) & 0xff == 1 { JoinError::Full(value) } else { JoinError::NoSuchSubgroup(value) })
}

impl<F: Fabric> Member<F> {
    /// A joiner ([`Member::join`]) asks the group itself to let it in as a member and sender of
    /// `subgroups`, whenever it has no state `retry_after_ns` (of the clock passed to
    /// [`Member::poll`]) after its first poll or its last ask, each time through the next member
    /// of its template (module docs). A member may still propose it meanwhile
    /// ([`Member::propose_join`]); it is admitted once.
    pub fn ask_to_join(&mut self, subgroups: &[usize], retry_after_ns: u64) -> Result<(), JoinError> {
        let template = self.joining.as_ref().ok_or(JoinError::NotAJoiner)?;
        if let Some(&bad) = subgroups.iter().find(|&&s| s >= template.subgroups.len()) {
            return Err(JoinError::NoSuchSubgroup(bad));
        }
        let word = JoinRequest::new(template.me, subgroups).word();
        self.asking = Some(Asking { word, retry_after_ns, next_at_ns: None, asked: 0, link: None });
        Ok(())
    }

    /// A joiner's poll before its state arrived: a refusal ends it, and so does its bound;
    /// else ask again if it is time (module docs). Returns whether it posted anything.
    pub(super) fn wait_for_state(&mut self, now_ns: u64) -> Result<bool, MulticastError> {
        let state = self.state_layout.as_ref().expect("a joiner has failure detection");
        if let Some(error) = refusal(self.fabric.load_u64(STATE_REGION, state.answer_at())?) {
            return Err(MulticastError::JoinRefused(error));
        }
        if let Some(give_up) = self.give_up.as_mut() {
            let waited_ns = now_ns.saturating_sub(*give_up.started_ns.get_or_insert(now_ns));
            if waited_ns >= give_up.after_ns {
                return Err(MulticastError::JoinTimedOut { waited_ns, asks: self.stats.join_asks });
            }
        }
        let (Some(asking), Some(template)) = (self.asking.as_mut(), self.joining.as_ref()) else { return Ok(false) };
        if let Some(ep) = asking.link.as_mut().and_then(|l| l.ep.as_mut()) {
            while ep.poll_completion().is_some() {}
        }
        let due = *asking.next_at_ns.get_or_insert(now_ns + asking.retry_after_ns);
        if now_ns < due {
            return Ok(false);
        }
        asking.next_at_ns = Some(now_ns + asking.retry_after_ns);
        let others: Vec<NodeId> = template.members.iter().copied().filter(|&m| m != template.me).collect();
        let Some(&member) = others.get(asking.asked % others.len().max(1)) else { return Ok(false) };
        asking.asked += 1;
        let mut link = Link::open(&self.fabric, member)?;
        let at = RemoteAddr::new(STATE_REGION, state.mailbox_at());
        let posted = post(&mut link, at, &asking.word.to_le_bytes(), &mut self.stats)?;
        asking.link = Some(link);
        self.stats.join_asks += u64::from(posted);
        Ok(posted)
    }

    /// A running member's look at its mailbox (module docs). A refusal is posted once, on a
    /// link kept until the next one: a joiner that missed it asks again and is told again.
    pub(super) fn answer_mailbox(&mut self) -> Result<bool, MulticastError> {
        if let Some(ep) = self.refusal_link.as_mut().and_then(|l| l.ep.as_mut()) {
            while ep.poll_completion().is_some() {}
        }
        let Some(state) = self.state_layout.as_ref() else { return Ok(false) };
        let (mailbox_at, answer_at) = (state.mailbox_at(), state.answer_at());
        let running = self.joining.is_none() && self.view.as_ref().is_some_and(|v| v.phase == Phase::Running);
        let Some(request) = JoinRequest::from_word(self.fabric.load_u64(STATE_REGION, mailbox_at)?) else {
            return Ok(false);
        };
        if !running {
            return Ok(false);
        }
        match self.propose_join(request.node, &request.subgroups()) {
            Ok(()) | Err(JoinError::AlreadyMember(_)) => {}
            Err(JoinError::Pending(_) | JoinError::NotRunning) => return Ok(false),
            Err(error) => {
                if let Some(word) = refusal_word(&error) {
                    let mut link = Link::open(&self.fabric, request.node)?;
                    post(&mut link, RemoteAddr::new(STATE_REGION, answer_at), &word.to_le_bytes(), &mut self.stats)?;
                    self.refusal_link = Some(link);
                }
            }
        }
        self.fabric.write_local(STATE_REGION, mailbox_at, &0u64.to_le_bytes())?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_one_word_and_round_trips() {
        for error in [JoinError::Full(8), JoinError::NoSuchSubgroup(46)] {
            let word = refusal_word(&error).expect("a refusal");
            assert_ne!(word, 0);
            assert_eq!(refusal(word), Some(error));
        }
        assert_eq!(refusal(0), None);
        assert_eq!(refusal_word(&JoinError::NotRunning), None, "a passing state, not a refusal");
    }
}
