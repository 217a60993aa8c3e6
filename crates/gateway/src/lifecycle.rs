//! The gateway's lifecycle flags: drain (stop accepting, finish what is in flight) and stop
//! (exit now). The gateway handle sets them; workers, the control thread and the admin
//! listener read them on their ticks.
//!
//! Owns two atomics and nothing else. Nothing on the request path waits on them.

use std::sync::atomic::{AtomicBool, Ordering};

/// Flags the gateway handle uses to stop its threads.
#[derive(Debug, Default)]
pub struct Lifecycle {
    drain: AtomicBool,
    stop: AtomicBool,
}

impl Lifecycle {
    /// Stop accepting; finish in-flight requests.
    pub fn start_drain(&self) {
        self.drain.store(true, Ordering::Relaxed);
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
