//! One module per strategy: its typed options (with their defaults), its per-core state
//! and its pick. `docs/strategies.md` is the behaviour each one implements.

pub mod adaptive;
pub mod cache_aware;
pub mod cheapest;
pub mod consistent_hash;
pub mod failover;
pub mod fair_catchup;
pub mod fastest;
pub mod least_loaded;
pub mod lmcache_aware;
pub mod lora_aware;
pub mod pipeline;
pub mod power_of_two;
pub mod precise_cache_aware;
pub mod predicted_latency;
pub mod random;
pub mod random_weighted;
pub mod round_robin;
