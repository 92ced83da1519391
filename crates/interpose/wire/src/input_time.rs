//! Input time (docs/WRAP.md, "Time and randomness"): every `Data` entry carries the time the
//! leader's wrap node chose for it, and every copy's server sees that time, not its own clock,
//! while it processes those bytes. The leader's shim gets it in the reply that says the bytes
//! committed. A follower's copy reads replayed bytes from the replay agent's connections, which
//! may hold several entries at once; so the agent publishes, before it writes an entry's bytes,
//! a record in the control page: where the entry ends in the stream of replayed bytes (the same
//! count as [`crate::CONTROL_REPLAY_READ`]) and its time. The shim, reading replayed bytes,
//! finds the record of the next unread byte, shortens the read to the end of that entry (a
//! short read is legal), and takes its time.
//!
//! The records form a ring of [`INPUT_TIME_SLOTS`] slots after the control page's counters.
//! One writer (the agent) and the server's reading thread: record `i` lives in slot
//! `i % INPUT_TIME_SLOTS` as three words (`i + 1`, end, time); the writer reuses a slot only
//! once the server read past the end of the record in it, and stores the index word last
//! (release), so a reader that finds the index it expects before and after reading the other
//! two words read a whole record.

use core::sync::atomic::{AtomicU64, Ordering};

/// Control page word (u64 index): how many input-time records the agent published.
pub const CONTROL_INPUT_TIMES: usize = 4;
/// Control page word (u64 index) where the ring of input-time records starts.
pub const CONTROL_INPUT_TIME_RING: usize = 8;
/// Records the ring holds.
pub const INPUT_TIME_SLOTS: usize = 1024;
/// Words per record.
const RECORD_WORDS: usize = 3;
/// Control page words the ring and the words before it take.
pub const INPUT_TIME_END_WORD: usize = CONTROL_INPUT_TIME_RING + INPUT_TIME_SLOTS * RECORD_WORDS;

/// One entry's replayed bytes end before byte `end` of the replayed stream, and were input at
/// `time_ns` (nanoseconds since the Unix epoch, the leader's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputTime {
    pub end: u64,
    pub time_ns: u64,
}

fn slot(page: &[AtomicU64], record: u64) -> Option<&[AtomicU64]> {
    let at = CONTROL_INPUT_TIME_RING + (record % INPUT_TIME_SLOTS as u64) as usize * RECORD_WORDS;
    page.get(at..at + RECORD_WORDS)
}

/// The writer's side: publishes `time` as record number `record` (the count published so
/// far). The caller first makes sure that the server read past the end of record
/// `record - INPUT_TIME_SLOTS` (see [`oldest_unconsumed_end`]). False if `page` is too short.
pub fn publish(page: &[AtomicU64], record: u64, time: InputTime) -> bool {
    let (Some(words), Some(count)) = (slot(page, record), page.get(CONTROL_INPUT_TIMES)) else { return false };
    let [index, end, time_ns] = words else { return false };
    index.store(0, Ordering::Release);
    end.store(time.end, Ordering::Relaxed);
    time_ns.store(time.time_ns, Ordering::Relaxed);
    index.store(record + 1, Ordering::Release);
    count.store(record + 1, Ordering::Release);
    true
}

/// The end of the record whose slot record `record` would take, if it is still needed: the
/// writer waits until the server read that far before publishing `record`.
pub fn oldest_unconsumed_end(page: &[AtomicU64], record: u64) -> Option<u64> {
    let previous = record.checked_sub(INPUT_TIME_SLOTS as u64)?;
    read_record(page, previous).map(|t| t.end)
}

fn read_record(page: &[AtomicU64], record: u64) -> Option<InputTime> {
    let [index, end, time_ns] = slot(page, record)? else { return None };
    if index.load(Ordering::Acquire) != record + 1 {
        return None;
    }
    let found = InputTime { end: end.load(Ordering::Relaxed), time_ns: time_ns.load(Ordering::Relaxed) };
    core::sync::atomic::fence(Ordering::Acquire);
    (index.load(Ordering::Relaxed) == record + 1).then_some(found)
}

/// The reader's side: the record of replayed byte `read` (the next one the server reads),
/// searching from record `from` (a hint, the last one found); returns it with its number.
/// `None` if no record covers that byte (the writer did not publish one: nothing to shorten).
pub fn find(page: &[AtomicU64], from: u64, read: u64) -> Option<(u64, InputTime)> {
    let published = page.get(CONTROL_INPUT_TIMES)?.load(Ordering::Acquire);
    let mut record = from.max(published.saturating_sub(INPUT_TIME_SLOTS as u64));
    while record < published {
        match read_record(page, record) {
            Some(t) if t.end > read => return Some((record, t)),
            // Consumed, or already overwritten by a later record (so consumed too).
            _ => record += 1,
        }
    }
    None
}

/// Forgets every record (the server restarts, and the replayed stream with it).
pub fn reset(page: &[AtomicU64]) {
    let words = page.get(CONTROL_INPUT_TIMES..INPUT_TIME_END_WORD).unwrap_or_default();
    for word in words {
        word.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> [AtomicU64; INPUT_TIME_END_WORD] {
        core::array::from_fn(|_| AtomicU64::new(0))
    }

    #[test]
    fn the_record_of_each_byte_is_found_in_order() {
        let page = page();
        assert_eq!(find(&page, 0, 0), None, "nothing published");
        assert!(publish(&page, 0, InputTime { end: 10, time_ns: 100 }));
        assert!(publish(&page, 1, InputTime { end: 25, time_ns: 200 }));
        assert_eq!(find(&page, 0, 0), Some((0, InputTime { end: 10, time_ns: 100 })));
        assert_eq!(find(&page, 0, 9), Some((0, InputTime { end: 10, time_ns: 100 })));
        assert_eq!(find(&page, 0, 10), Some((1, InputTime { end: 25, time_ns: 200 })));
        assert_eq!(find(&page, 1, 24), Some((1, InputTime { end: 25, time_ns: 200 })));
        assert_eq!(find(&page, 1, 25), None, "past the last record");
    }

    #[test]
    fn the_ring_wraps_and_a_reused_slot_is_never_taken_for_its_old_record() {
        let page = page();
        let slots = INPUT_TIME_SLOTS as u64;
        for record in 0..slots {
            assert_eq!(oldest_unconsumed_end(&page, record), None, "a free slot");
            publish(&page, record, InputTime { end: record + 1, time_ns: record });
        }
        assert_eq!(oldest_unconsumed_end(&page, slots), Some(1), "the writer waits for record 0's end");
        publish(&page, slots, InputTime { end: slots + 1, time_ns: 7 });
        assert_eq!(find(&page, 0, 0), Some((1, InputTime { end: 2, time_ns: 1 })), "record 0 is gone, 1 is next");
        assert_eq!(find(&page, 0, slots), Some((slots, InputTime { end: slots + 1, time_ns: 7 })));
    }

    #[test]
    fn a_reset_forgets_every_record() {
        let page = page();
        publish(&page, 0, InputTime { end: 10, time_ns: 100 });
        reset(&page);
        assert_eq!(find(&page, 0, 0), None);
        assert_eq!(oldest_unconsumed_end(&page, INPUT_TIME_SLOTS as u64), None);
    }
}
