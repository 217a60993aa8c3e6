//! What the KV-event plane reports per target (stream and index counters), written by the
//! index thread and read when `/metrics` is rendered. Shared as a snapshot behind a mutex
//! that only those two threads touch, never a worker.

use std::sync::{Arc, Mutex};

/// One target's KV-event stream and index share, as `/metrics` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvTargetReport {
    pub target: usize,
    /// The subscription is connected to the publisher.
    pub connected: bool,
    /// The workers trust this target's index entries (stream in order and recent).
    pub live: bool,
    /// Messages received (live and replayed).
    pub frames: u64,
    /// Messages received through replay.
    pub replayed: u64,
    /// Messages that were not three frames, or whose sequence was not 8 bytes.
    pub malformed: u64,
    /// Messages dropped because the index thread fell behind.
    pub dropped: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Replays requested, and those that failed.
    pub replays: u64,
    pub replay_failures: u64,
    /// Publisher restarts (the sequence went back).
    pub seq_resets: u64,
    /// Times the target's entries were dropped (an unrepaired gap or return, a restart).
    pub drops: u64,
    /// Blocks the index holds for the target, and blocks evicted by its memory bound.
    pub blocks: u64,
    pub evicted: u64,
}

/// The latest per-target reports, written by the index thread every 100 ms and read by the
/// control thread when `/metrics` is rendered (never by a worker).
#[derive(Debug, Clone, Default)]
pub struct KvReports(Arc<Mutex<Vec<KvTargetReport>>>);

impl KvReports {
    pub fn snapshot(&self) -> Vec<KvTargetReport> {
        self.0.lock().map(|g| g.clone()).unwrap_or_default()
    }

    #[cfg_attr(not(feature = "kv-events"), allow(dead_code))]
    pub(crate) fn publish(&self, reports: Vec<KvTargetReport>) {
        if let Ok(mut g) = self.0.lock() {
            *g = reports;
        }
    }
}
