//! What a configuration reload reports, the reload counters, the hook through which the
//! admin API (`POST /admin/reload`) and the control socket (`rolter reload`) ask for one,
//! and the counters of DNS discovery (a changed member set is applied as a reload).
//!
//! Owns those values only: the reload itself is the runtime's (`runtime::supervisor`). Read
//! by the control thread when it renders `/metrics` and `/admin/config`; never touched on
//! the request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// What a successful reload changed.
#[derive(Debug, Clone)]
pub struct ReloadReport {
    /// The new configuration's SHA-256.
    pub digest: String,
    pub targets: usize,
    pub routes: usize,
    /// Routes whose strategy state carried over (unchanged route over unchanged targets).
    pub routes_kept: usize,
    /// Targets whose keep-alive connections and health carried over.
    pub targets_kept: usize,
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "reloaded: sha256 {}, {} targets ({} unchanged), {} routes ({} kept their strategy state)",
            self.digest, self.targets, self.targets_kept, self.routes, self.routes_kept
        )
    }
}

/// Why a reload changed nothing (the running configuration keeps serving).
#[derive(Debug, Clone)]
pub enum ReloadError {
    /// The new file does not load: every error, as `rolter check` prints them.
    Invalid { errors: String, count: usize },
    /// Settings only a restart (or `rolter run --upgrade`) can change.
    RestartNeeded(Vec<String>),
    /// The new configuration loaded but could not be started (a TLS file, the engine
    /// threads, a worker that did not switch in time).
    Failed(String),
}

impl ReloadError {
    /// The `rolter_config_reloads_total` result label.
    pub fn label(&self) -> &'static str {
        match self {
            ReloadError::Invalid { .. } => "invalid",
            ReloadError::RestartNeeded(_) => "restart_needed",
            ReloadError::Failed(_) => "failed",
        }
    }
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::Invalid { errors, count } => write!(
                f,
                "{errors}\n{count} error(s); the running configuration keeps serving"
            ),
            ReloadError::RestartNeeded(keys) => {
                for k in keys {
                    writeln!(f, "{k}")?;
                }
                write!(
                    f,
                    "{} setting(s) need a restart; nothing was changed",
                    keys.len()
                )
            }
            ReloadError::Failed(e) => write!(
                f,
                "cannot apply the new configuration: {e}; the running configuration keeps serving"
            ),
        }
    }
}

/// Runs one reload of the configuration file the gateway was started with.
pub type ReloadHook = Arc<dyn Fn() -> Result<ReloadReport, ReloadError> + Send + Sync>;

/// Reload counts and the running configuration's identity.
#[derive(Default)]
pub struct ReloadStats {
    ok: AtomicU64,
    invalid: AtomicU64,
    restart_needed: AtomicU64,
    failed: AtomicU64,
    /// Unix time (seconds) of the start, then of the last successful reload.
    last_success: AtomicU64,
    current: Mutex<Running>,
    hook: OnceLock<ReloadHook>,
    /// Per `discover` entry, by name: its lookups and members.
    discovery: Mutex<std::collections::BTreeMap<String, DiscoveryCounts>>,
}

/// One `discover` entry's lookups since the start, and its members now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryCounts {
    /// The answer had the running members.
    pub unchanged: u64,
    /// The answer changed the members (applied as a reload).
    pub changed: u64,
    /// An error or an empty answer: the last good members were kept.
    pub failed: u64,
    /// Members in the running configuration.
    pub members: usize,
    /// The last failed lookup's message, until one succeeds.
    pub last_error: Option<String>,
}

/// What a lookup of a `discover` entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Unchanged,
    Changed,
    Failed,
}

/// The running configuration as the admin API shows it.
#[derive(Debug, Clone, Default)]
pub struct Running {
    pub source: String,
    pub digest: String,
    /// The last failed reload's message, until a reload succeeds.
    pub last_error: Option<String>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ReloadStats {
    /// Stats of a gateway started with the configuration `source` whose SHA-256 is `digest`.
    pub fn new(source: String, digest: String) -> Self {
        let s = ReloadStats::default();
        s.last_success.store(unix_now(), Ordering::Relaxed);
        *s.current.lock().unwrap_or_else(|e| e.into_inner()) = Running {
            source,
            digest,
            last_error: None,
        };
        s
    }

    /// Sets what `POST /admin/reload` and the control socket run (once, at start).
    pub fn set_hook(&self, hook: ReloadHook) {
        let _ = self.hook.set(hook);
    }

    /// Runs a reload through the hook (blocking: call it off the control thread's loop).
    pub fn trigger(&self) -> Result<ReloadReport, ReloadError> {
        match self.hook.get() {
            Some(h) => h(),
            None => Err(ReloadError::Failed(
                "this gateway was started without a configuration file to reload".into(),
            )),
        }
    }

    pub fn succeeded(&self, report: &ReloadReport) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        self.last_success.store(unix_now(), Ordering::Relaxed);
        let mut c = self.current.lock().unwrap_or_else(|e| e.into_inner());
        c.digest = report.digest.clone();
        c.last_error = None;
    }

    pub fn refused(&self, e: &ReloadError) {
        let counter = match e {
            ReloadError::Invalid { .. } => &self.invalid,
            ReloadError::RestartNeeded(_) => &self.restart_needed,
            ReloadError::Failed(_) => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error = Some(e.to_string());
    }

    pub fn running(&self) -> Running {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reloads by result label: `ok`, `invalid`, `restart_needed`, `failed`.
    pub fn counts(&self) -> [(&'static str, u64); 4] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("ok", g(&self.ok)),
            ("invalid", g(&self.invalid)),
            ("restart_needed", g(&self.restart_needed)),
            ("failed", g(&self.failed)),
        ]
    }

    /// Counts one lookup of `group`, which has `members` members afterwards (`error`: why
    /// it failed).
    pub fn discovered(&self, group: &str, outcome: Lookup, members: usize, error: Option<String>) {
        let mut map = self.discovery.lock().unwrap_or_else(|e| e.into_inner());
        let c = map.entry(group.to_string()).or_default();
        match outcome {
            Lookup::Unchanged => c.unchanged += 1,
            Lookup::Changed => c.changed += 1,
            Lookup::Failed => c.failed += 1,
        }
        c.members = members;
        c.last_error = error;
    }

    /// Every `discover` entry's counts, by name.
    pub fn discovery(&self) -> Vec<(String, DiscoveryCounts)> {
        let map = self.discovery.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Unix time of the start or the last successful reload.
    pub fn last_success(&self) -> u64 {
        self.last_success.load(Ordering::Relaxed)
    }
}
