//! The request's trace (`[tracing]`): its context, continued from the client's
//! `traceparent` or started here, and the sampling decision; the span id each attempt
//! tells its engine (`traceparent` upstream, written by `upstream_request`); and, for a
//! sampled request, its spans: one per attempt (kind client: the target, its status, the
//! failure and the retry reason) as each ends, and the request's own (kind server: route,
//! model, strategy, status, attempts) as it ends, with the routing decision, the queue
//! wait and the first token as events.
//!
//! Owns the spans' names, attributes and events. It must not block or export: spans go to
//! the exporter thread through [`Tracer::record`](crate::trace::Tracer::record), which
//! drops rather than waits. An unsampled request builds no span.

use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime};

use rolter_codec::h1::traceparent::{self, TraceParent};
use rolter_core::TargetId;

use super::relay::{Outcome, Report};
use super::request::Request;
use crate::access_log::Entry;
use crate::path::state::WorkerState;
use crate::trace::{self, AttrValue, SpanEvent, SpanKind, SpanRecord, SpanStatus};

/// One request's trace.
pub struct RequestTrace {
    pub trace_id: [u8; 16],
    /// The gateway's span of the request (the parent of its attempts' spans).
    pub span_id: [u8; 8],
    /// The client's span, from its `traceparent`.
    pub parent: Option<[u8; 8]>,
    pub sampled: bool,
    /// The attempts sent and not yet recorded: target, span id, when it was sent.
    open: RefCell<Vec<(TargetId, [u8; 8], SystemTime)>>,
    /// What happened on the way (routing decisions), for a sampled request.
    events: RefCell<Vec<SpanEvent>>,
}

/// The trace of `req`, when the gateway traces (`[tracing]`): the client's trace continued
/// (and its sampled flag obeyed, with `parent_based`), or a new one sampled by ratio.
pub fn begin(state: &WorkerState, req: &Request<'_>) -> Option<RequestTrace> {
    let settings = state.config.tracing.as_ref()?;
    let parent: Option<TraceParent> = req.header("traceparent").and_then(traceparent::parse);
    let trace_id = parent
        .as_ref()
        .map_or_else(trace::new_trace_id, |p| p.trace_id);
    let sampled = trace::sampled(
        parent.as_ref(),
        &trace_id,
        settings.sample,
        settings.parent_based,
    );
    Some(RequestTrace {
        trace_id,
        span_id: trace::new_span_id(),
        parent: parent.map(|p| p.parent_id),
        sampled,
        open: RefCell::new(Vec::new()),
        events: RefCell::new(Vec::new()),
    })
}

impl RequestTrace {
    /// A new attempt on `target` is being written: the span id its `traceparent` carries.
    pub fn attempt(&self, target: TargetId) -> [u8; 8] {
        let id = trace::new_span_id();
        if self.sampled {
            self.open.borrow_mut().push((target, id, SystemTime::now()));
        }
        id
    }

    /// The route's strategy sent the request to `target` (each attempt), with its score
    /// when it scores and the fallback it took, if any.
    pub fn routed(
        &self,
        strategy: &'static str,
        target: &str,
        (score, fallback): (Option<f64>, Option<&'static str>),
    ) {
        if !self.sampled {
            return;
        }
        let mut attributes = vec![
            ("rolter.strategy", AttrValue::Static(strategy)),
            ("rolter.target", AttrValue::Str(target.to_string())),
        ];
        if let Some(s) = score.filter(|s| s.is_finite()) {
            attributes.push(("rolter.score", AttrValue::F64(s)));
        }
        if let Some(f) = fallback {
            attributes.push(("rolter.fallback", AttrValue::Static(f)));
        }
        self.events.borrow_mut().push(SpanEvent {
            name: "routed",
            time_unix_nanos: trace::now_unix_nanos(),
            attributes,
        });
    }
}

/// Writes the `traceparent` an attempt's engine gets: the request's trace, `span` as the
/// parent, its sampled flag.
pub fn write_header(out: &mut Vec<u8>, t: &RequestTrace, span: &[u8; 8]) {
    out.extend_from_slice(b"traceparent: ");
    traceparent::write(out, &t.trace_id, span, t.sampled);
    out.extend_from_slice(b"\r\n");
}

/// How one attempt ended, for its span.
pub struct AttemptEnd<'a> {
    pub target: TargetId,
    pub outcome: &'a Outcome,
    pub report: &'a Report,
    /// Its number in the request (1: the first).
    pub n: usize,
    /// The failure of the attempt before it, which this one retried.
    pub retry_of: Option<&'static str>,
}

/// One attempt of the request traced by `t` ended as `a`: its span, when the request is
/// sampled.
pub fn attempt_ended(t: &RequestTrace, state: &WorkerState, a: AttemptEnd<'_>) {
    let Some(tracer) = state.tracer.as_ref().filter(|_| t.sampled) else {
        return;
    };
    let opened = {
        let mut open = t.open.borrow_mut();
        let at = open.iter().rposition(|(target, ..)| *target == a.target);
        at.map(|i| open.remove(i))
    };
    let Some((_, id, sent)) = opened else {
        return;
    };
    let target = &state.config.targets[a.target];
    let mut span = SpanRecord::new(
        t.trace_id,
        id,
        Some(t.span_id),
        "upstream attempt",
        SpanKind::Client,
        trace::unix_nanos(sent),
    );
    span.end_unix_nanos = trace::now_unix_nanos();
    span.attr("rolter.target", target.name.clone());
    span.attr("server.address", target.host_header.clone());
    span.attr("rolter.attempt", a.n as u64);
    if a.report.status != 0 {
        span.attr("http.response.status_code", u64::from(a.report.status));
    }
    if let Some(reason) = a.retry_of {
        span.attr("rolter.retry_reason", reason);
    }
    if let Some(first) = a.report.first_byte {
        span.event("first_byte", at(sent, a.report.sent, first));
    }
    span.status = match a.outcome {
        Outcome::Failed(e) => {
            span.attr("error.type", e.code);
            SpanStatus::Error(e.message.to_string())
        }
        Outcome::ClientGone => SpanStatus::Error("the client went away".into()),
        Outcome::Relayed { .. } if a.report.cut.is_some() => {
            SpanStatus::Error("the stream was cut".into())
        }
        Outcome::Relayed { .. } => SpanStatus::Unset,
    };
    tracer.record(span);
}

/// The wall-clock time of `instant`, given that `sent_at` (wall clock) was `sent` (when
/// known).
fn at(sent_at: SystemTime, sent: Option<Instant>, instant: Instant) -> u64 {
    let base = trace::unix_nanos(sent_at);
    match sent {
        Some(s) => base + nanos(instant.saturating_duration_since(s)),
        None => base,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The request `req` traced by `t` ended: its span, when sampled, from what its access-log
/// entry says (`entry`, filled whether or not the log is on) and the model it asked for.
pub fn request_ended(
    t: &RequestTrace,
    state: &WorkerState,
    req: &Request<'_>,
    (entry, model): (&Entry, &str),
) {
    let Some(tracer) = state.tracer.as_ref().filter(|_| t.sampled) else {
        return;
    };
    let start = trace::unix_nanos(req.time);
    let mut span = SpanRecord::new(
        t.trace_id,
        t.span_id,
        t.parent,
        format!("{} {}", req.head.method.as_str(), req.head.path(req.buf)),
        SpanKind::Server,
        start,
    );
    span.remote_parent = t.parent.is_some();
    span.end_unix_nanos = start + nanos(req.started.elapsed());
    span.attr("http.request.method", req.head.method.as_str().to_string());
    span.attr("url.path", req.head.path(req.buf).to_string());
    span.attr("http.response.status_code", u64::from(entry.status));
    span.attr("rolter.request_id", req.id.as_str().to_string());
    if let Some(route) = entry
        .route
        .and_then(|r| state.config.routes.get(usize::from(r)))
    {
        span.attr("rolter.route", route.name.clone());
        span.attr("rolter.strategy", route.strategy.name());
    }
    span.attr("gen_ai.request.model", model.to_string());
    span.attr("rolter.attempts", u64::from(entry.attempts));
    if let Some(class) = entry.class {
        let name = &state.config.classes[usize::from(class)].name;
        span.attr("rolter.class", name.clone());
    }
    if let Some(e) = entry.error {
        span.attr("error.type", e);
    }
    span.events = std::mem::take(&mut *t.events.borrow_mut());
    if entry.queue_wait_us > 0 {
        span.events.push(SpanEvent {
            name: "queue_wait",
            time_unix_nanos: start,
            attributes: vec![(
                "rolter.queue_wait_ms",
                AttrValue::F64(f64::from(entry.queue_wait_us) / 1000.0),
            )],
        });
    }
    if let Some(ttft) = entry.ttft {
        span.event("first_token", start + nanos(ttft));
    }
    if entry.status >= 500 || entry.status == 0 {
        span.status = SpanStatus::Error(entry.error.unwrap_or("upstream failure").to_string());
    }
    tracer.record(span);
}
