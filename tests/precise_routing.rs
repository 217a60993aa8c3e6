//! `precise_cache_aware` through the real gateway, in front of mock engines that publish
//! their prefix cache as vLLM KV events (ZMQ, msgpack) and serve `/tokenize`: a request
//! whose prefix is resident on one engine goes there; once the engine evicts it
//! (`BlockRemoved`) it no longer does; with the publisher stopped, routing falls back to
//! load and the fallback counter says so. A publisher away for longer than `stale_after`
//! is repaired from its replay endpoint when it returns, so the blocks its engine stored
//! meanwhile attract requests; a template every prompt shares leaves no engine idle.

mod common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter_mock::{KvEventsConfig, MockHandle, PrefixCacheConfig};

/// A mock engine with a prefix cache of `blocks` blocks publishing KV events on a free port.
fn kv_mock(name: &str, blocks: usize) -> MockHandle {
    kv_mock_with(name, blocks, false)
}

/// The same, with a replay endpoint when `replay`.
fn kv_mock_with(name: &str, blocks: usize, replay: bool) -> MockHandle {
    mock(name, |c| {
        c.prefix_cache = Some(PrefixCacheConfig {
            capacity_blocks: blocks,
            ..PrefixCacheConfig::default()
        });
        c.kv_events = Some(KvEventsConfig {
            endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: replay.then(|| "tcp://127.0.0.1:0".into()),
            topic: String::new(),
            buffer_steps: 100,
        });
    })
}

fn gateway_precise(d: rolter::config::DriverChoice, mocks: &[&MockHandle]) -> rolter::Gateway {
    gateway_precise_with(d, mocks, "")
}

/// A gateway over `mocks` (with their replay endpoints, if any) with `strategy_extra` in
/// the route's `[routes.strategy]`.
fn gateway_precise_with(
    d: rolter::config::DriverChoice,
    mocks: &[&MockHandle],
    strategy_extra: &str,
) -> rolter::Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        rest.push_str(&format!(
            "[[targets]]\nname = \"t{i}\"\nurl = \"http://{}\"\n\
             [targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"3s\"\nidle = \"3s\"\n\
             [targets.kv_events]\nendpoint = \"{}\"\n",
            m.addr(),
            m.kv_events_endpoint().unwrap()
        ));
        if let Some(replay) = m.kv_replay_endpoint() {
            rest.push_str(&format!("replay_endpoint = \"{replay}\"\n"));
        }
        names.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nretries = 0\n[routes.strategy]\nname = \"precise_cache_aware\"\n{strategy_extra}\n",
        names.join(", ")
    ));
    rest.push_str("[admin]\nlisten = \"127.0.0.1:0\"\n\n[kv_events]\nstale_after = \"300ms\"\n");
    gateway_with(d, 2, &rest)
}

/// A chat body whose system prompt is `system` repeated to about `bytes` bytes.
fn chat(system: &str, bytes: usize, question: &str) -> String {
    let mut s = String::new();
    while s.len() < bytes {
        s.push_str(system);
        s.push(' ');
    }
    format!(
        r#"{{"model":"m","max_tokens":2,"messages":[{{"role":"system","content":"{s}"}},{{"role":"user","content":"{question}"}}]}}"#
    )
}

/// Sends `body` through the gateway with the explain header; (target, score).
fn routed(addr: SocketAddr, body: &str) -> (String, f64) {
    let e = explained(addr, body);
    (e.target, e.score.unwrap_or(-1.0))
}

/// Sends `body` straight to the engine (bypassing the gateway) so its cache holds it.
fn warm(m: &MockHandle, body: &str) {
    let r = call(m.addr(), &post("/v1/chat/completions", &[], body));
    assert_eq!(r.status, 200, "{}", r.text());
}

fn fallbacks(g: &rolter::Gateway) -> f64 {
    admin_series(g, "rolter_strategy_fallbacks_total{route=\"r\",strategy=\"precise_cache_aware\",reason=\"kv_events_stale\"}").unwrap_or(0.0)
}

#[test]
fn resident_prefixes_attract_evicted_ones_do_not_and_a_silent_publisher_falls_back() {
    for d in drivers() {
        let a = kv_mock("a", 64);
        let b = kv_mock("b", 4096);
        let g = gateway_precise(d, &[&a, &b]);
        // Let the subscriptions connect (a SUB drops what was published before).
        std::thread::sleep(Duration::from_millis(300));
        let doc = chat("the quick brown fox jumps over the lazy dog", 2000, "q0");
        warm(&a, &doc);
        // Resident on a only: every request sharing the prefix goes to t0.
        wait_for(
            "the KV events of the warm-up",
            Duration::from_secs(3),
            || {
                let q = chat("the quick brown fox jumps over the lazy dog", 2000, "q1");
                routed(g.local_addr(), &q).0 == "t0"
            },
        );
        for i in 0..8 {
            let (t, score) = routed(
                g.local_addr(),
                &chat(
                    "the quick brown fox jumps over the lazy dog",
                    2000,
                    &format!("again {i}"),
                ),
            );
            assert_eq!(t, "t0", "under {}", driver_name(d));
            assert!(score > 0.5, "score {score}");
        }
        // a's small cache evicts the prefix when another long prompt comes in: BlockRemoved.
        warm(
            &a,
            &chat("a completely different text to fill the cache", 6000, "x"),
        );
        std::thread::sleep(Duration::from_millis(300));
        let (t, score) = routed(
            g.local_addr(),
            &chat(
                "the quick brown fox jumps over the lazy dog",
                2000,
                "after eviction",
            ),
        );
        // Not drawn to t0 any more: either t1 holds the prefix (an early request may have
        // gone there before the events arrived) or nothing does and load decided.
        assert!(
            t == "t1" || score == 0.0,
            "{t} with score {score} under {}",
            driver_name(d)
        );
        assert_eq!(fallbacks(&g), 0.0);
        // The plane's own series show both streams live, and what they carried.
        for t in ["t0", "t1"] {
            let live = format!("rolter_kv_events_live{{target=\"{t}\"}}");
            assert_eq!(admin_series(&g, &live), Some(1.0), "{live}");
        }
        assert!(
            admin_series(&g, "rolter_kv_events_messages_total{target=\"t0\"}").unwrap_or(0.0)
                >= 2.0
        );
        assert!(admin_series(&g, "rolter_kv_index_blocks{target=\"t0\"}").unwrap_or(0.0) > 0.0);
        assert_eq!(
            admin_series(&g, "rolter_kv_events_gaps_total{target=\"t0\"}"),
            Some(0.0)
        );
        // Both publishers stop: after stale_after, picks fall back to load and say so.
        a.stop_kv_events();
        b.stop_kv_events();
        wait_for("the fallback", Duration::from_secs(5), || {
            routed(g.local_addr(), &doc);
            fallbacks(&g) > 0.0
        });
        wait_for(
            "the streams to be shown stale",
            Duration::from_secs(3),
            || {
                admin_series(&g, "rolter_kv_events_live{target=\"t0\"}") == Some(0.0)
                    && admin_series(&g, "rolter_kv_events_live{target=\"t1\"}") == Some(0.0)
            },
        );
        g.shutdown(Duration::from_secs(1));
    }
}

fn series(g: &rolter::Gateway, name: &str, t: &str) -> f64 {
    admin_series(g, &format!("{name}{{target=\"{t}\"}}")).unwrap_or(-1.0)
}

#[test]
fn blocks_stored_while_the_publisher_was_away_route_after_the_replay() {
    for d in drivers() {
        let a = kv_mock_with("a", 4096, true);
        let b = kv_mock_with("b", 4096, true);
        let g = gateway_precise(d, &[&a, &b]);
        let ctx = driver_name(d);
        let text = "the quick brown fox jumps over the lazy dog";
        let other = "a completely different text stored during the outage";
        // Both streams connected, then a's engine stores a prefix (not through the
        // gateway, so b never holds it).
        wait_for("the subscriptions", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_connected", "t0") == 1.0
                && series(&g, "rolter_kv_events_connected", "t1") == 1.0
        });
        std::thread::sleep(Duration::from_millis(200));
        warm(&a, &chat(text, 2000, "before"));
        wait_for("the stored blocks", Duration::from_secs(5), || {
            series(&g, "rolter_kv_index_blocks", "t0") > 0.0
        });
        let before = series(&g, "rolter_kv_index_blocks", "t0");
        // a's publisher goes away for longer than stale_after (300 ms).
        a.set_kv_events_down(true).unwrap();
        wait_for("t0 to be stale", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_live", "t0") == 0.0
        });
        // Meanwhile a's engine stores another prompt; its events only reach the replay
        // buffer.
        let seq = a.kv_next_seq().unwrap();
        warm(&a, &chat(other, 2000, "during"));
        assert!(
            a.kv_next_seq().unwrap() > seq,
            "a batch was published while away"
        );
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(series(&g, "rolter_kv_events_live", "t0"), 0.0, "{ctx}");
        assert_eq!(series(&g, "rolter_kv_index_blocks", "t0"), before, "{ctx}");
        // Back: the gateway replays from the last batch it applied.
        a.set_kv_events_down(false).unwrap();
        wait_for("t0 to be repaired", Duration::from_secs(10), || {
            series(&g, "rolter_kv_events_live", "t0") == 1.0
        });
        assert!(
            series(&g, "rolter_kv_events_replays_total", "t0") >= 1.0,
            "{ctx}"
        );
        assert!(
            series(&g, "rolter_kv_events_replayed_messages_total", "t0") >= 2.0,
            "the last applied batch and the missed one, under {ctx}"
        );
        assert!(series(&g, "rolter_kv_index_blocks", "t0") > before, "{ctx}");
        // Blocks from during and from before the outage both draw requests to t0.
        for (i, doc) in [other, text, other, text].into_iter().enumerate() {
            let (t, score) = routed(g.local_addr(), &chat(doc, 2000, &format!("after {i}")));
            assert_eq!(t, "t0", "{doc:?} under {ctx}");
            assert!(score > 0.5, "score {score} for {doc:?} under {ctx}");
        }
        assert_eq!(series(&g, "rolter_kv_events_live", "t1"), 1.0, "{ctx}");
        g.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn an_engine_restarted_during_an_outage_loses_its_old_blocks_and_its_new_ones_route() {
    for d in drivers() {
        let a = kv_mock_with("a", 4096, true);
        let b = kv_mock_with("b", 4096, true);
        let g = gateway_precise(d, &[&a, &b]);
        let ctx = driver_name(d);
        let old = "the quick brown fox jumps over the lazy dog";
        let new = "a completely different text stored after the restart";
        wait_for("the subscriptions", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_connected", "t0") == 1.0
                && series(&g, "rolter_kv_events_connected", "t1") == 1.0
        });
        std::thread::sleep(Duration::from_millis(200));
        warm(&a, &chat(old, 2000, "before"));
        wait_for("the stored blocks", Duration::from_secs(5), || {
            series(&g, "rolter_kv_index_blocks", "t0") > 0.0
        });
        a.set_kv_events_down(true).unwrap();
        wait_for("t0 to be stale", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_live", "t0") == 0.0
        });
        // The engine restarts (empty cache, seq 0) and its publisher comes back.
        a.restart_kv_cache().unwrap();
        wait_for("the reconnection", Duration::from_secs(10), || {
            series(&g, "rolter_kv_events_connected", "t0") == 1.0
        });
        std::thread::sleep(Duration::from_millis(300));
        warm(&a, &chat(new, 2000, "after"));
        wait_for("t0 to be consistent again", Duration::from_secs(15), || {
            series(&g, "rolter_kv_events_live", "t0") == 1.0
        });
        let (t, score) = routed(g.local_addr(), &chat(new, 2000, "again"));
        assert_eq!(t, "t0", "{ctx}");
        assert!(score > 0.5, "score {score} under {ctx}");
        // The old engine's blocks are gone: no candidate holds that prefix.
        let (_, score) = routed(g.local_addr(), &chat(old, 2000, "again"));
        assert_eq!(score, 0.0, "under {ctx}");
        g.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn a_publisher_back_without_replay_is_trusted_again_only_once_its_cache_is_cleared() {
    for d in drivers() {
        let a = kv_mock("a", 4096);
        let g = gateway_precise(d, &[&a]);
        let ctx = driver_name(d);
        wait_for("the subscription", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_connected", "t0") == 1.0
        });
        std::thread::sleep(Duration::from_millis(200));
        warm(
            &a,
            &chat("the quick brown fox jumps over the lazy dog", 2000, "q"),
        );
        wait_for("the stored blocks", Duration::from_secs(5), || {
            series(&g, "rolter_kv_index_blocks", "t0") > 0.0
                && series(&g, "rolter_kv_events_live", "t0") == 1.0
        });
        a.set_kv_events_down(true).unwrap();
        wait_for("t0 to be stale", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_live", "t0") == 0.0
        });
        a.set_kv_events_down(false).unwrap();
        wait_for("the reconnection", Duration::from_secs(10), || {
            series(&g, "rolter_kv_events_connected", "t0") == 1.0
        });
        // What it published while away cannot be known: entries dropped, not trusted.
        wait_for("the entries to be dropped", Duration::from_secs(5), || {
            series(&g, "rolter_kv_index_blocks", "t0") == 0.0
        });
        warm(&a, &chat("another text after the outage", 2000, "q"));
        wait_for("the new blocks", Duration::from_secs(5), || {
            series(&g, "rolter_kv_index_blocks", "t0") > 0.0
        });
        assert_eq!(series(&g, "rolter_kv_events_live", "t0"), 0.0, "{ctx}");
        // The engine clears its cache (AllBlocksCleared): consistent again.
        a.publish_clear();
        wait_for("t0 to be trusted again", Duration::from_secs(5), || {
            series(&g, "rolter_kv_events_live", "t0") == 1.0
        });
        assert_eq!(series(&g, "rolter_kv_index_blocks", "t0"), 0.0, "{ctx}");
        g.shutdown(Duration::from_secs(1));
    }
}

/// A system prompt with which every canonical prompt (`[{"content":"<system>","role":
/// "system"},{"content":"question <i>: ...`) shares its first 64-byte block (16 tokens of
/// 4 bytes) and no more: the common part is 81 bytes.
const ONE_BLOCK: &str = "You are a helpful assistant.";
/// The same for two blocks: 136 bytes in common.
const TWO_BLOCKS: &str =
    "You are a helpful assistant. Answer briefly, in plain words, and cite your sources.";

/// Sends `n` chat requests, one at a time, whose prompts share the blocks that `system`
/// fills and differ from the next block on; returns how many each of the four engines
/// served.
fn spread_of_a_shared_template(
    d: rolter::config::DriverChoice,
    strategy_extra: &str,
    system: &str,
    n: usize,
) -> Vec<u64> {
    let mocks: Vec<MockHandle> = (0..4).map(|i| kv_mock(&format!("m{i}"), 4096)).collect();
    let refs: Vec<&MockHandle> = mocks.iter().collect();
    let g = gateway_precise_with(d, &refs, strategy_extra);
    wait_for("the subscriptions", Duration::from_secs(5), || {
        (0..4).all(|i| series(&g, "rolter_kv_events_connected", &format!("t{i}")) == 1.0)
    });
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..n {
        let body = format!(
            r#"{{"model":"m","max_tokens":2,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {i}: what do you know about the number {i} and its neighbours?"}}]}}"#
        );
        let _ = routed(g.local_addr(), &body);
        if i == 0 {
            // Let the first engine's events arrive, as they would under steady traffic.
            wait_for("the first events", Duration::from_secs(5), || {
                (0..4).any(|t| series(&g, "rolter_kv_index_blocks", &format!("t{t}")) > 0.0)
            });
        }
    }
    g.shutdown(Duration::from_secs(1));
    mocks.iter().map(|m| m.stats().requests).collect()
}

#[test]
fn a_template_every_prompt_shares_leaves_no_engine_idle() {
    for d in drivers() {
        let spread = spread_of_a_shared_template(d, "", ONE_BLOCK, 80);
        assert_eq!(spread.iter().sum::<u64>(), 80);
        assert!(
            spread.iter().all(|&n| n >= 4),
            "{spread:?} under {}",
            driver_name(d)
        );
    }
}

/// The figures in docs/strategies.md (`min_blocks`): `cargo test --test precise_routing
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_min_blocks_over_a_shared_template() {
    for (blocks, system) in [(1, ONE_BLOCK), (2, TWO_BLOCKS)] {
        for min in [0, 1, 2] {
            let extra = format!("min_blocks = {min}");
            let spread = spread_of_a_shared_template(drivers()[0], &extra, system, 300);
            eprintln!("{blocks} shared block(s), min_blocks = {min}: {spread:?}");
        }
    }
}
