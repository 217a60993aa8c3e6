//! `[tracing]`: the collector endpoint, sampling and the exporter's bounds.

use super::*;

fn with_tracing(section: &str) -> String {
    format!("{ONE_TARGET}\n[tracing]\n{section}")
}

fn tracing(section: &str) -> Tracing {
    load(&with_tracing(section))
        .unwrap_or_else(|e| panic!("{e}"))
        .tracing
        .expect("[tracing] is configured")
}

#[test]
fn without_the_section_there_is_no_trace_plane() {
    assert!(load(ONE_TARGET).unwrap().tracing.is_none());
}

#[test]
fn defaults_with_an_endpoint_alone() {
    let t = tracing("endpoint = \"http://127.0.0.1:4318/v1/traces\"\n");
    assert_eq!(
        t.endpoint,
        TraceEndpoint {
            url: "http://127.0.0.1:4318/v1/traces".into(),
            tls: false,
            host: "127.0.0.1".into(),
            port: 4318,
            path: "/v1/traces".into(),
            host_header: "127.0.0.1:4318".into(),
            ca_file: None,
            ca_certs: Vec::new(),
        }
    );
    assert_eq!(t.sample, 1.0);
    assert!(t.parent_based);
    assert!(t.headers.is_empty());
    assert_eq!(t.service_name, "rolter");
    assert_eq!((t.queue, t.batch), (4096, 512));
    assert_eq!(t.flush_interval, Duration::from_secs(1));
    assert_eq!(t.timeout, Duration::from_secs(5));
}

#[test]
fn every_key_is_read() {
    let t = tracing(
        "endpoint = \"https://otel.example.com/otlp/v1/traces\"\nsample = 0.25\n\
         parent_based = false\nservice_name = \"gw-eu\"\nqueue = 100\nbatch = 10\n\
         flush_interval = \"250ms\"\ntimeout = \"2s\"\n\
         headers = { \"Authorization\" = \"Bearer ${TOKEN}\", \"X-Tenant\" = \"blue\" }\n",
    );
    let e = &t.endpoint;
    assert!(e.tls);
    assert_eq!(
        (
            e.host.as_str(),
            e.port,
            e.path.as_str(),
            e.host_header.as_str()
        ),
        (
            "otel.example.com",
            443,
            "/otlp/v1/traces",
            "otel.example.com"
        )
    );
    assert_eq!(t.sample, 0.25);
    assert!(!t.parent_based);
    assert_eq!(t.service_name, "gw-eu");
    assert_eq!((t.queue, t.batch), (100, 10));
    assert_eq!(t.flush_interval, Duration::from_millis(250));
    assert_eq!(t.timeout, Duration::from_secs(2));
    assert_eq!(
        t.headers,
        vec![
            ("authorization".to_string(), "Bearer abc".to_string()),
            ("x-tenant".to_string(), "blue".to_string())
        ]
    );
    // The header values never show in the configuration's Debug form.
    let shown = format!("{t:?}");
    assert!(
        !shown.contains("Bearer abc") && shown.contains("<redacted sha256:"),
        "{shown}"
    );
}

#[test]
fn an_ipv6_endpoint_connects_without_brackets() {
    let t = tracing("endpoint = \"http://[::1]:4318/v1/traces\"\n");
    assert_eq!(t.endpoint.host, "::1");
    assert_eq!(t.endpoint.host_header, "[::1]:4318");
}

#[test]
fn a_section_without_endpoint_says_what_to_write() {
    let errs = errors(&with_tracing("sample = 0.5\n"));
    let e = error_at(&errs, "tracing.endpoint");
    assert_eq!(e.message, "[tracing] has no `endpoint`");
    assert!(
        e.fix
            .contains("endpoint = \"http://127.0.0.1:4318/v1/traces\""),
        "{}",
        e.fix
    );
}

#[test]
fn bad_endpoints_are_refused_with_the_reason() {
    for (written, message) in [
        (
            "127.0.0.1:4318/v1/traces",
            "is not an absolute http:// or https:// URL",
        ),
        ("", "is not an absolute http:// or https:// URL"),
        (
            "grpc://127.0.0.1:4317/v1/traces",
            "unsupported URL scheme `grpc`",
        ),
        ("http://127.0.0.1:4318", "has no path"),
        ("http://127.0.0.1:4318/", "has no path"),
        (
            "http://u:p@127.0.0.1:4318/v1/traces",
            "contains user credentials",
        ),
        (
            "http://127.0.0.1:4318/v1/traces?x=1",
            "has a query string or a fragment",
        ),
    ] {
        let errs = errors(&with_tracing(&format!("endpoint = \"{written}\"\n")));
        let e = error_at(&errs, "tracing.endpoint");
        assert!(e.message.contains(message), "{written}: {}", e.message);
        assert!(!e.fix.is_empty());
    }
}

#[test]
fn out_of_range_values_name_their_key() {
    let endpoint = "endpoint = \"http://127.0.0.1:4318/v1/traces\"\n";
    for (line, key, message) in [
        (
            "sample = 1.5",
            "tracing.sample",
            "`sample` = 1.5 is outside 0.0 to 1.0",
        ),
        (
            "sample = -0.1",
            "tracing.sample",
            "`sample` = -0.1 is outside 0.0 to 1.0",
        ),
        (
            "queue = 0",
            "tracing.queue",
            "queue is 0; it must be between 1 and 1000000",
        ),
        (
            "queue = 1000001",
            "tracing.queue",
            "queue is 1000001; it must be between 1 and 1000000",
        ),
        (
            "batch = 0",
            "tracing.batch",
            "batch is 0; it must be between 1 and 100000",
        ),
        (
            "flush_interval = \"0s\"",
            "tracing.flush_interval",
            "flush_interval is zero",
        ),
        (
            "flush_interval = 5",
            "tracing.flush_interval",
            "duration `5` has no unit",
        ),
        (
            "timeout = \"0s\"",
            "tracing.timeout",
            "duration `0s` is zero",
        ),
        (
            "timeout = \"soon\"",
            "tracing.timeout",
            "`soon` is not a duration",
        ),
        (
            "service_name = \"\"",
            "tracing.service_name",
            "`service_name` is empty",
        ),
    ] {
        let errs = errors(&with_tracing(&format!("{endpoint}{line}\n")));
        let e = error_at(&errs, key);
        assert!(e.message.contains(message), "{line}: {}", e.message);
        assert!(!e.fix.is_empty(), "{line}");
    }
}

#[test]
fn headers_are_checked_like_a_targets() {
    let endpoint = "endpoint = \"http://127.0.0.1:4318/v1/traces\"\n";
    for (headers, key, message) in [
        (
            "{ \"Bad Name\" = \"x\" }",
            "tracing.headers.\"Bad Name\"",
            "not allowed in an HTTP header name",
        ),
        (
            "{ \"Host\" = \"x\" }",
            "tracing.headers.Host",
            "one the gateway manages itself",
        ),
        (
            "{ \"X-Evil\" = \"${EVIL}\" }",
            "tracing.headers.X-Evil",
            "header value contains a carriage return",
        ),
        (
            "{ \"X-Key\" = \"${NOPE}\" }",
            "tracing.headers.X-Key",
            "environment variable `NOPE` is not set",
        ),
        (
            "{ \"Content-Type\" = \"text/plain\" }",
            "tracing.headers.Content-Type",
            "sends `content-type: application/x-protobuf` itself",
        ),
    ] {
        let errs = errors(&with_tracing(&format!("{endpoint}headers = {headers}\n")));
        let e = error_at(&errs, key);
        assert!(e.message.contains(message), "{headers}: {}", e.message);
    }
}

#[test]
fn ca_file_needs_an_https_endpoint_and_a_readable_file() {
    let errs = errors(&with_tracing(
        "endpoint = \"http://127.0.0.1:4318/v1/traces\"\nca_file = \"ca.pem\"\n",
    ));
    let e = error_at(&errs, "tracing.ca_file");
    assert!(e.message.contains("plaintext http://"), "{}", e.message);
    let errs = errors(&with_tracing(
        "endpoint = \"https://127.0.0.1:4318/v1/traces\"\nca_file = \"/nonexistent/ca.pem\"\n",
    ));
    let e = error_at(&errs, "tracing.ca_file");
    assert!(e.message.contains("cannot read ca_file"), "{}", e.message);
}

#[test]
fn a_misspelt_key_is_an_unknown_key_with_a_suggestion() {
    let errs = errors(&with_tracing(
        "endpoint = \"http://127.0.0.1:4318/v1/traces\"\nsampel = 0.5\n",
    ));
    let e = error_at(&errs, "tracing.sampel");
    assert_eq!(e.message, "unknown key `sampel` in [tracing]");
    assert!(e.fix.starts_with("did you mean `sample`?"), "{}", e.fix);
    // Every listed key is accepted by the section's serde type.
    for key in raw::TRACING_KEYS {
        let text = format!("[tracing]\n{key} = 1\n");
        if let Err(errs) = load(&text) {
            for e in &errs {
                assert!(!e.message.contains("unknown key"), "{text}: {e}");
            }
        }
    }
}
