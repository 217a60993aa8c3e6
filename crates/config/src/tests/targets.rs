//! `[[targets]]`: URLs, TLS trust, headers and environment, per-target keys.

use super::*;

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
pub(super) struct TempDir(pub(super) std::path::PathBuf);

impl TempDir {
    pub(super) fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p =
            std::env::temp_dir().join(format!("rolter-cfg-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub(super) fn write(&self, name: &str, contents: &[u8]) -> String {
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
