//! Configuration reload under load: ten reloads (routes, strategies and targets changing,
//! one of them invalid) while keep-alive clients send plain requests and long streams.
//! Nothing fails, no stream is cut, the invalid file is refused with its errors and the old
//! configuration keeps serving, and after each valid reload the new targets serve and the
//! removed ones receive nothing new.

mod common;
use common::*;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rolter::gateway::reload::ReloadError;
use rolter::Gateway;
use rolter_mock::MockHandle;

/// What the load threads saw.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    streams: AtomicU64,
    failures: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failures.lock().unwrap().push(what);
    }
}

/// One keep-alive client looping until `stop`: plain requests, or streams when `stream`.
/// A response with `connection: close` (a draining gateway) makes it reconnect.
fn load(addr: SocketAddr, stream: bool, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut c = Client::connect(addr);
    while !stop.load(Ordering::Relaxed) {
        c.send(&post("/v1/chat/completions", &[], &chat_body(stream)));
        match c.response() {
            Ok(r) if r.status == 200 => {
                if stream {
                    let events = sse_events(&r.body);
                    if events.last().map(|e| e.1.as_str()) != Some("[DONE]") {
                        tally.fail(format!("a stream ended without [DONE]: {events:?}"));
                    }
                    tally.streams.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                }
                if r.header("connection") == Some("close") {
                    c = Client::connect(addr);
                }
            }
            Ok(r) => {
                tally.fail(format!("status {}: {}", r.status, r.text()));
                c = Client::connect(addr);
            }
            Err(e) => {
                tally.fail(format!("i/o error: {e}"));
                c = Client::connect(addr);
            }
        }
    }
}

/// The configuration file for one step: `targets` (indices into `mocks`) and a route
/// section.
fn write_config(path: &Path, driver: &str, mocks: &[MockHandle], targets: &[usize], routes: &str) {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\npin_workers = false\ndriver = \"{driver}\"\n\
         shutdown_grace = \"5s\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[log]\naccess = \"off\"\n\n"
    );
    for &t in targets {
        text.push_str(&target(&format!("e{t}"), mocks[t].addr(), ""));
    }
    text.push_str(routes);
    std::fs::write(path, text).unwrap();
}

/// The main route over `targets`, and with `other` a second route for another model.
fn routes(strategy: &str, targets: &[usize], other: bool) -> String {
    let names: Vec<String> = targets.iter().map(|t| format!("\"e{t}\"")).collect();
    let names = names.join(", ");
    let mut text = format!(
        "[[routes]]\nname = \"main\"\nstrategy = \"{strategy}\"\ntargets = [{names}]\n[routes.match]\nmodels = [\"m\"]\n"
    );
    if other {
        text.push_str(&format!(
            "[[routes]]\nname = \"other\"\nstrategy = \"random\"\ntargets = [{names}]\n[routes.match]\nmodels = [\"m\"]\nheader = {{ name = \"x-tenant\", value = \"other\" }}\n"
        ));
    }
    text
}

/// Sends plain requests until every target in `want` answered one.
fn serves(addr: SocketAddr, want: &BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    wait_for("every new target serving", Duration::from_secs(10), || {
        let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{}", r.text());
        seen.insert(r.header("x-mock-engine").unwrap().to_string());
        want.is_subset(&seen)
    });
    assert!(
        seen.is_subset(want),
        "only targets of the new configuration serve new requests: saw {seen:?}, configured {want:?}"
    );
}

#[test]
fn ten_reloads_under_load_lose_nothing() {
    for d in drivers() {
        let mocks: Vec<MockHandle> = (0..4)
            .map(|i| {
                mock(&format!("e{i}"), |c| {
                    c.itl = Duration::from_millis(2);
                    c.tokens = 40;
                })
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rolter.toml");
        let driver = driver_name(d);
        write_config(
            &path,
            driver,
            &mocks,
            &[0, 1],
            &routes("round_robin", &[0, 1], false),
        );
        let g = Gateway::start(rolter::config::load_file(&path).unwrap()).unwrap();
        let addr = g.local_addr();
        let admin = g.admin_addr().unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let (stop, tally) = (stop.clone(), tally.clone());
                std::thread::spawn(move || load(addr, i % 3 == 0, stop, tally))
            })
            .collect();

        // (targets, strategy, a second route, valid)
        let steps: Vec<(Vec<usize>, &str, bool, bool)> = vec![
            (vec![0, 1, 2], "round_robin", false, true),
            (vec![0, 1, 2], "least_loaded", false, true),
            (vec![1, 2], "power_of_two", false, true),
            (vec![1, 2], "round_robbin", false, false),
            (vec![1, 2, 3], "least_loaded", true, true),
            (vec![3, 0], "random", false, true),
            (vec![3, 0], "random", false, true),
            (vec![0, 1, 2, 3], "round_robin", false, true),
            (vec![2], "least_loaded", true, true),
            (vec![0, 2], "round_robin", false, true),
        ];
        let mut current: Vec<usize> = vec![0, 1];
        for (i, (targets, strategy, other, valid)) in steps.into_iter().enumerate() {
            // Let the load run on this configuration for a moment.
            std::thread::sleep(Duration::from_millis(150));
            write_config(
                &path,
                driver,
                &mocks,
                &targets,
                &routes(strategy, &targets, other),
            );
            let result = if i == 4 {
                // One reload through the admin API; the others as SIGHUP does it.
                let r = call(admin, &post("/admin/reload", &[], ""));
                assert_eq!(r.status, 200, "{}", r.text());
                assert_eq!(r.json()["status"], "reloaded");
                Ok(())
            } else {
                g.reload().map(|_| ())
            };
            if !valid {
                match result {
                    Err(ReloadError::Invalid { errors, count }) => {
                        assert_eq!(count, 1, "{errors}");
                        assert!(errors.contains("round_robbin"), "{errors}");
                    }
                    other => panic!("step {i}: the invalid file was not refused: {other:?}"),
                }
                // The old configuration keeps serving.
                let want = current.iter().map(|t| format!("e{t}")).collect();
                serves(addr, &want);
                continue;
            }
            result.unwrap_or_else(|e| panic!("step {i}: {e}"));
            let removed: Vec<usize> = (0..4).filter(|t| !targets.contains(t)).collect();
            // A request that started before the reload may still reach a removed target;
            // none that starts after it does.
            std::thread::sleep(Duration::from_millis(250));
            let before: Vec<usize> = removed.iter().map(|&t| mocks[t].requests().len()).collect();
            let want = targets.iter().map(|t| format!("e{t}")).collect();
            serves(addr, &want);
            std::thread::sleep(Duration::from_millis(100));
            for (k, &t) in removed.iter().enumerate() {
                assert_eq!(
                    mocks[t].requests().len(),
                    before[k],
                    "{driver} step {i}: removed target e{t} received new requests"
                );
            }
            current = targets;
        }
        std::thread::sleep(Duration::from_millis(150));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let failures = tally.failures.lock().unwrap();
        assert!(failures.is_empty(), "{driver}: {failures:#?}");
        assert!(tally.ok.load(Ordering::Relaxed) > 50, "the load ran");
        assert!(tally.streams.load(Ordering::Relaxed) > 10, "streams ran");
        let cfg = call(admin, &request("GET", "/admin/config", &[], ""));
        let cfg = cfg.json();
        assert_eq!(cfg["reloads"]["ok"], 9);
        assert_eq!(cfg["reloads"]["invalid"], 1);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(cfg["sha256"], rolter::config::digest(&text));
        let m = call(admin, &request("GET", "/metrics", &[], "")).text();
        assert!(
            m.contains(&format!(
                "rolter_config_info{{sha256=\"{}\"}} 1",
                rolter::config::digest(&text)
            )),
            "{m}"
        );
        g.shutdown(Duration::from_secs(2));
    }
}

#[test]
fn a_reload_that_needs_a_restart_changes_nothing() {
    let d = drivers()[0];
    let m = mock("a", |_| {});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rolter.toml");
    write_config(
        &path,
        driver_name(d),
        std::slice::from_ref(&m),
        &[0],
        &routes("round_robin", &[0], false),
    );
    let g = Gateway::start(rolter::config::load_file(&path).unwrap()).unwrap();
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("workers = 2", "workers = 3");
    std::fs::write(&path, text).unwrap();
    match g.reload() {
        Err(ReloadError::RestartNeeded(keys)) => {
            assert!(keys[0].starts_with("server.workers"), "{keys:?}")
        }
        other => panic!("not refused: {other:?}"),
    }
    let r = call(
        g.local_addr(),
        &post("/v1/chat/completions", &[], &chat_body(false)),
    );
    assert_eq!(r.status, 200);
    g.shutdown(Duration::from_secs(1));
}

/// `main` (fastest over both mocks, `options` its option lines) and `side` (for requests
/// with `x-tenant: side`, with `side`'s strategy).
fn learning_config(path: &Path, d: &str, mocks: &[MockHandle], options: &str, side: &str) {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\npin_workers = false\ndriver = \"{d}\"\n\n[log]\naccess = \"off\"\n\n"
    );
    for (i, m) in mocks.iter().enumerate() {
        text.push_str(&target(&format!("e{i}"), m.addr(), ""));
    }
    text.push_str(&format!(
        "[[routes]]\nname = \"side\"\nstrategy = \"{side}\"\ntargets = [\"e0\", \"e1\"]\n\
         [routes.match]\nheader = {{ name = \"x-tenant\", value = \"side\" }}\n\n\
         [[routes]]\nname = \"main\"\ntargets = [\"e0\", \"e1\"]\n\
         [routes.strategy]\nname = \"fastest\"\n{options}\n"
    ));
    std::fs::write(path, text).unwrap();
}

/// Whether a request on `main` was picked with a fallback (`cold`), and by whom.
/// One stream (the learning strategies learn first-token times from streams): the
/// fallback that picked its target, if any, and the engine that served it.
fn explained(addr: SocketAddr) -> (Option<String>, String) {
    let r = call(
        addr,
        &post(
            "/v1/chat/completions",
            &[("x-rolter-explain", "1")],
            &chat_body(true),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    (
        r.header("x-rolter-fallback").map(str::to_string),
        r.header("x-mock-engine").unwrap().to_string(),
    )
}

#[test]
fn an_unchanged_route_keeps_what_its_strategy_learned_and_a_changed_one_starts_fresh() {
    let d = drivers()[0];
    let mocks = vec![
        mock("e0", |_| {}),
        mock("e1", |c| c.ttft = Duration::from_millis(40)),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rolter.toml");
    learning_config(&path, driver_name(d), &mocks, "min_samples = 3", "random");
    let g = Gateway::start(rolter::config::load_file(&path).unwrap()).unwrap();
    let addr = g.local_addr();
    // Cold at first; warm once both targets have their samples (on every core).
    assert_eq!(explained(addr).0.as_deref(), Some("cold"));
    // Each connection lands on either core: warm means several answers in a row warm.
    wait_for("fastest warm", Duration::from_secs(10), || {
        (0..8).all(|_| explained(addr).0.is_none())
    });
    assert_eq!(
        explained(addr),
        (None, "e0".to_string()),
        "the fast one wins"
    );

    // Only the other route changes: `main` keeps its TTFT averages.
    learning_config(
        &path,
        driver_name(d),
        &mocks,
        "min_samples = 3",
        "round_robin",
    );
    let r = g.reload().unwrap();
    assert_eq!(r.routes_kept, 1, "{r}");
    for _ in 0..4 {
        assert_eq!(explained(addr), (None, "e0".to_string()), "still warm");
    }

    // `main`'s options change: its strategy starts fresh, cold again.
    learning_config(
        &path,
        driver_name(d),
        &mocks,
        "min_samples = 4",
        "round_robin",
    );
    let r = g.reload().unwrap();
    assert_eq!(r.routes_kept, 1, "`side` is unchanged: {r}");
    assert_eq!(explained(addr).0.as_deref(), Some("cold"));
    g.shutdown(Duration::from_secs(1));
}

#[test]
fn records_of_a_configuration_two_reloads_old_fold_where_their_indices_mean_the_same() {
    let d = drivers()[0];
    let driver = driver_name(d);
    let mocks: Vec<MockHandle> = (0..2)
        .map(|i| {
            mock(&format!("e{i}"), |c| {
                c.itl = Duration::from_millis(20);
                c.tokens = 60;
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rolter.toml");
    write_config(
        &path,
        driver,
        &mocks,
        &[0, 1],
        &routes("round_robin", &[0, 1], false),
    );
    let g = Gateway::start(rolter::config::load_file(&path).unwrap()).unwrap();
    let (addr, admin) = (g.local_addr(), g.admin_addr().unwrap());
    // Streams that outlive both reloads, on the first configuration.
    let streams: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                call(addr, &post("/v1/chat/completions", &[], &chat_body(true)))
            })
        })
        .collect();
    wait_for("streams running", Duration::from_secs(5), || {
        mocks.iter().map(|m| m.stats().running).sum::<u64>() == 4
    });
    // Same names and indices: the first configuration's records fold into the second's plane.
    write_config(
        &path,
        driver,
        &mocks,
        &[0, 1],
        &routes("least_loaded", &[0, 1], false),
    );
    g.reload().unwrap();
    // Target e0 goes: index 0 now means e1, and there is one target only.
    write_config(
        &path,
        driver,
        &mocks,
        &[1],
        &routes("round_robin", &[1], false),
    );
    g.reload().unwrap();
    for s in streams {
        let r = s.join().unwrap();
        assert_eq!(sse_events(&r.body).last().unwrap().1, "[DONE]");
    }
    // The control thread took the first configuration's last records without confusing
    // their indices: it still answers, and the requests of the third count for e1 alone.
    std::thread::sleep(Duration::from_millis(100));
    let m = call(admin, &request("GET", "/metrics", &[], ""));
    assert_eq!(m.status, 200);
    let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(false)));
    assert_eq!(r.header("x-mock-engine"), Some("e1"));
    let t = call(admin, &request("GET", "/admin/targets", &[], "")).json();
    assert_eq!(t["targets"].as_array().unwrap().len(), 1, "{t}");
    g.shutdown(Duration::from_secs(1));
}
