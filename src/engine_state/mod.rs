//! What the gateway knows about the engines' internal state, rebuilt from what they publish.
//!
//! - [`kv_events`]: the decoder for vLLM / SGLang KV-cache event messages (ZMQ frames in,
//!   a reusable [`kv_events::EventBatch`] out).
//! - [`kv_index`]: the index from block keys to the targets holding them, fed with decoded
//!   batches on the control thread and read by the workers to score candidates.
//! - [`kv_transport`]: the ZMQ subscriptions to the engines' publishers (a thread of its
//!   own) and replay requests.
//! - [`lmcache`]: the LMCache controller's lookup API (request body, answer parsing into
//!   per-target matched tokens, a per-core memo of recent answers).
//! - [`view`]: the handles the workers' strategies read (index reader, per-target stream
//!   liveness).
//!
//! # Rules
//!
//! Everything here except `kv_transport` is pure: no sockets, no threads, no clocks (time comes in as an
//! argument), no logging (`view` holds shared atomics, nothing more). The subscribers that own the ZMQ sockets, and the strategies that
//! read the index, live elsewhere and call into these modules.

pub mod kv_events;
pub mod kv_index;
pub mod kv_transport;
pub mod lmcache;
pub mod view;
