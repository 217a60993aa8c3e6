//! The admin `/metrics` page as Prometheus's own tooling reads it, and the shipped Grafana
//! dashboard against it: a gateway with admin on serves successes, a stream, upstream
//! failures, the gateway's own errors and strategy fallbacks; then
//!
//! - `promtool check metrics` (from Prometheus's tools; `tests/run.sh` installs them where
//!   the distribution ships them) must find nothing to complain about — skipped, saying
//!   so, when promtool is not installed;
//! - every metric name an expression of `config/grafana-dashboard.json` uses must be one the
//!   page exports (histograms by their `_bucket`, `_sum` and `_count` series).
//!
//! Under both io drivers.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::MockHandle;

const DASHBOARD: &str = include_str!("../config/grafana-dashboard.json");

/// A port nothing listens on.
fn dead_port() -> u16 {
    refused_addr().port()
}

/// Two mock engines behind `t0` and `t1`; `t2` is named by host name (`localhost`) on a
/// dead port. Route `fast` (header `x-route: fast`) runs `fastest` over `t0` and `t1`, which
/// falls back while they are unmeasured; route `dead` (model `d`) goes to `t2` only; route
/// `r` takes the rest with round robin over `t0` and `t1`.
fn start(driver: DriverChoice) -> (Gateway, MockHandle, MockHandle) {
    let a = mock("a", |_| {});
    let b = mock("b", |_| {});
    let timeouts = "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"1s\"";
    let mut rest = target("t0", a.addr(), timeouts);
    rest.push_str(&target("t1", b.addr(), timeouts));
    rest.push_str(&format!(
        "[[targets]]\nname = \"t2\"\nurl = \"http://localhost:{}\"\nmodels = [\"d\"]\n{timeouts}\n",
        dead_port()
    ));
    rest.push_str(
        "[[routes]]\nname = \"fast\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"fastest\"\n\
         [routes.match]\nheader = { name = \"x-route\", value = \"fast\" }\n\
         [[routes]]\nname = \"dead\"\ntargets = [\"t2\"]\nretries = 0\n\
         [routes.match]\nmodels = [\"d\"]\n\
         [[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"round_robin\"\nqueue_max = 4\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
    );
    (gateway(driver, &rest), a, b)
}

fn chat(addr: SocketAddr, headers: &[(&str, &str)], body: &str) -> rolter_mock::client::Response {
    call(addr, &post("/v1/chat/completions", headers, body))
}

/// Traffic of every kind the page describes, then the page once every attempt is in it.
/// Series the traffic must have produced, so a quiet page cannot pass.
const REQUIRED: [&str; 6] = [
    "rolter_requests_total{route=\"dead\",target=\"t2\",code=\"none\"}",
    "rolter_strategy_fallbacks_total{route=\"fast\",strategy=\"fastest\",reason=\"cold\"}",
    "rolter_gateway_responses_total{status=\"413\",code=\"body_too_large\"}",
    "rolter_dns_resolutions_total{target=\"t2\",result=\"failed\"}",
    "rolter_build_info{",
    "rolter_queue_depth{route=\"r\"}",
];

fn traffic_then_metrics(g: &Gateway) -> String {
    let addr = g.local_addr();
    for _ in 0..4 {
        assert_eq!(chat(addr, &[], &chat_body(false)).status, 200);
    }
    let stream = chat(addr, &[], &chat_body(true));
    assert_eq!(stream.status, 200);
    assert!(stream.text().contains("data: [DONE]"), "{}", stream.text());
    for _ in 0..2 {
        let r = chat(addr, &[("x-route", "fast")], &chat_body(false));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // No target reachable: an upstream failure (no response).
    let dead = chat_body(false).replace(r#""model":"m""#, r#""model":"d""#);
    let r = chat(addr, &[], &dead);
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    // The gateway's own errors: an unknown model, and a body over the limit.
    let unknown = chat_body(false).replace(r#""model":"m""#, r#""model":"nope""#);
    assert_eq!(chat(addr, &[], &unknown).status, 404);
    // Only the head: the 413 comes before any body byte.
    let big = "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-length: 2000000\r\n\r\n";
    assert_eq!(call(addr, big).status, 413);

    let admin = g.admin_addr().expect("admin on");
    let mut text = String::new();
    wait_for("every attempt on /metrics", SHORT, || {
        text = call(admin, &request("GET", "/metrics", &[], "")).text();
        let attempts: f64 = text
            .lines()
            .filter(|l| l.starts_with("rolter_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        // Records reach the control thread on the workers' next tick: wait for all of them.
        attempts >= 8.0 && REQUIRED.iter().all(|s| text.contains(s))
    });
    text
}

/// The sample names on the page (`name{…} value` and `name value` lines).
fn exported(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Every metric name the dashboard's queries use: the `expr` of each panel target (rows'
/// nested panels included) and the template variables' queries. A name is a word
/// beginning with `rolter_` or `process_`, the prefixes of what the gateway exports.
fn dashboard_metrics() -> BTreeSet<String> {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    fn panels(list: &serde_json::Value, queries: &mut Vec<String>) {
        for p in list.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    queries.push(e.to_string());
                }
            }
            panels(&p["panels"], queries);
        }
    }
    panels(&d["panels"], &mut queries);
    assert!(queries.len() >= 10, "the dashboard has only {queries:?}");
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        match &v["query"] {
            serde_json::Value::String(q) => queries.push(q.clone()),
            q => {
                if let Some(q) = q["query"].as_str() {
                    queries.push(q.to_string());
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    for q in &queries {
        let words = q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        for w in words {
            if w.starts_with("rolter_") || w.starts_with("process_") {
                names.insert(w.to_string());
            }
        }
    }
    names
}

#[test]
fn promtool_finds_nothing_wrong_and_the_dashboard_uses_only_exported_series() {
    let promtool = Command::new("promtool").arg("--version").output().is_ok();
    if !promtool {
        eprintln!(
            "promtool is not installed (Debian/Ubuntu package `prometheus`; tests/run.sh \
             installs it): skipping `promtool check metrics`, checking the dashboard only"
        );
    }
    let wanted = dashboard_metrics();
    for want in [
        "rolter_requests_total",
        "rolter_ttft_seconds_bucket",
        "rolter_request_duration_seconds_bucket",
        "rolter_target_in_flight",
        "rolter_ejections_total",
        "rolter_strategy_fallbacks_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(
            wanted.contains(want),
            "the dashboard has no {want}: {wanted:?}"
        );
    }
    for d in drivers() {
        let (g, _a, _b) = start(d);
        let page = traffic_then_metrics(&g);
        let name = driver_name(d);

        let have = exported(&page);
        let missing: Vec<&String> = wanted.iter().filter(|n| !have.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "[{name}] the dashboard uses series /metrics does not export: {missing:?}\n{page}"
        );
        // What this test relies on being there, so a quiet page cannot pass.
        for series in REQUIRED {
            assert!(page.contains(series), "[{name}] no {series}\n{page}");
        }

        if promtool {
            let (ok, said) = promtool_check(&page).expect("promtool runs");
            assert!(
                ok && said.trim().is_empty(),
                "[{name}] promtool check metrics: {said}\n{page}"
            );
        }
    }
}
