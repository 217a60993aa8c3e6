//! `round_robin` / `smooth_weighted_round_robin`: nginx's smooth weighted round-robin.
//!
//! Every pick adds each candidate's weight to its current weight, picks the largest and
//! subtracts the total, so weights 5:1:1 give `a a b a c a a` and equal weights give plain
//! rotation in candidate order. The cursor is per core; with `atomic = true` it lives in the
//! shared state store and every replica advances the same one: the gateway advances it over
//! the pick's candidates before the pick ([`Needs::SHARED_ROTATION`]) and the answer comes
//! in as [`AsyncInputs::rotation`](rolter_core::AsyncInputs); when the store could not answer in
//! time the per-core cursor picks, and the pick says so (`store_unavailable`).
//! Owns only its current weights.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::requirements::{Requirements, StoreUse};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Needs, Pick, PickRequest};

/// The fallback reason of a pick made by the per-core cursor because the store did not
/// answer in time.
pub const STORE_UNAVAILABLE: &str = "store_unavailable";

/// Largest `lease`.
pub const MAX_LEASE: u32 = 1000;

/// The options of `round_robin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// One cursor for every gateway replica in the shared state store.
    pub atomic: bool,
    /// With `atomic`: consecutive positions a core takes from the store at once.
    pub lease: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            atomic: false,
            lease: 1,
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "round_robin";
    const ALIASES: &'static [&'static str] = &[
        "smooth_weighted_round_robin",
        "weighted",
        "weighted_round_robin",
    ];
    const SUMMARY: &'static str =
        "Rotation through the candidates; smooth weighted round-robin when weights differ";
    const TRAITS: &'static [Trait] = &[Trait::Weighted, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "atomic",
            "keep one cursor for every gateway replica in the shared state store ([state]); each pick advances it there",
        ),
        (
            "lease",
            "with atomic: consecutive positions a core takes per store call (1 = exact interleaving across replicas; N saves N-1 round trips and interleaves in blocks of up to N)",
        ),
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::require(
            errors,
            (1..=MAX_LEASE).contains(&self.lease),
            "lease",
            "must be a whole number from 1 to 1000 (default 1)",
        );
        crate::values::require(
            errors,
            self.atomic || self.lease == 1,
            "lease",
            "only applies with atomic = true; remove it or set atomic = true",
        );
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        let mut rr = RoundRobin::with_offset(ctx.target_count, ctx.seed);
        rr.atomic = self.atomic;
        Box::new(rr)
    }

    fn requirements(&self) -> Requirements {
        Requirements {
            store: self.atomic.then(|| StoreUse {
                rotation: Some(self.lease),
                ..StoreUse::by(format!("`{}` with atomic = true", Self::NAME))
            }),
            ..Requirements::default()
        }
    }
}

pub struct RoundRobin {
    /// Current weight per target id (targets not in the route stay at zero).
    current: Vec<f64>,
    /// Picks to skip before the first one, so that the cores of one gateway do not all
    /// start their rotations on the same target.
    offset: u64,
    /// The rotation lives in the shared state store; this cursor only stands in for it.
    atomic: bool,
}

impl RoundRobin {
    /// A rotation that starts with the first candidate.
    pub fn new(target_count: usize) -> Self {
        Self::with_offset(target_count, 0)
    }

    /// A rotation that starts `offset` picks in (modulo the first candidate count).
    pub fn with_offset(target_count: usize, offset: u64) -> Self {
        RoundRobin {
            current: vec![0.0; target_count],
            offset,
            atomic: false,
        }
    }

    fn advance(&mut self, candidates: &[Candidate]) -> usize {
        let mut total = 0.0;
        let mut best = 0;
        let mut best_w = f64::NEG_INFINITY;
        for (i, c) in candidates.iter().enumerate() {
            if c.target >= self.current.len() {
                self.current.resize(c.target + 1, 0.0);
            }
            let cw = &mut self.current[c.target];
            *cw += c.weight;
            total += c.weight;
            if *cw > best_w {
                best_w = *cw;
                best = i;
            }
        }
        self.current[candidates[best].target] -= total;
        best
    }
}

impl Strategy for RoundRobin {
    fn needs(&self) -> Needs {
        if self.atomic {
            Needs::SHARED_ROTATION
        } else {
            Needs::NONE
        }
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        if candidates.len() == 1 {
            return Some(Pick::at(0));
        }
        if self.atomic {
            let shared = req
                .inputs
                .rotation
                .and_then(|t| candidates.iter().position(|c| c.target == t));
            return Some(match shared {
                Some(i) => Pick::at(i),
                None => Pick::fallback(self.advance(candidates), STORE_UNAVAILABLE),
            });
        }
        if self.offset > 0 {
            for _ in 0..self.offset % candidates.len() as u64 {
                self.advance(candidates);
            }
            self.offset = 0;
        }
        Some(Pick::at(self.advance(candidates)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self, req};

    /// Candidates with the given weights and no load.
    fn cands(weights: &[f64]) -> Vec<Candidate> {
        let spec: Vec<(f64, u64)> = weights.iter().map(|&w| (w, 0)).collect();
        testing::cands(&spec)
    }

    fn sequence(rr: &mut RoundRobin, c: &[Candidate], n: usize) -> String {
        let now = Instant::now();
        (0..n)
            .map(|_| (b'a' + c[rr.pick(&req(), c, now).unwrap().index].target as u8) as char)
            .collect()
    }

    #[test]
    fn equal_weights_rotate_in_order() {
        let c = cands(&[1.0, 1.0, 1.0]);
        assert_eq!(sequence(&mut RoundRobin::new(3), &c, 7), "abcabca");
    }

    #[test]
    fn smooth_weights_interleave() {
        let c = cands(&[5.0, 1.0, 1.0]);
        let s = sequence(&mut RoundRobin::new(3), &c, 7);
        assert_eq!(s, "aabacaa");
        let long = sequence(&mut RoundRobin::new(3), &c, 7000);
        assert!(!long.contains("aaaaa"));
        assert_eq!(long.matches('a').count(), 5000);
        assert_eq!(long.matches('b').count(), 1000);
    }

    #[test]
    fn offset_starts_the_rotation_later() {
        let c = cands(&[1.0, 1.0, 1.0]);
        assert_eq!(
            sequence(&mut RoundRobin::with_offset(3, 1), &c, 6),
            "bcabca"
        );
        assert_eq!(sequence(&mut RoundRobin::with_offset(3, 5), &c, 3), "cab");
        let w = cands(&[5.0, 1.0, 1.0]);
        let s = sequence(&mut RoundRobin::with_offset(3, 3), &w, 7000);
        assert_eq!(s.matches('a').count(), 5000, "shares unchanged");
    }

    #[test]
    fn three_to_one_split() {
        let c = cands(&[3.0, 1.0]);
        let s = sequence(&mut RoundRobin::new(2), &c, 400);
        assert_eq!(s.matches('a').count(), 300);
        assert!(!s.contains("aaaa"));
    }

    #[test]
    fn atomic_follows_the_store_and_falls_back_to_its_own_cursor() {
        use crate::testing::context;
        let opts = Options {
            atomic: true,
            lease: 1,
        };
        let mut errors = Vec::new();
        opts.check(&mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        let store = opts.requirements().store.expect("atomic uses the store");
        assert_eq!(store.rotation, Some(1));
        assert_eq!(store.by, ["`round_robin` with atomic = true"]);
        let ctx = context(&[1.0; 3], &[None, None, None]);
        let mut rr = opts.build(&ctx);
        assert!(rr.needs().contains(Needs::SHARED_ROTATION));
        let c = cands(&[1.0, 1.0, 1.0]);
        let now = Instant::now();
        // The store's answer wins, whatever the local cursor would say.
        for t in [2, 2, 0] {
            let inputs = rolter_core::AsyncInputs {
                rotation: Some(t),
                ..Default::default()
            };
            let r = PickRequest {
                inputs: &inputs,
                ..req()
            };
            let p = rr.pick(&r, &c, now).unwrap();
            assert_eq!((c[p.index].target, p.fallback), (t, None));
        }
        // No answer (or one that is no longer a candidate): the local rotation, said so.
        let gone = rolter_core::AsyncInputs {
            rotation: Some(7),
            ..Default::default()
        };
        let r = PickRequest {
            inputs: &gone,
            ..req()
        };
        let picks: Vec<_> = (0..3).map(|_| rr.pick(&r, &c, now).unwrap()).collect();
        assert!(picks.iter().all(|p| p.fallback == Some(STORE_UNAVAILABLE)));
        let mut seen: Vec<usize> = picks.iter().map(|p| c[p.index].target).collect();
        seen.sort();
        assert_eq!(seen, [0, 1, 2], "the local cursor still rotates");
        // Without atomic nothing is asked of the store.
        assert!(Options::default().requirements().store.is_none());
        let plain = Options::default().build(&ctx);
        assert!(!plain.needs().contains(Needs::SHARED_ROTATION));
    }

    #[test]
    fn lease_is_checked() {
        for (atomic, lease, ok) in [
            (true, 0, false),
            (true, 1001, false),
            (false, 4, false),
            (true, 64, true),
        ] {
            let mut errors = Vec::new();
            Options { atomic, lease }.check(&mut errors);
            assert_eq!(
                errors.is_empty(),
                ok,
                "atomic {atomic} lease {lease}: {errors:?}"
            );
        }
    }

    #[test]
    fn one_and_shrinking_candidate_sets() {
        let now = Instant::now();
        let mut rr = RoundRobin::new(3);
        let all = cands(&[1.0, 1.0, 1.0]);
        assert_eq!(rr.pick(&req(), &all[1..2], now).unwrap().index, 0);
        // With one target removed, the other two still alternate.
        let two = [all[0], all[2]];
        let s: Vec<usize> = (0..6)
            .map(|_| two[rr.pick(&req(), &two, now).unwrap().index].target)
            .collect();
        assert_eq!(s.iter().filter(|&&t| t == 0).count(), 3);
        assert!(s.windows(2).all(|w| w[0] != w[1]));
    }
}
