//! The latency pieces the latency-learning strategies share (`fastest`, `adaptive`,
//! `pipeline`'s latency scorer): a time-decayed EWMA of TTFT, the route's membership mask,
//! and the filter that says which samples may teach.

use std::time::Instant;

use rolter_core::Sample;

use crate::BuildContext;

/// Time-decayed exponentially weighted moving average of one target's TTFT, in ms.
///
/// After `dt` the old value keeps the weight `2^(-dt / half_life)` and the new sample takes
/// the rest; the first sample sets the value. A sample that finished before the latest one
/// already folded in (a late sample from another core) counts with `dt = 0`, so it moves
/// the value by nothing: the average is weighted by time, not by sample count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TtftEwma {
    value_ms: f64,
    last: Option<Instant>,
    samples: u32,
}

impl TtftEwma {
    pub fn update(&mut self, ttft_ms: f64, at: Instant, half_life_secs: f64) {
        match self.last {
            None => {
                self.value_ms = ttft_ms;
                self.last = Some(at);
            }
            Some(prev) => {
                let dt = at.saturating_duration_since(prev).as_secs_f64();
                let keep = if half_life_secs > 0.0 {
                    (-dt / half_life_secs).exp2()
                } else {
                    0.0
                };
                self.value_ms = keep * self.value_ms + (1.0 - keep) * ttft_ms;
                if at > prev {
                    self.last = Some(at);
                }
            }
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// The average and the sample count, for the admin API.
    pub fn describe(&self) -> Vec<(&'static str, f64)> {
        let mut v = vec![("ttft_samples", f64::from(self.samples))];
        if self.samples > 0 {
            v.push(("ttft_ewma_ms", self.value_ms));
        }
        v
    }

    /// The average once at least `min_samples` samples taught it.
    #[inline]
    pub fn value_if(&self, min_samples: u32) -> Option<f64> {
        (self.samples >= min_samples.max(1)).then_some(self.value_ms)
    }
}

/// `mask[target]` is true for the route's targets; sized `target_count`.
pub fn route_mask(ctx: &BuildContext<'_>) -> Vec<bool> {
    let mut mask = vec![false; ctx.target_count];
    for &t in ctx.route_targets {
        if let Some(m) = mask.get_mut(t) {
            *m = true;
        }
    }
    mask
}

/// The sample's TTFT in ms when it may teach this route: a success, with a TTFT, for one of
/// the route's targets.
#[inline]
pub fn teaching_ttft_ms(sample: &Sample, mask: &[bool]) -> Option<f64> {
    if !sample.success || mask.get(sample.target) != Some(&true) {
        return None;
    }
    sample.ttft.map(|d| d.as_secs_f64() * 1000.0)
}
