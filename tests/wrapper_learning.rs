//! The wrapper strategies (`failover`, `adaptive`, `fair_catchup`) through the real gateway
//! with two workers: their inner `cache_aware` learns the prefixes and sessions this core
//! routes and shares them with the other core, exactly as it does on its own, so a shared
//! prompt prefix or a session lands on the same target whichever worker serves it.

mod common;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;

/// Longer than one exchange period, so what one core learned reaches the other.
const SETTLE: Duration = Duration::from_millis(15);

/// One chat request on a new connection (so SO_REUSEPORT spreads them over the workers),
/// explained: (target, worker, fallback).
fn chat(
    addr: SocketAddr,
    session: Option<&str>,
    system: &str,
    question: &str,
) -> (String, String, Option<String>) {
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    })
    .to_string();
    let mut headers = vec![("x-rolter-explain", "1")];
    if let Some(s) = session {
        headers.push(("x-session-id", s));
    }
    let r = call(addr, &post("/v1/chat/completions", &headers, &body));
    assert_eq!(r.status, 200, "{}", r.text());
    (
        r.header("x-rolter-target").unwrap().to_string(),
        r.header("x-rolter-worker").unwrap().to_string(),
        r.header("x-rolter-fallback").map(str::to_string),
    )
}

/// Two workers in front of three mocks, one route with `strategy` (TOML for the route's
/// strategy table) and `extra` top-level tables.
fn fleet(
    d: rolter::config::DriverChoice,
    strategy: &str,
    extra: &str,
) -> (rolter::Gateway, Vec<rolter_mock::MockHandle>) {
    let mocks: Vec<_> = (0..3).map(|i| mock(&format!("m{i}"), |_| {})).collect();
    let mut rest = extra.to_string();
    for (i, m) in mocks.iter().enumerate() {
        rest.push_str(&target(&format!("t{i}"), m.addr(), ""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\", \"t2\"]\n[routes.strategy]\n{strategy}\n"
    ));
    (gateway_with(d, 2, &rest), mocks)
}

/// A small index, so one 4 KB prompt makes a target measurably warmer than the others.
const INNER: &str = "{ name = \"cache_aware\", max_bytes_per_target = 65536 }";

/// What the inner `cache_aware` learned on one core is used on both: the first request of
/// a prefix picks a target, every later one of that prefix follows it on either worker,
/// and so does a session. `wrapper` names how the inner strategy is wrapped.
fn learns_across_cores(wrapper: &str, strategy: &str, extra: &str, fallback: Option<&str>) {
    for d in drivers() {
        let (g, _mocks) = fleet(d, strategy, extra);
        let addr = g.local_addr();
        let system = "A".repeat(4000);
        let (warm, first_worker, why) = chat(addr, None, &system, "first");
        assert_eq!(why.as_deref(), fallback, "{wrapper}: who picked");
        std::thread::sleep(SETTLE);
        let mut workers = HashSet::new();
        for i in 0..24 {
            let (t, w, _) = chat(addr, None, &system, &format!("question {i}"));
            assert_eq!(
                t,
                warm,
                "{wrapper} under {}: request {i} of a warm prefix on worker {w}",
                driver_name(d)
            );
            workers.insert(w);
        }
        assert!(
            workers.iter().any(|w| *w != first_worker),
            "{wrapper}: the other worker served some of them too: {workers:?}"
        );
        // A session: its first request (an unrelated prompt) picks a target; later ones
        // with other prompts follow it on either worker.
        let (pinned, _, _) = chat(addr, Some("user-7"), &"S".repeat(3000), "hello");
        std::thread::sleep(SETTLE);
        let mut workers = HashSet::new();
        for i in 0..16 {
            let other = format!("{}{i}", "Z".repeat(2000));
            let (t, w, _) = chat(addr, Some("user-7"), &other, "next");
            assert_eq!(
                t,
                pinned,
                "{wrapper} under {}: session request {i} on worker {w}",
                driver_name(d)
            );
            workers.insert(w);
        }
        assert_eq!(
            workers.len(),
            2,
            "{wrapper}: both workers served the session"
        );
    }
}

#[test]
fn failover_within_cache_aware_learns_across_cores() {
    learns_across_cores(
        "failover",
        &format!("name = \"failover\"\nwithin_tier = {INNER}"),
        "",
        None,
    );
}

#[test]
fn adaptive_with_a_cache_aware_fallback_learns_across_cores() {
    // The kill switch off: the fallback strategy picks every request.
    learns_across_cores(
        "adaptive",
        &format!("name = \"adaptive\"\nw_cost = 0\nfallback_strategy = {INNER}"),
        "[adaptive]\nenabled = false\n",
        Some("kill_switch"),
    );
}

#[test]
fn fair_catchup_over_cache_aware_learns_across_cores() {
    // A catch-up share so small that no deficit is repaid within the test's few picks:
    // the base strategy decides every one.
    learns_across_cores(
        "fair_catchup",
        &format!("name = \"fair_catchup\"\nmax_catchup_share = 0.01\nbase_strategy = {INNER}"),
        "",
        None,
    );
}
