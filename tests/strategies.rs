//! Strategies through the real gateway: where requests land when targets differ in load.

mod common;
use common::*;

/// Starts a streaming request, on its own connection, that the engine holds for `ms` before
/// its first token (under the harness's 1 s upstream idle timeout); returns its reader.
fn hold(addr: std::net::SocketAddr, ms: u64) -> std::thread::JoinHandle<Response> {
    std::thread::spawn(move || {
        let ms = ms.to_string();
        call(
            addr,
            &post(
                "/v1/chat/completions",
                &[("x-mock-ttft-ms", &ms)],
                &chat_body(true),
            ),
        )
    })
}

fn busy(mocks: &[&rolter_mock::MockHandle]) -> Vec<usize> {
    mocks
        .iter()
        .enumerate()
        .filter(|(_, m)| m.stats().running > 0)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn least_loaded_and_p2c_steer_around_a_busy_target() {
    for d in drivers() {
        for strategy in ["least_loaded", "p2c"] {
            let a = mock("a", |_| {});
            let b = mock("b", |_| {});
            let g = gateway_for(d, &[&a, &b], &format!("strategy = \"{strategy}\""));
            let long = hold(g.local_addr(), 800);
            wait_for("a held request", SHORT, || busy(&[&a, &b]).len() == 1);
            let held = busy(&[&a, &b])[0];
            let other = format!("t{}", 1 - held);
            for _ in 0..10 {
                let r = call(
                    g.local_addr(),
                    &post("/v1/completions", &[], r#"{"model":"m","prompt":"x"}"#),
                );
                assert_eq!(r.status, 200);
                assert_eq!(
                    r.header("x-rolter-target"),
                    Some(other.as_str()),
                    "{strategy} under {}: the idle target serves while t{held} is busy",
                    driver_name(d)
                );
            }
            assert_eq!(long.join().unwrap().status, 200);
        }
    }
}

#[test]
fn least_loaded_with_target_max_concurrent_answers_503_with_retry_after_when_all_are_full() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        // The cap is each target's `max_concurrent` (exact across workers).
        let mut rest = String::new();
        for (i, m) in [&a, &b].iter().enumerate() {
            rest.push_str(&target(
                &format!("t{i}"),
                m.addr(),
                "max_concurrent = 1\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"1s\"",
            ));
        }
        rest.push_str(
            "[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"least_loaded\"\n",
        );
        let g = gateway(d, &rest);
        let first = hold(g.local_addr(), 800);
        wait_for("first held", SHORT, || busy(&[&a, &b]).len() == 1);
        let second = hold(g.local_addr(), 800);
        wait_for("both held", SHORT, || busy(&[&a, &b]).len() == 2);
        let r = call(
            g.local_addr(),
            &post("/v1/completions", &[], r#"{"model":"m","prompt":"x"}"#),
        );
        assert_eq!(r.status, 503, "{}", driver_name(d));
        assert!(r.header("retry-after").is_some());
        assert_eq!(r.json()["error"]["code"], "no_available_target");
        assert_eq!(first.join().unwrap().status, 200);
        assert_eq!(second.join().unwrap().status, 200);
        // Once the targets are free again, requests are served.
        let r = call(
            g.local_addr(),
            &post("/v1/completions", &[], r#"{"model":"m","prompt":"x"}"#),
        );
        assert_eq!(r.status, 200);
    }
}

#[test]
fn random_weighted_follows_weights() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let mut rest = target("t0", a.addr(), "weight = 3.0");
        rest.push_str(&target("t1", b.addr(), "weight = 1.0"));
        rest.push_str("[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"random_weighted\"\n");
        let g = gateway(d, &rest);
        let mut c = Client::connect(g.local_addr());
        let mut on_a = 0;
        for _ in 0..400 {
            c.send(&post(
                "/v1/completions",
                &[],
                r#"{"model":"m","prompt":"x"}"#,
            ));
            let r = c.response().unwrap();
            if r.header("x-rolter-target") == Some("t0") {
                on_a += 1;
            }
        }
        // Expected 300 of 400; about 9 standard deviations of slack either way.
        assert!(
            (220..=380).contains(&on_a),
            "{on_a} of 400 on the weight-3 target"
        );
    }
}

/// `weight = 0` drains a target under every kind of strategy: none of its requests
/// reaches the drained engine, and a route left with only drained targets says so (and
/// makes `/readyz` answer 503).
#[test]
fn a_zero_weight_target_gets_no_traffic() {
    for d in drivers() {
        for strategy in [
            "round_robin",
            "random_weighted",
            "least_loaded",
            "consistent_hash",
        ] {
            let a = mock("a", |_| {});
            let b = mock("b", |_| {});
            let mut rest = target("t0", a.addr(), "");
            rest.push_str(&target("t1", b.addr(), "weight = 0"));
            rest.push_str(&format!(
                "[[routes]]\nname = \"drained\"\ntargets = [\"t1\"]\n\
                 [routes.match]\nheader = {{ name = \"x-route\", value = \"drained\" }}\n\
                 [[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"{strategy}\"\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n"
            ));
            let g = gateway(d, &rest);
            let mut c = Client::connect(g.local_addr());
            for i in 0..40 {
                let session = format!("s{i}");
                c.send(&post(
                    "/v1/completions",
                    &[("x-session-id", &session)],
                    r#"{"model":"m","prompt":"x"}"#,
                ));
                let r = c.response().unwrap();
                assert_eq!(
                    r.status,
                    200,
                    "[{}] {strategy}: {}",
                    driver_name(d),
                    r.text()
                );
                assert_eq!(
                    r.header("x-rolter-target"),
                    Some("t0"),
                    "[{}] {strategy}",
                    driver_name(d)
                );
            }
            assert_eq!(
                b.requests().len(),
                0,
                "[{}] {strategy}: the drained engine was used",
                driver_name(d)
            );
            assert_eq!(a.requests().len(), 40);
            // Only drained targets: a 503 that says why.
            let r = call(
                g.local_addr(),
                &post(
                    "/v1/completions",
                    &[("x-route", "drained")],
                    r#"{"model":"m","prompt":"x"}"#,
                ),
            );
            assert_eq!(
                r.status,
                503,
                "[{}] {strategy}: {}",
                driver_name(d),
                r.text()
            );
            assert!(r.text().contains("drained (weight = 0)"), "{}", r.text());
            // ... and the gateway is not ready while a route can serve nothing.
            let admin = g.admin_addr().expect("admin on");
            let ready = call(admin, &request("GET", "/readyz", &[], ""));
            assert_eq!(ready.status, 503, "[{}] {strategy}", driver_name(d));
        }
    }
}

#[test]
fn failover_keeps_traffic_on_the_primary_and_promotes_past_a_failing_one() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let mut rest = target("t0", a.addr(), "");
        rest.push_str(&target("t1", b.addr(), "tier = 1"));
        rest.push_str(
            "[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"active_passive\"\nretries = 1\n",
        );
        let g = gateway(d, &rest);
        let landed = || {
            let r = call(
                g.local_addr(),
                &post("/v1/completions", &[], r#"{"model":"m","prompt":"x"}"#),
            );
            assert_eq!(r.status, 200, "{}", driver_name(d));
            r.header("x-rolter-target").unwrap().to_string()
        };
        for _ in 0..5 {
            assert_eq!(landed(), "t0", "the primary takes all traffic");
        }
        assert_eq!(b.stats().requests, 0);
        // The primary fails: each request is promoted to the secondary tier.
        a.set_fault(Some(rolter_mock::Fault::Status(503)));
        for _ in 0..3 {
            assert_eq!(landed(), "t1");
        }
        // It recovers: traffic returns.
        a.set_fault(None);
        for _ in 0..3 {
            assert_eq!(landed(), "t0");
        }
    }
}

/// `x-rolter-explain: 1` names the route, the strategy, the winning score and any fallback;
/// without it only `x-rolter-target` is added.
#[test]
fn explain_header_says_why_a_target_was_chosen() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let mut rest = target("t0", a.addr(), "price = { input = 1.0, output = 2.0 }");
        rest.push_str(&target(
            "t1",
            b.addr(),
            "price = { input = 3.0, output = 4.0 }",
        ));
        rest.push_str(
            "[[routes]]\nname = \"cost\"\ntargets = [\"t0\", \"t1\"]\nstrategy = \"cheapest\"\n",
        );
        let g = gateway(d, &rest);
        let body = r#"{"model":"m","prompt":"x","max_tokens":10}"#;
        let r = call(
            g.local_addr(),
            &post("/v1/completions", &[("x-rolter-explain", "1")], body),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-rolter-target"), Some("t0"));
        assert_eq!(r.header("x-rolter-route"), Some("cost"));
        assert_eq!(r.header("x-rolter-strategy"), Some("cheapest"));
        assert_eq!(r.header("x-rolter-attempt"), Some("1"));
        let score: f64 = r.header("x-rolter-score").unwrap().parse().unwrap();
        assert!(score > 0.0, "the estimated cost is the score: {score}");
        assert!(r.header("x-rolter-fallback").is_none());
        let r = call(g.local_addr(), &post("/v1/completions", &[], body));
        assert_eq!(r.header("x-rolter-target"), Some("t0"));
        assert!(
            r.header("x-rolter-route").is_none(),
            "under {}",
            driver_name(d)
        );
        assert!(r.header("x-rolter-score").is_none());
    }
}
