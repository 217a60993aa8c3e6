//! Upstream connection reuse under both drivers, against the scripted upstream
//! (`common::scripted`): keep-alive reuse, what is never pooled (`connection: close`,
//! HTTP/1.0, close-delimited bodies, short bodies, bytes beyond the framing), stale
//! detection before reuse, the pool's idle timeout and `max_idle` bound.
//!
//! Assertions are on connection counts and bytes; sleeps only open generous windows around
//! the gateway's timers (hundreds of milliseconds either side).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::scripted::*;
use common::*;

#[test]
fn sequential_requests_reuse_one_upstream_connection() {
    for d in drivers() {
        let ctx = driver_name(d);
        let up = Upstream::start(|r| Reply::new(ok(&format!("{{\"n\":{}}}", r.total))));
        let g = gw(d, up.addr, TIMEOUTS, "");
        // Several requests on one client connection...
        let mut c = Client::connect(g.local_addr());
        for i in 0..3 {
            c.send(&chat());
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.text(), format!("{{\"n\":{i}}}"), "{ctx} #{i}");
            assert_eq!(r.header("x-rolter-target"), Some("t0"), "{ctx}");
        }
        // ...and one each on several client connections.
        for i in 3..6 {
            let r = call(g.local_addr(), &chat());
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.text(), format!("{{\"n\":{i}}}"), "{ctx} #{i}");
        }
        assert_eq!(up.accepts(), 1, "{ctx}: {:?}", up.conns());
        assert_eq!(up.conns()[0].requests, 6, "{ctx}");
        assert_eq!(up.closed_by_gateway(), 0, "{ctx}");
    }
}

// ---------------------------------------------------------------------------------------
// 2. Responses that end the connection are never pooled.
// ---------------------------------------------------------------------------------------

#[test]
fn connection_close_and_http10_responses_are_not_pooled() {
    let cases: [(&str, &[u8]); 3] = [
        (
            "connection: close",
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
        ),
        (
            "Connection: Keep-Alive, Close",
            b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\ncontent-length: 2\r\n\r\nok",
        ),
        (
            "HTTP/1.0 without keep-alive",
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ),
    ];
    for d in drivers() {
        for (name, resp) in cases {
            let ctx = format!("{} {name}", driver_name(d));
            // The upstream keeps the connection open anyway: only the gateway's decision
            // keeps it out of the pool.
            let up = Upstream::start(move |_| Reply::new(resp));
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            for i in 0..3 {
                c.send(&chat());
                let r = c.response().unwrap();
                assert_eq!(r.status, 200, "{ctx} #{i}");
                assert_eq!(r.text(), "ok", "{ctx} #{i}");
            }
            assert_eq!(up.accepts(), 3, "{ctx}: every request a new connection");
            assert!(up.conns().iter().all(|c| c.requests == 1), "{ctx}");
            // The gateway closed each of them.
            up.wait_closed(3, &ctx);
        }
    }
}

#[test]
fn close_delimited_body_is_relayed_rechunked_and_not_pooled() {
    for d in drivers() {
        let ctx = driver_name(d);
        let up = Upstream::start(|r| {
            Reply::parts(
                vec![
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst,".to_vec(),
                    b"second,".to_vec(),
                    format!("third-{}", r.total).into_bytes(),
                ],
                Duration::from_millis(30),
            )
            .then(Then::Close)
        });
        let g = gw(d, up.addr, TIMEOUTS, "");
        let mut c = Client::connect(g.local_addr());
        for i in 0..2 {
            c.send(&chat());
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx} #{i}");
            assert!(r.chunked, "{ctx}: re-chunked for the HTTP/1.1 client");
            assert_eq!(r.header("content-length"), None, "{ctx}");
            assert_eq!(r.text(), format!("first,second,third-{i}"), "{ctx} #{i}");
        }
        assert_eq!(up.accepts(), 2, "{ctx}: {:?}", up.conns());
        assert!(up.conns().iter().all(|c| c.requests == 1), "{ctx}");
        up.wait_closed(2, ctx);
    }
}

// ---------------------------------------------------------------------------------------
// 3. Stale detection.
// ---------------------------------------------------------------------------------------

#[test]
fn stale_pooled_connection_is_detected_before_reuse() {
    for d in drivers() {
        for (name, then) in [
            // Half-close: the upstream keeps reading, so a request sent on the stale
            // connection would be seen and counted.
            (
                "half-close",
                Then::HalfCloseWhenIdle(Duration::from_millis(100)),
            ),
            ("close", Then::CloseWhenIdle(Duration::from_millis(100))),
        ] {
            let ctx = format!("{} {name}", driver_name(d));
            let up = Upstream::start(move |r| Reply::new(ok(&format!("r{}", r.total))).then(then));
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            c.send(&chat());
            let r = c.response().unwrap();
            assert_eq!((r.status, r.text().as_str()), (200, "r0"), "{ctx}");
            // The upstream closes its idle connection after ~100 ms.
            thread::sleep(Duration::from_millis(300));
            c.send(&chat());
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
            assert_eq!(r.text(), "r1", "{ctx}");
            let conns = up.conns();
            assert_eq!(conns.len(), 2, "{ctx}: {conns:?}");
            assert_eq!(
                conns[0].requests, 1,
                "{ctx}: the stale connection was used: {conns:?}"
            );
            assert_eq!(conns[1].requests, 1, "{ctx}: {conns:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. Idle timeout.
// ---------------------------------------------------------------------------------------

#[test]
fn pool_idle_timeout_closes_and_replaces_idle_connections() {
    for d in drivers() {
        for (idle_timeout, expect_accepts) in [("200ms", 2), ("10s", 1)] {
            let ctx = format!("{} idle_timeout={idle_timeout}", driver_name(d));
            let up = Upstream::start(|r| Reply::new(ok(&format!("r{}", r.total))));
            let g = gw(
                d,
                up.addr,
                TIMEOUTS,
                &format!("idle_timeout = \"{idle_timeout}\""),
            );
            let r = call(g.local_addr(), &chat());
            assert_eq!((r.status, r.text().as_str()), (200, "r0"), "{ctx}");
            thread::sleep(Duration::from_millis(400));
            let r = call(g.local_addr(), &chat());
            assert_eq!((r.status, r.text().as_str()), (200, "r1"), "{ctx}");
            assert_eq!(up.accepts(), expect_accepts, "{ctx}: {:?}", up.conns());
            if expect_accepts == 2 {
                // The gateway closed the expired connection (the upstream sees EOF on it).
                wait_for(&format!("{ctx}: expired connection closed"), WAIT, || {
                    up.conns()[0].eof
                });
                assert_eq!(up.conns()[0].requests, 1, "{ctx}");
                assert!(!up.conns()[1].eof, "{ctx}: the fresh one is pooled");
            } else {
                assert_eq!(up.closed_by_gateway(), 0, "{ctx}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. max_idle.
// ---------------------------------------------------------------------------------------

#[test]
fn max_idle_bounds_the_idle_connections_kept() {
    for d in drivers() {
        for max_idle in [0usize, 1, 2] {
            let ctx = format!("{} max_idle={max_idle}", driver_name(d));
            // The first three requests are answered only once all three have arrived (and
            // a little later), so they are in flight together on three connections.
            let arrived = Arc::new(AtomicUsize::new(0));
            let up = Upstream::start(move |r| {
                if r.total < 3 {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    let t = Instant::now();
                    while arrived.load(Ordering::SeqCst) < 3 && t.elapsed() < WAIT {
                        thread::sleep(Duration::from_millis(2));
                    }
                    thread::sleep(Duration::from_millis(200));
                }
                Reply::new(ok(&format!("r{}", r.total)))
            });
            let g = gw(d, up.addr, TIMEOUTS, &format!("max_idle = {max_idle}"));
            let addr = g.local_addr();
            let concurrent: Vec<_> = (0..3)
                .map(|_| thread::spawn(move || call(addr, &chat())))
                .collect();
            for h in concurrent {
                let r = h.join().unwrap();
                assert_eq!(r.status, 200, "{ctx}: {}", r.text());
            }
            assert_eq!(up.accepts(), 3, "{ctx}: {:?}", up.conns());
            // Over the bound, the gateway closes the extra connections as they come back.
            up.wait_closed(3 - max_idle, &ctx);

            // Sequential requests reuse the most recently returned idle connection; with
            // max_idle = 0 each one opens (and then closes) a new connection.
            let mut c = Client::connect(addr);
            for i in 3..6 {
                c.send(&chat());
                let r = c.response().unwrap();
                assert_eq!(r.status, 200, "{ctx} #{i}");
                assert_eq!(r.text(), format!("r{i}"), "{ctx}");
            }
            let conns = up.conns();
            if max_idle == 0 {
                assert_eq!(conns.len(), 6, "{ctx}: {conns:?}");
                assert!(conns.iter().all(|c| c.requests == 1), "{ctx}: {conns:?}");
                up.wait_closed(6, &ctx);
            } else {
                assert_eq!(conns.len(), 3, "{ctx}: {conns:?}");
                let busiest = conns.iter().map(|c| c.requests).max().unwrap();
                assert_eq!(busiest, 4, "{ctx}: {conns:?}");
                assert_eq!(up.closed_by_gateway(), 3 - max_idle, "{ctx}: {conns:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 6. Short body.
// ---------------------------------------------------------------------------------------

#[test]
fn body_shorter_than_content_length_is_truncated_and_not_pooled() {
    for d in drivers() {
        for split in [false, true] {
            let ctx = format!("{} split={split}", driver_name(d));
            let up = Upstream::start(move |r| {
                if r.total > 0 {
                    return Reply::new(ok("fine"));
                }
                let head: &[u8] =
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n";
                let parts = if split {
                    vec![cat(&[head, b"01234"]), b"56789".to_vec()]
                } else {
                    vec![cat(&[head, b"0123456789"])]
                };
                Reply::parts(parts, Duration::from_millis(50)).then(Then::Close)
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            // No `connection: close`: the gateway closes the client connection itself.
            let mut c = Client::connect(g.local_addr());
            c.send(&chat());
            let r = parse_raw(read_all(&mut c));
            assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
            assert_eq!(r.header("content-length"), Some("100"), "{ctx}");
            assert_eq!(r.body, b"0123456789", "{ctx}: {}", r.show());
            up.wait_closed(1, &ctx);
            assert_still_serving(&g, "fine", &ctx);
            assert_eq!(up.accepts(), 2, "{ctx}: {:?}", up.conns());
        }
    }
}

#[test]
fn event_stream_with_content_length_cut_short_gets_no_error_event() {
    // An SSE body framed by Content-Length cannot take an appended error event (it would read
    // as the end of a complete body): the gateway just closes, short of the length.
    for d in drivers() {
        let ctx = driver_name(d).to_string();
        let up = Upstream::start(move |r| {
            if r.total > 0 {
                return Reply::new(ok("fine"));
            }
            let head: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 170\r\n\r\n";
            Reply::new(cat(&[head, b"data: {\"a\":1}\n\n"])).then(Then::Close)
        });
        let g = gw(d, up.addr, TIMEOUTS, "");
        let mut c = Client::connect(g.local_addr());
        c.send(&chat());
        let r = parse_raw(read_all(&mut c));
        assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
        assert_eq!(r.header("content-length"), Some("170"), "{ctx}");
        assert_eq!(r.body, b"data: {\"a\":1}\n\n", "{ctx}: {}", r.show());
        assert_still_serving(&g, "fine", &ctx);
    }
}

// ---------------------------------------------------------------------------------------
// 7. Bytes beyond the framing.
// ---------------------------------------------------------------------------------------

#[test]
fn bytes_beyond_content_length_are_dropped_and_the_connection_not_reused() {
    for d in drivers() {
        for later in [false, true] {
            let ctx = format!("{} garbage_in_later_write={later}", driver_name(d));
            let up = Upstream::start(move |r| {
                if r.total > 0 {
                    return Reply::new(ok("second"));
                }
                let parts = if later {
                    vec![ok("hello"), b"GARBAGE".to_vec()]
                } else {
                    vec![cat(&[&ok("hello"), b"GARBAGE"])]
                };
                Reply::parts(parts, Duration::from_millis(50))
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            c.send(&chat());
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx}");
            assert_eq!(r.text(), "hello", "{ctx}");
            // Let the late garbage reach the gateway's socket.
            wait_for("reply written", WAIT, || up.conns()[0].replies == 1);
            thread::sleep(Duration::from_millis(100));
            // Same client connection: the next response is clean, from a new connection.
            c.send(&chat());
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx}");
            assert_eq!(r.text(), "second", "{ctx}");
            let conns = up.conns();
            assert_eq!(conns.len(), 2, "{ctx}: {conns:?}");
            assert_eq!(conns[0].requests, 1, "{ctx}: {conns:?}");
            wait_for(&format!("{ctx}: dirty connection closed"), WAIT, || {
                up.conns()[0].eof
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// 8. 1xx interim responses.
// ---------------------------------------------------------------------------------------
