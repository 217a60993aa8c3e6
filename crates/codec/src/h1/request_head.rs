//! Request-head parsing with limits and the framing rules a front-door proxy must enforce.
//!
//! `httparse` does the tokenising; this module adds what it leaves out (bare-LF rejection,
//! Content-Length / Transfer-Encoding / Host / Expect semantics, size limits) and records
//! header positions as offsets so the caller keeps ownership of its read buffer. It must not
//! allocate per request beyond the caller's reused span vector.

use std::ops::Range;

use http::Method;

use super::{header_tokens, parse_content_length, trim_ows};

/// The most header fields `parse` can ever accept, whatever the configured limit.
pub const MAX_HEADERS_CAP: usize = 256;

/// Limits applied while parsing a head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub max_uri_bytes: usize,
    /// Header names with an underscore.
    pub underscores: UnderscoreHeaders,
}

/// What becomes of a request header whose name holds an underscore (`Transfer_Encoding`):
/// hops that map `_` to `-` (CGI-style servers, some proxies) would read it as another
/// header than the gateway did, so by default it is dropped, as nginx does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnderscoreHeaders {
    /// Ignored: neither read by the gateway nor forwarded.
    #[default]
    Drop,
    /// The request is refused (400).
    Reject,
    /// Kept and forwarded like any other header.
    Forward,
}

/// Position of one header field inside the head buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderSpan {
    pub name: (u32, u32),
    pub value: (u32, u32),
}

impl HeaderSpan {
    #[inline]
    pub fn name<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.name.0 as usize..self.name.1 as usize]
    }
    #[inline]
    pub fn value<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.value.0 as usize..self.value.1 as usize]
    }
    #[inline]
    pub fn is(&self, buf: &[u8], lower_name: &str) -> bool {
        self.name(buf).eq_ignore_ascii_case(lower_name.as_bytes())
    }
}

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A parsed, validated request head. Ranges index the buffer given to [`parse`].
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Length of the head including the blank line.
    pub len: usize,
    pub method: Method,
    /// Origin-form path, without the query (absolute-form authority removed).
    pub path: Range<usize>,
    /// Query including the leading `?`, or empty.
    pub query: Range<usize>,
    /// HTTP/1.0 request.
    pub http10: bool,
    pub framing: BodyFraming,
    /// `Expect: 100-continue` on an HTTP/1.1 request.
    pub expect_continue: bool,
    /// The client asked to close after this exchange (or speaks HTTP/1.0).
    pub close: bool,
}

impl RequestHead {
    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b str {
        // Validated as ASCII by httparse.
        std::str::from_utf8(&buf[self.path.clone()]).unwrap_or("/")
    }
}

/// Why a head was rejected. Every variant closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    BadRequest(&'static str),
    UriTooLong,
    HeaderTooLarge,
    TooManyHeaders,
    /// A transfer coding other than chunked.
    NotImplemented,
    ExpectationFailed,
    UnsupportedMediaType,
    PayloadTooLarge,
}

impl HeadError {
    pub fn status(self) -> u16 {
        match self {
            HeadError::BadRequest(_) => 400,
            HeadError::UriTooLong => 414,
            HeadError::HeaderTooLarge | HeadError::TooManyHeaders => 431,
            HeadError::NotImplemented => 501,
            HeadError::ExpectationFailed => 417,
            HeadError::UnsupportedMediaType => 415,
            HeadError::PayloadTooLarge => 413,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            HeadError::BadRequest(m) => m,
            HeadError::UriTooLong => "request target too long",
            HeadError::HeaderTooLarge => "request header section too large",
            HeadError::TooManyHeaders => "too many request header fields",
            HeadError::NotImplemented => {
                "transfer coding not implemented; only chunked is accepted"
            }
            HeadError::ExpectationFailed => "only `Expect: 100-continue` is supported",
            HeadError::UnsupportedMediaType => "request Content-Encoding is not supported",
            HeadError::PayloadTooLarge => {
                "request body exceeds the configured limit (server.limits.max_body_bytes)"
            }
        }
    }
}

/// Locates the end of the head (index just past `\r\n\r\n`) while rejecting a bare LF or a
/// CR not followed by LF anywhere before it. `Ok(None)`: incomplete.
fn find_head_end(buf: &[u8]) -> Result<Option<usize>, HeadError> {
    let mut i = 0;
    while let Some(off) = memchr::memchr2(b'\r', b'\n', &buf[i..]) {
        let p = i + off;
        if buf[p] == b'\n' {
            return Err(HeadError::BadRequest("bare LF in request head"));
        }
        // CR: must be followed by LF.
        match buf.get(p + 1) {
            None => return Ok(None),
            Some(b'\n') => {}
            Some(_) => return Err(HeadError::BadRequest("bare CR in request head")),
        }
        if buf.get(p + 2) == Some(&b'\r') {
            match buf.get(p + 3) {
                None => return Ok(None),
                Some(b'\n') => return Ok(Some(p + 4)),
                Some(_) => return Err(HeadError::BadRequest("bare CR in request head")),
            }
        }
        i = p + 2;
    }
    Ok(None)
}

/// Parses and validates a request head at the start of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed (and the limits still allow them).
/// `spans` is cleared and filled with the header positions.
pub fn parse(
    buf: &[u8],
    limits: &HeadLimits,
    spans: &mut Vec<HeaderSpan>,
) -> Result<Option<RequestHead>, HeadError> {
    spans.clear();
    let Some(end) = complete_head_end(buf, limits)? else {
        return Ok(None);
    };
    let cap = limits.max_headers.min(MAX_HEADERS_CAP);
    // Uninitialised storage: zeroing 256 header slots on every request costs more than
    // parsing a typical head.
    let mut storage =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS_CAP];
    let mut req = httparse::Request::new(&mut []);
    let status = req
        .parse_with_uninit_headers(&buf[..end], &mut storage[..cap])
        .map_err(httparse_error)?;
    let len = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Err(HeadError::BadRequest("malformed request head")),
    };
    let at = Offsets(buf.as_ptr() as usize);
    let line = request_line(&req, buf, at, limits)?;
    let mut fields = FieldFacts::new(line.http10);
    for h in req.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        if !keep_field(name, limits.underscores)? {
            continue;
        }
        spans.push(at.span(name, value));
        fields.note(name, value)?;
    }
    let framing = fields.framing()?;
    Ok(Some(RequestHead {
        len,
        method: line.method,
        path: line.path,
        query: line.query,
        http10: line.http10,
        framing,
        expect_continue: fields.expect_continue,
        close: fields.close,
    }))
}

/// The end of a complete head within the size limit; `Ok(None)` when more bytes are needed
/// (after judging the request line as soon as it is whole).
fn complete_head_end(buf: &[u8], limits: &HeadLimits) -> Result<Option<usize>, HeadError> {
    match find_head_end(buf)? {
        Some(end) if end > limits.max_head_bytes => Err(oversize_error(&buf[..end], limits)),
        Some(end) => Ok(Some(end)),
        None if buf.len() >= limits.max_head_bytes => Err(oversize_error(buf, limits)),
        None => check_request_line(buf).map(|()| None),
    }
}

/// Turns sub-slices of the head buffer into offsets from its start.
#[derive(Clone, Copy)]
struct Offsets(usize);

impl Offsets {
    /// Where `s` starts in the buffer.
    #[inline]
    fn of(self, s: &[u8]) -> u32 {
        (s.as_ptr() as usize - self.0) as u32
    }

    /// The span of one header field.
    #[inline]
    fn span(self, name: &[u8], value: &[u8]) -> HeaderSpan {
        HeaderSpan {
            name: (self.of(name), self.of(name) + name.len() as u32),
            value: (self.of(value), self.of(value) + value.len() as u32),
        }
    }
}

/// The method, the version and where the path and the query lie.
struct RequestLine {
    method: Method,
    http10: bool,
    path: Range<usize>,
    query: Range<usize>,
}

/// Validates the method and the request target (length, no fragment, origin or absolute
/// form) and splits the target into path and query.
fn request_line(
    req: &httparse::Request<'_, '_>,
    buf: &[u8],
    at: Offsets,
    limits: &HeadLimits,
) -> Result<RequestLine, HeadError> {
    let method = Method::from_bytes(req.method.unwrap_or("").as_bytes())
        .map_err(|_| HeadError::BadRequest("malformed method"))?;
    let http10 = req.version == Some(0);
    let target = req.path.unwrap_or("");
    if target.len() > limits.max_uri_bytes {
        return Err(HeadError::UriTooLong);
    }
    // A fragment is the client's own business (RFC 9110 §4.2.5) and has no place in a
    // request target (RFC 9112 §3.2); one here is a malformed or crafted request.
    if target.contains('#') {
        return Err(HeadError::BadRequest("request target with a fragment (#)"));
    }
    let target_start = at.of(target.as_bytes()) as usize;
    // Origin form, or absolute form whose authority is ignored: upstreams come only from
    // the configuration, never from the request.
    let origin_start = if target.starts_with('/') {
        target_start
    } else if let Some(rest) = strip_scheme(target) {
        match rest.find('/') {
            Some(slash) => target_start + (target.len() - rest.len()) + slash,
            None => return Err(HeadError::BadRequest("absolute-form target without a path")),
        }
    } else {
        return Err(HeadError::BadRequest(
            "request target must be origin or absolute form",
        ));
    };
    let target_end = target_start + target.len();
    let q = buf[origin_start..target_end]
        .iter()
        .position(|&b| b == b'?')
        .map(|p| origin_start + p)
        .unwrap_or(target_end);
    Ok(RequestLine {
        method,
        http10,
        path: origin_start..q,
        query: q..target_end,
    })
}

/// Applies the underscore policy to a header name: `Ok(false)` drops the field.
#[inline]
fn keep_field(name: &[u8], underscores: UnderscoreHeaders) -> Result<bool, HeadError> {
    if !name.contains(&b'_') {
        return Ok(true);
    }
    match underscores {
        UnderscoreHeaders::Drop => Ok(false),
        UnderscoreHeaders::Reject => Err(HeadError::BadRequest("header name with an underscore")),
        UnderscoreHeaders::Forward => Ok(true),
    }
}

/// What the header fields said about framing, Host, Expect and Connection, gathered one
/// field at a time.
struct FieldFacts {
    http10: bool,
    content_length: Option<u64>,
    cl_count: u32,
    te_count: u32,
    host_count: u32,
    expect_continue: bool,
    close: bool,
}

impl FieldFacts {
    fn new(http10: bool) -> Self {
        FieldFacts {
            http10,
            content_length: None,
            cl_count: 0,
            te_count: 0,
            host_count: 0,
            expect_continue: false,
            close: http10,
        }
    }

    /// Reads one header field, refusing a value the gateway will not accept.
    #[inline]
    fn note(&mut self, name: &[u8], value: &[u8]) -> Result<(), HeadError> {
        if name.eq_ignore_ascii_case(b"content-length") {
            self.cl_count += 1;
            self.content_length = Some(
                parse_content_length(value)
                    .ok_or(HeadError::BadRequest("invalid Content-Length"))?,
            );
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.te_count += 1;
            check_transfer_coding(value)?;
        } else if name.eq_ignore_ascii_case(b"host") {
            self.host_count += 1;
            if !valid_host(value) {
                return Err(HeadError::BadRequest("invalid Host"));
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            if self.http10 {
                return Ok(());
            }
            if !trim_ows(value).eq_ignore_ascii_case(b"100-continue") {
                return Err(HeadError::ExpectationFailed);
            }
            self.expect_continue = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            if header_tokens(value).any(|t| t.eq_ignore_ascii_case(b"close")) {
                self.close = true;
            }
        } else if name.eq_ignore_ascii_case(b"content-encoding")
            && !trim_ows(value).eq_ignore_ascii_case(b"identity")
        {
            return Err(HeadError::UnsupportedMediaType);
        }
        Ok(())
    }

    /// Decides how the body is delimited, refusing conflicting or repeated framing fields
    /// and a missing or repeated Host.
    fn framing(&self) -> Result<BodyFraming, HeadError> {
        let (cl, te, http10) = (self.cl_count, self.te_count, self.http10);
        if cl > 1 {
            return Err(HeadError::BadRequest("multiple Content-Length fields"));
        }
        if te > 1 {
            return Err(HeadError::BadRequest("multiple Transfer-Encoding fields"));
        }
        if te > 0 && http10 {
            return Err(HeadError::BadRequest(
                "Transfer-Encoding in an HTTP/1.0 request",
            ));
        }
        if te > 0 && cl > 0 {
            return Err(HeadError::BadRequest(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        if self.host_count > 1 || (!http10 && self.host_count == 0) {
            return Err(HeadError::BadRequest("exactly one Host field is required"));
        }
        Ok(if te > 0 {
            BodyFraming::Chunked
        } else {
            match self.content_length {
                Some(0) | None => BodyFraming::None,
                Some(n) => BodyFraming::Length(n),
            }
        })
    }
}

fn httparse_error(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        httparse::Error::Version => HeadError::BadRequest("unsupported HTTP version"),
        httparse::Error::Token => HeadError::BadRequest("malformed request line"),
        _ => HeadError::BadRequest("malformed request head"),
    }
}

/// Validates the request line of an incomplete head as soon as its CRLF has arrived, so a
/// malformed one (an HTTP/0.9 `GET /\r\n`, a bad version) is answered at once instead of
/// at the head timeout. `find_head_end` has already rejected bare CR and LF.
fn check_request_line(buf: &[u8]) -> Result<(), HeadError> {
    let Some(cr) = buf.iter().position(|&b| b == b'\r') else {
        return Ok(());
    };
    if buf.get(cr + 1) != Some(&b'\n') {
        return Ok(());
    }
    let mut no_headers: [httparse::Header<'_>; 0] = [];
    let mut req = httparse::Request::new(&mut no_headers);
    match req.parse(&buf[..cr + 2]) {
        // A lone leading CRLF is skipped by httparse: nothing to judge yet.
        Ok(_) => Ok(()),
        Err(e) => Err(httparse_error(e)),
    }
}

/// Transfer codings registered with IANA that the gateway understands but does not decode:
/// a request using them gets 501. Anything else unknown is malformed (400).
const KNOWN_CODINGS: &[&[u8]] = &[b"gzip", b"x-gzip", b"deflate", b"compress", b"x-compress"];

/// Accepts exactly `chunked` (any case, optional whitespace). A list with an empty element,
/// a non-token, an unknown coding, `chunked` twice or not last is a 400; a list of known
/// codings (e.g. `gzip` or `gzip, chunked`) is a 501.
fn check_transfer_coding(value: &[u8]) -> Result<(), HeadError> {
    let mut n = 0usize;
    let mut chunked_at: Option<usize> = None;
    for raw in value.split(|&b| b == b',') {
        let t = trim_ows(raw);
        if t.is_empty() || !t.iter().all(|&b| is_tchar(b)) {
            return Err(HeadError::BadRequest("invalid Transfer-Encoding"));
        }
        if t.eq_ignore_ascii_case(b"chunked") {
            if chunked_at.is_some() {
                return Err(HeadError::BadRequest(
                    "chunked transfer coding applied twice",
                ));
            }
            chunked_at = Some(n);
        } else if !KNOWN_CODINGS.iter().any(|k| t.eq_ignore_ascii_case(k)) {
            return Err(HeadError::BadRequest("unknown transfer coding"));
        }
        n += 1;
    }
    match chunked_at {
        Some(0) if n == 1 => Ok(()),
        Some(i) if i + 1 != n => Err(HeadError::BadRequest(
            "chunked must be the final transfer coding",
        )),
        _ => Err(HeadError::NotImplemented),
    }
}

fn strip_scheme(t: &str) -> Option<&str> {
    let b = t.as_bytes();
    if b.len() >= 7 && b[..7].eq_ignore_ascii_case(b"http://") {
        Some(&t[7..])
    } else if b.len() >= 8 && b[..8].eq_ignore_ascii_case(b"https://") {
        Some(&t[8..])
    } else {
        None
    }
}

/// Picks 414 when the request line alone is over the URI limit, else 431.
fn oversize_error(buf: &[u8], limits: &HeadLimits) -> HeadError {
    let line_end = buf.iter().position(|&b| b == b'\r').unwrap_or(buf.len());
    if line_end > limits.max_uri_bytes {
        HeadError::UriTooLong
    } else {
        HeadError::HeaderTooLarge
    }
}

/// A Host value as RFC 9112 §3.2 and RFC 3986 §3.2.2 have it: `uri-host [":" port]`, where
/// uri-host is an IP literal in brackets (an IPv6address; IPvFuture is refused), or a
/// reg-name (IPv4 addresses included) of unreserved characters, percent-encodings and
/// sub-delimiters. Refused: userinfo (`@`), spaces, a path, a comma (a list: more than one
/// host) and a port of more than 5 digits. Empty is allowed (a target without authority).
///
/// Public so the fuzz targets (`fuzz/`) can check it against a reference implementation;
/// [`parse`] applies it to every Host field.
pub fn valid_host(v: &[u8]) -> bool {
    let v = trim_ows(v);
    let (host, port) = if let Some(rest) = v.strip_prefix(b"[") {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        // std's parser reads exactly RFC 3986's IPv6address (no zone, no IPvFuture).
        let literal = std::str::from_utf8(&rest[..close]);
        if !literal.is_ok_and(|l| l.parse::<std::net::Ipv6Addr>().is_ok()) {
            return false;
        }
        (&b""[..], &rest[close + 1..])
    } else {
        match v.iter().position(|&b| b == b':') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, &b""[..]),
        }
    };
    let port_ok = match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    let mut i = 0;
    while i < host.len() {
        let b = host[i];
        if b == b'%' {
            let hex = |j: usize| host.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
            continue;
        }
        if !(b.is_ascii_alphanumeric() || b"-._~!$&'()*+;=".contains(&b)) {
            return false;
        }
        i += 1;
    }
    port_ok
}

/// RFC 9110 token character.
#[inline]
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: HeadLimits = HeadLimits {
        underscores: UnderscoreHeaders::Drop,
        max_head_bytes: 32 * 1024,
        max_headers: 100,
        max_uri_bytes: 8192,
    };

    fn p(s: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        let mut spans = Vec::new();
        parse(s, &L, &mut spans)
    }

    #[test]
    fn parses_a_simple_post() {
        let raw =
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
        let mut spans = Vec::new();
        let h = parse(raw, &L, &mut spans).unwrap().unwrap();
        assert_eq!(h.method, Method::POST);
        assert_eq!(h.path(raw), "/v1/chat/completions");
        assert_eq!(&raw[h.query.clone()], b"?x=1");
        assert_eq!(h.framing, BodyFraming::Length(5));
        assert_eq!(&raw[h.len..], b"hello");
        assert_eq!(spans.len(), 2);
        assert!(spans[1].is(raw, "content-length"));
    }

    #[test]
    fn incomplete_is_none() {
        assert!(p(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        assert!(p(b"GET / HTTP/1.1\r\nHost: a\r\n\r").unwrap().is_none());
    }

    #[test]
    fn rejects_bare_lf_and_cr() {
        assert!(matches!(
            p(b"GET /health HTTP/1.1\nHost: a\n\n"),
            Err(HeadError::BadRequest(_))
        ));
        assert!(matches!(
            p(b"GET / HTTP/1.1\r\nX: a\rContent-Length: 5\r\n\r\n"),
            Err(HeadError::BadRequest(_))
        ));
    }

    #[test]
    fn absolute_form_drops_authority() {
        let raw = b"POST http://169.254.169.254/v1/models HTTP/1.1\r\nHost: a\r\n\r\n";
        let h = p(raw).unwrap().unwrap();
        assert_eq!(h.path(raw), "/v1/models");
    }

    #[test]
    fn framing_conflicts() {
        let cases: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,chunked\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ];
        for c in cases {
            assert!(
                matches!(p(c), Err(HeadError::BadRequest(_))),
                "{}",
                String::from_utf8_lossy(c)
            );
        }
        assert_eq!(
            p(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n").unwrap_err(),
            HeadError::NotImplemented
        );
    }

    #[test]
    fn transfer_codings() {
        assert_eq!(check_transfer_coding(b"chunked"), Ok(()));
        assert_eq!(check_transfer_coding(b" Chunked "), Ok(()));
        for c in [
            &b"gzip"[..],
            b"gzip, chunked",
            b"X-GZIP,chunked",
            b"deflate",
        ] {
            assert_eq!(check_transfer_coding(c), Err(HeadError::NotImplemented));
        }
        for c in [
            &b"xchunked"[..],
            b"identity",
            b"chunked, chunked",
            b",chunked",
            b"chunked,",
            b"chunked, gzip",
            b"gzip;q=1, chunked",
            b"\"chunked\"",
            b"",
        ] {
            assert!(
                matches!(check_transfer_coding(c), Err(HeadError::BadRequest(_))),
                "{}",
                String::from_utf8_lossy(c)
            );
        }
    }

    #[test]
    fn malformed_request_line_is_rejected_before_the_head_ends() {
        assert!(matches!(p(b"GET /\r\n"), Err(HeadError::BadRequest(_))));
        assert!(matches!(
            p(b"GET / HTTP/1.32\r\nHost: a\r\n"),
            Err(HeadError::BadRequest(_))
        ));
        assert!(p(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        assert!(p(b"\r\nGET / HT").unwrap().is_none());
        assert!(p(b"GET /aaaa").unwrap().is_none());
    }

    #[test]
    fn limits() {
        let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(16 * 1024));
        assert_eq!(p(long_uri.as_bytes()).unwrap_err(), HeadError::UriTooLong);
        let big = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        assert_eq!(p(big.as_bytes()).unwrap_err(), HeadError::HeaderTooLarge);
        let mut many = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
        for i in 0..500 {
            many.push_str(&format!("X-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(p(many.as_bytes()).unwrap_err(), HeadError::TooManyHeaders);
    }

    #[test]
    fn expect_handling() {
        let h =
            p(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
                .unwrap()
                .unwrap();
        assert!(h.expect_continue);
        assert_eq!(
            p(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n").unwrap_err(),
            HeadError::ExpectationFailed
        );
    }

    #[test]
    fn host_values_follow_rfc_9112_and_3986() {
        for ok in [
            "a",
            "api.example.com",
            "api.example.com:8443",
            "10.0.0.1:80",
            "[::1]",
            "[2001:db8::1]:8080",
            "xn--bcher-kva.example",
            "a%2Db",
            "",
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {ok}\r\n\r\n");
            assert!(p(raw.as_bytes()).unwrap().is_some(), "{ok:?}");
        }
        for bad in [
            "user@host",
            "user:pw@host",
            "a b",
            "host/path",
            "a,b",
            "a, b",
            "host:80:81",
            "host:port",
            "host:123456",
            "[::1",
            "[zz::1]",
            "a%2",
            "a%zz",
            "a\\b",
            "a?b",
            "a#b",
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(
                p(raw.as_bytes()).unwrap_err(),
                HeadError::BadRequest("invalid Host"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_ip_literal_must_be_an_ipv6_address() {
        // Found by fuzz/ (the `host` target against its RFC 3986 reference): any run of hex
        // digits, colons and dots used to pass as an IP literal.
        for bad in [
            "[1]",
            "[a1]",
            "[191]",
            "[1:0]",
            "[:::]",
            "[:::1]",
            "[::1:]",
            "[::1::1]",
            "[8..]",
            "[:9D.0]",
            "[10.0.0.1:::1]",
            "[2001:dbdb8::1]:80",
            "[2001:db8::20011111]:8080",
            "[::01.2.3.4]",
            "[1.2.3.4::]",
            "[v1.fe]",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad:?}");
            let raw = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(
                p(raw.as_bytes()).unwrap_err(),
                HeadError::BadRequest("invalid Host"),
                "{bad:?}"
            );
        }
        for ok in [
            "[::]",
            "[::1]:",
            "[1:2:3:4:5:6:7:8]",
            "[1:2:3:4:5:6:7::]",
            "[::ffff:10.0.0.1]:443",
            "[1:2:3:4:5:6:1.2.3.4]",
        ] {
            assert!(valid_host(ok.as_bytes()), "{ok:?}");
        }
    }

    #[test]
    fn a_fragment_in_the_target_is_refused() {
        for raw in [
            &b"GET /v1/models#x HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"POST /v1/chat/completions?a=1#/../admin HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET http://h/v1/models#f HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(
                p(raw).unwrap_err(),
                HeadError::BadRequest("request target with a fragment (#)"),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn underscore_header_names_are_dropped_refused_or_kept() {
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nX_Y: 1\r\nContent-Length: 2\r\n\r\nhi";
        let mut spans = Vec::new();
        let h = parse(raw, &L, &mut spans).unwrap().unwrap();
        assert_eq!(
            h.framing,
            BodyFraming::Length(2),
            "never read as Transfer-Encoding"
        );
        let names: Vec<&[u8]> = spans
            .iter()
            .map(|s| &raw[s.name.0 as usize..s.name.1 as usize])
            .collect();
        assert_eq!(names, [&b"Host"[..], b"Content-Length"]);
        let reject = HeadLimits {
            underscores: UnderscoreHeaders::Reject,
            ..L
        };
        assert_eq!(
            parse(raw, &reject, &mut spans).unwrap_err(),
            HeadError::BadRequest("header name with an underscore")
        );
        let forward = HeadLimits {
            underscores: UnderscoreHeaders::Forward,
            ..L
        };
        let h = parse(raw, &forward, &mut spans).unwrap().unwrap();
        assert_eq!(h.framing, BodyFraming::Length(2));
        assert_eq!(spans.len(), 4);
    }
}
