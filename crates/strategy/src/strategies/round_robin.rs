//! `round_robin` / `smooth_weighted_round_robin`: nginx's smooth weighted round-robin.
//!
//! Every pick adds each candidate's weight to its current weight, picks the largest and
//! subtracts the total, so weights 5:1:1 give `a a b a c a a` and equal weights give plain
//! rotation in candidate order. The cursor is per core. Owns only its current weights.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::traits::Trait;
use crate::{BuildContext, Candidate, OptionError, Pick, PickRequest, Strategy, StrategyOptions};

/// The options of `round_robin`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// One cursor for every gateway replica in the shared state store.
    pub atomic: bool,
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
    const HELP: &'static [(&'static str, &'static str)] = &[(
        "atomic",
        "keep one cursor for every gateway replica in the shared state store",
    )];

    fn check(&self, errors: &mut Vec<OptionError>) {
        if self.atomic {
            errors.push(OptionError::new(
                "atomic",
                "`atomic = true` needs the shared state store, which this version does not \
                 provide; remove the option or set it to false (each core then keeps its own cursor)",
            ));
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(RoundRobin::with_offset(ctx.target_count, ctx.seed))
    }
}

pub struct RoundRobin {
    /// Current weight per target id (targets not in the route stay at zero).
    current: Vec<f64>,
    /// Picks to skip before the first one, so that the cores of one gateway do not all
    /// start their rotations on the same target.
    offset: u64,
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
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn pick(
        &mut self,
        _req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        match candidates.len() {
            0 => return None,
            1 => return Some(Pick::at(0)),
            _ => {}
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
    fn zero_one_and_shrinking_candidate_sets() {
        let now = Instant::now();
        let mut rr = RoundRobin::new(3);
        assert_eq!(rr.pick(&req(), &[], now), None);
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
