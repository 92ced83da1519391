//! The completion slot of one proposal, filled by whichever thread runs the replication plane
//! and awaited by the proposing thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::api::{Committed, ProposeError};
use crate::idle::Parker;

/// The outcome of a proposal once known.
pub(crate) type Outcome = Result<Committed, ProposeError>;

/// One proposal's completion slot.
#[derive(Debug)]
pub(crate) struct Ticket {
    done: AtomicBool,
    outcome: Mutex<Option<Outcome>>,
    waiter: Arc<Parker>,
    /// When it was submitted, in the node's clock (for the commit latency metric).
    submitted_ns: u64,
}

thread_local! {
    static PARKER: Arc<Parker> = Parker::current();
}

impl Ticket {
    /// A slot awaited by the calling thread, for a proposal submitted at `submitted_ns`.
    pub(crate) fn for_current_thread(submitted_ns: u64) -> Arc<Self> {
        Arc::new(Self {
            done: AtomicBool::new(false),
            outcome: Mutex::new(None),
            waiter: PARKER.with(Arc::clone),
            submitted_ns,
        })
    }

    /// When the proposal was submitted, in the node's clock.
    pub(crate) fn submitted_ns(&self) -> u64 {
        self.submitted_ns
    }

    /// Fills the slot (the first outcome wins) and wakes the waiter.
    pub(crate) fn complete(&self, outcome: Outcome) {
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(outcome);
            // SeqCst: ordered before `wake`'s load of the parked flag, as the waiter's store
            // of that flag is before its check of `done` (`park_until_done`): one of the two
            // sees the other, so no wake-up is lost.
            self.done.store(true, Ordering::SeqCst);
            drop(slot);
            self.waiter.wake();
        }
    }

    /// The outcome, if known (a cheap load until then).
    pub(crate) fn take(&self) -> Option<Outcome> {
        if !self.done.load(Ordering::Acquire) {
            return None;
        }
        self.outcome.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Whether the outcome is known.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Parks the waiting thread (the caller) up to `timeout`, unless the outcome is known: the
    /// completing thread wakes it.
    pub(crate) fn park_until_done(&self, timeout: Duration) {
        self.waiter.park_unless(timeout, || self.done.load(Ordering::SeqCst));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Index;

    #[test]
    fn first_outcome_wins_and_is_taken_once() {
        let t = Ticket::for_current_thread(0);
        assert!(t.take().is_none());
        let ok = Committed { index: Index { entry: 3, position: 1 }, reply: b"r".to_vec() };
        t.complete(Ok(ok.clone()));
        t.complete(Err(ProposeError::Unknown));
        assert!(t.is_done());
        assert_eq!(t.take(), Some(Ok(ok)));
        assert_eq!(t.take(), None);
    }
}
