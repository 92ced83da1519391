//! One commit, step by step, from what a [`TimedFabric`](super::timed_fabric) recorded between
//! the proposal and its `Committed` event (issue 18 §4: where a commit over verbs spends its
//! time). Each step is a histogram over the commits of a block:
//!
//! - **to first post**: from `propose` to the start of the first log WRITE (encoding, the local
//!   log write, whatever the leader polled first);
//! - **in posts**: the time spent inside every post call of the commit (for soft-RoCE each is a
//!   system call that also runs the send);
//! - **post to ack**: from the end of the log WRITE's post to the start of the poll that
//!   returned the first log WRITE completion (the majority: the leader and one follower);
//! - **last post to ack**: the same from the end of the last log WRITE's post (near zero when
//!   the acknowledgement was already waiting once the leader had posted to every follower);
//! - **ack to commit**: from that poll to the `Committed` event;
//! - **empty polls**: the time spent in polls that found no completion, and their number;
//! - the number of posts (log WRITEs, other WRITEs, READs) and completions per commit.

use hdrhistogram::Histogram;
use microrep_fabric::NodeId;

use super::timed_fabric::{Recorded, What};

/// The histograms of one block of commits.
pub(crate) struct Breakdown {
    steps: Vec<(&'static str, Histogram<u64>)>,
    counts: Vec<(&'static str, Histogram<u64>)>,
    /// Commits whose record held no completed log WRITE (not broken down).
    pub(crate) unmatched: u64,
}

const STEPS: [&str; 7] =
    ["total", "to first post", "in posts", "post to ack", "last post to ack", "ack to commit", "in empty polls"];
const COUNTS: [&str; 5] = ["log WRITEs", "other WRITEs", "READs", "completions", "empty polls"];

/// A log WRITE: the accept's slot (signaled, larger than a word).
fn is_log_write(what: What) -> bool {
    matches!(what, What::Write { len, signaled: true } if len > 8)
}

impl Breakdown {
    pub(crate) fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        Self {
            steps: STEPS.iter().map(|&s| (s, h())).collect(),
            counts: COUNTS.iter().map(|&s| (s, h())).collect(),
            unmatched: 0,
        }
    }

    /// Adds one commit proposed at `t0` and committed at `t_done` (trace clock).
    pub(crate) fn add(&mut self, t0: u64, t_done: u64, r: &Recorded) {
        let log_writes: Vec<(NodeId, u64, u64)> =
            r.events.iter().filter(|e| is_log_write(e.what)).map(|e| (e.peer, e.wr_id, e.at + e.took)).collect();
        let ack = r.events.iter().find_map(|e| match e.what {
            What::Completion { ok: true, .. } => log_writes
                .iter()
                .find(|(peer, id, _)| *peer == e.peer && *id == e.wr_id)
                .map(|&(_, _, posted)| (posted, e.at)),
            _ => None,
        });
        let (Some(first), Some((posted, acked))) = (r.events.iter().find(|e| is_log_write(e.what)), ack) else {
            self.unmatched += 1;
            return;
        };
        let last_posted = log_writes.iter().map(|&(_, _, posted)| posted).max().unwrap_or(posted);
        let in_posts: u64 =
            r.events.iter().filter(|e| !matches!(e.what, What::Completion { .. })).map(|e| e.took).sum();
        let steps = [
            t_done - t0,
            first.at.saturating_sub(t0),
            in_posts,
            acked.saturating_sub(posted),
            acked.saturating_sub(last_posted),
            t_done.saturating_sub(acked),
            r.empty_poll_ns,
        ];
        let count = |f: &dyn Fn(What) -> bool| r.events.iter().filter(|e| f(e.what)).count() as u64;
        let counts = [
            log_writes.len() as u64,
            count(&|w| matches!(w, What::Write { .. }) && !is_log_write(w)),
            count(&|w| matches!(w, What::Read { .. })),
            count(&|w| matches!(w, What::Completion { .. })),
            r.empty_polls,
        ];
        for ((_, h), v) in self.steps.iter_mut().zip(steps) {
            h.record(v).unwrap();
        }
        for ((_, h), v) in self.counts.iter_mut().zip(counts) {
            h.record(v).unwrap();
        }
    }

    /// Prints the block's table under `title`.
    pub(crate) fn print(&self, title: &str) {
        let commits = self.steps.first().map_or(0, |(_, h)| h.len());
        println!("{title}: {commits} commits broken down, {} without a completed log WRITE", self.unmatched);
        println!("{:<16} {:>9} {:>9} {:>9}", "step", "p50 us", "p99 us", "p99.9 us");
        let us = |ns: u64| format!("{:.1}", ns as f64 / 1000.0);
        for (name, h) in &self.steps {
            let q = |p| us(h.value_at_quantile(p));
            println!("{name:<16} {:>9} {:>9} {:>9}", q(0.5), q(0.99), q(0.999));
        }
        println!("{:<16} {:>9} {:>9} {:>9}", "per commit", "p50", "p99", "max");
        for (name, h) in &self.counts {
            let q = |p| h.value_at_quantile(p);
            println!("{name:<16} {:>9} {:>9} {:>9}", q(0.5), q(0.99), h.max());
        }
    }
}
