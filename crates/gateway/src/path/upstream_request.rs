//! The upstream request's bytes: method and path (a target URL's base path replacing the
//! leading `/v1`, or less its own `/v1` before a path outside `/v1`), `Host` from the
//! target, the client's headers minus hop-by-hop ones, those named in `Connection`,
//! `Expect`, forwarding headers and (unless the route says otherwise) the client's
//! credentials (the header that carried a gateway API key always) and its `x-request-id`s;
//! then the target's configured headers, a fresh
//! `X-Forwarded-For`, the request's one `x-request-id` (the client's when valid, else
//! generated), and a fresh Content-Length over the body, with the model (a JSON string or
//! a form field) swapped for the target's upstream name.
//!
//! A large body is not copied: the request's bytes then name where in the read buffer it
//! lies ([`Outgoing::body_in_place`]), and the write gathers the parts. A leg that changes
//! the body (a disaggregated route's fields, a data-parallel rank in the body: see
//! [`leg_body`]) writes it again after the head instead. A vLLM data-parallel rank is sent
//! as `X-data-parallel-rank`.
//!
//! Owns those bytes only; it writes into a reused buffer and must not allocate per
//! request beyond what the buffer needs.

use rolter_codec::api::fields::Fields;
use rolter_codec::h1::write::{write_content_length, write_header};
use rolter_codec::h1::{header_tokens, is_hop_by_hop};
use rolter_codec::translate::{self, Api, Pair, Reply};
use rolter_codec::GatewayError;
use rolter_config::{EngineKind, Target};

use super::exchange::Exchange;
use super::leg_body::{self, LegBody};
use super::outgoing::Outgoing;
use super::request::Request;
use super::route::Routed;
use super::spans::{self, RequestTrace};

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
    routed: &Routed<'_>,
    target: &Target,
    translation: Option<Pair>,
) -> bool {
    let (route, key_header) = (routed.route, routed.key_header);
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
        || name.eq_ignore_ascii_case(b"x-request-id")
        // The gateway chose the rank.
        || (target.dp.is_some() && name.eq_ignore_ascii_case(b"x-data-parallel-rank"))
    {
        return true;
    }
    if key_header.is_some_and(|h| name.eq_ignore_ascii_case(h.as_bytes())) {
        return true;
    }
    if let Some(pair) = translation {
        // A translated answer must come unencoded, and one API's headers mean nothing to
        // the other's engine (an Anthropic target's version is the target's own).
        let anthropic = name.len() >= 10 && name[..10].eq_ignore_ascii_case(b"anthropic-");
        if name.eq_ignore_ascii_case(b"accept-encoding")
            || (anthropic && pair.engine != Api::Messages)
            || (anthropic && name.eq_ignore_ascii_case(b"anthropic-version"))
        {
            return true;
        }
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

/// Writes the upstream request of exchange `ex` to `target`: [`build`] with what the
/// exchange's legs change in the body (a disaggregated route's fields, on the body's
/// fields parsed once for every leg).
pub fn build_leg(up: &mut Outgoing, ex: &Exchange<'_>, tid: usize) {
    let target = &ex.state.config.targets[tid];
    let reported = ex.state.usage_reported(tid);
    let edit = Rewrite {
        leg: &ex.body,
        fields: ex.fields,
        class: Some(ex.admit.class),
        trace: ex.trace.map(|t| (t, t.attempt(tid))),
        ask_usage: reported && asks_usage(ex.req, ex.routed, &ex.body, target),
    };
    write(up, ex.req, ex.routed, edit, target);
    // A client that asked for usage itself gets it from an engine that reports it: its
    // stream's deltas need no counting either.
    let facts = &ex.routed.facts;
    up.usage_expected =
        up.asked_usage || (reported && facts.stream && facts.include_usage && up.reply.is_none());
}

/// What a request asks the engine for when the gateway asks for a stream's usage.
pub const STREAM_USAGE: &str = r#"{"include_usage":true}"#;
/// The same, as the body's first field.
const STREAM_USAGE_FIELD: &[u8] = br#""stream_options":{"include_usage":true},"#;

/// Whether the request to `target` asks the engine for the stream's usage on the client's
/// behalf (`stream_usage = "ask"`): a streamed chat or completions request with no
/// `stream_options` of its own, relayed to the client (not vLLM's prefill leg).
fn asks_usage(req: &Request<'_>, routed: &Routed<'_>, leg: &LegBody, target: &Target) -> bool {
    let facts = &routed.facts;
    facts.stream
        && !facts.stream_options
        && facts.model_is_json
        && !leg.vllm_prefill
        && target.stream_usage == rolter_config::StreamUsage::Ask
        && matches!(
            &req.buf[req.head.path.clone()],
            b"/v1/chat/completions" | b"/v1/completions"
        )
}

/// Where `body` (a JSON object) opens: just past its `{`.
fn object_start(body: &[u8]) -> Option<usize> {
    let at = body.iter().position(|b| !b" \t\r\n".contains(b))?;
    (body[at] == b'{').then_some(at + 1)
}

/// Writes the upstream request of a co-located request to `target`: a fresh head and
/// framing, then the body (with the model name swapped for the target's upstream name
/// when one is configured), copied or in place; or, when the target takes a data-parallel
/// rank in the body, the body written again with it.
pub fn build(up: &mut Outgoing, req: &Request<'_>, routed: &Routed<'_>, target: &Target) {
    let edit = Rewrite {
        leg: &LegBody::default(),
        fields: None,
        class: None,
        trace: None,
        ask_usage: false,
    };
    write(up, req, routed, edit, target);
}

/// What a leg changes in the body, and the body's fields when they were parsed already.
#[derive(Clone, Copy)]
struct Rewrite<'a> {
    leg: &'a LegBody,
    fields: Option<&'a Fields<'a>>,
    /// The request's class, told to a target that schedules by it (`priority_field`).
    class: Option<usize>,
    /// The request's trace and the attempt's span id, told to the engine (`traceparent`).
    trace: Option<(&'a RequestTrace, [u8; 8])>,
    /// Ask the engine for the stream's usage (`stream_usage = "ask"`, [`asks_usage`]).
    ask_usage: bool,
}

fn write(
    up: &mut Outgoing,
    req: &Request<'_>,
    routed: &Routed<'_>,
    edit: Rewrite<'_>,
    target: &Target,
) {
    let facts = &routed.facts;
    up.clear();
    let translation = translation(req, target);
    let head = Head {
        translation,
        trace: edit.trace,
    };
    write_head(&mut up.bytes, req, routed, target, head);
    let upstream_model = target
        .upstream_models
        .get(facts.model.as_ref())
        .filter(|_| facts.model_span.is_some());
    let priority = target
        .priority
        .as_ref()
        .zip(edit.class)
        .and_then(|(p, c)| Some((p.field.as_str(), p.values.get(c)?.to_string())));
    if let Some(pair) = translation {
        let priority = priority.as_ref().map(|(f, v)| (*f, v.as_str()));
        let model = upstream_model.map(String::as_str);
        return write_translated(up, req.body, (edit.leg, target), pair, (model, priority));
    }
    // The field goes first, where the body opens (a body that is no object goes as it is).
    let usage_at = object_start(req.body).filter(|_| edit.ask_usage);
    up.asked_usage = usage_at.is_some();
    if !edit.leg.is_empty() || leg_body::rank_in_body(target) || priority.is_some() {
        let parsed;
        let fields = match edit.fields {
            Some(f) => Some(f),
            None => {
                parsed = Fields::parse(req.body).ok();
                parsed.as_ref()
            }
        };
        // A body that is not a JSON object goes unchanged.
        if let Some(fields) = fields {
            let model = upstream_model.map(|m| serde_json::to_string(m).unwrap_or_default());
            let mut body = std::mem::take(&mut up.scratch);
            body.clear();
            let priority = priority.as_ref().map(|(f, v)| (*f, v.as_str()));
            let changes = leg_body::Changes {
                model: model.as_deref(),
                priority,
                stream_options: usage_at.map(|_| STREAM_USAGE),
            };
            leg_body::write(fields, edit.leg, target, changes, &mut body);
            write_content_length(&mut up.bytes, body.len() as u64);
            up.bytes.extend_from_slice(b"\r\n");
            up.bytes.extend_from_slice(&body);
            up.scratch = body;
            return;
        }
    }
    if let Some(at) = usage_at {
        let model = upstream_model.zip(facts.model_span.clone());
        return write_asking_usage(up, req, at, model.map(|(m, span)| (m.as_str(), span)));
    }
    let out = &mut up.bytes;
    match (upstream_model, &facts.model_span) {
        (Some(m), Some(span)) => {
            // A form field's value is its raw bytes; a JSON one is a quoted string.
            let quoted = if facts.model_is_json {
                serde_json::to_string(m).unwrap_or_default()
            } else {
                m.clone()
            };
            let len = req.body.len() - span.len() + quoted.len();
            write_content_length(out, len as u64);
            out.extend_from_slice(b"\r\n");
            if let Some(p) = req.body_in_place {
                let end = p.at + req.body.len();
                up.body_in_place(p.buf, p.at..p.at + span.start, p.at + span.end..end);
                up.bytes.extend_from_slice(quoted.as_bytes());
            } else {
                out.extend_from_slice(&req.body[..span.start]);
                out.extend_from_slice(quoted.as_bytes());
                out.extend_from_slice(&req.body[span.end..]);
            }
        }
        _ => {
            write_content_length(out, req.body.len() as u64);
            out.extend_from_slice(b"\r\n");
            if let Some(p) = req.body_in_place {
                up.body_in_place(p.buf, p.at..p.at + req.body.len(), 0..0);
            } else {
                out.extend_from_slice(req.body);
            }
        }
    }
}

/// Writes the body with the stream's usage asked for ([`STREAM_USAGE_FIELD`] at `at`, where
/// the object opens), and the model swapped for `model`'s name over its span, if one is
/// configured: in place when only the field is added, else copied.
fn write_asking_usage(
    up: &mut Outgoing,
    req: &Request<'_>,
    at: usize,
    model: Option<(&str, std::ops::Range<usize>)>,
) {
    let body = req.body;
    let Some((name, span)) = model.filter(|(_, span)| span.start >= at) else {
        write_content_length(
            &mut up.bytes,
            (body.len() + STREAM_USAGE_FIELD.len()) as u64,
        );
        up.bytes.extend_from_slice(b"\r\n");
        if let Some(p) = req.body_in_place {
            up.body_in_place(p.buf, p.at..p.at + at, p.at + at..p.at + body.len());
            up.bytes.extend_from_slice(STREAM_USAGE_FIELD);
        } else {
            up.bytes.extend_from_slice(&body[..at]);
            up.bytes.extend_from_slice(STREAM_USAGE_FIELD);
            up.bytes.extend_from_slice(&body[at..]);
        }
        return;
    };
    let quoted = serde_json::to_string(name).unwrap_or_default();
    let len = body.len() + STREAM_USAGE_FIELD.len() - span.len() + quoted.len();
    let out = &mut up.bytes;
    write_content_length(out, len as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(STREAM_USAGE_FIELD);
    out.extend_from_slice(&body[at..span.start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[span.end..]);
}

/// What the head says beyond the client's request: the API it is translated to, the
/// trace it belongs to.
#[derive(Clone, Copy)]
struct Head<'a> {
    translation: Option<Pair>,
    trace: Option<(&'a RequestTrace, [u8; 8])>,
}

/// The translation a request to `target` needs: a `POST` to an API the target does not
/// speak, which it speaks another one for.
fn translation(req: &Request<'_>, target: &Target) -> Option<Pair> {
    // Most targets speak every API they are sent: no look at the path for them.
    if target.api == rolter_config::TargetApi::default() || req.head.method != http::Method::POST {
        return None;
    }
    let client = Api::of_path(&req.buf[req.head.path.clone()])?;
    Pair::new(client, target.api.engine_api_for(client)?)
}

/// Writes the body of a request translated as `pair` after the head: the client's body in
/// the engine's API (with the target's model name), then the leg's changes, the body rank
/// and the priority field on it. The answer's translation goes with the request
/// (`up.reply`); a body the engine's API cannot carry is refused (`up.refused`) and never
/// sent.
fn write_translated(
    up: &mut Outgoing,
    client_body: &[u8],
    (leg, target): (&LegBody, &Target),
    pair: Pair,
    (model, priority): (Option<&str>, Option<(&str, &str)>),
) {
    let mut body = std::mem::take(&mut up.scratch);
    body.clear();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let seed = format!("{:024x}", fastrand::u128(..) >> 32);
    match translate::request(pair, client_body, model, created, &seed, &mut body) {
        Ok(asked) => up.reply = Some(Box::new(Reply::new(pair, asked))),
        Err(r) => {
            let at = r.param.map(|p| format!(" (at `{p}`)")).unwrap_or_default();
            up.refused = Some(GatewayError::client(
                400,
                "untranslatable_request",
                format!(
                    "the target `{}` speaks another API, and this request cannot be translated for it{at}: {}",
                    target.name, r.message
                ),
            ));
            up.scratch = body;
            return;
        }
    }
    if !leg.is_empty() || leg_body::rank_in_body(target) || priority.is_some() {
        if let Ok(fields) = Fields::parse(&body) {
            let mut changed = Vec::with_capacity(body.len() + 256);
            let changes = leg_body::Changes {
                model: None,
                priority,
                stream_options: None,
            };
            leg_body::write(&fields, leg, target, changes, &mut changed);
            body = changed;
        }
    }
    write_content_length(&mut up.bytes, body.len() as u64);
    up.bytes.extend_from_slice(b"\r\n");
    up.bytes.extend_from_slice(&body);
    up.scratch = body;
}

/// The request line and the headers, up to the framing: the client's forwardable headers,
/// the target's, `X-Forwarded-For`, the request id and (for a vLLM data-parallel rank)
/// `X-data-parallel-rank`. A translated request goes to the engine's API's path, with an
/// Anthropic target's `anthropic-version`.
fn write_head(
    out: &mut Vec<u8>,
    req: &Request<'_>,
    routed: &Routed<'_>,
    target: &Target,
    Head { translation, trace }: Head<'_>,
) {
    out.extend_from_slice(req.head.method.as_str().as_bytes());
    out.push(b' ');
    // Like an SDK's base URL: a target URL with a path (".../v1") replaces the request's
    // leading "/v1"; without one the path goes through unchanged. A path outside "/v1"
    // (vLLM's "/tokenize", "/rerank") goes under the base path less its "/v1".
    let path = match translation {
        Some(pair) => pair.engine.path().as_bytes(),
        None => &req.buf[req.head.path.clone()],
    };
    match path
        .strip_prefix(b"/v1")
        .filter(|p| p.is_empty() || p[0] == b'/')
    {
        _ if target.base_path.is_empty() => out.extend_from_slice(path),
        Some(rest) => {
            out.extend_from_slice(target.base_path.as_bytes());
            out.extend_from_slice(rest);
        }
        None => {
            let base = target.base_path.as_str();
            out.extend_from_slice(base.strip_suffix("/v1").unwrap_or(base).as_bytes());
            out.extend_from_slice(path);
        }
    }
    out.extend_from_slice(&req.buf[req.head.query.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_header(out, b"host", target.host_header.as_bytes());
    let connection = ConnectionTokens::of(req);
    for s in req.spans {
        let name = s.name(req.buf);
        if withheld(name, req, &connection, routed, target, translation)
            || (trace.is_some() && name.eq_ignore_ascii_case(b"traceparent"))
        {
            continue;
        }
        write_header(out, name, s.value(req.buf));
    }
    for (n, v) in &target.headers {
        write_header(out, n.as_bytes(), v.as_bytes());
    }
    // An Anthropic client's own version goes through as it came.
    let own_version =
        || translation.is_none() && req.spans.iter().any(|s| s.is(req.buf, "anthropic-version"));
    if let Some(a) =
        target.api.anthropic.as_ref().filter(|_| {
            !target.headers.iter().any(|(n, _)| n == "anthropic-version") && !own_version()
        })
    {
        write_header(out, b"anthropic-version", a.version.as_bytes());
    }
    if let Some((t, span)) = trace {
        // The engine's spans are children of this attempt's (the client's own
        // `traceparent` is replaced; its `tracestate` goes as it came).
        spans::write_header(out, t, &span);
    }
    write_header(out, b"x-forwarded-for", req.peer_ip.as_bytes());
    // Every attempt carries the same id, so the engines' logs of a retried request match.
    write_header(out, b"x-request-id", req.id.as_bytes());
    if let Some(dp) = target
        .dp
        .as_ref()
        .filter(|_| target.engine == EngineKind::Vllm)
    {
        write_header(
            out,
            b"x-data-parallel-rank",
            itoa::Buffer::new().format(dp.rank).as_bytes(),
        );
    }
}
