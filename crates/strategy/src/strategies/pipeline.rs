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
//! (KV-event block index) is reserved there but not wired yet.
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

use crate::context::BuildContext;
use crate::options::{help_lines, StrategyOptions};
use crate::shared::ewma::{route_mask, teaching_ttft_ms, TtftEwma};
use crate::shared::prefix_index::{PrefixIndex, PromptKeys};
use crate::shared::sessions::{PinsAndSharing, SessionPins};
use crate::strategies::lora_aware::LadderScores;
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{
    Basis, Candidate, Needs, Pick, PickRequest, Sample, ShareSink, Shared, TargetId,
};

/// Scores closer than this tie (they differ only by rounding).
const SCORE_EPSILON: f64 = 1e-12;

/// One scoring signal. Each turns the candidates into values in [0, 1], higher is better.
///
/// Reserved for later, not wired yet: `PrecisePrefix` (resident KV blocks, from engine KV
/// events).
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
    /// Drop candidates whose engine queue is longer; unset, no limit. (Unset, TOML leaves
    /// it out; no `skip_serializing_if` beside flattened parts, see
    /// [`crate::options::field_names`].)
    pub max_queue: Option<u64>,
    /// Zero turns session affinity off.
    #[serde(with = "crate::values::duration")]
    pub session_ttl: Duration,
    /// `max_sessions`, `share_sessions`, `share_prefixes`.
    #[serde(flatten)]
    pub pins: PinsAndSharing,
    /// The load scorer counts the other gateway replicas' requests in flight too.
    pub fleet_load: bool,
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
            pins: PinsAndSharing::default(),
            fleet_load: false,
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
    const HELP: &'static [(&'static str, &'static str)] = &help_lines::<17>(&[
        &[
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
        ],
        &PinsAndSharing::HELP,
        &[
            super::least_loaded::FLEET_LOAD_HELP,
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
        ],
    ]);

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
        self.pins.check(errors);
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

    fn requirements(&self) -> crate::requirements::Requirements {
        crate::requirements::Requirements {
            store: match (
                self.pins.store_use(Self::NAME),
                crate::requirements::StoreUse::fleet_load(Self::NAME, self.fleet_load),
            ) {
                (Some(a), Some(b)) => Some(a.and(b)),
                (a, b) => a.or(b),
            },
            ..crate::requirements::Requirements::default()
        }
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
    /// The weighted sums with this replica's own load only (for the basis of a pick on
    /// the fleet's load). Capacity `target_count`.
    own_totals: Vec<f64>,
    /// What decided the last pick.
    basis: Basis,
    /// The route shares with the other replicas (pins, prefixes or load): only then is a
    /// pick's basis worked out.
    shares: bool,
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
            sessions: SessionPins::new(opts.pins.max_sessions, opts.session_ttl),
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
            own_totals: Vec::with_capacity(n),
            basis: Basis::Local,
            shares: opts.pins.share_sessions || opts.pins.share_prefixes || opts.fleet_load,
        }
    }

    /// What decided the pick of `kept[chosen]`, other than a session pin: a prefix known
    /// only from another replica, or the other replicas' load (with this replica's own
    /// load alone, another candidate would have scored higher); else this replica's own.
    fn basis_of(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        chosen: usize,
    ) -> Basis {
        let target = candidates[self.kept[chosen]].target;
        if self.prefix_on && !req.prompt.is_empty() {
            // The prefix scorer left the prompt's keys in `sig.keys`.
            let keys = self.sig.keys.borrow();
            let (m, fleet) = self
                .sig
                .index
                .matched_keys_with_origin(target, &keys, req.prompt);
            if m > 0 && fleet {
                return Basis::SharedPrefix;
            }
        }
        let Some(w) = self
            .active
            .iter()
            .find(|&&(s, _)| s == Scorer::Load)
            .map(|&(_, w)| w)
        else {
            return Basis::Local;
        };
        if !self.kept.iter().any(|&i| candidates[i].fleet_load > 0) {
            return Basis::Local;
        }
        let each = || self.kept.iter().map(|&i| &candidates[i]);
        self.own_totals.clear();
        self.own_totals.extend_from_slice(&self.totals);
        self.values.clear();
        inverse_share(each().map(|c| c.load), &mut self.values);
        for (t, v) in self.own_totals.iter_mut().zip(&self.values) {
            *t -= w * v;
        }
        self.values.clear();
        inverse_share(
            each().map(|c| c.load.saturating_sub(c.fleet_load)),
            &mut self.values,
        );
        for (t, v) in self.own_totals.iter_mut().zip(&self.values) {
            *t += w * v;
        }
        let best = self
            .own_totals
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        if self.own_totals[chosen] < best - SCORE_EPSILON {
            Basis::SharedLoad
        } else {
            Basis::Local
        }
    }

    /// Applies a prefix or pin another core (or, `fleet`, another replica) shared.
    fn learn(&mut self, item: &Shared<'_>, now: Instant, fleet: bool) {
        match *item {
            Shared::Prefix { target, data } if self.prefix_on && !data.is_empty() => {
                self.sig.index.insert_as(target, data, now, fleet);
            }
            Shared::SessionPin { key, target } if self.sessions.enabled() => {
                self.sessions.pin_as(key, target, now, fleet);
            }
            _ => {}
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
        self.basis = Basis::Local;
        let fallback = self.filter(candidates);
        if self.sessions.enabled() && req.session.is_explicit() {
            if let Some((t, fleet)) = self.sessions.get_with_origin(req.session.hash(), now) {
                if let Some(&i) = self.kept.iter().find(|&&i| candidates[i].target == t) {
                    if fleet {
                        self.basis = Basis::SharedPin;
                    }
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
        let chosen = crate::shared::choose::choose_uniform(&mut self.rng, totals.len(), |j| {
            totals[j] >= limit
        })?;
        if self.shares {
            self.basis = self.basis_of(req, candidates, chosen);
        }
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
        self.learn(item, now, false);
    }

    fn apply_fleet_shared(&mut self, item: &Shared<'_>, now: Instant) {
        self.learn(item, now, true);
    }

    fn basis(&self) -> Basis {
        self.basis
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
mod tests;
