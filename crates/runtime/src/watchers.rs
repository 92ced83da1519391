//! Threads that watch a node's observable state (its leader, whether it rests, a fatal error,
//! its removal, a request to leave) and park between changes instead of polling for them: each
//! change unparks every registered thread (`Node::unpark_on_change`).

use std::sync::{Mutex, PoisonError};
use std::thread::Thread;

/// The threads to unpark when a node's observable state changes.
#[derive(Debug, Default)]
pub(crate) struct Watchers(Mutex<Vec<Thread>>);

impl Watchers {
    /// Unparks `thread` at every later change (once per thread, however often it is added).
    pub(crate) fn add(&self, thread: Thread) {
        let mut threads = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if threads.iter().all(|t| t.id() != thread.id()) {
            threads.push(thread);
        }
    }

    /// Something observable changed: unparks every watching thread (a thread that is not
    /// parked returns from its next park at once, so a change between its look and its park
    /// is not missed).
    pub(crate) fn changed(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().for_each(Thread::unpark);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_change_before_the_watcher_parks_ends_its_next_park_at_once() {
        let watchers = Watchers::default();
        watchers.add(std::thread::current());
        watchers.add(std::thread::current());
        assert_eq!(watchers.0.lock().expect("not poisoned").len(), 1, "added once");
        watchers.changed();
        // Without the change this parks an hour and the test times out.
        std::thread::park_timeout(Duration::from_secs(3600));
    }

    #[test]
    fn a_change_wakes_a_parked_watcher() {
        let watchers = std::sync::Arc::new(Watchers::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let watcher = {
            let watchers = std::sync::Arc::clone(&watchers);
            std::thread::spawn(move || {
                watchers.add(std::thread::current());
                tx.send(()).expect("the test waits");
                std::thread::park_timeout(Duration::from_secs(3600));
            })
        };
        rx.recv().expect("the watcher registered");
        watchers.changed();
        watcher.join().expect("the watcher was woken");
    }
}
