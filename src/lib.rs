//! Rolter: a thread-per-core io_uring gateway for OpenAI-compatible inference engines.
//!
//! This crate is the `rolter` binary and a facade over the workspace's crates, named as
//! they are layered (each depends only on those above it in this list):
//!
//! - [`core`] (`rolter-core`): the values every layer shares: target ids, candidates,
//!   picks, samples, usage, LoRA residency, prices, the KV-cache view.
//! - [`codec`] (`rolter-codec`): HTTP/1.1 heads and bodies, request facts, canonical
//!   prompts, the usage scan, API-shaped errors.
//! - [`strategy`] (`rolter-strategy`): the strategy trait, the registry, one typed options
//!   struct per strategy, the strategies.
//! - [`tokenize`] (`rolter-tokenize`): the local tokenizer and chat templates (feature
//!   `local-tokenizer`) and the engines' tokenize wire formats.
//! - [`config`] (`rolter-config`): TOML to a validated configuration, every error named.
//! - [`engine`] (`rolter-engine`): what the engines tell: scrape, health book, LoRA
//!   residency, KV events and their index (transport behind feature `kv-events`), LMCache.
//! - [`gateway`] (`rolter-gateway`): the runtime, the per-core mesh, the request path, the
//!   upstream client, the control thread, admin and metrics.
//! - [`demo`] (feature `demo`): `rolter demo`, the gateway in front of built-in mock
//!   engines.

pub use rolter_codec as codec;
pub use rolter_config as config;
pub use rolter_core as core;
pub use rolter_engine as engine;
pub use rolter_gateway as gateway;
pub use rolter_strategy as strategy;
pub use rolter_tokenize as tokenize;

pub use rolter_gateway::Gateway;

#[cfg(feature = "demo")]
pub mod demo;
