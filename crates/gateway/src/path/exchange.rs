//! The exchange: one inference request's context from the moment it is routed until it is
//! recorded. It holds what every later stage reads (the request, its route and facts, the
//! strategy's inputs, the pick request) and what they write: the [`Attempts`] so far, and
//! [`Served`], what they came to, from which the access-log record is filled.
//!
//! Owns the per-request record of the attempts (what one attempt came to is one
//! [`Attempted`]) and its mapping onto an access-log entry.
//! It must not run a stage itself; the stages take the exchange instead of a long list of
//! arguments.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rolter_codec::api::fields::Fields;
use rolter_codec::GatewayError;
use rolter_config::{RetryPolicy, MAX_RETRIES};
use rolter_core::{PickRequest, TargetId, Usage};

use super::admit::Admit;
use super::inputs::Inputs;
use super::leg_body::LegBody;
use super::pick::Ask;
use super::relay::{Outcome, Report};
use super::request::Request;
use super::route::Routed;
use super::spans::RequestTrace;
use crate::access_log::entry::{Inline, PrefillLeg};
use crate::access_log::{Entry, Flags};
use crate::path::state::WorkerState;

/// One routed request on its way through the attempts.
pub struct Exchange<'a> {
    pub state: &'a WorkerState,
    pub req: &'a Request<'a>,
    pub routed: &'a Routed<'a>,
    pub inputs: &'a Inputs,
    pub pick: &'a PickRequest<'a>,
    /// The attempts so far.
    pub attempts: Attempts,
    /// What the attempts came to, written by each as it ends.
    pub served: Served,
    /// What this exchange's legs change in the client's body (a disaggregated route's
    /// fields); empty for a co-located request.
    pub body: LegBody,
    /// The client body's top-level fields, parsed once for every leg of a disaggregated
    /// request (`None`: not parsed).
    pub fields: Option<&'a Fields<'a>>,
    /// The request's class, tenant and deadline.
    pub admit: Admit,
    /// How long the request waited in the route's queue (zero: it did not).
    pub waited: Cell<Duration>,
    /// The request's trace, when the gateway traces (`[tracing]`).
    pub trace: Option<&'a RequestTrace>,
}

/// Most attempts one request can make: the first try and the most retries the
/// configuration allows (a hedge counts as one of them).
pub const MAX_ATTEMPTS: usize = MAX_RETRIES as usize + 1;

/// The attempts of one request so far (of one pool's legs, on a disaggregated route).
pub struct Attempts {
    /// The targets no longer candidates, in order (the first `tried_n`): every target
    /// tried, or on a disaggregated route's pool those whose leg failed.
    tried: [TargetId; MAX_ATTEMPTS],
    tried_n: usize,
    /// Attempts made.
    pub n: usize,
    /// The last failure that allowed a retry: what the client gets when no candidate is left.
    pub last_err: Option<GatewayError>,
    /// The end of the whole request: the route's `deadline`, or the client's
    /// (`x-rolter-deadline-ms`) when sooner.
    pub request_end: Option<monoio::time::Instant>,
    /// When the first attempt was about to be picked (the retry budget counts the request
    /// then).
    pub started: Instant,
}

impl Attempts {
    /// No attempt yet, for a request under `policy` that started at `start`.
    pub fn new(policy: &RetryPolicy, start: Instant, deadline: Option<Instant>) -> Self {
        let route_end = policy.deadline.map(|d| start + d);
        let end = match (route_end, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Attempts {
            tried: [usize::MAX; MAX_ATTEMPTS],
            tried_n: 0,
            n: 0,
            last_err: None,
            request_end: end.map(monoio::time::Instant::from_std),
            started: start,
        }
    }

    /// The targets no longer candidates, in order.
    pub fn tried(&self) -> &[TargetId] {
        &self.tried[..self.tried_n]
    }

    /// One more attempt, on `target`, which is then no candidate again.
    pub fn push(&mut self, target: TargetId) {
        self.note(target, true);
    }

    /// One more attempt, on `target`; it stays a candidate unless `failed` (a pool's leg
    /// that succeeded may serve the request's next pair).
    pub fn note(&mut self, target: TargetId, failed: bool) {
        if failed && self.tried_n < MAX_ATTEMPTS {
            self.tried[self.tried_n] = target;
            self.tried_n += 1;
        }
        self.n += 1;
    }
}

/// What one attempt came to: the target, how the exchange ended, what it reported, and
/// the target's load when the request was sent.
pub struct Attempted {
    pub target: TargetId,
    pub outcome: Outcome,
    pub report: Report,
    pub load_at_send: u64,
}

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
    /// How long the last attempt took, from its request being written to its end (noted
    /// for a disaggregated route's legs).
    pub last_time: Option<std::time::Duration>,
}

impl Served {
    /// The gateway answered `e` itself (`bytes_out` written, 0 when the write failed).
    pub fn answered_error(&mut self, e: &GatewayError, bytes_out: usize) {
        self.status = e.status;
        self.error = Some(e.code);
        self.flags.insert(Flags::for_error(e));
        self.bytes_out += bytes_out as u64;
    }

    /// The prompt and completion tokens to charge: the usage the response reported, else
    /// the completion tokens its stream counted.
    pub fn tokens(&self) -> (u32, u32) {
        self.usage.map_or((0, self.estimated_completion), |u| {
            (u.prompt_tokens, u.completion_tokens)
        })
    }
}

impl<'a> Exchange<'a> {
    /// What the next pick is asked: among the targets not tried yet.
    pub fn ask(&self) -> Ask<'_> {
        Ask {
            routed: self.routed,
            preq: self.pick,
            tried: self.attempts.tried(),
            admit: &self.admit,
            waited: Some(&self.waited),
        }
    }

    /// Fills what the exchange learned into the request's access-log entry (the caller's
    /// key is the identify stage's).
    pub fn fill(&self, e: &mut Entry) {
        let s = &self.served;
        e.route = Some(self.routed.index as u16);
        e.model = Inline::new(self.routed.facts.model.as_bytes());
        e.target = s.target.map(|t| t as u16);
        e.status = s.status;
        e.upstream_status = s.upstream_status;
        e.attempts = s.attempts;
        e.flags = s.flags;
        e.error = s.error;
        e.ttft = s
            .first_byte
            .map(|t| t.saturating_duration_since(self.req.started));
        e.bytes_out = s.bytes_out;
        match s.usage {
            Some(u) => {
                e.prompt_tokens = Some(u.prompt_tokens);
                e.completion_tokens = Some(u.completion_tokens);
            }
            None if s.estimated_completion > 0 => {
                e.completion_tokens = Some(s.estimated_completion);
                e.tokens_estimated = true;
            }
            None => {}
        }
        e.fallback = s.fallback;
        // Logged only where `[[classes]]` makes classes worth telling apart.
        if self.state.config.classes.len() > 1
            || self.state.config.classes[0].name != rolter_config::DEFAULT_CLASS
        {
            e.class = Some(self.admit.class as u8);
        }
        if self.admit.tenant_named {
            let header = self.routed.route.admission.tenant_header.as_deref();
            if let Some(v) = header.and_then(|h| self.req.header(h)) {
                e.tenant = Inline::new(v);
            }
        }
        let waited = self.waited.get();
        if !waited.is_zero() {
            e.queue_wait_us = u32::try_from(waited.as_micros()).unwrap_or(u32::MAX).max(1);
        }
    }

    /// Adds what a disaggregated request's prefill legs (this exchange's) came to into the
    /// entry the decode exchange filled: the prefill side, its flags, and the gateway's
    /// answer when it was the prefill pool's (no prefill candidate, a prefill failure).
    pub fn fill_prefill(&self, e: &mut Entry) {
        let s = &self.served;
        e.prefill = Some(PrefillLeg {
            target: s.target.map(|t| t as u16),
            status: s.upstream_status,
            attempts: s.attempts,
            time: s.last_time,
        });
        e.flags.insert(s.flags);
        if e.status == 0 {
            e.status = s.status;
            e.error = e.error.or(s.error);
        }
        e.bytes_out += s.bytes_out;
        e.fallback = e.fallback.or(s.fallback);
    }
}
