//! A core's sign of life for busy polling: the request path notes each client request and
//! each upstream read here, and a polling worker keeps polling while notes keep coming.
//!
//! Owns a counter and the waker of a poller that went to sleep. It must not take a lock,
//! read the clock or allocate: a note is on every read of the request path, polling on or
//! off.

use std::cell::Cell;
use std::task::Waker;

/// Notes of work on one core (see [`crate::runtime::busy_poll`]).
#[derive(Default)]
pub struct Activity {
    notes: Cell<u64>,
    /// The poller, when it stopped polling and waits for work.
    sleeper: Cell<Option<Waker>>,
}

impl Activity {
    /// Work happened: a request arrived or an upstream answered.
    #[inline]
    pub fn note(&self) {
        self.notes.set(self.notes.get().wrapping_add(1));
        if let Some(w) = self.sleeper.take() {
            w.wake();
        }
    }

    /// How many notes so far (only its changes mean anything).
    pub fn count(&self) -> u64 {
        self.notes.get()
    }

    /// Waits for the next note.
    pub async fn next(&self) {
        let start = self.count();
        std::future::poll_fn(|cx| {
            if self.count() != start {
                std::task::Poll::Ready(())
            } else {
                self.sleeper.set(Some(cx.waker().clone()));
                std::task::Poll::Pending
            }
        })
        .await
    }
}
