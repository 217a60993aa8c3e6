//! `fastest`: the candidate with the lowest time-decayed EWMA of time to first token.
//!
//! A target with fewer than `min_samples` learning samples is cold: cold candidates are
//! picked first (least loaded among them, fallback reason `cold`) so every target gets
//! measured. Once every candidate is warm, the lowest EWMA wins; candidates within
//! `tie_tolerance` of the best tie, load breaks the tie, then a seeded random choice.
//!
//! Owns one EWMA per target id (preallocated at build, sized `target_count`), the route's
//! membership mask and its generator. It must not block, lock, log, do I/O or allocate per
//! pick, and it reads time only from `Sample::finished`. Only successful samples with a
//! TTFT teach; samples for targets outside the route are dropped on a single mask lookup.
//!

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::shared::choose::{choose_least_loaded_among, choose_uniform};
use crate::shared::ewma::{TtftAverages, TtftOptions};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Pick, PickRequest, Sample};

/// The options of `fastest`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// `half_life`.
    #[serde(flatten)]
    pub ttft: TtftOptions,
    /// Successful samples before a target counts as measured.
    pub min_samples: u32,
    /// Relative: candidates with `ewma <= best * (1 + tie_tolerance)` tie.
    pub tie_tolerance: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ttft: TtftOptions::default(),
            min_samples: 3,
            tie_tolerance: 0.0,
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "fastest";
    const SUMMARY: &'static str =
        "The lowest time-decayed EWMA of time to first token; unmeasured targets first";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[
        TtftOptions::HELP,
        (
            "min_samples",
            "successful samples before a target counts as measured; unmeasured targets are picked first, least loaded among them",
        ),
        (
            "tie_tolerance",
            "relative margin: targets within best × (1 + tie_tolerance) tie and load decides",
        ),
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        self.ttft.check(errors);
        crate::values::positive(errors, "min_samples", u64::from(self.min_samples));
        crate::values::non_negative(errors, "tie_tolerance", self.tie_tolerance);
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(Fastest::new(*self, ctx))
    }
}

pub struct Fastest {
    rng: fastrand::Rng,
    ttft: TtftAverages,
    min_samples: u32,
    tie_tolerance: f64,
}

impl Fastest {
    pub fn new(opts: Options, ctx: &BuildContext<'_>) -> Self {
        Fastest {
            rng: fastrand::Rng::with_seed(ctx.seed),
            ttft: TtftAverages::new(opts.ttft, ctx),
            min_samples: opts.min_samples.max(1),
            tie_tolerance: opts.tie_tolerance.max(0.0),
        }
    }

    /// The target's TTFT average in ms once it is warm (at least `min_samples` samples).
    pub fn ttft_ewma_ms(&self, target: usize) -> Option<f64> {
        self.ttft.get(target)?.value_if(self.min_samples)
    }
}

impl Strategy for Fastest {
    fn pick(
        &mut self,
        _req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        let mut best = f64::INFINITY;
        let mut cold_min_load: Option<u64> = None;
        for c in candidates {
            match self.ttft_ewma_ms(c.target) {
                Some(v) => best = best.min(v),
                None => cold_min_load = Some(cold_min_load.map_or(c.load, |m| m.min(c.load))),
            }
        }
        let (ewma, min_samples) = (&self.ttft, self.min_samples);
        let warm = |t: usize| ewma.get(t).and_then(|e| e.value_if(min_samples));

        if let Some(load) = cold_min_load {
            let i = choose_uniform(&mut self.rng, candidates.len(), |i| {
                let c = &candidates[i];
                c.load == load && warm(c.target).is_none()
            })?;
            return Some(Pick::fallback(i, "cold"));
        }

        let limit = best * (1.0 + self.tie_tolerance);
        let tied = |i: usize| warm(candidates[i].target).is_some_and(|v| v <= limit);
        let i = choose_least_loaded_among(&mut self.rng, candidates, tied)?;
        Some(Pick {
            index: i,
            score: warm(candidates[i].target),
            fallback: None,
        })
    }

    fn predicted_ttft_ms(&self, _req: &PickRequest<'_>, c: &Candidate) -> Option<f64> {
        self.ttft_ewma_ms(c.target)
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
    use crate::testing;
    use crate::testing::{cands, context, req, sample};

    fn at(target: usize, ttft_ms: u64, t0: Instant, secs: f64) -> Sample {
        let mut s = sample(target, ttft_ms, 0, 100);
        s.finished = t0 + Duration::from_secs_f64(secs);
        s
    }

    fn fastest(n: usize, opts: Options) -> Fastest {
        Fastest::new(opts, &context(&vec![1.0; n], &[]))
    }

    fn opts(half_life_secs: u64, min_samples: u32, tie_tolerance: f64) -> Options {
        Options {
            ttft: TtftOptions {
                half_life: Duration::from_secs(half_life_secs),
            },
            min_samples,
            tie_tolerance,
        }
    }

    #[test]
    fn it_predicts_a_warm_targets_average_and_nothing_for_a_cold_one() {
        let mut s = fastest(2, opts(10, 2, 0.0));
        let t0 = Instant::now();
        for i in 0..2 {
            s.observe(&at(0, 200, t0, f64::from(i)));
        }
        s.observe(&at(1, 50, t0, 0.0));
        let c = cands(&[(1.0, 0), (1.0, 0)]);
        let p = s.predicted_ttft_ms(&req(), &c[0]).unwrap();
        assert!((p - 200.0).abs() < 1e-9, "{p}");
        assert_eq!(
            s.predicted_ttft_ms(&req(), &c[1]),
            None,
            "one sample is cold"
        );
    }

    #[test]
    fn measures_cold_targets_first_least_loaded_among_them() {
        let mut s = fastest(3, Options::default());
        let t0 = Instant::now();
        let c = cands(&[(1.0, 2), (1.0, 0), (1.0, 1)]);
        assert_eq!(
            s.pick(&req(), &c, t0),
            Some(Pick::fallback(1, "cold")),
            "all cold: least loaded"
        );
        for k in 0..3 {
            s.observe(&at(1, 10, t0, k as f64));
        }
        // Target 1 is warm (and fast), yet the cold ones are measured first.
        assert_eq!(s.pick(&req(), &c, t0), Some(Pick::fallback(2, "cold")));
        for k in 0..2 {
            s.observe(&at(2, 500, t0, k as f64));
        }
        assert_eq!(
            s.pick(&req(), &c, t0).unwrap().index,
            2,
            "two samples of three: still cold"
        );
        s.observe(&at(2, 500, t0, 3.0));
        assert_eq!(s.pick(&req(), &c, t0), Some(Pick::fallback(0, "cold")));
        for k in 0..3 {
            s.observe(&at(0, 200, t0, k as f64));
        }
        let p = s.pick(&req(), &c, t0).unwrap();
        assert_eq!((p.index, p.fallback), (1, None), "all warm: the fastest");
    }

    #[test]
    fn moves_traffic_to_the_faster_target_once_measured() {
        let mut s = fastest(2, Options::default());
        let t0 = Instant::now();
        for k in 0..3 {
            s.observe(&at(0, 100, t0, k as f64));
            s.observe(&at(1, 40, t0, k as f64));
        }
        // The faster target wins even when it is busier.
        let c = cands(&[(1.0, 0), (1.0, 5)]);
        for _ in 0..100 {
            let p = s.pick(&req(), &c, t0).unwrap();
            assert_eq!(p.index, 1);
            assert_eq!(p.score, Some(40.0));
            assert_eq!(p.fallback, None);
        }
        // Target 1 slows down to 400 ms; after a few half-lives the traffic moves back.
        for k in 1..=6 {
            s.observe(&at(1, 400, t0, 2.0 + 10.0 * k as f64));
        }
        assert!(s.ttft_ewma_ms(1).unwrap() > 100.0);
        assert_eq!(s.pick(&req(), &c, t0).unwrap().index, 0);
    }

    #[test]
    fn half_life_math_with_explicit_timestamps() {
        let mut s = fastest(1, opts(10, 1, 0.0));
        let t0 = Instant::now();
        assert_eq!(s.ttft_ewma_ms(0), None);
        s.observe(&at(0, 100, t0, 0.0));
        assert_eq!(
            s.ttft_ewma_ms(0),
            Some(100.0),
            "the first sample sets the value"
        );
        s.observe(&at(0, 200, t0, 10.0));
        // One half-life: the old value keeps half its weight.
        assert!((s.ttft_ewma_ms(0).unwrap() - 150.0).abs() < 1e-9);
        s.observe(&at(0, 300, t0, 30.0));
        // Two half-lives: a quarter.
        assert!((s.ttft_ewma_ms(0).unwrap() - (0.25 * 150.0 + 0.75 * 300.0)).abs() < 1e-9);
        // A late sample (finished before the last one) has dt = 0 and no weight.
        s.observe(&at(0, 5_000, t0, 5.0));
        assert!((s.ttft_ewma_ms(0).unwrap() - 262.5).abs() < 1e-9);
        // Far beyond the half-life the new sample all but replaces the value.
        s.observe(&at(0, 50, t0, 1_030.0));
        assert!((s.ttft_ewma_ms(0).unwrap() - 50.0).abs() < 1e-6);
    }

    #[test]
    fn tie_tolerance_lets_load_decide() {
        let t0 = Instant::now();
        let train = |s: &mut Fastest| {
            for k in 0..3 {
                s.observe(&at(0, 100, t0, k as f64));
                s.observe(&at(1, 105, t0, k as f64));
                s.observe(&at(2, 200, t0, k as f64));
            }
        };
        let busy_fast = cands(&[(1.0, 4), (1.0, 1), (1.0, 0)]);
        let mut strict = fastest(3, opts(10, 3, 0.0));
        train(&mut strict);
        assert_eq!(strict.pick(&req(), &busy_fast, t0).unwrap().index, 0);

        let mut tolerant = fastest(3, opts(10, 3, 0.1));
        train(&mut tolerant);
        // 105 <= 100 * 1.1 ties with the best; 200 does not, even idle.
        assert_eq!(tolerant.pick(&req(), &busy_fast, t0).unwrap().index, 1);
        // Equal load among the tied: random, both get a fair share; never the slow one.
        let even = cands(&[(1.0, 2), (1.0, 2), (1.0, 0)]);
        let mut counts = [0u32; 3];
        for _ in 0..10_000 {
            counts[tolerant.pick(&req(), &even, t0).unwrap().index] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!((4_500..=5_500).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn failing_samples_never_teach() {
        let mut s = fastest(1, opts(10, 1, 0.0));
        let t0 = Instant::now();
        let mut failed = at(0, 10, t0, 0.0);
        failed.success = false;
        failed.status = 503;
        s.observe(&failed);
        let mut no_ttft = at(0, 10, t0, 1.0);
        no_ttft.ttft = None;
        s.observe(&no_ttft);
        assert_eq!(s.ttft_ewma_ms(0), None);
        let p = s.pick(&req(), &cands(&[(1.0, 0)]), t0).unwrap();
        assert_eq!(p, Pick::fallback(0, "cold"));
    }

    #[test]
    fn one_and_many_candidates_and_removal_mid_stream() {
        let mut s = fastest(4, opts(10, 1, 0.0));
        let t0 = Instant::now();
        assert_eq!(s.pick(&req(), &cands(&[(1.0, 9)]), t0).unwrap().index, 0);
        for (t, ms) in [(0, 300), (1, 100), (2, 200), (3, 400)] {
            s.observe(&at(t, ms, t0, 0.0));
        }
        let all = cands(&[(1.0, 0), (1.0, 0), (1.0, 0), (1.0, 0)]);
        assert_eq!(all[s.pick(&req(), &all, t0).unwrap().index].target, 1);
        // The fastest drops out (ejected, full): the next fastest takes over.
        let without_1: Vec<Candidate> = all.iter().copied().filter(|c| c.target != 1).collect();
        assert_eq!(
            without_1[s.pick(&req(), &without_1, t0).unwrap().index].target,
            2
        );
        let only_3 = [all[3]];
        assert_eq!(s.pick(&req(), &only_3, t0).unwrap().index, 0);
    }

    #[test]
    fn ignores_targets_of_other_routes() {
        let route: &'static [usize] = &[0, 1];
        let ctx = BuildContext {
            route_targets: route,
            ..context(&[1.0, 1.0, 1.0], &[])
        };
        let mut s = Fastest::new(opts(10, 1, 0.0), &ctx);
        let t0 = Instant::now();
        s.observe(&at(2, 10, t0, 0.0));
        s.observe(&at(99, 10, t0, 0.0));
        assert_eq!(s.ttft_ewma_ms(2), None);
        s.observe(&at(0, 10, t0, 0.0));
        assert_eq!(s.ttft_ewma_ms(0), Some(10.0));
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
        let good = table(&[
            ("half_life", toml::Value::String("2s".into())),
            ("min_samples", toml::Value::Integer(1)),
            ("tie_tolerance", toml::Value::Float(0.05)),
        ]);
        assert_eq!(
            crate::testing::parse_options::<Options>(&good).unwrap(),
            Options {
                ttft: TtftOptions {
                    half_life: Duration::from_secs(2),
                },
                min_samples: 1,
                tie_tolerance: 0.05
            }
        );
        assert_eq!(
            crate::testing::parse_options::<Options>(&toml::Table::new()).unwrap(),
            Options::default()
        );
        for options in [toml::Table::new(), good] {
            assert_eq!(testing::validate_spec("fastest", &options), Ok("fastest"));
            let mut s = testing::build(&crate::testing::raw("fastest", options), &ctx);
            let p = s.pick(&req(), &cands(&[(1.0, 1), (1.0, 0)]), Instant::now());
            assert_eq!(p, Some(Pick::fallback(1, "cold")));
        }
        for bad in [
            ("half_life", toml::Value::String("0s".into())),
            ("half_life", toml::Value::String("soon".into())),
            ("half_life", toml::Value::Integer(10)),
            ("min_samples", toml::Value::Integer(0)),
            ("min_samples", toml::Value::Float(2.5)),
            ("tie_tolerance", toml::Value::Float(-0.1)),
            ("tie_tolerance", toml::Value::Float(f64::NAN)),
            ("tolerance", toml::Value::Float(0.1)),
        ] {
            let t = table(std::slice::from_ref(&bad));
            let err = testing::validate_spec("fastest", &t).unwrap_err();
            assert_eq!(err[0].0, bad.0, "{bad:?} must be rejected");
        }
    }
}
