//! Latency outlier ejection and slow start through the real gateway: one of three mock
//! engines turns five times slower (a throttled GPU) and is ejected as a latency outlier,
//! comes back when its ejection time is over, and then ramps its share up over
//! `slow_start_window` instead of taking its full share at once.

mod common;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rolter_mock::Fault;

fn target_of(addr: SocketAddr) -> String {
    let r = call(
        addr,
        &post(
            "/v1/chat/completions",
            &[("x-rolter-explain", "1")],
            &chat_body(false),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-rolter-target").unwrap().to_string()
}

fn ejected(g: &rolter::Gateway, name: &str) -> bool {
    let doc = call(
        g.admin_addr().unwrap(),
        &request("GET", "/admin/targets", &[], ""),
    )
    .json();
    doc.as_array()
        .or_else(|| doc["targets"].as_array())
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap()["health"]["ejected"]
        .as_bool()
        .unwrap()
}

/// Sends requests from `clients` threads until `done` holds (checked between rounds) or
/// `within` passes; the targets that served them, in order.
fn load_until(
    addr: SocketAddr,
    clients: usize,
    within: Duration,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let end = Instant::now() + within;
    let mut served = Vec::new();
    while !done(&served) {
        assert!(Instant::now() < end, "timed out; served {served:?}");
        let round: Vec<_> = (0..clients)
            .map(|_| std::thread::spawn(move || target_of(addr)))
            .collect();
        served.extend(round.into_iter().map(|h| h.join().unwrap()));
    }
    served
}

#[test]
fn a_five_times_slower_engine_is_ejected_returns_and_ramps_up() {
    for d in drivers() {
        let mocks: Vec<_> = (0..3)
            .map(|i| mock(&format!("m{i}"), |c| c.ttft = Duration::from_millis(20)))
            .collect();
        let refs: Vec<&rolter_mock::MockHandle> = mocks.iter().collect();
        let health = "[health]\nactive = false\nfailures = 0\nlatency_factor = 3.0\nlatency_for = \"500ms\"\nlatency_min_samples = 5\nejection_time = \"1500ms\"\nmax_ejected_percent = 34\nslow_start_window = \"4s\"\nslow_start_min_weight = 0.1\n[admin]\nlisten = \"127.0.0.1:0\"\n";
        let mut rest = String::new();
        for (i, m) in refs.iter().enumerate() {
            rest.push_str(&target(&format!("t{i}"), m.addr(), ""));
        }
        rest.push_str("[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\", \"t2\"]\nstrategy = \"round_robin\"\n");
        rest.push_str(health);
        let g = gateway_with(d, 2, &rest);
        let addr = g.local_addr();
        // Everyone fast: every target serves, nobody is ejected.
        let warm = load_until(addr, 3, Duration::from_secs(20), |s| s.len() >= 30);
        for t in ["t0", "t1", "t2"] {
            assert!(warm.iter().any(|s| s == t), "{t} never served: {warm:?}");
        }
        assert!(!ejected(&g, "t2"));
        // t2 turns five times slower; it is ejected once its average has stayed above
        // three times its peers' median for latency_for.
        mocks[2].set_fault(Some(Fault::Slow(Duration::from_millis(100))));
        load_until(addr, 3, Duration::from_secs(30), |_| ejected(&g, "t2"));
        assert_eq!(
            admin_series(&g, "rolter_ejections_total{target=\"t2\"}"),
            Some(1.0),
            "under {}",
            driver_name(d)
        );
        // While out, it serves nothing.
        let during = load_until(addr, 3, Duration::from_secs(10), |s| s.len() >= 12);
        if ejected(&g, "t2") {
            assert!(during.iter().all(|s| s != "t2"), "{during:?}");
        }
        // It recovers; once the ejection time is over it is back, on a ramp.
        mocks[2].set_fault(None);
        load_until(addr, 3, Duration::from_secs(20), |_| !ejected(&g, "t2"));
        let back = Instant::now();
        // The first second of the ramp (share factor 0.1 to 0.35): well under a third.
        let early = load_until(addr, 3, Duration::from_secs(20), |_| {
            back.elapsed() >= Duration::from_secs(1)
        });
        let share = early.iter().filter(|s| *s == "t2").count() as f64 / early.len() as f64;
        assert!(
            share < 0.2,
            "under {}: t2 took {share:.2} of the picks right after returning: {early:?}",
            driver_name(d)
        );
        // After the window its full share again, and it is not ejected again (fast now).
        load_until(addr, 3, Duration::from_secs(20), |_| {
            back.elapsed() >= Duration::from_secs(4)
        });
        let after = load_until(addr, 3, Duration::from_secs(20), |s| s.len() >= 30);
        let share = after.iter().filter(|s| *s == "t2").count() as f64 / after.len() as f64;
        assert!(share > 0.25, "t2's share after the ramp: {share:.2}");
        assert!(!ejected(&g, "t2"));
    }
}
