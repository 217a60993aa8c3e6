//! An entry as one JSON line: the fields in a fixed order, names resolved from the
//! configuration the request was served with, times in RFC 3339 UTC and milliseconds.
//!
//! Owns the line's shape (documented in `docs/operations.md`, "Access log"). It must not
//! write anything.

use std::borrow::Cow;

use rolter_config::Config;
use serde::Serialize;

use super::entry::Entry;

#[derive(Serialize)]
struct Line<'a> {
    time: String,
    request_id: &'a str,
    client: String,
    method: &'a str,
    path: Cow<'a, str>,
    route: Option<&'a str>,
    strategy: Option<&'a str>,
    target: Option<&'a str>,
    model: Option<Cow<'a, str>>,
    status: u16,
    upstream_status: Option<u16>,
    attempts: u8,
    flags: String,
    error: Option<&'a str>,
    ttft_ms: Option<f64>,
    duration_ms: f64,
    bytes_in: u64,
    bytes_out: u64,
    prompt_tokens: Option<u32>,
    completion_tokens: Option<u32>,
    tokens_estimated: bool,
    fallback: Option<&'a str>,
    key: Option<&'a str>,
    /// Only with `[[classes]]`: the request's class.
    #[serde(skip_serializing_if = "Option::is_none")]
    class: Option<&'a str>,
    /// Only on a route with `tenant_header`: the tenant fair queueing served the request
    /// as (elsewhere the tenant is the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<Cow<'a, str>>,
    /// Only for a request that waited in its route's queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_wait_ms: Option<f64>,
    /// Only on a disaggregated route: the prefill legs (the fields above are the decode's).
    #[serde(skip_serializing_if = "Option::is_none")]
    prefill: Option<Prefill<'a>>,
}

/// A disaggregated request's prefill side.
#[derive(Serialize)]
struct Prefill<'a> {
    target: Option<&'a str>,
    status: Option<u16>,
    attempts: u8,
    time_ms: Option<f64>,
}

/// Milliseconds with microsecond precision.
fn ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn fields<'a>(e: &'a Entry, config: &'a Config) -> Line<'a> {
    let route = e.route.and_then(|r| config.routes.get(r as usize));
    let model = e.model.text();
    let path = e.path.text();
    let line = Line {
        time: humantime::format_rfc3339_millis(e.time).to_string(),
        request_id: e.request_id.as_str(),
        client: e.client.to_string(),
        method: e.method,
        path,
        route: route.map(|r| r.name.as_str()),
        strategy: route.map(|r| r.strategy.name()),
        target: e
            .target
            .and_then(|t| config.targets.get(t as usize))
            .map(|t| t.name.as_str()),
        model: (!model.is_empty()).then_some(model),
        status: e.status,
        upstream_status: (e.upstream_status != 0).then_some(e.upstream_status),
        attempts: e.attempts,
        flags: e.flags.names(),
        error: e.error,
        ttft_ms: e.ttft.map(ms),
        duration_ms: ms(e.duration),
        bytes_in: e.bytes_in,
        bytes_out: e.bytes_out,
        prompt_tokens: e.prompt_tokens,
        completion_tokens: e.completion_tokens,
        tokens_estimated: e.tokens_estimated,
        fallback: e.fallback,
        key: e
            .key
            .and_then(|k| config.keys.keys.get(k as usize))
            .map(|k| k.name.as_str()),
        class: e
            .class
            .and_then(|c| config.classes.get(c as usize))
            .map(|c| c.name.as_str()),
        tenant: (!e.tenant.is_empty()).then(|| e.tenant.text()),
        queue_wait_ms: (e.queue_wait_us > 0).then(|| f64::from(e.queue_wait_us) / 1000.0),
        prefill: e.prefill.map(|p| Prefill {
            target: p
                .target
                .and_then(|t| config.targets.get(t as usize))
                .map(|t| t.name.as_str()),
            status: (p.status != 0).then_some(p.status),
            attempts: p.attempts,
            time_ms: p.time.map(ms),
        }),
    };
    line
}

/// Appends the entry's line and a newline to `out` (a batch of lines for the writer).
pub fn write(e: &Entry, config: &Config, out: &mut Vec<u8>) {
    let line = fields(e, config);
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}
