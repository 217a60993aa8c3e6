//! Stage 7 of the request path: what an attempt teaches. The routing decision goes to the
//! route's strategy at once (a prefix now warm on the target, a session now served there,
//! shared with the other cores on the next tick) and to the cache-lookup memo; the finished
//! attempt becomes a [`Sample`] that this core's strategies learn from at once and that
//! joins the tick's batch to the other cores and the control thread, with its [`Verdict`]
//! for the health book and the metrics.
//!
//! A finished request becomes an access-log [`Entry`], sent the same way unless the log is
//! off or sampling skips it.
//!
//! Owns the verdict rules and the sampling decision. It must not log or block; records
//! leave by message only.

use std::time::{Duration, Instant};

use http::Method;
use rolter_codec::h1::request_head::RequestHead;
use rolter_codec::h1::request_id::RequestId;
use rolter_codec::GatewayError;
use rolter_config::{AccessLogDest, RetryPolicy};
use rolter_core::{Sample, TargetId, Verdict};

use super::exchange::{Attempted, Exchange};
use super::relay::{Outcome, Report};
use super::request::Request;
use super::{retry, spans};
use crate::access_log::Entry;
use crate::mesh::messages::AttemptNotes;
use crate::mesh::Record;
use crate::path::state::WorkerState;

/// The request was sent to `target` (each attempt, so a retry elsewhere is recorded where
/// it went): the strategy's `routed` hook, the cache-lookup memo, and the decision (with
/// its `score`) in the request's trace.
pub fn routed(ex: &Exchange<'_>, target: TargetId, now: Instant, score: Option<f64>) {
    let (state, routed, preq, inputs) = (ex.state, ex.routed, ex.pick, ex.inputs);
    let rs = &state.routes[routed.index];
    rs.strategy.borrow_mut().routed(
        preq,
        target,
        state.share.borrow_mut().for_route(routed.index),
        now,
    );
    if let (Some(client), Some(key), Some(ids)) =
        (&rs.lookup, inputs.lookup_key, &inputs.resolved.token_ids)
    {
        client.routed(key, target, u32::try_from(ids.len()).unwrap_or(u32::MAX));
    }
    if rs.shares_items {
        state.share_now();
    }
    if let Some(t) = ex.trace {
        let name = &state.config.targets[target].name;
        let strategy = ex.routed.route.strategy.name();
        t.routed(strategy, name, (score, ex.served.fallback));
    }
}

/// One finished attempt: its sample and verdict, and the target's cool-down when it asked
/// to be left alone.
pub fn attempt(ex: &Exchange<'_>, a: &Attempted) {
    let (state, route, preq) = (ex.state, ex.routed.index, ex.pick);
    let Attempted {
        target,
        ref outcome,
        ref report,
        load_at_send,
    } = *a;
    let verdict = verdict(outcome, report);
    let finished = Instant::now();
    let sent = report.sent.unwrap_or(finished);
    let first_byte = report.first_byte.map(|f| f.saturating_duration_since(sent));
    // A head that answered (not a server error or a rate limit) teaches the route's
    // send-to-head percentile, for `hedge_after = "pNN"`.
    if let (Some(s), Some(h)) = (report.sent, report.head) {
        if report.status < 500 && report.status != 429 {
            state.routes[route]
                .head_times
                .note(h.saturating_duration_since(s));
        }
    }
    state.record_attempt(
        route,
        Sample {
            target,
            status: report.status,
            success: verdict == Verdict::Success,
            // Only a stream's first byte is its first token: a plain answer teaches no TTFT.
            ttft: first_byte.filter(|_| report.streamed),
            first_byte,
            duration: finished.saturating_duration_since(sent),
            load_at_send,
            prompt_tokens: preq.prompt_tokens,
            usage: report.usage,
            finished,
        },
        verdict,
        AttemptNotes {
            cut: report.cut,
            estimated_completion: estimated_completion(report),
            error: match outcome {
                Outcome::Failed(e) => Some(e.code),
                _ => None,
            },
        },
    );
    cooling(state, target, report.wait, &ex.routed.route.retry);
    if let Some(t) = ex.trace {
        let end = spans::AttemptEnd {
            target,
            outcome,
            report,
            n: ex.attempts.n,
            // Why this attempt was made: the retry reason of the last one's failure
            // (`retry_on`'s name, e.g. `503`).
            retry_of: ex
                .attempts
                .last_err
                .as_ref()
                .map(|e| retry::reason(e).map_or(e.code, |r| r.name())),
        };
        spans::attempt_ended(t, state, end);
    }
}

/// `target` asked to be left alone for `wait` (a 429's or a 503's `Retry-After`, capped by
/// the route's `retry_after_max`): out of this core's candidates at once, and of the other
/// cores' once the control thread passes it on.
fn cooling(state: &WorkerState, target: TargetId, wait: Option<Duration>, policy: &RetryPolicy) {
    let Some(wait) = wait.map(|w| w.min(policy.retry_after_max)) else {
        return;
    };
    if wait.is_zero() {
        return;
    }
    let until = Instant::now() + wait;
    state.load.cool(target, until);
    state.links.record(Record::Cooldown {
        target: target as u16,
        until,
    });
}

/// Completion tokens counted from a successful stream's deltas when it reported no usage.
pub fn estimated_completion(report: &Report) -> u32 {
    if report.usage.is_none() && (200..300).contains(&report.status) {
        report.deltas
    } else {
        0
    }
}

/// The method's name, for the access log.
fn method_name(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "OTHER",
    }
}

/// A request rejected before it was read whole (a malformed head, a body too large or too
/// slow): its entry, with the method and path when the head was read. Always written.
pub fn rejected(
    state: &WorkerState,
    peer: std::net::SocketAddr,
    head: Option<(&RequestHead, &[u8])>,
    id: &RequestId,
    e: &GatewayError,
) {
    if state.config.log.access == AccessLogDest::Off {
        return;
    }
    let (method, path) = match head {
        Some((h, buf)) => (method_name(&h.method), h.path(buf).as_bytes()),
        None => ("-", &b""[..]),
    };
    let mut entry = Entry::new(std::time::SystemTime::now(), *id, peer, method, path);
    entry.status = e.status;
    entry.error = Some(e.code);
    state.links.record(Record::Request(Box::new(entry)));
}

/// A finished request: its access-log entry, filled in by `fill`, is sent to the control
/// thread unless the log is off, or `log.sample` skips this success.
pub fn finished(state: &WorkerState, req: &Request<'_>, fill: impl FnOnce(&mut Entry)) {
    if state.config.log.access == AccessLogDest::Off {
        return;
    }
    send(state, entry(req, fill));
}

/// The access-log entry of the finished request `req`, filled in by `fill` (also what a
/// sampled request's span is made of).
pub fn entry(req: &Request<'_>, fill: impl FnOnce(&mut Entry)) -> Entry {
    let mut entry = Entry::new(
        req.time,
        req.id,
        req.peer,
        method_name(&req.head.method),
        req.head.path(req.buf).as_bytes(),
    );
    entry.bytes_in = req.bytes_in();
    fill(&mut entry);
    entry.duration = req.started.elapsed();
    entry
}

/// Sends `entry` to the control thread unless the log is off, or `log.sample` skips this
/// success.
pub fn send(state: &WorkerState, entry: Entry) {
    let log = &state.config.log;
    if log.access == AccessLogDest::Off {
        return;
    }
    if log.sample < 1.0 && !entry.always_logged() && fastrand::f64() >= log.sample {
        return;
    }
    state.links.record(Record::Request(Box::new(entry)));
}

/// What an attempt says about its target.
pub fn verdict(outcome: &Outcome, report: &Report) -> Verdict {
    match outcome {
        Outcome::ClientGone => Verdict::ClientGone,
        Outcome::Relayed { .. } if !report.completed => Verdict::TargetFailed,
        Outcome::Relayed { .. } | Outcome::Failed(_) => match report.status {
            200..=299 if report.completed => Verdict::Success,
            // No response, or a server error (including the retryable 502/503/504).
            0 | 500..=599 => Verdict::TargetFailed,
            // A head was read but the response was malformed or cut before the client got it.
            200..=299 => Verdict::TargetFailed,
            _ => Verdict::Answered,
        },
    }
}
