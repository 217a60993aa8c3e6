//! `lmcache_aware` through the real gateway, in front of mock engines whose LMCache workers
//! report what they store to an LMCache-controller stand-in (ZMQ PUSH, msgpack maps, as
//! LMCache does) that serves `POST /lookup`: a prompt held on one engine goes there, an
//! answer is reused for the same prefix, instance ids map through `lmcache_instance`, and a
//! slow, failing or absent controller makes picks fall back to load and say so.

mod common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter_mock::{Controller, ControllerConfig, LmcacheWorkerConfig, MockHandle};

const WAIT: Duration = Duration::from_secs(10);

/// An engine named `name` with an LMCache worker reporting to `ctl`.
fn engine(name: &str, ctl: &Controller) -> MockHandle {
    mock(name, |c| {
        c.lmcache = Some(LmcacheWorkerConfig {
            controller: ctl.pull_endpoint().to_string(),
            capacity_chunks: 256,
            ..LmcacheWorkerConfig::default()
        });
    })
}

/// A gateway over `engines` as targets t0.. (each mapped to its engine's instance id),
/// `workers` worker cores, one `lmcache_aware` route asking `ctl`.
fn gateway_lmcache(
    d: rolter::config::DriverChoice,
    workers: usize,
    engines: &[&MockHandle],
    ctl: &Controller,
) -> rolter::Gateway {
    let strategy = format!(
        "[routes.strategy]\nname = \"lmcache_aware\"\ncontroller = \"http://{}\"\n\
         lookup_timeout = \"100ms\"\nretry_after = \"2s\"\n",
        ctl.http_addr()
    );
    gateway_routing(d, workers, engines, &strategy)
}

/// A gateway over `engines` as targets t0.., `workers` worker cores, one route with the
/// `strategy` table, and an admin listener.
fn gateway_routing(
    d: rolter::config::DriverChoice,
    workers: usize,
    engines: &[&MockHandle],
    strategy: &str,
) -> rolter::Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in engines.iter().enumerate() {
        rest.push_str(&format!(
            "[[targets]]\nname = \"t{i}\"\nurl = \"http://{}\"\nlmcache_instance = \"{}\"\n\
             [targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"3s\"\nidle = \"3s\"\n",
            m.addr(),
            m.lmcache_instance_id().unwrap()
        ));
        names.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nretries = 0\n{strategy}\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        names.join(", "),
    ));
    gateway_with(d, workers, &rest)
}

/// A chat body: a 3600-byte system text built from `seed`, then `question`: about 920
/// tokens, of which the three whole 256-token chunks lie inside the system text.
fn chat(seed: u64, question: &str) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut s = String::new();
    while s.len() < 3600 {
        for _ in 0..rng.usize(2..9) {
            s.push(rng.lowercase());
        }
        s.push(' ');
    }
    s.truncate(3600);
    format!(
        r#"{{"model":"m","max_tokens":2,"messages":[{{"role":"system","content":"{s}"}},{{"role":"user","content":"{question}"}}]}}"#
    )
}

/// Sends `body` through the gateway with the explain header: (target, score, fallback).
fn routed(addr: SocketAddr, body: &str) -> (String, f64, Option<String>) {
    let e = explained(addr, body);
    (e.target, e.score.unwrap_or(-1.0), e.fallback)
}

/// Sends `body` straight to the engine so its LMCache worker stores the prompt, and waits
/// until the controller has every message the engines sent.
fn warm(m: &MockHandle, body: &str, ctl: &Controller, all: &[&MockHandle]) {
    let r = call(m.addr(), &post("/v1/chat/completions", &[], body));
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for("the controller to catch up", WAIT, || {
        let sent: u64 = all
            .iter()
            .map(|h| h.lmcache_stats().unwrap().sent_messages)
            .sum();
        ctl.messages() == sent
    });
}

/// The value of one series on the gateway's `/metrics` (0 when absent).
fn series(g: &rolter::Gateway, name: &str) -> f64 {
    admin_series(g, name).unwrap_or(0.0)
}

fn lookups(g: &rolter::Gateway, result: &str) -> f64 {
    series(
        g,
        &format!("rolter_cache_lookups_total{{route=\"r\",result=\"{result}\"}}"),
    )
}

fn unreachable(g: &rolter::Gateway) -> f64 {
    series(
        g,
        "rolter_strategy_fallbacks_total{route=\"r\",strategy=\"lmcache_aware\",reason=\"lmcache_unreachable\"}",
    )
}

#[test]
fn held_prompts_go_to_their_holder_and_answers_are_reused() {
    for d in drivers() {
        let ctl = Controller::start(ControllerConfig::default()).unwrap();
        let e = [
            engine("pod-a", &ctl),
            engine("pod-b", &ctl),
            engine("pod-c", &ctl),
        ];
        // Registered with the controller but no target of the gateway.
        let stranger = engine("pod-elsewhere", &ctl);
        let all = [&e[0], &e[1], &e[2], &stranger];
        wait_for("the registrations", WAIT, || ctl.workers().len() == 4);
        let g = gateway_lmcache(d, 2, &[&e[0], &e[1], &e[2]], &ctl);

        // The prompt is held by pod-b only: every request sharing its whole chunks goes to
        // t1, whatever the load.
        warm(&e[1], &chat(1, "warm-up"), &ctl, &all);
        for i in 0..6 {
            let (t, score, fallback) = routed(g.local_addr(), &chat(1, &format!("q{i}")));
            assert_eq!(t, "t1", "request {i} under {}", driver_name(d));
            assert!(score > 0.5, "score {score}");
            assert_eq!(fallback, None);
        }
        // Six requests with the same whole chunks: one lookup per worker core at most, the
        // rest reuse the answer.
        // (The counts reach /metrics through the control thread within a few ticks.)
        wait_for("six lookups counted", WAIT, || {
            lookups(&g, "answered") + lookups(&g, "memo") == 6.0
        });
        let asked = lookups(&g, "answered");
        assert!((1.0..=2.0).contains(&asked), "{asked} lookups answered");

        // A prompt nobody holds: load decides (score 0), and it is no fallback.
        let (_, score, fallback) = routed(g.local_addr(), &chat(2, "fresh"));
        assert_eq!((score, fallback), (0.0, None));

        // A prompt held only by an engine of no target: its holding is ignored and the
        // mismatch is counted.
        warm(&stranger, &chat(3, "warm-up"), &ctl, &all);
        let (_, score, fallback) = routed(g.local_addr(), &chat(3, "elsewhere"));
        assert_eq!((score, fallback), (0.0, None));
        wait_for("the unknown instance counted", WAIT, || {
            lookups(&g, "unknown_instance") >= 1.0
        });
        g.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn a_slow_failing_or_absent_controller_falls_back_to_load() {
    for d in drivers() {
        let ctl = Controller::start(ControllerConfig::default()).unwrap();
        let e = [engine("pod-a", &ctl), engine("pod-b", &ctl)];
        wait_for("the registrations", WAIT, || ctl.workers().len() == 2);
        // One worker: the pause after a failure is per core.
        let g = gateway_lmcache(d, 1, &[&e[0], &e[1]], &ctl);
        warm(&e[1], &chat(1, "warm-up"), &ctl, &[&e[0], &e[1]]);

        // Slower than lookup_timeout (100 ms): answered by load, said so.
        ctl.set_delay(Duration::from_millis(400));
        let (_, _, fallback) = routed(g.local_addr(), &chat(5, "slow"));
        assert_eq!(fallback.as_deref(), Some("lmcache_unreachable"));
        wait_for("the timeout counted", WAIT, || {
            lookups(&g, "timeout") == 1.0
        });
        // Within retry_after (2 s) the controller is not asked at all.
        let before = ctl.lookups();
        let (_, _, fallback) = routed(g.local_addr(), &chat(6, "paused"));
        assert_eq!(fallback.as_deref(), Some("lmcache_unreachable"));
        wait_for("the paused lookup counted", WAIT, || {
            lookups(&g, "paused") >= 1.0
        });
        std::thread::sleep(Duration::from_millis(450));
        assert_eq!(ctl.lookups(), before, "asked during the pause");

        // After the pause, an error answer (503) is a fallback too.
        ctl.set_delay(Duration::ZERO);
        ctl.set_failing(true);
        std::thread::sleep(Duration::from_millis(2100));
        let (_, _, fallback) = routed(g.local_addr(), &chat(7, "failing"));
        assert_eq!(fallback.as_deref(), Some("lmcache_unreachable"));
        wait_for("the error counted", WAIT, || lookups(&g, "error") == 1.0);

        // Healthy again: the holder wins again.
        ctl.set_failing(false);
        std::thread::sleep(Duration::from_millis(2100));
        let (t, _, fallback) = routed(g.local_addr(), &chat(1, "healthy"));
        assert_eq!((t.as_str(), fallback), ("t1", None));

        // Gone (connections refused): fallback, and every request is still answered.
        ctl.shutdown();
        std::thread::sleep(Duration::from_millis(2100));
        for i in 0..4 {
            let (_, _, fallback) = routed(g.local_addr(), &chat(8 + i, "gone"));
            assert_eq!(fallback.as_deref(), Some("lmcache_unreachable"));
        }
        wait_for("every fallback counted", WAIT, || unreachable(&g) == 7.0);
        g.shutdown(Duration::from_secs(1));
    }
}

/// The share of prompt tokens the engines found in their LMCache stores, over a RAG-like
/// load (12 documents of ~920 tokens asked about at random by 4 clients, 120 requests)
/// through a gateway whose route uses `strategy`. Each engine's store holds 16 chunks of
/// 256 tokens: a quarter of the documents when each stays on one engine, far fewer when
/// every engine sees them all. The engines' GPU prefix caches are off, so only LMCache
/// hits count.
fn lmcache_hit_share(d: rolter::config::DriverChoice, strategy: &str) -> f64 {
    let ctl = Controller::start(ControllerConfig::default()).unwrap();
    let engines: Vec<MockHandle> = (0..4)
        .map(|i| {
            mock(&format!("pod-{i}"), |c| {
                c.prefix_cache = Some(rolter_mock::PrefixCacheConfig {
                    capacity_blocks: 0,
                    prefill_us_per_token: 5,
                    ..rolter_mock::PrefixCacheConfig::default()
                });
                c.lmcache = Some(LmcacheWorkerConfig {
                    controller: ctl.pull_endpoint().to_string(),
                    capacity_chunks: 16,
                    ..LmcacheWorkerConfig::default()
                });
            })
        })
        .collect();
    let refs: Vec<&MockHandle> = engines.iter().collect();
    wait_for("the registrations", WAIT, || ctl.workers().len() == 4);
    let g = if strategy == "lmcache_aware" {
        gateway_lmcache(d, 2, &refs, &ctl)
    } else {
        gateway_routing(d, 2, &refs, &format!("strategy = \"{strategy}\""))
    };
    let addr = g.local_addr();
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(100 + c);
                for i in 0..30 {
                    let doc = rng.u64(0..12);
                    let r = call(
                        addr,
                        &post(
                            "/v1/chat/completions",
                            &[("x-mock-ttft-ms", "5")],
                            &chat(1000 + doc, &format!("client {c} question {i}")),
                        ),
                    );
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    g.shutdown(Duration::from_secs(1));
    let (hit, asked) = engines.iter().fold((0, 0), |(h, q), e| {
        let s = e.lmcache_stats().unwrap();
        (h + s.hit_tokens, q + s.query_tokens)
    });
    hit as f64 / asked.max(1) as f64
}

/// Keeping each document on the engine whose LMCache store holds it finds far more of the
/// prompts in LMCache than spreading by load.
#[test]
fn lmcache_aware_finds_more_prompts_in_lmcache_than_least_loaded() {
    let d = drivers()[0];
    let spread = lmcache_hit_share(d, "least_loaded");
    let aware = lmcache_hit_share(d, "lmcache_aware");
    eprintln!(
        "{}: 120 requests over 12 documents, 4 engines x 16 chunks: LMCache hit share least_loaded {:.1} %, lmcache_aware {:.1} %",
        driver_name(d),
        spread * 100.0,
        aware * 100.0
    );
    assert!(
        aware >= spread * 1.5 && aware > 0.35,
        "lmcache_aware {aware:.3} against least_loaded {spread:.3}"
    );
}
