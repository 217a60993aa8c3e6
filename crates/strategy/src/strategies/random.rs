//! `random`: a uniform choice among the candidates, from a per-core generator.
//!
//! Owns only its random number generator.

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::shared::seeded::{Rule, Seeded};
use crate::strategy::Strategy;
use crate::traits::Trait;
use rolter_core::Candidate;

/// `random` takes no options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {}

impl StrategyOptions for Options {
    const NAME: &'static str = "random";
    const ALIASES: &'static [&'static str] = &[];
    const SUMMARY: &'static str = "Uniform random choice among the candidates";
    const TRAITS: &'static [Trait] = &[Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[];

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(Random::new(ctx.seed))
    }
}

/// `random`'s rule: any candidate, uniformly.
#[derive(Debug, Default)]
pub struct Uniform;

impl Rule for Uniform {
    fn choose(&mut self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
        Some(rng.usize(..candidates.len()))
    }
}

/// The `random` strategy: [`Uniform`] with its per-core generator.
pub type Random = Seeded<Uniform>;

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::testing::{cands, req};

    #[test]
    fn uniform_over_candidates() {
        let req = req();
        let c = cands(&[(1.0, 0); 4]);
        let mut r = Random::new(7);
        let mut counts = [0u32; 4];
        let now = Instant::now();
        for _ in 0..40_000 {
            counts[r.pick(&req, &c, now).unwrap().index] += 1;
        }
        // Each share within 5 % of 10,000 (about 10 standard deviations).
        for n in counts {
            assert!((9_500..=10_500).contains(&n), "{counts:?}");
        }
        assert_eq!(r.pick(&req, &c[2..3], now).unwrap().index, 0);
    }
}
