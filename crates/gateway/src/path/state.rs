//! Per-core worker state of one configuration: the configuration snapshot, each route's
//! strategy instance and the clients of what it needs, the upstreams and their pool, the
//! load view, and reusable scratch space. [`WorkerCore`] is what a core keeps across
//! configurations (its counts, its drain flag, its spare buffers).
//!
//! Lives in an `Rc` on one worker thread and is never shared with another core. It must
//! not hold anything `Send`-only or locked.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use rolter_codec::h1::request_head::HeadLimits;
use rolter_config::reload::{same, unchanged_routes, unchanged_targets};
use rolter_config::{Config, Route};
use rolter_core::{Candidate, Needs, Sample, ShareSink, Verdict};
use rolter_strategy::Strategy;

use crate::fleet::StoreLink;
use crate::mesh::admission::RouteQueues;
use crate::mesh::caps::{ConnectionCap, TargetCaps};
use crate::mesh::key_limits::KeyBook;
use crate::mesh::load::LoadView;
use crate::mesh::messages::AttemptNotes;
use crate::mesh::{Record, WorkerLinks};
use crate::path::activity::Activity;
use crate::path::client_tls;
use crate::path::head_times::HeadTimes;
use crate::path::models;
use crate::path::release::Waiters;
use crate::path::request::IoBufs;
use crate::path::retry::RetryBudget;
use crate::route_clients::adapters::AdapterLoader;
use crate::route_clients::cache_lookup::CacheLookup;
use crate::route_clients::rotation::Rotation;
use crate::route_clients::tokens::TokenSource;
use crate::strategies::StrategyFactory;
use crate::trace::Tracer;
use crate::upstream::tls::UpstreamTls;
use crate::upstream::Upstreams;

/// One route's per-core strategy instance.
pub struct RouteState {
    pub strategy: RefCell<Box<dyn Strategy>>,
    /// What the strategy asks for before it picks.
    pub needs: Needs,
    /// Where the route's token ids come from (`TokenSource::None` unless the strategy
    /// needs them).
    pub tokens: TokenSource,
    /// The route's cache-controller client, when its strategy asks for a lookup.
    pub lookup: Option<CacheLookup>,
    /// The route's LoRA adapter loader, when its strategy loads adapters (`load_from`).
    pub adapters: Option<AdapterLoader>,
    /// The route's shared rotation (`atomic` round-robin), with this core's lease.
    pub rotation: Option<Rotation>,
    /// Candidate loads include the other replicas' requests in flight (`fleet_load`).
    pub fleet_load: bool,
    /// The route shares prefixes or sessions with the other replicas: what a pick teaches
    /// goes out at once, not at the next signal tick.
    pub shares_items: bool,
    /// Picks since the last signal tick by what decided them (indexed like
    /// [`Basis::ALL`](rolter_core::Basis::ALL)); counted only on routes that share state.
    pub bases: [Cell<u32>; 4],
    /// The route's retry budget on this core.
    pub retry_budget: RetryBudget,
    /// Requests waiting in the route's queue on this core.
    pub queued: Cell<usize>,
    /// The route's recent send-to-head times on this core (`hedge_after = "pNN"`).
    pub head_times: HeadTimes,
}

/// What one core keeps for its whole life, whatever configuration it serves: its counts
/// (for the drain), the drain flag, and the buffer sets not in use.
pub struct WorkerCore {
    pub id: usize,
    /// Set when the gateway is stopping: finish the current exchange, then close.
    pub draining: Cell<bool>,
    /// Set during a drain: streams still running then are ended with an error event (so
    /// no client mistakes the cut for a complete answer) before the grace runs out.
    pub cut_at: Cell<Option<std::time::Instant>>,
    /// Open client connections on this core.
    pub connections: Cell<usize>,
    /// Requests between a complete head and the end of their response, on this core.
    pub active_requests: Cell<usize>,
    /// Buffer sets not in use: a connection holds one only while it serves a request, so
    /// an idle keep-alive connection costs almost nothing.
    spare_bufs: RefCell<Vec<IoBufs>>,
    /// Single request-sized buffers a request gave back while it has no use for them (a
    /// stream between its events needs only its armed upstream read), lent to the next
    /// that needs one.
    spare_vecs: RefCell<Vec<Vec<u8>>>,
    /// The state thread, when `[state]` is configured (it lives as long as the process).
    pub store: Option<StoreLink>,
    /// The process's client connections over every worker (`server.max_connections`).
    pub connection_cap: Arc<ConnectionCap>,
    /// Requests waiting in a route's queue on this core, woken when a place may have freed.
    pub waiters: Waiters,
    /// Requests and upstream reads on this core, for busy polling (`server.busy_poll`).
    pub activity: Activity,
}

impl WorkerCore {
    pub fn new(id: usize, store: Option<StoreLink>, connection_cap: Arc<ConnectionCap>) -> Self {
        WorkerCore {
            store,
            connection_cap,
            waiters: Waiters::default(),
            activity: Activity::default(),
            id,
            draining: Cell::new(false),
            cut_at: Cell::new(None),
            connections: Cell::new(0),
            active_requests: Cell::new(0),
            spare_bufs: RefCell::new(Vec::new()),
            spare_vecs: RefCell::new(Vec::new()),
        }
    }

    /// Takes `v`'s buffer for reuse by another request (kept up to a bound, freed beyond
    /// it), leaving `v` without one.
    pub fn give_back(&self, v: &mut Vec<u8>) {
        let mut v = std::mem::take(v);
        if v.capacity() < SPARE_VEC || v.capacity() > IoBufs::KEEP {
            return;
        }
        let mut spare = self.spare_vecs.borrow_mut();
        if spare.len() < MAX_SPARE_VECS {
            v.clear();
            spare.push(v);
        }
    }

    /// Gives `v` a request-sized buffer if it has a smaller one (or none): a spare one,
    /// else a new one.
    pub fn lend(&self, v: &mut Vec<u8>) {
        if v.capacity() < SPARE_VEC {
            *v = self
                .spare_vecs
                .borrow_mut()
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(SPARE_VEC));
        }
    }

    /// A buffer set for one request.
    pub fn take_bufs(&self) -> PooledBufs<'_> {
        self.activity.note();
        let mut bufs = self.spare_bufs.borrow_mut().pop().unwrap_or_default();
        // A set that went back while a stream had lent these out gets them again.
        self.lend(&mut bufs.out);
        self.lend(&mut bufs.up.bytes);
        PooledBufs {
            core: self,
            bufs: Some(bufs),
        }
    }
}

pub struct WorkerState {
    pub id: usize,
    pub core: Rc<WorkerCore>,
    pub config: Arc<Config>,
    /// Shared with the next configuration's state when the route is unchanged, so what
    /// its strategy learned carries over a reload.
    pub routes: Vec<Rc<RouteState>>,
    /// The targets, their TLS settings and this core's keep-alive pool.
    pub upstream: Upstreams,
    /// In-flight counts (this core exact, other cores by snapshot), queue depth, eligibility.
    pub load: LoadView,
    /// Each target's exact admission count over every core (`max_concurrent`).
    pub caps: Arc<TargetCaps>,
    /// Each route's queue over every core (`queue_max`): who gets the next place.
    pub queues: Arc<RouteQueues>,
    /// Each client API key's windows and counts over every core (`[[keys]]` limits).
    pub keys: Arc<KeyBook>,
    /// Where sampled requests' spans go (`[tracing]`); `None` without tracing.
    pub tracer: Option<Tracer>,
    /// Channels to the other cores and the control thread.
    pub links: WorkerLinks,
    /// What this core's strategies learned from routing this tick, for the other cores.
    pub share: RefCell<ShareSink>,
    /// Pre-built `GET /v1/models` body.
    pub models_body: Vec<u8>,
    /// Pre-built `GET /v1/models/{id}` bodies, by model id.
    pub model_bodies: std::collections::HashMap<String, Vec<u8>>,
    pub head_limits: HeadLimits,
    /// Scratch candidate list, reused by every pick.
    pub candidates: RefCell<Vec<Candidate>>,
    /// Scratch: candidates slow start left out of one pick.
    pub ramped_out: RefCell<Vec<Candidate>>,
    /// Some route shares items with the other replicas through the state store.
    pub shares_with_fleet: bool,
    /// `max_concurrent` counts the other replicas' requests too (`state.share_load`).
    pub fleet_caps: bool,
    /// The listener's TLS settings (`[server.tls]`); `None`: plaintext.
    pub client_tls: Option<Arc<rustls::ServerConfig>>,
    /// Targets whose stream came back without the usage it was asked for, on this core:
    /// their streams are counted, not asked again (`stream_usage`), until the next
    /// configuration.
    usage_unreported: RefCell<Vec<bool>>,
}

/// Most spare buffer sets a worker keeps.
const MAX_SPARE_BUFS: usize = 256;
/// Most single spare buffers a worker keeps: streams share them, each holding one only
/// while it writes.
const MAX_SPARE_VECS: usize = 64;
/// The size of a lent buffer (a set's `out` and `up` start at it).
const SPARE_VEC: usize = 4 * 1024;

/// A buffer set borrowed from the worker for one request; returned when dropped.
pub struct PooledBufs<'a> {
    core: &'a WorkerCore,
    bufs: Option<IoBufs>,
}

impl std::ops::Deref for PooledBufs<'_> {
    type Target = IoBufs;
    fn deref(&self) -> &IoBufs {
        self.bufs.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for PooledBufs<'_> {
    fn deref_mut(&mut self) -> &mut IoBufs {
        self.bufs.as_mut().expect("present until drop")
    }
}

impl Drop for PooledBufs<'_> {
    fn drop(&mut self) {
        if let Some(mut b) = self.bufs.take() {
            let mut spare = self.core.spare_bufs.borrow_mut();
            if spare.len() < MAX_SPARE_BUFS {
                b.recycle();
                spare.push(b);
            }
        }
    }
}

/// What one configuration's state on a core is built from: the configuration, what the
/// gateway built for it (shared by every core), and this core's links.
pub struct StateParts<'a> {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub caps: Arc<TargetCaps>,
    pub queues: Arc<RouteQueues>,
    pub keys: Arc<KeyBook>,
    pub strategies: &'a StrategyFactory,
    pub tracer: Option<Tracer>,
    pub links: WorkerLinks,
}

impl WorkerState {
    /// This core's state for `parts.config`, on a gateway of `workers` cores. With
    /// `previous` (a reload), unchanged routes keep their strategy instance (and what it
    /// learned), and unchanged targets their idle keep-alive connections.
    pub fn new(
        core: Rc<WorkerCore>,
        parts: StateParts<'_>,
        workers: usize,
        previous: Option<&WorkerState>,
    ) -> Self {
        let StateParts {
            config,
            tls,
            caps,
            queues,
            keys,
            strategies,
            tracer,
            links,
        } = parts;
        let id = core.id;
        let seed = fastrand::u64(..) ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let kept = previous.map(|p| (p, unchanged_routes(&p.config, &config)));
        let routes = config
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                match kept
                    .as_ref()
                    .and_then(|(p, same)| same[i].map(|o| p.routes[o].clone()))
                {
                    Some(old) => old,
                    None => {
                        let fresh = route_state(r, &config, strategies, seed);
                        if let Some(p) = previous {
                            carry_learned(p, r, &fresh, &config, strategies, seed);
                        }
                        fresh
                    }
                }
            })
            .collect();
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let limits = &config.server.limits;
        let upstream = Upstreams::new(config.clone(), tls);
        if let Some(p) = previous {
            let map = unchanged_targets(&p.config.targets, &config.targets);
            upstream.pool.adopt(&p.upstream.pool, &map);
        }
        WorkerState {
            id,
            core,
            routes,
            upstream,
            load: LoadView::new(config.targets.len(), workers),
            caps,
            queues,
            keys,
            tracer,
            links,
            share: RefCell::new(ShareSink::default()),
            models_body: models::list_body(&config, created),
            model_bodies: models::object_bodies(&config, created),
            head_limits: HeadLimits {
                max_head_bytes: limits.max_head_bytes,
                max_headers: limits.max_headers,
                max_uri_bytes: limits.max_uri_bytes,
                underscores: config.server.underscores_in_headers,
            },
            candidates: RefCell::new(Vec::with_capacity(config.targets.len())),
            ramped_out: RefCell::new(Vec::with_capacity(config.targets.len())),
            shares_with_fleet: config.routes.iter().any(|r| {
                r.strategy
                    .requirements()
                    .store
                    .is_some_and(|s| s.shares_items())
            }),
            fleet_caps: config.state.as_ref().is_some_and(|s| s.share_load),
            client_tls: config.server.tls.as_ref().map(client_tls::server_config),
            usage_unreported: RefCell::new(vec![false; config.targets.len()]),
            config,
        }
    }

    /// Whether `target`'s streams report the usage they are asked for, as far as this
    /// core has seen.
    pub fn usage_reported(&self, target: usize) -> bool {
        !self
            .usage_unreported
            .borrow()
            .get(target)
            .copied()
            .unwrap_or(false)
    }

    /// `target`'s stream came back without the usage it was asked for: its streams are
    /// counted from now on.
    pub fn usage_unreported(&self, target: usize) {
        if let Some(t) = self.usage_unreported.borrow_mut().get_mut(target) {
            if !*t {
                *t = true;
                self.links.record(Record::UsageUnreported {
                    target: target as u16,
                });
            }
        }
    }
}

/// A route's state on this core, new: its strategy instance and the clients of what the
/// strategy needs (token ids, a cache lookup, adapter loading, the shared rotation).
/// A route whose targets moved but whose definition is otherwise the same (a discovered
/// member joined or left, a target was added to or removed from the file) takes what its
/// strategy learned on `previous`, remapped to the new targets, when the strategy can
/// carry it ([`Strategy::remap_targets`]); the old configuration's in-flight requests
/// finish on a fresh instance.
fn carry_learned(
    previous: &WorkerState,
    r: &Route,
    fresh: &RouteState,
    config: &Config,
    strategies: &StrategyFactory,
    seed: u64,
) {
    let Some(o) = previous.config.routes.iter().position(|o| o.name == r.name) else {
        return;
    };
    let without_targets = |r: &Route| Route {
        targets: Vec::new(),
        ..r.clone()
    };
    let old_route = &previous.config.routes[o];
    if !same(&without_targets(old_route), &without_targets(r))
        || !same(&previous.config.kv_events, &config.kv_events)
    {
        return;
    }
    let map = unchanged_targets(&previous.config.targets, &config.targets);
    let old = &previous.routes[o];
    let Ok(mut learned) = old.strategy.try_borrow_mut() else {
        return;
    };
    if !learned.remap_targets(&map) {
        // Nothing was changed: the old instance goes on serving the old configuration.
        return;
    }
    let stand_in = strategies.build(old_route, seed);
    let carried = std::mem::replace(&mut *learned, stand_in);
    *fresh.strategy.borrow_mut() = carried;
}

fn route_state(
    r: &Route,
    config: &Config,
    strategies: &StrategyFactory,
    seed: u64,
) -> Rc<RouteState> {
    let strategy = strategies.build(r, seed);
    let needs = strategy.needs();
    // How the strategy's inputs are had: its typed requirements, which agree with what the
    // instance asks for.
    let req = r.strategy.requirements();
    Rc::new(RouteState {
        tokens: TokenSource::for_route(
            r,
            req.token_ids
                .as_ref()
                .filter(|_| needs.contains(Needs::TOKEN_IDS)),
        ),
        lookup: CacheLookup::for_route(
            r,
            &config.targets,
            req.cache_lookup
                .as_ref()
                .filter(|_| needs.contains(Needs::CACHE_LOOKUP)),
        ),
        adapters: AdapterLoader::for_route(req.adapter_loading.as_ref()),
        rotation: req
            .store
            .as_ref()
            .and_then(|s| s.rotation)
            .filter(|_| needs.contains(Needs::SHARED_ROTATION))
            .map(Rotation::new),
        fleet_load: req.store.as_ref().is_some_and(|s| s.fleet_load),
        shares_items: req.store.as_ref().is_some_and(|s| s.shares_items()),
        bases: Default::default(),
        retry_budget: RetryBudget::default(),
        queued: Cell::new(0),
        head_times: HeadTimes::default(),
        needs,
        strategy: RefCell::new(strategy),
    })
}

impl Drop for WorkerState {
    /// A configuration's state goes when its last request ends (after a reload) or at
    /// stop: what it recorded since the last tick still reaches the control thread.
    fn drop(&mut self) {
        self.links.publish(&self.load);
    }
}

impl WorkerState {
    /// Applies whatever the other cores and the control thread sent: load snapshots,
    /// target eligibility and queue depth, and samples to learn from. Cheap when the inbox
    /// is empty (one atomic load).
    pub fn drain_signals(&self) {
        if self.links.has_mail() {
            self.links.drain(
                &self.load,
                |s| self.observe(s),
                |batch, from_fleet| {
                    let now = std::time::Instant::now();
                    for (route, item) in batch.iter() {
                        if let Some(r) = self.routes.get(route) {
                            let mut s = r.strategy.borrow_mut();
                            if from_fleet {
                                s.apply_fleet_shared(&item, now);
                            } else {
                                s.apply_shared(&item, now);
                            }
                        }
                    }
                },
                |addrs| self.upstream.addrs.apply(addrs),
                |books| {
                    for (route, ledger) in books {
                        if let Some(r) = self.routes.get(*route) {
                            r.strategy.borrow_mut().apply_ledger(ledger);
                        }
                    }
                },
            );
        }
    }

    /// Teaches every route's strategy on this core.
    pub fn observe(&self, sample: &Sample) {
        for r in &self.routes {
            r.strategy.borrow_mut().observe(sample);
        }
    }

    /// Learns from an attempt on this core and reports it to the other cores and control
    /// (with `notes` for the control thread's metrics and logs).
    pub fn record_attempt(
        &self,
        route: usize,
        sample: Sample,
        verdict: Verdict,
        notes: AttemptNotes,
    ) {
        self.observe(&sample);
        self.links.record(Record::Attempt {
            route: route as u16,
            sample,
            verdict,
            notes,
        });
    }

    /// Counts a response the gateway produced itself.
    pub fn record_gateway(&self, status: u16, code: &'static str) {
        self.links.record(Record::Gateway { status, code });
    }

    /// Counts a client TLS handshake (see [`Record::TlsHandshake`]).
    pub fn record_tls_handshake(&self, result: Result<&'static str, &'static str>, seconds: f64) {
        self.links.record(Record::TlsHandshake { result, seconds });
    }

    /// The signal tick: publish this core's changes, apply the others'.
    pub fn signal_tick(&self) {
        self.record_bases();
        self.links.publish(&self.load);
        self.share_now();
        self.drain_signals();
    }

    /// The picks' bases since the last tick, one record per route that picked.
    fn record_bases(&self) {
        for (i, r) in self.routes.iter().enumerate() {
            let counts = r.bases.each_ref().map(|c| c.replace(0));
            if counts.iter().any(|&n| n > 0) {
                self.links.record(Record::Bases {
                    route: i as u16,
                    counts,
                });
            }
        }
    }

    /// Sends what this core's strategies learned since the last time to the other cores and,
    /// for routes that share through the store, to the other replicas. Called on the signal
    /// tick, and right after a pick of a route that shares with the fleet: a conversation's
    /// next turn may reach another replica a few milliseconds later.
    pub fn share_now(&self) {
        let mut share = self.share.borrow_mut();
        if share.is_empty() {
            return;
        }
        let batch = Arc::new(share.take_batch());
        self.links.share(&batch);
        if self.shares_with_fleet {
            if let Some(store) = &self.core.store {
                store.share(&self.config, &batch);
            }
        }
    }
}
