//! Admission control at the gateway under overload (`rolter-sim admission`): engines with
//! a gateway-side `max_concurrent` cap, the route's gateway-wide bounded queue
//! (`queue_max`, `queue_timeout`) and, with admission features, priority classes (strict
//! class order, a reserved share of each engine's places), weighted fair queueing between
//! tenants within a class (an unserved request's charge given back), displacement of the
//! last waiter in line (by class, then finish tag) by a newcomer before it when the queue
//! is full, and per-class deadlines (504). Without them the queue is first in, first out
//! and a full queue answers 503 at once, as the gateway did before admission features.
//!
//! Owns the event loop of one run: arrivals, admissions, completions and expiries on a
//! virtual clock. The target among the engines with a free place is chosen by a registry
//! strategy built from its validated `StrategySpec`; each engine is the simulator's
//! [`Engine`] (serialised prefill, then decode), with no prefix cache. The queue's order
//! and bookkeeping are in [`queue`], the requests in [`workload`], the counting in
//! [`metrics`], the scenarios and the report in [`cli`].

pub mod cli;
pub mod metrics;
pub mod queue;
pub mod workload;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter::core::{Price, PriceBook, Residency};
use rolter::strategy::{
    AsyncInputs, BuildContext, Candidate, PickRequest, Sample, SessionKey, ShareSink, Strategy,
    StrategySpec, Switches, Usage,
};
use serde::Serialize;

use crate::engine::{Engine, EngineParams};
use crate::fleet::fleet_targets;
use metrics::{jain, ClassStats, Outcome, Tally, TenantStats};
use queue::{class_limits, Charge, FairClock, Key, Queue};
use workload::{Class, Lengths, Request, Stream, Tenant};

/// Whether the gateway has admission features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Today: one first-in-first-out queue, classes and tenants ignored, 503 at once when
    /// the queue is full, no deadlines.
    Fifo,
    /// Classes (strict order, reserves), fair queueing within a class, displacement of the
    /// last waiter in line (a later class, or the same class and a later tag) by a
    /// newcomer before it when the queue is full, and deadlines. As in the gateway, a
    /// request that leaves the queue unserved (timed out, displaced, past its deadline) or
    /// is refused at a full queue gives its charge back to its tenant's last finish tag.
    Admission,
}

impl Mode {
    /// Whether the gateway has the admission features.
    pub fn admission(self) -> bool {
        self != Mode::Fifo
    }
}

/// The fleet and the gateway's settings of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub engines: usize,
    /// The gateway's cap per engine (the engine runs every request it is sent).
    pub max_concurrent: usize,
    pub queue_max: usize,
    pub queue_timeout: Duration,
    pub ttft_base: Duration,
    pub prefill_per_token: Duration,
    pub itl: Duration,
    /// The strategy that picks among the engines with a free place.
    pub strategy: StrategySpec,
    pub seed: u64,
}

impl Settings {
    /// Requests per second the fleet completes when every place is busy: places ÷ the mean
    /// service time (`ttft_base` + prefill + output × ITL; prefill queueing left out).
    pub fn capacity(&self, lengths: &Lengths) -> f64 {
        let service = self.ttft_base.as_secs_f64()
            + lengths.mean_prompt() * self.prefill_per_token.as_secs_f64()
            + lengths.mean_output() * self.itl.as_secs_f64();
        (self.engines * self.max_concurrent) as f64 / service.max(1e-9)
    }

    fn engine(&self) -> EngineParams {
        EngineParams {
            max_running: self.max_concurrent.max(1),
            cache_blocks: 0,
            ttft_base: self.ttft_base,
            prefill_per_token: self.prefill_per_token,
            itl: self.itl,
        }
    }
}

/// Who sends what: classes, tenants, their streams, over `duration`.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub classes: Vec<Class>,
    pub tenants: Vec<Tenant>,
    pub streams: Vec<Stream>,
    pub lengths: Lengths,
    #[serde(serialize_with = "ser_s")]
    pub duration: Duration,
}

fn ser_s<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Scenario {
    /// The requests of this scenario for `seed`.
    pub fn requests(&self, seed: u64) -> Vec<Request> {
        workload::generate(&self.streams, &self.lengths, self.duration, seed)
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct AdmissionResult {
    pub scenario: String,
    pub mode: Mode,
    pub queue_max: usize,
    pub requests: u64,
    pub offered_per_s: f64,
    /// Requests admitted to an engine per second of arrivals.
    pub served_per_s: f64,
    /// [`Settings::capacity`].
    pub capacity_per_s: f64,
    pub classes: Vec<ClassStats>,
    pub tenants: Vec<TenantStats>,
    /// Jain's index over the tenants' served tokens.
    pub jain: f64,
    pub refused: u64,
    pub displaced: u64,
    pub timed_out: u64,
    pub deadline: u64,
    /// Simulated time to the last completion.
    pub sim_seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive {
        req: u32,
    },
    Finish {
        req: u32,
    },
    /// Request `req`'s wait ends: its deadline (504) or `queue_timeout` (503).
    Expire {
        req: u32,
        deadline: bool,
    },
}

/// A queued request's seat: its place in line and, with admission features, what its tag
/// charged its tenant.
#[derive(Debug, Clone, Copy)]
struct Seat {
    key: Key,
    charge: Option<Charge>,
}

/// What the gateway holds for a request sent to an engine.
#[derive(Debug, Clone, Copy, Default)]
struct Sent {
    target: usize,
    at: Duration,
    load: u64,
    to_first_token: Duration,
}

/// The state of one run.
struct Gate<'a> {
    reqs: &'a [Request],
    scenario: &'a Scenario,
    settings: &'a Settings,
    mode: Mode,
    engines: Vec<Engine>,
    strategy: Box<dyn Strategy>,
    sink: ShareSink,
    inputs: AsyncInputs,
    queue: Queue,
    clock: FairClock,
    /// Per class: the in-flight count below which it is admitted to an engine.
    limits: Vec<usize>,
    /// Per request: its seat while it waits.
    waiting: Vec<Option<Seat>>,
    sent: Vec<Sent>,
    tally: Tally,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    base: Instant,
    last: Duration,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Every engine's price, as the other simulations give it (for strategies that read it).
const PRICE: Price = Price {
    input_per_mtok: 0.5,
    output_per_mtok: 1.5,
};

fn build_strategy(spec: &StrategySpec, n: usize, seed: u64) -> Box<dyn Strategy> {
    let targets = fleet_targets(n);
    let weights: Vec<f64> = targets.iter().map(|t| t.weight).collect();
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let route_targets: Vec<usize> = (0..n).collect();
    spec.build(&BuildContext {
        target_count: n,
        seed,
        weights: &weights,
        names: &names,
        route_targets: &route_targets,
        prices: &PriceBook::fixed(&vec![Some(PRICE); n]),
        switches: &Arc::new(Switches::default()),
        kv: None,
    })
}

/// Runs `reqs` (of `scenario`) through the gateway of `settings` in `mode`.
pub fn run(
    reqs: &[Request],
    scenario: &Scenario,
    settings: &Settings,
    mode: Mode,
) -> AdmissionResult {
    let mut gate = Gate::new(reqs, scenario, settings, mode);
    while let Some(Reverse((t_ns, _, ev))) = gate.heap.pop() {
        let now = Duration::from_nanos(t_ns);
        match ev {
            Event::Arrive { req } => gate.arrive(req as usize, now),
            Event::Finish { req } => gate.finish(req as usize, now),
            Event::Expire { req, deadline } => gate.expire(req as usize, deadline),
        }
    }
    gate.summary()
}

impl<'a> Gate<'a> {
    fn new(
        reqs: &'a [Request],
        scenario: &'a Scenario,
        settings: &'a Settings,
        mode: Mode,
    ) -> Self {
        let n = settings.engines.max(1);
        let admission = mode.admission();
        let limits = if admission {
            class_limits(&scenario.classes, settings.max_concurrent)
        } else {
            vec![settings.max_concurrent; scenario.classes.len()]
        };
        let mut gate = Gate {
            reqs,
            scenario,
            settings,
            mode,
            engines: (0..n).map(|_| Engine::new(settings.engine())).collect(),
            strategy: build_strategy(&settings.strategy, n, settings.seed),
            sink: ShareSink::default(),
            inputs: AsyncInputs::default(),
            queue: Queue::new(settings.queue_max, admission),
            clock: FairClock::new(scenario.tenants.len()),
            limits,
            waiting: vec![None; reqs.len()],
            sent: vec![Sent::default(); reqs.len()],
            tally: Tally::new(scenario.classes.len(), scenario.tenants.len()),
            heap: BinaryHeap::new(),
            seq: 0,
            base: Instant::now(),
            last: Duration::ZERO,
        };
        for (i, r) in reqs.iter().enumerate() {
            gate.push(r.at, Event::Arrive { req: i as u32 });
        }
        gate
    }

    fn push(&mut self, at: Duration, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((ns(at), self.seq, ev)));
    }

    fn rank(&self, r: &Request) -> u8 {
        match self.mode {
            Mode::Fifo => 0,
            Mode::Admission => self.scenario.classes[r.class].rank,
        }
    }

    /// A queued request's place in the order: its fair-queueing finish tag and the charge
    /// to give back if it leaves unserved, or (FIFO) its arrival number.
    fn tag(&mut self, id: usize) -> (u64, Option<Charge>) {
        let r = &self.reqs[id];
        let share = self.scenario.tenants[r.tenant].share;
        match self.mode {
            Mode::Fifo => (id as u64, None),
            Mode::Admission => {
                let (tag, charge) = self.clock.tag(r.tenant, r.cost(), share);
                (tag, Some(charge))
            }
        }
    }

    /// Request `id` left the queue (or was refused at it) unserved: its tenant gets its
    /// charge back.
    fn unserved(&mut self, id: usize, charge: Option<Charge>, outcome: Outcome) {
        if let Some(c) = charge {
            self.clock.refund(c);
        }
        self.tally.record(&self.reqs[id], outcome);
    }

    /// The engines a request of `class` may be admitted to now, as the strategy sees them.
    fn candidates(&self, class: usize) -> Vec<Candidate> {
        let limit = self.limits[class];
        (0..self.engines.len())
            .filter(|&t| self.engines[t].running() < limit)
            .map(|t| Candidate {
                target: t,
                weight: 1.0,
                load: self.engines[t].running() as u64,
                fleet_load: 0,
                tier: 0,
                queue_depth: 0,
                kv_usage: None,
                lora: Residency::UNKNOWN,
            })
            .collect()
    }

    /// Request `id` reaches the gateway: while nobody waits, or when the queue is full,
    /// admitted at once when an engine has a place for its class (at a full queue, a place
    /// its class reserves is taken without displacing anyone, as the gateway does);
    /// otherwise it joins the queue with its finish tag (displacing the last waiter of a
    /// full queue when it is in line before it, else refused), and when its class has a
    /// place (it is then in line before every waiter) it is admitted from its seat at
    /// once, as the gateway's first waiter is.
    fn arrive(&mut self, id: usize, now: Duration) {
        let candidates = self.candidates(self.reqs[id].class);
        if !candidates.is_empty() && (self.queue.is_empty() || self.queue.is_full()) {
            self.admit(id, None, &candidates, now);
            return;
        }
        let Some(seat) = self.join(id) else {
            return;
        };
        if !candidates.is_empty() {
            self.queue.remove(&seat.key);
            self.admit(id, Some(seat), &candidates, now);
            return;
        }
        self.waiting[id] = Some(seat);
        let deadline = match self.mode {
            Mode::Fifo => None,
            Mode::Admission => self.scenario.classes[self.reqs[id].class].deadline,
        };
        let timeout = self.settings.queue_timeout;
        let (wait, by_deadline) = match deadline {
            Some(d) if d < timeout => (d, true),
            _ => (timeout, false),
        };
        let ev = Event::Expire {
            req: id as u32,
            deadline: by_deadline,
        };
        self.push(now + wait, ev);
    }

    /// Request `id` takes a seat: tagged, then seated (a full queue's last waiter, when
    /// after it, displaced and refunded), or refused with its charge given back.
    fn join(&mut self, id: usize) -> Option<Seat> {
        let (tag, charge) = self.tag(id);
        let key = Key {
            rank: self.rank(&self.reqs[id]),
            tag,
            seq: id as u64,
        };
        if !self.queue.accepts(&key) {
            self.unserved(id, charge, Outcome::Refused);
            return None;
        }
        if let Some((_, v)) = self.queue.push(key, id) {
            let lost = self.waiting[v]
                .take()
                .expect("a displaced request was waiting");
            self.unserved(v, lost.charge, Outcome::Displaced);
        }
        Some(Seat { key, charge })
    }

    /// Sends request `id` (a waiter at `seat`, or one that did not queue) to the engine the
    /// strategy picks among `candidates`.
    fn admit(&mut self, id: usize, seat: Option<Seat>, candidates: &[Candidate], now: Duration) {
        let r = self.reqs[id];
        let req = PickRequest {
            model: crate::workload::BASE_MODEL,
            session: SessionKey {
                header: None,
                prompt: &[],
            },
            prompt: &[],
            prompt_tokens: r.prompt_tokens,
            max_tokens: Some(r.max_tokens as u64),
            inputs: &self.inputs,
        };
        let at = self.base + now;
        let Some(pick) = self.strategy.pick(&req, candidates, at) else {
            self.unserved(id, seat.and_then(|s| s.charge), Outcome::Refused);
            return;
        };
        let c = candidates[pick.index];
        self.strategy
            .routed(&req, c.target, self.sink.for_route(0), at);
        let _ = self.sink.take_batch();
        if let Some(s) = seat.filter(|_| self.mode.admission()) {
            self.clock.admitted(s.key.tag);
        }
        let a = self.engines[c.target].admit(now, &[], r.prompt_tokens, r.max_tokens);
        let wait = now - r.at;
        self.tally.record(
            &r,
            Outcome::Served {
                ttft_ms: (wait + a.to_first_token).as_secs_f64() * 1e3,
                wait_ms: wait.as_secs_f64() * 1e3,
            },
        );
        self.sent[id] = Sent {
            target: c.target,
            at: now,
            load: c.load,
            to_first_token: a.to_first_token,
        };
        self.push(now + a.to_finish, Event::Finish { req: id as u32 });
    }

    /// Request `id` finished: its place is released, the strategy observes it, and the
    /// queue's head is admitted while an engine has a place for its class.
    fn finish(&mut self, id: usize, now: Duration) {
        let (r, s) = (self.reqs[id], self.sent[id]);
        self.last = self.last.max(now);
        self.engines[s.target].release(0);
        self.strategy.observe(&Sample {
            target: s.target,
            status: 200,
            success: true,
            ttft: Some(s.to_first_token),
            first_byte: Some(s.to_first_token),
            duration: now - s.at,
            load_at_send: s.load,
            prompt_tokens: r.prompt_tokens,
            usage: Some(Usage {
                prompt_tokens: r.prompt_tokens,
                completion_tokens: r.max_tokens,
            }),
            finished: self.base + now,
        });
        // Limits only shrink with rank, so when the head finds no place nobody behind it does.
        while let Some((_, next)) = self.queue.head() {
            let candidates = self.candidates(self.reqs[next].class);
            if candidates.is_empty() {
                break;
            }
            self.queue.pop_head();
            let seat = self.waiting[next].take();
            self.admit(next, seat, &candidates, now);
        }
    }

    /// Request `id`'s wait ran out, if it is still waiting.
    fn expire(&mut self, id: usize, deadline: bool) {
        let Some(seat) = self.waiting[id].take() else {
            return;
        };
        self.queue.remove(&seat.key);
        let outcome = if deadline {
            Outcome::Deadline
        } else {
            Outcome::TimedOut
        };
        self.unserved(id, seat.charge, outcome);
    }

    fn summary(self) -> AdmissionResult {
        let span = self.scenario.duration.as_secs_f64().max(1e-9);
        let (classes, tenants) = self
            .tally
            .summarize(&self.scenario.classes, &self.scenario.tenants);
        let served: u64 = classes.iter().map(|c| c.served).sum();
        let sum = |f: fn(&ClassStats) -> u64| classes.iter().map(f).sum::<u64>();
        let tokens: Vec<f64> = tenants.iter().map(|t| t.served_tokens as f64).collect();
        AdmissionResult {
            scenario: self.scenario.name.clone(),
            mode: self.mode,
            queue_max: self.settings.queue_max,
            requests: self.reqs.len() as u64,
            offered_per_s: self.reqs.len() as f64 / span,
            served_per_s: served as f64 / span,
            capacity_per_s: self.settings.capacity(&self.scenario.lengths),
            jain: jain(&tokens),
            refused: sum(|c| c.refused),
            displaced: sum(|c| c.displaced),
            timed_out: sum(|c| c.timed_out),
            deadline: sum(|c| c.deadline),
            sim_seconds: self.last.as_secs_f64(),
            classes,
            tenants,
        }
    }
}
