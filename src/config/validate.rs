//! Raw file values → validated [`Config`], collecting every problem.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::Collector;
use super::model::*;
use super::raw::{
    closest, join, OrderedStrings, RawConfig, RawHeaderMatch, RawLimits, RawMatch, RawPool,
    RawPrice, RawRoute, RawServer, RawTarget, RawTimeouts,
};

/// Resolves a host name and port to socket addresses.
pub(crate) type Resolver<'a> = &'a dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;
/// Looks up an environment variable.
pub(crate) type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What validation needs from the outside world (injectable for tests).
pub(crate) struct Host<'a> {
    pub resolve: Resolver<'a>,
    pub env: EnvLookup<'a>,
    /// Used when `server.workers = 0`.
    pub cores: usize,
    /// Directory of the configuration file, for relative paths (`ca_file`); `None` when
    /// the text did not come from a file (relative paths then use the working directory).
    pub config_dir: Option<&'a Path>,
}

/// Request paths the gateway proxies; `match.paths` entries must be among them.
pub use crate::openai::PROXIED_PATHS;

/// Header names a target may not set: hop-by-hop and framing headers the gateway owns.
pub const FORBIDDEN_TARGET_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "host",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "x-forwarded-for",
];

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_POOL_MAX_IDLE: usize = 64;
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_RETRIES: u32 = 1;
pub const MAX_RETRIES: u32 = 10;
pub const DEFAULT_STRATEGY: &str = "round_robin";
pub const IMPLICIT_ROUTE_NAME: &str = "default";

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 32 * 1024,
            max_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_body_bytes: 8 * 1024 * 1024,
            head_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Validates everything in `raw`; returns the config only when no error was pushed.
pub(crate) fn validate(
    raw: RawConfig,
    source: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Config> {
    let server = server(raw.server.unwrap_or_default(), host, errs);

    let raw_targets = match raw.targets {
        Some(t) if !t.is_empty() => t,
        Some(_) => {
            errs.push(
                "targets",
                "`targets` is empty; at least one target is required",
                "add a [[targets]] table with `name` and `url`, e.g. name = \"vllm-0\", url = \"http://10.0.0.11:8000\"",
            );
            Vec::new()
        }
        None => {
            errs.push(
                "targets",
                "no targets are configured; at least one target is required",
                "add a [[targets]] table with `name` and `url`, e.g. name = \"vllm-0\", url = \"http://10.0.0.11:8000\"",
            );
            Vec::new()
        }
    };
    let count = raw_targets.len();
    // Target names as written (even for otherwise invalid targets), for route references.
    let names: Vec<Option<String>> = raw_targets.iter().map(|t| t.name.clone()).collect();
    let targets: Vec<Option<Target>> = raw_targets
        .into_iter()
        .enumerate()
        .map(|(i, t)| target(t, &format!("targets[{i}]"), host, errs))
        .collect();
    check_unique_names(&names, "targets", "target", errs);

    let routes = match raw.routes {
        None => vec![Route {
            name: IMPLICIT_ROUTE_NAME.to_string(),
            matcher: RouteMatch::default(),
            targets: (0..count).collect(),
            strategy: StrategySpec {
                name: DEFAULT_STRATEGY,
                options: toml::Table::new(),
            },
            forward_client_auth: false,
            retries: DEFAULT_RETRIES,
        }],
        Some(r) if r.is_empty() => {
            errs.push(
                "routes",
                "`routes` is an empty array, so no request could ever be routed",
                "remove `routes` to get the implicit \"default\" route over all targets, or add a [[routes]] table",
            );
            Vec::new()
        }
        Some(r) => {
            let route_names: Vec<Option<String>> = r.iter().map(|r| r.name.clone()).collect();
            check_unique_names(&route_names, "routes", "route", errs);
            let routes: Vec<Option<Route>> = r
                .into_iter()
                .enumerate()
                .map(|(i, r)| route(r, &format!("routes[{i}]"), &names, &targets, errs))
                .collect();
            routes.into_iter().flatten().collect()
        }
    };

    if !errs.is_empty() {
        return None;
    }
    Some(Config {
        source: PathBuf::from(source),
        server: server?,
        targets: targets.into_iter().collect::<Option<Vec<_>>>()?,
        routes,
        health: Default::default(),
        scrape: Default::default(),
        admin: None,
        catalog: Default::default(),
        adaptive: Default::default(),
    })
}

// ---------------------------------------------------------------- server

fn server(raw: RawServer, host: &Host<'_>, errs: &mut Collector) -> Option<ServerConfig> {
    let listen = match raw.listen.as_deref() {
        None => Some(
            DEFAULT_LISTEN
                .parse()
                .expect("valid default listen address"),
        ),
        Some(s) => listen_addr(s, host, errs),
    };
    let workers = match raw.workers {
        None | Some(0) => Some(host.cores.max(1)),
        Some(n) if n < 0 => {
            errs.push(
                "server.workers",
                format!("workers is {n}, a negative number"),
                "set workers = 0 for one worker per core, or a positive count",
            );
            None
        }
        Some(n) if n > 4096 => {
            errs.push(
                "server.workers",
                format!("workers is {n}, more than the limit of 4096"),
                "set workers = 0 for one worker per core, or a count of at most 4096",
            );
            None
        }
        Some(n) => Some(n as usize),
    };
    let driver = match raw.driver.as_deref() {
        None | Some("auto") => Some(DriverChoice::Auto),
        Some("io_uring") => Some(DriverChoice::IoUring),
        Some("epoll") => Some(DriverChoice::Epoll),
        Some(other) => {
            let valid = ["auto", "io_uring", "epoll"];
            let best = closest(other, &valid).unwrap_or("auto");
            errs.push(
                "server.driver",
                format!("unknown driver `{other}`"),
                format!("use one of auto, io_uring, epoll (did you mean `{best}`?)"),
            );
            None
        }
    };
    let shutdown_grace = duration(
        raw.shutdown_grace.as_ref(),
        "server.shutdown_grace",
        DEFAULT_SHUTDOWN_GRACE,
        true,
        errs,
    );
    let limits = limits(raw.limits.unwrap_or_default(), errs);
    Some(ServerConfig {
        listen: listen?,
        workers: workers?,
        pin_workers: raw.pin_workers.unwrap_or(true),
        driver: driver?,
        limits: limits?,
        shutdown_grace: shutdown_grace?,
    })
}

fn listen_addr(s: &str, host: &Host<'_>, errs: &mut Collector) -> Option<SocketAddr> {
    const KEY: &str = "server.listen";
    const FIX: &str =
        "write an address and port such as \"127.0.0.1:8080\", \"0.0.0.0:8080\" or \"[::]:8080\"";
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr);
    }
    let Some((name, port)) = s.rsplit_once(':') else {
        errs.push(KEY, format!("`{s}` has no port"), FIX);
        return None;
    };
    let Ok(port) = port.parse::<u16>() else {
        errs.push(KEY, format!("`{s}` has an invalid port `{port}`"), FIX);
        return None;
    };
    if name.is_empty() {
        errs.push(KEY, format!("`{s}` has no host"), FIX);
        return None;
    }
    match (host.resolve)(name, port) {
        Ok(addrs) if !addrs.is_empty() => Some(addrs[0]),
        Ok(_) => {
            errs.push(KEY, format!("host `{name}` resolved to no address"), FIX);
            None
        }
        Err(e) => {
            errs.push(KEY, format!("cannot resolve host `{name}`: {e}"), FIX);
            None
        }
    }
}

fn limits(raw: RawLimits, errs: &mut Collector) -> Option<Limits> {
    let d = Limits::default();
    let size = |v: Option<i64>, key: &str, default: usize, errs: &mut Collector| {
        positive(v, &format!("server.limits.{key}"), errs)
            .map(|v| v.map_or(default, |v| v as usize))
    };
    let max_head_bytes = size(raw.max_head_bytes, "max_head_bytes", d.max_head_bytes, errs);
    let mut max_headers = size(raw.max_headers, "max_headers", d.max_headers, errs);
    if let Some(n) = max_headers.filter(|&n| n > crate::http::head::MAX_HEADERS_CAP) {
        errs.push(
            "server.limits.max_headers",
            format!(
                "{n} is over the largest supported value, {}",
                crate::http::head::MAX_HEADERS_CAP
            ),
            format!(
                "set max_headers to at most {}",
                crate::http::head::MAX_HEADERS_CAP
            ),
        );
        max_headers = None;
    }
    let max_uri_bytes = size(raw.max_uri_bytes, "max_uri_bytes", d.max_uri_bytes, errs);
    let max_body_bytes = size(raw.max_body_bytes, "max_body_bytes", d.max_body_bytes, errs);
    let t = |v: Option<&toml::Value>, key: &str, default: Duration, errs: &mut Collector| {
        duration(v, &format!("server.limits.{key}"), default, false, errs)
    };
    let head_timeout = t(
        raw.head_timeout.as_ref(),
        "head_timeout",
        d.head_timeout,
        errs,
    );
    let body_timeout = t(
        raw.body_timeout.as_ref(),
        "body_timeout",
        d.body_timeout,
        errs,
    );
    let keepalive_timeout = t(
        raw.keepalive_timeout.as_ref(),
        "keepalive_timeout",
        d.keepalive_timeout,
        errs,
    );
    let write_timeout = t(
        raw.write_timeout.as_ref(),
        "write_timeout",
        d.write_timeout,
        errs,
    );
    Some(Limits {
        max_head_bytes: max_head_bytes?,
        max_headers: max_headers?,
        max_uri_bytes: max_uri_bytes?,
        max_body_bytes: max_body_bytes?,
        head_timeout: head_timeout?,
        body_timeout: body_timeout?,
        keepalive_timeout: keepalive_timeout?,
        write_timeout: write_timeout?,
    })
}

// ---------------------------------------------------------------- targets

fn target(raw: RawTarget, at: &str, host: &Host<'_>, errs: &mut Collector) -> Option<Target> {
    let name = match raw.name {
        None => {
            errs.push(
                join(at, "name"),
                "target has no `name`",
                "add name = \"...\" (letters, digits, '.', '_' or '-'), unique among targets",
            );
            None
        }
        Some(n) => {
            if check_name(&n, &join(at, "name"), "target", errs) {
                Some(n)
            } else {
                None
            }
        }
    };

    let url = match raw.url {
        None => {
            errs.push(
                join(at, "url"),
                "target has no `url`",
                "add url = \"http://host:port\" (or https://host/base-path)",
            );
            None
        }
        Some(u) => target_url(&u, &join(at, "url"), host, errs),
    };

    let ca = match raw.ca_file {
        None => Some(None),
        Some(f) => ca_file(&f, url.as_ref(), &join(at, "ca_file"), host, errs).map(Some),
    };

    let weight = match raw.weight {
        Some(w) if w.is_infinite() && w > 0.0 => {
            errs.push(
                join(at, "weight"),
                "weight is infinite",
                "use a finite positive weight such as 1.0",
            );
            None
        }
        Some(w) if w > 0.0 => Some(w),
        // Non-positive (and NaN) weights mean the default, by specification.
        _ => Some(1.0),
    };

    let models = string_list(raw.models, &join(at, "models"), "model name", errs);

    let max_concurrent = match raw.max_concurrent {
        None => Some(None),
        Some(n) if n <= 0 => {
            errs.push(
                join(at, "max_concurrent"),
                format!("max_concurrent is {n}; it must be greater than 0"),
                "set a positive limit such as 64, or remove the key for no limit",
            );
            None
        }
        Some(n) => match u32::try_from(n) {
            Ok(v) => Some(Some(v)),
            Err(_) => {
                errs.push(
                    join(at, "max_concurrent"),
                    format!("max_concurrent is {n}, too large"),
                    format!("use at most {}, or remove the key for no limit", u32::MAX),
                );
                None
            }
        },
    };

    let tier = match raw.tier {
        None => Some(0),
        Some(n) => match u32::try_from(n) {
            Ok(v) => Some(v),
            Err(_) => {
                errs.push(
                    join(at, "tier"),
                    format!("tier is {n}; it must be between 0 and {}", u32::MAX),
                    "use 0 for primary targets and 1, 2, … for failover tiers",
                );
                None
            }
        },
    };

    let price = match raw.price {
        None => Some(None),
        Some(p) => price(p, &join(at, "price"), errs).map(Some),
    };

    let headers = target_headers(raw.headers, &join(at, "headers"), host, errs);

    let upstream_models = upstream_models(
        raw.upstream_models,
        models.as_deref(),
        &join(at, "upstream_models"),
        errs,
    );

    let timeouts = timeouts(
        raw.timeouts.unwrap_or_default(),
        &join(at, "timeouts"),
        errs,
    );
    let pool = pool(raw.pool.unwrap_or_default(), &join(at, "pool"), errs);

    let url = url?;
    let (ca_file, ca_certs) = ca?.unzip();
    Some(Target {
        name: name?,
        url: url.written,
        addr: url.addr,
        tls: url.tls,
        server_name: url.server_name,
        ca_file,
        ca_certs: ca_certs.unwrap_or_default(),
        host_header: url.host_header,
        base_path: url.base_path,
        weight: weight?,
        models: models?,
        upstream_models: upstream_models?,
        headers: headers?,
        max_concurrent: max_concurrent?,
        tier: tier?,
        price: price?,
        health_path: None,
        scrape: true,
        metrics_path: None,
        timeouts: timeouts?,
        pool: pool?,
    })
}

/// A name of a target or route: non-empty, `[A-Za-z0-9._-]+` for targets.
fn check_name(n: &str, key: &str, what: &str, errs: &mut Collector) -> bool {
    if n.is_empty() {
        errs.push(
            key,
            format!("{what} name is empty"),
            format!("give the {what} a non-empty, unique name"),
        );
        return false;
    }
    if what == "target" {
        if let Some(bad) = n
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            let suggestion: String = n
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            errs.push(
                key,
                format!("target name `{n}` contains {bad:?}; only letters, digits, '.', '_' and '-' are allowed"),
                format!("rename it, e.g. to `{suggestion}`"),
            );
            return false;
        }
    }
    true
}

struct ParsedUrl {
    written: String,
    addr: SocketAddr,
    tls: bool,
    server_name: String,
    host_header: String,
    base_path: String,
}

fn target_url(
    written: &str,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<ParsedUrl> {
    const EXAMPLE: &str = "e.g. \"http://10.0.0.11:8000\" or \"https://api.openai.com/v1\"";
    if written.is_empty() {
        errs.push(
            key,
            "url is empty",
            format!("write the upstream base URL, {EXAMPLE}"),
        );
        return None;
    }
    if !written.contains("://") {
        errs.push(
            key,
            format!("`{written}` has no scheme (http:// or https://)"),
            format!("write it as \"http://{written}\" (or https:// for TLS)"),
        );
        return None;
    }
    let u = match url::Url::parse(written) {
        Ok(u) => u,
        Err(e) => {
            errs.push(
                key,
                format!("`{written}` is not a valid URL: {e}"),
                format!("write an absolute http:// or https:// URL, {EXAMPLE}"),
            );
            return None;
        }
    };
    let tls = match u.scheme() {
        "http" => false,
        "https" => true,
        other => {
            errs.push(
                key,
                format!("unsupported URL scheme `{other}` in `{written}`"),
                format!("use http:// or https://, {EXAMPLE}"),
            );
            return None;
        }
    };
    let mut ok = true;
    if !u.username().is_empty() || u.password().is_some() {
        errs.push(
            key,
            format!("`{written}` contains user credentials"),
            "remove `user:password@` from the URL and put credentials in `headers`, e.g. headers = { \"Authorization\" = \"Bearer ${API_KEY}\" }",
        );
        ok = false;
    }
    if u.query().is_some() {
        errs.push(
            key,
            format!("`{written}` has a query string"),
            "remove the `?…` part; the URL may only have a host, an optional port and an optional base path",
        );
        ok = false;
    }
    if u.fragment().is_some() {
        errs.push(
            key,
            format!("`{written}` has a fragment"),
            "remove the `#…` part; the URL may only have a host, an optional port and an optional base path",
        );
        ok = false;
    }
    let Some(url_host) = u.host() else {
        errs.push(
            key,
            format!("`{written}` has no host"),
            format!("write a URL with a host, {EXAMPLE}"),
        );
        return None;
    };
    if !ok {
        return None;
    }
    let port = u
        .port_or_known_default()
        .unwrap_or(if tls { 443 } else { 80 });
    let host_str = u.host_str().unwrap_or_default().to_string();
    let server_name = match url_host {
        url::Host::Ipv6(ip) => ip.to_string(),
        _ => host_str.clone(),
    };
    if tls && rustls::pki_types::ServerName::try_from(server_name.as_str()).is_err() {
        errs.push(
            key,
            format!("`{server_name}` in `{written}` is not a valid TLS server name"),
            "use the DNS name (or IP address) the upstream's certificate is issued for",
        );
        return None;
    }
    let host_header = match u.port() {
        Some(p) => format!("{host_str}:{p}"),
        None => host_str.clone(),
    };
    let base_path = u.path().trim_end_matches('/').to_string();
    let addr = match url_host {
        url::Host::Ipv4(ip) => SocketAddr::new(IpAddr::V4(ip), port),
        url::Host::Ipv6(ip) => SocketAddr::new(IpAddr::V6(ip), port),
        url::Host::Domain(d) => match (host.resolve)(d, port) {
            Ok(addrs) if !addrs.is_empty() => addrs[0],
            Ok(_) => {
                errs.push(
                    key,
                    format!("host `{d}` resolved to no address"),
                    format!("check the host name `{d}` and DNS, or use an IP address"),
                );
                return None;
            }
            Err(e) => {
                errs.push(
                    key,
                    format!("cannot resolve host `{d}`: {e}"),
                    format!("check the host name `{d}` and that DNS works on this machine, or use an IP address"),
                );
                return None;
            }
        },
    };
    Some(ParsedUrl {
        written: written.to_string(),
        addr,
        tls,
        server_name,
        host_header,
        base_path,
    })
}

/// A target's `ca_file`: only for https:// URLs; a readable PEM file holding at least one
/// certificate that is usable as a trust anchor. Returns the resolved path and the
/// certificates (DER). `url` is `None` when the URL itself was invalid (already reported).
fn ca_file(
    written: &str,
    url: Option<&ParsedUrl>,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<(PathBuf, Vec<rustls::pki_types::CertificateDer<'static>>)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    if let Some(u) = url {
        if !u.tls {
            errs.push(
                key,
                format!(
                    "ca_file is set but the target URL `{}` is plaintext http://; a CA file only applies to TLS",
                    u.written
                ),
                "remove `ca_file`, or change the url to https:// if the upstream speaks TLS",
            );
            return None;
        }
    }
    if written.is_empty() {
        errs.push(
            key,
            "ca_file is empty",
            "write the path of a PEM file with the CA certificate(s) that signed the upstream's certificate, or remove `ca_file` to trust the public CAs",
        );
        return None;
    }
    let path = match host.config_dir {
        Some(dir) if Path::new(written).is_relative() => dir.join(written),
        _ => PathBuf::from(written),
    };
    let shown = path.display();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            errs.push(
                key,
                format!("cannot read ca_file `{shown}`: {e}"),
                "check the path (relative paths are resolved against the configuration file's directory) and that the file is readable by rolter",
            );
            return None;
        }
    };
    let mut certs = Vec::new();
    for item in CertificateDer::pem_slice_iter(&bytes) {
        match item {
            Ok(c) => certs.push(c),
            Err(e) => {
                errs.push(
                    key,
                    format!("ca_file `{shown}` is not valid PEM: {e}"),
                    "use a PEM file of `-----BEGIN CERTIFICATE-----` blocks (convert DER with `openssl x509 -inform der -in ca.der -out ca.pem`)",
                );
                return None;
            }
        }
    }
    if certs.is_empty() {
        errs.push(
            key,
            format!("ca_file `{shown}` contains no certificate"),
            "put the CA certificate(s) in the file as `-----BEGIN CERTIFICATE-----` PEM blocks",
        );
        return None;
    }
    for (i, c) in certs.iter().enumerate() {
        if let Err(e) = rustls::RootCertStore::empty().add(c.clone()) {
            errs.push(
                key,
                format!(
                    "certificate {} of ca_file `{shown}` is not usable as a CA certificate: {e}",
                    i + 1
                ),
                "replace it with the CA certificate that signed the upstream's certificate (an X.509 v3 certificate in PEM)",
            );
            return None;
        }
    }
    Some((path, certs))
}

fn price(raw: RawPrice, at: &str, errs: &mut Collector) -> Option<Price> {
    let one = |v: Option<f64>, key: &str, errs: &mut Collector| match v {
        None => {
            errs.push(
                join(at, key),
                format!("price has no `{key}`"),
                "set both prices per 1M tokens, e.g. price = { input = 0.15, output = 0.60 }",
            );
            None
        }
        Some(p) if !(p.is_finite() && p >= 0.0) => {
            errs.push(
                join(at, key),
                format!("price {key} is {p}; it must be a finite number >= 0"),
                "write the price per 1M tokens as a number >= 0, e.g. 0.15",
            );
            None
        }
        Some(p) => Some(p),
    };
    let input = one(raw.input, "input", errs);
    let output = one(raw.output, "output", errs);
    Some(Price {
        input_per_mtok: input?,
        output_per_mtok: output?,
    })
}

/// RFC 9110 token characters.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn check_header_name(name: &str, key: &str, errs: &mut Collector) -> bool {
    if name.is_empty() {
        errs.push(
            key,
            "header name is empty",
            "write a header name such as \"Authorization\"",
        );
        return false;
    }
    if let Some(bad) = name.chars().find(|c| !is_tchar(*c)) {
        errs.push(
            key,
            format!("header name `{name}` contains {bad:?}, which is not allowed in an HTTP header name"),
            "use only letters, digits and !#$%&'*+-.^_`|~ in header names",
        );
        return false;
    }
    true
}

/// Checks a header value for CR, LF and NUL; `what` describes it for messages.
fn check_header_value(value: &str, key: &str, errs: &mut Collector) -> bool {
    for (c, label) in [
        ('\r', "a carriage return (CR)"),
        ('\n', "a line feed (LF)"),
        ('\0', "a NUL byte"),
    ] {
        if value.contains(c) {
            errs.push(
                key,
                format!(
                    "header value contains {label}, which would split or corrupt the request head"
                ),
                "remove the control character from the value (and from any ${VAR} it uses)",
            );
            return false;
        }
    }
    true
}

/// Expands `${VAR}` references from the environment. `$` not followed by `{` is literal.
fn expand_env(value: &str, key: &str, host: &Host<'_>, errs: &mut Collector) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    let mut ok = true;
    while let Some(pos) = rest.find("${") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 2..];
        let Some(end) = after.find('}') else {
            errs.push(
                key,
                // The value itself is not echoed: it may hold a secret.
                "`${` without a closing `}`".to_string(),
                "close the reference as ${VAR}",
            );
            return None;
        };
        let var = &after[..end];
        let valid = !var.is_empty()
            && !var.starts_with(|c: char| c.is_ascii_digit())
            && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            errs.push(
                key,
                format!("`${{{var}}}` is not a valid environment variable reference"),
                "use ${NAME} where NAME is letters, digits and '_' and does not start with a digit",
            );
            ok = false;
        } else {
            match (host.env)(var) {
                Some(v) => out.push_str(&v),
                None => {
                    errs.push(
                        key,
                        format!("environment variable `{var}` is not set"),
                        format!("export {var} before starting rolter, or write the value directly"),
                    );
                    ok = false;
                }
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    ok.then_some(out)
}

fn target_headers(
    raw: Option<OrderedStrings>,
    at: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Vec<(String, String)>> {
    let Some(OrderedStrings(raw)) = raw else {
        return Some(Vec::new());
    };
    let mut out = Vec::with_capacity(raw.len());
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut ok = true;
    for (name, value) in raw {
        let key = join(at, &name);
        if !check_header_name(&name, &key, errs) {
            ok = false;
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if FORBIDDEN_TARGET_HEADERS.contains(&lower.as_str()) {
            errs.push(
                &key,
                format!("header `{name}` is a hop-by-hop or framing header that the gateway manages itself"),
                format!("remove `{name}` from headers"),
            );
            ok = false;
            continue;
        }
        if let Some(first) = seen.get(&lower) {
            errs.push(
                &key,
                format!(
                    "header `{name}` is set twice (also as `{first}`; names are case-insensitive)"
                ),
                format!("keep only one of `{first}` and `{name}`"),
            );
            ok = false;
            continue;
        }
        seen.insert(lower.clone(), name.clone());
        // Check before expansion too, so a literal control character is reported even when a
        // variable in the same value is unset.
        if !check_header_value(&value, &key, errs) {
            ok = false;
            continue;
        }
        let Some(expanded) = expand_env(&value, &key, host, errs) else {
            ok = false;
            continue;
        };
        if !check_header_value(&expanded, &key, errs) {
            ok = false;
            continue;
        }
        out.push((lower, expanded));
    }
    ok.then_some(out)
}

fn upstream_models(
    raw: Option<OrderedStrings>,
    models: Option<&[String]>,
    at: &str,
    errs: &mut Collector,
) -> Option<HashMap<String, String>> {
    let Some(OrderedStrings(raw)) = raw else {
        return Some(HashMap::new());
    };
    let mut out = HashMap::with_capacity(raw.len());
    let mut ok = true;
    for (public, upstream) in raw {
        let key = join(at, &public);
        if public.is_empty() {
            errs.push(
                &key,
                "public model name is empty",
                "map a non-empty public model name to the upstream's name",
            );
            ok = false;
            continue;
        }
        if upstream.is_empty() {
            errs.push(
                &key,
                format!("upstream model name for `{public}` is empty"),
                format!("write the name the upstream expects for `{public}`, or remove the entry"),
            );
            ok = false;
            continue;
        }
        if let Some(models) = models {
            if !models.is_empty() && !models.contains(&public) {
                errs.push(
                    &key,
                    format!(
                        "`{public}` is not in this target's `models` ({})",
                        models.join(", ")
                    ),
                    format!("add \"{public}\" to `models`, or remove this mapping"),
                );
                ok = false;
                continue;
            }
        }
        out.insert(public, upstream);
    }
    ok.then_some(out)
}

fn timeouts(raw: RawTimeouts, at: &str, errs: &mut Collector) -> Option<UpstreamTimeouts> {
    let connect = duration(
        raw.connect.as_ref(),
        &join(at, "connect"),
        DEFAULT_CONNECT_TIMEOUT,
        false,
        errs,
    );
    let first_byte = duration(
        raw.first_byte.as_ref(),
        &join(at, "first_byte"),
        DEFAULT_FIRST_BYTE_TIMEOUT,
        false,
        errs,
    );
    let idle = duration(
        raw.idle.as_ref(),
        &join(at, "idle"),
        DEFAULT_IDLE_TIMEOUT,
        false,
        errs,
    );
    Some(UpstreamTimeouts {
        connect: connect?,
        first_byte: first_byte?,
        idle: idle?,
    })
}

fn pool(raw: RawPool, at: &str, errs: &mut Collector) -> Option<PoolConfig> {
    let max_idle = match raw.max_idle {
        None => Some(DEFAULT_POOL_MAX_IDLE),
        Some(n) => match usize::try_from(n) {
            Ok(v) => Some(v),
            Err(_) => {
                errs.push(
                    join(at, "max_idle"),
                    format!("max_idle is {n}; it must be 0 or more"),
                    "set max_idle = 0 to disable pooling, or a positive count such as 64",
                );
                None
            }
        },
    };
    let idle_timeout = duration(
        raw.idle_timeout.as_ref(),
        &join(at, "idle_timeout"),
        DEFAULT_POOL_IDLE_TIMEOUT,
        false,
        errs,
    );
    Some(PoolConfig {
        max_idle: max_idle?,
        idle_timeout: idle_timeout?,
    })
}

/// Whether `best` is close enough to `word` to be suggested as what was meant.
fn raw_close(word: &str, best: &str) -> bool {
    super::raw::edit_distance(word, best) <= (word.chars().count() / 2).max(1)
}

/// Reports every repeated non-empty name in `names` (as written, valid or not).
fn check_unique_names(names: &[Option<String>], list: &str, what: &str, errs: &mut Collector) {
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, n) in names.iter().enumerate() {
        let Some(n) = n.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        if let Some(&j) = first.get(n) {
            errs.push(
                format!("{list}[{i}].name"),
                format!("{what} name `{n}` is already used by {list}[{j}]"),
                format!("give every {what} a unique name, e.g. rename this one to `{n}-{i}`"),
            );
        } else {
            first.insert(n, i);
        }
    }
}

// ---------------------------------------------------------------- routes

fn route(
    raw: RawRoute,
    at: &str,
    names: &[Option<String>],
    targets: &[Option<Target>],
    errs: &mut Collector,
) -> Option<Route> {
    let name = match raw.name {
        None => {
            errs.push(
                join(at, "name"),
                "route has no `name`",
                "add name = \"...\", unique among routes",
            );
            None
        }
        Some(n) => check_name(&n, &join(at, "name"), "route", errs).then_some(n),
    };

    let route_targets = route_targets(raw.targets, &join(at, "targets"), names, errs);
    let strategy = strategy(raw.strategy, &join(at, "strategy"), errs);

    let retries = match raw.retries {
        None => Some(DEFAULT_RETRIES),
        Some(n) if (0..=i64::from(MAX_RETRIES)).contains(&n) => Some(n as u32),
        Some(n) => {
            errs.push(
                join(at, "retries"),
                format!("retries is {n}; it must be between 0 and {MAX_RETRIES}"),
                format!(
                    "set retries to a number from 0 to {MAX_RETRIES} (default {DEFAULT_RETRIES})"
                ),
            );
            None
        }
    };

    let matcher = match raw.matcher {
        None => Some(RouteMatch::default()),
        Some(m) => route_match(
            m,
            &join(at, "match"),
            route_targets.as_deref(),
            targets,
            errs,
        ),
    };

    Some(Route {
        name: name?,
        matcher: matcher?,
        targets: route_targets?,
        strategy: strategy?,
        forward_client_auth: raw.forward_client_auth.unwrap_or(false),
        retries: retries?,
    })
}

fn route_targets(
    raw: Option<Vec<String>>,
    key: &str,
    names: &[Option<String>],
    errs: &mut Collector,
) -> Option<Vec<TargetId>> {
    let mut known: Vec<&str> = Vec::new();
    for n in names.iter().flatten() {
        if !n.is_empty() && !known.contains(&n.as_str()) {
            known.push(n);
        }
    }
    let known_list = if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    };
    let list = match raw {
        None => {
            errs.push(
                key,
                "route has no `targets`",
                format!("add targets = [\"…\"] naming one or more targets (known targets: {known_list})"),
            );
            return None;
        }
        Some(l) if l.is_empty() => {
            errs.push(
                key,
                "route `targets` is empty",
                format!("name one or more targets (known targets: {known_list})"),
            );
            return None;
        }
        Some(l) => l,
    };
    let mut out = Vec::with_capacity(list.len());
    let mut ok = true;
    for (i, n) in list.iter().enumerate() {
        let k = format!("{key}[{i}]");
        match names.iter().position(|t| t.as_deref() == Some(n.as_str())) {
            Some(id) if out.contains(&id) => {
                errs.push(
                    k,
                    format!("target `{n}` is listed twice"),
                    format!("list `{n}` only once"),
                );
                ok = false;
            }
            Some(id) => out.push(id),
            None => {
                let hint = match closest(n, &known) {
                    Some(best) if raw_close(n, best) => format!(" (did you mean `{best}`?)"),
                    _ => String::new(),
                };
                errs.push(
                    k,
                    format!("no target is named `{n}`"),
                    format!("use one of the known targets: {known_list}{hint}"),
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn strategy(raw: Option<toml::Value>, key: &str, errs: &mut Collector) -> Option<StrategySpec> {
    let (name, options, name_key) = match raw {
        None => (
            DEFAULT_STRATEGY.to_string(),
            toml::Table::new(),
            key.to_string(),
        ),
        Some(toml::Value::String(s)) => (s, toml::Table::new(), key.to_string()),
        Some(toml::Value::Table(mut t)) => match t.remove("name") {
            Some(toml::Value::String(s)) => (s, t, join(key, "name")),
            Some(other) => {
                errs.push(
                    join(key, "name"),
                    format!(
                        "strategy name must be a string, found a {}",
                        other.type_str()
                    ),
                    "write name = \"round_robin\" (or another strategy name)",
                );
                return None;
            }
            None => {
                errs.push(
                    join(key, "name"),
                    "strategy table has no `name`",
                    "add name = \"…\" to the strategy table, e.g. name = \"round_robin\"",
                );
                return None;
            }
        },
        Some(other) => {
            errs.push(
                key,
                format!("strategy must be a string or a table, found a {}", other.type_str()),
                "write strategy = \"round_robin\", or a [routes.strategy] table with `name` and options",
            );
            return None;
        }
    };
    if name.is_empty() {
        errs.push(
            &name_key,
            "strategy name is empty",
            "name a strategy, e.g. \"round_robin\"",
        );
        return None;
    }
    match crate::strategy::registry::validate_spec(&name, &options) {
        Ok(canonical) => Some(StrategySpec {
            name: canonical,
            options,
        }),
        Err(problems) => {
            for (opt, message) in problems {
                if opt == "name" {
                    errs.push(
                        &name_key,
                        message,
                        "use one of the valid strategy names listed in the message",
                    );
                } else {
                    let k = join(key, &opt);
                    let fix = format!(
                        "correct or remove `{k}`; see the options documented for strategy `{name}`"
                    );
                    errs.push(k, message, fix);
                }
            }
            None
        }
    }
}

fn route_match(
    raw: RawMatch,
    at: &str,
    route_targets: Option<&[TargetId]>,
    targets: &[Option<Target>],
    errs: &mut Collector,
) -> Option<RouteMatch> {
    let mut ok = true;
    let paths = raw.paths.unwrap_or_default();
    for (i, p) in paths.iter().enumerate() {
        if !PROXIED_PATHS.contains(&p.as_str()) {
            let best = closest(p, PROXIED_PATHS).unwrap_or(PROXIED_PATHS[0]);
            errs.push(
                format!("{}[{i}]", join(at, "paths")),
                format!("`{p}` is not a proxied path"),
                format!(
                    "use one of {} (did you mean `{best}`?)",
                    PROXIED_PATHS.join(", ")
                ),
            );
            ok = false;
        }
    }

    let raw_models = raw.models.unwrap_or_default();
    if let Some(ids) = route_targets {
        // Only when every target of the route is valid and lists its models.
        let served: Option<Vec<&Target>> = ids.iter().map(|&id| targets[id].as_ref()).collect();
        if let Some(served) = served {
            if served.iter().all(|t| !t.models.is_empty()) {
                let all: HashSet<&str> = served
                    .iter()
                    .flat_map(|t| t.models.iter().map(String::as_str))
                    .collect();
                let mut listed: Vec<&str> = all.iter().copied().collect();
                listed.sort_unstable();
                for (i, m) in raw_models.iter().enumerate() {
                    if !m.is_empty() && !all.contains(m.as_str()) {
                        errs.push(
                            format!("{}[{i}]", join(at, "models")),
                            format!(
                                "no target of this route serves model `{m}` (they serve: {})",
                                listed.join(", ")
                            ),
                            format!("add \"{m}\" to the `models` of a target in this route, or remove it from match.models"),
                        );
                        ok = false;
                    }
                }
            }
        }
    }
    let models = string_list(Some(raw_models), &join(at, "models"), "model name", errs);

    let header = match raw.header {
        None => Some(None),
        Some(h) => header_match(h, &join(at, "header"), errs).map(Some),
    };

    if !ok {
        return None;
    }
    Some(RouteMatch {
        paths,
        models: models?,
        header: header?,
    })
}

fn header_match(raw: RawHeaderMatch, at: &str, errs: &mut Collector) -> Option<(String, String)> {
    let name = match raw.name {
        None => {
            errs.push(
                join(at, "name"),
                "header match has no `name`",
                "write header = { name = \"x-tenant\", value = \"blue\" }",
            );
            None
        }
        Some(n) => check_header_name(&n, &join(at, "name"), errs).then(|| n.to_ascii_lowercase()),
    };
    let value = match raw.value {
        None => {
            errs.push(
                join(at, "value"),
                "header match has no `value`",
                "write header = { name = \"x-tenant\", value = \"blue\" }",
            );
            None
        }
        Some(v) if v.is_empty() => {
            errs.push(
                join(at, "value"),
                "header match value is empty",
                "give the exact non-empty value the header must have",
            );
            None
        }
        Some(v) => check_header_value(&v, &join(at, "value"), errs).then_some(v),
    };
    Some((name?, value?))
}

// ---------------------------------------------------------------- shared helpers

/// An optional integer that must be > 0.
fn positive(v: Option<i64>, key: &str, errs: &mut Collector) -> Option<Option<i64>> {
    match v {
        Some(n) if n <= 0 => {
            errs.push(
                key,
                format!("value is {n}; it must be greater than 0"),
                "use a positive number, or remove the key for the default",
            );
            None
        }
        other => Some(other),
    }
}

/// A list of non-empty, distinct strings.
fn string_list(
    v: Option<Vec<String>>,
    key: &str,
    what: &str,
    errs: &mut Collector,
) -> Option<Vec<String>> {
    let list = v.unwrap_or_default();
    let mut ok = true;
    for (i, s) in list.iter().enumerate() {
        if s.is_empty() {
            errs.push(
                format!("{key}[{i}]"),
                format!("{what} is empty"),
                format!("remove the empty string or write the {what}"),
            );
            ok = false;
        } else if list[..i].contains(s) {
            errs.push(
                format!("{key}[{i}]"),
                format!("{what} `{s}` is listed twice"),
                format!("list `{s}` only once"),
            );
            ok = false;
        }
    }
    ok.then_some(list)
}

/// A humantime duration string; `allow_zero` is false for timeouts.
fn duration(
    v: Option<&toml::Value>,
    key: &str,
    default: Duration,
    allow_zero: bool,
    errs: &mut Collector,
) -> Option<Duration> {
    let example = humantime::format_duration(default).to_string();
    match v {
        None => Some(default),
        Some(toml::Value::String(s)) => match humantime::parse_duration(s.trim()) {
            Ok(d) if d.is_zero() && !allow_zero => {
                errs.push(
                    key,
                    format!("duration `{s}` is zero, which would make every operation time out"),
                    format!("use a positive duration such as \"{example}\" (the default)"),
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                errs.push(
                    key,
                    format!("`{s}` is not a duration: {e}"),
                    format!("write a number with a unit, e.g. \"250ms\", \"10s\" or \"2m\" (default \"{example}\")"),
                );
                None
            }
        },
        Some(toml::Value::Integer(n)) => {
            errs.push(
                key,
                format!("duration `{n}` has no unit"),
                format!("write it as a string with a unit, e.g. \"{n}s\" or \"{n}ms\""),
            );
            None
        }
        Some(other) => {
            errs.push(
                key,
                format!("a duration must be a string, found a {}", other.type_str()),
                format!("write a string with a unit, e.g. \"10s\" (default \"{example}\")"),
            );
            None
        }
    }
}
