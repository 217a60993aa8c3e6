//! `least_loaded`: the candidate with the lowest load; ties broken at random.
//!
//! A target's own `max_concurrent` is honoured by the candidate filter before the strategy
//! runs; the strategy's `max_concurrent` option caps every target of the route as well. A
//! candidate at the cap is skipped; all at the cap means no pick (503 with `Retry-After`).
//! Owns only its generator.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::traits::Trait;
use crate::{BuildContext, Candidate, OptionError, Pick, PickRequest, Strategy, StrategyOptions};

/// The options of `least_loaded`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// A cap on every target's load for this route; unset, no cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    /// Loads include the other gateway replicas' requests in flight (shared state store).
    pub fleet_load: bool,
}

impl StrategyOptions for Options {
    const NAME: &'static str = "least_loaded";
    const SUMMARY: &'static str = "The lowest load among the candidates; ties at random";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "max_concurrent",
            "cap on every target's load for this route (a full target is skipped; all full: 503 with Retry-After)",
        ),
        FLEET_LOAD_HELP,
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        if let Some(n) = self.max_concurrent {
            crate::values::positive(errors, "max_concurrent", n);
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(LeastLoaded::new(ctx.seed, self.max_concurrent))
    }

    fn requirements(&self) -> crate::Requirements {
        crate::Requirements {
            store: crate::StoreUse::fleet_load(Self::NAME, self.fleet_load),
            ..crate::Requirements::default()
        }
    }
}

/// The help line of `fleet_load`.
pub const FLEET_LOAD_HELP: (&str, &str) = (
    "fleet_load",
    "loads include the other gateway replicas' requests in flight, through the shared state store ([state]; as fresh as its sync_interval)",
);

pub struct LeastLoaded {
    rng: fastrand::Rng,
    /// Route-wide cap on each target's load.
    max_concurrent: Option<u64>,
}

impl LeastLoaded {
    pub fn new(seed: u64, max_concurrent: Option<u64>) -> Self {
        LeastLoaded {
            rng: fastrand::Rng::with_seed(seed),
            max_concurrent,
        }
    }
}

impl Strategy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }

    fn pick(
        &mut self,
        _req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        let cap = self.max_concurrent.unwrap_or(u64::MAX);
        let min = candidates
            .iter()
            .map(|c| c.load)
            .filter(|&l| l < cap)
            .min()?;
        let chosen = crate::choose_uniform(&mut self.rng, candidates.len(), |i| {
            candidates[i].load == min
        })?;
        Some(Pick::at(chosen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{cands, req};

    #[test]
    fn picks_the_lowest_load() {
        let c = cands(&[(1.0, 4), (1.0, 1), (1.0, 7), (1.0, 3)]);
        let mut s = LeastLoaded::new(2, None);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(s.pick(&req(), &c, now).unwrap().index, 1);
        }
    }

    #[test]
    fn ties_spread_uniformly() {
        let c = cands(&[(1.0, 2), (1.0, 9), (1.0, 2), (1.0, 2)]);
        let mut s = LeastLoaded::new(9, None);
        let now = Instant::now();
        let mut counts = [0u32; 4];
        for _ in 0..30_000 {
            counts[s.pick(&req(), &c, now).unwrap().index] += 1;
        }
        assert_eq!(counts[1], 0);
        for i in [0, 2, 3] {
            assert!((9_300..=10_700).contains(&counts[i]), "{counts:?}");
        }
    }

    #[test]
    fn max_concurrent_skips_full_targets_and_refuses_when_all_are_full() {
        let now = Instant::now();
        let mut s = LeastLoaded::new(4, Some(3));
        let c = cands(&[(1.0, 3), (1.0, 5), (1.0, 2)]);
        assert_eq!(s.pick(&req(), &c, now).unwrap().index, 2);
        let full = cands(&[(1.0, 3), (1.0, 4)]);
        assert_eq!(s.pick(&req(), &full, now), None);
    }

    #[test]
    fn no_candidate_is_none() {
        assert_eq!(
            LeastLoaded::new(1, None).pick(&req(), &[], Instant::now()),
            None
        );
    }
}
