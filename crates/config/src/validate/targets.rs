//! `[[targets]]`: URL, TLS trust, headers, model mapping, timeouts, pool, price.

use super::common::*;
use super::kv::target_kv_events;

/// The `[[targets]]` tables; an error when there are none (validation goes on without).
pub(super) fn target_tables(raw: Option<Vec<RawTarget>>, errs: &mut Collector) -> Vec<RawTarget> {
    match raw {
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
    }
}

/// One `[[targets]]` table at `at` (`targets[i]`); `None` when any key has an error.
pub(super) fn target(
    raw: RawTarget,
    at: &str,
    discover: Option<&DiscoverSpec>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Target> {
    let api = target_api(&raw, at, errs);
    let name = target_name(raw.name, at, errs);
    let url = match (discover, &raw.discover) {
        (Some(spec), Some(d)) => Some(discover_url(spec, d)),
        _ => required_url(raw.url, at, host, errs),
    };
    let ca = match raw.ca_file {
        None => Some(None),
        Some(f) => ca_file(&f, url.as_ref(), &join(at, "ca_file"), host, errs).map(Some),
    };
    let weight = weight(raw.weight, at, errs);
    let models = string_list(raw.models, &join(at, "models"), "model name", errs);
    let max_concurrent = max_concurrent(raw.max_concurrent, at, errs);
    let tier = tier(raw.tier, at, errs);
    let price = target_price(raw.price, at, errs);
    let health_path = health_path(raw.health_path, at, errs);
    let kv_events = target_kv_events(raw.kv_events, &join(at, "kv_events"), errs);
    let lmcache_instance = lmcache_instance(raw.lmcache_instance, at, errs);
    let metrics_path = metrics_path(raw.metrics_path, at, errs);
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
    let bootstrap_port = bootstrap_port(raw.bootstrap_port, at, errs);
    let engine = engine_kind(raw.engine.as_deref(), at, errs);
    let stream_usage = stream_usage(raw.stream_usage.as_deref(), at, errs);

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
        dns_name: url.dns_name,
        tls: url.tls,
        server_name: url.server_name,
        ca_file,
        ca_certs: ca_certs.unwrap_or_default(),
        host_header: url.host_header,
        base_path: url.base_path,
        weight: weight?,
        models: models?,
        upstream_models: upstream_models?.into_iter().collect(),
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
        bootstrap_port: bootstrap_port?,
        engine: engine?,
        // Set when `dp_size` makes one target per rank.
        dp: None,
        // Set for each member when a `discover` entry becomes its members.
        member_of: None,
        // Set from `admission::target`.
        priority: None,
        api: api?,
        stream_usage: stream_usage?,
    })
}

/// `targets[i].api`, `lacks` and `anthropic_version`.
fn target_api(raw: &RawTarget, at: &str, errs: &mut Collector) -> Option<TargetApi> {
    let mut api = TargetApi::default();
    match raw.api.as_deref() {
        None | Some("openai") => {
            if raw.anthropic_version.is_some() {
                errs.push(
                    join(at, "anthropic_version"),
                    "anthropic_version is set on a target that speaks OpenAI's API",
                    "add api = \"anthropic\", or remove anthropic_version",
                );
                return None;
            }
        }
        Some("anthropic") => {
            if raw.lacks.is_some() {
                errs.push(
                    join(at, "lacks"),
                    "lacks is set on a target that speaks Anthropic's API",
                    "remove lacks: an Anthropic target speaks Messages only, and OpenAI chat requests to it are translated",
                );
                return None;
            }
            let version = match raw.anthropic_version.as_deref() {
                None => DEFAULT_ANTHROPIC_VERSION.to_string(),
                Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()) => {
                    v.to_string()
                }
                Some(v) => {
                    errs.push(
                        join(at, "anthropic_version"),
                        format!(
                            "anthropic_version is `{v}`; it must be a header value without spaces"
                        ),
                        "write the API version, e.g. anthropic_version = \"2023-06-01\"",
                    );
                    return None;
                }
            };
            api.anthropic = Some(AnthropicApi { version });
        }
        Some(other) => {
            errs.push(
                join(at, "api"),
                format!("unknown api `{other}`"),
                "write api = \"openai\" (the default: chat, completions, and what `lacks` does not name) or \"anthropic\" (Anthropic's Messages API)",
            );
            return None;
        }
    }
    let mut ok = true;
    for (i, what) in raw.lacks.iter().flatten().enumerate() {
        match what.as_str() {
            "messages" => api.lacks_messages = true,
            "responses" => api.lacks_responses = true,
            other => {
                ok = false;
                errs.push(
                    format!("{at}.lacks[{i}]"),
                    format!("unknown API `{other}` in lacks"),
                    "list what the engine does not serve: \"messages\" (/v1/messages, translated to chat) or \"responses\" (/v1/responses, translated to chat)",
                );
            }
        }
    }
    ok.then_some(api)
}

/// `targets[i].discover`: `Some(None)` when the entry has none, `None` when it is wrong.
/// An entry with `discover` has no `url`, and none of the settings that name one engine
/// (`dp_size`, `kv_events`, `lmcache_instance`).
pub(super) fn discover_spec(
    raw: &RawTarget,
    at: &str,
    errs: &mut Collector,
) -> Option<Option<DiscoverSpec>> {
    let Some(d) = &raw.discover else {
        return Some(None);
    };
    let key = join(at, "discover");
    let mut ok = true;
    let mut refuse = |what: &str, message: String, fix: &str| {
        ok = false;
        let at = if what.is_empty() {
            key.clone()
        } else {
            join(&key, what)
        };
        errs.push(at, message, fix);
    };
    if raw.url.is_some() {
        refuse(
            "",
            "a target has both `url` and `discover`".into(),
            "keep `url` for one engine, or `discover` for a group found by DNS",
        );
    }
    for (set, what) in [
        (raw.dp_size.is_some_and(|n| n != 1), "dp_size"),
        (raw.kv_events.is_some(), "kv_events"),
        (raw.lmcache_instance.is_some(), "lmcache_instance"),
    ] {
        if set {
            refuse(
                "",
                format!("`{what}` names one engine, and a `discover` entry stands for many"),
                "list such engines one by one with `url`",
            );
        }
    }
    if let Some(p) = &d.path {
        if !p.is_empty() && (!p.starts_with('/') || p.contains(['?', '#', ' '])) {
            refuse(
                "path",
                format!("path is `{p}`; it must be empty or start with /"),
                "write the engines' base path, e.g. path = \"/v1\", or leave it out",
            );
        }
    }
    let spec = match (&d.dns, &d.srv, d.port) {
        (Some(name), None, Some(p)) if (1..=65535).contains(&p) => DiscoverSpec::Addresses {
            name: name.clone(),
            port: p as u16,
        },
        (Some(_), None, Some(p)) => {
            refuse(
                "port",
                format!("port is {p}; it must be a TCP port, 1 to 65535"),
                "set the engines' port, e.g. port = 8000",
            );
            return None;
        }
        (Some(_), None, None) => {
            refuse(
                "port",
                "`discover.dns` needs the engines' port".into(),
                "add port = 8000 (or the port the engines listen on)",
            );
            return None;
        }
        (None, Some(name), None) => DiscoverSpec::Srv { name: name.clone() },
        (None, Some(_), Some(_)) => {
            refuse(
                "port",
                "an SRV record carries its own port".into(),
                "remove `port`, or use `dns` for A/AAAA records and a fixed port",
            );
            return None;
        }
        _ => {
            refuse(
                "",
                "`discover` needs exactly one of `dns` (A/AAAA records) and `srv`".into(),
                "write discover = { dns = \"vllm.default.svc.cluster.local\", port = 8000 } \
                 or discover = { srv = \"_http._tcp.vllm.default.svc.cluster.local\" }",
            );
            return None;
        }
    };
    if hickory_proto::rr::Name::from_ascii(spec.name()).is_err() || spec.name().is_empty() {
        refuse(
            if d.dns.is_some() { "dns" } else { "srv" },
            format!("`{}` is not a DNS name", spec.name()),
            "write the name as the DNS server answers it, e.g. vllm.default.svc.cluster.local",
        );
    }
    ok.then_some(Some(spec))
}

/// Looks every `discover` entry up and puts its members in its place: `groups[i]` is
/// target `i`'s spec. A lookup that finds nothing is an error at the entry's key.
pub(super) fn discover_members(
    config: &mut Config,
    specs: &[Option<DiscoverSpec>],
    host: &Host<'_>,
    errs: &mut Collector,
) {
    let groups: Vec<DiscoveryGroup> = specs
        .iter()
        .enumerate()
        .filter_map(|(i, spec)| {
            let spec = spec.clone()?;
            let mut template = config.targets[i].clone();
            template.member_of = Some(template.name.clone());
            config.targets[i].member_of = Some(template.name.clone());
            Some(DiscoveryGroup {
                name: template.name.clone(),
                at: format!("targets[{i}]"),
                spec,
                template,
                members: Vec::new(),
            })
        })
        .collect();
    config.discovery = groups.clone();
    for g in groups {
        match (host.discover)(&g.name, &g.spec, &config.server.nameservers) {
            Ok(members) => match config.rediscovered(&g.name, members) {
                Some(next) => *config = next,
                None => errs.push(
                    join(&g.at, "discover"),
                    format!("{}: the answer has no address", g.spec),
                    "check the name and that the engines are up (dig it at the nameserver)",
                ),
            },
            Err(e) => errs.push(
                join(&g.at, "discover"),
                format!("looking up {} failed: {e}", g.spec),
                "check the name, that the nameserver answers (server.nameservers or \
                 /etc/resolv.conf) and that the engines are registered",
            ),
        }
    }
}

/// The URL parts every member of a `discover` entry shares (each member's own address is
/// set when the entry becomes its members): the looked-up name is the TLS server name and
/// the `Host` header, as for a URL with that name.
fn discover_url(spec: &DiscoverSpec, d: &RawDiscover) -> ParsedUrl {
    let tls = d.https.unwrap_or(false);
    let scheme = if tls { "https" } else { "http" };
    let base_path = d.path.clone().unwrap_or_default();
    let base_path = base_path.trim_end_matches('/').to_string();
    let (name, port) = match spec {
        DiscoverSpec::Addresses { name, port } => (name.trim_end_matches('.'), *port),
        DiscoverSpec::Srv { name } => (name.trim_end_matches('.'), if tls { 443 } else { 80 }),
    };
    ParsedUrl {
        written: format!("{scheme}://{name}:{port}{base_path} (discovered: {spec})"),
        addr: SocketAddr::from(([0, 0, 0, 0], port)),
        dns_name: None,
        tls,
        server_name: name.to_string(),
        host_header: format!("{name}:{port}"),
        base_path,
    }
}

/// `bootstrap_port`: a TCP port, default [`DEFAULT_BOOTSTRAP_PORT`].
fn bootstrap_port(v: Option<i64>, at: &str, errs: &mut Collector) -> Option<u16> {
    match v {
        None => Some(DEFAULT_BOOTSTRAP_PORT),
        Some(p) if (1..=65535).contains(&p) => Some(p as u16),
        Some(p) => {
            errs.push(
                join(at, "bootstrap_port"),
                format!("bootstrap_port is {p}; it must be a TCP port, 1 to 65535"),
                format!("set it to the engine's --disaggregation-bootstrap-port (SGLang's default is {DEFAULT_BOOTSTRAP_PORT})"),
            );
            None
        }
    }
}

/// Most data-parallel ranks one target may declare.
pub const MAX_DP_SIZE: i64 = 256;

/// `dp_size`: the engine's data-parallel ranks behind its address (default 1).
pub(super) fn dp_size(v: Option<i64>, at: &str, errs: &mut Collector) -> u32 {
    match v {
        None => 1,
        Some(n) if (1..=MAX_DP_SIZE).contains(&n) => n as u32,
        Some(n) => {
            errs.push(
                join(at, "dp_size"),
                format!("dp_size is {n}; it must be between 1 and {MAX_DP_SIZE}"),
                "set dp_size to the engine's --data-parallel-size (vLLM) or --dp-size (SGLang)",
            );
            1
        }
    }
}

/// `engine`: whose conventions the target follows (default vLLM's; SGLang's for a target
/// of a `disaggregation = "sglang"` route).
fn engine_kind(v: Option<&str>, at: &str, errs: &mut Collector) -> Option<EngineKind> {
    match v {
        None | Some("vllm") => Some(EngineKind::Vllm),
        Some("sglang") => Some(EngineKind::Sglang),
        Some(other) => {
            errs.push(
                join(at, "engine"),
                format!("unknown engine `{other}`"),
                "write engine = \"vllm\" (a data-parallel rank goes in the X-data-parallel-rank header) or \"sglang\" (in the body's data_parallel_rank field)",
            );
            None
        }
    }
}

/// `targets[i].stream_usage`: `"ask"` (the default) or `"count"`.
fn stream_usage(v: Option<&str>, at: &str, errs: &mut Collector) -> Option<StreamUsage> {
    match v {
        None | Some("ask") => Some(StreamUsage::Ask),
        Some("count") => Some(StreamUsage::Count),
        Some(other) => {
            errs.push(
                join(at, "stream_usage"),
                format!("unknown stream_usage `{other}`"),
                "write stream_usage = \"ask\" (the default: streams ask the engine for usage, kept from clients that did not ask) or \"count\" (for an engine that refuses stream_options: its content deltas are counted)",
            );
            None
        }
    }
}

/// A target's `name`: required, and a valid target name ([`check_name`]).
fn target_name(v: Option<String>, at: &str, errs: &mut Collector) -> Option<String> {
    match v {
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
    }
}

/// A target's `url`: required, and an upstream base URL ([`target_url`]).
fn required_url(
    v: Option<String>,
    at: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<ParsedUrl> {
    let Some(u) = v else {
        errs.push(
            join(at, "url"),
            "target has no `url`",
            "add url = \"http://host:port\" (or https://host/base-path)",
        );
        return None;
    };
    target_url(&u, &join(at, "url"), host, errs)
}

/// A target's `weight`: finite and not negative, 1.0 when absent (0 drains the target).
fn weight(v: Option<f64>, at: &str, errs: &mut Collector) -> Option<f64> {
    match v {
        None => Some(1.0),
        Some(w) if w.is_nan() || w.is_infinite() => {
            errs.push(
                join(at, "weight"),
                format!("weight is {w}"),
                "use a finite weight such as 1.0 (or 0 to drain the target)",
            );
            None
        }
        Some(w) if w < 0.0 => {
            errs.push(
                join(at, "weight"),
                format!("weight is {w}; it must not be negative"),
                "use a positive weight such as 1.0, or 0 to drain the target (it then gets no traffic)",
            );
            None
        }
        // 0 drains the target: it stays configured, probed and scraped, and gets no picks.
        Some(w) => Some(w),
    }
}

/// A target's `max_concurrent`: from 1 to `u32::MAX`; `Some(None)` (no limit) when absent.
fn max_concurrent(v: Option<i64>, at: &str, errs: &mut Collector) -> Option<Option<u32>> {
    match v {
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
    }
}

/// A target's failover `tier`: from 0 (primary, the default) to `u32::MAX`.
fn tier(v: Option<i64>, at: &str, errs: &mut Collector) -> Option<u32> {
    match v {
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
    }
}

/// A target's `price` table ([`price`]); `Some(None)` when absent.
fn target_price(v: Option<RawPrice>, at: &str, errs: &mut Collector) -> Option<Option<Price>> {
    let Some(p) = v else {
        return Some(None);
    };
    price(
        p,
        &join(at, "price"),
        "price = { input = 0.15, output = 0.60 }",
        errs,
    )
    .map(Some)
}

/// A target's `health_path`: a request path, or empty to turn active checks off for it.
fn health_path(v: Option<String>, at: &str, errs: &mut Collector) -> Option<Option<String>> {
    match v {
        None => Some(None),
        // An empty path turns active checks off for this target.
        Some(p) if p.is_empty() => Some(Some(p)),
        Some(p) => check_path(&p, &join(at, "health_path"), "/health", errs).then_some(Some(p)),
    }
}

/// A target's `lmcache_instance`: not empty; `Some(None)` when absent (the target's name).
fn lmcache_instance(v: Option<String>, at: &str, errs: &mut Collector) -> Option<Option<String>> {
    match v {
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
    }
}

/// A target's `metrics_path`: a non-empty request path; `Some(None)` when absent.
fn metrics_path(v: Option<String>, at: &str, errs: &mut Collector) -> Option<Option<String>> {
    match v {
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
    }
}

/// A name of a target or route: non-empty, `[A-Za-z0-9._-]+` for targets.
pub(super) fn check_name(n: &str, key: &str, what: &str, errs: &mut Collector) -> bool {
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

pub(super) struct ParsedUrl {
    pub(super) written: String,
    pub(super) addr: SocketAddr,
    pub(super) dns_name: Option<String>,
    pub(super) tls: bool,
    pub(super) server_name: String,
    pub(super) host_header: String,
    pub(super) base_path: String,
}

/// Written in the fixes for a target's `url`.
const URL_EXAMPLE: &str = "e.g. \"http://10.0.0.11:8000\" or \"https://api.openai.com/v1\"";

/// A target's `url` at `key`: an absolute http:// or https:// URL with a host, and an
/// optional port and base path; a host name is resolved now.
pub(super) fn target_url(
    written: &str,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<ParsedUrl> {
    let (u, tls) = parse_target_url(written, key, errs)?;
    let ok = check_url_extras(&u, written, key, errs);
    let Some(url_host) = u.host() else {
        errs.push(
            key,
            format!("`{written}` has no host"),
            format!("write a URL with a host, {URL_EXAMPLE}"),
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
    let addr = upstream_addr(&url_host, port, key, host, errs)?;
    let dns_name = match url_host {
        url::Host::Domain(d) => Some(d.to_string()),
        _ => None,
    };
    Some(ParsedUrl {
        written: written.to_string(),
        addr,
        dns_name,
        tls,
        server_name,
        host_header,
        base_path,
    })
}

/// Parses a target's URL: not empty, with a scheme, valid, and http:// or https://
/// (the `bool` is true for https://).
fn parse_target_url(written: &str, key: &str, errs: &mut Collector) -> Option<(url::Url, bool)> {
    if written.is_empty() {
        errs.push(
            key,
            "url is empty",
            format!("write the upstream base URL, {URL_EXAMPLE}"),
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
                format!("write an absolute http:// or https:// URL, {URL_EXAMPLE}"),
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
                format!("use http:// or https://, {URL_EXAMPLE}"),
            );
            return None;
        }
    };
    Some((u, tls))
}

/// Reports each part a target's URL may not have (credentials, a query, a fragment);
/// true when it has none.
fn check_url_extras(u: &url::Url, written: &str, key: &str, errs: &mut Collector) -> bool {
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
    ok
}

/// The upstream's socket address: an IP literal as written, a host name resolved now (its
/// first address).
fn upstream_addr(
    url_host: &url::Host<&str>,
    port: u16,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<SocketAddr> {
    let d = match url_host {
        url::Host::Ipv4(ip) => return Some(SocketAddr::new(IpAddr::V4(*ip), port)),
        url::Host::Ipv6(ip) => return Some(SocketAddr::new(IpAddr::V6(*ip), port)),
        url::Host::Domain(d) => *d,
    };
    match (host.resolve)(d, port) {
        Ok(addrs) if !addrs.is_empty() => Some(addrs[0]),
        Ok(_) => {
            errs.push(
                key,
                format!("host `{d}` resolved to no address"),
                format!("check the host name `{d}` and DNS, or use an IP address"),
            );
            None
        }
        Err(e) => {
            errs.push(
                key,
                format!("cannot resolve host `{d}`: {e}"),
                format!("check the host name `{d}` and that DNS works on this machine, or use an IP address"),
            );
            None
        }
    }
}

/// A target's `ca_file`: only for https:// URLs; a readable PEM file holding at least one
/// certificate that is usable as a trust anchor. Returns the resolved path and the
/// certificates (DER). `url` is `None` when the URL itself was invalid (already reported).
pub(super) fn ca_file(
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
    let path = config_path(host.config_dir, written);
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
pub(super) fn price(raw: RawPrice, at: &str, example: &str, errs: &mut Collector) -> Option<Price> {
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
pub(super) fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

pub(super) fn check_header_name(name: &str, key: &str, errs: &mut Collector) -> bool {
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
pub(super) fn check_header_value(value: &str, key: &str, errs: &mut Collector) -> bool {
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
pub(super) fn expand_env(
    value: &str,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<String> {
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

pub(super) fn target_headers(
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
                format!("header `{name}` is one the gateway manages itself (hop-by-hop, framing, forwarding, or the request's x-request-id)"),
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

pub(super) fn upstream_models(
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

pub(super) fn timeouts(
    raw: RawTimeouts,
    at: &str,
    errs: &mut Collector,
) -> Option<UpstreamTimeouts> {
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

pub(super) fn pool(raw: RawPool, at: &str, errs: &mut Collector) -> Option<PoolConfig> {
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
pub(super) fn raw_close(word: &str, best: &str) -> bool {
    crate::raw::edit_distance(word, best) <= (word.chars().count() / 2).max(1)
}

/// Reports every repeated non-empty name in `names` (as written, valid or not).
pub(super) fn check_unique_names(
    names: &[Option<String>],
    list: &str,
    what: &str,
    errs: &mut Collector,
) {
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
