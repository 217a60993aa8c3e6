//! HTTP/1.1 request parsing (httparse; Content-Length and chunked bodies) and response
//! head serialization.

use std::io::Write as _;

use crate::RecordedRequest;

pub(crate) const MAX_HEAD: usize = 64 * 1024;
pub(crate) const MAX_BODY: usize = 64 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    Embeddings,
    Messages,
    Responses,
    Models,
    Health,
    Metrics,
    MockStats,
    MockFault,
    LoraLoad,
    LoraUnload,
    Tokenize,
    CountTokens,
    Rerank,
    Score,
    Detokenize,
    Pooling,
    Classify,
    Transcription,
    Translation,
    /// `/mock/echo/...`, any method: the body back, for passthrough tests.
    Echo,
    ResetPrefixCache,
    /// `POST /mock/pd/pull`: a decode takes the KV blocks a prefill holds for it.
    PdPull,
    NotFound,
    MethodNotAllowed,
}

impl Route {
    fn find(method: &str, path: &str) -> Route {
        let path = path.split('?').next().unwrap_or("");
        if path.starts_with("/mock/echo/") {
            return Route::Echo;
        }
        let (want_post, route) = match path {
            "/v1/chat/completions" => (true, Route::Chat),
            "/v1/completions" => (true, Route::Completions),
            "/v1/embeddings" => (true, Route::Embeddings),
            "/v1/messages" => (true, Route::Messages),
            "/v1/responses" => (true, Route::Responses),
            "/mock/fault" => (true, Route::MockFault),
            "/v1/load_lora_adapter" => (true, Route::LoraLoad),
            "/v1/unload_lora_adapter" => (true, Route::LoraUnload),
            "/tokenize" => (true, Route::Tokenize),
            "/v1/messages/count_tokens" => (true, Route::CountTokens),
            "/rerank" | "/v1/rerank" => (true, Route::Rerank),
            "/score" | "/v1/score" => (true, Route::Score),
            "/detokenize" => (true, Route::Detokenize),
            "/pooling" => (true, Route::Pooling),
            "/classify" => (true, Route::Classify),
            "/v1/audio/transcriptions" => (true, Route::Transcription),
            "/v1/audio/translations" => (true, Route::Translation),
            "/reset_prefix_cache" => (true, Route::ResetPrefixCache),
            "/mock/pd/pull" => (true, Route::PdPull),
            "/v1/models" => (false, Route::Models),
            "/health" => (false, Route::Health),
            "/metrics" => (false, Route::Metrics),
            "/mock/stats" => (false, Route::MockStats),
            _ => return Route::NotFound,
        };
        let ok = if want_post {
            method == "POST"
        } else {
            method == "GET"
        };
        if ok {
            route
        } else {
            Route::MethodNotAllowed
        }
    }

    /// An endpoint that generates no text, answered by `endpoints`.
    pub fn is_task(self) -> bool {
        matches!(
            self,
            Route::CountTokens
                | Route::Rerank
                | Route::Score
                | Route::Detokenize
                | Route::Pooling
                | Route::Classify
                | Route::Transcription
                | Route::Translation
        )
    }

    pub fn is_inference(self) -> bool {
        matches!(
            self,
            Route::Chat
                | Route::Completions
                | Route::Embeddings
                | Route::Messages
                | Route::Responses
        )
    }
}

/// Which API a request's path belongs to, whatever its method: what an engine's
/// [`crate::MockApi`] serves or refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Surface {
    /// `/v1/messages` and `/v1/messages/count_tokens`: Anthropic's.
    Anthropic,
    /// `/v1/responses`.
    Responses,
    /// `/v1/models`, which every API has.
    Models,
    /// `/health`, `/metrics` and `/mock/*`: the engine's own, never refused.
    Control,
    /// Any other path under `/v1` (the OpenAI API's, known or not).
    OpenAiV1,
    /// Any other path (vLLM's own endpoints, or none).
    Other,
}

impl Surface {
    fn of(path: &str) -> Surface {
        let path = path.split('?').next().unwrap_or("");
        match path {
            "/v1/messages" | "/v1/messages/count_tokens" => Surface::Anthropic,
            "/v1/responses" => Surface::Responses,
            "/v1/models" => Surface::Models,
            "/health" | "/metrics" => Surface::Control,
            p if p.starts_with("/mock/") => Surface::Control,
            p if p == "/v1" || p.starts_with("/v1/") => Surface::OpenAiV1,
            _ => Surface::Other,
        }
    }
}

/// The credentials and version headers a request brings, for the API mode's checks.
#[derive(Clone, Debug, Default)]
pub(crate) struct Credentials {
    /// An `anthropic-version` header with a non-blank value came.
    pub anthropic_version: bool,
    /// The `x-api-key` header's value.
    pub x_api_key: Option<String>,
    /// The `authorization` header's value.
    pub authorization: Option<String>,
}

/// Per-request behaviour overrides from `x-mock-*` headers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    pub ttft_ms: Option<u64>,
    pub itl_ms: Option<u64>,
    pub tokens: Option<u32>,
    pub status: Option<u16>,
    pub retry_after: Option<u64>,
    pub reset_after: Option<u32>,
    pub stall_after: Option<u32>,
}

#[derive(Debug)]
pub(crate) enum Body {
    Range(usize, usize),
    Owned(Vec<u8>),
}

#[derive(Debug)]
pub(crate) struct Head {
    pub route: Route,
    /// The API the path belongs to.
    pub surface: Surface,
    pub credentials: Credentials,
    pub http10: bool,
    pub close: bool,
    pub ov: Overrides,
    pub request_id: Option<String>,
    /// The `X-data-parallel-rank` header's value.
    pub dp_rank: Option<String>,
    pub record: Option<RecordedRequest>,
}

// Returned by value once per request; boxing `Head` would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Parse {
    /// A complete request; `usize` = bytes consumed from the buffer.
    Done(Head, Body, usize),
    /// Need more bytes; `true` when the client waits for `100 Continue`.
    Partial(bool),
    Error(u16, &'static str),
}

fn num<T: std::str::FromStr>(v: &[u8]) -> Option<T> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

fn has_token(v: &[u8], token: &str) -> bool {
    std::str::from_utf8(v)
        .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        .unwrap_or(false)
}

/// Parses one request at the start of `buf`: its head, `x-mock-*` overrides and body
/// (a copy kept when `record` is set).
pub(crate) fn parse(buf: &[u8], record: bool) -> Parse {
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match head_len(&mut req, buf) {
        Ok(Some(n)) => n,
        Ok(None) => return Parse::Partial(false),
        Err((status, msg)) => return Parse::Error(status, msg),
    };
    let method = req.method.unwrap_or("");
    let path = req.path.unwrap_or("");
    let http10 = req.version == Some(0);
    let mut fields = Fields::new(http10);
    for h in req.headers.iter() {
        if let Err(msg) = fields.note(h.name, h.value) {
            return Parse::Error(400, msg);
        }
    }
    let (body, consumed) = match read_body(buf, head_len, &fields) {
        Ok(Some(read)) => read,
        Ok(None) => return Parse::Partial(fields.expect_continue),
        Err((status, msg)) => return Parse::Error(status, msg),
    };
    let record = record.then(|| recorded(method, path, req.headers, &body, buf));
    let head = Head {
        route: Route::find(method, path),
        surface: Surface::of(path),
        credentials: fields.credentials,
        http10,
        close: fields.close,
        ov: fields.ov,
        request_id: fields.request_id,
        dp_rank: fields.dp_rank,
        record,
    };
    Parse::Done(head, body, consumed)
}

/// Runs httparse over `buf`: the head's length, `Ok(None)` while it is incomplete and
/// under [`MAX_HEAD`], or the status and message that refuse it.
fn head_len<'b>(
    req: &mut httparse::Request<'_, 'b>,
    buf: &'b [u8],
) -> Result<Option<usize>, (u16, &'static str)> {
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => Ok(Some(n)),
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            Err((431, "request header too large"))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err((431, "too many request headers")),
        Err(_) => Err((400, "malformed HTTP request")),
    }
}

/// What the header fields said, gathered one field at a time.
struct Fields {
    http10: bool,
    close: bool,
    content_length: Option<usize>,
    chunked: bool,
    expect_continue: bool,
    ov: Overrides,
    request_id: Option<String>,
    dp_rank: Option<String>,
    credentials: Credentials,
}

impl Fields {
    fn new(http10: bool) -> Fields {
        Fields {
            http10,
            close: http10,
            content_length: None,
            chunked: false,
            expect_continue: false,
            ov: Overrides::default(),
            request_id: None,
            dp_rank: None,
            credentials: Credentials::default(),
        }
    }

    /// Reads one header field; `Err` for an invalid Content-Length.
    fn note(&mut self, n: &str, v: &[u8]) -> Result<(), &'static str> {
        if n.eq_ignore_ascii_case("content-length") {
            self.content_length = Some(num::<usize>(v).ok_or("invalid content-length")?);
        } else if n.eq_ignore_ascii_case("transfer-encoding") {
            self.chunked = has_token(v, "chunked");
        } else if n.eq_ignore_ascii_case("connection") {
            if has_token(v, "close") {
                self.close = true;
            } else if self.http10 && has_token(v, "keep-alive") {
                // Keep it simple: HTTP/1.0 always closes.
                self.close = true;
            }
        } else if n.eq_ignore_ascii_case("expect") {
            self.expect_continue = has_token(v, "100-continue");
        } else if n.eq_ignore_ascii_case("x-request-id") {
            self.request_id = Some(String::from_utf8_lossy(v).into_owned());
        } else if n.eq_ignore_ascii_case("x-data-parallel-rank") {
            self.dp_rank = Some(String::from_utf8_lossy(v).into_owned());
        } else if n.eq_ignore_ascii_case("authorization") {
            self.credentials.authorization = Some(String::from_utf8_lossy(v).into_owned());
        } else if n.eq_ignore_ascii_case("x-api-key") {
            self.credentials.x_api_key = Some(String::from_utf8_lossy(v).into_owned());
        } else if n.eq_ignore_ascii_case("anthropic-version") {
            self.credentials.anthropic_version = !v.trim_ascii().is_empty();
        } else if n.len() > 7 && n[..7].eq_ignore_ascii_case("x-mock-") {
            self.ov.set(&n[7..], v);
        }
        Ok(())
    }
}

impl Overrides {
    /// Reads one `x-mock-<k>` header; an unknown `k` is ignored, a bad value clears it.
    fn set(&mut self, k: &str, v: &[u8]) {
        if k.eq_ignore_ascii_case("ttft-ms") {
            self.ttft_ms = num(v);
        } else if k.eq_ignore_ascii_case("itl-ms") {
            self.itl_ms = num(v);
        } else if k.eq_ignore_ascii_case("tokens") {
            self.tokens = num(v);
        } else if k.eq_ignore_ascii_case("status") {
            self.status = num(v);
        } else if k.eq_ignore_ascii_case("retry-after") {
            self.retry_after = num(v);
        } else if k.eq_ignore_ascii_case("reset-after") {
            self.reset_after = num(v);
        } else if k.eq_ignore_ascii_case("stall-after") {
            self.stall_after = num(v);
        }
    }
}

/// The body after a `head_len`-byte head, by its framing, with the bytes the request used;
/// `Ok(None)` while incomplete, `Err` with the status and message that refuse it.
fn read_body(
    buf: &[u8],
    head_len: usize,
    fields: &Fields,
) -> Result<Option<(Body, usize)>, (u16, &'static str)> {
    if fields.chunked {
        return match decode_chunked(&buf[head_len..]) {
            Ok(Some((body, used))) => Ok(Some((Body::Owned(body), head_len + used))),
            Ok(None) => Ok(None),
            Err(msg) => Err((400, msg)),
        };
    }
    let len = fields.content_length.unwrap_or(0);
    if len > MAX_BODY {
        return Err((413, "request body too large"));
    }
    if buf.len() - head_len < len {
        return Ok(None);
    }
    Ok(Some((
        Body::Range(head_len, head_len + len),
        head_len + len,
    )))
}

/// A copy of the request as the tests read it back: lower-cased header names.
fn recorded(
    method: &str,
    path: &str,
    headers: &[httparse::Header<'_>],
    body: &Body,
    buf: &[u8],
) -> RecordedRequest {
    RecordedRequest {
        method: method.to_string(),
        path: path.to_string(),
        headers: headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        body: match body {
            Body::Range(a, b) => buf[*a..*b].to_vec(),
            Body::Owned(v) => v.clone(),
        },
        dp_rank: None,
        ran_on_rank: 0,
    }
}

/// Decodes a chunked body. `Ok(None)` = incomplete; on success returns the body and the
/// bytes used (including trailers).
fn decode_chunked(mut buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, &'static str> {
    let total = buf.len();
    let mut body = Vec::new();
    loop {
        let Some(eol) = find_crlf(buf) else {
            return if buf.len() > 1024 {
                Err("invalid chunk size line")
            } else {
                Ok(None)
            };
        };
        let line = std::str::from_utf8(&buf[..eol]).map_err(|_| "invalid chunk size")?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| "invalid chunk size")?;
        buf = &buf[eol + 2..];
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                let Some(eol) = find_crlf(buf) else {
                    return Ok(None);
                };
                buf = &buf[eol + 2..];
                if eol == 0 {
                    return Ok(Some((body, total - buf.len())));
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err("request body too large");
        }
        if buf.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[..size]);
        if &buf[size..size + 2] != b"\r\n" {
            return Err("invalid chunk terminator");
        }
        buf = &buf[size + 2..];
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// How the body length is conveyed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Length {
    Fixed(usize),
    Chunked,
    /// HTTP/1.0 streaming: no length, the connection closes at the end.
    Close,
}

/// Appends a response head to `out`.
pub(crate) fn write_head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    len: Length,
    close: bool,
    engine_header: &[u8],
    retry_after: Option<u64>,
) {
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\n",
        reason(status)
    );
    match len {
        Length::Fixed(n) => {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        Length::Chunked => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n")
        }
        Length::Close => out.extend_from_slice(b"cache-control: no-cache\r\n"),
    }
    if let Some(s) = retry_after {
        let _ = write!(out, "retry-after: {s}\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(engine_header);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_body() {
        let raw = b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\n\r\nGET";
        match parse(raw, true) {
            Parse::Done(h, Body::Owned(b), used) => {
                assert_eq!(b, b"abcdefg");
                assert_eq!(&raw[used..], b"GET");
                assert_eq!(h.route, Route::Completions);
                assert_eq!(h.record.unwrap().body, b"abcdefg");
            }
            _ => panic!("bad parse"),
        }
        assert!(matches!(
            parse(&raw[..raw.len() - 6], false),
            Parse::Partial(_)
        ));
    }

    #[test]
    fn overrides_and_routes() {
        let raw = b"GET /v1/models?x=1 HTTP/1.0\r\nX-Mock-TTFT-ms: 5\r\nx-request-id: abc\r\n\r\n";
        match parse(raw, false) {
            Parse::Done(h, Body::Range(a, b), used) => {
                assert_eq!((a, b, used), (raw.len(), raw.len(), raw.len()));
                assert_eq!(h.route, Route::Models);
                assert!(h.http10 && h.close);
                assert_eq!(h.ov.ttft_ms, Some(5));
                assert_eq!(h.request_id.as_deref(), Some("abc"));
            }
            _ => panic!("bad parse"),
        }
        assert_eq!(
            Route::find("GET", "/v1/chat/completions"),
            Route::MethodNotAllowed
        );
        assert_eq!(Route::find("GET", "/nope"), Route::NotFound);
    }
}
