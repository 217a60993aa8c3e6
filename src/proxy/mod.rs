//! The request pipeline: the client connection loop, routing and target choice, and the
//! streaming relay to and from the upstream.
//!
//! Owns everything that happens per request on a worker core. It must not block, take a
//! lock, or log per request at default levels; anything slow belongs to the control thread.

pub mod adapter_load;
pub mod cache_lookup;
pub mod conn;
pub mod forward;
pub mod inputs;
pub mod race;
pub mod reader;
pub mod relay;
pub mod side_call;
pub mod state;
