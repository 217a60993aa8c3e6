//! Forwarding one request: routing by path, model and header, asking the route's strategy
//! for a target among the candidates, writing the upstream request, and retrying on
//! another target while that is still safe.
//!
//! Owns the upstream request's bytes: client auth, hop-by-hop and Connection-named
//! headers are removed, configured target headers are added, `X-Forwarded-For` is
//! replaced, and the body gets a fresh Content-Length. It must not relay response bytes
//! itself (that is `relay`).

use std::time::Instant as StdInstant;

use super::adapter_load::LoadResult;
use super::conn::{respond, ClientIo};
use super::inputs::{token_ids, Prompt, TokenSource};
use super::relay::{exchange, ClientSide, Explain, Outcome, Report};
use super::state::WorkerState;
use crate::config::{Route, Target};
use crate::error::{GatewayError, Retry};
use crate::http::head::{HeaderSpan, RequestHead};
use crate::http::response::{write_content_length, write_header};
use crate::http::{header_tokens, is_hop_by_hop};
use crate::openai::canonical;
use crate::openai::facts::{self, RequestFacts};
use crate::signals::exchange::{Record, Verdict};
use crate::signals::lora::adapter_key;
use crate::strategy::lora_aware::Residency;
use crate::strategy::{AsyncInputs, Candidate, Needs, Pick, PickRequest, Sample, SessionKey};

/// What happens to the client connection after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    KeepAlive,
    Close,
}

/// A parsed request, borrowed from the connection's buffers.
pub struct Request<'a> {
    pub head: &'a RequestHead,
    pub buf: &'a [u8],
    pub spans: &'a [HeaderSpan],
    pub body: &'a [u8],
    pub peer_ip: &'a str,
    /// The connection closes after this exchange.
    pub close: bool,
}

impl Request<'_> {
    pub fn header(&self, lower_name: &str) -> Option<&[u8]> {
        self.spans
            .iter()
            .find(|s| s.is(self.buf, lower_name))
            .map(|s| s.value(self.buf))
    }
}

/// Smallest upstream read; a read that fills the buffer doubles the next one (up to
/// [`MAX_UPSTREAM_READ`]), so SSE streams keep small buffers and large bodies move in large
/// reads.
pub const MIN_UPSTREAM_READ: usize = 4 * 1024;
/// Largest upstream read.
pub const MAX_UPSTREAM_READ: usize = 64 * 1024;

/// Buffers for one request, lent by the worker.
pub struct IoBufs {
    /// Bytes for the client.
    pub out: Vec<u8>,
    /// The upstream request.
    pub up: Vec<u8>,
    /// Upstream reads.
    pub ubuf: Vec<u8>,
    /// Forwardable response headers, scratch.
    pub hdrs: Vec<u8>,
    /// A request body decoded from chunked framing.
    pub body: Vec<u8>,
    /// The canonical prompt, for strategies that ask for it.
    pub prompt: Vec<u8>,
    /// Request bytes of the gateway's own calls made for an input (tokenize).
    pub side: Vec<u8>,
}

impl IoBufs {
    pub fn new() -> Self {
        IoBufs {
            out: Vec::with_capacity(4 * 1024),
            up: Vec::with_capacity(4 * 1024),
            ubuf: Vec::with_capacity(MIN_UPSTREAM_READ),
            hdrs: Vec::with_capacity(512),
            body: Vec::new(),
            prompt: Vec::new(),
            side: Vec::new(),
        }
    }
}

impl IoBufs {
    /// Largest capacity a buffer may keep when the set goes back to the worker's spares.
    pub const KEEP: usize = 64 * 1024;

    /// Empties every buffer and releases any that grew past [`Self::KEEP`] (a big body or
    /// response), so spare sets stay small.
    pub fn recycle(&mut self) {
        for b in [
            &mut self.out,
            &mut self.up,
            &mut self.ubuf,
            &mut self.hdrs,
            &mut self.body,
            &mut self.prompt,
            &mut self.side,
        ] {
            b.clear();
            if b.capacity() > Self::KEEP {
                *b = Vec::new();
            }
        }
    }
}

impl Default for IoBufs {
    fn default() -> Self {
        Self::new()
    }
}

/// Most attempts one request can make (first try plus the largest `retries`).
const MAX_ATTEMPTS: usize = 11;

/// Routes, picks and proxies one request, retrying elsewhere while allowed.
pub async fn forward(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Fate {
    let write_timeout = state.config.server.limits.write_timeout;
    let facts = match facts::extract(req.body) {
        Ok(f) => f,
        Err(e) => {
            state.record_gateway(e.status, e.code);
            return respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
        }
    };
    if facts.model.is_empty() {
        let e =
            GatewayError::client(400, "missing_model", "`model` is required").with_param("model");
        state.record_gateway(e.status, e.code);
        return respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
    }
    let path = req.head.path(req.buf);
    let route_idx = match match_route(
        &state.config.routes,
        &state.config.targets,
        path,
        &facts.model,
        req,
    ) {
        Some(i) => i,
        None => {
            let e = model_not_found(&facts.model);
            state.record_gateway(e.status, e.code);
            return respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
        }
    };
    let route = &state.config.routes[route_idx];
    let mut inputs = AsyncInputs::default();
    let tokens = &state.routes[route_idx].tokens;
    if !matches!(tokens, TokenSource::None) {
        let chat = path == "/v1/chat/completions";
        if chat || path == "/v1/completions" {
            let prompt = Prompt {
                chat,
                json: facts.prompt,
                model: &facts.model,
            };
            inputs.token_ids = token_ids(state, tokens, route, &prompt, &mut bufs.side).await;
        }
    }
    let mut lookup_key = None;
    if let (Some(client), Some(ids)) = (&state.routes[route_idx].lookup, &inputs.token_ids) {
        let found = client.lookup(ids, &mut bufs.prompt, &mut bufs.side).await;
        lookup_key = Some(found.key);
        state.links.record(Record::CacheLookup {
            route: route_idx as u16,
            result: found.result.label(),
            unknown_instances: found.unknown_instances as u32,
        });
        inputs.cached_tokens = found.holdings;
    }
    // Strategies that compare prompts get them whitespace-free, in a buffer lent for the
    // request (taken out of `bufs`, which the exchange borrows mutably meanwhile).
    let mut canonical = std::mem::take(&mut bufs.prompt);
    let prompt: &[u8] = if state.routes[route_idx]
        .needs
        .contains(Needs::CANONICAL_PROMPT)
    {
        canonical::minify(facts.prompt, &mut canonical);
        &canonical
    } else {
        facts.prompt
    };
    let preq = PickRequest {
        model: &facts.model,
        session: SessionKey {
            header: req.header("x-session-id").filter(|v| !v.is_empty()),
            prompt,
        },
        prompt,
        prompt_tokens: facts.prompt_tokens,
        max_tokens: facts.max_tokens,
        inputs: &inputs,
    };

    let explain = req.header("x-rolter-explain").is_some_and(|v| v == b"1");
    let mut tried = [usize::MAX; MAX_ATTEMPTS];
    let mut attempts = 0usize;
    let mut last_err: Option<GatewayError> = None;
    let fate = loop {
        // One clock read serves the pick and the routing record.
        let now = StdInstant::now();
        let picked = pick_target(state, route_idx, route, &preq, &tried[..attempts], now);
        let (tid, others, pick) = match picked {
            Ok(v) => v,
            Err(e) => {
                let e = last_err.take().unwrap_or(e);
                state.record_gateway(e.status, e.code);
                break respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
            }
        };
        state.routes[route_idx].strategy.borrow_mut().routed(
            &preq,
            tid,
            state.share.borrow_mut().for_route(route_idx),
            now,
        );
        if let (Some(client), Some(key), Some(ids)) = (
            &state.routes[route_idx].lookup,
            lookup_key,
            &inputs.token_ids,
        ) {
            client.routed(key, tid, u32::try_from(ids.len()).unwrap_or(u32::MAX));
        }
        if let Some(loader) = &state.routes[route_idx].adapters {
            let residency = state
                .candidates
                .borrow()
                .iter()
                .find(|c| c.target == tid)
                .map_or(Residency::UNKNOWN, |c| c.lora);
            let key = adapter_key(preq.model);
            if let Some(adapter) = loader.needed(key, residency) {
                let loaded = loader.load(state, tid, key, adapter, &mut bufs.side).await;
                state.links.record(Record::AdapterLoad {
                    target: tid as u16,
                    adapter: key,
                    loaded: loaded == LoadResult::Loaded,
                });
            }
        }
        let target = &state.config.targets[tid];
        let retries_left = (route.retries as usize)
            .saturating_sub(attempts)
            .min(others);
        build_upstream_request(&mut bufs.up, req, &facts, route, target);
        let load_at_send = state.load.load(tid);
        let mut report = Report::default();
        let outcome = {
            let _in_flight = state.load.enter(tid);
            exchange(
                state,
                tid,
                &mut io.wr,
                &io.reader,
                bufs,
                ClientSide {
                    http10: req.head.http10,
                    close: req.close,
                    explain: explain.then_some(Explain {
                        route: route_idx,
                        score: pick.score,
                        fallback: pick.fallback,
                        attempt: attempts + 1,
                    }),
                },
                retries_left > 0,
                &mut report,
            )
            .await
        };
        let verdict = verdict(&outcome, &report);
        let finished = StdInstant::now();
        let sent = report.sent.unwrap_or(finished);
        state.record_attempt(
            route_idx,
            Sample {
                target: tid,
                status: report.status,
                success: verdict == Verdict::Success,
                ttft: report.first_byte.map(|f| f.saturating_duration_since(sent)),
                duration: finished.saturating_duration_since(sent),
                load_at_send,
                prompt_tokens: preq.prompt_tokens,
                usage: report.usage,
                finished,
            },
            verdict,
        );
        tried[attempts] = tid;
        attempts += 1;
        match outcome {
            Outcome::Relayed { close } => break if close { Fate::Close } else { Fate::KeepAlive },
            Outcome::ClientGone => break Fate::Close,
            Outcome::Failed(e) => {
                if e.retry == Retry::Allowed && retries_left > 0 && attempts < MAX_ATTEMPTS {
                    last_err = Some(e);
                    continue;
                }
                break respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
            }
        }
    };
    bufs.prompt = canonical;
    // The client's reader kept watching throughout: a client that closed while the
    // response was being written ends the connection.
    if io.reader.is_gone() {
        Fate::Close
    } else {
        fate
    }
}

/// What an attempt says about its target.
fn verdict(outcome: &Outcome, report: &Report) -> Verdict {
    match outcome {
        Outcome::ClientGone => Verdict::ClientGone,
        Outcome::Relayed { .. } if !report.completed => Verdict::TargetFailed,
        Outcome::Relayed { .. } | Outcome::Failed(_) => match report.status {
            200..=299 if report.completed => Verdict::Success,
            // No response, or a server error (including the retryable 502/503/504).
            0 | 500..=599 => Verdict::TargetFailed,
            // A head was read but the response was malformed or cut before the client got it.
            200..=299 => Verdict::TargetFailed,
            _ => Verdict::Answered,
        },
    }
}

fn model_not_found(model: &str) -> GatewayError {
    GatewayError::client(
        404,
        "model_not_found",
        format!("The model `{model}` does not exist or is not served by this gateway."),
    )
    .with_param("model")
}

#[inline]
/// Whether `target` serves `model` (no `models` list: any).
pub(super) fn serves(target: &Target, model: &str) -> bool {
    target.models.is_empty() || target.models.iter().any(|m| m == model)
}

/// The first route whose rules all hold and one of whose targets serves the model.
pub fn match_route(
    routes: &[Route],
    targets: &[Target],
    path: &str,
    model: &str,
    req: &Request<'_>,
) -> Option<usize> {
    routes.iter().position(|r| {
        let m = &r.matcher;
        (m.paths.is_empty() || m.paths.iter().any(|p| p == path))
            && (m.models.is_empty() || m.models.iter().any(|x| x == model))
            && m.header
                .as_ref()
                .is_none_or(|(n, v)| req.header(n) == Some(v.as_bytes()))
            && r.targets.iter().any(|&t| serves(&targets[t], model))
    })
}

/// Builds the candidate set and asks the route's strategy. Returns the chosen target, how
/// many other candidates remain for a retry, and the strategy's pick (score, fallback).
fn pick_target(
    state: &WorkerState,
    route_idx: usize,
    route: &Route,
    preq: &PickRequest<'_>,
    tried: &[usize],
    now: StdInstant,
) -> Result<(usize, usize, Pick), GatewayError> {
    state.drain_signals();
    let mut cands = state.candidates.borrow_mut();
    cands.clear();
    let mut full = 0;
    let mut out = 0;
    // Adapter residency only for strategies that read it (the model is hashed once).
    let lora = state.routes[route_idx]
        .needs
        .contains(Needs::LORA_RESIDENCY)
        .then(|| state.load.lora.lookup(preq.model));
    for &t in &route.targets {
        let target = &state.config.targets[t];
        if !serves(target, preq.model) || tried.contains(&t) {
            continue;
        }
        if !state.load.eligible(t) {
            out += 1;
            continue;
        }
        if target
            .max_concurrent
            .is_some_and(|m| state.load.in_flight(t) >= u64::from(m))
        {
            full += 1;
            continue;
        }
        let load = state.load.load(t);
        cands.push(Candidate {
            target: t,
            weight: target.weight,
            load,
            tier: target.tier,
            queue_depth: state.load.queue_depth(t),
            kv_usage: state.load.kv_usage(t),
            lora: lora.as_ref().map_or(Residency::UNKNOWN, |l| {
                let r = l.residency(t);
                match &state.routes[route_idx].adapters {
                    Some(loader) => loader.residency(l.key(), t, r, now),
                    None => r,
                }
            }),
        });
    }
    drop(lora);
    if cands.is_empty() {
        let msg = if full > 0 {
            "every target for this model is at its max_concurrent limit"
        } else if out > 0 {
            "every target for this model is unhealthy or ejected"
        } else {
            "no target is available for this model"
        };
        return Err(GatewayError::internal(503, "no_available_target", msg).with_retry_after(1));
    }
    let pick = state.routes[route_idx]
        .strategy
        .borrow_mut()
        .pick(preq, &cands, now);
    match pick {
        Some(p) if p.index < cands.len() => {
            if let Some(reason) = p.fallback {
                state.links.record(Record::Fallback {
                    route: route_idx as u16,
                    reason,
                });
            }
            Ok((cands[p.index].target, cands.len() - 1, p))
        }
        _ => Err(GatewayError::internal(
            503,
            "no_available_target",
            "the route's strategy found no acceptable target",
        )
        .with_retry_after(1)),
    }
}

/// The values of the request's `Connection` fields, gathered once per request.
struct ConnectionTokens<'a> {
    values: [&'a [u8]; 4],
    count: usize,
    /// More than four `Connection` fields: fall back to scanning every field.
    overflow: bool,
}

impl<'a> ConnectionTokens<'a> {
    fn of(req: &Request<'a>) -> Self {
        let mut t = ConnectionTokens {
            values: [&[]; 4],
            count: 0,
            overflow: false,
        };
        for s in req.spans.iter().filter(|s| s.is(req.buf, "connection")) {
            if t.count == t.values.len() {
                t.overflow = true;
                break;
            }
            t.values[t.count] = s.value(req.buf);
            t.count += 1;
        }
        t
    }

    /// Does a `Connection` field name `name`?
    fn names(&self, name: &[u8], req: &Request<'_>) -> bool {
        let named = |v: &[u8]| header_tokens(v).any(|t| t.eq_ignore_ascii_case(name));
        if self.overflow {
            return req
                .spans
                .iter()
                .filter(|s| s.is(req.buf, "connection"))
                .any(|s| named(s.value(req.buf)));
        }
        self.values[..self.count].iter().any(|v| named(v))
    }
}

/// Is this client header withheld from the upstream?
fn withheld(
    name: &[u8],
    req: &Request<'_>,
    connection: &ConnectionTokens<'_>,
    route: &Route,
    target: &Target,
) -> bool {
    let Ok(name_str) = std::str::from_utf8(name) else {
        return true;
    };
    if is_hop_by_hop(name_str)
        || name.eq_ignore_ascii_case(b"host")
        || name.eq_ignore_ascii_case(b"expect")
        || name.eq_ignore_ascii_case(b"x-forwarded-for")
        || name.eq_ignore_ascii_case(b"forwarded")
        || name.eq_ignore_ascii_case(b"x-real-ip")
        || name.eq_ignore_ascii_case(b"content-encoding")
    {
        return true;
    }
    if !route.forward_client_auth
        && (name.eq_ignore_ascii_case(b"authorization")
            || name.eq_ignore_ascii_case(b"x-api-key")
            || name.eq_ignore_ascii_case(b"api-key"))
    {
        return true;
    }
    if target
        .headers
        .iter()
        .any(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
    {
        return true;
    }
    // Any header the client named in Connection is hop-by-hop for this hop.
    connection.names(name, req)
}

/// Writes the upstream request: a fresh head and framing, then the body (with the model name
/// swapped for the target's upstream name when one is configured).
pub fn build_upstream_request(
    out: &mut Vec<u8>,
    req: &Request<'_>,
    facts: &RequestFacts<'_>,
    route: &Route,
    target: &Target,
) {
    out.clear();
    out.extend_from_slice(req.head.method.as_str().as_bytes());
    out.push(b' ');
    // Like an SDK's base URL: a target URL with a path (".../v1") replaces the request's
    // leading "/v1"; without one the path goes through unchanged.
    let path = &req.buf[req.head.path.clone()];
    if target.base_path.is_empty() {
        out.extend_from_slice(path);
    } else {
        out.extend_from_slice(target.base_path.as_bytes());
        out.extend_from_slice(path.strip_prefix(b"/v1").unwrap_or(path));
    }
    out.extend_from_slice(&req.buf[req.head.query.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_header(out, b"host", target.host_header.as_bytes());
    let mut has_request_id = false;
    let connection = ConnectionTokens::of(req);
    for s in req.spans {
        let name = s.name(req.buf);
        if withheld(name, req, &connection, route, target) {
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-request-id") {
            has_request_id = true;
        }
        write_header(out, name, s.value(req.buf));
    }
    for (n, v) in &target.headers {
        write_header(out, n.as_bytes(), v.as_bytes());
    }
    write_header(out, b"x-forwarded-for", req.peer_ip.as_bytes());
    if !has_request_id {
        // Filled by the caller's state in `forward`; a stable id per attempt is not needed.
        let mut id = [0u8; 24];
        let n = request_id(&mut id);
        write_header(out, b"x-request-id", &id[..n]);
    }
    let upstream_model = target
        .upstream_models
        .get(facts.model.as_ref())
        .filter(|_| facts.model_span.is_some());
    match (upstream_model, &facts.model_span) {
        (Some(m), Some(span)) => {
            let quoted = serde_json::to_string(m).unwrap_or_default();
            let len = req.body.len() - span.len() + quoted.len();
            write_content_length(out, len as u64);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&req.body[..span.start]);
            out.extend_from_slice(quoted.as_bytes());
            out.extend_from_slice(&req.body[span.end..]);
        }
        _ => {
            write_content_length(out, req.body.len() as u64);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(req.body);
        }
    }
}

thread_local! {
    static REQUEST_SEQ: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// A request id unique within the process: a per-thread random prefix and a counter, hex.
fn request_id(out: &mut [u8; 24]) -> usize {
    REQUEST_SEQ.with(|c| {
        let (mut prefix, n) = c.get();
        if prefix == 0 {
            prefix = fastrand::u64(1..u64::from(u32::MAX));
        }
        c.set((prefix, n + 1));
        let v = (prefix << 32) ^ n;
        let hex = b"0123456789abcdef";
        for (i, slot) in out.iter_mut().take(16).enumerate() {
            *slot = hex[((v >> (60 - 4 * i)) & 0xf) as usize];
        }
        16
    })
}
