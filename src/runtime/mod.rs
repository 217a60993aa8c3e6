//! Worker threads and the gateway's lifecycle: one pinned thread per core, each with its
//! own monoio runtime and SO_REUSEPORT listener, plus start, drain and stop.
//!
//! Owns threads and listening sockets. It must not handle requests itself (that is
//! `proxy`); a connection lives and dies on the worker that accepted it.

pub mod driver;
pub mod gateway;
pub mod listener;
pub mod worker;

pub use gateway::Gateway;
