//! The random tie-break every strategy uses, and the least-loaded choice that is the load
//! fallback of every strategy that has one.

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
    let min = candidates.iter().map(|c| c.load).min()?;
    choose_uniform(rng, candidates.len(), |i| candidates[i].load == min)
}
