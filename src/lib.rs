//! Rolter: a thread-per-core io_uring gateway for OpenAI-compatible inference engines.
//!
//! Crate map (a request's way through, top to bottom):
//!
//! - [`runtime`]: worker threads, one pinned per core, each with its own monoio runtime
//!   (io_uring or epoll) and SO_REUSEPORT listener; start, drain, stop.
//! - [`proxy`]: the per-request pipeline on a worker: the client connection loop
//!   ([`proxy::conn`]), routing and target choice with retries ([`proxy::forward`]), and
//!   the streaming relay ([`proxy::relay`]).
//! - [`http`]: the HTTP/1.1 codec: request heads with limits and framing rules, strict
//!   chunked decoding, response serialisation.
//! - [`upstream`]: the thin upstream client: connect, per-core keep-alive pool, response heads.
//! - [`openai`]: the API surface: proxied paths, request facts, `/v1/models`.
//! - [`signals`]: the load view, the cross-core exchange and the health book.
//! - [`strategy`]: the strategy interface, registry and the strategies themselves.
//! - [`pricing`]: model prices (built-in catalog, `[catalog]`, per-target) for cost-aware strategies.
//! - [`control`]: the control thread: health checks, metrics scrape, merged metrics, and
//!   the signals it publishes to the workers; [`admin`] is its listener.
//! - [`metrics`]: the gateway's own Prometheus metrics, kept and rendered by the control thread.
//! - [`config`]: TOML → validated [`config::Config`], every error reported at once.
//! - [`error`]: errors typed by side and retryability, rendered in OpenAI's shape.
//! - [`demo`]: `rolter demo`, the gateway in front of built-in mock engines.

pub mod admin;
pub mod config;
pub mod control;
pub mod demo;
pub mod engine_state;
pub mod error;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod pricing;
pub mod proxy;
pub mod runtime;
pub mod signals;
pub mod strategy;
pub mod tokenize;
pub mod upstream;

pub use runtime::Gateway;
