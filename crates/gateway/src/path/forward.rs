//! Forwarding one inference request, stage by stage: identify its caller
//! ([`auth`](super::auth), when `[[keys]]` are configured), [`route`](super::route) it,
//! check the caller may send it there, resolve what its strategy needs
//! ([`inputs`](super::inputs)), then [`attempt`](super::attempt) targets until one answers.
//!
//! Owns the order of the stages and the request's borrowed buffers between them, and hands
//! what they came to to [`record::finished`](super::record::finished). It must not do any
//! stage's work itself.

use std::time::Instant;

use rolter_codec::api::fields::Fields;
use rolter_codec::GatewayError;
use rolter_core::{PickRequest, SessionKey};

use super::admit::{self, Admit};
use super::client::{respond, ClientIo, Fate};
use super::disaggregated::{self, Legs};
use super::exchange::{Attempts, Exchange, Served};
use super::inputs::Inputs;
use super::leg_body::LegBody;
use super::request::{IoBufs, Request};
use super::route::Routed;
use super::{attempt, auth, inputs, record, route, spans};
use crate::access_log::Flags;
use crate::path::state::WorkerState;
use rolter_config::Disaggregation;

/// Routes, picks and proxies one request, retrying elsewhere while allowed.
pub async fn forward(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Fate {
    let caller = match auth::identify(state, req) {
        Ok(c) => c,
        Err(e) => return refuse(state, io, bufs, Refusal::new(req, &e)).await,
    };
    let key = caller.map(|c| c.key as u32);
    let mut routed = match route::route(state, req) {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                state,
                io,
                bufs,
                Refusal {
                    key,
                    ..Refusal::new(req, &e)
                },
            )
            .await
        }
    };
    if let Some(c) = caller {
        if let Err(e) = auth::permit(state, c, &routed) {
            let refusal = Refusal {
                key,
                at: Some((routed.index as u16, routed.facts.model.as_bytes())),
                ..Refusal::new(req, &e)
            };
            return refuse(state, io, bufs, refusal).await;
        }
        routed.key_header = Some(c.header);
    }
    #[cfg(feature = "local-tokenizer")]
    if let Some(fate) = super::count_tokens::locally(state, io, req, bufs, &routed).await {
        return fate;
    }
    let admit = match admit::classify(&state.config, req, &routed, caller) {
        Ok(a) => a,
        Err(e) => {
            let refusal = Refusal {
                key,
                at: Some((routed.index as u16, routed.facts.model.as_bytes())),
                ..Refusal::new(req, &e)
            };
            return refuse(state, io, bufs, refusal).await;
        }
    };
    if let Some(d) = routed
        .route
        .disaggregation
        .filter(|_| disaggregates(req.head.path(req.buf)))
    {
        // Boxed: two exchanges' state, on disaggregated routes only.
        return Box::pin(disaggregated(
            state,
            io,
            req,
            bufs,
            (routed, caller, d, admit),
        ))
        .await;
    }
    let trace = spans::begin(state, req);
    let inputs = inputs::resolve(state, &routed, req, bufs).await;
    // The canonical prompt lives in a buffer lent for the request (taken out of `bufs`,
    // which the attempts borrow mutably meanwhile).
    let mut canonical = std::mem::take(&mut bufs.prompt);
    let pick = pick_request(state, req, &routed, &inputs, &mut canonical);
    let mut ex = Exchange {
        state,
        req,
        routed: &routed,
        inputs: &inputs,
        pick: &pick,
        attempts: Attempts::new(&routed.route.retry, Instant::now(), admit.deadline),
        served: Served::default(),
        body: LegBody::default(),
        fields: None,
        admit,
        waited: Default::default(),
        trace: trace.as_ref(),
    };
    let fate = attempt::until_answered(&mut ex, io, bufs).await;
    let fate = conclude(&ex, caller, io, fate, |_| {});
    bufs.prompt = canonical;
    fate
}

/// The paths a disaggregated route prefills and decodes on two engines (vLLM's and SGLang's
/// P/D servers take them); any other goes to the decode pool as one request.
fn disaggregates(path: &str) -> bool {
    matches!(
        path,
        "/v1/chat/completions" | "/v1/completions" | "/v1/messages"
    )
}

/// A request on a disaggregated route: its prefill exchange over the prefill pool's route
/// (with that strategy's inputs), its decode exchange over the route itself.
async fn disaggregated(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    (routed, caller, d, admit): (Routed<'_>, Option<auth::Caller>, Disaggregation, Admit),
) -> Fate {
    // Parsed once: both legs (and their retries) change the same body.
    let fields = match Fields::parse(req.body) {
        Ok(f) => f,
        Err(e) => {
            let e = GatewayError::client(400, "invalid_json", e.to_string());
            let refusal = Refusal {
                key: caller.map(|c| c.key as u32),
                at: Some((routed.index as u16, routed.facts.model.as_bytes())),
                ..Refusal::new(req, &e)
            };
            return refuse(state, io, bufs, refusal).await;
        }
    };
    let pool = Routed {
        facts: routed.facts.clone(),
        index: d.prefill_route,
        route: &state.config.routes[d.prefill_route],
        passthrough: false,
        key_header: routed.key_header,
    };
    let pool_inputs = inputs::resolve(state, &pool, req, bufs).await;
    let decode_inputs = inputs::resolve(state, &routed, req, bufs).await;
    let mut pool_canonical = std::mem::take(&mut bufs.prompt);
    let mut decode_canonical = Vec::new();
    let pool_pick = pick_request(state, req, &pool, &pool_inputs, &mut pool_canonical);
    let decode_pick = pick_request(state, req, &routed, &decode_inputs, &mut decode_canonical);
    let start = Instant::now();
    let trace = spans::begin(state, req);
    let exchange = |routed, inputs, pick| Exchange {
        state,
        req,
        routed,
        inputs,
        pick,
        attempts: Attempts::new(&routed.route.retry, start, admit.deadline),
        served: Served::default(),
        body: LegBody::default(),
        fields: Some(&fields),
        admit,
        waited: Default::default(),
        trace: trace.as_ref(),
    };
    let mut prefill = exchange(&pool, &pool_inputs, &pool_pick);
    let mut decode = exchange(&routed, &decode_inputs, &decode_pick);
    let legs = Legs {
        prefill: &mut prefill,
        decode: &mut decode,
    };
    let fate = disaggregated::until_answered(legs, io, bufs).await;
    let fate = conclude(&decode, caller, io, fate, |e| prefill.fill_prefill(e));
    bufs.prompt = pool_canonical;
    fate
}

/// The end of a forwarded request: the caller's tokens charged, its access-log entry
/// (`more` adds to it), and the connection's fate.
fn conclude(
    ex: &Exchange<'_>,
    caller: Option<auth::Caller>,
    io: &ClientIo,
    fate: Fate,
    more: impl FnOnce(&mut crate::access_log::Entry),
) -> Fate {
    let state = ex.state;
    if let Some(c) = caller {
        let (prompt, completion) = ex.served.tokens();
        auth::charge(state, c, prompt, completion);
    }
    let traced = ex.trace.is_some_and(|t| t.sampled);
    if traced || state.config.log.access != rolter_config::AccessLogDest::Off {
        let entry = record::entry(ex.req, |e| {
            e.key = caller.map(|c| c.key as u32);
            ex.fill(e);
            more(e);
        });
        if let Some(t) = ex.trace.filter(|t| t.sampled) {
            let model = &ex.routed.facts.model;
            spans::request_ended(t, state, ex.req, (&entry, model));
        }
        record::send(state, entry);
    }
    // The client's reader kept watching throughout: a client that closed while the
    // response was being written ends the connection.
    if io.reader.is_gone() {
        Fate::Close
    } else {
        fate
    }
}

/// What the route's strategy is asked to pick for: the model, the session's key, the
/// prompt (canonical, in `canonical`, when the route needs it) and its token estimates.
fn pick_request<'a>(
    state: &WorkerState,
    req: &'a Request<'_>,
    routed: &'a Routed<'_>,
    inputs: &'a Inputs,
    canonical: &'a mut Vec<u8>,
) -> PickRequest<'a> {
    let needs = state.routes[routed.index].needs;
    let prompt = inputs::prompt(needs, routed.facts.prompt, canonical);
    PickRequest {
        model: &routed.facts.model,
        session: SessionKey {
            header: req.header("x-session-id").filter(|v| !v.is_empty()),
            // A passthrough request has no prompt: its path keys the session instead.
            prompt: if routed.passthrough {
                &req.buf[req.head.path.clone()]
            } else {
                prompt
            },
        },
        prompt,
        prompt_tokens: routed.facts.prompt_tokens,
        max_tokens: routed.facts.max_tokens,
        inputs: &inputs.resolved,
    }
}

/// A request refused before any upstream was tried: the error, and what its access-log
/// entry is to say of the caller and the route.
struct Refusal<'a> {
    req: &'a Request<'a>,
    e: &'a GatewayError,
    /// The caller's key, once identified.
    key: Option<u32>,
    /// The route and model, once routed.
    at: Option<(u16, &'a [u8])>,
}

impl<'a> Refusal<'a> {
    /// `e`, answered to `req` before its caller was known.
    fn new(req: &'a Request<'a>, e: &'a GatewayError) -> Self {
        Refusal {
            req,
            e,
            key: None,
            at: None,
        }
    }
}

/// Answers a refusal: the gateway's own error, counted and logged with the caller's key
/// and (once routed) the route and model.
async fn refuse(
    state: &WorkerState,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    refusal: Refusal<'_>,
) -> Fate {
    let Refusal {
        req,
        e,
        key,
        at: routed,
    } = refusal;
    state.record_gateway(e.status, e.code);
    let write_timeout = state.config.server.limits.write_timeout;
    let fate = respond(&mut io.wr, &mut bufs.out, e, req.reply(), write_timeout).await;
    let written = bufs.out.len() as u64;
    record::finished(state, req, |entry| {
        entry.status = e.status;
        entry.error = Some(e.code);
        entry.flags = Flags::for_error(e);
        entry.key = key;
        if let Some((route, model)) = routed {
            entry.route = Some(route);
            entry.model = crate::access_log::entry::Inline::new(model);
        }
        if fate == Fate::Close {
            entry.flags.insert(Flags::DC);
        } else {
            entry.bytes_out = written;
        }
    });
    fate
}
