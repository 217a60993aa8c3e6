//! `failover` (`active_passive`): all traffic to the lowest tier that has a candidate; within
//! that tier a sub-strategy (option `within_tier`, default `round_robin`) spreads it.
//!
//! A tier is promoted past as soon as none of its members is a candidate, and traffic
//! returns as soon as one is again: the candidate filter decides (today a target drops out
//! when it is at `max_concurrent` or already failed this request; health ejection feeds the
//! same filter). Owns the sub-strategy and a reused scratch list of the tier's candidates.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::InnerStrategy;
use crate::options::StrategyOptions;
use crate::requirements::Requirements;
use crate::shared::wrap::{Wrapped, Wrapper};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Pick, PickRequest};

/// The options of `failover`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// The strategy that spreads traffic within a tier.
    pub within_tier: InnerStrategy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            within_tier: InnerStrategy::of(super::round_robin::Options::default()),
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "failover";
    const ALIASES: &'static [&'static str] = &["active_passive"];
    const SUMMARY: &'static str =
        "All traffic to the lowest tier with a candidate; a sub-strategy within it";
    const TRAITS: &'static [Trait] = &[Trait::HealthAware, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[(
        "within_tier",
        "the strategy that spreads traffic within a tier (any name or alias but failover, or a table with name and its options)",
    )];

    fn check(&self, errors: &mut Vec<OptionError>) {
        self.within_tier
            .check_not(Self::NAME, "within_tier", errors);
        // The shared rotation advances over the pick's candidates, every tier's; failover
        // hands its inner strategy only the lowest tier's, so the store's answer would often
        // not be among them.
        let inner = self.within_tier.resolved().map(|s| s.requirements());
        if inner.is_some_and(|r| r.store.is_some_and(|s| s.rotation.is_some())) {
            errors.push(OptionError::new(
                "within_tier",
                "a shared rotation (atomic = true) cannot run within a tier: it advances over every tier's candidates; use atomic = false within tiers, or an atomic round_robin on a route without failover",
            ));
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(Failover::new(self.within_tier.spec().build(ctx)))
    }

    fn requirements(&self) -> Requirements {
        self.within_tier.requirements(Self::NAME, "within_tier")
    }

    fn nested(&mut self) -> Vec<(&'static str, &mut InnerStrategy)> {
        vec![("within_tier", &mut self.within_tier)]
    }
}

/// The tier logic; the sub-strategy is the wrapped inner strategy.
pub struct Failover {
    /// The current tier's candidates, and their indices in the full candidate slice.
    tier: Vec<Candidate>,
    index: Vec<usize>,
}

impl Failover {
    /// Failover over `within`, which spreads traffic inside the lowest tier and sees every
    /// hook.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(within: Box<dyn Strategy>) -> Wrapped<Failover> {
        Wrapped::new(
            Failover {
                tier: Vec::new(),
                index: Vec::new(),
            },
            within,
        )
    }
}

impl Wrapper for Failover {
    fn pick(
        &mut self,
        within: &mut dyn Strategy,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        let lowest = candidates.iter().map(|c| c.tier).min()?;
        self.tier.clear();
        self.index.clear();
        for (i, c) in candidates.iter().enumerate() {
            if c.tier == lowest {
                self.tier.push(*c);
                self.index.push(i);
            }
        }
        let p = within.pick(req, &self.tier, now)?;
        Some(Pick {
            index: *self.index.get(p.index)?,
            score: p.score,
            fallback: p.fallback,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_atomic_rotation_within_tiers_is_refused() {
        let t: toml::Table =
            toml::from_str("within_tier = { name = \"round_robin\", atomic = true }").unwrap();
        let err = crate::testing::validate_spec("failover", &t).unwrap_err();
        assert!(
            err.iter().any(|e| e.1.contains("cannot run within a tier")),
            "{err:?}"
        );
    }

    use super::*;
    use crate::strategies::round_robin::RoundRobin;
    use crate::testing::req;

    fn c(target: usize, tier: u32) -> Candidate {
        Candidate {
            target,
            weight: 1.0,
            load: 0,
            tier,
            ..Candidate::default()
        }
    }

    #[test]
    fn primary_tier_takes_everything_and_rotates_within() {
        let mut f = Failover::new(Box::new(RoundRobin::new(4)));
        let all = [c(0, 0), c(1, 0), c(2, 1), c(3, 1)];
        let now = Instant::now();
        let picks: Vec<usize> = (0..6)
            .map(|_| all[f.pick(&req(), &all, now).unwrap().index].target)
            .collect();
        assert_eq!(picks, vec![0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn promotes_when_the_tier_is_gone_and_returns_when_it_is_back() {
        let mut f = Failover::new(Box::new(RoundRobin::new(4)));
        let now = Instant::now();
        // Tier 0 out (not candidates): tier 1 serves, both of its members.
        let degraded = [c(2, 1), c(3, 1)];
        let mut seen: Vec<usize> = (0..4)
            .map(|_| degraded[f.pick(&req(), &degraded, now).unwrap().index].target)
            .collect();
        seen.sort();
        assert_eq!(seen, vec![2, 2, 3, 3]);
        // One primary back: it takes all the traffic again.
        let recovered = [c(1, 0), c(2, 1), c(3, 1)];
        for _ in 0..4 {
            let p = f.pick(&req(), &recovered, now).unwrap();
            assert_eq!(recovered[p.index].target, 1);
        }
    }

    #[test]
    fn a_learning_sub_strategy_learns_through_failover() {
        let ctx = crate::testing::context(&[1.0, 1.0], &[]);
        let spec = crate::testing::raw(
            "failover",
            toml::from_str("within_tier = \"fastest\"").unwrap(),
        );
        let mut s = crate::testing::build(&spec, &ctx);
        for _ in 0..5 {
            s.observe(&crate::testing::sample(0, 90, 0, 10));
            s.observe(&crate::testing::sample(1, 10, 0, 10));
        }
        let cands = [c(0, 0), c(1, 0)];
        let p = s.pick(&req(), &cands, Instant::now()).unwrap();
        assert_eq!(p.index, 1, "the faster member of the tier, once measured");
        assert!(!s.learned(1).is_empty());
    }
}
