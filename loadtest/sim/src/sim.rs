//! The discrete-event simulation: a virtual clock, one [`Engine`] per target, R gateway
//! replicas of N cores each holding its own instance of the strategy, the gateway's
//! cross-core exchange (shared routing items and samples every exchange period), the
//! replicas' shared store ([`crate::store`]), the engines' signals the strategies read (KV
//! events, LoRA residency), and the metrics of one run.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter::core::{KvCacheView, Price, PriceBook, Residency};
use rolter::strategy::registry;
use rolter::strategy::{
    AsyncInputs, BuildContext, Candidate, Needs, PickRequest, SessionKey, ShareSink, Strategy,
    StrategySpec, Switches, Usage,
};
use rolter::strategy::{Pick, Sample};
use serde::Serialize;

use crate::adapters::{AdapterSlots, LoraParams};
use crate::engine::{block_hashes, Engine, EngineParams};
use crate::fleet::fleet_targets;
use crate::lora_feed::LoraFeed;
use crate::store::{Payload, Share, Store, SyncPeriods};
use crate::workload::{Workload, BASE_MODEL};
use rolter::engine::kv::events::{BlockRemoved, BlockStored, EventBatch, Medium};
use rolter::engine::kv::index::{KvIndex, KvIndexConfig};
use rolter::engine::kv::view::EngineView;

/// The fleet a workload runs on.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FleetSpec {
    pub targets: usize,
    pub engine: EngineParams,
    /// `(target, factor)`: that target's constants are `factor` times larger.
    pub slow: Option<(usize, f64)>,
    /// LoRA adapter slots on every engine, for workloads that name adapters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraParams>,
}

impl FleetSpec {
    pub fn params(&self, target: usize) -> EngineParams {
        match self.slow {
            Some((t, f)) if t == target => self.engine.slowed(f),
            _ => self.engine,
        }
    }
}

/// A routing policy under test.
#[derive(Debug, Clone)]
pub enum Policy {
    /// A registry strategy with its options (validated).
    Strategy(StrategySpec),
    /// Keeps each session group (conversation, document, template) on the engine that was
    /// least loaded when the group was first seen.
    Oracle,
}

impl Policy {
    pub fn label(&self) -> String {
        match self {
            Policy::Oracle => "oracle".to_string(),
            Policy::Strategy(s) if s.is_default() => s.name().to_string(),
            Policy::Strategy(s) => {
                let opts: Vec<String> = s
                    .non_default()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!("{}({})", s.name(), opts.join(","))
            }
        }
    }
}

/// How requests are spread over the gateway's cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CoreAssign {
    RoundRobin,
    Random,
}

/// The load a core sees on each candidate. With several replicas, "every request" is every
/// request of the core's own replica; other replicas' requests in flight are added only when
/// they share `load` through the store (as of the store delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LoadView {
    /// Every core sees every request in flight on the target (all cores') plus the
    /// engine's queue depth, exactly: one gateway with `[metrics_scrape]`.
    Global,
    /// A core counts the requests it has in flight itself, plus the other cores' counts as
    /// of the last exchange, and no engine queue: gateway cores without `[metrics_scrape]`,
    /// and, with an exchange that never comes, gateway replicas that share nothing.
    PerCore,
}

/// Gateway-side settings of a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SimConfig {
    /// Gateway replicas behind an L4 balancer: each request goes to one at random.
    pub replicas: usize,
    /// What the replicas share through the store (nothing reaches another replica
    /// otherwise).
    pub share: Share,
    /// How long a replica's publication takes to reach the other replicas (then applied
    /// at their next exchange tick).
    #[serde(serialize_with = "ser_ms")]
    pub store_delay: Duration,
    /// When replicas publish to and read from the store: as it happens (zero periods, the
    /// default) or once per sync interval each ([`SyncPeriods`]).
    pub sync: SyncPeriods,
    /// Cores per replica, each with its own strategy instance.
    pub cores: usize,
    pub core_assign: CoreAssign,
    /// The gateway's signal exchange period between cores.
    #[serde(serialize_with = "ser_ms")]
    pub exchange: Duration,
    /// The gateway's metrics scrape period: how stale the LoRA residency signal is (at
    /// most one period).
    #[serde(serialize_with = "ser_ms")]
    pub scrape: Duration,
    pub load_view: LoadView,
    pub seed: u64,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            replicas: 1,
            share: Share::NONE,
            store_delay: Duration::ZERO,
            sync: SyncPeriods::default(),
            cores: 2,
            core_assign: CoreAssign::RoundRobin,
            exchange: Duration::from_millis(2),
            scrape: Duration::from_secs(1),
            load_view: LoadView::Global,
            seed: 1,
        }
    }
}

/// The metrics of one workload × policy run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub workload: String,
    pub policy: String,
    pub requests: u64,
    /// Picks that returned no target (counted as failed, not timed).
    pub rejected: u64,
    /// Picks that took a strategy's fallback path.
    pub fallbacks: u64,
    pub prompt_tokens: u64,
    pub hit_tokens: u64,
    /// hit tokens ÷ prompt tokens.
    pub hit_rate: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Requests routed to each target.
    pub per_target: Vec<u64>,
    /// The busiest target's share of requests ÷ the mean share (1.0 = even).
    pub load_spread: f64,
    /// Sessions of two or more routed turns whose turns all went to one target.
    pub sticky_sessions: Option<f64>,
    /// Simulated time from the first arrival to the last completion.
    pub sim_seconds: f64,
    /// LoRA adapters loaded into a GPU slot, per target (fleets with adapter slots only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_loads_per_target: Option<Vec<u64>>,
    /// Their sum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_loads: Option<u64>,
    /// Adapter loads per 1000 completed requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_loads_per_1k: Option<f64>,
    /// Strategy items (session pins, prefixes) of the shared kinds published to the store,
    /// counted once per item (several replicas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_items: Option<u64>,
}

/// What a pick ran against: a strategy instance per core, or the oracle.
enum Router {
    Cores(Vec<Box<dyn Strategy>>),
    Oracle {
        owner: HashMap<u64, usize>,
        groups: Vec<u64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Turn `turn` of session `session` reaches the gateway.
    Arrive { session: u32, turn: u32 },
    /// Request `req` finished on its engine.
    Finish { req: u32 },
    /// Request `req`'s adapter is loaded: it goes on to a running slot.
    Ready { req: u32 },
}

struct InFlight {
    session: u32,
    turn: u32,
    core: usize,
    target: usize,
    sent: Duration,
    admitted: Duration,
    load_at_send: u64,
    blocks: Vec<u64>,
    hit_tokens: u32,
    to_first_token: Duration,
    to_finish: Duration,
    /// The prompt's token ids, for strategies that read them.
    tokens: Option<std::rc::Rc<[u32]>>,
    /// The LoRA adapter it holds a slot of, on engines with adapter slots.
    adapter: Option<u32>,
}

/// Synthesised token ids: one per 4 prompt bytes (the simulator's token), so a 16-token
/// block covers exactly one 64-byte cache block.
pub(crate) fn token_ids(prompt: &[u8]) -> Vec<u32> {
    prompt
        .chunks(crate::engine::BYTES_PER_TOKEN)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// The engines' KV events, applied to one index the strategies read.
pub(crate) struct KvFeed {
    index: KvIndex,
    view: EngineView,
    seq: Vec<u64>,
    batch: EventBatch,
}

impl KvFeed {
    pub(crate) fn new(targets: usize) -> Self {
        let index = KvIndex::new(KvIndexConfig {
            block_size: crate::engine::BLOCK_TOKENS as usize,
            ..KvIndexConfig::default()
        })
        .expect("valid index settings");
        let view = EngineView::with_kv(index.reader(), targets);
        for t in 0..targets {
            view.set_kv_live(t, true);
        }
        KvFeed {
            index,
            view,
            seq: vec![0; targets],
            batch: EventBatch::new(),
        }
    }

    /// The index as the strategies read it.
    pub(crate) fn view(&self) -> Arc<dyn KvCacheView> {
        Arc::new(self.view.clone())
    }

    /// Publishes what admitting `r` stored in and evicted from `engine`'s cache, as vLLM
    /// would: one BlockStored per run of new blocks (with its parent), one BlockRemoved.
    fn publish(&mut self, target: usize, engine: &mut Engine, r: &InFlight, now: Instant) {
        self.publish_cache(
            target,
            &mut engine.cache,
            &r.blocks,
            r.tokens.as_deref(),
            now,
        );
    }

    /// Publishes what the last prompt touched in `cache` (its `blocks`, token ids
    /// `tokens`) stored and evicted, as vLLM would: one BlockStored per run of new blocks
    /// (with its parent), one BlockRemoved. Nothing without token ids.
    pub(crate) fn publish_cache(
        &mut self,
        target: usize,
        cache: &mut crate::engine::PrefixCache,
        blocks: &[u64],
        tokens: Option<&[u32]>,
        now: Instant,
    ) {
        let log = cache.take_log();
        let Some(tokens) = tokens else { return };
        if log.stored.is_empty() && log.evicted.is_empty() {
            return;
        }
        let bt = crate::engine::BLOCK_TOKENS as usize;
        self.batch.clear();
        let mut i = 0;
        while i < log.stored.len() {
            let first = log.stored[i];
            let mut last = first;
            while i + 1 < log.stored.len() && log.stored[i + 1] == last + 1 {
                i += 1;
                last += 1;
            }
            i += 1;
            self.batch.push_block_stored(&BlockStored {
                block_hashes: &blocks[first..=last],
                parent_block_hash: first.checked_sub(1).map(|p| blocks[p]),
                token_ids: &tokens[first * bt..(last + 1) * bt],
                block_size: bt as u32,
                medium: Some(Medium::Gpu),
                ..BlockStored::default()
            });
        }
        if !log.evicted.is_empty() {
            self.batch.push_block_removed(&BlockRemoved {
                block_hashes: &log.evicted,
                medium: Some(Medium::Gpu),
                group_idx: None,
            });
        }
        let seq = self.seq[target];
        self.seq[target] += 1;
        let _ = self.index.apply(target as u32, seq, &self.batch, now);
    }
}

#[derive(Default, Clone, Copy)]
struct SessionTrack {
    first: Option<usize>,
    moved: bool,
    routed: u32,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Runs `workload` on `fleet` with `policy`.
pub fn run(workload: &Workload, fleet: &FleetSpec, policy: &Policy, cfg: &SimConfig) -> RunResult {
    let adapter_names: Vec<String> = workload.adapter_names();
    let mut sim = Run::new(workload, fleet, policy, cfg, &adapter_names);
    while let Some(Reverse((t_ns, _, ev))) = sim.heap.pop() {
        sim.tick(t_ns);
        sim.deliver(t_ns);
        if let Some(feed) = &mut sim.lora {
            feed.scrape_due(t_ns, &sim.engines, sim.base);
        }
        let now = Duration::from_nanos(t_ns);
        match ev {
            Event::Arrive { session, turn } => sim.arrive(session, turn, now),
            Event::Ready { req } => {
                let id = req as usize;
                let e = &mut sim.engines[sim.reqs[id].target];
                if let Some(fin) = start(
                    e,
                    &mut sim.kv,
                    &mut sim.reqs,
                    id,
                    sim.sessions,
                    now,
                    sim.base,
                ) {
                    sim.push(fin, Event::Finish { req });
                }
            }
            Event::Finish { req } => sim.finish(req, now),
        }
    }
    sim.summary(workload, policy)
}

/// The strategy instances of a run (instance `i` is core `i % cores` of replica
/// `i / cores`), or the oracle.
fn build_router(
    policy: &Policy,
    n: usize,
    instances: usize,
    seed: u64,
    kv: &Arc<dyn KvCacheView>,
) -> Router {
    let Policy::Strategy(spec) = policy else {
        return Router::Oracle {
            owner: HashMap::new(),
            groups: vec![0; n],
        };
    };
    let targets = fleet_targets(n);
    let weights: Vec<f64> = targets.iter().map(|t| t.weight).collect();
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let route_targets: Vec<usize> = (0..n).collect();
    let price = Price {
        input_per_mtok: 0.5,
        output_per_mtok: 1.5,
    };
    let prices = PriceBook::fixed(&vec![Some(price); n]);
    let switches = Arc::new(Switches::default());
    Router::Cores(
        (0..instances)
            .map(|c| {
                spec.build(&BuildContext {
                    target_count: n,
                    seed: seed.wrapping_mul(0x9e37_79b9).wrapping_add(c as u64),
                    weights: &weights,
                    names: &names,
                    route_targets: &route_targets,
                    prices: &prices,
                    switches: &switches,
                    kv: Some(kv),
                })
            })
            .collect(),
    )
}

/// The state of one run: the event queue, the engines, the gateway replicas' strategy
/// instances and what they exchange, and the metrics so far.
struct Run<'a> {
    cfg: &'a SimConfig,
    fleet: &'a FleetSpec,
    sessions: &'a [crate::workload::Session],
    adapter_names: &'a [String],
    header: bool,
    n: usize,
    cores: usize,
    replicas: usize,
    weights: Vec<f64>,
    router: Router,
    sinks: Vec<ShareSink>,
    /// The replicas' store, and per replica what it last received of every other replica's
    /// requests in flight per target (`Share::load`).
    store: Option<Store>,
    remote_load: Vec<Vec<Vec<u64>>>,
    store_items: u64,
    pending_samples: Vec<(usize, Sample)>,
    engines: Vec<Engine>,
    /// KV events: every engine's cache changes reach one index at once (a strategy that
    /// reads token ids gets them, synthesised as one id per 4 prompt bytes, like the blocks).
    kv: KvFeed,
    /// The LoRA residency signal, for strategies that read it (as the gateway fills it).
    lora: Option<LoraFeed>,
    residency: Vec<Residency>,
    wants_tokens: bool,
    /// Per replica: its requests in flight per target. Per core: its own, and
    /// (LoadView::PerCore) the other cores' of its replica as of the last exchange.
    replica_in_flight: Vec<Vec<u64>>,
    own_in_flight: Vec<Vec<u64>>,
    others_seen: Vec<Vec<u64>>,
    per_target: Vec<u64>,
    core_rng: fastrand::Rng,
    replica_rng: fastrand::Rng,
    next_core: Vec<usize>,
    base: Instant,
    inputs: AsyncInputs,
    tracks: Vec<SessionTrack>,
    reqs: Vec<InFlight>,
    ttfts: Vec<f64>,
    prompt_total: u64,
    hit_total: u64,
    rejected: u64,
    fallbacks: u64,
    last_finish: Duration,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    period: u64,
    next_tick: u64,
}

impl<'a> Run<'a> {
    fn new(
        workload: &'a Workload,
        fleet: &'a FleetSpec,
        policy: &Policy,
        cfg: &'a SimConfig,
        adapter_names: &'a [String],
    ) -> Self {
        let n = fleet.targets;
        let kv = KvFeed::new(n);
        let kv_view: Arc<dyn KvCacheView> = Arc::new(kv.view.clone());
        let cores = cfg.cores.max(1);
        let replicas = cfg.replicas.max(1);
        let instances_n = replicas * cores;
        let router = build_router(policy, n, instances_n, cfg.seed, &kv_view);
        let mut engines: Vec<Engine> = (0..n)
            .map(|t| {
                let mut e = Engine::new(fleet.params(t));
                e.adapters = fleet.lora.map(AdapterSlots::new);
                e
            })
            .collect();
        let lora = match &router {
            Router::Cores(i)
                if fleet.lora.is_some() && i[0].needs().contains(Needs::LORA_RESIDENCY) =>
            {
                Some(LoraFeed::new(
                    n,
                    cfg.scrape,
                    i,
                    adapter_names.to_vec().into(),
                ))
            }
            _ => None,
        };
        let wants_tokens =
            matches!(&router, Router::Cores(i) if i[0].needs().contains(Needs::TOKEN_IDS));
        if wants_tokens {
            for e in &mut engines {
                e.cache.enable_log();
            }
        }
        let sessions = &workload.sessions[..];
        let mut run = Run {
            cfg,
            fleet,
            sessions,
            adapter_names,
            header: workload.kind.header(),
            n,
            cores,
            replicas,
            weights: fleet_targets(n).iter().map(|t| t.weight).collect(),
            router,
            sinks: (0..instances_n).map(|_| ShareSink::default()).collect(),
            store: (replicas > 1)
                .then(|| Store::new(replicas, cfg.store_delay, cfg.exchange, cfg.sync, cfg.seed)),
            remote_load: vec![vec![vec![0u64; n]; replicas]; replicas],
            store_items: 0,
            pending_samples: Vec::new(),
            engines,
            kv,
            lora,
            residency: vec![Residency::UNKNOWN; n],
            wants_tokens,
            replica_in_flight: vec![vec![0u64; n]; replicas],
            own_in_flight: vec![vec![0u64; n]; instances_n],
            others_seen: vec![vec![0u64; n]; instances_n],
            per_target: vec![0u64; n],
            core_rng: fastrand::Rng::with_seed(cfg.seed ^ 0xc0de),
            replica_rng: fastrand::Rng::with_seed(cfg.seed ^ 0x5e1ec7),
            next_core: vec![0usize; replicas],
            base: Instant::now(),
            inputs: AsyncInputs::default(),
            tracks: vec![SessionTrack::default(); sessions.len()],
            reqs: Vec::new(),
            ttfts: Vec::new(),
            prompt_total: 0,
            hit_total: 0,
            rejected: 0,
            fallbacks: 0,
            last_finish: Duration::ZERO,
            seq: 0,
            heap: BinaryHeap::new(),
            period: ns(cfg.exchange).max(1),
            next_tick: ns(cfg.exchange).max(1),
        };
        for (i, s) in sessions.iter().enumerate() {
            run.push(
                s.start,
                Event::Arrive {
                    session: i as u32,
                    turn: 0,
                },
            );
        }
        run
    }

    fn push(&mut self, at: Duration, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((ns(at), self.seq, ev)));
    }

    /// The exchange ticks that passed since the last event: everything shared or
    /// finished before them reaches the other cores at the first one (later ticks
    /// carry nothing, as no event happened in between).
    fn tick(&mut self, t_ns: u64) {
        if t_ns < self.next_tick {
            return;
        }
        let (cfg, cores, next_tick) = (self.cfg, self.cores, self.next_tick);
        let tick_at = self.base + Duration::from_nanos(next_tick);
        if let Router::Cores(instances) = &mut self.router {
            let publish = self
                .store
                .as_mut()
                .filter(|_| cfg.share.any_items())
                .map(|s| (s, next_tick, cfg.share, &mut self.store_items));
            exchange(
                instances,
                cores,
                &mut self.sinks,
                &mut self.pending_samples,
                publish,
                tick_at,
            );
        }
        if cfg.load_view == LoadView::PerCore {
            for (c, seen) in self.others_seen.iter_mut().enumerate() {
                for (t, v) in seen.iter_mut().enumerate() {
                    *v = self.replica_in_flight[c / cores][t] - self.own_in_flight[c][t];
                }
            }
        }
        if let Some(store) = self.store.as_mut().filter(|_| cfg.share.load) {
            for (r, load) in self.replica_in_flight.iter().enumerate() {
                store.publish(r, next_tick, Payload::Load(load.clone()));
            }
        }
        self.next_tick = (t_ns / self.period + 1) * self.period;
    }

    /// What the store delivers by now reaches the receiving replica's instances.
    fn deliver(&mut self, t_ns: u64) {
        let Some(store) = &mut self.store else { return };
        let (cores, share) = (self.cores, self.cfg.share);
        while let Some((to, m)) = store.pop_due(t_ns) {
            match (&*m.payload, &mut self.router) {
                (Payload::Items(batch), Router::Cores(instances)) => {
                    let at = self.base + Duration::from_nanos(m.at_ns);
                    for (_, item) in batch.iter().filter(|(_, i)| share.carries(i)) {
                        for inst in &mut instances[to * cores..(to + 1) * cores] {
                            inst.apply_shared(&item, at);
                        }
                    }
                }
                (Payload::Items(_), Router::Oracle { .. }) => {}
                (Payload::Load(load), _) => self.remote_load[to][m.from].clone_from(load),
            }
        }
    }

    /// The replica (at random) and core a request goes to.
    fn assign(&mut self) -> (usize, usize) {
        let replica = if self.replicas > 1 {
            self.replica_rng.usize(..self.replicas)
        } else {
            0
        };
        let core = match self.cfg.core_assign {
            CoreAssign::RoundRobin => {
                let next = &mut self.next_core[replica];
                *next = (*next + 1) % self.cores;
                *next
            }
            CoreAssign::Random => self.core_rng.usize(..self.cores),
        };
        (replica, replica * self.cores + core)
    }

    /// Every target as core `core` of `replica` sees it.
    fn candidates(&self, replica: usize, core: usize) -> Vec<Candidate> {
        (0..self.n)
            .map(|t| Candidate {
                target: t,
                weight: self.weights[t],
                fleet_load: self.remote_load[replica].iter().map(|l| l[t]).sum::<u64>(),
                load: self.remote_load[replica].iter().map(|l| l[t]).sum::<u64>()
                    + match self.cfg.load_view {
                        LoadView::Global => {
                            self.replica_in_flight[replica][t]
                                + self.engines[t].queue_depth() as u64
                        }
                        LoadView::PerCore => {
                            self.own_in_flight[core][t] + self.others_seen[core][t]
                        }
                    },
                tier: 0,
                queue_depth: self.engines[t].queue_depth() as u64,
                kv_usage: Some(self.engines[t].kv_usage()),
                lora: self.residency[t],
            })
            .collect()
    }

    /// Schedules the session's next turn `think` after `now`, if it has one.
    fn next_turn(&mut self, session: u32, turn: u32, now: Duration) {
        if let Some(next) = self.sessions[session as usize].turns.get(turn as usize + 1) {
            let at = now + next.think;
            self.push(
                at,
                Event::Arrive {
                    session,
                    turn: turn + 1,
                },
            );
        }
    }

    /// Turn `turn` of `session` reaches a gateway replica: picked, routed, sent.
    fn arrive(&mut self, session: u32, turn: u32, now: Duration) {
        let sessions = self.sessions;
        let s = &sessions[session as usize];
        let tr = &s.turns[turn as usize];
        let (replica, core) = self.assign();
        let model = match tr.adapter {
            Some(a) if self.fleet.lora.is_some() => self.adapter_names[a as usize].as_str(),
            _ => BASE_MODEL,
        };
        if let Some(feed) = &self.lora {
            feed.residency(model, &mut self.residency);
        }
        let candidates = self.candidates(replica, core);
        let session_id = format!("session-{}", s.id);
        let tokens: Option<std::rc::Rc<[u32]>> =
            self.wants_tokens.then(|| token_ids(&tr.prompt).into());
        let req_inputs = AsyncInputs {
            token_ids: tokens.clone(),
            ..self.inputs.clone()
        };
        let req = PickRequest {
            model,
            session: SessionKey {
                header: self.header.then_some(session_id.as_bytes()),
                prompt: &tr.prompt,
            },
            prompt: &tr.prompt,
            prompt_tokens: tr.prompt_tokens,
            max_tokens: Some(tr.output_tokens as u64),
            inputs: &req_inputs,
        };
        let at = self.base + now;
        let pick: Option<Pick> = match &mut self.router {
            // A strategy is never asked to pick among no candidates (a fleet of none
            // rejects every request, as the gateway answers 503).
            _ if candidates.is_empty() => None,
            Router::Cores(instances) => instances[core].pick(&req, &candidates, at),
            Router::Oracle { owner, groups } => {
                Some(oracle_pick(owner, groups, s.group, &candidates))
            }
        };
        let Some(pick) = pick else {
            self.rejected += 1;
            self.next_turn(session, turn, now);
            return;
        };
        if pick.fallback.is_some() {
            self.fallbacks += 1;
        }
        let target = candidates[pick.index].target;
        if let Router::Cores(instances) = &mut self.router {
            instances[core].routed(&req, target, self.sinks[core].for_route(0), at);
        }
        self.send(
            session,
            turn,
            core,
            target,
            candidates[pick.index].load,
            tokens,
            now,
        );
    }

    /// Sends the picked request to `target`'s engine.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        session: u32,
        turn: u32,
        core: usize,
        target: usize,
        load_at_send: u64,
        tokens: Option<std::rc::Rc<[u32]>>,
        now: Duration,
    ) {
        let tr = &self.sessions[session as usize].turns[turn as usize];
        self.per_target[target] += 1;
        let track = &mut self.tracks[session as usize];
        match track.first {
            None => track.first = Some(target),
            Some(f) if f != target => track.moved = true,
            _ => {}
        }
        track.routed += 1;
        self.replica_in_flight[core / self.cores][target] += 1;
        self.own_in_flight[core][target] += 1;
        let id = self.reqs.len();
        self.reqs.push(InFlight {
            session,
            turn,
            core,
            target,
            sent: now,
            admitted: now,
            load_at_send,
            blocks: block_hashes(&tr.prompt),
            hit_tokens: 0,
            to_first_token: Duration::ZERO,
            to_finish: Duration::ZERO,
            tokens,
            adapter: tr.adapter.filter(|_| self.fleet.lora.is_some()),
        });
        // An adapter request first needs its adapter's slot (and maybe its load).
        let ready = match (
            self.reqs[id].adapter,
            self.engines[target].adapters.as_mut(),
        ) {
            (Some(a), Some(slots)) => slots.acquire(id, a, now),
            _ => Some(now),
        };
        match ready {
            Some(r) if r > now => self.push(r, Event::Ready { req: id as u32 }),
            Some(_) => {
                let e = &mut self.engines[target];
                if let Some(fin) = start(
                    e,
                    &mut self.kv,
                    &mut self.reqs,
                    id,
                    self.sessions,
                    now,
                    self.base,
                ) {
                    self.push(fin, Event::Finish { req: id as u32 });
                }
            }
            None => {}
        }
    }

    /// Request `req` finished on its engine: counted, its slot and adapter released, its
    /// sample observed, the session's next turn scheduled.
    fn finish(&mut self, req: u32, now: Duration) {
        let r = &self.reqs[req as usize];
        let (target, core) = (r.target, r.core);
        let tr = &self.sessions[r.session as usize].turns[r.turn as usize];
        let ttft = (r.admitted - r.sent) + r.to_first_token;
        self.ttfts.push(ttft.as_secs_f64() * 1e3);
        self.prompt_total += tr.prompt_tokens as u64;
        self.hit_total += r.hit_tokens as u64;
        self.last_finish = self.last_finish.max(now);
        let sample = Sample {
            target,
            status: 200,
            success: true,
            ttft: Some(ttft),
            first_byte: Some(ttft),
            duration: now - r.sent,
            load_at_send: r.load_at_send,
            prompt_tokens: tr.prompt_tokens,
            usage: Some(Usage {
                prompt_tokens: tr.prompt_tokens,
                completion_tokens: tr.output_tokens,
            }),
            finished: self.base + now,
        };
        let (session, turn) = (r.session, r.turn);
        let held = r.blocks.len();
        let adapter = r.adapter;
        self.replica_in_flight[core / self.cores][target] -= 1;
        self.own_in_flight[core][target] -= 1;
        if let Some(next) = self.engines[target].release(held) {
            let fin = admit(
                &mut self.engines[target],
                &mut self.reqs[next],
                self.sessions,
                now,
            );
            self.kv.publish(
                target,
                &mut self.engines[target],
                &self.reqs[next],
                self.base + now,
            );
            self.push(fin, Event::Finish { req: next as u32 });
        }
        // The adapter's slot: waiting requests that get one go on.
        let granted = match (adapter, self.engines[target].adapters.as_mut()) {
            (Some(a), Some(slots)) => slots.release(a, now),
            _ => Vec::new(),
        };
        for (id, ready) in granted {
            if ready > now {
                self.push(ready, Event::Ready { req: id as u32 });
            } else {
                let e = &mut self.engines[target];
                if let Some(fin) = start(
                    e,
                    &mut self.kv,
                    &mut self.reqs,
                    id,
                    self.sessions,
                    now,
                    self.base,
                ) {
                    self.push(fin, Event::Finish { req: id as u32 });
                }
            }
        }
        // Free the finished request's blocks list; it is not needed any more.
        self.reqs[req as usize].blocks = Vec::new();
        if let Router::Cores(instances) = &mut self.router {
            instances[core].observe(&sample);
            if self.cores > 1 {
                self.pending_samples.push((core, sample));
            }
        }
        self.next_turn(session, turn, now);
    }

    fn summary(self, workload: &Workload, policy: &Policy) -> RunResult {
        let first_start = self
            .sessions
            .iter()
            .map(|s| s.start)
            .min()
            .unwrap_or_default();
        let adapter_loads = self.fleet.lora.map(|_| {
            self.engines
                .iter()
                .map(|e| e.adapters.as_ref().map_or(0, |a| a.loads()))
                .collect()
        });
        summarize(Summary {
            workload: workload.kind.name().to_string(),
            policy: policy.label(),
            rejected: self.rejected,
            fallbacks: self.fallbacks,
            prompt_total: self.prompt_total,
            hit_total: self.hit_total,
            ttfts: self.ttfts,
            per_target: self.per_target,
            tracks: self.tracks,
            sim: self.last_finish.saturating_sub(first_start),
            adapter_loads,
            store_items: (self.replicas > 1).then_some(self.store_items),
        })
    }
}

/// Request `id`, ready to run on `engine` at `now`, takes a running slot (or queues for
/// one); returns when it finishes if it was admitted.
fn start(
    engine: &mut Engine,
    kv: &mut KvFeed,
    reqs: &mut [InFlight],
    id: usize,
    sessions: &[crate::workload::Session],
    now: Duration,
    base: Instant,
) -> Option<Duration> {
    if !engine.has_free_slot() {
        engine.enqueue(id);
        return None;
    }
    let fin = admit(engine, &mut reqs[id], sessions, now);
    let target = reqs[id].target;
    kv.publish(target, engine, &reqs[id], base + now);
    Some(fin)
}

/// Admits `r` on `engine` at `now`; returns when it finishes.
fn admit(
    engine: &mut Engine,
    r: &mut InFlight,
    sessions: &[crate::workload::Session],
    now: Duration,
) -> Duration {
    let tr = &sessions[r.session as usize].turns[r.turn as usize];
    let a = engine.admit(now, &r.blocks, tr.prompt_tokens, tr.output_tokens);
    r.admitted = now;
    r.hit_tokens = a.hit_tokens;
    r.to_first_token = a.to_first_token;
    r.to_finish = a.to_finish;
    now + a.to_finish
}

/// One exchange tick: every core's shared items and finished samples reach every other
/// core of its replica (instances `i` with the same `i / cores`); with `publish`, each
/// core's shared items then go to the store at that tick (in ns), counting the items of
/// the kinds shared.
fn exchange(
    instances: &mut [Box<dyn Strategy>],
    cores: usize,
    sinks: &mut [ShareSink],
    samples: &mut Vec<(usize, Sample)>,
    mut publish: Option<(&mut Store, u64, Share, &mut u64)>,
    now: Instant,
) {
    let same_replica = |a: usize, b: usize| a != b && a / cores == b / cores;
    for (from, sink) in sinks.iter_mut().enumerate() {
        if sink.is_empty() {
            continue;
        }
        let batch = sink.take_batch();
        for (to, inst) in instances.iter_mut().enumerate() {
            if same_replica(from, to) {
                for (_, item) in batch.iter() {
                    inst.apply_shared(&item, now);
                }
            }
        }
        if let Some((store, tick_ns, share, items)) = publish.as_mut() {
            **items += batch.iter().filter(|(_, i)| share.carries(i)).count() as u64;
            store.publish(from / cores, *tick_ns, Payload::Items(batch));
        }
    }
    for (from, sample) in samples.drain(..) {
        for (to, inst) in instances.iter_mut().enumerate() {
            if same_replica(from, to) {
                inst.observe(&sample);
            }
        }
    }
}

/// The oracle: a group's first request goes to the least-loaded candidate (ties: fewest
/// groups owned, then the lowest index); every later request of the group follows it.
fn oracle_pick(
    owner: &mut HashMap<u64, usize>,
    groups: &mut [u64],
    group: u64,
    candidates: &[Candidate],
) -> Pick {
    if let Some(&t) = owner.get(&group) {
        if let Some(i) = candidates.iter().position(|c| c.target == t) {
            return Pick::at(i);
        }
    }
    let i = (0..candidates.len())
        .min_by_key(|&i| (candidates[i].load, groups[candidates[i].target], i))
        .expect("candidates are never empty");
    let t = candidates[i].target;
    owner.insert(group, t);
    groups[t] += 1;
    Pick::at(i)
}

struct Summary {
    workload: String,
    policy: String,
    rejected: u64,
    fallbacks: u64,
    prompt_total: u64,
    hit_total: u64,
    ttfts: Vec<f64>,
    per_target: Vec<u64>,
    tracks: Vec<SessionTrack>,
    sim: Duration,
    adapter_loads: Option<Vec<u64>>,
    store_items: Option<u64>,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarize(s: Summary) -> RunResult {
    let mut ttfts = s.ttfts;
    ttfts.sort_by(f64::total_cmp);
    let requests = ttfts.len() as u64;
    let mean = if ttfts.is_empty() {
        0.0
    } else {
        ttfts.iter().sum::<f64>() / ttfts.len() as f64
    };
    let routed: u64 = s.per_target.iter().sum();
    let load_spread = if routed == 0 {
        0.0
    } else {
        let max = *s.per_target.iter().max().unwrap_or(&0) as f64;
        max / (routed as f64 / s.per_target.len() as f64)
    };
    let multi: Vec<&SessionTrack> = s.tracks.iter().filter(|t| t.routed >= 2).collect();
    let sticky_sessions = (!multi.is_empty())
        .then(|| multi.iter().filter(|t| !t.moved).count() as f64 / multi.len() as f64);
    let adapter_loads = s.adapter_loads.as_ref().map(|l| l.iter().sum::<u64>());
    RunResult {
        workload: s.workload,
        policy: s.policy,
        requests,
        rejected: s.rejected,
        fallbacks: s.fallbacks,
        prompt_tokens: s.prompt_total,
        hit_tokens: s.hit_total,
        hit_rate: if s.prompt_total == 0 {
            0.0
        } else {
            s.hit_total as f64 / s.prompt_total as f64
        },
        ttft_mean_ms: mean,
        ttft_p50_ms: percentile(&ttfts, 0.50),
        ttft_p99_ms: percentile(&ttfts, 0.99),
        per_target: s.per_target,
        load_spread,
        sticky_sessions,
        sim_seconds: s.sim.as_secs_f64(),
        adapter_loads_per_1k: adapter_loads.map(|l| l as f64 * 1000.0 / requests.max(1) as f64),
        adapter_loads,
        adapter_loads_per_target: s.adapter_loads,
        store_items: s.store_items,
    }
}

/// Resolves a strategy name (or alias) with its options through the registry. `Ok(None)`
/// when the registry does not know the name; `Err` for invalid options.
pub fn strategy_policy(name: &str, options: toml::Table) -> Result<Option<Policy>, String> {
    if registry::lookup(name).is_none() {
        return Ok(None);
    }
    match StrategySpec::parse(name, &options) {
        Ok(spec) => Ok(Some(Policy::Strategy(spec))),
        Err(errors) => Err(errors
            .into_iter()
            .map(|e| format!("{name}.{}: {}", e.key, e.message))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

#[cfg(test)]
mod tests;
