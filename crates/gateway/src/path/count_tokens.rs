//! Anthropic's `POST /v1/messages/count_tokens` answered by the gateway itself: on a route
//! with a local tokenizer (its strategy's `tokenizer`) whose every target for the model
//! would have the request translated (`lacks = ["messages"]`), the body's chat messages
//! and tools are counted with the route's chat template, on the blocking pool, and no
//! engine is asked. Without a local tokenizer, or when counting fails or takes too long,
//! the request goes on to an engine's `/tokenize` as any translated request does.
//!
//! Owns that answer only. It must not block the worker: the tokenizer runs off it.

use std::time::Duration;

use rolter_codec::h1::write::write_head_and_body;
use rolter_codec::translate::{count_tokens, Api};

use super::client::{write_out, ClientIo, Fate};
use super::record;
use super::request::{IoBufs, Request};
use super::route::Routed;
use crate::path::state::WorkerState;

/// How long counting may take before the engine is asked instead.
const COUNT_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers `req` from the route's local tokenizer when it is a count_tokens request the
/// route would translate; `None` when the request goes on to an engine.
pub async fn locally(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    routed: &Routed<'_>,
) -> Option<Fate> {
    let tokenizer = routed.route.tokenizer.clone()?;
    let path = &req.buf[req.head.path.clone()];
    if req.head.method != http::Method::POST || Api::of_path(path) != Some(Api::CountTokens) {
        return None;
    }
    let model = routed.facts.model.as_ref();
    let mut serving = routed
        .route
        .targets
        .iter()
        .map(|&t| &state.config.targets[t])
        .filter(|t| t.serves(model))
        .peekable();
    serving.peek()?;
    if !serving.all(|t| t.api.engine_api_for(Api::CountTokens) == Some(Api::Tokenize)) {
        return None;
    }
    let (messages, tools) = count_tokens::chat_parts(req.body).ok()?;
    let job = monoio::spawn_blocking(move || {
        let mut ids = Vec::new();
        tokenizer
            .chat_ids(&messages, tools.as_deref(), true, &mut ids)
            .ok()
            .map(|()| ids.len())
    });
    let count = match monoio::time::timeout(COUNT_TIMEOUT, job).await {
        Ok(Ok(Some(n))) => n,
        _ => return None,
    };
    let body = format!("{{\"input_tokens\":{count}}}");
    bufs.out.clear();
    let id = [("x-request-id", req.id.as_str())];
    let out = &mut bufs.out;
    write_head_and_body(
        out,
        200,
        "application/json",
        &id,
        body.as_bytes(),
        req.close,
    );
    let limits = &state.config.server.limits;
    let fate = write_out(&mut io.wr, &mut bufs.out, limits.write_timeout).await;
    let written = bufs.out.len() as u64;
    record::finished(state, req, |entry| {
        entry.status = 200;
        entry.route = Some(routed.index as u16);
        entry.bytes_out = written;
    });
    Some(fate)
}
