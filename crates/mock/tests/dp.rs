//! Data-parallel ranks: the rank pin by header or body field, round-robin without one,
//! refusal out of range, per-rank queues, prefix caches, counters and `engine="r"` series.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter_mock::{MockHandle, PrefixCacheConfig};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn ranks(
    d: rolter_mock::Driver,
    n: u32,
    f: impl FnOnce(&mut rolter_mock::MockConfig),
) -> MockHandle {
    start(d, |c| {
        c.dp_size = n;
        c.tokens = 3;
        c.record_requests = true;
        f(c);
    })
}

fn chat(content: &str, extra: Value) -> String {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

/// The value of one series: `name{engine="<rank>",model_name="mock-model"}`.
fn series(addr: SocketAddr, name: &str, rank: u32) -> f64 {
    let text = call(addr, &request("GET", "/metrics", &[], "")).text();
    let prefix = format!("{name}{{engine=\"{rank}\",model_name=\"mock-model\"}} ");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no series {prefix:?} in\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

#[test]
fn a_header_or_a_body_field_pins_the_rank() {
    for d in drivers() {
        let m = ranks(d, 3, |_| {});
        let a = m.addr();
        let r = call(
            a,
            &post(
                CHAT,
                &[("X-Data-Parallel-Rank", "2")],
                &chat("hi", json!({})),
            ),
        );
        assert_eq!(r.status, 200);
        let body = chat("hi", json!({"data_parallel_rank": 1}));
        assert_eq!(call(a, &post(CHAT, &[], &body)).status, 200);
        // The header wins over the body field.
        let r = call(a, &post(CHAT, &[("x-data-parallel-rank", "2")], &body));
        assert_eq!(r.status, 200);
        let got: Vec<(Option<u32>, u32)> = m
            .requests()
            .iter()
            .map(|r| (r.dp_rank, r.ran_on_rank))
            .collect();
        assert_eq!(got, vec![(Some(2), 2), (Some(1), 1), (Some(2), 2)]);
        let per_rank: Vec<u64> = m.rank_stats().iter().map(|s| s.requests).collect();
        assert_eq!(per_rank, vec![0, 1, 2]);
        assert_eq!(m.stats().requests, 3);
        assert_eq!(series(a, "vllm:generation_tokens_total", 0), 0.0);
        assert_eq!(series(a, "vllm:generation_tokens_total", 1), 3.0);
        assert_eq!(series(a, "vllm:generation_tokens_total", 2), 6.0);
        let text = call(a, &request("GET", "/metrics", &[], "")).text();
        let stop = "vllm:request_success_total{engine=\"2\",finished_reason=\"stop\",model_name=\"mock-model\"} 2.0";
        assert!(text.lines().any(|l| l == stop), "{text}");
        // Each family is written once, its series together.
        assert_eq!(
            text.matches("# TYPE vllm:num_requests_running gauge")
                .count(),
            1
        );
    }
}

#[test]
fn without_a_pin_the_ranks_take_turns_and_a_rank_out_of_range_is_refused() {
    for d in drivers() {
        let m = ranks(d, 2, |_| {});
        let a = m.addr();
        for _ in 0..4 {
            assert_eq!(
                call(a, &post(CHAT, &[], &chat("hi", json!({})))).status,
                200
            );
        }
        let ran: Vec<u32> = m.requests().iter().map(|r| r.ran_on_rank).collect();
        assert_eq!(ran, vec![0, 1, 0, 1]);
        assert!(m.requests().iter().all(|r| r.dp_rank.is_none()));
        let r = call(
            a,
            &post(
                CHAT,
                &[("x-data-parallel-rank", "2")],
                &chat("hi", json!({})),
            ),
        );
        assert_eq!(r.status, 400);
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            msg.contains("data_parallel_rank 2 is out of range"),
            "{msg}"
        );
        let body = chat("hi", json!({"data_parallel_rank": 7}));
        assert_eq!(call(a, &post(CHAT, &[], &body)).status, 400);
        let bad = call(
            a,
            &post(
                CHAT,
                &[("x-data-parallel-rank", "one")],
                &chat("hi", json!({})),
            ),
        );
        assert_eq!(bad.status, 400);
        assert_eq!(m.requests()[5].dp_rank, Some(7));
        let per_rank: Vec<u64> = m.rank_stats().iter().map(|s| s.requests).collect();
        assert_eq!(per_rank, vec![2, 2], "refused requests ran on no rank");
        assert_eq!(m.stats().generation_tokens, 12);
    }
}

#[test]
fn each_rank_has_its_own_prefix_cache() {
    for d in drivers() {
        let m = ranks(d, 2, |c| {
            c.prefix_cache = Some(PrefixCacheConfig::default())
        });
        let a = m.addr();
        let prompt = "a long shared system prompt. ".repeat(20);
        let on = |rank: &str| {
            let r = call(
                a,
                &post(
                    CHAT,
                    &[("x-data-parallel-rank", rank)],
                    &chat(&prompt, json!({})),
                ),
            );
            r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(on("0"), 0);
        let hit = on("0");
        assert!(hit >= 16 * 8, "rank 0 holds the prompt: {hit}");
        assert_eq!(on("1"), 0, "rank 1 has its own cache");
        assert_eq!(on("1"), hit);
        let s = m.rank_stats();
        assert_eq!((s[0].prefix_cache_hits, s[1].prefix_cache_hits), (hit, hit));
        assert_eq!(s[0].prefix_cache_queries, s[1].prefix_cache_queries);
        assert_eq!(series(a, "vllm:prefix_cache_hits_total", 1), hit as f64);
        let total = m.prefix_cache_stats().unwrap();
        assert_eq!(total.hits, 2 * hit);
    }
}

#[test]
fn max_running_is_split_over_the_ranks() {
    for d in drivers() {
        let m = ranks(d, 2, |c| c.max_running = 2);
        let a = m.addr();
        let slow = [("x-data-parallel-rank", "0"), ("x-mock-ttft-ms", "10000")];
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = Client::connect(a);
            c.send(&post(CHAT, &slow, &chat("hi", json!({}))));
            held.push(c);
        }
        wait_for("rank 0 full", Duration::from_secs(2), || {
            let s = m.rank_stats();
            s[0].running == 1 && s[0].waiting == 1
        });
        assert_eq!(series(a, "vllm:num_requests_waiting", 0), 1.0);
        assert_eq!(series(a, "vllm:num_requests_running", 0), 1.0);
        assert_eq!(series(a, "vllm:kv_cache_usage_perc", 0), 1.0);
        // Rank 1 still has its slot.
        let r = call(
            a,
            &post(
                CHAT,
                &[("x-data-parallel-rank", "1")],
                &chat("hi", json!({})),
            ),
        );
        assert_eq!(r.status, 200);
        assert_eq!(series(a, "vllm:num_requests_waiting", 1), 0.0);
        assert_eq!(m.rank_stats()[1].completed, 1);
        drop(held);
        wait_for("aborts", Duration::from_secs(2), || m.stats().aborted == 2);
        assert_eq!(m.rank_stats()[0].running + m.rank_stats()[0].waiting, 0);
    }
}

#[test]
fn one_rank_keeps_the_engine_label_zero() {
    let m = ranks(rolter_mock::Driver::Auto, 1, |_| {});
    let a = m.addr();
    assert_eq!(
        call(a, &post(CHAT, &[], &chat("hi", json!({})))).status,
        200
    );
    assert_eq!(series(a, "vllm:generation_tokens_total", 0), 3.0);
    let text = call(a, &request("GET", "/metrics", &[], "")).text();
    assert!(!text.contains("engine=\"1\""));
    assert_eq!(m.rank_stats().len(), 1);
    assert_eq!(m.rank_stats()[0].requests, 1);
    assert_eq!(m.requests()[0].ran_on_rank, 0);
    assert_eq!(m.requests()[0].dp_rank, None);
}
