//! Applying a reloaded configuration to the running threads: check it can be applied
//! without a restart, build what it needs (TLS settings, strategies, engine threads when
//! their settings changed, a fresh mesh), hand it to the control thread, then to every
//! worker, and wait until each of them serves new requests with it.
//!
//! Owns the running configuration and the engine-state threads between reloads. Runs on the
//! thread that asked for the reload (the main thread on SIGHUP, a short-lived thread for
//! the admin API and the control socket), never on a worker or the control thread's loop.
//! A refused reload changes nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded, Sender};
use rolter_config::discover::{DiscoverSpec, Member};
use rolter_config::prices::price_book;
use rolter_config::reload::{
    restart_needed, same, same_targets, unchanged_routes, unchanged_targets,
};
use rolter_config::Config;
use rolter_core::{KvView, Switches};

use super::control_thread::Adopt;
use super::engine_threads::EngineThreads;
use super::worker::Handoff;
use crate::lifecycle::Lifecycle;
use crate::mesh::admission::RouteQueues;
use crate::mesh::caps::TargetCaps;
use crate::mesh::key_limits::KeyBook;
use crate::mesh::{mesh, ControlLinks, WorkerLinks};
use crate::reload::{ReloadError, ReloadReport, ReloadStats};
use crate::strategies::StrategyFactory;
use crate::trace::{ExporterHandle, Tracer};
use crate::upstream::tls::UpstreamTls;

/// Longest a reload waits for the workers to say they switched.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Supervisor {
    pub config: Arc<Config>,
    /// The running configuration's admission counters (unchanged targets keep theirs).
    pub caps: Arc<TargetCaps>,
    /// The running configuration's key windows (unchanged keys keep theirs).
    pub keys: Arc<KeyBook>,
    pub engine: Option<EngineThreads>,
    pub kv_view: Option<KvView>,
    pub switches: Arc<Switches>,
    pub adopt: Sender<Adopt>,
    pub handoffs: Vec<Sender<Handoff>>,
    pub stats: Arc<ReloadStats>,
    /// Nudges workers sleeping through a quiet tick to take their handoff now.
    pub lifecycle: Arc<Lifecycle>,
    /// The trace exporter thread, while `[tracing]` is configured.
    pub tracing: Option<ExporterHandle>,
}

impl Supervisor {
    /// Loads the file the running configuration came from and applies it.
    pub fn reload_file(&mut self) -> Result<ReloadReport, ReloadError> {
        let path = self.config.source.clone();
        tracing::info!(file = %path.display(), "reloading the configuration");
        let running = self.config.clone();
        // A `discover` entry whose lookup fails now keeps the members it runs with.
        let discover = move |entry: &str, spec: &DiscoverSpec, ns: &[SocketAddr]| {
            rolter_config::system_discover(entry, spec, ns).or_else(|e| {
                let g = running
                    .discovery
                    .iter()
                    .find(|g| g.name == entry && g.spec == *spec)
                    .ok_or_else(|| e.clone())?;
                tracing::warn!(
                    group = entry,
                    members = g.members.len(),
                    "reload: looking up a discover entry failed: {e}; it keeps its running \
                     members"
                );
                Ok(g.members.clone())
            })
        };
        let result = match rolter_config::load_file_discovering(&path, &discover) {
            Ok(c) => self.apply(c),
            Err(errors) => Err(ReloadError::Invalid {
                count: errors.errors.len(),
                errors: errors.to_string(),
            }),
        };
        self.account(&result);
        result
    }

    /// Applies an already loaded configuration (the embedding API and tests).
    pub fn reload_with(&mut self, config: Config) -> Result<ReloadReport, ReloadError> {
        let result = self.apply(config);
        self.account(&result);
        result
    }

    /// Applies a new member set of `discover` entry `group` (looked up as `spec`): the
    /// running configuration with the group's members replaced, through the reload path
    /// (added targets start through slow start, removed ones take no new request and
    /// finish what they serve). `None` when the running configuration no longer has that
    /// entry, or already has these members.
    pub fn rediscover(
        &mut self,
        group: &str,
        spec: &DiscoverSpec,
        members: Vec<Member>,
    ) -> Option<Result<ReloadReport, ReloadError>> {
        let g = self
            .config
            .discovery
            .iter()
            .find(|g| g.name == group && g.spec == *spec)?;
        if g.members == members {
            return None;
        }
        let label = |m: &Member| format!("{group}/{}", m.label());
        let added: Vec<String> = members
            .iter()
            .filter(|m| !g.members.contains(m))
            .map(label)
            .collect();
        let removed: Vec<String> = g
            .members
            .iter()
            .filter(|m| !members.contains(m))
            .map(label)
            .collect();
        let next = self.config.rediscovered(group, members)?;
        let result = self.apply(next);
        match &result {
            Ok(r) => tracing::info!(
                group,
                added = ?added,
                removed = ?removed,
                "discovery: the members changed; {r}"
            ),
            Err(e) => tracing::warn!(
                group,
                added = ?added,
                removed = ?removed,
                "discovery: the members changed but cannot be applied: {e}"
            ),
        }
        Some(result)
    }

    fn account(&self, result: &Result<ReloadReport, ReloadError>) {
        match result {
            Ok(r) => {
                self.stats.succeeded(r);
                tracing::info!("{r}");
            }
            Err(e) => {
                self.stats.refused(e);
                tracing::warn!(result = e.label(), "reload refused: {e}");
            }
        }
    }

    /// Applies `new` when it needs no restart: builds what it runs with, hands it to the
    /// control thread and then to every worker, and makes it the running configuration.
    fn apply(&mut self, new: Config) -> Result<ReloadReport, ReloadError> {
        let restart = restart_needed(&self.config, &new);
        if !restart.is_empty() {
            return Err(ReloadError::RestartNeeded(
                restart.iter().map(ToString::to_string).collect(),
            ));
        }
        let mut next = self.prepare(new)?;
        next.tracer = self.retrace(&next.config)?;
        let (worker_links, control_links) = mesh(self.handoffs.len());
        self.hand_to_control(&next, control_links)?;
        // The control thread runs the new plane: from here the reload is committed.
        self.hand_to_workers(&next, worker_links);
        Ok(self.commit(next))
    }

    /// The exporter for `config`'s `[tracing]`: the running one with the new settings, a
    /// new one when the section appears, none (the old one flushed and stopped) when it
    /// goes.
    fn retrace(&mut self, config: &Config) -> Result<Option<Tracer>, ReloadError> {
        let failed = |e: std::io::Error| ReloadError::Failed(format!("trace exporter: {e}"));
        match (&mut self.tracing, &config.tracing) {
            (Some(h), Some(t)) => h.reload(t).map(Some).map_err(failed),
            (None, Some(t)) => {
                let (tracer, handle) = crate::trace::start(t).map_err(failed)?;
                self.tracing = Some(handle);
                Ok(Some(tracer))
            }
            (Some(_), None) => {
                if let Some(h) = self.tracing.take() {
                    h.shutdown();
                }
                Ok(None)
            }
            (None, None) => Ok(None),
        }
    }

    /// Builds what `new` runs with, keeping what unchanged targets, keys and engine-state
    /// settings had.
    fn prepare(&self, new: Config) -> Result<Prepared, ReloadError> {
        let tls = Arc::new(
            UpstreamTls::build(&new.targets).map_err(|e| ReloadError::Failed(e.to_string()))?,
        );
        // The engine-state threads are per target: they restart only when the targets or
        // the index settings changed (the KV index starts empty then).
        let keep_engine =
            same_targets(&self.config, &new) && same(&self.config.kv_events, &new.kv_events);
        let (engine, kv_view) = if keep_engine {
            (None, self.kv_view.clone())
        } else {
            let (e, v) = EngineThreads::start(&new)
                .map_err(|e| ReloadError::Failed(format!("engine-state threads: {e}")))?;
            (Some(e), v)
        };
        let routes_kept = unchanged_routes(&self.config, &new)
            .iter()
            .filter(|r| r.is_some())
            .count();
        let targets_kept = unchanged_targets(&self.config.targets, &new.targets)
            .iter()
            .filter(|t| t.is_some())
            .count();
        let caps = TargetCaps::new(&new.targets, Some((&self.caps, &self.config.targets)));
        let keys = KeyBook::new(&new.keys.keys, Some((&self.keys, &self.config.keys.keys)));
        let config = Arc::new(new);
        let strategies = Arc::new(StrategyFactory::new(
            &config,
            price_book(&config),
            self.switches.clone(),
            kv_view.clone(),
        ));
        Ok(Prepared {
            tracer: None,
            queues: RouteQueues::new(&config),
            config,
            tls,
            caps,
            keys,
            strategies,
            engine,
            kv_view,
            routes_kept,
            targets_kept,
        })
    }

    /// Hands the new configuration to the control thread and waits until its plane runs
    /// (the control thread takes it on its next tick: its loop never blocks).
    fn hand_to_control(&self, next: &Prepared, links: ControlLinks) -> Result<(), ReloadError> {
        let kv_reports = match &next.engine {
            Some(e) => e.kv_reports(),
            None => self.engine.as_ref().and_then(EngineThreads::kv_reports),
        };
        let (adopted_tx, adopted) = bounded(1);
        let adopt = Adopt {
            config: next.config.clone(),
            tls: next.tls.clone(),
            links,
            strategies: next.strategies.clone(),
            keys: next.keys.clone(),
            kv_reports,
            tracer: next.tracer.clone(),
            done: adopted_tx,
        };
        let gone = || ReloadError::Failed("the gateway is stopping".into());
        self.adopt.send(adopt).map_err(|_| gone())?;
        // A control thread sleeping through a quiet tick takes it now.
        self.lifecycle.nudge();
        adopted.recv().map_err(|_| gone())
    }

    /// Hands the new configuration to every worker still running and waits (up to
    /// [`SWITCH_TIMEOUT`]) until each serves new requests with it.
    fn hand_to_workers(&self, next: &Prepared, links: Vec<WorkerLinks>) {
        let (switched_tx, switched) = unbounded();
        let mut sent = 0;
        for (tx, links) in self.handoffs.iter().zip(links) {
            let handoff = Handoff {
                config: next.config.clone(),
                tls: next.tls.clone(),
                caps: next.caps.clone(),
                queues: next.queues.clone(),
                keys: next.keys.clone(),
                strategies: next.strategies.clone(),
                tracer: next.tracer.clone(),
                links,
                done: switched_tx.clone(),
            };
            // A worker that already stopped (a drain) takes nothing.
            sent += usize::from(tx.send(handoff).is_ok());
        }
        self.lifecycle.nudge();
        let deadline = std::time::Instant::now() + SWITCH_TIMEOUT;
        let mut slow = 0;
        for _ in 0..sent {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if switched.recv_timeout(left).is_err() {
                slow += 1;
            }
        }
        if slow > 0 {
            // Each worker switches when it reaches its tick; a busy one just takes longer.
            tracing::warn!(
                workers = slow,
                "reload: some workers had not switched after {SWITCH_TIMEOUT:?}; they do at \
                 their next tick"
            );
        }
    }

    /// Makes the new configuration the running one (stopping replaced engine-state
    /// threads), and reports it.
    fn commit(&mut self, next: Prepared) -> ReloadReport {
        if let Some(e) = next.engine {
            if let Some(old) = self.engine.replace(e) {
                old.stop();
            }
            self.kv_view = next.kv_view;
        }
        let config = next.config;
        let report = ReloadReport {
            digest: config.digest.clone(),
            targets: config.targets.len(),
            routes: config.routes.len(),
            routes_kept: next.routes_kept,
            targets_kept: next.targets_kept,
        };
        self.config = config;
        self.caps = next.caps;
        self.keys = next.keys;
        report
    }
}

/// What a reloaded configuration runs with, built before anything is handed over.
struct Prepared {
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    caps: Arc<TargetCaps>,
    /// Fresh route queues (a waiter stays in its own configuration's).
    queues: Arc<RouteQueues>,
    keys: Arc<KeyBook>,
    strategies: Arc<StrategyFactory>,
    /// New engine-state threads, when the targets or their settings changed.
    engine: Option<EngineThreads>,
    /// The trace exporter the new configuration records with (`retrace`).
    tracer: Option<Tracer>,
    kv_view: Option<KvView>,
    routes_kept: usize,
    targets_kept: usize,
}
