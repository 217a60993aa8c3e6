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
    gw_workers(d, 1, addrs, route_extra)
}

fn gw_workers(d: DriverChoice, workers: usize, addrs: &[SocketAddr], route_extra: &str) -> Gateway {
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
    gateway_with(d, workers, &rest)
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
        // Records reach the control thread on the workers' next tick.
        let series = "rolter_retries_total{route=\"r\",reason=\"503\"}";
        wait_for(&format!("{ctx}: {series}"), SHORT, || {
            admin_series(&g, series) == Some((attempts - REQUESTS) as f64)
        });
        let refused = "rolter_retry_budget_exhausted_total{route=\"r\"}";
        wait_for(&format!("{ctx}: a refusal counted"), SHORT, || {
            admin_series(&g, refused).is_some_and(|n| n > 0.0)
        });
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
        let series = "rolter_retries_total{route=\"r\",reason=\"reset_before_response\"}";
        wait_for(&format!("{ctx}: {series}"), SHORT, || {
            admin_series(&g, series) == Some(tried_bad as f64)
        });

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

/// An upstream answering 200, or `429` with `headers` while `limited` says so for the
/// request's index (arrival order).
fn limited(headers: &'static str, limited: fn(usize) -> bool) -> Upstream {
    Upstream::start(move |r| {
        if limited(r.total) {
            let body = r#"{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}}"#;
            Reply::new(format!(
                "HTTP/1.1 429 Too Many Requests\r\n{headers}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ))
        } else {
            Reply::new(common::scripted::ok(r#"{"ok":true}"#))
        }
    })
}

/// The target `name`'s `cooling` object in `/admin/targets` (null while it does not cool).
fn cooling(g: &Gateway, name: &str) -> serde_json::Value {
    let v = call(
        g.admin_addr().unwrap(),
        &request("GET", "/admin/targets", &[], ""),
    )
    .json();
    v["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .find(|t| t["name"] == name)
        .expect("the target")["cooling"]
        .clone()
}

/// The target's `cooling` object once the control thread has the worker's record.
fn cooling_shown(g: &Gateway, name: &str) -> serde_json::Value {
    let mut shown = serde_json::Value::Null;
    wait_for(&format!("{name} shown cooling"), SHORT, || {
        shown = cooling(g, name);
        !shown.is_null()
    });
    shown
}

#[test]
fn a_target_answering_429_with_retry_after_cools_and_returns() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = limited("retry-after: 2\r\n", |n| n == 0);
        let b = limited("", |_| false);
        let g = gw(d, &[a.addr, b.addr], "retries = 1");
        // Round robin reaches `a` within two requests; its 429 is retried on `b`.
        while a.requests() == 0 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        }
        let limited_at = std::time::Instant::now();
        let b_before = b.requests();
        // Within the 2 s the target receives nothing (only requests sent well inside them
        // are counted, so a slow machine cannot blur the edge).
        let mut sent = 0;
        while sent < 10 && limited_at.elapsed() < std::time::Duration::from_millis(1500) {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(sent % 2 == 0)));
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
            sent += 1;
        }
        assert!(sent > 0, "{ctx}: nothing sent within the cooling time");
        assert_eq!(a.requests(), 1, "{ctx}: the cooling target was picked");
        assert_eq!(b.requests() - b_before, sent, "{ctx}");
        let series = "rolter_target_cooldowns_total{target=\"t0\"}";
        wait_for(&format!("{ctx}: {series}"), SHORT, || {
            admin_series(&g, series) == Some(1.0)
        });
        assert_eq!(
            admin_series(&g, "rolter_target_cooldowns_total{target=\"t1\"}"),
            Some(0.0),
            "{ctx}"
        );
        // Shown while it lasts, gone after; then the target gets its share again.
        let shown = cooling(&g, "t0");
        if limited_at.elapsed() < std::time::Duration::from_millis(1500) {
            let left = shown["remaining_seconds"].as_f64().expect("cooling shown");
            assert!(left > 0.0 && left <= 2.0, "{ctx}: {shown}");
            assert!(shown["until"].is_string(), "{ctx}: {shown}");
        }
        assert!(cooling(&g, "t1").is_null(), "{ctx}");
        wait_for(&format!("{ctx}: the cooling ends"), SHORT * 2, || {
            cooling(&g, "t0").is_null()
        });
        for i in 0..10 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx} #{i}");
        }
        assert_eq!(
            a.requests(),
            1 + 5,
            "{ctx}: its round-robin share after cooling"
        );
    }
}

#[test]
fn a_cooling_target_is_left_out_on_every_core() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = limited("retry-after: 5\r\n", |n| n == 0);
        let b = limited("", |_| false);
        let g = gw_workers(d, 2, &[a.addr, b.addr], "retries = 1");
        let explain = [("x-rolter-explain", "1")];
        let mut limited_on = None;
        while a.requests() == 0 {
            let r = call(g.local_addr(), &post(CHAT, &explain, &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
            limited_on = r.header("x-rolter-worker").map(str::to_string);
        }
        let limited_on = limited_on.expect("x-rolter-worker");
        let limited_at = std::time::Instant::now();
        // Once the control thread shows it, it has sent it to every worker too (both
        // happen in one turn of its loop).
        cooling_shown(&g, "t0");
        // New connections spread over both workers; the other one must leave `a` out too.
        let mut on_other = 0;
        for _ in 0..40 {
            if on_other >= 3 || limited_at.elapsed() > std::time::Duration::from_secs(4) {
                break;
            }
            let r = call(g.local_addr(), &post(CHAT, &explain, &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
            assert_eq!(r.header("x-rolter-target"), Some("t1"), "{ctx}");
            if r.header("x-rolter-worker") != Some(limited_on.as_str()) {
                on_other += 1;
            }
        }
        if limited_at.elapsed() <= std::time::Duration::from_secs(4) {
            assert!(on_other > 0, "{ctx}: no request reached the other worker");
        }
        assert_eq!(a.requests(), 1, "{ctx}: the cooling target was picked");
    }
}

#[test]
fn every_target_cooling_answers_429_with_the_shortest_retry_after() {
    for d in drivers() {
        let ctx = driver_name(d);
        let a = limited("retry-after: 30\r\n", |_| true);
        let b = limited("retry-after: 20\r\n", |_| true);
        let g = gw(d, &[a.addr, b.addr], "retries = 1");
        // Both tried: the last attempt's 429 reaches the client as the engine sent it.
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert_eq!(r.status, 429, "{ctx}: {}", r.text());
        assert_eq!((a.requests(), b.requests()), (1, 1), "{ctx}");
        // Now both cool: the gateway answers without asking either.
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(true)));
        assert_eq!(r.status, 429, "{ctx}: {}", r.text());
        assert_eq!(error_of(&r, ctx)["code"], "targets_rate_limited", "{ctx}");
        let after: u64 = r
            .header("retry-after")
            .expect("retry-after")
            .parse()
            .unwrap();
        assert!((1..=20).contains(&after), "{ctx}: retry-after {after}");
        assert!(
            after > 10,
            "{ctx}: the shorter wait is b's 20 s, not a's 30 s: {after}"
        );
        assert_eq!(
            (a.requests(), b.requests()),
            (1, 1),
            "{ctx}: no upstream asked"
        );
    }
}

#[test]
fn http_dates_and_rate_limit_resets_set_the_cooling_time_up_to_its_cap() {
    for d in drivers() {
        let ctx = driver_name(d);
        // A managed API's reset headers: the shorter one (2 s), capped at 1 s here.
        let a = limited(
            "x-ratelimit-reset-requests: 6m0s\r\nx-ratelimit-reset-tokens: 2s\r\n",
            |n| n == 0,
        );
        let b = limited("", |_| false);
        let g = gw(
            d,
            &[a.addr, b.addr],
            "retries = 1\nretry_after_max = \"1s\"",
        );
        while a.requests() == 0 {
            call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        }
        let shown = cooling_shown(&g, "t0");
        let left = shown["remaining_seconds"].as_f64().expect("cooling shown");
        assert!(left > 0.0 && left <= 1.0, "{ctx}: {shown}");

        // Retry-After as an HTTP-date 30 s ahead (whole seconds: between 28 and 30 left).
        let date = httpdate_in(30);
        let headers: &'static str = Box::leak(format!("retry-after: {date}\r\n").into_boxed_str());
        let c = limited(headers, |n| n == 0);
        let g = gw(d, &[c.addr, b.addr], "retries = 1");
        while c.requests() == 0 {
            call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        }
        let shown = cooling_shown(&g, "t0");
        let left = shown["remaining_seconds"].as_f64().expect("cooling shown");
        assert!(left > 20.0 && left <= 30.0, "{ctx}: {shown}");
    }
}

/// An IMF-fixdate `secs` from now.
fn httpdate_in(secs: u64) -> String {
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(secs);
    let unix = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (days, rem) = ((unix / 86_400) as i64, unix % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MO: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WD[(days % 7) as usize],
        MO[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
