//! The price-, latency- and history-driven strategies through the real gateway: mock engines
//! of different speeds and prices behind real sockets, and where the requests land.
//!
//! Every check is on placement (the `x-rolter-target` header, the engines' own counters and
//! the admin API), never on how fast anything was. Requests whose placement depends on the
//! load view are sent one after the other on one keep-alive connection: the gateway drops a
//! request's in-flight count before it reads the next request of that connection, so the
//! next pick sees exact loads. Requests held to create load are sent on connections of their
//! own and abandoned (the client closes), which the gateway records as "client gone": such an
//! attempt neither teaches the learning strategies nor counts against the target's health.

mod common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter::config::DriverChoice;
use rolter_mock::MockHandle;

/// A gateway with `workers` workers in front of `mocks` (targets t0, t1, …, each with its
/// `target_extra` lines), the given `[[routes]]` text, an `[admin]` listener on a free port
/// and extra top-level `tables`.
fn gateway_admin(
    d: DriverChoice,
    workers: usize,
    mocks: &[&MockHandle],
    target_extra: &[&str],
    routes: &str,
    tables: &str,
) -> rolter::Gateway {
    let mut rest = String::new();
    for (i, m) in mocks.iter().enumerate() {
        let extra = target_extra.get(i).copied().unwrap_or("");
        rest.push_str(&target(
            &format!("t{i}"),
            m.addr(),
            &format!(
                "{extra}\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"3s\"\nidle = \"3s\""
            ),
        ));
    }
    rest.push_str(routes);
    rest.push_str("\n[admin]\nlisten = \"127.0.0.1:0\"\n");
    rest.push_str(tables);
    gateway_with(d, workers, &rest)
}

/// A `[[routes]]` entry named `name` over targets t0..t{n-1} with `extra` lines.
fn route(name: &str, n: usize, extra: &str) -> String {
    let targets: Vec<String> = (0..n).map(|i| format!("\"t{i}\"")).collect();
    format!(
        "[[routes]]\nname = \"{name}\"\ntargets = [{}]\n{extra}\n",
        targets.join(", ")
    )
}

fn admin_call(g: &rolter::Gateway, method: &str, path: &str, body: &str) -> Response {
    call(
        g.admin_addr().expect("admin on"),
        &request(method, path, &[], body),
    )
}

/// The control thread's view of target `i`'s requests in flight (summed over every core).
fn in_flight(g: &rolter::Gateway, i: usize) -> u64 {
    let r = admin_call(g, "GET", "/admin/targets", "");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["targets"][i]["load"]["in_flight"]
        .as_u64()
        .expect("in_flight")
}

fn fallbacks(g: &rolter::Gateway, strategy: &str, reason: &str) -> f64 {
    admin_series(
        g,
        &format!(
            "rolter_strategy_fallbacks_total{{route=\"r\",strategy=\"{strategy}\",reason=\"{reason}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

/// Prompt tokens the gateway estimates for a completions prompt of `chars` ASCII letters:
/// the JSON value's bytes, quotes included, four to a token.
fn prompt_tokens(chars: usize) -> u32 {
    (chars + 2).div_ceil(4) as u32
}

/// A streamed completions body for model "m" with a prompt of `chars` letters (the
/// learning strategies learn first-token times from streams).
fn completion(chars: usize, max_tokens: Option<u64>) -> String {
    let prompt = "x".repeat(chars);
    match max_tokens {
        Some(n) => {
            format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":{n},"stream":true}}"#)
        }
        None => format!(r#"{{"model":"m","prompt":"{prompt}","stream":true}}"#),
    }
}

/// The target that served a successful response.
fn landed(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.header("x-rolter-target")
        .expect("x-rolter-target")
        .to_string()
}

/// One request on a fresh connection; the target that served it.
fn once(addr: SocketAddr, headers: &[(&str, &str)], body: &str) -> String {
    landed(&call(addr, &post("/v1/completions", headers, body)))
}

/// One request on an open keep-alive connection; the target that served it.
fn next(c: &mut Client, headers: &[(&str, &str)], body: &str) -> String {
    c.send(&post("/v1/completions", headers, body));
    landed(&c.response().expect("response"))
}

/// Sends a request the engine holds for 2.5 s (under the 3 s first-byte timeout) and leaves
/// it in flight; dropping the returned client abandons it.
fn hold(addr: SocketAddr, headers: &[(&str, &str)]) -> Client {
    let mut h = vec![("x-mock-ttft-ms", "2500")];
    h.extend_from_slice(headers);
    let mut c = Client::connect(addr);
    c.send(&post("/v1/completions", &h, &completion(8, Some(4))));
    c
}

/// The index of the one mock that is running a request.
fn running_one(mocks: &[&MockHandle]) -> usize {
    wait_for("one held request", SHORT, || {
        mocks.iter().map(|m| m.stats().running).sum::<u64>() == 1
    });
    mocks.iter().position(|m| m.stats().running == 1).unwrap()
}

/// Well over the 2 ms period at which cores exchange load snapshots and samples.
fn settle() {
    std::thread::sleep(Duration::from_millis(30));
}

/// `fastest` with `min_samples = 2` over a slow (80 ms TTFT) and a fast (5 ms) engine, two
/// workers. Proves: while a target is cold it is picked first (exactly two requests each,
/// all four counted as `cold` fallbacks), so the slow engine gets measured; once both are
/// warm and the samples have reached the other core, every request on every connection goes
/// to the engine with the lower measured TTFT. Round-robin would send half to the slow one.
#[test]
fn fastest_measures_both_then_sends_everything_to_the_fast_engine() {
    for d in drivers() {
        let slow = mock("slow", |c| c.ttft = Duration::from_millis(80));
        let fast = mock("fast", |c| c.ttft = Duration::from_millis(5));
        let g = gateway_admin(
            d,
            2,
            &[&slow, &fast],
            &[],
            &route("r", 2, "strategy = { name = \"fastest\", min_samples = 2 }"),
            "",
        );
        let body = completion(16, Some(4));
        let mut c = Client::connect(g.local_addr());
        for _ in 0..4 {
            next(&mut c, &[], &body);
        }
        assert_eq!(
            (slow.stats().requests, fast.stats().requests),
            (2, 2),
            "under {}: each cold target is measured min_samples times first",
            driver_name(d)
        );
        wait_for("the cold picks to be counted", SHORT, || {
            fallbacks(&g, "fastest", "cold") == 4.0
        });
        settle();
        // New connections, spread over both cores by the kernel.
        for i in 0..20 {
            assert_eq!(
                once(g.local_addr(), &[], &body),
                "t1",
                "under {}: request {i} after warm-up",
                driver_name(d)
            );
        }
        assert_eq!(slow.stats().requests, 2, "the slow engine got no more");
        assert_eq!(fallbacks(&g, "fastest", "cold"), 4.0);
    }
}

/// `cheapest` over three priced targets, two workers, 1000-token prompts.
/// t0 { 5, 20 } is dearest for everything; t1 { 1, 10 } has the cheap input; t2 { 5, 2 } the
/// cheap output. Costs per request are 1000 × input + max_tokens × output, so t1 wins while
/// max_tokens < 500 and t2 above it. Proves: the cheapest target takes every request (also
/// with the default expected output, and also while it is the busier one), and the choice
/// flips exactly where the input/output prices cross. Round-robin would spread over all three.
#[test]
fn cheapest_follows_the_estimated_cost_and_flips_where_prices_cross() {
    for d in drivers() {
        let m0 = mock("dear", |_| {});
        let m1 = mock("cheap-input", |_| {});
        let m2 = mock("cheap-output", |_| {});
        let g = gateway_admin(
            d,
            2,
            &[&m0, &m1, &m2],
            &[
                "price = { input = 5.0, output = 20.0 }",
                "price = { input = 1.0, output = 10.0 }",
                "price = { input = 5.0, output = 2.0 }",
            ],
            &route("r", 3, "strategy = \"cheapest\""),
            "",
        );
        const PROMPT: usize = 3998;
        assert_eq!(prompt_tokens(PROMPT), 1000);
        let addr = g.local_addr();
        let under = driver_name(d);
        for _ in 0..6 {
            // 1000 + 100 (t1) < 5000 + 20 (t2) < 5000 + 200 (t0)
            assert_eq!(
                once(addr, &[], &completion(PROMPT, Some(10))),
                "t1",
                "{under}"
            );
            // No max_tokens: 256 expected, 1000 + 2560 (t1) < 5000 + 512 (t2)
            assert_eq!(once(addr, &[], &completion(PROMPT, None)), "t1", "{under}");
        }
        // Around the crossing at 500 output tokens: 5500 < 5900, then 6500 > 6100.
        assert_eq!(once(addr, &[], &completion(PROMPT, Some(450))), "t1");
        assert_eq!(once(addr, &[], &completion(PROMPT, Some(550))), "t2");
        for _ in 0..6 {
            // 1000 + 40000 (t1) > 5000 + 8000 (t2)
            assert_eq!(
                once(addr, &[], &completion(PROMPT, Some(4000))),
                "t2",
                "{under}"
            );
        }
        // Price beats load: with a request held on t1, t1 still wins.
        let mut held = Client::connect(addr);
        held.send(&post(
            "/v1/completions",
            &[("x-mock-ttft-ms", "2500")],
            &completion(PROMPT, Some(10)),
        ));
        wait_for("the held request on t1", SHORT, || m1.stats().running == 1);
        settle();
        let mut c = Client::connect(addr);
        for _ in 0..4 {
            assert_eq!(next(&mut c, &[], &completion(PROMPT, Some(10))), "t1");
        }
        drop(held);
        assert_eq!(m0.stats().requests, 0, "the dearest target never served");
    }
}

/// `cheapest` with equal prices: load breaks the tie. Two workers; one request held on
/// whichever target took it, then every following request goes to the other. A random
/// tie-break would hit the held one about half the time, round-robin every other time.
#[test]
fn cheapest_breaks_equal_prices_by_load() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let price = "price = { input = 1.0, output = 2.0 }";
        let g = gateway_admin(
            d,
            2,
            &[&a, &b],
            &[price, price],
            &route("r", 2, "strategy = \"cheapest\""),
            "",
        );
        let held = hold(g.local_addr(), &[]);
        let busy = running_one(&[&a, &b]);
        let other = format!("t{}", 1 - busy);
        // The held request may sit on the other core: let its count reach every core.
        wait_for("the held request in the load view", SHORT, || {
            in_flight(&g, busy) == 1
        });
        settle();
        let mut c = Client::connect(g.local_addr());
        for i in 0..8 {
            assert_eq!(
                next(&mut c, &[], &completion(16, Some(4))),
                other,
                "under {}: request {i} with t{busy} busy",
                driver_name(d)
            );
        }
        drop(held);
    }
}

/// `adaptive` with latency only (w_cost = 0, w_load = 0) over a slow (80 ms) and a fast
/// (5 ms) engine, fallback round_robin, two workers. Proves: once both are measured, the
/// blend sends everything to the fast engine; the admin kill switch makes the very next
/// picks on every core follow the fallback (both engines get traffic, each pick counted as
/// a `kill_switch` fallback); turning it back on returns all traffic to the fast engine.
#[test]
fn adaptive_kill_switch_falls_back_and_returns() {
    for d in drivers() {
        let slow = mock("slow", |c| c.ttft = Duration::from_millis(80));
        let fast = mock("fast", |c| c.ttft = Duration::from_millis(5));
        let g = gateway_admin(
            d,
            2,
            &[&slow, &fast],
            &[],
            &route(
                "r",
                2,
                "[routes.strategy]\nname = \"adaptive\"\nw_latency = 1.0\nw_cost = 0.0\nw_load = 0.0\nfallback_strategy = \"round_robin\"",
            ),
            "",
        );
        let addr = g.local_addr();
        let body = completion(16, Some(4));
        let under = driver_name(d);
        // Warm-up: until both have a sample the two score the same and tie at random.
        let mut c = Client::connect(addr);
        let mut warm_up = 0;
        while slow.stats().requests == 0 || fast.stats().requests == 0 {
            next(&mut c, &[], &body);
            warm_up += 1;
            assert!(warm_up < 60, "under {under}: both engines were never tried");
        }
        settle();
        for i in 0..10 {
            assert_eq!(once(addr, &[], &body), "t1", "under {under}: request {i}");
        }
        assert_eq!(fallbacks(&g, "adaptive", "kill_switch"), 0.0);

        let r = admin_call(&g, "POST", "/admin/adaptive", "{\"enabled\": false}");
        assert_eq!(r.status, 200, "{}", r.text());
        let (slow_before, fast_before) = (slow.stats().requests, fast.stats().requests);
        let landed: Vec<String> = (0..10).map(|_| once(addr, &[], &body)).collect();
        // Each core rotates on its own: whatever the split of the ten over the two cores,
        // each target gets at least four of them.
        let on_slow = landed.iter().filter(|t| *t == "t0").count();
        assert!(
            (4..=6).contains(&on_slow),
            "under {under}: round_robin fallback spreads: {landed:?}"
        );
        assert_eq!(slow.stats().requests - slow_before, on_slow as u64);
        assert_eq!(fast.stats().requests - fast_before, 10 - on_slow as u64);
        wait_for("ten kill_switch fallbacks", SHORT, || {
            fallbacks(&g, "adaptive", "kill_switch") == 10.0
        });
        let r = admin_call(&g, "GET", "/metrics", "");
        assert!(r.text().contains("rolter_adaptive_enabled 0"));

        let r = admin_call(&g, "POST", "/admin/adaptive", "{\"enabled\": true}");
        assert_eq!(r.status, 200, "{}", r.text());
        for i in 0..10 {
            assert_eq!(
                once(addr, &[], &body),
                "t1",
                "under {under}: request {i} after the switch is back on"
            );
        }
        settle();
        assert_eq!(fallbacks(&g, "adaptive", "kill_switch"), 10.0);
    }
}

/// Prompt sizes of the predicted_latency scenario: about 16, 500 and 2000 tokens.
const SMALL: usize = 62;
const MEDIUM: usize = 1998;
const LARGE: usize = 7998;

/// The TTFT (ms) the scenario's engines answer with, as a function of the load the gateway
/// sees on them and of the gateway's prompt estimate (thousands of tokens). t0 is a fast
/// prefiller with an expensive queue (50 ms per request ahead), t1 a slow prefiller
/// (60 ms per thousand prompt tokens) with a cheap queue (10 ms per request ahead).
fn engine_ttft(target: usize, queue: u64, chars: usize) -> u64 {
    let k = f64::from(prompt_tokens(chars)) / 1000.0;
    let q = queue as f64;
    let ms = if target == 0 {
        10.0 + 50.0 * q + 2.0 * k
    } else {
        10.0 + 10.0 * q + 60.0 * k
    };
    ms.round() as u64
}

/// `predicted_latency`, two workers. The model learns from what the gateway measures, so the
/// engines must answer as the scenario says for whatever load the gateway saw and prompt it
/// sent: every successful request carries `x-mock-ttft-ms` = [`engine_ttft`] of the target
/// that is expected to serve it (training requests are steered through two single-target
/// routes matched on `x-train`; samples from any route teach every route's model of that
/// target). Load comes from abandoned held requests, which never teach.
///
/// Proves:
/// 1. Learning phase (fewer than 8 samples): with a request held on one target, every next
///    request goes to the other — least-load picks, each counted as a `learning` fallback.
/// 2. After training on both targets at queue depths 0–2 and three prompt sizes, with one
///    request held on t0: a 2000-token prompt goes to t0, the fast prefiller, although its
///    queue is longer (predicted ≈ 64 ms against ≈ 130 ms), and a 16-token prompt goes to
///    t1, the shorter queue (≈ 11 ms against ≈ 60 ms); no pick is a fallback any more.
///    Least-load would send both to t1, round-robin would alternate regardless of the prompt.
#[test]
fn predicted_latency_learns_prefill_speed_and_queue_cost() {
    for d in drivers() {
        let m0 = mock("fast-prefill", |_| {});
        let m1 = mock("slow-prefill", |_| {});
        let mut routes = String::new();
        for t in 0..2 {
            routes.push_str(&format!(
                "[[routes]]\nname = \"only-t{t}\"\ntargets = [\"t{t}\"]\nstrategy = \"round_robin\"\n\
                 match = {{ header = {{ name = \"x-train\", value = \"t{t}\" }} }}\n"
            ));
        }
        routes.push_str(&route("r", 2, "strategy = \"predicted_latency\""));
        let g = gateway_admin(d, 2, &[&m0, &m1], &[], &routes, "");
        let addr = g.local_addr();
        let under = driver_name(d);
        let quiet = |g: &rolter::Gateway| {
            wait_for("no request in flight", SHORT, || {
                in_flight(g, 0) == 0 && in_flight(g, 1) == 0
            });
            settle();
        };

        // 1. Learning phase: least-load.
        let held = hold(addr, &[]);
        let busy = running_one(&[&m0, &m1]);
        let other = 1 - busy;
        wait_for("the held request in the load view", SHORT, || {
            in_flight(&g, busy) == 1
        });
        settle();
        let mut c = Client::connect(addr);
        let ttft = engine_ttft(other, 0, SMALL).to_string();
        for i in 0..4 {
            assert_eq!(
                next(
                    &mut c,
                    &[("x-mock-ttft-ms", &ttft)],
                    &completion(SMALL, Some(4))
                ),
                format!("t{other}"),
                "under {under}: learning pick {i} with t{busy} busy"
            );
        }
        drop(c);
        wait_for("five learning fallbacks", SHORT, || {
            fallbacks(&g, "predicted_latency", "learning") == 5.0
        });
        drop(held);
        quiet(&g);

        // Training: queue depths 0, 1, 2 (held requests) × three prompt sizes, per target.
        for t in 0..2 {
            let route_header = ("x-train", if t == 0 { "t0" } else { "t1" });
            let mut holds = Vec::new();
            let mut c = Client::connect(addr);
            for q in 0..3u64 {
                while (holds.len() as u64) < q {
                    holds.push(hold(addr, &[route_header]));
                }
                wait_for("the training queue", SHORT, || in_flight(&g, t) == q);
                settle();
                for chars in [MEDIUM, SMALL, LARGE] {
                    let ttft = engine_ttft(t, q, chars).to_string();
                    let served = next(
                        &mut c,
                        &[route_header, ("x-mock-ttft-ms", &ttft)],
                        &completion(chars, Some(4)),
                    );
                    assert_eq!(served, format!("t{t}"));
                }
            }
            drop(holds);
            quiet(&g);
        }

        // 2. Model phase: one request held on t0.
        let held = hold(addr, &[("x-train", "t0")]);
        wait_for("the held request in the load view", SHORT, || {
            in_flight(&g, 0) == 1
        });
        settle();
        let mut c = Client::connect(addr);
        for round in 0..3 {
            let ttft = engine_ttft(0, 1, LARGE).to_string();
            assert_eq!(
                next(
                    &mut c,
                    &[("x-mock-ttft-ms", &ttft)],
                    &completion(LARGE, Some(4))
                ),
                "t0",
                "under {under}, round {round}: the long prompt goes to the fast prefiller"
            );
            let ttft = engine_ttft(1, 0, SMALL).to_string();
            assert_eq!(
                next(
                    &mut c,
                    &[("x-mock-ttft-ms", &ttft)],
                    &completion(SMALL, Some(4))
                ),
                "t1",
                "under {under}, round {round}: the short prompt goes to the shorter queue"
            );
        }
        drop(held);
        // Four learning picks and six probes succeeded on route r.
        wait_for("the probes to be recorded", SHORT, || {
            let ok = |t: &str| {
                admin_series(
                    &g,
                    &format!("rolter_requests_total{{route=\"r\",target=\"{t}\",code=\"200\"}}"),
                )
                .unwrap_or(0.0)
            };
            ok("t0") + ok("t1") == 10.0
        });
        assert_eq!(
            fallbacks(&g, "predicted_latency", "learning"),
            5.0,
            "under {under}: the model phase picks without falling back"
        );
    }
}

/// `fair_catchup` over two equal-weight targets, base round_robin, `max_catchup_share`
/// 0.5. One worker, because the books are per core: with several workers each core would
/// keep its own books over the requests the kernel happened to give it, and the counts
/// below would depend on that split.
///
/// Each target takes one request at a time (`max_concurrent = 1`); a held request makes one
/// of them unavailable while 20 requests go to the other. Proves: once it is back, the
/// returning target gets clearly more than half of the next 20 picks (repayment: 15 = a
/// catch-up every other pick plus half of the base picks) but never more than three in a
/// row (the catch-up rate is bounded); once the books balance the split is back to 50/50,
/// and over the whole window both targets have had their equal share. Round-robin would
/// give the returning target only half right away.
#[test]
fn fair_catchup_repays_a_returning_target_at_a_bounded_rate() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = gateway_admin(
            d,
            1,
            &[&a, &b],
            &["max_concurrent = 1", "max_concurrent = 1"],
            &route(
                "r",
                2,
                "[routes.strategy]\nname = \"fair_catchup\"\nwindow = \"120s\"\nmax_catchup_share = 0.5\nbase_strategy = \"round_robin\"",
            ),
            "",
        );
        let under = driver_name(d);
        let held = hold(g.local_addr(), &[]);
        let away = running_one(&[&a, &b]);
        let (away_name, present_name) = (format!("t{away}"), format!("t{}", 1 - away));
        let mut c = Client::connect(g.local_addr());
        let body = completion(16, Some(4));
        for i in 0..20 {
            assert_eq!(
                next(&mut c, &[], &body),
                present_name,
                "under {under}: request {i} while {away_name} is full"
            );
        }
        drop(held);
        wait_for("the held request to end", SHORT, || {
            in_flight(&g, away) == 0
        });

        let mut run = |n: usize| -> Vec<bool> {
            (0..n)
                .map(|_| next(&mut c, &[], &body) == away_name)
                .collect()
        };
        let pattern =
            |v: &[bool]| -> String { v.iter().map(|&x| if x { 'R' } else { '.' }).collect() };
        let repay = run(20);
        let returning = repay.iter().filter(|&&x| x).count();
        let longest = repay.split(|&x| !x).map(|s| s.len()).max().unwrap_or(0);
        assert!(
            (13..=17).contains(&returning),
            "under {under}: the returning target repays: {} (R = {away_name})",
            pattern(&repay)
        );
        assert!(
            longest <= 3,
            "under {under}: catch-up is spread: {}",
            pattern(&repay)
        );
        // The deficit (≈ 4.5 picks left) is repaid within the next 30.
        let rest = run(30);
        let balanced = run(20);
        let returning_later = balanced.iter().filter(|&&x| x).count();
        assert!(
            (9..=11).contains(&returning_later),
            "under {under}: back to an even split: {} (before: {})",
            pattern(&balanced),
            pattern(&rest)
        );
        // Over the whole window: the held one, 20 elsewhere, then 70.
        let total_away = 1 + returning + rest.iter().filter(|&&x| x).count() + returning_later;
        let total = 1 + 20 + 70;
        assert!(
            total_away.abs_diff(total - total_away) <= 2,
            "under {under}: {total_away} of {total} on the returning target"
        );
    }
}
