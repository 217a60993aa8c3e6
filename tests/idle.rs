//! A quiet worker slows its signal tick: with no request for 100 ms its thread wakes about
//! ten times a second instead of every 2 ms, and it still answers the next request, a
//! reload and a stop at once. A control thread that no worker has sent anything for a
//! second slows its tick the same way, and still folds the next request's records in and
//! takes a reload (under both drivers).

mod common;

use std::time::Duration;

use common::*;

const CHAT: &str = "/v1/chat/completions";

/// The tests look threads up by name in this one process, so they take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

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

/// How many times the thread named `name` woke in the next second.
fn wakeups_in_a_second(name: &str) -> u64 {
    let before = wakeups(name);
    std::thread::sleep(Duration::from_secs(1));
    wakeups(name) - before
}

#[test]
fn a_quiet_worker_sleeps_between_slow_ticks_and_wakes_for_a_request() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("m", |_| {});
        let g = gateway_for(d, &[&m], "");
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{ctx}");
        // Quiet after 100 ms without a request.
        std::thread::sleep(Duration::from_millis(300));
        let woke = wakeups_in_a_second("rolter-w0");
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

/// Whether `series` on `/metrics` reaches `value` within [`SHORT`].
fn counted(g: &rolter::Gateway, series: &str, value: f64) -> bool {
    let end = std::time::Instant::now() + SHORT;
    while std::time::Instant::now() < end {
        if admin_series(g, series) == Some(value) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn an_idle_control_thread_sleeps_and_still_folds_the_next_request_and_takes_a_reload() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("m", |_| {});
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rolter.toml");
        let text = |strategy: &str| {
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\n\
                 driver = \"{ctx}\"\n[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
                 {}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\nstrategy = \"{strategy}\"\n",
                target("t0", m.addr(), "")
            )
        };
        std::fs::write(&path, text("round_robin")).expect("write the configuration");
        let g = rolter::Gateway::start(rolter::config::load_file(&path).expect("config"))
            .expect("start");
        let ok = r#"rolter_requests_total{route="r",target="t0",code="200"}"#;
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{ctx}");
        assert!(
            counted(&g, ok, 1.0),
            "{ctx}: the first request was not counted"
        );
        // Quiet once no worker has sent anything for a second.
        std::thread::sleep(Duration::from_millis(1500));
        let woke = wakeups_in_a_second("rolter-control");
        // A 2 ms tick alone is 500 wake-ups a second; a quiet one about 10.
        assert!(
            woke < 100,
            "{ctx}: the quiet control thread woke {woke} times in 1 s"
        );
        // The next request's records are folded in (the worker rings the sleeping thread;
        // `mesh::bell`'s unit tests check the ring itself).
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(true)));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        assert!(
            counted(&g, ok, 2.0),
            "{ctx}: the second request was not counted"
        );
        // A reload while it sleeps again is taken (the supervisor nudges it).
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::write(&path, text("random")).expect("write the configuration");
        g.reload().unwrap_or_else(|e| panic!("{ctx}: reload: {e}"));
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{ctx}");
        assert_eq!(m.requests().len(), 3, "{ctx}");
    }
}
