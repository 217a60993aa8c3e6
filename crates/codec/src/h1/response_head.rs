//! Parsing an upstream response head and deciding its body framing.
//!
//! Owns the upstream side of framing rules: 1xx interim responses, bodiless statuses,
//! chunked vs Content-Length vs close-delimited, and what the gateway forwards.

use super::{header_tokens, is_hop_by_hop, parse_content_length, trim_ows};

/// Largest upstream response head accepted.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;
const MAX_RESPONSE_HEADERS: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespFraming {
    /// No body (HEAD request, 1xx, 204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Delimited by the upstream closing the connection.
    Close,
}

#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub len: usize,
    pub status: u16,
    pub framing: RespFraming,
    /// The upstream allows reuse of the connection after this response.
    pub keep_alive: bool,
    /// `content-type: text/event-stream`.
    pub is_sse: bool,
    /// `Retry-After` in seconds (delta-seconds, or an HTTP-date's distance from now,
    /// rounded up).
    pub retry_after: Option<u64>,
    /// How long the upstream asks to be left alone: `Retry-After`, else the shorter of
    /// `x-ratelimit-reset-requests` and `x-ratelimit-reset-tokens`.
    pub wait: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespError {
    Malformed,
    TooLarge,
}

/// Parses the response head at the start of `buf`; `Ok(None)` when incomplete.
/// For a complete head, the forwardable headers are appended to `out` as
/// `name: value\r\n` lines (hop-by-hop, framing and Connection-named headers removed).
pub fn parse(
    buf: &[u8],
    head_request: bool,
    out: &mut Vec<u8>,
) -> Result<Option<ResponseHead>, RespError> {
    // Uninitialised storage: zeroing every slot on each parse costs more than the parse.
    let mut storage =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let Some(len) = tokenise(&mut resp, buf, &mut storage)? else {
        return Ok(None);
    };
    let status = resp.code.ok_or(RespError::Malformed)?;
    let mut fields = UpstreamFields::new(resp.version == Some(0));
    for h in resp.headers.iter() {
        fields.note(h.name.as_bytes(), h.value)?;
    }
    let framing = fields.framing(status, head_request)?;
    forward_headers(resp.headers, fields.names_headers, out);
    Ok(Some(ResponseHead {
        len,
        status,
        framing,
        keep_alive: fields.keep_alive && framing != RespFraming::Close,
        is_sse: fields.is_sse,
        retry_after: fields.retry_after,
        wait: fields.wait.or(fields.reset),
    }))
}

/// Runs httparse over `buf`: the head's length, or `Ok(None)` while it is incomplete and
/// still under [`MAX_RESPONSE_HEAD`].
fn tokenise<'h, 'b>(
    resp: &mut httparse::Response<'h, 'b>,
    buf: &'b [u8],
    storage: &'h mut [std::mem::MaybeUninit<httparse::Header<'b>>],
) -> Result<Option<usize>, RespError> {
    match httparse::ParserConfig::default().parse_response_with_uninit_headers(resp, buf, storage) {
        Ok(httparse::Status::Complete(n)) => Ok(Some(n)),
        Ok(httparse::Status::Partial) if buf.len() >= MAX_RESPONSE_HEAD => Err(RespError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(RespError::Malformed),
    }
}

/// What the upstream's header fields said, gathered one field at a time.
struct UpstreamFields {
    http10: bool,
    content_length: Option<u64>,
    /// A Transfer-Encoding field was seen, and whether its last coding is chunked.
    te_seen: bool,
    chunked: bool,
    keep_alive: bool,
    is_sse: bool,
    retry_after: Option<u64>,
    wait: Option<std::time::Duration>,
    /// The shorter of the `x-ratelimit-reset-*` durations.
    reset: Option<std::time::Duration>,
    /// A Connection field names headers beyond close / keep-alive.
    names_headers: bool,
}

impl UpstreamFields {
    fn new(http10: bool) -> Self {
        UpstreamFields {
            http10,
            content_length: None,
            te_seen: false,
            chunked: false,
            keep_alive: !http10,
            is_sse: false,
            retry_after: None,
            wait: None,
            reset: None,
            names_headers: false,
        }
    }

    /// Reads one header field; a bad or conflicting Content-Length is malformed.
    #[inline]
    fn note(&mut self, n: &[u8], value: &[u8]) -> Result<(), RespError> {
        if n.eq_ignore_ascii_case(b"content-length") {
            let v = parse_content_length(value).ok_or(RespError::Malformed)?;
            if self.content_length.is_some_and(|c| c != v) {
                return Err(RespError::Malformed);
            }
            self.content_length = Some(v);
        } else if n.eq_ignore_ascii_case(b"transfer-encoding") {
            self.te_seen = true;
            self.chunked = header_tokens(value)
                .last()
                .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if n.eq_ignore_ascii_case(b"connection") {
            self.connection(value);
        } else if n.eq_ignore_ascii_case(b"content-type") {
            self.is_sse = trim_ows(value)
                .get(..17)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"));
        } else if n.eq_ignore_ascii_case(b"retry-after") {
            self.wait = super::retry_after::retry_after(value, std::time::SystemTime::now());
            self.retry_after = self.wait.map(super::retry_after::whole_seconds);
        } else if n.eq_ignore_ascii_case(b"x-ratelimit-reset-requests")
            || n.eq_ignore_ascii_case(b"x-ratelimit-reset-tokens")
        {
            if let Some(d) = super::retry_after::reset_duration(value) {
                self.reset = Some(self.reset.map_or(d, |r| r.min(d)));
            }
        }
        Ok(())
    }

    /// Reads the tokens of a Connection field.
    #[inline]
    fn connection(&mut self, value: &[u8]) {
        for t in header_tokens(value) {
            if t.eq_ignore_ascii_case(b"close") {
                self.keep_alive = false;
            } else if t.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive |= self.http10;
            } else {
                self.names_headers = true;
            }
        }
    }

    /// Decides how the body is delimited: none for a HEAD request or a bodiless status,
    /// else chunked, Content-Length or up to the close.
    fn framing(&self, status: u16, head_request: bool) -> Result<RespFraming, RespError> {
        Ok(
            if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
                RespFraming::Empty
            } else if self.te_seen {
                if !self.chunked {
                    // A coding the gateway would strip (gzip without chunked): relaying the
                    // bytes without the header would hand the client data it cannot interpret.
                    return Err(RespError::Malformed);
                }
                RespFraming::Chunked
            } else if let Some(n) = self.content_length {
                RespFraming::Length(n)
            } else {
                RespFraming::Close
            },
        )
    }
}

/// Appends the forwardable headers to `out` as `name: value\r\n` lines: not hop-by-hop or
/// framing, not named by a Connection field (looked up only when `names_headers`), and not
/// the upstream's `x-request-id` (the gateway writes the request's own; an echo would make a
/// second one).
fn forward_headers(headers: &[httparse::Header<'_>], names_headers: bool, out: &mut Vec<u8>) {
    let connection_named = |name: &[u8]| {
        headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .any(|h| header_tokens(h.value).any(|t| t.eq_ignore_ascii_case(name)))
    };
    for h in headers {
        if is_hop_by_hop(h.name)
            || h.name.eq_ignore_ascii_case("x-request-id")
            || (names_headers && connection_named(h.name.as_bytes()))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_sse_head() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\nconnection: keep-alive, x-secret\r\nx-secret: 1\r\nx-ok: 2\r\n\r\ndata";
        let mut out = Vec::new();
        let h = parse(raw, false, &mut out).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, RespFraming::Chunked);
        assert!(h.is_sse && h.keep_alive);
        assert_eq!(&raw[h.len..], b"data");
        assert_eq!(
            out,
            b"content-type: text/event-stream; charset=utf-8\r\nx-ok: 2\r\n"
        );
    }

    #[test]
    fn framing_rules() {
        let mut out = Vec::new();
        let h = parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            false,
            &mut out,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, RespFraming::Length(5));
        let h = parse(b"HTTP/1.1 200 OK\r\n\r\n", false, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, RespFraming::Close);
        assert!(!h.keep_alive);
        let h = parse(b"HTTP/1.1 204 No Content\r\n\r\n", false, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, RespFraming::Empty);
        let h = parse(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n",
            false,
            &mut out,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.retry_after, Some(7));
        assert!(parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            false,
            &mut out
        )
        .is_err());
        assert!(parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            false,
            &mut out
        )
        .is_err());
        assert!(parse(b"HTTP/1.1 200", false, &mut out).unwrap().is_none());
    }
}
