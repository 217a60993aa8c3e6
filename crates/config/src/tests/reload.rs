//! What a reload may change, and what it leaves unchanged.

use super::*;
use crate::reload::{restart_needed, same_targets, unchanged_routes, unchanged_targets};

const BASE: &str = r#"
[server]
listen = "127.0.0.1:8080"
workers = 2

[[targets]]
name = "a"
url = "http://127.0.0.1:9001"
upstream_models = { m2 = "x", m1 = "y", m3 = "z" }

[[targets]]
name = "b"
url = "http://127.0.0.1:9002"

[[routes]]
name = "one"
targets = ["a", "b"]
strategy = "least_loaded"

[[routes]]
name = "two"
targets = ["a", "b"]
strategy = "round_robin"
"#;

#[test]
fn the_same_file_changes_nothing_and_has_the_same_digest() {
    let (a, b) = (load(BASE).unwrap(), load(BASE).unwrap());
    assert!(restart_needed(&a, &b).is_empty());
    assert!(same_targets(&a, &b), "maps compare in a stable order");
    assert_eq!(unchanged_routes(&a, &b), vec![Some(0), Some(1)]);
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.digest, digest(BASE));
    assert_eq!(a.digest.len(), 64);
}

#[test]
fn listen_workers_driver_and_admin_need_a_restart() {
    let a = load(BASE).unwrap();
    let text = BASE
        .replace("127.0.0.1:8080", "127.0.0.1:8081")
        .replace("workers = 2", "workers = 3\ndriver = \"epoll\"")
        + "\n[admin]\nlisten = \"127.0.0.1:9091\"\n";
    let b = load(&text).unwrap();
    let keys: Vec<&str> = restart_needed(&a, &b).iter().map(|r| r.key).collect();
    assert_eq!(
        keys,
        [
            "server.listen",
            "server.workers",
            "server.driver",
            "admin.listen"
        ]
    );
    assert!(restart_needed(&a, &b)[1]
        .message
        .contains("changed from 2 to 3"));
}

#[test]
fn a_changed_route_starts_fresh_and_the_others_keep_their_state() {
    let a = load(BASE).unwrap();
    let b = load(&BASE.replace("strategy = \"round_robin\"", "strategy = \"random\"")).unwrap();
    assert!(restart_needed(&a, &b).is_empty());
    assert_eq!(unchanged_routes(&a, &b), vec![Some(0), None]);
}

#[test]
fn a_changed_target_keeps_the_others_but_no_route_state() {
    let a = load(BASE).unwrap();
    let b = load(&BASE.replace("127.0.0.1:9002", "127.0.0.1:9003")).unwrap();
    assert!(!same_targets(&a, &b));
    assert_eq!(
        unchanged_targets(&a.targets, &b.targets),
        vec![Some(0), None]
    );
    assert_eq!(unchanged_routes(&a, &b), vec![None, None]);
    // A target added in front: the old ones are found by name.
    let c = load(&BASE.replacen(
        "[[targets]]",
        "[[targets]]\nname = \"z\"\nurl = \"http://127.0.0.1:9009\"\n\n[[targets]]",
        1,
    ))
    .unwrap();
    assert_eq!(
        unchanged_targets(&a.targets, &c.targets),
        vec![None, Some(0), Some(1)]
    );
}
