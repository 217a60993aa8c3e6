//! The admin listener: `GET /metrics` (the gateway's own Prometheus metrics),
//! `GET /admin/targets` (health, load, queue depth, TTFT average and engine state per
//! target, as JSON), `GET|POST /admin/adaptive` (the adaptive kill switch), `GET
//! /admin/config` (the running configuration's file, SHA-256 and reload counts), `POST
//! /admin/reload` (reload the configuration file, answered when applied or refused), `GET
//! /admin/state` (the shared state store: reachable or not, the last error, what each route
//! keeps there, the counters), `GET /healthz`
//! (the process is up) and `GET /readyz` (every route has an eligible target and the gateway
//! is not draining).
//!
//! Runs on the control thread, one request per connection. When a token is configured every
//! path but `/healthz` and `/readyz` needs `Authorization: Bearer <token>`. Mutations are
//! POST only. It must never be reachable from the data-plane listener.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

use crate::control::thread_state::Plane;
use crate::lifecycle::Lifecycle;
use crate::reload::ReloadStats;
use rolter_codec::error::GatewayError;
use rolter_codec::h1::write::write_head_and_body;
use rolter_strategy::Switches;

/// Largest admin request (head and body).
const MAX_REQUEST: usize = 16 * 1024;
/// Time allowed to send a whole admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What every admin request may read or change, shared by the connections.
#[derive(Clone)]
struct Admin {
    plane: Rc<RefCell<Plane>>,
    switches: Arc<Switches>,
    flags: Arc<Lifecycle>,
    reloads: Arc<ReloadStats>,
}

/// Accepts admin connections until the gateway stops.
pub async fn serve(
    listener: TcpListener,
    plane: Rc<RefCell<Plane>>,
    switches: Arc<Switches>,
    flags: Arc<Lifecycle>,
    reloads: Arc<ReloadStats>,
) {
    let admin = Admin {
        plane,
        switches,
        flags,
        reloads,
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                monoio::spawn(handle(stream, admin.clone()));
            }
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One parsed admin request.
struct AdminRequest {
    method: String,
    path: String,
    query: String,
    authorization: Option<Vec<u8>>,
    body: Vec<u8>,
}

async fn handle(mut stream: TcpStream, admin: Admin) {
    let mut out = Vec::with_capacity(1024);
    match monoio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream)).await {
        Ok(Ok(req)) if req.path == "/admin/reload" => {
            if authorized_or_401(&req, &admin.plane, &mut out) {
                reload(&req, &admin.reloads, &mut out).await;
            }
        }
        Ok(Ok(req)) => {
            if authorized_or_401(&req, &admin.plane, &mut out) {
                respond(&req, &admin, &mut out);
            }
        }
        Ok(Err(e)) => e.write_response(&mut out, true),
        Err(_) => GatewayError::client(
            408,
            "request_timeout",
            "the admin request was not sent in time",
        )
        .write_response(&mut out, true),
    }
    let _ = stream.write_all(out).await;
}

async fn read_request(stream: &mut TcpStream) -> Result<AdminRequest, GatewayError> {
    let bad = |m: &str| GatewayError::client(400, "invalid_request", m.to_string());
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let mut length = 0usize;
                let mut authorization = None;
                for h in req.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|v| v.trim().parse().ok())
                            .ok_or_else(|| bad("invalid Content-Length"))?;
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                        return Err(GatewayError::client(
                            411,
                            "length_required",
                            "the admin API takes bodies with Content-Length only",
                        ));
                    } else if h.name.eq_ignore_ascii_case("authorization") {
                        authorization = Some(h.value.to_vec());
                    }
                }
                if len + length > MAX_REQUEST {
                    return Err(GatewayError::client(
                        413,
                        "request_too_large",
                        "admin request too large",
                    ));
                }
                let target = req.path.unwrap_or("/");
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                let method = req.method.unwrap_or("").to_string();
                let (path, query) = (path.to_string(), query.to_string());
                while buf.len() < len + length {
                    buf = read_some(stream, buf)
                        .await
                        .ok_or_else(|| bad("truncated body"))?;
                }
                return Ok(AdminRequest {
                    method,
                    path,
                    query,
                    authorization,
                    body: buf[len..len + length].to_vec(),
                });
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() >= MAX_REQUEST {
                    return Err(GatewayError::client(
                        431,
                        "request_header_too_large",
                        "admin request head too large",
                    ));
                }
                buf = read_some(stream, buf)
                    .await
                    .ok_or_else(|| bad("connection closed mid-request"))?;
            }
            Err(_) => return Err(bad("malformed HTTP request")),
        }
    }
}

async fn read_some(stream: &mut TcpStream, mut buf: Vec<u8>) -> Option<Vec<u8>> {
    let before = buf.len();
    buf.reserve(4096);
    let cap = buf.capacity();
    let (r, slice) = stream.read(buf.slice_mut(before..cap)).await;
    match r {
        Ok(n) if n > 0 => Some(slice.into_inner()),
        _ => None,
    }
}

/// Constant-time comparison of the presented credentials with the token.
fn authorized(presented: Option<&[u8]>, token: &str) -> bool {
    let Some(p) = presented else {
        return false;
    };
    let Some(p) = p.strip_prefix(b"Bearer ") else {
        return false;
    };
    let t = token.as_bytes();
    if p.len() != t.len() {
        return false;
    }
    p.iter().zip(t).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Whether the request may go on: always for `/healthz` and `/readyz`, else when no token
/// is configured or it carries the token (read from the running configuration, so a
/// reload can rotate it). Writes the 401 otherwise.
fn authorized_or_401(req: &AdminRequest, plane: &Rc<RefCell<Plane>>, out: &mut Vec<u8>) -> bool {
    let open = matches!(req.path.as_str(), "/healthz" | "/readyz");
    let p = plane.borrow();
    let token = p.config.admin.as_ref().and_then(|a| a.token.as_deref());
    match token {
        Some(token) if !open && !authorized(req.authorization.as_deref(), token) => {
            GatewayError::client(
                401,
                "invalid_api_key",
                "the admin API needs `Authorization: Bearer <token>`",
            )
            .write_response(out, true);
            false
        }
        _ => true,
    }
}

/// `POST /admin/reload`: runs the reload on a thread of its own (it loads files and waits
/// for every worker to switch) and answers with its outcome: 200 with what changed, or
/// 400 (the file has errors), 409 (a setting needs a restart), 500 (it could not be
/// applied), each with every message; nothing changes unless it is 200.
async fn reload(req: &AdminRequest, reloads: &Arc<ReloadStats>, out: &mut Vec<u8>) {
    if req.method != "POST" {
        let e = GatewayError::client(405, "method_not_allowed", "use POST on /admin/reload").body();
        write_head_and_body(out, 405, "application/json", &[("allow", "POST")], &e, true);
        return;
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let stats = reloads.clone();
    let spawned = std::thread::Builder::new()
        .name("rolter-reload".into())
        .spawn(move || {
            let _ = tx.send(stats.trigger());
        });
    if let Err(e) = spawned {
        GatewayError::internal(
            500,
            "reload_failed",
            format!("cannot start the reload: {e}"),
        )
        .write_response(out, true);
        return;
    }
    let result = loop {
        match rx.try_recv() {
            Ok(r) => break r,
            Err(crossbeam_channel::TryRecvError::Empty) => {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                break Err(crate::reload::ReloadError::Failed(
                    "the reload thread ended without an answer".into(),
                ))
            }
        }
    };
    let (status, body) = match result {
        Ok(r) => (
            200,
            serde_json::json!({
                "status": "reloaded",
                "sha256": r.digest,
                "targets": r.targets,
                "targets_unchanged": r.targets_kept,
                "routes": r.routes,
                "routes_kept_state": r.routes_kept,
            }),
        ),
        Err(e) => {
            let status = match e {
                crate::reload::ReloadError::Invalid { .. } => 400,
                crate::reload::ReloadError::RestartNeeded(_) => 409,
                crate::reload::ReloadError::Failed(_) => 500,
            };
            (
                status,
                serde_json::json!({
                    "status": "refused",
                    "result": e.label(),
                    "message": e.to_string(),
                }),
            )
        }
    };
    let body = serde_json::to_vec_pretty(&body).unwrap_or_default();
    write_head_and_body(out, status, "application/json", &[], &body, true);
}

/// Answers every admin endpoint but `/admin/reload`: a dispatch on path and method.
fn respond(req: &AdminRequest, admin: &Admin, out: &mut Vec<u8>) {
    let now = Instant::now();
    let plane = &admin.plane;
    match (req.path.as_str(), req.method.as_str()) {
        ("/metrics", "GET") => metrics(&plane.borrow(), now, out),
        ("/admin/targets", "GET") => write_json(out, 200, &plane.borrow().targets_json(now)),
        ("/admin/adaptive", "GET") => write_json(
            out,
            200,
            &serde_json::json!({ "enabled": admin.switches.adaptive() }),
        ),
        ("/admin/adaptive", "POST") => switch_adaptive(req, &admin.switches, out),
        ("/admin/config", "GET") => {
            write_json(out, 200, &config_json(&plane.borrow(), &admin.reloads))
        }
        ("/healthz", "GET") => write_head_and_body(out, 200, "text/plain", &[], b"ok\n", true),
        ("/readyz", "GET") => readiness(&plane.borrow(), &admin.flags, out),
        ("/admin/state", "GET") => write_json(out, 200, &state_json(&plane.borrow())),
        (
            "/metrics" | "/admin/targets" | "/admin/config" | "/admin/state" | "/healthz"
            | "/readyz",
            _,
        ) => method_not_allowed(req, "GET", out),
        ("/admin/adaptive", _) => method_not_allowed(req, "GET, POST", out),
        _ => GatewayError::client(
            404,
            "not_found",
            format!("no admin endpoint at {}", req.path),
        )
        .write_response(out, true),
    }
}

/// Writes an answer with `status` and `v` as its pretty-printed JSON body.
fn write_json(out: &mut Vec<u8>, status: u16, v: &serde_json::Value) {
    let body = serde_json::to_vec_pretty(v).unwrap_or_default();
    write_head_and_body(out, status, "application/json", &[], &body, true);
}

/// Writes the 405 for a method `req.path` does not take, with the `allow`ed ones.
fn method_not_allowed(req: &AdminRequest, allow: &str, out: &mut Vec<u8>) {
    let e = GatewayError::client(
        405,
        "method_not_allowed",
        format!("use {allow} on {}", req.path),
    )
    .body();
    write_head_and_body(out, 405, "application/json", &[("allow", allow)], &e, true);
}

/// `GET /metrics`: the whole metric set in the Prometheus text format.
fn metrics(plane: &Plane, now: Instant, out: &mut Vec<u8>) {
    let mut text = String::with_capacity(16 * 1024);
    plane.render_metrics(now, &mut text);
    write_head_and_body(
        out,
        200,
        "text/plain; version=0.0.4; charset=utf-8",
        &[],
        text.as_bytes(),
        true,
    );
}

/// `POST /admin/adaptive`: sets the kill switch and answers with the new and old setting.
fn switch_adaptive(req: &AdminRequest, switches: &Switches, out: &mut Vec<u8>) {
    match adaptive_setting(req) {
        Ok(on) => {
            let was = switches.adaptive();
            switches.set_adaptive(on);
            if was != on {
                tracing::warn!(enabled = on, "adaptive routing switched by the admin API");
            }
            write_json(
                out,
                200,
                &serde_json::json!({ "enabled": on, "previous": was }),
            )
        }
        Err(e) => e.write_response(out, true),
    }
}

/// `GET /admin/config`'s document: the running file, its targets and routes, the reload
/// counts and the keys' summary.
fn config_json(plane: &Plane, reloads: &ReloadStats) -> serde_json::Value {
    let running = reloads.running();
    let counts: serde_json::Map<String, serde_json::Value> = reloads
        .counts()
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    serde_json::json!({
        "file": running.source,
        "sha256": running.digest,
        "targets": plane.config.targets.iter().map(|t| &t.name).collect::<Vec<_>>(),
        "routes": plane.config.routes.iter().map(|r| serde_json::json!({
            "name": r.name,
            "strategy": r.strategy.name(),
        })).collect::<Vec<_>>(),
        "last_successful_load_unix": reloads.last_success(),
        "reloads": counts,
        "last_reload_error": running.last_error,
        "auth": auth_summary(&plane.config),
    })
}

/// `GET /readyz`: 200 when every route has an eligible target and the gateway is not
/// draining, else 503 saying which.
fn readiness(plane: &Plane, flags: &Lifecycle, out: &mut Vec<u8>) {
    let (status, body): (u16, &[u8]) = match (flags.draining(), plane.ready()) {
        (true, _) => (503, b"draining\n"),
        (false, false) => (503, b"a route has no eligible target\n"),
        (false, true) => (200, b"ready\n"),
    };
    write_head_and_body(out, status, "text/plain", &[], body, true)
}

/// `GET /admin/state`'s document: the shared state store's status and what each route
/// keeps there, or that no `[state]` is configured.
fn state_json(plane: &Plane) -> serde_json::Value {
    match &plane.fleet {
        Some(f) => {
            let f = f.borrow();
            let mut doc = f.stats.json();
            doc["configured"] = true.into();
            doc["routes"] = f.routes_json();
            doc
        }
        None => serde_json::json!({
            "configured": false,
            "message": "no [state] section: every replica routes on its own state",
        }),
    }
}

/// `POST /admin/adaptive` with `{"enabled": false}` or `?enabled=false`.
fn adaptive_setting(req: &AdminRequest) -> Result<bool, GatewayError> {
    let bad = || {
        GatewayError::client(
            400,
            "invalid_request",
            "send {\"enabled\": true|false} or ?enabled=true|false",
        )
        .with_param("enabled")
    };
    for pair in req.query.split('&') {
        match pair {
            "enabled=true" | "enabled=1" | "enabled=on" => return Ok(true),
            "enabled=false" | "enabled=0" | "enabled=off" => return Ok(false),
            _ => {}
        }
    }
    let v: serde_json::Value = serde_json::from_slice(&req.body).map_err(|_| bad())?;
    v.get("enabled").and_then(|e| e.as_bool()).ok_or_else(bad)
}

/// `/admin/config`'s `auth`: `"open"` without `[[keys]]`, else each key's name, routes,
/// models and limits (never its hash) and the keys file.
fn auth_summary(config: &rolter_config::Config) -> serde_json::Value {
    if config.keys.is_empty() {
        return "open".into();
    }
    let keys: Vec<serde_json::Value> = config
        .keys
        .keys
        .iter()
        .map(|k| {
            serde_json::json!({
                "name": k.name,
                "routes": k.routes.as_ref().map(|r| {
                    r.iter().map(|&i| config.routes[i].name.as_str()).collect::<Vec<_>>()
                }),
                "models": k.models,
                "requests_per_minute": k.requests_per_minute,
                "tokens_per_minute": k.tokens_per_minute,
            })
        })
        .collect();
    serde_json::json!({
        "keys": keys,
        "keys_file": config.keys.file.as_ref().map(|f| f.display().to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_is_checked_exactly() {
        assert!(authorized(Some(b"Bearer s3cret"), "s3cret"));
        assert!(!authorized(Some(b"Bearer s3cre"), "s3cret"));
        assert!(!authorized(Some(b"Bearer s3cret2"), "s3cret"));
        assert!(!authorized(Some(b"Basic s3cret"), "s3cret"));
        assert!(!authorized(None, "s3cret"));
    }

    #[test]
    fn adaptive_setting_reads_query_or_json() {
        let req = |query: &str, body: &str| AdminRequest {
            method: "POST".into(),
            path: "/admin/adaptive".into(),
            query: query.into(),
            authorization: None,
            body: body.as_bytes().to_vec(),
        };
        assert!(!adaptive_setting(&req("enabled=false", "")).unwrap());
        assert!(adaptive_setting(&req("", r#"{"enabled": true}"#)).unwrap());
        assert_eq!(
            adaptive_setting(&req("", r#"{"enabled": "no"}"#))
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(adaptive_setting(&req("x=1", "")).unwrap_err().status, 400);
    }
}
