//! What busy polling costs, over every worker: the wall time the workers spent polling
//! (`server.busy_poll`), written as `rolter_busy_poll_seconds_total`.
//!
//! Owns the shared counter. A worker adds to it once per polling stretch, never per
//! request; it must not be read on the request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Time spent polling, all workers together.
#[derive(Debug, Default)]
pub struct PollStats {
    nanos: AtomicU64,
}

impl PollStats {
    /// One polling stretch of a worker ended after `spent`.
    pub fn add(&self, spent: Duration) {
        self.nanos
            .fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Time polled so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}
