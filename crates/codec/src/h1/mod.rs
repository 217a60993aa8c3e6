//! HTTP/1.1 wire codec: request heads with limits, strict chunked framing, and response
//! writing helpers.
//!
//! Owns byte-level parsing and serialisation only. It must not do I/O, routing or
//! logging: every function here is synchronous and works on caller-owned buffers, so the
//! gateway's connection loops decide when to read and write.

pub mod chunked;
pub mod request_head;
pub mod request_id;
pub mod response_head;
pub mod retry_after;
pub mod traceparent;
pub mod write;

/// Headers that describe one hop of a connection and are never forwarded (RFC 9110 §7.6.1),
/// plus the framing headers the gateway always writes afresh.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "content-length",
];

/// Is `name` (any case) a hop-by-hop or framing header?
#[inline]
pub fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Iterates the comma-separated tokens of a header value, trimmed of optional whitespace.
pub fn header_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|t| !t.is_empty())
}

/// Trims spaces and tabs at both ends.
#[inline]
pub fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Parses a Content-Length value strictly: one or more ASCII digits, no sign, no list,
/// no overflow.
pub fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = trim_ows(v);
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_strict() {
        assert_eq!(parse_content_length(b"5"), Some(5));
        assert_eq!(parse_content_length(b" 42 "), Some(42));
        for bad in [
            &b"+5"[..],
            b"0x5",
            b"-1",
            b"5 5",
            b"1_0",
            b"",
            b"5, 5",
            b"18446744073709551616",
        ] {
            assert_eq!(parse_content_length(bad), None, "{:?}", bad);
        }
        assert_eq!(
            parse_content_length(b"18446744073709551615"),
            Some(u64::MAX)
        );
    }

    #[test]
    fn tokens_split_and_trim() {
        let t: Vec<&[u8]> = header_tokens(b" close ,X-Foo,, Authorization").collect();
        assert_eq!(t, vec![&b"close"[..], b"X-Foo", b"Authorization"]);
    }
}
