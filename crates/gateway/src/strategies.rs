//! Building each route's strategy instances from the configuration: one per route on every
//! worker core (each with its own seed), and one mirror per route on the control thread
//! (taught by every sample, for the admin API).
//!
//! Owns the build context's shared parts (weights, names, prices, switches, the KV-cache
//! view). It must not hold per-request state.

use std::sync::Arc;

use rolter_config::{Config, Route};
use rolter_core::{KvCacheView, PriceBook, Switches};
use rolter_strategy::{BuildContext, Strategy};

/// What every route's strategy is built from.
pub struct StrategyFactory {
    target_count: usize,
    weights: Vec<f64>,
    names: Vec<String>,
    prices: PriceBook,
    switches: Arc<Switches>,
    kv: Option<Arc<dyn KvCacheView>>,
}

impl StrategyFactory {
    pub fn new(
        config: &Config,
        prices: PriceBook,
        switches: Arc<Switches>,
        kv: Option<Arc<dyn KvCacheView>>,
    ) -> Self {
        StrategyFactory {
            target_count: config.targets.len(),
            weights: config.targets.iter().map(|t| t.weight).collect(),
            names: config.targets.iter().map(|t| t.name.clone()).collect(),
            prices,
            switches,
            kv,
        }
    }

    /// One instance of `route`'s strategy, its randomness seeded with `seed`.
    pub fn build(&self, route: &Route, seed: u64) -> Box<dyn Strategy> {
        route.strategy.build(&BuildContext {
            target_count: self.target_count,
            seed,
            weights: &self.weights,
            names: &self.names,
            route_targets: &route.targets,
            prices: &self.prices,
            switches: &self.switches,
            kv: self.kv.as_ref(),
        })
    }
}
