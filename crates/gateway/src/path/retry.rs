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

use rolter_codec::{GatewayError, UpstreamFailure};
use rolter_config::{RetryPolicy, RetryReason};

/// Length of the budget's window, in one-second slots.
pub const WINDOW_SECS: u64 = 10;

/// The `retry_on` reason of a failed attempt; `None` for a failure never retried (a
/// malformed response, a close inside the response head, a cut stream) and for the
/// client's and the gateway's own errors.
pub fn reason(e: &GatewayError) -> Option<RetryReason> {
    reason_of(e.upstream?)
}

/// The `retry_on` reason of an upstream failure of kind `f`.
pub fn reason_of(f: UpstreamFailure) -> Option<RetryReason> {
    match f {
        UpstreamFailure::ConnectFailed
        | UpstreamFailure::ConnectTimeout
        | UpstreamFailure::TlsFailed => Some(RetryReason::ConnectFailure),
        UpstreamFailure::WriteFailed | UpstreamFailure::ClosedBeforeResponse => {
            Some(RetryReason::ResetBeforeResponse)
        }
        UpstreamFailure::Refused(status) => RetryReason::for_status(status),
        UpstreamFailure::FirstByteTimeout => Some(RetryReason::FirstByteTimeout),
        UpstreamFailure::ClosedInHead
        | UpstreamFailure::BadResponse
        | UpstreamFailure::StreamInterrupted => None,
    }
}

/// Whether the failed attempt never reached its engine (the connection was refused or
/// timed out): its retry is not charged to the budget.
pub fn never_reached(e: &GatewayError) -> bool {
    e.upstream.is_some_and(UpstreamFailure::never_reached)
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
    fn every_failure_kind_has_its_retry_verdict() {
        use UpstreamFailure as F;
        let verdicts: Vec<(F, Option<RetryReason>)> =
            F::ALL.iter().map(|&f| (f, reason_of(f))).collect();
        assert_eq!(
            verdicts,
            [
                (F::ConnectFailed, Some(RetryReason::ConnectFailure)),
                (F::ConnectTimeout, Some(RetryReason::ConnectFailure)),
                (F::TlsFailed, Some(RetryReason::ConnectFailure)),
                (F::WriteFailed, Some(RetryReason::ResetBeforeResponse)),
                (
                    F::ClosedBeforeResponse,
                    Some(RetryReason::ResetBeforeResponse)
                ),
                (F::ClosedInHead, None),
                (F::Refused(429), Some(RetryReason::Status429)),
                (F::Refused(503), Some(RetryReason::Status503)),
                (F::FirstByteTimeout, Some(RetryReason::FirstByteTimeout)),
                (F::BadResponse, None),
                (F::StreamInterrupted, None),
            ]
        );
        // A retry that reason allows is one the kind's own verdict allows, but for the
        // first-byte timeout, which a route opts into.
        for f in F::ALL {
            if reason_of(f).is_some() && f != F::FirstByteTimeout {
                assert_eq!(f.retry(), rolter_codec::Retry::Allowed, "{f:?}");
            }
        }
        assert_eq!(reason(&GatewayError::client(400, "bad_request", "x")), None);
        assert!(never_reached(&GatewayError::upstream(
            F::ConnectTimeout,
            "x"
        )));
        assert!(!never_reached(&GatewayError::upstream(F::WriteFailed, "x")));
        assert!(!never_reached(&GatewayError::internal(
            503,
            "no_capacity",
            "x"
        )));
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
