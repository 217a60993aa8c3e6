//! A route's recent times from sending a request to its response head, on one core, and
//! the percentile a `hedge_after = "pNN"` reads from them (`path::hedge`).
//!
//! Owns the histogram only. It must not decide whether to hedge, and it is never shared
//! with another core.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use rolter_config::HedgeAfter;

/// Send-to-head times a route must have seen on a core before a percentile `hedge_after`
/// hedges there.
pub const MIN_SAMPLES: u32 = 20;

/// Buckets of [`HeadTimes`]: quarter octaves from 1 ms, up to about 4.8 minutes.
const BUCKETS: usize = 72;
/// Counts are halved when they reach this many, so the percentile follows the present.
const DECAY_AT: u32 = 2048;
/// The cached percentile is computed again after this many new times.
const REFRESH_EVERY: u32 = 16;

/// A route's recent times from sending a request to its response head, on one core: a
/// histogram of quarter-octave buckets (a percentile read from it is within 19 % of the
/// true one), decayed by halving.
#[derive(Debug)]
pub struct HeadTimes {
    counts: RefCell<[u32; BUCKETS]>,
    total: Cell<u32>,
    fresh: Cell<u32>,
    /// The last percentile computed, and for which percentile.
    cached: Cell<Option<(f64, Duration)>>,
}

impl Default for HeadTimes {
    fn default() -> Self {
        HeadTimes {
            counts: RefCell::new([0; BUCKETS]),
            total: Cell::new(0),
            fresh: Cell::new(0),
            cached: Cell::new(None),
        }
    }
}

impl HeadTimes {
    /// Notes one send-to-head time.
    pub fn note(&self, t: Duration) {
        let ms = t.as_secs_f64() * 1000.0;
        let i = if ms <= 1.0 {
            0
        } else {
            ((ms.log2() * 4.0) as usize + 1).min(BUCKETS - 1)
        };
        let mut counts = self.counts.borrow_mut();
        counts[i] += 1;
        let mut total = self.total.get() + 1;
        if total >= DECAY_AT {
            total = 0;
            for c in counts.iter_mut() {
                *c /= 2;
                total += *c;
            }
        }
        self.total.set(total);
        self.fresh.set(self.fresh.get() + 1);
    }

    /// The `p`th percentile (upper bound of its bucket), once [`MIN_SAMPLES`] are known.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let total = self.total.get();
        if total < MIN_SAMPLES {
            return None;
        }
        if let Some((cp, d)) = self.cached.get() {
            if cp == p && self.fresh.get() < REFRESH_EVERY {
                return Some(d);
            }
        }
        let rank = ((p / 100.0) * f64::from(total)).ceil().max(1.0) as u32;
        let counts = self.counts.borrow();
        let mut seen = 0;
        let mut bucket = BUCKETS - 1;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                bucket = i;
                break;
            }
        }
        // Bucket i > 0 holds times up to 2^(i/4) ms.
        let d = Duration::from_secs_f64(2f64.powf(bucket as f64 / 4.0) / 1000.0);
        self.cached.set(Some((p, d)));
        self.fresh.set(0);
        Some(d)
    }

    /// How long after the first attempt starts a hedge follows, when it does.
    pub fn delay(&self, after: HedgeAfter) -> Option<Duration> {
        match after {
            HedgeAfter::Delay(d) => Some(d),
            HedgeAfter::Percentile(p) => self.percentile(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_percentile_before_enough_times() {
        let h = HeadTimes::default();
        for _ in 0..MIN_SAMPLES - 1 {
            h.note(ms(10));
        }
        assert_eq!(h.percentile(95.0), None);
        assert_eq!(h.delay(HedgeAfter::Delay(ms(300))), Some(ms(300)));
        h.note(ms(10));
        let p = h.percentile(95.0).unwrap();
        // Within the bucket's quarter octave above the true value.
        assert!(p >= ms(10) && p <= ms(12), "{p:?}");
    }

    #[test]
    fn percentile_splits_a_mixed_route() {
        let h = HeadTimes::default();
        // 90 fast heads, 10 slow ones.
        for i in 0..100 {
            h.note(if i % 10 == 0 { ms(800) } else { ms(20) });
        }
        let p50 = h.percentile(50.0).unwrap();
        assert!(p50 >= ms(20) && p50 <= ms(24), "{p50:?}");
        let p95 = h.percentile(95.0).unwrap();
        assert!(p95 >= ms(800) && p95 <= ms(952), "{p95:?}");
        // Sub-millisecond heads land in the first bucket.
        let fast = HeadTimes::default();
        for _ in 0..MIN_SAMPLES {
            fast.note(Duration::from_micros(200));
        }
        assert_eq!(fast.percentile(99.0), Some(ms(1)));
    }

    #[test]
    fn old_times_fade() {
        let h = HeadTimes::default();
        for _ in 0..DECAY_AT {
            h.note(ms(500));
        }
        // The route became fast: after a few halvings the percentile follows.
        for _ in 0..4 * DECAY_AT {
            h.note(ms(5));
        }
        let p = h.percentile(90.0).unwrap();
        assert!(p <= ms(6), "{p:?}");
    }
}
