//! Client-side TLS (`[server.tls]`), under both drivers, with certificates from a CA made at
//! test time: curl completes a chat completion and a stream over TLS 1.2 and 1.3; a
//! TLS-1.3-only listener refuses a TLS 1.2 client; the client's SNI name picks the
//! certificate; the gateway ends its sessions with close_notify, and an answer cut
//! mid-way without it (a truncation the client can tell); a client that never
//! handshakes is closed after `handshake_timeout`, and plaintext HTTP sent to the TLS port
//! is closed without an HTTP answer, each counted by reason; a reload with a new
//! certificate leaves an open connection working while a new one gets the new certificate.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::scripted::{Reply, Then, Upstream};
use common::*;
use rolter::config::{self, DriverChoice};
use rolter::Gateway;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// A CA and the certificates it signed, written as PEM files to a temp dir.
struct Pki {
    dir: PathBuf,
    ca_cert: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "rolter client-tls test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("rolter-client-tls-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki {
            dir,
            ca_cert: ca.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A leaf for `names` written as `<stem>.pem` and `<stem>.key`; returns its DER.
    fn leaf(&self, stem: &str, names: &[&str]) -> CertificateDer<'static> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        std::fs::write(self.dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
        std::fs::write(self.dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn roots(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_cert.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(cfg)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The configuration of a gateway serving TLS with `<stem>.pem` in front of `mock`, with
/// `tls_extra` in `[server.tls]` and an admin listener.
fn config_text(
    d: DriverChoice,
    pki: &Pki,
    stem: &str,
    tls_extra: &str,
    mock: SocketAddr,
) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\ndriver = \"{}\"\n\
         shutdown_grace = \"2s\"\n{TEST_LIMITS}\n\
         [server.tls]\ncert_file = {:?}\nkey_file = {:?}\n{tls_extra}\n\
         [log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}",
        driver_name(d),
        pki.path(&format!("{stem}.pem")),
        pki.path(&format!("{stem}.key")),
        target("a", mock, "")
    )
}

fn start(text: &str) -> Gateway {
    let cfg = config::load_str(text, "<test>").unwrap_or_else(|e| panic!("{e}\n{text}"));
    Gateway::start(cfg).expect("start gateway")
}

/// curl over TLS to the gateway at `addr` (as `localhost`); returns (exit ok, stdout, stderr).
fn curl(pki: &Pki, addr: SocketAddr, body: &str, extra: &[&str]) -> (bool, String, String) {
    let url = format!("https://localhost:{}/v1/chat/completions", addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", addr.port());
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "20", "--cacert"])
        .arg(pki.ca_file())
        .args([
            "--resolve",
            &resolve,
            "-H",
            "content-type: application/json",
            "-d",
            body,
        ])
        .args(extra)
        .arg(&url)
        .output()
        .expect("curl runs (tests/run.sh installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits (bounded) until the admin series reaches `want`.
fn wait_series(g: &Gateway, series: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = admin_series(g, series);
        if v == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {v:?}, expected {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `addr` with SNI `name` (an IP address sends no SNI).
fn connect(pki: &Pki, addr: SocketAddr, name: &str) -> Tls {
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    let conn = ClientConnection::new(pki.roots(), name).unwrap();
    let mut s = StreamOwned::new(conn, sock);
    // Drive the handshake.
    s.flush().unwrap();
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    s
}

fn peer_leaf(s: &Tls) -> CertificateDer<'static> {
    s.conn.peer_certificates().unwrap()[0].clone()
}

/// One chat completion on `s`; returns the status line and the body.
fn chat(s: &mut Tls, close: bool) -> (String, String) {
    post_chat(s, &chat_body(false), close)
}

/// `body` posted to the chat endpoint on `s`; the status line and the response body.
fn post_chat(s: &mut Tls, body: &str, close: bool) -> (String, String) {
    let conn = if close { "connection: close\r\n" } else { "" };
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n{conn}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.flush().unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "head cut: {buf:?}");
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .expect("content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (
        head.lines().next().unwrap().to_string(),
        String::from_utf8(body).unwrap(),
    )
}

#[test]
fn curl_completes_a_chat_and_a_stream_over_tls_1_2_and_1_3() {
    let pki = Pki::new();
    pki.leaf("srv", &["localhost"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = start(&config_text(d, &pki, "srv", "", m.addr()));
        let addr = g.local_addr();
        for (flags, version) in [
            (&["--tlsv1.2", "--tls-max", "1.2"][..], "TLSv1.2"),
            (&["--tlsv1.3"][..], "TLSv1.3"),
        ] {
            let ctx = format!("{} {version}", driver_name(d));
            let (ok, out, err) = curl(&pki, addr, &chat_body(false), flags);
            assert!(ok, "{ctx}: {err}");
            assert!(
                err.contains(&format!("SSL connection using {version}")),
                "{ctx}: {err}"
            );
            assert!(
                err.contains("ALPN: server accepted http/1.1"),
                "{ctx}: {err}"
            );
            let v: serde_json::Value =
                serde_json::from_str(&out).unwrap_or_else(|e| panic!("{ctx}: {e}: {out}"));
            assert_eq!(v["object"], "chat.completion", "{ctx}: {out}");
            let (ok, out, err) = curl(&pki, addr, &chat_body(true), flags);
            assert!(ok, "{ctx}: {err}");
            assert!(out.contains("\"chat.completion.chunk\""), "{ctx}: {out}");
            assert!(out.trim_end().ends_with("data: [DONE]"), "{ctx}: {out}");
        }
        wait_series(&g, "rolter_tls_handshakes_total{version=\"1.2\"}", 2.0);
        wait_series(&g, "rolter_tls_handshakes_total{version=\"1.3\"}", 2.0);
        g.shutdown(SHORT);
    }
}

#[test]
fn a_tls_1_3_only_listener_refuses_tls_1_2() {
    let pki = Pki::new();
    pki.leaf("srv", &["localhost"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = start(&config_text(
            d,
            &pki,
            "srv",
            "min_version = \"1.3\"",
            m.addr(),
        ));
        let (ok, _, err) = curl(
            &pki,
            g.local_addr(),
            &chat_body(false),
            &["--tlsv1.2", "--tls-max", "1.2"],
        );
        assert!(
            !ok,
            "{}: a TLS 1.2 client was served: {err}",
            driver_name(d)
        );
        let (ok, _, err) = curl(&pki, g.local_addr(), &chat_body(false), &["--tlsv1.3"]);
        assert!(ok, "{}: {err}", driver_name(d));
        wait_series(
            &g,
            "rolter_tls_handshake_failures_total{reason=\"incompatible\"}",
            1.0,
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn sni_picks_the_certificate_and_sessions_end_with_close_notify() {
    let pki = Pki::new();
    let default = pki.leaf("srv", &["localhost"]);
    let api = pki.leaf("api", &["api.test"]);
    let wild = pki.leaf("wild", &["x.wild.test"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let extra = format!(
            "[[server.tls.sni]]\nnames = [\"api.test\"]\ncert_file = {:?}\nkey_file = {:?}\n\
             [[server.tls.sni]]\nnames = [\"*.wild.test\"]\ncert_file = {:?}\nkey_file = {:?}\n",
            pki.path("api.pem"),
            pki.path("api.key"),
            pki.path("wild.pem"),
            pki.path("wild.key"),
        );
        let g = start(&config_text(d, &pki, "srv", &extra, m.addr()));
        let addr = g.local_addr();
        let ctx = driver_name(d);
        for (name, want) in [
            ("api.test", &api),
            ("x.wild.test", &wild),
            ("localhost", &default),
        ] {
            let mut s = connect(&pki, addr, name);
            assert_eq!(&peer_leaf(&s), want, "{ctx}: SNI {name}");
            assert_eq!(
                s.conn.alpn_protocol(),
                None,
                "{ctx}: no ALPN offered, none chosen"
            );
            let (status, body) = chat(&mut s, true);
            assert!(status.starts_with("HTTP/1.1 200"), "{ctx}: {status}");
            assert!(body.contains("chat.completion"), "{ctx}: {body}");
            // The gateway closes the session with close_notify: a clean end, not an
            // `UnexpectedEof` (which rustls reports for a TCP close without it).
            let mut rest = Vec::new();
            s.read_to_end(&mut rest)
                .unwrap_or_else(|e| panic!("{ctx}: {name}: no close_notify: {e}"));
            assert!(rest.is_empty(), "{ctx}: {rest:?}");
        }
        // No SNI (an IP address): the default certificate.
        let mut s = {
            let sock = TcpStream::connect(addr).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let mut cfg = (*pki.roots()).clone();
            cfg.enable_sni = false;
            let conn =
                ClientConnection::new(Arc::new(cfg), ServerName::try_from("localhost").unwrap())
                    .unwrap();
            StreamOwned::new(conn, sock)
        };
        let (status, _) = chat(&mut s, false);
        assert!(status.starts_with("HTTP/1.1 200"), "{ctx}: {status}");
        assert_eq!(peer_leaf(&s), default, "{ctx}: no SNI");
        g.shutdown(SHORT);
    }
}

/// Reads until the gateway closes; returns what arrived (a read error counts as closed).
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                panic!("the gateway kept the connection open")
            }
            Err(_) => return got,
        }
    }
}

#[test]
fn no_handshake_and_plaintext_http_are_closed_and_counted() {
    let pki = Pki::new();
    pki.leaf("srv", &["localhost"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = start(&config_text(
            d,
            &pki,
            "srv",
            "handshake_timeout = \"500ms\"",
            m.addr(),
        ));
        let addr = g.local_addr();
        let ctx = driver_name(d);
        // Connects and says nothing: closed once the handshake timeout passes (the read
        // timeout is only a bound on a hung test).
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        assert!(read_until_closed(&mut idle).is_empty(), "{ctx}");
        wait_series(
            &g,
            "rolter_tls_handshake_failures_total{reason=\"timeout\"}",
            1.0,
        );
        // Plaintext HTTP to the TLS port: no HTTP answer, at most a TLS alert, then closed.
        let mut plain = TcpStream::connect(addr).unwrap();
        plain
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let body = chat_body(false);
        // The gateway may close before the whole request is written (it needs only the
        // first bytes to tell): a failed write is part of the expected outcome.
        let _ = write!(
            plain,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let got = read_until_closed(&mut plain);
        assert!(!got.starts_with(b"HTTP/"), "{ctx}: {got:?}");
        assert!(
            got.is_empty() || got[0] == 0x15,
            "{ctx}: not a TLS alert: {got:?}"
        );
        wait_series(
            &g,
            "rolter_tls_handshake_failures_total{reason=\"not_tls\"}",
            1.0,
        );
        // A client that goes away mid-handshake.
        let mut half = TcpStream::connect(addr).unwrap();
        let _ = half.write_all(&[0x16, 0x03, 0x01, 0x00, 0x40]);
        drop(half);
        wait_series(
            &g,
            "rolter_tls_handshake_failures_total{reason=\"closed\"}",
            1.0,
        );
        // The gateway still serves.
        let (ok, _, err) = curl(&pki, addr, &chat_body(false), &[]);
        assert!(ok, "{ctx}: {err}");
        g.shutdown(SHORT);
    }
}

#[test]
fn a_reload_with_a_new_certificate_serves_new_connections_and_keeps_open_ones() {
    let pki = Pki::new();
    let old = pki.leaf("old", &["localhost"]);
    let new = pki.leaf("new", &["localhost"]);
    let bad = Path::new(&pki.path("bad.pem")).to_path_buf();
    std::fs::write(&bad, "not a certificate\n").unwrap();
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = start(&config_text(d, &pki, "old", "", m.addr()));
        let addr = g.local_addr();
        let ctx = driver_name(d);
        let mut before = connect(&pki, addr, "localhost");
        assert_eq!(peer_leaf(&before), old, "{ctx}");
        assert!(
            chat(&mut before, false).0.starts_with("HTTP/1.1 200"),
            "{ctx}"
        );

        // A configuration whose certificate does not load is refused before any reload.
        let text = config_text(d, &pki, "old", "", m.addr())
            .replace(&pki.path("old.pem"), &bad.display().to_string());
        let errs = config::load_str(&text, "<test>").unwrap_err().to_string();
        assert!(
            errs.contains("server.tls.cert_file") && errs.contains("bad.pem"),
            "{ctx}: {errs}"
        );

        let cfg = config::load_str(&config_text(d, &pki, "new", "", m.addr()), "<test>").unwrap();
        g.reload_with(cfg).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        // The open connection keeps its session and is served on.
        let (status, _) = chat(&mut before, false);
        assert!(status.starts_with("HTTP/1.1 200"), "{ctx}: {status}");
        // A new one gets the new certificate.
        let mut after = connect(&pki, addr, "localhost");
        assert_eq!(peer_leaf(&after), new, "{ctx}");
        assert!(
            chat(&mut after, false).0.starts_with("HTTP/1.1 200"),
            "{ctx}"
        );

        // Turning TLS off is not a reload.
        let plain = config::load_str(
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\ndriver = \"{}\"\n{}",
                driver_name(d),
                target("a", m.addr(), "")
            ),
            "<test>",
        )
        .unwrap();
        let e = g.reload_with(plain).unwrap_err().to_string();
        assert!(e.contains("server.tls"), "{ctx}: {e}");
        assert!(
            chat(&mut before, false).0.starts_with("HTTP/1.1 200"),
            "{ctx}"
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn an_answer_cut_mid_way_ends_without_close_notify() {
    let pki = Pki::new();
    pki.leaf("srv", &["localhost"]);
    // The engine promises 100 bytes, sends 10 and closes.
    let up = Upstream::start(|_| {
        Reply::new(
            &b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"partial\""[..],
        )
        .then(Then::Close)
    });
    for d in drivers() {
        let g = start(&config_text(d, &pki, "srv", "", up.addr));
        let ctx = driver_name(d);
        let mut s = connect(&pki, g.local_addr(), "localhost");
        let body = chat_body(false);
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        s.flush().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let end = loop {
            match s.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break Err(e),
            }
        };
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{ctx}: {text}");
        assert!(text.ends_with("{\"partial\""), "{ctx}: {text}");
        let e = end.expect_err("a cut answer must not end with close_notify");
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{ctx}: {e}");
        g.shutdown(SHORT);
    }
}

#[test]
fn a_connection_over_max_connections_is_closed_before_any_handshake() {
    let pki = Pki::new();
    pki.leaf("srv", &["localhost"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let text = config_text(d, &pki, "srv", "", m.addr())
            .replace("workers = 1\n", "workers = 1\nmax_connections = 1\n");
        let g = start(&text);
        let ctx = driver_name(d);
        let mut held = connect(&pki, g.local_addr(), "localhost");
        assert!(
            chat(&mut held, false).0.starts_with("HTTP/1.1 200"),
            "{ctx}"
        );
        let mut over = TcpStream::connect(g.local_addr()).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        assert!(
            read_until_closed(&mut over).is_empty(),
            "{ctx}: no plaintext 503 on a TLS port"
        );
        wait_series(
            &g,
            "rolter_gateway_responses_total{status=\"503\",code=\"too_many_connections\"}",
            1.0,
        );
        assert!(
            chat(&mut held, false).0.starts_with("HTTP/1.1 200"),
            "{ctx}"
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn a_reload_whose_certificate_does_not_load_keeps_the_old_one_serving() {
    let pki = Pki::new();
    let old = pki.leaf("srv", &["localhost"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let file = pki.dir.join(format!("rolter-{}.toml", driver_name(d)));
        std::fs::write(&file, config_text(d, &pki, "srv", "", m.addr())).unwrap();
        let g = Gateway::start(config::load_file(&file).unwrap()).expect("start gateway");
        let ctx = driver_name(d);
        let good = std::fs::read(pki.dir.join("srv.pem")).unwrap();
        // The certificate file is replaced by something that is not one, and a reload asked.
        std::fs::write(
            pki.dir.join("srv.pem"),
            "-----BEGIN CERTIFICATE-----\ngarbage\n",
        )
        .unwrap();
        let e = g
            .reload()
            .expect_err("a reload with a broken certificate")
            .to_string();
        assert!(
            e.contains("server.tls.cert_file") && e.contains("srv.pem"),
            "{ctx}: {e}"
        );
        let mut s = connect(&pki, g.local_addr(), "localhost");
        assert_eq!(peer_leaf(&s), old, "{ctx}");
        assert!(chat(&mut s, false).0.starts_with("HTTP/1.1 200"), "{ctx}");
        std::fs::write(pki.dir.join("srv.pem"), good).unwrap();
        g.shutdown(SHORT);
    }
}

#[test]
fn a_large_body_arrives_whole_over_many_records() {
    let pki = Pki::new();
    pki.leaf("srv", &["localhost"]);
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = start(&config_text(d, &pki, "srv", "", m.addr()));
        let ctx = driver_name(d);
        let mut s = connect(&pki, g.local_addr(), "localhost");
        // 600 KiB: dozens of TLS records, read in pieces of every size.
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "x".repeat(600 * 1024)
        );
        let (status, _) = post_chat(&mut s, &body, false);
        assert!(status.starts_with("HTTP/1.1 200"), "{ctx}: {status}");
        // The engine received the body byte for byte.
        let seen = m.requests();
        let last = seen.last().expect("a recorded request");
        assert!(
            last.body == body.as_bytes(),
            "{ctx}: {} bytes arrived",
            last.body.len()
        );
        g.shutdown(SHORT);
    }
}
