//! What a strategy instance is built for: the route's targets, the prices, the run-time
//! switches and the engines' KV-cache view, as one core's worker sees them.

use std::sync::Arc;

use rolter_core::{KvCacheView, PriceBook, Switches, TargetId};

/// What a strategy instance is built for.
pub struct BuildContext<'a> {
    /// Number of targets in the whole configuration (strategies index state by target id).
    pub target_count: usize,
    /// Seed for per-core randomness.
    pub seed: u64,
    /// Every target's routing weight, indexed by target id.
    pub weights: &'a [f64],
    /// Every target's name, indexed by target id (hash rings place targets by name).
    pub names: &'a [String],
    /// The targets of the route this instance serves, in configuration order.
    pub route_targets: &'a [TargetId],
    /// Prices per target and model (catalog, `[catalog]` and per-target overrides).
    pub prices: &'a PriceBook,
    /// Run-time switches shared by every core (the adaptive kill switch).
    pub switches: &'a Arc<Switches>,
    /// What the engines hold in their KV caches; `None` when no target publishes KV events.
    pub kv: Option<&'a Arc<dyn KvCacheView>>,
}

impl BuildContext<'_> {
    /// Target `t`'s weight (1.0 for an id out of range).
    pub fn weight(&self, t: TargetId) -> f64 {
        self.weights.get(t).copied().unwrap_or(1.0)
    }
}
