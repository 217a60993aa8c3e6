//! Raw file values → validated [`Config`], collecting every problem.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::error::Collector;
use super::model::*;
use super::raw::{
    closest, is_bare_key, join, OrderedPrices, OrderedStrings, RawAdmin, RawConfig, RawHeaderMatch,
    RawHealth, RawKvEvents, RawLimits, RawMatch, RawPool, RawPrice, RawRoute, RawScrape, RawServer,
    RawTarget, RawTargetKvEvents, RawTimeouts,
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
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9091";
/// Default `w_cost` of the `adaptive` strategy (the price check uses it when unset).
pub const DEFAULT_ADAPTIVE_W_COST: f64 = 1.0;

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

    // One entry per [[routes]] table (None where it is invalid), so indices match the file.
    let routes: Vec<Option<Route>> = match raw.routes {
        None => vec![Some(Route {
            name: IMPLICIT_ROUTE_NAME.to_string(),
            matcher: RouteMatch::default(),
            targets: (0..count).collect(),
            strategy: StrategySpec {
                name: DEFAULT_STRATEGY,
                options: toml::Table::new(),
            },
            forward_client_auth: false,
            retries: DEFAULT_RETRIES,
            tokenizer: None,
            cache_controller: None,
        })],
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
            r.into_iter()
                .enumerate()
                .map(|(i, r)| route(r, &format!("routes[{i}]"), &names, &targets, host, errs))
                .collect()
        }
    };

    let health = health(raw.health, errs);
    let scrape = scrape(raw.metrics_scrape, errs);
    let admin = match raw.admin {
        None => Some(None),
        Some(a) => admin(a, server.as_ref(), host, errs).map(Some),
    };
    let catalog = catalog(raw.catalog, errs);
    let kv_events = kv_events(raw.kv_events, errs);
    let adaptive = AdaptiveConfig {
        enabled: raw
            .adaptive
            .and_then(|a| a.enabled)
            .unwrap_or(AdaptiveConfig::default().enabled),
    };
    // With an invalid [catalog] every price lookup would be suspect: its errors come first.
    if let Some(catalog) = &catalog {
        check_prices(&routes, &targets, catalog, errs);
    }

    if !errs.is_empty() {
        return None;
    }
    Some(Config {
        source: PathBuf::from(source),
        server: server?,
        targets: targets.into_iter().collect::<Option<Vec<_>>>()?,
        routes: routes.into_iter().collect::<Option<Vec<_>>>()?,
        health: health?,
        scrape: scrape?,
        admin: admin?,
        catalog: catalog?,
        adaptive,
        kv_events: kv_events?,
    })
}

// ---------------------------------------------------------------- health, scrape, admin

fn health(raw: Option<RawHealth>, errs: &mut Collector) -> Option<HealthConfig> {
    let d = HealthConfig::default();
    let Some(raw) = raw else {
        return Some(d);
    };
    let path = http_path(raw.path, "health.path", &d.path, errs);
    let interval = nonzero_duration(raw.interval.as_ref(), "health.interval", d.interval, errs);
    let timeout = duration(
        raw.timeout.as_ref(),
        "health.timeout",
        d.timeout,
        false,
        errs,
    );
    let timeout = match (interval, timeout) {
        (Some(i), Some(t)) if t >= i => {
            errs.push(
                "health.timeout",
                format!(
                    "timeout {}{} is not shorter than interval {}",
                    humantime::format_duration(t),
                    if raw.timeout.is_none() {
                        " (the default)"
                    } else {
                        ""
                    },
                    humantime::format_duration(i)
                ),
                format!(
                    "set timeout below the interval, e.g. timeout = \"{}\", or raise interval",
                    humantime::format_duration(half(i))
                ),
            );
            None
        }
        (_, t) => t,
    };
    let healthy_threshold = count(
        raw.healthy_threshold,
        "health.healthy_threshold",
        d.healthy_threshold,
        1..=u32::MAX,
        "the number of passing probes that bring a target back",
        errs,
    );
    let unhealthy_threshold = count(
        raw.unhealthy_threshold,
        "health.unhealthy_threshold",
        d.unhealthy_threshold,
        1..=u32::MAX,
        "the number of failing probes that take a target out",
        errs,
    );
    let failures = count(
        raw.failures,
        "health.failures",
        d.failures,
        0..=u32::MAX,
        "the number of failed requests in a row that eject a target; 0 turns passive ejection off",
        errs,
    );
    let ejection_time = nonzero_duration(
        raw.ejection_time.as_ref(),
        "health.ejection_time",
        d.ejection_time,
        errs,
    );
    let max_ejection_time = nonzero_duration(
        raw.max_ejection_time.as_ref(),
        "health.max_ejection_time",
        d.max_ejection_time,
        errs,
    );
    let max_ejection_time = match (ejection_time, max_ejection_time) {
        (Some(first), Some(max)) if max < first => {
            errs.push(
                "health.max_ejection_time",
                format!(
                    "max_ejection_time {}{} is shorter than ejection_time {}",
                    humantime::format_duration(max),
                    if raw.max_ejection_time.is_none() { " (the default)" } else { "" },
                    humantime::format_duration(first)
                ),
                format!(
                    "set max_ejection_time to at least ejection_time, e.g. max_ejection_time = \"{}\"",
                    humantime::format_duration(first * 30)
                ),
            );
            None
        }
        (_, m) => m,
    };
    let max_ejected_percent = count(
        raw.max_ejected_percent,
        "health.max_ejected_percent",
        d.max_ejected_percent,
        0..=100,
        "the largest share of a route's targets ejected at once, in percent",
        errs,
    );
    Some(HealthConfig {
        active: raw.active.unwrap_or(true),
        path: path?,
        interval: interval?,
        timeout: timeout?,
        healthy_threshold: healthy_threshold?,
        unhealthy_threshold: unhealthy_threshold?,
        failures: failures?,
        ejection_time: ejection_time?,
        max_ejection_time: max_ejection_time?,
        max_ejected_percent: max_ejected_percent?,
    })
}

fn scrape(raw: Option<RawScrape>, errs: &mut Collector) -> Option<ScrapeConfig> {
    let d = ScrapeConfig::default();
    let Some(raw) = raw else {
        return Some(d);
    };
    let path = http_path(raw.path, "metrics_scrape.path", &d.path, errs);
    let interval = nonzero_duration(
        raw.interval.as_ref(),
        "metrics_scrape.interval",
        d.interval,
        errs,
    );
    let timeout = duration(
        raw.timeout.as_ref(),
        "metrics_scrape.timeout",
        d.timeout,
        false,
        errs,
    );
    let timeout = match (interval, timeout) {
        (Some(i), Some(t)) if t > i => {
            errs.push(
                "metrics_scrape.timeout",
                format!(
                    "timeout {}{} is longer than interval {}",
                    humantime::format_duration(t),
                    if raw.timeout.is_none() {
                        " (the default)"
                    } else {
                        ""
                    },
                    humantime::format_duration(i)
                ),
                format!(
                    "set timeout to at most the interval, e.g. timeout = \"{}\", or raise interval",
                    humantime::format_duration(half(i))
                ),
            );
            None
        }
        (_, t) => t,
    };
    let stale_default = interval.map_or(d.stale_after, |i| i * 3);
    let stale_after = nonzero_duration(
        raw.stale_after.as_ref(),
        "metrics_scrape.stale_after",
        stale_default,
        errs,
    );
    let stale_after = match (interval, stale_after) {
        (Some(i), Some(s)) if s < i => {
            errs.push(
                "metrics_scrape.stale_after",
                format!(
                    "stale_after {} is shorter than interval {}, so every scrape would be stale before the next one",
                    humantime::format_duration(s),
                    humantime::format_duration(i)
                ),
                format!(
                    "set stale_after to at least the interval, e.g. stale_after = \"{}\" (the default, 3 × interval), or remove it",
                    humantime::format_duration(i * 3)
                ),
            );
            None
        }
        (_, s) => s,
    };
    Some(ScrapeConfig {
        enabled: raw.enabled.unwrap_or(true),
        path: path?,
        interval: interval?,
        timeout: timeout?,
        stale_after: stale_after?,
    })
}

/// Half a duration, rounded to whole milliseconds (at least 1ms), for examples in fixes.
fn half(d: Duration) -> Duration {
    Duration::from_millis((d.as_millis() / 2).max(1) as u64)
}

fn admin(
    raw: RawAdmin,
    server: Option<&ServerConfig>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<AdminConfig> {
    let listen = match raw.listen.as_deref() {
        None => Some(
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("valid default admin listen address"),
        ),
        Some(s) => socket_addr(s, "admin.listen", 9091, host, errs),
    };
    let listen = match (listen, server) {
        (Some(a), Some(s)) if overlaps(a, s.listen) => {
            errs.push(
                "admin.listen",
                format!(
                    "admin listener {a} overlaps the client listener server.listen = {}",
                    s.listen
                ),
                format!(
                    "give the admin listener its own port, e.g. listen = \"127.0.0.1:{}\"",
                    if s.listen.port() == 9091 { 9092 } else { 9091 }
                ),
            );
            None
        }
        (a, _) => a,
    };
    let token = match raw.token {
        None => Some(None),
        Some(t) => admin_token(&t, "admin.token", host, errs).map(Some),
    };
    Some(AdminConfig {
        listen: listen?,
        token: token?,
    })
}

/// Whether two listen addresses would claim the same port on a shared address.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `[admin].token`: non-empty after `${VAR}` expansion, without whitespace or control
/// characters. Messages never echo the value.
fn admin_token(value: &str, key: &str, host: &Host<'_>, errs: &mut Collector) -> Option<String> {
    const FIX_EMPTY: &str = "write a secret such as token = \"${ROLTER_ADMIN_TOKEN}\" (e.g. from `openssl rand -hex 32`), or remove `token` to leave the admin listener without authentication";
    if value.is_empty() {
        errs.push(key, "token is empty", FIX_EMPTY);
        return None;
    }
    let expanded = expand_env(value, key, host, errs)?;
    if expanded.is_empty() {
        errs.push(
            key,
            "token is empty after expanding its ${VAR} references",
            "set the referenced environment variable to a non-empty secret before starting rolter",
        );
        return None;
    }
    if expanded
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        errs.push(
            key,
            "token contains whitespace or a control character (space, tab, CR, LF, …), which cannot be sent in an Authorization header",
            "use a token of visible characters only, e.g. from `openssl rand -hex 32` (check the value of any ${VAR} it uses, including a trailing newline)",
        );
        return None;
    }
    Some(expanded)
}

fn catalog(raw: Option<OrderedPrices>, errs: &mut Collector) -> Option<HashMap<String, Price>> {
    let Some(OrderedPrices(raw)) = raw else {
        return Some(HashMap::new());
    };
    let mut out = HashMap::with_capacity(raw.len());
    let mut ok = true;
    for (name, p) in raw {
        let key = if is_bare_key(&name) {
            format!("catalog.{name}")
        } else {
            format!("catalog.{name:?}")
        };
        if name.is_empty() {
            errs.push(
                &key,
                "model name is empty",
                "name the entry after the model name the upstream expects, e.g. \"gpt-4o-mini\" = { input = 0.15, output = 0.60 }",
            );
            ok = false;
            continue;
        }
        let example = format!("{name:?} = {{ input = 0.15, output = 0.60 }}");
        match price(p, &key, &example, errs) {
            Some(p) => {
                out.insert(name, p);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

// ---------------------------------------------------------------- prices

/// Why a strategy ranks by price, if it does: `cheapest`; `adaptive` with `w_cost` > 0 or
/// with `cheapest` as its fallback; `failover` with `cheapest` within each tier.
fn price_need(spec: &StrategySpec) -> Option<String> {
    let canonical = |n: &str| {
        crate::strategy::registry::lookup(n).map_or(n.to_string(), |i| i.name.to_string())
    };
    let option_names_cheapest = |key: &str| {
        spec.options
            .get(key)
            .and_then(|v| v.as_str())
            .is_some_and(|n| canonical(n) == "cheapest")
    };
    match spec.name {
        "cheapest" => Some("strategy `cheapest`".to_string()),
        "adaptive" => {
            let w_cost = match spec.options.get("w_cost") {
                None => Some(DEFAULT_ADAPTIVE_W_COST),
                Some(toml::Value::Float(f)) => Some(*f),
                Some(toml::Value::Integer(n)) => Some(*n as f64),
                // Any other type is reported by the strategy's own option checks.
                Some(_) => None,
            };
            match w_cost {
                Some(w) if w > 0.0 => Some(format!(
                    "strategy `adaptive` with w_cost = {w}{}",
                    if spec.options.contains_key("w_cost") {
                        ""
                    } else {
                        " (the default)"
                    }
                )),
                _ if option_names_cheapest("fallback_strategy") => {
                    Some("strategy `adaptive` with fallback_strategy `cheapest`".to_string())
                }
                _ => None,
            }
        }
        "failover" if option_names_cheapest("within_tier") => {
            Some("strategy `failover` with within_tier `cheapest`".to_string())
        }
        _ => None,
    }
}

/// Every route that ranks by price (see [`price_need`]) must know a price for every model
/// each of its targets can serve on it, resolved as `crate::pricing::PriceBook` does: the
/// target's `price`, else `[catalog]` by upstream model name, else the built-in catalog.
/// `routes` and `targets` are indexed as in the file; `None` entries (invalid, already
/// reported) are skipped.
pub(crate) fn check_prices(
    routes: &[Option<Route>],
    targets: &[Option<Target>],
    catalog: &HashMap<String, Price>,
    errs: &mut Collector,
) {
    for (ri, route) in routes.iter().enumerate() {
        let Some(route) = route else { continue };
        let Some(need) = price_need(&route.strategy) else {
            continue;
        };
        let route_key = format!("routes[{ri}].strategy");
        let extra = if route.strategy.name == "adaptive" && need.contains("w_cost") {
            format!("; or set w_cost = 0 in {route_key} to rank without cost")
        } else {
            String::new()
        };
        for &id in &route.targets {
            let Some(t) = targets.get(id).and_then(Option::as_ref) else {
                continue;
            };
            if t.price.is_some() {
                continue;
            }
            let key = format!("targets[{id}].price");
            if t.models.is_empty() {
                errs.push(
                    &key,
                    format!(
                        "route `{}` uses {need} ({route_key}), which needs a price for every target, but target `{}` has no `price` and no `models` list, so it may serve any model at an unknown price",
                        route.name, t.name
                    ),
                    format!(
                        "add price = {{ input = 0.15, output = 0.60 }} (per 1M tokens) to target \"{}\", or list its `models` and give each a [catalog] entry such as \"model-name\" = {{ input = 0.15, output = 0.60 }}{extra}",
                        t.name
                    ),
                );
                continue;
            }
            for model in &t.models {
                if !route.matcher.models.is_empty() && !route.matcher.models.contains(model) {
                    continue;
                }
                let upstream = t.upstream_models.get(model).unwrap_or(model);
                if catalog.contains_key(upstream) || crate::pricing::builtin(upstream).is_some() {
                    continue;
                }
                let upstream_note = if upstream == model {
                    String::new()
                } else {
                    format!(" (upstream name `{upstream}`)")
                };
                errs.push(
                    &key,
                    format!(
                        "route `{}` uses {need} ({route_key}), which needs a price for every model, but target `{}` has no `price` and model `{model}`{upstream_note} is neither in [catalog] nor in the built-in catalog",
                        route.name, t.name
                    ),
                    format!(
                        "add price = {{ input = 0.15, output = 0.60 }} (per 1M tokens) to target \"{}\", or a [catalog] entry {upstream:?} = {{ input = ..., output = ... }}{extra}",
                        t.name
                    ),
                );
            }
        }
    }
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
    socket_addr(s, "server.listen", 8080, host, errs)
}

/// A listen address `host:port` (IP literal, or a name resolved once); `port` is the port
/// used in the examples of the fix.
fn socket_addr(
    s: &str,
    key: &str,
    port: u16,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<SocketAddr> {
    let fix = format!(
        "write an address and port such as \"127.0.0.1:{port}\", \"0.0.0.0:{port}\" or \"[::]:{port}\""
    );
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr);
    }
    let Some((name, port)) = s.rsplit_once(':') else {
        errs.push(key, format!("`{s}` has no port"), fix);
        return None;
    };
    let Ok(port) = port.parse::<u16>() else {
        errs.push(key, format!("`{s}` has an invalid port `{port}`"), fix);
        return None;
    };
    if name.is_empty() {
        errs.push(key, format!("`{s}` has no host"), fix);
        return None;
    }
    match (host.resolve)(name, port) {
        Ok(addrs) if !addrs.is_empty() => Some(addrs[0]),
        Ok(_) => {
            errs.push(key, format!("host `{name}` resolved to no address"), fix);
            None
        }
        Err(e) => {
            errs.push(key, format!("cannot resolve host `{name}`: {e}"), fix);
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
        Some(p) => price(
            p,
            &join(at, "price"),
            "price = { input = 0.15, output = 0.60 }",
            errs,
        )
        .map(Some),
    };

    let health_path = match raw.health_path {
        None => Some(None),
        // An empty path turns active checks off for this target.
        Some(p) if p.is_empty() => Some(Some(p)),
        Some(p) => check_path(&p, &join(at, "health_path"), "/health", errs).then_some(Some(p)),
    };
    let kv_events = target_kv_events(raw.kv_events, &join(at, "kv_events"), errs);
    let lmcache_instance = match raw.lmcache_instance {
        Some(id) if id.is_empty() => {
            errs.push(
                join(at, "lmcache_instance"),
                "lmcache_instance is empty",
                "write the instance id the engine registers with the LMCache controller (its LMCACHE_LMCACHE_INSTANCE_ID), or remove the key to use the target's name",
            );
            None
        }
        Some(id) => Some(Some(id)),
        None => Some(None),
    };
    let metrics_path = match raw.metrics_path {
        None => Some(None),
        Some(p) if p.is_empty() => {
            errs.push(
                join(at, "metrics_path"),
                "metrics_path is empty",
                "write a path such as \"/metrics\", remove the key to use [metrics_scrape].path, or set scrape = false to not scrape this target",
            );
            None
        }
        Some(p) => check_path(&p, &join(at, "metrics_path"), "/metrics", errs).then_some(Some(p)),
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

    let lmcache_instance = match lmcache_instance {
        Some(Some(id)) => Some(id),
        Some(None) => name.clone(),
        None => None,
    };
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
        health_path: health_path?,
        scrape: raw.scrape.unwrap_or(true),
        metrics_path: metrics_path?,
        timeouts: timeouts?,
        pool: pool?,
        kv_events: kv_events?,
        lmcache_instance: lmcache_instance?,
    })
}

/// A ZMQ endpoint the gateway connects to: `tcp://host:port`, `ipc://path` or `inproc://name`.
fn zmq_endpoint(
    v: Option<String>,
    key: &str,
    required: bool,
    errs: &mut Collector,
) -> Option<Option<String>> {
    match v {
        None if required => {
            errs.push(
                key,
                "[kv_events] has no `endpoint`",
                "set endpoint = \"tcp://<engine host>:5557\" (the engine's --kv-events-config endpoint, with its host instead of *)",
            );
            None
        }
        None => Some(None),
        Some(e) => {
            let ok = ["tcp://", "ipc://", "inproc://"]
                .iter()
                .any(|p| e.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
                && !e.contains('*');
            if ok {
                Some(Some(e))
            } else {
                errs.push(
                    key,
                    format!("`{e}` is not a ZMQ endpoint the gateway can connect to"),
                    "write tcp://host:port (no *: that is the engine's bind address), ipc://path or inproc://name",
                );
                None
            }
        }
    }
}

fn target_kv_events(
    raw: Option<RawTargetKvEvents>,
    at: &str,
    errs: &mut Collector,
) -> Option<Option<TargetKvEvents>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let endpoint = zmq_endpoint(raw.endpoint, &join(at, "endpoint"), true, errs);
    let replay = zmq_endpoint(
        raw.replay_endpoint,
        &join(at, "replay_endpoint"),
        false,
        errs,
    );
    Some(Some(TargetKvEvents {
        endpoint: endpoint??,
        replay_endpoint: replay?,
        topic: raw.topic.unwrap_or_default(),
    }))
}

fn kv_events(raw: Option<RawKvEvents>, errs: &mut Collector) -> Option<KvEventsConfig> {
    let d = KvEventsConfig::default();
    let Some(raw) = raw else {
        return Some(d);
    };
    let block_size = count(
        raw.block_size,
        "kv_events.block_size",
        d.block_size,
        1..=256,
        "tokens per index key",
        errs,
    );
    let max_blocks = count(
        raw.max_blocks_per_target,
        "kv_events.max_blocks_per_target",
        d.max_blocks_per_target,
        1..=u32::MAX,
        "engine blocks remembered per target",
        errs,
    );
    let stale_after = nonzero_duration(
        raw.stale_after.as_ref(),
        "kv_events.stale_after",
        d.stale_after,
        errs,
    );
    Some(KvEventsConfig {
        block_size: block_size?,
        max_blocks_per_target: max_blocks?,
        stale_after: stale_after?,
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

/// A price table; `example` shows a complete one in the fix (`price = { … }` on a target,
/// `"model" = { … }` in `[catalog]`).
fn price(raw: RawPrice, at: &str, example: &str, errs: &mut Collector) -> Option<Price> {
    let one = |v: Option<f64>, key: &str, errs: &mut Collector| match v {
        None => {
            errs.push(
                join(at, key),
                format!("price has no `{key}`"),
                format!("set both prices per 1M tokens, e.g. {example}"),
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
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Route> {
    let config_dir = host.config_dir;
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
    let tokenizer = match &strategy {
        Some(s) => local_tokenizer(s, &join(at, "strategy"), config_dir, errs),
        None => Some(None),
    };
    let cache_controller = match &strategy {
        Some(s) => cache_controller(s, &join(at, "strategy"), host, errs),
        None => Some(None),
    };

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
        tokenizer: tokenizer?,
        cache_controller: cache_controller?,
    })
}

/// The LMCache controller of an `lmcache_aware` strategy: required, a plain http:// URL
/// (the controller's API server speaks no TLS), resolved now. `Some(None)` for every other
/// strategy; `None` after an error.
fn cache_controller(
    spec: &StrategySpec,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<CacheController>> {
    if spec.name != "lmcache_aware" {
        return Some(None);
    }
    let key = join(key, "controller");
    let Some(written) = spec.options.get("controller").and_then(toml::Value::as_str) else {
        // A value of the wrong type was reported by the registry's option check.
        if !spec.options.contains_key("controller") {
            errs.push(
                key,
                "lmcache_aware has no `controller`",
                "set controller = \"http://<controller host>:9000\" (the LMCache controller's API server, `python -m lmcache.v1.api_server --port 9000`)",
            );
        }
        return None;
    };
    let url = target_url(written, &key, host, errs)?;
    if url.tls {
        errs.push(
            key,
            format!(
                "`{written}` is https://; the LMCache controller's API server speaks plain HTTP"
            ),
            "write the controller's address as http://host:port",
        );
        return None;
    }
    Some(Some(CacheController {
        url: url.written,
        addr: url.addr,
        host_header: url.host_header,
        base_path: url.base_path,
    }))
}

/// The local tokenizer of a `precise_cache_aware` strategy whose `tokenizer` option is a
/// path: loaded now, so a missing or broken file stops the configuration. `Some(None)` when
/// there is none to load; `None` after an error.
fn local_tokenizer(
    spec: &StrategySpec,
    key: &str,
    config_dir: Option<&Path>,
    errs: &mut Collector,
) -> Option<Option<Arc<crate::tokenize::LocalTokenizer>>> {
    if !matches!(spec.name, "precise_cache_aware" | "lmcache_aware") {
        return Some(None);
    }
    let written = spec
        .options
        .get("tokenizer")
        .and_then(toml::Value::as_str)
        .unwrap_or("engine");
    if written == "engine" {
        return Some(None);
    }
    let resolve = |w: &str| match config_dir {
        Some(dir) if Path::new(w).is_relative() => dir.join(w),
        _ => PathBuf::from(w),
    };
    let json = resolve(written);
    let cfg_written = spec
        .options
        .get("tokenizer_config")
        .and_then(toml::Value::as_str)
        .filter(|s| !s.is_empty());
    let cfg = match cfg_written {
        Some(c) => Some(resolve(c)),
        // The usual layout: tokenizer_config.json beside tokenizer.json.
        None => json
            .parent()
            .map(|d| d.join("tokenizer_config.json"))
            .filter(|p| p.is_file()),
    };
    match crate::tokenize::LocalTokenizer::from_files(&json, cfg.as_deref()) {
        Ok(t) => Some(Some(Arc::new(t))),
        Err(e) => {
            errs.push(
                join(key, "tokenizer"),
                format!("cannot load the tokenizer: {e}"),
                "point `tokenizer` at the model's tokenizer.json (relative paths are resolved against the configuration file's directory), with its tokenizer_config.json beside it or named by `tokenizer_config`, or set tokenizer = \"engine\" to ask the target's /tokenize endpoint",
            );
            None
        }
    }
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

/// An optional integer in `range`; `what` says what it counts, for the fix.
fn count(
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
fn check_path(p: &str, key: &str, example: &str, errs: &mut Collector) -> bool {
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
fn http_path(v: Option<String>, key: &str, default: &str, errs: &mut Collector) -> Option<String> {
    match v {
        None => Some(default.to_string()),
        Some(p) => check_path(&p, key, default, errs).then_some(p),
    }
}

/// A duration that must be greater than zero (an interval or a period, not a timeout).
fn nonzero_duration(
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
