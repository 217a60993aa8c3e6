//! A core's sign of life: the request path notes each client request and each upstream
//! read here. A busy-polling worker keeps polling while notes keep coming, and a worker
//! whose signal tick slowed down for a quiet core ticks fast again at the first note.
//!
//! Owns a counter and the wakers of the two that wait for a note. It must not take a lock,
//! read the clock or allocate: a note is on every read of the request path.

use std::cell::Cell;
use std::task::Waker;

/// Who waits for the next note.
#[derive(Debug, Clone, Copy)]
pub enum Waiter {
    /// The busy poller ([`crate::runtime::busy_poll`]), when it stopped polling.
    Poller = 0,
    /// The worker's signal tick, while the core is quiet.
    Tick = 1,
}

/// Notes of work on one core.
#[derive(Default)]
pub struct Activity {
    notes: Cell<u64>,
    sleepers: [Cell<Option<Waker>>; 2],
}

impl Activity {
    /// Work happened: a request arrived or an upstream answered.
    #[inline]
    pub fn note(&self) {
        self.notes.set(self.notes.get().wrapping_add(1));
        for s in &self.sleepers {
            if let Some(w) = s.take() {
                w.wake();
            }
        }
    }

    /// How many notes so far (only its changes mean anything).
    pub fn count(&self) -> u64 {
        self.notes.get()
    }

    /// Waits for the next note.
    pub async fn next(&self, who: Waiter) {
        let start = self.count();
        std::future::poll_fn(|cx| {
            if self.count() != start {
                std::task::Poll::Ready(())
            } else {
                self.sleepers[who as usize].set(Some(cx.waker().clone()));
                std::task::Poll::Pending
            }
        })
        .await
    }
}
