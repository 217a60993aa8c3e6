//! The API modes ([`MockApi`]): which requests an engine refuses before reading them (a
//! route its API lacks, a missing `anthropic-version`, a wrong key), and the error and
//! model-list bodies each mode speaks.
//!
//! Owns those decisions and bodies only; it must not answer, record or count requests
//! (the connection does).

use serde_json::json;

use crate::http::{Credentials, Head, Surface};
use crate::{MockApi, MockConfig};

/// The answer to a request the engine's API mode refuses: status and JSON body; `None`
/// when the request goes on to its route.
///
/// OpenAI and any: with a key, every path under `/v1` needs `Authorization: Bearer <key>`
/// (vLLM's 401 `{"error":"Unauthorized"}`); then an OpenAI-only engine answers its missing
/// routes with FastAPI's 404 `{"detail":"Not Found"}`. Anthropic: a path outside its API
/// is a 404 `not_found_error`, then a wrong or missing `x-api-key` a 401
/// `authentication_error`, then a `/v1/messages*` request without `anthropic-version` a
/// 400 `invalid_request_error`.
pub(crate) fn refusal(cfg: &MockConfig, head: &Head) -> Option<(u16, Vec<u8>)> {
    let surface = head.surface;
    match cfg.api {
        MockApi::Any | MockApi::OpenAi => {
            let guarded = !matches!(surface, Surface::Control | Surface::Other);
            if let (Some(key), true) = (&cfg.api_key, guarded) {
                if !bearer_matches(&head.credentials, key) {
                    return Some((401, body(json!({"error": "Unauthorized"}))));
                }
            }
            let missing = matches!(surface, Surface::Anthropic | Surface::Responses);
            (cfg.api == MockApi::OpenAi && missing)
                .then(|| (404, body(json!({"detail": "Not Found"}))))
        }
        MockApi::Anthropic => anthropic_refusal(cfg, surface, &head.credentials),
    }
}

fn anthropic_refusal(
    cfg: &MockConfig,
    surface: Surface,
    credentials: &Credentials,
) -> Option<(u16, Vec<u8>)> {
    match surface {
        Surface::Control => return None,
        Surface::Anthropic | Surface::Models => {}
        _ => return Some((404, anthropic_error_body(404, "Not Found"))),
    }
    if let Some(key) = &cfg.api_key {
        let refused = match credentials.x_api_key.as_deref() {
            None => Some("x-api-key header is required"),
            Some(k) if k != key => Some("invalid x-api-key"),
            Some(_) => None,
        };
        if let Some(msg) = refused {
            return Some((401, anthropic_error_body(401, msg)));
        }
    }
    if surface == Surface::Anthropic && !credentials.anthropic_version {
        let msg = "anthropic-version: header is required";
        return Some((400, anthropic_error_body(400, msg)));
    }
    None
}

/// `Authorization: Bearer <key>`, the scheme in any case, as vLLM checks it.
fn bearer_matches(credentials: &Credentials, key: &str) -> bool {
    let Some(value) = credentials.authorization.as_deref() else {
        return false;
    };
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    scheme.eq_ignore_ascii_case("bearer") && token == key
}

fn body(v: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The error body of an engine in mode `api`: Anthropic's shape for an Anthropic engine,
/// vLLM's OpenAI shape otherwise.
pub(crate) fn error_body(api: MockApi, status: u16, message: &str) -> Vec<u8> {
    match api {
        MockApi::Anthropic => anthropic_error_body(status, message),
        MockApi::Any | MockApi::OpenAi => crate::api::error_body(status, message),
    }
}

/// Anthropic's error type for a status, as its API documents them; other 4xx are
/// `invalid_request_error`, other 5xx `api_error`.
fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type":"error","error":{"type":...,"message":...}}`, its members in Anthropic's order.
pub(crate) fn anthropic_error_body(status: u16, message: &str) -> Vec<u8> {
    let kind = anthropic_error_type(status);
    let message = serde_json::to_string(message).unwrap_or_else(|_| "\"\"".into());
    format!(r#"{{"type":"error","error":{{"type":"{kind}","message":{message}}}}}"#).into_bytes()
}

/// The `GET /v1/models` body of an engine in mode `api`: Anthropic's list for an
/// Anthropic engine, vLLM's otherwise.
pub(crate) fn models_body(api: MockApi, models: &[String]) -> Vec<u8> {
    match api {
        MockApi::Anthropic => anthropic_models_body(models),
        MockApi::Any | MockApi::OpenAi => crate::api::models_body(models),
    }
}

/// An Anthropic engine's `GET /v1/models`: the served models in Anthropic's list shape.
fn anthropic_models_body(models: &[String]) -> Vec<u8> {
    let data: Vec<_> = models
        .iter()
        .map(|m| {
            json!({"type": "model", "id": m, "display_name": m,
                "created_at": "2025-01-01T00:00:00Z"})
        })
        .collect();
    body(json!({
        "data": data,
        "has_more": false,
        "first_id": models.first(),
        "last_id": models.last(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_error_bytes() {
        let body = anthropic_error_body(404, "a \"b\"");
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"type":"error","error":{"type":"not_found_error","message":"a \"b\""}}"#
        );
    }

    #[test]
    fn anthropic_error_types() {
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(MockApi::Anthropic, 503, "x")).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "api_error", "message": "x"}})
        );
        let types: Vec<_> = [400, 401, 403, 404, 405, 413, 422, 429, 500, 529]
            .into_iter()
            .map(anthropic_error_type)
            .collect();
        assert_eq!(
            types,
            [
                "invalid_request_error",
                "authentication_error",
                "permission_error",
                "not_found_error",
                "invalid_request_error",
                "request_too_large",
                "invalid_request_error",
                "rate_limit_error",
                "api_error",
                "overloaded_error"
            ]
        );
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(MockApi::OpenAi, 429, "y")).unwrap();
        assert_eq!(v["error"]["type"], "RateLimitError");
    }

    #[test]
    fn bearer_scheme_any_case() {
        let with = |v: &str| Credentials {
            authorization: Some(v.to_string()),
            ..Credentials::default()
        };
        assert!(bearer_matches(&with("Bearer k1"), "k1"));
        assert!(bearer_matches(&with("bearer k1"), "k1"));
        assert!(!bearer_matches(&with("Bearer k2"), "k1"));
        assert!(!bearer_matches(&with("Basic k1"), "k1"));
        assert!(!bearer_matches(&with("k1"), "k1"));
        assert!(!bearer_matches(&Credentials::default(), "k1"));
    }
}
