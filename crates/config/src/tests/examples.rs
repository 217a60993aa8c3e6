//! The example configurations and the defaults.

use super::prices::{price_errors, spec};
use super::*;

// ------------------------------------------------------------------ examples

#[test]
fn pd_fleet_example_loads() {
    let c =
        load(include_str!("../../../../config/pd-fleet.toml")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = c.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "prefill-0",
            "prefill-1",
            "decode-0[0]",
            "decode-0[1]",
            "decode-0[2]",
            "decode-0[3]",
            "decode-1"
        ]
    );
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[0].targets, vec![2, 3, 4, 5, 6]);
    assert_eq!(c.routes[1].name, "chat/prefill");
    assert_eq!(c.routes[1].targets, vec![0, 1]);
    assert_eq!(c.targets[3].max_concurrent, Some(64));
}

#[test]
fn vllm_fleet_example_loads() {
    let c = load(FLEET).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.targets.len(), 3);
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.server.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(c.routes[0].name, "chat");
    assert_eq!(c.routes[0].targets, vec![0, 1, 2]);
    assert_eq!(c.routes[0].strategy.name(), "round_robin");
    assert_eq!(c.routes[0].matcher.paths, vec!["/v1/chat/completions"]);
    assert_eq!(c.routes[1].matcher.paths, vec!["/v1/completions"]);
    assert_eq!(c.targets[2].weight, 2.0);
    assert_eq!(c.targets[0].addr, "10.0.0.11:8000".parse().unwrap());
    assert_eq!(c.targets[0].max_concurrent, Some(64));
    assert_eq!(c.targets[0].health_path.as_deref(), Some("/health"));
    assert_eq!(c.targets[0].metrics_path.as_deref(), Some("/metrics"));
    assert_eq!(c.targets[1].health_path, None);
    assert!(c.targets.iter().all(|t| t.scrape));
    // The example spells out every default of the three sections.
    assert_eq!(
        c.health,
        HealthConfig {
            active: true,
            ..HealthConfig::default()
        }
    );
    assert_eq!(
        c.scrape,
        ScrapeConfig {
            enabled: true,
            ..ScrapeConfig::default()
        }
    );
    assert_eq!(
        c.admin,
        Some(AdminConfig {
            listen: "127.0.0.1:9091".parse().unwrap(),
            token: None
        })
    );
    assert!(c.catalog.is_empty());
    assert!(c.adaptive.enabled);
}

#[test]
fn vllm_fleet_example_loads_from_file_with_system_resolver() {
    // Only IP literals: no DNS needed.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/vllm-fleet.toml");
    let c = load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.source, path);
    assert_eq!(c.targets.len(), 3);
}

#[test]
fn managed_api_example_loads() {
    let c = load(MANAGED).unwrap_or_else(|e| panic!("{e}"));
    let t = &c.targets[0];
    assert!(t.tls);
    assert_eq!(t.addr, "192.0.2.10:443".parse().unwrap());
    assert_eq!(t.server_name, "api.openai.com");
    assert_eq!(t.host_header, "api.openai.com");
    assert_eq!(t.base_path, "/v1");
    assert_eq!(
        t.headers,
        vec![(
            "authorization".to_string(),
            "Bearer sk-test-123".to_string()
        )]
    );
    assert_eq!(t.upstream_models["gpt-4o-mini"], "gpt-4o-mini-2024-07-18");
    assert_eq!(t.price, None);
    assert_eq!(t.timeouts.connect, Duration::from_secs(5));
    assert_eq!(t.health_path.as_deref(), Some(""));
    assert!(!t.scrape);
    assert!(!c.routes[0].forward_client_auth);
    // [health] is present (active checks on), but this target opts out of them.
    assert!(c.health.active);
    assert_eq!(c.health.failures, 5);
    assert!(!c.scrape.enabled);
    let admin = c.admin.as_ref().unwrap();
    assert_eq!(admin.listen, "127.0.0.1:9091".parse().unwrap());
    assert_eq!(admin.token.as_deref(), Some("admin-secret-42"));
    // The dated upstream name is priced by [catalog].
    let mini = Price {
        input_per_mtok: 0.15,
        output_per_mtok: 0.60,
    };
    assert_eq!(c.catalog["gpt-4o-mini-2024-07-18"], mini);
    assert_eq!(price_book(&c).price(0, "gpt-4o-mini"), Some(mini));
    // Every target of the example has a known price, so a price-ranked route would load.
    let mut cheap = c.clone();
    cheap.routes[0].strategy = spec("cheapest", "");
    assert!(price_errors(&cheap).is_empty());
}

#[test]
fn managed_api_example_without_key_names_the_variable() {
    let errs = load_with(MANAGED, "managed.toml", &fake_resolve, &|_| None).unwrap_err();
    let e = error_at(&errs.errors, "targets[0].headers.Authorization");
    assert!(e.message.contains("OPENAI_API_KEY"), "{e}");
    assert!(e.fix.contains("export OPENAI_API_KEY"), "{e}");
    let e = error_at(&errs.errors, "admin.token");
    assert!(e.message.contains("ROLTER_ADMIN_TOKEN"), "{e}");
}

// ------------------------------------------------------------------ defaults

#[test]
fn defaults_and_implicit_route() {
    let text = format!("{ONE_TARGET}[[targets]]\nname = \"b\"\nurl = \"http://10.0.0.2\"\n");
    let c = load(&text).unwrap();
    assert_eq!(c.source, std::path::PathBuf::from("test.toml"));
    let s = &c.server;
    assert_eq!(s.listen, "127.0.0.1:8080".parse().unwrap());
    assert!(s.workers >= 1);
    assert_eq!(
        s.workers,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    assert!(s.pin_workers);
    assert_eq!(s.driver, DriverChoice::Auto);
    assert_eq!(s.shutdown_grace, Duration::from_secs(30));
    let l = &s.limits;
    assert_eq!(l.max_head_bytes, 32768);
    assert_eq!(l.max_headers, 100);
    assert_eq!(l.max_uri_bytes, 8192);
    assert_eq!(l.max_body_bytes, 8 * 1024 * 1024);
    assert_eq!(l.head_timeout, Duration::from_secs(10));
    assert_eq!(l.body_timeout, Duration::from_secs(30));
    assert_eq!(l.keepalive_timeout, Duration::from_secs(60));
    assert_eq!(l.write_timeout, Duration::from_secs(30));

    let t = &c.targets[1];
    assert_eq!(t.weight, 1.0);
    assert_eq!(t.tier, 0);
    assert!(t.models.is_empty() && t.headers.is_empty() && t.upstream_models.is_empty());
    assert_eq!(t.max_concurrent, None);
    assert_eq!(t.price, None);
    assert_eq!(t.timeouts.connect, Duration::from_secs(3));
    assert_eq!(t.timeouts.first_byte, Duration::from_secs(120));
    assert_eq!(t.timeouts.idle, Duration::from_secs(60));
    assert_eq!(t.pool.max_idle, 64);
    assert_eq!(t.pool.idle_timeout, Duration::from_secs(60));
    assert_eq!(t.addr, "10.0.0.2:80".parse().unwrap());
    assert!(!t.tls);

    assert_eq!(c.routes.len(), 1);
    let r = &c.routes[0];
    assert_eq!(r.name, "default");
    assert_eq!(r.targets, vec![0, 1]);
    assert_eq!(r.strategy.name(), "round_robin");
    assert!(r.strategy.is_default());
    assert!(!r.forward_client_auth);
    assert_eq!(r.retries, 1);
    assert!(r.matcher.paths.is_empty() && r.matcher.models.is_empty());
    assert!(r.matcher.header.is_none());
}

#[test]
fn explicit_route_defaults() {
    let text = format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n");
    let c = load(&text).unwrap();
    let r = &c.routes[0];
    assert_eq!(r.strategy.name(), "round_robin");
    assert_eq!(r.retries, 1);
    assert!(!r.forward_client_auth);
}

#[test]
fn zero_weight_drains_and_negative_weight_is_an_error() {
    for w in ["0", "0.0"] {
        let c = load(&format!("{ONE_TARGET}weight = {w}\n")).unwrap_or_else(|e| panic!("{w}: {e}"));
        assert_eq!(c.targets[0].weight, 0.0, "{w}");
    }
    let c = load(&format!("{ONE_TARGET}weight = 3\n")).unwrap();
    assert_eq!(c.targets[0].weight, 3.0);
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.targets[0].weight, 1.0);

    let errs = errors(&format!("{ONE_TARGET}weight = -3.5\n"));
    let e = error_at(&errs, "targets[0].weight");
    assert!(e.message.contains("-3.5"), "{e}");
    assert!(e.message.contains("must not be negative"), "{e}");
    assert!(e.fix.contains("0 to drain"), "{e}");
    for w in ["inf", "nan", "-inf"] {
        let errs = errors(&format!("{ONE_TARGET}weight = {w}\n"));
        error_at(&errs, "targets[0].weight");
    }
}

#[test]
fn server_values() {
    let text = format!(
        "[server]\nlisten = \"localhost:9000\"\nworkers = 3\npin_workers = false\n\
         driver = \"epoll\"\nshutdown_grace = \"0s\"\n[server.limits]\nmax_body_bytes = 1024\n\
         head_timeout = \"250ms\"\n{ONE_TARGET}"
    );
    let c = load(&text).unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(c.server.workers, 3);
    assert!(!c.server.pin_workers);
    assert_eq!(c.server.driver, DriverChoice::Epoll);
    assert_eq!(c.server.shutdown_grace, Duration::ZERO);
    assert_eq!(c.server.limits.max_body_bytes, 1024);
    assert_eq!(c.server.limits.head_timeout, Duration::from_millis(250));
    let c = load(&format!("[server]\ndriver = \"io_uring\"\n{ONE_TARGET}")).unwrap();
    assert_eq!(c.server.driver, DriverChoice::IoUring);
}

#[test]
fn dns_refresh_defaults_to_30s_and_zero_turns_it_off() {
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.server.dns_refresh, Duration::from_secs(30));
    assert_eq!(
        c.targets[0].dns_name, None,
        "an IP address is not re-resolved"
    );
    let text = String::from(
        "[server]\ndns_refresh = \"5m\"\n[[targets]]\nname = \"e\"\nurl = \"http://engine.internal:8000\"\n"
    );
    let c = load(&text).unwrap();
    assert_eq!(c.server.dns_refresh, Duration::from_secs(300));
    assert_eq!(c.targets[0].dns_name.as_deref(), Some("engine.internal"));
    assert_eq!(c.targets[0].addr, "192.0.2.20:8000".parse().unwrap());
    let c = load(&format!("[server]\ndns_refresh = \"0s\"\n{ONE_TARGET}")).unwrap();
    assert_eq!(c.server.dns_refresh, Duration::ZERO);

    let errs = errors(&format!("[server]\ndns_refresh = \"30ms\"\n{ONE_TARGET}"));
    let e = error_at(&errs, "server.dns_refresh");
    assert!(e.message.contains("shorter than the minimum"), "{e}");
    assert!(e.fix.contains("\"0s\""), "{e}");
    for bad in ["\"soon\"", "30"] {
        let errs = errors(&format!("[server]\ndns_refresh = {bad}\n{ONE_TARGET}"));
        error_at(&errs, "server.dns_refresh");
    }
}

#[test]
fn busy_poll_is_off_by_default_and_bounded() {
    assert_eq!(load(ONE_TARGET).unwrap().server.busy_poll, Duration::ZERO);
    let c = load(&format!("[server]\nbusy_poll = \"250us\"\n{ONE_TARGET}")).unwrap();
    assert_eq!(c.server.busy_poll, Duration::from_micros(250));
    let errs = errors(&format!("[server]\nbusy_poll = \"1s\"\n{ONE_TARGET}"));
    let e = error_at(&errs, "server.busy_poll");
    assert!(
        e.message.contains("longer than the maximum of 100ms"),
        "{e}"
    );
    assert!(e.fix.contains("\"0s\""), "{e}");
    for bad in ["\"fast\"", "5"] {
        let errs = errors(&format!("[server]\nbusy_poll = {bad}\n{ONE_TARGET}"));
        error_at(&errs, "server.busy_poll");
    }
}

#[test]
fn server_errors() {
    let text = format!(
        "[server]\nlisten = \"nowhere\"\nworkers = -1\ndriver = \"iouring\"\n\
         [server.limits]\nmax_headers = 0\nmax_body_bytes = -5\n{ONE_TARGET}"
    );
    let errs = errors(&text);
    error_at(&errs, "server.listen");
    error_at(&errs, "server.workers");
    let d = error_at(&errs, "server.driver");
    assert!(d.fix.contains("io_uring"), "{d}");
    error_at(&errs, "server.limits.max_headers");
    error_at(&errs, "server.limits.max_body_bytes");
    assert_eq!(errs.len(), 5);
}
