//! The discovery thread: looks every `discover` entry of the running configuration up
//! every `server.dns_refresh`, and applies a changed member set through the supervisor
//! (as a reload of the same file with the new members). A failed or empty lookup keeps the
//! last good members; it is counted and logged (at most once a minute per entry).
//!
//! Owns the lookup schedule. Its queries block, so it runs on a thread of its own, never on
//! a worker or the control thread. It holds the supervisor weakly and ends once the
//! gateway is gone or stopping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolter_config::discover;

use super::supervisor::Supervisor;
use crate::lifecycle::Lifecycle;
use crate::reload::{Lookup, ReloadStats};

/// How often the thread looks at the running configuration when it has nothing to look up
/// (a reload may add a `discover` entry) and checks for the stop.
const NAP: Duration = Duration::from_millis(100);

/// A failing entry's lookups are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Starts the thread.
pub(super) fn spawn(
    supervisor: Weak<Mutex<Supervisor>>,
    stats: Arc<ReloadStats>,
    lifecycle: Arc<Lifecycle>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rolter-discovery".into())
        .spawn(move || run(&supervisor, &stats, &lifecycle))
}

fn run(supervisor: &Weak<Mutex<Supervisor>>, stats: &ReloadStats, lifecycle: &Lifecycle) {
    // The first lookups are one refresh after the start (the load looked every entry up).
    let mut next_due: Option<Instant> = None;
    // Per entry: when a failure was last logged, and failures since.
    let mut failure_log: HashMap<String, (Instant, u64)> = HashMap::new();
    loop {
        if lifecycle.stopped() || lifecycle.draining() {
            return;
        }
        let Some(sup) = supervisor.upgrade() else {
            return;
        };
        let now = Instant::now();
        if let Some(due) = next_due.filter(|&d| now < d) {
            drop(sup);
            std::thread::sleep(NAP.min(due - now));
            continue;
        }
        let config = sup.lock().unwrap_or_else(|e| e.into_inner()).config.clone();
        let refresh = config.server.dns_refresh;
        if config.discovery.is_empty() || refresh.is_zero() {
            next_due = Some(now + NAP);
            continue;
        }
        let first = next_due.is_none();
        next_due = Some(now + refresh);
        if first {
            continue;
        }
        for g in &config.discovery {
            match discover::lookup(&g.spec, &config.server.nameservers) {
                Ok(members) if members == g.members => {
                    failure_log.remove(&g.name);
                    stats.discovered(&g.name, Lookup::Unchanged, members.len(), None);
                }
                Ok(members) => {
                    failure_log.remove(&g.name);
                    let n = members.len();
                    let applied = sup
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .rediscover(&g.name, &g.spec, members);
                    match applied {
                        Some(Ok(_)) => stats.discovered(&g.name, Lookup::Changed, n, None),
                        Some(Err(e)) => stats.discovered(
                            &g.name,
                            Lookup::Failed,
                            g.members.len(),
                            Some(e.to_string()),
                        ),
                        // A reload replaced the entry meanwhile: the next round sees it.
                        None => {}
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    stats.discovered(&g.name, Lookup::Failed, g.members.len(), Some(why.clone()));
                    log_failure(&mut failure_log, &g.name, &g.spec, g.members.len(), &why);
                }
            }
        }
    }
}

/// Logs a failed lookup of `group`: the first one, then at most once per [`LOG_EVERY`] with
/// the count since.
fn log_failure(
    log: &mut HashMap<String, (Instant, u64)>,
    group: &str,
    spec: &discover::DiscoverSpec,
    members: usize,
    why: &str,
) {
    let now = Instant::now();
    let failures = match log.get_mut(group) {
        Some((at, since)) if now.saturating_duration_since(*at) < LOG_EVERY => {
            *since += 1;
            return;
        }
        Some(entry) => {
            let n = entry.1 + 1;
            *entry = (now, 0);
            n
        }
        None => {
            log.insert(group.to_string(), (now, 0));
            1
        }
    };
    tracing::warn!(
        group,
        lookup = %spec,
        keeping = members,
        failures,
        "discovery: a lookup failed: {why}; the last good members keep serving (counted in \
         rolter_discovery_lookups_total)"
    );
}
