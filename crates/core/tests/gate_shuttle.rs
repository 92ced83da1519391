//! The local-log gate's handshake under shuttle's schedule exploration (`--features shuttle`):
//! once `set_owner` returns, no write of the previous owner is under way or starts later, in
//! every interleaving shuttle tries. A gate without the manager's wait (the same handshake
//! minus one loop) fails the same check, so the check can fail.
#![cfg(feature = "shuttle")]

use std::sync::Arc;

use microrep_core::mu::LocalLogGate;
use microrep_fabric::NodeId;
use shuttle::sync::atomic::{AtomicBool, AtomicU32, Ordering};

const ITERATIONS: usize = 20_000;

/// What the check needs of a gate.
trait Gate: Send + Sync + 'static {
    fn write_if_owner(&self, me: NodeId, write: impl FnOnce()) -> bool;
    fn set_owner(&self, owner: NodeId);
}

impl Gate for LocalLogGate {
    fn write_if_owner(&self, me: NodeId, write: impl FnOnce()) -> bool {
        LocalLogGate::write_if_owner(self, me, write)
    }
    fn set_owner(&self, owner: NodeId) {
        LocalLogGate::set_owner(self, owner);
    }
}

/// The handshake without the manager's wait for an announced write.
struct NoWait {
    owner: AtomicU32,
}

impl Gate for NoWait {
    fn write_if_owner(&self, me: NodeId, write: impl FnOnce()) -> bool {
        let owns = self.owner.load(Ordering::SeqCst) == u32::from(me.0);
        if owns {
            write();
        }
        owns
    }
    fn set_owner(&self, owner: NodeId) {
        self.owner.store(u32::from(owner.0), Ordering::SeqCst);
    }
}

/// Replica 1 owns the log and writes it three times while the permission manager hands it to
/// replica 2; each write checks, in two steps, that the hand-over has not returned yet.
fn hand_over<G: Gate>(gate: Arc<G>) {
    gate.set_owner(NodeId(1));
    let handed_over = Arc::new(AtomicBool::new(false));
    let writer = {
        let (gate, handed_over) = (Arc::clone(&gate), Arc::clone(&handed_over));
        shuttle::thread::spawn(move || {
            for _ in 0..3 {
                gate.write_if_owner(NodeId(1), || {
                    assert!(!handed_over.load(Ordering::SeqCst), "a write began after the hand-over");
                    shuttle::thread::yield_now();
                    assert!(!handed_over.load(Ordering::SeqCst), "a write was under way after the hand-over");
                });
            }
        })
    };
    gate.set_owner(NodeId(2));
    handed_over.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
}

#[test]
fn once_the_owner_changed_the_previous_owner_writes_nothing() {
    shuttle::check_random(|| hand_over(LocalLogGate::new()), ITERATIONS);
}

#[test]
fn a_gate_whose_manager_does_not_wait_is_caught() {
    let caught = std::panic::catch_unwind(|| {
        shuttle::check_random(|| hand_over(Arc::new(NoWait { owner: AtomicU32::new(u32::MAX) })), ITERATIONS);
    });
    assert!(caught.is_err(), "shuttle found no interleaving where the unguarded write runs late");
}
