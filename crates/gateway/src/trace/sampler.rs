//! Whether a request's trace is sampled: by the client's `traceparent` flag when
//! `parent_based` and one came, else by the trace id and the ratio, as OpenTelemetry's
//! `TraceIdRatioBased` sampler decides (so every service using that sampler with the same
//! ratio keeps the same traces).
//!
//! Owns the decision only; it is pure and cheap enough for the request path.

use rolter_codec::h1::traceparent::TraceParent;

/// The sampling decision for a request in trace `trace_id` (the parent's trace when a
/// valid `traceparent` came, else a new one).
pub fn sampled(
    parent: Option<&TraceParent>,
    trace_id: &[u8; 16],
    ratio: f64,
    parent_based: bool,
) -> bool {
    match parent {
        Some(p) if parent_based => p.sampled,
        _ => ratio_sampled(trace_id, ratio),
    }
}

/// `TraceIdRatioBased`: the trace id's low 8 bytes (big-endian) shifted right by one,
/// below `ratio` × 2^63.
pub fn ratio_sampled(trace_id: &[u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    // NaN and negative ratios sample nothing.
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::span::new_trace_id;

    fn parent(sampled: bool) -> TraceParent {
        TraceParent {
            trace_id: [7; 16],
            parent_id: [9; 8],
            sampled,
        }
    }

    #[test]
    fn ratio_zero_never_and_one_always() {
        for _ in 0..1000 {
            let id = new_trace_id();
            assert!(!sampled(None, &id, 0.0, true));
            assert!(sampled(None, &id, 1.0, true));
        }
        // The extremes of the low half: all ones is kept only at 1.0, all zeros at any
        // ratio whose bound is above zero (2^-63 and more).
        let mut id = [0xff; 16];
        assert!(!ratio_sampled(&id, 0.0) && !ratio_sampled(&id, 0.999) && ratio_sampled(&id, 1.0));
        id[8..].copy_from_slice(&[0; 8]);
        assert!(!ratio_sampled(&id, 0.0) && ratio_sampled(&id, 1e-18));
        assert!(!ratio_sampled(&id, f64::NAN) && !ratio_sampled(&id, -1.0));
    }

    #[test]
    fn a_quarter_samples_about_a_quarter_and_the_same_trace_each_time() {
        let ids: Vec<[u8; 16]> = (0..10_000).map(|_| new_trace_id()).collect();
        let kept = ids
            .iter()
            .filter(|id| sampled(None, id, 0.25, true))
            .count();
        // Binomial(10 000, 0.25): σ ≈ 43; ±300 is seven of them.
        assert!((2200..=2800).contains(&kept), "{kept}");
        for id in &ids {
            assert_eq!(ratio_sampled(id, 0.25), ratio_sampled(id, 0.25));
        }
    }

    #[test]
    fn the_decision_is_the_one_opentelemetry_makes() {
        // The bound for 0.25 is 2^61; a low half of 0x4000…0 shifts to exactly 2^61, which
        // is not below it, and 0x3f00…0 shifts to less.
        let mut id = [0u8; 16];
        id[8] = 0x40;
        assert!(!ratio_sampled(&id, 0.25));
        id[8] = 0x3f;
        assert!(ratio_sampled(&id, 0.25));
        // The high half plays no part.
        id[..8].copy_from_slice(&[0xff; 8]);
        assert!(ratio_sampled(&id, 0.25));
    }

    #[test]
    fn a_parent_decides_when_parent_based() {
        let id = [0xff; 16];
        assert!(sampled(Some(&parent(true)), &id, 0.0, true));
        assert!(!sampled(Some(&parent(false)), &id, 1.0, true));
        // Without parent_based the ratio decides, parent or not.
        assert!(!sampled(Some(&parent(true)), &id, 0.0, false));
        assert!(sampled(Some(&parent(false)), &id, 1.0, false));
    }
}
