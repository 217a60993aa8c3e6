//! Upstream connection handling under both drivers, against a scripted upstream written
//! here (a std TcpListener that counts accepted connections, records requests and answers
//! exactly the bytes each test scripts): keep-alive reuse, what is never pooled
//! (`connection: close`, HTTP/1.0, close-delimited bodies, short bodies, bytes beyond the
//! framing, malformed chunking), stale detection before reuse, the pool's idle timeout and
//! `max_idle` bound, 1xx interim responses, the connect timeout, hop-by-hop response headers,
//! chunk extensions and trailers, and malformed responses.
//!
//! Assertions are on connection counts and bytes; sleeps only open generous windows around
//! the gateway's timers (hundreds of milliseconds either side).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;

const CHAT: &str = "/v1/chat/completions";
/// Upper bound for anything the tests wait on.
const WAIT: Duration = Duration::from_secs(5);
/// Target timeouts for most tests: generous, so only the scripted behaviour matters.
const TIMEOUTS: &str = "connect = \"1s\"\nfirst_byte = \"2s\"\nidle = \"2s\"";

// ---------------------------------------------------------------------------------------
// The scripted upstream.
// ---------------------------------------------------------------------------------------

/// One request as the upstream received it.
struct Req {
    /// Index of the connection (accept order).
    conn: usize,
    /// Index of the request on its connection.
    nth: usize,
    /// Index of the request over all connections (arrival order).
    total: usize,
    #[allow(dead_code)]
    head: String,
}

/// What the upstream does with a connection after answering.
#[derive(Clone, Copy)]
enum Then {
    /// Keep it open and wait for the next request.
    KeepAlive,
    /// Half-close at once (FIN) and keep reading, recording anything that still arrives.
    Close,
    /// Keep it open; after this long without a new request, half-close it (FIN) and keep
    /// reading, so a request the gateway sends on it anyway is seen and recorded.
    HalfCloseWhenIdle(Duration),
    /// Keep it open; after this long without a new request, close it completely.
    CloseWhenIdle(Duration),
}

struct Reply {
    /// Written in order, `gap` apart.
    parts: Vec<Vec<u8>>,
    gap: Duration,
    /// Wait before the first write.
    delay: Duration,
    then: Then,
}

impl Reply {
    fn new(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::parts(vec![bytes.into()], Duration::ZERO)
    }
    fn parts(parts: Vec<Vec<u8>>, gap: Duration) -> Reply {
        Reply {
            parts,
            gap,
            delay: Duration::ZERO,
            then: Then::KeepAlive,
        }
    }
    fn then(mut self, then: Then) -> Reply {
        self.then = then;
        self
    }
}

/// A keep-alive 200 with a Content-Length body.
fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[derive(Default, Clone, Debug)]
struct ConnLog {
    /// Requests received on this connection (including any after the upstream half-closed).
    requests: usize,
    /// Replies fully written.
    replies: usize,
    /// The gateway closed (EOF or reset seen by the upstream).
    eof: bool,
}

#[derive(Default)]
struct Shared {
    conns: Mutex<Vec<ConnLog>>,
    total: AtomicUsize,
    stop: AtomicBool,
}

type Script = dyn Fn(&Req) -> Reply + Send + Sync;

struct Upstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Upstream {
    fn start(script: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let script: Arc<Script> = Arc::new(script);
        let sh = shared.clone();
        thread::spawn(move || {
            while !sh.stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let id = {
                            let mut c = sh.conns.lock().unwrap();
                            c.push(ConnLog::default());
                            c.len() - 1
                        };
                        let (sh, script) = (sh.clone(), script.clone());
                        thread::spawn(move || serve_conn(s, id, &sh, &*script));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Upstream { addr, shared }
    }
    /// Connections accepted so far.
    fn accepts(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }
    fn conns(&self) -> Vec<ConnLog> {
        self.shared.conns.lock().unwrap().clone()
    }
    fn requests(&self) -> usize {
        self.shared.total.load(Ordering::SeqCst)
    }
    fn closed_by_gateway(&self) -> usize {
        self.conns().iter().filter(|c| c.eof).count()
    }
    fn wait_closed(&self, n: usize, ctx: &str) {
        wait_for(&format!("{ctx}: {n} upstream closes"), WAIT, || {
            self.closed_by_gateway() == n
        });
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request (head and Content-Length body); `Ok(None)` at EOF.
fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<String>> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let cl = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.trim().parse::<usize>().unwrap())
                .unwrap_or(0);
            if buf.len() >= end + 4 + cl {
                buf.drain(..end + 4 + cl);
                return Ok(Some(head));
            }
        }
        let mut tmp = [0u8; 16 * 1024];
        let n = s.read(&mut tmp)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

fn serve_conn(mut s: TcpStream, id: usize, sh: &Shared, script: &Script) {
    s.set_nonblocking(false).unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = Vec::new();
    let mut nth = 0;
    let mut when_idle: Option<Then> = None;
    let mut half_closed = false;
    let log = |f: &dyn Fn(&mut ConnLog)| f(&mut sh.conns.lock().unwrap()[id]);
    loop {
        let idle_limit = match when_idle {
            Some(Then::HalfCloseWhenIdle(d) | Then::CloseWhenIdle(d)) if !half_closed => d,
            _ => Duration::from_secs(10),
        };
        s.set_read_timeout(Some(idle_limit)).unwrap();
        match read_request(&mut s, &mut buf) {
            Ok(Some(head)) => {
                let total = sh.total.fetch_add(1, Ordering::SeqCst);
                log(&|c| c.requests += 1);
                let req = Req {
                    conn: id,
                    nth,
                    total,
                    head,
                };
                nth += 1;
                if half_closed {
                    // Seen and recorded, never answered: the upstream already sent its FIN.
                    continue;
                }
                let reply = script(&req);
                thread::sleep(reply.delay);
                for (i, p) in reply.parts.iter().enumerate() {
                    if i > 0 {
                        thread::sleep(reply.gap);
                    }
                    if s.write_all(p).is_err() {
                        break;
                    }
                }
                log(&|c| c.replies += 1);
                match reply.then {
                    Then::KeepAlive => when_idle = None,
                    Then::Close => {
                        let _ = s.shutdown(Shutdown::Write);
                        half_closed = true;
                    }
                    t => when_idle = Some(t),
                }
            }
            Ok(None) => {
                log(&|c| c.eof = true);
                return;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                match when_idle {
                    Some(Then::HalfCloseWhenIdle(_)) if !half_closed && buf.is_empty() => {
                        let _ = s.shutdown(Shutdown::Write);
                        half_closed = true;
                    }
                    // Dropping the socket closes it.
                    Some(Then::CloseWhenIdle(_)) if buf.is_empty() => return,
                    _ => return,
                }
            }
            Err(_) => {
                // A reset from the gateway closing with unread bytes.
                log(&|c| c.eof = true);
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Gateway and client helpers.
// ---------------------------------------------------------------------------------------

/// A gateway (one worker) with one target `t0` at `up` and one route without retries.
fn gw(d: DriverChoice, up: SocketAddr, timeouts: &str, pool: &str) -> Gateway {
    let mut rest = target(
        "t0",
        up,
        &format!("[targets.timeouts]\n{timeouts}\n[targets.pool]\n{pool}\n"),
    );
    rest.push_str(
        "[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\nstrategy = \"round_robin\"\nretries = 0\n",
    );
    gateway(d, &rest)
}

fn chat() -> String {
    post(CHAT, &[], &chat_body(false))
}

/// A request after which the gateway closes the client connection.
fn chat_close() -> String {
    post(CHAT, &[("connection", "close")], &chat_body(false))
}

/// Everything the gateway sends until it closes the client connection.
fn read_all(c: &mut Client) -> Vec<u8> {
    let mut raw = Vec::new();
    match c.r.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!(
            "reading until close: {e} after {:?}",
            String::from_utf8_lossy(&raw)
        ),
    }
    raw
}

/// A response as raw bytes, parsed leniently so a broken one can be described.
#[derive(Debug)]
struct Raw {
    status: Option<u16>,
    headers: Vec<(String, String)>,
    /// The body, de-chunked when chunked (complete chunks only).
    body: Vec<u8>,
    chunked: bool,
    /// The terminal `0\r\n\r\n` arrived.
    terminated: bool,
    /// Bytes after the terminal chunk (chunked) .
    after: Vec<u8>,
    raw: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn show(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

fn parse_raw(raw: Vec<u8>) -> Raw {
    let mut r = Raw {
        status: None,
        headers: Vec::new(),
        body: Vec::new(),
        chunked: false,
        terminated: false,
        after: Vec::new(),
        raw,
    };
    let Some(end) = find(&r.raw, b"\r\n\r\n") else {
        return r;
    };
    let head = String::from_utf8_lossy(&r.raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    if let Some(rest) = status_line.strip_prefix("HTTP/1.1 ") {
        r.status = rest.get(..3).and_then(|s| s.parse().ok());
    }
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            r.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    r.chunked = r.header("transfer-encoding") == Some("chunked");
    let mut pos = end + 4;
    if !r.chunked {
        r.body = r.raw[pos..].to_vec();
        return r;
    }
    while let Some(eol) = find(&r.raw[pos..], b"\r\n") {
        let Some(size) = std::str::from_utf8(&r.raw[pos..pos + eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
        else {
            break;
        };
        let start = pos + eol + 2;
        if r.raw.len() < start + size + 2 || &r.raw[start + size..start + size + 2] != b"\r\n" {
            break;
        }
        pos = start + size + 2;
        if size == 0 {
            r.terminated = true;
            break;
        }
        r.body.extend_from_slice(&r.raw[start..start + size]);
    }
    r.after = r.raw[pos..].to_vec();
    r
}

/// One request with `connection: close` on a fresh client connection, read until close.
fn raw_call(addr: SocketAddr) -> Raw {
    let mut c = Client::connect(addr);
    c.send(&chat_close());
    parse_raw(read_all(&mut c))
}

fn assert_openai_error(r: &Raw, status: u16, code: &str, ctx: &str) {
    assert_eq!(r.status, Some(status), "{ctx}: {}", r.show());
    assert!(!r.chunked, "{ctx}: {}", r.show());
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{ctx}: body is not JSON ({e}): {}", r.show()));
    let e = &v["error"];
    assert!(e["message"].is_string(), "{ctx}: {v}");
    assert!(e["type"].is_string(), "{ctx}: {v}");
    assert!(e.get("param").is_some(), "{ctx}: {v}");
    assert_eq!(e["code"], code, "{ctx}: {v}");
}

/// The gateway still serves a normal request (the upstream answers `ok(..)` to it).
fn assert_still_serving(g: &Gateway, body: &str, ctx: &str) {
    let r = call(g.local_addr(), &chat());
    assert_eq!(r.status, 200, "{ctx}: {}", r.text());
    assert_eq!(r.text(), body, "{ctx}");
}

// ---------------------------------------------------------------------------------------
// 1. Reuse.
// ---------------------------------------------------------------------------------------

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
                    ("x-request-id", "up-1"),
                    ("x-rolter-target", "t0"),
                ] {
                    assert_eq!(r.header(h), Some(v), "{ctx}: {:?}", r.headers);
                }
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
