//! `least_loaded`: the candidate with the lowest load; ties broken at random.
//!
//! A target's own `max_concurrent` (exact across workers) is honoured by the candidate
//! filter before the strategy runs; the strategy has no cap of its own (its former
//! `max_concurrent` option, counted per core, is refused with that fix). Owns only its
//! generator.

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::RemovedOption;
use crate::options::StrategyOptions;
use crate::shared::seeded::{Rule, Seeded};
use crate::strategy::Strategy;
use crate::traits::Trait;
use rolter_core::Candidate;

/// The options of `least_loaded`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Loads include the other gateway replicas' requests in flight (shared state store).
    pub fleet_load: bool,
}

impl StrategyOptions for Options {
    const NAME: &'static str = "least_loaded";
    const SUMMARY: &'static str = "The lowest load among the candidates; ties at random";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[FLEET_LOAD_HELP];
    const REMOVED: &'static [RemovedOption] = &[RemovedOption {
        key: "max_concurrent",
        message: "`max_concurrent` is no longer an option of strategy `least_loaded`: it was \
                  counted per worker core, so with several workers more requests than the cap \
                  reached a target",
        fix: "remove it and set `max_concurrent` on each target (`targets[i].max_concurrent`), \
              which is exact across workers",
    }];

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(LeastLoaded::new(ctx.seed))
    }

    fn requirements(&self) -> crate::requirements::Requirements {
        crate::requirements::Requirements {
            store: crate::requirements::StoreUse::fleet_load(Self::NAME, self.fleet_load),
            ..crate::requirements::Requirements::default()
        }
    }
}

/// The help line of `fleet_load`.
pub const FLEET_LOAD_HELP: (&str, &str) = (
    "fleet_load",
    "loads include the other gateway replicas' requests in flight, through the shared state store ([state]; as fresh as its sync_interval)",
);

/// `least_loaded`'s rule: the lowest load, ties at random.
#[derive(Debug, Default)]
pub struct LowestLoad;

/// The `least_loaded` strategy: [`LowestLoad`] with its per-core generator.
pub type LeastLoaded = Seeded<LowestLoad>;

impl Rule for LowestLoad {
    fn choose(&mut self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
        crate::shared::choose::choose_least_loaded(rng, candidates)
    }

    /// The fleet's load decided when another candidate has less of this replica's own.
    fn basis(&self, candidates: &[Candidate], chosen: usize) -> rolter_core::Basis {
        let own = |c: &Candidate| c.load.saturating_sub(c.fleet_load);
        let least = candidates.iter().map(own).min().unwrap_or(0);
        if own(&candidates[chosen]) > least {
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
    fn picks_the_lowest_load() {
        let c = cands(&[(1.0, 4), (1.0, 1), (1.0, 7), (1.0, 3)]);
        let mut s = LeastLoaded::new(2);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(s.pick(&req(), &c, now).unwrap().index, 1);
        }
    }

    #[test]
    fn a_pick_the_fleets_load_changed_says_so() {
        let now = Instant::now();
        let mut s = LeastLoaded::new(3);
        // Own loads 0, 2, 4; with the other replicas' 5 on target 0: 5, 2, 4.
        let mut c = cands(&[(1.0, 5), (1.0, 2), (1.0, 4)]);
        c[0].fleet_load = 5;
        assert_eq!(s.pick(&req(), &c, now).unwrap().index, 1);
        assert_eq!(s.basis(), rolter_core::Basis::SharedLoad);
        // The same choice on this replica's own load alone.
        c[0].fleet_load = 0;
        assert_eq!(s.pick(&req(), &c, now).unwrap().index, 1);
        assert_eq!(s.basis(), rolter_core::Basis::Local);
    }

    #[test]
    fn ties_spread_uniformly() {
        let c = cands(&[(1.0, 2), (1.0, 9), (1.0, 2), (1.0, 2)]);
        let mut s = LeastLoaded::new(9);
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
    fn the_former_max_concurrent_option_is_refused_with_the_target_key_as_fix() {
        let mut t = toml::Table::new();
        t.insert("max_concurrent".into(), toml::Value::Integer(3));
        let errors = crate::StrategySpec::parse("least_loaded", &t).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].key, "max_concurrent");
        assert!(errors[0].message.contains("per worker core"), "{errors:?}");
        let fix = errors[0].fix.as_deref().unwrap();
        assert!(fix.contains("targets[i].max_concurrent"), "{fix}");
        assert!(fix.contains("exact across workers"), "{fix}");
    }

    #[test]
    fn high_loads_are_still_candidates() {
        // No cap of its own: the candidate filter applies each target's `max_concurrent`.
        let c = cands(&[(1.0, 300), (1.0, 500), (1.0, 200)]);
        let mut s = LeastLoaded::new(4);
        assert_eq!(s.pick(&req(), &c, Instant::now()).unwrap().index, 2);
    }
}
