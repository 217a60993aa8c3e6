//! What every section's checks share: the outside world validation sees ([`Host`]), the
//! defaults and limits named in messages, the small value checks (counts, paths,
//! durations, string lists) that report into the [`Collector`], and where a file path
//! written in the configuration points ([`config_path`]).
//!
//! A leaf of the validation modules: each section imports it, it imports none of them.

pub(super) use std::collections::{HashMap, HashSet};
pub(super) use std::net::{IpAddr, SocketAddr};
pub(super) use std::path::{Path, PathBuf};
pub(super) use std::time::Duration;

pub(super) use rolter_strategy::Requirements;

pub(super) use crate::discover::{DiscoverSpec, DiscoveryGroup, Member};
pub(super) use crate::error::Collector;
pub(super) use crate::model::*;
pub(super) use crate::raw::{
    closest, is_bare_key, join, OrderedPrices, OrderedStrings, RawAdmin, RawClass, RawConfig,
    RawDiscover, RawHeaderMatch, RawHealth, RawKvEvents, RawLimits, RawLog, RawMatch, RawPdPool,
    RawPool, RawPrice, RawRoute, RawScrape, RawServer, RawServerTls, RawTarget, RawTargetKvEvents,
    RawTimeouts,
};

/// Resolves a host name and port to socket addresses.
pub(crate) type Resolver<'a> = &'a dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;
/// Looks a `discover` entry (its name and spec) up at the nameservers given (empty: the
/// system's): its members, or why there are none.
pub type Discoverer<'a> =
    &'a dyn Fn(&str, &DiscoverSpec, &[SocketAddr]) -> Result<Vec<Member>, String>;
/// Looks up an environment variable.
pub(crate) type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What validation needs from the outside world (injectable for tests).
pub(crate) struct Host<'a> {
    pub resolve: Resolver<'a>,
    pub discover: Discoverer<'a>,
    pub env: EnvLookup<'a>,
    /// Used when `server.workers = 0`.
    pub cores: usize,
    /// Directory of the configuration file, for relative paths (`ca_file`); `None` when
    /// the text did not come from a file (relative paths then use the working directory).
    pub config_dir: Option<&'a Path>,
}

/// A path written in the configuration: relative ones are taken from the configuration
/// file's directory (`config_dir`), or from the working directory when there is none.
pub(crate) fn config_path(config_dir: Option<&Path>, written: impl AsRef<Path>) -> PathBuf {
    let written = written.as_ref();
    match config_dir {
        Some(dir) if written.is_relative() => dir.join(written),
        _ => written.to_path_buf(),
    }
}

/// Request paths the gateway proxies; `match.paths` entries must be among them.
pub use rolter_codec::api::PROXIED_PATHS;

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
    "x-request-id",
];

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// `server.max_connections` when not set: client connections open at once, over every
/// worker; beyond it a new connection gets a 503 and is closed.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// A route's `queue_timeout` when it has a queue and does not set it.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(2);
/// `server.dns_refresh` when not set.
pub const DEFAULT_DNS_REFRESH: Duration = Duration::from_secs(30);
/// The longest `server.busy_poll`: past it a worker spins through gaps that a sleep and a
/// wake-up would serve as fast.
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(100);
/// The shortest non-zero `server.dns_refresh`.
pub const MIN_DNS_REFRESH: Duration = Duration::from_secs(1);
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_POOL_MAX_IDLE: usize = 64;
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_RETRIES: u32 = 1;
pub const MAX_RETRIES: u32 = 10;
pub const DEFAULT_STRATEGY: &str = "round_robin";
pub const IMPLICIT_ROUTE_NAME: &str = "default";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9091";

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

/// An optional integer that must be > 0.
pub(super) fn positive(v: Option<i64>, key: &str, errs: &mut Collector) -> Option<Option<i64>> {
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

/// An optional integer in `range`; `what` says what it counts, for the fix.
pub(super) fn count(
    v: Option<i64>,
    key: &str,
    default: u32,
    range: std::ops::RangeInclusive<u32>,
    what: &str,
    errs: &mut Collector,
) -> Option<u32> {
    let Some(n) = v else {
        return Some(default);
    };
    match u32::try_from(n) {
        Ok(v) if range.contains(&v) => Some(v),
        _ => {
            let name = key.rsplit('.').next().unwrap_or(key);
            let (lo, hi) = (*range.start(), *range.end());
            let (bound, whole) = if hi == u32::MAX {
                (
                    format!("at least {lo}"),
                    format!("a whole number of at least {lo}"),
                )
            } else {
                (
                    format!("between {lo} and {hi}"),
                    format!("a whole number from {lo} to {hi}"),
                )
            };
            errs.push(
                key,
                format!("{name} is {n}; it must be {bound}"),
                format!("set {name} to {whole}: {what} (default {default})"),
            );
            None
        }
    }
}

/// A request path for probes and scrapes: starts with "/", no whitespace or control
/// characters. `example` is shown in the fix.
pub(super) fn check_path(p: &str, key: &str, example: &str, errs: &mut Collector) -> bool {
    if !p.starts_with('/') {
        let fix = if p.is_empty() {
            format!("write an absolute path such as \"{example}\"")
        } else {
            format!("write it as an absolute path: \"/{p}\"")
        };
        errs.push(key, format!("path {p:?} does not start with \"/\""), fix);
        return false;
    }
    if let Some(bad) = p.chars().find(|c| c.is_whitespace() || c.is_control()) {
        errs.push(
            key,
            format!("path {p:?} contains {bad:?}, which cannot appear in a request line"),
            "remove the character, or percent-encode it (a space is %20)",
        );
        return false;
    }
    true
}

/// An optional path (`check_path`), or `default` when absent.
pub(super) fn http_path(
    v: Option<String>,
    key: &str,
    default: &str,
    errs: &mut Collector,
) -> Option<String> {
    match v {
        None => Some(default.to_string()),
        Some(p) => check_path(&p, key, default, errs).then_some(p),
    }
}

/// A duration that must be greater than zero (an interval or a period, not a timeout).
pub(super) fn nonzero_duration(
    v: Option<&toml::Value>,
    key: &str,
    default: Duration,
    errs: &mut Collector,
) -> Option<Duration> {
    let d = duration(v, key, default, true, errs)?;
    if d.is_zero() {
        let name = key.rsplit('.').next().unwrap_or(key);
        errs.push(
            key,
            format!("{name} is zero; it must be greater than zero"),
            format!(
                "use a positive duration such as \"{}\" (the default)",
                humantime::format_duration(default)
            ),
        );
        return None;
    }
    Some(d)
}

/// A list of non-empty, distinct strings.
pub(super) fn string_list(
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
pub(super) fn duration(
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
