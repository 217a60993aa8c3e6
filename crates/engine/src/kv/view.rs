//! What the workers' strategies can read about the engines' own state: the KV block index
//! (read without locks) and, per target, whether its KV-event stream is live, behind the
//! core crate's [`KvCacheView`].
//!
//! Owns only shared handles. The control plane's KV-event thread writes through its own
//! [`KvIndex`](crate::kv::index::KvIndex) and flips the liveness flags; strategies only read.
//! Nothing here blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rolter_core::{KvCacheView, TargetId};

use super::index::{KeySpace, KvIndexReader};

/// The engines' state as the gateway rebuilt it, shared by every core.
#[derive(Clone, Default)]
pub struct EngineView {
    /// The KV block index; `None` when no target publishes KV events.
    pub kv: Option<KvIndexReader>,
    /// Per target id: its KV events arrive and the index holds a consistent copy of them.
    kv_live: Arc<[AtomicBool]>,
}

impl EngineView {
    /// A view over `reader` for `targets` targets, every stream not live yet.
    pub fn with_kv(reader: KvIndexReader, targets: usize) -> Self {
        EngineView {
            kv: Some(reader),
            kv_live: (0..targets).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether target `t`'s KV-event stream is live.
    #[inline]
    pub fn kv_live(&self, t: usize) -> bool {
        self.kv_live
            .get(t)
            .is_some_and(|b| b.load(Ordering::Relaxed))
    }

    /// Marks target `t`'s stream live or not (the KV-event thread).
    pub fn set_kv_live(&self, t: usize, live: bool) {
        if let Some(b) = self.kv_live.get(t) {
            b.store(live, Ordering::Relaxed);
        }
    }
}

impl KvCacheView for EngineView {
    #[inline]
    fn is_live(&self, target: TargetId) -> bool {
        self.kv_live(target)
    }

    fn block_keys(&self, tokens: &[u32], out: &mut Vec<u64>) {
        match &self.kv {
            Some(index) => index.request_keys(KeySpace::default(), tokens, out),
            None => out.clear(),
        }
    }

    fn leading_blocks(&self, keys: &[u64], targets: &[u32], scores: &mut [u32]) {
        match &self.kv {
            Some(index) => index.longest_prefix(keys, targets, scores),
            None => scores.fill(0),
        }
    }
}
