//! The bytes of Rolter's HTTP/1.1 traffic and of the inference APIs it carries, parsed and
//! written on caller-owned buffers.
//!
//! - [`h1`]: request heads with limits and framing rules, strict chunked decoding, response
//!   heads from upstreams, and response serialisation.
//! - [`api`]: the proxied inference paths, the request facts routing needs (one borrowed
//!   JSON pass), the canonical prompt, the usage scan of responses.
//! - [`error`]: the gateway's error, typed by side and retryability, and its body and
//!   mid-stream event in the shape of the API called ([`surface`]).
//! - [`translate`]: requests and answers translated between Anthropic's Messages, OpenAI's
//!   Chat Completions and OpenAI's Responses, for a client and an engine that do not speak
//!   the same API.
//!
//! Everything here is synchronous and pure: no I/O, no clocks, no logging, no routing.
//! Depends only on the core crate.

pub mod api;
pub mod error;
pub mod h1;
pub mod surface;
pub mod translate;

pub use error::{GatewayError, Reply, Retry, Side, UpstreamFailure};
pub use surface::Surface;
