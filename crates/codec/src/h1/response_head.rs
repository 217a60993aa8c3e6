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
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut storage,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= MAX_RESPONSE_HEAD {
                return Err(RespError::TooLarge);
            }
            return Ok(None);
        }
        Err(_) => return Err(RespError::Malformed),
    };
    let status = resp.code.ok_or(RespError::Malformed)?;
    let http10 = resp.version == Some(0);
    let mut content_length = None;
    let mut chunked = false;
    let mut te_seen = false;
    let mut keep_alive = !http10;
    let mut is_sse = false;
    let mut retry_after = None;
    let mut wait = None;
    let mut reset: Option<std::time::Duration> = None;
    // A Connection field names headers beyond close / keep-alive.
    let mut names_headers = false;
    for h in resp.headers.iter() {
        let n = h.name.as_bytes();
        if n.eq_ignore_ascii_case(b"content-length") {
            let v = parse_content_length(h.value).ok_or(RespError::Malformed)?;
            if content_length.is_some_and(|c| c != v) {
                return Err(RespError::Malformed);
            }
            content_length = Some(v);
        } else if n.eq_ignore_ascii_case(b"transfer-encoding") {
            te_seen = true;
            chunked = header_tokens(h.value)
                .last()
                .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if n.eq_ignore_ascii_case(b"connection") {
            for t in header_tokens(h.value) {
                if t.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive |= http10;
                } else {
                    names_headers = true;
                }
            }
        } else if n.eq_ignore_ascii_case(b"content-type") {
            is_sse = trim_ows(h.value)
                .get(..17)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"));
        } else if n.eq_ignore_ascii_case(b"retry-after") {
            wait = super::retry_after::retry_after(h.value, std::time::SystemTime::now());
            retry_after = wait.map(super::retry_after::whole_seconds);
        } else if n.eq_ignore_ascii_case(b"x-ratelimit-reset-requests")
            || n.eq_ignore_ascii_case(b"x-ratelimit-reset-tokens")
        {
            if let Some(d) = super::retry_after::reset_duration(h.value) {
                reset = Some(reset.map_or(d, |r| r.min(d)));
            }
        }
    }
    let framing = if head_request || (100..200).contains(&status) || status == 204 || status == 304
    {
        RespFraming::Empty
    } else if te_seen {
        if chunked {
            RespFraming::Chunked
        } else {
            // A coding the gateway would strip (gzip without chunked): relaying the bytes
            // without the header would hand the client data it cannot interpret.
            return Err(RespError::Malformed);
        }
    } else if let Some(n) = content_length {
        RespFraming::Length(n)
    } else {
        RespFraming::Close
    };
    if framing == RespFraming::Close {
        keep_alive = false;
    }
    // Forwardable headers.
    let connection_named = |name: &[u8]| {
        resp.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .any(|h| header_tokens(h.value).any(|t| t.eq_ignore_ascii_case(name)))
    };
    for h in resp.headers.iter() {
        // The gateway writes the request's own `x-request-id`; an upstream's echo of it would
        // make a second one.
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
    Ok(Some(ResponseHead {
        len,
        status,
        framing,
        keep_alive,
        is_sse,
        retry_after,
        wait: wait.or(reset),
    }))
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
