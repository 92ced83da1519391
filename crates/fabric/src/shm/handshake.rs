//! The permission handshake of the shm fabric: Dekker's protocol on a slot's two words
//! (`PermSlot`), the CPU's version of the check a NIC makes when a write arrives (Mu §5.2).
//!
//! - The **writer** announces a copy (`in_flight` = its tag), fences, then reads `granted`; it
//!   copies only if the grant is still set, and clears `in_flight` (release) when done.
//! - The **revoker** clears `granted`, fences, then waits until it reads `in_flight` = 0
//!   (acquire); past that, no copy of that writer lands (the fabric fences a writer that stays
//!   inside a copy, see `await_writer`).
//!
//! One of the two always sees the other: either the writer reads the cleared grant and does not
//! copy, or the revoker reads the announcement and waits for the copy to end. The fences make
//! that so in the C11 model; the functions here are generic over the atomic type so that the
//! loom model below checks exactly this code (loom models `fence(SeqCst)`, not SeqCst loads and
//! stores, hence fences rather than SeqCst accesses).
//!
//! In the light mode (see `fence`) the writer's fence is only a compiler fence and the revoker
//! adds `membarrier`, which runs a full barrier on every CPU running a thread of the writer's
//! process: the same order, obtained from the kernel. The model checks the symmetric form;
//! that the light form is equivalent is the membarrier contract (liburcu, folly).

use std::sync::atomic::{Ordering, compiler_fence};

/// A 64-bit atomic word as the handshake uses it, with the fence of its memory model.
pub(crate) trait Word {
    /// Loads the word.
    fn load(&self, order: Ordering) -> u64;
    /// Stores the word.
    fn store(&self, value: u64, order: Ordering);
    /// A sequentially consistent fence.
    fn fence();
}

impl Word for std::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        self.load(order)
    }

    fn store(&self, value: u64, order: Ordering) {
        self.store(value, order);
    }

    fn fence() {
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// The writer's store-load fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriterFence {
    /// A full fence of its own.
    Full,
    /// A compiler fence; the revoker's `membarrier` supplies the hardware one.
    Light,
}

/// Writer: announces a copy tagged `tag` (non-zero) and checks the grant. True: the caller may
/// copy, then must call [`leave`]. False: refused, nothing announced.
#[inline]
pub(crate) fn enter<W: Word>(granted: &W, in_flight: &W, tag: u64, fence: WriterFence) -> bool {
    in_flight.store(tag, Ordering::Relaxed);
    match fence {
        WriterFence::Full => W::fence(),
        WriterFence::Light => compiler_fence(Ordering::SeqCst),
    }
    if granted.load(Ordering::Relaxed) == 0 {
        in_flight.store(0, Ordering::Release);
        return false;
    }
    true
}

/// Writer: the copy is done.
#[inline]
pub(crate) fn leave<W: Word>(in_flight: &W) {
    in_flight.store(0, Ordering::Release);
}

/// Revoker: takes the grant away. The caller then issues the heavy barrier for light writers
/// and waits with [`copy_in_flight`] until it reads 0.
pub(crate) fn withdraw<W: Word>(granted: &W) {
    granted.store(0, Ordering::Relaxed);
    W::fence();
}

/// Revoker: the tag of a copy still in flight, 0 if none. Reading 0 after [`withdraw`] means
/// every copy that saw the grant has ended (and happened before this read).
pub(crate) fn copy_in_flight<W: Word>(in_flight: &W) -> u64 {
    in_flight.load(Ordering::Acquire)
}

/// Granter: lets the writer copy.
pub(crate) fn grant<W: Word>(granted: &W) {
    granted.store(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;

    use super::*;

    impl Word for AtomicU64 {
        fn load(&self, order: Ordering) -> u64 {
            self.load(order)
        }

        fn store(&self, value: u64, order: Ordering) {
            self.store(value, order);
        }

        fn fence() {
            loom::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    type Enter = fn(&AtomicU64, &AtomicU64, u64) -> bool;
    type Withdraw = fn(&AtomicU64);

    fn full(granted: &AtomicU64, in_flight: &AtomicU64, tag: u64) -> bool {
        enter(granted, in_flight, tag, WriterFence::Full)
    }

    /// A writer copies into a region while a revoker withdraws its grant and then writes the
    /// region itself, as a new leader does. Loom explores every interleaving and every value a
    /// C11 load may return; the region is a loom cell, so a copy that is not ordered before the
    /// revoker's own write is reported as a data race.
    fn revoke_during_a_copy(enter: Enter, withdraw: Withdraw) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(move || {
            let granted = Arc::new(AtomicU64::new(1));
            let in_flight = Arc::new(AtomicU64::new(0));
            let region = Arc::new(UnsafeCell::new(0u64));
            let writer = {
                let (granted, in_flight, region) = (granted.clone(), in_flight.clone(), region.clone());
                loom::thread::spawn(move || {
                    if enter(&granted, &in_flight, 7) {
                        // SAFETY: a loom cell; loom checks that this access races with nothing.
                        region.with_mut(|p| unsafe { *p = 1 });
                        leave(&*in_flight);
                    }
                })
            };
            withdraw(&granted);
            while copy_in_flight(&*in_flight) != 0 {
                loom::thread::yield_now();
            }
            // SAFETY: as above.
            region.with_mut(|p| unsafe { *p = 2 });
            writer.join().expect("writer");
        });
    }

    #[test]
    fn a_copy_never_lands_after_the_revoke_returns() {
        revoke_during_a_copy(full, super::withdraw);
    }

    #[test]
    fn the_model_catches_a_writer_that_checks_the_grant_before_announcing() {
        // A planted mutation: the grant is read first, then the copy announced. The revoker can
        // withdraw in between and find no copy in flight, while the writer copies anyway.
        fn check_first(granted: &AtomicU64, in_flight: &AtomicU64, tag: u64) -> bool {
            let ok = Word::load(granted, Ordering::Relaxed) != 0;
            <AtomicU64 as Word>::fence();
            Word::store(in_flight, tag, Ordering::Relaxed);
            ok
        }
        let caught = std::panic::catch_unwind(|| revoke_during_a_copy(check_first, super::withdraw));
        assert!(caught.is_err(), "loom must find the race of the planted writer");
    }

    #[test]
    fn the_model_catches_a_writer_without_a_fence() {
        // A planted mutation: no store-load fence on the writer's side (and no membarrier):
        // the store may not be visible to the revoker when the writer reads the old grant.
        fn unfenced(granted: &AtomicU64, in_flight: &AtomicU64, tag: u64) -> bool {
            Word::store(in_flight, tag, Ordering::Relaxed);
            Word::load(granted, Ordering::Relaxed) != 0
        }
        let caught = std::panic::catch_unwind(|| revoke_during_a_copy(unfenced, super::withdraw));
        assert!(caught.is_err(), "loom must find the race of the unfenced writer");
    }

    #[test]
    fn the_model_catches_a_revoker_without_a_fence() {
        // A planted mutation: the revoker reads `in_flight` without fencing after its store.
        fn unfenced(granted: &AtomicU64) {
            Word::store(granted, 0, Ordering::Relaxed);
        }
        let caught = std::panic::catch_unwind(|| revoke_during_a_copy(full, unfenced));
        assert!(caught.is_err(), "loom must find the race of the unfenced revoker");
    }
}
