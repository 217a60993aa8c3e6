//! Forwarding one inference request, stage by stage: [`route`](super::route) it, resolve
//! what its strategy needs ([`inputs`](super::inputs)), then [`attempt`](super::attempt)
//! targets until one answers.
//!
//! Owns the order of the stages and the request's borrowed buffers between them. It must
//! not do any stage's work itself.

use rolter_core::{PickRequest, SessionKey};

use super::client::{respond, ClientIo, Fate};
use super::request::{IoBufs, Request};
use super::{attempt, inputs, route};
use crate::path::state::WorkerState;

/// Routes, picks and proxies one request, retrying elsewhere while allowed.
pub async fn forward(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Fate {
    let routed = match route::route(state, req) {
        Ok(r) => r,
        Err(e) => {
            state.record_gateway(e.status, e.code);
            let write_timeout = state.config.server.limits.write_timeout;
            return respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
        }
    };
    let inputs = inputs::resolve(state, &routed, req, bufs).await;
    // The canonical prompt lives in a buffer lent for the request (taken out of `bufs`,
    // which the exchange borrows mutably meanwhile).
    let mut canonical = std::mem::take(&mut bufs.prompt);
    let needs = state.routes[routed.index].needs;
    let prompt = inputs::prompt(needs, routed.facts.prompt, &mut canonical);
    let preq = PickRequest {
        model: &routed.facts.model,
        session: SessionKey {
            header: req.header("x-session-id").filter(|v| !v.is_empty()),
            prompt,
        },
        prompt,
        prompt_tokens: routed.facts.prompt_tokens,
        max_tokens: routed.facts.max_tokens,
        inputs: &inputs.resolved,
    };
    let fate = attempt::until_answered(state, io, req, bufs, &routed, &inputs, &preq).await;
    bufs.prompt = canonical;
    // The client's reader kept watching throughout: a client that closed while the
    // response was being written ends the connection.
    if io.reader.is_gone() {
        Fate::Close
    } else {
        fate
    }
}
