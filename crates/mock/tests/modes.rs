//! API modes: an OpenAI-only engine's and an Anthropic-only engine's refusals (404, 400,
//! 401) and their bodies, Anthropic's error shape for faults, its model list and its
//! stream `ping`, vLLM's `--api-key` check, and the recording of refused requests.

mod common;

use common::*;
use rolter_mock::MockApi;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const CHAT_BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const MESSAGES: &str = "/v1/messages";
const MSG_BODY: &str =
    r#"{"model":"c","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;
const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// Status and JSON body of one request.
fn answer(m: &rolter_mock::MockHandle, raw: &str) -> (u16, Value) {
    let r = call(m.addr(), raw);
    (r.status, r.json())
}

#[test]
fn openai_engine_lacks_anthropic_and_responses_routes() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.api = MockApi::OpenAi;
        c.record_requests = true;
        c.tokens = 2;
    });
    let not_found = json!({"detail": "Not Found"});
    for raw in [
        post(MESSAGES, &[VERSION], MSG_BODY),
        post("/v1/messages/count_tokens", &[VERSION], MSG_BODY),
        post("/v1/responses", &[], r#"{"model":"r","input":"hi"}"#),
        request("GET", MESSAGES, &[], ""),
    ] {
        assert_eq!(answer(&m, &raw), (404, not_found.clone()), "{raw}");
    }
    // Everything else is served as by any engine.
    let (status, v) = answer(&m, &post(CHAT, &[], CHAT_BODY));
    assert_eq!(
        (status, v["choices"][0]["finish_reason"].clone()),
        (200, json!("stop"))
    );
    let (status, v) = answer(&m, &post("/v1/completions", &[], r#"{"prompt":"x"}"#));
    assert_eq!(
        (status, v["object"].clone()),
        (200, json!("text_completion"))
    );
    let (status, v) = answer(&m, &post("/v1/embeddings", &[], r#"{"input":"x"}"#));
    assert_eq!((status, v["object"].clone()), (200, json!("list")));
    let (status, v) = answer(&m, &request("GET", "/v1/models", &[], ""));
    assert_eq!(
        (status, v["data"][0]["owned_by"].clone()),
        (200, json!("vllm"))
    );
    let (status, v) = answer(&m, &post("/tokenize", &[], r#"{"prompt":"abcd"}"#));
    assert_eq!((status, v["count"].is_u64()), (200, true));
    let (status, v) = answer(&m, &request("GET", "/nope", &[], ""));
    assert_eq!(
        (status, v["error"]["type"].clone()),
        (404, json!("NotFoundError"))
    );
    assert_eq!(
        call(m.addr(), &request("GET", "/health", &[], "")).status,
        200
    );
    // The refused requests reached the engine and were recorded, with their bodies.
    let reqs = m.requests();
    let paths: Vec<_> = reqs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            MESSAGES,
            "/v1/messages/count_tokens",
            "/v1/responses",
            MESSAGES,
            CHAT,
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
            "/tokenize",
            "/nope",
            "/health"
        ]
    );
    assert_eq!(reqs[0].body, MSG_BODY.as_bytes());
    assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
    // Refused before the engine: not counted as inference requests.
    assert_eq!(m.stats().requests, 3);
}

#[test]
fn anthropic_engine_serves_only_its_api() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.api = MockApi::Anthropic;
        c.record_requests = true;
        c.tokens = 2;
        c.models = vec!["claude-a".into(), "claude-b".into()];
    });
    let not_found = anthropic_error("not_found_error", "Not Found");
    for raw in [
        post(CHAT, &[VERSION], CHAT_BODY),
        post("/v1/completions", &[VERSION], r#"{"prompt":"x"}"#),
        post("/v1/embeddings", &[VERSION], r#"{"input":"x"}"#),
        post("/v1/responses", &[VERSION], r#"{"input":"x"}"#),
        post("/tokenize", &[VERSION], r#"{"prompt":"x"}"#),
        request("GET", "/nope", &[], ""),
    ] {
        assert_eq!(answer(&m, &raw), (404, not_found.clone()), "{raw}");
    }
    let no_version = anthropic_error(
        "invalid_request_error",
        "anthropic-version: header is required",
    );
    assert_eq!(
        answer(&m, &post(MESSAGES, &[], MSG_BODY)),
        (400, no_version.clone())
    );
    let count = "/v1/messages/count_tokens";
    assert_eq!(answer(&m, &post(count, &[], MSG_BODY)), (400, no_version));
    let (status, v) = answer(&m, &post(MESSAGES, &[VERSION], MSG_BODY));
    assert_eq!((status, v["stop_reason"].clone()), (200, json!("end_turn")));
    let (status, v) = answer(&m, &post(count, &[VERSION], MSG_BODY));
    assert_eq!((status, v["input_tokens"].is_u64()), (200, true));
    let created = "2025-01-01T00:00:00Z";
    assert_eq!(
        answer(&m, &request("GET", "/v1/models", &[], "")),
        (
            200,
            json!({
                "data": [
                    {"type": "model", "id": "claude-a", "display_name": "claude-a", "created_at": created},
                    {"type": "model", "id": "claude-b", "display_name": "claude-b", "created_at": created}
                ],
                "has_more": false, "first_id": "claude-a", "last_id": "claude-b"
            })
        )
    );
    let (status, v) = answer(&m, &request("GET", MESSAGES, &[VERSION], ""));
    assert_eq!(
        (status, v),
        (
            405,
            anthropic_error("invalid_request_error", "Method Not Allowed")
        )
    );
    let (status, v) = answer(&m, &post(MESSAGES, &[VERSION], "{not json"));
    assert_eq!(
        (status, v["error"]["type"].clone()),
        (400, json!("invalid_request_error"))
    );
    assert_eq!(v["type"], "error");
    // The engine's own endpoints stay.
    assert_eq!(
        call(m.addr(), &request("GET", "/health", &[], "")).status,
        200
    );
    assert_eq!(
        call(m.addr(), &request("GET", "/metrics", &[], "")).status,
        200
    );
    let (status, v) = answer(&m, &request("GET", "/mock/stats", &[], ""));
    assert_eq!((status, v["requests"].clone()), (200, json!(2)));
    let reqs = m.requests();
    assert_eq!(reqs.len(), 16);
    assert_eq!(
        (reqs[0].path.as_str(), reqs[0].body.as_slice()),
        (CHAT, CHAT_BODY.as_bytes())
    );
    assert_eq!(reqs[6].path, MESSAGES);
    assert!(reqs[6].header("anthropic-version").is_none());
}

#[test]
fn anthropic_engine_errors_have_anthropic_shape() {
    let m = start(rolter_mock::Driver::Auto, |c| c.api = MockApi::Anthropic);
    let fault = call(m.addr(), &post("/mock/fault", &[], r#"{"status":429}"#));
    assert_eq!(fault.status, 200);
    let rate_limited = anthropic_error(
        "rate_limit_error",
        "mock engine injected error (status 429)",
    );
    assert_eq!(
        answer(&m, &post(MESSAGES, &[VERSION], MSG_BODY)),
        (429, rate_limited)
    );
    call(m.addr(), &post("/mock/fault", &[], ""));
    for (status, kind) in [
        ("529", "overloaded_error"),
        ("500", "api_error"),
        ("401", "authentication_error"),
        ("403", "permission_error"),
        ("413", "request_too_large"),
        ("422", "invalid_request_error"),
    ] {
        let headers = [
            VERSION,
            ("x-mock-status", status),
            ("x-mock-retry-after", "3"),
        ];
        let r = call(m.addr(), &post(MESSAGES, &headers, MSG_BODY));
        assert_eq!(r.status.to_string(), status);
        assert_eq!(r.header("retry-after"), Some("3"));
        let message = format!("mock engine injected error (status {status})");
        assert_eq!(r.json(), anthropic_error(kind, &message));
    }
    let zero = MSG_BODY.replace("\"max_tokens\":2", "\"max_tokens\":0");
    assert_eq!(
        answer(&m, &post(MESSAGES, &[VERSION], &zero)),
        (
            400,
            anthropic_error(
                "invalid_request_error",
                "max_tokens must be at least 1, got 0."
            )
        )
    );
}

#[test]
fn anthropic_engine_checks_its_key() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.api = MockApi::Anthropic;
        c.api_key = Some("sk-right".into());
        c.tokens = 2;
    });
    let required = anthropic_error("authentication_error", "x-api-key header is required");
    let invalid = anthropic_error("authentication_error", "invalid x-api-key");
    let right = ("x-api-key", "sk-right");
    let wrong = ("x-api-key", "sk-wrong");
    assert_eq!(
        answer(&m, &post(MESSAGES, &[VERSION], MSG_BODY)),
        (401, required.clone())
    );
    assert_eq!(
        answer(&m, &post(MESSAGES, &[VERSION, wrong], MSG_BODY)),
        (401, invalid)
    );
    // A bearer token is not Anthropic's key.
    let bearer = ("authorization", "Bearer sk-right");
    assert_eq!(
        answer(&m, &post(MESSAGES, &[VERSION, bearer], MSG_BODY)),
        (401, required.clone())
    );
    let models = request("GET", "/v1/models", &[], "");
    assert_eq!(answer(&m, &models), (401, required));
    // The key is checked before the version; an unknown path is a 404 whatever the key.
    let (status, v) = answer(&m, &post(MESSAGES, &[right], MSG_BODY));
    assert_eq!(
        (status, v["error"]["type"].clone()),
        (400, json!("invalid_request_error"))
    );
    let (status, v) = answer(&m, &post(CHAT, &[wrong], CHAT_BODY));
    assert_eq!(
        (status, v["error"]["type"].clone()),
        (404, json!("not_found_error"))
    );
    let (status, v) = answer(&m, &post(MESSAGES, &[VERSION, right], MSG_BODY));
    assert_eq!((status, v["type"].clone()), (200, json!("message")));
    assert_eq!(
        call(m.addr(), &request("GET", "/v1/models", &[right], "")).status,
        200
    );
    assert_eq!(
        call(m.addr(), &request("GET", "/health", &[], "")).status,
        200
    );
    assert_eq!(
        call(m.addr(), &request("GET", "/mock/stats", &[], "")).status,
        200
    );
}

#[test]
fn openai_and_any_engines_check_a_bearer_key() {
    for api in [MockApi::Any, MockApi::OpenAi] {
        let m = start(rolter_mock::Driver::Auto, |c| {
            c.api = api;
            c.api_key = Some("k1".into());
            c.tokens = 2;
        });
        let unauthorized = (401, json!({"error": "Unauthorized"}));
        assert_eq!(answer(&m, &post(CHAT, &[], CHAT_BODY)), unauthorized);
        let wrong = ("authorization", "Bearer k2");
        assert_eq!(answer(&m, &post(CHAT, &[wrong], CHAT_BODY)), unauthorized);
        let x_api_key = ("x-api-key", "k1");
        assert_eq!(
            answer(&m, &post(MESSAGES, &[VERSION, x_api_key], MSG_BODY)),
            unauthorized
        );
        assert_eq!(
            answer(&m, &request("GET", "/v1/models", &[], "")),
            unauthorized
        );
        let right = ("authorization", "Bearer k1");
        let (status, v) = answer(&m, &post(CHAT, &[right], CHAT_BODY));
        assert_eq!(
            (status, v["object"].clone()),
            (200, json!("chat.completion"))
        );
        let (status, _) = answer(&m, &post(MESSAGES, &[right], MSG_BODY));
        assert_eq!(status, if api == MockApi::Any { 200 } else { 404 });
        // Outside /v1 no key is needed, as with vLLM.
        let (status, _) = answer(&m, &post("/tokenize", &[], r#"{"prompt":"abcd"}"#));
        assert_eq!(status, 200);
        assert_eq!(
            call(m.addr(), &request("GET", "/health", &[], "")).status,
            200
        );
    }
}

#[test]
fn anthropic_streams_ping_after_message_start() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.api = MockApi::Anthropic;
        c.tokens = 2;
    });
    let body = MSG_BODY.replace("\"max_tokens\":2", "\"stream\":true");
    let r = call(m.addr(), &post(MESSAGES, &[VERSION], &body));
    assert_eq!(r.status, 200);
    let events = sse_events(&r.body);
    let types: Vec<_> = events.iter().map(|(e, _)| e.clone().unwrap()).collect();
    assert_eq!(
        types,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(r
        .text()
        .contains("}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\nevent: content_block_start\n"));
    // Any engine's streams have no ping.
    let m = start(rolter_mock::Driver::Auto, |c| c.tokens = 2);
    let r = call(m.addr(), &post(MESSAGES, &[], &body));
    assert!(sse_events(&r.body)
        .iter()
        .all(|(e, _)| e.as_deref() != Some("ping")));
}
