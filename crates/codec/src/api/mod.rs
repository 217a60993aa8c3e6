//! The inference APIs' request and response shapes (OpenAI's chat, completions,
//! embeddings, responses and audio; Anthropic's messages; vLLM's and SGLang's rerank,
//! score, tokenize, pooling and classify): which paths are proxied, what routing needs from
//! a request body (JSON, or a multipart form), the canonical form of a prompt, and the
//! usage a response reports.
//!
//! Owns knowledge of the APIs' shapes. It must not do I/O or pick targets.

pub mod canonical;
pub mod deltas;
pub mod facts;
pub mod fields;
pub mod key_search;
pub mod multipart;
pub mod sequence;
pub mod usage;
pub mod usage_chunk;

/// The inference endpoints the gateway proxies (`POST`, routed by path and `model`).
pub const PROXIED_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/rerank",
    "/rerank",
    "/v1/score",
    "/score",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
];

/// Is `path` one of the proxied inference endpoints?
#[inline]
pub fn is_proxied_path(path: &str) -> bool {
    PROXIED_PATHS.contains(&path)
}
