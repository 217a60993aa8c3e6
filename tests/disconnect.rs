//! Clients that go away or crawl, under both drivers:
//! a close during prefill, mid-stream or a half-close cancels the upstream request within
//! about a second; slow heads and bodies get 408 and a close; a streaming client that never
//! reads hits the write timeout and the upstream is aborted.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use rolter_mock::MockHandle;

const CHAT: &str = "/v1/chat/completions";
/// How soon an abandoned upstream request must be cancelled.
const CANCEL_WITHIN: Duration = Duration::from_millis(1000);

fn wait_aborted(m: &MockHandle, id: &str, since: Instant, ctx: &str) {
    wait_for(
        &format!("{ctx}: upstream abort of {id}"),
        CANCEL_WITHIN,
        || m.aborted_ids().iter().any(|a| a == id),
    );
    let took = since.elapsed();
    assert!(
        took < CANCEL_WITHIN + Duration::from_millis(100),
        "{ctx}: {took:?}"
    );
}

/// Waits until the engine holds request `id` (so a disconnect cancels real work).
fn wait_received(m: &MockHandle, id: &str, ctx: &str) {
    wait_for(&format!("{ctx}: request {id} at the engine"), SHORT, || {
        m.requests()
            .iter()
            .any(|r| r.header("x-request-id") == Some(id))
            && m.stats().running == 1
    });
}

/// The gateway still answers a normal request.
fn still_serving(g: SocketAddr, ctx: &str) {
    let r = call(g, &post(CHAT, &[], &chat_body(true)));
    assert_eq!(r.status, 200, "{ctx}: gateway serves after the disconnect");
    assert_eq!(sse_events(&r.body).last().unwrap().1, "[DONE]", "{ctx}");
}

#[test]
fn close_during_prefill_cancels_upstream() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        for stream in [false, true] {
            let ctx = format!("{} stream={stream}", driver_name(d));
            let id = format!("prefill-{stream}");
            let mut c = Client::connect(g.local_addr());
            c.send(&post(
                CHAT,
                &[("x-mock-ttft-ms", "2000"), ("x-request-id", &id)],
                &chat_body(stream),
            ));
            wait_received(&m, &id, &ctx);
            let t = Instant::now();
            drop(c);
            wait_aborted(&m, &id, t, &ctx);
            still_serving(g.local_addr(), &ctx);
        }
        assert_eq!(m.stats().aborted, 2);
    }
}

#[test]
fn close_mid_stream_cancels_upstream() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        let ctx = driver_name(d);
        let mut c = Client::connect(g.local_addr());
        c.send(&post(
            CHAT,
            &[
                ("x-mock-itl-ms", "50"),
                ("x-mock-tokens", "200"),
                ("x-request-id", "mid"),
            ],
            &chat_body(true),
        ));
        let (status, _) = c.head().unwrap();
        assert_eq!(status, 200);
        let mut seen = String::new();
        while seen.matches("\"delta\":{\"content\":\"").count() < 2 {
            let chunk = c.chunk().unwrap().expect("stream ended early");
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        let t = Instant::now();
        drop(c);
        wait_aborted(&m, "mid", t, ctx);
        assert_eq!(m.stats().completed, 0, "{ctx}");
        still_serving(g.local_addr(), ctx);
    }
}

#[test]
fn half_close_cancels_upstream() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        let ctx = driver_name(d);
        let mut c = Client::connect(g.local_addr());
        c.send(&post(
            CHAT,
            &[("x-mock-ttft-ms", "2000"), ("x-request-id", "half")],
            &chat_body(true),
        ));
        wait_received(&m, "half", ctx);
        let t = Instant::now();
        c.stream().shutdown(Shutdown::Write).unwrap();
        wait_aborted(&m, "half", t, ctx);
        // Policy (HAProxy abortonclose): a half-close abandons the request; the gateway
        // closes the connection rather than answer.
        let mut rest = Vec::new();
        let _ = c.r.read_to_end(&mut rest);
        assert!(
            !String::from_utf8_lossy(&rest).contains("[DONE]"),
            "{ctx}: {}",
            String::from_utf8_lossy(&rest)
        );
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{ctx}: connection closed"
        );
        still_serving(g.local_addr(), ctx);
    }
}

/// Sends `bytes` one at a time, one every `every`, until the gateway answers; returns the
/// whole answer (read until the gateway closes) and when it started to arrive.
fn trickle(addr: SocketAddr, prefix: &[u8], bytes: &[u8], every: Duration) -> (Vec<u8>, Duration) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(prefix).unwrap();
    let t = Instant::now();
    s.set_read_timeout(Some(every)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut i = 0;
    loop {
        if i < bytes.len() && s.write_all(&bytes[i..i + 1]).is_ok() {
            i += 1;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                break;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no answer to a trickled request"
        );
    }
    let at = t.elapsed();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the gateway did not close after the 408: {e}"),
    }
    (got, at)
}

fn assert_408(got: &[u8], at: Duration, ctx: &str) {
    let text = String::from_utf8_lossy(got);
    assert!(text.starts_with("HTTP/1.1 408"), "{ctx}: {text}");
    assert!(text.contains("\"error\""), "{ctx}: {text}");
    // The head/body timeout is 1 s in the test limits.
    assert!(
        at >= Duration::from_millis(900),
        "{ctx}: answered after {at:?}"
    );
    assert!(
        at < Duration::from_millis(2500),
        "{ctx}: answered after {at:?}"
    );
}

#[test]
fn slow_head_gets_408_and_close() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        let ctx = driver_name(d);
        let req = post(
            CHAT,
            &[("x-pad", "abcdefghijklmnopqrstuvwxyz")],
            &chat_body(false),
        );
        let (got, at) = trickle(
            g.local_addr(),
            b"",
            req.as_bytes(),
            Duration::from_millis(300),
        );
        assert_408(&got, at, ctx);
        assert!(m.requests().is_empty(), "{ctx}");
        still_serving(g.local_addr(), ctx);
    }
}

#[test]
fn slow_body_gets_408_and_close() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        let ctx = driver_name(d);
        let body = chat_body(false);
        let req = post(CHAT, &[], &body);
        let split = req.len() - body.len() + 5;
        let (got, at) = trickle(
            g.local_addr(),
            &req.as_bytes()[..split],
            &req.as_bytes()[split..],
            Duration::from_millis(300),
        );
        assert_408(&got, at, ctx);
        assert!(m.requests().is_empty(), "{ctx}");
        still_serving(g.local_addr(), ctx);
    }
}

#[test]
fn stream_client_that_never_reads_hits_write_timeout_and_upstream_abort() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        let ctx = driver_name(d);
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(&g.local_addr().into()).unwrap();
        let mut s: TcpStream = sock.into();
        let t = Instant::now();
        s.write_all(
            post(
                CHAT,
                &[("x-mock-tokens", "400000"), ("x-request-id", "no-reader")],
                &chat_body(true),
            )
            .as_bytes(),
        )
        .unwrap();
        // Never read: the gateway's writes stall, its 1 s write timeout fires, and it drops
        // the upstream connection.
        wait_for(
            &format!("{ctx}: upstream abort"),
            Duration::from_secs(6),
            || m.aborted_ids() == ["no-reader"],
        );
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(900), "{ctx}: {took:?}");
        assert_eq!(m.stats().completed, 0, "{ctx}");
        // The gateway closed the client connection too: draining it ends in EOF or reset.
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut sink = [0u8; 64 * 1024];
        loop {
            match s.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => panic!("{ctx}: the gateway kept the connection open: {e}"),
            }
        }
        still_serving(g.local_addr(), ctx);
    }
}
