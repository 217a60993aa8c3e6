//! How upstream responses are framed for the client, under both drivers, against the
//! scripted upstream (`common::scripted`): 1xx interim responses, the connect timeout,
//! hop-by-hop response headers, chunk extensions and trailers, and malformed responses.
//!
//! Assertions are on bytes and connection counts; sleeps only open generous windows around
//! the gateway's timers.

mod common;

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::scripted::*;
use common::*;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
const EARLY_HINTS: &[u8] = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n";

fn assert_final_only(r: &Response, body: &str, ctx: &str) {
    assert_eq!(r.status, 200, "{ctx}: {}", r.text());
    assert_eq!(r.text(), body, "{ctx}");
    assert_eq!(r.header("link"), None, "{ctx}: {:?}", r.headers);
    assert!(!r.text().contains("HTTP/1.1"), "{ctx}");
}

/// Builds the parts of a scripted reply around a final response body.
type PartsFn = fn(&str) -> Vec<Vec<u8>>;

#[test]
fn interim_responses_are_not_relayed() {
    let variants: [(&str, PartsFn); 3] = [
        ("100 in the same write", |b| vec![cat(&[CONTINUE, &ok(b)])]),
        ("100 then final", |b| vec![CONTINUE.to_vec(), ok(b)]),
        ("103 then final", |b| vec![EARLY_HINTS.to_vec(), ok(b)]),
    ];
    for d in drivers() {
        for (name, parts) in variants {
            let ctx = format!("{} {name}", driver_name(d));
            let up = Upstream::start(move |r| {
                Reply::parts(parts(&format!("r{}", r.total)), Duration::from_millis(50))
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            for i in 0..2 {
                c.send(&chat());
                let r = c.response().unwrap();
                assert_final_only(&r, &format!("r{i}"), &ctx);
            }
            assert_eq!(up.accepts(), 1, "{ctx}: pooled after the final response");
        }
    }
}

/// Several interim responses that arrive in one read must all be skipped.
#[test]
fn several_interim_responses_in_one_read_are_all_skipped() {
    for d in drivers() {
        let ctx = driver_name(d);
        let up = Upstream::start(|r| {
            Reply::new(cat(&[CONTINUE, EARLY_HINTS, &ok(&format!("r{}", r.total))]))
        });
        let g = gw(d, up.addr, TIMEOUTS, "");
        let mut c = Client::connect(g.local_addr());
        c.send(&chat());
        let r = c.response().unwrap();
        assert_final_only(&r, "r0", ctx);
        assert_eq!(up.requests(), 1, "{ctx}");
    }
}

/// An interim response is a response byte: if the pooled connection then closes, the
/// request must not be sent again (the upstream has it).
#[test]
fn pooled_connection_closing_after_an_interim_response_is_not_resent() {
    for d in drivers() {
        let ctx = driver_name(d);
        let up = Upstream::start(|r| {
            if r.conn == 0 && r.nth == 1 {
                Reply::new(CONTINUE).then(Then::Close)
            } else {
                Reply::new(ok(&format!("r{}", r.total)))
            }
        });
        let g = gw(d, up.addr, TIMEOUTS, "");
        let r = call(g.local_addr(), &chat());
        assert_eq!((r.status, r.text().as_str()), (200, "r0"), "{ctx}");
        let r = raw_call(g.local_addr());
        assert_eq!(
            up.requests(),
            2,
            "{ctx}: the request was delivered twice (conns {:?}); client got {}",
            up.conns(),
            r.show()
        );
        assert_openai_error(&r, 502, "upstream_closed", ctx);
    }
}

// ---------------------------------------------------------------------------------------
// 9. Connect timeout.
// ---------------------------------------------------------------------------------------

/// A loopback listener that accepts nothing: `listen(0)` and never `accept`, with its
/// accept queue filled by a few connects first. Linux then drops further SYNs
/// (`tcp_conn_request`: accept queue full → drop), so a connect stays pending until the
/// caller gives up. Returns the listener and the fillers (keep both alive).
fn unaccepting_listener() -> (socket2::Socket, Vec<socket2::Socket>, SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    thread::sleep(Duration::from_millis(50));
    (l, fillers, addr)
}

#[test]
fn connect_timeout_is_a_504_upstream_connect_timeout() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (_l, _fillers, addr) = unaccepting_listener();
        // The precondition: a plain connect to it does not complete.
        let probe = TcpStream::connect_timeout(&addr, Duration::from_millis(300));
        assert!(
            matches!(&probe, Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock)),
            "{ctx}: the kernel completed a connect to a full accept queue: {probe:?}"
        );
        let g = gw(
            d,
            addr,
            "connect = \"300ms\"\nfirst_byte = \"2s\"\nidle = \"2s\"",
            "",
        );
        let t = Instant::now();
        let r = raw_call(g.local_addr());
        let took = t.elapsed();
        assert_openai_error(&r, 504, "upstream_connect_timeout", ctx);
        assert!(took < Duration::from_secs(3), "{ctx}: took {took:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 10. Hop-by-hop response headers.
// ---------------------------------------------------------------------------------------

#[test]
fn hop_by_hop_response_headers_are_not_relayed() {
    const HOP: &str = "connection: keep-alive, x-secret\r\nConnection: x-other\r\nX-Secret: 1\r\nx-other: 2\r\nkeep-alive: timeout=5\r\nproxy-authenticate: Basic realm=\"up\"\r\nproxy-connection: keep-alive\r\ntrailer: x-checksum\r\nupgrade: h2c\r\nte: trailers\r\n";
    const E2E: &str = "content-type: application/json\r\nx-end: yes\r\ncache-control: no-store\r\nx-request-id: up-1\r\n";
    for d in drivers() {
        for chunked in [false, true] {
            let ctx = format!("{} chunked={chunked}", driver_name(d));
            let up = Upstream::start(move |_| {
                Reply::new(if chunked {
                    format!(
                        "HTTP/1.1 200 OK\r\n{HOP}{E2E}transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                    )
                } else {
                    format!("HTTP/1.1 200 OK\r\n{HOP}{E2E}content-length: 2\r\n\r\nok")
                })
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            for _ in 0..2 {
                c.send(&chat());
                let r = c.response().unwrap();
                assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{ctx}");
                for h in [
                    "x-secret",
                    "x-other",
                    "keep-alive",
                    "proxy-authenticate",
                    "proxy-connection",
                    "trailer",
                    "upgrade",
                    "te",
                    "connection",
                ] {
                    assert_eq!(r.header(h), None, "{ctx}: {h} leaked: {:?}", r.headers);
                }
                for (h, v) in [
                    ("content-type", "application/json"),
                    ("x-end", "yes"),
                    ("cache-control", "no-store"),
                    ("x-rolter-target", "t0"),
                ] {
                    assert_eq!(r.header(h), Some(v), "{ctx}: {:?}", r.headers);
                }
                // The request's own id replaces the upstream's: one x-request-id.
                let ids: Vec<&str> = r
                    .headers
                    .iter()
                    .filter(|(n, _)| n == "x-request-id")
                    .map(|(_, v)| v.as_str())
                    .collect();
                assert_eq!(ids.len(), 1, "{ctx}: {:?}", r.headers);
                assert_ne!(ids[0], "up-1", "{ctx}");
                let framing = r
                    .headers
                    .iter()
                    .filter(|(n, _)| n == "content-length" || n == "transfer-encoding")
                    .count();
                assert_eq!(framing, 1, "{ctx}: one framing header: {:?}", r.headers);
            }
            assert_eq!(up.accepts(), 1, "{ctx}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 11. Chunk extensions and trailers.
// ---------------------------------------------------------------------------------------

#[test]
fn chunk_extensions_and_trailers_are_rechunked_without_trailers() {
    const HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntrailer: x-checksum, x-more\r\ntransfer-encoding: chunked\r\n\r\n";
    const BODY: [&[u8]; 3] = [
        b"5;ext=1\r\nhello\r\n",
        b"6;a=b;c=\"q x\"\r\n world\r\n1\r\n!\r\n",
        b"0;last=yes\r\nx-checksum: abc\r\nx-more: 1\r\n\r\n",
    ];
    for d in drivers() {
        for split in [false, true] {
            let ctx = format!("{} split={split}", driver_name(d));
            let up = Upstream::start(move |_| {
                if split {
                    let mut parts = vec![HEAD.to_vec()];
                    parts.extend(BODY.iter().map(|b| b.to_vec()));
                    // The trailer section itself split mid-line.
                    let last = parts.pop().unwrap();
                    parts.push(last[..20].to_vec());
                    parts.push(last[20..].to_vec());
                    Reply::parts(parts, Duration::from_millis(30))
                } else {
                    Reply::new(cat(&[HEAD, BODY[0], BODY[1], BODY[2]]))
                }
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            for i in 0..2 {
                c.send(&chat());
                // Strict chunk parsing: `0\r\n` must be followed by exactly `\r\n`.
                let r = c.response().unwrap();
                assert_eq!(r.status, 200, "{ctx} #{i}");
                assert!(r.chunked, "{ctx}");
                assert_eq!(r.text(), "hello world!", "{ctx} #{i}");
                for h in ["trailer", "x-checksum", "x-more"] {
                    assert_eq!(r.header(h), None, "{ctx}: {:?}", r.headers);
                }
            }
            // The second response head parsed cleanly, so no trailer bytes leaked after
            // the first terminal chunk; the connection was pooled after the trailers.
            assert_eq!(up.accepts(), 1, "{ctx}: {:?}", up.conns());
        }
    }
}

// ---------------------------------------------------------------------------------------
// 12. Malformed responses.
// ---------------------------------------------------------------------------------------

#[test]
fn malformed_response_heads_are_502() {
    let cases: [(&str, &[u8]); 5] = [
        (
            "bad status code",
            b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\nok",
        ),
        (
            "not HTTP",
            b"HTTX/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ),
        (
            "header without colon",
            b"HTTP/1.1 200 OK\r\nbroken header\r\ncontent-length: 2\r\n\r\nok",
        ),
        (
            "two different Content-Lengths",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok!",
        ),
        (
            "negative Content-Length",
            b"HTTP/1.1 200 OK\r\ncontent-length: -2\r\n\r\nok",
        ),
    ];
    for d in drivers() {
        let up = Upstream::start(move |r| match cases.get(r.total) {
            Some((_, bytes)) => Reply::new(*bytes),
            None => Reply::new(ok("fine")),
        });
        let g = gw(d, up.addr, TIMEOUTS, "");
        for (i, (name, _)) in cases.iter().enumerate() {
            let ctx = format!("{} {name}", driver_name(d));
            let r = raw_call(g.local_addr());
            assert_openai_error(&r, 502, "upstream_bad_response", &ctx);
            // The connection is dropped, never reused.
            up.wait_closed(i + 1, &ctx);
        }
        let ctx = driver_name(d);
        assert_still_serving(&g, "fine", ctx);
        assert_eq!(up.accepts(), cases.len() + 1, "{ctx}");
    }
}

/// A chunk-size error in the bytes that arrived with the head: nothing reached the client
/// yet, so the client must get a well-formed 502, not a cut-off or headless response.
#[test]
fn malformed_first_chunk_before_the_head_was_sent_is_502() {
    for d in drivers() {
        for sse in [true, false] {
            let ctx = format!("{} sse={sse}", driver_name(d));
            let up = Upstream::start(move |r| {
                if r.total > 0 {
                    return Reply::new(ok("fine"));
                }
                let ct = if sse {
                    "text/event-stream"
                } else {
                    "application/json"
                };
                Reply::new(format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
                ))
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            let r = raw_call(g.local_addr());
            let ctx = format!("{ctx}: got {:?}", r.show());
            assert_openai_error(&r, 502, "upstream_bad_response", &ctx);
            up.wait_closed(1, &ctx);
            assert_still_serving(&g, "fine", &ctx);
        }
    }
}

#[test]
fn malformed_chunk_mid_body_truncates_without_terminal_chunk() {
    for d in drivers() {
        let ctx = driver_name(d);
        let up = Upstream::start(|r| {
            if r.total > 0 {
                return Reply::new(ok("fine"));
            }
            Reply::parts(
                vec![
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
                    b"zz\r\nmore\r\n0\r\n\r\n".to_vec(),
                ],
                Duration::from_millis(100),
            )
        });
        let g = gw(d, up.addr, TIMEOUTS, "");
        // Keep-alive client: the gateway must close the connection to signal the cut.
        let mut c = Client::connect(g.local_addr());
        c.send(&chat());
        let r = parse_raw(read_all(&mut c));
        assert_eq!(r.status, Some(200), "{ctx}: {}", r.show());
        assert!(r.chunked, "{ctx}: {}", r.show());
        assert_eq!(r.body, b"hello", "{ctx}: {}", r.show());
        assert!(!r.terminated, "{ctx}: terminal chunk sent: {}", r.show());
        assert!(r.after.is_empty(), "{ctx}: {}", r.show());
        assert!(!r.raw.ends_with(b"0\r\n\r\n"), "{ctx}: {}", r.show());
        up.wait_closed(1, ctx);
        assert_still_serving(&g, "fine", ctx);
        assert_eq!(up.accepts(), 2, "{ctx}");
    }
}

// ---------------------------------------------------------------------------------------
// The usage of a stream, asked for on the client's behalf (`stream_usage = "ask"`).
// ---------------------------------------------------------------------------------------

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n";
const TOKEN_EVENT: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
const USAGE_EVENT: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2}}\n\n";
const DONE_EVENT: &str = "data: [DONE]\n\n";
/// A streamed chat request that asks for no usage.
const STREAM_BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Hello there"}]}"#;

/// The `content-length` of a request head.
fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap()
}

#[test]
fn the_usage_event_asked_for_is_cut_from_a_stream_however_it_is_framed_and_split() {
    let events = format!("{TOKEN_EVENT}{TOKEN_EVENT}{USAGE_EVENT}{DONE_EVENT}");
    let want = format!("{TOKEN_EVENT}{TOKEN_EVENT}{DONE_EVENT}");
    for d in drivers() {
        for framing in ["length", "chunked", "close"] {
            let ctx = format!("{} {framing}", driver_name(d));
            let body = events.clone();
            let heads = Arc::new(Mutex::new(Vec::new()));
            let seen = heads.clone();
            let up = Upstream::start(move |r| {
                seen.lock().unwrap().push(r.head.clone());
                // The usage event split across two writes, mid-key.
                let cut = body.find("_tokens").unwrap();
                let (a, b) = body.split_at(cut);
                let (head, parts): (String, Vec<Vec<u8>>) = match framing {
                    "length" => (
                        format!("{SSE_HEAD}content-length: {}\r\n\r\n", body.len()),
                        vec![a.into(), b.into()],
                    ),
                    "chunked" => (
                        format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n"),
                        vec![
                            format!("{:x}\r\n{a}\r\n", a.len()).into(),
                            format!("{:x}\r\n{b}\r\n0\r\n\r\n", b.len()).into(),
                        ],
                    ),
                    _ => (format!("{SSE_HEAD}\r\n"), vec![a.into(), b.into()]),
                };
                let mut all = vec![head.into_bytes()];
                all.extend(parts);
                let reply = Reply::parts(all, Duration::from_millis(30));
                if framing == "close" {
                    reply.then(Then::Close)
                } else {
                    reply
                }
            });
            let g = gw(d, up.addr, TIMEOUTS, "");
            let mut c = Client::connect(g.local_addr());
            c.send(&post(CHAT, &[], STREAM_BODY));
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx}");
            assert!(r.chunked, "{ctx}: reframed, whatever the engine's framing");
            assert_eq!(r.text(), want, "{ctx}");
            let head = heads.lock().unwrap()[0].clone();
            assert_eq!(
                content_length(&head),
                STREAM_BODY.len() + r#""stream_options":{"include_usage":true},"#.len(),
                "{ctx}: the request asked for usage"
            );
        }
    }
}

#[test]
fn an_engine_that_ignores_the_usage_asked_for_is_not_asked_again_on_that_core() {
    let events = format!("{TOKEN_EVENT}{TOKEN_EVENT}{DONE_EVENT}");
    for d in drivers() {
        let ctx = driver_name(d);
        let body = events.clone();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        let up = Upstream::start(move |r| {
            seen.lock().unwrap().push(r.head.clone());
            Reply::new(format!(
                "{SSE_HEAD}content-length: {}\r\n\r\n{body}",
                body.len()
            ))
        });
        let mut rest = target("t0", up.addr, "");
        rest.push_str(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
        );
        let g = gateway(d, &rest);
        // One connection: one core.
        let mut c = Client::connect(g.local_addr());
        for i in 0..3 {
            c.send(&post(CHAT, &[], STREAM_BODY));
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx} #{i}");
            assert_eq!(r.text(), events, "{ctx} #{i}: relayed whole");
        }
        let lengths: Vec<usize> = heads
            .lock()
            .unwrap()
            .iter()
            .map(|h| content_length(h))
            .collect();
        let asked = STREAM_BODY.len() + r#""stream_options":{"include_usage":true},"#.len();
        assert_eq!(
            lengths,
            [asked, STREAM_BODY.len(), STREAM_BODY.len()],
            "{ctx}: asked once, then sent as it came"
        );
        let unreported = "rolter_stream_usage_unreported_total{target=\"t0\"}";
        wait_for("the unreported usage counted", WAIT, || {
            admin_series(&g, unreported) == Some(1.0)
        });
    }
}
