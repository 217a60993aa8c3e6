//! Comparing a running configuration with a new one, for a reload: what cannot change
//! without a restart, and which targets and routes are unchanged (so their connections,
//! health and learned state carry over).
//!
//! Owns the comparison rules only. It must not apply anything: the gateway does.

use std::fmt::Debug;

use crate::{Config, Route, Target};

/// One setting a reload cannot apply: the key, and why a restart is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartNeeded {
    pub key: &'static str,
    pub message: String,
}

impl std::fmt::Display for RestartNeeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// A setting as a message shows it.
type Show = fn(&Config) -> String;

/// The settings that differ between `old` and `new` and that only a restart (or a binary
/// upgrade, `rolter run --upgrade`) can apply: the listening sockets, the worker threads and
/// their io driver, the control socket, the admin listener's address, and where the access
/// log goes and the operational log's format (the writer and the subscriber are set up
/// once; `log.sample` reloads), and the shared state store (`[state]`: its thread and
/// connection are set up once), and whether the listener speaks TLS (`[server.tls]` added
/// or removed: its clients would have to change scheme at once; its certificates, SNI
/// entries, handshake timeout and minimum version do reload).
pub fn restart_needed(old: &Config, new: &Config) -> Vec<RestartNeeded> {
    // Each setting as shown in the message; a setting changed when its text did.
    let admin = |c: &Config| {
        c.admin
            .as_ref()
            .map_or("off".into(), |a| a.listen.to_string())
    };
    let settings: [(&'static str, Show); 10] = [
        ("server.listen", |c| c.server.listen.to_string()),
        ("server.tls", |c| {
            if c.server.tls.is_some() { "on" } else { "off" }.to_string()
        }),
        ("server.workers", |c| c.server.workers.to_string()),
        ("server.driver", |c| format!("{:?}", c.server.driver)),
        ("server.pin_workers", |c| c.server.pin_workers.to_string()),
        ("server.control_socket", |c| {
            format!("{:?}", c.server.control_socket)
        }),
        ("log.access", |c| format!("{:?}", c.log.access)),
        ("log.format", |c| format!("{:?}", c.log.format)),
        ("admin.listen", admin),
        ("state", |c| format!("{:?}", c.state)),
    ];
    settings
        .iter()
        .filter_map(|(key, show)| {
            let (was, now) = (show(old), show(new));
            (was != now).then(|| RestartNeeded {
                key,
                message: format!(
                    "changed from {was} to {now}; a reload keeps the listening sockets and \
                     worker threads, so this needs a restart or `rolter run --upgrade`"
                ),
            })
        })
        .collect()
}

/// Whether two values are the same definition. Values are compared through their `Debug`
/// form, which shows every field: a field that formats differently (a map in another
/// order) only makes the comparison say "changed", which costs carried-over state, never
/// correctness.
pub fn same<T: Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// For each target of `new`, the index of the same target (same name, same definition) in
/// `old`, if it has one: its keep-alive connections and health carry over.
pub fn unchanged_targets(old: &[Target], new: &[Target]) -> Vec<Option<usize>> {
    new.iter()
        .map(|t| {
            old.iter()
                .position(|o| o.name == t.name)
                .filter(|&i| same(&old[i], t))
        })
        .collect()
}

/// Whether every target is unchanged and in the same place, so state indexed by target
/// (strategies' learned state, health, load) means the same in both configurations.
pub fn same_targets(old: &Config, new: &Config) -> bool {
    old.targets.len() == new.targets.len()
        && old
            .targets
            .iter()
            .zip(&new.targets)
            .all(|(a, b)| same(a, b))
        && same(&old.catalog, &new.catalog)
}

/// For each route of `new`, the index of the same route in `old` when its strategy state
/// can carry over: the route is defined identically, every target is unchanged, and so are
/// the KV index's settings (a strategy reading the index keeps reading the same one).
pub fn unchanged_routes(old: &Config, new: &Config) -> Vec<Option<usize>> {
    let targets = same_targets(old, new) && same(&old.kv_events, &new.kv_events);
    new.routes
        .iter()
        .map(|r| {
            if !targets {
                return None;
            }
            old.routes
                .iter()
                .position(|o: &Route| o.name == r.name)
                .filter(|&i| same(&old.routes[i], r))
        })
        .collect()
}
