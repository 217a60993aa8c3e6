//! HTTP hardening: cases P1–P34 and P37–P39 (each test is named after its case, `p01_…`;
//! P37–P39 cover Host values, fragments, header names with underscores) and ported request-smuggling payloads
//! (http_desync_guardian `severe.yaml`, HTTP Garden), as raw bytes over a socket against
//! the real gateway and a recording mock engine, under both drivers.
//!
//! Every rejection must: carry the exact status, an OpenAI-shaped error body, close the
//! connection, and leave the upstream untouched. Every forwarded request must reach the
//! upstream as exactly one well-framed request.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::{MockHandle, RecordedRequest};

const UPSTREAM_KEY: &str = "Bearer upstream-key";

/// A gateway with one target (injecting an upstream `Authorization`) in front of a mock.
struct Env {
    // Field order: the gateway stops before its upstream.
    gw: Gateway,
    mock: MockHandle,
    driver: DriverChoice,
}

impl Env {
    fn new(driver: DriverChoice) -> Env {
        let mock = mock("a", |_| {});
        let mut rest = target(
            "t0",
            mock.addr(),
            &format!(
                "headers = {{ \"Authorization\" = \"{UPSTREAM_KEY}\" }}\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"1s\""
            ),
        );
        rest.push_str("[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\nretries = 0\n");
        let gw = gateway(driver, &rest);
        Env { gw, mock, driver }
    }

    fn addr(&self) -> SocketAddr {
        self.gw.local_addr()
    }

    fn d(&self) -> &'static str {
        driver_name(self.driver)
    }

    fn seen(&self) -> usize {
        self.mock.requests().len()
    }

    /// The mock's `host:port`, which is what the target's Host header must carry.
    fn target_host(&self) -> String {
        self.mock.addr().to_string()
    }

    /// Sends `raw` on a fresh connection and checks a complete rejection: exactly `status`,
    /// `connection: close`, an OpenAI error body, the server closes, nothing reached the
    /// upstream.
    fn reject(&self, label: &str, raw: &[u8], status: u16) -> Resp {
        let before = self.seen();
        let mut c = Conn::open(self.addr());
        c.send(raw);
        let r = c
            .response()
            .unwrap_or_else(|e| panic!("[{}] {label}: no response: {e}", self.d()));
        self.check_rejection(label, &r, status);
        c.expect_close(&format!("[{}] {label}", self.d()));
        assert_eq!(
            self.seen(),
            before,
            "[{}] {label}: the upstream received a rejected request: {:?}",
            self.d(),
            self.mock.requests().last()
        );
        r
    }

    fn check_rejection(&self, label: &str, r: &Resp, status: u16) {
        assert_eq!(
            r.status,
            status,
            "[{}] {label}: wrong status; body {}",
            self.d(),
            r.text()
        );
        assert_eq!(
            r.header("connection")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("close"),
            "[{}] {label}: a rejection must announce the close",
            self.d()
        );
        assert_openai_error(&r.body, &format!("[{}] {label}", self.d()));
    }

    /// Sends `raw` (one complete request) on a fresh connection, expects `status`, and
    /// checks the upstream saw exactly one more request, which it returns.
    fn accept(&self, label: &str, raw: &[u8]) -> (Resp, RecordedRequest) {
        let before = self.seen();
        let mut c = Conn::open(self.addr());
        c.send(raw);
        let r = c
            .response()
            .unwrap_or_else(|e| panic!("[{}] {label}: no response: {e}", self.d()));
        assert_eq!(
            r.status,
            200,
            "[{}] {label}: wrong status; body {}",
            self.d(),
            r.text()
        );
        let reqs = self.mock.requests();
        assert_eq!(
            reqs.len(),
            before + 1,
            "[{}] {label}: the upstream must see exactly one request",
            self.d()
        );
        let up = reqs.last().unwrap().clone();
        check_forwarded(&up, &format!("[{}] {label}", self.d()), &self.target_host());
        (r, up)
    }
}

/// Properties every forwarded request has: one Host (the target's), a fresh Content-Length
/// matching the body, no framing or hop-by-hop headers, the injected key exactly once.
fn check_forwarded(up: &RecordedRequest, label: &str, host: &str) {
    let count = |n: &str| up.headers.iter().filter(|(k, _)| k == n).count();
    assert_eq!(count("host"), 1, "{label}: upstream Host count");
    assert_eq!(up.header("host"), Some(host), "{label}: upstream Host");
    assert_eq!(
        count("content-length"),
        1,
        "{label}: upstream Content-Length count"
    );
    assert_eq!(
        up.header("content-length"),
        Some(up.body.len().to_string().as_str()),
        "{label}: upstream Content-Length must match the body"
    );
    for h in [
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "expect",
    ] {
        assert_eq!(
            count(h),
            0,
            "{label}: upstream carries `{h}`: {:?}",
            up.headers
        );
    }
    assert_eq!(
        count("authorization"),
        1,
        "{label}: upstream Authorization count"
    );
    assert_eq!(up.header("authorization"), Some(UPSTREAM_KEY), "{label}");
    assert_eq!(
        count("x-forwarded-for"),
        1,
        "{label}: X-Forwarded-For count"
    );
    assert_eq!(up.header("x-forwarded-for"), Some("127.0.0.1"), "{label}");
    for (n, v) in &up.headers {
        assert!(
            !n.contains(['\r', '\n', '\0']) && !v.contains(['\r', '\n', '\0']),
            "{label}: control bytes forwarded in {n}: {v:?}"
        );
    }
}

fn assert_openai_error(body: &[u8], label: &str) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "{label}: error body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    let err = v
        .get("error")
        .and_then(|e| e.as_object())
        .unwrap_or_else(|| panic!("{label}: no `error` object: {v}"));
    assert!(
        err.get("message").is_some_and(|m| m.is_string()),
        "{label}: {v}"
    );
    assert!(
        err.get("type").is_some_and(|m| m.is_string()),
        "{label}: {v}"
    );
    assert!(err.contains_key("param"), "{label}: no param: {v}");
    assert!(err.contains_key("code"), "{label}: no code: {v}");
    assert_eq!(
        v.as_object().unwrap().len(),
        1,
        "{label}: extra top-level keys: {v}"
    );
}

/// A response as read off the wire.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: bool,
    /// Body delimited by the connection closing.
    close_delimited: bool,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("bad json {e}: {}", self.text()))
    }
}

/// A raw client connection with its own read buffer.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            s,
            buf: Vec::new(),
            eof: false,
        }
    }

    /// Writes everything; a peer that stops reading and closes may cut a large write short,
    /// which is fine: the response is checked afterwards.
    fn send(&mut self, raw: &[u8]) {
        if let Err(e) = self.s.write_all(raw) {
            assert!(
                matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
                "write failed: {e}"
            );
        }
    }

    /// Reads more bytes; Ok(false) at EOF (or a reset, which also means the peer closed).
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        let mut tmp = [0u8; 16 * 1024];
        match self.s.read(&mut tmp) {
            Ok(0) => {
                self.eof = true;
                Ok(false)
            }
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                self.eof = true;
                Ok(false)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e),
        }
    }

    fn need(&mut self, n: usize) -> std::io::Result<()> {
        while self.buf.len() < n {
            if !self.fill()? {
                return Err(ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    fn line(&mut self) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = self.buf[..p].to_vec();
                self.buf.drain(..p + 2);
                return Ok(l);
            }
            if !self.fill()? {
                return Err(ErrorKind::UnexpectedEof.into());
            }
        }
    }

    fn take(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        self.need(n)?;
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads one response (interim 1xx responses included), strictly framed.
    fn response(&mut self) -> std::io::Result<Resp> {
        let sl = String::from_utf8(self.line()?).expect("status line is UTF-8");
        assert!(
            sl.starts_with("HTTP/1.1 ") && sl.len() >= 12,
            "status line {sl:?}"
        );
        let status: u16 = sl[9..12].parse().expect("status code");
        let mut headers = Vec::new();
        loop {
            let l = String::from_utf8(self.line()?).expect("header is UTF-8");
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("header colon");
            assert!(
                !k.is_empty() && !k.contains([' ', '\t']),
                "header name {k:?}"
            );
            headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut r = Resp {
            status,
            headers,
            body: Vec::new(),
            chunked: false,
            close_delimited: false,
        };
        if (100..200).contains(&status) {
            return Ok(r);
        }
        let te = r.header("transfer-encoding").map(str::to_string);
        let cl = r.header("content-length").map(str::to_string);
        assert!(
            te.is_none() || cl.is_none(),
            "response carries both framings: {:?}",
            r.headers
        );
        if let Some(te) = te {
            assert_eq!(te, "chunked", "response transfer-encoding");
            r.chunked = true;
            loop {
                let l = String::from_utf8(self.line()?).unwrap();
                let size = usize::from_str_radix(&l, 16)
                    .unwrap_or_else(|_| panic!("chunk size line {l:?}"));
                if size == 0 {
                    assert_eq!(self.line()?, b"", "no trailers expected");
                    break;
                }
                let data = self.take(size + 2)?;
                assert_eq!(&data[size..], b"\r\n", "chunk terminator");
                r.body.extend_from_slice(&data[..size]);
            }
        } else if let Some(cl) = cl {
            let n: usize = cl.parse().expect("response content-length");
            r.body = self.take(n)?;
        } else {
            r.close_delimited = true;
            while self.fill()? {}
            r.body = std::mem::take(&mut self.buf);
        }
        Ok(r)
    }

    /// A final response, skipping interim ones.
    fn final_response(&mut self) -> Resp {
        loop {
            let r = self.response().expect("response");
            if r.status >= 200 {
                return r;
            }
            assert_eq!(r.status, 100, "unexpected interim response");
        }
    }

    /// Asserts the server closes the connection with no further bytes.
    fn expect_close(&mut self, label: &str) {
        let t = Instant::now();
        loop {
            match self.fill() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => panic!(
                    "{label}: the server did not close the connection after {:?}: {e}",
                    t.elapsed()
                ),
            }
        }
        assert!(
            self.buf.is_empty(),
            "{label}: bytes after the response: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
    }
}

/// `R` from the document: the start of a chat completion request.
const R: &str = "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n";

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn body() -> String {
    chat_body(false)
}

/// A complete, valid chat request with the given extra header lines (each ending in CRLF).
fn valid_post(extra: &str) -> Vec<u8> {
    let b = body();
    format!("{R}{extra}Content-Length: {}\r\n\r\n{b}", b.len()).into_bytes()
}

/// A chunked encoding of `data` in pieces of at most `piece` bytes, with the last chunk.
fn chunked(data: &[u8], piece: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in data.chunks(piece) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn each_driver(f: impl Fn(&Env)) {
    for d in drivers() {
        let env = Env::new(d);
        f(&env);
    }
}

// ---------------------------------------------------------------------------------------
// Framing: Content-Length and Transfer-Encoding
// ---------------------------------------------------------------------------------------

#[test]
fn p01_content_length_with_transfer_encoding() {
    each_driver(|e| {
        let raw = format!("{R}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX");
        e.reject("CL+TE", raw.as_bytes(), 400);
        let raw = format!("{R}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\nX");
        e.reject("TE+CL", raw.as_bytes(), 400);
    });
}

#[test]
fn p02_two_content_lengths() {
    each_driver(|e| {
        let raw = format!("{R}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!");
        e.reject("CL 5 / CL 6", raw.as_bytes(), 400);
    });
}

#[test]
fn p03_content_length_list() {
    each_driver(|e| {
        let raw = format!("{R}Content-Length: 5, 5\r\n\r\nhello");
        e.reject("CL `5, 5`", raw.as_bytes(), 400);
    });
}

#[test]
fn p04_malformed_content_length() {
    each_driver(|e| {
        for v in ["+5", "0x5", "-1", "5 5", "1_0", ""] {
            let raw = format!("{R}Content-Length: {v}\r\n\r\nhello");
            e.reject(&format!("CL {v:?}"), raw.as_bytes(), 400);
        }
    });
}

#[test]
fn p05_content_length_overflow() {
    each_driver(|e| {
        let raw = format!("{R}Content-Length: 18446744073709551616\r\n\r\nhello");
        e.reject("CL 2^64", raw.as_bytes(), 400);
        let raw = format!("{R}Content-Length: 99999999999999999999999999\r\n\r\nhello");
        e.reject("CL 10^26", raw.as_bytes(), 400);
    });
}

#[test]
fn p06_body_over_the_limit_is_refused_before_it_is_read() {
    each_driver(|e| {
        // Only the head: the 413 must come without any body byte being sent.
        let raw = format!("{R}Content-Length: 1000000000\r\n\r\n");
        let t = Instant::now();
        e.reject("CL 1e9, head only", raw.as_bytes(), 413);
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "413 waited for the body"
        );
        let raw = format!("{R}Content-Length: 1048577\r\n\r\n");
        let r = e.reject("CL limit+1, head only", raw.as_bytes(), 413);
        // The message names the limit and the key that sets it.
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("1048576 bytes") && msg.contains("server.limits.max_body_bytes"),
            "[{}] 413 message: {msg}",
            e.d()
        );
        assert_eq!(body["error"]["code"], "body_too_large", "[{}]", e.d());
    });
}

#[test]
fn p07_unknown_or_unsupported_transfer_coding() {
    each_driver(|e| {
        let raw = format!("{R}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n");
        e.reject("TE xchunked", raw.as_bytes(), 400);
        let raw = format!("{R}Transfer-Encoding: gzip\r\n\r\n");
        e.reject("TE gzip", raw.as_bytes(), 501);
    });
}

#[test]
fn p08_chunked_twice() {
    each_driver(|e| {
        let raw =
            format!("{R}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        e.reject("two TE fields", raw.as_bytes(), 400);
        let raw = format!("{R}Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n");
        e.reject("TE `chunked, chunked`", raw.as_bytes(), 400);
    });
}

#[test]
fn p09_space_before_colon_in_transfer_encoding() {
    each_driver(|e| {
        let raw = format!("{R}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n");
        e.reject("`Transfer-Encoding :`", raw.as_bytes(), 400);
    });
}

#[test]
fn p10_mangled_chunked_token() {
    each_driver(|e| {
        for v in [&b",chunked"[..], b"chunked\x0b", b"chunked\x00"] {
            let raw = cat(&[
                R.as_bytes(),
                b"Transfer-Encoding: ",
                v,
                b"\r\n\r\n0\r\n\r\n",
            ]);
            e.reject(&format!("TE {:?}", String::from_utf8_lossy(v)), &raw, 400);
        }
    });
}

#[test]
fn p11_folded_transfer_encoding_with_content_length() {
    each_driver(|e| {
        let raw = format!("{R}Transfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n\r\nhello");
        e.reject("folded TE + CL", raw.as_bytes(), 400);
    });
}

#[test]
fn p12_obs_fold() {
    each_driver(|e| {
        let b = body();
        let raw = format!("{R}X: a\r\n b\r\nContent-Length: {}\r\n\r\n{b}", b.len());
        e.reject("obs-fold", raw.as_bytes(), 400);
    });
}

#[test]
fn p13_whitespace_before_the_first_header() {
    each_driver(|e| {
        let raw = "POST /v1/chat/completions HTTP/1.1\r\n\tContent-Length: 1\r\nHost: a\r\n\r\nX";
        e.reject("leading tab header", raw.as_bytes(), 400);
        let raw = "POST /v1/chat/completions HTTP/1.1\r\n Content-Length: 1\r\nHost: a\r\n\r\nX";
        e.reject("leading space header", raw.as_bytes(), 400);
    });
}

#[test]
fn p14_bare_lf_line_endings() {
    each_driver(|e| {
        e.reject("bare LF", b"GET /health HTTP/1.1\nHost: a\n\n", 400);
        e.reject(
            "mixed LF",
            b"GET /health HTTP/1.1\r\nHost: a\nX: b\r\n\r\n",
            400,
        );
    });
}

#[test]
fn p15_bare_cr_in_a_header() {
    each_driver(|e| {
        let raw = format!("{R}X: a\rContent-Length: 5\r\n\r\nhello");
        e.reject("bare CR", raw.as_bytes(), 400);
    });
}

#[test]
fn p16_bad_bytes_in_header_names_and_values() {
    each_driver(|e| {
        let cases: [(&str, &[u8]); 3] = [
            ("NUL in a value", b"X: a\x00b\r\n"),
            ("empty name", b": x\r\n"),
            ("0x85 in a name", b"Content-Length\x85: 10\r\n"),
        ];
        for (label, h) in cases {
            let raw = cat(&[R.as_bytes(), h, b"Content-Length: 2\r\n\r\n{}"]);
            e.reject(label, &raw, 400);
        }
    });
}

#[test]
fn p17_host_count() {
    each_driver(|e| {
        let b = body();
        let raw = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        e.reject("no Host", raw.as_bytes(), 400);
        let raw = format!("{R}Host: b\r\nContent-Length: {}\r\n\r\n{b}", b.len());
        e.reject("two Hosts", raw.as_bytes(), 400);
        e.reject("no Host, GET", b"GET /health HTTP/1.1\r\n\r\n", 400);
    });
}

// ---------------------------------------------------------------------------------------
// Chunked bodies
// ---------------------------------------------------------------------------------------

fn chunked_head() -> String {
    format!("{R}Transfer-Encoding: chunked\r\n\r\n")
}

#[test]
fn p18_malformed_chunk_sizes() {
    each_driver(|e| {
        for size in ["0x5", "0_2e", "+5", "-1", " 5"] {
            let raw = format!("{}{size}\r\nhello\r\n0\r\n\r\n", chunked_head());
            e.reject(&format!("chunk size {size:?}"), raw.as_bytes(), 400);
        }
    });
}

#[test]
fn p19_chunk_size_overflow() {
    each_driver(|e| {
        let raw = format!("{}1FFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n", chunked_head());
        e.reject("17-digit chunk size", raw.as_bytes(), 400);
        let raw = format!("{}FFFFFFFFFFFFFFFFFFFFFFFF\r\n", chunked_head());
        e.reject("24-digit chunk size", raw.as_bytes(), 400);
    });
}

#[test]
fn p20_chunk_longer_than_its_size() {
    each_driver(|e| {
        let raw = format!("{}5\r\nhello!!\r\n0\r\n\r\n", chunked_head());
        e.reject("chunk spill", raw.as_bytes(), 400);
    });
}

#[test]
fn p21_bare_lf_in_chunked_framing() {
    each_driver(|e| {
        let raw = format!("{}5\nhello\n0\n\n", chunked_head());
        e.reject("LF chunk lines", raw.as_bytes(), 400);
        let raw = format!("{}5\r\nhello\n0\r\n\r\n", chunked_head());
        e.reject("LF after chunk data", raw.as_bytes(), 400);
    });
}

#[test]
fn p22_bare_cr_in_a_chunk_size_line() {
    each_driver(|e| {
        let raw = format!("{}2\r\r;a\r\nhi\r\n0\r\n\r\n", chunked_head());
        e.reject("`2\\r\\r;a`", raw.as_bytes(), 400);
    });
}

#[test]
fn p23_huge_chunk_extension() {
    each_driver(|e| {
        let mut raw = format!("{}1;", chunked_head()).into_bytes();
        raw.extend(std::iter::repeat_n(b'a', 1024 * 1024));
        raw.extend_from_slice(b"\r\nX\r\n0\r\n\r\n");
        e.reject("1 MB chunk extension", &raw, 400);
    });
}

#[test]
fn chunk_framing_cannot_outweigh_the_body_limit() {
    // 1-byte chunks each carrying a 1000-byte extension: about 2.4 MB on the wire for 2 KB
    // of data. The raw body is capped at twice max_body_bytes (1 MiB here) plus 64 KiB, so
    // the gateway answers 413 instead of buffering the framing.
    each_driver(|e| {
        let ext = "e".repeat(1000);
        let mut raw = chunked_head().into_bytes();
        for _ in 0..2400 {
            raw.extend_from_slice(format!("1;{ext}\r\nx\r\n").as_bytes());
        }
        raw.extend_from_slice(b"0\r\n\r\n");
        e.reject("chunk-extension amplification", &raw, 413);
    });
}

#[test]
fn p24_trailers_are_dropped() {
    each_driver(|e| {
        let b = body();
        let mut raw = chunked_head().into_bytes();
        let mut enc = chunked(b.as_bytes(), 17);
        enc.truncate(enc.len() - 2); // keep "0\r\n", add trailers
        raw.extend_from_slice(&enc);
        raw.extend_from_slice(
            b"Content-Length: 999\r\nHost: trailer.evil\r\nAuthorization: Bearer trailer-key\r\nX-Trailer-Only: sneaky\r\n\r\n",
        );
        let (r, up) = e.accept("trailers", &raw);
        assert_eq!(r.json()["object"], "chat.completion");
        assert_eq!(up.body, b.as_bytes(), "[{}] decoded body", e.d());
        for (n, v) in &up.headers {
            assert!(
                !["999", "trailer.evil", "Bearer trailer-key", "sneaky"].contains(&v.as_str()),
                "[{}] trailer value forwarded: {n}: {v}",
                e.d()
            );
            assert_ne!(n, "x-trailer-only", "[{}] trailer forwarded", e.d());
        }
    });
}

#[test]
fn p25_http10_with_transfer_encoding_and_content_length() {
    each_driver(|e| {
        let raw =
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n";
        e.reject("HTTP/1.0 TE+CL", raw.as_bytes(), 400);
        let raw =
            "POST /v1/chat/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        e.reject("HTTP/1.0 TE", raw.as_bytes(), 400);
    });
}

// ---------------------------------------------------------------------------------------
// Limits and request lines
// ---------------------------------------------------------------------------------------

#[test]
fn p26_oversized_header_section() {
    each_driver(|e| {
        let raw = format!("{R}X-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
        e.reject("64 KiB header", raw.as_bytes(), 431);
        let mut raw = String::from(R);
        for i in 0..500 {
            raw.push_str(&format!("X-H{i}: v\r\n"));
        }
        raw.push_str("Content-Length: 2\r\n\r\n{}");
        e.reject("500 headers", raw.as_bytes(), 431);
    });
}

#[test]
fn p27_long_uri() {
    each_driver(|e| {
        let raw = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(16 * 1024));
        e.reject("16 KiB URI", raw.as_bytes(), 414);
    });
}

#[test]
fn p28_malformed_request_lines() {
    each_driver(|e| {
        e.reject(
            "control byte in method",
            b"G\x01T /health HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "HTTP/1.32",
            b"GET /health HTTP/1.32\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject("HTTP/2.0", b"GET /health HTTP/2.0\r\nHost: a\r\n\r\n", 400);
        // HTTP/0.9: answered as soon as the line is complete, not at the head timeout.
        let t = Instant::now();
        e.reject("HTTP/0.9 line", b"GET /\r\n", 400);
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "[{}] HTTP/0.9 waited for a head timeout",
            e.d()
        );
        e.reject("HTTP/0.9 line + blank", b"GET /\r\n\r\n", 400);
    });
}

// ---------------------------------------------------------------------------------------
// Routing and upstream headers
// ---------------------------------------------------------------------------------------

#[test]
fn p29_absolute_form_never_selects_the_upstream() {
    each_driver(|e| {
        let b = body();
        let raw = format!(
            "POST http://169.254.169.254/v1/chat/completions HTTP/1.1\r\nHost: 169.254.169.254\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        let (r, up) = e.accept("absolute-form link-local", raw.as_bytes());
        assert_eq!(r.json()["object"], "chat.completion");
        assert_eq!(up.path, "/v1/chat/completions");
        assert_eq!(up.method, "POST");
        assert!(
            up.headers
                .iter()
                .all(|(_, v)| !v.contains("169.254.169.254")),
            "[{}] the link-local authority leaked upstream: {:?}",
            e.d(),
            up.headers
        );
        // A Host naming link-local space in origin form is ignored just the same.
        let raw = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 169.254.169.254:80\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        let (_, up) = e.accept("Host link-local", raw.as_bytes());
        assert!(up
            .headers
            .iter()
            .all(|(_, v)| !v.contains("169.254.169.254")));
    });
}

#[test]
fn p30_hop_by_hop_and_client_auth_are_stripped() {
    each_driver(|e| {
        let extra = "Connection: X-Foo, Authorization\r\n\
                     X-Foo: named-in-connection\r\n\
                     Keep-Alive: timeout=5\r\n\
                     TE: trailers\r\n\
                     Upgrade: websocket\r\n\
                     Proxy-Authorization: Basic cHJveHk6c2VjcmV0\r\n\
                     Proxy-Connection: keep-alive\r\n\
                     Authorization: Bearer client-key\r\n\
                     X-Api-Key: client-api-key\r\n\
                     X-Forwarded-For: 6.6.6.6\r\n\
                     X-Kept: yes\r\n";
        let (r, up) = e.accept("hop-by-hop", &valid_post(extra));
        assert_eq!(r.json()["object"], "chat.completion");
        for h in ["x-foo", "x-api-key"] {
            assert!(up.header(h).is_none(), "[{}] `{h}` forwarded", e.d());
        }
        for (n, v) in &up.headers {
            assert!(
                !v.contains("client-key")
                    && !v.contains("6.6.6.6")
                    && !v.contains("cHJveHk6c2VjcmV0")
                    && !v.contains("named-in-connection"),
                "[{}] client value forwarded: {n}: {v}",
                e.d()
            );
        }
        assert_eq!(up.header("x-kept"), Some("yes"), "end-to-end header kept");
        // Connection: close in the request: forwarded clean, and the server closes after
        // the response.
        let mut c = Conn::open(e.addr());
        c.send(&valid_post("Connection: close\r\n"));
        let r = c.final_response();
        assert_eq!(r.status, 200);
        c.expect_close(&format!("[{}] Connection: close", e.d()));
        let up = e.mock.requests().pop().unwrap();
        check_forwarded(&up, e.d(), &e.target_host());
    });
}

// ---------------------------------------------------------------------------------------
// Connection management
// ---------------------------------------------------------------------------------------

#[test]
fn p31_pipelined_requests_are_answered_in_order() {
    each_driver(|e| {
        let first = chat_body(false).replace("Hello there", "first");
        let second = chat_body(false).replace("Hello there", "second");
        let raw = format!(
            "{R}Content-Length: {}\r\n\r\n{first}GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n{R}Content-Length: {}\r\nConnection: close\r\n\r\n{second}",
            first.len(),
            second.len()
        );
        let mut c = Conn::open(e.addr());
        c.send(raw.as_bytes());
        let r1 = c.final_response();
        let r2 = c.final_response();
        let r3 = c.final_response();
        c.expect_close(e.d());
        assert_eq!(r1.status, 200, "[{}] {}", e.d(), r1.text());
        assert_eq!(r1.json()["object"], "chat.completion");
        assert_eq!(r2.status, 200);
        assert_eq!(r2.json()["object"], "list");
        assert_eq!(r3.status, 200);
        assert_eq!(r3.json()["object"], "chat.completion");
        let reqs = e.mock.requests();
        assert_eq!(reqs.len(), 2, "[{}]", e.d());
        assert_eq!(reqs[0].body, first.as_bytes());
        assert_eq!(reqs[1].body, second.as_bytes());

        // Two requests in one write, a valid one then a malformed one: 200, then 400 + close.
        let mut raw = valid_post("");
        raw.extend_from_slice(b"GET /health HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n");
        let mut c = Conn::open(e.addr());
        c.send(&raw);
        let r1 = c.final_response();
        assert_eq!(r1.status, 200);
        let r2 = c.final_response();
        e.check_rejection("pipelined malformed", &r2, 400);
        c.expect_close(e.d());
        assert_eq!(e.seen(), 3);
    });
}

#[test]
fn p32_expect_100_continue() {
    each_driver(|e| {
        // Within the limit: 100, then (after the body) the response.
        let b = body();
        let head = format!(
            "{R}Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            b.len()
        );
        let mut c = Conn::open(e.addr());
        c.send(head.as_bytes());
        let r = c.response().unwrap();
        assert_eq!(r.status, 100, "[{}] expected 100 Continue", e.d());
        assert!(r.body.is_empty());
        c.send(b.as_bytes());
        let r = c.response().unwrap();
        assert_eq!(r.status, 200, "[{}] {}", e.d(), r.text());
        assert_eq!(r.json()["object"], "chat.completion");
        let up = e.mock.requests().pop().unwrap();
        check_forwarded(&up, e.d(), &e.target_host());
        assert_eq!(up.body, b.as_bytes());
        // Still keep-alive: a second request on the same connection works.
        c.send(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.response().unwrap().status, 200);

        // Over the limit: 413 and no 100.
        let raw = format!("{R}Expect: 100-continue\r\nContent-Length: 2000000\r\n\r\n");
        e.reject("Expect over the limit", raw.as_bytes(), 413);

        // An expectation the gateway cannot meet.
        let raw = format!("{R}Expect: foo\r\nContent-Length: {}\r\n\r\n", b.len());
        e.reject("Expect: foo", raw.as_bytes(), 417);
        assert_eq!(e.seen(), 1);
    });
}

#[test]
fn p33_expect_with_immediate_body_and_pipelined_get() {
    each_driver(|e| {
        let b = body();
        let raw = format!(
            "{R}Expect: 100-continue\r\nContent-Length: {}\r\n\r\n{b}GET /health HTTP/1.1\r\nHost: a\r\n\r\n",
            b.len()
        );
        let mut c = Conn::open(e.addr());
        c.send(raw.as_bytes());
        let r1 = c.final_response();
        assert_eq!(r1.status, 200, "[{}] {}", e.d(), r1.text());
        assert_eq!(r1.json()["object"], "chat.completion");
        let r2 = c.final_response();
        assert_eq!(
            r2.status,
            200,
            "[{}] the GET must parse as a request",
            e.d()
        );
        assert_eq!(r2.json()["status"], "ok");
        let reqs = e.mock.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].body, b.as_bytes());
        // Same, chunked.
        let mut raw =
            format!("{R}Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
        raw.extend_from_slice(&chunked(b.as_bytes(), 40));
        raw.extend_from_slice(b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let mut c = Conn::open(e.addr());
        c.send(&raw);
        assert_eq!(c.final_response().status, 200);
        let r2 = c.final_response();
        assert_eq!(r2.json()["status"], "ok");
        c.expect_close(e.d());
        assert_eq!(e.seen(), 2);
    });
}

#[test]
fn p34_http10_responses_are_never_chunked() {
    each_driver(|e| {
        let mut c = Conn::open(e.addr());
        c.send(b"GET /health HTTP/1.0\r\n\r\n");
        let r = c.response().unwrap();
        assert_eq!(r.status, 200);
        assert!(
            !r.chunked && !r.close_delimited,
            "[{}] {:?}",
            e.d(),
            r.headers
        );
        assert_eq!(r.header("content-length"), Some("15"));
        assert_eq!(r.json()["status"], "ok");
        c.expect_close(e.d());

        // A streaming completion over HTTP/1.0: not chunked, ended by the close.
        let b = chat_body(true);
        let raw = format!(
            "POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        let mut c = Conn::open(e.addr());
        c.send(raw.as_bytes());
        let r = c.response().unwrap();
        assert_eq!(r.status, 200, "[{}] {}", e.d(), r.text());
        assert!(!r.chunked, "[{}] chunked reply to HTTP/1.0", e.d());
        assert!(r.header("transfer-encoding").is_none());
        let events = sse_events(&r.body);
        assert_eq!(events.last().unwrap().1, "[DONE]");
        c.expect_close(e.d());
        assert_eq!(e.seen(), 1);
    });
}

// ---------------------------------------------------------------------------------------
// Ported desync payloads (http_desync_guardian severe.yaml, HTTP Garden)
// ---------------------------------------------------------------------------------------

#[test]
fn x_content_length_with_leading_zeros_is_a_number() {
    each_driver(|e| {
        let b = body();
        let raw = format!("{R}Content-Length: 000{}\r\n\r\n{b}", b.len());
        let (_, up) = e.accept("CL 000n", raw.as_bytes());
        assert_eq!(up.body, b.as_bytes());
    });
}

#[test]
fn x_content_length_not_decimal_digits() {
    each_driver(|e| {
        for v in ["1e3", "-0", "5.0", "٥", "5\t5", "0x00"] {
            let raw = format!("{R}Content-Length: {v}\r\n\r\nhello");
            e.reject(&format!("CL {v:?}"), raw.as_bytes(), 400);
        }
    });
}

#[test]
fn x_content_length_does_not_wrap_at_32_bits() {
    each_driver(|e| {
        let raw = format!("{R}Content-Length: 4294967301\r\n\r\nhello");
        e.reject("CL 2^32+5", raw.as_bytes(), 413);
    });
}

#[test]
fn x_transfer_encoding_identity_and_other_codings() {
    each_driver(|e| {
        let raw = format!("{R}Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello");
        e.reject("TE identity + CL", raw.as_bytes(), 400);
        let raw = format!("{R}Transfer-Encoding: identity\r\n\r\n");
        e.reject("TE identity", raw.as_bytes(), 400);
        let raw = format!(
            "{R}Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n"
        );
        e.reject("TE chunked + TE identity", raw.as_bytes(), 400);
        let raw = format!("{R}Transfer-Encoding: \"chunked\"\r\n\r\n0\r\n\r\n");
        e.reject("TE quoted chunked", raw.as_bytes(), 400);
    });
}

#[test]
fn x_chunked_with_content_length_zero() {
    each_driver(|e| {
        let raw = format!(
            "{R}Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        e.reject("TE chunked + CL 0", raw.as_bytes(), 400);
    });
}

#[test]
fn x_transfer_coding_names_are_case_insensitive() {
    each_driver(|e| {
        let b = body();
        let mut raw = format!("{R}Transfer-Encoding: Chunked \r\n\r\n").into_bytes();
        // Sizes with leading zeros and upper-case hex are valid too.
        raw.extend_from_slice(format!("000{:X}\r\n{b}\r\n0000\r\n\r\n", b.len()).as_bytes());
        let (_, up) = e.accept("TE `Chunked `", &raw);
        assert_eq!(up.body, b.as_bytes());
    });
}

#[test]
fn x_nul_and_controls_in_the_request_line() {
    each_driver(|e| {
        e.reject(
            "NUL in target",
            b"GET /hea\x00lth HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "NUL after version",
            b"GET /health HTTP/1.1\x00\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "tab separator",
            b"GET\t/health HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "DEL in target",
            b"GET /hea\x7flth HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
    });
}

#[test]
fn x_request_line_spacing_and_version_case() {
    each_driver(|e| {
        e.reject(
            "two spaces",
            b"GET  /health HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "two spaces before version",
            b"GET /health  HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "trailing space",
            b"GET /health HTTP/1.1 \r\nHost: a\r\n\r\n",
            400,
        );
        e.reject(
            "lowercase version",
            b"GET /health http/1.1\r\nHost: a\r\n\r\n",
            400,
        );
    });
}

#[test]
fn x_space_or_junk_around_header_names() {
    each_driver(|e| {
        let b = body();
        for h in [
            "X-Foo : bar",
            "Content-Length : 2",
            "X-Foo\t: bar",
            "No colon here",
            "Host : a",
        ] {
            let raw = format!("{R}{h}\r\nContent-Length: {}\r\n\r\n{b}", b.len());
            e.reject(&format!("header {h:?}"), raw.as_bytes(), 400);
        }
        let raw = format!("{R}host: b\r\nContent-Length: {}\r\n\r\n{b}", b.len());
        e.reject("Host + host", raw.as_bytes(), 400);
    });
}

#[test]
fn x_absolute_form_https_is_routed_by_the_configuration() {
    each_driver(|e| {
        let b = body();
        let raw = format!(
            "POST https://evil.example:8443/v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        let (_, up) = e.accept("absolute https", raw.as_bytes());
        assert_eq!(up.path, "/v1/chat/completions");
        assert!(up.headers.iter().all(|(_, v)| !v.contains("evil.example")));
    });
}

#[test]
fn x_chunk_framing_oddities() {
    each_driver(|e| {
        // Trailing whitespace after the size (no extension): not in the grammar.
        let raw = format!("{}5 \r\nhello\r\n0\r\n\r\n", chunked_head());
        e.reject("chunk size `5 `", raw.as_bytes(), 400);
        // A quoted extension hiding a CRLF: parsers that honour quotes disagree with those
        // that do not; a strict one ends the line at the CRLF and then sees bad data.
        let raw = format!("{}1;a=\"\r\nX\"\r\nY\r\n0\r\n\r\n", chunked_head());
        e.reject("quoted CRLF in extension", raw.as_bytes(), 400);
        // After the last chunk, a "request" is only a trailer line to a strict parser; one
        // ended by a bare LF is malformed framing (400), never a second request.
        let raw = format!("{}0\r\nGET /health HTTP/1.1\n\r\n", chunked_head());
        e.reject("bare LF in trailer", raw.as_bytes(), 400);
    });
}

#[test]
fn x_declared_chunk_over_the_limit_is_refused_at_once() {
    each_driver(|e| {
        // 1 GiB chunk announced; only its first bytes are sent.
        let raw = format!("{}40000000\r\nhello", chunked_head());
        let t = Instant::now();
        e.reject("chunk size over the limit", raw.as_bytes(), 413);
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "[{}] waited for the chunk data",
            e.d()
        );
    });
}

#[test]
fn x_smuggled_tail_is_the_next_request() {
    each_driver(|e| {
        // CL body followed by what a TE-honouring parser would see as body: here the tail
        // is a separate request and must be answered as one.
        let b = body();
        let raw = format!(
            "{R}Content-Length: {}\r\n\r\n{b}GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            b.len()
        );
        let mut c = Conn::open(e.addr());
        c.send(raw.as_bytes());
        assert_eq!(c.final_response().status, 200);
        let r2 = c.final_response();
        assert_eq!(r2.json()["object"], "list");
        c.expect_close(e.d());
        // Chunked body followed by a smuggled POST to a proxied path.
        let mut raw = chunked_head().into_bytes();
        raw.extend_from_slice(&chunked(b.as_bytes(), 64));
        raw.extend_from_slice(b"GET /nope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let mut c = Conn::open(e.addr());
        c.send(&raw);
        assert_eq!(c.final_response().status, 200);
        let r2 = c.final_response();
        assert_eq!(r2.status, 404);
        assert_openai_error(&r2.body, e.d());
        c.expect_close(e.d());
        let reqs = e.mock.requests();
        assert_eq!(
            reqs.len(),
            2,
            "[{}] each forwarded message is one request",
            e.d()
        );
        for up in &reqs {
            assert_eq!(up.body, b.as_bytes());
        }
    });
}

#[test]
fn x_request_content_encoding_is_refused() {
    each_driver(|e| {
        let b = body();
        let raw = format!(
            "{R}Content-Encoding: gzip\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        e.reject("Content-Encoding gzip", raw.as_bytes(), 415);
    });
}

#[test]
fn x_request_split_across_many_reads() {
    // Regression: a monoio read into a Vec fills it from index 0, so a head or body that
    // arrived in several reads used to be overwritten (408s and bogus 400/414s).
    each_driver(|e| {
        let b = body();
        let raw = format!(
            "{R}X-Pad: {}\r\nContent-Length: {}\r\n\r\n{b}",
            "p".repeat(100),
            b.len()
        );
        let raw = raw.as_bytes();
        let before = e.seen();
        let mut c = Conn::open(e.addr());
        for piece in raw.chunks(raw.len() / 5 + 1) {
            c.send(piece);
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = c.final_response();
        assert_eq!(r.status, 200, "[{}] {}", e.d(), r.text());
        let reqs = e.mock.requests();
        assert_eq!(reqs.len(), before + 1);
        assert_eq!(reqs.last().unwrap().body, b.as_bytes());
        // Chunked, one chunk per write, on the same connection.
        let mut parts = vec![chunked_head().into_bytes()];
        for piece in b.as_bytes().chunks(40) {
            let mut c = format!("{:x}\r\n", piece.len()).into_bytes();
            c.extend_from_slice(piece);
            c.extend_from_slice(b"\r\n");
            parts.push(c);
        }
        parts.push(b"0\r\n\r\n".to_vec());
        for p in &parts {
            c.send(p);
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = c.final_response();
        assert_eq!(r.status, 200, "[{}] {}", e.d(), r.text());
        let up = e.mock.requests().pop().unwrap();
        check_forwarded(&up, e.d(), &e.target_host());
        assert_eq!(up.body, b.as_bytes());
    });
}

// ---------------------------------------------------------------------------------------
// Host, fragments, header names (RFC 9112 §3.2, RFC 3986; nginx's underscores_in_headers)
// ---------------------------------------------------------------------------------------

#[test]
fn p37_invalid_host_values_are_refused() {
    each_driver(|e| {
        let b = body();
        for host in [
            "user@a",
            "user:secret@a",
            "a b",
            "a/path",
            "a,b",
            "a, b",
            "a:b",
            "a:99999999",
            "[::1",
            "a%zz",
        ] {
            let raw = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            );
            let r = e.reject(&format!("Host: {host}"), raw.as_bytes(), 400);
            assert!(
                r.text().contains("invalid Host"),
                "[{}] {host}: {}",
                e.d(),
                r.text()
            );
        }
        // Valid forms are served.
        for host in [
            "a",
            "a:8080",
            "10.1.2.3:80",
            "[::1]:8000",
            "api.example.com",
        ] {
            let b = body();
            let raw = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            );
            e.accept(&format!("Host: {host}"), raw.as_bytes());
        }
    });
}

#[test]
fn p38_a_fragment_in_the_target_is_refused() {
    each_driver(|e| {
        let b = body();
        for target in [
            "/v1/chat/completions#x",
            "/v1/chat/completions?a=1#/../../admin",
            "http://h/v1/chat/completions#f",
        ] {
            let raw = format!(
                "POST {target} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            );
            let r = e.reject(target, raw.as_bytes(), 400);
            assert!(
                r.text().contains("fragment"),
                "[{}] {target}: {}",
                e.d(),
                r.text()
            );
        }
        let r = e.reject(
            "GET with a fragment",
            b"GET /health#x HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        );
        assert!(r.text().contains("fragment"), "{}", r.text());
    });
}

#[test]
fn p39_underscore_header_names_are_dropped_by_default() {
    each_driver(|e| {
        // Beside a Content-Length, a `Transfer_Encoding` that a hop mapping `_` to `-` would
        // read as chunked: neither read here nor forwarded.
        let b = body();
        let raw = format!(
            "{R}Transfer_Encoding: chunked\r\nX_Custom: 1\r\nX-Kept: yes\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        );
        let (r, up) = e.accept("underscore names", raw.as_bytes());
        assert_eq!(r.json()["object"], "chat.completion");
        for (n, _) in &up.headers {
            assert!(!n.contains('_'), "[{}] `{n}` forwarded", e.d());
        }
        assert_eq!(up.header("x-kept"), Some("yes"));
        assert_eq!(up.body, b.as_bytes());
        check_forwarded(&up, e.d(), &e.target_host());
    });
}

#[test]
fn p39_underscore_header_names_refused_or_forwarded_as_configured() {
    for d in drivers() {
        let m = mock("a", |_| {});
        for (choice, status) in [("reject", 400), ("forward", 200)] {
            let text = format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\ndriver = \"{}\"\nunderscores_in_headers = \"{choice}\"\n[log]\naccess = \"off\"\n{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
                driver_name(d),
                target("t0", m.addr(), "")
            );
            let g = Gateway::start(rolter::config::load_str(&text, "<test>").unwrap()).unwrap();
            let before = m.requests().len();
            let mut c = Conn::open(g.local_addr());
            c.send(&valid_post("X_Custom: 1\r\nConnection: close\r\n"));
            let r = c.response().unwrap();
            assert_eq!(
                r.status,
                status,
                "[{}] {choice}: {}",
                driver_name(d),
                r.text()
            );
            if choice == "forward" {
                let up = m.requests().pop().unwrap();
                assert_eq!(up.header("x_custom"), Some("1"), "[{}]", driver_name(d));
            } else {
                assert!(r.text().contains("underscore"), "{}", r.text());
                c.expect_close(&format!("[{}] reject", driver_name(d)));
                assert_eq!(m.requests().len(), before);
            }
        }
    }
}
