//! The gateway's lifecycle flags: drain (stop accepting, finish what is in flight) and stop
//! (exit now). The gateway handle sets them; workers, the control thread and the admin
//! listener read them on their ticks.
//!
//! Owns two atomics, the drain's deadline, and the wakers of workers and of the control
//! thread sleeping through a quiet tick (a drain, a stop or a reload nudges them). Nothing
//! on the request path waits on them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::Instant;

/// Flags the gateway handle uses to stop its threads.
#[derive(Debug, Default)]
pub struct Lifecycle {
    drain: AtomicBool,
    stop: AtomicBool,
    /// When the drain's grace ends (the stop follows).
    deadline: OnceLock<Instant>,
    /// Nudges so far: a drain, a stop, or a reload handed to the workers.
    nudges: AtomicU64,
    /// Workers whose tick slowed down for a quiet core, by worker id: woken by a nudge.
    /// Taken when a worker starts a quiet tick and by a nudge, never on the request path.
    quiet: Mutex<HashMap<usize, Waker>>,
}

impl Lifecycle {
    /// The id the control thread waits on [`nudged`](Self::nudged) by while it sleeps
    /// through a quiet tick (workers use theirs, from 0).
    pub const CONTROL: usize = usize::MAX;

    /// Stop accepting; finish in-flight requests, which have until `deadline`.
    pub fn start_drain(&self, deadline: Instant) {
        let _ = self.deadline.set(deadline);
        self.drain.store(true, Ordering::Relaxed);
        self.nudge();
    }

    /// When the grace of a drain in progress ends.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.get().copied()
    }

    /// Grace period over (or immediate stop): exit now.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.nudge();
    }

    /// Wakes every worker sleeping through a quiet tick, so it looks at its flags and its
    /// handoffs now.
    pub fn nudge(&self) {
        self.nudges.fetch_add(1, Ordering::SeqCst);
        let waiting: Vec<Waker> = match self.quiet.lock() {
            Ok(mut q) => q.drain().map(|(_, w)| w).collect(),
            Err(_) => return,
        };
        for w in waiting {
            w.wake();
        }
    }

    /// Waits for the next [`nudge`](Self::nudge) after this call (worker `id`'s quiet tick,
    /// or [`CONTROL`](Self::CONTROL)'s).
    pub fn nudged(&self, id: usize) -> impl std::future::Future<Output = ()> + '_ {
        let start = self.nudges.load(Ordering::SeqCst);
        std::future::poll_fn(move |cx| {
            if let Ok(mut q) = self.quiet.lock() {
                // Looked at under the lock a nudge takes: a nudge either comes after the
                // waker is in, or its count is seen here.
                if self.nudges.load(Ordering::SeqCst) != start {
                    q.remove(&id);
                    return Poll::Ready(());
                }
                q.insert(id, cx.waker().clone());
            }
            Poll::Pending
        })
    }

    pub fn draining(&self) -> bool {
        self.drain.load(Ordering::Relaxed)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
