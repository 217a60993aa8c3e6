//! `[state]`: the shared state store, and the routes that need it.

use super::*;

const RR_ATOMIC: &str = r#"
[[targets]]
name = "a"
url = "http://localhost:8001"
[[targets]]
name = "b"
url = "http://localhost:8002"
[[routes]]
name = "chat"
targets = ["a", "b"]
strategy = { name = "round_robin", atomic = true, lease = 4 }
"#;

#[test]
fn atomic_without_a_store_is_refused_with_the_way_to_configure_one() {
    let errs = errors(RR_ATOMIC);
    let e = error_at(&errs, "routes[0].strategy");
    assert!(
        e.message.contains("`round_robin` with atomic = true")
            && e.message.contains("no [state] is configured"),
        "{}",
        e.message
    );
    let fix = &e.fix;
    assert!(
        fix.contains("[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\""),
        "{fix}"
    );
    // Every strategy option that uses the store says so, through wrappers too.
    for (strategy, phrase) in [
        (
            r#"{ name = "fair_catchup", durable = true }"#,
            "`fair_catchup` with durable = true",
        ),
        (
            r#"{ name = "cache_aware", share_prefixes = true }"#,
            "`cache_aware` with share_prefixes = true",
        ),
        (
            r#"{ name = "pipeline", share_sessions = true }"#,
            "`pipeline` with share_sessions = true",
        ),
        (
            r#"{ name = "least_loaded", fleet_load = true }"#,
            "`least_loaded` with fleet_load = true",
        ),
        (
            r#"{ name = "p2c", fleet_load = true }"#,
            "`power_of_two` with fleet_load = true",
        ),
        (
            r#"{ name = "fair_catchup", base_strategy = { name = "round_robin", atomic = true } }"#,
            "`fair_catchup` with base_strategy `round_robin` with atomic = true",
        ),
    ] {
        let text = RR_ATOMIC.replace(
            r#"{ name = "round_robin", atomic = true, lease = 4 }"#,
            strategy,
        );
        let errs = errors(&text);
        let e = error_at(&errs, "routes[0].strategy");
        assert!(e.message.contains(phrase), "{strategy}: {}", e.message);
    }
    // With a store the same file loads.
    let c = load(&format!(
        "{RR_ATOMIC}\n[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n"
    ))
    .unwrap();
    let store = c.routes[0].strategy.requirements().store.unwrap();
    assert_eq!(store.rotation, Some(4));
}

#[test]
fn state_defaults_and_credentials_from_the_environment() {
    let c = load(&format!(
        "{RR_ATOMIC}\n[state]\nbackend = \"redis\"\nurl = \"rediss://cache.internal:6380\"\nusername_env = \"REDIS_USER\"\n"
    ))
    .unwrap();
    let s = c.state.unwrap();
    let d = StateConfig::with_url("rediss://cache.internal:6380");
    assert_eq!(s.urls, d.urls);
    assert_eq!(s.topology, StateTopology::Standalone);
    assert_eq!(s.username.as_deref(), Some("gateway"));
    // The default variable is read when it is set.
    assert_eq!(s.password.as_deref(), Some("s3cret"));
    assert_eq!(
        (
            s.connect_timeout,
            s.command_timeout,
            s.pick_timeout,
            s.sync_interval
        ),
        (
            d.connect_timeout,
            d.command_timeout,
            d.pick_timeout,
            d.sync_interval
        )
    );
    assert_eq!(s.key_prefix, "rolter");
    assert!(s.share_load);
    // The password never shows in Debug (what a reload compares and logs).
    let shown = format!("{s:?}");
    assert!(
        !shown.contains("s3cret") && shown.contains("redacted"),
        "{shown}"
    );
}

#[test]
fn state_errors_name_the_key_and_the_fix() {
    let base = "[[targets]]\nname = \"a\"\nurl = \"http://localhost:8001\"\n[state]\n";
    for (body, key, says) in [
        ("url = \"redis://x:1\"\n", "state.backend", "has no `backend`"),
        ("backend = \"memcached\"\nurl = \"redis://x:1\"\n", "state.backend", "unknown state backend"),
        ("backend = \"redis\"\n", "state.url", "names no server"),
        ("backend = \"redis\"\nurl = \"http://x:1\"\n", "state.url", "not a redis://"),
        ("backend = \"redis\"\nurl = \"redis://user:pw@x:1\"\n", "state.url", "carries credentials"),
        ("backend = \"redis\"\nurl = \"redis://x:1\"\nurls = [\"redis://y:1\"]\n", "state.urls", "both `url` and `urls`"),
        ("backend = \"redis\"\nurls = [\"redis://x:1\"]\nsentinel_master = \"m\"\ncluster = true\n", "state.cluster", "both"),
        ("backend = \"redis\"\nurl = \"redis://x:1\"\npassword_env = \"NOPE\"\n", "state.password_env", "NOPE is not set"),
        ("backend = \"redis\"\nurl = \"redis://x:1\"\nkey_prefix = \"a{b}\"\n", "state.key_prefix", "braces"),
        ("backend = \"redis\"\nurl = \"redis://x:1\"\npick_timeout = \"0s\"\n", "state.pick_timeout", "zero"),
        ("backend = \"redis\"\nurl = \"redis://x:1\"\nsync_intervall = \"1s\"\n", "state.sync_intervall", "unknown key"),
    ] {
        let errs = errors(&format!("{base}{body}"));
        let e = error_at(&errs, key);
        assert!(e.message.contains(says), "{body}: {}", e.message);
        assert!(!e.fix.is_empty(), "{body}: no fix");
    }
    // fleet_load needs the replicas to publish their load.
    let text = format!(
        "{base}backend = \"redis\"\nurl = \"redis://x:1\"\nshare_load = false\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nstrategy = {{ name = \"least_loaded\", fleet_load = true }}\n"
    );
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].strategy")
        .message
        .contains("share_load = false"));
    let c = load(&format!(
        "{base}backend = \"valkey\"\nurls = [\"redis://s1:26379\", \"redis://s2:26379\"]\nsentinel_master = \"mymaster\"\n"
    ))
    .unwrap();
    let s = c.state.unwrap();
    assert_eq!(
        s.topology,
        StateTopology::Sentinel {
            master: "mymaster".into()
        }
    );
    assert_eq!(s.urls.len(), 2);
}
