//! The hot-spot guard of the prefix strategies (`cache_aware`, `precise_cache_aware`,
//! `lmcache_aware`): when the candidates' loads are too uneven, load decides instead of the
//! prefix score, so the first engine to hold a prefix every prompt shares (a system prompt)
//! does not draw every request.

use rolter_core::Candidate;
use serde::{Deserialize, Serialize};

use super::choose::choose_uniform;

/// Fallback reason when the guard decided.
pub const IMBALANCE: &str = "imbalance";

/// The candidates are imbalanced when the highest and lowest loads differ by more than
/// `abs` **and** the highest exceeds `rel` times the lowest.
///
/// Also the guard's two options, `balance_abs_threshold` and `balance_rel_threshold`, in
/// the options of every strategy that has the guard (`#[serde(flatten)]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BalanceGuard {
    #[serde(rename = "balance_abs_threshold")]
    pub abs: u64,
    #[serde(rename = "balance_rel_threshold")]
    pub rel: f64,
}

impl Default for BalanceGuard {
    /// `balance_abs_threshold = 32`, `balance_rel_threshold = 1.5`.
    fn default() -> Self {
        BalanceGuard { abs: 32, rel: 1.5 }
    }
}

impl BalanceGuard {
    /// The help lines of the guard's two options, shared by every strategy that has the
    /// guard.
    pub const HELP: [(&'static str, &'static str); 2] = [
        (
            "balance_abs_threshold",
            "balance guard: pick by load when max load - min load among the candidates exceeds this and max > balance_rel_threshold x min",
        ),
        (
            "balance_rel_threshold",
            "balance guard: the ratio max load / min load must exceed too (>= 1)",
        ),
    ];

    /// When the candidates (never empty) are imbalanced, the least-loaded one (ties at
    /// random).
    #[inline]
    pub fn check(&self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
        debug_assert!(
            !candidates.is_empty(),
            "a strategy is never asked among none"
        );
        let (mut min, mut max) = (u64::MAX, 0);
        for c in candidates {
            min = min.min(c.load);
            max = max.max(c.load);
        }
        if max - min <= self.abs || max as f64 <= self.rel * min as f64 {
            return None;
        }
        choose_uniform(rng, candidates.len(), |i| candidates[i].load == min)
    }

    /// The guard's option checks (`balance_rel_threshold` of at least 1).
    pub fn check_options(&self, errors: &mut Vec<crate::values::OptionError>) {
        crate::values::require(
            errors,
            self.rel.is_finite() && self.rel >= 1.0,
            "balance_rel_threshold",
            "must be a number >= 1, such as 1.5",
        );
    }
}
