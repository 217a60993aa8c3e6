//! The gateway's own endpoints on the client listener: `GET /health`, `GET /v1/models` and
//! `GET /v1/models/{id}` (their bodies built once, see [`models`](super::models); HEAD
//! answers their heads), and the
//! errors for unknown paths and wrong methods; everything else (a proxied path, or one a
//! route's `passthrough` prefix covers) is a request to forward.
//!
//! With `[[keys]]`, the model list needs a key (`path::auth`); `/health` never does.
//!
//! Owns those answers and which requests are forwarded. It must not query engines.

use http::Method;
use rolter_codec::api::is_proxied_path;
use rolter_codec::h1::write::{write_head, write_head_and_body};
use rolter_codec::GatewayError;

use super::auth;
use super::client::{respond, write_out, ClientIo, Fate};
use super::models;
use super::record;
use super::request::{IoBufs, Request};
use super::route::{model_not_found, not_found};
use crate::path::state::WorkerState;

/// The path prefix of `GET /v1/models/{id}`.
const MODEL_PREFIX: &str = "/v1/models/";

/// Whether `req` is a request the gateway forwards: a `POST` to a proxied path, or a
/// passthrough request (any method but `HEAD`, whose answer would have no body to relay, on
/// a path a route's `passthrough` prefix covers). Proxied paths and the gateway's own
/// endpoints are never passthrough.
pub fn is_forwarded(state: &WorkerState, req: &Request<'_>) -> bool {
    let path = req.head.path(req.buf);
    if is_proxied_path(path) {
        return req.head.method == Method::POST;
    }
    req.head.method != Method::HEAD && !is_own(path) && is_passthrough(state, path)
}

/// Is `path` one of the gateway's own endpoints?
fn is_own(path: &str) -> bool {
    path == "/health" || path == "/v1/models" || path.starts_with(MODEL_PREFIX)
}

fn is_passthrough(state: &WorkerState, path: &str) -> bool {
    state
        .config
        .routes
        .iter()
        .any(|r| r.matcher.takes_passthrough(path))
}

/// Answers a request that is not forwarded.
pub async fn answer(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Fate {
    let limits = &state.config.server.limits;
    let path = req.head.path(req.buf);
    // With `[[keys]]`, the model list is for callers with a key too (`/health` stays open).
    let listing = path == "/v1/models" || path.starts_with(MODEL_PREFIX);
    let identified = if listing {
        auth::identify(state, req).map(|_| ())
    } else {
        Ok(())
    };
    let local: Result<&[u8], GatewayError> =
        identified.and_then(|()| match (&req.head.method, path) {
            (_, p) if is_proxied_path(p) => Err(GatewayError::client(
                405,
                "method_not_allowed",
                format!("{path} accepts only POST"),
            )),
            (&Method::GET | &Method::HEAD, "/health") => Ok(&br#"{"status":"ok"}"#[..]),
            (&Method::GET | &Method::HEAD, "/v1/models") => Ok(&state.models_body),
            (&Method::GET | &Method::HEAD, p) if p.starts_with(MODEL_PREFIX) => {
                let id = models::decode_id(&p[MODEL_PREFIX.len()..]);
                match state.model_bodies.get(id.as_ref()) {
                    Some(body) => Ok(body),
                    None => Err(model_not_found(&id)),
                }
            }
            (_, p) if is_own(p) => Err(GatewayError::client(
                405,
                "method_not_allowed",
                format!("{path} accepts only GET (and HEAD)"),
            )),
            (_, p) if is_passthrough(state, p) => Err(GatewayError::client(
                405,
                "method_not_allowed",
                format!("{path} is a passthrough path; it accepts any method but HEAD"),
            )),
            _ => Err(not_found(path)),
        });
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
    if req.head.method == Method::HEAD {
        // What GET would answer, without the body (RFC 9110 §9.3.2).
        write_head(
            &mut bufs.out,
            200,
            "application/json",
            &id,
            body.len(),
            req.close,
        );
    } else {
        write_head_and_body(&mut bufs.out, 200, "application/json", &id, body, req.close);
    }
    let fate = write_out(&mut io.wr, &mut bufs.out, limits.write_timeout).await;
    let written = bufs.out.len() as u64;
    record::finished(state, req, |entry| {
        entry.status = 200;
        entry.bytes_out = written;
    });
    fate
}
