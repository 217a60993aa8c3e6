//! `[[routes]]`: targets, match rules, retries and the strategy with what it needs; the
//! implicit "default" route when the file has no `routes`.

use super::common::*;
use super::pool::{route_targets, strategy};
use super::retry::retry_policy;
use super::targets::{
    check_header_name, check_header_value, check_name, check_unique_names, target_url,
};
#[cfg(feature = "local-tokenizer")]
use std::sync::Arc;

/// One entry per `[[routes]]` table (`None` where it is invalid), so indices match the
/// file; without `routes`, the implicit route over every target. `names` and `targets`
/// hold one entry per `[[targets]]` table.
pub(super) fn routes(
    raw: Option<Vec<RawRoute>>,
    names: &[Option<String>],
    targets: &[Option<Target>],
    host: &Host<'_>,
    errs: &mut Collector,
) -> Vec<Option<Route>> {
    match raw {
        None => vec![Some(implicit_route(targets.len()))],
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
            let mut pools = Vec::new();
            let mut out: Vec<Option<Route>> = r
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    let (route, pool) =
                        route(r, &format!("routes[{i}]"), names, targets, host, errs)?;
                    if let Some(pool) = pool {
                        pools.push((i, pool));
                    }
                    Some(route)
                })
                .collect();
            // The prefill pools follow the file's routes, so a route's index is its place in
            // the file.
            for (i, mut pool) in pools {
                if route_names.iter().flatten().any(|n| *n == pool.name) {
                    errs.push(
                        format!("routes[{i}].name"),
                        format!("the name `{}` is taken by the prefill pool of this route", pool.name),
                        "rename the other route: a disaggregated route's prefill pool is named `<route>/prefill` in metrics and the admin API",
                    );
                }
                pool.prefill_of = Some(i);
                let at = out.len();
                if let Some(Some(main)) = out.get_mut(i) {
                    if let Some(d) = &mut main.disaggregation {
                        d.prefill_route = at;
                    }
                }
                out.push(Some(pool));
            }
            out
        }
    }
}

/// The route used when the file has no `routes`: named [`IMPLICIT_ROUTE_NAME`], over all
/// `count` targets, with the default strategy and retries.
fn implicit_route(count: usize) -> Route {
    Route {
        name: IMPLICIT_ROUTE_NAME.to_string(),
        matcher: RouteMatch::default(),
        targets: (0..count).collect(),
        strategy: StrategySpec::with_defaults(DEFAULT_STRATEGY)
            .expect("the default strategy is registered"),
        forward_client_auth: false,
        retries: DEFAULT_RETRIES,
        retry: RetryPolicy::default(),
        queue: None,
        admission: RouteAdmission::default(),
        #[cfg(feature = "local-tokenizer")]
        tokenizer: None,
        cache_controller: None,
        disaggregation: None,
        prefill_of: None,
    }
}

/// One `[[routes]]` table, with its prefill pool's route when it is disaggregated.
pub(super) fn route(
    mut raw: RawRoute,
    at: &str,
    names: &[Option<String>],
    targets: &[Option<Target>],
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<(Route, Option<Route>)> {
    let retry = retry_policy(&raw, at, errs);
    let name = match raw.name.take() {
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
    let pd = super::pd::pools(&mut raw, at, names, errs);
    let (route_targets, strategy, prefill) = match pd {
        None => (None, None, None),
        Some(None) => (
            route_targets(raw.targets.take(), &join(at, "targets"), names, errs),
            strategy(raw.strategy.take(), &join(at, "strategy"), errs),
            None,
        ),
        Some(Some(p)) => (p.decode.targets, p.decode.strategy, Some(p.prefill)),
    };
    let needs = strategy_clients(strategy.as_ref(), &join(at, "strategy"), host, errs);

    let retries = retries(raw.retries, at, errs);
    let queue = route_queue(raw.queue_max, raw.queue_timeout.as_ref(), at, errs);

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
    if let (Some(p), Some(m), Some(r)) = (&prefill, &matcher, &retry) {
        super::pd::check_route(p.protocol, m, r, at, errs);
    }
    let prefill_needs = prefill.as_ref().map(|p| {
        strategy_clients(
            p.pool.strategy.as_ref(),
            &join(at, "prefill.strategy"),
            host,
            errs,
        )
    });

    let (tokenizer, cache_controller) = needs?;
    let route = Route {
        name: name?,
        matcher: matcher?,
        targets: route_targets?,
        strategy: strategy?,
        forward_client_auth: raw.forward_client_auth.unwrap_or(false),
        retries: retries?,
        retry: retry?,
        queue: queue?,
        // Set by `admission::apply_to_routes`.
        admission: RouteAdmission::default(),
        #[cfg(feature = "local-tokenizer")]
        tokenizer,
        cache_controller,
        disaggregation: prefill.as_ref().map(|p| Disaggregation {
            protocol: p.protocol,
            // Set once the pool's place among the routes is known.
            prefill_route: usize::MAX,
        }),
        prefill_of: None,
    };
    #[cfg(not(feature = "local-tokenizer"))]
    let _ = tokenizer;
    let pool = match (prefill, prefill_needs) {
        (Some(p), Some(needs)) => prefill_pool(&route, p, needs?),
        _ => None,
    };
    Some((route, pool))
}

/// `retries`: 0 to [`MAX_RETRIES`], default [`DEFAULT_RETRIES`].
fn retries(v: Option<i64>, at: &str, errs: &mut Collector) -> Option<u32> {
    match v {
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
    }
}

/// A disaggregated route's prefill pool as a route of its own, named `<route>/prefill`:
/// the route's settings with the pool's targets, strategy and what it needs.
fn prefill_pool(
    route: &Route,
    p: super::pd::Prefill,
    (tokenizer, cache_controller): StrategyClients,
) -> Option<Route> {
    #[cfg(not(feature = "local-tokenizer"))]
    let _ = tokenizer;
    Some(Route {
        name: format!("{}/prefill", route.name),
        matcher: RouteMatch::default(),
        targets: p.pool.targets?,
        strategy: p.pool.strategy?,
        #[cfg(feature = "local-tokenizer")]
        tokenizer,
        cache_controller,
        disaggregation: None,
        prefill_of: None,
        ..route.clone()
    })
}

/// What `strategy` needs loaded or resolved now: its local tokenizer and its cache
/// controller. `None` after an error (or when the strategy itself was invalid).
#[cfg(feature = "local-tokenizer")]
type StrategyClients = (
    Option<Arc<rolter_tokenize::LocalTokenizer>>,
    Option<CacheController>,
);
#[cfg(not(feature = "local-tokenizer"))]
type StrategyClients = (Option<()>, Option<CacheController>);

fn strategy_clients(
    strategy: Option<&StrategySpec>,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<StrategyClients> {
    let requirements = strategy?.requirements();
    let tokenizer = local_tokenizer(&requirements, key, host.config_dir, errs);
    let cache_controller = cache_controller(&requirements, key, host, errs);
    Some((tokenizer?, cache_controller?))
}

/// The LMCache controller the strategy asks (`lmcache_aware`, also inside a wrapper): a
/// plain http:// URL (the controller's API server speaks no TLS), resolved now. `Some(None)`
/// when the strategy asks none; `None` after an error.
pub(super) fn cache_controller(
    requirements: &Requirements,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<CacheController>> {
    let Some(lookup) = &requirements.cache_lookup else {
        return Some(None);
    };
    let key = join(key, "controller");
    let written = lookup.controller.as_str();
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

/// The local tokenizer file the strategy names (`tokenizer = "<path>"`): loaded now, so a
/// missing or broken file stops the configuration. `Some(None)` when there is none to
/// load; `None` after an error.
#[cfg(feature = "local-tokenizer")]
pub(super) fn local_tokenizer(
    requirements: &Requirements,
    key: &str,
    config_dir: Option<&Path>,
    errs: &mut Collector,
) -> Option<Option<Arc<rolter_tokenize::LocalTokenizer>>> {
    let Some(tokens) = &requirements.token_ids else {
        return Some(None);
    };
    let Some(written) = tokens.local_path() else {
        return Some(None);
    };
    let resolve = |w: &str| config_path(config_dir, w);
    let json = resolve(written);
    let cfg = match tokens.tokenizer_config.as_deref().filter(|s| !s.is_empty()) {
        Some(c) => Some(resolve(c)),
        // The usual layout: tokenizer_config.json beside tokenizer.json.
        None => json
            .parent()
            .map(|d| d.join("tokenizer_config.json"))
            .filter(|p| p.is_file()),
    };
    match rolter_tokenize::LocalTokenizer::from_files(&json, cfg.as_deref()) {
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

/// Without the local tokenizer built in, a strategy naming a tokenizer file is an error.
#[cfg(not(feature = "local-tokenizer"))]
pub(super) fn local_tokenizer(
    requirements: &Requirements,
    key: &str,
    _config_dir: Option<&Path>,
    errs: &mut Collector,
) -> Option<Option<()>> {
    match requirements.token_ids.as_ref().and_then(|t| t.local_path()) {
        None => Some(None),
        Some(written) => {
            errs.push(
                join(key, "tokenizer"),
                format!("`{written}` names a local tokenizer, but this build of rolter has none (built without the `local-tokenizer` feature)"),
                "set tokenizer = \"engine\" to ask the target's /tokenize endpoint, or use a build with the default features",
            );
            None
        }
    }
}

pub(super) fn route_match(
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

    let passthrough = passthrough_prefixes(raw.passthrough, &join(at, "passthrough"), errs);

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
        passthrough: passthrough?,
        models: models?,
        header: header?,
    })
}

/// `match.passthrough`: distinct path prefixes, each an origin-form path other than a
/// proxied one (those are routed by `paths`).
fn passthrough_prefixes(
    raw: Option<Vec<String>>,
    key: &str,
    errs: &mut Collector,
) -> Option<Vec<String>> {
    let list = string_list(raw, key, "passthrough prefix", errs)?;
    let mut ok = true;
    for (i, p) in list.iter().enumerate() {
        let at = format!("{key}[{i}]");
        if !p.starts_with('/') {
            errs.push(
                at,
                format!("passthrough prefix `{p}` does not start with `/`"),
                format!("write the path prefix as requests carry it, e.g. \"/{p}\""),
            );
            ok = false;
        } else if p
            .bytes()
            .any(|b| !b.is_ascii_graphic() || b == b'?' || b == b'#')
        {
            errs.push(
                at,
                format!("passthrough prefix `{p}` holds a space, control character, `?` or `#`"),
                "write only the path part of the URL (no query, no fragment)",
            );
            ok = false;
        } else if PROXIED_PATHS.contains(&p.as_str()) {
            errs.push(
                at,
                format!("`{p}` is a proxied path, routed by `model`, not a passthrough prefix"),
                format!("move \"{p}\" to match.paths"),
            );
            ok = false;
        }
    }
    ok.then_some(list)
}

pub(super) fn header_match(
    raw: RawHeaderMatch,
    at: &str,
    errs: &mut Collector,
) -> Option<(String, String)> {
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

/// `queue_max` and `queue_timeout`: no queue unless `queue_max` is set.
fn route_queue(
    max: Option<i64>,
    timeout: Option<&toml::Value>,
    at: &str,
    errs: &mut Collector,
) -> Option<Option<RouteQueue>> {
    let timeout_key = join(at, "queue_timeout");
    let given = timeout.is_some();
    let timeout = duration(timeout, &timeout_key, DEFAULT_QUEUE_TIMEOUT, false, errs);
    match max {
        None => {
            if given {
                errs.push(
                    timeout_key,
                    "queue_timeout is set but the route has no queue",
                    "add queue_max = <most requests waiting> to the route, or remove queue_timeout",
                );
                return None;
            }
            Some(None)
        }
        Some(n) if n <= 0 || n > 1_000_000 => {
            errs.push(
                join(at, "queue_max"),
                format!("queue_max is {n}; it must be between 1 and 1000000"),
                "set the most requests that may wait for a place on this route, or remove \
                 queue_max for no queue (a 503 at once when every target is full)",
            );
            None
        }
        Some(n) => Some(Some(RouteQueue {
            max: n as usize,
            timeout: timeout?,
        })),
    }
}
