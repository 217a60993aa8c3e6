//! The retry policy under both drivers: `retry_on` (a reset before the first response byte
//! is retried on a fresh connection too; a first-byte timeout only when named), the per-try
//! timeout and the request deadline, and the retry budget that keeps a fleet-wide failure
//! from multiplying the engines' load. Each test asserts what the client saw and what each
//! upstream saw.

mod common;

use std::net::SocketAddr;

use common::scripted::{Reply, Upstream};
use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::Fault;

const CHAT: &str = "/v1/chat/completions";

/// A gateway (one worker, an admin listener) with one round-robin route `r` over `addrs`
/// (targets t0, t1, …), health checking off so every request meets every target and only
/// requests reach the upstreams.
fn gw(d: DriverChoice, addrs: &[SocketAddr], route_extra: &str) -> Gateway {
    let mut rest =
        String::from("[admin]\nlisten = \"127.0.0.1:0\"\n[health]\nactive = false\nfailures = 0\n");
    let mut names = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let name = format!("t{i}");
        rest.push_str(&target(
            &name,
            *a,
            "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"5s\"\nidle = \"5s\"",
        ));
        names.push(format!("\"{name}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nstrategy = \"round_robin\"\n{route_extra}\n",
        names.join(", ")
    ));
    gateway(d, &rest)
}

fn error_of(r: &Response, ctx: &str) -> serde_json::Value {
    let v = r.json();
    let e = v["error"].clone();
    assert!(e["message"].is_string(), "{ctx}: {v}");
    assert!(e["type"].is_string(), "{ctx}: {v}");
    e
}

/// An upstream answering every request 503 with an OpenAI-shaped body.
fn always_503() -> Upstream {
    Upstream::start(|_| {
        let body =
            r#"{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}"#;
        Reply::new(format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
    })
}

#[test]
fn the_retry_budget_bounds_the_attempts_when_every_engine_answers_503() {
    const REQUESTS: usize = 50;
    for d in drivers() {
        let ctx = driver_name(d);
        let ups: Vec<Upstream> = (0..4).map(|_| always_503()).collect();
        let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
        // Three retries each would cost 4 attempts a request (200 in all) without a budget.
        let g = gw(d, &addrs, "retries = 3\nretry_backoff = \"0s\"");
        for i in 0..REQUESTS {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(i % 2 == 0)));
            assert_eq!(r.status, 503, "{ctx} #{i}: {}", r.text());
            // The last attempt's error: the engine's own answer when retries ran out, the
            // gateway's (in the API's shape) when the budget refused the retry.
            let v = r.json();
            assert!(v["error"]["message"].is_string(), "{ctx} #{i}: {v}");
        }
        let attempts: usize = ups.iter().map(Upstream::requests).sum();
        // requests × (1 + retry_budget) + retry_budget_min, with the defaults 0.2 and 3.
        let bound = REQUESTS + REQUESTS / 5 + 3;
        assert!(
            attempts <= bound,
            "{ctx}: {attempts} attempts, bound {bound}"
        );
        assert!(attempts > REQUESTS, "{ctx}: the budget allowed no retry");
        let retries = admin_series(&g, "rolter_retries_total{route=\"r\",reason=\"503\"}");
        assert_eq!(retries, Some((attempts - REQUESTS) as f64), "{ctx}");
        let refused = admin_series(&g, "rolter_retry_budget_exhausted_total{route=\"r\"}")
            .expect("the budget series");
        assert!(refused > 0.0, "{ctx}: no refusal counted");
    }
}

#[test]
fn a_larger_budget_allows_every_retry() {
    for d in drivers() {
        let ctx = driver_name(d);
        let ups: Vec<Upstream> = (0..3).map(|_| always_503()).collect();
        let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
        let g = gw(
            d,
            &addrs,
            "retries = 2\nretry_backoff = \"0s\"\nretry_budget = 2.0\nretry_budget_min = 0",
        );
        for i in 0..10 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 503, "{ctx} #{i}");
        }
        let attempts: usize = ups.iter().map(Upstream::requests).sum();
        assert_eq!(
            attempts, 30,
            "{ctx}: every request tried on all three targets"
        );
        assert_eq!(
            admin_series(&g, "rolter_retry_budget_exhausted_total{route=\"r\"}"),
            Some(0.0),
            "{ctx}"
        );
    }
}

#[test]
fn a_reset_before_the_first_byte_on_a_fresh_connection_is_retried() {
    for d in drivers() {
        let ctx = driver_name(d);
        let bad = mock("bad", |_| {});
        let good = mock("good", |_| {});
        // Every connection to `bad` is reset before any response byte (RST, then a new
        // connection for the next request).
        bad.set_fault(Some(Fault::ResetAfter(0)));
        let g = gw(d, &[bad.addr(), good.addr()], "retries = 1");
        for i in 0..6 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(i % 2 == 0)));
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.header("x-mock-engine"), Some("good"), "{ctx} #{i}");
        }
        assert_eq!(good.requests().len(), 6, "{ctx}");
        let tried_bad = bad.requests().len();
        assert!(tried_bad >= 1, "{ctx}: round robin sent nothing to bad");
        assert_eq!(
            admin_series(
                &g,
                "rolter_retries_total{route=\"r\",reason=\"reset_before_response\"}"
            ),
            Some(tried_bad as f64),
            "{ctx}"
        );

        // Without the word in retry_on the reset reaches the client as a 502.
        let g = gw(
            d,
            &[bad.addr(), good.addr()],
            "retries = 1\nretry_on = [\"connect_failure\", \"503\"]",
        );
        let before = (bad.requests().len(), good.requests().len());
        let codes: Vec<u16> = (0..4)
            .map(|_| call(g.local_addr(), &post(CHAT, &[], &chat_body(false))).status)
            .collect();
        let after = (bad.requests().len(), good.requests().len());
        assert_eq!(
            codes.iter().filter(|&&c| c == 502).count(),
            2,
            "{ctx}: {codes:?}"
        );
        assert_eq!((after.0 - before.0, after.1 - before.1), (2, 2), "{ctx}");
    }
}

#[test]
fn a_first_byte_timeout_is_retried_only_when_retry_on_names_it() {
    for d in drivers() {
        let ctx = driver_name(d);
        let stalled = mock("stalled", |_| {});
        let good = mock("good", |_| {});
        stalled.set_fault(Some(Fault::Stall));
        let route = "retries = 1\nper_try_timeout = \"300ms\"";
        // By default the engine may still be working: the client gets the 504. Round
        // robin sends one of two requests to each target.
        let g = gw(d, &[stalled.addr(), good.addr()], route);
        let rs: Vec<Response> = (0..2)
            .map(|_| call(g.local_addr(), &post(CHAT, &[], &chat_body(false))))
            .collect();
        let timed_out: Vec<&Response> = rs.iter().filter(|r| r.status == 504).collect();
        assert_eq!(
            timed_out.len(),
            1,
            "{ctx}: {:?}",
            rs.iter().map(|r| r.status).collect::<Vec<_>>()
        );
        let e = error_of(timed_out[0], ctx);
        assert_eq!(e["code"], "upstream_timeout", "{ctx}");
        assert!(
            e["message"].as_str().unwrap().contains("per_try_timeout"),
            "{ctx}: {e}"
        );
        assert_eq!(
            (stalled.requests().len(), good.requests().len()),
            (1, 1),
            "{ctx}: retried without being asked"
        );

        let g = gw(
            d,
            &[stalled.addr(), good.addr()],
            &format!("{route}\nretry_on = [\"first_byte_timeout\", \"503\"]"),
        );
        for i in 0..2 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(i == 0)));
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.header("x-mock-engine"), Some("good"), "{ctx} #{i}");
        }
        assert_eq!(good.requests().len(), 3, "{ctx}");
        assert!(
            stalled.requests().len() >= 2,
            "{ctx}: the stalled target was never tried"
        );
    }
}

#[test]
fn the_deadline_counts_every_attempt() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m: Vec<_> = (0..3)
            .map(|i| {
                let m = mock(&format!("s{i}"), |_| {});
                m.set_fault(Some(Fault::Stall));
                m
            })
            .collect();
        let addrs: Vec<SocketAddr> = m.iter().map(|m| m.addr()).collect();
        // Each try may take 300 ms, the whole request 500 ms: at most two tries start.
        let g = gw(
            d,
            &addrs,
            "retries = 2\nper_try_timeout = \"300ms\"\ndeadline = \"500ms\"\nretry_on = [\"first_byte_timeout\"]",
        );
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert_eq!(r.status, 504, "{ctx}: {}", r.text());
        let e = error_of(&r, ctx);
        assert_eq!(e["code"], "upstream_timeout", "{ctx}");
        assert!(
            e["message"].as_str().unwrap().contains("deadline"),
            "{ctx}: {e}"
        );
        let tried: usize = m.iter().map(|m| m.requests().len()).sum();
        assert!((1..=2).contains(&tried), "{ctx}: {tried} tries");
    }
}
