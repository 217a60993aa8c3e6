//! The latency pieces the latency-learning strategies share (`fastest`, `adaptive`,
//! `pipeline`'s latency scorer): a time-decayed EWMA of TTFT, the route's membership mask,
//! and the filter that says which samples may teach.

use std::time::{Duration, Instant};

use rolter_core::Sample;
use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::values::OptionError;

/// The TTFT average's option, `half_life`, flattened into the options of the strategies
/// that keep one (`fastest`, `adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TtftOptions {
    /// Time after which an old TTFT average keeps half its weight against a new sample.
    #[serde(with = "crate::values::duration")]
    pub half_life: Duration,
}

impl Default for TtftOptions {
    fn default() -> Self {
        TtftOptions {
            half_life: Duration::from_secs(10),
        }
    }
}

impl TtftOptions {
    /// The help line of `half_life`.
    pub const HELP: (&'static str, &'static str) = (
        "half_life",
        "time after which an old TTFT average keeps half its weight against a new sample",
    );

    pub fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::positive_duration(errors, "half_life", self.half_life);
    }
}

/// One route's TTFT averages: a [`TtftEwma`] per target, taught by the samples of the
/// route's targets.
pub struct TtftAverages {
    in_route: Vec<bool>,
    ewma: Vec<TtftEwma>,
    half_life_secs: f64,
}

impl TtftAverages {
    pub fn new(opts: TtftOptions, ctx: &BuildContext<'_>) -> Self {
        TtftAverages {
            in_route: route_mask(ctx),
            ewma: vec![TtftEwma::default(); ctx.target_count],
            half_life_secs: opts.half_life.as_secs_f64(),
        }
    }

    /// The target's average.
    #[inline]
    pub fn get(&self, target: usize) -> Option<&TtftEwma> {
        self.ewma.get(target)
    }

    /// Folds in the sample when it may teach the route.
    pub fn observe(&mut self, sample: &Sample) {
        if let Some(ms) = teaching_ttft_ms(sample, &self.in_route) {
            self.ewma[sample.target].update(ms, sample.finished, self.half_life_secs);
        }
    }

    /// The target's average and sample count, for the admin API.
    pub fn learned(&self, target: usize) -> Vec<(&'static str, f64)> {
        self.ewma.get(target).map_or(Vec::new(), |e| e.describe())
    }
}

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
