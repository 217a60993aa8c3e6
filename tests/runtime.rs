//! Worker threads: one per configured worker, pinned to distinct cores, each accepting on
//! its own SO_REUSEPORT socket so that connections spread over the workers.
//!
//! This file holds a single test: it lists the process's `rolter-w*` threads, which another
//! gateway started by a concurrent test would disturb.

mod common;
use common::*;

use std::collections::HashSet;

/// Names and allowed-CPU lists of this process's threads called `rolter-w*`.
fn worker_threads() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = entry.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        if !comm.starts_with("rolter-w") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim()
            .to_string();
        out.push((comm, cpus));
    }
    out.sort();
    out
}

#[test]
fn workers_are_pinned_and_share_the_load() {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let m = mock("a", |_| {});
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\npin_workers = true\n\n{}",
        target("t0", m.addr(), "")
    );
    let cfg = rolter::config::load_str(&text, "<test>").unwrap();
    let g = rolter::Gateway::start(cfg).unwrap();

    let threads = worker_threads();
    assert_eq!(
        threads.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        vec!["rolter-w0", "rolter-w1"]
    );
    // Pinned: each worker may run on exactly one core, worker i on core i (mod cores).
    let ids = core_affinity::get_core_ids().unwrap();
    for (i, (_, cpus)) in threads.iter().enumerate() {
        let expected = ids[i % ids.len()].id.to_string();
        assert_eq!(cpus, &expected, "worker {i} on {cores} cores");
    }

    // Many connections: the kernel spreads them over both listeners. Each worker stamps
    // its own random prefix on the x-request-id it generates, so the engine can tell them
    // apart.
    for _ in 0..64 {
        let r = call(
            g.local_addr(),
            &post("/v1/completions", &[], r#"{"model":"m","prompt":"x"}"#),
        );
        assert_eq!(r.status, 200);
    }
    let prefixes: HashSet<String> = m
        .requests()
        .iter()
        .filter_map(|r| r.header("x-request-id").map(|v| v[..8].to_string()))
        .collect();
    assert_eq!(
        prefixes.len(),
        2,
        "connections reached both workers: {prefixes:?}"
    );
    g.shutdown(std::time::Duration::from_secs(1));
    assert!(worker_threads().is_empty(), "workers exit on shutdown");
}
