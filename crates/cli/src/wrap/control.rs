//! The control page a wrap node shares with the shim inside its server (`shim.ctl`, both map
//! it): counters the shim keeps (replayed bytes read, and processed), and the gate through
//! which the node holds client input back while its copy gives a peer its state
//! (`microrep_interpose_wire::CONTROL_GATE`).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use microrep_interpose_wire::{
    CONTROL_BYTES, CONTROL_GATE, CONTROL_GATED_CALLS, CONTROL_REPLAY_READ, CONTROL_REPLAY_SETTLED, InputTime,
    input_time,
};

/// The wrap node's mapping of the control page.
#[derive(Debug)]
pub(crate) struct Control {
    page: NonNull<AtomicU64>,
}

// SAFETY: the mapping is only accessed through atomics, from any thread, and lives until drop.
unsafe impl Send for Control {}
// SAFETY: as above: shared access is atomic.
unsafe impl Sync for Control {}

impl Control {
    /// Maps `file`, already sized to `CONTROL_BYTES`.
    pub(crate) fn map(file: &std::fs::File) -> std::io::Result<Self> {
        // SAFETY: a fresh shared mapping of a file of CONTROL_BYTES; unmapped only in drop, and
        // only ever read and written as u64 atomics (page-aligned, so every word is aligned).
        let page = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                CONTROL_BYTES,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                file,
                0,
            )
        }?;
        let page = NonNull::new(page.cast()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Self { page })
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < CONTROL_BYTES / 8, "control word {index} is outside the page");
        // SAFETY: in bounds of the live mapping (checked above), aligned, and only used as an
        // atomic by this process and the shim.
        unsafe { &*self.page.as_ptr().add(index) }
    }

    /// The whole page, as words.
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the live mapping holds CONTROL_BYTES / 8 aligned words, only used atomically.
        unsafe { std::slice::from_raw_parts(self.page.as_ptr(), CONTROL_BYTES / 8) }
    }

    /// Zeroes the shim's counters and the input times, for a server that is about to start
    /// again.
    pub(crate) fn reset(&self) {
        for index in [CONTROL_REPLAY_READ, CONTROL_REPLAY_SETTLED, CONTROL_GATED_CALLS] {
            self.word(index).store(0, Ordering::SeqCst);
        }
        input_time::reset(self.words());
    }

    /// Publishes the input time of the replayed bytes about to be written (they end at byte
    /// `time.end` of the replayed stream), as record `record`; first waits (at most `patience`)
    /// until the server read past the record whose slot it takes. False if it did not.
    pub(crate) fn publish_input_time(&self, record: u64, time: InputTime, patience: Duration) -> bool {
        if let Some(end) = input_time::oldest_unconsumed_end(self.words(), record) {
            let deadline = Instant::now() + patience;
            while self.replay_read() < end {
                if Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        input_time::publish(self.words(), record, time)
    }

    /// Bytes the server read on the replay agent's connections.
    pub(crate) fn replay_read(&self) -> u64 {
        self.word(CONTROL_REPLAY_READ).load(Ordering::Acquire)
    }

    /// Bytes read on the agent's connections that the server is known to have processed (its
    /// reading thread went back to waiting with nothing ready after reading them).
    pub(crate) fn settled(&self) -> u64 {
        self.word(CONTROL_REPLAY_SETTLED).load(Ordering::Acquire)
    }

    /// Holds client input back: closes the gate and waits (at most `patience`) until no server
    /// thread is inside a gated call, so that from then on the server reads no client input and
    /// accepts no client until the returned guard is dropped. `None` (the gate open again) if a
    /// call was still inside after `patience`.
    pub(crate) fn hold_clients(&self, patience: Duration) -> Option<HeldClients<'_>> {
        self.word(CONTROL_GATE).store(1, Ordering::SeqCst);
        let held = HeldClients(self);
        let deadline = Instant::now() + patience;
        while self.word(CONTROL_GATED_CALLS).load(Ordering::SeqCst) != 0 {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Some(held)
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference to it outlives self.
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr().cast(), CONTROL_BYTES) };
    }
}

/// Client input held back (see [`Control::hold_clients`]); dropping it lets it through again.
#[derive(Debug)]
pub(crate) struct HeldClients<'a>(&'a Control);

impl Drop for HeldClients<'_> {
    fn drop(&mut self) {
        self.0.word(CONTROL_GATE).store(0, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control page in a file removed at once (the mapping keeps it).
    fn page() -> Control {
        let name = format!("microrep-ctl-test-{}-{:?}", std::process::id(), std::thread::current().id());
        let path = std::env::temp_dir().join(name);
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("create");
        file.set_len(CONTROL_BYTES as u64).expect("size");
        let control = Control::map(&file).expect("map");
        std::fs::remove_file(&path).expect("remove");
        control
    }

    #[test]
    fn holding_clients_waits_for_calls_inside_and_the_guard_reopens_the_gate() {
        let control = page();
        let calls = control.word(CONTROL_GATED_CALLS);
        calls.store(1, Ordering::SeqCst);
        assert!(control.hold_clients(Duration::from_millis(5)).is_none(), "a call is inside");
        assert_eq!(control.word(CONTROL_GATE).load(Ordering::SeqCst), 0, "given up: open again");
        calls.store(0, Ordering::SeqCst);
        let held = control.hold_clients(Duration::from_secs(1)).expect("no call inside");
        assert_eq!(control.word(CONTROL_GATE).load(Ordering::SeqCst), 1);
        drop(held);
        assert_eq!(control.word(CONTROL_GATE).load(Ordering::SeqCst), 0);
    }

    #[test]
    fn input_times_wait_for_their_slot_and_a_reset_forgets_them() {
        let control = page();
        let slots = input_time::INPUT_TIME_SLOTS as u64;
        for record in 0..slots {
            assert!(control.publish_input_time(record, InputTime { end: record + 1, time_ns: 5 }, Duration::ZERO));
        }
        assert!(
            !control.publish_input_time(slots, InputTime { end: slots + 1, time_ns: 6 }, Duration::from_millis(2)),
            "the server has not read record 0 yet"
        );
        control.word(CONTROL_REPLAY_READ).store(1, Ordering::SeqCst);
        assert!(control.publish_input_time(slots, InputTime { end: slots + 1, time_ns: 6 }, Duration::ZERO));
        control.reset();
        assert_eq!(input_time::find(control.words(), 0, 0), None);
    }

    #[test]
    fn a_reset_zeroes_the_counters() {
        let control = page();
        control.word(CONTROL_REPLAY_READ).store(5, Ordering::SeqCst);
        control.word(CONTROL_REPLAY_SETTLED).store(4, Ordering::SeqCst);
        control.reset();
        assert_eq!((control.replay_read(), control.settled()), (0, 0));
    }
}
