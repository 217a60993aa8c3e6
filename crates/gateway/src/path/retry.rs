//! The retry policy's pieces on a worker core: which `retry_on` reason a failed attempt
//! gives, the route's retry budget on this core, and the back-off before the next attempt.
//!
//! The budget is per core and per route over a sliding window of [`WINDOW_SECS`] one-second
//! slots: a retry is allowed while the retries of the window stay below
//! `max(retry_budget_min, retry_budget × requests of the window)`. Retries of attempts that
//! never reached their engine (refused or timed-out connects) are not charged. It must not decide
//! whether a byte reached the client (the attempt stage knows) nor touch another core.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rolter_codec::{GatewayError, Retry};
use rolter_config::{RetryPolicy, RetryReason};

/// Length of the budget's window, in one-second slots.
pub const WINDOW_SECS: u64 = 10;

/// The `retry_on` reason of a failed attempt; `None` for a failure never retried (a
/// malformed response, a reset after a response byte).
pub fn reason(e: &GatewayError) -> Option<RetryReason> {
    match e.code {
        "upstream_connect_failed" | "upstream_connect_timeout" | "upstream_tls_failed" => {
            Some(RetryReason::ConnectFailure)
        }
        "upstream_write_failed" => Some(RetryReason::ResetBeforeResponse),
        "upstream_closed" if e.retry == Retry::Allowed => Some(RetryReason::ResetBeforeResponse),
        "upstream_unavailable" => RetryReason::for_status(e.status),
        "upstream_timeout" => Some(RetryReason::FirstByteTimeout),
        _ => None,
    }
}

/// Whether the failed attempt never reached its engine (the connection was refused or
/// timed out): its retry is not charged to the budget.
pub fn never_reached(e: &GatewayError) -> bool {
    matches!(
        e.code,
        "upstream_connect_failed" | "upstream_connect_timeout"
    )
}

/// The pause before retry number `n` (1 = the first retry): full jitter over
/// `min(backoff_max, backoff × 2^(n-1))`.
pub fn backoff(policy: &RetryPolicy, n: u32) -> Duration {
    let ceiling = policy
        .backoff
        .saturating_mul(1u32 << n.saturating_sub(1).min(20))
        .min(policy.backoff_max);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(fastrand::u64(0..=nanos))
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    /// The second (since the budget's start) this slot counts; older counts are stale.
    sec: u64,
    requests: u32,
    retries: u32,
}

/// One route's retry budget on one core.
#[derive(Debug)]
pub struct RetryBudget {
    start: Instant,
    slots: [Cell<Slot>; WINDOW_SECS as usize],
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl RetryBudget {
    pub fn new(start: Instant) -> Self {
        RetryBudget {
            start,
            slots: Default::default(),
        }
    }

    fn sec(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_secs()
    }

    /// The current second's slot, emptied when it last counted an older second.
    fn current(&self, sec: u64) -> &Cell<Slot> {
        let cell = &self.slots[(sec % WINDOW_SECS) as usize];
        if cell.get().sec != sec {
            cell.set(Slot {
                sec,
                ..Slot::default()
            });
        }
        cell
    }

    /// Counts a request arriving on the route.
    pub fn request(&self, now: Instant) {
        let cell = self.current(self.sec(now));
        let mut s = cell.get();
        s.requests = s.requests.saturating_add(1);
        cell.set(s);
    }

    /// Whether one more retry fits the budget; counts it when it does.
    pub fn try_retry(&self, now: Instant, share: f64, floor: u32) -> bool {
        let sec = self.sec(now);
        let cell = self.current(sec);
        let (mut requests, mut retries) = (0u64, 0u64);
        for slot in &self.slots {
            let s = slot.get();
            if s.sec + WINDOW_SECS > sec && s.sec <= sec {
                requests += u64::from(s.requests);
                retries += u64::from(s.retries);
            }
        }
        let allowed = ((share * requests as f64).floor() as u64).max(u64::from(floor));
        if retries >= allowed {
            return false;
        }
        let mut s = cell.get();
        s.retries = s.retries.saturating_add(1);
        cell.set(s);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rolter_codec::Retry;

    #[test]
    fn the_floor_then_the_share_of_the_window() {
        let t0 = Instant::now();
        let b = RetryBudget::new(t0);
        // A quiet route: the floor alone.
        b.request(t0);
        assert!(b.try_retry(t0, 0.2, 3));
        assert!(b.try_retry(t0, 0.2, 3));
        assert!(b.try_retry(t0, 0.2, 3));
        assert!(!b.try_retry(t0, 0.2, 3));
        // 50 requests: 20 % of them is 10 retries in all.
        for _ in 1..50 {
            b.request(t0);
        }
        let more = (0..20).filter(|_| b.try_retry(t0, 0.2, 3)).count();
        assert_eq!(more, 7);
        // The window slides: eleven seconds later the old counts are gone.
        let later = t0 + Duration::from_secs(11);
        assert!(b.try_retry(later, 0.2, 3));
        assert!(b.try_retry(later, 0.2, 3));
        assert!(b.try_retry(later, 0.2, 3));
        assert!(!b.try_retry(later, 0.2, 3));
    }

    #[test]
    fn no_budget_means_no_retry() {
        let t0 = Instant::now();
        let b = RetryBudget::new(t0);
        b.request(t0);
        assert!(!b.try_retry(t0, 0.0, 0));
    }

    #[test]
    fn failures_map_to_retry_on_words() {
        let up = |status, retry, code| GatewayError::upstream(status, retry, code, "x");
        assert_eq!(
            reason(&up(502, Retry::Allowed, "upstream_connect_failed")),
            Some(RetryReason::ConnectFailure)
        );
        assert_eq!(
            reason(&up(502, Retry::Allowed, "upstream_closed")),
            Some(RetryReason::ResetBeforeResponse)
        );
        assert_eq!(reason(&up(502, Retry::Forbidden, "upstream_closed")), None);
        assert_eq!(
            reason(&up(429, Retry::Allowed, "upstream_unavailable")),
            Some(RetryReason::Status429)
        );
        assert_eq!(
            reason(&up(504, Retry::Forbidden, "upstream_timeout")),
            Some(RetryReason::FirstByteTimeout)
        );
        assert_eq!(
            reason(&up(502, Retry::Forbidden, "upstream_bad_response")),
            None
        );
    }

    #[test]
    fn backoff_is_jittered_under_its_cap() {
        let p = RetryPolicy::default();
        for n in 1..12 {
            let d = backoff(&p, n);
            let cap = (p.backoff * (1 << (n - 1))).min(p.backoff_max);
            assert!(d <= cap, "retry {n}: {d:?} over {cap:?}");
        }
        let zero = RetryPolicy {
            backoff: Duration::ZERO,
            ..RetryPolicy::default()
        };
        assert_eq!(backoff(&zero, 3), Duration::ZERO);
    }
}
