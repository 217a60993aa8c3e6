//! Tool calls (chat and messages, whole and streamed, not after a tool's result) and stop
//! strings (chat `stop`, messages `stop_sequences`, completions `stop`), as exact JSON.

mod common;

use common::*;
use rolter_mock::MockApi;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");
const ARGUMENTS: &str = r#"{"location": "Paris", "unit": "celsius"}"#;
const CHAT_TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},{"type":"function","function":{"name":"get_time"}}]"#;
const MSG_TOOLS: &str = r#"[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object"}}]"#;

/// A chat body: `messages` (8 bytes of text: 2 prompt tokens) and extra fields.
fn chat(messages: &str, extra: &str) -> String {
    format!(r#"{{"model":"m","messages":{messages}{extra}}}"#)
}

fn ask_weather() -> &'static str {
    r#"[{"role":"user","content":"weather?"}]"#
}

/// Parsed SSE events, `[DONE]` as a string.
fn events(body: &[u8]) -> Vec<(Option<String>, Value)> {
    sse_events(body)
        .into_iter()
        .map(|(e, d)| match d.as_str() {
            "[DONE]" => (e, json!("[DONE]")),
            _ => (e, serde_json::from_str(&d).unwrap()),
        })
        .collect()
}

/// A chat chunk with this choice.
fn chunk(first: &Value, choice: Value) -> Value {
    json!({"id": first["id"], "object": "chat.completion.chunk", "created": first["created"],
        "model": "m", "choices": [choice], "usage": null})
}

fn assert_hex_id(id: &Value, prefix: &str) {
    let hex = id.as_str().unwrap().strip_prefix(prefix).unwrap();
    assert_eq!(hex.len(), 24, "{id}");
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
}

#[test]
fn chat_tool_call_whole() {
    let m = start(rolter_mock::Driver::Auto, |_| {});
    let v = call(
        m.addr(),
        &post(
            CHAT,
            &[],
            &chat(ask_weather(), &format!(r#","tools":{CHAT_TOOLS}"#)),
        ),
    )
    .json();
    let call_id = &v["choices"][0]["message"]["tool_calls"][0]["id"];
    assert_hex_id(call_id, "call_");
    assert_eq!(
        v,
        json!({
            "id": v["id"], "object": "chat.completion", "created": v["created"], "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
            ]}, "logprobs": null, "finish_reason": "tool_calls", "stop_reason": null}],
            "usage": {"prompt_tokens": 2, "total_tokens": 14, "completion_tokens": 12, "prompt_tokens_details": null},
            "prompt_logprobs": null
        })
    );
    assert_eq!(m.stats().generation_tokens, 12);
    // `tool_choice` names the tool; "required" takes the first; "none" answers text.
    let named = r#","tool_choice":{"type":"function","function":{"name":"get_time"}}"#;
    let v = call(
        m.addr(),
        &post(
            CHAT,
            &[],
            &chat(ask_weather(), &format!(r#","tools":{CHAT_TOOLS}{named}"#)),
        ),
    )
    .json();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_time"
    );
    let required = r#","tool_choice":"required""#;
    let v = call(
        m.addr(),
        &post(
            CHAT,
            &[],
            &chat(
                ask_weather(),
                &format!(r#","tools":{CHAT_TOOLS}{required}"#),
            ),
        ),
    )
    .json();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    let none = r#","tool_choice":"none""#;
    let v = call(
        m.addr(),
        &post(
            CHAT,
            &[],
            &chat(ask_weather(), &format!(r#","tools":{CHAT_TOOLS}{none}"#)),
        ),
    )
    .json();
    assert_eq!(v["choices"][0]["message"]["tool_calls"], json!([]));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // No tools, or an empty list: text.
    let v = call(
        m.addr(),
        &post(CHAT, &[], &chat(ask_weather(), r#","tools":[]"#)),
    )
    .json();
    assert_eq!(v["choices"][0]["message"]["tool_calls"], json!([]));
}

#[test]
fn chat_tool_call_streamed() {
    let m = start(rolter_mock::Driver::Auto, |_| {});
    let extra =
        format!(r#","tools":{CHAT_TOOLS},"stream":true,"stream_options":{{"include_usage":true}}"#);
    let r = call(m.addr(), &post(CHAT, &[], &chat(ask_weather(), &extra)));
    let ev = events(&r.body);
    let first = &ev[0].1;
    let call_id = &ev[1].1["choices"][0]["delta"]["tool_calls"][0]["id"];
    assert_hex_id(call_id, "call_");
    let piece = |args: &str| {
        chunk(
            first,
            json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args}}]},
            "logprobs": null, "finish_reason": null}),
        )
    };
    let expected = vec![
        chunk(
            first,
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
        ),
        chunk(
            first,
            json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}]}, "logprobs": null, "finish_reason": null}),
        ),
        piece(r#"{"location": "Paris", "#),
        piece(r#""unit": "celsius"}"#),
        chunk(
            first,
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls", "stop_reason": null}),
        ),
        json!({"id": first["id"], "object": "chat.completion.chunk", "created": first["created"], "model": "m",
            "choices": [], "usage": {"prompt_tokens": 2, "total_tokens": 14, "completion_tokens": 12}}),
        json!("[DONE]"),
    ];
    let got: Vec<Value> = ev
        .into_iter()
        .map(|(e, d)| {
            assert!(e.is_none());
            d
        })
        .collect();
    assert_eq!(got, expected);
    // The arguments' pieces make up the arguments.
    assert_eq!(
        format!("{}{}", r#"{"location": "Paris", "#, r#""unit": "celsius"}"#),
        ARGUMENTS
    );
    assert_eq!(m.stats().generation_tokens, 12);
}

#[test]
fn no_tool_call_after_a_tool_result() {
    let m = start(rolter_mock::Driver::Auto, |c| c.tokens = 2);
    let answered = r#"[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"15 C"}]"#;
    let v = call(
        m.addr(),
        &post(
            CHAT,
            &[],
            &chat(answered, &format!(r#","tools":{CHAT_TOOLS}"#)),
        ),
    )
    .json();
    let c = &v["choices"][0];
    assert_eq!(
        c["message"],
        json!({"role": "assistant", "content": " Hello from", "tool_calls": []})
    );
    assert_eq!(c["finish_reason"], "stop");
    let msg_answered = r#"[{"role":"user","content":"weather?"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"15 C"}]}]"#;
    let body =
        format!(r#"{{"model":"c","max_tokens":50,"tools":{MSG_TOOLS},"messages":{msg_answered}}}"#);
    let v = call(m.addr(), &post(MESSAGES, &[], &body)).json();
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": " Hello from"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    // A later user turn asks again: a tool call again.
    let again = msg_answered.replace(
        "]}]",
        r#"]},{"role":"assistant","content":"15 C"},{"role":"user","content":"and tomorrow?"}]"#,
    );
    let body = format!(r#"{{"model":"c","max_tokens":50,"tools":{MSG_TOOLS},"messages":{again}}}"#);
    let v = call(m.addr(), &post(MESSAGES, &[], &body)).json();
    assert_eq!(v["stop_reason"], "tool_use");
    // Streamed, the same: text after the tool's result.
    let body =
        format!(r#"{{"model":"c","stream":true,"tools":{MSG_TOOLS},"messages":{msg_answered}}}"#);
    let r = call(m.addr(), &post(MESSAGES, &[], &body));
    let ev = events(&r.body);
    assert_eq!(
        ev[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
}

#[test]
fn messages_tool_call_whole() {
    let m = start(rolter_mock::Driver::Auto, |_| {});
    let body = format!(
        r#"{{"model":"c","max_tokens":50,"tools":{MSG_TOOLS},"messages":{}}}"#,
        ask_weather()
    );
    let v = call(m.addr(), &post(MESSAGES, &[], &body)).json();
    let tool_id = &v["content"][0]["id"];
    assert_hex_id(tool_id, "toolu_");
    assert_eq!(
        v,
        json!({
            "id": v["id"], "type": "message", "role": "assistant", "model": "c",
            "content": [{"type": "tool_use", "id": tool_id, "name": "get_weather",
                "input": {"location": "Paris", "unit": "celsius"}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 2, "output_tokens": 12}
        })
    );
    let named = r#","tool_choice":{"type":"tool","name":"get_time"}"#;
    let v = call(
        m.addr(),
        &post(
            MESSAGES,
            &[],
            &body.replace(r#","messages""#, &format!(r#"{named},"messages""#)),
        ),
    )
    .json();
    assert_eq!(v["content"][0]["name"], "get_time");
    let none = r#","tool_choice":{"type":"none"}"#;
    let v = call(
        m.addr(),
        &post(
            MESSAGES,
            &[],
            &body.replace(r#","messages""#, &format!(r#"{none},"messages""#)),
        ),
    )
    .json();
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["stop_reason"], "end_turn");
}

#[test]
fn messages_tool_call_streamed() {
    for api in [MockApi::Any, MockApi::Anthropic] {
        let m = start(rolter_mock::Driver::Auto, |c| c.api = api);
        let body = format!(
            r#"{{"model":"c","max_tokens":50,"stream":true,"tools":{MSG_TOOLS},"messages":{}}}"#,
            ask_weather()
        );
        let r = call(m.addr(), &post(MESSAGES, &[VERSION], &body));
        let ev = events(&r.body);
        let msg_id = &ev[0].1["message"]["id"];
        let ping = api == MockApi::Anthropic;
        let tool_id = &ev[1 + ping as usize].1["content_block"]["id"];
        assert_hex_id(tool_id, "toolu_");
        let delta = |partial: &str| json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": partial}});
        let mut expected = vec![
            json!({"type": "message_start", "message": {"id": msg_id, "type": "message",
            "role": "assistant", "model": "c", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 2, "output_tokens": 0}}}),
        ];
        if ping {
            expected.push(json!({"type": "ping"}));
        }
        expected.extend([
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": tool_id,
                "name": "get_weather", "input": {}}}),
            delta(r#"{"location": "Paris", "#),
            delta(r#""unit": "celsius"}"#),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"output_tokens": 12}}),
            json!({"type": "message_stop"}),
        ]);
        let got: Vec<Value> = ev
            .into_iter()
            .map(|(e, d)| {
                assert_eq!(e.as_deref(), d["type"].as_str());
                d
            })
            .collect();
        assert_eq!(got, expected, "{api}");
    }
}

#[test]
fn chat_stop_strings_whole() {
    let m = start(rolter_mock::Driver::Auto, |_| {});
    let ask = |extra: &str| call(m.addr(), &post(CHAT, &[], &chat(ask_weather(), extra))).json();
    let v = ask(r#","stop":"engine""#);
    assert_eq!(
        v["choices"][0],
        json!({"index": 0, "message": {"role": "assistant", "content": " Hello from the mock", "tool_calls": []},
            "logprobs": null, "finish_reason": "stop", "stop_reason": "engine"})
    );
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["usage"]["total_tokens"], 6);
    // A string across tokens stops at the token it begins in; the earliest one wins.
    let v = ask(r#","stop":["zzz","mock engine","the"]"#);
    assert_eq!(v["choices"][0]["message"]["content"], " Hello from");
    assert_eq!(v["choices"][0]["stop_reason"], "the");
    // In the first token: nothing is sent.
    let v = ask(r#","stop":["Hello"]"#);
    assert_eq!(v["choices"][0]["message"]["content"], "");
    assert_eq!(
        (
            v["choices"][0]["finish_reason"].clone(),
            v["usage"]["completion_tokens"].clone()
        ),
        (json!("stop"), json!(0))
    );
    // Beyond what max_tokens lets through: a length finish, no stop reason.
    let v = ask(r#","stop":["mock"],"max_tokens":3"#);
    assert_eq!(v["choices"][0]["message"]["content"], " Hello from the");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["choices"][0]["stop_reason"].is_null());
    // Not in the text, empty or not a string: no effect.
    let v = ask(r#","stop":["nowhere","",7]"#);
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert!(v["choices"][0]["stop_reason"].is_null());
    // Completions take `stop` too.
    let v = call(
        m.addr(),
        &post("/v1/completions", &[], r#"{"prompt":"x","stop":"from"}"#),
    )
    .json();
    assert_eq!(v["choices"][0]["text"], " Hello");
    assert_eq!(
        (
            v["choices"][0]["finish_reason"].clone(),
            v["choices"][0]["stop_reason"].clone()
        ),
        (json!("stop"), json!("from"))
    );
    assert_eq!(v["usage"]["completion_tokens"], 1);
    // 4, 2, 0, 3, 16 and 1 tokens.
    assert_eq!(m.stats().generation_tokens, 26);
}

#[test]
fn chat_stop_string_streamed() {
    let m = start(rolter_mock::Driver::Auto, |_| {});
    let extra = r#","stop":["mock"],"stream":true,"stream_options":{"include_usage":true}"#;
    let r = call(m.addr(), &post(CHAT, &[], &chat(ask_weather(), extra)));
    let ev = events(&r.body);
    let first = &ev[0].1;
    let token = |t: &str| {
        chunk(
            first,
            json!({"index": 0, "delta": {"content": t}, "logprobs": null, "finish_reason": null}),
        )
    };
    let got: Vec<Value> = ev.iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(
        got,
        vec![
            chunk(
                first,
                json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})
            ),
            token(" Hello"),
            token(" from"),
            chunk(
                first,
                json!({"index": 0, "delta": {"content": " the"}, "logprobs": null, "finish_reason": "stop", "stop_reason": "mock"})
            ),
            json!({"id": first["id"], "object": "chat.completion.chunk", "created": first["created"], "model": "m",
                "choices": [], "usage": {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3}}),
            json!("[DONE]"),
        ]
    );
    assert_eq!(m.stats().generation_tokens, 3);
}

#[test]
fn messages_stop_sequences_whole_and_streamed() {
    let m = start(rolter_mock::Driver::Auto, |c| c.api = MockApi::Anthropic);
    let body = format!(
        r#"{{"model":"c","max_tokens":50,"stop_sequences":["stand-in","vLLM"],"messages":{}}}"#,
        ask_weather()
    );
    let v = call(m.addr(), &post(MESSAGES, &[VERSION], &body)).json();
    assert_eq!(
        v,
        json!({"id": v["id"], "type": "message", "role": "assistant", "model": "c",
            "content": [{"type": "text", "text": " Hello from the mock engine, a fast"}],
            "stop_reason": "stop_sequence", "stop_sequence": "stand-in",
            "usage": {"input_tokens": 2, "output_tokens": 8}})
    );
    let streamed = body.replace(r#""max_tokens":50"#, r#""max_tokens":50,"stream":true"#);
    let r = call(m.addr(), &post(MESSAGES, &[VERSION], &streamed));
    let ev = events(&r.body);
    let texts: Vec<&str> = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(
        texts,
        [" Hello", " from", " the", " mock", " engine", ",", " a", " fast"]
    );
    let n = ev.len();
    assert_eq!(
        ev[n - 2].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "stand-in"},
            "usage": {"output_tokens": 8}})
    );
    assert_eq!(
        ev[n - 3].1,
        json!({"type": "content_block_stop", "index": 0})
    );
    // A stop string not reached: the natural end, `stop_sequence` null.
    let v = call(
        m.addr(),
        &post(
            MESSAGES,
            &[VERSION],
            &body.replace("stand-in", "zzz").replace("vLLM", "yyy"),
        ),
    )
    .json();
    assert_eq!(
        (v["stop_reason"].clone(), v["stop_sequence"].clone()),
        (json!("end_turn"), Value::Null)
    );
    assert_eq!(m.stats().generation_tokens, 8 + 8 + 16);
}
