//! Threads and the gateway's lifecycle: one pinned worker thread per core, each with its
//! own monoio runtime and SO_REUSEPORT listener; the control thread; the engine-state
//! threads (KV events); the discovery thread; start, drain and stop.
//!
//! Owns threads and listening sockets. It must not handle requests itself (that is the
//! request path's); a connection lives and dies on the worker that accepted it.

pub mod busy_poll;
pub mod control_socket;
pub mod control_thread;
mod discovery;
pub mod driver;
pub mod engine_threads;
pub mod handle;
pub mod listener;
pub mod supervisor;
pub mod worker;

pub use handle::Gateway;
