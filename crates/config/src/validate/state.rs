//! `[state]`: the shared state store (Redis or Valkey) the replicas of a fleet share, and the
//! check that every route whose strategy keeps state there has one. The defaults live in
//! [`StateConfig::with_url`]; the credentials come from the environment, never the file.

use super::common::*;
use crate::raw::RawState;

const EXAMPLE: &str = "[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"";

/// `[state]`: `Some(None)` when the section is absent, `None` when it has errors.
pub(super) fn state(
    raw: Option<RawState>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<StateConfig>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let defaults = StateConfig::with_url("redis://127.0.0.1:6379");
    let servers = state_servers(&raw, errs);
    let credentials = state_credentials(&raw, &defaults, host, errs);
    let tls_ca_file = state_tls_ca_file(raw.tls_ca_file.as_deref(), host, errs);
    let timeouts = state_timeouts(&raw, &defaults, errs);
    let sync = state_sync(&raw, &defaults, errs);
    let (servers, credentials, timeouts, sync) = (servers?, credentials?, timeouts?, sync?);
    Some(Some(StateConfig {
        backend: servers.backend,
        urls: servers.urls,
        topology: servers.topology,
        username: credentials.username,
        password: credentials.password,
        username_env: credentials.username_env,
        password_env: credentials.password_env,
        tls_ca_file: tls_ca_file?,
        connect_timeout: timeouts.connect,
        command_timeout: timeouts.command,
        pick_timeout: timeouts.pick,
        key_prefix: sync.key_prefix,
        replica: sync.replica,
        sync_interval: sync.sync_interval,
        retry_interval: sync.retry_interval,
        max_items_per_second: sync.max_items_per_second,
        stream_maxlen: sync.stream_maxlen,
        share_load: raw.share_load.unwrap_or(defaults.share_load),
    }))
}

/// Which store the gateway talks to and how it is laid out.
struct StateServers {
    backend: StateBackend,
    urls: Vec<String>,
    topology: StateTopology,
}

/// `backend`, `url` or `urls`, and `sentinel_master` or `cluster`.
fn state_servers(raw: &RawState, errs: &mut Collector) -> Option<StateServers> {
    let backend = state_backend(raw.backend.as_deref(), errs);
    let urls = state_urls(raw.url.clone(), raw.urls.clone(), errs);
    let topology = state_topology(raw.sentinel_master.clone(), raw.cluster, errs);
    Some(StateServers {
        backend: backend?,
        urls: urls?,
        topology: topology?,
    })
}

/// `backend`: `"redis"`, or `"valkey"`, which speaks the same protocol.
fn state_backend(written: Option<&str>, errs: &mut Collector) -> Option<StateBackend> {
    match written {
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
    }
}

/// `url` or `urls` (exactly one of them, not empty), each address checked.
fn state_urls(
    url: Option<String>,
    urls: Option<Vec<String>>,
    errs: &mut Collector,
) -> Option<Vec<String>> {
    let list = match (url, urls) {
        (Some(_), Some(_)) => {
            errs.push(
                "state.urls",
                "both `url` and `urls` are set",
                "keep one: url = \"redis://host:6379\" for one server, urls = [...] for sentinels or cluster nodes",
            );
            return None;
        }
        (None, None) => {
            errs.push(
                "state.url",
                "[state] names no server",
                "add url = \"redis://127.0.0.1:6379\" (rediss:// for TLS), or urls = [...] for sentinels or cluster nodes",
            );
            return None;
        }
        (Some(u), None) => vec![u],
        (None, Some(list)) if list.is_empty() => {
            errs.push(
                "state.urls",
                "`urls` is empty",
                "list at least one address, e.g. urls = [\"redis://10.0.0.1:6379\"]",
            );
            return None;
        }
        (None, Some(list)) => list,
    };
    let mut ok = true;
    for (i, u) in list.iter().enumerate() {
        let key = if list.len() == 1 {
            "state.url".to_string()
        } else {
            format!("state.urls[{i}]")
        };
        ok &= check_state_url(u, key, errs);
    }
    ok.then_some(list)
}

/// One store address: a redis:// or rediss:// (or valkey) URL without credentials.
fn check_state_url(u: &str, key: String, errs: &mut Collector) -> bool {
    let scheme_ok = ["redis://", "rediss://", "valkey://", "valkeys://"]
        .iter()
        .any(|s| u.starts_with(s) && u.len() > s.len());
    if !scheme_ok {
        errs.push(
            key,
            format!("`{u}` is not a redis:// or rediss:// address"),
            "write it as redis://host:port (or rediss://host:port for TLS), e.g. \"redis://127.0.0.1:6379\"",
        );
        return false;
    }
    if u.contains('@') {
        errs.push(
            key,
            "the address carries credentials",
            "remove user and password from the address and put them in the environment variables named by username_env and password_env (default ROLTER_STATE_USERNAME, ROLTER_STATE_PASSWORD)",
        );
        return false;
    }
    true
}

/// `sentinel_master` or `cluster = true` (not both); neither: one standalone server.
fn state_topology(
    sentinel_master: Option<String>,
    cluster: Option<bool>,
    errs: &mut Collector,
) -> Option<StateTopology> {
    match (sentinel_master, cluster.unwrap_or(false)) {
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
    }
}

/// The ACL user and password, and the names of the variables they come from.
struct StateCredentials {
    username: Option<String>,
    password: Option<String>,
    username_env: String,
    password_env: String,
}

/// `username_env` and `password_env`: the variables are read now, from the environment.
fn state_credentials(
    raw: &RawState,
    defaults: &StateConfig,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<StateCredentials> {
    let username_env = raw
        .username_env
        .clone()
        .unwrap_or_else(|| defaults.username_env.clone());
    let password_env = raw
        .password_env
        .clone()
        .unwrap_or_else(|| defaults.password_env.clone());
    let username = credential(
        &username_env,
        raw.username_env.is_some(),
        "state.username_env",
        host,
        errs,
    );
    let password = credential(
        &password_env,
        raw.password_env.is_some(),
        "state.password_env",
        host,
        errs,
    );
    Some(StateCredentials {
        username: username?,
        password: password?,
        username_env,
        password_env,
    })
}

/// The value of the environment variable `var`, if set and not empty; unset is an error at
/// `key` only when the file named the variable (`explicit`).
fn credential(
    var: &str,
    explicit: bool,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<String>> {
    match (host.env)(var) {
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
    }
}

/// `tls_ca_file`: an existing file, relative paths taken from the configuration's directory.
fn state_tls_ca_file(
    written: Option<&str>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<PathBuf>> {
    let Some(p) = written else {
        return Some(None);
    };
    let path = config_path(host.config_dir, p);
    if path.is_file() {
        return Some(Some(path));
    }
    errs.push(
        "state.tls_ca_file",
        format!("no file at {}", path.display()),
        "name a PEM file holding the CA certificate of the store's TLS certificate",
    );
    None
}

/// How long connecting, a command and a pick's wait for the store may take.
struct StateTimeouts {
    connect: Duration,
    command: Duration,
    pick: Duration,
}

/// `connect_timeout`, `command_timeout` and `pick_timeout`.
fn state_timeouts(
    raw: &RawState,
    defaults: &StateConfig,
    errs: &mut Collector,
) -> Option<StateTimeouts> {
    let connect = duration(
        raw.connect_timeout.as_ref(),
        "state.connect_timeout",
        defaults.connect_timeout,
        false,
        errs,
    );
    let command = duration(
        raw.command_timeout.as_ref(),
        "state.command_timeout",
        defaults.command_timeout,
        false,
        errs,
    );
    let pick = duration(
        raw.pick_timeout.as_ref(),
        "state.pick_timeout",
        defaults.pick_timeout,
        false,
        errs,
    );
    Some(StateTimeouts {
        connect: connect?,
        command: command?,
        pick: pick?,
    })
}

/// How this replica shares its state: the pace, the keys' names and the limits.
struct StateSync {
    sync_interval: Duration,
    retry_interval: Duration,
    key_prefix: String,
    replica: Option<String>,
    max_items_per_second: u32,
    stream_maxlen: u32,
}

/// `sync_interval`, `retry_interval`, `key_prefix`, `replica`, `max_items_per_second` and
/// `stream_maxlen`.
fn state_sync(raw: &RawState, defaults: &StateConfig, errs: &mut Collector) -> Option<StateSync> {
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
    let key_prefix = key_prefix(raw.key_prefix.as_deref(), &defaults.key_prefix, errs);
    let replica = replica(raw.replica.as_deref(), errs);
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
    Some(StateSync {
        sync_interval: sync_interval?,
        retry_interval: retry_interval?,
        key_prefix: key_prefix?,
        replica: replica?,
        max_items_per_second: max_items_per_second?,
        stream_maxlen: stream_maxlen?,
    })
}

/// `key_prefix`: printable ASCII, not empty, without spaces or braces.
fn key_prefix(written: Option<&str>, default: &str, errs: &mut Collector) -> Option<String> {
    match written {
        None => Some(default.to_string()),
        Some(p)
            if !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_graphic() && c != '{' && c != '}') =>
        {
            Some(p.to_string())
        }
        Some(p) => {
            errs.push(
                "state.key_prefix",
                format!("key_prefix {p:?} is empty or holds spaces or braces"),
                "use letters, digits and punctuation other than { and }, e.g. key_prefix = \"rolter-prod\"",
            );
            None
        }
    }
}

/// `replica`: this replica's name in the store, not empty and without whitespace.
fn replica(written: Option<&str>, errs: &mut Collector) -> Option<Option<String>> {
    match written {
        Some(r) if r.is_empty() || r.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            errs.push(
                "state.replica",
                format!("replica name {r:?} is empty or holds whitespace"),
                "remove it (the default is the host name and the listening port) or write a name such as \"gw-1\"",
            );
            None
        }
        other => Some(other.map(str::to_string)),
    }
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
