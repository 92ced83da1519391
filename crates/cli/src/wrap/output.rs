//! Output checking (FALCON): the leader's shim digests what its server writes to each client
//! (CRC-64 over 4 KiB buckets, `microrep_interpose_wire::OutputDigest`) and reports each
//! bucket; the leader's wrap node puts the buckets into the log (`Check` entries, every
//! [`CHECK_EVERY`] buckets of a connection and at its close). A follower's replay agent
//! digests what its own copy answers on the same connection and compares, bucket by bucket,
//! as both become known. A copy whose output differs has diverged: it is reported (a log
//! line, `microrep status`'s `output` counts) and, with `--output-check repair`, rebuilt from
//! a peer's state.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use microrep_interpose_wire::{OutputBucket, OutputDigest};

/// What a replica does with its copy's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OutputCheck {
    /// Nothing is digested or compared.
    Off,
    /// Followers compare their copy's output with the leader's and report differences.
    Report,
    /// As `report`, and a follower whose copy's output differs rebuilds its copy.
    Repair,
}

/// Buckets of one connection a leader puts into one `Check` entry.
pub(crate) const CHECK_EVERY: usize = 8;
/// Completed buckets a follower keeps before the leader's check for them arrives (a follower
/// whose copy runs ahead of the log's checks drops the oldest).
const KEPT: usize = 1024;

/// Encodes buckets as a `Check` entry's payload.
pub(crate) fn encode(buckets: &[OutputBucket]) -> Vec<u8> {
    buckets.iter().flat_map(OutputBucket::encode).collect()
}

/// Decodes a `Check` entry's payload; `None` if it is not whole buckets.
pub(crate) fn decode(payload: &[u8]) -> Option<Vec<OutputBucket>> {
    if !payload.len().is_multiple_of(OutputBucket::BYTES) {
        return None;
    }
    let buckets = payload.chunks_exact(OutputBucket::BYTES);
    Some(buckets.filter_map(|b| b.try_into().ok()).map(OutputBucket::decode).collect())
}

/// The leader's buckets waiting to go into the log, per connection.
#[derive(Debug, Default)]
pub(crate) struct Reported(Mutex<HashMap<u64, Vec<OutputBucket>>>);

impl Reported {
    /// Adds a bucket of `conn`; the buckets due for a `Check` entry, if any: [`CHECK_EVERY`]
    /// of them, or all at a connection's last (partial) bucket.
    pub(crate) fn add(&self, conn: u64, bucket: OutputBucket) -> Option<Vec<OutputBucket>> {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let last = bucket.len < microrep_interpose_wire::OUTPUT_BUCKET_BYTES;
        if last {
            let mut due = all.remove(&conn).unwrap_or_default();
            due.push(bucket);
            return Some(due);
        }
        let waiting = all.entry(conn).or_default();
        waiting.push(bucket);
        (waiting.len() >= CHECK_EVERY).then(|| std::mem::take(waiting))
    }

    /// Takes the buckets of `conn` still waiting (it is closing).
    pub(crate) fn take(&self, conn: u64) -> Option<Vec<OutputBucket>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&conn).filter(|w| !w.is_empty())
    }

    /// Forgets every connection (a new copy, or a new term).
    pub(crate) fn clear(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// What the comparisons found, for `microrep status`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Buckets equal to the leader's.
    pub(crate) matched: AtomicU64,
    /// Buckets that differed from the leader's (or were missing).
    pub(crate) differed: AtomicU64,
}

impl Counts {
    /// Adds what a connection found since it was last asked.
    pub(crate) fn add(&self, conn: &mut ConnOutput) {
        self.matched.fetch_add(std::mem::take(&mut conn.matched), Ordering::Relaxed);
        self.differed.fetch_add(std::mem::take(&mut conn.differed), Ordering::Relaxed);
    }
}

/// A bucket that differed: the leader's, and this copy's (`None`: this copy wrote less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub(crate) leader: OutputBucket,
    pub(crate) ours: Option<OutputBucket>,
}

/// A follower's view of one replayed connection's output.
#[derive(Debug, Default)]
pub(crate) struct ConnOutput {
    digest: OutputDigest,
    /// Buckets of this copy's output not checked yet.
    ours: BTreeMap<u64, OutputBucket>,
    /// The leader's buckets not matched yet (this copy has not written them yet).
    expected: BTreeMap<u64, OutputBucket>,
    /// True for a connection this copy took over mid-stream (a state transfer re-opened it):
    /// its bucket boundaries are not the leader's, and nothing is compared.
    unaligned: bool,
    /// Buckets compared equal, and differing, since [`Counts::add`] last took them.
    matched: u64,
    differed: u64,
}

impl ConnOutput {
    /// A connection re-opened mid-stream (not compared).
    pub(crate) fn unaligned() -> Self {
        Self { unaligned: true, ..Self::default() }
    }

    /// This copy answered `bytes` on the connection.
    pub(crate) fn answered(&mut self, bytes: &[u8]) -> Vec<Mismatch> {
        if self.unaligned {
            return Vec::new();
        }
        let mut done = Vec::new();
        self.digest.feed(bytes, |b| done.push(b));
        done.into_iter().filter_map(|b| self.ours_known(b)).collect()
    }

    /// The leader's check arrived for `buckets` of this connection.
    pub(crate) fn checked(&mut self, buckets: &[OutputBucket]) -> Vec<Mismatch> {
        if self.unaligned {
            return Vec::new();
        }
        let mut found = Vec::new();
        for &leader in buckets {
            match self.ours.remove(&leader.bucket) {
                Some(ours) => found.extend(self.compare(leader, Some(ours))),
                // This copy's last bucket is still partial while the connection is open.
                None => drop(self.expected.insert(leader.bucket, leader)),
            }
        }
        found
    }

    /// The connection closed, every reply drained: its last partial bucket is complete, and a
    /// leader's bucket still unmatched is output this copy never wrote.
    pub(crate) fn closed(&mut self) -> Vec<Mismatch> {
        if self.unaligned {
            return Vec::new();
        }
        let mut found: Vec<Mismatch> = self.digest.partial().and_then(|b| self.ours_known(b)).into_iter().collect();
        for leader in std::mem::take(&mut self.expected).into_values() {
            found.extend(self.compare(leader, None));
        }
        found
    }

    fn ours_known(&mut self, ours: OutputBucket) -> Option<Mismatch> {
        match self.expected.remove(&ours.bucket) {
            Some(leader) => self.compare(leader, Some(ours)),
            None => {
                if self.ours.len() == KEPT {
                    self.ours.pop_first();
                }
                self.ours.insert(ours.bucket, ours);
                None
            }
        }
    }

    fn compare(&mut self, leader: OutputBucket, ours: Option<OutputBucket>) -> Option<Mismatch> {
        if ours == Some(leader) {
            self.matched += 1;
            return None;
        }
        self.differed += 1;
        Some(Mismatch { leader, ours })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use microrep_interpose_wire::OUTPUT_BUCKET_BYTES;

    fn leader_buckets(output: &[u8]) -> Vec<OutputBucket> {
        let mut digest = OutputDigest::default();
        let mut all = Vec::new();
        digest.feed(output, |b| all.push(b));
        all.extend(digest.partial());
        all
    }

    #[test]
    fn equal_output_matches_whether_the_check_or_the_reply_comes_first() {
        let output: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let checks = leader_buckets(&output);
        let counts = Counts::default();
        let mut early = ConnOutput::default();
        assert!(early.checked(&checks).is_empty());
        assert!(early.answered(&output[..5000]).is_empty());
        assert!(early.answered(&output[5000..]).is_empty());
        assert!(early.closed().is_empty());
        let mut late = ConnOutput::default();
        assert!(late.answered(&output).is_empty());
        assert!(late.checked(&checks).is_empty());
        assert!(late.closed().is_empty());
        counts.add(&mut early);
        counts.add(&mut late);
        assert_eq!((counts.matched.load(Ordering::Relaxed), counts.differed.load(Ordering::Relaxed)), (6, 0));
    }

    #[test]
    fn a_changed_byte_and_missing_output_are_found() {
        let output = vec![7u8; 2 * OUTPUT_BUCKET_BYTES as usize + 10];
        let checks = leader_buckets(&output);
        let mut changed = ConnOutput::default();
        let mut ours = output.clone();
        ours[5000] ^= 1;
        changed.answered(&ours);
        let found = changed.checked(&checks);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].leader.bucket, 1, "the second bucket holds byte 5000");
        let mut short = ConnOutput::default();
        short.answered(&output[..100]);
        short.checked(&checks);
        let missing = short.closed();
        assert_eq!(missing.len(), 3, "its one partial bucket differs and two of the leader's were never written");
        let mut skipped = ConnOutput::unaligned();
        skipped.answered(&ours);
        assert!(skipped.checked(&checks).is_empty() && skipped.closed().is_empty());
    }

    #[test]
    fn the_leader_checks_every_eight_buckets_and_at_the_last() {
        let reported = Reported::default();
        let full = |bucket| OutputBucket { bucket, len: OUTPUT_BUCKET_BYTES, crc: bucket };
        for b in 0..7 {
            assert!(reported.add(4096, full(b)).is_none());
        }
        assert_eq!(reported.add(4096, full(7)).map(|v| v.len()), Some(8));
        assert!(reported.add(4096, full(8)).is_none());
        let last = OutputBucket { bucket: 9, len: 3, crc: 1 };
        assert_eq!(reported.add(4096, last).map(|v| v.len()), Some(2));
        assert_eq!(decode(&encode(&[full(1), last])), Some(vec![full(1), last]));
        assert_eq!(decode(&[0; 5]), None);
    }
}
