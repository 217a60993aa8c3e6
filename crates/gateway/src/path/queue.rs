//! A route's bounded queue (`queue_max`, `queue_timeout`): a request whose first pick finds
//! every candidate at its `max_concurrent` waits for a place instead of a 503 at once.
//!
//! The queue is per core: each worker holds at most `ceil(queue_max / workers)` waiting
//! requests of a route, beyond which the request gets a 503 `queue_full` at once. Waiters
//! try admission again, in arrival order, whenever a place is released on this core
//! (`path::release`) and on every signal tick (for places freed on other cores, within
//! 2 ms). A waiter gets its place when its pick succeeds, a 503 `queue_timeout` with
//! `Retry-After` when `queue_timeout` passes, and leaves the queue at once when its
//! client disconnects (the connection's disconnect watch, `path::race`). Only a request's
//! first attempt queues; a retry never waits.
//!
//! Owns the wait. It must not admit by itself (that is `pick`) and takes no lock: the
//! only shared state it reads is the admission counters through `pick`.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rolter_codec::GatewayError;

use super::pick::{self, Ask, Picked};
use super::race::{race, Race};
use super::reader::Reader;
use crate::mesh::Record;
use crate::path::state::WorkerState;

/// The code of the error a waiter whose client went away returns (never written).
pub const CLIENT_GONE: &str = "client_gone_while_queued";

/// Whether `e` says every candidate was full: at once, or after the route's queue was full
/// or its wait timed out (the access log's `UO`, overflow).
pub fn is_overflow(e: &GatewayError) -> bool {
    e.message == pick::ALL_FULL || matches!(e.code, "queue_full" | "queue_timeout")
}

/// Picks a target; on a route with a queue, waits for a place when every candidate is
/// full (see the module's documentation).
pub async fn pick<'s>(
    state: &'s WorkerState,
    ask: Ask<'_>,
    now: Instant,
    client: &Reader,
) -> Result<Picked<'s>, GatewayError> {
    let first = pick::pick(state, ask, now).await;
    let routed = ask.routed;
    let Some(q) = routed.route.queue.filter(|_| ask.tried.is_empty()) else {
        return first;
    };
    match first {
        Err(e) if e.message == pick::ALL_FULL => {}
        other => return other,
    }
    let rs = &state.routes[routed.index];
    let per_core = q.max.div_ceil(state.config.server.workers.max(1));
    let route = routed.index as u16;
    if rs.queued.get() >= per_core {
        state.links.record(Record::Queue {
            route,
            result: result::OVERFLOW,
            waited: Duration::ZERO,
        });
        return Err(GatewayError::internal(
            503,
            "queue_full",
            "every target for this model is at its max_concurrent limit and the route's queue is full (queue_max)",
        )
        .with_retry_after(1));
    }
    let mut waiting = Waiting::enter(state, &rs.queued, route);
    let deadline = monoio::time::Instant::now() + q.timeout;
    loop {
        let wake = state.core.waiters.next_wake();
        match race(wake, client, deadline).await {
            Race::Done(()) => match pick::pick(state, ask, Instant::now()).await {
                Ok(p) => {
                    waiting.result = result::ADMITTED;
                    return Ok(p);
                }
                Err(e) if e.message == pick::ALL_FULL => {}
                Err(e) => {
                    waiting.result = result::UNAVAILABLE;
                    return Err(e);
                }
            },
            Race::ClientGone => {
                waiting.result = result::CLIENT_GONE;
                return Err(GatewayError::internal(
                    499,
                    CLIENT_GONE,
                    "the client went away while its request waited for a place",
                ));
            }
            Race::TimedOut => {
                waiting.result = result::TIMEOUT;
                let secs = q.timeout.as_secs().max(1);
                return Err(GatewayError::internal(
                    503,
                    "queue_timeout",
                    "every target for this model stayed at its max_concurrent limit for the route's queue_timeout",
                )
                .with_retry_after(secs));
            }
        }
    }
}

/// How a request's time in a queue ended (`rolter_queue_requests_total{result}`): it got a
/// place, `queue_timeout` passed, the queue was full (a 503 at once, no wait), the client
/// disconnected, the targets became unavailable otherwise (unhealthy, drained), or the
/// request went away otherwise (the gateway stopping).
pub mod result {
    pub const ADMITTED: &str = "admitted";
    pub const TIMEOUT: &str = "timeout";
    pub const OVERFLOW: &str = "overflow";
    pub const CLIENT_GONE: &str = "client_gone";
    pub const UNAVAILABLE: &str = "unavailable";
    pub const DROPPED: &str = "dropped";
}

/// A request in a route's queue on this core: counted on entry, and on leaving (however it
/// leaves) its result and wait are reported to the control thread.
struct Waiting<'s> {
    state: &'s WorkerState,
    queued: &'s Cell<usize>,
    _core: crate::path::release::Queued<'s>,
    route: u16,
    since: Instant,
    result: &'static str,
}

impl<'s> Waiting<'s> {
    fn enter(state: &'s WorkerState, queued: &'s Cell<usize>, route: u16) -> Self {
        queued.set(queued.get() + 1);
        state.links.record(Record::Queued { route });
        Waiting {
            state,
            queued,
            _core: state.core.waiters.enter(),
            route,
            since: Instant::now(),
            result: result::DROPPED,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.queued.set(self.queued.get() - 1);
        self.state.links.record(Record::Queue {
            route: self.route,
            result: self.result,
            waited: self.since.elapsed(),
        });
    }
}
