//! The control thread's state: the merged load view (every core's latest snapshot), the
//! health book, scrape results, a TTFT average per target for operators, and the gateway's
//! metrics. It turns them into the per-target signals the workers route on.
//!
//! Owned by the control thread only (`Rc<RefCell<…>>` shared by its tasks). It must not
//! block: probes and the admin listener are separate tasks that update it between awaits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rolter_config::reload::unchanged_targets;
use rolter_config::{Config, HealthConfig};
use rolter_core::{Needs, Sample, Switches, Verdict};
use rolter_engine::fleet::{Fleet, FleetRoute, FleetTarget, HealthSettings};
use rolter_engine::health::{HealthBook, HealthEvent};
use rolter_engine::kv::reports::KvReports;
use rolter_engine::lora_book::LoraBook;
use rolter_engine::scrape::EngineMetrics;
use rolter_strategy::Strategy;

use super::dns::{self, DnsBook};
use crate::access_log::{line, AccessSink, Entry};
use crate::mesh::load::TargetSignal;
use crate::mesh::messages::{AttemptNotes, HedgeEvent};
use crate::mesh::{Kind, MeshDrops, Record, ToControl};
use crate::metrics::{GatewayMetrics, ScrapeStatus, TargetGauges};
use crate::strategies::StrategyFactory;

/// Signals are re-sent at least this often even when unchanged, so a worker that missed a
/// message (full inbox) catches up.
const REPUBLISH: Duration = Duration::from_secs(1);

/// Weight of a new sample in the operator-facing TTFT average.
const TTFT_ALPHA: f64 = 0.2;

/// The latest scrape of one target.
#[derive(Debug, Default)]
pub struct ScrapeSlot {
    pub last_ok: Option<Instant>,
    pub metrics: Option<EngineMetrics>,
    pub last_error: Option<String>,
    /// Whether the last check found the scrape fresh (for logging transitions once).
    fresh: bool,
    failing: bool,
}

pub struct Plane {
    pub config: Arc<Config>,
    /// Poked when a probe, a scrape or a model listing delivered its result.
    pub stir: std::rc::Rc<super::stir::Stir>,
    pub health: HealthBook,
    pub metrics: GatewayMetrics,
    /// The routes' queue series.
    pub queues: crate::metrics::queue::QueueMetrics,
    pub switches: Arc<Switches>,
    /// The latest in-flight snapshot from each worker.
    loads: Vec<Option<Arc<[u32]>>>,
    pub scrapes: Vec<ScrapeSlot>,
    /// Operator-facing TTFT average (ms) and sample count per target.
    ttft: Vec<(Option<f64>, u64)>,
    published: Option<Arc<[TargetSignal]>>,
    last_publish: Option<Instant>,
    events: Vec<HealthEvent>,
    /// One instance of each route's strategy, taught by every sample like the workers'
    /// instances, so the admin API can show what the routes have learned. It never picks.
    mirrors: Vec<Box<dyn Strategy>>,
    /// Per (route, reason): when a fallback was last logged and how many happened since.
    fallbacks: std::collections::HashMap<(u16, &'static str), (Instant, u64)>,
    /// The KV-event plane's per-target reports, when any target publishes events.
    pub kv_reports: Option<KvReports>,
    /// Reload counts and the running configuration's digest, for `/metrics`.
    pub reloads: Option<Arc<crate::reload::ReloadStats>>,
    /// The client API keys' counts, for `/metrics` (`None` in tests that build a bare plane).
    pub keys: Option<Arc<crate::mesh::key_limits::KeyBook>>,
    /// The workers' busy-polling time (`rolter_busy_poll_seconds_total`).
    pub poll_stats: Option<Arc<crate::mesh::polling::PollStats>>,
    /// The trace exporter's counters (`[tracing]`), for `/metrics`.
    pub tracer: Option<crate::trace::Tracer>,
    /// What the mesh's senders dropped (every worker's, then the control thread's).
    mesh_drops: Vec<Arc<MeshDrops>>,
    /// The drop total last logged.
    drops_logged: u64,
    last_drop_log: Option<Instant>,
    /// Rate-limited log book of failing cache lookups, per (route, problem), and of failing
    /// adapter loads, per (target, "adapter_load"); spent retry budgets, per (route,
    /// "retry_budget").
    lookup_problems: std::collections::HashMap<(u16, &'static str), (Instant, u64)>,
    /// LoRA adapter residency per target, for routes that read it.
    pub lora: LoraBook,
    /// Where each target's new connections go, and the re-resolution of host names.
    pub dns: DnsBook,
    /// Where finished requests' access-log lines go (`None`: `log.access = "off"`).
    pub access: Option<AccessSink>,
    /// Access-log lines of this tick, handed to the writer as one batch.
    access_lines: Vec<u8>,
    access_count: usize,
    /// The fleet plane's control end (`None` without `[state]`), for `/metrics` and
    /// `/admin/state`.
    pub fleet: Option<std::rc::Rc<std::cell::RefCell<crate::fleet::news::FleetControl>>>,
    /// Rate-limited log book of failed attempts, per (target, cause).
    upstream_failures: std::collections::HashMap<(u16, &'static str), (Instant, u64)>,
    /// Until when each target cools after a 429 some worker saw (sent to every worker).
    cooling: Vec<Option<Instant>>,
}

/// Failed attempts are logged at most this often per target and cause (the metrics count
/// every one).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(1);

/// Fallback picks are logged at most this often per route and reason (the metrics count
/// every one).
const FALLBACK_LOG_EVERY: Duration = Duration::from_secs(60);
/// `rolter_cache_lookups_total` result of an answer naming an instance of no route target.
const UNKNOWN_INSTANCE: &str = "unknown_instance";

/// An access-log batch is handed to the writer once it holds this many bytes, and at the
/// end of every drain of the inbox.
const ACCESS_BATCH_BYTES: usize = 64 * 1024;

/// Counts one more occurrence of `key` in a rate-limited log book; `Some((first, count))`
/// when a line is due: at the first occurrence, then once per [`FALLBACK_LOG_EVERY`] with
/// the count since the last line.
fn log_due(
    book: &mut std::collections::HashMap<(u16, &'static str), (Instant, u64)>,
    key: (u16, &'static str),
    now: Instant,
) -> Option<(bool, u64)> {
    log_due_every(book, key, now, FALLBACK_LOG_EVERY)
}

/// [`log_due`] with its own interval.
fn log_due_every(
    book: &mut std::collections::HashMap<(u16, &'static str), (Instant, u64)>,
    key: (u16, &'static str),
    now: Instant,
    every: Duration,
) -> Option<(bool, u64)> {
    match book.get_mut(&key) {
        Some(e) => {
            e.1 += 1;
            if now.saturating_duration_since(e.0) < every {
                return None;
            }
            let v = *e;
            *e = (now, 0);
            Some((false, v.1))
        }
        None => {
            book.insert(key, (now, 0));
            Some((true, 1))
        }
    }
}

impl Plane {
    pub fn new(
        config: Arc<Config>,
        switches: Arc<Switches>,
        strategies: &StrategyFactory,
        workers: usize,
        mesh_drops: Vec<Arc<MeshDrops>>,
    ) -> Self {
        let route_names: Vec<String> = config.routes.iter().map(|r| r.name.clone()).collect();
        let strategy_names: Vec<&'static str> =
            config.routes.iter().map(|r| r.strategy.name()).collect();
        let target_names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
        let n = config.targets.len();
        let mirrors: Vec<Box<dyn Strategy>> = config
            .routes
            .iter()
            .map(|r| strategies.build(r, 0))
            .collect();
        let needs: Vec<Needs> = mirrors.iter().map(|m| m.needs()).collect();
        let fleet = engine_fleet(&config);
        let lora = LoraBook::new(&fleet, &needs);
        Plane {
            stir: std::rc::Rc::default(),
            dns: DnsBook::new(&config, dns::system_resolver(), Instant::now()),
            lora,
            mirrors,
            health: HealthBook::new(
                &health_settings(&config.health),
                &fleet.targets,
                &fleet.routes,
            ),
            metrics: GatewayMetrics::new(&route_names, &strategy_names, &target_names),
            queues: crate::metrics::queue::QueueMetrics::new(
                config
                    .routes
                    .iter()
                    .map(|r| r.queue.map(|_| r.name.clone()))
                    .collect(),
                crate::metrics::queue::AdmissionNames {
                    routes: config.routes.iter().map(|r| r.name.clone()).collect(),
                    classes: config.classes.iter().map(|c| c.name.clone()).collect(),
                    keys: config.keys.keys.iter().map(|k| k.name.clone()).collect(),
                },
            ),
            switches,
            loads: vec![None; workers],
            scrapes: (0..n).map(|_| ScrapeSlot::default()).collect(),
            ttft: vec![(None, 0); n],
            published: None,
            last_publish: None,
            events: Vec::new(),
            fallbacks: Default::default(),
            lookup_problems: Default::default(),
            kv_reports: None,
            reloads: None,
            keys: None,
            poll_stats: None,
            tracer: None,
            access_lines: Vec::new(),
            access_count: 0,
            mesh_drops,
            drops_logged: 0,
            last_drop_log: None,
            access: None,
            fleet: None,
            upstream_failures: Default::default(),
            cooling: vec![None; n],
            config,
        }
    }

    /// Takes over what `old` (the plane of the configuration a reload replaced) knows that
    /// still holds: the counters and histograms when the route and target names are the
    /// same (so `/metrics` series continue), and the health, scrape results and TTFT
    /// averages of every unchanged target.
    pub fn inherit(&mut self, old: &mut Plane) {
        let names = |c: &Config| {
            (
                c.routes.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
                c.targets.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
            )
        };
        if names(&old.config) == names(&self.config) {
            std::mem::swap(&mut self.metrics, &mut old.metrics);
            std::mem::swap(&mut self.fallbacks, &mut old.fallbacks);
            std::mem::swap(&mut self.lookup_problems, &mut old.lookup_problems);
        }
        let map = unchanged_targets(&old.config.targets, &self.config.targets);
        self.health.inherit(&old.health, &map);
        self.health.joined_by_reload(&map, Instant::now());
        for (t, from) in map.iter().enumerate() {
            if let Some(o) = *from {
                self.scrapes[t] = std::mem::take(&mut old.scrapes[o]);
                self.ttft[t] = old.ttft[o];
                self.cooling[t] = old.cooling[o];
            }
        }
    }

    /// Whether records indexed by `old`'s routes and targets mean the same in this plane.
    pub fn same_indices(&self, old: &Config) -> bool {
        old.routes.len() == self.config.routes.len()
            && old.targets.len() == self.config.targets.len()
            && old
                .routes
                .iter()
                .zip(&self.config.routes)
                .all(|(a, b)| a.name == b.name)
            && old
                .targets
                .iter()
                .zip(&self.config.targets)
                .all(|(a, b)| a.name == b.name)
    }

    /// Folds the records still arriving from a replaced configuration's requests (their
    /// load snapshots no longer count). `true` once every worker has dropped that
    /// configuration and the inbox is empty.
    pub fn drain_retired(&mut self, inbox: &Receiver<ToControl>, now: Instant) -> bool {
        loop {
            match inbox.try_recv() {
                Ok(ToControl::Records(records)) => {
                    for r in &records {
                        self.fold(r, now);
                    }
                }
                Ok(_) => {}
                Err(crossbeam_channel::TryRecvError::Empty) => {
                    self.flush_access();
                    return false;
                }
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    self.flush_access();
                    return true;
                }
            }
        }
    }

    /// Requests in flight to `t` on every core, as last reported.
    pub fn in_flight(&self, t: usize) -> u64 {
        self.loads
            .iter()
            .flatten()
            .map(|s| u64::from(s.get(t).copied().unwrap_or(0)))
            .sum()
    }

    /// The engine's queue depth when the scrape is fresh.
    pub fn queue_depth(&self, t: usize, now: Instant) -> Option<u64> {
        if !self.scrape_fresh(t, now) {
            return None;
        }
        self.scrapes[t]
            .metrics
            .as_ref()
            .and_then(|m| m.queue_depth())
    }

    fn scrape_fresh(&self, t: usize, now: Instant) -> bool {
        self.config.scrape.enabled
            && self.config.targets[t].scrape
            && self.scrapes[t].last_ok.is_some_and(|at| {
                now.saturating_duration_since(at) <= self.config.scrape.stale_after
            })
    }

    pub fn ttft_ms(&self, t: usize) -> (Option<f64>, u64) {
        self.ttft[t]
    }

    /// Hands the access-log lines folded so far to the writer as one batch; a batch that
    /// does not fit its buffer is dropped and its lines counted.
    fn flush_access(&mut self) {
        if self.access_count == 0 {
            return;
        }
        let Some(sink) = &self.access else {
            return;
        };
        let lines = std::mem::replace(
            &mut self.access_lines,
            Vec::with_capacity(ACCESS_BATCH_BYTES),
        );
        if !sink.send(lines, self.access_count) {
            self.metrics
                .record_access_log_drops(self.access_count as u64);
        }
        self.access_count = 0;
    }

    /// Folds everything waiting from the workers in; how many batches of records there
    /// were (a load snapshot alone, such as a quiet worker's heartbeat, is not counted).
    pub fn drain(&mut self, inbox: &Receiver<ToControl>, now: Instant) -> usize {
        let mut batches = 0;
        while let Ok(msg) = inbox.try_recv() {
            match msg {
                ToControl::Load { from, snapshot } => {
                    if let Some(slot) = self.loads.get_mut(from) {
                        *slot = Some(snapshot);
                    }
                }
                ToControl::Records(records) => {
                    batches += 1;
                    for r in &records {
                        self.fold(r, now);
                    }
                }
            }
        }
        self.flush_access();
        let mut events = std::mem::take(&mut self.events);
        self.health.tick(now, &mut events);
        for e in events.drain(..) {
            self.log_event(e);
        }
        self.events = events;
        batches
    }

    /// Folds one record from a worker into the metrics, the books and the logs.
    fn fold(&mut self, r: &Record, now: Instant) {
        match *r {
            Record::Attempt {
                route,
                ref sample,
                verdict,
                notes,
            } => self.fold_attempt(route, sample, verdict, notes, now),
            Record::Fallback { route, reason } => {
                self.metrics.record_fallback(route as usize, reason);
                self.log_fallback(route, reason, now);
            }
            Record::Bases { route, ref counts } => {
                self.metrics.record_bases(route as usize, counts);
            }
            Record::CacheLookup {
                route,
                result,
                unknown_instances,
            } => self.fold_cache_lookup(route, result, unknown_instances, now),
            Record::AdapterLoad {
                target,
                adapter,
                loaded,
            } => self.fold_adapter_load(target, adapter, loaded, now),
            Record::Gateway { status, code } => self.metrics.record_gateway_response(status, code),
            Record::TlsHandshake { result, seconds } => {
                self.metrics.record_tls_handshake(result, seconds)
            }
            Record::Retry { route, reason } => self.metrics.record_retry(route as usize, reason),
            Record::Hedge { route, event } => match event {
                HedgeEvent::Sent => self.metrics.record_hedge(route as usize, false),
                HedgeEvent::Won => self.metrics.record_hedge(route as usize, true),
                HedgeEvent::Skipped(why) => self.metrics.record_hedge_skipped(route as usize, why),
            },
            Record::Cooldown { target, until } => self.fold_cooldown(target as usize, until),
            Record::UsageUnreported { target } => self.fold_usage_unreported(target, now),
            Record::RetryBudgetExhausted { route } => self.fold_budget_exhausted(route, now),
            Record::Queued { route, class } => self.queues.queued(route, class),
            Record::Queue {
                route,
                class,
                tenant,
                result,
                waited,
            } => self.queues.left(route, (class, tenant), result, waited),
            Record::Request(ref entry) => self.fold_access_line(entry),
        }
    }

    /// One finished upstream attempt: its metrics, the strategy mirrors, the TTFT average,
    /// the health book, and a re-resolution when the target gave no response at all.
    fn fold_attempt(
        &mut self,
        route: u16,
        sample: &Sample,
        verdict: Verdict,
        notes: AttemptNotes,
        now: Instant,
    ) {
        self.metrics.record_outcome(
            route as usize,
            sample,
            notes.cut.map(|c| c.label()),
            notes.estimated_completion,
        );
        if verdict == Verdict::TargetFailed {
            self.log_failure(route, sample.target, sample.status, notes, now);
        }
        self.metrics.record_decision(route as usize, sample.target);
        for m in &mut self.mirrors {
            m.observe(sample);
        }
        if verdict == Verdict::Success {
            if let Some(ttft) = sample.ttft {
                self.learn_ttft(sample.target, ttft);
            }
        }
        self.health.on_sample(sample);
        if let Some(e) = self.health.on_attempt(sample.target, verdict, now) {
            self.log_event(e);
        }
        // No response at all (connect refused or timed out, a reset): the name may
        // point elsewhere by now.
        if verdict == Verdict::TargetFailed && sample.status == 0 {
            self.dns.connect_failed(sample.target, now);
        }
    }

    /// Moves `target`'s operator-facing TTFT average toward a successful attempt's `ttft`.
    fn learn_ttft(&mut self, target: usize, ttft: Duration) {
        let Some(slot) = self.ttft.get_mut(target) else {
            return;
        };
        let ms = ttft.as_secs_f64() * 1000.0;
        slot.0 = Some(match slot.0 {
            Some(old) => old + TTFT_ALPHA * (ms - old),
            None => ms,
        });
        slot.1 += 1;
    }

    /// A cache-controller lookup: counted by result, once more as `unknown_instance` when
    /// the answer named instances of no route target, and logged when it went wrong.
    fn fold_cache_lookup(
        &mut self,
        route: u16,
        result: &'static str,
        unknown_instances: u32,
        now: Instant,
    ) {
        self.metrics.record_cache_lookup(route as usize, result);
        if matches!(result, "timeout" | "error") {
            self.log_lookup_problem(route, result, now);
        }
        if unknown_instances > 0 {
            self.metrics
                .record_cache_lookup(route as usize, UNKNOWN_INSTANCE);
            self.log_lookup_problem(route, UNKNOWN_INSTANCE, now);
        }
    }

    /// A LoRA adapter load the gateway made: counted, noted in the LoRA book when it
    /// loaded, logged (rate-limited) when it failed.
    fn fold_adapter_load(&mut self, target: u16, adapter: u64, loaded: bool, now: Instant) {
        self.metrics.record_adapter_load(target as usize, loaded);
        if loaded {
            self.lora.loaded_by_gateway(target as usize, adapter, now);
            return;
        }
        if let Some((first, since)) =
            log_due(&mut self.lookup_problems, (target, "adapter_load"), now)
        {
            tracing::warn!(
                target = %self.config.targets[target as usize].name,
                failures = since,
                first,
                "loading a LoRA adapter on the target failed; the request was forwarded anyway (counted in rolter_adapter_loads_total)"
            );
        }
    }

    /// A target asked to be left alone until `until`: counted, and its cooling extended.
    fn fold_cooldown(&mut self, target: usize, until: Instant) {
        self.metrics.record_cooldown(target);
        if let Some(c) = self.cooling.get_mut(target) {
            if c.is_none_or(|u| u < until) {
                *c = Some(until);
            }
        }
    }

    /// A worker found a target's stream without the usage it asked for: counted, and
    /// logged (rate-limited).
    fn fold_usage_unreported(&mut self, target: u16, now: Instant) {
        self.metrics.record_usage_unreported(target as usize);
        if log_due(&mut self.lookup_problems, (target, "stream_usage"), now).is_none() {
            return;
        }
        let Some(t) = self.config.targets.get(target as usize) else {
            return;
        };
        tracing::warn!(
            target = %t.name,
            "the target's stream came back without the usage it was asked for (stream_options.include_usage): that worker counts its streams' content deltas until the next reload; set stream_usage = \"count\" on the target to stop asking (counted in rolter_stream_usage_unreported_total)"
        );
    }

    /// A retry refused by the route's budget: counted, and logged (rate-limited).
    fn fold_budget_exhausted(&mut self, route: u16, now: Instant) {
        self.metrics.record_budget_exhausted(route as usize);
        let Some((first, since)) = log_due(&mut self.lookup_problems, (route, "retry_budget"), now)
        else {
            return;
        };
        let r = &self.config.routes[route as usize];
        tracing::warn!(
            route = %r.name,
            refused = since,
            first,
            retry_budget = r.retry.budget,
            retry_budget_min = r.retry.budget_min,
            "the route's retry budget is spent: failed requests get their error without a retry (counted in rolter_retry_budget_exhausted_total)"
        );
    }

    /// A finished request's access-log line, added to this tick's batch (handed over early
    /// once the batch is full).
    fn fold_access_line(&mut self, entry: &Entry) {
        if self.access.is_none() {
            return;
        }
        line::write(entry, &self.config, &mut self.access_lines);
        self.access_count += 1;
        if self.access_lines.len() >= ACCESS_BATCH_BYTES {
            self.flush_access();
        }
    }

    /// Says in the log that an attempt on a target failed: at the first failure of a cause,
    /// then at most once a second per target and cause with the count since.
    fn log_failure(
        &mut self,
        route: u16,
        target: usize,
        status: u16,
        notes: AttemptNotes,
        now: Instant,
    ) {
        let cause = match (notes.cut, notes.error) {
            (Some(c), _) => c.label(),
            (None, Some(code)) => code,
            (None, None) if status >= 500 => "upstream_5xx",
            (None, None) => "upstream_failed",
        };
        let Some((first, since)) = log_due_every(
            &mut self.upstream_failures,
            (target as u16, cause),
            now,
            FAILURE_LOG_EVERY,
        ) else {
            return;
        };
        let route = self
            .config
            .routes
            .get(route as usize)
            .map_or("", |r| r.name.as_str());
        let target = self
            .config
            .targets
            .get(target)
            .map_or("", |t| t.name.as_str());
        tracing::warn!(
            target = %target,
            route = %route,
            cause,
            status,
            failures = since,
            first,
            "upstream attempt failed (every attempt is counted in rolter_requests_total)"
        );
    }

    /// Says in the log that a route's strategy is running on its fallback: at the first
    /// fallback pick, then at most once a minute with the count since.
    fn log_fallback(&mut self, route: u16, reason: &'static str, now: Instant) {
        let Some((logged, since)) = log_due(&mut self.fallbacks, (route, reason), now) else {
            return;
        };
        let r = &self.config.routes[route as usize];
        tracing::info!(
            route = %r.name,
            strategy = r.strategy.name(),
            reason,
            picks = since,
            first = logged,
            "strategy picked by its fallback (every such pick is counted in rolter_strategy_fallbacks_total)"
        );
    }

    /// Says in the log that a route's cache lookups fail or name unknown instances: at the
    /// first, then at most once a minute with the count since.
    fn log_lookup_problem(&mut self, route: u16, problem: &'static str, now: Instant) {
        let Some((first, since)) = log_due(&mut self.lookup_problems, (route, problem), now) else {
            return;
        };
        let r = &self.config.routes[route as usize];
        let controller = r.cache_controller.as_ref().map_or("", |c| c.url.as_str());
        if problem == UNKNOWN_INSTANCE {
            tracing::warn!(
                route = %r.name,
                controller,
                lookups = since,
                first,
                "the cache controller named LMCache instances that are no target of this route; set each target's lmcache_instance to the id its engine registers (LMCACHE_LMCACHE_INSTANCE_ID)"
            );
        } else {
            tracing::warn!(
                route = %r.name,
                controller,
                problem,
                lookups = since,
                first,
                "cache-controller lookups fail; picks fall back to load (counted in rolter_cache_lookups_total)"
            );
        }
    }

    fn log_event(&mut self, e: HealthEvent) {
        let name = |t: usize| self.config.targets[t].name.clone();
        match e {
            HealthEvent::Ejected { target, duration } => {
                self.metrics.record_ejection(target);
                tracing::warn!(
                    target = %name(target),
                    seconds = duration.as_secs(),
                    failures = self.config.health.failures,
                    "target ejected after consecutive failures"
                );
            }
            HealthEvent::SlowEjected {
                target,
                duration,
                ratio,
            } => {
                self.metrics.record_ejection(target);
                tracing::warn!(
                    target = %name(target),
                    seconds = duration.as_secs(),
                    times_peers_median = format!("{ratio:.1}"),
                    for_seconds = self.config.health.latency_for.as_secs(),
                    "target ejected as a latency outlier: far slower than its peers"
                );
            }
            HealthEvent::EjectionCapped { target } => tracing::warn!(
                target = %name(target),
                max_ejected_percent = self.config.health.max_ejected_percent,
                "target keeps failing but stays in rotation: ejecting it would exceed a route's ejection cap"
            ),
            HealthEvent::Returned { target } => {
                tracing::info!(target = %name(target), "ejected target is back in rotation")
            }
            HealthEvent::Unhealthy { target } => tracing::warn!(
                target = %name(target),
                "target failed its active health checks; out of rotation"
            ),
            HealthEvent::Healthy { target } => tracing::info!(
                target = %name(target),
                "target passes its active health checks again; back in rotation"
            ),
        }
    }

    /// Records a scrape result.
    pub fn scraped(&mut self, t: usize, result: Result<EngineMetrics, String>, now: Instant) {
        let name = self.config.targets[t].name.clone();
        let slot = &mut self.scrapes[t];
        match result {
            Ok(m) => {
                if slot.failing {
                    tracing::info!(target = %name, "metrics scrape succeeds again");
                }
                slot.failing = false;
                slot.last_ok = Some(now);
                slot.metrics = Some(m);
                slot.last_error = None;
            }
            Err(e) => {
                if !slot.failing {
                    tracing::warn!(target = %name, error = %e, "metrics scrape failed");
                }
                slot.failing = true;
                slot.last_error = Some(e);
                self.metrics.record_scrape_failure(t);
            }
        }
    }

    /// Records an active probe result.
    pub fn probed(&mut self, t: usize, ok: bool, detail: &str, now: Instant) {
        if !ok {
            tracing::debug!(target = %self.config.targets[t].name, detail, "health probe failed");
        }
        if let Some(e) = self.health.on_probe(t, ok, now) {
            self.log_event(e);
        }
    }

    /// The per-target signals, when they changed (or are due for a periodic resend).
    pub fn publishable(&mut self, now: Instant) -> Option<Arc<[TargetSignal]>> {
        let n = self.config.targets.len();
        for t in 0..n {
            let fresh = self.scrape_fresh(t, now);
            let slot = &mut self.scrapes[t];
            if slot.fresh && !fresh {
                tracing::warn!(
                    target = %self.config.targets[t].name,
                    "metrics scrape is stale; load for this target falls back to in-flight counts"
                );
            }
            slot.fresh = fresh;
        }
        // A target whose cooling is over joins again: slow start ramps it up.
        for t in 0..n {
            if self.cooling[t].is_some_and(|until| now >= until) {
                self.cooling[t] = None;
                self.health.joined(t, now);
            }
        }
        let signals: Arc<[TargetSignal]> = (0..n)
            .map(|t| TargetSignal {
                eligible: self.health.eligible(t),
                queue_depth: self
                    .queue_depth(t, now)
                    .map(|q| q.min(u64::from(u32::MAX)) as u32)
                    .unwrap_or(0),
                kv_usage: self.scrapes[t]
                    .metrics
                    .as_ref()
                    .filter(|_| self.scrape_fresh(t, now))
                    .and_then(|m| m.kv_usage)
                    .map(|k| k as f32),
                cooling_until: self.cooling_left(t, now).map(|left| now + left),
                ramp: self.health.ramp(t, now),
            })
            .collect();
        let due = self
            .last_publish
            .is_none_or(|at| now.saturating_duration_since(at) >= REPUBLISH);
        if !due && self.published.as_deref() == Some(&*signals) {
            return None;
        }
        self.published = Some(signals.clone());
        self.last_publish = Some(now);
        Some(signals)
    }

    /// Gauges for `/metrics`.
    pub fn gauges(&self, now: Instant) -> Vec<TargetGauges> {
        (0..self.config.targets.len())
            .map(|t| {
                let h = self.health.state(t, now);
                let slot = &self.scrapes[t];
                let scrape = if !self.config.scrape.enabled || !self.config.targets[t].scrape {
                    ScrapeStatus::Off
                } else {
                    match slot.last_ok {
                        None => ScrapeStatus::Never,
                        Some(at) => {
                            let age = now.saturating_duration_since(at);
                            if self.scrape_fresh(t, now) {
                                ScrapeStatus::Fresh { age }
                            } else {
                                ScrapeStatus::Stale { age }
                            }
                        }
                    }
                };
                let m = slot.metrics.as_ref().filter(|_| self.scrape_fresh(t, now));
                TargetGauges {
                    in_flight: self.in_flight(t),
                    queue_depth: m.and_then(|m| m.queue_depth()),
                    running: m.and_then(|m| m.running).map(|r| r.max(0.0).round() as u64),
                    kv_usage: m.and_then(|m| m.kv_usage),
                    healthy: h.healthy,
                    ejected: h.ejected,
                    scrape,
                }
            })
            .collect()
    }

    /// How long `t` still cools after a 429, if it does.
    fn cooling_left(&self, t: usize, now: Instant) -> Option<Duration> {
        self.cooling
            .get(t)
            .copied()
            .flatten()
            .filter(|u| *u > now)
            .map(|u| u - now)
    }

    /// `GET /admin/targets`.
    pub fn targets_json(&self, now: Instant) -> serde_json::Value {
        let gauges = self.gauges(now);
        let items: Vec<serde_json::Value> = self
            .config
            .targets
            .iter()
            .enumerate()
            .map(|(t, target)| {
                let h = self.health.state(t, now);
                let g = &gauges[t];
                let (ttft, samples) = self.ttft[t];
                let slot = &self.scrapes[t];
                let (scrape_state, age) = match g.scrape {
                    ScrapeStatus::Off => ("off", None),
                    ScrapeStatus::Never => ("never", None),
                    ScrapeStatus::Fresh { age } => ("fresh", Some(age.as_secs_f64())),
                    ScrapeStatus::Stale { age } => ("stale", Some(age.as_secs_f64())),
                };
                let engine = slot
                    .metrics
                    .as_ref()
                    .map(|m| format!("{:?}", m.engine).to_lowercase());
                serde_json::json!({
                    "name": target.name,
                    "url": target.url,
                    "weight": target.weight,
                    "tier": target.tier,
                    "models": target.models,
                    "max_concurrent": target.max_concurrent,
                    "eligible": self.health.eligible(t),
                    "cooling": self.cooling_json(t, now),
                    "health": {
                        "active_checks": h.probed,
                        "healthy": h.healthy,
                        "ejected": h.ejected,
                        "ejected_for_seconds": h.ejected_for.map(|d| d.as_secs_f64()),
                        "consecutive_failures": h.consecutive_failures,
                        "total_ejections": h.total_ejections,
                        "slow_start_ramp": self.health.ramp(t, now),
                    },
                    "load": {
                        "in_flight": g.in_flight,
                        "queue_depth": g.queue_depth,
                        "load": g.in_flight + g.queue_depth.unwrap_or(0),
                    },
                    "engine": {
                        "kind": engine,
                        "running": g.running,
                        "kv_cache_usage": g.kv_usage,
                        "scrape": scrape_state,
                        "scrape_age_seconds": age,
                        "scrape_error": slot.last_error,
                    },
                    "ttft_ewma_ms": ttft,
                    "ttft_samples": samples,
                    "lora": self.lora.target_json(t, now),
                    "pools": self.pools_of(t),
                    "dp": dp_json(target),
                })
            })
            .collect();
        let routes: Vec<serde_json::Value> = self
            .config
            .routes
            .iter()
            .zip(&self.mirrors)
            .map(|(r, m)| {
                let learned: serde_json::Map<String, serde_json::Value> = r
                    .targets
                    .iter()
                    .filter_map(|&t| {
                        let facts = m.learned(t);
                        (!facts.is_empty()).then(|| {
                            let obj: serde_json::Map<String, serde_json::Value> = facts
                                .into_iter()
                                .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
                                .collect();
                            (self.config.targets[t].name.clone(), obj.into())
                        })
                    })
                    .collect();
                let mut route = serde_json::json!({
                    "name": r.name,
                    "strategy": r.strategy.name(),
                    "learned": learned,
                });
                if let Some(d) = r.disaggregation {
                    route["disaggregation"] = serde_json::json!({
                        "protocol": d.protocol.name(),
                        "prefill_pool": self.config.routes[d.prefill_route].name,
                    });
                }
                if let Some(of) = r.prefill_of {
                    route["prefill_pool_of"] = self.config.routes[of].name.clone().into();
                }
                route
            })
            .collect();
        serde_json::json!({ "targets": items, "routes": routes })
    }

    /// How long target `t` still cools after a 429, if it does.
    fn cooling_json(&self, t: usize, now: Instant) -> Option<serde_json::Value> {
        self.cooling_left(t, now).map(|left| {
            serde_json::json!({
                "until": humantime::format_rfc3339_millis(std::time::SystemTime::now() + left).to_string(),
                "remaining_seconds": left.as_secs_f64(),
            })
        })
    }

    /// The routes' pools target `t` is in: `{"route", "pool"}` with the pool `prefill`
    /// or `decode` on a disaggregated route, `all` on a co-located one.
    fn pools_of(&self, t: usize) -> Vec<serde_json::Value> {
        let routes = &self.config.routes;
        routes
            .iter()
            .filter(|r| r.targets.contains(&t))
            .map(|r| {
                let (route, pool) = match (r.prefill_of, r.disaggregation) {
                    (Some(of), _) => (&routes[of].name, "prefill"),
                    (None, Some(_)) => (&r.name, "decode"),
                    (None, None) => (&r.name, "all"),
                };
                serde_json::json!({ "route": route, "pool": pool })
            })
            .collect()
    }

    /// Ready: every route has at least one eligible target that is not drained
    /// (`weight = 0`).
    pub fn ready(&self) -> bool {
        let serving = |t: usize| self.config.targets[t].weight > 0.0 && self.health.eligible(t);
        self.config
            .routes
            .iter()
            .all(|r| r.targets.iter().copied().any(serving))
    }

    pub fn render_metrics(&self, now: Instant, out: &mut String) {
        let gauges = self.gauges(now);
        let kv = self.kv_reports.as_ref().map(|r| r.snapshot());
        let drops = self.mesh_dropped();
        self.metrics.render_with_kv(
            &gauges,
            self.switches.adaptive(),
            &drops,
            kv.as_deref(),
            out,
        );
        if let Some(stats) = &self.reloads {
            crate::metrics::render_reloads(stats, out);
        }
        if let Some(f) = &self.fleet {
            f.borrow().stats.render(out);
        }
        if let Some(k) = &self.keys {
            crate::metrics::key_series::render(k, out);
        }
        let names: Vec<String> = self.config.targets.iter().map(|t| t.name.clone()).collect();
        crate::metrics::dns::render(&names, &self.dns.counts(), out);
        self.queues.render(out);
        if let Some(p) = &self.poll_stats {
            crate::metrics::busy_poll::render(p, out);
        }
        if let Some(t) = &self.tracer {
            crate::metrics::trace::render(&t.stats(), out);
        }
        crate::metrics::process::render(&crate::metrics::process::ProcessStats::read(), out);
    }

    /// Messages the mesh dropped so far, per kind, over every sender.
    pub fn mesh_dropped(&self) -> Vec<(&'static str, u64)> {
        Kind::ALL
            .iter()
            .map(|&k| {
                let n = self.mesh_drops.iter().map(|d| d.get(k)).sum();
                (k.label(), n)
            })
            .collect()
    }

    /// Says in the log that the mesh dropped messages: when the count grew, at most once a
    /// minute (every drop is counted in `rolter_mesh_dropped_total`).
    pub fn log_mesh_drops(&mut self, now: Instant) {
        if self
            .last_drop_log
            .is_some_and(|at| now.saturating_duration_since(at) < FALLBACK_LOG_EVERY)
        {
            return;
        }
        let total: u64 = self.mesh_dropped().iter().map(|(_, n)| n).sum();
        if total > self.drops_logged {
            tracing::warn!(
                dropped = total - self.drops_logged,
                "the mesh dropped messages to full inboxes (a core not draining its inbox); \
                 load snapshots heal on the next heartbeat (counted in rolter_mesh_dropped_total)"
            );
            self.drops_logged = total;
            self.last_drop_log = Some(now);
        }
    }
}

/// The engine crate's view of the fleet, its books' input: targets, routes and the scrape
/// settings.
pub fn engine_fleet(config: &Config) -> Fleet {
    Fleet {
        targets: config
            .targets
            .iter()
            .map(|t| FleetTarget {
                name: t.name.clone(),
                scrape: t.scrape,
                health_path: t.health_path.clone(),
            })
            .collect(),
        routes: config
            .routes
            .iter()
            .map(|r| FleetRoute {
                targets: r.targets.clone(),
            })
            .collect(),
        scrape_enabled: config.scrape.enabled,
        scrape_stale_after: config.scrape.stale_after,
    }
}

/// What the health book does, from `[health]` (its probe path and timing are the prober's).
pub fn health_settings(h: &HealthConfig) -> HealthSettings {
    HealthSettings {
        active: h.active,
        healthy_threshold: h.healthy_threshold,
        unhealthy_threshold: h.unhealthy_threshold,
        failures: h.failures,
        ejection_time: h.ejection_time,
        max_ejection_time: h.max_ejection_time,
        max_ejected_percent: h.max_ejected_percent,
        latency_factor: h.latency_factor,
        latency_for: h.latency_for,
        latency_min_samples: h.latency_min_samples,
        slow_start_window: h.slow_start_window,
        slow_start_aggression: h.slow_start_aggression,
        slow_start_min_weight: h.slow_start_min_weight,
    }
}

/// A data-parallel rank's place: its engine, rank, the engine's ranks, and how the rank is
/// sent (`null` for a target that is not a rank).
fn dp_json(target: &rolter_config::Target) -> Option<serde_json::Value> {
    target.dp.as_ref().map(|d| {
        serde_json::json!({
            "engine": d.engine_name,
            "rank": d.rank,
            "size": d.size,
            "rank_in": if target.engine == rolter_config::EngineKind::Sglang { "body" } else { "header" },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine crate's defaults are the configuration's: `[health]`, and `[kv_events]`
    /// for the KV index.
    #[test]
    fn engine_defaults_match_the_configuration() {
        assert_eq!(
            health_settings(&HealthConfig::default()),
            HealthSettings::default()
        );
        let kv = rolter_config::KvEventsConfig::default();
        let index = rolter_engine::kv::index::KvIndexConfig::default();
        assert_eq!(index.block_size, kv.block_size as usize);
        assert_eq!(
            index.max_blocks_per_target,
            kv.max_blocks_per_target as usize
        );
    }
}
