//! `[state]`: the shared state store (Redis or Valkey) the replicas of a fleet share, and the
//! check that every route whose strategy keeps state there has one. The defaults live in
//! [`StateConfig::with_url`]; the credentials come from the environment, never the file.

use super::common::*;
use crate::raw::RawState;

const EXAMPLE: &str = "[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"";

pub(super) fn state(
    raw: Option<RawState>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<StateConfig>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let backend = match raw.backend.as_deref() {
        Some("redis") => Some(StateBackend::Redis),
        Some("valkey") => Some(StateBackend::Redis),
        None => {
            errs.push(
                "state.backend",
                "[state] has no `backend`",
                "add backend = \"redis\" (Redis 7 or Valkey, which speaks the same protocol)",
            );
            None
        }
        Some(b) => {
            errs.push(
                "state.backend",
                format!("unknown state backend \"{b}\""),
                "write backend = \"redis\" (Redis 7 or Valkey, which speaks the same protocol)",
            );
            None
        }
    };
    let urls = match (raw.url, raw.urls) {
        (Some(_), Some(_)) => {
            errs.push(
                "state.urls",
                "both `url` and `urls` are set",
                "keep one: url = \"redis://host:6379\" for one server, urls = [...] for sentinels or cluster nodes",
            );
            None
        }
        (None, None) => {
            errs.push(
                "state.url",
                "[state] names no server",
                "add url = \"redis://127.0.0.1:6379\" (rediss:// for TLS), or urls = [...] for sentinels or cluster nodes",
            );
            None
        }
        (Some(u), None) => Some(vec![u]),
        (None, Some(list)) if list.is_empty() => {
            errs.push(
                "state.urls",
                "`urls` is empty",
                "list at least one address, e.g. urls = [\"redis://10.0.0.1:6379\"]",
            );
            None
        }
        (None, Some(list)) => Some(list),
    };
    let urls = urls.and_then(|list| {
        let mut ok = true;
        for (i, u) in list.iter().enumerate() {
            let key = if list.len() == 1 {
                "state.url".to_string()
            } else {
                format!("state.urls[{i}]")
            };
            let scheme_ok = ["redis://", "rediss://", "valkey://", "valkeys://"]
                .iter()
                .any(|s| u.starts_with(s) && u.len() > s.len());
            if !scheme_ok {
                errs.push(
                    key,
                    format!("`{u}` is not a redis:// or rediss:// address"),
                    "write it as redis://host:port (or rediss://host:port for TLS), e.g. \"redis://127.0.0.1:6379\"",
                );
                ok = false;
            } else if u.contains('@') {
                errs.push(
                    key,
                    "the address carries credentials",
                    "remove user and password from the address and put them in the environment variables named by username_env and password_env (default ROLTER_STATE_USERNAME, ROLTER_STATE_PASSWORD)",
                );
                ok = false;
            }
        }
        ok.then_some(list)
    });
    let topology = match (raw.sentinel_master, raw.cluster.unwrap_or(false)) {
        (Some(_), true) => {
            errs.push(
                "state.cluster",
                "both `sentinel_master` and `cluster = true` are set",
                "keep sentinel_master for sentinels, or cluster = true for a Redis Cluster",
            );
            None
        }
        (Some(m), false) if m.is_empty() => {
            errs.push(
                "state.sentinel_master",
                "`sentinel_master` is empty",
                "write the master's name as the sentinels know it, e.g. sentinel_master = \"mymaster\"",
            );
            None
        }
        (Some(m), false) => Some(StateTopology::Sentinel { master: m }),
        (None, true) => Some(StateTopology::Cluster),
        (None, false) => Some(StateTopology::Standalone),
    };
    let defaults = StateConfig::with_url("redis://127.0.0.1:6379");
    let username_env = raw.username_env.clone().unwrap_or(defaults.username_env);
    let password_env = raw.password_env.clone().unwrap_or(defaults.password_env);
    let from_env = |var: &str, explicit: bool, key: &str, errs: &mut Collector| match (host.env)(
        var,
    ) {
        Some(v) if !v.is_empty() => Some(Some(v)),
        _ if explicit => {
            errs.push(
                    key,
                    format!("the environment variable {var} is not set"),
                    format!("set {var} in the gateway's environment (for systemd: Environment= or EnvironmentFile= in the unit), or remove {}", key.rsplit('.').next().unwrap_or(key)),
                );
            None
        }
        _ => Some(None),
    };
    let username = from_env(
        &username_env,
        raw.username_env.is_some(),
        "state.username_env",
        errs,
    );
    let password = from_env(
        &password_env,
        raw.password_env.is_some(),
        "state.password_env",
        errs,
    );
    let tls_ca_file = match raw.tls_ca_file {
        None => Some(None),
        Some(p) => {
            let path = match host.config_dir {
                Some(dir) if Path::new(&p).is_relative() => dir.join(&p),
                _ => PathBuf::from(&p),
            };
            if path.is_file() {
                Some(Some(path))
            } else {
                errs.push(
                    "state.tls_ca_file",
                    format!("no file at {}", path.display()),
                    "name a PEM file holding the CA certificate of the store's TLS certificate",
                );
                None
            }
        }
    };
    let connect_timeout = duration(
        raw.connect_timeout.as_ref(),
        "state.connect_timeout",
        defaults.connect_timeout,
        false,
        errs,
    );
    let command_timeout = duration(
        raw.command_timeout.as_ref(),
        "state.command_timeout",
        defaults.command_timeout,
        false,
        errs,
    );
    let pick_timeout = duration(
        raw.pick_timeout.as_ref(),
        "state.pick_timeout",
        defaults.pick_timeout,
        false,
        errs,
    );
    let sync_interval = nonzero_duration(
        raw.sync_interval.as_ref(),
        "state.sync_interval",
        defaults.sync_interval,
        errs,
    );
    let retry_interval = nonzero_duration(
        raw.retry_interval.as_ref(),
        "state.retry_interval",
        defaults.retry_interval,
        errs,
    );
    let key_prefix = match raw.key_prefix {
        None => Some(defaults.key_prefix),
        Some(p)
            if !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_graphic() && c != '{' && c != '}') =>
        {
            Some(p)
        }
        Some(p) => {
            errs.push(
                "state.key_prefix",
                format!("key_prefix {p:?} is empty or holds spaces or braces"),
                "use letters, digits and punctuation other than { and }, e.g. key_prefix = \"rolter-prod\"",
            );
            None
        }
    };
    let replica = match raw.replica {
        Some(r) if r.is_empty() || r.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            errs.push(
                "state.replica",
                format!("replica name {r:?} is empty or holds whitespace"),
                "remove it (the default is the host name and the listening port) or write a name such as \"gw-1\"",
            );
            None
        }
        other => Some(other),
    };
    let max_items_per_second = count(
        raw.max_items_per_second,
        "state.max_items_per_second",
        defaults.max_items_per_second,
        1..=10_000_000,
        "shared items (session pins, prefixes) published per second at most",
        errs,
    );
    let stream_maxlen = count(
        raw.stream_maxlen,
        "state.stream_maxlen",
        defaults.stream_maxlen,
        100..=100_000_000,
        "entries the items stream keeps",
        errs,
    );
    Some(Some(StateConfig {
        backend: backend?,
        urls: urls?,
        topology: topology?,
        username: username?,
        password: password?,
        username_env,
        password_env,
        tls_ca_file: tls_ca_file?,
        connect_timeout: connect_timeout?,
        command_timeout: command_timeout?,
        pick_timeout: pick_timeout?,
        key_prefix: key_prefix?,
        replica: replica?,
        sync_interval: sync_interval?,
        retry_interval: retry_interval?,
        max_items_per_second: max_items_per_second?,
        stream_maxlen: stream_maxlen?,
        share_load: raw.share_load.unwrap_or(defaults.share_load),
    }))
}

/// Every route whose strategy keeps state in the store needs a `[state]`.
pub(super) fn check_store_use(
    routes: &[Option<Route>],
    state: Option<&Option<StateConfig>>,
    errs: &mut Collector,
) {
    // An invalid [state] has said so already.
    let state = match state {
        Some(None) => None,
        Some(Some(s)) => Some(s),
        None => return,
    };
    if let Some(s) = state {
        if !s.share_load {
            for (i, r) in routes.iter().enumerate() {
                let Some(r) = r else { continue };
                if r.strategy
                    .requirements()
                    .store
                    .is_some_and(|u| u.fleet_load)
                {
                    errs.push(
                        format!("routes[{i}].strategy"),
                        format!(
                            "route \"{}\": fleet_load = true reads the other replicas' load, and state.share_load = false publishes none",
                            r.name
                        ),
                        "set share_load = true in [state] (the default), or remove fleet_load",
                    );
                }
            }
        }
        return;
    }
    for (i, r) in routes.iter().enumerate() {
        let Some(r) = r else { continue };
        if let Some(store) = r.strategy.requirements().store {
            errs.push(
                format!("routes[{i}].strategy"),
                format!(
                    "route \"{}\": {} keeps its state in the shared state store, and no [state] is configured",
                    r.name,
                    store.by.join(" and ")
                ),
                format!(
                    "add the store every replica shares:\n{EXAMPLE}\n(see docs/operations.md, \"Running several replicas\"), or turn the option off to keep the state per gateway"
                ),
            );
        }
    }
}
