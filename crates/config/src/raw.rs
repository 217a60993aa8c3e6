//! The file as written: serde types that accept anything well-typed, plus the parsing step
//! that turns TOML text into them while collecting syntax errors, type errors and unknown keys.
//!
//! Required fields are `Option` here so that a missing one is reported by validation
//! together with every other problem instead of stopping deserialization.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::error::Collector;

/// Top level of the file.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawConfig {
    pub server: Option<RawServer>,
    pub targets: Option<Vec<RawTarget>>,
    pub routes: Option<Vec<RawRoute>>,
    pub health: Option<RawHealth>,
    pub metrics_scrape: Option<RawScrape>,
    pub admin: Option<RawAdmin>,
    pub catalog: Option<OrderedPrices>,
    pub adaptive: Option<RawAdaptive>,
    pub kv_events: Option<RawKvEvents>,
    pub log: Option<RawLog>,
    pub state: Option<RawState>,
    pub auth: Option<RawAuth>,
    pub keys: Option<Vec<RawKey>>,
    pub classes: Option<Vec<RawClass>>,
    pub tracing: Option<RawTracing>,
}

/// `[tracing]`: exporting spans to an OpenTelemetry collector.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawTracing {
    pub endpoint: Option<String>,
    pub ca_file: Option<String>,
    pub sample: Option<f64>,
    pub parent_based: Option<bool>,
    pub headers: Option<OrderedStrings>,
    pub service_name: Option<String>,
    pub queue: Option<i64>,
    pub batch: Option<i64>,
    pub flush_interval: Option<toml::Value>,
    pub timeout: Option<toml::Value>,
}

/// One `[[classes]]` entry: a priority class.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawClass {
    pub name: Option<String>,
    pub rank: Option<i64>,
    pub reserve: Option<f64>,
}

/// `[auth]`: where client API keys come from besides `[[keys]]`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawAuth {
    pub keys_file: Option<String>,
    pub share_limits: Option<bool>,
}

/// One `[[keys]]` entry (in the configuration or the keys file).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawKey {
    pub name: Option<String>,
    pub hash: Option<String>,
    pub routes: Option<Vec<String>>,
    pub models: Option<Vec<String>>,
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub priority: Option<String>,
    pub set_priority: Option<bool>,
    pub share: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawState {
    pub backend: Option<String>,
    pub url: Option<String>,
    pub urls: Option<Vec<String>>,
    pub sentinel_master: Option<String>,
    pub cluster: Option<bool>,
    pub username_env: Option<String>,
    pub password_env: Option<String>,
    pub tls_ca_file: Option<String>,
    pub connect_timeout: Option<toml::Value>,
    pub command_timeout: Option<toml::Value>,
    pub pick_timeout: Option<toml::Value>,
    pub key_prefix: Option<String>,
    pub replica: Option<String>,
    pub sync_interval: Option<toml::Value>,
    pub retry_interval: Option<toml::Value>,
    pub max_items_per_second: Option<i64>,
    pub stream_maxlen: Option<i64>,
    pub share_load: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawLog {
    pub access: Option<String>,
    pub sample: Option<f64>,
    pub format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawKvEvents {
    pub block_size: Option<i64>,
    pub max_blocks_per_target: Option<i64>,
    pub stale_after: Option<toml::Value>,
    pub repair_timeout: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawTargetKvEvents {
    pub endpoint: Option<String>,
    pub replay_endpoint: Option<String>,
    pub topic: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawHealth {
    pub active: Option<bool>,
    pub path: Option<String>,
    pub interval: Option<toml::Value>,
    pub timeout: Option<toml::Value>,
    pub healthy_threshold: Option<i64>,
    pub unhealthy_threshold: Option<i64>,
    pub failures: Option<i64>,
    pub ejection_time: Option<toml::Value>,
    pub max_ejection_time: Option<toml::Value>,
    pub max_ejected_percent: Option<i64>,
    pub latency_factor: Option<f64>,
    pub latency_for: Option<toml::Value>,
    pub latency_min_samples: Option<i64>,
    pub slow_start_window: Option<toml::Value>,
    pub slow_start_aggression: Option<f64>,
    pub slow_start_min_weight: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawScrape {
    pub enabled: Option<bool>,
    pub path: Option<String>,
    pub interval: Option<toml::Value>,
    pub timeout: Option<toml::Value>,
    pub stale_after: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawAdaptive {
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawServer {
    pub listen: Option<String>,
    pub workers: Option<i64>,
    pub pin_workers: Option<bool>,
    pub driver: Option<String>,
    pub shutdown_grace: Option<toml::Value>,
    pub dns_refresh: Option<toml::Value>,
    pub nameservers: Option<Vec<String>>,
    pub max_connections: Option<i64>,
    pub limits: Option<RawLimits>,
    pub control_socket: Option<String>,
    pub underscores_in_headers: Option<String>,
    pub tls: Option<RawServerTls>,
    pub busy_poll: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawServerTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub handshake_timeout: Option<toml::Value>,
    pub min_version: Option<String>,
    pub sni: Option<Vec<RawSniCert>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawSniCert {
    pub names: Option<Vec<String>>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawLimits {
    pub max_head_bytes: Option<i64>,
    pub max_headers: Option<i64>,
    pub max_uri_bytes: Option<i64>,
    pub max_body_bytes: Option<i64>,
    pub head_timeout: Option<toml::Value>,
    pub body_timeout: Option<toml::Value>,
    pub keepalive_timeout: Option<toml::Value>,
    pub write_timeout: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawTarget {
    pub name: Option<String>,
    pub url: Option<String>,
    pub ca_file: Option<String>,
    pub weight: Option<f64>,
    pub models: Option<Vec<String>>,
    pub max_concurrent: Option<i64>,
    pub tier: Option<i64>,
    pub price: Option<RawPrice>,
    pub headers: Option<OrderedStrings>,
    pub upstream_models: Option<OrderedStrings>,
    pub health_path: Option<String>,
    pub scrape: Option<bool>,
    pub metrics_path: Option<String>,
    pub timeouts: Option<RawTimeouts>,
    pub pool: Option<RawPool>,
    pub kv_events: Option<RawTargetKvEvents>,
    pub lmcache_instance: Option<String>,
    pub bootstrap_port: Option<i64>,
    pub dp_size: Option<i64>,
    pub engine: Option<String>,
    pub discover: Option<RawDiscover>,
    pub priority_field: Option<String>,
    pub priority_values: Option<std::collections::BTreeMap<String, i64>>,
    pub api: Option<String>,
    pub lacks: Option<Vec<String>>,
    pub anthropic_version: Option<String>,
    pub stream_usage: Option<String>,
}

/// `targets[i].discover`: the target group's members come from DNS.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawDiscover {
    pub dns: Option<String>,
    pub srv: Option<String>,
    pub port: Option<i64>,
    pub https: Option<bool>,
    pub path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawPrice {
    pub input: Option<f64>,
    pub output: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawTimeouts {
    pub connect: Option<toml::Value>,
    pub first_byte: Option<toml::Value>,
    pub idle: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawPool {
    pub max_idle: Option<i64>,
    pub idle_timeout: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawRoute {
    pub name: Option<String>,
    pub targets: Option<Vec<String>>,
    /// A string (the strategy name) or a table (`name` plus the strategy's options).
    pub strategy: Option<toml::Value>,
    pub forward_client_auth: Option<bool>,
    pub retries: Option<i64>,
    pub retry_on: Option<Vec<String>>,
    pub per_try_timeout: Option<toml::Value>,
    pub deadline: Option<toml::Value>,
    pub retry_backoff: Option<toml::Value>,
    pub retry_backoff_max: Option<toml::Value>,
    pub retry_budget: Option<f64>,
    pub retry_budget_min: Option<i64>,
    pub retry_after_max: Option<toml::Value>,
    pub hedge_after: Option<toml::Value>,
    pub queue_max: Option<i64>,
    pub queue_timeout: Option<toml::Value>,
    #[serde(rename = "match")]
    pub matcher: Option<RawMatch>,
    pub disaggregation: Option<String>,
    pub prefill: Option<RawPdPool>,
    pub decode: Option<RawPdPool>,
    pub default_class: Option<String>,
    pub priority_header: Option<bool>,
    pub tenant_header: Option<String>,
    pub refuse_unmeetable: Option<bool>,
}

/// `routes.prefill` / `routes.decode`: one pool of a disaggregated route.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawPdPool {
    pub targets: Option<Vec<String>>,
    /// A string (the strategy name) or a table (`name` plus the strategy's options).
    pub strategy: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawMatch {
    pub paths: Option<Vec<String>>,
    pub passthrough: Option<Vec<String>>,
    pub models: Option<Vec<String>>,
    pub header: Option<RawHeaderMatch>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawHeaderMatch {
    pub name: Option<String>,
    pub value: Option<String>,
}

/// A TOML table of string values, in file order.
#[derive(Debug, Default)]
pub(crate) struct OrderedStrings(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for OrderedStrings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedStrings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    out.push((k, v));
                }
                Ok(OrderedStrings(out))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// `[catalog]`: upstream model name → price table, in file order.
#[derive(Debug, Default)]
pub(crate) struct OrderedPrices(pub Vec<(String, RawPrice)>);

impl<'de> Deserialize<'de> for OrderedPrices {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedPrices;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of model name = { input = …, output = … }")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, RawPrice>()? {
                    out.push((k, v));
                }
                Ok(OrderedPrices(out))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// Valid keys of each table, for unknown-key suggestions. Keep in sync with the structs above
/// (the `known_keys_match_structs` test checks it).
pub(crate) const TOP_KEYS: &[&str] = &[
    "server",
    "targets",
    "routes",
    "health",
    "metrics_scrape",
    "admin",
    "catalog",
    "adaptive",
    "kv_events",
    "log",
    "state",
    "auth",
    "keys",
    "classes",
    "tracing",
];
pub(crate) const TRACING_KEYS: &[&str] = &[
    "endpoint",
    "ca_file",
    "sample",
    "parent_based",
    "headers",
    "service_name",
    "queue",
    "batch",
    "flush_interval",
    "timeout",
];
pub(crate) const CLASS_KEYS: &[&str] = &["name", "rank", "reserve"];
pub(crate) const AUTH_KEYS: &[&str] = &["keys_file", "share_limits"];
pub(crate) const KEY_KEYS: &[&str] = &[
    "name",
    "hash",
    "routes",
    "models",
    "requests_per_minute",
    "tokens_per_minute",
    "priority",
    "set_priority",
    "share",
];
pub(crate) const STATE_KEYS: &[&str] = &[
    "backend",
    "url",
    "urls",
    "sentinel_master",
    "cluster",
    "username_env",
    "password_env",
    "tls_ca_file",
    "connect_timeout",
    "command_timeout",
    "pick_timeout",
    "key_prefix",
    "replica",
    "sync_interval",
    "retry_interval",
    "max_items_per_second",
    "stream_maxlen",
    "share_load",
];
pub(crate) const LOG_KEYS: &[&str] = &["access", "sample", "format"];
pub(crate) const SERVER_KEYS: &[&str] = &[
    "listen",
    "workers",
    "pin_workers",
    "control_socket",
    "driver",
    "shutdown_grace",
    "dns_refresh",
    "nameservers",
    "max_connections",
    "underscores_in_headers",
    "limits",
    "tls",
    "busy_poll",
];
pub(crate) const SERVER_TLS_KEYS: &[&str] = &[
    "cert_file",
    "key_file",
    "handshake_timeout",
    "min_version",
    "sni",
];
pub(crate) const SNI_KEYS: &[&str] = &["names", "cert_file", "key_file"];
pub(crate) const LIMITS_KEYS: &[&str] = &[
    "max_head_bytes",
    "max_headers",
    "max_uri_bytes",
    "max_body_bytes",
    "head_timeout",
    "body_timeout",
    "keepalive_timeout",
    "write_timeout",
];
pub(crate) const DISCOVER_KEYS: &[&str] = &["dns", "srv", "port", "https", "path"];
pub(crate) const TARGET_KEYS: &[&str] = &[
    "name",
    "url",
    "ca_file",
    "weight",
    "models",
    "max_concurrent",
    "tier",
    "price",
    "headers",
    "upstream_models",
    "health_path",
    "scrape",
    "metrics_path",
    "timeouts",
    "pool",
    "kv_events",
    "lmcache_instance",
    "bootstrap_port",
    "dp_size",
    "discover",
    "engine",
    "priority_field",
    "priority_values",
    "api",
    "lacks",
    "anthropic_version",
    "stream_usage",
];
pub(crate) const PRICE_KEYS: &[&str] = &["input", "output"];
pub(crate) const TIMEOUTS_KEYS: &[&str] = &["connect", "first_byte", "idle"];
pub(crate) const POOL_KEYS: &[&str] = &["max_idle", "idle_timeout"];
pub(crate) const ROUTE_KEYS: &[&str] = &[
    "name",
    "targets",
    "strategy",
    "forward_client_auth",
    "retries",
    "retry_on",
    "per_try_timeout",
    "deadline",
    "retry_backoff",
    "retry_backoff_max",
    "retry_budget",
    "retry_budget_min",
    "retry_after_max",
    "hedge_after",
    "queue_max",
    "queue_timeout",
    "match",
    "disaggregation",
    "prefill",
    "decode",
    "default_class",
    "priority_header",
    "tenant_header",
    "refuse_unmeetable",
];
pub(crate) const PD_POOL_KEYS: &[&str] = &["targets", "strategy"];
pub(crate) const MATCH_KEYS: &[&str] = &["paths", "passthrough", "models", "header"];
pub(crate) const HEADER_MATCH_KEYS: &[&str] = &["name", "value"];
pub(crate) const HEALTH_KEYS: &[&str] = &[
    "active",
    "path",
    "interval",
    "timeout",
    "healthy_threshold",
    "unhealthy_threshold",
    "failures",
    "ejection_time",
    "max_ejection_time",
    "max_ejected_percent",
    "latency_factor",
    "latency_for",
    "latency_min_samples",
    "slow_start_window",
    "slow_start_aggression",
    "slow_start_min_weight",
];
pub(crate) const SCRAPE_KEYS: &[&str] = &["enabled", "path", "interval", "timeout", "stale_after"];
pub(crate) const ADMIN_KEYS: &[&str] = &["listen", "token"];
pub(crate) const ADAPTIVE_KEYS: &[&str] = &["enabled"];
pub(crate) const KV_EVENTS_KEYS: &[&str] = &[
    "block_size",
    "max_blocks_per_target",
    "stale_after",
    "repair_timeout",
];
pub(crate) const TARGET_KV_EVENTS_KEYS: &[&str] = &["endpoint", "replay_endpoint", "topic"];

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn path_segments(path: &serde_ignored::Path<'_>, out: &mut Vec<Seg>) {
    use serde_ignored::Path;
    match path {
        Path::Root => {}
        Path::Seq { parent, index } => {
            path_segments(parent, out);
            out.push(Seg::Index(*index));
        }
        Path::Map { parent, key } => {
            path_segments(parent, out);
            out.push(Seg::Key(key.clone()));
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => path_segments(parent, out),
    }
}

/// Renders segments as `targets[1].timeouts.connect`.
fn render(segs: &[Seg]) -> String {
    let mut s = String::new();
    for seg in segs {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                if is_bare_key(k) {
                    s.push_str(k);
                } else {
                    s.push_str(&format!("{k:?}"));
                }
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

pub(crate) fn is_bare_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The table an unknown key sits in: its display name and its valid keys.
fn table_of(parent: &[Seg]) -> Option<(&'static str, &'static [&'static str])> {
    let names: Vec<&str> = parent
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .collect();
    Some(match names.as_slice() {
        [] => ("the top level", TOP_KEYS),
        ["server"] => ("[server]", SERVER_KEYS),
        ["server", "limits"] => ("[server.limits]", LIMITS_KEYS),
        ["server", "tls"] => ("[server.tls]", SERVER_TLS_KEYS),
        ["server", "tls", "sni"] => ("[[server.tls.sni]]", SNI_KEYS),
        ["targets"] => ("[[targets]]", TARGET_KEYS),
        ["targets", "price"] => ("targets.price", PRICE_KEYS),
        ["targets", "timeouts"] => ("[targets.timeouts]", TIMEOUTS_KEYS),
        ["targets", "pool"] => ("[targets.pool]", POOL_KEYS),
        ["targets", "kv_events"] => ("[targets.kv_events]", TARGET_KV_EVENTS_KEYS),
        ["targets", "discover"] => ("targets.discover", DISCOVER_KEYS),
        ["routes"] => ("[[routes]]", ROUTE_KEYS),
        ["routes", "match"] => ("[routes.match]", MATCH_KEYS),
        ["routes", "prefill"] => ("routes.prefill", PD_POOL_KEYS),
        ["routes", "decode"] => ("routes.decode", PD_POOL_KEYS),
        ["routes", "match", "header"] => ("routes.match.header", HEADER_MATCH_KEYS),
        ["health"] => ("[health]", HEALTH_KEYS),
        ["metrics_scrape"] => ("[metrics_scrape]", SCRAPE_KEYS),
        ["admin"] => ("[admin]", ADMIN_KEYS),
        ["adaptive"] => ("[adaptive]", ADAPTIVE_KEYS),
        ["kv_events"] => ("[kv_events]", KV_EVENTS_KEYS),
        ["log"] => ("[log]", LOG_KEYS),
        ["state"] => ("[state]", STATE_KEYS),
        ["auth"] => ("[auth]", AUTH_KEYS),
        ["keys"] => ("[[keys]]", KEY_KEYS),
        ["classes"] => ("[[classes]]", CLASS_KEYS),
        ["tracing"] => ("[tracing]", TRACING_KEYS),
        ["catalog", _] => ("a [catalog] entry", PRICE_KEYS),
        _ => return None,
    })
}

/// Levenshtein distance over chars, case-insensitive.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate closest to `word` (first one on ties).
pub(crate) fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .copied()
        .min_by_key(|c| edit_distance(word, c))
}

fn report_unknown(errs: &mut Collector, segs: &[Seg]) {
    let key = render(segs);
    let (last, parent) = match segs.split_last() {
        Some((Seg::Key(k), parent)) => (k.as_str(), parent),
        _ => {
            errs.push(key, "unexpected value", "remove it");
            return;
        }
    };
    match table_of(parent) {
        Some((table, valid)) => {
            let best = closest(last, valid).unwrap_or_default();
            errs.push(
                key,
                format!("unknown key `{last}` in {table}"),
                format!(
                    "did you mean `{best}`? rename it to `{best}` or remove it (valid keys: {})",
                    valid.join(", ")
                ),
            );
        }
        None => errs.push(
            key,
            format!("unknown key `{last}`"),
            "remove it".to_string(),
        ),
    }
}

/// 1-based line and column (in chars) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let mut offset = offset;
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// Deepest key path in `root` whose value (or key) contains `span`.
fn key_at(root: &DeTable<'_>, span: &std::ops::Range<usize>) -> Vec<Seg> {
    let mut out = Vec::new();
    find_in_table(root, span, &mut out);
    out
}

fn contains(outer: &std::ops::Range<usize>, inner: &std::ops::Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end.max(outer.start + 1)
}

fn find_in_table(t: &DeTable<'_>, span: &std::ops::Range<usize>, out: &mut Vec<Seg>) -> bool {
    for (k, v) in t.iter() {
        let in_value = contains(&v.span(), span);
        let in_key = contains(&k.span(), span);
        if in_value || in_key {
            out.push(Seg::Key(k.get_ref().to_string()));
            if in_value {
                find_in_value(v, span, out);
            }
            return true;
        }
    }
    // Tables defined with headers (`[server]`, `[[targets]]`) may span more than their
    // values; look inside nested tables and arrays even when the outer span does not match.
    for (k, v) in t.iter() {
        let mut sub = vec![Seg::Key(k.get_ref().to_string())];
        if find_in_value(v, span, &mut sub) && sub.len() > 1 {
            out.extend(sub);
            return true;
        }
    }
    false
}

fn find_in_value(
    v: &Spanned<DeValue<'_>>,
    span: &std::ops::Range<usize>,
    out: &mut Vec<Seg>,
) -> bool {
    match v.get_ref() {
        DeValue::Table(t) => find_in_table(t, span, out),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                let mut sub = vec![Seg::Index(i)];
                let inner = find_in_value(item, span, &mut sub);
                if inner || contains(&item.span(), span) {
                    out.extend(sub);
                    return true;
                }
            }
            false
        }
        _ => false,
    }
}

/// Rewrites serde's type vocabulary into TOML terms (and hides internal type names).
fn humanize(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(pos) = rest.find("struct Raw") {
        out.push_str(&rest[..pos]);
        out.push_str("a table");
        let after = &rest[pos + "struct Raw".len()..];
        let end = after
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out.replace("a sequence", "an array")
        .replace("a map", "a table")
        .replace("expected i64", "expected an integer")
        .replace("expected f64", "expected a number")
        .replace("expected a boolean", "expected a boolean (true or false)")
}

fn toml_error(
    errs: &mut Collector,
    text: &str,
    root: Option<&DeTable<'_>>,
    e: &toml::de::Error,
    syntax: bool,
) {
    let message = humanize(e.message().trim()).replace('\n', "; ");
    let expected = message
        .strip_prefix("invalid type: ")
        .and_then(|m| m.split_once(", expected "))
        .map(|(_, exp)| exp.to_string());
    match e.span() {
        Some(span) => {
            let (line, col) = line_col(text, span.start);
            let segs = root.map(|r| key_at(r, &span)).unwrap_or_default();
            let key = if segs.is_empty() {
                "(document)".to_string()
            } else {
                render(&segs)
            };
            let fix = match (&expected, syntax) {
                (Some(exp), _) => format!("write {exp} at line {line}, column {col}"),
                (None, true) => format!("fix the TOML syntax at line {line}, column {col}"),
                (None, false) => format!("correct the value at line {line}, column {col}"),
            };
            errs.push(key, format!("line {line}, column {col}: {message}"), fix);
        }
        None => errs.push(
            "(document)",
            message,
            "correct the file so it matches the format documented in config/vllm-fleet.toml",
        ),
    }
}

/// Parses `text` into a [`RawConfig`], pushing syntax errors, type errors and unknown keys into
/// `errs`. Returns `None` when the text could not be deserialized at all.
///
/// Serde stops at the first type error, so each one is reported, the key holding the
/// mistyped value is dropped from the document and the rest is deserialized again: every
/// type error is found, and what remains is validated as usual (the dropped keys count as
/// not set, without a second error at them).
pub(crate) fn parse(text: &str, errs: &mut Collector) -> Option<RawConfig> {
    let (mut root, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        let mut syntax_errors = syntax_errors;
        syntax_errors.sort_by_key(|e| e.span().map_or(usize::MAX, |s| s.start));
        for e in &syntax_errors {
            toml_error(errs, text, Some(root.get_ref()), e, true);
        }
        return None;
    }
    // Each pass drops one key, so this ends.
    loop {
        let de = toml::de::Deserializer::from(root.clone());
        let mut unknown: Vec<Vec<Seg>> = Vec::new();
        let result: Result<RawConfig, _> = serde_ignored::deserialize(de, |path| {
            let mut segs = Vec::new();
            path_segments(&path, &mut segs);
            unknown.push(segs);
        });
        let e = match result {
            Ok(raw) => {
                for segs in &unknown {
                    report_unknown(errs, segs);
                }
                return Some(raw);
            }
            Err(e) => e,
        };
        toml_error(errs, text, Some(root.get_ref()), &e, false);
        let segs = e
            .span()
            .map(|span| key_at(root.get_ref(), &span))
            .unwrap_or_default();
        match drop_key(root.get_mut(), &segs) {
            Some(dropped) => errs.drop_under(render(&segs[..dropped])),
            None => {
                for segs in &unknown {
                    report_unknown(errs, segs);
                }
                return None;
            }
        }
    }
}

/// Removes the innermost key along `segs` (an array element is dropped with the key that
/// holds the array, so later indices stay as written). Returns how many segments lead to
/// the removed key, or `None` when there is no key to remove.
fn drop_key(root: &mut DeTable<'_>, segs: &[Seg]) -> Option<usize> {
    let last = segs.iter().rposition(|s| matches!(s, Seg::Key(_)))?;
    drop_in_table(root, &segs[..=last]).then_some(last + 1)
}

/// Removes the key `segs` ends with (the only key, or the last, in `segs`).
fn drop_in_table(table: &mut DeTable<'_>, segs: &[Seg]) -> bool {
    match segs {
        [Seg::Key(k)] => table.remove(k.as_str()).is_some(),
        [Seg::Key(k), rest @ ..] => table
            .get_mut(k.as_str())
            .is_some_and(|v| drop_in_value(v.get_mut(), rest)),
        _ => false,
    }
}

fn drop_in_value(value: &mut DeValue<'_>, segs: &[Seg]) -> bool {
    match (value, segs) {
        (DeValue::Table(t), _) => drop_in_table(t, segs),
        (DeValue::Array(a), [Seg::Index(i), rest @ ..]) => a
            .get_mut(*i)
            .is_some_and(|item| drop_in_value(item.get_mut(), rest)),
        _ => false,
    }
}

/// Renders a key path relative to a prefix, for validation messages.
pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else if key.starts_with('[') {
        format!("{prefix}{key}")
    } else if is_bare_key(key) {
        format!("{prefix}.{key}")
    } else {
        format!("{prefix}.{key:?}")
    }
}
