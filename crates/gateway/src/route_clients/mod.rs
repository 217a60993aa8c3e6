//! The clients of what a route's strategy needs beyond the candidates, one set per route
//! on each core: where its token ids come from ([`tokens`]), its LMCache controller
//! ([`cache_lookup`]), its LoRA adapter loader ([`adapters`]), and its shared rotation in
//! the state store ([`rotation`]). Each is built from the
//! strategy's typed requirements; the request path's inputs stage calls them.
//!
//! They must not fail a request: what cannot be had in time is left out, and the strategy
//! falls back and says so.

pub mod adapters;
pub mod cache_lookup;
pub mod rotation;
pub mod tokens;
