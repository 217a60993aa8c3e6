//! The gateway's lifecycle flags: drain (stop accepting, finish what is in flight) and stop
//! (exit now). The gateway handle sets them; workers, the control thread and the admin
//! listener read them on their ticks.
//!
//! Owns two atomics and the drain's deadline, nothing else. Nothing on the request path
//! waits on them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Flags the gateway handle uses to stop its threads.
#[derive(Debug, Default)]
pub struct Lifecycle {
    drain: AtomicBool,
    stop: AtomicBool,
    /// When the drain's grace ends (the stop follows).
    deadline: OnceLock<Instant>,
}

impl Lifecycle {
    /// Stop accepting; finish in-flight requests, which have until `deadline`.
    pub fn start_drain(&self, deadline: Instant) {
        let _ = self.deadline.set(deadline);
        self.drain.store(true, Ordering::Relaxed);
    }

    /// When the grace of a drain in progress ends.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.get().copied()
    }

    /// Grace period over (or immediate stop): exit now.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.drain.load(Ordering::Relaxed)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
