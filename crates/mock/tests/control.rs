//! Admission queue, abort detection and fault injection.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::*;
use rolter_mock::Fault;

const CHAT: &str = "/v1/chat/completions";
const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn queueing_shows_running_and_waiting() {
    for d in drivers() {
        let m = start(d, |c| {
            c.max_running = 1;
            c.ttft = Duration::from_millis(150);
        });
        let a = m.addr();
        let mut c1 = Client::connect(a);
        c1.send(&post(CHAT, &[], BODY));
        wait_for("running", Duration::from_secs(1), || m.stats().running == 1);
        let mut c2 = Client::connect(a);
        c2.send(&post(CHAT, &[], BODY));
        wait_for("waiting", Duration::from_secs(1), || m.stats().waiting == 1);
        assert_eq!(metric(a, "vllm:num_requests_running"), 1.0);
        assert_eq!(metric(a, "vllm:num_requests_waiting"), 1.0);
        assert_eq!(metric(a, "vllm:kv_cache_usage_perc"), 1.0);
        let t = Instant::now();
        assert_eq!(c1.response().unwrap().status, 200);
        assert_eq!(c2.response().unwrap().status, 200);
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "second request waited"
        );
        let s = m.stats();
        assert_eq!((s.running, s.waiting, s.completed), (0, 0, 2));
    }
}

#[test]
fn abort_during_ttft_frees_slot() {
    for d in drivers() {
        let m = start(d, |c| {
            c.max_running = 1;
            c.ttft = Duration::from_secs(3);
        });
        let a = m.addr();
        let mut c1 = Client::connect(a);
        c1.send(&post(CHAT, &[("x-request-id", "req-ttft")], BODY));
        wait_for("running", Duration::from_secs(1), || m.stats().running == 1);
        // Queued request, aborted while waiting.
        let mut c2 = Client::connect(a);
        c2.send(&post(CHAT, &[("x-request-id", "req-queued")], BODY));
        wait_for("waiting", Duration::from_secs(1), || m.stats().waiting == 1);
        drop(c2);
        wait_for("queued abort", Duration::from_secs(1), || {
            m.stats().aborted == 1
        });
        assert_eq!(m.stats().waiting, 0);
        // Third request queues behind the first.
        let mut c3 = Client::connect(a);
        c3.send(&post(CHAT, &[("x-mock-ttft-ms", "0")], BODY));
        wait_for("waiting", Duration::from_secs(1), || m.stats().waiting == 1);
        let t = Instant::now();
        drop(c1);
        wait_for("ttft abort", Duration::from_secs(1), || {
            m.stats().aborted == 2
        });
        assert!(t.elapsed() < Duration::from_millis(500));
        assert_eq!(
            m.aborted_ids(),
            vec!["req-queued".to_string(), "req-ttft".to_string()]
        );
        // The slot went to the third request.
        assert_eq!(c3.response().unwrap().status, 200);
        assert_eq!(m.stats().running, 0);
    }
}

#[test]
fn abort_mid_stream_and_on_half_close() {
    for d in drivers() {
        let m = start(d, |c| {
            c.itl = Duration::from_millis(20);
            c.tokens = 200;
        });
        let mut c = Client::connect(m.addr());
        c.send(&post(CHAT, &[("x-request-id", "mid")], STREAM));
        c.head().unwrap();
        for _ in 0..3 {
            c.chunk().unwrap().unwrap();
        }
        drop(c);
        wait_for("mid-stream abort", Duration::from_secs(1), || {
            m.stats().aborted == 1
        });
        assert_eq!(m.aborted_ids(), vec!["mid".to_string()]);
        assert!(m.stats().generation_tokens < 200);

        // Half-close after sending the body counts as an abort.
        let mut c = Client::connect(m.addr());
        c.send(&post(
            CHAT,
            &[("x-request-id", "half"), ("x-mock-ttft-ms", "2000")],
            BODY,
        ));
        c.stream().shutdown(Shutdown::Write).unwrap();
        wait_for("half-close abort", Duration::from_secs(1), || {
            m.stats().aborted == 2
        });
        assert_eq!(m.aborted_ids()[1], "half");
        let mut rest = Vec::new();
        let _ = c.r.read_to_end(&mut rest);
        assert!(rest.is_empty());
        assert_eq!(m.stats().running, 0);
    }
}

#[test]
fn status_fault_header_and_engine_wide() {
    for d in drivers() {
        let m = start(d, |_| {});
        let a = m.addr();
        let r = call(
            a,
            &post(
                CHAT,
                &[("x-mock-status", "503"), ("x-mock-retry-after", "7")],
                BODY,
            ),
        );
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("7"));
        let e = &r.json()["error"];
        assert_eq!(e["code"], 503);
        assert!(e["message"].is_string() && e["type"].is_string() && e["param"].is_null());
        let r = call(a, &post(CHAT, &[("x-mock-status", "429")], BODY));
        assert_eq!(r.status, 429);
        assert!(r.header("retry-after").is_none());

        m.set_fault(Some(Fault::Status(500)));
        assert_eq!(call(a, &request("GET", "/health", &[], "")).status, 503);
        assert_eq!(call(a, &post(CHAT, &[], BODY)).status, 500);
        assert_eq!(call(a, &request("GET", "/v1/models", &[], "")).status, 200);
        m.set_fault(None);
        assert_eq!(call(a, &request("GET", "/health", &[], "")).status, 200);
        assert_eq!(call(a, &post(CHAT, &[], BODY)).status, 200);

        // The same over HTTP.
        assert_eq!(
            call(a, &post("/mock/fault", &[], r#"{"status":503}"#)).status,
            200
        );
        assert_eq!(call(a, &request("GET", "/health", &[], "")).status, 503);
        assert_eq!(call(a, &post(CHAT, &[], BODY)).status, 503);
        assert_eq!(
            call(a, &post("/mock/fault", &[], r#"{"stall":true}"#)).status,
            200
        );
        assert_eq!(call(a, &request("GET", "/health", &[], "")).status, 503);
        assert_eq!(call(a, &post("/mock/fault", &[], "{}")).status, 200);
        assert_eq!(call(a, &request("GET", "/health", &[], "")).status, 200);
    }
}

fn expect_reset(c: &mut Client) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.r.read(&mut buf) {
            Ok(0) => panic!(
                "expected RST, got clean EOF after {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}

#[test]
fn reset_faults() {
    for d in drivers() {
        let m = start(d, |c| c.tokens = 8);
        let a = m.addr();
        let mut c = Client::connect(a);
        c.send(&post(CHAT, &[("x-mock-reset-after", "0")], STREAM));
        assert!(expect_reset(&mut c).is_empty());

        let mut c = Client::connect(a);
        c.send(&post(
            CHAT,
            &[("x-mock-reset-after", "2"), ("x-mock-itl-ms", "5")],
            STREAM,
        ));
        let got = String::from_utf8(expect_reset(&mut c)).unwrap();
        assert!(got.starts_with("HTTP/1.1 200"));
        assert_eq!(
            got.matches("\"content\":").count(),
            3,
            "role chunk + 2 tokens: {got}"
        );
        assert!(!got.contains("[DONE]"));

        m.set_fault(Some(Fault::ResetAfter(0)));
        let mut c = Client::connect(a);
        c.send(&post(CHAT, &[], BODY));
        assert!(expect_reset(&mut c).is_empty());
        m.set_fault(None);
        assert_eq!(call(a, &post(CHAT, &[], BODY)).status, 200);
        assert_eq!(m.stats().faulted, 3);
    }
}

#[test]
fn stall_faults() {
    for d in drivers() {
        let m = start(d, |c| c.tokens = 8);
        let a = m.addr();
        let mut c = Client::connect(a);
        c.stream()
            .set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        c.send(&post(
            CHAT,
            &[("x-mock-stall-after", "0"), ("x-request-id", "s0")],
            STREAM,
        ));
        let mut buf = [0u8; 64];
        let e = c.r.read(&mut buf).unwrap_err();
        assert!(matches!(
            e.kind(),
            ErrorKind::WouldBlock | ErrorKind::TimedOut
        ));

        let mut c2 = Client::connect(a);
        c2.send(&post(CHAT, &[("x-mock-stall-after", "2")], STREAM));
        c2.head().unwrap();
        for _ in 0..3 {
            c2.chunk().unwrap().unwrap();
        }
        c2.stream()
            .set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        assert!(c2.chunk().is_err(), "nothing after the stall point");
        assert_eq!(m.stats().running, 2);
        drop(c);
        drop(c2);
        wait_for("stall aborts", Duration::from_secs(1), || {
            m.stats().aborted == 2
        });
        assert!(m.aborted_ids().contains(&"s0".to_string()));

        m.set_fault(Some(Fault::Stall));
        let mut c = Client::connect(a);
        c.stream()
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        c.send(&post(CHAT, &[], BODY));
        assert!(c.r.read(&mut buf).is_err());
        m.set_fault(None);
    }
}

#[test]
fn shutdown_closes_connections() {
    let m = start(rolter_mock::Driver::Auto, |_| {});
    let mut c = Client::connect(m.addr());
    c.send(&post(CHAT, &[("x-mock-stall-after", "0")], BODY));
    wait_for("running", Duration::from_secs(1), || m.stats().running == 1);
    let t = Instant::now();
    m.shutdown();
    assert!(t.elapsed() < Duration::from_secs(1));
    let mut buf = [0u8; 16];
    assert!(matches!(c.r.read(&mut buf), Ok(0) | Err(_)));
    let _ = c.r.get_mut().write_all(b"x");
}

#[test]
fn accepted_connections_are_counted() {
    for d in drivers() {
        let m = start(d, |_| {});
        let a = m.addr();
        assert_eq!(m.stats().connections, 0);
        let mut c = Client::connect(a);
        for _ in 0..3 {
            c.send(&post(CHAT, &[], BODY));
            assert_eq!(c.response().unwrap().status, 200);
        }
        assert_eq!(m.stats().connections, 1, "keep-alive reuses one connection");
        assert_eq!(call(a, &post(CHAT, &[], BODY)).status, 200);
        let s = m.stats();
        assert_eq!((s.connections, s.requests), (2, 4));
        let j = call(a, &request("GET", "/mock/stats", &[], "")).json();
        assert_eq!(j["connections"], 3);
    }
}

#[test]
fn fast_stream_abandoned_by_its_reader_is_an_abort() {
    for d in drivers() {
        let m = start(d, |_| {});
        let mut s = std::net::TcpStream::connect(m.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = post(
            CHAT,
            &[("x-mock-tokens", "200000"), ("x-request-id", "big")],
            STREAM,
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 4096];
        assert!(s.read(&mut buf).unwrap() > 0);
        drop(s);
        wait_for("abort", Duration::from_secs(2), || m.stats().aborted == 1);
        assert_eq!(m.aborted_ids(), vec!["big".to_string()]);
        assert_eq!(m.stats().completed, 0);
    }
}
