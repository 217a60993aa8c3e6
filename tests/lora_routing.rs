//! `lora_aware` through the real gateway, in front of mock engines that serve LoRA adapters
//! (`vllm:lora_requests_info`, adapter entries in `/v1/models`, vLLM's 404 for an adapter
//! they do not have): adapter requests land where the adapter is, base-model requests
//! spread by load, and without a residency signal the route falls back to load, visibly.

mod common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rolter_mock::{LoraConfig, MockHandle};

/// A mock engine serving base model "m" and the given adapters.
fn lora_mock(name: &str, adapters: &[&str], max_loras: usize) -> MockHandle {
    mock(name, |c| {
        c.lora = Some(LoraConfig {
            max_loras,
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
            load_delay: Duration::ZERO,
        })
    })
}

const SCRAPE: &str =
    "[metrics_scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"\nstale_after = \"300ms\"\n";

/// A gateway with two workers and the admin listener in front of `mocks` (targets t0, t1,
/// … serving any model), one `lora_aware` route `r`, and `tables`.
fn gateway_lora(
    d: rolter::config::DriverChoice,
    mocks: &[&MockHandle],
    tables: &str,
) -> rolter::Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        rest.push_str(&format!(
            "[[targets]]\nname = \"t{i}\"\nurl = \"http://{}\"\n\
             [targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"3s\"\nidle = \"3s\"\n",
            m.addr()
        ));
        names.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nretries = 0\nstrategy = \"lora_aware\"\n",
        names.join(", ")
    ));
    rest.push_str("\n[admin]\nlisten = \"127.0.0.1:0\"\n");
    rest.push_str(tables);
    gateway_with(d, 2, &rest)
}

fn targets_json(g: &rolter::Gateway) -> serde_json::Value {
    let r = call(
        g.admin_addr().unwrap(),
        &request("GET", "/admin/targets", &[], ""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

const FALLBACKS: &str =
    "rolter_strategy_fallbacks_total{route=\"r\",strategy=\"lora_aware\",reason=\"no_lora_signal\"}";

fn completion(addr: SocketAddr, model: &str, headers: &[(&str, &str)]) -> Response {
    call(
        addr,
        &post(
            "/v1/completions",
            headers,
            &format!(r#"{{"model":"{model}","prompt":"x","max_tokens":4}}"#),
        ),
    )
}

/// Where a request for `model` lands (asserting it was served).
fn landed(g: &rolter::Gateway, model: &str) -> String {
    let r = completion(g.local_addr(), model, &[]);
    assert_eq!(r.status, 200, "{model}: {}", r.text());
    r.header("x-rolter-target").unwrap().to_string()
}

/// Waits until the admin API shows every target's LoRA lists fresh, and `check` holds.
fn wait_for_residency(g: &rolter::Gateway, check: impl Fn(&serde_json::Value) -> bool) {
    wait_for("the LoRA residency signal", Duration::from_secs(3), || {
        let v = targets_json(g);
        v["targets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["lora"]["metrics"] == true && t["lora"]["loaded"].is_array())
            && check(&v)
    });
    // The control thread publishes on its next 2 ms tick; the workers apply it before
    // their next pick.
    std::thread::sleep(Duration::from_millis(20));
}

#[test]
fn adapter_requests_go_where_the_adapter_is_and_base_requests_spread() {
    for d in drivers() {
        let a = lora_mock("a", &["sql-lora"], 2);
        let b = lora_mock("b", &["chat-lora"], 2);
        let g = gateway_lora(d, &[&a, &b], SCRAPE);
        wait_for_residency(&g, |v| v["targets"][0]["lora"]["loaded"][0] == "sql-lora");
        for _ in 0..10 {
            assert_eq!(landed(&g, "sql-lora"), "t0", "under {}", driver_name(d));
            assert_eq!(landed(&g, "chat-lora"), "t1", "under {}", driver_name(d));
        }
        // The engines saw only adapters they have: no 404 anywhere.
        assert_eq!(a.lora_stats().unwrap().slot_loads, 1);
        assert_eq!(b.lora_stats().unwrap().slot_loads, 1);
        // Base-model requests are not adapters: idle targets tie on load, ties at random.
        let mut on_t0 = 0;
        for _ in 0..30 {
            if landed(&g, "m") == "t0" {
                on_t0 += 1;
            }
        }
        assert!((3..=27).contains(&on_t0), "{on_t0} of 30 on t0");
        assert_eq!(admin_series(&g, FALLBACKS), None, "no fallback while fresh");
    }
}

/// Both engines have the adapter registered; it runs on one of them: that one wins over the
/// other's free slot, and the gateway's own routing keeps a burst together.
#[test]
fn a_running_adapter_beats_a_free_slot() {
    for d in drivers() {
        let a = lora_mock("a", &["sql-lora"], 2);
        let b = lora_mock("b", &["sql-lora"], 2);
        // A long request for the adapter straight at engine b: it runs there.
        let addr = b.addr();
        let held =
            std::thread::spawn(move || completion(addr, "sql-lora", &[("x-mock-ttft-ms", "1500")]));
        let g = gateway_lora(d, &[&a, &b], SCRAPE);
        wait_for_residency(&g, |v| v["targets"][1]["lora"]["running"][0] == "sql-lora");
        for _ in 0..10 {
            assert_eq!(landed(&g, "sql-lora"), "t1", "under {}", driver_name(d));
        }
        assert_eq!(a.lora_stats().unwrap().slot_loads, 0);
        assert_eq!(held.join().unwrap().status, 200);
    }
}

/// Without `[metrics_scrape]` no residency is known: picks go by load and are counted as
/// fallbacks.
#[test]
fn without_a_signal_the_route_falls_back_to_load_visibly() {
    for d in drivers() {
        let a = lora_mock("a", &["sql-lora"], 2);
        let b = lora_mock("b", &["sql-lora"], 2);
        let g = gateway_lora(d, &[&a, &b], "");
        // A held request through the gateway loads one target.
        let addr = g.local_addr();
        let held = std::thread::spawn(move || completion(addr, "m", &[("x-mock-ttft-ms", "1200")]));
        wait_for("the held request", SHORT, || {
            a.stats().running + b.stats().running == 1
        });
        std::thread::sleep(Duration::from_millis(20));
        let busy = if a.stats().running == 1 { "t0" } else { "t1" };
        for _ in 0..6 {
            let t = landed(&g, "sql-lora");
            assert_ne!(
                t,
                busy,
                "under {}: the least loaded target serves",
                driver_name(d)
            );
            // Past the 2 ms exchange, so no core counts the previous request as in flight.
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_for("the fallback count", SHORT, || {
            admin_series(&g, FALLBACKS).unwrap_or(0.0) >= 7.0
        });
        let v = targets_json(&g);
        assert_eq!(v["targets"][0]["lora"], serde_json::Value::Null, "{v}");
        assert_eq!(held.join().unwrap().status, 200);
    }
}

/// A residency signal that goes stale counts as none: the route falls back to load.
#[test]
fn a_stale_signal_falls_back_too() {
    for d in drivers() {
        stale_signal_falls_back(d);
    }
}

fn stale_signal_falls_back(d: rolter::config::DriverChoice) {
    let a = lora_mock("a", &["sql-lora"], 2);
    let b = lora_mock("b", &[], 2);
    // Scraped fast at first; the metrics path of both targets then stops answering…
    let g = gateway_lora(d, &[&a, &b], SCRAPE);
    wait_for_residency(&g, |_| true);
    assert_eq!(landed(&g, "sql-lora"), "t0");
    assert_eq!(admin_series(&g, FALLBACKS), None);
    // … which the mocks model by shutting down: the scrape fails, the signal goes stale
    // after 300 ms, and the route reports the fallback (the request itself fails, as the
    // engine is gone).
    a.shutdown();
    b.shutdown();
    wait_for("the stale signals", Duration::from_secs(3), || {
        let v = targets_json(&g);
        v["targets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["lora"]["metrics"] == false && t["lora"]["loaded"].is_null())
    });
    std::thread::sleep(Duration::from_millis(20));
    let r = completion(g.local_addr(), "sql-lora", &[]);
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    wait_for("the fallback count", SHORT, || {
        admin_series(&g, FALLBACKS).unwrap_or(0.0) >= 1.0
    });
}

/// The mock's LoRA surfaces as vLLM shows them: adapter entries in `/v1/models`, the
/// load/unload endpoints and their replies, 404 for a model it does not serve.
#[test]
fn mock_lora_surfaces() {
    let m = lora_mock("m", &["sql-lora"], 1);
    let models = call(m.addr(), &request("GET", "/v1/models", &[], "")).json();
    assert_eq!(models["data"][1]["id"], "sql-lora");
    assert_eq!(models["data"][1]["parent"], "m");
    let r = completion(m.addr(), "other-lora", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json()["error"]["message"],
        "The model `other-lora` does not exist."
    );
    let load = |body: &str| call(m.addr(), &post("/v1/load_lora_adapter", &[], body));
    let r = load(r#"{"lora_name":"other-lora","lora_path":"/adapters/other"}"#);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "Success: LoRA adapter 'other-lora' added successfully."
    );
    let r = load(r#"{"lora_name":"other-lora","lora_path":"/adapters/other"}"#);
    assert_eq!(r.status, 400);
    assert!(r.text().contains("has already been loaded"));
    assert_eq!(load(r#"{"lora_name":"x"}"#).status, 400);
    assert_eq!(completion(m.addr(), "other-lora", &[]).status, 200);
    let metrics = call(m.addr(), &request("GET", "/metrics", &[], "")).text();
    assert!(
        metrics.contains("vllm:lora_requests_info{max_lora=\"1\""),
        "{metrics}"
    );
    let unload = |body: &str| call(m.addr(), &post("/v1/unload_lora_adapter", &[], body));
    let r = unload(r#"{"lora_name":"other-lora"}"#);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "Success: LoRA adapter 'other-lora' removed successfully."
    );
    assert_eq!(unload(r#"{"lora_name":"other-lora"}"#).status, 404);
    let s = m.lora_stats().unwrap();
    assert_eq!((s.api_loads, s.api_unloads, s.slot_loads), (1, 1, 1));
    assert_eq!(s.registered, ["sql-lora"]);
    // One slot: a second adapter waits while the first runs.
    unload(r#"{"lora_name":"nothing"}"#);
    load(r#"{"lora_name":"b","lora_path":"/b"}"#);
    let addr = m.addr();
    let first =
        std::thread::spawn(move || completion(addr, "sql-lora", &[("x-mock-ttft-ms", "400")]));
    wait_for("sql-lora running", SHORT, || {
        m.lora_stats().unwrap().running == ["sql-lora"]
    });
    let second = std::thread::spawn(move || completion(addr, "b", &[]));
    wait_for("b waiting", SHORT, || {
        m.lora_stats().unwrap().waiting == ["b"]
    });
    assert_eq!(m.stats().waiting, 1);
    let metrics = call(m.addr(), &request("GET", "/metrics", &[], "")).text();
    assert!(
        metrics.contains("running_lora_adapters=\"sql-lora\",waiting_lora_adapters=\"b\""),
        "{metrics}"
    );
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(second.join().unwrap().status, 200);
    assert_eq!(m.lora_stats().unwrap().slot_loads, 3);
}

/// A slot load costs the mock `load_delay`; an adapter still in the GPU does not.
#[test]
fn mock_slot_loads_take_the_load_delay() {
    let m = mock("m", |c| {
        c.lora = Some(LoraConfig {
            max_loras: 1,
            adapters: vec!["a".into(), "b".into()],
            load_delay: Duration::from_millis(150),
        })
    });
    let timed = |model: &str| {
        let t = std::time::Instant::now();
        assert_eq!(completion(m.addr(), model, &[]).status, 200);
        t.elapsed()
    };
    assert!(timed("a") >= Duration::from_millis(150));
    assert!(timed("a") < Duration::from_millis(150), "still resident");
    assert!(timed("b") >= Duration::from_millis(150), "evicts a");
    assert!(
        timed("m") < Duration::from_millis(150),
        "the base model needs no slot"
    );
    assert_eq!(m.lora_stats().unwrap().slot_loads, 2);
}

/// Adapter loads (GPU slot swaps) over the same many-adapter load under `strategy`.
fn slot_loads(d: rolter::config::DriverChoice, strategy: &str) -> u64 {
    let adapters: Vec<String> = (0..16).map(|i| format!("lora-{i}")).collect();
    let names: Vec<&str> = adapters.iter().map(String::as_str).collect();
    let mocks: Vec<MockHandle> = (0..4)
        .map(|i| lora_mock(&format!("e{i}"), &names, 2))
        .collect();
    let refs: Vec<&MockHandle> = mocks.iter().collect();
    let mut rest = String::new();
    let mut targets = Vec::new();
    for (i, m) in refs.iter().enumerate() {
        rest.push_str(&format!(
            "[[targets]]\nname = \"t{i}\"\nurl = \"http://{}\"\n[targets.timeouts]\nfirst_byte = \"5s\"\n",
            m.addr()
        ));
        targets.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nretries = 0\nstrategy = \"{strategy}\"\n{SCRAPE}",
        targets.join(", ")
    ));
    let g = gateway_with(d, 2, &rest);
    if strategy == "lora_aware" {
        // Wait for the first scrape, so no pick falls back for want of a signal.
        std::thread::sleep(Duration::from_millis(200));
    }
    let addr = g.local_addr();
    let clients: Vec<_> = (0..8u64)
        .map(|c| {
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(c);
                for _ in 0..30 {
                    // Skewed popularity: low-numbered adapters are asked for most.
                    let a = (rng.f64().powi(2) * 16.0) as usize;
                    let r = completion(addr, &format!("lora-{a}"), &[("x-mock-ttft-ms", "15")]);
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    g.shutdown(Duration::from_secs(1));
    mocks
        .iter()
        .map(|m| m.lora_stats().unwrap().slot_loads)
        .sum()
}

/// Many adapters, two GPU slots per engine: keeping each adapter where it runs swaps far
/// fewer adapters in than spreading by load.
#[test]
fn lora_aware_cuts_adapter_loads_against_least_loaded() {
    for d in drivers() {
        let spread = slot_loads(d, "least_loaded");
        let aware = slot_loads(d, "lora_aware");
        eprintln!(
            "{}: 240 requests over 16 adapters, 4 engines x 2 slots: least_loaded {spread} adapter loads, lora_aware {aware}",
            driver_name(d)
        );
        assert!(
            aware * 10 <= spread * 7,
            "lora_aware {aware} loads against least_loaded {spread}"
        );
    }
}

/// With `load_from`, a request for a configured adapter that no target has is served: the
/// gateway loads it on the chosen target first (vLLM's `/v1/load_lora_adapter`), the next
/// requests follow it there without loading again, and without `load_from` the engine's
/// 404 reaches the client.
#[test]
fn load_from_loads_a_missing_adapter_once_and_follows_it() {
    for d in drivers() {
        let engines = [
            lora_mock("a", &[], 2),
            lora_mock("b", &[], 2),
            lora_mock("c", &[], 2),
        ];
        let refs: Vec<&MockHandle> = engines.iter().collect();
        let mut rest = String::new();
        for (i, m) in refs.iter().enumerate() {
            rest.push_str(&format!(
                "[[targets]]\nname = \"t{i}\"\nurl = \"http://{}\"\n[targets.timeouts]\nfirst_byte = \"3s\"\n",
                m.addr()
            ));
        }
        rest.push_str(
            "[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\", \"t2\"]\nretries = 0\n\
             [routes.strategy]\nname = \"lora_aware\"\nadapters = \"sql-lora, chat-lora\"\n\
             load_from = \"/models/loras\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        );
        rest.push_str(SCRAPE);
        let g = gateway_with(d, 2, &rest);
        wait_for_residency(&g, |_| true);

        let first = landed(&g, "sql-lora");
        // The load reaches the other core through the control thread within a few signal
        // ticks (2 ms each).
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..8 {
            assert_eq!(landed(&g, "sql-lora"), first, "under {}", driver_name(d));
        }
        let loads: Vec<u64> = engines
            .iter()
            .map(|e| e.lora_stats().unwrap().api_loads)
            .collect();
        assert_eq!(loads.iter().sum::<u64>(), 1, "{loads:?}");
        let holder = &engines[first[1..].parse::<usize>().unwrap()];
        assert_eq!(holder.lora_stats().unwrap().registered, vec!["sql-lora"]);
        let series = format!("rolter_adapter_loads_total{{target=\"{first}\",result=\"loaded\"}}");
        wait_for("the load counted", Duration::from_secs(3), || {
            admin_series(&g, &series) == Some(1.0)
        });
        // Once the models poll shows it, later requests still go there.
        wait_for_residency(&g, |v| {
            v["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["lora"]["loaded"][0] == "sql-lora")
        });
        assert_eq!(landed(&g, "sql-lora"), first);
        // A name that is not one of the route's adapters is not loaded: vLLM's 404.
        let r = completion(g.local_addr(), "unknown-lora", &[]);
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(
            engines
                .iter()
                .map(|e| e.lora_stats().unwrap().api_loads)
                .sum::<u64>(),
            1
        );
        g.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn load_from_needs_adapters() {
    let text = "[[targets]]\nname = \"a\"\nurl = \"http://127.0.0.1:8000\"\n\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n[routes.strategy]\nname = \"lora_aware\"\nload_from = \"/loras\"\n";
    let e = rolter::config::load_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("load_from") && e.contains("adapters"), "{e}");
}
