//! Rolter's load-balancing strategies.
//!
//! - [`Strategy`]: the interface. A strategy is small, synchronous and per core; signals
//!   come in as values and time as an argument.
//! - [`STRATEGIES`]: every strategy; [`registry`]: what an entry holds (name, aliases,
//!   traits, options) and [`StrategySpec`], a route's validated strategy, which builds
//!   per-core instances.
//! - [`options`]: the trait each strategy's typed options struct implements, the one
//!   parser of a strategy table, and `Default` as the single source of every default.
//! - [`requirements`]: what a strategy needs from the gateway (prices, token ids, a
//!   cache lookup, adapter loading), read by the configuration and the request path.
//! - [`strategies`]: one module per strategy.
//! - [`shared`]: pieces several strategies use (tie-breaks, balance guard, TTFT average,
//!   prefix index, session pins, the options parts several strategies flatten in, the
//!   generator-and-rule strategy of those that read only the candidates, the wrapper that
//!   forwards every hook).
//!
//! Depends on the core crate only. Nothing here blocks, does I/O, takes a lock, logs or
//! reads a clock.

pub mod context;
pub mod options;
pub mod registry;
pub mod requirements;
pub mod shared;
pub mod strategies;
mod strategy;
pub mod traits;
pub mod values;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use context::BuildContext;
pub use options::{
    InnerStrategy, OptionLine, ParseSpec, RemovedOption, StrategyOptions, StrategySpec,
};
pub use registry::{StrategyInfo, Trait, STRATEGIES};
pub use requirements::{
    AdapterLoading, CacheLookupOptions, PriceUse, Requirements, StoreUse, TokenizerOptions,
};
pub use rolter_core::{
    AsyncInputs, Candidate, Needs, Pick, PickRequest, RouteLedger, Sample, SessionKey, ShareBatch,
    ShareSink, Shared, Switches, TargetId, Usage,
};
pub use strategy::Strategy;
pub use values::OptionError;
