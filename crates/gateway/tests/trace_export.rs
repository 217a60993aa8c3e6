//! The trace exporter against a real OTLP receiver: `tests/py/otlp_receiver.py`, which
//! decodes the requests with OpenTelemetry's own protobuf definitions
//! (`opentelemetry-proto`). Spans recorded arrive with their ids, parent links,
//! attributes, events, status and resource; a receiver that never answers makes no
//! `record` wait.
//!
//! Needs `python3` with the `opentelemetry-proto` package (`tests/run.sh` installs it);
//! without them the test fails and says so, it never skips.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rolter_codec::h1::traceparent;
use rolter_config::{TraceEndpoint, Tracing};
use rolter_gateway::trace::{self, SpanKind, SpanRecord, SpanStatus, TraceStats};
use serde_json::{json, Value};

/// The receiver process, killed when dropped.
struct Receiver {
    child: Child,
    addr: SocketAddr,
    out: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn receiver(name: &str, stall: bool) -> Receiver {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/py/otlp_receiver.py"
    );
    let out = std::env::temp_dir().join(format!("rolter-otlp-{}-{name}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg("0").arg(&out);
    if stall {
        cmd.arg("--stall");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs tests/py/otlp_receiver.py (install python3)");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port: u16 = line
        .strip_prefix("listening ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!(
                "the OTLP receiver did not start (said {line:?}); install its package: \
                 python3 -m pip install opentelemetry-proto"
            )
        });
    Receiver {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        out,
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
        headers: vec![("x-collector-key".into(), "k".into())],
        service_name: "rolter-it".into(),
        queue: 256,
        batch: 2,
        flush_interval: Duration::from_millis(50),
        timeout: Duration::from_millis(500),
    }
}

fn lines(path: &PathBuf, n: usize) -> Vec<Value> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let got: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if got.len() >= n || Instant::now() > until {
            return got;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client's request with a `traceparent`: the gateway's server span under the client's,
/// an upstream client span under it.
fn request_spans() -> (SpanRecord, SpanRecord) {
    let parent = traceparent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .expect("the specification's example");
    let server_id = [0x11; 8];
    let mut server = SpanRecord::new(
        parent.trace_id,
        server_id,
        Some(parent.parent_id),
        "POST /v1/chat/completions",
        SpanKind::Server,
        1_000,
    );
    server.remote_parent = true;
    server.end_unix_nanos = 9_000;
    server.attr("http.request.method", "POST");
    server.attr("http.response.status_code", 502i64);
    server.attr("rolter.retried", true);
    server.event("retry", 5_000);
    server.status = SpanStatus::Error("upstream reset".into());
    let mut client = SpanRecord::new(
        parent.trace_id,
        [0x22; 8],
        Some(server_id),
        "upstream",
        SpanKind::Client,
        2_000,
    );
    client.end_unix_nanos = 4_000;
    client.attr("server.address", String::from("10.0.0.1"));
    client.attr("rolter.weight", 0.5);
    (server, client)
}

#[test]
fn spans_reach_a_real_otlp_receiver_with_their_parent_links() {
    let r = receiver("links", false);
    let (tracer, handle) = trace::start(&settings(r.addr)).unwrap();
    let (server, client) = request_spans();
    tracer.record(client);
    tracer.record(server);
    let got = lines(&r.out, 2);
    let resource =
        json!({ "service.name": "rolter-it", "service.version": env!("CARGO_PKG_VERSION") });
    assert_eq!(
        got,
        vec![
            json!({
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "span_id": "2222222222222222",
                "parent_span_id": "1111111111111111",
                "name": "upstream",
                "kind": 3,
                "start": 2000,
                "end": 4000,
                "attributes": { "server.address": "10.0.0.1", "rolter.weight": 0.5 },
                "events": [],
                "status": { "code": 0, "message": "" },
                "resource": resource,
                "scope": "rolter",
            }),
            json!({
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "span_id": "1111111111111111",
                "parent_span_id": "00f067aa0ba902b7",
                "name": "POST /v1/chat/completions",
                "kind": 2,
                "start": 1000,
                "end": 9000,
                "attributes": {
                    "http.request.method": "POST",
                    "http.response.status_code": 502,
                    "rolter.retried": true,
                },
                "events": [{ "name": "retry", "attributes": {} }],
                "status": { "code": 2, "message": "upstream reset" },
                "resource": resource,
                "scope": "rolter",
            }),
        ]
    );
    handle.shutdown();
    assert_eq!(
        tracer.stats(),
        TraceStats {
            exported: 2,
            dropped: 0,
            failed_exports: 0
        }
    );
}

#[test]
fn a_stalled_receiver_never_makes_record_wait() {
    let r = receiver("stall", true);
    let s = settings(r.addr);
    let (tracer, handle) = trace::start(&s).unwrap();
    // A `record` that waited for room would drop nothing: every span beyond the queue and
    // the batch in flight is dropped at once instead.
    for _ in 0..10 * s.queue {
        let (server, _) = request_spans();
        tracer.record(server);
    }
    let stats = tracer.stats();
    assert!(
        stats.dropped >= (10 * s.queue - s.queue - s.batch) as u64,
        "{stats:?}"
    );
    // The shutdown ends (bounded by the export timeout, not by the receiver).
    handle.shutdown();
    let stats = tracer.stats();
    assert_eq!(
        (stats.exported, stats.dropped),
        (0, 10 * s.queue as u64),
        "{stats:?}"
    );
    assert!(stats.failed_exports >= 1, "{stats:?}");
}
