//! Hard caps under both drivers: a target's `max_concurrent` holds exactly across workers
//! (the engine's own count of requests running at once never exceeds it, in a burst over
//! four workers) and every way an attempt ends gives its place back.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;

const COMPLETION: &str = r#"{"model":"m","prompt":"x"}"#;

/// A gateway with `workers` workers in front of `mocks` (targets t0, t1, … with
/// `target_extra`), one round-robin route with `route_extra`.
fn gw(
    d: DriverChoice,
    workers: usize,
    mocks: &[&rolter_mock::MockHandle],
    target_extra: &str,
    route_extra: &str,
) -> Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        let name = format!("t{i}");
        rest.push_str(&target(
            &name,
            m.addr(),
            &format!(
                "{target_extra}\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"5s\"\nidle = \"5s\""
            ),
        ));
        names.push(format!("\"{name}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nstrategy = \"round_robin\"\n{route_extra}\n",
        names.join(", ")
    ));
    gateway_with(d, workers, &rest)
}

/// Sends `n` requests at once, each on its own connection opened beforehand (so they
/// spread over the workers), and returns their responses.
fn burst(
    addr: SocketAddr,
    n: usize,
    headers: &'static [(&'static str, &'static str)],
) -> Vec<Response> {
    let start = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                start.wait();
                c.send(&post("/v1/completions", headers, COMPLETION));
                c.response().expect("a response")
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn max_concurrent_is_exact_across_four_workers() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |c| c.ttft = std::time::Duration::from_millis(300));
        let g = gw(d, 4, &[&a], "max_concurrent = 2", "retries = 0");
        let answers = burst(g.local_addr(), 24, &[]);
        let ok = answers.iter().filter(|r| r.status == 200).count();
        for r in &answers {
            match r.status {
                200 => {}
                503 => {
                    assert_eq!(r.json()["error"]["code"], "no_available_target", "{ctx}");
                    assert!(r.header("retry-after").is_some(), "{ctx}");
                }
                s => panic!("{ctx}: unexpected status {s}: {}", r.text()),
            }
        }
        let stats = a.stats();
        assert!(
            stats.peak_running <= 2,
            "{ctx}: the engine saw {} requests at once with max_concurrent = 2",
            stats.peak_running
        );
        assert!(ok >= 2, "{ctx}: only {ok} of the burst were served");
        assert_eq!(
            stats.requests, ok as u64,
            "{ctx}: each 200 reached the engine once"
        );
        // Every place was given back: a full round is served again.
        let again = burst(g.local_addr(), 2, &[]);
        assert!(again.iter().all(|r| r.status == 200), "{ctx}");
        assert!(a.stats().peak_running <= 2, "{ctx}");
    }
}

#[test]
fn every_way_an_attempt_ends_gives_its_place_back() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |_| {});
        let g = gw(d, 2, &[&a], "max_concurrent = 1", "retries = 0");
        let addr = g.local_addr();
        // An engine error.
        let r = call(
            addr,
            &post("/v1/completions", &[("x-mock-status", "500")], COMPLETION),
        );
        assert_eq!(r.status, 500, "{ctx}");
        // A reset before the first byte.
        let r = call(
            addr,
            &post(
                "/v1/completions",
                &[("x-mock-reset-after", "0")],
                COMPLETION,
            ),
        );
        assert_eq!(r.status, 502, "{ctx}: {}", r.text());
        // A stream cut after its first bytes.
        {
            let mut c = Client::connect(addr);
            c.send(&post(
                "/v1/chat/completions",
                &[("x-mock-reset-after", "2"), ("x-mock-tokens", "5")],
                &chat_body(true),
            ));
            assert_eq!(c.head().expect("a head").0, 200, "{ctx}");
            // The cut stream ends without its terminal chunk.
            while let Ok(Some(_)) = c.chunk() {}
        }
        // A client that goes away while the engine works.
        {
            let mut c = Client::connect(addr);
            c.send(&post(
                "/v1/completions",
                &[("x-mock-ttft-ms", "5000")],
                COMPLETION,
            ));
            wait_for("the held request runs", SHORT, || a.stats().running == 1);
        }
        wait_for("the abort reaches the engine", SHORT, || {
            a.stats().aborted == 1
        });
        // The one place is free again each time: requests keep being served, on either worker.
        for _ in 0..6 {
            let r = call(addr, &post("/v1/completions", &[], COMPLETION));
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        }
        assert_eq!(a.stats().peak_running, 1, "{ctx}");
    }
}

#[test]
fn a_full_target_leaves_the_candidates_and_the_other_serves() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |c| c.ttft = std::time::Duration::from_millis(300));
        let b = mock("b", |c| c.ttft = std::time::Duration::from_millis(300));
        let g = gw(d, 4, &[&a, &b], "max_concurrent = 1", "retries = 0");
        let answers = burst(g.local_addr(), 12, &[]);
        let ok = answers.iter().filter(|r| r.status == 200).count();
        let (sa, sb) = (a.stats(), b.stats());
        assert!(
            sa.peak_running <= 1 && sb.peak_running <= 1,
            "{ctx}: {sa:?} {sb:?}"
        );
        assert_eq!(sa.requests + sb.requests, ok as u64, "{ctx}");
        assert!(ok >= 2, "{ctx}: {ok}");
    }
}

/// Starts a gateway from `server` (lines of the `[server]` table) and `rest`.
fn gateway_text(d: DriverChoice, server: &str, rest: &str) -> Gateway {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\npin_workers = false\ndriver = \"{}\"\nshutdown_grace = \"2s\"\n{server}\n{TEST_LIMITS}\n[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{rest}",
        driver_name(d)
    );
    let cfg = rolter::config::load_str(&text, "<test>").unwrap_or_else(|e| panic!("{e}\n{text}"));
    Gateway::start(cfg).expect("start gateway")
}

#[test]
fn a_connection_over_max_connections_gets_a_503_and_is_closed() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |_| {});
        let rest = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
            target("t0", a.addr(), "")
        );
        let g = gateway_text(d, "workers = 2\nmax_connections = 2", &rest);
        let addr = g.local_addr();
        // Two connections, each served once and kept open.
        let mut held: Vec<Client> = (0..2)
            .map(|_| {
                let mut c = Client::connect(addr);
                c.send(&post("/v1/completions", &[], COMPLETION));
                assert_eq!(c.response().unwrap().status, 200, "{ctx}");
                c
            })
            .collect();
        // A third: a 503 in the API's error shape, then the gateway closes.
        let mut c = Client::connect(addr);
        c.send(&post("/v1/completions", &[], COMPLETION));
        let r = c.response().expect("the refusal");
        assert_eq!(r.status, 503, "{ctx}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"), "{ctx}");
        assert!(r.header("retry-after").is_some(), "{ctx}");
        let e = &r.json()["error"];
        assert_eq!(e["code"], "too_many_connections", "{ctx}");
        assert!(
            e["message"].as_str().unwrap().contains("max_connections"),
            "{ctx}"
        );
        let mut rest = Vec::new();
        let n = std::io::Read::read_to_end(&mut c.r, &mut rest).unwrap_or(0);
        assert_eq!(n, 0, "{ctx}: nothing after the refusal");
        assert_eq!(
            a.stats().requests,
            2,
            "{ctx}: the refused request never reached the engine"
        );
        // The held connections still work.
        for c in &mut held {
            c.send(&post("/v1/completions", &[], COMPLETION));
            assert_eq!(c.response().unwrap().status, 200, "{ctx}");
        }
        // One closes: a new connection is served once the gateway has seen the close.
        drop(held.pop());
        wait_for("a place frees", SHORT, || {
            let mut c = Client::connect(addr);
            c.send(&post("/v1/completions", &[], COMPLETION));
            c.response().is_ok_and(|r| r.status == 200)
        });
        wait_for("the refusal is counted", SHORT, || {
            admin_series(
                &g,
                "rolter_gateway_responses_total{status=\"503\",code=\"too_many_connections\"}",
            )
            .is_some_and(|v| v >= 1.0)
        });
    }
}

/// A gateway with `workers` workers over one mock capped at one request, its route with
/// `route_extra` (the queue's keys).
fn queued_gw(
    d: DriverChoice,
    workers: usize,
    a: &rolter_mock::MockHandle,
    route_extra: &str,
) -> Gateway {
    let rest = format!(
        "{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\nretries = 0\n{route_extra}\n",
        target(
            "t0",
            a.addr(),
            "max_concurrent = 1\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"10s\"\nidle = \"10s\""
        )
    );
    gateway_text(d, &format!("workers = {workers}"), &rest)
}

/// Starts a request on its own connection that the engine holds for `ms`.
fn held(addr: SocketAddr, ms: u64) -> std::thread::JoinHandle<Response> {
    std::thread::spawn(move || {
        let ms = ms.to_string();
        call(
            addr,
            &post("/v1/completions", &[("x-mock-ttft-ms", &ms)], COMPLETION),
        )
    })
}

fn series(g: &Gateway, s: &str) -> f64 {
    admin_series(g, s).unwrap_or(0.0)
}

const DEPTH: &str = "rolter_queue_depth{route=\"r\"}";

#[test]
fn queued_requests_wait_for_a_place_and_are_all_served() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |c| c.ttft = std::time::Duration::from_millis(100));
        // Each of the 4 workers holds up to 64 / 4 = 16 waiters: room for the whole burst on any one.
        let g = queued_gw(d, 4, &a, "queue_max = 64\nqueue_timeout = \"20s\"");
        let answers = burst(g.local_addr(), 8, &[]);
        for r in &answers {
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        }
        let s = a.stats();
        assert_eq!(s.requests, 8, "{ctx}: each request reached the engine once");
        assert_eq!(
            s.peak_running, 1,
            "{ctx}: one at a time, as max_concurrent says"
        );
        wait_for("every wait accounted", SHORT, || {
            series(
                &g,
                "rolter_queue_requests_total{route=\"r\",result=\"admitted\"}",
            ) >= 1.0
                && series(&g, DEPTH) == 0.0
        });
    }
}

#[test]
fn a_queued_request_times_out_with_retry_after() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |_| {});
        let g = queued_gw(d, 2, &a, "queue_max = 4\nqueue_timeout = \"300ms\"");
        let long = held(g.local_addr(), 3000);
        wait_for("the place is taken", SHORT, || a.stats().running == 1);
        let r = call(g.local_addr(), &post("/v1/completions", &[], COMPLETION));
        assert_eq!(r.status, 503, "{ctx}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "queue_timeout", "{ctx}");
        assert!(r.header("retry-after").is_some(), "{ctx}");
        assert_eq!(long.join().unwrap().status, 200, "{ctx}");
        assert_eq!(
            a.stats().requests,
            1,
            "{ctx}: the timed-out request never reached the engine"
        );
        wait_for("the timeout is counted", SHORT, || {
            series(
                &g,
                "rolter_queue_requests_total{route=\"r\",result=\"timeout\"}",
            ) == 1.0
        });
    }
}

#[test]
fn a_full_queue_answers_at_once_and_a_client_that_leaves_is_dropped_from_it() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |_| {});
        // One worker, so the whole queue (one place) is on it.
        let g = queued_gw(d, 1, &a, "queue_max = 1\nqueue_timeout = \"20s\"");
        let addr = g.local_addr();
        let long = held(addr, 4000);
        wait_for("the place is taken", SHORT, || a.stats().running == 1);
        // One waits…
        let mut waiting = Client::connect(addr);
        waiting.send(&post("/v1/completions", &[], COMPLETION));
        wait_for("one request queued", SHORT, || series(&g, DEPTH) == 1.0);
        // …so the next finds the queue full: a 503 at once.
        let r = call(addr, &post("/v1/completions", &[], COMPLETION));
        assert_eq!(r.status, 503, "{ctx}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "queue_full", "{ctx}");
        assert!(r.header("retry-after").is_some(), "{ctx}");
        // The waiting client goes away: it leaves the queue.
        drop(waiting);
        wait_for("the queue is empty", SHORT, || {
            series(&g, DEPTH) == 0.0
                && series(
                    &g,
                    "rolter_queue_requests_total{route=\"r\",result=\"client_gone\"}",
                ) == 1.0
        });
        assert_eq!(long.join().unwrap().status, 200, "{ctx}");
        // Its request never reached the engine; the place is free for the next.
        let r = call(addr, &post("/v1/completions", &[], COMPLETION));
        assert_eq!(r.status, 200, "{ctx}");
        assert_eq!(a.stats().requests, 2, "{ctx}");
        assert_eq!(
            series(
                &g,
                "rolter_queue_requests_total{route=\"r\",result=\"overflow\"}"
            ),
            1.0,
            "{ctx}"
        );
    }
}
