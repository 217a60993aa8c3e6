//! Gateway replicas sharing state through a real `redis-server` on loopback (`[state]`):
//! one rotation for the whole fleet (`round_robin` with `atomic = true`), fair-catchup books
//! shared by the replicas and kept over a restart, session and prefix sharing of
//! `cache_aware`, and the store killed and restarted under load.

mod common;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::MockHandle;
use rolter_store::testing::RedisServer;

/// How often the replicas exchange items, books and load in these tests.
const SYNC: &str = "20ms";

fn state_section(redis: &RedisServer, prefix: &str, extra: &str) -> String {
    format!(
        "[state]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\nsync_interval = \"{SYNC}\"\nretry_interval = \"100ms\"\npick_timeout = \"50ms\"\ncommand_timeout = \"200ms\"\n{extra}\n",
        redis.url()
    )
}

/// A replica (2 workers, an admin listener) in front of `mocks` with weights `weights`, one
/// route "r" with `strategy`, sharing `redis` under `prefix`.
fn replica(
    d: DriverChoice,
    name: &str,
    mocks: &[&MockHandle],
    weights: &[f64],
    strategy: &str,
    state: &str,
) -> Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        rest.push_str(&target(
            &format!("t{i}"),
            m.addr(),
            &format!("weight = {}", weights.get(i).copied().unwrap_or(1.0)),
        ));
        names.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nstrategy = {strategy}\n[admin]\nlisten = \"127.0.0.1:0\"\n{}replica = \"{name}\"\n",
        names.join(", "),
        state
    ));
    gateway_with(d, 2, &rest)
}

/// One chat request on a new connection; the target that served it and the fallback, if any.
fn routed(addr: SocketAddr, body: &str) -> (String, Option<String>) {
    let e = explained(addr, body);
    (e.target, e.fallback)
}

fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn store_up(g: &Gateway) -> bool {
    admin_series(g, "rolter_state_up") == Some(1.0)
}

fn skip_without_redis() -> bool {
    if RedisServer::available() {
        return false;
    }
    assert!(
        std::env::var_os("ROLTER_TEST_REQUIRE_REDIS").is_none(),
        "redis-server is missing but ROLTER_TEST_REQUIRE_REDIS is set"
    );
    eprintln!("warning: redis-server is not installed; the shared-state tests are skipped");
    true
}

#[test]
fn atomic_rotation_is_one_rotation_across_three_replicas() {
    if skip_without_redis() {
        return;
    }
    let redis = RedisServer::start();
    for d in drivers() {
        let mocks: Vec<_> = (0..3).map(|i| mock(&format!("m{i}"), |_| {})).collect();
        let refs: Vec<&MockHandle> = mocks.iter().collect();
        for (weights, picks) in [(vec![1.0, 1.0, 1.0], 60usize), (vec![5.0, 1.0, 1.0], 70)] {
            let prefix = format!("rr-{}-{}", driver_name(d), weights[0]);
            let state = state_section(&redis, &prefix, "");
            let strategy = "{ name = \"round_robin\", atomic = true }";
            let replicas: Vec<Gateway> = (0..3)
                .map(|i| replica(d, &format!("gw{i}"), &refs, &weights, strategy, &state))
                .collect();
            for g in &replicas {
                wait_until("the store", Duration::from_secs(5), || store_up(g));
            }
            let mut rng = fastrand::Rng::with_seed(7);
            let mut seq = Vec::new();
            for _ in 0..picks {
                let g = &replicas[rng.usize(..3)];
                let (t, fallback) = routed(g.local_addr(), &chat_body(false));
                assert_eq!(fallback, None, "under {}: a pick fell back", driver_name(d));
                seq.push(t.trim_start_matches('t').parse::<usize>().unwrap());
            }
            let counts: Vec<usize> = (0..3)
                .map(|t| seq.iter().filter(|&&s| s == t).count())
                .collect();
            if weights[0] == 1.0 {
                // Every window of three consecutive picks, fleet-wide, hits each target once.
                for w in seq.windows(3) {
                    let mut s = w.to_vec();
                    s.sort();
                    assert_eq!(s, [0, 1, 2], "under {}: {seq:?}", driver_name(d));
                }
            } else {
                // 5:1:1 is `a a b a c a a` for the fleet: exact shares, never five in a row.
                assert_eq!(counts, [50, 10, 10], "{seq:?}");
                assert!(
                    seq.windows(5).all(|w| w.iter().any(|&t| t != 0)),
                    "five in a row: {seq:?}"
                );
                let first: Vec<usize> = seq[..7].to_vec();
                assert_eq!(first, [0, 0, 1, 0, 2, 0, 0], "the smooth sequence");
            }
            let asked: f64 = replicas
                .iter()
                .map(|g| admin_series(g, "rolter_state_rotations_total{result=\"ok\"}").unwrap())
                .sum();
            assert_eq!(
                asked as usize, picks,
                "one store call per pick with lease = 1"
            );
        }
    }
}

#[test]
fn a_lease_takes_blocks_of_positions_and_keeps_the_shares() {
    if skip_without_redis() {
        return;
    }
    let redis = RedisServer::start();
    let d = drivers()[0];
    let mocks: Vec<_> = (0..3).map(|i| mock(&format!("m{i}"), |_| {})).collect();
    let refs: Vec<&MockHandle> = mocks.iter().collect();
    let state = state_section(&redis, "lease", "");
    let strategy = "{ name = \"round_robin\", atomic = true, lease = 6 }";
    let replicas: Vec<Gateway> = (0..3)
        .map(|i| replica(d, &format!("gw{i}"), &refs, &[1.0; 3], strategy, &state))
        .collect();
    for g in &replicas {
        wait_until("the store", Duration::from_secs(5), || store_up(g));
    }
    // Each replica's requests go to one worker (one connection after another may land on
    // either of its two): the fleet takes whole blocks of six consecutive positions.
    let mut counts = [0usize; 3];
    for i in 0..72 {
        let (t, fallback) = routed(replicas[i % 3].local_addr(), &chat_body(false));
        assert_eq!(fallback, None);
        counts[t.trim_start_matches('t').parse::<usize>().unwrap()] += 1;
    }
    // Every position handed out is exact SWRR; what is still leased (at most one block per
    // core, 3 replicas x 2 cores x 5 left) is what the shares can be off by.
    for c in counts {
        assert!(
            (24usize.saturating_sub(30)..=24 + 30).contains(&c),
            "{counts:?}"
        );
        assert!(c >= 9, "every target keeps a share: {counts:?}");
    }
    let asks: f64 = replicas
        .iter()
        .map(|g| admin_series(g, "rolter_state_rotations_total{result=\"ok\"}").unwrap())
        .sum();
    let positions: f64 = replicas
        .iter()
        .map(|g| admin_series(g, "rolter_state_rotation_positions_total").unwrap())
        .sum();
    assert_eq!(positions, asks * 6.0, "each call takes six positions");
    assert!(asks <= 72.0 / 6.0 + 6.0, "{asks} store calls for 72 picks");
}

#[test]
fn store_killed_and_restarted_under_load_loses_no_request() {
    if skip_without_redis() {
        return;
    }
    let mut redis = RedisServer::start();
    let d = drivers()[0];
    let mocks: Vec<_> = (0..3).map(|i| mock(&format!("m{i}"), |_| {})).collect();
    let refs: Vec<&MockHandle> = mocks.iter().collect();
    let state = state_section(&redis, "kill", "");
    let strategy = "{ name = \"round_robin\", atomic = true }";
    let replicas: Vec<Gateway> = (0..3)
        .map(|i| replica(d, &format!("gw{i}"), &refs, &[1.0; 3], strategy, &state))
        .collect();
    for g in &replicas {
        wait_until("the store", Duration::from_secs(5), || store_up(g));
    }
    let addrs: Vec<SocketAddr> = replicas.iter().map(|g| g.local_addr()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|c| {
            let addrs = addrs.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u32;
                let mut failed = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = call(
                        addrs[(c + n as usize) % 3],
                        &post("/v1/chat/completions", &[], &chat_body(false)),
                    );
                    if r.status != 200 {
                        failed.push(format!("{} {}", r.status, r.text()));
                    }
                    n += 1;
                }
                (n, failed)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    redis.kill();
    for g in &replicas {
        wait_until(
            "the replicas to see the store gone",
            Duration::from_secs(5),
            || !store_up(g),
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    redis.restart();
    for g in &replicas {
        wait_until("the store back", Duration::from_secs(10), || store_up(g));
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for h in load {
        let (n, failed) = h.join().unwrap();
        assert!(failed.is_empty(), "requests failed: {failed:?}");
        total += n;
    }
    assert!(total > 30, "{total} requests");
    // While the store was away the picks used the local cursors, and said so.
    let fallbacks: f64 = replicas
        .iter()
        .map(|g| {
            admin_series(
                g,
                "rolter_strategy_fallbacks_total{route=\"r\",strategy=\"round_robin\",reason=\"store_unavailable\"}",
            )
            .unwrap_or(0.0)
        })
        .sum();
    assert!(fallbacks > 0.0, "no fallback counted");
    let admin = call(
        replicas[0].admin_addr().unwrap(),
        &request("GET", "/admin/state", &[], ""),
    );
    let doc: serde_json::Value = admin.json();
    assert_eq!(doc["up"], true, "{doc}");
    assert!(doc["disconnects"].as_u64().unwrap() >= 1, "{doc}");
    assert_eq!(doc["routes"][0]["rotation_lease"], 1, "{doc}");
    // Sharing resumed: one rotation again, no fallback.
    let mut seq = Vec::new();
    for i in 0..9 {
        let (t, fallback) = routed(addrs[i % 3], &chat_body(false));
        assert_eq!(fallback, None);
        seq.push(t);
    }
    for w in seq.windows(3) {
        let mut s = w.to_vec();
        s.sort();
        assert_eq!(s, ["t0", "t1", "t2"], "{seq:?}");
    }
}
