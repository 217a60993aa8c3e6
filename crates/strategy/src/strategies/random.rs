//! `random`: a uniform choice among the candidates, from a per-core generator.
//!
//! Owns only its random number generator.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::OfOptions;
use crate::options::StrategyOptions;
use crate::strategy::Strategy;
use crate::traits::Trait;
use rolter_core::{Candidate, Pick, PickRequest};

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

pub struct Random {
    rng: fastrand::Rng,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Random {
            rng: fastrand::Rng::with_seed(seed),
        }
    }
}

impl OfOptions for Random {
    type Options = Options;
}

impl Strategy for Random {
    fn pick(
        &mut self,
        _req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        Some(Pick::at(self.rng.usize(..candidates.len())))
    }
}

#[cfg(test)]
mod tests {
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
