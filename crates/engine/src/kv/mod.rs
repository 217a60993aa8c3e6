//! The engines' KV-cache events, from the wire to the index the strategies read.
//!
//! - [`events`]: the decoder for vLLM / SGLang KV-cache event messages (ZMQ frames in, a
//!   reusable [`events::EventBatch`] out).
//! - [`block_keys`]: how a request's token ids become block keys, chained so that a match is a
//!   consecutive prefix.
//! - [`index`]: the index from block keys to the targets holding them, written by one
//!   thread, read by every worker without locks.
//! - [`transport`] (feature `kv-events`): the ZMQ subscriptions to the engines' publishers,
//!   on a thread of their own, and replay requests.
//! - [`index_thread`] (feature `kv-events`): the index thread, which applies decoded batches in
//!   sequence order, repairs gaps and keeps each target's "live" flag honest; [`reports`]
//!   is what it reports per target for `/metrics`.
//! - [`view`]: the handles the workers' strategies read (index reader, per-target stream
//!   liveness), behind the core crate's `KvCacheView`.

pub mod block_keys;
pub mod events;
pub mod index;
#[cfg(feature = "kv-events")]
pub mod index_thread;
mod msgpack;
pub mod reports;
#[cfg(feature = "kv-events")]
pub mod transport;
pub mod view;
