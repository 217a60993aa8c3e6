//! Busy polling (`server.busy_poll`) under both drivers: a polling worker serves plain and
//! streamed requests byte for byte, its polling time shows in
//! `rolter_busy_poll_seconds_total` (zero when polling is off), and timers keep firing
//! while it polls without a pause (a first-byte timeout is answered 504 while other
//! requests keep the worker polling).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::{Fault, MockHandle};

const CHAT: &str = "/v1/chat/completions";
const POLLED: &str = "rolter_busy_poll_seconds_total";

/// One worker polling for `busy_poll`, routes `fast` (model "m") and `slow` (model "s").
fn gw(d: DriverChoice, busy_poll: &str, fast: &MockHandle, slow: &MockHandle) -> Gateway {
    let rest = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n[health]\nactive = false\nfailures = 0\n\
         [[targets]]\nname = \"fast\"\nurl = \"http://{}\"\nmodels = [\"m\"]\n\
         [[targets]]\nname = \"slow\"\nurl = \"http://{}\"\nmodels = [\"s\"]\n\
         [targets.timeouts]\nfirst_byte = \"300ms\"\n\
         [[routes]]\nname = \"fast\"\ntargets = [\"fast\"]\n[routes.match]\nmodels = [\"m\"]\n\
         [[routes]]\nname = \"slow\"\ntargets = [\"slow\"]\nretries = 0\n[routes.match]\nmodels = [\"s\"]\n",
        fast.addr(),
        slow.addr()
    );
    gateway_with_server(d, 1, &format!("busy_poll = \"{busy_poll}\""), &rest)
}

fn engines() -> (MockHandle, MockHandle) {
    let fast = mock("fast", |_| {});
    let slow = mock("slow", |c| c.models = vec!["s".to_string()]);
    (fast, slow)
}

#[test]
fn a_polling_worker_serves_plain_and_streamed_requests_and_counts_its_polling() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (fast, slow) = engines();
        let g = gw(d, "20ms", &fast, &slow);
        for i in 0..12 {
            let stream = i % 2 == 1;
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(stream)));
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            if stream {
                assert!(r.text().trim_end().ends_with("data: [DONE]"), "{ctx} #{i}");
            } else {
                assert_eq!(r.json()["object"], "chat.completion", "{ctx} #{i}");
            }
        }
        assert_eq!(fast.requests().len(), 12, "{ctx}");
        wait_for("polling time on /metrics", SHORT, || {
            admin_series(&g, POLLED).is_some_and(|s| s > 0.0)
        });

        // Off (the default): the worker never polls.
        let off = gw(d, "0s", &fast, &slow);
        for i in 0..4 {
            let r = call(off.local_addr(), &post(CHAT, &[], &chat_body(i % 2 == 1)));
            assert_eq!(r.status, 200, "{ctx} off #{i}");
        }
        assert_eq!(admin_series(&off, POLLED), Some(0.0), "{ctx}");
    }
}

#[test]
fn timers_fire_while_other_requests_keep_the_worker_polling() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (fast, slow) = engines();
        slow.set_fault(Some(Fault::Stall));
        // The longest polling time: any request within 100 ms keeps the worker polling.
        let g = gw(d, "100ms", &fast, &slow);
        let addr = g.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let load = {
            let (stop, served) = (stop.clone(), served.clone());
            std::thread::spawn(move || {
                let cap = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::SeqCst) && Instant::now() < cap {
                    let r = call(addr, &post(CHAT, &[], &chat_body(false)));
                    assert_eq!(r.status, 200, "load: {}", r.text());
                    served.fetch_add(1, Ordering::SeqCst);
                }
                Instant::now() < cap
            })
        };
        wait_for("the load is running", SHORT, || {
            served.load(Ordering::SeqCst) > 10
        });
        let before = served.load(Ordering::SeqCst);
        let body = r#"{"model":"s","messages":[{"role":"user","content":"hi"}]}"#;
        let r = call(addr, &post(CHAT, &[], body));
        let during = served.load(Ordering::SeqCst) - before;
        stop.store(true, Ordering::SeqCst);
        let stopped_by_us = load.join().expect("load thread");
        assert_eq!(r.status, 504, "{ctx}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "upstream_timeout", "{ctx}");
        // The timeout fired while the load was still running (not once it had stopped and
        // the worker could sleep), and the worker was polling then.
        assert!(
            stopped_by_us,
            "{ctx}: the timeout came only after the load ended"
        );
        assert!(
            during > 0,
            "{ctx}: no request was served during the timeout"
        );
        assert!(admin_series(&g, POLLED).unwrap_or(0.0) > 0.0, "{ctx}");
        assert_eq!(slow.requests().len(), 1, "{ctx}: {:?}", slow.requests());
    }
}
