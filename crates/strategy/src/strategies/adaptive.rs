//! `adaptive`: a blend of latency, cost and load. Each candidate scores
//! `w_latency × norm(TTFT EWMA) + w_cost × norm(estimated cost) + w_load × norm(load)`;
//! the lowest score wins, load breaks ties, then a seeded random choice.
//!
//! `norm` is the value's share of the largest across the candidates (`v / max`; 0 when all
//! are 0), so terms count in proportion: loads 5 and 4 differ by 0.2, not by the whole
//! range, and one request of load cannot outweigh a threefold latency gap (min–max scaling
//! let it). A target without a latency sample scores latency 0 (optimistic, so it is not
//! avoided before it is measured); a target without a known price
//! for the requested model scores cost 1 (the worst). When the global kill switch
//! ([`crate::Switches::adaptive`], read on every pick) is off, the route's
//! `fallback_strategy` picks and the pick is marked `kill_switch`; blending resumes at the
//! next pick after it is turned back on.
//!
//! Owns one EWMA per target id, a clone of the price book and of the switches handle, the
//! fallback strategy (which sees every sample too) and a scratch score list reused across
//! picks. It must not block, lock, log, do I/O or allocate per pick; time comes only from
//! `Sample::finished`.

use std::sync::Arc;
use std::time::Instant;

use rolter_core::PriceBook;
use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::InnerStrategy;
use crate::options::StrategyOptions;
use crate::requirements::PriceUse;
use crate::requirements::Requirements;
use crate::shared::choose::choose_least_loaded_among;
use crate::shared::ewma::{TtftAverages, TtftOptions};
use crate::shared::wrap::{Wrapped, Wrapper};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Pick, PickRequest, Sample, Switches};

/// Scores closer than this tie (they differ only by rounding).
const SCORE_EPSILON: f64 = 1e-12;

/// The options of `adaptive`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    pub w_latency: f64,
    pub w_cost: f64,
    pub w_load: f64,
    /// `half_life`.
    #[serde(flatten)]
    pub ttft: TtftOptions,
    /// Output tokens assumed when the request sets no `max_tokens`.
    pub default_output_tokens: u64,
    /// The strategy that picks while the kill switch is off.
    pub fallback_strategy: InnerStrategy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            w_latency: 1.0,
            w_cost: 1.0,
            w_load: 1.0,
            ttft: TtftOptions::default(),
            default_output_tokens: 256,
            fallback_strategy: InnerStrategy::of(super::least_loaded::Options::default()),
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "adaptive";
    const SUMMARY: &'static str =
        "Lowest weighted blend of normalised latency, estimated cost and load; global kill switch";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "w_latency",
            "weight of the normalised TTFT average (unmeasured targets score 0)",
        ),
        (
            "w_cost",
            "weight of the normalised estimated request cost (unknown price scores 1, the worst)",
        ),
        ("w_load", "weight of the normalised load"),
        TtftOptions::HELP,
        (
            "default_output_tokens",
            "output tokens assumed for the cost estimate when the request sets no max_tokens",
        ),
        (
            "fallback_strategy",
            "the strategy used while the adaptive kill switch is off (any name or alias but adaptive, or a table with name and its options)",
        ),
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::non_negative(errors, "w_latency", self.w_latency);
        crate::values::non_negative(errors, "w_cost", self.w_cost);
        crate::values::non_negative(errors, "w_load", self.w_load);
        self.ttft.check(errors);
        self.fallback_strategy
            .check_not(Self::NAME, "fallback_strategy", errors);
        if errors.is_empty() && self.w_latency == 0.0 && self.w_cost == 0.0 && self.w_load == 0.0 {
            errors.push(OptionError::new(
                "w_latency",
                "every weight is 0, so adaptive would score all targets alike; give at least \
                 one of w_latency, w_cost, w_load a value above 0",
            ));
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(Adaptive::new(
            self,
            self.fallback_strategy.spec().build(ctx),
            ctx,
        ))
    }

    fn requirements(&self) -> Requirements {
        let own = Requirements {
            prices: (self.w_cost > 0.0).then(|| PriceUse {
                by: format!(
                    "`adaptive` with w_cost = {}{}",
                    self.w_cost,
                    if self.w_cost == Options::default().w_cost {
                        " (the default)"
                    } else {
                        ""
                    }
                ),
                instead: Some("set w_cost = 0".to_string()),
            }),
            ..Requirements::default()
        };
        own.and(
            self.fallback_strategy
                .requirements(Self::NAME, "fallback_strategy"),
        )
    }

    fn nested(&mut self) -> Vec<(&'static str, &mut InnerStrategy)> {
        vec![("fallback_strategy", &mut self.fallback_strategy)]
    }
}

/// Running minimum and maximum of one signal across the candidates.
#[derive(Clone, Copy)]
struct Range {
    min: f64,
    max: f64,
}

impl Range {
    const EMPTY: Range = Range {
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
    };

    #[inline]
    fn add(&mut self, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// The value's share of the largest, in [0, 1] for the non-negative signals scored
    /// here; 0 when the largest is 0.
    #[inline]
    fn norm(&self, v: f64) -> f64 {
        if self.max > 0.0 {
            v / self.max
        } else {
            0.0
        }
    }
}

pub struct Adaptive {
    rng: fastrand::Rng,
    ttft: TtftAverages,
    w_latency: f64,
    w_cost: f64,
    w_load: f64,
    default_output_tokens: f64,
    prices: PriceBook,
    switches: Arc<Switches>,
    /// Per candidate: estimated cost (NaN when unknown), then the score. Capacity
    /// `target_count`, so it never grows on a pick.
    scratch: Vec<f64>,
}

impl Adaptive {
    /// The blend over `fallback`, which picks while the kill switch is off and sees every
    /// hook throughout.
    pub fn new(
        opts: &Options,
        fallback: Box<dyn Strategy>,
        ctx: &BuildContext<'_>,
    ) -> Wrapped<Adaptive> {
        let own = Adaptive {
            rng: fastrand::Rng::with_seed(ctx.seed),
            ttft: TtftAverages::new(opts.ttft, ctx),
            w_latency: opts.w_latency,
            w_cost: opts.w_cost,
            w_load: opts.w_load,
            default_output_tokens: opts.default_output_tokens as f64,
            prices: ctx.prices.clone(),
            switches: Arc::clone(ctx.switches),
            scratch: Vec::with_capacity(ctx.target_count),
        };
        Wrapped::new(own, fallback)
    }

    /// The target's TTFT average in ms once it has a sample.
    pub fn ttft_ewma_ms(&self, target: usize) -> Option<f64> {
        self.ttft.get(target)?.value_if(1)
    }

    /// Estimated cost of the request on `target`, when its price for the model is known.
    fn cost(&self, req: &PickRequest<'_>, target: usize, output_tokens: f64) -> Option<f64> {
        self.prices
            .estimate(target, req.model, req.prompt_tokens, output_tokens)
    }

    fn blend(&mut self, req: &PickRequest<'_>, candidates: &[Candidate]) -> Option<Pick> {
        let output_tokens = req
            .max_tokens
            .map_or(self.default_output_tokens, |m| m as f64);
        let (mut latency, mut cost, mut load) = (Range::EMPTY, Range::EMPTY, Range::EMPTY);
        self.scratch.clear();
        for c in candidates {
            let estimate = if self.w_cost > 0.0 {
                self.cost(req, c.target, output_tokens)
            } else {
                None
            };
            if let Some(v) = estimate {
                cost.add(v);
            }
            self.scratch.push(estimate.unwrap_or(f64::NAN));
            if let Some(v) = self.ttft_ewma_ms(c.target) {
                latency.add(v);
            }
            load.add(c.load as f64);
        }
        let mut best = f64::INFINITY;
        for (i, c) in candidates.iter().enumerate() {
            let latency_term = self.ttft_ewma_ms(c.target).map_or(0.0, |v| latency.norm(v));
            let estimate = self.scratch[i];
            let cost_term = if estimate.is_nan() {
                1.0
            } else {
                cost.norm(estimate)
            };
            let score = self.w_latency * latency_term
                + self.w_cost * cost_term
                + self.w_load * load.norm(c.load as f64);
            self.scratch[i] = score;
            best = best.min(score);
        }
        let limit = best + SCORE_EPSILON;
        let scores = &self.scratch;
        let index = choose_least_loaded_among(&mut self.rng, candidates, |i| scores[i] <= limit)?;
        Some(Pick {
            index,
            score: Some(scores[index]),
            fallback: None,
        })
    }
}

impl Wrapper for Adaptive {
    fn pick(
        &mut self,
        fallback: &mut dyn Strategy,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        if self.switches.adaptive() {
            return self.blend(req, candidates);
        }
        let p = fallback.pick(req, candidates, now)?;
        Some(Pick {
            fallback: Some("kill_switch"),
            ..p
        })
    }

    fn learned(&self, target: usize) -> Vec<(&'static str, f64)> {
        self.ttft.learned(target)
    }

    fn observe(&mut self, sample: &Sample) {
        self.ttft.observe(sample);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::strategies::least_loaded::LeastLoaded;
    use crate::testing;
    use crate::testing::{cands, context, price, req, sample};

    fn weights(w_latency: f64, w_cost: f64, w_load: f64) -> Options {
        Options {
            w_latency,
            w_cost,
            w_load,
            ..Options::default()
        }
    }

    fn adaptive(ctx: &BuildContext<'_>, opts: Options) -> Wrapped<Adaptive> {
        Adaptive::new(&opts, Box::new(LeastLoaded::new(ctx.seed)), ctx)
    }

    fn at(target: usize, ttft_ms: u64, t0: Instant, secs: f64) -> Sample {
        let mut s = sample(target, ttft_ms, 0, 100);
        s.finished = t0 + Duration::from_secs_f64(secs);
        s
    }

    fn request(prompt_tokens: u32, max_tokens: Option<u64>) -> PickRequest<'static> {
        PickRequest {
            prompt_tokens,
            max_tokens,
            ..req()
        }
    }

    /// Three targets: 0 fast, expensive, busy; 1 slow, cheap, mid; 2 middling, idle.
    fn three() -> (BuildContext<'static>, Vec<Candidate>, Instant) {
        let ctx = context(
            &[1.0, 1.0, 1.0],
            &[price(10.0, 30.0), price(0.1, 0.3), price(3.0, 9.0)],
        );
        let c = cands(&[(1.0, 8), (1.0, 4), (1.0, 0)]);
        (ctx, c, Instant::now())
    }

    fn train(s: &mut Adaptive, t0: Instant) {
        s.observe(&at(0, 50, t0, 0.0));
        s.observe(&at(1, 900, t0, 0.0));
        s.observe(&at(2, 300, t0, 0.0));
    }

    #[test]
    fn each_weight_alone_reproduces_its_single_signal_choice() {
        let (ctx, c, t0) = three();
        let r = request(1000, Some(200));
        // Latency 50/900/300 ms, cost 16000/160/4800 (µ$), load 8/4/0: each alone picks
        // its smallest, scored as its share of the largest.
        for (opts, expected, score) in [
            (weights(1.0, 0.0, 0.0), 0, 50.0 / 900.0),
            (weights(0.0, 1.0, 0.0), 1, 160.0 / 16000.0),
            (weights(0.0, 0.0, 1.0), 2, 0.0),
        ] {
            let mut s = adaptive(&ctx, opts.clone());
            train(&mut s, t0);
            for _ in 0..50 {
                let p = s.pick(&r, &c, t0).unwrap();
                assert_eq!((p.index, p.fallback), (expected, None), "{opts:?}");
                assert!((p.score.unwrap() - score).abs() < 1e-9, "{opts:?}: {p:?}");
            }
        }
    }

    #[test]
    fn blends_normalised_terms() {
        let (ctx, c, t0) = three();
        // Latency norms: 50/900, 1, 300/900; load norms: 1, 0.5, 0.
        let mut s = adaptive(&ctx, weights(1.0, 0.0, 1.0));
        train(&mut s, t0);
        let p = s.pick(&request(10, None), &c, t0).unwrap();
        assert_eq!(p.index, 2);
        assert!((p.score.unwrap() - 300.0 / 900.0).abs() < 1e-12);
        // A heavier latency weight tips the balance to the fast, busy target.
        let mut s = adaptive(&ctx, weights(4.0, 0.0, 1.0));
        train(&mut s, t0);
        assert_eq!(s.pick(&request(10, None), &c, t0).unwrap().index, 0);
        // Defaults (1, 1, 1): scores 0.06+1+1, 1+0.01+0.5, 0.33+0.3+0 → target 2.
        let mut s = adaptive(&ctx, Options::default());
        train(&mut s, t0);
        assert_eq!(s.pick(&request(1000, Some(200)), &c, t0).unwrap().index, 2);
    }

    #[test]
    fn output_estimate_uses_max_tokens_else_the_default() {
        // 0: cheap input, dear output; 1: dear input, cheap output.
        let ctx = context(&[1.0, 1.0], &[price(1.0, 20.0), price(10.0, 1.0)]);
        let c = cands(&[(1.0, 0), (1.0, 0)]);
        let now = Instant::now();
        let mut s = adaptive(&ctx, weights(0.0, 1.0, 0.0));
        // 1000 in, 10 out: 0 costs 1000+200, 1 costs 10000+10.
        assert_eq!(s.pick(&request(1000, Some(10)), &c, now).unwrap().index, 0);
        // No max_tokens: 256 out: 0 costs 1000+5120, 1 costs 10000+256.
        assert_eq!(s.pick(&request(1000, None), &c, now).unwrap().index, 0);
        let mut s = adaptive(
            &ctx,
            Options {
                default_output_tokens: 2000,
                ..weights(0.0, 1.0, 0.0)
            },
        );
        // 2000 out: 0 costs 1000+40000, 1 costs 10000+2000.
        assert_eq!(s.pick(&request(1000, None), &c, now).unwrap().index, 1);
    }

    #[test]
    fn unknown_price_is_the_worst_cost_and_unmeasured_latency_the_best() {
        let ctx = context(&[1.0, 1.0, 1.0], &[price(5.0, 5.0), None, price(1.0, 1.0)]);
        let c = cands(&[(1.0, 0), (1.0, 0), (1.0, 0)]);
        let t0 = Instant::now();
        let mut s = adaptive(&ctx, weights(0.0, 1.0, 0.0));
        for _ in 0..20 {
            assert_eq!(s.pick(&request(100, None), &c, t0).unwrap().index, 2);
        }
        // Only the unpriced target left: it is picked (nothing better to compare with).
        assert_eq!(s.pick(&request(100, None), &c[1..2], t0).unwrap().index, 0);

        let mut s = adaptive(&ctx, weights(1.0, 0.0, 0.0));
        s.observe(&at(0, 100, t0, 0.0));
        s.observe(&at(2, 300, t0, 0.0));
        // Target 1 has no sample: latency term 0, tied with the fastest measured; load decides.
        let c = cands(&[(1.0, 3), (1.0, 1), (1.0, 0)]);
        assert_eq!(s.pick(&req(), &c, t0).unwrap().index, 1);
    }

    #[test]
    fn kill_switch_applies_at_once_and_blending_resumes() {
        let (ctx, c, t0) = three();
        let mut s = adaptive(&ctx, weights(1.0, 0.0, 0.0));
        train(&mut s, t0);
        assert_eq!(s.pick(&req(), &c, t0).unwrap().index, 0);
        ctx.switches.set_adaptive(false);
        for _ in 0..10 {
            let p = s.pick(&req(), &c, t0).unwrap();
            assert_eq!(
                (p.index, p.fallback),
                (2, Some("kill_switch")),
                "least loaded"
            );
        }
        // Samples still teach while off.
        for k in 1..=5 {
            s.observe(&at(0, 5_000, t0, 60.0 * k as f64));
        }
        ctx.switches.set_adaptive(true);
        let p = s.pick(&req(), &c, t0).unwrap();
        assert_eq!(
            (p.index, p.fallback),
            (2, None),
            "target 0 is now the slowest"
        );
    }

    #[test]
    fn samples_reach_the_fallback_strategy() {
        let ctx = context(&[1.0, 1.0], &[]);
        let mut options = toml::Table::new();
        options.insert("fallback_strategy".into(), "fastest".into());
        let mut s = testing::build(&crate::testing::raw("adaptive", options), &ctx);
        ctx.switches.set_adaptive(false);
        let t0 = Instant::now();
        let c = cands(&[(1.0, 0), (1.0, 5)]);
        assert_eq!(
            s.pick(&req(), &c, t0).unwrap().index,
            0,
            "fastest: cold, least loaded"
        );
        for k in 0..3 {
            s.observe(&at(0, 400, t0, k as f64));
            s.observe(&at(1, 40, t0, k as f64));
        }
        let p = s.pick(&req(), &c, t0).unwrap();
        assert_eq!((p.index, p.fallback), (1, Some("kill_switch")));
    }

    #[test]
    fn failing_samples_and_other_routes_never_teach() {
        let route: &'static [usize] = &[0, 1];
        let ctx = BuildContext {
            route_targets: route,
            ..context(&[1.0, 1.0, 1.0], &[])
        };
        let mut s = adaptive(&ctx, Options::default());
        let t0 = Instant::now();
        let mut failed = at(0, 10, t0, 0.0);
        failed.success = false;
        s.observe(&failed);
        let mut no_ttft = at(0, 10, t0, 0.0);
        no_ttft.ttft = None;
        s.observe(&no_ttft);
        s.observe(&at(2, 10, t0, 0.0));
        s.observe(&at(42, 10, t0, 0.0));
        assert_eq!(s.ttft_ewma_ms(0), None);
        assert_eq!(s.ttft_ewma_ms(2), None);
        s.observe(&at(1, 10, t0, 0.0));
        assert_eq!(s.ttft_ewma_ms(1), Some(10.0));
    }

    #[test]
    fn one_and_many_candidates() {
        let (ctx, c, t0) = three();
        let mut s = adaptive(&ctx, Options::default());
        assert_eq!(s.pick(&req(), &c[1..2], t0).unwrap().index, 0);
        // Equal everything: uniform among the tied.
        let even = cands(&[(1.0, 1), (1.0, 1), (1.0, 1)]);
        let ctx = context(&[1.0, 1.0, 1.0], &[]);
        let mut s = adaptive(&ctx, Options::default());
        let mut counts = [0u32; 3];
        for _ in 0..9_000 {
            counts[s.pick(&req(), &even, t0).unwrap().index] += 1;
        }
        assert!(
            counts.iter().all(|&n| (2_700..=3_300).contains(&n)),
            "{counts:?}"
        );
    }

    #[test]
    fn registry_builds_with_defaults_and_options_and_rejects_bad_ones() {
        let ctx = context(&[1.0, 1.0], &[price(1.0, 1.0), price(2.0, 2.0)]);
        let table = |pairs: &[(&str, toml::Value)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<toml::Table>()
        };
        let good = table(&[
            ("w_latency", toml::Value::Float(0.5)),
            ("w_cost", toml::Value::Integer(2)),
            ("w_load", toml::Value::Float(0.0)),
            ("half_life", toml::Value::String("30s".into())),
            ("default_output_tokens", toml::Value::Integer(512)),
            ("fallback_strategy", toml::Value::String("p2c".into())),
        ]);
        assert_eq!(
            crate::testing::parse_options::<Options>(&good).unwrap(),
            Options {
                w_latency: 0.5,
                w_cost: 2.0,
                w_load: 0.0,
                ttft: TtftOptions {
                    half_life: Duration::from_secs(30),
                },
                default_output_tokens: 512,
                fallback_strategy: InnerStrategy::of(
                    crate::strategies::power_of_two::Options::default()
                ),
            }
        );
        assert_eq!(
            crate::testing::parse_options::<Options>(&toml::Table::new()).unwrap(),
            Options::default()
        );
        for options in [toml::Table::new(), good] {
            assert_eq!(testing::validate_spec("adaptive", &options), Ok("adaptive"));
            let mut s = testing::build(&crate::testing::raw("adaptive", options), &ctx);
            let p = s.pick(&req(), &cands(&[(1.0, 0), (1.0, 0)]), Instant::now());
            assert_eq!(p.unwrap().index, 0, "cheaper");
        }
        for bad in [
            ("w_latency", toml::Value::Float(-1.0)),
            ("w_cost", toml::Value::Float(f64::INFINITY)),
            ("w_load", toml::Value::String("high".into())),
            ("half_life", toml::Value::String("0ms".into())),
            ("default_output_tokens", toml::Value::Integer(-5)),
            ("fallback_strategy", toml::Value::String("adaptive".into())),
            ("fallback_strategy", toml::Value::String("nope".into())),
            ("fallback", toml::Value::String("random".into())),
        ] {
            let t = table(std::slice::from_ref(&bad));
            let err = testing::validate_spec("adaptive", &t).unwrap_err();
            assert_eq!(err[0].0, bad.0, "{bad:?} must be rejected");
        }
    }
}
