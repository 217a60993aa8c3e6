//! Admission at the front of the pick: a route's shared queue (`queue_max`,
//! `queue_timeout`) and the request's deadline.
//!
//! A request whose first pick finds every candidate at its `max_concurrent` (or finds
//! others already waiting) takes a seat in the route's queue, one per gateway shared by
//! every worker (`mesh::admission`): beyond `queue_max` waiters it gets a 503 `queue_full`
//! at once, unless it is in line before the last waiter (of an earlier class, or of its
//! class with an earlier fair-share tag), whose seat it then takes (that waiter answers a
//! 503 `displaced`, with `Retry-After`). Waiters are admitted in
//! class order, and within a class by fair queueing between tenants, costed in estimated
//! tokens: only the first in line (of its model) tries, whenever a place is released on
//! this core (`path::release`) and on every signal tick (for places freed on other cores
//! and seats taken over, within 2 ms). A waiter leaves with a 503 `queue_timeout` when
//! `queue_timeout` passes, a 504 `deadline_exceeded` when its deadline does first, and at
//! once when its client disconnects (`path::race`). Only a request's first attempt
//! queues; a retry never waits.
//!
//! On a route with `refuse_unmeetable`, a request with a deadline whose predicted time to
//! first token on every candidate already exceeds what is left of it is refused with a
//! 504 `deadline_unmeetable` before it takes a place.
//!
//! Owns the wait and the deadline checks before a pick. It must not admit by itself (that
//! is `pick`) and takes no lock: the shared state it reads is atomic.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rolter_codec::GatewayError;

use super::pick::{self, Ask, Picked};
use super::race::{race, Race};
use super::reader::Reader;
use crate::mesh::admission::{Joined, SharedQueue, Ticket};
use crate::mesh::Record;
use crate::path::state::WorkerState;

/// The code of the error a waiter whose client went away returns (never written).
pub const CLIENT_GONE: &str = "client_gone_while_queued";

/// The completion tokens a request that sets no `max_tokens` is costed at in fair
/// queueing.
pub const COMPLETION_ESTIMATE: u64 = 256;

/// Whether `e` says every candidate was full: at once, or after the route's queue was full
/// or its wait timed out, or the request was displaced (the access log's `UO`, overflow).
pub fn is_overflow(e: &GatewayError) -> bool {
    e.message == pick::ALL_FULL || matches!(e.code, "queue_full" | "queue_timeout" | "displaced")
}

/// Picks a target; on a route with a queue, waits for a place when every candidate is
/// full or others wait (see the module's documentation). `deadline` is the request's.
pub async fn pick<'s>(
    state: &'s WorkerState,
    ask: Ask<'_>,
    deadline: Option<monoio::time::Instant>,
    client: &Reader,
) -> Result<Picked<'s>, GatewayError> {
    let now = Instant::now();
    let routed = ask.routed;
    if routed.route.admission.refuse_unmeetable {
        refuse_unmeetable(state, ask, deadline, now)?;
    }
    let queue = state
        .queues
        .route(routed.index)
        .filter(|_| ask.tried.is_empty());
    let Some(queue) = queue else {
        return pick::pick(state, ask, now).await;
    };
    if !queue.busy() {
        match pick::pick(state, ask, now).await {
            Err(e) if e.message == pick::ALL_FULL => {}
            other => return other,
        }
    }
    wait(state, ask, queue, deadline, client).await
}

/// 504 `deadline_unmeetable` when no candidate is predicted to answer within `deadline`.
fn refuse_unmeetable(
    state: &WorkerState,
    ask: Ask<'_>,
    deadline: Option<monoio::time::Instant>,
    now: Instant,
) -> Result<(), GatewayError> {
    let Some(end) = deadline else {
        return Ok(());
    };
    let Some(predicted) = pick::predicted_ttft_ms(state, ask, now) else {
        return Ok(());
    };
    let left = end.into_std().saturating_duration_since(now);
    if predicted <= left.as_secs_f64() * 1e3 {
        return Ok(());
    }
    state.links.record(Record::Queue {
        route: ask.routed.index as u16,
        class: ask.admit.class as u8,
        tenant: ask.admit.tenant as u32,
        result: result::UNMEETABLE,
        waited: Duration::ZERO,
    });
    Err(GatewayError::internal(
        504,
        "deadline_unmeetable",
        format!(
            "no target is predicted to answer within the request's deadline: the fastest is predicted at {predicted:.0} ms to the first token, {} ms are left",
            left.as_millis()
        ),
    ))
}

/// Takes a seat in `queue` and waits for this request's turn and a place.
async fn wait<'s>(
    state: &'s WorkerState,
    ask: Ask<'_>,
    queue: &SharedQueue,
    deadline: Option<monoio::time::Instant>,
    client: &Reader,
) -> Result<Picked<'s>, GatewayError> {
    let (routed, admit, preq) = (ask.routed, ask.admit, ask.preq);
    let q = routed
        .route
        .queue
        .expect("a route with a shared queue has queue_max");
    if queue.waiting() >= q.max {
        // A full queue: a place this request may take now (one its class reserves, which
        // no waiter of a later class can use) is taken without displacing anyone.
        match pick::pick(state, ask, Instant::now()).await {
            Err(e) if e.message == pick::ALL_FULL => {}
            other => return other,
        }
    }
    let cost = u64::from(preq.prompt_tokens) + preq.max_tokens.unwrap_or(COMPLETION_ESTIMATE);
    let model = xxhash_rust::xxh3::xxh3_64(preq.model.as_bytes()) as u32;
    let ticket = match queue.join(admit.rank, (admit.tenant, admit.share), cost, model) {
        Joined::Seated(t) | Joined::Displaced(t) => t,
        Joined::Full => {
            state.links.record(Record::Queue {
                route: routed.index as u16,
                class: admit.class as u8,
                tenant: admit.tenant as u32,
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
    };
    let mut waiting = Waiting::enter(state, ask, ticket);
    let timeout = monoio::time::Instant::now() + q.timeout;
    let end = deadline.map_or(timeout, |d| d.min(timeout));
    loop {
        // Made before the checks, so a release between them and the wait still wakes it.
        let wake = state.core.waiters.next_wake();
        if !waiting.ticket.is_seated() {
            waiting.result = result::DISPLACED;
            return Err(GatewayError::internal(
                503,
                "displaced",
                "the route's queue was full and a request ahead of this one (of an earlier class, or of a tenant within its fair share) took its place",
            )
            .with_retry_after(1));
        }
        if waiting.ticket.is_first() {
            match pick::pick(state, ask, Instant::now()).await {
                Ok(p) => {
                    waiting.ticket.admitted();
                    waiting.result = result::ADMITTED;
                    ask_waited(ask, waiting.since.elapsed());
                    return Ok(p);
                }
                Err(e) if e.message == pick::ALL_FULL => {}
                Err(e) => {
                    waiting.result = result::UNAVAILABLE;
                    return Err(e);
                }
            }
        }
        match race(wake, client, end).await {
            Race::Done(()) => {}
            Race::ClientGone => {
                waiting.result = result::CLIENT_GONE;
                return Err(GatewayError::internal(
                    499,
                    CLIENT_GONE,
                    "the client went away while its request waited for a place",
                ));
            }
            Race::TimedOut => {
                ask_waited(ask, waiting.since.elapsed());
                if end < timeout {
                    waiting.result = result::DEADLINE;
                    return Err(deadline_exceeded());
                }
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

/// Notes the queue wait for the request's access-log entry.
fn ask_waited(ask: Ask<'_>, waited: Duration) {
    if let Some(cell) = ask.waited {
        cell.set(waited);
    }
}

/// The 504 when the request's deadline passed before it could be answered.
pub fn deadline_exceeded() -> GatewayError {
    GatewayError::internal(
        504,
        "deadline_exceeded",
        "the request's deadline passed before a target could take it",
    )
}

/// How a request's time in a queue ended (`rolter_queue_requests_total{result}`): it got a
/// place, `queue_timeout` passed, its deadline passed, the queue was full (a 503 at once,
/// no wait), a request of a higher class took its seat, the client disconnected, the
/// targets became unavailable otherwise (unhealthy, drained), or the request went away
/// otherwise (the gateway stopping); or it never queued, its deadline unmeetable.
pub mod result {
    pub const ADMITTED: &str = "admitted";
    pub const TIMEOUT: &str = "timeout";
    pub const DEADLINE: &str = "deadline_exceeded";
    pub const OVERFLOW: &str = "overflow";
    pub const DISPLACED: &str = "displaced";
    pub const CLIENT_GONE: &str = "client_gone";
    pub const UNAVAILABLE: &str = "unavailable";
    pub const DROPPED: &str = "dropped";
    pub const UNMEETABLE: &str = "deadline_unmeetable";
}

/// A request in a route's queue on this core: counted on entry, and on leaving (however it
/// leaves) its result and wait are reported to the control thread.
struct Waiting<'s, 'q> {
    state: &'s WorkerState,
    ticket: Ticket<'q>,
    _core: crate::path::release::Queued<'s>,
    queued: &'s Cell<usize>,
    route: u16,
    class: u8,
    tenant: u32,
    since: Instant,
    result: &'static str,
}

impl<'s, 'q> Waiting<'s, 'q> {
    fn enter(state: &'s WorkerState, ask: Ask<'_>, ticket: Ticket<'q>) -> Self {
        let route = ask.routed.index as u16;
        let class = ask.admit.class as u8;
        let queued = &state.routes[ask.routed.index].queued;
        queued.set(queued.get() + 1);
        state.links.record(Record::Queued { route, class });
        Waiting {
            state,
            ticket,
            _core: state.core.waiters.enter(),
            queued,
            route,
            class,
            tenant: ask.admit.tenant as u32,
            since: Instant::now(),
            result: result::DROPPED,
        }
    }
}

impl Drop for Waiting<'_, '_> {
    fn drop(&mut self) {
        self.queued.set(self.queued.get() - 1);
        self.state.links.record(Record::Queue {
            route: self.route,
            class: self.class,
            tenant: self.tenant,
            result: self.result,
            waited: self.since.elapsed(),
        });
    }
}
