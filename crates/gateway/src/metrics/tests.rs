//! Render-and-parse-back tests: what `render` writes is read with the same parser the
//! scraper uses, and every value and bucket count is checked.

use std::time::{Duration, Instant};

use prom_text_format_parser::{Scrape, Type, ValueType};

use super::*;
use rolter_strategy::{Sample, Usage};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn metrics() -> GatewayMetrics {
    GatewayMetrics::new(
        &names(&["chat", "embed"]),
        &["round_robin", "least_loaded"],
        &names(&["a", "b"]),
    )
}

fn sample(target: usize, status: u16, ttft_ms: Option<u64>, duration_ms: u64) -> Sample {
    Sample {
        target,
        status,
        success: (200..300).contains(&status),
        ttft: ttft_ms.map(Duration::from_millis),
        first_byte: ttft_ms.map(Duration::from_millis),
        duration: Duration::from_millis(duration_ms),
        load_at_send: 0,
        prompt_tokens: 0,
        usage: None,
        finished: Instant::now(),
    }
}

fn gauge(in_flight: u64, scrape: ScrapeStatus) -> TargetGauges {
    TargetGauges {
        in_flight,
        queue_depth: None,
        running: None,
        kv_usage: None,
        healthy: true,
        ejected: false,
        scrape,
    }
}

/// Renders and parses back strictly: any family without both HELP and TYPE, any sample
/// that does not belong to its declared family, or any syntax error fails.
fn render(m: &GatewayMetrics, gauges: &[TargetGauges], adaptive: bool) -> (String, Scrape) {
    let mut out = String::new();
    m.render(gauges, adaptive, &mut out);
    let scrape = Scrape::parse(&out).unwrap_or_else(|e| panic!("{e:?}\n{out}"));
    for metric in &scrape.metrics {
        assert!(
            metric.help_desc.is_some(),
            "{} has no HELP\n{out}",
            metric.name
        );
        assert_ne!(
            metric.kind,
            Type::Untyped,
            "{} has no TYPE\n{out}",
            metric.name
        );
    }
    let mut seen: Vec<&str> = scrape.metrics.iter().map(|m| m.name.as_str()).collect();
    seen.sort_unstable();
    let before = seen.len();
    seen.dedup();
    assert_eq!(before, seen.len(), "a family is written twice\n{out}");
    (out, scrape)
}

/// The value of the one sample of family `name` with exactly these labels and value type.
fn get(scrape: &Scrape, name: &str, vt: ValueType, labels: &[(&str, &str)]) -> Option<f64> {
    let metric = scrape.metrics.iter().find(|m| m.name == name)?;
    let mut found = metric.samples.iter().filter(|s| {
        s.value.value_type == vt
            && s.labels.len() == labels.len()
            && labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|l| l.key == *k && l.value == *v))
    });
    let first = found.next()?;
    assert!(found.next().is_none(), "{name} {labels:?} appears twice");
    Some(first.value.value.parse().expect("a number"))
}

fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    get(scrape, name, ValueType::Sample, labels)
}

fn kind(scrape: &Scrape, name: &str) -> Option<Type> {
    scrape
        .metrics
        .iter()
        .find(|m| m.name == name)
        .map(|m| m.kind)
}

/// Bucket counts of one histogram series, in bucket order, `+Inf` last.
fn buckets(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<(String, f64)> {
    let metric = scrape.metrics.iter().find(|m| m.name == name).expect(name);
    metric
        .samples
        .iter()
        .filter(|s| {
            s.value.value_type == ValueType::Sample
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|l| l.key == *k && l.value == *v))
        })
        .map(|s| {
            let le = s.labels.iter().find(|l| l.key == "le").expect("le label");
            (le.value.clone(), s.value.value.parse().expect("a number"))
        })
        .collect()
}

/// The cumulative count at `le` (as the encoder writes the bound).
fn bucket(all: &[(String, f64)], le: &str) -> f64 {
    all.iter()
        .find(|(b, _)| b == le)
        .unwrap_or_else(|| panic!("no bucket {le} in {all:?}"))
        .1
}

#[test]
fn attempts_render_as_counters_and_histograms() {
    let mut m = metrics();
    let mut first = sample(0, 200, Some(30), 1_200);
    first.usage = Some(Usage {
        prompt_tokens: 10,
        completion_tokens: 20,
    });
    m.record_attempt(0, &first);
    let mut second = sample(0, 200, Some(3_000), 40_000);
    second.usage = Some(Usage {
        prompt_tokens: 5,
        completion_tokens: 7,
    });
    m.record_attempt(0, &second);
    m.record_attempt(0, &sample(1, 0, None, 500));
    m.record_attempt(1, &sample(1, 503, None, 5));

    let gauges = [gauge(0, ScrapeStatus::Off), gauge(0, ScrapeStatus::Off)];
    let (out, s) = render(&m, &gauges, true);

    let req = "rolter_requests_total";
    assert_eq!(kind(&s, req), Some(Type::Counter));
    assert_eq!(
        value(
            &s,
            req,
            &[("route", "chat"), ("target", "a"), ("code", "200")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            req,
            &[("route", "chat"), ("target", "b"), ("code", "none")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            req,
            &[("route", "embed"), ("target", "b"), ("code", "503")]
        ),
        Some(1.0)
    );
    assert_eq!(
        s.metrics
            .iter()
            .find(|x| x.name == req)
            .unwrap()
            .samples
            .len(),
        3
    );

    // TTFT: 30 ms and 3 s on chat/a; no series where no attempt had a first byte.
    let ttft = "rolter_ttft_seconds";
    assert_eq!(kind(&s, ttft), Some(Type::Histogram));
    let chat_a = [("route", "chat"), ("target", "a")];
    let b = buckets(&s, ttft, &chat_a);
    assert_eq!(b.len(), TTFT_BUCKETS.len() + 1, "{b:?}");
    assert_eq!(b.first().map(|(le, _)| le.as_str()), Some("0.005"));
    assert_eq!(b.last().map(|(le, _)| le.as_str()), Some("+Inf"));
    assert_eq!(bucket(&b, "0.025"), 0.0);
    assert_eq!(bucket(&b, "0.05"), 1.0);
    assert_eq!(bucket(&b, "2.5"), 1.0);
    assert_eq!(bucket(&b, "5"), 2.0);
    assert_eq!(bucket(&b, "+Inf"), 2.0);
    assert_eq!(get(&s, ttft, ValueType::Count, &chat_a), Some(2.0));
    let sum = get(&s, ttft, ValueType::Sum, &chat_a).unwrap();
    assert!((sum - 3.03).abs() < 1e-9, "{sum}");
    assert!(buckets(&s, ttft, &[("route", "chat"), ("target", "b")]).is_empty());
    assert!(buckets(&s, ttft, &[("route", "embed")]).is_empty());

    // Duration: every attempt, with or without a response.
    let dur = "rolter_request_duration_seconds";
    let b = buckets(&s, dur, &chat_a);
    assert_eq!(b.len(), DURATION_BUCKETS.len() + 1, "{b:?}");
    assert_eq!(bucket(&b, "1"), 0.0);
    assert_eq!(bucket(&b, "2.5"), 1.0);
    assert_eq!(bucket(&b, "30"), 1.0);
    assert_eq!(bucket(&b, "60"), 2.0);
    assert_eq!(bucket(&b, "600"), 2.0);
    assert_eq!(bucket(&b, "+Inf"), 2.0);
    let sum = get(&s, dur, ValueType::Sum, &chat_a).unwrap();
    assert!((sum - 41.2).abs() < 1e-9, "{sum}");
    let chat_b = [("route", "chat"), ("target", "b")];
    assert_eq!(bucket(&buckets(&s, dur, &chat_b), "0.25"), 0.0);
    assert_eq!(bucket(&buckets(&s, dur, &chat_b), "0.5"), 1.0);
    assert_eq!(get(&s, dur, ValueType::Count, &chat_b), Some(1.0));
    let embed_b = [("route", "embed"), ("target", "b")];
    assert_eq!(bucket(&buckets(&s, dur, &embed_b), "0.01"), 1.0);

    // Tokens: summed per target and kind; targets without usage stay at zero.
    let tok = "rolter_tokens_total";
    assert_eq!(kind(&s, tok), Some(Type::Counter));
    assert_eq!(
        value(&s, tok, &[("target", "a"), ("kind", "prompt")]),
        Some(15.0)
    );
    assert_eq!(
        value(&s, tok, &[("target", "a"), ("kind", "completion")]),
        Some(27.0)
    );
    assert_eq!(
        value(&s, tok, &[("target", "b"), ("kind", "prompt")]),
        Some(0.0)
    );

    // Nothing recorded for these yet: the families are left out entirely.
    for absent in [
        "rolter_strategy_decisions_total",
        "rolter_strategy_fallbacks_total",
        "rolter_gateway_responses_total",
    ] {
        assert!(!out.contains(absent), "{absent} written\n{out}");
    }
}

#[test]
fn decisions_fallbacks_responses_ejections_and_scrape_failures() {
    let mut m = metrics();
    m.record_decision(0, 1);
    m.record_decision(0, 1);
    m.record_decision(1, 0);
    m.record_fallback(0, "cold_start");
    m.record_fallback(0, "cold_start");
    m.record_fallback(0, "adaptive_off");
    m.record_fallback(1, "cold_start");
    m.record_gateway_response(404, "model_not_found");
    m.record_gateway_response(404, "model_not_found");
    m.record_gateway_response(503, "no_available_target");
    m.record_gateway_response(400, "invalid_json");
    m.record_ejection(1);
    m.record_scrape_failure(0);
    m.record_scrape_failure(0);

    let gauges = [gauge(0, ScrapeStatus::Off), gauge(0, ScrapeStatus::Off)];
    let (_, s) = render(&m, &gauges, false);

    let dec = "rolter_strategy_decisions_total";
    assert_eq!(
        value(
            &s,
            dec,
            &[
                ("route", "chat"),
                ("strategy", "round_robin"),
                ("target", "b")
            ]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            dec,
            &[
                ("route", "embed"),
                ("strategy", "least_loaded"),
                ("target", "a")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        s.metrics
            .iter()
            .find(|x| x.name == dec)
            .unwrap()
            .samples
            .len(),
        2
    );

    let fb = "rolter_strategy_fallbacks_total";
    let chat = [("route", "chat"), ("strategy", "round_robin")];
    assert_eq!(
        value(&s, fb, &[chat[0], chat[1], ("reason", "cold_start")]),
        Some(2.0)
    );
    assert_eq!(
        value(&s, fb, &[chat[0], chat[1], ("reason", "adaptive_off")]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            fb,
            &[
                ("route", "embed"),
                ("strategy", "least_loaded"),
                ("reason", "cold_start")
            ]
        ),
        Some(1.0)
    );

    let gw = "rolter_gateway_responses_total";
    assert_eq!(
        value(&s, gw, &[("status", "404"), ("code", "model_not_found")]),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            gw,
            &[("status", "503"), ("code", "no_available_target")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, gw, &[("status", "400"), ("code", "invalid_json")]),
        Some(1.0)
    );

    let ej = "rolter_ejections_total";
    assert_eq!(value(&s, ej, &[("target", "a")]), Some(0.0));
    assert_eq!(value(&s, ej, &[("target", "b")]), Some(1.0));
    let sf = "rolter_scrape_failures_total";
    assert_eq!(value(&s, sf, &[("target", "a")]), Some(2.0));
    assert_eq!(value(&s, sf, &[("target", "b")]), Some(0.0));

    assert_eq!(value(&s, "rolter_adaptive_enabled", &[]), Some(0.0));
}

#[test]
fn target_gauges() {
    let m = GatewayMetrics::new(
        &names(&["chat"]),
        &["adaptive"],
        &names(&["a", "b", "c", "d"]),
    );
    let gauges = [
        TargetGauges {
            in_flight: 3,
            queue_depth: Some(2),
            running: Some(5),
            kv_usage: Some(0.25),
            healthy: true,
            ejected: false,
            scrape: ScrapeStatus::Fresh {
                age: Duration::from_millis(1_500),
            },
        },
        TargetGauges {
            in_flight: 0,
            queue_depth: None,
            running: None,
            kv_usage: None,
            healthy: false,
            ejected: true,
            scrape: ScrapeStatus::Stale {
                age: Duration::from_secs(12),
            },
        },
        gauge(7, ScrapeStatus::Never),
        gauge(1, ScrapeStatus::Off),
    ];
    let (_, s) = render(&m, &gauges, true);
    let t = |name| [("target", name)];

    for family in [
        "rolter_target_in_flight",
        "rolter_target_queue_depth",
        "rolter_target_running",
        "rolter_target_kv_cache_usage",
        "rolter_target_healthy",
        "rolter_target_ejected",
        "rolter_scrape_up",
        "rolter_scrape_age_seconds",
        "rolter_adaptive_enabled",
    ] {
        assert_eq!(kind(&s, family), Some(Type::Gauge), "{family}");
    }

    let inf = "rolter_target_in_flight";
    assert_eq!(value(&s, inf, &t("a")), Some(3.0));
    assert_eq!(value(&s, inf, &t("b")), Some(0.0));
    assert_eq!(value(&s, inf, &t("c")), Some(7.0));
    assert_eq!(value(&s, inf, &t("d")), Some(1.0));

    // Unknown values have no series.
    for (family, a) in [
        ("rolter_target_queue_depth", 2.0),
        ("rolter_target_running", 5.0),
        ("rolter_target_kv_cache_usage", 0.25),
    ] {
        assert_eq!(value(&s, family, &t("a")), Some(a), "{family}");
        for other in ["b", "c", "d"] {
            assert_eq!(value(&s, family, &t(other)), None, "{family} {other}");
        }
    }

    assert_eq!(value(&s, "rolter_target_healthy", &t("a")), Some(1.0));
    assert_eq!(value(&s, "rolter_target_healthy", &t("b")), Some(0.0));
    assert_eq!(value(&s, "rolter_target_ejected", &t("a")), Some(0.0));
    assert_eq!(value(&s, "rolter_target_ejected", &t("b")), Some(1.0));

    // Fresh 1, stale and never 0, off absent; an age only where a scrape succeeded.
    let up = "rolter_scrape_up";
    assert_eq!(value(&s, up, &t("a")), Some(1.0));
    assert_eq!(value(&s, up, &t("b")), Some(0.0));
    assert_eq!(value(&s, up, &t("c")), Some(0.0));
    assert_eq!(value(&s, up, &t("d")), None);
    let age = "rolter_scrape_age_seconds";
    assert_eq!(value(&s, age, &t("a")), Some(1.5));
    assert_eq!(value(&s, age, &t("b")), Some(12.0));
    assert_eq!(value(&s, age, &t("c")), None);
    assert_eq!(value(&s, age, &t("d")), None);

    assert_eq!(value(&s, "rolter_adaptive_enabled", &[]), Some(1.0));
}

#[test]
fn families_without_series_are_left_out() {
    let m = GatewayMetrics::new(&[], &[], &[]);
    let (out, s) = render(&m, &[], true);
    let families: Vec<&str> = s.metrics.iter().map(|x| x.name.as_str()).collect();
    // The access log's drop counter is always there, at 0 until a line is dropped.
    assert_eq!(
        families,
        ["rolter_access_log_dropped_total", "rolter_adaptive_enabled"],
        "{out}"
    );
    assert!(out.contains("rolter_access_log_dropped_total 0\n"), "{out}");
    assert!(out.contains("# HELP rolter_adaptive_enabled "), "{out}");
    assert!(
        out.contains("# TYPE rolter_adaptive_enabled gauge\n"),
        "{out}"
    );
}

#[test]
fn render_appends_and_every_family_has_help_and_type() {
    let mut m = metrics();
    m.record_attempt(1, &sample(0, 429, Some(12), 40));
    let gauges = [gauge(1, ScrapeStatus::Never), gauge(2, ScrapeStatus::Off)];
    let mut out = String::from("# leading text kept\n");
    m.render(&gauges, true, &mut out);
    assert!(out.starts_with("# leading text kept\n"));

    // Every sample line's family is declared just before it, under the name the samples use.
    let mut declared = Vec::new();
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let name = parts.next().unwrap();
            assert!(
                out.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
            declared.push((name.to_string(), parts.next().unwrap().to_string()));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let (family, kind) = declared.last().expect("a sample before any TYPE");
            let ok = match kind.as_str() {
                "histogram" => [
                    format!("{family}_bucket"),
                    format!("{family}_sum"),
                    format!("{family}_count"),
                ]
                .contains(&name.to_string()),
                _ => name == family,
            };
            assert!(ok, "{name} under # TYPE {family} {kind}");
        }
    }
    assert!(declared
        .iter()
        .any(|(n, k)| n == "rolter_requests_total" && k == "counter"));
    let (_, s) = render(&m, &gauges, true);
    assert_eq!(
        value(
            &s,
            "rolter_requests_total",
            &[("route", "embed"), ("target", "a"), ("code", "429")]
        ),
        Some(1.0)
    );
}

/// Label values are escaped, so odd route and target names keep the output parseable.
#[test]
fn label_values_are_escaped() {
    let mut m = GatewayMetrics::new(
        &names(&["r \"quoted\""]),
        &["random"],
        &names(&["back\\slash", "new\nline"]),
    );
    m.record_attempt(0, &sample(1, 200, Some(5), 10));
    let gauges = [gauge(0, ScrapeStatus::Off), gauge(0, ScrapeStatus::Off)];
    let (out, s) = render(&m, &gauges, true);
    assert!(out.contains(r#"target="new\nline""#), "{out}");
    // The parser keeps label values as written, escapes included.
    assert_eq!(
        value(
            &s,
            "rolter_requests_total",
            &[
                ("route", r#"r \"quoted\""#),
                ("target", r"new\nline"),
                ("code", "200")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "rolter_ejections_total", &[("target", r"back\\slash")]),
        Some(0.0)
    );
}

/// Indices outside the configuration are a caller bug: a panic in debug builds, ignored in
/// release builds so the control thread keeps running.
#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "out of range"))]
fn out_of_range_indices() {
    let mut m = metrics();
    m.record_attempt(5, &sample(0, 200, None, 1));
    m.record_attempt(0, &sample(9, 200, None, 1));
    m.record_decision(0, 9);
    m.record_fallback(7, "x");
    m.record_ejection(9);
    m.record_scrape_failure(9);
    let gauges = [gauge(0, ScrapeStatus::Off), gauge(0, ScrapeStatus::Off)];
    let (out, _) = render(&m, &gauges, true);
    assert!(!out.contains("rolter_requests_total{"), "{out}");
    assert!(!out.contains("rolter_strategy_"), "{out}");
}

#[test]
fn content_type_is_the_prometheus_text_format() {
    assert_eq!(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
}

#[test]
fn cache_lookups_and_kv_event_series() {
    let mut m = metrics();
    m.record_cache_lookup(0, "answered");
    m.record_cache_lookup(0, "answered");
    m.record_cache_lookup(0, "memo");
    m.record_cache_lookup(1, "timeout");
    let reports = [rolter_engine::kv::reports::KvTargetReport {
        target: 1,
        connected: true,
        live: true,
        frames: 40,
        replayed: 3,
        gaps: 2,
        replays: 1,
        blocks: 1200,
        ..Default::default()
    }];
    let gauges = [gauge(0, ScrapeStatus::Off), gauge(0, ScrapeStatus::Off)];
    let mut out = String::new();
    m.render_with_kv(&gauges, false, &[], Some(&reports), &mut out);
    let s = Scrape::parse(&out).unwrap_or_else(|e| panic!("{e:?}\n{out}"));
    assert!(s
        .metrics
        .iter()
        .all(|f| f.help_desc.is_some() && f.kind != Type::Untyped));
    let lookups = "rolter_cache_lookups_total";
    assert_eq!(kind(&s, lookups), Some(Type::Counter));
    assert_eq!(
        value(&s, lookups, &[("route", "chat"), ("result", "answered")]),
        Some(2.0)
    );
    assert_eq!(
        value(&s, lookups, &[("route", "chat"), ("result", "memo")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, lookups, &[("route", "embed"), ("result", "timeout")]),
        Some(1.0)
    );
    let t = [("target", "b")];
    assert_eq!(value(&s, "rolter_kv_events_live", &t), Some(1.0));
    assert_eq!(kind(&s, "rolter_kv_events_live"), Some(Type::Gauge));
    assert_eq!(value(&s, "rolter_kv_events_messages_total", &t), Some(40.0));
    assert_eq!(
        kind(&s, "rolter_kv_events_messages_total"),
        Some(Type::Counter)
    );
    assert_eq!(value(&s, "rolter_kv_events_gaps_total", &t), Some(2.0));
    assert_eq!(value(&s, "rolter_kv_index_blocks", &t), Some(1200.0));
    // Only targets that publish have series.
    assert_eq!(value(&s, "rolter_kv_events_live", &[("target", "a")]), None);
    // Without a KV plane, none of its families is written.
    let mut plain = String::new();
    m.render(&gauges, false, &mut plain);
    assert!(!plain.contains("rolter_kv_"), "{plain}");
}

#[test]
fn mesh_drops_are_counters_by_kind() {
    let m = metrics();
    let gauges = [gauge(0, ScrapeStatus::Off), gauge(0, ScrapeStatus::Off)];
    let mut out = String::new();
    m.render_with_kv(
        &gauges,
        true,
        &[("load", 3), ("records", 0)],
        None,
        &mut out,
    );
    let s = Scrape::parse(&out).unwrap_or_else(|e| panic!("{e:?}\n{out}"));
    let name = "rolter_mesh_dropped_total";
    assert_eq!(kind(&s, name), Some(Type::Counter), "{out}");
    assert_eq!(value(&s, name, &[("kind", "load")]), Some(3.0));
    assert_eq!(value(&s, name, &[("kind", "records")]), Some(0.0));
    assert_eq!(value(&s, name, &[("kind", "samples")]), None);
}

#[test]
fn a_cut_stream_counts_as_interrupted_with_its_cause_and_estimated_tokens_count() {
    let mut m = GatewayMetrics::new(&["r".to_string()], &["round_robin"], &["a".to_string()]);
    m.record_outcome(0, &sample(0, 200, None, 10), Some("upstream_reset"), 4);
    m.record_outcome(0, &sample(0, 200, None, 10), None, 3);
    let (out, _) = render(&m, &[gauge(0, ScrapeStatus::Off)], true);
    let rt = "route=\"r\",target=\"a\"";
    assert!(
        out.contains(&format!(
            "rolter_requests_total{{{rt},code=\"interrupted\"}} 1\n"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("rolter_requests_total{{{rt},code=\"200\"}} 1\n")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "rolter_stream_interrupted_total{{{rt},cause=\"upstream_reset\"}} 1\n"
        )),
        "{out}"
    );
    assert!(
        out.contains("rolter_tokens_total{target=\"a\",kind=\"completion\"} 7\n"),
        "{out}"
    );
}

/// Client TLS handshakes: completed ones by version (count and duration), failed ones by
/// reason; nothing rendered before the first.
#[test]
fn tls_handshakes_by_version_and_failures_by_reason() {
    let mut m = GatewayMetrics::new(&[], &[], &[]);
    m.record_tls_handshake(Ok("1.3"), 0.003);
    m.record_tls_handshake(Ok("1.3"), 0.004);
    m.record_tls_handshake(Ok("1.2"), 0.02);
    m.record_tls_handshake(Err("timeout"), 10.0);
    m.record_tls_handshake(Err("not_tls"), 0.0);
    let (out, _) = render(&m, &[], true);
    for line in [
        "rolter_tls_handshakes_total{version=\"1.3\"} 2\n",
        "rolter_tls_handshakes_total{version=\"1.2\"} 1\n",
        "rolter_tls_handshake_failures_total{reason=\"timeout\"} 1\n",
        "rolter_tls_handshake_failures_total{reason=\"not_tls\"} 1\n",
        "rolter_tls_handshake_duration_seconds_count{version=\"1.3\"} 2\n",
        "rolter_tls_handshake_duration_seconds_bucket{version=\"1.3\",le=\"0.005\"} 2\n",
    ] {
        assert!(out.contains(line), "{line}{out}");
    }
}
