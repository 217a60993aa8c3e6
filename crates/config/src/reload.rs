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

/// The settings that differ between `old` and `new` and that only a restart (or a binary
/// upgrade, `rolter run --upgrade`) can apply: the listening sockets, the worker threads and
/// their io driver, the control socket, the admin listener's address, and where the access
/// log goes and the operational log's format (the writer and the subscriber are set up
/// once; `log.sample` reloads).
pub fn restart_needed(old: &Config, new: &Config) -> Vec<RestartNeeded> {
    let mut out = Vec::new();
    let mut check = |key: &'static str, changed: bool, was: String, now: String| {
        if changed {
            out.push(RestartNeeded {
                key,
                message: format!(
                    "changed from {was} to {now}; a reload keeps the listening sockets and \
                     worker threads, so this needs a restart or `rolter run --upgrade`"
                ),
            });
        }
    };
    let (o, n) = (&old.server, &new.server);
    check(
        "server.listen",
        o.listen != n.listen,
        o.listen.to_string(),
        n.listen.to_string(),
    );
    check(
        "server.workers",
        o.workers != n.workers,
        o.workers.to_string(),
        n.workers.to_string(),
    );
    check(
        "server.driver",
        o.driver != n.driver,
        format!("{:?}", o.driver),
        format!("{:?}", n.driver),
    );
    check(
        "server.pin_workers",
        o.pin_workers != n.pin_workers,
        o.pin_workers.to_string(),
        n.pin_workers.to_string(),
    );
    check(
        "server.control_socket",
        o.control_socket != n.control_socket,
        format!("{:?}", o.control_socket),
        format!("{:?}", n.control_socket),
    );
    check(
        "log.access",
        !same(&old.log.access, &new.log.access),
        format!("{:?}", old.log.access),
        format!("{:?}", new.log.access),
    );
    check(
        "log.format",
        !same(&old.log.format, &new.log.format),
        format!("{:?}", old.log.format),
        format!("{:?}", new.log.format),
    );
    let admin = |c: &Config| c.admin.as_ref().map(|a| a.listen);
    let show = |a: Option<std::net::SocketAddr>| a.map_or("off".to_string(), |a| a.to_string());
    check(
        "admin.listen",
        admin(old) != admin(new),
        show(admin(old)),
        show(admin(new)),
    );
    out
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
