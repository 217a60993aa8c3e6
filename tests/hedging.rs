//! Hedging (`hedge_after`) under both drivers: a first attempt that has sent no response
//! byte within the delay is raced by a second on another target; the first head wins and
//! the loser's engine sees its connection close (an abort). Hedges are charged to the retry
//! budget, and a percentile delay waits until the route's head times are known.

mod common;

use std::time::Duration;

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::{Fault, MockHandle};

const CHAT: &str = "/v1/chat/completions";

/// A gateway with an admin listener and one round-robin route over `mocks` (t0, t1, …).
fn gw(d: DriverChoice, mocks: &[&MockHandle], first_byte: &str, route_extra: &str) -> Gateway {
    let mut rest =
        String::from("[admin]\nlisten = \"127.0.0.1:0\"\n[health]\nactive = false\nfailures = 0\n");
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        let name = format!("t{i}");
        rest.push_str(&target(
            &name,
            m.addr(),
            &format!("[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"{first_byte}\"\nidle = \"2s\""),
        ));
        names.push(format!("\"{name}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nstrategy = \"round_robin\"\n{route_extra}\n",
        names.join(", ")
    ));
    gateway(d, &rest)
}

fn series(g: &Gateway, name: &str) -> f64 {
    admin_series(g, name).unwrap_or(0.0)
}

/// The statuses of `n` chat requests, one after another, sorted.
fn statuses(g: &Gateway, n: usize) -> Vec<u16> {
    let mut codes: Vec<u16> = (0..n)
        .map(|_| call(g.local_addr(), &post(CHAT, &[], &chat_body(false))).status)
        .collect();
    codes.sort();
    codes
}

/// The `x-request-id`s an engine received, sorted.
fn ids(m: &MockHandle) -> Vec<String> {
    let mut v: Vec<String> = m
        .requests()
        .iter()
        .filter_map(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == "x-request-id")
                .map(|(_, v)| v.clone())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_stalled_first_attempt_loses_to_a_hedge_and_its_engine_sees_the_abort() {
    for d in drivers() {
        let ctx = driver_name(d);
        let stalled = mock("stalled", |_| {});
        let good = mock("good", |_| {});
        stalled.set_fault(Some(Fault::Stall));
        // No retries: only the hedge can save a request that went to the stalled engine.
        let g = gw(
            d,
            &[&stalled, &good],
            "5s",
            "retries = 0\nhedge_after = \"150ms\"",
        );
        for i in 0..6 {
            let id = format!("hedge-{i}");
            let stream = i % 2 == 1;
            let r = call(
                g.local_addr(),
                &post(CHAT, &[("x-request-id", &id)], &chat_body(stream)),
            );
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.header("x-mock-engine"), Some("good"), "{ctx} #{i}");
            if stream {
                assert!(r.text().trim_end().ends_with("data: [DONE]"), "{ctx} #{i}");
            } else {
                assert_eq!(r.json()["object"], "chat.completion", "{ctx} #{i}");
            }
        }
        // Every request reached the good engine once; those that went first to the
        // stalled one were let go there the moment the hedge answered.
        assert_eq!(good.requests().len(), 6, "{ctx}");
        let first_to_stalled = ids(&stalled);
        assert!(
            !first_to_stalled.is_empty(),
            "{ctx}: round robin never chose t0"
        );
        wait_for("the stalled engine sees every abort", SHORT, || {
            let mut aborted = stalled.aborted_ids();
            aborted.sort();
            aborted == first_to_stalled
        });
        let k = first_to_stalled.len() as f64;
        wait_for("hedge metrics", SHORT, || {
            series(&g, "rolter_hedges_sent_total{route=\"r\"}") == k
                && series(&g, "rolter_hedges_won_total{route=\"r\"}") == k
        });
        // The cancelled attempts are no failures of the stalled target.
        assert_eq!(
            series(&g, "rolter_ejections_total{target=\"t0\"}"),
            0.0,
            "{ctx}"
        );
    }
}

#[test]
fn a_hedge_is_charged_to_the_retry_budget() {
    for d in drivers() {
        let ctx = driver_name(d);
        let stalled = mock("stalled", |_| {});
        let good = mock("good", |_| {});
        stalled.set_fault(Some(Fault::Stall));
        // A budget of nothing: the hedge is due but never sent.
        let g = gw(
            d,
            &[&stalled, &good],
            "600ms",
            "retries = 0\nhedge_after = \"100ms\"\nretry_budget = 0.0\nretry_budget_min = 0",
        );
        assert_eq!(statuses(&g, 2), [200, 504], "{ctx}");
        assert_eq!(
            (stalled.requests().len(), good.requests().len()),
            (1, 1),
            "{ctx}"
        );
        wait_for("skipped hedge counted", SHORT, || {
            series(
                &g,
                "rolter_hedges_skipped_total{route=\"r\",reason=\"budget\"}",
            ) == 1.0
        });
        assert_eq!(
            series(&g, "rolter_hedges_sent_total{route=\"r\"}"),
            0.0,
            "{ctx}"
        );
    }
}

#[test]
fn a_percentile_hedge_waits_for_the_routes_head_times_then_hedges() {
    for d in drivers() {
        let ctx = driver_name(d);
        let flaky = mock("flaky", |_| {});
        let good = mock("good", |_| {});
        flaky.set_fault(Some(Fault::Stall));
        let g = gw(
            d,
            &[&flaky, &good],
            "600ms",
            "retries = 0\nhedge_after = \"p90\"",
        );
        // No head times yet: no hedge, the stalled attempt times out (one time is learnt,
        // from the healthy answer).
        assert_eq!(statuses(&g, 2), [200, 504], "{ctx}");
        flaky.set_fault(None);
        for i in 0..17 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx} #{i}");
        }
        // 18 times, then 19: still fewer than MIN_SAMPLES, so a stall is still not hedged.
        flaky.set_fault(Some(Fault::Stall));
        assert_eq!(
            statuses(&g, 2),
            [200, 504],
            "{ctx}: hedged before enough head times"
        );
        assert_eq!(
            series(&g, "rolter_hedges_sent_total{route=\"r\"}"),
            0.0,
            "{ctx}: a hedge was sent before enough head times"
        );
        // The route learns the rest of its head times from healthy answers. A healthy answer
        // slower than the learnt p90 may itself be hedged (that is what p90 means), so what
        // follows is counted from here.
        flaky.set_fault(None);
        for i in 0..8 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx} #{i}");
        }
        let won_before = series(&g, "rolter_hedges_won_total{route=\"r\"}");
        // Now a stall is hedged after the learnt p90, well before the first_byte timeout.
        flaky.set_fault(Some(Fault::Stall));
        for i in 0..4 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.header("x-mock-engine"), Some("good"), "{ctx} #{i}");
        }
        wait_for("hedges won", SHORT, || {
            series(&g, "rolter_hedges_won_total{route=\"r\"}") >= won_before + 1.0
        });
    }
}

#[test]
fn a_route_that_answers_within_hedge_after_sends_no_hedge() {
    // Both engines healthy and fast: nothing is hedged, nothing aborted.
    for d in drivers() {
        let ctx = driver_name(d);
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = gw(d, &[&a, &b], "5s", "hedge_after = \"2s\"");
        for i in 0..4 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(i % 2 == 0)));
            assert_eq!(r.status, 200, "{ctx} #{i}");
        }
        assert_eq!((a.requests().len(), b.requests().len()), (2, 2), "{ctx}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(a.stats().aborted + b.stats().aborted, 0, "{ctx}");
        assert_eq!(
            series(&g, "rolter_hedges_sent_total{route=\"r\"}"),
            0.0,
            "{ctx}"
        );
    }
}
