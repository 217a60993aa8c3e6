//! Unit tests for the configuration loader.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::error::Collector;
use super::raw;
use super::validate::check_prices;
use super::*;
use crate::pricing::PriceBook;

const FLEET: &str = include_str!("../../config/vllm-fleet.toml");
const MANAGED: &str = include_str!("../../config/managed-api.toml");

/// Resolves a few fixed names; everything else fails like an unknown host.
fn fake_resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let ip = match host {
        "api.openai.com" => Ipv4Addr::new(192, 0, 2, 10),
        "engine.internal" => Ipv4Addr::new(192, 0, 2, 20),
        "localhost" => Ipv4Addr::LOCALHOST,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "failed to lookup address information",
            ))
        }
    };
    Ok(vec![SocketAddr::new(IpAddr::V4(ip), port)])
}

fn fake_env(name: &str) -> Option<String> {
    let vars: HashMap<&str, &str> = [
        ("OPENAI_API_KEY", "sk-test-123"),
        ("TOKEN", "abc"),
        ("TENANT", "blue"),
        ("EVIL", "x\r\nInjected: yes"),
        ("EMPTY", ""),
        ("ROLTER_ADMIN_TOKEN", "admin-secret-42"),
        ("SPACEY", "two words"),
    ]
    .into_iter()
    .collect();
    vars.get(name).map(|s| s.to_string())
}

fn load(text: &str) -> Result<Config, ConfigErrors> {
    load_with(text, "test.toml", &fake_resolve, &fake_env)
}

fn errors(text: &str) -> Vec<ConfigError> {
    match load(text) {
        Ok(c) => panic!("expected errors, got a config: {c:#?}"),
        Err(e) => {
            assert!(!e.errors.is_empty());
            e.errors
        }
    }
}

/// The error at `key`, panicking with all errors if there is none.
fn error_at<'a>(errs: &'a [ConfigError], key: &str) -> &'a ConfigError {
    errs.iter().find(|e| e.key == key).unwrap_or_else(|| {
        panic!(
            "no error at `{key}`; errors:\n{}",
            ConfigErrors {
                errors: errs.to_vec()
            }
        )
    })
}

const ONE_TARGET: &str = "[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\n";

// ------------------------------------------------------------------ examples

#[test]
fn vllm_fleet_example_loads() {
    let c = load(FLEET).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.targets.len(), 3);
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.server.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(c.routes[0].name, "chat");
    assert_eq!(c.routes[0].targets, vec![0, 1, 2]);
    assert_eq!(c.routes[0].strategy.name, "round_robin");
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
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/vllm-fleet.toml");
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
    assert_eq!(PriceBook::new(&c).price(0, "gpt-4o-mini"), Some(mini));
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
    assert_eq!(r.strategy.name, "round_robin");
    assert!(r.strategy.options.is_empty());
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
    assert_eq!(r.strategy.name, "round_robin");
    assert_eq!(r.retries, 1);
    assert!(!r.forward_client_auth);
}

#[test]
fn non_positive_weight_becomes_one() {
    for w in ["0", "-3.5", "0.0", "nan"] {
        let text = format!("{ONE_TARGET}weight = {w}\n");
        let c = load(&text).unwrap_or_else(|e| panic!("{w}: {e}"));
        assert_eq!(c.targets[0].weight, 1.0, "{w}");
    }
    let c = load(&format!("{ONE_TARGET}weight = 3\n")).unwrap();
    assert_eq!(c.targets[0].weight, 3.0);
    let errs = errors(&format!("{ONE_TARGET}weight = inf\n"));
    error_at(&errs, "targets[0].weight");
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

// ------------------------------------------------------------------ URLs

fn target_with_url(url: &str) -> Result<Config, ConfigErrors> {
    load(&format!("[[targets]]\nname = \"t\"\nurl = \"{url}\"\n"))
}

#[test]
fn url_parts() {
    let t = &target_with_url("https://engine.internal:8443/base/")
        .unwrap()
        .targets[0];
    assert!(t.tls);
    assert_eq!(t.addr, "192.0.2.20:8443".parse().unwrap());
    assert_eq!(t.host_header, "engine.internal:8443");
    assert_eq!(t.server_name, "engine.internal");
    assert_eq!(t.base_path, "/base");
    assert_eq!(t.url, "https://engine.internal:8443/base/");

    let t = &target_with_url("http://engine.internal:80/")
        .unwrap()
        .targets[0];
    assert_eq!(t.host_header, "engine.internal");
    assert_eq!(t.base_path, "");
    assert_eq!(t.addr.port(), 80);

    let t = &target_with_url("https://engine.internal").unwrap().targets[0];
    assert_eq!(t.addr.port(), 443);
    assert_eq!(t.host_header, "engine.internal");

    let t = &target_with_url("http://[::1]:9000/v1").unwrap().targets[0];
    assert_eq!(t.addr, "[::1]:9000".parse().unwrap());
    assert_eq!(t.host_header, "[::1]:9000");
    assert_eq!(t.server_name, "::1");
    assert_eq!(t.base_path, "/v1");
}

#[test]
fn url_errors() {
    for (url, needle) in [
        ("ftp://10.0.0.1/", "scheme `ftp`"),
        ("http://10.0.0.1/?x=1", "query"),
        ("http://10.0.0.1/#frag", "fragment"),
        ("http://user:pw@10.0.0.1/", "credentials"),
        ("10.0.0.1:8000", "scheme"),
        ("http://exa mple.com/", "not a valid URL"),
        ("", "empty"),
        ("http://no-such-host.invalid:8000", "no-such-host.invalid"),
    ] {
        let errs = target_with_url(url).unwrap_err();
        let e = error_at(&errs.errors, "targets[0].url");
        assert!(e.message.contains(needle), "{url}: {e}");
        assert!(!e.fix.is_empty());
    }
}

// ------------------------------------------------------------------ TLS: ca_file

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p =
            std::env::temp_dir().join(format!("rolter-cfg-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn write(&self, name: &str, contents: &[u8]) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ca_pem() -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "rolter test CA");
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

fn target_with_ca(url: &str, ca_file: &str) -> Result<Config, ConfigErrors> {
    load(&format!(
        "[[targets]]\nname = \"t\"\nurl = \"{url}\"\nca_file = {ca_file:?}\n"
    ))
}

#[test]
fn ca_file_is_loaded_for_https_targets() {
    let dir = TempDir::new("ok");
    // Two certificates in one file, with text around them.
    let pem = format!("# internal CAs\n{}\n{}", ca_pem(), ca_pem());
    let path = dir.write("ca.pem", pem.as_bytes());
    let c = target_with_ca("https://engine.internal:8443", &path).unwrap();
    let t = &c.targets[0];
    assert!(t.tls);
    assert_eq!(t.ca_file.as_deref(), Some(std::path::Path::new(&path)));
    assert_eq!(t.ca_certs.len(), 2);
    // Without ca_file: no private roots (the public ones apply).
    let t = &target_with_url("https://engine.internal").unwrap().targets[0];
    assert!(t.ca_file.is_none() && t.ca_certs.is_empty());
    // The gateway builds one client configuration per distinct trust setting.
    let tls = crate::upstream::tls::UpstreamTls::build(&c.targets).unwrap();
    assert!(tls.get(0).is_some());
}

#[test]
fn ca_file_relative_to_the_configuration_file() {
    let dir = TempDir::new("rel");
    dir.write("ca.pem", ca_pem().as_bytes());
    let cfg = dir.write(
        "rolter.toml",
        b"[[targets]]\nname = \"t\"\nurl = \"https://127.0.0.1:8443\"\nca_file = \"ca.pem\"\n",
    );
    let c = load_file(std::path::Path::new(&cfg)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.targets[0].ca_file.as_deref(),
        Some(dir.0.join("ca.pem").as_path())
    );
    assert_eq!(c.targets[0].ca_certs.len(), 1);
}

#[test]
fn ca_file_errors() {
    let dir = TempDir::new("bad");
    let good = dir.write("ca.pem", ca_pem().as_bytes());
    let missing = dir.0.join("missing.pem").display().to_string();
    let empty = dir.write("empty.pem", b"no certificates here\n");
    let broken = dir.write(
        "broken.pem",
        b"-----BEGIN CERTIFICATE-----\nMIIB\n", // no END line
    );
    let garbage = dir.write(
        "garbage.pem",
        b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    );
    for (url, file, needle) in [
        ("http://10.0.0.1:8000", good.as_str(), "plaintext http://"),
        ("https://10.0.0.1", missing.as_str(), "cannot read ca_file"),
        (
            "https://10.0.0.1",
            empty.as_str(),
            "contains no certificate",
        ),
        ("https://10.0.0.1", broken.as_str(), "not valid PEM"),
        (
            "https://10.0.0.1",
            garbage.as_str(),
            "not usable as a CA certificate",
        ),
        ("https://10.0.0.1", "", "empty"),
    ] {
        let errs = target_with_ca(url, file).unwrap_err();
        let e = error_at(&errs.errors, "targets[0].ca_file");
        assert!(e.message.contains(needle), "{file}: {e}");
        assert_eq!(e.file, "test.toml");
        assert!(!e.fix.is_empty(), "{e}");
    }
    // The http:// message says what to do.
    let errs = target_with_ca("http://10.0.0.1:8000", &good).unwrap_err();
    assert!(errs.errors[0].fix.contains("https://"), "{}", errs);
    // A misspelling is an unknown key with a suggestion.
    let errs = load("[[targets]]\nname = \"t\"\nurl = \"https://10.0.0.1\"\ncafile = \"x\"\n")
        .unwrap_err();
    let e = error_at(&errs.errors, "targets[0].cafile");
    assert!(e.fix.contains("ca_file"), "{e}");
}

#[test]
fn resolution_failure_names_key_and_host() {
    let errs = target_with_url("http://no-such-host.invalid:8000").unwrap_err();
    let e = &errs.errors[0];
    assert_eq!(e.key, "targets[0].url");
    assert!(e
        .message
        .contains("cannot resolve host `no-such-host.invalid`"));
}

// ------------------------------------------------------------------ durations

#[test]
fn duration_errors() {
    let text = format!(
        "[server]\nshutdown_grace = \"soon\"\n[server.limits]\nhead_timeout = \"0s\"\n\
         body_timeout = 30\nwrite_timeout = true\n{ONE_TARGET}\
         [targets.timeouts]\nconnect = \"0ms\"\nfirst_byte = \"2m\"\nidle = \"10 parsecs\"\n\
         [targets.pool]\nidle_timeout = \"0s\"\n"
    );
    let errs = errors(&text);
    assert!(error_at(&errs, "server.shutdown_grace")
        .message
        .contains("not a duration"));
    assert!(error_at(&errs, "server.limits.head_timeout")
        .message
        .contains("zero"));
    assert!(error_at(&errs, "server.limits.body_timeout")
        .fix
        .contains("\"30s\""));
    error_at(&errs, "server.limits.write_timeout");
    error_at(&errs, "targets[0].timeouts.connect");
    error_at(&errs, "targets[0].timeouts.idle");
    error_at(&errs, "targets[0].pool.idle_timeout");
    assert_eq!(errs.len(), 7, "{}", ConfigErrors { errors: errs });
}

#[test]
fn durations_parse() {
    let c = load(&format!(
        "{ONE_TARGET}[targets.timeouts]\nconnect = \"250ms\"\nfirst_byte = \"2m\"\nidle = \"1h 30m\"\n"
    ))
    .unwrap();
    let t = &c.targets[0].timeouts;
    assert_eq!(t.connect, Duration::from_millis(250));
    assert_eq!(t.first_byte, Duration::from_secs(120));
    assert_eq!(t.idle, Duration::from_secs(5400));
}

// ------------------------------------------------------------------ unknown keys

#[test]
fn unknown_keys_everywhere_with_suggestions() {
    let text = "\
servr = 1
[server]
listn = \"127.0.0.1:1\"
[server.limits]
max_body_byte = 10
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
price = { input = 1.0, output = 2.0, ouput = 3.0 }
[targets.timeouts]
conect = \"1s\"
[targets.pool]
max_idel = 3
[[targets]]
name = \"b\"
url = \"http://10.0.0.2\"
wieght = 2.0
[[routes]]
name = \"r\"
targets = [\"a\"]
retry = 2
[routes.match]
pathz = [\"/v1/completions\"]
header = { name = \"x\", value = \"y\", vlaue = \"z\" }
";
    let errs = errors(text);
    let expect = [
        ("servr", "server"),
        ("server.listn", "listen"),
        ("server.limits.max_body_byte", "max_body_bytes"),
        ("targets[0].price.ouput", "output"),
        ("targets[0].timeouts.conect", "connect"),
        ("targets[0].pool.max_idel", "max_idle"),
        ("targets[1].wieght", "weight"),
        ("routes[0].retry", "retries"),
        ("routes[0].match.pathz", "paths"),
        ("routes[0].match.header.vlaue", "value"),
    ];
    for (key, suggestion) in expect {
        let e = error_at(&errs, key);
        assert!(e.message.contains("unknown key"), "{e}");
        assert!(
            e.fix.contains(&format!("did you mean `{suggestion}`?")),
            "{e}"
        );
    }
    assert_eq!(
        errs.len(),
        expect.len(),
        "{}",
        ConfigErrors { errors: errs }
    );
}

#[test]
fn misspelled_table_is_an_unknown_key() {
    let errs = errors(&format!("[server.limts]\nmax_headers = 5\n{ONE_TARGET}"));
    let e = error_at(&errs, "server.limts");
    assert!(e.fix.contains("`limits`"), "{e}");
}

#[test]
fn known_keys_match_structs() {
    // Every key listed as valid is accepted by the serde types (no unknown-key error).
    let tables: [(&str, &[&str]); 17] = [
        ("", raw::TOP_KEYS),
        ("[server]\n", raw::SERVER_KEYS),
        ("[server.limits]\n", raw::LIMITS_KEYS),
        ("[[targets]]\n", raw::TARGET_KEYS),
        ("[[targets]]\n[targets.price]\n", raw::PRICE_KEYS),
        ("[[targets]]\n[targets.timeouts]\n", raw::TIMEOUTS_KEYS),
        ("[[targets]]\n[targets.pool]\n", raw::POOL_KEYS),
        (
            "[[targets]]\n[targets.kv_events]\n",
            raw::TARGET_KV_EVENTS_KEYS,
        ),
        ("[[routes]]\n", raw::ROUTE_KEYS),
        ("[[routes]]\n[routes.match]\n", raw::MATCH_KEYS),
        (
            "[[routes]]\n[routes.match.header]\n",
            raw::HEADER_MATCH_KEYS,
        ),
        ("[health]\n", raw::HEALTH_KEYS),
        ("[metrics_scrape]\n", raw::SCRAPE_KEYS),
        ("[admin]\n", raw::ADMIN_KEYS),
        ("[adaptive]\n", raw::ADAPTIVE_KEYS),
        ("[kv_events]\n", raw::KV_EVENTS_KEYS),
        ("[catalog.m]\n", raw::PRICE_KEYS),
    ];
    for (header, keys) in tables {
        for key in keys {
            let text = format!("{header}{key} = 1\n");
            if let Err(errs) = load(&text) {
                for e in &errs {
                    assert!(!e.message.contains("unknown key"), "{text}: {e}");
                }
            }
        }
        // And an unlisted key is reported.
        let text = format!("{header}zzz_unlisted = 1\n");
        let errs = load(&text).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.message.contains("unknown key `zzz_unlisted`")),
            "{text}: {errs}"
        );
    }
}

#[test]
fn strategy_options_are_not_unknown_keys() {
    let text = format!(
        "{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n[routes.strategy]\n\
         name = \"round_robin\"\nzzz_not_an_option = 3\n"
    );
    let errs = errors(&text);
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    let e = error_at(&errs, "routes[0].strategy.zzz_not_an_option");
    assert!(!e.message.contains("unknown key"));
}

// ------------------------------------------------------------------ serde / TOML errors

#[test]
fn type_error_has_line_column_and_key() {
    let text = format!("{ONE_TARGET}[[targets]]\nname = \"b\"\nurl = 5\n");
    let errs = errors(&text);
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    let e = &errs[0];
    assert_eq!(e.key, "targets[1].url");
    assert!(e.message.starts_with("line 6, column 7: "), "{e}");
    assert!(e.message.contains("string"), "{e}");
}

#[test]
fn type_error_in_server() {
    let errs = errors(&format!("[server]\nworkers = \"four\"\n{ONE_TARGET}"));
    let e = &errs[0];
    assert_eq!(e.key, "server.workers");
    assert!(e.message.starts_with("line 2, column 11"), "{e}");
}

#[test]
fn unknown_keys_reported_alongside_type_error() {
    let errs = errors(&format!(
        "[server]\nlistn = \"x\"\nworkers = \"four\"\n{ONE_TARGET}"
    ));
    error_at(&errs, "server.listn");
    error_at(&errs, "server.workers");
}

#[test]
fn syntax_errors_have_line_and_column() {
    let errs = errors("[[targets]]\nname = \"a\nurl = \"http://10.0.0.1\"\n");
    let e = &errs[0];
    assert!(e.message.starts_with("line 2, column"), "{e}");
    assert!(e.fix.contains("line 2"), "{e}");
    // Each error renders on exactly one line.
    let all = ConfigErrors { errors: errs }.to_string();
    assert_eq!(all.lines().count(), all.matches("(fix: ").count());
}

#[test]
fn duplicate_key_is_a_syntax_error() {
    let errs = errors("[[targets]]\nname = \"a\"\nname = \"b\"\nurl = \"http://10.0.0.1\"\n");
    assert!(errs[0].message.starts_with("line 3"), "{}", errs[0]);
}

// ------------------------------------------------------------------ names and references

#[test]
fn no_targets_is_an_error() {
    let errs = errors("[server]\nworkers = 1\n");
    error_at(&errs, "targets");
    let errs = errors("targets = []\n");
    error_at(&errs, "targets");
}

#[test]
fn empty_routes_array_is_an_error() {
    let errs = errors(&format!("routes = []\n{ONE_TARGET}"));
    error_at(&errs, "routes");
}

#[test]
fn names_required_unique_and_well_formed() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
[[targets]]
name = \"a\"
url = \"http://10.0.0.2\"
[[targets]]
name = \"\"
url = \"http://10.0.0.3\"
[[targets]]
name = \"bad name!\"
url = \"http://10.0.0.4\"
[[targets]]
url = \"http://10.0.0.5\"
[[targets]]
name = \"nourl\"
[[routes]]
name = \"r\"
targets = [\"a\"]
[[routes]]
name = \"r\"
targets = [\"a\"]
[[routes]]
name = \"\"
targets = [\"a\"]
[[routes]]
targets = [\"a\"]
";
    let errs = errors(text);
    assert!(error_at(&errs, "targets[1].name")
        .message
        .contains("already used by targets[0]"));
    assert!(error_at(&errs, "targets[2].name").message.contains("empty"));
    assert!(error_at(&errs, "targets[3].name")
        .fix
        .contains("`bad-name-`"));
    error_at(&errs, "targets[4].name");
    error_at(&errs, "targets[5].url");
    assert!(error_at(&errs, "routes[1].name")
        .message
        .contains("already used by routes[0]"));
    error_at(&errs, "routes[2].name");
    error_at(&errs, "routes[3].name");
    assert_eq!(errs.len(), 8, "{}", ConfigErrors { errors: errs });
}

#[test]
fn dangling_route_target_names_it_and_lists_known() {
    let text = format!(
        "{ONE_TARGET}[[targets]]\nname = \"bee\"\nurl = \"http://10.0.0.2\"\n\
         [[routes]]\nname = \"r\"\ntargets = [\"a\", \"be\", \"a\"]\n\
         [[routes]]\nname = \"s\"\ntargets = []\n[[routes]]\nname = \"t\"\n"
    );
    let errs = errors(&text);
    let e = error_at(&errs, "routes[0].targets[1]");
    assert!(e.message.contains("`be`"), "{e}");
    assert!(e.fix.contains("a, bee"), "{e}");
    assert!(e.fix.contains("did you mean `bee`?"), "{e}");
    assert!(error_at(&errs, "routes[0].targets[2]")
        .message
        .contains("twice"));
    error_at(&errs, "routes[1].targets");
    error_at(&errs, "routes[2].targets");
    assert_eq!(errs.len(), 4);
}

#[test]
fn route_to_invalid_target_is_not_dangling() {
    // The target has a bad URL; the route naming it must not add a second, misleading error.
    let text = "[[targets]]\nname = \"a\"\nurl = \"ftp://x\"\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n";
    let errs = errors(text);
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    assert_eq!(errs[0].key, "targets[0].url");
}

// ------------------------------------------------------------------ match rules

#[test]
fn match_rules() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
models = [\"m1\", \"m2\"]
[[targets]]
name = \"b\"
url = \"http://10.0.0.2\"
models = [\"m3\"]
[[routes]]
name = \"r\"
targets = [\"a\", \"b\"]
forward_client_auth = true
retries = 0
[routes.match]
paths = [\"/v1/embeddings\", \"/v1/messages\"]
models = [\"m1\", \"m3\"]
header = { name = \"X-Tenant\", value = \"blue\" }
";
    let c = load(text).unwrap();
    let r = &c.routes[0];
    assert!(r.forward_client_auth);
    assert_eq!(r.retries, 0);
    assert_eq!(r.matcher.paths, vec!["/v1/embeddings", "/v1/messages"]);
    assert_eq!(r.matcher.models, vec!["m1", "m3"]);
    assert_eq!(
        r.matcher.header,
        Some(("x-tenant".to_string(), "blue".to_string()))
    );
}

#[test]
fn match_errors() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
models = [\"m1\"]
[[targets]]
name = \"any\"
url = \"http://10.0.0.2\"
[[routes]]
name = \"r\"
targets = [\"a\"]
[routes.match]
paths = [\"/v1/chat/completion\", \"/v1/completions\"]
models = [\"m1\", \"m9\", \"\"]
header = { name = \"bad header\", value = \"\" }
[[routes]]
name = \"s\"
targets = [\"a\", \"any\"]
match = { models = [\"m9\"] }
";
    let errs = errors(text);
    let e = error_at(&errs, "routes[0].match.paths[0]");
    assert!(
        e.fix.contains("did you mean `/v1/chat/completions`?"),
        "{e}"
    );
    let e = error_at(&errs, "routes[0].match.models[1]");
    assert!(
        e.message.contains("`m9`") && e.message.contains("m1"),
        "{e}"
    );
    error_at(&errs, "routes[0].match.models[2]");
    error_at(&errs, "routes[0].match.header.name");
    error_at(&errs, "routes[0].match.header.value");
    // Route `s` has a target without a model list, so m9 may be served: no error.
    assert_eq!(errs.len(), 5, "{}", ConfigErrors { errors: errs });
}

#[test]
fn retries_bounds() {
    for (r, ok) in [("0", true), ("10", true), ("11", false), ("-1", false)] {
        let text =
            format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nretries = {r}\n");
        match load(&text) {
            Ok(c) => assert!(ok, "{r}: {c:?}"),
            Err(errs) => {
                assert!(!ok, "{r}: {errs}");
                error_at(&errs.errors, "routes[0].retries");
            }
        }
    }
}

// ------------------------------------------------------------------ strategies

#[test]
fn strategy_forms() {
    let text = format!(
        "{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nstrategy = \"round_robin\"\n\
         [[routes]]\nname = \"s\"\ntargets = [\"a\"]\nstrategy = {{ name = \"round_robin\" }}\n"
    );
    let c = load(&text).unwrap();
    assert_eq!(c.routes[0].strategy.name, "round_robin");
    assert!(c.routes[0].strategy.options.is_empty());
    assert_eq!(c.routes[1].strategy.name, "round_robin");
    assert!(c.routes[1].strategy.options.is_empty());
}

#[test]
fn strategy_errors() {
    let text = format!(
        "{ONE_TARGET}\
         [[routes]]\nname = \"r0\"\ntargets = [\"a\"]\nstrategy = \"zzz_no_such_strategy\"\n\
         [[routes]]\nname = \"r1\"\ntargets = [\"a\"]\nstrategy = {{ name = \"zzz_nope\" }}\n\
         [[routes]]\nname = \"r2\"\ntargets = [\"a\"]\nstrategy = {{ threshold = 2 }}\n\
         [[routes]]\nname = \"r3\"\ntargets = [\"a\"]\nstrategy = 7\n\
         [[routes]]\nname = \"r4\"\ntargets = [\"a\"]\nstrategy = {{ name = 7 }}\n\
         [[routes]]\nname = \"r5\"\ntargets = [\"a\"]\nstrategy = \"\"\n"
    );
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].strategy")
        .message
        .contains("`zzz_no_such_strategy`"));
    assert!(error_at(&errs, "routes[1].strategy.name")
        .message
        .contains("`zzz_nope`"));
    error_at(&errs, "routes[2].strategy.name");
    error_at(&errs, "routes[3].strategy");
    error_at(&errs, "routes[4].strategy.name");
    error_at(&errs, "routes[5].strategy");
    assert_eq!(errs.len(), 6, "{}", ConfigErrors { errors: errs });
}

// ------------------------------------------------------------------ headers and env

fn target_with_headers(headers: &str) -> Result<Config, ConfigErrors> {
    load(&format!("{ONE_TARGET}headers = {{ {headers} }}\n"))
}

#[test]
fn env_expansion() {
    let c = target_with_headers(
        r#""Authorization" = "Bearer ${TOKEN}", "X-Combo" = "${TENANT}-${TOKEN}$HOME${EMPTY}", "x-plain" = "a$b""#,
    )
    .unwrap();
    assert_eq!(
        c.targets[0].headers,
        vec![
            ("authorization".to_string(), "Bearer abc".to_string()),
            ("x-combo".to_string(), "blue-abc$HOME".to_string()),
            ("x-plain".to_string(), "a$b".to_string()),
        ]
    );
}

#[test]
fn env_expansion_errors_name_every_missing_variable() {
    let errs = target_with_headers(
        r#"a = "${NOPE_1}", b = "${NOPE_2} and ${TOKEN}", c = "${oops", d = "${1X}""#,
    )
    .unwrap_err();
    let a = error_at(&errs.errors, "targets[0].headers.a");
    assert!(a.message.contains("`NOPE_1` is not set"), "{a}");
    let b = error_at(&errs.errors, "targets[0].headers.b");
    assert!(b.message.contains("NOPE_2"), "{b}");
    error_at(&errs.errors, "targets[0].headers.c");
    error_at(&errs.errors, "targets[0].headers.d");
    assert_eq!(errs.len(), 4);
}

#[test]
fn env_expansion_with_process_environment() {
    // load_str uses the real environment; PATH is set in any test environment.
    let path = std::env::var("PATH").expect("PATH is set");
    let c = load_str(
        &format!("{ONE_TARGET}headers = {{ x-path = \"${{PATH}}\" }}\n"),
        "env.toml",
    )
    .unwrap();
    assert_eq!(c.targets[0].headers[0].1, path);
    let errs = load_str(
        &format!("{ONE_TARGET}headers = {{ x = \"${{ROLTER_TEST_SURELY_UNSET_VAR}}\" }}\n"),
        "env.toml",
    )
    .unwrap_err();
    assert!(errs.errors[0]
        .message
        .contains("ROLTER_TEST_SURELY_UNSET_VAR"));
    assert_eq!(errs.errors[0].file, "env.toml");
}

#[test]
fn header_values_reject_cr_lf_nul() {
    let errs = target_with_headers(
        r#"a = "x\r\ny: z", b = "line\nfeed", c = "nul\u0000", d = "${EVIL}", e = "ok""#,
    )
    .unwrap_err();
    assert!(error_at(&errs.errors, "targets[0].headers.a")
        .message
        .contains("carriage return"));
    assert!(error_at(&errs.errors, "targets[0].headers.b")
        .message
        .contains("line feed"));
    assert!(error_at(&errs.errors, "targets[0].headers.c")
        .message
        .contains("NUL"));
    error_at(&errs.errors, "targets[0].headers.d");
    assert_eq!(errs.len(), 4, "{errs}");
}

#[test]
fn header_names_checked() {
    let errs = target_with_headers(
        r#""Bad Name" = "1", "Connection" = "close", "Transfer-Encoding" = "chunked", host = "x", "X-A" = "1", "x-a" = "2", "" = "3""#,
    )
    .unwrap_err();
    error_at(&errs.errors, "targets[0].headers.\"Bad Name\"");
    error_at(&errs.errors, "targets[0].headers.Connection");
    error_at(&errs.errors, "targets[0].headers.Transfer-Encoding");
    error_at(&errs.errors, "targets[0].headers.host");
    assert!(error_at(&errs.errors, "targets[0].headers.x-a")
        .message
        .contains("twice"));
    error_at(&errs.errors, "targets[0].headers.\"\"");
    assert_eq!(errs.len(), 6, "{errs}");
}

// ------------------------------------------------------------------ other target fields

#[test]
fn target_field_errors() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
models = [\"m1\", \"m1\", \"\"]
max_concurrent = 0
tier = -1
price = { input = -1.0 }
upstream_models = { m2 = \"x\", m1 = \"\" }
[targets.pool]
max_idle = -2
[[targets]]
name = \"b\"
url = \"http://10.0.0.2\"
upstream_models = { anything = \"provider-name\" }
";
    let errs = errors(text);
    for key in [
        "targets[0].models[1]",
        "targets[0].models[2]",
        "targets[0].max_concurrent",
        "targets[0].tier",
        "targets[0].price.input",
        "targets[0].price.output",
        "targets[0].pool.max_idle",
    ] {
        error_at(&errs, key);
    }
    // models is invalid, so upstream_models cannot be checked against it; fix models and retry.
    let text = text.replace("[\"m1\", \"m1\", \"\"]", "[\"m1\"]");
    let errs = errors(&text);
    let e = error_at(&errs, "targets[0].upstream_models.m2");
    assert!(e.fix.contains("add \"m2\" to `models`"), "{e}");
    error_at(&errs, "targets[0].upstream_models.m1");
    // Target b has no models list: any mapping is fine.
    assert!(!errs.iter().any(|e| e.key.starts_with("targets[1]")));
}

#[test]
fn target_values() {
    let c = load(&format!(
        "{ONE_TARGET}models = [\"m\"]\nmax_concurrent = 8\ntier = 2\nprice = {{ input = 0, output = 1.5 }}\n\
         upstream_models = {{ m = \"org/m\" }}\n[targets.pool]\nmax_idle = 0\n"
    ))
    .unwrap();
    let t = &c.targets[0];
    assert_eq!(t.models, vec!["m"]);
    assert_eq!(t.max_concurrent, Some(8));
    assert_eq!(t.tier, 2);
    assert_eq!(
        t.price,
        Some(Price {
            input_per_mtok: 0.0,
            output_per_mtok: 1.5
        })
    );
    assert_eq!(t.upstream_models["m"], "org/m");
    assert_eq!(t.pool.max_idle, 0);
}

// ------------------------------------------------------------------ reporting

#[test]
fn many_errors_reported_at_once() {
    let text = "\
[server]
workers = -4
drivr = \"epoll\"
[[targets]]
name = \"a\"
url = \"gopher://x\"
[[targets]]
name = \"a\"
url = \"http://10.0.0.2\"
headers = { x = \"${NOT_SET_ANYWHERE}\" }
[targets.timeouts]
connect = \"0s\"
[[routes]]
name = \"r\"
targets = [\"zzz\"]
retries = 50
";
    let errs = load(text).unwrap_err();
    let keys: Vec<&str> = errs.iter().map(|e| e.key.as_str()).collect();
    for key in [
        "server.drivr",
        "server.workers",
        "targets[0].url",
        "targets[1].headers.x",
        "targets[1].timeouts.connect",
        "targets[1].name",
        "routes[0].targets[0]",
        "routes[0].retries",
    ] {
        assert!(keys.contains(&key), "missing {key} in {keys:?}");
    }
    assert_eq!(errs.len(), 8, "{errs}");
    let shown = errs.to_string();
    assert_eq!(shown.lines().count(), 8);
    for line in shown.lines() {
        assert!(line.starts_with("test.toml: "), "{line}");
        assert!(line.ends_with(')') && line.contains(" (fix: "), "{line}");
    }
}

#[test]
fn error_display_format() {
    let e = ConfigError {
        file: "f.toml".into(),
        key: "targets[1].url".into(),
        message: "bad".into(),
        fix: "do better".into(),
    };
    assert_eq!(
        e.to_string(),
        "f.toml: targets[1].url: bad (fix: do better)"
    );
    let all = ConfigErrors {
        errors: vec![e.clone(), e],
    };
    assert_eq!(all.to_string().lines().count(), 2);
    let _: &dyn std::error::Error = &all;
}

#[test]
fn load_file_missing_file() {
    let errs = load_file(std::path::Path::new("/nonexistent/rolter.toml")).unwrap_err();
    assert_eq!(errs.errors[0].file, "/nonexistent/rolter.toml");
    assert!(errs.errors[0].message.contains("cannot read"));
}

#[test]
fn every_error_has_a_fix() {
    let texts = [
        FLEET.replace("round_robin", "bogus"),
        "x = [".to_string(),
        "[[targets]]\nname = 1\n".to_string(),
    ];
    for t in &texts {
        for e in &load(t).unwrap_err() {
            assert!(!e.message.is_empty() && !e.fix.is_empty(), "{e}");
            assert!(!e.key.is_empty(), "{e}");
        }
    }
}

#[test]
fn config_is_plain_data() {
    fn assert_plain<T: Clone + Send + Sync + 'static>() {}
    assert_plain::<Config>();
    assert_plain::<ConfigErrors>();
}

#[test]
fn edit_distance_basics() {
    assert_eq!(raw::edit_distance("listen", "listen"), 0);
    assert_eq!(raw::edit_distance("listn", "listen"), 1);
    assert_eq!(raw::edit_distance("Weight", "wieght"), 2);
    assert_eq!(raw::closest("conect", raw::TIMEOUTS_KEYS), Some("connect"));
}

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
         max_ejection_time = \"30s\"\nmax_ejected_percent = 100\n{ONE_TARGET}"
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
        }
    );
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

// ------------------------------------------------------------------ per-target health and scrape keys

#[test]
fn target_health_and_scrape_keys() {
    let c = load(&format!(
        "{ONE_TARGET}health_path = \"\"\nscrape = false\n\
         [[targets]]\nname = \"b\"\nurl = \"http://10.0.0.2\"\nhealth_path = \"/healthz\"\n\
         metrics_path = \"/engine/metrics\"\n"
    ))
    .unwrap();
    assert_eq!(c.targets[0].health_path.as_deref(), Some(""));
    assert!(!c.targets[0].scrape);
    assert_eq!(c.targets[0].metrics_path, None);
    assert_eq!(c.targets[1].health_path.as_deref(), Some("/healthz"));
    assert!(c.targets[1].scrape);
    assert_eq!(
        c.targets[1].metrics_path.as_deref(),
        Some("/engine/metrics")
    );
}

#[test]
fn target_health_and_scrape_key_errors() {
    let errs = errors(&format!(
        "{ONE_TARGET}health_path = \"healthz\"\nmetrics_path = \"\"\n\
         [[targets]]\nname = \"b\"\nurl = \"http://10.0.0.2\"\nhealth_path = \"/a\\r\\nb\"\n\
         metrics_path = \"metrics\"\n"
    ));
    let e = error_at(&errs, "targets[0].health_path");
    assert!(e.message.contains("does not start with \"/\""), "{e}");
    assert!(e.fix.contains("\"/healthz\""), "{e}");
    let e = error_at(&errs, "targets[0].metrics_path");
    assert!(e.message.contains("empty"), "{e}");
    assert!(e.fix.contains("scrape = false"), "{e}");
    assert!(error_at(&errs, "targets[1].health_path")
        .message
        .contains("'\\r'"));
    assert!(error_at(&errs, "targets[1].metrics_path")
        .fix
        .contains("\"/metrics\""));
    assert_eq!(errs.len(), 4, "{}", ConfigErrors { errors: errs });
    // `scrape` is a boolean.
    let errs = errors(&format!("{ONE_TARGET}scrape = \"no\"\n"));
    assert!(error_at(&errs, "targets[0].scrape")
        .message
        .contains("boolean"));
}

// ------------------------------------------------------------------ unknown keys in the new tables

#[test]
fn unknown_keys_in_new_tables_with_suggestions() {
    let text = "\
helth = 1
metric_scrape = 2
[health]
intervl = \"5s\"
[metrics_scrape]
enabeld = true
[admin]
tokn = \"x\"
[adaptive]
enable = false
[catalog]
m = { input = 1.0, output = 2.0, ouptut = 3.0 }
\"org/model\" = { input = 1.0, output = 2.0, inptu = 3.0 }
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
helth_path = \"/h\"
scrap = false
metrics_pth = \"/m\"
";
    let errs = errors(text);
    let expect = [
        ("helth", "health"),
        ("metric_scrape", "metrics_scrape"),
        ("health.intervl", "interval"),
        ("metrics_scrape.enabeld", "enabled"),
        ("admin.tokn", "token"),
        ("adaptive.enable", "enabled"),
        ("catalog.m.ouptut", "output"),
        ("catalog.\"org/model\".inptu", "input"),
        ("targets[0].helth_path", "health_path"),
        ("targets[0].scrap", "scrape"),
        ("targets[0].metrics_pth", "metrics_path"),
    ];
    for (key, suggestion) in expect {
        let e = error_at(&errs, key);
        assert!(e.message.contains("unknown key"), "{e}");
        assert!(
            e.fix.contains(&format!("did you mean `{suggestion}`?")),
            "{e}"
        );
    }
    assert_eq!(
        errs.len(),
        expect.len(),
        "{}",
        ConfigErrors { errors: errs }
    );
}

// ------------------------------------------------------------------ [catalog]

#[test]
fn catalog_values() {
    let c = load(&format!(
        "[catalog]\n\"meta-llama/Llama-3.1-8B\" = {{ input = 0.05, output = 0.08 }}\n\
         free = {{ input = 0, output = 0 }}\n{ONE_TARGET}"
    ))
    .unwrap();
    assert_eq!(c.catalog.len(), 2);
    assert_eq!(
        c.catalog["meta-llama/Llama-3.1-8B"],
        Price {
            input_per_mtok: 0.05,
            output_per_mtok: 0.08
        }
    );
    assert_eq!(c.catalog["free"].output_per_mtok, 0.0);
}

#[test]
fn catalog_errors() {
    let errs = errors(&format!(
        "[catalog]\na = {{ input = -1.0, output = 1.0 }}\nb = {{ input = 1.0 }}\n\
         \"c/d\" = {{ input = nan, output = inf }}\n\"\" = {{ input = 1.0, output = 1.0 }}\n{ONE_TARGET}"
    ));
    let e = error_at(&errs, "catalog.a.input");
    assert!(e.message.contains(">= 0"), "{e}");
    let e = error_at(&errs, "catalog.b.output");
    assert!(e.message.contains("no `output`"), "{e}");
    assert!(
        e.fix.contains("\"b\" = { input = 0.15, output = 0.60 }"),
        "{e}"
    );
    error_at(&errs, "catalog.\"c/d\".input");
    error_at(&errs, "catalog.\"c/d\".output");
    let e = error_at(&errs, "catalog.\"\"");
    assert!(e.message.contains("model name is empty"), "{e}");
    assert_eq!(errs.len(), 5, "{}", ConfigErrors { errors: errs });

    // An entry that is not a table is a type error at its key.
    let errs = errors(&format!("[catalog]\nm = 5\n{ONE_TARGET}"));
    let e = error_at(&errs, "catalog.m");
    assert!(e.message.contains("expected a table"), "{e}");
}

#[test]
fn catalog_overrides_resolve_through_price_book() {
    let c = load(&format!(
        "[catalog]\n\"gpt-4o-mini\" = {{ input = 1.0, output = 2.0 }}\n\
         private-llama = {{ input = 0.01, output = 0.02 }}\n\
         {ONE_TARGET}models = [\"mini\", \"4o\", \"llama\", \"mystery\"]\n\
         upstream_models = {{ mini = \"gpt-4o-mini\", 4o = \"gpt-4o\", llama = \"private-llama\" }}\n\
         [[targets]]\nname = \"b\"\nurl = \"http://10.0.0.2\"\nmodels = [\"gpt-4o-mini\"]\n\
         price = {{ input = 9.0, output = 9.5 }}\n\
         [[targets]]\nname = \"c\"\nurl = \"http://10.0.0.3\"\nmodels = [\"gpt-4o-mini\", \"gpt-4o\"]\n"
    ))
    .unwrap();
    let p = |i: f64, o: f64| Price {
        input_per_mtok: i,
        output_per_mtok: o,
    };
    let book = PriceBook::new(&c);
    // [catalog] beats the built-in price of gpt-4o-mini (0.15 / 0.60).
    assert_eq!(book.price(0, "mini"), Some(p(1.0, 2.0)));
    assert_eq!(book.price(2, "gpt-4o-mini"), Some(p(1.0, 2.0)));
    // Models [catalog] does not name keep their built-in price.
    assert_eq!(book.price(0, "4o"), crate::pricing::builtin("gpt-4o"));
    assert_eq!(book.price(2, "gpt-4o"), Some(p(2.5, 10.0)));
    // Private models are priced by [catalog] alone; unknown ones have no price.
    assert_eq!(book.price(0, "llama"), Some(p(0.01, 0.02)));
    assert_eq!(book.price(0, "mystery"), None);
    // A target's own price beats both.
    assert_eq!(book.price(1, "gpt-4o-mini"), Some(p(9.0, 9.5)));
}

// ------------------------------------------------------------------ price checks for price-ranked routes

/// A strategy spec with `options` written as TOML.
fn spec(name: &'static str, options: &str) -> StrategySpec {
    StrategySpec {
        name,
        options: options.parse::<toml::Table>().unwrap(),
    }
}

/// The errors `check_prices` reports for a loaded configuration.
fn price_errors(c: &Config) -> Vec<ConfigError> {
    let routes: Vec<Option<Route>> = c.routes.iter().cloned().map(Some).collect();
    let targets: Vec<Option<Target>> = c.targets.iter().cloned().map(Some).collect();
    let mut errs = Collector::new("test.toml");
    check_prices(&routes, &targets, &c.catalog, &mut errs);
    errs.into_errors().errors
}

/// Targets: 0 "priced" (own price, any model), 1 "listed" (builtin, catalog and mapped
/// models), 2 "any" (no models, no price), 3 "private" (a model with no known price).
/// Route 0 "all" uses every target; route 1 "known" only the first two; route 2 "matched"
/// only serves model "known" of target 3.
const PRICE_FIXTURE: &str = "\
[catalog]
house-model = { input = 0.5, output = 1.0 }
[[targets]]
name = \"priced\"
url = \"http://10.0.0.1\"
price = { input = 0.2, output = 0.4 }
[[targets]]
name = \"listed\"
url = \"http://10.0.0.2\"
models = [\"gpt-4o-mini\", \"house\", \"claude\"]
upstream_models = { house = \"house-model\", claude = \"claude-3-5-haiku-latest\" }
[[targets]]
name = \"any\"
url = \"http://10.0.0.3\"
[[targets]]
name = \"private\"
url = \"http://10.0.0.4\"
models = [\"known\", \"secret\"]
upstream_models = { known = \"house-model\", secret = \"org/secret-7b\" }
[[routes]]
name = \"all\"
targets = [\"priced\", \"listed\", \"any\", \"private\"]
[[routes]]
name = \"known\"
targets = [\"priced\", \"listed\"]
[[routes]]
name = \"matched\"
targets = [\"private\"]
[routes.match]
models = [\"known\"]
";

fn price_fixture(strategy: StrategySpec) -> Config {
    let mut c = load(PRICE_FIXTURE).unwrap_or_else(|e| panic!("{e}"));
    for r in &mut c.routes {
        r.strategy = strategy.clone();
    }
    c
}

#[test]
fn check_prices_cheapest_names_route_target_and_model() {
    let errs = price_errors(&price_fixture(spec("cheapest", "")));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    // Route "all": target "any" has neither models nor price.
    let e = error_at(&errs, "targets[2].price");
    assert!(e.message.contains("route `all`"), "{e}");
    assert!(e.message.contains("routes[0].strategy"), "{e}");
    assert!(e.message.contains("target `any`"), "{e}");
    assert!(e.message.contains("no `models` list"), "{e}");
    assert!(
        e.fix.contains(
            "add price = { input = 0.15, output = 0.60 } (per 1M tokens) to target \"any\""
        ),
        "{e}"
    );
    assert!(!e.fix.contains("w_cost"), "{e}");
    // Route "all": model "secret" of "private" maps to an unpriced upstream name; route
    // "matched" only serves "known", which is priced by [catalog].
    let e = error_at(&errs, "targets[3].price");
    assert!(e.message.contains("route `all`"), "{e}");
    assert!(e.message.contains("target `private`"), "{e}");
    assert!(e.message.contains("model `secret`"), "{e}");
    assert!(e.message.contains("upstream name `org/secret-7b`"), "{e}");
    assert!(e.fix.contains("to target \"private\""), "{e}");
    assert!(
        e.fix.contains("[catalog] entry \"org/secret-7b\" = {"),
        "{e}"
    );
    for e in &errs {
        assert_eq!(e.file, "test.toml");
        assert!(!e.fix.is_empty());
    }
}

#[test]
fn check_prices_skips_routes_that_do_not_rank_by_price() {
    for s in [
        spec("round_robin", ""),
        spec("least_loaded", ""),
        spec("adaptive", "w_cost = 0.0"),
        spec("adaptive", "w_cost = 0"),
        spec(
            "adaptive",
            "w_cost = 0.0\nfallback_strategy = \"least_loaded\"",
        ),
        spec("failover", "within_tier = \"p2c\""),
        spec("failover", ""),
    ] {
        let errs = price_errors(&price_fixture(s.clone()));
        assert!(errs.is_empty(), "{s:?}: {}", ConfigErrors { errors: errs });
    }
}

#[test]
fn check_prices_adaptive_with_cost_weight() {
    for (options, needle) in [
        ("", "w_cost = 1 (the default)"),
        ("w_cost = 0.25", "w_cost = 0.25"),
        ("w_cost = 2", "w_cost = 2"),
    ] {
        let errs = price_errors(&price_fixture(spec("adaptive", options)));
        assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
        let e = error_at(&errs, "targets[2].price");
        assert!(e.message.contains(needle), "{options}: {e}");
        assert!(
            e.fix
                .contains("or set w_cost = 0 in routes[0].strategy to rank without cost"),
            "{e}"
        );
    }
    // No cost weight, but cheapest as the fallback: prices are still needed.
    let errs = price_errors(&price_fixture(spec(
        "adaptive",
        "w_cost = 0.0\nfallback_strategy = \"cheapest\"",
    )));
    let e = error_at(&errs, "targets[2].price");
    assert!(e.message.contains("fallback_strategy `cheapest`"), "{e}");
    assert!(!e.fix.contains("w_cost"), "{e}");
}

#[test]
fn check_prices_failover_within_cheapest() {
    let errs = price_errors(&price_fixture(spec(
        "failover",
        "within_tier = \"cheapest\"",
    )));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    assert!(error_at(&errs, "targets[2].price")
        .message
        .contains("within_tier `cheapest`"));
}

#[test]
fn check_prices_without_gaps_is_quiet() {
    // Route "known" alone: own price, builtin, [catalog] through upstream_models.
    let mut c = price_fixture(spec("cheapest", ""));
    c.routes.remove(0);
    assert!(price_errors(&c).is_empty());
    // A [catalog] entry for the missing upstream name and a price on "any" close both gaps.
    let text = PRICE_FIXTURE
        .replace(
            "[catalog]\n",
            "[catalog]\n\"org/secret-7b\" = { input = 0.0, output = 0.0 }\n",
        )
        .replace(
            "name = \"any\"\n",
            "name = \"any\"\nprice = { input = 1.0, output = 1.0 }\n",
        );
    let mut c = load(&text).unwrap();
    for r in &mut c.routes {
        r.strategy = spec("cheapest", "");
    }
    assert!(price_errors(&c).is_empty());
}

#[test]
fn check_prices_skips_invalid_routes_and_targets() {
    let c = price_fixture(spec("cheapest", ""));
    let routes: Vec<Option<Route>> = vec![None, Some(c.routes[0].clone())];
    // Targets 2 and 3 were invalid (already reported): nothing more to say about them.
    let targets: Vec<Option<Target>> = vec![
        Some(c.targets[0].clone()),
        Some(c.targets[1].clone()),
        None,
        None,
    ];
    let mut errs = Collector::new("test.toml");
    check_prices(&routes, &targets, &c.catalog, &mut errs);
    assert!(errs.is_empty(), "{}", errs.into_errors());
}

// ------------------------------------------------------------------ price checks at load
//
// These load configurations whose routes use `cheapest` or `adaptive`, so they need those
// strategies in the registry; until then they return early.

fn strategies_registered(names: &[&str]) -> bool {
    names
        .iter()
        .all(|n| crate::strategy::registry::lookup(n).is_some())
}

#[test]
fn load_rejects_cheapest_route_without_prices() {
    if !strategies_registered(&["cheapest"]) {
        return;
    }
    let text = PRICE_FIXTURE.replace(
        "name = \"all\"\n",
        "name = \"all\"\nstrategy = \"cheapest\"\n",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    let e = error_at(&errs, "targets[2].price");
    assert!(
        e.message.contains("route `all`") && e.message.contains("target `any`"),
        "{e}"
    );
    let e = error_at(&errs, "targets[3].price");
    assert!(e.message.contains("model `secret`"), "{e}");
    assert!(e.fix.contains("\"org/secret-7b\""), "{e}");
}

#[test]
fn load_accepts_cheapest_route_with_known_prices() {
    if !strategies_registered(&["cheapest"]) {
        return;
    }
    // Route "known" (own price, builtin, [catalog]) and route "matched" (only the priced
    // model of "private") load; route "all" keeps round_robin.
    let text = PRICE_FIXTURE
        .replace(
            "name = \"known\"\n",
            "name = \"known\"\nstrategy = \"cheapest\"\n",
        )
        .replace(
            "name = \"matched\"\n",
            "name = \"matched\"\nstrategy = \"cheapest\"\n",
        );
    let c = load(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[1].strategy.name, "cheapest");
    let book = PriceBook::new(&c);
    for (target, model) in [
        (0, "anything"),
        (1, "gpt-4o-mini"),
        (1, "house"),
        (1, "claude"),
    ] {
        assert!(book.price(target, model).is_some(), "{target} {model}");
    }
}

#[test]
fn load_checks_adaptive_route_prices_unless_cost_is_off() {
    if !strategies_registered(&["adaptive"]) {
        return;
    }
    let with = |strategy: &str| {
        PRICE_FIXTURE.replace("name = \"all\"\n", &format!("name = \"all\"\n{strategy}\n"))
    };
    // Default w_cost (1.0): the same two gaps as for cheapest, with the w_cost hint.
    let errs = errors(&with("strategy = \"adaptive\""));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    let e = error_at(&errs, "targets[2].price");
    assert!(e.message.contains("strategy `adaptive`"), "{e}");
    assert!(e.fix.contains("w_cost = 0"), "{e}");
    // w_cost = 0: cost is not used, no price is needed.
    let c = load(&with("strategy = { name = \"adaptive\", w_cost = 0.0 }"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[0].strategy.name, "adaptive");
}

// ------------------------------------------------------------------ tokenizers

fn precise_route(options: &str) -> String {
    format!(
        "{ONE_TARGET}\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n[routes.strategy]\nname = \"precise_cache_aware\"\n{options}\n"
    )
}

#[test]
fn precise_cache_aware_loads_a_local_tokenizer_or_uses_the_engine() {
    let c = load(&precise_route("")).unwrap();
    assert!(c.routes[0].tokenizer.is_none(), "default: the engine");
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenizer/chatml"
    );
    let c = load(&precise_route(&format!(
        "tokenizer = \"{dir}/tokenizer.json\"\nmin_blocks = 2"
    )))
    .unwrap();
    let t = c.routes[0].tokenizer.as_ref().expect("loaded");
    assert!(
        t.has_chat_template(),
        "tokenizer_config.json beside it was read"
    );
}

#[test]
fn a_missing_tokenizer_file_is_a_configuration_error() {
    let errs = errors(&precise_route(
        "tokenizer = \"/nonexistent/tokenizer.json\"",
    ));
    let e = error_at(&errs, "routes[0].strategy.tokenizer");
    assert!(e.message.contains("/nonexistent/tokenizer.json"), "{e}");
    assert!(e.fix.contains("engine"), "{e}");
}

#[test]
fn kv_events_endpoints_and_settings_are_checked() {
    let ok = format!(
        "{ONE_TARGET}[targets.kv_events]\nendpoint = \"tcp://10.0.0.1:5557\"\nreplay_endpoint = \"tcp://10.0.0.1:5558\"\n\n[kv_events]\nblock_size = 32\nstale_after = \"3s\"\n"
    );
    let c = load(&ok).unwrap();
    let kv = c.targets[0].kv_events.as_ref().unwrap();
    assert_eq!(kv.endpoint, "tcp://10.0.0.1:5557");
    assert_eq!(kv.replay_endpoint.as_deref(), Some("tcp://10.0.0.1:5558"));
    assert_eq!(c.kv_events.block_size, 32);
    assert_eq!(c.kv_events.stale_after, Duration::from_secs(3));
    // The engine's bind address is not something to connect to.
    let errs = errors(&format!(
        "{ONE_TARGET}[targets.kv_events]\nendpoint = \"tcp://*:5557\"\n"
    ));
    let e = error_at(&errs, "targets[0].kv_events.endpoint");
    assert!(e.fix.contains("tcp://host:port"), "{e}");
    let errs = errors(&format!(
        "{ONE_TARGET}[targets.kv_events]\ntopic = \"kv@\"\n"
    ));
    error_at(&errs, "targets[0].kv_events.endpoint");
    let errs = errors(&format!("{ONE_TARGET}[kv_events]\nblock_size = 0\n"));
    error_at(&errs, "kv_events.block_size");
}

// ------------------------------------------------------------------ lmcache_aware

fn lmcache_route(target_extra: &str, options: &str) -> String {
    format!(
        "[[targets]]\nname = \"a\"\nurl = \"http://127.0.0.1:8001\"\n{target_extra}\n[[targets]]\nname = \"b\"\nurl = \"http://127.0.0.1:8002\"\n\n[[routes]]\nname = \"r\"\ntargets = [\"a\", \"b\"]\n[routes.strategy]\nname = \"lmcache_aware\"\n{options}\n"
    )
}

#[test]
fn lmcache_aware_resolves_its_controller_and_maps_instances() {
    let c = load(&lmcache_route(
        "lmcache_instance = \"vllm-pod-0\"",
        "controller = \"http://127.0.0.1:9000\"\nlookup_timeout = \"20ms\"",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let ctl = c.routes[0].cache_controller.as_ref().expect("resolved");
    assert_eq!(ctl.addr, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(ctl.host_header, "127.0.0.1:9000");
    assert_eq!(ctl.base_path, "");
    assert_eq!(c.targets[0].lmcache_instance, "vllm-pod-0");
    assert_eq!(
        c.targets[1].lmcache_instance, "b",
        "default: the target's name"
    );
    // Other strategies have no controller.
    let c = load(&precise_route("")).unwrap();
    assert!(c.routes[0].cache_controller.is_none());
}

#[test]
fn lmcache_aware_without_a_usable_controller_is_a_configuration_error() {
    let errs = errors(&lmcache_route("", ""));
    let e = error_at(&errs, "routes[0].strategy.controller");
    assert!(e.message.contains("no `controller`"), "{e}");
    assert!(e.fix.contains("http://"), "{e}");

    let errs = errors(&lmcache_route("", "controller = \"https://10.0.0.1:9000\""));
    let e = error_at(&errs, "routes[0].strategy.controller");
    assert!(e.message.contains("plain HTTP"), "{e}");

    let errs = errors(&lmcache_route("", "controller = \"10.0.0.1:9000\""));
    let e = error_at(&errs, "routes[0].strategy.controller");
    assert!(e.message.contains("no scheme"), "{e}");

    let errs = errors(&lmcache_route("", "controller = 9000"));
    error_at(&errs, "routes[0].strategy.controller");

    let errs = errors(&lmcache_route(
        "lmcache_instance = \"\"",
        "controller = \"http://127.0.0.1:9000\"",
    ));
    let e = error_at(&errs, "targets[0].lmcache_instance");
    assert!(e.fix.contains("LMCACHE_LMCACHE_INSTANCE_ID"), "{e}");

    let errs = errors(&lmcache_route(
        "",
        "controller = \"http://127.0.0.1:9000\"\nw_prefix = 0\nw_free = 0",
    ));
    error_at(&errs, "routes[0].strategy.w_prefix");
}
