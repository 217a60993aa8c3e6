//! The random tie-break every strategy uses, the least-loaded choice that is the load
//! fallback of every strategy that has one, and the tie-break by load among the
//! best-scoring candidates.

use rolter_core::Candidate;

/// A uniform choice among the indices `0..len` that `eligible` accepts, in one pass and
/// without a second array (reservoir sampling); `None` when it accepts none. Every
/// strategy's random tie-break goes through here.
#[inline]
pub fn choose_uniform(
    rng: &mut fastrand::Rng,
    len: usize,
    mut eligible: impl FnMut(usize) -> bool,
) -> Option<usize> {
    let mut chosen = None;
    let mut seen = 0u32;
    for i in 0..len {
        if eligible(i) {
            seen += 1;
            if seen == 1 || rng.u32(..seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

/// The least-loaded candidate, ties at random: the load fallback of every strategy that
/// has one.
#[inline]
pub fn choose_least_loaded(rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
    choose_least_loaded_among(rng, candidates, |_| true)
}

/// The least-loaded of the candidates (by index) that `eligible` accepts, ties at random;
/// `None` when it accepts none. How every scoring strategy breaks a tie among its
/// best-scoring candidates: load first, then a random choice.
#[inline]
pub fn choose_least_loaded_among(
    rng: &mut fastrand::Rng,
    candidates: &[Candidate],
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    let min = (0..candidates.len())
        .filter(|&i| eligible(i))
        .map(|i| candidates[i].load)
        .min()?;
    choose_uniform(rng, candidates.len(), |i| {
        candidates[i].load == min && eligible(i)
    })
}
