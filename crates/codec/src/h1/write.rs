//! Serialisation of response heads and complete local responses.
//!
//! Owns the status line, framing headers and the `connection` header the gateway writes.
//! It must not decide policy (keep-alive, retries): callers pass those decisions in.

/// Appends `HTTP/1.1 <code> <reason>\r\n`.
pub fn write_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(status).as_bytes());
    out.push(b' ');
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unknown");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `name: value\r\n`.
#[inline]
pub fn write_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `content-length: n\r\n`.
#[inline]
pub fn write_content_length(out: &mut Vec<u8>, n: u64) {
    let mut b = itoa::Buffer::new();
    write_header(out, b"content-length", b.format(n).as_bytes());
}

/// Appends a complete response with a Content-Length body.
pub fn write_head_and_body(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    close: bool,
) {
    write_head(out, status, content_type, extra, body.len(), close);
    out.extend_from_slice(body);
}

/// The head [`write_head_and_body`] writes for a body of `body_len` bytes, without the
/// body: the answer to HEAD, whose Content-Length is the one GET would carry.
pub fn write_head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body_len: usize,
    close: bool,
) {
    write_status_line(out, status);
    write_header(out, b"content-type", content_type.as_bytes());
    for (n, v) in extra {
        write_header(out, n.as_bytes(), v.as_bytes());
    }
    write_content_length(out, body_len as u64);
    if close {
        write_header(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
}

/// The interim response sent for `Expect: 100-continue`.
pub const CONTINUE_100: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
