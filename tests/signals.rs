//! The signal plane through the real gateway: the cross-core load view, passive ejection,
//! active health checks, the metrics scrape, outcome recording and the admin listener.

mod common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter_mock::{Fault, MockHandle};

/// A gateway with `workers` workers in front of `mocks` (targets t0, t1, …), one route with
/// `route_extra`, per-target extra lines, and extra top-level tables (`[admin]` is always on,
/// on a free port).
fn gateway_signals(
    d: rolter::config::DriverChoice,
    workers: usize,
    mocks: &[&MockHandle],
    target_extra: &[&str],
    route_extra: &str,
    tables: &str,
) -> rolter::Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        let name = format!("t{i}");
        let extra = target_extra.get(i).copied().unwrap_or("");
        rest.push_str(&target(
            &name,
            m.addr(),
            &format!(
                "{extra}\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"3s\"\nidle = \"3s\""
            ),
        ));
        names.push(format!("\"{name}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\n{route_extra}\n",
        names.join(", ")
    ));
    rest.push_str("\n[admin]\nlisten = \"127.0.0.1:0\"\n");
    rest.push_str(tables);
    gateway_with(d, workers, &rest)
}

fn admin_get(g: &rolter::Gateway, path: &str) -> rolter_mock::client::Response {
    call(
        g.admin_addr().expect("admin on"),
        &request("GET", path, &[], ""),
    )
}

fn targets_json(g: &rolter::Gateway) -> serde_json::Value {
    let r = admin_get(g, "/admin/targets");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn completion(addr: SocketAddr, headers: &[(&str, &str)]) -> rolter_mock::client::Response {
    call(
        addr,
        &post(
            "/v1/completions",
            headers,
            r#"{"model":"m","prompt":"x","max_tokens":4}"#,
        ),
    )
}

/// A streamed completion: what the learning strategies learn first-token times from.
fn streamed_completion(addr: SocketAddr) -> rolter_mock::client::Response {
    call(
        addr,
        &post(
            "/v1/completions",
            &[],
            r#"{"model":"m","prompt":"x","max_tokens":4,"stream":true}"#,
        ),
    )
}

/// Requests held by the engine for `ms`, each on its own connection (so SO_REUSEPORT spreads
/// them over the workers), started `gap` apart.
fn hold_many(
    addr: SocketAddr,
    n: usize,
    ms: u64,
    gap: Duration,
) -> Vec<std::thread::JoinHandle<rolter_mock::client::Response>> {
    (0..n)
        .map(|_| {
            let h = std::thread::spawn(move || {
                let ms = ms.to_string();
                completion(addr, &[("x-mock-ttft-ms", &ms)])
            });
            std::thread::sleep(gap);
            h
        })
        .collect()
}

/// With four workers, least_loaded balances held requests exactly, whichever core accepts
/// each connection: every core sees the others' in-flight counts within the signal tick.
/// With per-core counts only, two cores would each see an idle target and pile up.
#[test]
fn least_loaded_sees_every_cores_in_flight_requests() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = gateway_signals(d, 4, &[&a, &b], &[], "strategy = \"least_loaded\"", "");
        // 40 ms apart: far longer than the 2 ms exchange period.
        let held = hold_many(g.local_addr(), 8, 1500, Duration::from_millis(40));
        wait_for("eight held requests", SHORT, || {
            a.stats().running + b.stats().running == 8
        });
        assert_eq!(
            (a.stats().running, b.stats().running),
            (4, 4),
            "under {}: least_loaded with a shared view splits 8 held requests 4/4",
            driver_name(d)
        );
        // The control thread's merged view agrees.
        wait_for("admin in-flight totals", SHORT, || {
            let v = targets_json(&g);
            v["targets"][0]["load"]["in_flight"] == 4 && v["targets"][1]["load"]["in_flight"] == 4
        });
        for h in held {
            assert_eq!(h.join().unwrap().status, 200);
        }
    }
}

/// A target's `max_concurrent` counts requests on every core.
#[test]
fn max_concurrent_is_global_across_cores() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let g = gateway_signals(d, 4, &[&a], &["max_concurrent = 2"], "", "");
        let held = hold_many(g.local_addr(), 2, 1200, Duration::from_millis(40));
        wait_for("two held requests", SHORT, || a.stats().running == 2);
        std::thread::sleep(Duration::from_millis(20));
        // Several new connections, likely on other cores: all refused while two are held.
        for _ in 0..6 {
            let r = completion(g.local_addr(), &[]);
            assert_eq!(r.status, 503, "under {}: {}", driver_name(d), r.text());
            assert!(r.header("retry-after").is_some());
            assert_eq!(r.json()["error"]["code"], "no_available_target");
        }
        for h in held {
            assert_eq!(h.join().unwrap().status, 200);
        }
        assert_eq!(completion(g.local_addr(), &[]).status, 200);
    }
}

/// Consecutive 5xx eject a target; traffic goes elsewhere; the ejection shows in the admin
/// API and the metrics; after its ejection time the target returns.
#[test]
fn passive_ejection_takes_a_failing_target_out_and_brings_it_back() {
    for d in drivers() {
        let good = mock("good", |_| {});
        let bad = mock("bad", |_| {});
        bad.set_fault(Some(Fault::Status(500)));
        let g = gateway_signals(
            d,
            2,
            &[&good, &bad],
            &[],
            "strategy = \"round_robin\"\nretries = 0",
            "[health]\nactive = false\nfailures = 3\nejection_time = \"600ms\"\nmax_ejected_percent = 50\n",
        );
        let mut failed = 0;
        for _ in 0..12 {
            if completion(g.local_addr(), &[]).status == 500 {
                failed += 1;
            }
        }
        assert!(failed >= 3, "under {}: {failed}", driver_name(d));
        // The ejection reaches every core within a few signal ticks.
        wait_for("the ejection", SHORT, || {
            targets_json(&g)["targets"][1]["health"]["ejected"] == true
        });
        std::thread::sleep(Duration::from_millis(20));
        // Ejected now: everything lands on the good target.
        for _ in 0..10 {
            let r = completion(g.local_addr(), &[]);
            assert_eq!(r.status, 200);
            assert_eq!(r.header("x-rolter-target"), Some("t0"));
        }
        let v = targets_json(&g);
        assert_eq!(v["targets"][1]["health"]["ejected"], true, "{v}");
        assert_eq!(v["targets"][1]["eligible"], false);
        assert_eq!(
            admin_series(&g, "rolter_ejections_total{target=\"t1\"}"),
            Some(1.0)
        );
        // It returns after its ejection time (no active checks configured) and, healed,
        // serves again.
        bad.set_fault(None);
        wait_for(
            "the ejected target to return",
            Duration::from_secs(3),
            || targets_json(&g)["targets"][1]["eligible"] == true,
        );
        let landed: Vec<String> = (0..6)
            .map(|_| {
                completion(g.local_addr(), &[])
                    .header("x-rolter-target")
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert!(landed.iter().any(|t| t == "t1"), "{landed:?}");
    }
}

/// Active checks mark a target unhealthy without any request failing; failover promotes the
/// next tier and returns when the checks pass again.
#[test]
fn active_checks_drive_failover_promotion_and_return() {
    for d in drivers() {
        let primary = mock("primary", |_| {});
        let backup = mock("backup", |_| {});
        let g = gateway_signals(
            d,
            2,
            &[&primary, &backup],
            &["tier = 0", "tier = 1"],
            "strategy = \"failover\"",
            "[health]\ninterval = \"50ms\"\ntimeout = \"40ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n",
        );
        assert_eq!(
            completion(g.local_addr(), &[]).header("x-rolter-target"),
            Some("t0")
        );
        primary.set_fault(Some(Fault::Status(503)));
        wait_for("the primary to fail its checks", SHORT, || {
            targets_json(&g)["targets"][0]["health"]["healthy"] == false
        });
        // The control thread tells the workers on its next tick (2 ms); leave it room.
        std::thread::sleep(Duration::from_millis(50));
        // Health probes keep reaching the primary; only completions count here.
        let completions = |m: &MockHandle| {
            m.requests()
                .iter()
                .filter(|r| r.path == "/v1/completions")
                .count()
        };
        let served_before = completions(&primary);
        for _ in 0..5 {
            let r = completion(g.local_addr(), &[]);
            assert_eq!(r.status, 200, "under {}", driver_name(d));
            assert_eq!(r.header("x-rolter-target"), Some("t1"));
        }
        assert_eq!(
            completions(&primary),
            served_before,
            "no request was sent to the unhealthy primary"
        );
        primary.set_fault(None);
        wait_for("traffic to return to the primary", SHORT, || {
            completion(g.local_addr(), &[]).header("x-rolter-target") == Some("t0")
        });
        let r = admin_get(&g, "/readyz");
        assert_eq!(r.status, 200);
    }
}

/// With `[metrics_scrape]`, an engine's own waiting queue counts as load: least_loaded avoids
/// an engine whose queue is full of requests the gateway never saw.
#[test]
fn scraped_queue_depth_steers_least_loaded() {
    for d in drivers() {
        let a = mock("a", |c| c.max_running = 1);
        let b = mock("b", |_| {});
        let g = gateway_signals(
            d,
            2,
            &[&a, &b],
            &[],
            "strategy = \"least_loaded\"",
            // Timeouts with room for a loaded machine: a scrape that times out would leave
            // the queue unknown and the pick to in-flight counts alone.
            "[metrics_scrape]\ninterval = \"200ms\"\ntimeout = \"150ms\"\nstale_after = \"2s\"\n",
        );
        // Load engine `a` directly: one running, three waiting.
        let direct: Vec<_> = (0..4)
            .map(|_| {
                let addr = a.addr();
                std::thread::spawn(move || completion(addr, &[("x-mock-ttft-ms", "1200")]))
            })
            .collect();
        wait_for("a's queue", SHORT, || a.stats().waiting == 3);
        wait_for("the scrape to see it", SHORT, || {
            targets_json(&g)["targets"][0]["load"]["queue_depth"] == 3
        });
        let v = targets_json(&g);
        assert_eq!(v["targets"][0]["engine"]["scrape"], "fresh", "{v}");
        assert_eq!(v["targets"][0]["engine"]["kind"], "vllm");
        // The control thread publishes the queue to the workers on its next tick; on a
        // loaded machine a worker may take a moment to apply it.
        std::thread::sleep(std::time::Duration::from_millis(100));
        for _ in 0..6 {
            let r = completion(g.local_addr(), &[]);
            assert_eq!(
                r.header("x-rolter-target"),
                Some("t1"),
                "under {}: the engine with a queue is avoided (answer {}: {})",
                driver_name(d),
                r.status,
                r.text()
            );
        }
        assert_eq!(
            admin_series(&g, "rolter_target_queue_depth{target=\"t0\"}"),
            Some(3.0)
        );
        assert_eq!(
            admin_series(&g, "rolter_scrape_up{target=\"t0\"}"),
            Some(1.0)
        );
        for h in direct {
            assert_eq!(h.join().unwrap().status, 200);
        }
    }
}

/// A target whose scrape fails falls back to in-flight counts, visibly.
#[test]
fn a_failing_scrape_falls_back_visibly() {
    let a = mock("a", |_| {});
    let b = mock("b", |_| {});
    let g = gateway_signals(
        rolter::config::DriverChoice::Auto,
        1,
        &[&a, &b],
        &["metrics_path = \"/no-metrics-here\""],
        "strategy = \"least_loaded\"",
        "[metrics_scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"\nstale_after = \"200ms\"\n",
    );
    wait_for("a scrape failure and a good scrape", SHORT, || {
        admin_series(&g, "rolter_scrape_failures_total{target=\"t0\"}").unwrap_or(0.0) >= 1.0
            && targets_json(&g)["targets"][1]["engine"]["scrape"] == "fresh"
    });
    let v = targets_json(&g);
    assert_eq!(v["targets"][0]["engine"]["scrape"], "never", "{v}");
    assert!(v["targets"][0]["engine"]["scrape_error"]
        .as_str()
        .unwrap()
        .contains("404"));
    assert_eq!(v["targets"][1]["engine"]["scrape"], "fresh");
    assert_eq!(
        admin_series(&g, "rolter_scrape_up{target=\"t0\"}"),
        Some(0.0)
    );
    // Routing still works on in-flight counts.
    for _ in 0..4 {
        assert_eq!(completion(g.local_addr(), &[]).status, 200);
    }
}

/// Every attempt is recorded: status counts, TTFT samples of the streams, token usage from
/// the stream.
#[test]
fn outcomes_are_recorded_per_target() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let g = gateway_signals(d, 2, &[&a], &[], "", "");
        for _ in 0..5 {
            let r = call(
                g.local_addr(),
                &post("/v1/chat/completions", &[], &chat_body(true)),
            );
            assert_eq!(r.status, 200);
        }
        let r = call(
            g.local_addr(),
            &post(
                "/v1/chat/completions",
                &[("x-mock-status", "429")],
                &chat_body(false),
            ),
        );
        assert_eq!(r.status, 429);
        let r = completion(g.local_addr(), &[]);
        assert_eq!(r.status, 200);
        let r = call(
            g.local_addr(),
            &post("/v1/completions", &[], r#"{"model":"nope","prompt":"x"}"#),
        );
        assert_eq!(r.status, 404);
        // Each worker publishes its records on its own tick: wait for all of them.
        wait_for("the records to reach the control thread", SHORT, || {
            admin_series(
                &g,
                "rolter_requests_total{route=\"r\",target=\"t0\",code=\"200\"}",
            ) == Some(6.0)
                && admin_series(
                    &g,
                    "rolter_requests_total{route=\"r\",target=\"t0\",code=\"429\"}",
                ) == Some(1.0)
                && admin_series(
                    &g,
                    "rolter_gateway_responses_total{status=\"404\",code=\"model_not_found\"}",
                ) == Some(1.0)
        });
        assert_eq!(
            admin_series(
                &g,
                "rolter_requests_total{route=\"r\",target=\"t0\",code=\"429\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            admin_series(&g, "rolter_ttft_seconds_count{route=\"r\",target=\"t0\"}"),
            Some(5.0),
            "only successful streams have a TTFT sample (the plain completion has none)"
        );
        assert!(
            admin_series(&g, "rolter_tokens_total{target=\"t0\",kind=\"completion\"}")
                .unwrap_or(0.0)
                > 0.0,
            "usage from the stream's last event is counted"
        );
        assert_eq!(
            admin_series(
                &g,
                "rolter_gateway_responses_total{status=\"404\",code=\"model_not_found\"}"
            ),
            Some(1.0)
        );
        let v = targets_json(&g);
        assert_eq!(v["targets"][0]["ttft_samples"], 5, "the streams: {v}");
        assert!(v["targets"][0]["ttft_ewma_ms"].as_f64().unwrap() > 0.0);
    }
}

/// The admin listener: health and readiness, the token, POST-only mutations, the kill switch.
#[test]
fn admin_listener_guards_and_switches() {
    let a = mock("a", |_| {});
    let g = gateway_signals(
        rolter::config::DriverChoice::Auto,
        1,
        &[&a],
        &[],
        "",
        "token = \"s3cret\"\n",
    );
    let admin = g.admin_addr().unwrap();
    let auth = [("authorization", "Bearer s3cret")];
    assert_eq!(
        call(admin, &request("GET", "/healthz", &[], "")).status,
        200
    );
    assert_eq!(call(admin, &request("GET", "/readyz", &[], "")).status, 200);
    let r = call(admin, &request("GET", "/metrics", &[], ""));
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = call(
        admin,
        &request("GET", "/metrics", &[("authorization", "Bearer wrong")], ""),
    );
    assert_eq!(r.status, 401);
    let r = call(admin, &request("GET", "/metrics", &auth, ""));
    assert_eq!(r.status, 200);
    assert!(r.text().contains("# TYPE rolter_target_in_flight gauge"));
    assert!(r.text().contains("rolter_target_healthy{target=\"t0\"} 1"));
    assert!(r.text().contains("rolter_adaptive_enabled 1"));
    // Mutations are POST only.
    let r = call(admin, &request("GET", "/admin/adaptive", &auth, ""));
    assert_eq!(r.json()["enabled"], true);
    let r = call(
        admin,
        &request("PUT", "/admin/adaptive", &auth, "{\"enabled\":false}"),
    );
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, POST"));
    assert!(g.switches().adaptive());
    let r = call(
        admin,
        &request("POST", "/admin/adaptive", &auth, "{\"enabled\":false}"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!g.switches().adaptive(), "the switch flips at once");
    let r = call(admin, &request("GET", "/metrics", &auth, ""));
    assert!(r.text().contains("rolter_adaptive_enabled 0"));
    let r = call(
        admin,
        &request("POST", "/admin/adaptive", &auth, "{\"enabled\":\"no\"}"),
    );
    assert_eq!(r.status, 400);
    let r = call(
        admin,
        &request("POST", "/admin/adaptive?enabled=true", &auth, ""),
    );
    assert_eq!(r.status, 200);
    assert!(g.switches().adaptive());
    assert_eq!(call(admin, &request("GET", "/nope", &auth, "")).status, 404);
    assert_eq!(
        call(admin, &request("POST", "/metrics", &auth, "")).status,
        405
    );
    // The admin paths are not served on the data-plane listener.
    let r = call(g.local_addr(), &request("GET", "/admin/targets", &auth, ""));
    assert_eq!(r.status, 404);
}

/// `/admin/targets` shows what each route's strategy learned, from every core's samples.
#[test]
fn admin_shows_what_learning_strategies_learned() {
    let a = mock("a", |_| {});
    let b = mock("b", |_| {});
    let g = gateway_signals(
        rolter::config::DriverChoice::Auto,
        2,
        &[&a, &b],
        &[],
        "strategy = \"predicted_latency\"",
        "",
    );
    for _ in 0..20 {
        assert_eq!(streamed_completion(g.local_addr()).status, 200);
    }
    wait_for("twenty samples", SHORT, || {
        let v = targets_json(&g);
        let learned = &v["routes"][0]["learned"];
        learned["t0"]["samples"].as_f64().unwrap_or(0.0)
            + learned["t1"]["samples"].as_f64().unwrap_or(0.0)
            == 20.0
    });
    let v = targets_json(&g);
    assert_eq!(v["routes"][0]["strategy"], "predicted_latency");
    let learned = &v["routes"][0]["learned"];
    for t in ["t0", "t1"] {
        if learned[t]["samples"].as_f64().unwrap() >= 8.0 {
            assert!(learned[t]["base_ms"].is_number(), "{v}");
        }
    }
}
