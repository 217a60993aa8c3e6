//! Upstream faults under both drivers: refused connections and 5xx before headers are
//! retried elsewhere; 429 from everyone is passed on with Retry-After; a reset before
//! headers is retried elsewhere (the last attempt's 502 when every target resets), never
//! when `retry_on` leaves it out; a reset or stall after the first bytes ends the stream
//! with an SSE error event and a close without the terminal chunk; a stall before headers
//! is a 504.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::Fault;

const CHAT: &str = "/v1/chat/completions";

/// An address nothing listens on.
fn closed_port() -> SocketAddr {
    refused_addr()
}

/// A gateway with one round-robin route over `addrs` (targets t0, t1, ...).
fn gw(
    d: DriverChoice,
    addrs: &[SocketAddr],
    first_byte: &str,
    idle: &str,
    route_extra: &str,
) -> Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let name = format!("t{i}");
        rest.push_str(&target(
            &name,
            *a,
            &format!("[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"{first_byte}\"\nidle = \"{idle}\""),
        ));
        names.push(format!("\"{name}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nstrategy = \"round_robin\"\n{route_extra}\n",
        names.join(", ")
    ));
    gateway(d, &rest)
}

fn assert_openai_error(r: &Response, ctx: &str) -> serde_json::Value {
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].is_string(), "{ctx}: {v}");
    assert!(e["type"].is_string(), "{ctx}: {v}");
    assert!(e.get("param").is_some(), "{ctx}: {v}");
    assert!(e["code"].is_string(), "{ctx}: {v}");
    e.clone()
}

/// What a cut-off stream looked like on the wire.
struct Raw {
    status: u16,
    /// Chunk payloads, in order.
    chunks: Vec<Vec<u8>>,
    /// The terminal `0\r\n\r\n` chunk arrived.
    terminated: bool,
    /// Bytes after the last complete chunk.
    trailing: Vec<u8>,
    raw: Vec<u8>,
}

/// Reads everything until the gateway closes, then parses the chunked body strictly.
fn read_until_close(c: &mut Client) -> Raw {
    let mut raw = Vec::new();
    match c.r.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!(
            "reading until close: {e} after {:?}",
            String::from_utf8_lossy(&raw)
        ),
    }
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head")
        + 4;
    let head = std::str::from_utf8(&raw[..head_end]).unwrap();
    let status: u16 = head[9..12].parse().unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let mut pos = head_end;
    let mut chunks = Vec::new();
    let mut terminated = false;
    while let Some(eol) = raw[pos..].windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&raw[pos..pos + eol]).unwrap(), 16)
            .expect("hex chunk size");
        let start = pos + eol + 2;
        if raw.len() < start + size + 2 {
            break;
        }
        assert_eq!(&raw[start + size..start + size + 2], b"\r\n");
        pos = start + size + 2;
        if size == 0 {
            terminated = true;
            break;
        }
        chunks.push(raw[start..start + size].to_vec());
    }
    Raw {
        status,
        chunks,
        terminated,
        trailing: raw[pos..].to_vec(),
        raw,
    }
}

/// The SSE events of a cut-off stream: every event must be complete.
fn cut_events(r: &Raw) -> Vec<String> {
    let body: Vec<u8> = r.chunks.concat();
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.ends_with("\n\n"),
        "ends on an event boundary: {text:?}"
    );
    assert!(
        !text.contains("\n\n\n"),
        "no empty event before the error: {text:?}"
    );
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| e.trim_start_matches('\n').to_string())
        .collect()
}

fn assert_cut_with_error_event(r: &Raw, tokens_before: usize, ctx: &str) {
    let raw = String::from_utf8_lossy(&r.raw);
    assert_eq!(r.status, 200, "{ctx}: {raw}");
    assert!(
        !r.terminated,
        "{ctx}: the terminal chunk must not be sent: {raw}"
    );
    assert!(r.trailing.is_empty(), "{ctx}: trailing bytes: {raw}");
    assert!(!r.raw.ends_with(b"0\r\n\r\n"), "{ctx}: {raw}");
    let events = cut_events(r);
    let tokens = events
        .iter()
        .filter(|e| e.contains("\"delta\":{\"content\":\""))
        .count();
    assert_eq!(tokens, tokens_before, "{ctx}: {events:?}");
    assert!(!events.iter().any(|e| e.contains("[DONE]")), "{ctx}");
    let last = events.last().unwrap();
    let data = last
        .strip_prefix("data: ")
        .unwrap_or_else(|| panic!("{ctx}: {last:?}"));
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert!(v["error"]["message"].is_string(), "{ctx}: {v}");
    assert!(v["error"]["type"].is_string(), "{ctx}: {v}");
    assert!(v["error"]["code"].is_string(), "{ctx}: {v}");
    // Every event before it is a normal chunk.
    for e in &events[..events.len() - 1] {
        let d = e.strip_prefix("data: ").unwrap();
        let v: serde_json::Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk", "{ctx}");
    }
}

#[test]
fn refused_connection_is_retried_on_a_healthy_target() {
    for d in drivers() {
        let m = mock("ok", |_| {});
        let g = gw(d, &[closed_port(), m.addr()], "2s", "1s", "retries = 1");
        for i in 0..4 {
            let t = Instant::now();
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(i % 2 == 0)));
            let ctx = format!("{} #{i}", driver_name(d));
            assert_eq!(r.status, 200, "{ctx}: {}", String::from_utf8_lossy(&r.body));
            assert_eq!(r.header("x-rolter-target"), Some("t1"), "{ctx}");
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{ctx}: {:?}",
                t.elapsed()
            );
        }
        assert_eq!(m.stats().requests, 4);
    }
}

#[test]
fn status_503_before_headers_is_retried_once_elsewhere() {
    for d in drivers() {
        let bad = mock("bad", |_| {});
        let good = mock("good", |_| {});
        bad.set_fault(Some(Fault::Status(503)));
        let g = gw(d, &[bad.addr(), good.addr()], "2s", "1s", "retries = 1");
        for i in 0..4 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(i % 2 == 0)));
            let ctx = format!("{} #{i}", driver_name(d));
            assert_eq!(r.status, 200, "{ctx}: {}", String::from_utf8_lossy(&r.body));
            assert_eq!(r.header("x-mock-engine"), Some("good"), "{ctx}");
        }
        assert_eq!(good.stats().requests, 4);
        let tried_bad = bad.stats().requests;
        assert!((1..=4).contains(&tried_bad), "{tried_bad}");

        // Without retries the client gets the engine's 503 when the bad target is picked.
        let g = gw(d, &[bad.addr(), good.addr()], "2s", "1s", "retries = 0");
        let before = (bad.stats().requests, good.stats().requests);
        let statuses: Vec<u16> = (0..2)
            .map(|_| call(g.local_addr(), &post(CHAT, &[], &chat_body(false))).status)
            .collect();
        let after = (bad.stats().requests, good.stats().requests);
        assert!(statuses.contains(&503), "{statuses:?}");
        assert_eq!(
            (after.0 - before.0) + (after.1 - before.1),
            2,
            "no retries: one attempt per request"
        );
    }
}

#[test]
fn status_429_everywhere_passes_on_retry_after() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = gw(d, &[a.addr(), b.addr()], "2s", "1s", "retries = 1");
        let r = call(
            g.local_addr(),
            &post(
                CHAT,
                &[("x-mock-status", "429"), ("x-mock-retry-after", "7")],
                &chat_body(false),
            ),
        );
        let ctx = driver_name(d);
        assert_eq!(r.status, 429, "{ctx}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("retry-after"), Some("7"), "{ctx}: {:?}", r.headers);
        assert!(r.json()["error"]["message"].is_string());
        assert_eq!(
            (a.stats().requests, b.stats().requests),
            (1, 1),
            "{ctx}: each target tried once"
        );
    }
}

#[test]
fn reset_before_headers_everywhere_is_the_last_attempts_502() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        for (route, per_request) in [
            ("retries = 1", 2),
            ("retries = 1\nretry_on = [\"connect_failure\", \"503\"]", 1),
        ] {
            let g = gw(d, &[a.addr(), b.addr()], "2s", "1s", route);
            let before = a.requests().len() + b.requests().len();
            for stream in [false, true] {
                let t = Instant::now();
                let r = call(
                    g.local_addr(),
                    &post(CHAT, &[("x-mock-reset-after", "0")], &chat_body(stream)),
                );
                let ctx = format!("{} {route} stream={stream}", driver_name(d));
                assert_eq!(r.status, 502, "{ctx}: {}", String::from_utf8_lossy(&r.body));
                assert!(!r.chunked);
                let e = assert_openai_error(&r, &ctx);
                assert_eq!(e["code"], "upstream_closed", "{ctx}");
                assert!(t.elapsed() < Duration::from_secs(1), "{ctx}");
            }
            // Retried: each request reached both engines once; not retried: one engine.
            let n = a.requests().len() + b.requests().len() - before;
            assert_eq!(n, 2 * per_request, "{} {route}", driver_name(d));
        }
    }
}

#[test]
fn reset_before_headers_on_a_pooled_connection_is_delivered_once_per_target() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = gw(d, &[a.addr(), b.addr()], "2s", "1s", "retries = 1");
        for _ in 0..2 {
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
            assert_eq!(r.status, 200);
        }
        let ctx = driver_name(d);
        assert_eq!(
            (a.stats().connections, b.stats().connections),
            (1, 1),
            "{ctx}: one pooled connection per target"
        );
        // A reset (not a close) before any response byte on a pooled connection is the
        // engine failing a request it sent no byte of an answer for: tried once on the
        // other target (which resets too), never twice on the same one.
        let r = call(
            g.local_addr(),
            &post(CHAT, &[("x-mock-reset-after", "0")], &chat_body(false)),
        );
        assert_eq!(r.status, 502, "{ctx}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(assert_openai_error(&r, ctx)["code"], "upstream_closed");
        let got = [a.requests().len() - 1, b.requests().len() - 1];
        assert_eq!(got, [1, 1], "{ctx}: deliveries");
    }
}

#[test]
fn reset_after_first_sse_bytes_ends_with_error_event_and_no_terminal_chunk() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gw(d, &[m.addr()], "2s", "1s", "");
        let mut c = Client::connect(g.local_addr());
        c.send(&post(
            CHAT,
            &[("x-mock-reset-after", "2")],
            &chat_body(true),
        ));
        let r = read_until_close(&mut c);
        assert_cut_with_error_event(&r, 2, driver_name(d));
        assert_eq!(m.stats().faulted, 1);
        // The gateway keeps serving.
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(true)));
        assert_eq!(r.status, 200);
        assert_eq!(sse_events(&r.body).last().unwrap().1, "[DONE]");
    }
}

#[test]
fn stall_before_headers_is_a_504_at_the_first_byte_timeout() {
    for d in drivers() {
        let a = mock("a", |_| {});
        let b = mock("b", |_| {});
        let g = gw(d, &[a.addr(), b.addr()], "600ms", "1s", "retries = 1");
        let t = Instant::now();
        let r = call(
            g.local_addr(),
            &post(
                CHAT,
                &[("x-mock-stall-after", "0"), ("x-request-id", "stall-0")],
                &chat_body(true),
            ),
        );
        let took = t.elapsed();
        let ctx = format!("{} took {took:?}", driver_name(d));
        assert_eq!(r.status, 504, "{ctx}: {}", String::from_utf8_lossy(&r.body));
        assert_openai_error(&r, &ctx);
        assert!(took >= Duration::from_millis(550), "{ctx}");
        assert!(took < Duration::from_millis(2500), "{ctx}");
        // The stalled engine was let go (it sees the close as an abort); no retry happened.
        wait_for("stalled request aborted", Duration::from_secs(1), || {
            a.stats().aborted + b.stats().aborted == 1
        });
        assert_eq!(a.requests().len() + b.requests().len(), 1, "{ctx}");
    }
}

#[test]
fn stall_mid_stream_ends_with_error_event_at_the_idle_timeout() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gw(d, &[m.addr()], "2s", "600ms", "");
        let mut c = Client::connect(g.local_addr());
        let t = Instant::now();
        c.send(&post(
            CHAT,
            &[("x-mock-stall-after", "2"), ("x-request-id", "stall-2")],
            &chat_body(true),
        ));
        let r = read_until_close(&mut c);
        let took = t.elapsed();
        let ctx = format!("{} took {took:?}", driver_name(d));
        assert_cut_with_error_event(&r, 2, &ctx);
        assert!(took >= Duration::from_millis(550), "{ctx}");
        assert!(took < Duration::from_millis(2500), "{ctx}");
        wait_for("stalled stream aborted", Duration::from_secs(1), || {
            m.aborted_ids() == ["stall-2"]
        });
    }
}

#[test]
fn all_targets_down_fails_fast() {
    for d in drivers() {
        let g = gw(
            d,
            &[closed_port(), closed_port()],
            "2s",
            "1s",
            "retries = 1",
        );
        for stream in [false, true] {
            let t = Instant::now();
            let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(stream)));
            let ctx = format!("{} stream={stream}", driver_name(d));
            assert!(
                matches!(r.status, 502 | 503),
                "{ctx}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
            assert_openai_error(&r, &ctx);
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{ctx}: {:?}",
                t.elapsed()
            );
        }
        // Every engine down after a stall too: one target stalls before headers, one is
        // refused, and the answer still comes by the first-byte deadline.
        let m = mock("stall", |_| {});
        m.set_fault(Some(Fault::Stall));
        let g = gw(d, &[m.addr(), closed_port()], "500ms", "1s", "retries = 1");
        let t = Instant::now();
        let r = call(g.local_addr(), &post(CHAT, &[], &chat_body(false)));
        assert!((502..=504).contains(&r.status), "{}", r.status);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
}
