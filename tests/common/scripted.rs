//! A scripted upstream for the upstream-handling tests: a std TcpListener that counts
//! accepted connections, records requests and answers exactly the bytes each test scripts,
//! and the gateway and client helpers those tests share.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rolter::config::DriverChoice;
use rolter::Gateway;

use super::*;

pub const CHAT: &str = "/v1/chat/completions";
/// Upper bound for anything the tests wait on.
pub const WAIT: Duration = Duration::from_secs(5);
/// Target timeouts for most tests: generous, so only the scripted behaviour matters.
pub const TIMEOUTS: &str = "connect = \"1s\"\nfirst_byte = \"2s\"\nidle = \"2s\"";

// ---------------------------------------------------------------------------------------
// The scripted upstream.
// ---------------------------------------------------------------------------------------

/// One request as the upstream received it.
pub struct Req {
    /// Index of the connection (accept order).
    pub conn: usize,
    /// Index of the request on its connection.
    pub nth: usize,
    /// Index of the request over all connections (arrival order).
    pub total: usize,
    #[allow(dead_code)]
    pub head: String,
}

/// What the upstream does with a connection after answering.
#[derive(Clone, Copy)]
pub enum Then {
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

pub struct Reply {
    /// Written in order, `gap` apart.
    pub parts: Vec<Vec<u8>>,
    pub gap: Duration,
    /// Wait before the first write.
    pub delay: Duration,
    pub then: Then,
}

impl Reply {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::parts(vec![bytes.into()], Duration::ZERO)
    }
    pub fn parts(parts: Vec<Vec<u8>>, gap: Duration) -> Reply {
        Reply {
            parts,
            gap,
            delay: Duration::ZERO,
            then: Then::KeepAlive,
        }
    }
    pub fn then(mut self, then: Then) -> Reply {
        self.then = then;
        self
    }
}

/// A keep-alive 200 with a Content-Length body.
pub fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[derive(Default, Clone, Debug)]
pub struct ConnLog {
    /// Requests received on this connection (including any after the upstream half-closed).
    pub requests: usize,
    /// Replies fully written.
    pub replies: usize,
    /// The gateway closed (EOF or reset seen by the upstream).
    pub eof: bool,
}

#[derive(Default)]
pub struct Shared {
    pub conns: Mutex<Vec<ConnLog>>,
    pub total: AtomicUsize,
    pub stop: AtomicBool,
}

pub type Script = dyn Fn(&Req) -> Reply + Send + Sync;

pub struct Upstream {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
}

impl Upstream {
    pub fn start(script: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Upstream {
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
    pub fn accepts(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }
    pub fn conns(&self) -> Vec<ConnLog> {
        self.shared.conns.lock().unwrap().clone()
    }
    pub fn requests(&self) -> usize {
        self.shared.total.load(Ordering::SeqCst)
    }
    pub fn closed_by_gateway(&self) -> usize {
        self.conns().iter().filter(|c| c.eof).count()
    }
    pub fn wait_closed(&self, n: usize, ctx: &str) {
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

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request (head and Content-Length body); `Ok(None)` at EOF.
pub fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<String>> {
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

pub fn serve_conn(mut s: TcpStream, id: usize, sh: &Shared, script: &Script) {
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
pub fn gw(d: DriverChoice, up: SocketAddr, timeouts: &str, pool: &str) -> Gateway {
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

pub fn chat() -> String {
    post(CHAT, &[], &chat_body(false))
}

/// A request after which the gateway closes the client connection.
pub fn chat_close() -> String {
    post(CHAT, &[("connection", "close")], &chat_body(false))
}

/// Everything the gateway sends until it closes the client connection.
pub fn read_all(c: &mut Client) -> Vec<u8> {
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
pub struct Raw {
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when chunked (complete chunks only).
    pub body: Vec<u8>,
    pub chunked: bool,
    /// The terminal `0\r\n\r\n` arrived.
    pub terminated: bool,
    /// Bytes after the terminal chunk (chunked) .
    pub after: Vec<u8>,
    pub raw: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn show(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

pub fn parse_raw(raw: Vec<u8>) -> Raw {
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
pub fn raw_call(addr: SocketAddr) -> Raw {
    let mut c = Client::connect(addr);
    c.send(&chat_close());
    parse_raw(read_all(&mut c))
}

pub fn assert_openai_error(r: &Raw, status: u16, code: &str, ctx: &str) {
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
pub fn assert_still_serving(g: &Gateway, body: &str, ctx: &str) {
    let r = call(g.local_addr(), &chat());
    assert_eq!(r.status, 200, "{ctx}: {}", r.text());
    assert_eq!(r.text(), body, "{ctx}");
}

// ---------------------------------------------------------------------------------------
// 1. Reuse.
// ---------------------------------------------------------------------------------------
