//! Forwarding one inference request, stage by stage: identify its caller
//! ([`auth`](super::auth), when `[[keys]]` are configured), [`route`](super::route) it,
//! check the caller may send it there, resolve what its strategy needs
//! ([`inputs`](super::inputs)), then [`attempt`](super::attempt) targets until one answers.
//!
//! Owns the order of the stages and the request's borrowed buffers between them, and hands
//! what they came to to [`record::finished`](super::record::finished). It must not do any
//! stage's work itself.

use std::time::Instant;

use rolter_codec::GatewayError;
use rolter_core::{PickRequest, SessionKey};

use super::client::{respond, ClientIo, Fate};
use super::exchange::{Attempts, Exchange, Served};
use super::inputs::Inputs;
use super::request::{IoBufs, Request};
use super::route::Routed;
use super::{attempt, auth, inputs, record, route};
use crate::access_log::Flags;
use crate::path::state::WorkerState;

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
        attempts: Attempts::new(&routed.route.retry, Instant::now()),
        served: Served::default(),
    };
    let fate = attempt::until_answered(&mut ex, io, bufs).await;
    if let Some(c) = caller {
        let (prompt, completion) = ex.served.tokens();
        auth::charge(state, c, prompt, completion);
    }
    record::finished(state, req, |e| {
        e.key = key;
        ex.fill(e);
    });
    bufs.prompt = canonical;
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
