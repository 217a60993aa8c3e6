//! The values every layer of Rolter shares, and nothing else.
//!
//! A request's way through the gateway is told in these types: the [`Candidate`]s a
//! strategy may choose from, the [`PickRequest`] it is asked about (with the
//! [`AsyncInputs`] resolved for it), the [`Pick`] it returns, the [`Sample`] a finished
//! attempt teaches and its [`Verdict`], what strategies share between cores
//! ([`ShareSink`], [`ShareBatch`]), the prices cost-aware strategies rank by
//! ([`PriceBook`]), a target's LoRA adapter [`Residency`], and the read-only view of the
//! engines' KV caches ([`KvCacheView`]).
//!
//! Owns plain data and the few pure functions on it (a session key's hash, an adapter
//! key). It must not do I/O, read a clock, parse configuration or know any strategy:
//! every other crate depends on this one, and it depends on none of them.

mod candidate;
mod fleet;
mod kv;
mod lora;
mod pick;
mod price;
mod request;
mod sample;
mod share;
mod switches;

pub use candidate::Candidate;
pub use fleet::RouteLedger;
pub use kv::{KvCacheView, KvView};
pub use lora::{adapter_key, Level, Residency};
pub use pick::{Basis, Pick};
pub use price::{builtin, catalog_price, Price, PriceBook, TargetPrices, BUILTIN};
pub use request::{AsyncInputs, Needs, PickRequest, SessionKey};
pub use sample::{Sample, Usage, Verdict};
pub use share::{ShareBatch, ShareSink, Shared};
pub use switches::Switches;

/// Index of a target in the configuration's target list.
pub type TargetId = usize;
