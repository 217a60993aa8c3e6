//! TLS to upstreams, under both drivers: a local HTTPS engine with a certificate from a CA
//! generated at test time, trusted through the target's `ca_file`. Non-streaming and SSE
//! answers arrive intact (the stream re-framed by the gateway), the configured headers reach
//! the engine, one TLS connection carries sequential requests, connections the engine closed
//! are not reused, and an untrusted certificate or a stalled handshake fails the request with
//! an OpenAI-shaped error.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

/// A CA and a `localhost` server certificate it signed, written to a temp dir.
struct Pki {
    dir: PathBuf,
    ca_file: PathBuf,
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

impl Pki {
    fn new() -> Pki {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "rolter test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let leaf_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();

        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("rolter-tls-test-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        Pki {
            dir,
            ca_file,
            chain: vec![leaf.der().clone()],
            key: leaf_key.serialize_der(),
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the engine saw.
#[derive(Default)]
struct Seen {
    accepts: AtomicUsize,
    requests: AtomicUsize,
    authorization: Mutex<Vec<String>>,
    host: Mutex<Vec<String>>,
    alpn: Mutex<Vec<Option<Vec<u8>>>>,
    /// The request bodies, in arrival order.
    bodies: Mutex<Vec<Vec<u8>>>,
}

/// A minimal HTTPS engine on std threads: keep-alive HTTP/1.1, a JSON chat completion, or a
/// chunked SSE stream when the body asks for `"stream":true`.
struct TlsEngine {
    addr: SocketAddr,
    seen: Arc<Seen>,
}

const SSE_EVENTS: &[&str] = &[
    r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
    r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
    r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    "[DONE]",
];

const COMPLETION: &str = r#"{"id":"c0","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello over TLS"},"finish_reason":"stop"}]}"#;

/// How the engine ends its responses.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Framed responses on a keep-alive connection.
    KeepAlive,
    /// Every response is followed by close_notify and a close, without `connection: close`,
    /// so the gateway pools a connection that is about to die.
    CloseAfter,
    /// Streams are close-delimited (no framing); the end is a close with or without a TLS
    /// close_notify first.
    CloseDelimited { notify: bool },
}

impl TlsEngine {
    /// Binds where `localhost` resolves (the gateway connects there).
    fn spawn(pki: &Pki, mode: Mode) -> TlsEngine {
        let ip = ("localhost", 0)
            .to_socket_addrs()
            .unwrap()
            .next()
            .unwrap()
            .ip();
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                pki.chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.key.clone())),
            )
            .unwrap();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        let seen = Arc::new(Seen::default());
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                seen2.accepts.fetch_add(1, Ordering::SeqCst);
                let cfg = cfg.clone();
                let seen = seen2.clone();
                std::thread::spawn(move || serve(cfg, tcp, &seen, mode));
            }
        });
        TlsEngine { addr, seen }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }
}

fn serve(cfg: Arc<ServerConfig>, tcp: TcpStream, seen: &Seen, mode: Mode) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(conn) = ServerConnection::new(cfg) else {
        return;
    };
    let mut tls = StreamOwned::new(conn, tcp);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // One request head (and its Content-Length body).
        let (head_len, content_length, stream) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                let mut cl = 0usize;
                for h in req.headers.iter() {
                    let v = String::from_utf8_lossy(h.value).to_string();
                    if h.name.eq_ignore_ascii_case("content-length") {
                        cl = v.trim().parse().unwrap();
                    } else if h.name.eq_ignore_ascii_case("authorization") {
                        seen.authorization.lock().unwrap().push(v);
                    } else if h.name.eq_ignore_ascii_case("host") {
                        seen.host.lock().unwrap().push(v);
                    }
                }
                break (n, cl, false);
            }
            let mut chunk = [0u8; 4096];
            match tls.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        while buf.len() < head_len + content_length {
            let mut chunk = [0u8; 4096];
            match tls.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let raw_body = buf[head_len..head_len + content_length].to_vec();
        let body = String::from_utf8_lossy(&raw_body).to_string();
        seen.bodies.lock().unwrap().push(raw_body);
        buf.drain(..head_len + content_length);
        let stream = stream || body.replace(' ', "").contains("\"stream\":true");
        seen.requests.fetch_add(1, Ordering::SeqCst);
        seen.alpn
            .lock()
            .unwrap()
            .push(tls.conn.alpn_protocol().map(|p| p.to_vec()));

        let ok = if let (true, Mode::CloseDelimited { notify }) = (stream, mode) {
            let mut resp =
                String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n");
            for e in SSE_EVENTS {
                resp.push_str(&format!("data: {e}\n\n"));
            }
            let _ = tls.write_all(resp.as_bytes()).and_then(|_| tls.flush());
            if notify {
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
            std::thread::sleep(Duration::from_millis(20));
            let _ = tls.sock.shutdown(std::net::Shutdown::Both);
            return;
        } else if stream {
            write_sse(&mut tls)
        } else {
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{COMPLETION}",
                COMPLETION.len()
            );
            tls.write_all(resp.as_bytes()).and_then(|_| tls.flush())
        };
        if ok.is_err() {
            return;
        }
        if mode == Mode::CloseAfter {
            tls.conn.send_close_notify();
            let _ = tls.flush();
            let _ = tls.sock.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// A chunked SSE answer, each event flushed on its own; the second event is split across
/// two chunks so the gateway has to re-frame rather than copy chunk boundaries.
fn write_sse(tls: &mut StreamOwned<ServerConnection, TcpStream>) -> std::io::Result<()> {
    tls.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    tls.flush()?;
    for (i, e) in SSE_EVENTS.iter().enumerate() {
        let event = format!("data: {e}\n\n");
        let parts: Vec<&str> = if i == 1 {
            let (a, b) = event.split_at(10);
            vec![a, b]
        } else {
            vec![&event]
        };
        for p in parts {
            tls.write_all(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes())?;
            tls.flush()?;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    tls.write_all(b"0\r\n\r\n")?;
    tls.flush()
}

const API_KEY: &str = "Bearer sk-tls-test";

/// A gateway with one TLS target on `port`; `ca` is the `ca_file` line (or empty).
fn tls_gateway(driver: rolter::config::DriverChoice, port: u16, ca: &str) -> rolter::Gateway {
    gateway(
        driver,
        &format!(
            r#"[[targets]]
name = "tls"
url = "https://localhost:{port}/v1"
models = ["m"]
{ca}
headers = {{ "Authorization" = "{API_KEY}" }}
[targets.timeouts]
connect = "2s"
first_byte = "5s"
idle = "5s"
[[routes]]
name = "r"
targets = ["tls"]
retries = 0
"#
        ),
    )
}

fn ca_line(pki: &Pki) -> String {
    format!("ca_file = {:?}", pki.ca_file.display().to_string())
}

#[test]
fn completion_and_stream_over_one_tls_connection() {
    let pki = Pki::new();
    for driver in drivers() {
        let engine = TlsEngine::spawn(&pki, Mode::KeepAlive);
        let gw = tls_gateway(driver, engine.port(), &ca_line(&pki));
        let addr = gw.local_addr();
        let name = driver_name(driver);

        // Non-streaming.
        let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(r.text(), COMPLETION, "{name}");
        assert_eq!(r.header("x-rolter-target"), Some("tls"), "{name}");

        // Streaming: every event intact and in order, re-framed as the client's chunks.
        let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(true)));
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert!(
            r.chunked,
            "{name}: the gateway re-frames the stream as chunked"
        );
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream"),
            "{name}"
        );
        let events: Vec<String> = sse_events(&r.body).into_iter().map(|(_, d)| d).collect();
        assert_eq!(events, SSE_EVENTS, "{name}");
        let expected: String = SSE_EVENTS
            .iter()
            .map(|e| format!("data: {e}\n\n"))
            .collect();
        assert_eq!(r.text(), expected, "{name}: payload bytes unchanged");

        // A third request: still the same TLS connection.
        let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{name}");
        assert_eq!(engine.seen.requests.load(Ordering::SeqCst), 3, "{name}");
        assert_eq!(
            engine.seen.accepts.load(Ordering::SeqCst),
            1,
            "{name}: sequential requests reuse one TLS connection"
        );

        // A large body (written from the client's read buffer, in parts) arrives whole.
        let big = chat_body(false).replace("Hello there", &"long prompt ".repeat(200 * 1024 / 12));
        let r = call(addr, &post("/v1/chat/completions", &[], &big));
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        let bodies = engine.seen.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 4, "{name}");
        assert!(
            bodies[3] == big.as_bytes(),
            "{name}: the large body differs"
        );

        // The configured credentials, Host and ALPN reached the engine.
        let auth = engine.seen.authorization.lock().unwrap().clone();
        assert_eq!(auth, vec![API_KEY; 4], "{name}");
        let host = engine.seen.host.lock().unwrap().clone();
        assert_eq!(host[0], format!("localhost:{}", engine.port()), "{name}");
        let alpn = engine.seen.alpn.lock().unwrap().clone();
        assert_eq!(alpn[0].as_deref(), Some(&b"http/1.1"[..]), "{name}");
        gw.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn connections_the_engine_closed_are_not_reused() {
    let pki = Pki::new();
    for driver in drivers() {
        let engine = TlsEngine::spawn(&pki, Mode::CloseAfter);
        let gw = tls_gateway(driver, engine.port(), &ca_line(&pki));
        let addr = gw.local_addr();
        let name = driver_name(driver);
        for i in 0..3 {
            let stream = i % 2 == 1;
            let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(stream)));
            assert_eq!(r.status, 200, "{name} request {i}: {}", r.text());
            if i == 0 {
                // Let the close_notify arrive before the next request: the pool's liveness
                // check must discard the connection.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        assert_eq!(engine.seen.requests.load(Ordering::SeqCst), 3, "{name}");
        assert_eq!(engine.seen.accepts.load(Ordering::SeqCst), 3, "{name}");
        gw.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn close_delimited_stream_needs_close_notify() {
    let pki = Pki::new();
    for driver in drivers() {
        let name = driver_name(driver);
        // With close_notify: a complete answer, re-chunked, with the terminal chunk.
        let engine = TlsEngine::spawn(&pki, Mode::CloseDelimited { notify: true });
        let gw = tls_gateway(driver, engine.port(), &ca_line(&pki));
        let r = call(
            gw.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(true)),
        );
        assert_eq!(r.status, 200, "{name}");
        assert!(r.chunked, "{name}");
        let events: Vec<String> = sse_events(&r.body).into_iter().map(|(_, d)| d).collect();
        assert_eq!(events, SSE_EVENTS, "{name}");
        gw.shutdown(Duration::from_secs(1));

        // A bare TCP close may be a truncation: the stream ends with the error event and
        // without the terminal chunk.
        let engine = TlsEngine::spawn(&pki, Mode::CloseDelimited { notify: false });
        let gw = tls_gateway(driver, engine.port(), &ca_line(&pki));
        let mut c = Client::connect(gw.local_addr());
        c.send(&post("/v1/chat/completions", &[], &chat_body(true)));
        let (status, _) = c.head().unwrap();
        assert_eq!(status, 200, "{name}");
        let mut body = Vec::new();
        let ended = loop {
            match c.chunk() {
                Ok(Some(d)) => body.extend_from_slice(&d),
                Ok(None) => break "terminal chunk",
                Err(_) => break "close",
            }
        };
        assert_eq!(
            ended, "close",
            "{name}: no terminal chunk after a truncation"
        );
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("upstream_stream_interrupted"),
            "{name}: {text}"
        );
        gw.shutdown(Duration::from_secs(1));
    }
}

fn assert_openai_error(r: &Response, status: u16, code: &str, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert_eq!(e["code"], code, "{v}");
    assert_eq!(e["type"], "upstream_error", "{v}");
    assert!(e.get("param").is_some(), "{v}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(needle), "{msg}");
}

#[test]
fn untrusted_certificate_fails_with_502() {
    let pki = Pki::new();
    for driver in drivers() {
        let engine = TlsEngine::spawn(&pki, Mode::KeepAlive);
        // No ca_file: the public roots do not know the test CA.
        let gw = tls_gateway(driver, engine.port(), "");
        let r = call(
            gw.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(false)),
        );
        assert_openai_error(&r, 502, "upstream_tls_failed", "certificate");
        assert_eq!(engine.seen.requests.load(Ordering::SeqCst), 0);
        gw.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn wrong_ca_fails_with_502() {
    let pki = Pki::new();
    let other = Pki::new();
    for driver in drivers() {
        let engine = TlsEngine::spawn(&pki, Mode::KeepAlive);
        let gw = tls_gateway(driver, engine.port(), &ca_line(&other));
        let r = call(
            gw.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(true)),
        );
        assert_openai_error(&r, 502, "upstream_tls_failed", "certificate");
        assert_eq!(engine.seen.requests.load(Ordering::SeqCst), 0);
        gw.shutdown(Duration::from_secs(1));
    }
}

#[test]
fn stalled_handshake_is_a_connect_timeout() {
    let pki = Pki::new();
    for driver in drivers() {
        // Accepts TCP and never answers the ClientHello.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(2));
            drop(s);
        });
        let gw = gateway(
            driver,
            &format!(
                r#"[[targets]]
name = "tls"
url = "https://127.0.0.1:{port}"
models = ["m"]
{}
[targets.timeouts]
connect = "300ms"
"#,
                ca_line(&pki)
            ),
        );
        let started = std::time::Instant::now();
        let r = call(
            gw.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(false)),
        );
        assert_openai_error(&r, 504, "upstream_connect_timeout", "TLS handshake");
        assert!(started.elapsed() < Duration::from_secs(2));
        gw.shutdown(Duration::from_secs(1));
        held.join().unwrap();
    }
}
