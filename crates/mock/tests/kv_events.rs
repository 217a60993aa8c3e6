//! The mock's KV-cache events over ZMQ and its `/tokenize`: a real SUB socket and a
//! msgpack decoder (rmpv) check what a vLLM subscriber would see.

mod common;

use std::time::Duration;

use common::*;
use rmpv::Value;
use rolter_mock::{Driver, KvEventsConfig, MockHandle, PrefixCacheConfig};

const WAIT_MS: i64 = 5_000;

fn start(capacity_blocks: usize) -> MockHandle {
    common::start(Driver::Epoll, |c| {
        c.prefix_cache = Some(PrefixCacheConfig {
            block_tokens: 4,
            capacity_blocks,
            prefill_us_per_token: 0,
            chars_per_token: 2,
        });
        c.kv_events = Some(KvEventsConfig {
            endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:*".into()),
            topic: "kv@mock".into(),
            buffer_steps: 100,
        });
    })
}

/// A subscriber that has seen a first message (so no later one is lost to the slow
/// joiner); returns it with the seq it expects next.
fn subscribe(h: &MockHandle, ctx: &zmq::Context) -> (zmq::Socket, u64) {
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"kv@").unwrap();
    sub.connect(&h.kv_events_endpoint().unwrap()).unwrap();
    loop {
        h.publish_clear();
        if sub.poll(zmq::POLLIN, 20).unwrap() > 0 {
            break;
        }
        assert!(h.kv_next_seq().unwrap() < 500, "subscription never arrived");
    }
    while sub.poll(zmq::POLLIN, 50).unwrap() > 0 {
        sub.recv_multipart(0).unwrap();
    }
    let next = h.kv_next_seq().unwrap();
    (sub, next)
}

/// Receives one message: (seq, decoded batch).
fn recv(sub: &zmq::Socket) -> (u64, Value) {
    assert!(sub.poll(zmq::POLLIN, WAIT_MS).unwrap() > 0, "no message");
    let f = sub.recv_multipart(0).unwrap();
    assert_eq!(f.len(), 3);
    assert_eq!(f[0], b"kv@mock");
    let seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
    (seq, rmpv::decode::read_value(&mut &f[2][..]).unwrap())
}

/// The events of a batch, checking its envelope.
fn events(batch: &Value) -> Vec<Value> {
    let a = batch.as_array().unwrap();
    assert_eq!(a.len(), 3, "[ts, events, data_parallel_rank]");
    assert!(a[0].is_f64());
    assert_eq!(a[2].as_u64(), Some(0));
    a[1].as_array().unwrap().clone()
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn chat(h: &MockHandle, content: &str) -> String {
    let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{content}"}}]}}"#);
    let mut c = Client::connect(h.addr());
    c.send(&post("/v1/chat/completions", &[], &body));
    assert_eq!(c.response().unwrap().status, 200);
    body
}

fn tokenize(h: &MockHandle, body: &str) -> Response {
    let mut c = Client::connect(h.addr());
    c.send(&post("/tokenize", &[], body));
    c.response().unwrap()
}

#[test]
fn tokenize_answers_in_vllms_shape() {
    let h = start(64);
    let r = tokenize(&h, r#"{"model":"m","prompt":"abcdefg"}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let j = r.json();
    // The canonical prompt is `"abcdefg"` (9 bytes with the quotes): 5 two-byte pieces.
    assert_eq!(j["count"], 5);
    assert_eq!(j["max_model_len"], 8192);
    assert_eq!(j["tokens"].as_array().unwrap().len(), 5);
    assert!(j["token_strs"].is_null());
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(keys.len(), 4);
    let body = String::from_utf8(r.body.clone()).unwrap();
    assert!(
        body.starts_with(r#"{"count":5,"max_model_len":8192,"tokens":["#),
        "{body}"
    );
    assert!(body.ends_with(r#"],"token_strs":null}"#), "{body}");

    let r = tokenize(
        &h,
        r#"{"model":"m","prompt":"abcdefg","return_token_strs":true}"#,
    );
    assert_eq!(
        r.json()["token_strs"],
        serde_json::json!(["\"a", "bc", "de", "fg", "\""])
    );
    // Same pieces, same ids.
    assert_eq!(r.json()["tokens"][1], j["tokens"][1]);
    for t in j["tokens"].as_array().unwrap() {
        assert!(t.as_u64().unwrap() < 128_000);
    }

    // Chat form: messages, with vLLM's generation-prompt flags.
    let r = tokenize(
        &h,
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["count"], 16); // [{"content":"hi","role":"user"}] is 32 bytes
    let r = tokenize(
        &h,
        r#"{"messages":[],"add_generation_prompt":true,"continue_final_message":true}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(tokenize(&h, r#"{"model":"m"}"#).status, 400);
    assert_eq!(tokenize(&h, r#"{"prompt":[1,2]}"#).status, 400);
    assert_eq!(tokenize(&h, "nope").status, 400);
}

#[test]
fn block_stored_carries_the_tokenized_prompt_and_chained_keys() {
    let h = start(64);
    let ctx = zmq::Context::new();
    let (sub, next) = subscribe(&h, &ctx);
    let content = "the quick brown fox jumps over the lazy dog";
    let body = chat(&h, content);
    let (seq, batch) = recv(&sub);
    assert_eq!(seq, next);
    let ev = events(&batch);
    assert_eq!(ev.len(), 1);
    let e = ev[0].as_array().unwrap();
    assert_eq!(e.len(), 8);
    assert_eq!(e[0].as_str(), Some("BlockStored"));
    assert!(e[2].is_nil(), "a prompt's first block has no parent");
    assert_eq!(e[4].as_u64(), Some(4));
    assert!(e[5].is_nil() && e[7].is_nil());
    assert_eq!(e[6].as_str(), Some("GPU"));
    let hashes = u64s(&e[1]);
    let tokens = u64s(&e[3]);
    // The tokens of the full blocks are the head of /tokenize's answer.
    let all: Vec<u64> = tokenize(&h, &body).json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let full_blocks = all.len() / 4;
    assert!(full_blocks >= 5);
    assert_eq!(hashes.len(), full_blocks);
    assert_eq!(tokens, all[..full_blocks * 4]);

    // A longer prompt sharing the head stores only its new blocks, parented on the last
    // shared one.
    let longer = format!("{content} and then runs far away into the forest");
    chat(&h, &longer);
    let (seq2, batch) = recv(&sub);
    assert_eq!(seq2, seq + 1);
    let ev = events(&batch);
    let e = ev[0].as_array().unwrap();
    let new_hashes = u64s(&e[1]);
    let parent = e[2].as_u64().unwrap();
    assert!(hashes.contains(&parent));
    assert!(new_hashes.iter().all(|k| !hashes.contains(k)));
    assert_eq!(u64s(&e[3]).len(), new_hashes.len() * 4);

    // A repeat changes nothing, so publishes nothing: the next message is the clear.
    chat(&h, content);
    h.publish_clear();
    let (seq3, batch) = recv(&sub);
    assert_eq!(seq3, seq2 + 1);
    let ev = events(&batch);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        ev[0].as_array().unwrap()[0].as_str(),
        Some("AllBlocksCleared")
    );
    // POST /reset_prefix_cache does the same.
    let mut c = Client::connect(h.addr());
    c.send(&post("/reset_prefix_cache", &[], ""));
    assert_eq!(c.response().unwrap().status, 200);
    let (seq4, batch) = recv(&sub);
    assert_eq!(seq4, seq3 + 1);
    assert_eq!(events(&batch)[0][0].as_str(), Some("AllBlocksCleared"));
}

#[test]
fn evictions_gaps_pauses_and_replay() {
    let h = start(6);
    let ctx = zmq::Context::new();
    let (sub, next) = subscribe(&h, &ctx);
    // `[{"content":"<39 a>","role":"user"}]`: 69 bytes, 8 full blocks of 8 bytes > 6.
    chat(&h, &"a".repeat(39));
    let (seq, batch) = recv(&sub);
    assert_eq!(seq, next);
    let ev = events(&batch);
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0][0].as_str(), Some("BlockStored"));
    let stored = u64s(&ev[0][1]);
    assert_eq!(stored.len(), 8);
    let removed = ev[1].as_array().unwrap();
    assert_eq!(removed.len(), 3);
    assert_eq!(removed[0].as_str(), Some("BlockRemoved"));
    assert_eq!(removed[2].as_str(), Some("GPU"));
    // The tail goes first (last block first): the prompt's head stays cached.
    assert_eq!(u64s(&removed[1]), [stored[7], stored[6]]);

    // A dropped message leaves a gap in the seqs but stays replayable.
    h.drop_next_kv_messages(1);
    h.publish_clear();
    h.publish_clear();
    let (seq2, _) = recv(&sub);
    assert_eq!(seq2, seq + 2);

    // Paused: nothing is sent, no seq is used; resumed: sent in order.
    h.pause_kv_events(true);
    chat(
        &h,
        "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    );
    h.publish_clear();
    assert_eq!(sub.poll(zmq::POLLIN, 100).unwrap(), 0);
    assert_eq!(h.kv_next_seq(), Some(seq2 + 1));
    h.pause_kv_events(false);
    let (a, batch_a) = recv(&sub);
    let (b, batch_b) = recv(&sub);
    assert_eq!((a, b), (seq2 + 1, seq2 + 2));
    assert_eq!(events(&batch_a)[0][0].as_str(), Some("BlockStored"));
    assert_eq!(events(&batch_b)[0][0].as_str(), Some("AllBlocksCleared"));

    // Replay from the dropped seq returns it and everything after.
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.connect(&h.kv_replay_endpoint().unwrap()).unwrap();
    dealer
        .send_multipart([&b""[..], &(seq + 1).to_be_bytes()[..]], 0)
        .unwrap();
    let mut seqs = Vec::new();
    loop {
        assert!(dealer.poll(zmq::POLLIN, WAIT_MS).unwrap() > 0);
        let f = dealer.recv_multipart(0).unwrap();
        assert_eq!(f.len(), 3, "[b\"\", seq, payload]");
        let s = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
        if s == u64::MAX {
            assert!(f[2].is_empty());
            break;
        }
        rmpv::decode::read_value(&mut &f[2][..]).unwrap();
        seqs.push(s);
    }
    assert_eq!(seqs, (seq + 1..=seq2 + 2).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(10));
    h.shutdown();
}
