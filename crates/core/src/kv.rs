//! The read side of the engines' KV caches, as the gateway rebuilt them from the engines'
//! KV-cache events: what a KV-aware strategy may ask at pick time.
//!
//! `rolter-engine` implements it (`kv::view::EngineView`) over its lock-free block index;
//! strategies only call it. Every method must be cheap, lock-free and allocation-free once
//! the output buffers have grown.

use std::sync::Arc;

use crate::TargetId;

/// What the engines hold in their KV caches.
pub trait KvCacheView: Send + Sync {
    /// Whether target `target`'s KV-event stream is live, so its entries can be trusted.
    fn is_live(&self, target: TargetId) -> bool;

    /// The keys of the prompt's full blocks of `tokens`, chained so that a match is a
    /// consecutive prefix, written to `out` (cleared first).
    fn block_keys(&self, tokens: &[u32], out: &mut Vec<u64>);

    /// For each `targets[i]`, writes to `scores[i]` how many consecutive leading `keys` it
    /// holds.
    fn leading_blocks(&self, keys: &[u64], targets: &[u32], scores: &mut [u32]);
}

/// The view as the worker cores share it.
pub type KvView = Arc<dyn KvCacheView>;
