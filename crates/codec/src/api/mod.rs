//! The inference APIs' request and response shapes (OpenAI's chat, completions,
//! embeddings and responses; Anthropic's messages): which paths are proxied, what routing
//! needs from a request body, the canonical form of a prompt, and the usage a response
//! reports.
//!
//! Owns knowledge of the APIs' shapes. It must not do I/O or pick targets.

pub mod canonical;
pub mod deltas;
pub mod facts;
pub mod sequence;
pub mod usage;

/// The inference endpoints the gateway proxies.
pub const PROXIED_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
];

/// Is `path` one of the proxied inference endpoints?
#[inline]
pub fn is_proxied_path(path: &str) -> bool {
    PROXIED_PATHS.contains(&path)
}
