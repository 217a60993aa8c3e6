//! The OpenAI- and Anthropic-compatible surface: which paths are proxied, what routing
//! needs from a request body, and the `/v1/models` listing.
//!
//! Owns knowledge of the API's shapes. It must not do I/O or pick targets.

pub mod canonical;
pub mod facts;
pub mod models;
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
