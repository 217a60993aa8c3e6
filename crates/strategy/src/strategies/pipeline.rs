//! `pipeline`: filter → score → argmax, with session affinity.
//!
//! **Filter.** The gateway hands over candidates that are already healthy, under
//! `max_concurrent` and serving the requested model. The strategy adds `max_queue`: a
//! candidate whose engine queue (`queue_depth`) exceeds it is dropped, unless that would
//! drop every candidate, in which case all stay and the pick is marked `queue_limit`.
//!
//! **Session affinity.** A request carrying `x-session-id` goes to the target that last
//! served that session when that target survived the filter and the last use is within
//! `session_ttl` (default 10 minutes; `"0s"` turns affinity off). The session map is
//! bounded by `max_sessions` (least recently used evicted first; expired pins are dropped
//! as they reach the front of the eviction order).
//!
//! **Score.** Each scorer whose weight is above 0 gives every surviving candidate a value
//! in [0, 1], higher is better, normalised across the candidates:
//!
//! | scorer | option | value |
//! |---|---|---|
//! | weight | `w_weight` (0) | weight / largest weight |
//! | load | `w_load` (1) | 1 − load / largest load (1 when all are 0) |
//! | prefix | `w_prefix` (1) | leading prompt bytes the target holds / prompt length |
//! | latency | `w_latency` (0) | smallest TTFT EWMA / own (unmeasured: 1) |
//! | cost | `w_cost` (0) | cheapest estimate / own (unknown price: 0) |
//! | queue | `w_queue` (0) | 1 − queue_depth / largest queue_depth (1 when all are 0) |
//! | kv_cache | `w_kv_cache` (0) | 1 − KV-cache use (unknown: 0.5) |
//! | lora | `w_lora` (0) | `lora_aware`'s residency score of the requested adapter (running 1, free slot 0.8, waiting 0.6, registered 0.4, none or unknown 0); 1 everywhere for a base model |
//!
//! The pick's score is `Σ w × value`; the highest wins and ties (within rounding) are
//! broken uniformly at random. Every weight at 0 is a configuration error (the registry's
//! combined check). The scorer set is the internal [`Scorer`] enum; `precise_prefix`
//! (KV-event block index) is reserved there but not wired yet, because its signal does not
//! reach strategies yet.
//!
//! **Learning.** `routed` inserts the prompt into the target's [`PrefixIndex`] (when the
//! prefix scorer is on) and pins an explicit session to the target, and shares both through
//! the [`ShareSink`]; `apply_shared` applies what other cores shared. `observe` feeds a
//! TTFT EWMA per target when the latency scorer is on.
//!
//! Owns the prefix index, one EWMA per target id, the session map, a clone of the price
//! book, its generator and scratch lists sized `target_count` at build, so a pick does not
//! allocate. It must not block, lock, log or do I/O; time comes in as an argument.

use std::time::{Duration, Instant};

use rolter_core::{PriceBook, Residency};
use serde::{Deserialize, Serialize};

use crate::registry::Trait;
use crate::shared::ewma::{route_mask, teaching_ttft_ms, TtftEwma};
use crate::shared::prefix_index::{PrefixIndex, PromptKeys};
use crate::shared::sessions::SessionPins;
use crate::strategies::lora_aware::LadderScores;
use crate::{
    BuildContext, Candidate, Needs, OptionError, Pick, PickRequest, Sample, ShareSink, Shared,
    Strategy, StrategyOptions, TargetId,
};

/// Scores closer than this tie (they differ only by rounding).
const SCORE_EPSILON: f64 = 1e-12;

/// One scoring signal. Each turns the candidates into values in [0, 1], higher is better.
///
/// Reserved for later, not wired yet because its signal does not reach strategies yet:
/// `PrecisePrefix` (resident KV blocks, from engine KV events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scorer {
    Weight,
    Load,
    Prefix,
    Latency,
    Cost,
    Queue,
    KvCache,
    /// LoRA adapter residency ([`Candidate::lora`]).
    Lora,
}

impl Scorer {
    pub const ALL: [Scorer; 8] = [
        Scorer::Weight,
        Scorer::Load,
        Scorer::Prefix,
        Scorer::Latency,
        Scorer::Cost,
        Scorer::Queue,
        Scorer::KvCache,
        Scorer::Lora,
    ];

    /// Writes, for each candidate `kept` names, its value in [0, 1] to `out`.
    fn score(
        self,
        sig: &Signals,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        kept: &[usize],
        out: &mut Vec<f64>,
    ) {
        out.clear();
        let each = kept.iter().map(|&i| &candidates[i]);
        match self {
            Scorer::Weight => {
                let max = each.clone().map(|c| c.weight).fold(0.0, f64::max);
                out.extend(each.map(|c| {
                    if max > 0.0 {
                        (c.weight / max).clamp(0.0, 1.0)
                    } else {
                        1.0
                    }
                }));
            }
            Scorer::Load => inverse_share(each.map(|c| c.load), out),
            Scorer::Queue => inverse_share(each.map(|c| c.queue_depth), out),
            Scorer::Prefix => {
                let len = req.prompt.len();
                let mut keys = sig.keys.borrow_mut();
                if len > 0 {
                    keys.compute(req.prompt);
                }
                out.extend(each.map(|c| {
                    if len == 0 {
                        0.0
                    } else {
                        let m = sig.index.matched_keys(c.target, &keys, req.prompt);
                        m.min(len) as f64 / len as f64
                    }
                }));
            }
            Scorer::Latency => {
                out.extend(each.map(|c| sig.ttft_ms(c.target).unwrap_or(f64::NAN)));
                min_over_value(out, 1.0);
            }
            Scorer::Cost => {
                out.extend(each.map(|c| sig.cost(req, c.target).unwrap_or(f64::NAN)));
                min_over_value(out, 0.0);
            }
            Scorer::KvCache => out.extend(each.map(|c| {
                c.kv_usage
                    .map_or(0.5, |u| 1.0 - f64::from(u).clamp(0.0, 1.0))
            })),
            Scorer::Lora => {
                let adapter = each.clone().any(|c| c.lora.contains(Residency::ADAPTER));
                let ladder = LadderScores::DEFAULT;
                out.extend(each.map(|c| {
                    if adapter {
                        ladder.of(c.lora.level())
                    } else {
                        1.0
                    }
                }));
            }
        }
    }
}

/// `1 − v / max` per value; 1 for every value when all are 0.
fn inverse_share(values: impl Iterator<Item = u64> + Clone, out: &mut Vec<f64>) {
    let max = values.clone().max().unwrap_or(0);
    out.extend(values.map(|v| {
        if max == 0 {
            1.0
        } else {
            1.0 - v as f64 / max as f64
        }
    }));
}

/// Replaces each raw value (NaN = unknown) by `min / value` over the known ones; unknown
/// values become `unknown`, and a value of 0 scores 1.
fn min_over_value(values: &mut [f64], unknown: f64) {
    let min = values
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f64::INFINITY, f64::min);
    for v in values.iter_mut() {
        *v = if v.is_nan() {
            unknown
        } else if *v <= 0.0 {
            1.0
        } else {
            (min.max(0.0) / *v).clamp(0.0, 1.0)
        };
    }
}

/// The options of `pipeline`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    pub w_weight: f64,
    pub w_load: f64,
    pub w_prefix: f64,
    pub w_latency: f64,
    pub w_cost: f64,
    pub w_queue: f64,
    pub w_kv_cache: f64,
    pub w_lora: f64,
    /// Drop candidates whose engine queue is longer; unset, no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<u64>,
    /// Zero turns session affinity off.
    #[serde(with = "crate::values::duration")]
    pub session_ttl: Duration,
    pub max_sessions: usize,
    /// Prompt bytes the prefix index keeps per target (16 MiB by default).
    pub max_bytes_per_target: usize,
    /// Half-life of the TTFT average of the latency scorer.
    #[serde(with = "crate::values::duration")]
    pub half_life: Duration,
    /// Output tokens the cost estimate assumes when the request sets no `max_tokens`.
    pub default_output_tokens: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            w_weight: 0.0,
            w_load: 1.0,
            w_prefix: 1.0,
            w_latency: 0.0,
            w_cost: 0.0,
            w_queue: 0.0,
            w_kv_cache: 0.0,
            w_lora: 0.0,
            max_queue: None,
            session_ttl: Duration::from_secs(600),
            max_sessions: 100_000,
            max_bytes_per_target: 16 << 20,
            half_life: Duration::from_secs(10),
            default_output_tokens: 256,
        }
    }
}

impl Options {
    fn weight_mut(&mut self, scorer: Scorer) -> &mut f64 {
        match scorer {
            Scorer::Weight => &mut self.w_weight,
            Scorer::Load => &mut self.w_load,
            Scorer::Prefix => &mut self.w_prefix,
            Scorer::Latency => &mut self.w_latency,
            Scorer::Cost => &mut self.w_cost,
            Scorer::Queue => &mut self.w_queue,
            Scorer::KvCache => &mut self.w_kv_cache,
            Scorer::Lora => &mut self.w_lora,
        }
    }

    /// The weight of `scorer`.
    pub fn weight(&self, scorer: Scorer) -> f64 {
        let mut o = *self;
        *o.weight_mut(scorer)
    }

    /// Sets the weight of `scorer` (builder style, for tests and benches).
    pub fn with(mut self, scorer: Scorer, weight: f64) -> Self {
        *self.weight_mut(scorer) = weight.max(0.0);
        self
    }

    /// Every scorer's weight set to `weight`.
    pub fn with_all(mut self, weight: f64) -> Self {
        for s in Scorer::ALL {
            self = self.with(s, weight);
        }
        self
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "pipeline";
    const SUMMARY: &'static str = "Filter (max_queue), then the highest weighted sum of normalised scorers (weight, load, prefix, latency, cost, queue, kv_cache, lora); ties at random; sticky sessions";
    const TRAITS: &'static [Trait] = &[
        Trait::Weighted,
        Trait::LoadAware,
        Trait::Stateful,
        Trait::SingleWinner,
    ];
    const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "w_weight",
            "weight of the static-weight scorer (weight / largest weight)",
        ),
        ("w_load", "weight of the load scorer (1 - load / largest load)"),
        (
            "w_prefix",
            "weight of the prefix scorer (leading prompt bytes already sent to the target / prompt length)",
        ),
        (
            "w_latency",
            "weight of the latency scorer (smallest TTFT average / own; unmeasured scores 1)",
        ),
        (
            "w_cost",
            "weight of the cost scorer (cheapest estimate / own; unknown price scores 0)",
        ),
        (
            "w_queue",
            "weight of the engine-queue scorer (1 - queue_depth / largest queue_depth)",
        ),
        (
            "w_kv_cache",
            "weight of the KV-cache scorer (1 - KV-cache use; unknown scores 0.5). All weights 0: uniform random",
        ),
        (
            "w_lora",
            "weight of the LoRA scorer (lora_aware's residency score of the requested adapter: running 1, free slot 0.8, waiting 0.6, registered 0.4; 1 for a base model)",
        ),
        (
            "max_queue",
            "drop candidates whose engine queue is longer (unless that drops them all)",
        ),
        (
            "session_ttl",
            "an x-session-id request goes back to the target that last served it within this time; \"0s\" turns affinity off",
        ),
        (
            "max_sessions",
            "sessions remembered per core (least recently used forgotten first)",
        ),
        (
            "max_bytes_per_target",
            "prompt bytes the prefix index keeps per target (least recently used evicted)",
        ),
        (
            "half_life",
            "half-life of the TTFT average of the latency scorer",
        ),
        (
            "default_output_tokens",
            "output tokens the cost scorer assumes when the request sets no max_tokens",
        ),
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        for (key, w) in [
            ("w_weight", self.w_weight),
            ("w_load", self.w_load),
            ("w_prefix", self.w_prefix),
            ("w_latency", self.w_latency),
            ("w_cost", self.w_cost),
            ("w_queue", self.w_queue),
            ("w_kv_cache", self.w_kv_cache),
            ("w_lora", self.w_lora),
        ] {
            crate::values::non_negative(errors, key, w);
        }
        crate::values::positive(errors, "max_sessions", self.max_sessions as u64);
        crate::values::positive(
            errors,
            "max_bytes_per_target",
            self.max_bytes_per_target as u64,
        );
        crate::values::positive_duration(errors, "half_life", self.half_life);
        crate::values::positive(errors, "default_output_tokens", self.default_output_tokens);
        if errors.is_empty() && Scorer::ALL.iter().all(|&s| self.weight(s) == 0.0) {
            errors.push(OptionError::new(
                "w_load",
                "every scorer weight is 0, so pipeline would pick at random; give at least one \
                 of w_weight, w_load, w_prefix, w_latency, w_cost, w_queue, w_kv_cache, w_lora a value \
                 above 0 (or use strategy = \"random\")",
            ));
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(Pipeline::new(*self, ctx))
    }
}

/// What the scorers read besides the candidates and the request.
struct Signals {
    index: PrefixIndex,
    /// The request's chunk keys, computed once per pick and reused for every candidate
    /// (hashing a 32 KiB prompt once instead of once per target).
    keys: std::cell::RefCell<PromptKeys>,
    ewma: Vec<TtftEwma>,
    prices: PriceBook,
    default_output_tokens: f64,
}

impl Signals {
    fn ttft_ms(&self, target: TargetId) -> Option<f64> {
        self.ewma.get(target)?.value_if(1)
    }

    /// Estimated cost of the request on `target`, when its price for the model is known.
    fn cost(&self, req: &PickRequest<'_>, target: TargetId) -> Option<f64> {
        let output = req
            .max_tokens
            .map_or(self.default_output_tokens, |m| m as f64);
        self.prices
            .estimate(target, req.model, req.prompt_tokens, output)
    }
}

pub struct Pipeline {
    rng: fastrand::Rng,
    in_route: Vec<bool>,
    /// The scorers with a weight above 0, with that weight.
    active: Vec<(Scorer, f64)>,
    max_queue: Option<u64>,
    prefix_on: bool,
    latency_on: bool,
    lora_on: bool,
    half_life_secs: f64,
    sessions: SessionPins,
    sig: Signals,
    /// Indices of the candidates that passed the filter. Capacity `target_count`.
    kept: Vec<usize>,
    /// One scorer's values per kept candidate. Capacity `target_count`.
    values: Vec<f64>,
    /// Weighted sum per kept candidate. Capacity `target_count`.
    totals: Vec<f64>,
}

impl Pipeline {
    pub fn new(opts: Options, ctx: &BuildContext<'_>) -> Self {
        let active: Vec<(Scorer, f64)> = Scorer::ALL
            .iter()
            .map(|&s| (s, opts.weight(s)))
            .filter(|&(_, w)| w > 0.0 && w.is_finite())
            .collect();
        let on = |s: Scorer| active.iter().any(|&(a, _)| a == s);
        let (prefix_on, latency_on) = (on(Scorer::Prefix), on(Scorer::Latency));
        let n = ctx.target_count.max(ctx.route_targets.len());
        Pipeline {
            rng: fastrand::Rng::with_seed(ctx.seed),
            in_route: route_mask(ctx),
            max_queue: opts.max_queue,
            prefix_on,
            latency_on,
            lora_on: on(Scorer::Lora),
            half_life_secs: opts.half_life.as_secs_f64(),
            sessions: SessionPins::new(opts.max_sessions, opts.session_ttl),
            sig: Signals {
                // The index only ever holds anything when the prefix scorer is on.
                index: PrefixIndex::new(
                    if prefix_on { ctx.target_count } else { 0 },
                    opts.max_bytes_per_target,
                ),
                keys: Default::default(),
                ewma: vec![TtftEwma::default(); ctx.target_count],
                prices: ctx.prices.clone(),
                default_output_tokens: opts.default_output_tokens as f64,
            },
            active,
            kept: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
            totals: Vec::with_capacity(n),
        }
    }

    /// Sessions currently pinned.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Fills `kept` with the candidates that pass the filter; the fallback reason when the
    /// filter would have dropped them all.
    fn filter(&mut self, candidates: &[Candidate]) -> Option<&'static str> {
        self.kept.clear();
        if let Some(max) = self.max_queue {
            self.kept.extend(
                candidates
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.queue_depth <= max)
                    .map(|(i, _)| i),
            );
            if !self.kept.is_empty() {
                return None;
            }
            self.kept.extend(0..candidates.len());
            return Some("queue_limit");
        }
        self.kept.extend(0..candidates.len());
        None
    }
}

impl Strategy for Pipeline {
    fn name(&self) -> &'static str {
        "pipeline"
    }

    fn needs(&self) -> Needs {
        let mut n = Needs::NONE;
        if self.prefix_on {
            n = n.union(Needs::CANONICAL_PROMPT);
        }
        if self.lora_on {
            n = n.union(Needs::LORA_RESIDENCY);
        }
        n
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        if candidates.is_empty() {
            return None;
        }
        let fallback = self.filter(candidates);
        if self.sessions.enabled() && req.session.is_explicit() {
            if let Some(t) = self.sessions.get(req.session.hash(), now) {
                if let Some(&i) = self.kept.iter().find(|&&i| candidates[i].target == t) {
                    return Some(Pick {
                        index: i,
                        score: None,
                        fallback,
                    });
                }
            }
        }
        if self.kept.len() == 1 {
            return Some(Pick {
                index: self.kept[0],
                score: None,
                fallback,
            });
        }
        self.totals.clear();
        self.totals.resize(self.kept.len(), 0.0);
        for &(scorer, w) in &self.active {
            scorer.score(&self.sig, req, candidates, &self.kept, &mut self.values);
            for (t, v) in self.totals.iter_mut().zip(&self.values) {
                *t += w * v;
            }
        }
        let best = self
            .totals
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let limit = best - SCORE_EPSILON;
        let totals = &self.totals;
        let chosen = crate::choose_uniform(&mut self.rng, totals.len(), |j| totals[j] >= limit)?;
        Some(Pick {
            index: self.kept[chosen],
            score: Some(self.totals[chosen]),
            fallback,
        })
    }

    fn observe(&mut self, sample: &Sample) {
        if !self.latency_on {
            return;
        }
        if let Some(ms) = teaching_ttft_ms(sample, &self.in_route) {
            self.sig.ewma[sample.target].update(ms, sample.finished, self.half_life_secs);
        }
    }

    fn routed(
        &mut self,
        req: &PickRequest<'_>,
        target: TargetId,
        share: &mut ShareSink,
        now: Instant,
    ) {
        if self.sessions.enabled() && req.session.is_explicit() {
            let key = req.session.hash();
            self.sessions.pin(key, target, now);
            share.session_pin(key, target);
        }
        if self.prefix_on && !req.prompt.is_empty() {
            self.sig.index.insert(target, req.prompt, now);
            share.prefix(target, req.prompt);
        }
    }

    fn apply_shared(&mut self, item: &Shared<'_>, now: Instant) {
        match *item {
            Shared::Prefix { target, data } if self.prefix_on && !data.is_empty() => {
                self.sig.index.insert(target, data, now);
            }
            Shared::SessionPin { key, target } if self.sessions.enabled() => {
                self.sessions.pin(key, target, now);
            }
            _ => {}
        }
    }

    fn learned(&self, target: TargetId) -> Vec<(&'static str, f64)> {
        let mut v = Vec::new();
        if self.prefix_on {
            v.push(("prefix_bytes_held", self.sig.index.held(target) as f64));
        }
        if self.latency_on {
            if let Some(e) = self.sig.ewma.get(target) {
                v.extend(e.describe());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use crate::testing::{cands, context, req, sample};
    use crate::{AsyncInputs, SessionKey};
    use rolter_core::Price;

    fn pipeline(n: usize, opts: Options) -> Pipeline {
        Pipeline::new(opts, &context(&vec![1.0; n], &[]))
    }

    /// Only `scorer` on, with weight 1.
    fn only(scorer: Scorer) -> Options {
        Options::default().with_all(0.0).with(scorer, 1.0)
    }

    /// The values one scorer gives every candidate.
    fn values(p: &Pipeline, scorer: Scorer, r: &PickRequest<'_>, c: &[Candidate]) -> Vec<f64> {
        let kept: Vec<usize> = (0..c.len()).collect();
        let mut out = Vec::new();
        scorer.score(&p.sig, r, c, &kept, &mut out);
        out
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    fn with_prompt(prompt: &'static [u8]) -> PickRequest<'static> {
        PickRequest {
            prompt,
            session: SessionKey {
                header: None,
                prompt,
            },
            ..req()
        }
    }

    fn with_session(id: &'static [u8], prompt: &'static [u8]) -> PickRequest<'static> {
        PickRequest {
            prompt,
            session: SessionKey {
                header: Some(id),
                prompt,
            },
            ..req()
        }
    }

    fn counts(p: &mut Pipeline, r: &PickRequest<'_>, c: &[Candidate], n: usize) -> Vec<u32> {
        let now = Instant::now();
        let mut counts = vec![0u32; c.len()];
        for _ in 0..n {
            counts[p.pick(r, c, now).unwrap().index] += 1;
        }
        counts
    }

    #[test]
    fn weight_load_and_queue_scorers_normalise() {
        let p = pipeline(3, Options::default());
        let c = cands(&[(1.0, 0), (2.0, 5), (4.0, 10)]);
        let r = req();
        assert!(close(
            &values(&p, Scorer::Weight, &r, &c),
            &[0.25, 0.5, 1.0]
        ));
        assert!(close(&values(&p, Scorer::Load, &r, &c), &[1.0, 0.5, 0.0]));
        let idle = cands(&[(1.0, 0), (1.0, 0)]);
        assert!(close(&values(&p, Scorer::Load, &r, &idle), &[1.0, 1.0]));
        assert!(close(&values(&p, Scorer::Queue, &r, &idle), &[1.0, 1.0]));
        let mut q = c.clone();
        for (c, d) in q.iter_mut().zip([0, 3, 6]) {
            c.queue_depth = d;
        }
        assert!(close(&values(&p, Scorer::Queue, &r, &q), &[1.0, 0.5, 0.0]));
    }

    #[test]
    fn lora_scorer_is_the_residency_ladder() {
        let known = Residency::ADAPTER
            .union(Residency::SLOTS_KNOWN)
            .union(Residency::LISTED);
        let p = pipeline(5, Options::default().with(Scorer::Lora, 1.0));
        assert!(p.needs().contains(Needs::LORA_RESIDENCY));
        assert!(!pipeline(2, Options::default())
            .needs()
            .contains(Needs::LORA_RESIDENCY));
        let mut c = cands(&[(1.0, 0); 5]);
        c[0].lora = known.union(Residency::RUNNING).union(Residency::LOADED);
        c[1].lora = known.union(Residency::FREE_SLOT).union(Residency::LOADED);
        c[2].lora = known.union(Residency::WAITING);
        c[3].lora = known;
        c[4].lora = Residency::ADAPTER;
        assert!(close(
            &values(&p, Scorer::Lora, &req(), &c),
            &[1.0, 0.8, 0.6, 0.0, 0.0]
        ));
        // A base model (no candidate knows it as an adapter): neutral.
        for c in &mut c {
            c.lora = Residency::SLOTS_KNOWN;
        }
        assert!(close(&values(&p, Scorer::Lora, &req(), &c), &[1.0; 5]));
        // Combined with load: residency outweighs a small load difference.
        let mut p = pipeline(2, only(Scorer::Lora).with(Scorer::Load, 0.5));
        let mut c = cands(&[(1.0, 1), (1.0, 2)]);
        c[0].lora = known.union(Residency::WAITING);
        c[1].lora = known.union(Residency::RUNNING);
        assert_eq!(counts(&mut p, &req(), &c, 50), [0, 50]);
    }

    #[test]
    fn kv_cache_scorer_normalises_unknown_to_half() {
        let p = pipeline(3, Options::default());
        let mut c = cands(&[(1.0, 0); 3]);
        c[0].kv_usage = Some(0.25);
        c[2].kv_usage = Some(1.0);
        assert!(close(
            &values(&p, Scorer::KvCache, &req(), &c),
            &[0.75, 0.5, 0.0]
        ));
    }

    #[test]
    fn prefix_scorer_is_the_held_share_of_the_prompt() {
        let mut p = pipeline(3, Options::default());
        let now = Instant::now();
        // The index matches in 64-byte chunks: prompts of four chunks, two shared.
        let full: &'static [u8] = Box::leak([b'a'; 256].to_vec().into_boxed_slice());
        let mut half = [b'a'; 256];
        half[128..].fill(b'X');
        p.sig.index.insert(0, full, now);
        p.sig.index.insert(1, &half, now);
        let c = cands(&[(1.0, 0); 3]);
        assert!(close(
            &values(&p, Scorer::Prefix, &with_prompt(full), &c),
            &[1.0, 0.5, 0.0]
        ));
        assert!(close(
            &values(&p, Scorer::Prefix, &with_prompt(b""), &c),
            &[0.0, 0.0, 0.0]
        ));
    }

    #[test]
    fn latency_scorer_is_min_over_own_with_unmeasured_at_one() {
        let mut p = pipeline(3, only(Scorer::Latency));
        p.observe(&sample(0, 100, 0, 10));
        p.observe(&sample(1, 200, 0, 10));
        let c = cands(&[(1.0, 0); 3]);
        assert!(close(
            &values(&p, Scorer::Latency, &req(), &c),
            &[1.0, 0.5, 1.0]
        ));
        // Measured targets compete; the unmeasured one is tried as if fastest.
        assert_ne!(p.pick(&req(), &c, Instant::now()).unwrap().index, 1);
        let learned = p.learned(1);
        assert!(
            learned
                .iter()
                .any(|&(k, v)| k == "ttft_ewma_ms" && (v - 200.0).abs() < 1e-6),
            "{learned:?}"
        );
    }

    #[test]
    fn cost_scorer_is_cheapest_over_own_with_unknown_at_zero() {
        let price = |i: f64, o: f64| {
            Some(Price {
                input_per_mtok: i,
                output_per_mtok: o,
            })
        };
        let ctx = context(&[1.0; 3], &[price(1.0, 2.0), price(2.0, 4.0), None]);
        let p = Pipeline::new(only(Scorer::Cost), &ctx);
        let r = PickRequest {
            prompt_tokens: 1000,
            max_tokens: Some(500),
            ..req()
        };
        // 0.002, 0.004, unknown.
        let c = cands(&[(1.0, 0); 3]);
        assert!(close(&values(&p, Scorer::Cost, &r, &c), &[1.0, 0.5, 0.0]));
    }

    #[test]
    fn weights_combine() {
        let c = cands(&[(4.0, 10), (1.0, 0)]);
        // weight 1 / 0.25, load 0 / 1.
        let mut p = pipeline(2, only(Scorer::Load).with(Scorer::Weight, 2.0));
        let pick = p.pick(&req(), &c, Instant::now()).unwrap();
        assert_eq!((pick.index, pick.score), (0, Some(2.0)));
        let mut p = pipeline(2, only(Scorer::Load).with(Scorer::Weight, 1.0));
        let pick = p.pick(&req(), &c, Instant::now()).unwrap();
        assert_eq!((pick.index, pick.score), (1, Some(1.25)));
    }

    #[test]
    fn ties_are_broken_uniformly() {
        let c = cands(&[(1.0, 2), (1.0, 2), (1.0, 7), (1.0, 2)]);
        let mut p = pipeline(4, Options::default());
        let n = counts(&mut p, &req(), &c, 30_000);
        assert_eq!(n[2], 0);
        for i in [0, 1, 3] {
            assert!((9_300..=10_700).contains(&n[i]), "{n:?}");
        }
        // Every weight at 0: everything ties.
        let mut p = pipeline(4, Options::default().with_all(0.0));
        let n = counts(&mut p, &req(), &c, 40_000);
        for &k in &n {
            assert!((9_300..=10_700).contains(&k), "{n:?}");
        }
    }

    #[test]
    fn zero_one_and_many_candidates() {
        let mut p = pipeline(5, Options::default());
        let now = Instant::now();
        assert_eq!(p.pick(&req(), &[], now), None);
        let one = cands(&[(1.0, 99)]);
        assert_eq!(p.pick(&req(), &one, now).unwrap().index, 0);
        let many = cands(&[(1.0, 4), (1.0, 3), (1.0, 1), (1.0, 8), (1.0, 6)]);
        for _ in 0..50 {
            assert_eq!(p.pick(&req(), &many, now).unwrap().index, 2);
        }
        // A candidate removed mid-stream: the next best of the rest.
        assert_eq!(p.pick(&req(), &[many[0], many[1]], now).unwrap().index, 1);
    }

    #[test]
    fn max_queue_drops_long_queues_unless_all_are_long() {
        let opts = Options {
            max_queue: Some(4),
            ..Options::default()
        };
        let mut p = pipeline(3, opts);
        let now = Instant::now();
        let mut c = cands(&[(1.0, 0), (1.0, 6), (1.0, 0)]);
        for (c, d) in c.iter_mut().zip([5, 1, 9]) {
            c.queue_depth = d;
        }
        for _ in 0..50 {
            assert_eq!(p.pick(&req(), &c, now), Some(Pick::at(1)));
        }
        for c in c.iter_mut() {
            c.queue_depth = 10;
        }
        let pick = p.pick(&req(), &c, now).unwrap();
        assert_ne!(pick.index, 1, "load decides among all");
        assert_eq!(pick.fallback, Some("queue_limit"));
    }

    #[test]
    fn session_sticks_within_ttl_only_while_a_candidate() {
        let opts = Options {
            session_ttl: Duration::from_secs(60),
            ..Options::default()
        };
        let mut p = pipeline(3, opts);
        let mut sink = ShareSink::default();
        let t0 = Instant::now();
        let r = with_session(b"user-7", b"");
        // Target 2 is the busiest; the session was served there.
        let c = cands(&[(1.0, 1), (1.0, 0), (1.0, 5)]);
        p.routed(&r, 2, &mut sink, t0);
        let within = t0 + Duration::from_secs(59);
        assert_eq!(p.pick(&r, &c, within).unwrap().index, 2);
        // Other sessions and implicit sessions score normally.
        assert_eq!(
            p.pick(&with_session(b"user-8", b""), &c, within)
                .unwrap()
                .index,
            1
        );
        assert_eq!(p.pick(&req(), &c, within).unwrap().index, 1);
        // Not a candidate any more.
        assert_eq!(p.pick(&r, &c[..2], within).unwrap().index, 1);
        // After the TTL.
        let after = t0 + Duration::from_secs(61);
        assert_eq!(p.pick(&r, &c, after).unwrap().index, 1);
    }

    #[test]
    fn session_map_is_bounded_oldest_first() {
        let opts = Options {
            max_sessions: 2,
            ..Options::default()
        };
        let mut p = pipeline(3, opts);
        let mut sink = ShareSink::default();
        let t0 = Instant::now();
        let c = cands(&[(1.0, 0), (1.0, 0), (1.0, 9)]);
        for (i, id) in [b"a", b"b", b"a", b"c"].into_iter().enumerate() {
            let t = t0 + Duration::from_secs(i as u64);
            p.routed(&with_session(id, b""), 2, &mut sink, t);
        }
        assert_eq!(p.sessions(), 2);
        let now = t0 + Duration::from_secs(5);
        // "b" was least recently used and is gone; "a" and "c" stay pinned.
        assert_ne!(p.pick(&with_session(b"b", b""), &c, now).unwrap().index, 2);
        assert_eq!(p.pick(&with_session(b"a", b""), &c, now).unwrap().index, 2);
        assert_eq!(p.pick(&with_session(b"c", b""), &c, now).unwrap().index, 2);
        // Refreshing one session many times keeps memory bounded.
        for i in 0..10_000u64 {
            p.routed(
                &with_session(b"a", b""),
                2,
                &mut sink,
                now + Duration::from_millis(i),
            );
        }
        assert!(p.sessions.storage() <= 2, "slots stay within max_sessions");
    }

    #[test]
    fn prefix_sends_shared_prefix_requests_to_the_warm_target() {
        let mut p = pipeline(3, Options::default());
        let mut sink = ShareSink::default();
        let now = Instant::now();
        let conversation = |question: &str| -> &'static [u8] {
            let system =
                "You answer billing questions for the finance team, in two sentences. ".repeat(6);
            let text = format!(
                "[{{\"role\":\"system\",\"content\":\"{system}\"}},{{\"role\":\"user\",\"content\":\"{question}\"}}]"
            );
            Box::leak(text.into_bytes().into_boxed_slice())
        };
        let system = conversation("first question");
        p.routed(&with_prompt(system), 2, &mut sink, now);
        assert!(p.learned(2)[0].1 > 0.0);
        assert_eq!(p.learned(0), vec![("prefix_bytes_held", 0.0)]);
        let follow = conversation("second one");
        // Target 2 is a little busier; its warm prefix outweighs that.
        let c = cands(&[(1.0, 1), (1.0, 1), (1.0, 2)]);
        for _ in 0..20 {
            assert_eq!(p.pick(&with_prompt(follow), &c, now).unwrap().index, 2);
        }
        // A prompt with nothing in common goes by load.
        let other = with_prompt(b"{\"prompt\":\"unrelated\"}");
        assert_ne!(p.pick(&other, &c, now).unwrap().index, 2);
        assert_eq!(p.needs(), Needs::CANONICAL_PROMPT);
        assert_eq!(pipeline(2, only(Scorer::Load)).needs(), Needs::NONE);
    }

    #[test]
    fn two_instances_converge_through_shared_items() {
        let mut a = pipeline(3, Options::default());
        let mut b = pipeline(3, Options::default());
        let mut sink = ShareSink::default();
        let now = Instant::now();
        let prompt: &'static [u8] = b"[{\"role\":\"user\",\"content\":\"a long shared context\"}]";
        a.routed(&with_session(b"s1", prompt), 1, &mut sink, now);
        let batch = sink.take_batch();
        assert_eq!(batch.len(), 2);
        assert!(sink.is_empty());
        for (_, item) in batch.iter() {
            b.apply_shared(&item, now);
        }
        let c = cands(&[(1.0, 0), (1.0, 3), (1.0, 0)]);
        let later = now + Duration::from_secs(1);
        // The session pin reached b.
        assert_eq!(
            b.pick(&with_session(b"s1", b"x"), &c, later).unwrap().index,
            1
        );
        // So did the prefix: b sends the same prompt where a warmed it.
        assert_eq!(b.learned(1), a.learned(1));
        let idle = cands(&[(1.0, 1), (1.0, 1), (1.0, 1)]);
        assert_eq!(b.pick(&with_prompt(prompt), &idle, later).unwrap().index, 1);
        assert_eq!(a.pick(&with_prompt(prompt), &idle, later).unwrap().index, 1);
    }

    #[test]
    fn scratch_does_not_grow_on_picks() {
        let mut p = pipeline(16, Options::default().with(Scorer::KvCache, 1.0));
        let c = cands(&[(1.0, 3); 16]);
        let caps = (p.kept.capacity(), p.values.capacity(), p.totals.capacity());
        let now = Instant::now();
        for _ in 0..100 {
            p.pick(&with_prompt(b"abc"), &c, now);
        }
        assert_eq!(
            caps,
            (p.kept.capacity(), p.values.capacity(), p.totals.capacity())
        );
    }

    #[test]
    fn registry_validates_and_builds_pipeline() {
        let ok: toml::Table = toml::from_str(
            "w_load = 1\nw_prefix = 0.5\nw_weight = 0\nw_latency = 2\nw_cost = 0.1\n\
             w_queue = 1\nw_kv_cache = 1\nmax_queue = 8\nsession_ttl = \"0s\"\n\
             max_sessions = 10\nmax_bytes_per_target = 1024\nhalf_life = \"5s\"\n\
             default_output_tokens = 128",
        )
        .unwrap();
        assert_eq!(testing::validate_spec("pipeline", &ok), Ok("pipeline"));
        let opts = crate::options::parse::<Options>(&ok).unwrap();
        assert_eq!(opts.max_queue, Some(8));
        assert!(opts.session_ttl.is_zero());
        assert_eq!(opts.weight(Scorer::Latency), 2.0);
        for bad in [
            "w_load = -1",
            "max_queue = -1",
            "session_ttl = \"soon\"",
            "max_sessions = 0",
            "w_lora = -1",
        ] {
            let t: toml::Table = toml::from_str(bad).unwrap();
            assert!(testing::validate_spec("pipeline", &t).is_err(), "{bad}");
        }
        let zero: toml::Table = toml::from_str("w_load = 0\nw_prefix = 0").unwrap();
        let errs = testing::validate_spec("pipeline", &zero).unwrap_err();
        assert!(errs[0].1.contains("every scorer weight is 0"), "{errs:?}");
        let one: toml::Table = toml::from_str("w_load = 0\nw_prefix = 0\nw_queue = 0.5").unwrap();
        assert_eq!(testing::validate_spec("pipeline", &one), Ok("pipeline"));
        let ctx = context(&[1.0, 1.0], &[]);
        let spec = testing::raw("pipeline", toml::Table::new());
        let mut s = testing::build(&spec, &ctx);
        assert_eq!(s.name(), "pipeline");
        let inputs = AsyncInputs::default();
        let r = PickRequest {
            inputs: &inputs,
            ..req()
        };
        let c = cands(&[(1.0, 3), (1.0, 0)]);
        assert_eq!(s.pick(&r, &c, Instant::now()).unwrap().index, 1);
    }
}
