//! Validated configuration: the types every other module reads.
//!
//! Owns the shape of a loaded, checked configuration. It must not parse text or
//! touch the network: `load` builds these values and guarantees their invariants
//! (target indices valid, header values free of CR/LF, addresses resolved).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Index of a target in [`Config::targets`].
pub type TargetId = usize;

/// A fully validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this configuration came from (for messages), or `<builtin>`.
    pub source: PathBuf,
    pub server: ServerConfig,
    pub targets: Vec<Target>,
    pub routes: Vec<Route>,
}

/// Which io driver the workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring where the kernel allows it, epoll otherwise.
    Auto,
    IoUring,
    Epoll,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Client-facing listener (SO_REUSEPORT, one socket per worker).
    pub listen: SocketAddr,
    /// Worker threads; resolved (never 0 after validation: 0 in the file means one per core).
    pub workers: usize,
    /// Pin worker i to core i (modulo the core count).
    pub pin_workers: bool,
    pub driver: DriverChoice,
    pub limits: Limits,
    /// How long a stopping gateway lets in-flight requests finish.
    pub shutdown_grace: Duration,
}

/// Client-side protocol limits and timeouts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head (request line + headers), bytes. Over it: 431.
    pub max_head_bytes: usize,
    /// Most header fields in one request. Over it: 431.
    pub max_headers: usize,
    /// Longest request target, bytes. Over it: 414.
    pub max_uri_bytes: usize,
    /// Largest request body, bytes. Over it: 413, before reading it.
    pub max_body_bytes: usize,
    /// Time allowed to receive a whole request head, from its first byte.
    pub head_timeout: Duration,
    /// Time allowed to receive a whole request body.
    pub body_timeout: Duration,
    /// Idle keep-alive time between requests on a client connection.
    pub keepalive_timeout: Duration,
    /// Longest a single write to a client may block (a client that never reads).
    pub write_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    /// The URL as written, for messages and the admin API.
    pub url: String,
    /// Resolved upstream socket address (resolved once, at load).
    pub addr: SocketAddr,
    /// `https://` URL: the upstream connection is TLS (1.2 or later, ALPN `http/1.1`), its
    /// certificate verified against the webpki public roots, or against `ca_certs` only.
    pub tls: bool,
    /// Host name from the URL, used for TLS SNI and certificate verification.
    pub server_name: String,
    /// `ca_file` as written (resolved against the configuration file's directory), if any.
    pub ca_file: Option<PathBuf>,
    /// The certificates read from `ca_file` (DER, checked to be usable trust anchors). When
    /// non-empty they are the only roots trusted for this target, replacing the public ones.
    pub ca_certs: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Value for the upstream `Host` header: `host[:port]` from the URL.
    pub host_header: String,
    /// Path prefix from the URL ("" or "/something", no trailing slash) prepended to the request path.
    pub base_path: String,
    /// Routing weight; non-positive values in the file become 1.0.
    pub weight: f64,
    /// Public model names this target serves (empty: any model the route accepts).
    pub models: Vec<String>,
    /// Public model name → the name this upstream expects in the body.
    pub upstream_models: HashMap<String, String>,
    /// Headers added to every upstream request (after client auth and hop-by-hop are removed).
    /// Names are lowercase; values contain no CR, LF or NUL.
    pub headers: Vec<(String, String)>,
    pub max_concurrent: Option<u32>,
    /// Failover tier, 0 = primary.
    pub tier: u32,
    pub price: Option<Price>,
    pub timeouts: UpstreamTimeouts,
    pub pool: PoolConfig,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Currency units per 1M input tokens.
    pub input_per_mtok: f64,
    /// Currency units per 1M output tokens.
    pub output_per_mtok: f64,
}

#[derive(Debug, Clone)]
pub struct UpstreamTimeouts {
    pub connect: Duration,
    /// From the request being written to the first response byte (covers queueing and prefill).
    pub first_byte: Duration,
    /// Longest silence between two response reads once bytes flow.
    pub idle: Duration,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Most idle keep-alive connections kept per target, per worker.
    pub max_idle: usize,
    /// An idle pooled connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub matcher: RouteMatch,
    /// Targets this route may use, in configuration order.
    pub targets: Vec<TargetId>,
    pub strategy: StrategySpec,
    /// Forward the client's `Authorization` header upstream (default false).
    pub forward_client_auth: bool,
    /// Extra attempts on other targets before any response byte reached the client.
    pub retries: u32,
}

/// All present rules must hold for a request to match. An empty rule set matches everything.
#[derive(Debug, Clone, Default)]
pub struct RouteMatch {
    /// Exact request paths (without query). Empty: any proxied path.
    pub paths: Vec<String>,
    /// Requested model names. Empty: any model served by one of the route's targets.
    pub models: Vec<String>,
    /// A request header (lowercase name) that must equal the value.
    pub header: Option<(String, String)>,
}

/// A route's strategy as configured: canonical name plus its options, already validated
/// by `crate::strategy::registry::validate_spec`.
#[derive(Debug, Clone)]
pub struct StrategySpec {
    /// Canonical strategy name (aliases resolved).
    pub name: &'static str,
    /// Options exactly as written under the strategy table, minus `name`.
    pub options: toml::Table,
}
