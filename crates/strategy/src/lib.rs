//! Rolter's load-balancing strategies.
//!
//! - [`Strategy`]: the interface. A strategy is small, synchronous and per core; signals
//!   come in as values and time as an argument.
//! - [`registry`]: every strategy's name, aliases, traits and options;
//!   [`StrategySpec`] is a route's validated strategy, which builds per-core instances.
//! - [`options`]: the trait each strategy's typed options struct implements, the one
//!   parser of a strategy table, and `Default` as the single source of every default.
//! - [`requirements`]: what a strategy needs from the gateway (prices, token ids, a
//!   cache lookup, adapter loading), read by the configuration and the request path.
//! - [`strategies`]: one module per strategy.
//! - [`shared`]: pieces several strategies use (tie-break, balance guard, TTFT average,
//!   prefix index, session pins, the wrapper that forwards every hook).
//!
//! Depends on the core crate only. Nothing here blocks, does I/O, takes a lock, logs or
//! reads a clock.

pub mod context;
pub mod inner;
pub mod options;
pub mod registry;
pub mod requirements;
pub mod shared;
pub mod strategies;
mod strategy;
mod traits;
pub mod values;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use context::BuildContext;
pub use inner::InnerStrategy;
pub use options::{OptionLine, StrategyOptions};
pub use registry::{StrategyInfo, StrategySpec, Trait};
pub use requirements::{
    AdapterLoading, CacheLookupOptions, PriceUse, Requirements, TokenizerOptions,
};
pub use rolter_core::{
    AsyncInputs, Candidate, Needs, Pick, PickRequest, Sample, SessionKey, ShareBatch, ShareSink,
    Shared, Switches, TargetId, Usage,
};
pub use strategy::Strategy;
pub use values::OptionError;

pub(crate) use shared::{choose_least_loaded, choose_uniform, BalanceGuard};
