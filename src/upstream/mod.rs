//! The thin upstream HTTP/1.1 client: connecting (plaintext or TLS), the per-core keep-alive
//! pool, and parsing response heads.
//!
//! Owns connections to targets. It must not buffer client response bodies: the relay in
//! `proxy` reads and forwards them as they arrive (only `side_request`, for the gateway's
//! own small calls, reads a whole body). Nothing here is shared across cores.

pub mod conn;
pub mod connect;
pub mod pool;
pub mod response;
pub mod side_request;
pub mod tls;
