//! `random_weighted`: a random candidate with probability proportional to its weight.
//!
//! A cumulative weight array over the candidates and one binary search per pick. No shared
//! state; owns only its generator and a reused scratch array.

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::shared::seeded::{Rule, Seeded};
use crate::strategy::Strategy;
use crate::traits::Trait;
use rolter_core::Candidate;

/// `random_weighted` takes no options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {}

impl StrategyOptions for Options {
    const NAME: &'static str = "random_weighted";
    const ALIASES: &'static [&'static str] = &[];
    const SUMMARY: &'static str = "Random choice with probability proportional to weight";
    const TRAITS: &'static [Trait] = &[Trait::Weighted, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[];

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(RandomWeighted::new(ctx.seed))
    }
}

/// `random_weighted`'s rule: a candidate with probability proportional to its weight.
#[derive(Debug, Default)]
pub struct ByWeight {
    /// Cumulative weights of the current candidates, reused between picks.
    cumulative: Vec<f64>,
}

/// The `random_weighted` strategy: [`ByWeight`] with its per-core generator.
pub type RandomWeighted = Seeded<ByWeight>;

impl Rule for ByWeight {
    fn choose(&mut self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
        if candidates.len() == 1 {
            return Some(0);
        }
        self.cumulative.clear();
        let mut total = 0.0;
        for c in candidates {
            total += c.weight;
            self.cumulative.push(total);
        }
        let x = rng.f64() * total;
        // The first candidate whose cumulative weight exceeds x.
        let i = self.cumulative.partition_point(|&w| w <= x);
        Some(i.min(candidates.len() - 1))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::testing::{cands, req};

    #[test]
    fn shares_follow_weights() {
        let c = cands(&[(3.0, 0), (1.0, 0), (0.5, 0)]);
        let mut s = RandomWeighted::new(11);
        let mut counts = [0u32; 3];
        let now = Instant::now();
        for _ in 0..90_000 {
            counts[s.pick(&req(), &c, now).unwrap().index] += 1;
        }
        // Expected 60,000 / 20,000 / 10,000; allow 3 % of the total.
        for (n, want) in counts.iter().zip([60_000.0, 20_000.0, 10_000.0]) {
            assert!((*n as f64 - want).abs() < 2_700.0, "{counts:?}");
        }
    }

    #[test]
    fn a_drained_candidate_is_never_picked() {
        // Weight 0 first, in the middle and last: none of them is ever chosen.
        let c = cands(&[(0.0, 0), (1.0, 0), (0.0, 0), (2.0, 0), (0.0, 0)]);
        let mut s = RandomWeighted::new(3);
        let now = Instant::now();
        let mut counts = [0u32; 5];
        for _ in 0..20_000 {
            counts[s.pick(&req(), &c, now).unwrap().index] += 1;
        }
        assert_eq!([counts[0], counts[2], counts[4]], [0, 0, 0], "{counts:?}");
        assert!(counts[1] > 0 && counts[3] > counts[1], "{counts:?}");
    }

    #[test]
    fn one_candidate() {
        let mut s = RandomWeighted::new(1);
        let now = Instant::now();
        let c = cands(&[(2.0, 5)]);
        assert_eq!(s.pick(&req(), &c, now).unwrap().index, 0);
    }
}
