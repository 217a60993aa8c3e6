//! Session and prefix routing through the real gateway with several workers: whichever core
//! accepts a connection, a session or a shared prompt prefix lands on the same target.

mod common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;

/// Four workers in front of `n` mocks, one route with `strategy_line`.
fn fleet(
    d: rolter::config::DriverChoice,
    n: usize,
    strategy_line: &str,
) -> (rolter::Gateway, Vec<rolter_mock::MockHandle>) {
    let mocks: Vec<_> = (0..n).map(|i| mock(&format!("m{i}"), |_| {})).collect();
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        rest.push_str(&target(&format!("t{i}"), m.addr(), ""));
        names.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\n{strategy_line}\n",
        names.join(", ")
    ));
    (gateway_with(d, 4, &rest), mocks)
}

/// One chat request on a new connection (so SO_REUSEPORT spreads them over the workers);
/// returns the serving target.
fn chat(addr: SocketAddr, headers: &[(&str, &str)], system: &str, question: &str) -> String {
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    })
    .to_string();
    let r = call(addr, &post("/v1/chat/completions", headers, &body));
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-rolter-target").unwrap().to_string()
}

/// Longer than one exchange period, so what one core learned reaches the others.
const SETTLE: Duration = Duration::from_millis(15);

#[test]
fn consistent_hash_keeps_each_session_on_one_target_across_cores() {
    for d in drivers() {
        let (g, _mocks) = fleet(d, 4, "strategy = \"consistent_hash\"");
        let mut owners = std::collections::HashMap::new();
        let mut spread = std::collections::HashSet::new();
        for round in 0..3 {
            for s in 0..16 {
                let session = format!("user-{s}");
                let t = chat(
                    g.local_addr(),
                    &[("x-session-id", &session)],
                    "You are terse.",
                    &format!("question {round}"),
                );
                spread.insert(t.clone());
                let owner = owners.entry(session.clone()).or_insert_with(|| t.clone());
                assert_eq!(
                    *owner,
                    t,
                    "under {}: session {session} moved",
                    driver_name(d)
                );
            }
        }
        assert!(
            spread.len() >= 3,
            "16 sessions use most of 4 targets: {spread:?}"
        );
    }
}

#[test]
fn cache_aware_sends_a_shared_prefix_to_the_same_target_on_every_core() {
    for d in drivers() {
        // A small index, so one 4 KB prompt makes a target measurably warmer than the
        // others (targets within 1/64 of the bound count as equally warm).
        let (g, _mocks) = fleet(
            d,
            3,
            "[routes.strategy]\nname = \"cache_aware\"\nmax_bytes_per_target = 65536\n",
        );
        let system_a = "A".repeat(4000);
        let system_b = "B".repeat(4000);
        let first_a = chat(g.local_addr(), &[], &system_a, "first");
        std::thread::sleep(SETTLE);
        let first_b = chat(g.local_addr(), &[], &system_b, "first");
        assert_ne!(
            first_a, first_b,
            "a new prefix goes to a less-warmed target"
        );
        std::thread::sleep(SETTLE);
        for i in 0..12 {
            let (system, expected) = if i % 2 == 0 {
                (&system_a, &first_a)
            } else {
                (&system_b, &first_b)
            };
            let t = chat(g.local_addr(), &[], system, &format!("q{i}"));
            assert_eq!(&t, expected, "under {}: request {i}", driver_name(d));
        }
    }
}

#[test]
fn pipeline_pins_a_session_across_cores() {
    for d in drivers() {
        let (g, _mocks) = fleet(
            d,
            3,
            "[routes.strategy]\nname = \"pipeline\"\nw_load = 1.0\nw_prefix = 0.0\n",
        );
        let first = chat(g.local_addr(), &[("x-session-id", "s-1")], "sys", "q0");
        std::thread::sleep(SETTLE);
        for i in 1..10 {
            let t = chat(
                g.local_addr(),
                &[("x-session-id", "s-1")],
                "sys",
                &format!("q{i}"),
            );
            assert_eq!(t, first, "under {}: request {i}", driver_name(d));
        }
    }
}
