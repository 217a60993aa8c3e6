//! `[health]`, `[metrics_scrape]`, `[admin]`, `[adaptive]`.

use super::*;

// ------------------------------------------------------------------ [health], [metrics_scrape], [admin], [adaptive]

fn keys(errs: &[ConfigError]) -> Vec<&str> {
    errs.iter().map(|e| e.key.as_str()).collect()
}

#[test]
fn new_sections_absent_give_defaults() {
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.health, HealthConfig::default());
    assert!(!c.health.active);
    assert_eq!(c.health.failures, 5, "passive ejection is on by default");
    assert_eq!(c.scrape, ScrapeConfig::default());
    assert!(!c.scrape.enabled);
    assert_eq!(c.admin, None);
    assert!(c.catalog.is_empty());
    assert_eq!(c.adaptive, AdaptiveConfig { enabled: true });
    let t = &c.targets[0];
    assert_eq!(t.health_path, None);
    assert!(t.scrape);
    assert_eq!(t.metrics_path, None);
}

#[test]
fn new_sections_present_but_empty_give_defaults() {
    let c = load(&format!(
        "[health]\n[metrics_scrape]\n[admin]\n[catalog]\n[adaptive]\n{ONE_TARGET}"
    ))
    .unwrap();
    let h = &c.health;
    assert!(h.active);
    assert_eq!(h.path, "/health");
    assert_eq!(h.interval, Duration::from_secs(5));
    assert_eq!(h.timeout, Duration::from_secs(1));
    assert_eq!(h.healthy_threshold, 2);
    assert_eq!(h.unhealthy_threshold, 3);
    assert_eq!(h.failures, 5);
    assert_eq!(h.ejection_time, Duration::from_secs(10));
    assert_eq!(h.max_ejection_time, Duration::from_secs(300));
    assert_eq!(h.max_ejected_percent, 50);
    let s = &c.scrape;
    assert!(s.enabled);
    assert_eq!(s.path, "/metrics");
    assert_eq!(s.interval, Duration::from_secs(1));
    assert_eq!(s.timeout, Duration::from_millis(500));
    assert_eq!(s.stale_after, Duration::from_secs(3));
    assert_eq!(
        c.admin,
        Some(AdminConfig {
            listen: DEFAULT_ADMIN_LISTEN.parse().unwrap(),
            token: None
        })
    );
    assert_eq!(c.admin.unwrap().listen, "127.0.0.1:9091".parse().unwrap());
    assert!(c.catalog.is_empty());
    assert!(c.adaptive.enabled);
}

#[test]
fn health_values() {
    let c = load(&format!(
        "[health]\nactive = false\npath = \"/v1/models\"\ninterval = \"2s\"\ntimeout = \"1500ms\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 7\nfailures = 0\nejection_time = \"30s\"\n\
         max_ejection_time = \"30s\"\nmax_ejected_percent = 100\nlatency_factor = 4.0\n\
         latency_for = \"1m\"\nlatency_min_samples = 50\nslow_start_window = \"30s\"\n\
         slow_start_aggression = 2.0\nslow_start_min_weight = 0.2\n{ONE_TARGET}"
    ))
    .unwrap();
    assert_eq!(
        c.health,
        HealthConfig {
            active: false,
            path: "/v1/models".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_millis(1500),
            healthy_threshold: 1,
            unhealthy_threshold: 7,
            failures: 0,
            ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(30),
            max_ejected_percent: 100,
            latency_factor: 4.0,
            latency_for: Duration::from_secs(60),
            latency_min_samples: 50,
            slow_start_window: Duration::from_secs(30),
            slow_start_aggression: 2.0,
            slow_start_min_weight: 0.2,
        }
    );
    for (line, key) in [
        ("latency_factor = 0.5", "health.latency_factor"),
        ("latency_for = \"0s\"", "health.latency_for"),
        (
            "slow_start_aggression = 0.0",
            "health.slow_start_aggression",
        ),
        (
            "slow_start_min_weight = 1.5",
            "health.slow_start_min_weight",
        ),
    ] {
        let errs = errors(&format!("[health]\n{line}\n{ONE_TARGET}"));
        assert!(errs.iter().any(|e| e.key == key), "{line}: {errs:?}");
    }
    let c = load(&format!("[health]\nmax_ejected_percent = 0\n{ONE_TARGET}")).unwrap();
    assert_eq!(c.health.max_ejected_percent, 0);
}

#[test]
fn health_errors() {
    let text = format!(
        "[health]\nactive = true\npath = \"health\"\ninterval = \"0s\"\ntimeout = \"0ms\"\n\
         healthy_threshold = 0\nunhealthy_threshold = -1\nfailures = -1\nejection_time = \"0s\"\n\
         max_ejection_time = \"forever\"\nmax_ejected_percent = 101\n{ONE_TARGET}"
    );
    let errs = errors(&text);
    let e = error_at(&errs, "health.path");
    assert!(e.message.contains("does not start with \"/\""), "{e}");
    assert!(e.fix.contains("\"/health\""), "{e}");
    let e = error_at(&errs, "health.interval");
    assert!(e.message.contains("zero"), "{e}");
    assert!(e.fix.contains("\"5s\""), "{e}");
    assert!(error_at(&errs, "health.timeout").message.contains("zero"));
    let e = error_at(&errs, "health.healthy_threshold");
    assert!(e.message.contains("at least 1"), "{e}");
    assert!(e.fix.contains("(default 2)"), "{e}");
    let e = error_at(&errs, "health.unhealthy_threshold");
    assert!(e.message.contains("-1"), "{e}");
    assert!(e.fix.contains("(default 3)"), "{e}");
    let e = error_at(&errs, "health.failures");
    assert!(e.message.contains("at least 0"), "{e}");
    assert!(e.fix.contains("0 turns passive ejection off"), "{e}");
    assert!(e.fix.contains("(default 5)"), "{e}");
    assert!(error_at(&errs, "health.ejection_time")
        .message
        .contains("zero"));
    assert!(error_at(&errs, "health.max_ejection_time")
        .message
        .contains("not a duration"));
    let e = error_at(&errs, "health.max_ejected_percent");
    assert!(e.message.contains("between 0 and 100"), "{e}");
    assert_eq!(errs.len(), 9, "{}", ConfigErrors { errors: errs });

    // A path with a space, and a duration without a unit.
    let errs = errors(&format!(
        "[health]\npath = \"/he alth\"\ninterval = 5\n{ONE_TARGET}"
    ));
    assert!(error_at(&errs, "health.path").message.contains("' '"));
    assert!(error_at(&errs, "health.interval").fix.contains("\"5s\""));
}

#[test]
fn health_cross_checks() {
    // timeout must be shorter than interval.
    let errs = errors(&format!(
        "[health]\ninterval = \"1s\"\ntimeout = \"1s\"\n{ONE_TARGET}"
    ));
    let e = error_at(&errs, "health.timeout");
    assert!(e.message.contains("not shorter than interval 1s"), "{e}");
    assert!(e.fix.contains("timeout = \"500ms\""), "{e}");
    assert_eq!(errs.len(), 1);
    // The default timeout (1s) against a short interval: the message says it is the default.
    let errs = errors(&format!("[health]\ninterval = \"800ms\"\n{ONE_TARGET}"));
    let e = error_at(&errs, "health.timeout");
    assert!(e.message.contains("(the default)"), "{e}");
    // max_ejection_time must be at least ejection_time (the default 5m included).
    let errs = errors(&format!("[health]\nejection_time = \"10m\"\n{ONE_TARGET}"));
    let e = error_at(&errs, "health.max_ejection_time");
    assert!(e.message.contains("shorter than ejection_time 10m"), "{e}");
    assert!(e.message.contains("(the default)"), "{e}");
    assert!(e.fix.contains("max_ejection_time = "), "{e}");
    let errs = errors(&format!(
        "[health]\nejection_time = \"1m\"\nmax_ejection_time = \"30s\"\n{ONE_TARGET}"
    ));
    assert_eq!(keys(&errs), vec!["health.max_ejection_time"]);
}

#[test]
fn scrape_values() {
    let c = load(&format!(
        "[metrics_scrape]\nenabled = false\npath = \"/prom\"\ninterval = \"2s\"\ntimeout = \"2s\"\n\
         stale_after = \"2s\"\n{ONE_TARGET}"
    ))
    .unwrap();
    assert_eq!(
        c.scrape,
        ScrapeConfig {
            enabled: false,
            path: "/prom".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(2),
            stale_after: Duration::from_secs(2),
        }
    );
    // stale_after defaults to three intervals.
    let c = load(&format!(
        "[metrics_scrape]\ninterval = \"250ms\"\ntimeout = \"100ms\"\n{ONE_TARGET}"
    ))
    .unwrap();
    assert_eq!(c.scrape.stale_after, Duration::from_millis(750));
}

#[test]
fn scrape_errors() {
    let errs = errors(&format!(
        "[metrics_scrape]\nenabled = true\npath = \"\"\ninterval = \"0s\"\ntimeout = \"0s\"\n\
         stale_after = \"0s\"\n{ONE_TARGET}"
    ));
    let e = error_at(&errs, "metrics_scrape.path");
    assert!(e.fix.contains("\"/metrics\""), "{e}");
    assert!(error_at(&errs, "metrics_scrape.interval")
        .message
        .contains("zero"));
    assert!(error_at(&errs, "metrics_scrape.timeout")
        .message
        .contains("zero"));
    assert!(error_at(&errs, "metrics_scrape.stale_after")
        .message
        .contains("zero"));
    assert_eq!(errs.len(), 4, "{}", ConfigErrors { errors: errs });

    // timeout longer than interval (the default 500ms against 200ms too).
    let errs = errors(&format!(
        "[metrics_scrape]\ninterval = \"1s\"\ntimeout = \"2s\"\n{ONE_TARGET}"
    ));
    let e = error_at(&errs, "metrics_scrape.timeout");
    assert!(e.message.contains("longer than interval 1s"), "{e}");
    assert!(e.fix.contains("or raise interval"), "{e}");
    let errs = errors(&format!(
        "[metrics_scrape]\ninterval = \"200ms\"\n{ONE_TARGET}"
    ));
    assert!(error_at(&errs, "metrics_scrape.timeout")
        .message
        .contains("(the default)"));

    // stale_after shorter than interval.
    let errs = errors(&format!(
        "[metrics_scrape]\ninterval = \"2s\"\nstale_after = \"1s\"\n{ONE_TARGET}"
    ));
    let e = error_at(&errs, "metrics_scrape.stale_after");
    assert!(e.message.contains("shorter than interval 2s"), "{e}");
    assert!(e.fix.contains("stale_after = \"6s\""), "{e}");
    assert_eq!(errs.len(), 1);

    let errs = errors(&format!(
        "[metrics_scrape]\npath = \"metrics\"\n{ONE_TARGET}"
    ));
    assert!(error_at(&errs, "metrics_scrape.path")
        .fix
        .contains("\"/metrics\""));
}

#[test]
fn admin_values() {
    let c = load(&format!(
        "[admin]\nlisten = \"0.0.0.0:9100\"\ntoken = \"${{TOKEN}}-${{ROLTER_ADMIN_TOKEN}}\"\n{ONE_TARGET}"
    ))
    .unwrap();
    let a = c.admin.unwrap();
    assert_eq!(a.listen, "0.0.0.0:9100".parse().unwrap());
    assert_eq!(a.token.as_deref(), Some("abc-admin-secret-42"));
    // Host names resolve like server.listen; a literal token is kept as written.
    let c = load(&format!(
        "[admin]\nlisten = \"localhost:9200\"\ntoken = \"literal$token\"\n{ONE_TARGET}"
    ))
    .unwrap();
    let a = c.admin.unwrap();
    assert_eq!(a.listen, "127.0.0.1:9200".parse().unwrap());
    assert_eq!(a.token.as_deref(), Some("literal$token"));
    // A different port on the same address as the client listener is fine.
    load(&format!(
        "[server]\nlisten = \"0.0.0.0:8080\"\n[admin]\nlisten = \"0.0.0.0:8081\"\n{ONE_TARGET}"
    ))
    .unwrap();
}

#[test]
fn admin_errors() {
    for (listen, needle) in [
        ("nope", "has no port"),
        ("127.0.0.1:99999", "invalid port"),
        (":9091", "has no host"),
        ("no-such-host.invalid:9091", "cannot resolve host"),
    ] {
        let errs = errors(&format!("[admin]\nlisten = \"{listen}\"\n{ONE_TARGET}"));
        let e = error_at(&errs, "admin.listen");
        assert!(e.message.contains(needle), "{listen}: {e}");
        assert!(e.fix.contains(":9091"), "{e}");
    }
    // The admin listener may not take the client listener's port.
    for (server, admin) in [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("0.0.0.0:9091", "127.0.0.1:9091"),
    ] {
        let errs = errors(&format!(
            "[server]\nlisten = \"{server}\"\n[admin]\nlisten = \"{admin}\"\n{ONE_TARGET}"
        ));
        let e = error_at(&errs, "admin.listen");
        assert!(e.message.contains("overlaps"), "{e}");
        assert!(e.fix.contains("its own port"), "{e}");
    }

    for (token, needle) in [
        ("", "token is empty"),
        ("${EMPTY}", "empty after expanding"),
        ("${NOT_SET_ANYWHERE}", "`NOT_SET_ANYWHERE` is not set"),
        ("${EVIL}", "whitespace or a control character"),
        ("${SPACEY}", "whitespace or a control character"),
        ("tab\\there", "whitespace or a control character"),
        ("${unclosed", "without a closing"),
    ] {
        let errs = errors(&format!("[admin]\ntoken = \"{token}\"\n{ONE_TARGET}"));
        let e = error_at(&errs, "admin.token");
        assert!(e.message.contains(needle), "{token}: {e}");
        assert!(!e.fix.is_empty());
        // The secret is never echoed.
        assert!(!e.to_string().contains("two words"), "{e}");
        assert!(!e.to_string().contains("Injected"), "{e}");
        assert_eq!(errs.len(), 1, "{}", ConfigErrors { errors: errs });
    }
}

#[test]
fn adaptive_switch() {
    let c = load(&format!("[adaptive]\nenabled = false\n{ONE_TARGET}")).unwrap();
    assert!(!c.adaptive.enabled);
    let c = load(&format!("[adaptive]\nenabled = true\n{ONE_TARGET}")).unwrap();
    assert!(c.adaptive.enabled);
    let errs = errors(&format!("[adaptive]\nenabled = \"yes\"\n{ONE_TARGET}"));
    assert!(error_at(&errs, "adaptive.enabled")
        .message
        .contains("boolean"));
}

#[test]
fn log_defaults_and_values() {
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.log, LogConfig::default());
    assert_eq!(c.log.access, AccessLogDest::Stdout);
    assert_eq!(c.log.sample, 1.0);
    assert_eq!(c.log.format, LogFormat::Text);
    let c = load(&format!(
        "[log]\naccess = \"/var/log/rolter/access.log\"\nsample = 0.25\nformat = \"json\"\n{ONE_TARGET}"
    ))
    .unwrap();
    assert_eq!(
        c.log.access,
        AccessLogDest::File("/var/log/rolter/access.log".into())
    );
    assert_eq!(c.log.sample, 0.25);
    assert_eq!(c.log.format, LogFormat::Json);
    let c = load(&format!("[log]\naccess = \"off\"\n{ONE_TARGET}")).unwrap();
    assert_eq!(c.log.access, AccessLogDest::Off);
}

#[test]
fn log_errors_name_the_key_and_the_fix() {
    let errs = errors(&format!(
        "[log]\naccess = \"\"\nsample = 1.5\nformat = \"yaml\"\n{ONE_TARGET}"
    ));
    assert!(error_at(&errs, "log.access").fix.contains("stdout"));
    let e = error_at(&errs, "log.sample");
    assert!(e.message.contains("1.5") && e.fix.contains("0.1"), "{e:?}");
    let e = error_at(&errs, "log.format");
    assert!(
        e.message.contains("yaml") && e.fix.contains("json"),
        "{e:?}"
    );
    let errs = errors(&format!("[log]\nacess = \"off\"\n{ONE_TARGET}"));
    assert!(
        errs.iter()
            .any(|e| e.key.contains("acess") && format!("{e:?}").contains("access")),
        "{errs:?}"
    );
}

#[test]
fn max_connections_defaults_and_errors() {
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.server.max_connections, crate::DEFAULT_MAX_CONNECTIONS);
    let c = load(&format!("[server]\nmax_connections = 64\n{ONE_TARGET}")).unwrap();
    assert_eq!(c.server.max_connections, 64);
    let errs = errors(&format!("[server]\nmax_connections = 0\n{ONE_TARGET}"));
    let e = error_at(&errs, "server.max_connections");
    assert!(e.message.contains('0') && e.fix.contains("10000"), "{e:?}");
}
