//! Admission's cost per request: what every request on a route pays (classifying it: class,
//! tenant, deadline; the queue's idle check; the places its class may take), and what one
//! that waits pays for its seat (join, the first-in-line check, leave) with nobody else in
//! line. Compare with the ~18 µs of CPU a proxied request costs in all
//! (`loadtest/admission_cost.sh`, `docs/benchmarks.md`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rolter::codec::api::facts;
use rolter::codec::h1::request_head::{self as head, HeadLimits};
use rolter::config::{held_back, load_str, Config};
use rolter::gateway::mesh::admission::{Joined, SharedQueue};
use rolter::gateway::path::admit;
use rolter::gateway::path::auth::Caller;
use rolter::gateway::path::request::Request;
use rolter::gateway::path::route::Routed;

const PLAIN: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.local:8080\r\nUser-Agent: OpenAI/Python 1.54.0\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-test-0123456789abcdef\r\nX-Stainless-Lang: python\r\nContent-Length: 60\r\n\r\n";
const CLASSED: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.local:8080\r\nUser-Agent: OpenAI/Python 1.54.0\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-test-0123456789abcdef\r\nX-Stainless-Lang: python\r\nx-rolter-priority: interactive\r\nx-tenant: team-a\r\nx-rolter-deadline-ms: 30000\r\nContent-Length: 60\r\n\r\n";
const BODY: &[u8] = br#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;

fn config(classes: bool) -> Config {
    let hash = rolter::config::key_hash("sk-test-0123456789abcdef");
    let (classes, key, route) = if classes {
        (
            "[[classes]]\nname = \"interactive\"\nrank = 0\nreserve = 0.25\n[[classes]]\nname = \"batch\"\nrank = 1\n",
            "priority = \"batch\"\nset_priority = true\n",
            "priority_header = true\ntenant_header = \"x-tenant\"\n",
        )
    } else {
        ("", "", "")
    };
    load_str(
        &format!(
            "{classes}[[keys]]\nname = \"k\"\nhash = \"{hash}\"\n{key}\n[[targets]]\nname = \"t\"\nurl = \"http://10.0.0.1:8000\"\nmax_concurrent = 64\n[[routes]]\nname = \"r\"\ntargets = [\"t\"]\nqueue_max = 256\n{route}"
        ),
        "bench.toml",
    )
    .unwrap()
}

fn bench_classify(c: &mut Criterion) {
    let limits = HeadLimits {
        max_head_bytes: 32 * 1024,
        max_headers: 100,
        max_uri_bytes: 8192,
        underscores: Default::default(),
    };
    let mut g = c.benchmark_group("admission");
    for (name, raw, classes) in [
        ("classify_plain", PLAIN, false),
        ("classify_class_tenant_deadline_headers", CLASSED, true),
    ] {
        let config = config(classes);
        let mut spans = Vec::new();
        let head = head::parse(raw, &limits, &mut spans).unwrap().unwrap();
        let req = Request {
            head: &head,
            buf: raw,
            spans: &spans,
            body: BODY,
            body_in_place: None,
            peer_ip: "10.1.2.3",
            peer: "10.1.2.3:50000".parse().unwrap(),
            close: false,
            id: rolter::codec::h1::request_id::RequestId::generate(),
            started: std::time::Instant::now(),
            time: std::time::SystemTime::now(),
            surface: rolter::codec::Surface::OpenAi,
        };
        let routed = Routed {
            facts: facts::extract(BODY).unwrap(),
            index: 0,
            route: &config.routes[0],
            passthrough: false,
            key_header: None,
        };
        let caller = Some(Caller {
            key: 0,
            header: "authorization",
        });
        g.bench_function(name, |b| {
            b.iter(|| admit::classify(&config, black_box(&req), &routed, caller).unwrap())
        });
    }
    let two = config(true);
    g.bench_function("held_back_two_classes", |b| {
        b.iter(|| held_back(&two.classes, black_box(1), black_box(64)))
    });
    let q = SharedQueue::new(256, 1 + 1 + 1024);
    g.bench_function("queue_idle_check", |b| b.iter(|| black_box(&q).busy()));
    g.bench_function("seat_join_first_admitted_leave", |b| {
        b.iter(|| {
            let Joined::Seated(mut t) = q.join(0, (black_box(1), 1), 64, 7) else {
                unreachable!("an empty queue seats");
            };
            assert!(t.is_first());
            t.admitted();
        })
    });
    g.finish();
}

criterion_group!(benches, bench_classify);
criterion_main!(benches);
