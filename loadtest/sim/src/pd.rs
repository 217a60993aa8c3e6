//! Disaggregated prefill/decode (P/D) serving against co-located serving, on one workload:
//! the fleet model ([`node`]: prefill, decode and co-located engines stepped iteration by
//! iteration), the KV transfer between a prefill and a decode engine, the two strategy
//! instances of a P/D route (one per pool, each over its own pool's targets) or the one of
//! a co-located route, and the metrics of one run (prefill-pool hit rate, TTFT, TPOT,
//! throughput, goodput, load spread per pool).
//!
//! Strategies are built from their validated `StrategySpec` as a gateway worker builds
//! them, see every target of the configuration (`target_count`, names) and route among
//! their own pool's (`route_targets`). Time is virtual; a run is a pure function of its
//! inputs. What this module must not do: read the wall clock for anything but the
//! strategies' `Instant` base, or share state between the two pools' strategies.

pub mod cli;
pub mod node;
pub mod shapes;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter::core::{KvCacheView, Price, PriceBook, Residency};
use rolter::strategy::{
    AsyncInputs, BuildContext, Candidate, Needs, PickRequest, Sample, SessionKey, ShareSink,
    Strategy, StrategySpec, Switches, Usage,
};
use serde::Serialize;

use crate::engine::block_hashes;
use crate::sim::{token_ids, KvFeed};
use crate::workload::{Workload, BASE_MODEL};
use node::{Job, Node, NodeParams, Role};

/// The KV transfer from a prefill engine to a decode engine (NIXL, Mooncake): a fixed
/// latency plus the prompt's tokens over the link's bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Transfer {
    #[serde(serialize_with = "ser_ms")]
    pub latency: Duration,
    /// Prompt tokens of KV cache moved per second.
    pub tokens_per_s: f64,
}

impl Transfer {
    /// How long moving the KV cache of `prompt_tokens` tokens takes.
    pub fn time(&self, prompt_tokens: u32) -> Duration {
        self.latency + Duration::from_secs_f64(prompt_tokens as f64 / self.tokens_per_s.max(1.0))
    }
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// When the decode engine is chosen: the engines' P/D wire protocols differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Two attempts in sequence: the decode target is picked when the prefill answered.
    Vllm,
    /// One request to both pools at once: both targets are picked on arrival.
    Sglang,
}

/// One pool of a route: its engines and its strategy.
#[derive(Debug, Clone)]
pub struct Pool {
    pub engines: usize,
    pub strategy: StrategySpec,
}

/// A fleet and the route in front of it.
#[derive(Debug, Clone)]
pub enum Setup {
    /// Prefill engines `p0..`, decode engines `d0..`, one strategy per pool.
    Disaggregated {
        prefill: Pool,
        decode: Pool,
        protocol: Protocol,
    },
    /// Engines `engine-0..` that prefill and decode, one strategy.
    Colocated(Pool),
}

impl Setup {
    /// `P/D 2:2` or `co-located 4`.
    pub fn layout(&self) -> String {
        match self {
            Setup::Disaggregated {
                prefill, decode, ..
            } => format!("P/D {}:{}", prefill.engines, decode.engines),
            Setup::Colocated(p) => format!("co-located {}", p.engines),
        }
    }

    /// The strategies: `cache_aware / least_loaded` or `cache_aware`.
    pub fn strategies(&self) -> String {
        match self {
            Setup::Disaggregated {
                prefill, decode, ..
            } => format!("{} / {}", prefill.strategy.name(), decode.strategy.name()),
            Setup::Colocated(p) => p.strategy.name().to_string(),
        }
    }

    /// Every engine's role and name, prefill engines first.
    fn engines(&self) -> Vec<(Role, String)> {
        match self {
            Setup::Disaggregated {
                prefill, decode, ..
            } => (0..prefill.engines)
                .map(|i| (Role::Prefill, format!("p{i}")))
                .chain((0..decode.engines).map(|i| (Role::Decode, format!("d{i}"))))
                .collect(),
            Setup::Colocated(p) => (0..p.engines)
                .map(|i| (Role::Colocated, format!("engine-{i}")))
                .collect(),
        }
    }
}

/// Latency objectives a request must meet to count toward goodput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    #[serde(serialize_with = "ser_ms")]
    pub ttft: Duration,
    #[serde(serialize_with = "ser_ms")]
    pub tpot: Duration,
}

/// Engine, link and objective settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PdParams {
    pub node: NodeParams,
    pub transfer: Transfer,
    pub slo: Slo,
    pub seed: u64,
}

/// What happened to one request, in simulated time from the start of the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub session: u32,
    pub turn: u32,
    pub sent: Duration,
    /// The engine (target id) that prefilled it.
    pub prefill_engine: usize,
    pub prefill_start: Duration,
    pub prefill_end: Duration,
    pub hit_tokens: u32,
    /// The KV transfer's time (zero when co-located).
    pub transfer: Duration,
    /// The engine that decoded it.
    pub decode_engine: usize,
    pub first_token: Duration,
    pub finished: Duration,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The loads the pools' strategies saw on their picks, and when the decode attempt
    /// was sent (for the samples the strategies observe).
    prefill_load: u64,
    decode_load: u64,
    decode_sent: Duration,
    /// While its KV cache is in transfer: the request as the decode engine will see it.
    job: Option<Job>,
    /// Until its prefill starts: the prompt's blocks, for its engine's KV events.
    blocks: Arc<[u64]>,
    /// Until its decode target is picked: the prompt's token ids, for strategies that
    /// read them.
    tokens: Option<Rc<[u32]>>,
}

/// The metrics of one run.
#[derive(Debug, Clone, Serialize)]
pub struct PdResult {
    pub workload: String,
    pub layout: String,
    pub strategies: String,
    pub requests: u64,
    /// Picks that returned no target (counted, not timed).
    pub rejected: u64,
    /// Picks (of both pools) that took a strategy's fallback path.
    pub fallbacks: u64,
    pub prompt_tokens: u64,
    pub hit_tokens: u64,
    /// Hit tokens ÷ prompt tokens on the engines that prefill (the prefill pool for P/D).
    pub hit_rate: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Time per output token after the first: (last − first token) ÷ (output − 1).
    pub tpot_p50_ms: f64,
    pub tpot_p99_ms: f64,
    pub transfer_mean_ms: f64,
    /// Completed requests and output tokens per simulated second.
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Requests per second that met both objectives, and their share.
    pub goodput_per_s: f64,
    pub slo_met: f64,
    /// Requests per engine of the prefill pool (co-located: every engine), and of the
    /// decode pool (P/D only).
    pub prefill_per_target: Vec<u64>,
    pub decode_per_target: Vec<u64>,
    /// The busiest engine's requests ÷ the pool's mean (1.00 = even).
    pub prefill_spread: f64,
    pub decode_spread: f64,
    pub sim_seconds: f64,
}

/// A run's metrics and every request's trace.
#[derive(Debug, Clone)]
pub struct PdRun {
    pub result: PdResult,
    pub traces: Vec<Trace>,
    /// Every engine's role, by target id.
    pub roles: Vec<Role>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive {
        session: u32,
        turn: u32,
    },
    /// Engine `node`'s iteration ends.
    Step {
        node: u32,
    },
    /// Request `req`'s KV cache reached its decode engine.
    Transferred {
        req: u32,
    },
}

/// One pool's strategy instance and what the gateway counts for it.
struct PoolState {
    strategy: Box<dyn Strategy>,
    /// Target ids of the pool.
    targets: Vec<usize>,
    /// Requests in flight per target id (sent to the pool, not yet answered by it).
    in_flight: Vec<u64>,
    routed: Vec<u64>,
    sink: ShareSink,
    fallbacks: u64,
}

impl PoolState {
    fn new(
        spec: &StrategySpec,
        targets: Vec<usize>,
        names: &[String],
        seed: u64,
        kv: &Arc<dyn KvCacheView>,
    ) -> Self {
        let n = names.len();
        let weights = vec![1.0; n];
        let price = Price {
            input_per_mtok: 0.5,
            output_per_mtok: 1.5,
        };
        let prices = PriceBook::fixed(&vec![Some(price); n]);
        let switches = Arc::new(Switches::default());
        let strategy = spec.build(&BuildContext {
            target_count: n,
            seed,
            weights: &weights,
            names,
            route_targets: &targets,
            prices: &prices,
            switches: &switches,
            kv: Some(kv),
        });
        PoolState {
            strategy,
            targets,
            in_flight: vec![0; n],
            routed: vec![0; n],
            sink: ShareSink::default(),
            fallbacks: 0,
        }
    }

    /// Picks a target for `req` among the pool's engines as the gateway would (load =
    /// requests in flight + the engine's queue); returns it and the load it had.
    fn pick(&mut self, nodes: &[Node], req: &PickRequest, at: Instant) -> Option<(usize, u64)> {
        let candidates: Vec<Candidate> = self
            .targets
            .iter()
            .map(|&t| Candidate {
                target: t,
                weight: 1.0,
                load: self.in_flight[t] + nodes[t].queue_depth() as u64,
                fleet_load: 0,
                tier: 0,
                queue_depth: nodes[t].queue_depth() as u64,
                kv_usage: Some(nodes[t].kv_usage()),
                lora: Residency::UNKNOWN,
            })
            .collect();
        let pick = self.strategy.pick(req, &candidates, at)?;
        self.fallbacks += pick.fallback.is_some() as u64;
        let c = &candidates[pick.index];
        self.strategy
            .routed(req, c.target, self.sink.for_route(0), at);
        // One instance per pool: nothing to exchange with other cores.
        drop(self.sink.take_batch());
        self.in_flight[c.target] += 1;
        self.routed[c.target] += 1;
        Some((c.target, c.load))
    }

    /// The pool's attempt on `target` answered.
    fn answered(&mut self, sample: &Sample) {
        self.in_flight[sample.target] -= 1;
        self.strategy.observe(sample);
    }

    fn per_target(&self) -> Vec<u64> {
        self.targets.iter().map(|&t| self.routed[t]).collect()
    }
}

struct State<'a> {
    workload: &'a Workload,
    params: &'a PdParams,
    protocol: Protocol,
    nodes: Vec<Node>,
    prefill: PoolState,
    /// `None`: co-located (the prefill pool decodes too).
    decode: Option<PoolState>,
    traces: Vec<Trace>,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    base: Instant,
    /// The prefilling engines' KV events, for strategies that read token ids.
    kv: Option<KvFeed>,
    rejected: u64,
}

/// Runs `workload` on the fleet and route of `setup`.
pub fn run(workload: &Workload, setup: &Setup, params: &PdParams) -> PdRun {
    let engines = setup.engines();
    let names: Vec<String> = engines.iter().map(|(_, n)| n.clone()).collect();
    let roles: Vec<Role> = engines.iter().map(|(r, _)| *r).collect();
    let seed = |k: u64| params.seed.wrapping_mul(0x9e37_79b9).wrapping_add(k);
    let kv = KvFeed::new(names.len());
    let view = kv.view();
    let (prefill, decode, protocol) = match setup {
        Setup::Disaggregated {
            prefill,
            decode,
            protocol,
        } => {
            let p = prefill.engines;
            let d = decode.engines;
            (
                PoolState::new(&prefill.strategy, (0..p).collect(), &names, seed(0), &view),
                Some(PoolState::new(
                    &decode.strategy,
                    (p..p + d).collect(),
                    &names,
                    seed(1),
                    &view,
                )),
                *protocol,
            )
        }
        Setup::Colocated(pool) => (
            PoolState::new(
                &pool.strategy,
                (0..pool.engines).collect(),
                &names,
                seed(0),
                &view,
            ),
            None,
            Protocol::Vllm,
        ),
    };
    // Only the pools' strategies that read token ids need the engines' KV events.
    let wants_tokens = std::iter::once(&prefill)
        .chain(decode.as_ref())
        .any(|p| p.strategy.needs().contains(Needs::TOKEN_IDS));
    let mut nodes: Vec<Node> = roles.iter().map(|&r| Node::new(r, params.node)).collect();
    if wants_tokens {
        for n in &mut nodes {
            n.cache.enable_log();
        }
    }
    let mut st = State {
        workload,
        params,
        protocol,
        nodes,
        prefill,
        decode,
        traces: Vec::new(),
        heap: BinaryHeap::new(),
        seq: 0,
        base: Instant::now(),
        kv: wants_tokens.then_some(kv),
        rejected: 0,
    };
    for (i, s) in workload.sessions.iter().enumerate() {
        let ev = Event::Arrive {
            session: i as u32,
            turn: 0,
        };
        st.push(s.start, ev);
    }
    while let Some(Reverse((t_ns, _, ev))) = st.heap.pop() {
        let now = Duration::from_nanos(t_ns);
        match ev {
            Event::Arrive { session, turn } => st.arrive(session, turn, now),
            Event::Step { node } => st.step_done(node as usize, now),
            Event::Transferred { req } => st.transferred(req as usize, now),
        }
    }
    let result = summarize(&st, setup);
    PdRun {
        result,
        traces: st.traces,
        roles,
    }
}

impl State<'_> {
    fn push(&mut self, at: Duration, ev: Event) {
        self.seq += 1;
        self.heap
            .push(Reverse((at.as_nanos() as u64, self.seq, ev)));
    }

    fn next_turn(&mut self, session: u32, turn: u32, now: Duration) {
        let s = &self.workload.sessions[session as usize];
        if let Some(next) = s.turns.get(turn as usize + 1) {
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

    /// Starts `node`'s next iteration if it is idle and has work.
    fn kick(&mut self, node: usize, now: Duration) {
        if let Some(it) = self.nodes[node].start(now) {
            if let Some((req, hit)) = it.prefill {
                let t = &mut self.traces[req];
                t.prefill_start = now;
                t.prefill_end = it.end;
                t.hit_tokens = hit;
                let blocks = std::mem::take(&mut t.blocks);
                // A vLLM decode pick still reads the token ids; nothing else does.
                let tokens = match (&self.decode, self.protocol) {
                    (Some(_), Protocol::Vllm) => t.tokens.clone(),
                    _ => t.tokens.take(),
                };
                if let Some(kv) = &mut self.kv {
                    let cache = &mut self.nodes[node].cache;
                    kv.publish_cache(node, cache, &blocks, tokens.as_deref(), self.base + now);
                }
            }
            self.push(it.end, Event::Step { node: node as u32 });
        }
    }

    fn arrive(&mut self, session: u32, turn: u32, now: Duration) {
        let at = self.base + now;
        let tr = &self.workload.sessions[session as usize].turns[turn as usize];
        let (prompt_tokens, output_tokens) = (tr.prompt_tokens, tr.output_tokens);
        let blocks: Arc<[u64]> = block_hashes(&tr.prompt).into();
        let tokens: Option<Rc<[u32]>> = self.kv.is_some().then(|| token_ids(&tr.prompt).into());
        let both = self.decode.is_some() && self.protocol == Protocol::Sglang;
        let prefill_max = if self.decode.is_some() && !both {
            1
        } else {
            output_tokens as u64
        };
        let (prefill, decode) = {
            let (nodes, pp, dp) = (&self.nodes, &mut self.prefill, &mut self.decode);
            with_request(
                self.workload,
                tokens.clone(),
                (session, turn),
                prefill_max,
                |req| {
                    let p = pp.pick(nodes, req, at);
                    let d = match (p, dp.as_mut()) {
                        (Some(_), Some(dp)) if both => dp.pick(nodes, req, at),
                        _ => None,
                    };
                    (p, d)
                },
            )
        };
        let Some((target, load)) = prefill else {
            self.rejected += 1;
            self.next_turn(session, turn, now);
            return;
        };
        let id = self.traces.len();
        let job = Job {
            req: id,
            blocks,
            prompt_tokens,
            output_tokens,
        };
        let (decode_engine, decode_load) = decode.unwrap_or((target, 0));
        self.traces.push(Trace {
            session,
            turn,
            sent: now,
            prefill_engine: target,
            decode_engine,
            decode_load,
            decode_sent: now,
            prefill_load: load,
            prompt_tokens,
            output_tokens,
            blocks: job.blocks.clone(),
            tokens,
            ..Trace::default()
        });
        self.nodes[target].push_prefill(job);
        self.kick(target, now);
    }

    fn step_done(&mut self, node: usize, now: Duration) {
        let out = self.nodes[node].complete();
        if let Some(job) = out.prefilled {
            self.prefilled(job, now);
        }
        for r in out.first_tokens {
            self.traces[r].first_token = now;
        }
        for r in out.finished {
            self.finished(r, now);
        }
        self.kick(node, now);
    }

    /// A P/D prefill answered: the prefill pool learns of it, the decode target is picked
    /// (vLLM) and the KV transfer starts.
    fn prefilled(&mut self, job: Job, now: Duration) {
        let at = self.base + now;
        let id = job.req;
        let t = &mut self.traces[id];
        t.prefill_end = now;
        let sample = sample(
            (t.prefill_engine, t.prefill_load),
            (t.sent, now),
            (t.prompt_tokens, 1),
            at,
        );
        self.prefill.answered(&sample);
        if self.protocol == Protocol::Vllm {
            let (session, turn) = (self.traces[id].session, self.traces[id].turn);
            let output = self.traces[id].output_tokens as u64;
            let (nodes, dp) = (&self.nodes, self.decode.as_mut().expect("P/D"));
            let tokens = self.traces[id].tokens.take();
            let picked = with_request(self.workload, tokens, (session, turn), output, |req| {
                dp.pick(nodes, req, at)
            });
            let Some((d, load)) = picked else {
                self.rejected += 1;
                self.next_turn(session, turn, now);
                return;
            };
            let t = &mut self.traces[id];
            t.decode_engine = d;
            t.decode_load = load;
            t.decode_sent = now;
        }
        let transfer = self.params.transfer.time(job.prompt_tokens);
        let t = &mut self.traces[id];
        t.transfer = transfer;
        t.job = Some(job);
        self.push(now + transfer, Event::Transferred { req: id as u32 });
    }

    fn transferred(&mut self, req: usize, now: Duration) {
        let t = &mut self.traces[req];
        let job = t.job.take().expect("a transfer carries its job");
        let d = t.decode_engine;
        self.nodes[d].push_decode(job);
        self.kick(d, now);
    }

    fn finished(&mut self, req: usize, now: Duration) {
        let at = self.base + now;
        let t = &mut self.traces[req];
        t.finished = now;
        let usage = (t.prompt_tokens, t.output_tokens);
        let (session, turn) = (t.session, t.turn);
        match self.decode.as_mut() {
            Some(dp) => {
                let mut s = sample(
                    (t.decode_engine, t.decode_load),
                    (t.decode_sent, now),
                    usage,
                    at,
                );
                s.ttft = Some(t.first_token - t.decode_sent);
                s.first_byte = s.ttft;
                dp.answered(&s);
            }
            None => {
                let attempt = (t.prefill_engine, t.prefill_load);
                let mut s = sample(attempt, (t.sent, now), usage, at);
                s.ttft = Some(t.first_token - t.sent);
                s.first_byte = s.ttft;
                self.prefill.answered(&s);
            }
        }
        self.next_turn(session, turn, now);
    }
}

/// Calls `f` with the pick request of turn `turn` of `session` (`max_tokens`: the vLLM
/// prefill attempt asks for one token).
fn with_request<R>(
    workload: &Workload,
    token_ids: Option<Rc<[u32]>>,
    (session, turn): (u32, u32),
    max_tokens: u64,
    f: impl FnOnce(&PickRequest) -> R,
) -> R {
    let s = &workload.sessions[session as usize];
    let tr = &s.turns[turn as usize];
    let session_id = format!("session-{}", s.id);
    let req = PickRequest {
        model: BASE_MODEL,
        session: SessionKey {
            header: workload.kind.header().then_some(session_id.as_bytes()),
            prompt: &tr.prompt,
        },
        prompt: &tr.prompt,
        prompt_tokens: tr.prompt_tokens,
        max_tokens: Some(max_tokens),
        inputs: &AsyncInputs {
            token_ids,
            ..AsyncInputs::default()
        },
    };
    f(&req)
}

/// A successful attempt's sample: on `target` (which had `load_at_send`), sent at `sent`
/// and answered whole at `now` (its TTFT is set by the caller when it streamed more than
/// one token).
fn sample(
    (target, load_at_send): (usize, u64),
    (sent, now): (Duration, Duration),
    (prompt_tokens, completion_tokens): (u32, u32),
    at: Instant,
) -> Sample {
    Sample {
        target,
        status: 200,
        success: true,
        ttft: Some(now - sent),
        first_byte: Some(now - sent),
        duration: now - sent,
        load_at_send,
        prompt_tokens,
        usage: Some(Usage {
            prompt_tokens,
            completion_tokens,
        }),
        finished: at,
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn spread(per_target: &[u64]) -> f64 {
    let total: u64 = per_target.iter().sum();
    if total == 0 {
        return 0.0;
    }
    *per_target.iter().max().unwrap_or(&0) as f64 / (total as f64 / per_target.len() as f64)
}

fn summarize(st: &State, setup: &Setup) -> PdResult {
    let slo = st.params.slo;
    let done: Vec<&Trace> = st.traces.iter().filter(|t| t.finished > t.sent).collect();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut ttft: Vec<f64> = done.iter().map(|t| ms(t.first_token - t.sent)).collect();
    let tpot_of = |t: &Trace| match t.output_tokens {
        0 | 1 => Duration::ZERO,
        n => (t.finished - t.first_token) / (n - 1),
    };
    let mut tpot: Vec<f64> = done.iter().map(|t| ms(tpot_of(t))).collect();
    ttft.sort_by(f64::total_cmp);
    tpot.sort_by(f64::total_cmp);
    let met = done
        .iter()
        .filter(|t| t.first_token - t.sent <= slo.ttft && tpot_of(t) <= slo.tpot)
        .count();
    let first = done.iter().map(|t| t.sent).min().unwrap_or_default();
    let last = done.iter().map(|t| t.finished).max().unwrap_or_default();
    let secs = (last - first).as_secs_f64().max(1e-9);
    let prompt: u64 = done.iter().map(|t| t.prompt_tokens as u64).sum();
    let hit: u64 = done.iter().map(|t| t.hit_tokens as u64).sum();
    let output: u64 = done.iter().map(|t| t.output_tokens as u64).sum();
    let n = done.len().max(1) as f64;
    let prefill_per_target = st.prefill.per_target();
    let decode_per_target = st
        .decode
        .as_ref()
        .map(|d| d.per_target())
        .unwrap_or_default();
    PdResult {
        workload: st.workload.kind.name().to_string(),
        layout: setup.layout(),
        strategies: setup.strategies(),
        requests: done.len() as u64,
        rejected: st.rejected,
        fallbacks: st.prefill.fallbacks + st.decode.as_ref().map_or(0, |d| d.fallbacks),
        prompt_tokens: prompt,
        hit_tokens: hit,
        hit_rate: hit as f64 / prompt.max(1) as f64,
        ttft_p50_ms: percentile(&ttft, 0.5),
        ttft_p99_ms: percentile(&ttft, 0.99),
        tpot_p50_ms: percentile(&tpot, 0.5),
        tpot_p99_ms: percentile(&tpot, 0.99),
        transfer_mean_ms: done.iter().map(|t| ms(t.transfer)).sum::<f64>() / n,
        requests_per_s: done.len() as f64 / secs,
        output_tokens_per_s: output as f64 / secs,
        goodput_per_s: met as f64 / secs,
        slo_met: met as f64 / n,
        prefill_spread: spread(&prefill_per_target),
        decode_spread: spread(&decode_per_target),
        prefill_per_target,
        decode_per_target,
        sim_seconds: secs,
    }
}
