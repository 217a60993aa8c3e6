//! Validated configuration: the types every other module reads.
//!
//! Owns the shape of a loaded, checked configuration. It must not parse text or
//! touch the network: `load` builds these values and guarantees their invariants
//! (target indices valid, header values free of CR/LF, addresses resolved).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use rolter_codec::h1::request_head::UnderscoreHeaders;

pub use rolter_core::{Price, TargetId};
pub use rolter_strategy::StrategySpec;

/// A fully validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this configuration came from (for messages), or `<builtin>`.
    pub source: PathBuf,
    /// SHA-256 of the configuration text, lowercase hex (what `sha256sum` prints for the
    /// file): shown by `/admin/config` and `rolter_config_info` so an operator can tell
    /// which file a gateway runs.
    pub digest: String,
    pub server: ServerConfig,
    pub targets: Vec<Target>,
    pub routes: Vec<Route>,
    /// Active health checks and passive ejection (`[health]`).
    pub health: HealthConfig,
    /// Scraping the engines' Prometheus endpoints (`[metrics_scrape]`).
    pub scrape: ScrapeConfig,
    /// The admin listener (`[admin]`); `None` when the section is absent.
    pub admin: Option<AdminConfig>,
    /// Prices per upstream model name from `[catalog]`, over the built-in catalog.
    pub catalog: BTreeMap<String, Price>,
    /// `[adaptive]`: the starting state of the global kill switch.
    pub adaptive: AdaptiveConfig,
    /// `[kv_events]`: how the KV block index is keyed, bounded and kept fresh.
    pub kv_events: KvEventsConfig,
    /// `[log]`: the access log and the operational log's format.
    pub log: LogConfig,
    /// `[state]`: the shared state store the replicas of a fleet share; `None` when the
    /// section is absent (every replica then routes on what it alone has seen).
    pub state: Option<StateConfig>,
    /// `[[keys]]` and `[auth] keys_file`: the client API keys. Empty: the gateway is open.
    pub keys: ApiKeys,
    /// `[[classes]]`: the priority classes, in configuration order (a request's class is an
    /// index here). Never empty: without `[[classes]]` there is one, [`DEFAULT_CLASS`].
    pub classes: Vec<PriorityClass>,
    /// The `[[targets]]` entries given by `discover`, with their current members (which are
    /// in `targets`).
    pub discovery: Vec<DiscoveryGroup>,
    /// `[tracing]`: spans exported to an OpenTelemetry collector; `None` when the section
    /// is absent (no trace plane).
    pub tracing: Option<Tracing>,
}

/// The client API keys: every `[[keys]]` entry of the configuration, then those of
/// `[auth] keys_file`, with a map from each key's SHA-256 to its place.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    pub keys: Vec<ApiKey>,
    /// Each key's SHA-256 → its index in `keys`.
    pub by_hash: std::collections::HashMap<[u8; 32], usize>,
    /// `[auth] keys_file`, resolved against the configuration's directory.
    pub file: Option<PathBuf>,
    /// `[auth] share_limits`: the keys' per-minute counts are added up over every replica
    /// through the shared-state store (needs `[state]`).
    pub share_limits: bool,
}

impl ApiKeys {
    /// No keys: every client is served without one.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// One client API key. Only its SHA-256 is known; `Debug` never shows even that.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Unique; the label in the access log and the metrics.
    pub name: String,
    /// SHA-256 of the key.
    pub hash: [u8; 32],
    /// Indices of the routes the key may use; `None`: every route.
    pub routes: Option<Vec<usize>>,
    /// Model names (as the client sends them) the key may use; `None`: every model.
    pub models: Option<Vec<String>>,
    /// Requests admitted per fixed one-minute window, per gateway.
    pub requests_per_minute: Option<u32>,
    /// Tokens (prompt and completion) per fixed one-minute window, per gateway.
    pub tokens_per_minute: Option<u32>,
    /// The class of the key's requests (`priority`, an index in `Config::classes`);
    /// `None`: the route's default class.
    pub priority: Option<usize>,
    /// The key may choose its requests' class with `x-rolter-priority` on routes that trust
    /// the header (`set_priority`, default false).
    pub set_priority: bool,
    /// The key's weight in its routes' fair queueing (`share`, default 1): a key with
    /// share 2 is served twice the tokens of a key with share 1 while both wait.
    pub share: u32,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("routes", &self.routes)
            .field("models", &self.models)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("priority", &self.priority)
            .field("set_priority", &self.set_priority)
            .field("share", &self.share)
            .finish_non_exhaustive()
    }
}

/// `[state]`: where the shared state store is and how the gateway talks to it.
#[derive(Clone, PartialEq)]
pub struct StateConfig {
    /// `backend` (only `"redis"`, which Valkey speaks too).
    pub backend: StateBackend,
    /// `url` or `urls`: `redis://` or `rediss://` (TLS) addresses.
    pub urls: Vec<String>,
    pub topology: StateTopology,
    /// The ACL user and password, read at start from the environment variables named by
    /// `username_env` and `password_env` (never written in the file).
    pub username: Option<String>,
    pub password: Option<String>,
    /// The variable names, for messages.
    pub username_env: String,
    pub password_env: String,
    /// An extra CA certificate (PEM) for `rediss://`.
    pub tls_ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// How long any one store command may take before it counts as failed.
    pub command_timeout: Duration,
    /// How long a pick waits for the store's answer (the `atomic` rotation) before the
    /// local cursor picks.
    pub pick_timeout: Duration,
    /// Every key starts with `{key_prefix}:`, so fleets can share one store.
    pub key_prefix: String,
    /// This replica's name in the store; `None`: the host name and the listening port.
    pub replica: Option<String>,
    /// How often shared items, fair-catchup books and load are written and read.
    pub sync_interval: Duration,
    /// How often a store that is away is tried again.
    pub retry_interval: Duration,
    /// Shared items (session pins, prefixes) published per second at most; the rest are
    /// dropped and counted.
    pub max_items_per_second: u32,
    /// Entries the items stream keeps (approximately).
    pub stream_maxlen: u32,
    /// Publish this replica's requests in flight per target and read the others'
    /// (`max_concurrent` then counts the fleet; routes with `fleet_load` rank by it).
    pub share_load: bool,
}

impl std::fmt::Debug for StateConfig {
    /// The password is never shown; the rest is (a reload compares configurations by it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateConfig")
            .field("backend", &self.backend)
            .field("urls", &self.urls)
            .field("topology", &self.topology)
            .field("username", &self.username)
            .field(
                "password",
                &self.password.as_ref().map(|p| {
                    use sha2::Digest;
                    let d = sha2::Sha256::digest(p.as_bytes());
                    format!(
                        "<redacted sha256:{:02x}{:02x}{:02x}{:02x}>",
                        d[0], d[1], d[2], d[3]
                    )
                }),
            )
            .field("tls_ca_file", &self.tls_ca_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("pick_timeout", &self.pick_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("replica", &self.replica)
            .field("sync_interval", &self.sync_interval)
            .field("retry_interval", &self.retry_interval)
            .field("max_items_per_second", &self.max_items_per_second)
            .field("stream_maxlen", &self.stream_maxlen)
            .field("share_load", &self.share_load)
            .finish()
    }
}

/// `state.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBackend {
    Redis,
}

/// How the store's addresses are used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateTopology {
    /// One server (the first reachable of `urls`).
    Standalone,
    /// Sentinels that name the master of `sentinel_master`.
    Sentinel { master: String },
    /// A Redis Cluster; every key of a fleet shares one hash slot.
    Cluster,
}

impl StateConfig {
    /// The defaults of every optional key, for `url` alone.
    pub fn with_url(url: &str) -> StateConfig {
        StateConfig {
            backend: StateBackend::Redis,
            urls: vec![url.to_string()],
            topology: StateTopology::Standalone,
            username: None,
            password: None,
            username_env: "ROLTER_STATE_USERNAME".into(),
            password_env: "ROLTER_STATE_PASSWORD".into(),
            tls_ca_file: None,
            connect_timeout: Duration::from_millis(500),
            command_timeout: Duration::from_millis(100),
            pick_timeout: Duration::from_millis(5),
            key_prefix: "rolter".into(),
            replica: None,
            sync_interval: Duration::from_millis(100),
            retry_interval: Duration::from_secs(1),
            max_items_per_second: 20_000,
            stream_maxlen: 10_000,
            share_load: true,
        }
    }
}

/// `[tracing]`: OpenTelemetry spans of the requests, exported over OTLP/HTTP (protobuf) to
/// a collector by the gateway's exporter thread.
///
/// A reload applies every key: `sample` and `parent_based` at once (each worker reads
/// them from its configuration), the exporter's own settings on its thread (in place, or
/// in a new exporter thread when `queue` changed, since the queue is its channel).
#[derive(Clone, PartialEq)]
pub struct Tracing {
    /// Where spans are POSTed (`endpoint`, with `ca_file`).
    pub endpoint: TraceEndpoint,
    /// The share of the traces the gateway starts that are sampled (`sample`, 0.0 to 1.0).
    pub sample: f64,
    /// A client's `traceparent` decides sampling by its `sampled` flag (`parent_based`);
    /// the ratio then decides only for traces the gateway starts.
    pub parent_based: bool,
    /// Headers sent with every export (`headers`): lowercase names, values with `${VAR}`
    /// expanded and free of CR, LF and NUL.
    pub headers: Vec<(String, String)>,
    /// The resource's `service.name` (`service_name`).
    pub service_name: String,
    /// Spans buffered for the exporter before new ones are dropped (`queue`).
    pub queue: usize,
    /// Spans per export at most (`batch`).
    pub batch: usize,
    /// How long a span waits at most before a batch that is not full is sent
    /// (`flush_interval`).
    pub flush_interval: Duration,
    /// How long one export may take, connecting included (`timeout`).
    pub timeout: Duration,
}

impl Tracing {
    pub const DEFAULT_SAMPLE: f64 = 1.0;
    pub const DEFAULT_SERVICE_NAME: &'static str = "rolter";
    pub const DEFAULT_QUEUE: usize = 4096;
    pub const MAX_QUEUE: usize = 1_000_000;
    pub const DEFAULT_BATCH: usize = 512;
    pub const MAX_BATCH: usize = 100_000;
    pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
}

impl std::fmt::Debug for Tracing {
    /// Header values may hold a collector's credentials: only a digest of each is shown
    /// (a reload still sees a change).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(&str, String)> = self
            .headers
            .iter()
            .map(|(n, v)| {
                use sha2::Digest;
                let d = sha2::Sha256::digest(v.as_bytes());
                let shown = format!(
                    "<redacted sha256:{:02x}{:02x}{:02x}{:02x}>",
                    d[0], d[1], d[2], d[3]
                );
                (n.as_str(), shown)
            })
            .collect();
        f.debug_struct("Tracing")
            .field("endpoint", &self.endpoint)
            .field("sample", &self.sample)
            .field("parent_based", &self.parent_based)
            .field("headers", &headers)
            .field("service_name", &self.service_name)
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .field("flush_interval", &self.flush_interval)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `tracing.endpoint`: an `http://` or `https://` URL, taken apart for the exporter. The
/// host is resolved by the exporter each time it connects, not when the file is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEndpoint {
    /// The URL as written, for messages.
    pub url: String,
    /// `https://`: TLS (1.2 or later) verified against the webpki public roots, or
    /// against `ca_certs` only when `ca_file` is set.
    pub tls: bool,
    /// The host to connect to: a DNS name or an IP address (IPv6 without brackets); also
    /// the TLS server name.
    pub host: String,
    pub port: u16,
    /// The request target, e.g. `/v1/traces`.
    pub path: String,
    /// The `Host` header's value (the port only when the URL wrote one).
    pub host_header: String,
    /// `tracing.ca_file`, resolved against the configuration's directory.
    pub ca_file: Option<PathBuf>,
    /// The certificates read from `ca_file` (DER, checked to be usable trust anchors).
    pub ca_certs: Vec<rustls::pki_types::CertificateDer<'static>>,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Where the access log goes (`access`).
    pub access: AccessLogDest,
    /// Share of successful requests written to the access log (`sample`, 0.0 to 1.0);
    /// errors and flagged requests are always written.
    pub sample: f64,
    /// The operational (tracing) log's format (`format`).
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: AccessLogDest::Stdout,
            sample: 1.0,
            format: LogFormat::Text,
        }
    }
}

/// `log.access`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogDest {
    Stdout,
    Off,
    /// Appended to this file, reopened on request (log rotation).
    File(PathBuf),
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours only when stderr is a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

/// `[kv_events]`: settings of the index built from the targets' KV-cache events (used only
/// when some target has `[targets.kv_events]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvEventsConfig {
    /// Tokens per index key; every engine's block size must be a multiple (vLLM: 16).
    pub block_size: u32,
    /// Engine blocks remembered per target (oldest dropped first).
    pub max_blocks_per_target: u32,
    /// A target whose publisher has been unreachable this long loses its entries and is
    /// no longer trusted until it publishes again.
    pub stale_after: Duration,
    /// How long a replay from a target's `replay_endpoint` may take; past it the target's
    /// entries are dropped and it is not live until repaired.
    pub repair_timeout: Duration,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            block_size: 16,
            max_blocks_per_target: 1 << 17,
            stale_after: Duration::from_secs(10),
            repair_timeout: Duration::from_secs(2),
        }
    }
}

/// A target's KV-cache event publisher (`[targets.kv_events]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetKvEvents {
    /// The engine's ZMQ PUB endpoint, e.g. `tcp://10.0.0.5:5557` (the gateway connects).
    pub endpoint: String,
    /// The engine's replay (ROUTER) endpoint, for repairing gaps.
    pub replay_endpoint: Option<String>,
    /// Subscription prefix (vLLM publishes with an empty topic; llm-d uses `kv@`).
    pub topic: String,
}

/// `[health]`. Active checks run only when the section is present (`active`, default true
/// then); passive ejection is on by default.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// Probe every target (except those with `health_path = ""`) on an interval.
    pub active: bool,
    /// Path probed with `GET`; a 2xx answer passes. Per-target `health_path` overrides it.
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive passing probes that make an unhealthy target healthy again.
    pub healthy_threshold: u32,
    /// Consecutive failing probes that make a healthy target unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive failed requests (connect errors, timeouts, 5xx) that eject a target;
    /// 0 turns passive ejection off.
    pub failures: u32,
    /// First ejection time; each further ejection in a row doubles it.
    pub ejection_time: Duration,
    /// Longest ejection time.
    pub max_ejection_time: Duration,
    /// Largest share (percent) of a route's targets ejected at once (rounded down).
    pub max_ejected_percent: u32,
    /// Latency outlier ejection: a target whose TTFT (or inter-token time) average stays
    /// above this factor times its route peers' median is ejected; 0 turns it off.
    pub latency_factor: f64,
    /// How long a target must stay a latency outlier before it is ejected.
    pub latency_for: Duration,
    /// Samples a target (and each peer compared with) needs before latency counts.
    pub latency_min_samples: u32,
    /// A target that joins (returns from ejection or cooling, becomes healthy, is added by
    /// a reload) ramps its share over this window; 0 turns slow start off.
    pub slow_start_window: Duration,
    /// The ramp's shape: share × (elapsed / window)^(1 / aggression).
    pub slow_start_aggression: f64,
    /// The smallest share factor during the ramp.
    pub slow_start_min_weight: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            active: false,
            path: "/health".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            failures: 5,
            ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(300),
            max_ejected_percent: 50,
            latency_factor: 0.0,
            latency_for: Duration::from_secs(30),
            latency_min_samples: 20,
            slow_start_window: Duration::ZERO,
            slow_start_aggression: 1.0,
            slow_start_min_weight: 0.1,
        }
    }
}

/// `[metrics_scrape]`. Off unless the section is present (`enabled`, default true then).
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeConfig {
    pub enabled: bool,
    /// Path scraped on each target unless the target sets `metrics_path`.
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// A scrape older than this no longer counts: the target falls back to in-flight counts.
    pub stale_after: Duration,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            enabled: false,
            path: "/metrics".into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            stale_after: Duration::from_secs(3),
        }
    }
}

/// `[admin]`: a separate listener for metrics and operations.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    /// Default 127.0.0.1:9091.
    pub listen: SocketAddr,
    /// When set, every request must carry `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

/// `[adaptive]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// Whether adaptive routes blend (true) or use their fallback strategy (false) at start.
    /// The admin API flips it at run time for every adaptive route at once.
    pub enabled: bool,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig { enabled: true }
    }
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
    /// The UNIX socket `rolter reload` and `rolter run --upgrade` talk to; `None`: the
    /// default place (see the gateway's `control_socket`).
    pub control_socket: Option<PathBuf>,
    /// How often targets named by a host name are resolved again (`dns_refresh`, default
    /// 30 s; zero: resolved once, at load).
    pub dns_refresh: Duration,
    /// Where `discover` entries are looked up (`nameservers`, `ip[:port]`); empty: the
    /// nameservers of `/etc/resolv.conf`.
    pub nameservers: Vec<SocketAddr>,
    /// Client connections open at once over every worker (`max_connections`, default
    /// 10 000); a connection beyond it is answered 503 and closed. Reloadable.
    pub max_connections: usize,
    /// Request headers whose name holds an underscore (`underscores_in_headers`): dropped
    /// (the default), refused with 400, or forwarded. Reloadable.
    pub underscores_in_headers: UnderscoreHeaders,
    /// `[server.tls]`: the listener terminates TLS; `None`: plaintext HTTP/1.1.
    pub tls: Option<ServerTls>,
    /// How long a worker keeps polling its ring after its last client or upstream read
    /// before it sleeps in the kernel (`busy_poll`; zero, the default: it sleeps as soon as
    /// it has nothing to run). A polling worker holds its core at 100 % for that long after
    /// each read, in exchange for no wake-up on the next one. Reloadable.
    pub busy_poll: Duration,
}

/// `[server.tls]`: client-side TLS on the listener. Certificates and keys were read and
/// checked (the key signs for the certificate) at load; a reload reads them again.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The certificate served when the client's SNI names none of `sni` (or it sends none).
    pub default: TlsCert,
    /// Extra certificates chosen by the SNI name the client sends (`[[server.tls.sni]]`).
    pub sni: Vec<SniCert>,
    /// Time allowed for the TLS handshake, from the accepted connection to its end.
    pub handshake_timeout: Duration,
    /// The oldest protocol version accepted (1.2 or 1.3).
    pub min_version: TlsVersion,
}

/// `server.tls.min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// One certificate chain with its private key, as files name them.
#[derive(Clone)]
pub struct TlsCert {
    /// `cert_file` and `key_file` as resolved (for messages).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The chain (leaf first) and the key able to sign for it.
    pub key: std::sync::Arc<rustls::sign::CertifiedKey>,
}

impl std::fmt::Debug for TlsCert {
    /// Files and the leaf certificate's digest; never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use sha2::Digest;
        let leaf = self
            .key
            .cert
            .first()
            .map(|c| sha2::Sha256::digest(c.as_ref()));
        f.debug_struct("TlsCert")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("leaf_sha256", &leaf.map(|d| format!("{d:x}")))
            .finish()
    }
}

/// A `[[server.tls.sni]]` entry: served to clients whose SNI is one of `names`
/// (lowercase; `*.example.com` matches one label).
#[derive(Debug, Clone)]
pub struct SniCert {
    pub names: Vec<String>,
    pub cert: TlsCert,
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
    /// Idle keep-alive time between requests on a client connection (a coarse deadline:
    /// the connection closes at the worker's first sweep after it, up to 100 ms later).
    pub keepalive_timeout: Duration,
    /// Longest a single write to a client may block (a client that never reads).
    pub write_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    /// The URL as written, for messages and the admin API.
    pub url: String,
    /// Upstream socket address, as resolved at load; the control thread resolves
    /// `dns_name` again every `server.dns_refresh` and tells the workers of a change.
    pub addr: SocketAddr,
    /// The URL's host when it is a name to resolve (`None` for an IP address).
    pub dns_name: Option<String>,
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
    /// Routing weight (default 1.0, never negative). 0 drains the target: it is never a
    /// candidate for a pick, while health checks and scrapes go on.
    pub weight: f64,
    /// Public model names this target serves (empty: any model the route accepts).
    pub models: Vec<String>,
    /// Public model name → the name this upstream expects in the body.
    pub upstream_models: BTreeMap<String, String>,
    /// Headers added to every upstream request (after client auth and hop-by-hop are removed).
    /// Names are lowercase; values contain no CR, LF or NUL.
    pub headers: Vec<(String, String)>,
    pub max_concurrent: Option<u32>,
    /// Failover tier, 0 = primary.
    pub tier: u32,
    pub price: Option<Price>,
    /// Active health-check path for this target; `Some("")` turns active checks off for it
    /// (a managed API without a health endpoint). `None`: `[health].path`.
    pub health_path: Option<String>,
    /// Scrape this target's metrics when `[metrics_scrape]` is on (default true; false for
    /// managed APIs).
    pub scrape: bool,
    /// Metrics path for this target; `None`: `[metrics_scrape].path`.
    pub metrics_path: Option<String>,
    /// The engine's KV-cache event publisher, when it has one.
    pub kv_events: Option<TargetKvEvents>,
    /// The LMCache instance id this engine registers with the cache controller
    /// (`LMCACHE_LMCACHE_INSTANCE_ID`); default: the target's name.
    pub lmcache_instance: String,
    pub timeouts: UpstreamTimeouts,
    pub pool: PoolConfig,
    /// The port of the engine's bootstrap server, where a decode engine fetches what this
    /// engine prefilled (SGLang's `--disaggregation-bootstrap-port`; `bootstrap_port`,
    /// default 8998). Sent only by `disaggregation = "sglang"` routes.
    pub bootstrap_port: u16,
    /// Whose wire conventions the engine follows where they differ (`engine`): how it takes
    /// a data-parallel rank.
    pub engine: EngineKind,
    /// This target is one data-parallel rank of an engine run with `dp_size` ranks behind
    /// one address; `None`: a single engine.
    pub dp: Option<DpRank>,
    /// The `discover` entry this target is a member of (its name is `<entry>/<host>:<port>`);
    /// `None`: written with a `url`.
    pub member_of: Option<String>,
    /// The body field the engine schedules by (`priority_field`, e.g. vLLM's `priority`
    /// with `--scheduling-policy priority`), set to the request's class's value.
    pub priority: Option<EnginePriority>,
    /// The inference API the target speaks (`api`, `lacks`, `anthropic_version`): a request
    /// in another API is translated on its way there and its answer on its way back.
    pub api: TargetApi,
    /// How a stream's completion tokens are learned (`stream_usage`).
    pub stream_usage: StreamUsage,
}

/// `targets[i].stream_usage`: how the gateway learns a streamed answer's token counts when
/// the client did not ask the engine for usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamUsage {
    /// `"ask"` (the default): a streamed chat or completions request without
    /// `stream_options` goes with `"stream_options":{"include_usage":true}`; the engine's
    /// usage event is kept from the client, and its counts are the stream's.
    #[default]
    Ask,
    /// `"count"`: the request goes as it came, and the stream's content deltas are counted
    /// (an estimate: about one token a delta), for engines that refuse `stream_options`.
    Count,
}

/// The API an Anthropic target is called with when `anthropic_version` is not set.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// `targets[i].api` and `lacks`: which inference API a target speaks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetApi {
    /// `api = "anthropic"`: Anthropic's Messages API only (a managed Anthropic endpoint).
    /// Otherwise OpenAI's APIs, less what `lacks` names.
    pub anthropic: Option<AnthropicApi>,
    /// `lacks = ["messages"]`: an OpenAI engine without `/v1/messages`.
    pub lacks_messages: bool,
    /// `lacks = ["responses"]`: an OpenAI engine without `/v1/responses`.
    pub lacks_responses: bool,
}

/// What an Anthropic target is told on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicApi {
    /// The `anthropic-version` header's value, unless the target's `headers` set one.
    pub version: String,
}

impl TargetApi {
    /// The API a request the client made in `client` goes to this target in, when that is
    /// another one (`None`: it goes as it came).
    pub fn engine_api_for(
        &self,
        client: rolter_codec::translate::Api,
    ) -> Option<rolter_codec::translate::Api> {
        use rolter_codec::translate::Api;
        match client {
            Api::Chat if self.anthropic.is_some() => Some(Api::Messages),
            Api::Messages | Api::CountTokens if self.anthropic.is_none() && self.lacks_messages => {
                Some(if client == Api::Messages {
                    Api::Chat
                } else {
                    Api::Tokenize
                })
            }
            Api::Responses if self.anthropic.is_none() && self.lacks_responses => Some(Api::Chat),
            _ => None,
        }
    }
}

/// `targets[i].priority_field` and `priority_values`: what the engine is told of a
/// request's class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnginePriority {
    /// The JSON field set in the request body.
    pub field: String,
    /// Its value for each class (indexed like `Config::classes`): `priority_values`, else
    /// the class's `rank` (lower first, as vLLM schedules).
    pub values: Vec<i64>,
}

/// `targets[i].engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM: the rank in the `X-data-parallel-rank` header.
    Vllm,
    /// SGLang: the rank in the body's `data_parallel_rank` field.
    Sglang,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

/// One data-parallel rank of an engine (`dp_size = N` on a target makes N targets, named
/// `name[0]` … `name[N-1]`, one per rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpRank {
    pub rank: u32,
    pub size: u32,
    /// The target's name as written (without the rank).
    pub engine_name: String,
}

/// The default `bootstrap_port` (SGLang's default bootstrap port).
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

impl Target {
    /// Whether this target serves public model `model` (no `models` list: any).
    #[inline]
    pub fn serves(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
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
    /// When and how those extra attempts are made (`retry_on`, timeouts, back-off, budget).
    pub retry: RetryPolicy,
    /// The route's queue (`queue_max`, `queue_timeout`): when every candidate is at its
    /// `max_concurrent`, a request waits for a place instead of a 503 at once. `None`: no
    /// queue (the default).
    pub queue: Option<RouteQueue>,
    /// Who goes first when the route's targets are full: the requests' classes, tenants and
    /// deadlines.
    pub admission: RouteAdmission,
    /// The local tokenizer the route's strategy named (`tokenizer = "<path>"`), loaded at
    /// configuration time; `None` when it reads no token ids or asks the engine.
    #[cfg(feature = "local-tokenizer")]
    pub tokenizer: Option<std::sync::Arc<rolter_tokenize::LocalTokenizer>>,
    /// The cache controller the route's strategy asks (`controller = "http://…"`),
    /// resolved at configuration time; `None` when it asks none.
    pub cache_controller: Option<CacheController>,
    /// `disaggregation`: each request is prefilled on another route's pool (the route's
    /// `prefill` pool) and decoded on this route's targets (its `decode` pool). `None`: one
    /// engine serves the whole request.
    pub disaggregation: Option<Disaggregation>,
    /// This route is the prefill pool of the route at this index: it matches no request
    /// itself, and its targets and strategy serve that route's prefill attempts.
    pub prefill_of: Option<usize>,
}

/// A disaggregated route's prefill side and the wire protocol between the two pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disaggregation {
    pub protocol: PdProtocol,
    /// The index (in `Config::routes`) of the route that holds the prefill pool.
    pub prefill_route: usize,
}

/// `routes[i].disaggregation`: how the prefill and decode engines are asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdProtocol {
    /// vLLM's KV connectors (e.g. NixlConnector): prefill first (`kv_transfer_params`
    /// asking for a remote decode, one token, no stream), then decode with the transfer
    /// parameters the prefill answered.
    Vllm,
    /// SGLang's bootstrap: one request, with `bootstrap_host`, `bootstrap_port` and
    /// `bootstrap_room`, to both engines at once.
    Sglang,
}

impl PdProtocol {
    pub const ALL: [PdProtocol; 2] = [PdProtocol::Vllm, PdProtocol::Sglang];

    pub fn name(self) -> &'static str {
        match self {
            PdProtocol::Vllm => "vllm",
            PdProtocol::Sglang => "sglang",
        }
    }

    pub fn parse(s: &str) -> Option<PdProtocol> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether one engine may be in both pools: a vLLM engine with `kv_role = "kv_both"`
    /// can prefill and decode; an SGLang engine runs in one disaggregation mode.
    pub fn allows_shared_targets(self) -> bool {
        self == PdProtocol::Vllm
    }
}

impl Route {
    /// Whether requests can match this route (a prefill pool's route serves only its
    /// disaggregated route).
    pub fn matches_requests(&self) -> bool {
        self.prefill_of.is_none()
    }
}

/// A route's retry policy: which failures are retried, how long one attempt and the whole
/// request may take, the back-off between attempts and the share of requests that may retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The failures retried on another target (`retry_on`).
    pub on: RetryOn,
    /// Bound on one attempt up to its first response byte (default: the target's first_byte).
    pub per_try_timeout: Option<Duration>,
    /// Bound on the whole request, every attempt and back-off included, up to the first byte
    /// reaching the client (default: none).
    pub deadline: Option<Duration>,
    /// Base of the exponential back-off with full jitter between attempts.
    pub backoff: Duration,
    /// Most back-off before one attempt.
    pub backoff_max: Duration,
    /// Retries allowed as a share of the route's requests over the budget window.
    pub budget: f64,
    /// Retries always allowed over the budget window, whatever the share.
    pub budget_min: u32,
    /// Longest a target cools after a 429 (or a 503 with `Retry-After`).
    pub retry_after_max: Duration,
    /// When a second attempt races the first (`hedge_after`); `None`: no hedging (the
    /// default).
    pub hedge_after: Option<HedgeAfter>,
}

/// When a request is hedged: a second attempt goes to another target while the first has
/// sent no response byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeAfter {
    /// This long after the first attempt started (`hedge_after = "300ms"`).
    Delay(Duration),
    /// This percentile of the route's recent times to a response head, learnt on each
    /// core (`hedge_after = "p95"`); no hedge until enough times are known.
    Percentile(f64),
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            on: RetryOn::DEFAULT,
            per_try_timeout: None,
            deadline: None,
            backoff: DEFAULT_RETRY_BACKOFF,
            backoff_max: DEFAULT_RETRY_BACKOFF_MAX,
            budget: DEFAULT_RETRY_BUDGET,
            budget_min: DEFAULT_RETRY_BUDGET_MIN,
            retry_after_max: DEFAULT_RETRY_AFTER_MAX,
            hedge_after: None,
        }
    }
}

pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(25);
pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_millis(250);
pub const DEFAULT_RETRY_BUDGET: f64 = 0.2;
pub const DEFAULT_RETRY_BUDGET_MIN: u32 = 3;
pub const DEFAULT_RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// Why a failed attempt may be retried: one of the `retry_on` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The connection could not be made (refused, timed out, TLS failed).
    ConnectFailure,
    /// The connection was reset or closed before the first response byte, pooled or fresh.
    ResetBeforeResponse,
    Status502,
    Status503,
    Status504,
    Status429,
    /// No response byte within the per-try timeout (the engine may still be working).
    FirstByteTimeout,
}

impl RetryReason {
    pub const ALL: [RetryReason; 7] = [
        RetryReason::ConnectFailure,
        RetryReason::ResetBeforeResponse,
        RetryReason::Status502,
        RetryReason::Status503,
        RetryReason::Status504,
        RetryReason::Status429,
        RetryReason::FirstByteTimeout,
    ];

    /// The word in `retry_on` and the metrics' `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            RetryReason::ConnectFailure => "connect_failure",
            RetryReason::ResetBeforeResponse => "reset_before_response",
            RetryReason::Status502 => "502",
            RetryReason::Status503 => "503",
            RetryReason::Status504 => "504",
            RetryReason::Status429 => "429",
            RetryReason::FirstByteTimeout => "first_byte_timeout",
        }
    }

    pub fn parse(s: &str) -> Option<RetryReason> {
        Self::ALL.into_iter().find(|r| r.name() == s)
    }

    /// The reason a response status gives, when it is one `retry_on` can name.
    pub fn for_status(status: u16) -> Option<RetryReason> {
        match status {
            502 => Some(RetryReason::Status502),
            503 => Some(RetryReason::Status503),
            504 => Some(RetryReason::Status504),
            429 => Some(RetryReason::Status429),
            _ => None,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A set of [`RetryReason`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOn(u8);

impl RetryOn {
    pub const NONE: RetryOn = RetryOn(0);
    /// Everything but `first_byte_timeout`, which is opt-in: the engine may still be working.
    pub const DEFAULT: RetryOn = RetryOn(0b011_1111);

    pub fn with(self, r: RetryReason) -> RetryOn {
        RetryOn(self.0 | 1 << r.index())
    }

    pub fn contains(self, r: RetryReason) -> bool {
        self.0 & (1 << r.index()) != 0
    }

    /// Whether a response with this status is retried (and so held back from the client).
    pub fn status(self, status: u16) -> bool {
        RetryReason::for_status(status).is_some_and(|r| self.contains(r))
    }
}

/// A route's bounded queue for requests that find every candidate full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteQueue {
    /// Most requests waiting at once over the gateway (`queue_max`), split evenly over the
    /// workers (each holds at most `ceil(max / workers)`); beyond it a 503 at once.
    pub max: usize,
    /// Longest a request waits (`queue_timeout`, default 2 s) before a 503 with
    /// `Retry-After`.
    pub timeout: Duration,
}

/// The class every request has when `[[classes]]` is absent.
pub const DEFAULT_CLASS: &str = "default";

/// The most classes (ranks 0 to 7).
pub const MAX_CLASSES: usize = 8;

/// One `[[classes]]` entry: a priority class.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorityClass {
    pub name: String,
    /// 0 to 7; a lower rank is admitted first (as vLLM's `priority` schedules).
    pub rank: u8,
    /// The share (0 to 0.9) of every target's `max_concurrent` that requests of a lower
    /// class (a higher rank) may not take (`reserve`).
    pub reserve: f64,
}

/// A route's admission settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteAdmission {
    /// The class of a request no key or header gives one (`default_class`).
    pub default_class: usize,
    /// The route takes a request's class from `x-rolter-priority` (`priority_header`):
    /// from any client when the gateway has no keys, else only from keys with
    /// `set_priority`.
    pub priority_header: bool,
    /// The header naming a request's tenant for fair queueing (`tenant_header`); `None`:
    /// the tenant is the caller's key.
    pub tenant_header: Option<String>,
    /// A request whose predicted time to first token (`predicted_latency`, `fastest`)
    /// already exceeds its remaining deadline is refused at once (`refuse_unmeetable`,
    /// default false).
    pub refuse_unmeetable: bool,
}

impl PriorityClass {
    /// The class of a configuration without `[[classes]]`.
    pub fn default_class() -> Self {
        PriorityClass {
            name: DEFAULT_CLASS.to_string(),
            rank: 0,
            reserve: 0.0,
        }
    }
}

/// The places of a target capped at `max` that a request of class rank `rank` may not
/// take: the reserves of every class ranked before it (each `floor(reserve × max)`).
#[inline]
pub fn held_back(classes: &[PriorityClass], rank: u8, max: u32) -> u32 {
    if rank == 0 {
        return 0;
    }
    let held: u32 = classes
        .iter()
        .filter(|c| c.rank < rank)
        .map(|c| (c.reserve * f64::from(max)).floor() as u32)
        .sum();
    held.min(max.saturating_sub(1))
}

/// An LMCache controller's HTTP API (`python -m lmcache.v1.api_server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheController {
    /// As written in the configuration.
    pub url: String,
    pub addr: SocketAddr,
    pub host_header: String,
    /// The URL's path, prefixed to `/lookup` (empty for a root URL).
    pub base_path: String,
}

/// All present rules must hold for a request to match. An empty rule set matches everything.
#[derive(Debug, Clone, Default)]
pub struct RouteMatch {
    /// Exact request paths (without query). Empty: any proxied path, unless `passthrough`
    /// is set (then none).
    pub paths: Vec<String>,
    /// Path prefixes of other endpoints forwarded as they are: any method but `HEAD`, the
    /// body unread, no model (so `models` and the targets' model lists do not apply).
    pub passthrough: Vec<String>,
    /// Requested model names. Empty: any model served by one of the route's targets.
    pub models: Vec<String>,
    /// A request header (lowercase name) that must equal the value.
    pub header: Option<(String, String)>,
}

impl RouteMatch {
    /// Does this rule set take a request for proxied path `path` (its model aside)?
    pub fn takes_proxied(&self, path: &str) -> bool {
        if self.paths.is_empty() {
            self.passthrough.is_empty()
        } else {
            self.paths.iter().any(|p| p == path)
        }
    }

    /// Does one of the `passthrough` prefixes cover `path`?
    pub fn takes_passthrough(&self, path: &str) -> bool {
        self.passthrough
            .iter()
            .any(|p| path.starts_with(p.as_str()))
    }
}

/// What a `discover` entry looks up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoverSpec {
    /// `discover = { dns = "name", port = N }`: one target per A/AAAA address of `name`.
    Addresses { name: String, port: u16 },
    /// `discover = { srv = "_http._tcp.name" }`: one target per SRV record, at its target's
    /// address and its port; its weight scales the entry's, and a lower priority makes a
    /// lower (preferred) failover tier.
    Srv { name: String },
}

impl DiscoverSpec {
    /// The name queried.
    pub fn name(&self) -> &str {
        match self {
            DiscoverSpec::Addresses { name, .. } | DiscoverSpec::Srv { name } => name,
        }
    }
}

impl std::fmt::Display for DiscoverSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiscoverSpec::Addresses { name, port } => write!(f, "A/AAAA {name} (port {port})"),
            DiscoverSpec::Srv { name } => write!(f, "SRV {name}"),
        }
    }
}

/// One member of a discovered group, as the lookup found it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// What the member's name shows after `<entry>/`: the address, or the SRV target host.
    pub host: String,
    pub addr: SocketAddr,
    /// The SRV priority (0 for A/AAAA): lower is preferred.
    pub priority: u16,
    /// The SRV weight (1 for A/AAAA).
    pub weight: u16,
}

impl Member {
    /// `host:port`, with an IPv6 address in brackets.
    pub fn label(&self) -> String {
        match self.host.parse::<IpAddr>() {
            // An address member: the socket address, IPv6 in brackets.
            Ok(_) => self.addr.to_string(),
            Err(_) => format!("{}:{}", self.host, self.addr.port()),
        }
    }
}

/// A `discover` entry of the running configuration: what it looks up, the target it was
/// written as (every member is a copy with its own name, address, weight and tier), and
/// its current members.
#[derive(Debug, Clone)]
pub struct DiscoveryGroup {
    /// The entry's `name`; its members are `<name>/<host>:<port>`.
    pub name: String,
    /// Where it was written (`targets[i]`), for messages.
    pub at: String,
    pub spec: DiscoverSpec,
    /// The entry as a target: `https`, `path` and every other setting of the entry.
    pub template: Target,
    /// The members the running configuration has, sorted by name.
    pub members: Vec<Member>,
}
