//! Raw file values → validated [`Config`], collecting every problem: one module per
//! section, [`common`] for what they share, this module for the order.

mod admin;
mod admission;
mod api_keys;
pub(crate) mod common;
mod health;
mod kv;
mod log;
mod pd;
mod pool;
mod prices;
mod retry;
mod routes;
mod server;
mod server_tls;
mod state;
mod targets;
mod tracing;

use admin::admin;
use common::*;
use health::{health, scrape};
use kv::kv_events;
use log::log;
use prices::catalog;
pub(crate) use prices::check_prices;
use routes::routes;
use server::server;
use targets::{check_unique_names, target, target_tables};

pub use api_keys::{parse_hash, HASH_PREFIX};
pub use common::Discoverer;
pub(crate) use common::{EnvLookup, Host, Resolver};
pub use common::{
    DEFAULT_ADMIN_LISTEN, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_BYTE_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_IDLE_TIMEOUT,
    DEFAULT_POOL_MAX_IDLE, DEFAULT_RETRIES, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STRATEGY,
    FORBIDDEN_TARGET_HEADERS, IMPLICIT_ROUTE_NAME, MAX_RETRIES, PROXIED_PATHS,
};
pub use server_tls::DEFAULT_HANDSHAKE_TIMEOUT;

/// Each entry's spec at its first target after the ranks were expanded (`dp_size` is
/// refused on `discover` entries, so such an entry is still one target).
fn specs_at_targets(
    specs: Vec<Option<Option<DiscoverSpec>>>,
    dp_sizes: &[u32],
    targets: usize,
) -> Vec<Option<DiscoverSpec>> {
    let mut at_target: Vec<Option<DiscoverSpec>> = Vec::with_capacity(targets);
    for (spec, size) in specs.into_iter().zip(dp_sizes) {
        at_target.push(spec.flatten());
        at_target.extend((1..*size).map(|_| None));
    }
    at_target
}

/// Validates everything in `raw`; returns the config only when no error was pushed.
pub(crate) fn validate(
    mut raw: RawConfig,
    source: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Config> {
    let server = server(raw.server.unwrap_or_default(), host, errs);
    let classes = admission::classes(raw.classes.take(), errs);
    let raw_targets = target_tables(raw.targets, errs);
    let (route_admission, engine_priority) =
        admission::from_raw(raw.routes.as_ref(), &raw_targets, &classes, errs);
    // Route names as written, for the keys' `routes` references.
    let route_names: Vec<Option<String>> = match &raw.routes {
        None => vec![Some(IMPLICIT_ROUTE_NAME.to_string())],
        Some(r) => r.iter().map(|r| r.name.clone()).collect(),
    };
    // Target names as written (even for otherwise invalid targets), for route references.
    let names: Vec<Option<String>> = raw_targets.iter().map(|t| t.name.clone()).collect();
    let engine_written: Vec<bool> = raw_targets.iter().map(|t| t.engine.is_some()).collect();
    let dp_sizes: Vec<u32> = raw_targets
        .iter()
        .enumerate()
        .map(|(i, t)| targets::dp_size(t.dp_size, &format!("targets[{i}]"), errs))
        .collect();
    let specs: Vec<Option<Option<DiscoverSpec>>> = raw_targets
        .iter()
        .enumerate()
        .map(|(i, t)| targets::discover_spec(t, &format!("targets[{i}]"), errs))
        .collect();
    let targets: Vec<Option<Target>> = raw_targets
        .into_iter()
        .zip(&specs)
        .zip(engine_priority)
        .enumerate()
        .map(|(i, ((t, spec), priority))| {
            let spec = spec.as_ref().and_then(Option::as_ref);
            let t = target(t, &format!("targets[{i}]"), spec, host, errs)?;
            Some(Target { priority, ..t })
        })
        .collect();
    check_unique_names(&names, "targets", "target", errs);
    let mut routes = routes(raw.routes, &names, &targets, host, errs);
    admission::apply_to_routes(&mut routes, route_admission);
    let health = health(raw.health, errs);
    let scrape = scrape(raw.metrics_scrape, errs);
    let admin = match raw.admin {
        None => Some(None),
        Some(a) => admin(a, server.as_ref(), host, errs).map(Some),
    };
    let catalog = catalog(raw.catalog, errs);
    let kv_events = kv_events(raw.kv_events, errs);
    let log = log(raw.log, errs);
    let state = state::state(raw.state, host, errs);
    let tracing = tracing::tracing(raw.tracing, host, errs);
    let keys = api_keys::keys(raw.keys, raw.auth, (&route_names, &classes), host, errs);
    state::check_store_use(&routes, state.as_ref(), errs);
    api_keys::check_shared_limits(keys.as_ref(), state.as_ref(), errs);
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
    let mut targets = targets.into_iter().collect::<Option<Vec<_>>>()?;
    let mut routes = routes.into_iter().collect::<Option<Vec<_>>>()?;
    pd::engine_kinds(&mut targets, &engine_written, &routes);
    let targets = pd::expand_ranks(targets, &dp_sizes, &mut routes);
    let at_target = specs_at_targets(specs, &dp_sizes, targets.len());
    let mut config = Config {
        source: PathBuf::from(source),
        digest: String::new(),
        server: server?,
        targets,
        routes,
        health: health?,
        scrape: scrape?,
        admin: admin?,
        catalog: catalog?.into_iter().collect(),
        adaptive,
        kv_events: kv_events?,
        log: log?,
        state: state?,
        keys: keys?,
        classes,
        discovery: Vec::new(),
        tracing: tracing?,
    };
    if at_target.iter().any(Option::is_some) {
        targets::discover_members(&mut config, &at_target, host, errs);
    }
    errs.is_empty().then_some(config)
}
