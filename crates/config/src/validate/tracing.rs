//! `[tracing]`: the OpenTelemetry collector spans are exported to (`endpoint`, `ca_file`,
//! `headers`), the sampling (`sample`, `parent_based`), the resource's `service_name` and
//! the exporter's bounds (`queue`, `batch`, `flush_interval`, `timeout`). The defaults
//! live in [`Tracing`]'s constants.
//!
//! Owns these keys' checks. It resolves no host name: the exporter does when it connects,
//! so a collector that is away at start never stops the gateway.

use super::common::*;
use super::targets::{ca_file, target_headers};
use crate::raw::RawTracing;

/// Written in the fixes for `tracing.endpoint`.
const ENDPOINT_EXAMPLE: &str = "endpoint = \"http://127.0.0.1:4318/v1/traces\"";

/// `[tracing]`: `Some(None)` without the section, `None` after an error.
pub(super) fn tracing(
    raw: Option<RawTracing>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<Tracing>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let endpoint = match raw.endpoint.as_deref() {
        Some(written) => endpoint(written, errs),
        None => {
            errs.push(
                "tracing.endpoint",
                "[tracing] has no `endpoint`",
                format!("add {ENDPOINT_EXAMPLE} (the collector's OTLP/HTTP traces URL), or remove [tracing]"),
            );
            None
        }
    };
    let endpoint = match (endpoint, raw.ca_file.as_deref()) {
        (Some(e), Some(written)) => endpoint_ca(e, written, host, errs),
        (e, _) => e,
    };
    let headers = export_headers(raw.headers, host, errs);
    let sample = match raw.sample {
        None => Some(Tracing::DEFAULT_SAMPLE),
        Some(s) if (0.0..=1.0).contains(&s) => Some(s),
        Some(s) => {
            errs.push(
                "tracing.sample",
                format!("`sample` = {s} is outside 0.0 to 1.0"),
                "write the share of new traces to sample, e.g. sample = 0.1 for one in ten, or 1.0 (the default) for all",
            );
            None
        }
    };
    let service_name = match raw.service_name {
        None => Some(Tracing::DEFAULT_SERVICE_NAME.to_string()),
        Some(n) if !n.trim().is_empty() && !n.chars().any(char::is_control) => Some(n),
        Some(_) => {
            errs.push(
                "tracing.service_name",
                "`service_name` is empty or holds a control character",
                "write the name the collector shows for this gateway, e.g. service_name = \"rolter\" (the default)",
            );
            None
        }
    };
    let queue = bounded(
        raw.queue,
        "tracing.queue",
        Tracing::DEFAULT_QUEUE,
        Tracing::MAX_QUEUE,
        "spans buffered for the exporter before new ones are dropped",
        errs,
    );
    let batch = bounded(
        raw.batch,
        "tracing.batch",
        Tracing::DEFAULT_BATCH,
        Tracing::MAX_BATCH,
        "spans sent in one export at most",
        errs,
    );
    let flush_interval = nonzero_duration(
        raw.flush_interval.as_ref(),
        "tracing.flush_interval",
        Tracing::DEFAULT_FLUSH_INTERVAL,
        errs,
    );
    let timeout = duration(
        raw.timeout.as_ref(),
        "tracing.timeout",
        Tracing::DEFAULT_TIMEOUT,
        false,
        errs,
    );
    Some(Some(Tracing {
        endpoint: endpoint?,
        sample: sample?,
        parent_based: raw.parent_based.unwrap_or(true),
        headers: headers?,
        service_name: service_name?,
        queue: queue?,
        batch: batch?,
        flush_interval: flush_interval?,
        timeout: timeout?,
    }))
}

/// A count from 1 to `max` (`default` when absent).
fn bounded(
    v: Option<i64>,
    key: &str,
    default: usize,
    max: usize,
    what: &str,
    errs: &mut Collector,
) -> Option<usize> {
    let hi = u32::try_from(max).unwrap_or(u32::MAX);
    let default = u32::try_from(default).unwrap_or(hi);
    count(v, key, default, 1..=hi, what, errs).map(|n| n as usize)
}

/// `tracing.endpoint`: an absolute http:// or https:// URL with a host and a path, and no
/// credentials, query or fragment.
fn endpoint(written: &str, errs: &mut Collector) -> Option<TraceEndpoint> {
    const KEY: &str = "tracing.endpoint";
    let u = match url::Url::parse(written) {
        Ok(u) if written.contains("://") => u,
        Ok(_) | Err(_) => {
            errs.push(
                KEY,
                format!("`{written}` is not an absolute http:// or https:// URL"),
                format!("write the collector's OTLP/HTTP traces URL, e.g. {ENDPOINT_EXAMPLE}"),
            );
            return None;
        }
    };
    let tls = match u.scheme() {
        "http" => false,
        "https" => true,
        other => {
            errs.push(
                KEY,
                format!("unsupported URL scheme `{other}` in `{written}`; spans are sent over OTLP/HTTP"),
                format!("use http:// or https://, e.g. {ENDPOINT_EXAMPLE} (OTLP over gRPC, port 4317, is not supported)"),
            );
            return None;
        }
    };
    if !endpoint_parts_ok(&u, written, errs) {
        return None;
    }
    let (host_str, url_host) = (u.host_str().unwrap_or_default(), u.host()?);
    let connect_host = match url_host {
        url::Host::Ipv6(ip) => ip.to_string(),
        _ => host_str.to_string(),
    };
    if tls && rustls::pki_types::ServerName::try_from(connect_host.as_str()).is_err() {
        errs.push(
            KEY,
            format!("`{connect_host}` in `{written}` is not a valid TLS server name"),
            "use the DNS name (or IP address) the collector's certificate is issued for",
        );
        return None;
    }
    Some(TraceEndpoint {
        url: written.to_string(),
        tls,
        port: u
            .port_or_known_default()
            .unwrap_or(if tls { 443 } else { 80 }),
        host_header: match u.port() {
            Some(p) => format!("{host_str}:{p}"),
            None => host_str.to_string(),
        },
        host: connect_host,
        path: u.path().to_string(),
        ca_file: None,
        ca_certs: Vec::new(),
    })
}

/// Reports each part the endpoint may not have or must have; true when all is well.
fn endpoint_parts_ok(u: &url::Url, written: &str, errs: &mut Collector) -> bool {
    const KEY: &str = "tracing.endpoint";
    let problems = [
        (
            u.host_str().is_none_or(str::is_empty),
            "has no host",
            format!("write the collector's host, e.g. {ENDPOINT_EXAMPLE}"),
        ),
        (
            !u.username().is_empty() || u.password().is_some(),
            "contains user credentials",
            "remove `user:password@` from the URL and send credentials in `headers`, e.g. headers = { \"Authorization\" = \"Bearer ${OTLP_TOKEN}\" }".to_string(),
        ),
        (
            u.query().is_some() || u.fragment().is_some(),
            "has a query string or a fragment",
            "remove the `?…` or `#…` part; the URL names the collector's host, port and path".to_string(),
        ),
        (
            u.path() == "/",
            "has no path; OTLP/HTTP collectors take traces at /v1/traces",
            format!("write the whole traces URL, e.g. {ENDPOINT_EXAMPLE}"),
        ),
    ];
    let mut ok = true;
    for (bad, what, fix) in problems {
        if bad && ok {
            errs.push(KEY, format!("`{written}` {what}"), fix);
            ok = false;
        }
    }
    ok
}

/// `tracing.ca_file` for `endpoint`: only for an https:// endpoint.
fn endpoint_ca(
    endpoint: TraceEndpoint,
    written: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<TraceEndpoint> {
    const KEY: &str = "tracing.ca_file";
    if !endpoint.tls {
        errs.push(
            KEY,
            format!(
                "ca_file is set but the endpoint `{}` is plaintext http://; a CA file only applies to TLS",
                endpoint.url
            ),
            "remove `ca_file`, or change the endpoint to https:// if the collector speaks TLS",
        );
        return None;
    }
    let (path, certs) = ca_file(written, None, KEY, host, errs)?;
    Some(TraceEndpoint {
        ca_file: Some(path),
        ca_certs: certs,
        ..endpoint
    })
}

/// `tracing.headers`: checked as a target's headers are; `content-type` is the
/// exporter's own.
fn export_headers(
    raw: Option<OrderedStrings>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Vec<(String, String)>> {
    let own = raw.as_ref().and_then(|OrderedStrings(h)| {
        h.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .map(|(n, _)| n.clone())
    });
    let headers = target_headers(raw, "tracing.headers", host, errs)?;
    if let Some(name) = own {
        errs.push(
            join("tracing.headers", &name),
            "the exporter sends `content-type: application/x-protobuf` itself",
            format!("remove `{name}` from headers"),
        );
        return None;
    }
    Some(headers)
}
