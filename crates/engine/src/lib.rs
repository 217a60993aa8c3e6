//! What the gateway learns from the engines, rebuilt from what they expose and publish.
//!
//! - [`fleet`]: what the books are built from: targets, routes, scrape and health settings.
//! - [`scrape`]: an engine's Prometheus text parsed into queue depth, running requests and
//!   KV-cache use (vLLM and SGLang names).
//! - [`health`]: the health book: active check results, passive ejection on consecutive
//!   failures, the ejection cap and the growing ejection time.
//! - [`lora`]: LoRA adapter residency per target (`vllm:lora_requests_info`, the adapters
//!   `GET /v1/models` lists), the table published to the workers and the worker's view of
//!   it; [`lora_book`] is the control thread's record of both sources.
//! - [`kv`]: the engines' KV-cache events: the decoder, the block index the strategies read
//!   without locks through its view (the core crate's `KvCacheView`), and (feature
//!   `kv-events`) the ZMQ subscriptions and the index thread.
//! - [`lmcache`]: the LMCache controller's lookup API (request body, answer parsing into
//!   per-target matched tokens, a per-core memo of recent answers).
//!
//! Everything here except the KV transport and the index thread is pure: no sockets, no
//! threads, no clocks (time comes in as an argument). The gateway's control thread does
//! the fetching and scheduling and calls into these modules, building them from [`fleet`]'s
//! plain values (the targets, routes and health settings it takes from its configuration).
//! Depends on the core crate only.

pub mod fleet;
pub mod health;
pub mod kv;
pub mod lmcache;
pub mod lora;
pub mod lora_book;
pub mod scrape;
