//! The gateway's error type, typed by side (client, upstream, internal) and by whether the
//! request may be retried on another target.
//!
//! Owns the mapping from a failure to an HTTP status and an OpenAI-shaped body. It must not
//! do I/O; the connection loop writes what `write_response` produces.

use std::borrow::Cow;

use crate::h1::write::write_head_and_body;

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

#[derive(Debug, Clone)]
pub struct GatewayError {
    pub side: Side,
    pub retry: Retry,
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
            status,
            kind: "invalid_request_error",
            code,
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn upstream(
        status: u16,
        retry: Retry,
        code: &'static str,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        GatewayError {
            side: Side::Upstream,
            retry,
            status,
            kind: "upstream_error",
            code,
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

    /// Appends a complete response (head and JSON body) to `out`.
    pub fn write_response(&self, out: &mut Vec<u8>, close: bool) {
        self.write_response_with_id(out, close, None);
    }

    /// [`Self::write_response`] with an `x-request-id` header when `request_id` is given.
    pub fn write_response_with_id(&self, out: &mut Vec<u8>, close: bool, request_id: Option<&str>) {
        let mut ra = itoa::Buffer::new();
        let mut extra: [(&str, &str); 2] = [("", ""); 2];
        let mut n = 0;
        if let Some(s) = self.retry_after {
            extra[n] = ("retry-after", ra.format(s));
            n += 1;
        }
        if let Some(id) = request_id {
            extra[n] = ("x-request-id", id);
            n += 1;
        }
        write_head_and_body(
            out,
            self.status,
            "application/json",
            &extra[..n],
            &self.body(),
            close,
        );
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
}
