//! `cheapest`: the candidate on which this request is estimated to cost the least.
//!
//! Estimated cost = `prompt_tokens` × input price + expected output tokens × output price
//! (prices per 1M tokens, from the [`PriceBook`]); expected output tokens are the request's
//! `max_tokens` (or `max_completion_tokens`), else the `default_output_tokens` option.
//! Costs within a tiny relative epsilon are equal; equal costs go to the lower load, then
//! at random. A candidate without a known price ranks after every priced one; a pick among
//! unpriced candidates only is made by load and reported as the `no_price` fallback
//! (configuration validation normally guarantees a price for every target of the route).
//!
//! Owns a per-core copy of the price book and a generator. It must not allocate, log or
//! look anything up beyond the price book per pick.

use std::cmp::Ordering;
use std::time::Instant;

use rolter_core::PriceBook;
use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::requirements::PriceUse;
use crate::requirements::Requirements;
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Pick, PickRequest, TargetId};

/// The options of `cheapest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Expected output tokens of a request without `max_tokens`.
    pub default_output_tokens: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            default_output_tokens: 256,
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "cheapest";
    const SUMMARY: &'static str =
        "The lowest estimated cost of this request (catalog prices); ties by load, then at random";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[(
        "default_output_tokens",
        "expected output tokens of a request without max_tokens / max_completion_tokens (>= 1)",
    )];

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::positive(errors, "default_output_tokens", self.default_output_tokens);
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(Cheapest::new(
            ctx.seed,
            ctx.prices.clone(),
            self.default_output_tokens,
        ))
    }

    fn requirements(&self) -> Requirements {
        Requirements {
            prices: Some(PriceUse {
                by: "`cheapest`".to_string(),
                instead: None,
            }),
            ..Requirements::default()
        }
    }
}

/// Relative tolerance under which two estimated costs count as equal.
const COST_EPSILON: f64 = 1e-9;

pub struct Cheapest {
    rng: fastrand::Rng,
    prices: PriceBook,
    default_output_tokens: u64,
}

impl Cheapest {
    /// `default_output_tokens` is the expected output of a request without `max_tokens`
    /// (at least 1; 0 is raised to 1).
    pub fn new(seed: u64, prices: PriceBook, default_output_tokens: u64) -> Self {
        Cheapest {
            rng: fastrand::Rng::with_seed(seed),
            prices,
            default_output_tokens: default_output_tokens.max(1),
        }
    }

    /// The estimated cost of `req` on `target` in currency units, or `None` when the
    /// target has no known (finite) price for the requested model.
    pub fn estimate(&self, req: &PickRequest<'_>, target: TargetId) -> Option<f64> {
        let output = req.max_tokens.unwrap_or(self.default_output_tokens);
        self.prices
            .estimate(target, req.model, req.prompt_tokens, output as f64)
    }
}

/// Orders two estimated costs; `INFINITY` stands for "no price" and equals itself.
fn compare_cost(a: f64, b: f64) -> Ordering {
    if a == b
        || (a.is_finite() && b.is_finite() && (a - b).abs() <= COST_EPSILON * a.abs().max(b.abs()))
    {
        Ordering::Equal
    } else if a < b {
        Ordering::Less
    } else {
        Ordering::Greater
    }
}

impl Strategy for Cheapest {
    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        // One pass: the best (cost, load) so far, and a reservoir choice among exact ties so
        // that equal candidates are chosen uniformly without a second array.
        let mut chosen = 0;
        let mut chosen_cost = f64::INFINITY;
        let mut best_cost = f64::INFINITY;
        let mut best_load = u64::MAX;
        let mut ties = 0u32;
        for (i, c) in candidates.iter().enumerate() {
            let cost = self.estimate(req, c.target).unwrap_or(f64::INFINITY);
            let order = if ties == 0 {
                Ordering::Less
            } else {
                compare_cost(cost, best_cost).then(c.load.cmp(&best_load))
            };
            match order {
                Ordering::Less => {
                    chosen = i;
                    chosen_cost = cost;
                    best_cost = cost;
                    best_load = c.load;
                    ties = 1;
                }
                Ordering::Equal => {
                    ties += 1;
                    if self.rng.u32(..ties) == 0 {
                        chosen = i;
                        chosen_cost = cost;
                    }
                }
                Ordering::Greater => {}
            }
        }
        if chosen_cost.is_finite() {
            Some(Pick {
                index: chosen,
                score: Some(chosen_cost),
                fallback: None,
            })
        } else {
            Some(Pick::fallback(chosen, "no_price"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use crate::testing::{cands, context, price, req};
    use rolter_core::Price;

    fn cheapest(prices: &[Option<Price>]) -> Cheapest {
        Cheapest::new(
            3,
            PriceBook::fixed(prices),
            Options::default().default_output_tokens,
        )
    }

    fn request(prompt_tokens: u32, max_tokens: Option<u64>) -> PickRequest<'static> {
        PickRequest {
            prompt_tokens,
            max_tokens,
            ..req()
        }
    }

    #[test]
    fn the_cheapest_target_wins_every_time_whatever_its_load() {
        let mut s = cheapest(&[price(3.0, 15.0), price(0.15, 0.6), price(2.5, 10.0)]);
        let c = cands(&[(1.0, 0), (1.0, 40), (1.0, 0)]);
        let r = request(1000, Some(100));
        let now = Instant::now();
        for _ in 0..200 {
            let p = s.pick(&r, &c, now).unwrap();
            assert_eq!(p.index, 1);
            assert_eq!(p.fallback, None);
            // 1000 × 0.15 / 1e6 + 100 × 0.6 / 1e6
            let expected = 0.00015 + 0.00006;
            assert!((p.score.unwrap() - expected).abs() < 1e-12, "{p:?}");
        }
    }

    #[test]
    fn max_tokens_can_flip_the_winner_when_prices_cross() {
        // a: cheap input, dear output; b: dear input, cheap output.
        let mut s = cheapest(&[price(1.0, 10.0), price(5.0, 2.0)]);
        let c = cands(&[(1.0, 0), (1.0, 0)]);
        let now = Instant::now();
        // Short answer: 1000 + 100 (a) < 5000 + 20 (b).
        assert_eq!(s.pick(&request(1000, Some(10)), &c, now).unwrap().index, 0);
        // Long answer: 1000 + 50000 (a) > 5000 + 10000 (b).
        assert_eq!(
            s.pick(&request(1000, Some(5000)), &c, now).unwrap().index,
            1
        );
        // No max_tokens: the default 256 output tokens, 3560 (a) < 5512 (b).
        assert_eq!(s.pick(&request(1000, None), &c, now).unwrap().index, 0);
        // A larger default output flips it: 41000 (a) > 13000 (b).
        let mut long = Cheapest::new(
            3,
            PriceBook::fixed(&[price(1.0, 10.0), price(5.0, 2.0)]),
            4000,
        );
        assert_eq!(long.pick(&request(1000, None), &c, now).unwrap().index, 1);
    }

    #[test]
    fn equal_cost_goes_to_the_lower_load() {
        let mut s = cheapest(&[
            price(1.0, 2.0),
            price(1.0, 2.0),
            price(1.0, 2.0),
            price(0.5, 9.0),
        ]);
        let c = cands(&[(1.0, 5), (1.0, 2), (1.0, 7), (1.0, 0)]);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(s.pick(&request(100, Some(100)), &c, now).unwrap().index, 1);
        }
    }

    #[test]
    fn costs_equal_up_to_rounding_are_ties() {
        // 0.1 + 0.2 and 0.3 differ in the last bit; the load must decide.
        let mut s = cheapest(&[price(0.1 + 0.2, 0.0), price(0.3, 0.0)]);
        let c = cands(&[(1.0, 4), (1.0, 1)]);
        assert_eq!(
            s.pick(&request(1_000_000, Some(0)), &c, Instant::now())
                .unwrap()
                .index,
            1
        );
    }

    #[test]
    fn equal_cost_and_load_spread_uniformly() {
        let mut s = cheapest(&[
            price(1.0, 1.0),
            price(9.0, 9.0),
            price(1.0, 1.0),
            price(1.0, 1.0),
        ]);
        let c = cands(&[(1.0, 3), (1.0, 0), (1.0, 3), (1.0, 3)]);
        let now = Instant::now();
        let mut counts = [0u32; 4];
        for _ in 0..30_000 {
            counts[s.pick(&request(10, Some(10)), &c, now).unwrap().index] += 1;
        }
        assert_eq!(counts[1], 0);
        for i in [0, 2, 3] {
            assert!((9_300..=10_700).contains(&counts[i]), "{counts:?}");
        }
    }

    #[test]
    fn unpriced_candidates_rank_after_every_priced_one() {
        let mut s = cheapest(&[None, price(75.0, 150.0), None]);
        let c = cands(&[(1.0, 0), (1.0, 90), (1.0, 0)]);
        let now = Instant::now();
        for _ in 0..50 {
            let p = s.pick(&request(100, Some(100)), &c, now).unwrap();
            assert_eq!(p.index, 1);
            assert_eq!(p.fallback, None);
        }
    }

    #[test]
    fn only_unpriced_candidates_pick_by_load_as_a_fallback() {
        let mut s = cheapest(&[None, None, None]);
        let c = cands(&[(1.0, 6), (1.0, 2), (1.0, 9)]);
        let now = Instant::now();
        for _ in 0..50 {
            let p = s.pick(&request(100, Some(100)), &c, now).unwrap();
            assert_eq!(p, Pick::fallback(1, "no_price"));
        }
        // Unknown targets (outside the price book) are unpriced too.
        let far = [Candidate {
            target: 40,
            weight: 1.0,
            load: 0,
            tier: 0,
            ..Candidate::default()
        }];
        assert_eq!(
            s.pick(&req(), &far, now),
            Some(Pick::fallback(0, "no_price"))
        );
    }

    #[test]
    fn one_and_many_candidates() {
        let mut s = cheapest(&[price(2.0, 2.0), price(1.0, 1.0), price(3.0, 3.0)]);
        let now = Instant::now();
        let all = cands(&[(1.0, 0), (1.0, 0), (1.0, 0)]);
        let p = s.pick(&request(10, None), &all[2..], now).unwrap();
        assert_eq!(p.index, 0);
        assert!(p.score.unwrap() > 0.0);
        assert_eq!(all[s.pick(&req(), &all, now).unwrap().index].target, 1);
        // The cheapest one removed mid-stream: the next cheapest takes over.
        let without = [all[0], all[2]];
        assert_eq!(
            without[s.pick(&req(), &without, now).unwrap().index].target,
            0
        );
    }

    #[test]
    fn registry_builds_with_defaults_and_with_options() {
        let ctx = context(&[1.0, 1.0], &[price(1.0, 10.0), price(5.0, 2.0)]);
        let c = cands(&[(1.0, 0), (1.0, 0)]);
        let now = Instant::now();
        let mut options = toml::Table::new();
        assert_eq!(validate(&options), Ok("cheapest"));
        let mut s = testing::build(&testing::raw("cheapest", options.clone()), &ctx);
        assert_eq!(s.pick(&request(1000, None), &c, now).unwrap().index, 0);
        options.insert("default_output_tokens".into(), toml::Value::Integer(4000));
        assert_eq!(validate(&options), Ok("cheapest"));
        let mut s = testing::build(&testing::raw("cheapest", options), &ctx);
        assert_eq!(s.pick(&request(1000, None), &c, now).unwrap().index, 1);
        let info = testing::lookup("cheapest").unwrap();
        assert!(info.aliases.is_empty());
        assert!(info.traits.contains(&testing::Trait::LoadAware));
    }

    fn validate(options: &toml::Table) -> Result<&'static str, Vec<(String, String)>> {
        testing::validate_spec("cheapest", options)
    }

    #[test]
    fn bad_options_are_rejected() {
        for bad in [
            toml::Value::Integer(0),
            toml::Value::Integer(-5),
            toml::Value::Float(12.5),
            toml::Value::String("256".into()),
        ] {
            let mut t = toml::Table::new();
            t.insert("default_output_tokens".into(), bad.clone());
            let err = validate(&t).unwrap_err();
            assert_eq!(err[0].0, "default_output_tokens", "{bad:?}");
        }
        let mut t = toml::Table::new();
        t.insert("window".into(), toml::Value::String("60s".into()));
        assert!(validate(&t).unwrap_err()[0]
            .1
            .contains("default_output_tokens"));
    }
}
