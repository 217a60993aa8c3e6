//! `[[keys]]` and `[auth] keys_file`: the client API keys, each a name, the SHA-256 of the
//! key (never the key), the routes and models it may use and its per-minute limits.
//!
//! Owns the keys' checks (with `share_limits` needing a `[state]`) and reading the keys
//! file (the same `[[keys]]` tables, nothing else). It must not see a key itself: only
//! hashes are written or read.

use super::common::*;
use crate::raw::{RawAuth, RawKey};

/// What `hash` must start with.
pub const HASH_PREFIX: &str = "sha256:";

const HASH_FIX: &str = "write the key's hash as printed by `rolter keys hash` (it reads the key on stdin), e.g. hash = \"sha256:<64 hex digits>\"; the key itself never goes in the file";

/// The keys of the configuration and of its keys file; `route_names` are the routes'
/// names in order (`None` where a route has none), for `routes` references.
pub(super) fn keys(
    raw: Option<Vec<RawKey>>,
    auth: Option<RawAuth>,
    (route_names, classes): (&[Option<String>], &[PriorityClass]),
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<ApiKeys> {
    let mut entries: Vec<(String, ApiKey)> = Vec::new();
    let mut ok = true;
    for (i, k) in raw.unwrap_or_default().into_iter().enumerate() {
        match key(k, &format!("keys[{i}]"), (route_names, classes), errs) {
            Some(k) => entries.push((format!("keys[{i}]"), k)),
            None => ok = false,
        }
    }
    let share_limits = auth.as_ref().and_then(|a| a.share_limits).unwrap_or(false);
    let file = auth.and_then(|a| a.keys_file);
    let file = match file.as_deref() {
        None => None,
        Some("") => {
            errs.push(
                "auth.keys_file",
                "`keys_file` is empty",
                "name the file holding the [[keys]] tables, e.g. keys_file = \"/etc/rolter/keys.toml\", or remove the key",
            );
            return None;
        }
        Some(p) => {
            let path = config_path(host.config_dir, p);
            match keys_file(&path, (route_names, classes), errs) {
                Some(more) => entries.extend(more),
                None => ok = false,
            }
            Some(path)
        }
    };
    // Names and hashes are unique over the configuration and the keys file together.
    let mut by_hash: HashMap<[u8; 32], usize> = HashMap::new();
    let mut names: HashMap<&str, &str> = HashMap::new();
    for (i, (at, k)) in entries.iter().enumerate() {
        if let Some(first) = names.insert(&k.name, at) {
            errs.push(
                format!("{at}.name"),
                format!("key name `{}` is already used by {first}", k.name),
                "give every key a unique name (it labels the key's log entries and metrics)",
            );
            ok = false;
        }
        if let Some(&j) = by_hash.get(&k.hash) {
            errs.push(
                format!("{at}.hash"),
                format!(
                    "this hash is already the hash of {} (`{}`)",
                    entries[j].0, entries[j].1.name
                ),
                "give every client its own key: generate one with `rolter keys new --name NAME`",
            );
            ok = false;
        } else {
            by_hash.insert(k.hash, i);
        }
    }
    if !ok {
        return None;
    }
    Some(ApiKeys {
        keys: entries.into_iter().map(|(_, k)| k).collect(),
        by_hash,
        file,
        share_limits,
    })
}

/// The `[[keys]]` tables of `path`; its errors name that file.
fn keys_file(
    path: &Path,
    refs: (&[Option<String>], &[PriorityClass]),
    errs: &mut Collector,
) -> Option<Vec<(String, ApiKey)>> {
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            errs.push(
                "auth.keys_file",
                format!("cannot read the keys file {shown}: {e}"),
                "check the path (relative paths are relative to the configuration file's directory) and that the file is readable",
            );
            return None;
        }
    };
    let mut file_errs = Collector::new(&shown);
    let raw = crate::raw::parse(&text, &mut file_errs);
    let mut out = Vec::new();
    if let Some(raw) = raw {
        let others = [
            ("server", raw.server.is_some()),
            ("targets", raw.targets.is_some()),
            ("routes", raw.routes.is_some()),
            ("health", raw.health.is_some()),
            ("metrics_scrape", raw.metrics_scrape.is_some()),
            ("admin", raw.admin.is_some()),
            ("catalog", raw.catalog.is_some()),
            ("adaptive", raw.adaptive.is_some()),
            ("kv_events", raw.kv_events.is_some()),
            ("log", raw.log.is_some()),
            ("state", raw.state.is_some()),
            ("auth", raw.auth.is_some()),
        ];
        for (name, _) in others.iter().filter(|(_, set)| *set) {
            file_errs.push(
                *name,
                format!("the keys file holds only [[keys]] tables, not `{name}`"),
                "move it to the main configuration file",
            );
        }
        for (i, k) in raw.keys.unwrap_or_default().into_iter().enumerate() {
            let at = format!("keys[{i}]");
            if let Some(k) = key(k, &at, refs, &mut file_errs) {
                out.push((format!("{shown}: {at}"), k));
            }
        }
    }
    let ok = file_errs.is_empty();
    errs.absorb(file_errs);
    ok.then_some(out)
}

/// One `[[keys]]` table at `at`.
fn key(
    raw: RawKey,
    at: &str,
    (route_names, classes): (&[Option<String>], &[PriorityClass]),
    errs: &mut Collector,
) -> Option<ApiKey> {
    let admission = super::admission::key(&raw, classes, at, errs);
    let name = match raw.name {
        None => {
            errs.push(
                format!("{at}.name"),
                "a key has no `name`",
                "add name = \"...\" (letters, digits, '_', '-', '.'; it labels the key's log entries and metrics)",
            );
            None
        }
        Some(n) if !valid_name(&n) => {
            errs.push(
                format!("{at}.name"),
                format!("key name `{n}` is not 1 to 64 letters, digits, '_', '-' or '.' starting with a letter or digit"),
                "rename it, e.g. name = \"team-search\"",
            );
            None
        }
        Some(n) => Some(n),
    };
    let hash = match raw.hash.as_deref() {
        None => {
            errs.push(format!("{at}.hash"), "a key has no `hash`", HASH_FIX);
            None
        }
        Some(h) => {
            let parsed = parse_hash(h);
            if parsed.is_none() {
                errs.push(
                    format!("{at}.hash"),
                    "`hash` is not a SHA-256 hash (\"sha256:\" and 64 hex digits)",
                    HASH_FIX,
                );
            }
            parsed
        }
    };
    let routes = match raw.routes {
        None => Some(None),
        Some(list) => {
            let mut idx = Vec::new();
            let mut ok = true;
            for (i, r) in list.iter().enumerate() {
                match route_names.iter().position(|n| n.as_deref() == Some(r)) {
                    Some(p) if !idx.contains(&p) => idx.push(p),
                    Some(_) => {}
                    None => {
                        let known: Vec<&str> =
                            route_names.iter().flatten().map(|s| s.as_str()).collect();
                        errs.push(
                            format!("{at}.routes[{i}]"),
                            format!("no route is named `{r}`"),
                            format!("name one of the routes ({}), or remove `routes` to allow every route", known.join(", ")),
                        );
                        ok = false;
                    }
                }
            }
            ok.then_some(Some(idx))
        }
    };
    let models = match raw.models {
        None => Some(None),
        Some(m) => string_list(Some(m), &format!("{at}.models"), "model name", errs).map(Some),
    };
    let requests_per_minute = limit(
        raw.requests_per_minute,
        &format!("{at}.requests_per_minute"),
        "requests",
        errs,
    );
    let tokens_per_minute = limit(
        raw.tokens_per_minute,
        &format!("{at}.tokens_per_minute"),
        "tokens",
        errs,
    );
    let (priority, share) = admission?;
    Some(ApiKey {
        priority,
        set_priority: raw.set_priority.unwrap_or(false),
        share,
        name: name?,
        hash: hash?,
        routes: routes?,
        models: models?,
        requests_per_minute: requests_per_minute?,
        tokens_per_minute: tokens_per_minute?,
    })
}

fn limit(v: Option<i64>, key: &str, what: &str, errs: &mut Collector) -> Option<Option<u32>> {
    match v {
        None => Some(None),
        Some(n) => {
            match u32::try_from(n) {
                Ok(n) if n > 0 => Some(Some(n)),
                _ => {
                    errs.push(
                    key,
                    format!("value is {n}; it must be from 1 to {}", u32::MAX),
                    format!("set the {what} a key may use per minute, or remove the key for no limit"),
                );
                    None
                }
            }
        }
    }
}

fn valid_name(n: &str) -> bool {
    n.len() <= 64
        && n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// `sha256:` and 64 hex digits → the 32 bytes.
pub fn parse_hash(s: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix(HASH_PREFIX)?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// `auth.share_limits` adds the keys' counts up through the shared-state store, so it
/// needs a `[state]`. Either side invalid (`None`) has been reported already.
pub(super) fn check_shared_limits(
    keys: Option<&ApiKeys>,
    state: Option<&Option<StateConfig>>,
    errs: &mut Collector,
) {
    if keys.is_some_and(|k| k.share_limits) && state.is_some_and(|s| s.is_none()) {
        errs.push(
            "auth.share_limits",
            "share_limits adds up the keys' per-minute counts over every replica through the shared-state store, and no [state] is configured",
            "add a [state] section (backend = \"redis\", url = \"redis://…\"), or remove share_limits for limits per gateway",
        );
    }
}
