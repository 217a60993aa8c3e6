//! The one shape of the strategies that choose from the candidates alone, with a per-core
//! generator and nothing learned (`random`, `random_weighted`, `power_of_two`,
//! `least_loaded`): each states only its [`Rule`], and [`Seeded`] over that rule is the
//! strategy.
//!
//! Owns the generator and the rule's own scratch state; it reads neither the request nor
//! the time.

use std::time::Instant;

use rolter_core::{Basis, Candidate, Pick, PickRequest};

use crate::strategy::Strategy;

/// How a strategy that reads only the candidates chooses one of them.
pub trait Rule {
    /// The index of the chosen candidate (`candidates` is never empty), drawing from `rng`.
    fn choose(&mut self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize>;

    /// What decided the choice of `chosen` (right after [`choose`](Rule::choose)): the
    /// load-aware rules say [`Basis::SharedLoad`] when this replica's own load alone would
    /// have chosen another candidate.
    fn basis(&self, _candidates: &[Candidate], _chosen: usize) -> Basis {
        Basis::Local
    }
}

/// A [`Rule`] and its per-core generator, as one strategy.
pub struct Seeded<R> {
    rng: fastrand::Rng,
    rule: R,
    basis: Basis,
}

impl<R: Rule + Default> Seeded<R> {
    /// The rule with a generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Seeded {
            rng: fastrand::Rng::with_seed(seed),
            rule: R::default(),
            basis: Basis::Local,
        }
    }
}

impl<R: Rule> Strategy for Seeded<R> {
    fn pick(
        &mut self,
        _req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        debug_assert!(
            !candidates.is_empty(),
            "a strategy is never asked among none"
        );
        let chosen = self.rule.choose(&mut self.rng, candidates)?;
        self.basis = self.rule.basis(candidates, chosen);
        Some(Pick::at(chosen))
    }

    fn basis(&self) -> Basis {
        self.basis
    }
}
