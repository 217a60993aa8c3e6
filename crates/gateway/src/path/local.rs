//! The gateway's own endpoints on the client listener: `GET /health`, `GET /v1/models`
//! (its body built once, see [`models`](super::models)), and the errors for unknown paths
//! and wrong methods; everything else is an inference request to forward.
//!
//! Owns those answers. It must not query engines.

use http::Method;
use rolter_codec::api::is_proxied_path;
use rolter_codec::h1::write::write_head_and_body;
use rolter_codec::GatewayError;
use rolter_config::Limits;

use super::client::{respond, write_out, ClientIo, Fate};
use super::record;
use super::request::{IoBufs, Request};
use crate::path::state::WorkerState;

/// Whether `req` is an inference request the gateway forwards.
pub fn is_forwarded(req: &Request<'_>) -> bool {
    req.head.method == Method::POST && is_proxied_path(req.head.path(req.buf))
}

/// Answers a request that is not forwarded.
pub async fn answer(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    limits: &Limits,
) -> Fate {
    let path = req.head.path(req.buf);
    let local: Result<&[u8], GatewayError> = match (&req.head.method, path) {
        (_, p) if is_proxied_path(p) => Err(GatewayError::client(
            405,
            "method_not_allowed",
            format!("{path} accepts only POST"),
        )),
        (&Method::GET, "/health") => Ok(br#"{"status":"ok"}"#),
        (&Method::GET, "/v1/models") => Ok(&state.models_body),
        (_, "/health") | (_, "/v1/models") => Err(GatewayError::client(
            405,
            "method_not_allowed",
            format!("{path} accepts only GET"),
        )),
        _ => Err(GatewayError::client(
            404,
            "not_found",
            format!("no such endpoint: {path}"),
        )),
    };
    let body = match local {
        Ok(body) => body,
        Err(e) => {
            state.record_gateway(e.status, e.code);
            let fate = respond(
                &mut io.wr,
                &mut bufs.out,
                &e,
                req.reply(),
                limits.write_timeout,
            )
            .await;
            let written = bufs.out.len() as u64;
            record::finished(state, req, |entry| {
                entry.status = e.status;
                entry.error = Some(e.code);
                entry.bytes_out = written;
            });
            return fate;
        }
    };
    bufs.out.clear();
    let id = [("x-request-id", req.id.as_str())];
    write_head_and_body(&mut bufs.out, 200, "application/json", &id, body, req.close);
    let fate = write_out(&mut io.wr, &mut bufs.out, limits.write_timeout).await;
    let written = bufs.out.len() as u64;
    record::finished(state, req, |entry| {
        entry.status = 200;
        entry.bytes_out = written;
    });
    fate
}
