//! Stage 5 of the request path: attempts on the chosen targets until one answers the client. Each
//! attempt picks (among the candidates not tried yet), tells the strategy where the request
//! went, loads the model's LoRA adapter there first when the route asks, writes the
//! upstream request and runs the exchange; a failure before any byte reached the client is
//! retried on another target while `retries`, the candidates, the route's `retry_on`, its
//! `deadline` and its retry budget allow, after a jittered back-off. A route with
//! `hedge_after` runs its first attempt through `hedge`, which may race a second one.
//!
//! What the attempts came to (the last target, statuses, flags, timings, tokens) is kept
//! in a [`Served`] for the request's access-log entry.
//!
//! Owns the retry decision. It must not relay bytes itself (that is `relay`) and never
//! retries once the client has seen a byte of the answer.

use std::time::Instant;

use rolter_codec::GatewayError;
use rolter_config::RetryOn;
use rolter_core::{PickRequest, Usage};

use super::client::{respond, ClientIo, Fate};
use super::inputs::Inputs;
use super::race::{race, Race};
use super::relay::{self, ClientSide, Explain, Outcome, Report, TryLimits};
use super::release::Released;
use super::request::{IoBufs, Request};
use super::route::Routed;
use super::{hedge, queue, record, retry, upstream_request};
use crate::access_log::Flags;
use crate::mesh::Record;
use crate::path::state::WorkerState;

/// What a request's attempts came to, for its access-log entry.
#[derive(Debug, Default, Clone, Copy)]
pub struct Served {
    pub attempts: u8,
    /// The last target tried.
    pub target: Option<usize>,
    /// The last upstream response status (0: none).
    pub upstream_status: u16,
    /// The status the client received (0: none).
    pub status: u16,
    pub flags: Flags,
    /// The gateway's error code when it answered with an error itself.
    pub error: Option<&'static str>,
    /// When the first response body byte arrived from the target that answered.
    pub first_byte: Option<Instant>,
    pub bytes_out: u64,
    pub usage: Option<Usage>,
    /// Completion tokens counted from the stream when it reported no usage.
    pub estimated_completion: u32,
    pub fallback: Option<&'static str>,
}

impl Served {
    /// The gateway answered `e` itself (`bytes_out` written, 0 when the write failed).
    fn answered_error(&mut self, e: &GatewayError, bytes_out: usize) {
        self.status = e.status;
        self.error = Some(e.code);
        self.flags.insert(Flags::for_error(e));
        self.bytes_out += bytes_out as u64;
    }
}

/// Most attempts one request can make (first try plus the largest `retries`).
const MAX_ATTEMPTS: usize = 11;

/// Tries targets until the request is answered; the connection's fate afterwards.
#[allow(clippy::too_many_arguments)]
pub async fn until_answered(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    routed: &Routed<'_>,
    inputs: &Inputs,
    preq: &PickRequest<'_>,
    served: &mut Served,
) -> Fate {
    let write_timeout = state.config.server.limits.write_timeout;
    let explain = req.header("x-rolter-explain").is_some_and(|v| v == b"1");
    let rs = &state.routes[routed.index];
    let policy = &routed.route.retry;
    let start = Instant::now();
    let request_end = policy
        .deadline
        .map(|d| monoio::time::Instant::from_std(start + d));
    rs.retry_budget.request(start);
    let mut tried = [usize::MAX; MAX_ATTEMPTS];
    let mut attempts = 0usize;
    let mut last_err: Option<GatewayError> = None;
    loop {
        // One clock read serves the pick and the routing record.
        let now = Instant::now();
        let picked =
            match queue::pick(state, routed, preq, &tried[..attempts], now, &io.reader).await {
                Ok(p) => p,
                Err(e) if e.code == queue::CLIENT_GONE => {
                    served.flags.insert(Flags::DC);
                    return Fate::Close;
                }
                Err(e) => {
                    if last_err.is_none() {
                        served.flags.insert(if queue::is_overflow(&e) {
                            Flags::UO
                        } else {
                            Flags::UH
                        });
                    } else {
                        // Out of candidates after a failure that allowed a retry.
                        served.flags.insert(Flags::URX);
                    }
                    let e = last_err.take().unwrap_or(e);
                    state.record_gateway(e.status, e.code);
                    return answer(io, bufs, &e, req, served, write_timeout).await;
                }
            };
        let tid = picked.target;
        served.fallback = picked.pick.fallback;
        record::routed(state, routed, preq, inputs, tid, now);
        if let Some(loader) = &rs.adapters {
            // Boxed: a LoRA load is a call of its own, on few routes.
            Box::pin(loader.ensure(
                &state.upstream,
                &state.links,
                tid,
                preq.model,
                picked.residency,
                &mut bufs.side,
            ))
            .await;
        }
        let retries_left = (routed.route.retries as usize)
            .saturating_sub(attempts)
            .min(picked.others);
        let target = &state.config.targets[tid];
        upstream_request::build(
            &mut bufs.up,
            req,
            &routed.facts,
            routed.route,
            target,
            routed.key_header,
        );
        let load_at_send = state.load.load(tid);
        let client = ClientSide {
            http10: req.head.http10,
            close: req.close,
            explain: explain.then_some(Explain {
                route: routed.index,
                score: picked.pick.score,
                fallback: picked.pick.fallback,
                attempt: attempts + 1,
            }),
            request_id: req.id,
            surface: req.surface,
        };
        let limits = TryLimits {
            retry_on: if retries_left > 0 && attempts + 1 < MAX_ATTEMPTS {
                policy.on
            } else {
                RetryOn::NONE
            },
            per_try_end: policy
                .per_try_timeout
                .map(|p| monoio::time::Instant::from_std(now + p)),
            request_end,
        };
        // Hedging: the first attempt only, with room for a second.
        let hedge_after = policy
            .hedge_after
            .filter(|_| attempts == 0 && picked.others > 0)
            .and_then(|h| rs.head_times.delay(h));
        let (tid, outcome, report, load_at_send) = if let Some(after) = hedge_after {
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
            };
            // Boxed: two legs' state, and only routes with `hedge_after` need it.
            let hedged = Box::pin(hedge::exchange(
                state, io, req, bufs, routed, inputs, preq, first, after,
            ))
            .await;
            if let Some(other) = hedged.other {
                tried[attempts] = other;
                attempts += 1;
            }
            let leg = hedged.leg;
            (leg.target, leg.outcome, leg.report, leg.load_at_send)
        } else {
            let mut report = Report::default();
            let admitted = picked.admitted;
            // The target's place under `max_concurrent` and its in-flight count are held
            // for exactly this exchange: released once the engine is done (before the last
            // bytes reach the client), or when the exchange ends, however it ends (the
            // future dropped included).
            let mut held = Some((
                Released::new(admitted, &state.core.waiters),
                state.load.enter(tid),
            ));
            let outcome = relay::exchange(
                state,
                tid,
                &mut io.wr,
                &io.reader,
                bufs,
                client,
                limits,
                &mut held,
                &mut report,
            )
            .await;
            drop(held);
            (tid, outcome, report, load_at_send)
        };
        record::attempt(
            state,
            routed.index,
            tid,
            preq,
            &outcome,
            &report,
            load_at_send,
        );
        record::cooling(state, tid, report.wait, policy);
        tried[attempts] = tid;
        attempts += 1;
        served.attempts = attempts as u8;
        served.target = Some(tid);
        served.upstream_status = report.status;
        served.status = report.client_status;
        served.first_byte = report.first_byte;
        served.bytes_out += report.bytes_out;
        served.usage = report.usage;
        served.estimated_completion = record::estimated_completion(&report);
        if let Some(cut) = report.cut {
            served.flags.insert(cut.flag());
        }
        match outcome {
            Outcome::Relayed { close } => return if close { Fate::Close } else { Fate::KeepAlive },
            Outcome::ClientGone => {
                served.flags.insert(Flags::DC);
                return Fate::Close;
            }
            Outcome::Failed(e) => {
                let reason = retry::reason(&e).filter(|r| policy.on.contains(*r));
                let past_end = request_end.is_some_and(|end| monoio::time::Instant::now() >= end);
                if let Some(reason) =
                    reason.filter(|_| retries_left > 0 && attempts < MAX_ATTEMPTS && !past_end)
                {
                    let route = routed.index as u16;
                    // A connection that never opened cost its engine nothing: retrying it
                    // elsewhere multiplies no load, so the budget does not count it.
                    let free = retry::never_reached(&e);
                    if !free
                        && !rs.retry_budget.try_retry(
                            Instant::now(),
                            policy.budget,
                            policy.budget_min,
                        )
                    {
                        state.links.record(Record::RetryBudgetExhausted { route });
                        served.flags.insert(Flags::URX);
                        return answer(io, bufs, &e, req, served, write_timeout).await;
                    }
                    state.links.record(Record::Retry {
                        route,
                        reason: reason.name(),
                    });
                    let pause = retry::backoff(policy, attempts as u32);
                    if !pause.is_zero() {
                        let wake = monoio::time::Instant::now() + pause;
                        if request_end.is_some_and(|end| wake >= end) {
                            // The pause would outlast the request's deadline.
                            served.flags.insert(Flags::URX);
                            return answer(io, bufs, &e, req, served, write_timeout).await;
                        }
                        // Racing a future that never ends: only the client or the pause end it.
                        if let Race::ClientGone =
                            race(std::future::pending::<()>(), &io.reader, wake).await
                        {
                            served.flags.insert(Flags::DC);
                            return Fate::Close;
                        }
                    }
                    last_err = Some(e);
                    continue;
                }
                if attempts > 1 {
                    served.flags.insert(Flags::URX);
                }
                return answer(io, bufs, &e, req, served, write_timeout).await;
            }
        }
    }
}

/// Answers the client with the gateway's error `e`, noting it in `served`.
async fn answer(
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    e: &GatewayError,
    req: &Request<'_>,
    served: &mut Served,
    write_timeout: std::time::Duration,
) -> Fate {
    let fate = respond(&mut io.wr, &mut bufs.out, e, req.reply(), write_timeout).await;
    let written = if fate == Fate::KeepAlive {
        bufs.out.len()
    } else {
        // The write failed: the client is gone.
        served.flags.insert(Flags::DC);
        0
    };
    served.answered_error(e, written);
    fate
}
