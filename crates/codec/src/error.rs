//! The gateway's error type, typed by side (client, upstream, internal) and by whether the
//! request may be retried on another target.
//!
//! Owns the mapping from a failure to an HTTP status and a body in the shape of the API the
//! request called ([`Surface`]): OpenAI's for OpenAI's surfaces, Anthropic's for
//! `/v1/messages`, and each one's mid-stream error event. A response to HEAD carries the
//! head only. It must not do I/O; the connection loop writes what `write_reply` produces.

use std::borrow::Cow;

use crate::h1::write::{write_head, write_head_and_body};
use crate::surface::Surface;

/// How a gateway error answers the request it answers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reply<'a> {
    /// The API the request called.
    pub surface: Surface,
    /// The request was HEAD: the head only, no body (RFC 9110 §9.3.2).
    pub head_only: bool,
    /// `Connection: close` on the answer.
    pub close: bool,
    /// Returned as `x-request-id` (and in Anthropic's body as `request_id`).
    pub request_id: Option<&'a str>,
}

/// Anthropic's `error.type` for a status (its SDK raises by status; the type names it).
pub fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Who caused the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The request is bad; retrying it anywhere gives the same answer.
    Client,
    /// A target failed or misbehaved.
    Upstream,
    /// The gateway itself cannot serve (no candidate, overload, bug).
    Internal,
}

/// Whether another target may be tried for the same request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing reached the target, or it refused before doing work: try another.
    Allowed,
    /// The target may have done work, or bytes already reached the client.
    Forbidden,
}

/// What went wrong upstream: every way an attempt on a target can fail, told apart so the
/// attempt stage decides on the kind, never on the text. Each kind has one OpenAI `code`,
/// one status (a refusal's is the target's own) and one retry verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The TCP connection was refused or failed.
    ConnectFailed,
    /// The connection did not open in time.
    ConnectTimeout,
    /// The TLS handshake with the target failed.
    TlsFailed,
    /// Writing the request failed before any response byte.
    WriteFailed,
    /// The target closed the connection before any response byte: it cannot have answered.
    ClosedBeforeResponse,
    /// The target closed the connection inside its response head.
    ClosedInHead,
    /// The target answered with a status the route retries (429, 5xx); held back from the
    /// client.
    Refused(u16),
    /// No response head before the first-byte timeout (or the route's deadline).
    FirstByteTimeout,
    /// The response head or body was malformed.
    BadResponse,
    /// The response had started reaching the client when the target failed.
    StreamInterrupted,
}

impl UpstreamFailure {
    /// Every kind (with a 429 and a 503 for the refusals), for tests and docs.
    pub const ALL: [UpstreamFailure; 11] = [
        UpstreamFailure::ConnectFailed,
        UpstreamFailure::ConnectTimeout,
        UpstreamFailure::TlsFailed,
        UpstreamFailure::WriteFailed,
        UpstreamFailure::ClosedBeforeResponse,
        UpstreamFailure::ClosedInHead,
        UpstreamFailure::Refused(429),
        UpstreamFailure::Refused(503),
        UpstreamFailure::FirstByteTimeout,
        UpstreamFailure::BadResponse,
        UpstreamFailure::StreamInterrupted,
    ];

    /// The OpenAI `error.code` the client sees.
    pub fn code(self) -> &'static str {
        match self {
            UpstreamFailure::ConnectFailed => "upstream_connect_failed",
            UpstreamFailure::ConnectTimeout => "upstream_connect_timeout",
            UpstreamFailure::TlsFailed => "upstream_tls_failed",
            UpstreamFailure::WriteFailed => "upstream_write_failed",
            UpstreamFailure::ClosedBeforeResponse | UpstreamFailure::ClosedInHead => {
                "upstream_closed"
            }
            UpstreamFailure::Refused(_) => "upstream_unavailable",
            UpstreamFailure::FirstByteTimeout => "upstream_timeout",
            UpstreamFailure::BadResponse => "upstream_bad_response",
            UpstreamFailure::StreamInterrupted => "upstream_stream_interrupted",
        }
    }

    /// The status the gateway answers with.
    pub fn status(self) -> u16 {
        match self {
            UpstreamFailure::ConnectTimeout | UpstreamFailure::FirstByteTimeout => 504,
            UpstreamFailure::Refused(status) => status,
            _ => 502,
        }
    }

    /// Whether another target may be tried: only when the target cannot have done the
    /// work, or refused it. A first-byte timeout is `Forbidden` here (the engine may be
    /// generating); a route opts into retrying it with `retry_on = ["first_byte_timeout"]`.
    pub fn retry(self) -> Retry {
        match self {
            UpstreamFailure::ConnectFailed
            | UpstreamFailure::ConnectTimeout
            | UpstreamFailure::TlsFailed
            | UpstreamFailure::WriteFailed
            | UpstreamFailure::ClosedBeforeResponse
            | UpstreamFailure::Refused(_) => Retry::Allowed,
            UpstreamFailure::ClosedInHead
            | UpstreamFailure::FirstByteTimeout
            | UpstreamFailure::BadResponse
            | UpstreamFailure::StreamInterrupted => Retry::Forbidden,
        }
    }

    /// Whether the request never reached the engine (the connection never opened).
    pub fn never_reached(self) -> bool {
        matches!(
            self,
            UpstreamFailure::ConnectFailed | UpstreamFailure::ConnectTimeout
        )
    }
}

#[derive(Debug, Clone)]
pub struct GatewayError {
    pub side: Side,
    pub retry: Retry,
    /// The kind of an upstream failure (`None` for the client's and the gateway's own).
    pub upstream: Option<UpstreamFailure>,
    pub status: u16,
    /// OpenAI `error.type`.
    pub kind: &'static str,
    /// OpenAI `error.code`.
    pub code: &'static str,
    /// OpenAI `error.param`, when one field is at fault.
    pub param: Option<&'static str>,
    pub message: Cow<'static, str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl GatewayError {
    pub fn client(status: u16, code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        GatewayError {
            side: Side::Client,
            retry: Retry::Forbidden,
            upstream: None,
            status,
            kind: "invalid_request_error",
            code,
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A target's failure of kind `failure`: its code, status and retry verdict are the
    /// kind's.
    pub fn upstream(failure: UpstreamFailure, message: impl Into<Cow<'static, str>>) -> Self {
        GatewayError {
            side: Side::Upstream,
            retry: failure.retry(),
            upstream: Some(failure),
            status: failure.status(),
            kind: "upstream_error",
            code: failure.code(),
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn internal(
        status: u16,
        code: &'static str,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        GatewayError {
            side: Side::Internal,
            retry: Retry::Forbidden,
            upstream: None,
            status,
            kind: "server_error",
            code,
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// `{"error":{"message","type","param","code"}}`, in OpenAI's field order.
    pub fn body(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: &'a str,
        }
        #[derive(serde::Serialize)]
        struct Outer<'a> {
            error: Inner<'a>,
        }
        serde_json::to_vec(&Outer {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        })
        .unwrap_or_default()
    }

    /// The body in `surface`'s shape (`request_id`, when known, goes into Anthropic's).
    pub fn body_in(&self, surface: Surface, request_id: Option<&str>) -> Vec<u8> {
        match surface {
            Surface::OpenAi | Surface::Responses => self.body(),
            Surface::Anthropic => {
                #[derive(serde::Serialize)]
                struct Inner<'a> {
                    #[serde(rename = "type")]
                    kind: &'a str,
                    message: &'a str,
                }
                #[derive(serde::Serialize)]
                struct Outer<'a> {
                    #[serde(rename = "type")]
                    kind: &'a str,
                    error: Inner<'a>,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    request_id: Option<&'a str>,
                }
                serde_json::to_vec(&Outer {
                    kind: "error",
                    error: Inner {
                        kind: anthropic_type(self.status),
                        message: &self.message,
                    },
                    request_id,
                })
                .unwrap_or_default()
            }
        }
    }

    /// The event that ends a stream this error cut, in `surface`'s shape, blank line
    /// included: OpenAI's `data:` line with the error object; the Responses API's
    /// `event: error` (numbered after `last_sequence`, the stream's last
    /// `sequence_number`); Anthropic's `event: error`.
    pub fn stream_event(&self, surface: Surface, last_sequence: Option<u64>) -> Vec<u8> {
        let mut ev = Vec::with_capacity(64 + self.message.len());
        match surface {
            Surface::OpenAi => {
                ev.extend_from_slice(b"data: ");
                ev.extend_from_slice(&self.body());
            }
            Surface::Responses => {
                #[derive(serde::Serialize)]
                struct Event<'a> {
                    #[serde(rename = "type")]
                    kind: &'a str,
                    code: &'a str,
                    message: &'a str,
                    param: Option<&'a str>,
                    sequence_number: u64,
                }
                ev.extend_from_slice(b"event: error\ndata: ");
                let e = Event {
                    kind: "error",
                    code: self.code,
                    message: &self.message,
                    param: self.param,
                    sequence_number: last_sequence.map_or(0, |s| s + 1),
                };
                ev.extend_from_slice(&serde_json::to_vec(&e).unwrap_or_default());
            }
            Surface::Anthropic => {
                ev.extend_from_slice(b"event: error\ndata: ");
                ev.extend_from_slice(&self.body_in(Surface::Anthropic, None));
            }
        }
        ev.extend_from_slice(b"\n\n");
        ev
    }

    /// Appends a complete response (head and OpenAI-shaped JSON body) to `out`.
    pub fn write_response(&self, out: &mut Vec<u8>, close: bool) {
        self.write_reply(
            out,
            Reply {
                close,
                ..Reply::default()
            },
        );
    }

    /// Appends the response answering `to` (its surface's body; the head only for HEAD).
    pub fn write_reply(&self, out: &mut Vec<u8>, to: Reply<'_>) {
        let mut ra = itoa::Buffer::new();
        let mut extra: [(&str, &str); 2] = [("", ""); 2];
        let mut n = 0;
        if let Some(s) = self.retry_after {
            extra[n] = ("retry-after", ra.format(s));
            n += 1;
        }
        if let Some(id) = to.request_id {
            extra[n] = ("x-request-id", id);
            n += 1;
        }
        let body = self.body_in(to.surface, to.request_id);
        if to.head_only {
            write_head(
                out,
                self.status,
                "application/json",
                &extra[..n],
                body.len(),
                to.close,
            );
        } else {
            write_head_and_body(
                out,
                self.status,
                "application/json",
                &extra[..n],
                &body,
                to.close,
            );
        }
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl std::error::Error for GatewayError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let e = GatewayError::client(404, "model_not_found", "The model `x` does not exist.")
            .with_param("model");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["message"], "The model `x` does not exist.");
        let text = String::from_utf8(e.body()).unwrap();
        assert!(text.starts_with(r#"{"error":{"message":"#), "{text}");
    }

    #[test]
    fn response_has_retry_after_and_length() {
        let e = GatewayError::internal(503, "no_capacity", "busy").with_retry_after(2);
        let mut out = Vec::new();
        e.write_response(&mut out, true);
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(s.contains("\r\nretry-after: 2\r\n"));
        assert!(s.contains("\r\nconnection: close\r\n"));
        let body = &s[s.find("\r\n\r\n").unwrap() + 4..];
        assert!(s.contains(&format!("content-length: {}\r\n", body.len())));
    }

    #[test]
    fn anthropic_body_and_events_follow_each_api() {
        let e = GatewayError::client(404, "model_not_found", "no model `x`");
        let v: serde_json::Value =
            serde_json::from_slice(&e.body_in(Surface::Anthropic, Some("req-1"))).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type":"error","error":{"type":"not_found_error","message":"no model `x`"},"request_id":"req-1"})
        );
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (431, "invalid_request_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
        ] {
            assert_eq!(anthropic_type(status), kind, "{status}");
        }
        let cut = GatewayError::upstream(UpstreamFailure::StreamInterrupted, "cut");
        let ev = String::from_utf8(cut.stream_event(Surface::OpenAi, None)).unwrap();
        assert!(
            ev.starts_with("data: {\"error\":{") && ev.ends_with("}\n\n"),
            "{ev}"
        );
        let ev = String::from_utf8(cut.stream_event(Surface::Anthropic, None)).unwrap();
        assert_eq!(
            ev,
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"cut\"}}\n\n"
        );
        let ev = String::from_utf8(cut.stream_event(Surface::Responses, Some(6))).unwrap();
        assert_eq!(
            ev,
            "event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_stream_interrupted\",\"message\":\"cut\",\"param\":null,\"sequence_number\":7}\n\n"
        );
    }

    #[test]
    fn every_upstream_failure_has_one_code_status_and_verdict() {
        use UpstreamFailure as F;
        let table: Vec<(F, &str, u16, Retry, bool)> = F::ALL
            .iter()
            .map(|&f| (f, f.code(), f.status(), f.retry(), f.never_reached()))
            .collect();
        assert_eq!(
            table,
            [
                (
                    F::ConnectFailed,
                    "upstream_connect_failed",
                    502,
                    Retry::Allowed,
                    true
                ),
                (
                    F::ConnectTimeout,
                    "upstream_connect_timeout",
                    504,
                    Retry::Allowed,
                    true
                ),
                (
                    F::TlsFailed,
                    "upstream_tls_failed",
                    502,
                    Retry::Allowed,
                    false
                ),
                (
                    F::WriteFailed,
                    "upstream_write_failed",
                    502,
                    Retry::Allowed,
                    false
                ),
                (
                    F::ClosedBeforeResponse,
                    "upstream_closed",
                    502,
                    Retry::Allowed,
                    false
                ),
                (
                    F::ClosedInHead,
                    "upstream_closed",
                    502,
                    Retry::Forbidden,
                    false
                ),
                (
                    F::Refused(429),
                    "upstream_unavailable",
                    429,
                    Retry::Allowed,
                    false
                ),
                (
                    F::Refused(503),
                    "upstream_unavailable",
                    503,
                    Retry::Allowed,
                    false
                ),
                (
                    F::FirstByteTimeout,
                    "upstream_timeout",
                    504,
                    Retry::Forbidden,
                    false
                ),
                (
                    F::BadResponse,
                    "upstream_bad_response",
                    502,
                    Retry::Forbidden,
                    false
                ),
                (
                    F::StreamInterrupted,
                    "upstream_stream_interrupted",
                    502,
                    Retry::Forbidden,
                    false
                ),
            ]
        );
        let e = GatewayError::upstream(F::Refused(429), "busy");
        assert_eq!(
            (e.side, e.status, e.code),
            (Side::Upstream, 429, "upstream_unavailable")
        );
        assert_eq!(e.upstream, Some(F::Refused(429)));
        assert_eq!(GatewayError::client(400, "bad_request", "x").upstream, None);
    }

    #[test]
    fn an_answer_to_head_is_the_head_alone() {
        let e = GatewayError::client(405, "method_not_allowed", "POST only");
        let mut get = Vec::new();
        e.write_reply(&mut get, Reply::default());
        let mut head = Vec::new();
        e.write_reply(
            &mut head,
            Reply {
                head_only: true,
                ..Reply::default()
            },
        );
        let end = get.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(head, get[..end], "the same head, no body");
        assert!(get.len() > end);
    }
}
