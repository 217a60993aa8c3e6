//! Wire-format tests: vLLM JSON and SSE shapes, HTTP framing, keep-alive and pipelining.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

fn chat_body(extra: &str) -> String {
    format!(r#"{{"model":"m-req","messages":[{{"role":"user","content":"0123456789"}}]{extra}}}"#)
}

/// The JSON "shape": keys and value kinds, not values.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::String(_) => "string".into(),
        Value::Number(_) => "number".into(),
        Value::Bool(_) => "bool".into(),
        Value::Null => Value::Null,
    }
}

fn fixture() -> Vec<Value> {
    let raw = include_bytes!("fixtures/vllm_chat_stream.sse");
    sse_events(raw)
        .into_iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(&d).unwrap())
        .collect()
}

#[test]
fn chat_stream_matches_fixture_with_usage() {
    let fx = fixture();
    for d in drivers() {
        let m = start(d, |c| c.tokens = 5);
        let r = call(
            m.addr(),
            &post(
                CHAT,
                &[],
                &chat_body(r#","stream":true,"stream_options":{"include_usage":true}"#),
            ),
        );
        assert_eq!(r.status, 200);
        assert!(r.chunked);
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert_eq!(r.header("x-mock-engine"), Some("mock"));
        // Every SSE event is its own chunk.
        for c in &r.chunks {
            assert_eq!(sse_events(c).len(), 1, "one event per chunk");
        }
        let events = sse_events(&r.body);
        assert_eq!(events.len(), 1 + 5 + 1 + 1);
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let json: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|(e, d)| {
                assert!(e.is_none());
                serde_json::from_str(d).unwrap()
            })
            .collect();
        assert_eq!(shape(&json[0]), shape(&fx[0]), "role chunk");
        assert_eq!(json[0]["choices"][0]["delta"], fx[0]["choices"][0]["delta"]);
        for t in &json[1..5] {
            assert_eq!(shape(t), shape(&fx[1]), "token chunk");
        }
        assert_eq!(shape(&json[5]), shape(&fx[2]), "last token chunk");
        assert_eq!(json[5]["choices"][0]["finish_reason"], "stop");
        assert_eq!(shape(&json[6]), shape(&fx[3]), "usage chunk");
        let id = &json[0]["id"];
        assert!(id.as_str().unwrap().starts_with("chatcmpl-"));
        for j in &json {
            assert_eq!(&j["id"], id);
            assert_eq!(j["model"], "m-req");
        }
        let usage = &json[6]["usage"];
        assert_eq!(usage["prompt_tokens"], 3);
        assert_eq!(usage["completion_tokens"], 5);
        assert_eq!(usage["total_tokens"], 8);
        let streamed: String = json[1..6]
            .iter()
            .map(|j| {
                j["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let full = call(m.addr(), &post(CHAT, &[], &chat_body(""))).json();
        assert_eq!(full["choices"][0]["message"]["content"], streamed.as_str());
    }
}

#[test]
fn chat_stream_without_usage_and_max_tokens() {
    for d in drivers() {
        let m = start(d, |_| {});
        let r = call(
            m.addr(),
            &post(CHAT, &[], &chat_body(r#","stream":true,"max_tokens":3"#)),
        );
        let events = sse_events(&r.body);
        assert_eq!(events.len(), 1 + 3 + 1);
        for (_, d) in &events[..4] {
            let v: Value = serde_json::from_str(d).unwrap();
            assert!(v.get("usage").is_none(), "usage key must be omitted: {d}");
            assert_eq!(v["choices"].as_array().unwrap().len(), 1);
        }
        let last: Value = serde_json::from_str(&events[3].1).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(events[4].1, "[DONE]");
        assert_eq!(m.stats().generation_tokens, 3);
    }
}

#[test]
fn non_streaming_shapes() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.models = vec!["first".into(), "second".into()];
        c.name = "eng-a".into();
    });
    let a = m.addr();
    let r = call(
        a,
        &post(CHAT, &[], &chat_body(r#","max_completion_tokens":4"#)),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-mock-engine"), Some("eng-a"));
    let v = r.json();
    assert!(
        v["id"]
            .as_str()
            .unwrap()
            .strip_prefix("chatcmpl-")
            .unwrap()
            .len()
            == 32
    );
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].is_u64());
    assert_eq!(v["model"], "m-req");
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    assert_eq!(c["message"]["tool_calls"], serde_json::json!([]));
    assert!(c["logprobs"].is_null() && c["stop_reason"].is_null());
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert!(v["usage"]["prompt_tokens_details"].is_null());
    assert!(v["prompt_logprobs"].is_null());

    // Default model when none is given; header token override; finish "stop".
    let r = call(
        a,
        &post(
            "/v1/completions",
            &[("x-mock-tokens", "2")],
            r#"{"prompt":"abcde"}"#,
        ),
    );
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "first");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["text"].is_string());
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 2);

    let v = call(
        a,
        &post("/v1/embeddings", &[], r#"{"model":"e","input":"abcdefgh"}"#),
    )
    .json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 8);
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["total_tokens"], 2);

    let v = call(
        a,
        &post(
            "/v1/messages",
            &[],
            r#"{"model":"c","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    )
    .json();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);

    let v = call(
        a,
        &post("/v1/responses", &[], r#"{"model":"r","input":"hello"}"#),
    )
    .json();
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["usage"]["total_tokens"], 2 + 16);

    let v = call(a, &request("GET", "/v1/models", &[], "")).json();
    let ids: Vec<_> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, vec!["first", "second"]);
    assert_eq!(v["data"][0]["owned_by"], "vllm");
    assert_eq!(v["data"][0]["max_model_len"], 8192);

    let r = call(a, &request("GET", "/nope", &[], ""));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "NotFoundError");
    let r = call(a, &post(CHAT, &[], "{not json"));
    assert_eq!(r.status, 400);
    let e = &r.json()["error"];
    assert_eq!(e["code"], 400);
    assert!(e["param"].is_null() && e["message"].is_string());

    let r = call(a, &request("GET", "/health", &[], ""));
    assert_eq!((r.status, r.body.len()), (200, 0));
    let s = call(a, &request("GET", "/mock/stats", &[], "")).json();
    assert_eq!(s["requests"], 6);
    assert_eq!(s["completed"], 6);
    assert_eq!(
        metric(a, "vllm:generation_tokens_total"),
        (4 + 2 + 3 + 16) as f64
    );
}

#[test]
fn anthropic_and_responses_streams() {
    let m = start(rolter_mock::Driver::Auto, |c| c.tokens = 3);
    let r = call(
        m.addr(),
        &post(
            "/v1/messages",
            &[],
            r#"{"model":"c","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    );
    let types: Vec<_> = sse_events(&r.body)
        .into_iter()
        .map(|(e, d)| {
            let v: Value = serde_json::from_str(&d).unwrap();
            assert_eq!(v["type"].as_str(), e.as_deref());
            e.unwrap()
        })
        .collect();
    assert_eq!(
        types,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let r = call(
        m.addr(),
        &post(
            "/v1/responses",
            &[],
            r#"{"model":"r","stream":true,"input":"hi"}"#,
        ),
    );
    let ev = sse_events(&r.body);
    let types: Vec<_> = ev.iter().map(|(e, _)| e.clone().unwrap()).collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.completed"
        ]
    );
    let done: Value = serde_json::from_str(&ev[4].1).unwrap();
    assert_eq!(done["response"]["status"], "completed");
}

#[test]
fn chunked_request_keepalive_and_pipelining() {
    for d in drivers() {
        let m = start(d, |c| c.record_requests = true);
        let mut c = Client::connect(m.addr());
        // Chunked request body.
        let body = chat_body("");
        let (a, b) = body.split_at(10);
        c.send(&format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Custom: Yes\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        ));
        assert_eq!(c.response().unwrap().status, 200);
        // Keep-alive: second request on the same connection.
        c.send(&post(CHAT, &[], &chat_body(r#","stream":true"#)));
        let r = c.response().unwrap();
        assert_eq!(sse_events(&r.body).last().unwrap().1, "[DONE]");
        // Pipelined: three requests in one write.
        let raw = format!(
            "{}{}{}",
            post(CHAT, &[], &chat_body(r#","stream":true"#)),
            request("GET", "/health", &[], ""),
            post("/v1/completions", &[], r#"{"prompt":"x","max_tokens":1}"#)
        );
        c.send(&raw);
        assert_eq!(c.response().unwrap().status, 200);
        assert_eq!(c.response().unwrap().status, 200);
        assert_eq!(
            c.response().unwrap().json()["usage"]["completion_tokens"],
            1
        );
        let reqs = m.requests();
        assert_eq!(reqs.len(), 5);
        assert_eq!(reqs[0].method, "POST");
        assert_eq!(reqs[0].path, CHAT);
        assert_eq!(reqs[0].header("x-custom"), Some("Yes"));
        assert_eq!(reqs[0].body, body.as_bytes());
        assert_eq!(reqs[3].path, "/health");
    }
}

#[test]
fn pipelined_request_during_slow_stream_is_kept() {
    for d in drivers() {
        let m = start(d, |c| {
            c.itl = Duration::from_millis(10);
            c.tokens = 5;
        });
        let mut c = Client::connect(m.addr());
        c.send(&post(CHAT, &[], &chat_body(r#","stream":true"#)));
        let (status, _) = c.head().unwrap();
        assert_eq!(status, 200);
        // Arrives while the first answer is streaming.
        c.send(&post(CHAT, &[], &chat_body(r#","max_tokens":2"#)));
        while c.chunk().unwrap().is_some() {}
        let r = c.response().unwrap();
        assert_eq!(r.json()["usage"]["completion_tokens"], 2);
        assert_eq!(m.stats().aborted, 0);
        assert_eq!(m.stats().completed, 2);
    }
}

#[test]
fn stream_timing_follows_ttft_and_itl() {
    for d in drivers() {
        let m = start(d, |c| {
            c.ttft = Duration::from_millis(60);
            c.itl = Duration::from_millis(20);
            c.tokens = 4;
        });
        let t0 = Instant::now();
        let mut c = Client::connect(m.addr());
        c.send(&post(CHAT, &[], &chat_body(r#","stream":true"#)));
        c.head().unwrap();
        assert!(t0.elapsed() < Duration::from_millis(50), "headers at once");
        c.chunk().unwrap().unwrap(); // role
        assert!(t0.elapsed() >= Duration::from_millis(55));
        c.chunk().unwrap().unwrap(); // token 0
        let t1 = Instant::now();
        c.chunk().unwrap().unwrap(); // token 1
        assert!(t1.elapsed() >= Duration::from_millis(12), "itl respected");
        while c.chunk().unwrap().is_some() {}
        assert!(t0.elapsed() >= Duration::from_millis(60 + 3 * 20 - 5));
    }
}

#[test]
fn http10_gets_unchunked_stream_and_close() {
    let m = start(rolter_mock::Driver::Auto, |c| c.tokens = 2);
    let body = chat_body(r#","stream":true"#);
    let mut c = Client::connect(m.addr());
    c.send(&format!(
        "POST {CHAT} HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    let r = c.response().unwrap();
    assert!(!r.chunked);
    assert!(r.header("transfer-encoding").is_none());
    assert_eq!(sse_events(&r.body).last().unwrap().1, "[DONE]");
}

#[test]
fn several_threads_serve() {
    let m = start(rolter_mock::Driver::Auto, |c| c.threads = 2);
    for _ in 0..20 {
        assert_eq!(call(m.addr(), &post(CHAT, &[], &chat_body(""))).status, 200);
    }
    assert_eq!(m.stats().completed, 20);
    m.shutdown();
}

#[test]
fn prefix_cache_reports_cached_tokens_and_metrics() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.tokens = 2;
        c.threads = 2;
        c.prefix_cache = Some(rolter_mock::PrefixCacheConfig {
            block_tokens: 4,
            capacity_blocks: 1000,
            prefill_us_per_token: 0,
            chars_per_token: 4,
        });
    });
    let a = m.addr();
    let question = "a fairly long question about prefix caching ".repeat(4);
    let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{question}"}}]}}"#);
    let canonical = format!(r#"[{{"content":"{question}","role":"user"}}]"#);
    let prompt_tokens = canonical.len().div_ceil(4) as u64;
    let full_block_tokens = (canonical.len() / 16 * 4) as u64;

    let r = call(a, &post(CHAT, &[], &body)).json();
    assert_eq!(r["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Same messages, other whitespace, streamed with usage.
    let spaced = body.replace(":[{", " : [ {").replace(",\"", ",\n \"");
    let r = call(
        a,
        &post(
            CHAT,
            &[],
            &spaced.replace(
                "}]}",
                r#"}], "stream": true, "stream_options": {"include_usage": true}}"#,
            ),
        ),
    );
    let events = sse_events(&r.body);
    let usage: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"],
        full_block_tokens
    );

    let s = m.stats();
    assert_eq!(s.prefix_cache_queries, 2 * prompt_tokens);
    assert_eq!(s.prefix_cache_hits, full_block_tokens);
    let pc = m.prefix_cache_stats().unwrap();
    assert_eq!(
        (pc.queries, pc.hits),
        (2 * prompt_tokens, full_block_tokens)
    );
    assert_eq!(pc.resident_blocks, full_block_tokens / 4);
    assert_eq!(
        metric(a, "vllm:prefix_cache_queries_total"),
        (2 * prompt_tokens) as f64
    );
    assert_eq!(
        metric(a, "vllm:prefix_cache_hits_total"),
        full_block_tokens as f64
    );
    assert_eq!(
        metric(a, "vllm:prompt_tokens_total"),
        (2 * prompt_tokens) as f64
    );
    let j = call(a, &request("GET", "/mock/stats", &[], "")).json();
    assert_eq!(j["prefix_cache_hits"], full_block_tokens);

    // Off by default: no details, no counters.
    let m = start(rolter_mock::Driver::Auto, |c| c.tokens = 2);
    let r = call(m.addr(), &post(CHAT, &[], &body)).json();
    assert!(r["usage"]["prompt_tokens_details"].is_null());
    assert!(m.prefix_cache_stats().is_none());
    assert_eq!(m.stats().prefix_cache_queries, 0);
}

#[test]
fn prefix_cache_prefill_delays_first_token() {
    let m = start(rolter_mock::Driver::Auto, |c| {
        c.tokens = 1;
        c.prefix_cache = Some(rolter_mock::PrefixCacheConfig {
            block_tokens: 16,
            capacity_blocks: 1000,
            prefill_us_per_token: 1000,
            chars_per_token: 4,
        });
    });
    // About 100 prompt tokens: ~100 ms cold, a few ms warm.
    let body = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(400));
    let t = Instant::now();
    let r = call(m.addr(), &post("/v1/completions", &[], &body)).json();
    let cold = t.elapsed();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(cold >= Duration::from_millis(100), "{cold:?}");
    let t = Instant::now();
    let r = call(
        m.addr(),
        &post("/v1/completions", &[("x-mock-ttft-ms", "0")], &body),
    )
    .json();
    let warm = t.elapsed();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
    assert!(warm < cold, "{warm:?} vs {cold:?}");
}
