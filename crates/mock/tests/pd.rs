//! Disaggregated prefill/decode legs: vLLM's KV-transfer params and single-use pull,
//! SGLang's bootstrap rooms (either leg first, batches, timeouts) and aborts while a leg
//! waits for its peer.

mod common;

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use common::*;
use rolter_mock::{Driver, MockHandle, PdConfig, PdProtocol, PdRole};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

fn leg(d: Driver, role: PdRole, protocol: PdProtocol, timeout: Duration) -> MockHandle {
    start(d, |c| {
        c.name = format!("{role:?}").to_lowercase();
        c.tokens = 4;
        c.record_requests = true;
        c.pd = Some(PdConfig {
            role,
            protocol,
            bootstrap_port: 0,
            handshake_timeout: timeout,
        });
    })
}

fn chat(extra: Value) -> String {
    let mut body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "x".repeat(200)}],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

fn prefill_params() -> Value {
    json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
        "remote_port": null}, "stream": false, "max_tokens": 1})
}

fn error_message(r: &Response) -> String {
    r.json()["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn vllm_prefill_names_its_blocks_and_a_decode_pulls_them_once() {
    for d in drivers() {
        let p = leg(d, PdRole::Prefill, PdProtocol::Vllm, Duration::from_secs(5));
        let dec = leg(d, PdRole::Decode, PdProtocol::Vllm, Duration::from_secs(5));
        let r = call(p.addr(), &post(CHAT, &[], &chat(prefill_params())));
        assert_eq!(r.status, 200);
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"]["completion_tokens"], 1);
        let kv = v["kv_transfer_params"].clone();
        assert_eq!(kv["do_remote_prefill"], true);
        assert_eq!(kv["do_remote_decode"], false);
        assert_eq!(kv["remote_engine_id"], p.pd_engine_id().unwrap());
        assert!(kv["remote_engine_id"]
            .as_str()
            .unwrap()
            .starts_with("prefill-"));
        assert_eq!(kv["remote_host"], "127.0.0.1");
        assert_eq!(kv["remote_port"], p.addr().port());
        assert_eq!(kv["tp_size"], 1);
        // A 200-byte message: a prompt of 50 tokens, four blocks of 16.
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        let blocks = kv["remote_block_ids"].as_array().unwrap();
        assert_eq!(blocks.len() as u64, prompt.div_ceil(16));
        assert!(blocks.iter().all(Value::is_u64));

        let body = chat(json!({"kv_transfer_params": kv, "stream": true}));
        let r = call(dec.addr(), &post(CHAT, &[("x-request-id", "r1")], &body));
        assert_eq!(r.status, 200, "{}", r.text());
        let events = sse_events(&r.body);
        assert_eq!(events.len(), 1 + 4 + 1, "role, tokens, [DONE]");
        assert_eq!(events.last().unwrap().1, "[DONE]");
        // The same params again: the blocks were freed by the first pull.
        let again = call(dec.addr(), &post(CHAT, &[], &body));
        assert_eq!(again.status, 400);
        assert_eq!(error_message(&again), "unknown blocks");
        let (ps, ds) = (p.pd_stats(), dec.pd_stats());
        assert_eq!((ps.prefills, ps.pulls_served, ps.pulls_refused), (1, 1, 1));
        assert_eq!((ds.decodes, ds.refused), (1, 1));
        assert_eq!(
            dec.stats().generation_tokens,
            4,
            "the refused decode generated nothing"
        );
        let pulls: Vec<_> = p
            .requests()
            .into_iter()
            .filter(|r| r.path == "/mock/pd/pull")
            .collect();
        assert_eq!(pulls.len(), 2);
        let pull: Value = serde_json::from_slice(&pulls[0].body).unwrap();
        assert_eq!(pull["request_id"], "r1");
        assert_eq!(pull["block_ids"], Value::Array(blocks.clone()));
    }
}

#[test]
fn a_decode_counts_the_prompt_as_cached_and_answers_whole() {
    let p = leg(
        Driver::Auto,
        PdRole::Prefill,
        PdProtocol::Vllm,
        Duration::from_secs(5),
    );
    let dec = leg(
        Driver::Auto,
        PdRole::Decode,
        PdProtocol::Vllm,
        Duration::from_secs(5),
    );
    let kv = call(p.addr(), &post(CHAT, &[], &chat(prefill_params()))).json()["kv_transfer_params"]
        .clone();
    let r = call(
        dec.addr(),
        &post(CHAT, &[], &chat(json!({"kv_transfer_params": kv}))),
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    assert!(v.get("kv_transfer_params").is_none());
    let usage = &v["usage"];
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        usage["prompt_tokens"]
    );
    assert_eq!(usage["completion_tokens"], 4);
}

#[test]
fn vllm_legs_without_their_params_are_refused() {
    for d in drivers() {
        let p = leg(d, PdRole::Prefill, PdProtocol::Vllm, Duration::from_secs(5));
        let dec = leg(d, PdRole::Decode, PdProtocol::Vllm, Duration::from_secs(5));
        let r = call(p.addr(), &post(CHAT, &[], &chat(json!({}))));
        assert_eq!(r.status, 400);
        assert!(
            error_message(&r).contains("kv_transfer_params"),
            "{}",
            r.text()
        );
        assert_eq!(r.json()["error"]["type"], "BadRequestError");
        let r = call(dec.addr(), &post(CHAT, &[], &chat(json!({}))));
        assert_eq!(r.status, 400);
        assert_eq!(error_message(&r), "kv_transfer_params name no prefill");
        // Made-up params naming the real prefill: it holds no such blocks.
        let made_up = json!({"kv_transfer_params": {"do_remote_prefill": true,
            "do_remote_decode": false, "remote_engine_id": "prefill-0000",
            "remote_block_ids": [1, 2, 3], "remote_host": "127.0.0.1",
            "remote_port": p.addr().port(), "tp_size": 1}});
        let r = call(dec.addr(), &post(CHAT, &[], &chat(made_up)));
        assert_eq!(r.status, 400);
        assert_eq!(error_message(&r), "unknown blocks");
        // Params naming a port no one listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let nowhere = json!({"kv_transfer_params": {"do_remote_prefill": true,
            "remote_engine_id": "e", "remote_block_ids": [1], "remote_host": "127.0.0.1",
            "remote_port": port}});
        let r = call(dec.addr(), &post(COMPLETIONS, &[], &chat(nowhere)));
        assert_eq!(r.status, 400);
        assert_eq!(dec.pd_stats().refused, 3);
        assert_eq!(dec.pd_stats().decodes, 0);
        assert_eq!(p.pd_stats().refused, 1);
        assert_eq!(p.pd_stats().pulls_refused, 1);
        assert_eq!(dec.stats().generation_tokens, 0);
    }
}

fn bootstrap(p: &MockHandle, room: Value) -> Value {
    let b: SocketAddr = p.bootstrap_addr().unwrap();
    json!({"bootstrap_host": b.ip().to_string(), "bootstrap_port": b.port(),
        "bootstrap_room": room})
}

#[test]
fn sglang_prefill_waits_for_its_decode_and_both_answer() {
    for d in drivers() {
        let p = leg(
            d,
            PdRole::Prefill,
            PdProtocol::Sglang,
            Duration::from_secs(5),
        );
        let dec = leg(
            d,
            PdRole::Decode,
            PdProtocol::Sglang,
            Duration::from_secs(5),
        );
        assert!(dec.bootstrap_addr().is_none());
        let body = chat(bootstrap(&p, json!(12345)));
        let (pa, pbody) = (p.addr(), body.clone());
        // The prefill first: it waits for the decode of room 12345.
        let prefill = thread::spawn(move || call(pa, &post(CHAT, &[], &pbody)));
        wait_for("prefill registered", Duration::from_secs(2), || {
            p.stats().requests == 1
        });
        let r = call(dec.addr(), &post(CHAT, &[], &body));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.json()["choices"][0]["message"]["content"],
            " Hello from the mock"
        );
        let pr = prefill.join().unwrap();
        assert_eq!(pr.status, 200, "{}", pr.text());
        assert_eq!(pr.json()["object"], "chat.completion");
        assert_eq!(p.pd_stats().handshakes, 1);
        assert_eq!(p.pd_stats().prefills, 1);
        assert_eq!(dec.pd_stats().decodes, 1);

        // The decode first, with a batch of two prompts: its handshakes wait for the
        // prefill's rooms.
        let mut fields = bootstrap(&p, json!([7, 8]));
        fields["bootstrap_host"] = json!([fields["bootstrap_host"], fields["bootstrap_host"]]);
        fields["bootstrap_port"] = json!([fields["bootstrap_port"], fields["bootstrap_port"]]);
        fields["prompt"] = json!(["first prompt", "second prompt"]);
        let body = fields.to_string();
        let (da, dbody) = (dec.addr(), body.clone());
        let decode = thread::spawn(move || call(da, &post(COMPLETIONS, &[], &dbody)));
        wait_for("decode waiting", Duration::from_secs(2), || {
            dec.stats().requests == 2
        });
        let pr = call(p.addr(), &post(COMPLETIONS, &[], &body));
        assert_eq!(pr.status, 200, "{}", pr.text());
        let r = decode.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["object"], "text_completion");
        assert_eq!(p.pd_stats().handshakes, 3);
        assert_eq!(dec.pd_stats().decodes, 2);
    }
}

#[test]
fn sglang_prefill_without_a_decode_times_out() {
    for d in drivers() {
        let p = leg(
            d,
            PdRole::Prefill,
            PdProtocol::Sglang,
            Duration::from_millis(200),
        );
        let r = call(p.addr(), &post(CHAT, &[], &chat(bootstrap(&p, json!(99)))));
        assert_eq!(r.status, 500);
        assert_eq!(
            error_message(&r),
            "no decode connected for bootstrap_room 99"
        );
        assert_eq!(p.pd_stats().handshake_timeouts, 1);
        assert_eq!(p.pd_stats().prefills, 0);
        assert_eq!(p.stats().generation_tokens, 0);
        // A decode coming after the room was given up finds nothing: the bootstrap
        // server answers 404 once its own wait is over, and the decode is refused.
        let dec = leg(
            d,
            PdRole::Decode,
            PdProtocol::Sglang,
            Duration::from_millis(200),
        );
        let r = call(
            dec.addr(),
            &post(CHAT, &[], &chat(bootstrap(&p, json!(99)))),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(error_message(&r).contains("bootstrap_room 99"));
        assert_eq!(dec.pd_stats().refused, 1);
        // Legs without the fields are refused at once.
        for m in [&p, &dec] {
            let r = call(m.addr(), &post(CHAT, &[], &chat(json!({}))));
            assert_eq!(r.status, 400);
            assert!(error_message(&r).contains("bootstrap_room"));
        }
        let short = json!({"prompt": ["a", "b"], "bootstrap_host": ["127.0.0.1"],
            "bootstrap_port": 1, "bootstrap_room": [1, 2]});
        let r = call(p.addr(), &post(COMPLETIONS, &[], &short.to_string()));
        assert_eq!(r.status, 400);
        assert!(error_message(&r).contains("bootstrap_host must be a list of 2"));
    }
}

#[test]
fn the_bootstrap_server_answers_by_room() {
    let p = leg(
        Driver::Auto,
        PdRole::Prefill,
        PdProtocol::Sglang,
        Duration::from_millis(100),
    );
    let b = p.bootstrap_addr().unwrap();
    assert_eq!(call(b, &request("GET", "/health", &[], "")).status, 200);
    assert_eq!(
        call(b, &request("GET", "/mock/bootstrap?room=5", &[], "")).status,
        404
    );
    assert_eq!(call(b, &post("/mock/bootstrap", &[], "{}")).status, 400);
    assert_eq!(call(b, &post("/nope", &[], "")).status, 404);
    // A prefill for room 5 waiting, then a GET handshake for it.
    let body = chat(bootstrap(&p, json!(5)));
    let pa = p.addr();
    let prefill = thread::spawn(move || call(pa, &post(CHAT, &[], &body)));
    wait_for("prefill registered", Duration::from_secs(2), || {
        p.stats().requests == 1
    });
    let r = call(b, &request("GET", "/mock/bootstrap?room=5", &[], ""));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["room"], 5);
    assert_eq!(prefill.join().unwrap().status, 200);
}

#[test]
fn a_client_gone_while_a_leg_waits_is_an_abort() {
    for d in drivers() {
        let p = leg(
            d,
            PdRole::Prefill,
            PdProtocol::Sglang,
            Duration::from_secs(5),
        );
        let mut c = Client::connect(p.addr());
        c.send(&post(
            CHAT,
            &[("x-request-id", "waiting-prefill")],
            &chat(bootstrap(&p, json!(1))),
        ));
        wait_for("prefill registered", Duration::from_secs(2), || {
            p.stats().requests == 1
        });
        drop(c);
        wait_for("prefill abort", Duration::from_secs(2), || {
            p.stats().aborted == 1
        });
        assert_eq!(p.aborted_ids(), vec!["waiting-prefill".to_string()]);

        // A decode whose handshake waits on a bootstrap server with no prefill request.
        let dec = leg(
            d,
            PdRole::Decode,
            PdProtocol::Sglang,
            Duration::from_secs(5),
        );
        let mut c = Client::connect(dec.addr());
        c.send(&post(
            CHAT,
            &[("x-request-id", "waiting-decode")],
            &chat(bootstrap(&p, json!(2))),
        ));
        wait_for("decode registered", Duration::from_secs(2), || {
            dec.stats().requests == 1
        });
        drop(c);
        wait_for("decode abort", Duration::from_secs(2), || {
            dec.stats().aborted == 1
        });
        assert_eq!(dec.aborted_ids(), vec!["waiting-decode".to_string()]);
        assert_eq!(dec.pd_stats().decodes, 0);

        // A vLLM prefill gone during its time to first token.
        let vp = start(d, |c| {
            c.ttft = Duration::from_secs(10);
            c.pd = Some(PdConfig::default());
        });
        let mut c = Client::connect(vp.addr());
        c.send(&post(
            CHAT,
            &[("x-request-id", "ttft")],
            &chat(prefill_params()),
        ));
        wait_for("running", Duration::from_secs(2), || {
            vp.stats().running == 1
        });
        drop(c);
        wait_for("ttft abort", Duration::from_secs(2), || {
            vp.stats().aborted == 1
        });
        assert_eq!(vp.aborted_ids(), vec!["ttft".to_string()]);
    }
}
