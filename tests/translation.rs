//! Clients and engines that speak different APIs, through the binary's gateway under both
//! drivers, with the official SDKs unchanged (tests/sdk/anthropic_translated.py and
//! tests/sdk/openai_translated.py) and mock engines that serve one API only:
//! - the `anthropic` SDK against a route whose only target has no `/v1/messages`
//!   (`lacks = ["messages"]`): Messages translated to chat and back;
//! - the `openai` SDK's chat against an Anthropic-only target (`api = "anthropic"`), with
//!   the target's `x-api-key` and `anthropic-version`;
//! - the `openai` SDK's `responses.create` against a chat-only target
//!   (`lacks = ["responses"]`);
//! - a route failing over from an OpenAI pool to an Anthropic target, answering each
//!   client in its own API throughout.
//!
//! Each test checks what the engine received, beside what the SDK saw.

mod common;

use common::sdk::run_script;
use common::*;
use rolter_mock::{Fault, MockApi, MockHandle, RecordedRequest};
use serde_json::Value;

const SETUP: &str =
    "run the test command from the README (`./tests/run.sh`, which installs the SDKs)";

const TIMEOUTS: &str =
    "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"1s\"";

fn engine(name: &str, api: MockApi) -> MockHandle {
    mock(name, |c| {
        c.tokens = 6;
        c.api = api;
        if api == MockApi::Anthropic {
            c.api_key = Some("sk-ant-test".to_string());
        }
    })
}

fn script(script: &str, args: &[&str], ctx: &str) -> String {
    let (code, output) = run_script(script, args, SETUP);
    match code {
        Some(0) => {}
        Some(3) => panic!("an SDK package is missing; {SETUP}\n{output}"),
        _ => panic!("{script} failed ({ctx}, exit {code:?})\n{output}"),
    }
    assert!(output.contains("all checks passed"), "{output}");
    output
}

fn bodies(m: &MockHandle, path: &str) -> Vec<Value> {
    m.requests()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| serde_json::from_slice(&r.body).expect("the engine got JSON"))
        .collect()
}

fn has(bodies: &[Value], what: &str, pred: impl Fn(&Value) -> bool) {
    assert!(
        bodies.iter().any(pred),
        "no request to the engine had {what}: {bodies:#?}"
    );
}

fn inference_paths(m: &MockHandle) -> Vec<String> {
    let recs: Vec<RecordedRequest> = m.requests();
    recs.into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.path)
        .collect()
}

#[test]
fn the_anthropic_sdk_works_against_a_chat_only_engine() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = engine("chat-only", MockApi::OpenAi);
        let rest = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"c\"]\nretries = 0\n",
            target(
                "c",
                m.addr(),
                &format!("lacks = [\"messages\"]\n{TIMEOUTS}")
            )
        );
        let g = gateway(d, &rest);
        let out = script(
            "anthropic_translated.py",
            &[&format!("http://{}", g.local_addr())],
            ctx,
        );
        let paths = inference_paths(&m);
        assert!(
            paths
                .iter()
                .all(|p| p == "/v1/chat/completions" || p == "/tokenize"),
            "{ctx}: the engine saw only chat and tokenize: {paths:?}\n{out}"
        );
        assert_eq!(
            paths.iter().filter(|p| *p == "/tokenize").count(),
            1,
            "{ctx}"
        );
        let chat = bodies(&m, "/v1/chat/completions");
        has(&chat, "the system prompt first", |b| {
            b["messages"][0] == serde_json::json!({"role": "system", "content": "Be brief."})
        });
        has(&chat, "the stop sequence", |b| {
            b["stop"] == serde_json::json!([" mock"])
        });
        has(&chat, "metadata's user", |b| b["user"] == "u-1");
        has(&chat, "usage asked for a stream", |b| {
            b["stream"] == true && b["stream_options"]["include_usage"] == true
        });
        has(&chat, "the image as a data URL", |b| {
            b["messages"][0]["content"][0]["image_url"]["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("data:image/png;base64,iVBOR"))
        });
        has(&chat, "the tool as a function", |b| {
            b["tools"][0]["function"]["name"] == "get_weather"
                && b["tools"][0]["function"]["parameters"]["required"][0] == "location"
        });
        has(&chat, "the tool's result as a tool message", |b| {
            b["messages"].as_array().is_some_and(|ms| {
                ms.iter().any(|m| {
                    m["role"] == "tool"
                        && m["content"] == "18 degrees, sunny"
                        && m["tool_call_id"]
                            .as_str()
                            .is_some_and(|id| id.starts_with("call_"))
                })
            })
        });
        for b in &chat {
            assert!(
                b.get("stop_sequences").is_none() && b.get("system").is_none(),
                "{ctx}: {b}"
            );
        }
    }
}

#[test]
fn the_openai_sdks_chat_works_against_an_anthropic_only_engine() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = engine("anthropic", MockApi::Anthropic);
        let extra = format!(
            "api = \"anthropic\"\nheaders = {{ \"x-api-key\" = \"sk-ant-test\" }}\n{TIMEOUTS}"
        );
        let rest = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nretries = 0\n",
            target("a", m.addr(), &extra)
        );
        let g = gateway(d, &rest);
        let out = script(
            "openai_translated.py",
            &[&format!("http://{}", g.local_addr()), "chat"],
            ctx,
        );
        let recs = m.requests();
        let inference: Vec<&RecordedRequest> = recs.iter().filter(|r| r.method == "POST").collect();
        assert!(!inference.is_empty(), "{ctx}\n{out}");
        for r in &inference {
            assert_eq!(r.path, "/v1/messages", "{ctx}");
            assert_eq!(r.header("anthropic-version"), Some("2023-06-01"), "{ctx}");
            assert_eq!(r.header("x-api-key"), Some("sk-ant-test"), "{ctx}");
            assert_eq!(
                r.header("authorization"),
                None,
                "{ctx}: the client's key stays"
            );
        }
        let msgs = bodies(&m, "/v1/messages");
        has(&msgs, "the system prompt on top", |b| {
            b["system"] == "Be brief."
        });
        has(&msgs, "stop_sequences", |b| {
            b["stop_sequences"] == serde_json::json!([" mock"])
        });
        has(&msgs, "a base64 image block", |b| {
            b["messages"][0]["content"].as_array().is_some_and(|c| {
                c.iter().any(|p| {
                    p["type"] == "image"
                        && p["source"]["type"] == "base64"
                        && p["source"]["media_type"] == "image/png"
                })
            })
        });
        has(&msgs, "the tool's result block", |b| {
            b["messages"].as_array().is_some_and(|ms| {
                ms.iter().any(|m| {
                    m["role"] == "user"
                        && m["content"][0]["type"] == "tool_result"
                        && m["content"][0]["content"] == "18 degrees, sunny"
                })
            })
        });
        has(&msgs, "the tool's schema", |b| {
            b["tools"][0]["name"] == "get_weather"
                && b["tools"][0]["input_schema"]["type"] == "object"
        });
        for b in &msgs {
            assert!(
                b["max_tokens"].as_u64().is_some(),
                "{ctx}: Anthropic needs max_tokens: {b}"
            );
        }
    }
}

#[test]
fn the_openai_sdks_responses_work_against_a_chat_only_engine() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = engine("chat-only", MockApi::OpenAi);
        let rest = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"c\"]\nretries = 0\n",
            target(
                "c",
                m.addr(),
                &format!("lacks = [\"responses\"]\n{TIMEOUTS}")
            )
        );
        let g = gateway(d, &rest);
        let out = script(
            "openai_translated.py",
            &[&format!("http://{}", g.local_addr()), "responses"],
            ctx,
        );
        let paths = inference_paths(&m);
        assert!(
            paths.iter().all(|p| p == "/v1/chat/completions"),
            "{ctx}: {paths:?}\n{out}"
        );
        let chat = bodies(&m, "/v1/chat/completions");
        has(&chat, "the instructions as a system message", |b| {
            b["messages"][0] == serde_json::json!({"role": "system", "content": "Be brief."})
        });
        has(&chat, "the function call's output as a tool message", |b| {
            b["messages"].as_array().is_some_and(|ms| {
                ms.iter()
                    .any(|m| m["role"] == "tool" && m["content"] == "18 degrees, sunny")
            })
        });
        // previous_response_id never reached the engine.
        assert!(
            chat.iter().all(|b| b.get("previous_response_id").is_none()),
            "{ctx}"
        );
    }
}

/// A route whose OpenAI pool (tier 0) answers 503 fails over to an Anthropic target
/// (tier 1): each SDK gets its own API's answers throughout.
#[test]
fn failover_across_apis_answers_in_the_clients_api() {
    for d in drivers() {
        let ctx = driver_name(d);
        let pool = engine("pool", MockApi::OpenAi);
        pool.set_fault(Some(Fault::Status(503)));
        let managed = engine("managed", MockApi::Anthropic);
        let managed_extra = format!(
            "api = \"anthropic\"\ntier = 1\nheaders = {{ \"x-api-key\" = \"sk-ant-test\" }}\n{TIMEOUTS}"
        );
        let rest = format!(
            "{}{}[[routes]]\nname = \"r\"\ntargets = [\"pool\", \"managed\"]\nstrategy = \"failover\"\nretries = 1\nretry_on = [\"503\", \"connect_failure\"]\nretry_budget_min = 10000\n",
            target("pool", pool.addr(), &format!("lacks = [\"messages\"]\n{TIMEOUTS}")),
            target("managed", managed.addr(), &managed_extra)
        );
        let g = gateway(d, &rest);
        let base = format!("http://{}", g.local_addr());
        script("openai_translated.py", &[&base, "chat-failover"], ctx);
        script("anthropic_translated.py", &[&base], ctx);
        assert!(
            !inference_paths(&pool).is_empty(),
            "{ctx}: the pool was tried first"
        );
        let managed_paths = inference_paths(&managed);
        assert!(
            !managed_paths.is_empty(),
            "{ctx}: the managed target answered"
        );
        assert!(
            managed_paths.iter().all(|p| p.starts_with("/v1/messages")),
            "{ctx}: {managed_paths:?}"
        );
    }
}

/// A `POST /v1/messages` that closes the connection after its answer.
fn messages_request(stream: bool) -> String {
    let body = format!(
        r#"{{"model":"m","max_tokens":16,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    format!(
        "POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// What the engine sends, by the request's number: a 200 that is not chat JSON; an event
/// that never ends; a stream that stops before its end (no finish, no `[DONE]`).
fn hostile(n: usize) -> common::scripted::Reply {
    use common::scripted::{Reply, Then};
    let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let first = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    match n {
        0 => Reply::new(common::scripted::ok("<html>not chat</html>")),
        1 => {
            let endless = format!("{sse}{first}data: {}", "x".repeat(2 << 20));
            Reply::new(endless).then(Then::Close)
        }
        _ => Reply::new(format!("{sse}{first}")).then(Then::Close),
    }
}

/// An engine that answers wrongly never reaches an Anthropic client as a clean answer: a
/// 200 that is not chat is a 502 in Anthropic's shape; an event stream whose event never
/// ends, or that stops before its API's end, ends with Anthropic's error event and no
/// terminal chunk.
#[test]
fn a_hostile_engines_answers_are_never_translated_into_clean_ones() {
    use common::scripted::{parse_raw, read_all, Upstream};
    for d in drivers() {
        let ctx = driver_name(d);
        let up = Upstream::start(|r| hostile(r.total));
        let rest = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"h\"]\nretries = 0\n",
            target(
                "h",
                up.addr,
                &format!("lacks = [\"messages\"]\nhealth_path = \"\"\n{TIMEOUTS}")
            )
        );
        let g = gateway(d, &rest);
        let mut answers = Vec::new();
        for stream in [false, true, true] {
            let mut c = rolter_mock::client::Client::connect(g.local_addr());
            c.send(&messages_request(stream));
            answers.push(parse_raw(read_all(&mut c)));
        }
        let whole = &answers[0];
        assert_eq!(whole.status, Some(502), "{ctx}: {}", whole.show());
        let v: Value = serde_json::from_slice(&whole.body).expect("an error body");
        assert_eq!(v["type"], "error", "{ctx}: Anthropic's shape: {v}");
        assert_eq!(v["error"]["type"], "api_error", "{ctx}: {v}");
        for (i, r) in answers[1..].iter().enumerate() {
            assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
            assert!(
                !r.terminated,
                "{ctx}: stream {i} must not end cleanly: {}",
                r.show()
            );
            let text = String::from_utf8_lossy(&r.body);
            assert!(text.starts_with("event: message_start\n"), "{ctx}: {text}");
            assert!(
                text.contains(
                    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\""
                ),
                "{ctx}: stream {i} ends with Anthropic's error event: {text}"
            );
            assert!(!text.contains("message_stop"), "{ctx}: {text}");
            assert!(
                !text.contains("xxxx"),
                "{ctx}: nothing of the endless event reaches the client"
            );
        }
    }
}

/// Counting tokens on a route with a local tokenizer, whose engine has no
/// `/v1/messages`: the gateway counts the translated chat messages and tools itself, with
/// the route's chat template, and asks no engine.
#[cfg(feature = "local-tokenizer")]
#[test]
fn count_tokens_is_answered_by_the_routes_local_tokenizer() {
    use common::scripted::{parse_raw, read_all};
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenizer/chatml"
    );
    let tokenizer = rolter::tokenize::LocalTokenizer::from_files(
        std::path::Path::new(&format!("{dir}/tokenizer.json")),
        Some(std::path::Path::new(&format!(
            "{dir}/tokenizer_config.json"
        ))),
    )
    .expect("the fixture tokenizer");
    let body = r#"{"model":"m","system":"Be brief.","messages":[{"role":"user","content":"How many tokens is this?"}]}"#;
    let mut expected = Vec::new();
    let messages = r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"How many tokens is this?"}]"#;
    tokenizer
        .chat_ids(messages.as_bytes(), None, true, &mut expected)
        .unwrap();
    for d in drivers() {
        let ctx = driver_name(d);
        let m = engine("chat-only", MockApi::OpenAi);
        let rest = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"c\"]\n[routes.strategy]\nname = \"precise_cache_aware\"\ntokenizer = \"{dir}/tokenizer.json\"\n",
            target("c", m.addr(), &format!("lacks = [\"messages\"]\n{TIMEOUTS}"))
        );
        let g = gateway(d, &rest);
        let mut c = rolter_mock::client::Client::connect(g.local_addr());
        c.send(&format!(
            "POST /v1/messages/count_tokens HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
        let r = parse_raw(read_all(&mut c));
        assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"input_tokens": expected.len()}),
            "{ctx}"
        );
        assert!(
            inference_paths(&m).is_empty(),
            "{ctx}: no engine was asked: {:?}",
            inference_paths(&m)
        );
    }
}
