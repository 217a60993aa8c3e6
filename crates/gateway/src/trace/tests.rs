//! The exporter against an in-process collector: batches arrive decoded with their
//! parent links, one kept-alive connection carries them, failures and a stalled collector
//! are counted without ever making `record` wait, and a reload takes new settings.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use rolter_config::{TraceEndpoint, Tracing};

use super::proto::{ExportTraceServiceRequest, Span};
use super::*;

/// How the fake collector answers.
#[derive(Clone, Copy)]
enum Answer {
    Status(u16),
    /// 200, then closes the connection.
    OkThenClose,
    /// Reads the request, never answers.
    Stall,
}

/// A collector on 127.0.0.1: every span it received, and the connections it accepted.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    requests: Arc<Mutex<Vec<String>>>,
    connections: Arc<AtomicUsize>,
}

impl Collector {
    fn start(answer: Answer) -> Collector {
        Collector::start_with(answer, None)
    }

    /// With `tls`, the connections speak TLS with that server configuration.
    fn start_with(answer: Answer, tls: Option<Arc<rustls::ServerConfig>>) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = Collector {
            addr: listener.local_addr().unwrap(),
            spans: Arc::default(),
            requests: Arc::default(),
            connections: Arc::default(),
        };
        let (spans, requests, connections) =
            (c.spans.clone(), c.requests.clone(), c.connections.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                connections.fetch_add(1, Ordering::SeqCst);
                let (spans, requests, tls) = (spans.clone(), requests.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    None => serve(conn, answer, &spans, &requests),
                    Some(cfg) => {
                        let tls = rustls::ServerConnection::new(cfg).unwrap();
                        let conn = rustls::StreamOwned::new(tls, conn);
                        serve(conn, answer, &spans, &requests)
                    }
                });
            }
        });
        c
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    fn wait_for(&self, n: usize) -> Vec<Span> {
        let until = Instant::now() + Duration::from_secs(10);
        while self.spans.lock().unwrap().len() < n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.spans()
    }
}

/// Reads requests from one connection and answers each as `answer` says.
fn serve(
    conn: impl Read + Write,
    answer: Answer,
    spans: &Mutex<Vec<Span>>,
    requests: &Mutex<Vec<String>>,
) {
    let mut reader = BufReader::new(conn);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for rs in request.resource_spans {
            for ss in rs.scope_spans {
                spans.lock().unwrap().extend(ss.spans);
            }
        }
        requests.lock().unwrap().push(head);
        match answer {
            Answer::Status(s) => {
                let reply = format!("HTTP/1.1 {s} X\r\ncontent-length: 2\r\n\r\n{{}}");
                let conn = reader.get_mut();
                conn.write_all(reply.as_bytes()).unwrap();
                // A TLS stream sends what it buffered only when flushed.
                conn.flush().unwrap();
            }
            Answer::OkThenClose => {
                let _ = reader
                    .get_mut()
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n");
                let _ = reader.get_mut().flush();
                return;
            }
            Answer::Stall => std::thread::sleep(Duration::from_secs(30)),
        }
    }
}

fn settings(addr: SocketAddr) -> Tracing {
    Tracing {
        endpoint: TraceEndpoint {
            url: format!("http://{addr}/v1/traces"),
            tls: false,
            host: addr.ip().to_string(),
            port: addr.port(),
            path: "/v1/traces".into(),
            host_header: addr.to_string(),
            ca_file: None,
            ca_certs: Vec::new(),
        },
        sample: 1.0,
        parent_based: true,
        headers: vec![("authorization".into(), "Bearer t0ken".into())],
        service_name: "rolter-test".into(),
        queue: 64,
        batch: 4,
        flush_interval: Duration::from_millis(20),
        timeout: Duration::from_millis(500),
    }
}

fn span(trace: [u8; 16], id: u8, parent: Option<u8>) -> SpanRecord {
    let mut s = SpanRecord::new(
        trace,
        [id; 8],
        parent.map(|p| [p; 8]),
        "span",
        SpanKind::Internal,
        1,
    );
    s.end_unix_nanos = 2;
    s
}

fn wait_stats(tracer: &Tracer, done: impl Fn(&TraceStats) -> bool) -> TraceStats {
    let until = Instant::now() + Duration::from_secs(10);
    while !done(&tracer.stats()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    tracer.stats()
}

#[test]
fn spans_arrive_in_batches_on_one_connection_with_their_parents() {
    let collector = Collector::start(Answer::Status(200));
    let (tracer, handle) = start(&settings(collector.addr)).unwrap();
    let trace = new_trace_id();
    tracer.record(span(trace, 1, None));
    for id in 2..=9 {
        tracer.record(span(trace, id, Some(1)));
    }
    let got = collector.wait_for(9);
    assert_eq!(got.len(), 9);
    assert_eq!(got[0].span_id, vec![1; 8]);
    assert!(got[0].parent_span_id.is_empty());
    for (i, s) in got[1..].iter().enumerate() {
        assert_eq!(
            (
                s.trace_id.as_slice(),
                s.span_id.clone(),
                s.parent_span_id.clone()
            ),
            (&trace[..], vec![i as u8 + 2; 8], vec![1; 8])
        );
    }
    let stats = wait_stats(&tracer, |s| s.exported == 9);
    assert_eq!(
        stats,
        TraceStats {
            exported: 9,
            dropped: 0,
            failed_exports: 0
        }
    );
    // Batches of 4, 4, then the last one after the flush interval, on one connection.
    let requests = collector.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert_eq!(collector.connections.load(Ordering::SeqCst), 1);
    let head = &requests[0];
    assert!(head.starts_with("POST /v1/traces HTTP/1.1\r\n"), "{head}");
    for line in [
        format!("host: {}\r\n", collector.addr),
        "content-type: application/x-protobuf\r\n".into(),
        "authorization: Bearer t0ken\r\n".into(),
    ] {
        assert!(head.contains(&line), "{head}");
    }
    handle.shutdown();
}

#[test]
fn a_non_2xx_answer_is_a_failed_export_and_its_spans_are_dropped() {
    let collector = Collector::start(Answer::Status(503));
    let (tracer, handle) = start(&settings(collector.addr)).unwrap();
    for id in 1..=4 {
        tracer.record(span([3; 16], id, None));
    }
    let stats = wait_stats(&tracer, |s| s.failed_exports == 1);
    assert_eq!(
        stats,
        TraceStats {
            exported: 0,
            dropped: 4,
            failed_exports: 1
        }
    );
    handle.shutdown();
}

#[test]
fn a_collector_that_closes_the_connection_gets_a_new_one() {
    let collector = Collector::start(Answer::OkThenClose);
    let (tracer, handle) = start(&settings(collector.addr)).unwrap();
    for round in 0..3u8 {
        for id in 1..=4 {
            tracer.record(span([round + 1; 16], id, None));
        }
        wait_stats(&tracer, |s| s.exported == 4 * (u64::from(round) + 1));
    }
    assert_eq!(
        tracer.stats(),
        TraceStats {
            exported: 12,
            dropped: 0,
            failed_exports: 0
        }
    );
    assert_eq!(collector.connections.load(Ordering::SeqCst), 3);
    handle.shutdown();
}

#[test]
fn a_collector_that_is_away_fails_exports_without_failing_the_start() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (tracer, handle) = start(&settings(addr)).unwrap();
    for id in 1..=4 {
        tracer.record(span([4; 16], id, None));
    }
    let stats = wait_stats(&tracer, |s| s.failed_exports == 1);
    assert_eq!(
        stats,
        TraceStats {
            exported: 0,
            dropped: 4,
            failed_exports: 1
        }
    );
    handle.shutdown();
}

#[test]
fn a_stalled_collector_never_makes_record_wait() {
    let collector = Collector::start(Answer::Stall);
    let s = settings(collector.addr);
    let (tracer, handle) = start(&s).unwrap();
    for i in 0..10 * s.queue {
        tracer.record(span([5; 16], (i % 250) as u8 + 1, None));
    }
    // At most the queue and one batch are kept; everything else was dropped at once.
    let stats = tracer.stats();
    assert!(
        stats.dropped >= (10 * s.queue - s.queue - s.batch) as u64,
        "{stats:?}"
    );
    // The shutdown ends, bounded by the timeout, not by the collector.
    handle.shutdown();
    let stats = tracer.stats();
    assert_eq!(stats.exported, 0);
    assert_eq!(stats.dropped, 10 * s.queue as u64, "{stats:?}");
    assert!(stats.failed_exports >= 1);
}

#[test]
fn a_reload_takes_new_settings_in_place_or_with_a_new_queue() {
    let first = Collector::start(Answer::Status(200));
    let second = Collector::start(Answer::Status(200));
    let s = settings(first.addr);
    let (tracer, mut handle) = start(&s).unwrap();
    tracer.record(span([6; 16], 1, None));
    first.wait_for(1);
    // Another endpoint with the same queue: the same tracer, the new collector.
    let moved = Tracing {
        service_name: "moved".into(),
        ..settings(second.addr)
    };
    let same = handle.reload(&moved).unwrap();
    same.record(span([6; 16], 2, None));
    tracer.record(span([6; 16], 3, None));
    assert_eq!(second.wait_for(2).len(), 2);
    // Only the sampling changed: nothing for the exporter to do.
    let _ = handle
        .reload(&Tracing {
            sample: 0.5,
            ..moved.clone()
        })
        .unwrap();
    // A bigger queue: a new tracer; the old one's spans are dropped once its thread ended.
    let bigger = Tracing {
        queue: 128,
        ..moved
    };
    let new = handle.reload(&bigger).unwrap();
    new.record(span([6; 16], 4, None));
    assert_eq!(second.wait_for(3).len(), 3);
    let stats = wait_stats(&new, |s| s.exported == 4);
    assert_eq!(
        stats,
        TraceStats {
            exported: 4,
            dropped: 0,
            failed_exports: 0
        }
    );
    // Until the old thread has ended, the old tracer's spans still go out; then they drop.
    let until = Instant::now() + Duration::from_secs(10);
    while handle.stats().dropped == 0 && Instant::now() < until {
        tracer.record(span([6; 16], 5, None));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(handle.stats().dropped, 1);
    assert_eq!(first.spans().len(), 1);
    handle.shutdown();
}

#[test]
fn shutdown_sends_what_is_queued() {
    let collector = Collector::start(Answer::Status(200));
    let s = Tracing {
        flush_interval: Duration::from_secs(60),
        batch: 100,
        ..settings(collector.addr)
    };
    let (tracer, handle) = start(&s).unwrap();
    for id in 1..=10 {
        tracer.record(span([7; 16], id, None));
    }
    handle.shutdown();
    assert_eq!(collector.spans().len(), 10);
    assert_eq!(
        tracer.stats(),
        TraceStats {
            exported: 10,
            dropped: 0,
            failed_exports: 0
        }
    );
}

/// A CA and a `localhost` certificate it signed: the server's chain and key, the CA's DER.
fn pki() -> (
    Arc<rustls::ServerConfig>,
    rustls::pki_types::CertificateDer<'static>,
) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key.into())
        .unwrap();
    (Arc::new(cfg), ca.der().clone())
}

fn tls_settings(addr: SocketAddr, ca: rustls::pki_types::CertificateDer<'static>) -> Tracing {
    let mut s = settings(addr);
    s.endpoint.tls = true;
    s.endpoint.host = "localhost".into();
    s.endpoint.host_header = format!("localhost:{}", addr.port());
    s.endpoint.ca_certs = vec![ca];
    s
}

#[test]
fn an_https_collector_is_reached_over_tls_with_the_configured_ca() {
    let (cfg, ca) = pki();
    let collector = Collector::start_with(Answer::Status(200), Some(cfg));
    let (tracer, handle) = start(&tls_settings(collector.addr, ca)).unwrap();
    for id in 1..=8 {
        tracer.record(span([8; 16], id, None));
    }
    assert_eq!(collector.wait_for(8).len(), 8);
    let stats = wait_stats(&tracer, |s| s.exported == 8);
    assert_eq!(
        stats,
        TraceStats {
            exported: 8,
            dropped: 0,
            failed_exports: 0
        }
    );
    assert_eq!(collector.connections.load(Ordering::SeqCst), 1);
    handle.shutdown();
}

#[test]
fn a_collector_whose_certificate_is_not_trusted_fails_the_export() {
    let (cfg, _) = pki();
    let (_, other_ca) = pki();
    let collector = Collector::start_with(Answer::Status(200), Some(cfg));
    let (tracer, handle) = start(&tls_settings(collector.addr, other_ca)).unwrap();
    for id in 1..=4 {
        tracer.record(span([9; 16], id, None));
    }
    let stats = wait_stats(&tracer, |s| s.failed_exports == 1);
    assert_eq!(
        stats,
        TraceStats {
            exported: 0,
            dropped: 4,
            failed_exports: 1
        }
    );
    assert!(collector.spans().is_empty());
    handle.shutdown();
}
