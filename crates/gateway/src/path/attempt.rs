//! Stage 5 of the request path, the attempt layer: attempts on the chosen targets until one
//! answers the client. Each attempt picks (among the candidates not tried yet), tells the
//! strategy where the request went, loads the model's LoRA adapter there first when the
//! route asks, writes the upstream request and runs the exchange ([`one`]); a failure
//! before any byte reached the client is retried on another target while `retries`, the
//! candidates, the route's `retry_on`, its `deadline` and its retry budget allow, after a
//! jittered back-off ([`after_failure`]). A route with `hedge_after` runs its first attempt
//! through `hedge`, which may race a second one.
//!
//! What the attempts came to is written into the exchange's [`Served`](super::exchange::Served).
//!
//! Owns the retry decision, by the kind of the failure (`retry::reason`); the attempts so
//! far are the exchange's (`exchange::Attempts`). It must not relay bytes itself (that is
//! `relay`) and never retries once the client has seen a byte of the answer.

use std::time::Instant;

use rolter_codec::GatewayError;
use rolter_config::RetryOn;

use super::client::{respond, ClientIo, Fate};
use super::exchange::{Attempted, Exchange, Served, MAX_ATTEMPTS};
use super::pick::Picked;
use super::race::{race, Race};
use super::relay::{self, ClientSide, Explain, Leg, Outcome, Report, TryLimits};
use super::release::Released;
use super::request::IoBufs;
use super::{hedge, queue, record, retry, upstream_request};
use crate::access_log::Flags;
use crate::mesh::Record;

/// What one attempt came to, and the retries it left the request (within the route's and
/// the candidates').
struct Tried {
    attempted: Attempted,
    retries_left: usize,
}

/// Tries targets until the request is answered; the connection's fate afterwards.
pub async fn until_answered(ex: &mut Exchange<'_>, io: &mut ClientIo, bufs: &mut IoBufs) -> Fate {
    ex.state.routes[ex.routed.index]
        .retry_budget
        .request(ex.attempts.started);
    loop {
        // One clock read serves the pick and the routing record (`Picked::at`).
        let pick = queue::pick(ex.state, ex.ask(), ex.attempts.request_end, &io.reader);
        let picked = match pick.await {
            Ok(p) => p,
            Err(e) => return no_candidate(ex, io, bufs, e).await,
        };
        let tried = one(ex, io, bufs, picked).await;
        record::attempt(ex, &tried.attempted);
        note(&mut ex.served, &tried.attempted);
        match tried.attempted.outcome {
            Outcome::Relayed { close } => return if close { Fate::Close } else { Fate::KeepAlive },
            Outcome::ClientGone => {
                ex.served.flags.insert(Flags::DC);
                return Fate::Close;
            }
            Outcome::Failed(e) => match after_failure(ex, io, e, tried.retries_left).await {
                Next::Retry(e) => ex.attempts.last_err = Some(e),
                Next::Answer(e) => return answer(ex, io, bufs, &e).await,
                Next::ClientGone => return Fate::Close,
            },
        }
    }
}

/// No candidate could be picked (`e`): the last failure that allowed a retry is answered,
/// or the pick's own error (no healthy target, a full queue).
pub(super) async fn no_candidate(
    ex: &mut Exchange<'_>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    e: GatewayError,
) -> Fate {
    if e.code == queue::CLIENT_GONE {
        ex.served.flags.insert(Flags::DC);
        return Fate::Close;
    }
    ex.served.flags.insert(match ex.attempts.last_err {
        // Out of candidates after a failure that allowed a retry.
        Some(_) => Flags::URX,
        None if queue::is_overflow(&e) => Flags::UO,
        None => Flags::UH,
    });
    let e = ex.attempts.last_err.take().unwrap_or(e);
    ex.state.record_gateway(e.status, e.code);
    answer(ex, io, bufs, &e).await
}

/// One attempt on the picked target: routed, its adapter loaded, the request built and
/// sent, the response relayed (with a hedge when the route asks), and counted in the
/// exchange's attempts.
async fn one(
    ex: &mut Exchange<'_>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    picked: Picked<'_>,
) -> Tried {
    let (state, routed, now) = (ex.state, ex.routed, picked.at);
    let rs = &state.routes[routed.index];
    let tid = picked.target;
    ex.served.fallback = picked.pick.fallback;
    record::routed(ex, tid, now, picked.pick.score);
    if let Some(loader) = &rs.adapters {
        // Boxed: a LoRA load is a call of its own, on few routes.
        let side = &mut bufs.side;
        let load = loader.ensure(
            &state.upstream,
            &state.links,
            tid,
            ex.pick.model,
            picked.residency,
            side,
        );
        Box::pin(load).await;
    }
    upstream_request::build_leg(&mut bufs.up, ex, tid);
    let retries_left = (routed.route.retries as usize)
        .saturating_sub(ex.attempts.n)
        .min(picked.others);
    let (client, limits) = leg_terms(ex, &picked, retries_left);
    let policy = &routed.route.retry;
    // Hedging: the first attempt only, with room for a second.
    let hedge_after = policy
        .hedge_after
        .filter(|_| ex.attempts.n == 0 && picked.others > 0)
        .and_then(|h| rs.head_times.delay(h));
    let load_at_send = state.load.load(tid);
    let tried = if let Some(after) = hedge_after {
        let first = hedge::First {
            target: tid,
            admitted: picked.admitted,
            load_at_send,
            client,
            // While the legs race, a status the route retries is held back either way.
            limits: TryLimits {
                retry_on: policy.on,
                ..limits
            },
            after,
        };
        // Boxed: two legs' state, and only routes with `hedge_after` need it.
        let hedged = Box::pin(hedge::exchange(ex, io, bufs, first)).await;
        if let Some(other) = hedged.other {
            ex.attempts.push(other);
        }
        Tried {
            attempted: hedged.leg,
            retries_left,
        }
    } else {
        let mut report = Report::default();
        let mut held = Some((
            Released::new(picked.admitted, &state.core.waiters),
            state.load.enter(tid),
        ));
        let leg = Leg {
            state,
            target: tid,
            client,
            limits,
            held: &mut held,
            report: &mut report,
        };
        let outcome = relay::exchange(io, bufs, leg).await;
        drop(held);
        Tried {
            attempted: Attempted {
                target: tid,
                outcome,
                report,
                load_at_send,
            },
            retries_left,
        }
    };
    ex.attempts.push(tried.attempted.target);
    ex.served.attempts = ex.attempts.n as u8;
    tried
}

/// What the relay is told about the client, and what bounds the attempt: the statuses it
/// may still hold back for a retry, its own timeout and the request's deadline.
pub(super) fn leg_terms(
    ex: &Exchange<'_>,
    picked: &Picked<'_>,
    retries_left: usize,
) -> (ClientSide, TryLimits) {
    let (req, attempts) = (ex.req, &ex.attempts);
    let policy = &ex.routed.route.retry;
    let explain = req.header("x-rolter-explain").is_some_and(|v| v == b"1");
    let client = ClientSide {
        http10: req.head.http10,
        close: req.close,
        explain: explain.then_some(Explain {
            route: ex.routed.index,
            score: picked.pick.score,
            fallback: picked.pick.fallback,
            attempt: attempts.n + 1,
        }),
        request_id: req.id,
        surface: req.surface,
    };
    let limits = TryLimits {
        retry_on: if retries_left > 0 && attempts.n + 1 < MAX_ATTEMPTS {
            policy.on
        } else {
            RetryOn::NONE
        },
        per_try_end: policy
            .per_try_timeout
            .map(|p| monoio::time::Instant::from_std(picked.at + p)),
        request_end: attempts.request_end,
    };
    (client, limits)
}

/// Notes a finished attempt in the exchange's record of what the attempts came to.
pub(super) fn note(served: &mut Served, a: &Attempted) {
    let report = &a.report;
    served.target = Some(a.target);
    served.upstream_status = report.status;
    served.status = report.client_status;
    served.first_byte = report.first_byte;
    served.bytes_out += report.bytes_out;
    served.usage = report.usage;
    served.estimated_completion = record::estimated_completion(report);
    if let Some(cut) = report.cut {
        served.flags.insert(cut.flag());
    }
}

/// What follows a failed attempt.
pub(super) enum Next {
    /// Try another target (after the back-off), answering this failure if none is left.
    Retry(GatewayError),
    /// Answer the failure.
    Answer(GatewayError),
    /// The client went away during the back-off.
    ClientGone,
}

/// The retry decision for the failure `e` of an attempt that left `retries_left`: by its
/// kind and the route's `retry_on`, within the retries, the attempts, the deadline and the
/// retry budget, then the back-off.
pub(super) async fn after_failure(
    ex: &mut Exchange<'_>,
    io: &ClientIo,
    e: GatewayError,
    retries_left: usize,
) -> Next {
    let (state, attempts) = (ex.state, &ex.attempts);
    let rs = &state.routes[ex.routed.index];
    let policy = &ex.routed.route.retry;
    let past_end = attempts
        .request_end
        .is_some_and(|end| monoio::time::Instant::now() >= end);
    let reason = retry::reason(&e).filter(|r| policy.on.contains(*r));
    let Some(reason) =
        reason.filter(|_| retries_left > 0 && attempts.n < MAX_ATTEMPTS && !past_end)
    else {
        if attempts.n > 1 {
            ex.served.flags.insert(Flags::URX);
        }
        return Next::Answer(e);
    };
    let route = ex.routed.index as u16;
    // A connection that never opened cost its engine nothing: retrying it elsewhere
    // multiplies no load, so the budget does not count it.
    let free = retry::never_reached(&e);
    if !free
        && !rs
            .retry_budget
            .try_retry(Instant::now(), policy.budget, policy.budget_min)
    {
        state.links.record(Record::RetryBudgetExhausted { route });
        ex.served.flags.insert(Flags::URX);
        return Next::Answer(e);
    }
    state.links.record(Record::Retry {
        route,
        reason: reason.name(),
    });
    let pause = retry::backoff(policy, attempts.n as u32);
    if !pause.is_zero() {
        let wake = monoio::time::Instant::now() + pause;
        if attempts.request_end.is_some_and(|end| wake >= end) {
            // The pause would outlast the request's deadline.
            ex.served.flags.insert(Flags::URX);
            return Next::Answer(e);
        }
        // Racing a future that never ends: only the client or the pause end it.
        if let Race::ClientGone = race(std::future::pending::<()>(), &io.reader, wake).await {
            ex.served.flags.insert(Flags::DC);
            return Next::ClientGone;
        }
    }
    Next::Retry(e)
}

/// Answers the client with the gateway's error `e`, noting it in the exchange's record.
pub(super) async fn answer(
    ex: &mut Exchange<'_>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    e: &GatewayError,
) -> Fate {
    let write_timeout = ex.state.config.server.limits.write_timeout;
    let fate = respond(&mut io.wr, &mut bufs.out, e, ex.req.reply(), write_timeout).await;
    let written = if fate == Fate::KeepAlive {
        bufs.out.len()
    } else {
        // The write failed: the client is gone.
        ex.served.flags.insert(Flags::DC);
        0
    };
    ex.served.answered_error(e, written);
    fate
}
