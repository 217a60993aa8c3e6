//! `predicted_latency`: per target an online linear model of time to first token,
//! `ttft_ms ≈ a + b × queue_depth + c × prompt_tokens`, learned by recursive least squares
//! with exponential forgetting (option `forgetting`); the candidate with the lowest prediction for this request
//! (its current load, the request's prompt tokens) wins, load breaks ties, then a seeded
//! random choice. Negative predictions count as 0.
//!
//! A target with fewer than 8 learning samples is unknown (not slow). While any candidate
//! is unknown the route picks exactly like `least_loaded` (fallback reason `learning`), so
//! switching a route to this strategy moves no traffic by itself.
//!
//! Owns one model per target id (three coefficients and a 3×3 information matrix, the
//! covariance's inverse, in fixed-size arrays preallocated at build, sized `target_count`),
//! the route's membership mask, the least-load picker used while learning and its
//! generator. It must not block, lock, log, do I/O or allocate per pick. Only successful
//! samples with a TTFT teach, with the load and prompt tokens they were sent with; a model
//! that stops being finite or positive definite is reset to unknown.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::shared::choose::choose_least_loaded_among;
use crate::shared::ewma::{route_mask, teaching_ttft_ms};
use crate::strategies::least_loaded::LeastLoaded;
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Pick, PickRequest, Sample};
/// Learning samples a target needs before its model is used.
pub const LEARNING_SAMPLES: u32 = 8;

/// Prompt tokens enter the model in thousands, so the three features have similar scales.
const PROMPT_SCALE: f64 = 1e-3;
/// Ridge prior on the coefficients (information per coefficient, in 1/ms²): negligible
/// next to a single sample, yet it keeps every direction of the model well defined.
const RIDGE: f64 = 1e-4;
/// Predictions closer than this (ms) tie.
const TIE_MS: f64 = 1e-9;

/// One target's model over `x = [1, queue_depth, prompt_tokens / 1000]`: exponentially
/// weighted least squares with a constant ridge prior, updated recursively in information
/// form. After `k` samples, `r = RIDGE·I + Σ λ^(k−i) xᵢxᵢᵀ` (the inverse of the 3×3
/// covariance) and `b = Σ λ^(k−i) xᵢyᵢ`; the coefficients solve `r θ = b` (a 3×3 Cholesky
/// solve, once per sample, never per pick).
///
/// Writing the update as `r ← λ r + x xᵀ + (1 − λ)·RIDGE·I` keeps the prior constant while
/// old samples fade, so a direction the samples never excite (a queue that is always empty,
/// prompts of one size) cannot wind up: the covariance stays bounded by `1 / RIDGE` in
/// every direction, and forgetting keeps working in the directions that are excited.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rls {
    r: [[f64; 3]; 3],
    b: [f64; 3],
    theta: [f64; 3],
    samples: u32,
}

#[inline]
fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

#[inline]
fn features(load: u64, prompt_tokens: u32) -> [f64; 3] {
    [1.0, load as f64, prompt_tokens as f64 * PROMPT_SCALE]
}

/// Solves `r θ = b` for a symmetric positive definite `r`; `None` when `r` is not
/// (numerically) positive definite or the result is not finite.
fn cholesky_solve(r: &[[f64; 3]; 3], b: [f64; 3]) -> Option<[f64; 3]> {
    let pivot = |v: f64| (v > 0.0 && v.is_finite()).then(|| v.sqrt());
    let l00 = pivot(r[0][0])?;
    let l10 = r[1][0] / l00;
    let l20 = r[2][0] / l00;
    let l11 = pivot(r[1][1] - l10 * l10)?;
    let l21 = (r[2][1] - l20 * l10) / l11;
    let l22 = pivot(r[2][2] - l20 * l20 - l21 * l21)?;
    let z0 = b[0] / l00;
    let z1 = (b[1] - l10 * z0) / l11;
    let z2 = (b[2] - l20 * z0 - l21 * z1) / l22;
    let t2 = z2 / l22;
    let t1 = (z1 - l21 * t2) / l11;
    let t0 = (z0 - l10 * t1 - l20 * t2) / l00;
    let theta = [t0, t1, t2];
    theta.iter().all(|v| v.is_finite()).then_some(theta)
}

impl Rls {
    const FRESH: Rls = Rls {
        r: [[RIDGE, 0.0, 0.0], [0.0, RIDGE, 0.0], [0.0, 0.0, RIDGE]],
        b: [0.0; 3],
        theta: [0.0; 3],
        samples: 0,
    };

    fn learn(&mut self, x: [f64; 3], y_ms: f64, forgetting: f64) {
        let prior = (1.0 - forgetting) * RIDGE;
        for (i, row) in self.r.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = forgetting * *v + x[i] * x[j] + if i == j { prior } else { 0.0 };
            }
        }
        for (bi, xi) in self.b.iter_mut().zip(x) {
            *bi = forgetting * *bi + xi * y_ms;
        }
        let finite = self
            .r
            .iter()
            .flatten()
            .chain(&self.b)
            .all(|v| v.is_finite());
        match cholesky_solve(&self.r, self.b) {
            Some(theta) if finite => {
                self.theta = theta;
                self.samples = self.samples.saturating_add(1);
            }
            // Numeric damage (an absurd sample, accumulated rounding): start over.
            _ => *self = Rls::FRESH,
        }
    }

    #[inline]
    fn known(&self) -> bool {
        self.samples >= LEARNING_SAMPLES
    }

    /// Predicted TTFT in ms, never negative.
    #[inline]
    fn predict(&self, x: [f64; 3]) -> f64 {
        dot(self.theta, x).max(0.0)
    }
}

/// The options of `predicted_latency`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// RLS forgetting factor in (0.9, 1]: 1 never forgets; 0.995 remembers roughly the
    /// last 200 samples.
    pub forgetting: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { forgetting: 0.995 }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "predicted_latency";
    const SUMMARY: &'static str =
        "Lowest TTFT predicted by a per-target online model of queue depth and prompt size";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[(
        "forgetting",
        "weight an old sample keeps per new one, in (0.9, 1]; 1 never forgets, 0.995 remembers about 200 samples",
    )];

    fn check(&self, errors: &mut Vec<OptionError>) {
        let f = self.forgetting;
        crate::values::require(
            errors,
            f > 0.9 && f <= 1.0,
            "forgetting",
            "must be a number in (0.9, 1], e.g. 0.995",
        );
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(PredictedLatency::new(*self, ctx))
    }
}

pub struct PredictedLatency {
    rng: fastrand::Rng,
    in_route: Vec<bool>,
    models: Vec<Rls>,
    forgetting: f64,
    /// Picks while any candidate is unknown.
    learning: LeastLoaded,
}

impl PredictedLatency {
    pub fn new(opts: Options, ctx: &BuildContext<'_>) -> Self {
        PredictedLatency {
            rng: fastrand::Rng::with_seed(ctx.seed ^ 0x9e37_79b9_7f4a_7c15),
            in_route: route_mask(ctx),
            models: vec![Rls::FRESH; ctx.target_count],
            forgetting: opts.forgetting,
            learning: LeastLoaded::new(ctx.seed),
        }
    }

    /// The predicted TTFT (ms) of a request with `prompt_tokens` sent to `target` at `load`,
    /// once the target's model is known.
    pub fn predict_ms(&self, target: usize, load: u64, prompt_tokens: u32) -> Option<f64> {
        let m = self.models.get(target).filter(|m| m.known())?;
        Some(m.predict(features(load, prompt_tokens)))
    }

    /// Learning samples the target's current model has seen.
    pub fn samples(&self, target: usize) -> u32 {
        self.models.get(target).map_or(0, |m| m.samples)
    }
}

impl Strategy for PredictedLatency {
    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        let models = &self.models;
        let prediction = |c: &Candidate| -> Option<f64> {
            let m = models.get(c.target).filter(|m| m.known())?;
            Some(m.predict(features(c.load, req.prompt_tokens)))
        };
        let mut best = f64::INFINITY;
        for c in candidates {
            match prediction(c) {
                Some(v) => best = best.min(v),
                None => {
                    let p = self.learning.pick(req, candidates, now)?;
                    return Some(Pick::fallback(p.index, "learning"));
                }
            }
        }
        let limit = best + TIE_MS;
        let tied = |i: usize| prediction(&candidates[i]).is_some_and(|v| v <= limit);
        let index = choose_least_loaded_among(&mut self.rng, candidates, tied)?;
        Some(Pick {
            index,
            score: prediction(&candidates[index]),
            fallback: None,
        })
    }

    fn predicted_ttft_ms(&self, req: &PickRequest<'_>, c: &Candidate) -> Option<f64> {
        self.predict_ms(c.target, c.load, req.prompt_tokens)
            .map(|v| v.max(0.0))
    }

    fn learned(&self, target: usize) -> Vec<(&'static str, f64)> {
        let Some(m) = self.models.get(target) else {
            return Vec::new();
        };
        let mut v = vec![("samples", f64::from(m.samples))];
        if m.known() {
            v.extend([
                ("base_ms", m.theta[0]),
                ("ms_per_queued_request", m.theta[1]),
                (
                    "ms_per_1k_prompt_tokens",
                    m.theta[2] * PROMPT_SCALE * 1000.0,
                ),
            ]);
        }
        v
    }

    fn observe(&mut self, sample: &Sample) {
        if let Some(ms) = teaching_ttft_ms(sample, &self.in_route) {
            let x = features(sample.load_at_send, sample.prompt_tokens);
            self.models[sample.target].learn(x, ms, self.forgetting);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use crate::testing::{cands, context, req, sample};

    fn strategy(n: usize) -> PredictedLatency {
        PredictedLatency::new(Options::default(), &context(&vec![1.0; n], &[]))
    }

    fn request(prompt_tokens: u32) -> PickRequest<'static> {
        PickRequest {
            prompt_tokens,
            ..req()
        }
    }

    /// Target 0: ttft = 20 + 30·q + 0.01·p (fast prefill); target 1: 20 + 30·q + 0.1·p.
    fn truth(target: usize, q: u64, p: u32) -> f64 {
        let per_token = if target == 0 { 0.01 } else { 0.1 };
        20.0 + 30.0 * q as f64 + per_token * p as f64
    }

    /// `n` noisy samples (±5 ms) per target across queue depths 0..=8 and prompts 50..8000.
    fn train(s: &mut PredictedLatency, targets: &[usize], n: usize, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..n {
            for &t in targets {
                let q = rng.u64(0..=8);
                let p = rng.u32(50..8000);
                let noisy = (truth(t, q, p) + rng.f64() * 10.0 - 5.0).max(0.0);
                s.observe(&sample(t, noisy.round() as u64, q, p));
            }
        }
    }

    #[test]
    fn it_predicts_a_known_targets_ttft_at_the_candidates_load_and_nothing_while_learning() {
        let mut s = strategy(2);
        let c = testing::cands(&[(1.0, 2), (1.0, 2)]);
        assert_eq!(s.predicted_ttft_ms(&request(1000), &c[0]), None);
        train(&mut s, &[0], 40, 7);
        let p = s.predicted_ttft_ms(&request(1000), &c[0]).unwrap();
        let want = truth(0, 2, 1000);
        assert!((p - want).abs() < 5.0, "{p} against {want}");
        assert_eq!(s.predicted_ttft_ms(&request(1000), &c[1]), None);
    }

    #[test]
    fn learning_picks_equal_least_loaded_picks_with_the_same_seed() {
        let ctx = context(&[1.0, 1.0, 1.0], &[]);
        let mut s = PredictedLatency::new(Options::default(), &ctx);
        let mut reference = LeastLoaded::new(ctx.seed);
        let mut loads = fastrand::Rng::with_seed(3);
        let now = Instant::now();
        for round in 0..400 {
            // Targets 0 and 1 learn fully; target 2 stays one sample short.
            if round < 7 {
                train(&mut s, &[0, 1, 2], 1, round);
            } else if round < 40 {
                train(&mut s, &[0, 1], 1, round);
            }
            let c = cands(&[
                (1.0, loads.u64(0..3)),
                (1.0, loads.u64(0..3)),
                (1.0, loads.u64(0..3)),
            ]);
            let want = reference.pick(&req(), &c, now).unwrap().index;
            assert_eq!(
                s.pick(&request(loads.u32(0..9000)), &c, now),
                Some(Pick::fallback(want, "learning")),
                "round {round}"
            );
        }
        assert_eq!(s.samples(2), LEARNING_SAMPLES - 1);
        assert!(s.predict_ms(0, 0, 0).is_some() && s.predict_ms(2, 0, 0).is_none());
        train(&mut s, &[2], 1, 99);
        let p = s.pick(&req(), &cands(&[(1.0, 0), (1.0, 0), (1.0, 0)]), now);
        assert_eq!(
            p.unwrap().fallback,
            None,
            "every candidate known: the model decides"
        );
    }

    #[test]
    fn long_prompts_go_to_the_fast_prefiller_short_ones_to_the_shorter_queue() {
        let mut s = strategy(2);
        train(&mut s, &[0, 1], 300, 11);
        let now = Instant::now();
        // A (target 0) has 3 queued, B (target 1) none.
        let c = cands(&[(1.0, 3), (1.0, 0)]);
        let long = s.pick(&request(4000), &c, now).unwrap();
        assert_eq!((long.index, long.fallback), (0, None));
        let predicted = long.score.unwrap();
        assert!((predicted - truth(0, 3, 4000)).abs() < 10.0, "{predicted}");
        let short = s.pick(&request(100), &c, now).unwrap();
        assert_eq!((short.index, short.fallback), (1, None));
        assert!((short.score.unwrap() - truth(1, 0, 100)).abs() < 10.0);
        // The learned coefficients are close to the truth.
        for t in [0, 1] {
            for (q, p) in [(0, 0), (5, 0), (0, 6000), (7, 2000)] {
                let got = s.predict_ms(t, q, p).unwrap();
                assert!((got - truth(t, q, p)).abs() < 10.0, "{t} {q} {p}: {got}");
            }
        }
    }

    #[test]
    fn negative_predictions_clamp_to_zero_and_ties_go_to_the_lower_load() {
        let mut s = strategy(2);
        // Both: ttft = 500 - 100·q, so a deep queue predicts below zero.
        for k in 0..40u64 {
            let q = k % 5;
            s.observe(&sample(0, 500 - 100 * q, q, 100));
            s.observe(&sample(1, 500 - 100 * q, q, 100));
        }
        assert_eq!(s.predict_ms(0, 9, 100), Some(0.0));
        let c = cands(&[(1.0, 9), (1.0, 8)]);
        let p = s.pick(&request(100), &c, Instant::now()).unwrap();
        assert_eq!((p.index, p.score), (1, Some(0.0)));
    }

    #[test]
    fn failing_samples_never_teach() {
        let mut s = strategy(1);
        for _ in 0..20 {
            let mut failed = sample(0, 10, 0, 100);
            failed.success = false;
            failed.status = 502;
            s.observe(&failed);
            let mut no_ttft = sample(0, 10, 0, 100);
            no_ttft.ttft = None;
            s.observe(&no_ttft);
        }
        assert_eq!(s.samples(0), 0);
        let p = s.pick(&req(), &cands(&[(1.0, 0)]), Instant::now());
        assert_eq!(p, Some(Pick::fallback(0, "learning")));
    }

    #[test]
    fn one_and_many_candidates_and_removal_mid_stream() {
        let mut s = strategy(3);
        let now = Instant::now();
        assert_eq!(s.pick(&req(), &cands(&[(1.0, 4)]), now).unwrap().index, 0);
        train(&mut s, &[0, 1], 50, 5);
        let mut rng = fastrand::Rng::with_seed(8);
        for _ in 0..50 {
            // Target 2 follows target 1's curve plus 200 ms.
            let (q, p) = (rng.u64(0..=8), rng.u32(50..8000));
            s.observe(&sample(2, (truth(1, q, p) + 200.0) as u64, q, p));
        }
        // Short: 111, 30, 230 ms; long: 150, 420, 620 ms.
        let all = cands(&[(1.0, 3), (1.0, 0), (1.0, 0)]);
        assert_eq!(s.pick(&request(100), &all, now).unwrap().index, 1);
        assert_eq!(s.pick(&request(4000), &all, now).unwrap().index, 0);
        // Target 0 drops out: long prompts now go to the better of the rest.
        let rest = &all[1..];
        assert_eq!(
            rest[s.pick(&request(4000), rest, now).unwrap().index].target,
            1
        );
    }

    #[test]
    fn ignores_targets_of_other_routes() {
        let route: &'static [usize] = &[0, 1];
        let ctx = BuildContext {
            route_targets: route,
            ..context(&[1.0, 1.0, 1.0], &[])
        };
        let mut s = PredictedLatency::new(Options::default(), &ctx);
        for _ in 0..10 {
            s.observe(&sample(2, 50, 0, 100));
            s.observe(&sample(77, 50, 0, 100));
            s.observe(&sample(0, 50, 0, 100));
        }
        assert_eq!((s.samples(0), s.samples(2), s.samples(77)), (10, 0, 0));
    }

    /// The covariance `r⁻¹` of a model (columns solved one at a time).
    fn covariance(m: &Rls) -> [[f64; 3]; 3] {
        let mut p = [[0.0; 3]; 3];
        for (j, e) in [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
            .into_iter()
            .enumerate()
        {
            let col = cholesky_solve(&m.r, e).unwrap();
            for (row, v) in p.iter_mut().zip(col) {
                row[j] = v;
            }
        }
        p
    }

    #[test]
    fn no_windup_without_excitation_and_forgetting_keeps_tracking() {
        let mut s = strategy(1);
        // One queue depth and one prompt size for a long time: the unexcited directions
        // must not wind up, and the model must not go stiff.
        for _ in 0..50_000 {
            s.observe(&sample(0, 30, 0, 1000));
        }
        let m = s.models[0];
        assert_eq!(m.samples, 50_000);
        let p = covariance(&m);
        for (i, row) in p.iter().enumerate() {
            assert!(row[i] > 0.0 && row[i] <= 1.0 / RIDGE * 1.000_001, "{p:?}");
        }
        assert!((s.predict_ms(0, 0, 1000).unwrap() - 30.0).abs() < 1e-3);
        // The same request shape gets slower: tracked within a few hundred samples.
        for _ in 0..1_000 {
            s.observe(&sample(0, 60, 0, 1000));
        }
        assert!((s.predict_ms(0, 0, 1000).unwrap() - 60.0).abs() < 1.0);
        // Excitation arriving later is learned quickly.
        train(&mut s, &[0], 300, 4);
        let got = s.predict_ms(0, 6, 3000).unwrap();
        assert!((got - truth(0, 6, 3000)).abs() < 10.0, "{got}");
    }

    #[test]
    fn numeric_blow_up_resets_the_model_to_unknown() {
        let mut s = strategy(1);
        train(&mut s, &[0], 20, 1);
        assert!(s.predict_ms(0, 0, 0).is_some());
        s.models[0].learn(
            features(1, 100),
            f64::INFINITY,
            Options::default().forgetting,
        );
        assert_eq!(s.models[0], Rls::FRESH);
        assert_eq!(s.predict_ms(0, 0, 0), None);
        let p = s.pick(&req(), &cands(&[(1.0, 0)]), Instant::now());
        assert_eq!(p, Some(Pick::fallback(0, "learning")));
        // Never forgetting works as well.
        let mut s = PredictedLatency::new(Options { forgetting: 1.0 }, &context(&[1.0, 1.0], &[]));
        train(&mut s, &[0, 1], 2_000, 2);
        let c = cands(&[(1.0, 3), (1.0, 0)]);
        assert_eq!(s.pick(&request(4000), &c, Instant::now()).unwrap().index, 0);
        assert_eq!(s.pick(&request(100), &c, Instant::now()).unwrap().index, 1);
    }

    #[test]
    fn registry_builds_with_defaults_and_options_and_rejects_bad_ones() {
        let ctx = context(&[1.0, 1.0], &[]);
        let table = |pairs: &[(&str, toml::Value)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<toml::Table>()
        };
        let good = table(&[("forgetting", toml::Value::Integer(1))]);
        assert_eq!(
            crate::testing::parse_options::<Options>(&good).unwrap(),
            Options { forgetting: 1.0 }
        );
        assert_eq!(
            crate::testing::parse_options::<Options>(&toml::Table::new()).unwrap(),
            Options::default()
        );
        for options in [toml::Table::new(), good] {
            assert_eq!(
                testing::validate_spec("predicted_latency", &options),
                Ok("predicted_latency")
            );
            let mut s = testing::build(&crate::testing::raw("predicted_latency", options), &ctx);
            let p = s.pick(&req(), &cands(&[(1.0, 2), (1.0, 1)]), Instant::now());
            assert_eq!(p, Some(Pick::fallback(1, "learning")));
        }
        for bad in [
            ("forgetting", toml::Value::Float(0.9)),
            ("forgetting", toml::Value::Float(1.01)),
            ("forgetting", toml::Value::Float(f64::NAN)),
            ("forgetting", toml::Value::String("0.99".into())),
            ("min_samples", toml::Value::Integer(8)),
        ] {
            let t = table(std::slice::from_ref(&bad));
            let err = testing::validate_spec("predicted_latency", &t).unwrap_err();
            assert_eq!(err[0].0, bad.0, "{bad:?} must be rejected");
        }
    }
}
