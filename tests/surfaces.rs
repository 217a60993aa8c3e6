//! Each API's shape for the gateway's own answers, under both drivers, on the wire: errors
//! on `/v1/messages` in Anthropic's shape (`{"type":"error","error":{"type","message"}}`,
//! its status mapping) and its cut stream ending with Anthropic's `event: error`; the
//! Responses API's cut stream ending with its `error` event numbered after the last one;
//! OpenAI's surfaces keep OpenAI's shape; an error answering HEAD has no body.

mod common;

use common::scripted::{parse_raw, read_all, Raw};
use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;

fn gw(d: DriverChoice, m: &rolter_mock::MockHandle) -> Gateway {
    gateway_for(d, &[m], "retries = 0")
}

/// One request (closing the connection), read until the gateway closes.
fn exchange(g: &Gateway, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Raw {
    let mut h: Vec<(&str, &str)> = headers.to_vec();
    h.push(("connection", "close"));
    let mut c = Client::connect(g.local_addr());
    c.send(&request(method, path, &h, body));
    parse_raw(read_all(&mut c))
}

fn json(r: &Raw, ctx: &str) -> serde_json::Value {
    serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{ctx}: body is not JSON ({e}): {}", r.show()))
}

fn messages_body(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":32,"stream":{stream},"messages":[{{"role":"user","content":"Hello"}}]}}"#
    )
}

/// The SSE events of a body, each without its blank line.
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| e.trim_start_matches('\n').to_string())
        .collect()
}

/// The data of the last event, which must be an `event: error` whose `type` is `error`.
fn last_error_event(evs: &[String], ctx: &str) -> serde_json::Value {
    let last = evs.last().unwrap();
    let data = last
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("{ctx}: last event {last:?}"));
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["type"], "error", "{ctx}: {v}");
    v
}

#[test]
fn messages_errors_are_anthropic_shaped_with_anthropic_types() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("a", |_| {});
        let g = gw(d, &m);
        // Unknown model: 404 not_found_error, the request id in the body too.
        let r = exchange(
            &g,
            "POST",
            "/v1/messages",
            &[("x-request-id", "req-anthropic-1")],
            &messages_body("no-such-model", false),
        );
        assert_eq!(r.status, Some(404), "{ctx}: {}", r.show());
        let v = json(&r, ctx);
        assert_eq!(v["type"], "error", "{ctx}: {v}");
        assert_eq!(v["error"]["type"], "not_found_error", "{ctx}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no-such-model"),
            "{ctx}: {v}"
        );
        assert_eq!(v["request_id"], "req-anthropic-1", "{ctx}: {v}");
        assert!(
            v.get("code").is_none() && v["error"].get("code").is_none(),
            "{ctx}: {v}"
        );
        // Malformed JSON: 400 invalid_request_error.
        let r = exchange(&g, "POST", "/v1/messages", &[], "{not json");
        assert_eq!(r.status, Some(400), "{ctx}: {}", r.show());
        assert_eq!(
            json(&r, ctx)["error"]["type"],
            "invalid_request_error",
            "{ctx}"
        );
        // The same mistakes on OpenAI's surface keep OpenAI's shape.
        let r = exchange(
            &g,
            "POST",
            "/v1/chat/completions",
            &[],
            &messages_body("no-such-model", false),
        );
        assert_eq!(r.status, Some(404), "{ctx}");
        let v = json(&r, ctx);
        assert_eq!(v["error"]["code"], "model_not_found", "{ctx}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{ctx}: {v}");
        assert!(v.get("type").is_none(), "{ctx}: {v}");
        // The engine's own errors pass through untouched (its body, its status).
        let r = exchange(
            &g,
            "POST",
            "/v1/messages",
            &[("x-mock-status", "429")],
            &messages_body("m", false),
        );
        assert_eq!(r.status, Some(429), "{ctx}: {}", r.show());
        assert_eq!(m.requests().len(), 1, "{ctx}");
    }
}

#[test]
fn a_cut_messages_stream_ends_with_anthropics_error_event() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("a", |c| c.tokens = 8);
        let g = gw(d, &m);
        let r = exchange(
            &g,
            "POST",
            "/v1/messages",
            &[("x-mock-reset-after", "2")],
            &messages_body("m", true),
        );
        assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
        assert!(
            !r.terminated,
            "{ctx}: a cut stream must not end cleanly: {}",
            r.show()
        );
        let evs = events(&r.body);
        assert_eq!(
            evs.iter()
                .filter(|e| e.contains("content_block_delta"))
                .count(),
            2,
            "{ctx}: {evs:?}"
        );
        let v = last_error_event(&evs, ctx);
        assert_eq!(v["error"]["type"], "api_error", "{ctx}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("incomplete"),
            "{ctx}: {v}"
        );
        assert!(
            !String::from_utf8_lossy(&r.body).contains("\"code\""),
            "{ctx}"
        );
    }
}

#[test]
fn a_cut_responses_stream_ends_with_its_error_event_numbered_after_the_last() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("a", |c| c.tokens = 8);
        let g = gw(d, &m);
        let body = r#"{"model":"m","stream":true,"input":"Hello"}"#;
        let r = exchange(
            &g,
            "POST",
            "/v1/responses",
            &[("x-mock-reset-after", "3")],
            body,
        );
        assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
        assert!(!r.terminated, "{ctx}: {}", r.show());
        let evs = events(&r.body);
        let numbers: Vec<u64> = evs
            .iter()
            .filter_map(|e| {
                let data = e.split_once("data: ")?.1;
                serde_json::from_str::<serde_json::Value>(data).ok()?["sequence_number"].as_u64()
            })
            .collect();
        let v = last_error_event(&evs, ctx);
        assert_eq!(v["code"], "upstream_stream_interrupted", "{ctx}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains("incomplete"),
            "{ctx}"
        );
        assert!(v.get("param").is_some(), "{ctx}: {v}");
        // Numbered after the last event the engine sent.
        let n = numbers.len();
        assert!(n >= 3, "{ctx}: {numbers:?}");
        assert_eq!(numbers[n - 1], numbers[n - 2] + 1, "{ctx}: {numbers:?}");
    }
}

#[test]
fn an_error_answering_head_carries_no_body() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("a", |_| {});
        let g = gw(d, &m);
        for (path, status) in [
            ("/v1/chat/completions", 405),
            ("/v1/messages", 405),
            ("/no/such/path", 404),
        ] {
            // Two HEADs on one connection: a body after the first would be read as the
            // second answer's start.
            let mut c = Client::connect(g.local_addr());
            c.send(&request("HEAD", path, &[], ""));
            c.send(&request("HEAD", path, &[("connection", "close")], ""));
            let raw = read_all(&mut c);
            let text = String::from_utf8_lossy(&raw).into_owned();
            let heads: Vec<&str> = text.split("\r\n\r\n").filter(|s| !s.is_empty()).collect();
            assert_eq!(heads.len(), 2, "{ctx} {path}: {text}");
            for h in heads {
                assert!(
                    h.starts_with(&format!("HTTP/1.1 {status} ")),
                    "{ctx} {path}: {text}"
                );
                // The length GET would have, no bytes of it.
                let len: usize = h
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{ctx} {path}: {h}"));
                assert!(len > 0, "{ctx} {path}");
            }
            assert!(text.ends_with("\r\n\r\n"), "{ctx} {path}: {text}");
        }
        // HEAD on the gateway's own GET endpoints: GET's head, no body.
        for path in ["/health", "/v1/models", "/v1/models/m"] {
            let get = exchange(&g, "GET", path, &[], "");
            let mut c = Client::connect(g.local_addr());
            c.send(&request("HEAD", path, &[("connection", "close")], ""));
            let text = String::from_utf8_lossy(&read_all(&mut c)).into_owned();
            assert!(
                text.starts_with("HTTP/1.1 200 OK\r\n"),
                "{ctx} {path}: {text}"
            );
            assert!(text.ends_with("\r\n\r\n"), "{ctx} {path}: {text}");
            assert!(
                text.contains(&format!("content-length: {}\r\n", get.body.len())),
                "{ctx} {path}: {text}"
            );
        }
        // Anthropic's 405 to HEAD: head only as well, and the next request is served.
        let mut c = Client::connect(g.local_addr());
        c.send(&request("HEAD", "/v1/messages", &[], ""));
        c.send(&post(
            "/v1/chat/completions",
            &[("connection", "close")],
            &chat_body(false),
        ));
        let text = String::from_utf8_lossy(&read_all(&mut c)).into_owned();
        assert!(text.starts_with("HTTP/1.1 405 "), "{ctx}: {text}");
        assert!(
            text.contains("\r\n\r\nHTTP/1.1 200 OK\r\n"),
            "{ctx}: {text}"
        );
    }
}
