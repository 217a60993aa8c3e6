//! OpenTelemetry traces (`[tracing]`) through a real gateway, under both drivers, checked
//! with a real OTLP receiver (tests/py/otlp_receiver.py, on `opentelemetry-proto`):
//! - a request retried after a 503 is one trace: the gateway's server span under the
//!   client's `traceparent`, one client span per attempt under it (target, status, the
//!   retry's reason), the routing decisions as events; each engine got the `traceparent`
//!   of its own attempt's span;
//! - sampling follows the parent: with `sample = 0`, a client's sampled trace is
//!   exported, an unsampled one is not (its engine still gets the trace, unsampled), and a
//!   trace the gateway starts is not;
//! - a collector that never answers drops spans (counted on `/metrics`) and every request
//!   is still served.

mod common;

use common::otlp::Receiver;
use common::process::free_port;
use common::*;
use rolter_mock::{Fault, MockHandle};
use serde_json::Value;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn traceparent(trace: &str, flags: &str) -> String {
    format!("00-{trace}-{PARENT}-{flags}")
}

fn chat(g: &rolter::Gateway, headers: &[(&str, &str)]) -> u16 {
    call(
        g.local_addr(),
        &post("/v1/chat/completions", headers, &chat_body(false)),
    )
    .status
}

/// The `traceparent` each request to `m` carried.
fn seen(m: &MockHandle) -> Vec<String> {
    m.requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.header("traceparent").unwrap_or("").to_string())
        .collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

#[test]
fn a_retried_request_is_one_trace_with_a_span_per_attempt() {
    for d in drivers() {
        let ctx = driver_name(d);
        let rx = Receiver::start(&format!("retry-{ctx}"), false);
        let (a, b) = (mock("a", |_| {}), mock("b", |_| {}));
        a.set_fault(Some(Fault::Status(503)));
        let rest = format!(
            "{}{}{}[[routes]]\nname = \"r\"\ntargets = [\"a\", \"b\"]\nstrategy = \"failover\"\nretries = 1\nretry_budget_min = 100\n",
            rx.section("sample = 1.0"),
            target("a", a.addr(), "health_path = \"\""),
            target("b", b.addr(), "tier = 1"),
        );
        let g = gateway(d, &rest);
        assert_eq!(
            chat(&g, &[("traceparent", &traceparent(TRACE, "01"))]),
            200,
            "{ctx}"
        );
        let spans = rx.trace(TRACE, 3);
        assert_eq!(spans.len(), 3, "{ctx}: {spans:#?}");
        let server: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 2).collect();
        assert_eq!(server.len(), 1, "{ctx}: one server span: {spans:#?}");
        let server = server[0];
        assert_eq!(
            server["parent_span_id"], PARENT,
            "{ctx}: under the client's span"
        );
        assert_eq!(server["name"], "POST /v1/chat/completions", "{ctx}");
        assert_eq!(attr(server, "http.response.status_code"), 200, "{ctx}");
        assert_eq!(attr(server, "rolter.route"), "r", "{ctx}");
        assert_eq!(attr(server, "rolter.attempts"), 2, "{ctx}");
        let routed: Vec<&Value> = server["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "routed")
            .collect();
        assert_eq!(
            routed.len(),
            2,
            "{ctx}: a routing event per attempt: {server:#?}"
        );
        assert_eq!(routed[0]["attributes"]["rolter.target"], "a", "{ctx}");
        assert_eq!(
            routed[1]["attributes"]["rolter.strategy"], "failover",
            "{ctx}"
        );
        let mut attempts: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 3).collect();
        attempts.sort_by_key(|s| s["attributes"]["rolter.attempt"].as_i64());
        assert_eq!(attempts.len(), 2, "{ctx}");
        for s in &attempts {
            assert_eq!(
                s["parent_span_id"], server["span_id"],
                "{ctx}: under the request"
            );
        }
        let (first, second) = (attempts[0], attempts[1]);
        assert_eq!(attr(first, "rolter.target"), "a", "{ctx}");
        assert_eq!(attr(first, "http.response.status_code"), 503, "{ctx}");
        assert_eq!(
            first["status"]["code"], 2,
            "{ctx}: the failed attempt is an error"
        );
        assert_eq!(attr(second, "rolter.target"), "b", "{ctx}");
        assert_eq!(attr(second, "http.response.status_code"), 200, "{ctx}");
        assert!(
            attr(second, "rolter.retry_reason") == "503",
            "{ctx}: the retry says why: {second:#?}"
        );
        // Each engine's traceparent names its own attempt's span, sampled.
        let first_id = first["span_id"].as_str().unwrap();
        let second_id = second["span_id"].as_str().unwrap();
        assert_eq!(seen(&a), [format!("00-{TRACE}-{first_id}-01")], "{ctx}");
        assert_eq!(seen(&b), [format!("00-{TRACE}-{second_id}-01")], "{ctx}");
    }
}

#[test]
fn sampling_follows_the_clients_trace() {
    for d in drivers() {
        let ctx = driver_name(d);
        let rx = Receiver::start(&format!("parent-{ctx}"), false);
        let m = mock("m", |_| {});
        let rest = format!(
            "{}{}[[routes]]\nname = \"r\"\ntargets = [\"m\"]\n",
            rx.section("sample = 0.0\nparent_based = true"),
            target("m", m.addr(), ""),
        );
        let g = gateway(d, &rest);
        let unsampled = "11111111111111111111111111111111";
        assert_eq!(
            chat(&g, &[("traceparent", &traceparent(unsampled, "00"))]),
            200
        );
        assert_eq!(chat(&g, &[]), 200, "{ctx}");
        // Last: the client's sampled trace, exported although the ratio is 0.
        assert_eq!(chat(&g, &[("traceparent", &traceparent(TRACE, "01"))]), 200);
        let spans = rx.trace(TRACE, 2);
        assert_eq!(
            spans.len(),
            2,
            "{ctx}: the sampled request's spans: {spans:#?}"
        );
        // Spans leave in order: nothing of the two traces before it was exported.
        let all = rx.spans();
        assert!(
            all.iter().all(|s| s["trace_id"] == TRACE),
            "{ctx}: {all:#?}"
        );
        let tp = seen(&m);
        assert_eq!(tp.len(), 3, "{ctx}");
        assert!(
            tp[0].starts_with(&format!("00-{unsampled}-")) && tp[0].ends_with("-00"),
            "{ctx}: the unsampled trace goes on, unsampled: {tp:?}"
        );
        assert!(
            tp[0].split('-').nth(2) != Some(PARENT),
            "{ctx}: under the gateway's span"
        );
        assert!(
            tp[1].ends_with("-00") && !tp[1].contains(unsampled) && !tp[1].contains(TRACE),
            "{ctx}: a trace the gateway started, unsampled at ratio 0: {tp:?}"
        );
        assert!(
            tp[2].starts_with(&format!("00-{TRACE}-")) && tp[2].ends_with("-01"),
            "{tp:?}"
        );
    }
}

/// The routing decision's event carries what the strategy said: its name, the target and
/// its score, the same the `x-rolter-explain` headers show.
#[test]
fn the_routing_event_carries_the_strategys_score() {
    for d in drivers() {
        let ctx = driver_name(d);
        let rx = Receiver::start(&format!("score-{ctx}"), false);
        let (a, b) = (mock("a", |_| {}), mock("b", |_| {}));
        let rest = format!(
            "{}{}{}[[routes]]\nname = \"r\"\ntargets = [\"a\", \"b\"]\nstrategy = \"cache_aware\"\n",
            rx.section(""),
            target("a", a.addr(), ""),
            target("b", b.addr(), ""),
        );
        let g = gateway(d, &rest);
        let tp = traceparent(TRACE, "01");
        let headers = [("traceparent", tp.as_str()), ("x-rolter-explain", "1")];
        let r = call(
            g.local_addr(),
            &post("/v1/chat/completions", &headers, &chat_body(false)),
        );
        assert_eq!(r.status, 200, "{ctx}");
        let score: f64 = r
            .header("x-rolter-score")
            .and_then(|s| s.parse().ok())
            .expect("cache_aware scores its pick");
        let spans = rx.trace(TRACE, 2);
        let server = spans
            .iter()
            .find(|s| s["kind"] == 2)
            .expect("a server span");
        let routed = &server["events"][0];
        assert_eq!(routed["name"], "routed", "{ctx}: {server:#?}");
        let attrs = &routed["attributes"];
        assert_eq!(attrs["rolter.strategy"], "cache_aware", "{ctx}");
        assert_eq!(
            attrs["rolter.target"],
            r.header("x-rolter-target").unwrap(),
            "{ctx}"
        );
        let traced = attrs["rolter.score"]
            .as_f64()
            .expect("the score, as a number");
        assert!(
            (traced - score).abs() < 1e-6,
            "{ctx}: {traced} against {score}"
        );
    }
}

#[test]
fn a_stalled_collector_drops_spans_and_every_request_is_served() {
    for d in drivers() {
        let ctx = driver_name(d);
        let rx = Receiver::start(&format!("stall-{ctx}"), true);
        let m = mock("m", |_| {});
        let admin = free_port();
        let rest = format!(
            "[admin]\nlisten = \"127.0.0.1:{admin}\"\n{}{}[[routes]]\nname = \"r\"\ntargets = [\"m\"]\n",
            rx.section("queue = 8\ntimeout = \"300ms\""),
            target("m", m.addr(), ""),
        );
        let g = gateway(d, &rest);
        for i in 0..200 {
            assert_eq!(chat(&g, &[]), 200, "{ctx}: request {i}");
        }
        let dropped = admin_series(&g, "rolter_trace_spans_dropped_total").unwrap_or(0.0);
        assert!(
            dropped > 0.0,
            "{ctx}: spans beyond the queue are dropped ({dropped})"
        );
        assert_eq!(
            admin_series(&g, "rolter_trace_spans_exported_total"),
            Some(0.0),
            "{ctx}"
        );
        assert!(rx.spans().is_empty(), "{ctx}");
    }
}
