//! `power_of_two` (`p2c`): sample two distinct candidates uniformly and take the less
//! loaded one; ties are broken at random. With one candidate, pick it.
//!
//! Load is the candidate's `load` as the pipeline reports it. Owns only its generator.

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::shared::seeded::{Rule, Seeded};
use crate::strategy::Strategy;
use crate::traits::Trait;
use rolter_core::Candidate;

/// The options of `power_of_two`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Loads include the other gateway replicas' requests in flight (shared state store).
    pub fleet_load: bool,
}

impl StrategyOptions for Options {
    const NAME: &'static str = "power_of_two";
    const ALIASES: &'static [&'static str] = &["p2c"];
    const SUMMARY: &'static str = "The less loaded of two candidates sampled at random";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[super::least_loaded::FLEET_LOAD_HELP];

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(PowerOfTwo::new(ctx.seed))
    }

    fn requirements(&self) -> crate::requirements::Requirements {
        crate::requirements::Requirements {
            store: crate::requirements::StoreUse::fleet_load(Self::NAME, self.fleet_load),
            ..crate::requirements::Requirements::default()
        }
    }
}

/// `power_of_two`'s rule: the less loaded of two distinct candidates drawn uniformly, ties
/// at random.
#[derive(Debug, Default)]
pub struct LessLoadedOfTwo {
    /// The last two candidates drawn.
    drawn: (usize, usize),
}

/// The `power_of_two` strategy: [`LessLoadedOfTwo`] with its per-core generator.
pub type PowerOfTwo = Seeded<LessLoadedOfTwo>;

impl Rule for LessLoadedOfTwo {
    fn choose(&mut self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
        let n = candidates.len();
        if n == 1 {
            return Some(0);
        }
        let a = rng.usize(..n);
        // A second index, distinct from the first, uniformly.
        let mut b = rng.usize(..n - 1);
        if b >= a {
            b += 1;
        }
        self.drawn = (a, b);
        let (la, lb) = (candidates[a].load, candidates[b].load);
        let pick = if la < lb {
            a
        } else if lb < la {
            b
        } else if rng.bool() {
            a
        } else {
            b
        };
        Some(pick)
    }

    /// The fleet's load decided when the other candidate drawn has less of this replica's
    /// own.
    fn basis(&self, candidates: &[Candidate], chosen: usize) -> rolter_core::Basis {
        let (a, b) = self.drawn;
        let other = if chosen == a { b } else { a };
        let own = |i: usize| {
            candidates
                .get(i)
                .map_or(0, |c: &Candidate| c.load.saturating_sub(c.fleet_load))
        };
        if candidates.len() > 1 && own(other) < own(chosen) {
            rolter_core::Basis::SharedLoad
        } else {
            rolter_core::Basis::Local
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::testing::{cands, req};

    #[test]
    fn a_pick_the_fleets_load_changed_says_so() {
        let now = Instant::now();
        let mut s = PowerOfTwo::new(5);
        // Two candidates: own loads 1 and 3; the other replicas add 4 to the first.
        let mut c = cands(&[(1.0, 5), (1.0, 3)]);
        c[0].fleet_load = 4;
        for _ in 0..20 {
            assert_eq!(s.pick(&req(), &c, now).unwrap().index, 1);
            assert_eq!(s.basis(), rolter_core::Basis::SharedLoad);
        }
        c[0].fleet_load = 1;
        for _ in 0..20 {
            assert_eq!(s.pick(&req(), &c, now).unwrap().index, 1);
            assert_eq!(s.basis(), rolter_core::Basis::Local, "own loads 4 and 3");
        }
    }

    #[test]
    fn never_picks_the_most_loaded_of_three() {
        let c = cands(&[(1.0, 5), (1.0, 9), (1.0, 1)]);
        let mut s = PowerOfTwo::new(3);
        let now = Instant::now();
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[s.pick(&req(), &c, now).unwrap().index] += 1;
        }
        assert_eq!(counts[1], 0, "{counts:?}");
        // The least loaded wins both pairs it is in (2/3 of the draws).
        assert!((19_000..=21_000).contains(&counts[2]), "{counts:?}");
    }

    #[test]
    fn ties_are_broken_at_random() {
        let c = cands(&[(1.0, 2), (1.0, 2)]);
        let mut s = PowerOfTwo::new(5);
        let now = Instant::now();
        let first = (0..10_000)
            .filter(|_| s.pick(&req(), &c, now).unwrap().index == 0)
            .count();
        assert!((4_500..=5_500).contains(&first), "{first}");
    }

    #[test]
    fn one_candidate() {
        let mut s = PowerOfTwo::new(1);
        let now = Instant::now();
        assert_eq!(s.pick(&req(), &cands(&[(1.0, 100)]), now).unwrap().index, 0);
    }
}
