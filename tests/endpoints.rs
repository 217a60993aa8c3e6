//! The engines' other endpoints through the gateway, under both drivers: `GET
//! /v1/models/{id}` answered by the gateway; Anthropic's `count_tokens` and vLLM's and
//! SGLang's rerank, score, tokenize, detokenize, pooling, classify and audio endpoints
//! routed by path and `model` (the audio ones as multipart forms, forwarded byte for byte);
//! a route's `passthrough` prefixes; and the 404 for everything else.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter::config::DriverChoice;
use rolter_mock::MockHandle;

/// A gateway in front of `a` (serving "m") and `b` (serving "other", under a target URL
/// with a `/v1` base path, as an SDK's base URL would be written), and a passthrough route
/// for `/mock/echo/` with `passthrough_strategy` over two targets that are both `b`.
fn two_model_gateway(
    d: DriverChoice,
    a: &MockHandle,
    b: &MockHandle,
    passthrough_strategy: &str,
) -> rolter::Gateway {
    let timeouts = "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"1s\"\n";
    let rest = format!(
        r#"
[[targets]]
name = "a"
url = "http://{a}"
models = ["m"]
{timeouts}
[[targets]]
name = "b"
url = "http://{b}/v1"
models = ["other", "renamed"]
upstream_models = {{ renamed = "engine-name" }}
{timeouts}
[[targets]]
name = "b2"
url = "http://{b}/v1"
models = ["other"]
{timeouts}
[admin]
listen = "127.0.0.1:0"
[health]
active = false
failures = 0

[[routes]]
name = "custom"
targets = ["b", "b2"]
strategy = "{passthrough_strategy}"
[routes.match]
passthrough = ["/mock/echo/"]

[[routes]]
name = "main"
targets = ["a", "b"]
strategy = "round_robin"
"#,
        a = a.addr(),
        b = b.addr(),
    );
    gateway(d, &rest)
}

/// The last request `m` recorded.
fn last(m: &MockHandle) -> rolter_mock::RecordedRequest {
    m.requests().pop().expect("the engine received a request")
}

/// Sends raw bytes as one request and reads the response.
fn call_bytes(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut c = Client::connect(addr);
    c.r.get_mut().write_all(raw).unwrap();
    c.response().unwrap()
}

fn assert_openai_error(r: &Response, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
}

#[test]
fn models_by_id_are_answered_by_the_gateway() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = two_model_gateway(d, &a, &b, "round_robin");
        let list = call(g.local_addr(), &request("GET", "/v1/models", &[], ""));
        let listed = &list.json()["data"];
        for (i, id) in ["m", "other", "renamed"].iter().enumerate() {
            let r = call(
                g.local_addr(),
                &request("GET", &format!("/v1/models/{id}"), &[], ""),
            );
            assert_eq!(r.status, 200, "{}: {}", driver_name(d), r.text());
            assert_eq!(r.header("content-type"), Some("application/json"));
            // The same object the list holds.
            assert_eq!(r.json(), listed[i], "{id}");
            assert_eq!(r.json()["object"], "model");
        }
        let r = call(g.local_addr(), &request("GET", "/v1/models/nope", &[], ""));
        assert_openai_error(&r, 404, "model_not_found");
        assert_eq!(r.json()["error"]["param"], "model");
        // An escaped id is decoded.
        let r = call(
            g.local_addr(),
            &request("GET", "/v1/models/oth%65r", &[], ""),
        );
        assert_eq!(r.json()["id"], "other");
        let r = call(g.local_addr(), &post("/v1/models/m", &[], "{}"));
        assert_openai_error(&r, 405, "method_not_allowed");
        assert!(a.requests().is_empty() && b.requests().is_empty());
    }
}

/// Each JSON endpoint, a body for model "other", and a member its answer must have.
const JSON_ENDPOINTS: &[(&str, &str, &str)] = &[
    (
        "/v1/messages/count_tokens",
        r#"{"model":"other","messages":[{"role":"user","content":"Hello there"}]}"#,
        "input_tokens",
    ),
    (
        "/v1/rerank",
        r#"{"model":"other","query":"red apple","documents":["a red apple","blue sky"]}"#,
        "results",
    ),
    (
        "/rerank",
        r#"{"model":"other","query":"red","documents":["red","blue"],"top_n":1}"#,
        "results",
    ),
    (
        "/v1/score",
        r#"{"model":"other","text_1":"a b","text_2":["a b","c"]}"#,
        "data",
    ),
    (
        "/score",
        r#"{"model":"other","text_1":"a","text_2":"a"}"#,
        "data",
    ),
    (
        "/tokenize",
        r#"{"model":"other","prompt":"Hello there"}"#,
        "tokens",
    ),
    (
        "/detokenize",
        r#"{"model":"other","tokens":[0,1,2]}"#,
        "prompt",
    ),
    (
        "/pooling",
        r#"{"model":"other","input":["x","yy"]}"#,
        "data",
    ),
    ("/classify", r#"{"model":"other","input":"hello"}"#, "data"),
];

#[test]
fn engine_endpoints_are_routed_by_model() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |c| c.models = vec!["other".into()]);
        let g = two_model_gateway(d, &a, &b, "round_robin");
        for (path, body, member) in JSON_ENDPOINTS {
            let r = call(g.local_addr(), &post(path, &[], body));
            assert_eq!(r.status, 200, "{} {path}: {}", driver_name(d), r.text());
            assert_eq!(r.header("x-rolter-target"), Some("b"), "{path}");
            assert!(!r.json()[member].is_null(), "{path}: {}", r.text());
            // The target's `/v1` base path replaces a leading /v1 and is left off a path
            // outside /v1; the body arrives as sent.
            let got = last(&b);
            assert_eq!((got.method.as_str(), got.path.as_str()), ("POST", *path));
            assert_eq!(got.body, body.as_bytes(), "{path}");
        }
        let r = call(
            g.local_addr(),
            &post("/v1/rerank", &[], JSON_ENDPOINTS[1].1),
        );
        let results = &r.json()["results"];
        assert_eq!(results[0]["index"], 0, "the matching document first");
        assert_eq!(results[0]["document"]["text"], "a red apple");
        // Model "m" goes to `a` on the same paths.
        let r = call(
            g.local_addr(),
            &post("/pooling", &[], r#"{"model":"m","input":"x"}"#),
        );
        assert_eq!(r.header("x-rolter-target"), Some("a"));
        assert_eq!(last(&a).path, "/pooling");
        // Like any proxied path: a model no target serves, a missing model, a GET.
        let r = call(
            g.local_addr(),
            &post(
                "/v1/score",
                &[],
                r#"{"model":"nope","text_1":"a","text_2":"b"}"#,
            ),
        );
        assert_openai_error(&r, 404, "model_not_found");
        let r = call(g.local_addr(), &post("/classify", &[], r#"{"input":"x"}"#));
        assert_openai_error(&r, 400, "missing_model");
        let r = call(g.local_addr(), &request("GET", "/tokenize", &[], ""));
        assert_openai_error(&r, 405, "method_not_allowed");
        assert_eq!(
            a.requests().len(),
            1,
            "only the one request for `m` reached `a`"
        );
    }
}

const BOUNDARY: &str = "----rolterFormBoundary7MA4YWxkTrZu0gW";

/// A multipart form as the OpenAI SDK sends it: a binary file part (every byte value, CR
/// LF pairs, a near-miss of the boundary, text that looks like part headers), then the
/// `model` field and another.
fn audio_form(model: &str) -> Vec<u8> {
    let mut audio: Vec<u8> = (0..=255u8).collect();
    audio.extend_from_slice(b"\r\n------rolterFormBoundary\r\n");
    audio.extend_from_slice(
        format!("\r\n--{BOUNDARY}X\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nfake")
            .as_bytes(),
    );
    audio.extend((0..4096u32).map(|i| (i * 31 % 251) as u8));
    let mut b = Vec::new();
    b.extend_from_slice(
        format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"model.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes(),
    );
    b.extend_from_slice(&audio);
    b.extend_from_slice(
        format!("\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\nen\r\n--{BOUNDARY}--\r\n").as_bytes(),
    );
    b
}

fn form_request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: multipart/form-data; boundary={BOUNDARY}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

#[test]
fn audio_forms_are_routed_by_their_model_field_and_forwarded_byte_for_byte() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |c| c.models = vec!["other".into()]);
        let g = two_model_gateway(d, &a, &b, "round_robin");
        for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
            let form = audio_form("other");
            let r = call_bytes(g.local_addr(), &form_request(path, &form));
            assert_eq!(r.status, 200, "{} {path}: {}", driver_name(d), r.text());
            assert_eq!(r.header("x-rolter-target"), Some("b"));
            assert!(r.json()["text"]
                .as_str()
                .unwrap()
                .contains(&form.len().to_string()));
            let got = last(&b);
            assert_eq!(got.path, path);
            assert_eq!(got.body, form, "the form arrives byte for byte");
            assert_eq!(
                got.header("content-type"),
                Some(format!("multipart/form-data; boundary={BOUNDARY}").as_str())
            );
        }
        // A public name mapped to an upstream one is swapped in the field, nothing else.
        let path = "/v1/audio/transcriptions";
        let r = call_bytes(g.local_addr(), &form_request(path, &audio_form("renamed")));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(last(&b).body, audio_form("engine-name"));
        // Model "m" goes to `a`.
        let r = call_bytes(g.local_addr(), &form_request(path, &audio_form("m")));
        assert_eq!(r.header("x-rolter-target"), Some("a"));
        assert_eq!(last(&a).body, audio_form("m"));
        // A form without a model, and one that is not closed, are 400s.
        let no_model = format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--{BOUNDARY}--\r\n"
        );
        let r = call_bytes(g.local_addr(), &form_request(path, no_model.as_bytes()));
        assert_openai_error(&r, 400, "missing_model");
        let form = audio_form("other");
        let cut = &form[..form.len() - BOUNDARY.len() - 8];
        let r = call_bytes(g.local_addr(), &form_request(path, cut));
        assert_openai_error(&r, 400, "invalid_multipart");
        assert_eq!(b.requests().len(), 3, "no malformed form reached an engine");
    }
}

#[test]
fn passthrough_prefixes_forward_any_body_to_their_route() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |c| c.models = vec!["other".into()]);
        // cache_aware needs a prompt: without one it falls back to load and says so.
        let g = two_model_gateway(d, &a, &b, "cache_aware");
        let body: Vec<u8> = (0..=255u8).rev().collect();
        let mut raw = b"PUT /mock/echo/items/7?x=1 HTTP/1.1\r\nhost: test\r\nx-rolter-explain: 1\r\ncontent-type: application/octet-stream\r\ncontent-length: 256\r\n\r\n".to_vec();
        raw.extend_from_slice(&body);
        let r = call_bytes(g.local_addr(), &raw);
        assert_eq!(
            r.status,
            200,
            "{}: {}",
            driver_name(d),
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.body, body, "the engine's echo of the body");
        assert_eq!(r.header("x-rolter-route"), Some("custom"));
        // No model: the targets' `models` lists do not exclude them.
        assert!(matches!(r.header("x-rolter-target"), Some("b" | "b2")));
        assert_eq!(r.header("x-rolter-fallback"), Some("no_prompt"));
        let got = last(&b);
        assert_eq!(
            (got.method.as_str(), got.path.as_str()),
            ("PUT", "/mock/echo/items/7?x=1"),
            "a passthrough path outside /v1 goes under the base path less its /v1"
        );
        assert_eq!(got.body, body);
        // A GET without a body, and a JSON body with a model nobody serves: both by path.
        let r = call(g.local_addr(), &request("GET", "/mock/echo/", &[], ""));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(last(&b).method, "GET");
        let json = r#"{"model":"nope"}"#;
        let r = call(g.local_addr(), &post("/mock/echo/j", &[], json));
        assert_eq!((r.status, r.text().as_str()), (200, json));
        // HEAD has no body to relay; a path outside every prefix keeps its 404; the
        // inference paths still go by model.
        let mut c = Client::connect(g.local_addr());
        c.send(&request("HEAD", "/mock/echo/x", &[], ""));
        assert_eq!(c.head().unwrap().0, 405);
        for path in ["/mock/echo", "/v1/custom/x", "/mock/stats"] {
            let r = call(g.local_addr(), &post(path, &[], "{}"));
            assert_openai_error(&r, 404, "not_found");
        }
        let r = call(
            g.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(false)),
        );
        assert_eq!(r.header("x-rolter-target"), Some("a"));
        assert_eq!(b.requests().len(), 3);
        // The control thread counts the three fallbacks from the workers' records.
        let series = r#"rolter_strategy_fallbacks_total{route="custom",strategy="cache_aware",reason="no_prompt"}"#;
        wait_for(
            "the fallbacks to be counted",
            Duration::from_secs(10),
            || admin_series(&g, series) == Some(3.0),
        );
    }
}
