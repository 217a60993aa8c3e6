//! A quiet worker slows its signal tick: with no request for 100 ms its thread wakes about
//! ten times a second instead of every 2 ms, and it still answers the next request, a
//! reload and a stop at once (under both drivers).

mod common;

use std::time::Duration;

use common::*;

const CHAT: &str = "/v1/chat/completions";

/// Voluntary context switches of this process's thread named `name`.
fn wakeups(name: &str) -> u64 {
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).expect("status");
        return status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("voluntary_ctxt_switches");
    }
    panic!("no thread named {name}");
}

#[test]
fn a_quiet_worker_sleeps_between_slow_ticks_and_wakes_for_a_request() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("m", |_| {});
        let g = gateway_for(d, &[&m], "");
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{ctx}");
        // Quiet after 100 ms without a request.
        std::thread::sleep(Duration::from_millis(300));
        let before = wakeups("rolter-w0");
        std::thread::sleep(Duration::from_secs(1));
        let woke = wakeups("rolter-w0") - before;
        // A 2 ms tick alone is 500 wake-ups a second; a quiet one about 10.
        assert!(
            woke < 100,
            "{ctx}: the quiet worker woke {woke} times in 1 s"
        );
        for stream in [false, true] {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(stream)));
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        }
        assert_eq!(m.requests().len(), 3, "{ctx}");
    }
}
