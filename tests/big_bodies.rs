//! Large request bodies under both drivers: a body of at least `IN_PLACE_BODY_MIN` bytes goes
//! upstream from the connection's read buffer in one vectored write (head, body, and the
//! swapped model name between the body's parts), a smaller one copied after the head. What
//! each engine received is compared byte for byte: with and without a model swap, on both
//! sides of the threshold, pipelined with the next request, to an engine that reads slowly,
//! sent again whole on a retry, and abandoned mid-write by a first-byte timeout.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use rolter::config::DriverChoice;
use rolter::gateway::path::outgoing::IN_PLACE_BODY_MIN;
use rolter::Gateway;

/// Bodies up to 16 MiB: larger than the loopback socket buffers take at once (4 MiB at
/// most), so a write of one is cut short and waits for the engine to read.
const BIG: usize = 6 * 1024 * 1024;

/// A gateway on 127.0.0.1:0 with one worker under `d`, taking bodies up to 16 MiB.
fn gateway(d: DriverChoice, rest: &str) -> Gateway {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\n\
         driver = \"{}\"\nshutdown_grace = \"2s\"\n\
         [server.limits]\nmax_body_bytes = 16777216\nbody_timeout = \"10s\"\n\
         [log]\naccess = \"off\"\n{rest}",
        driver_name(d)
    );
    let cfg = rolter::config::load_str(&text, "<test>").unwrap_or_else(|e| panic!("{e}\n{text}"));
    Gateway::start(cfg).expect("start gateway")
}

/// A chat body of exactly `len` bytes, its model field first or last.
fn body_of(len: usize, model_last: bool) -> String {
    let (open, close) = if model_last {
        (
            r#"{"messages":[{"role":"user","content":""#,
            r#""}],"model":"m"}"#,
        )
    } else {
        (
            r#"{"model":"m","messages":[{"role":"user","content":""#,
            r#""}]}"#,
        )
    };
    let fill = len - open.len() - close.len();
    let text: String = (0..fill)
        .map(|i| (b'a' + ((i * 7 + i / 13) % 26) as u8) as char)
        .collect();
    let b = format!("{open}{text}{close}");
    assert_eq!(b.len(), len);
    b
}

fn chat_post(body: &str) -> String {
    post(
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body,
    )
}

#[test]
fn a_large_body_reaches_the_engine_byte_for_byte_with_or_without_a_model_swap() {
    for d in drivers() {
        let ctx = driver_name(d);
        let swapped = mock("swapped", |_| {});
        let plain = mock("plain", |_| {});
        let rest = format!(
            "{}[[targets]]\nname = \"tp\"\nurl = \"http://{}\"\nmodels = [\"n\"]\n\
             [[routes]]\nname = \"r\"\ntargets = [\"ts\"]\n\
             [[routes]]\nname = \"p\"\ntargets = [\"tp\"]\n[routes.match]\nmodels = [\"n\"]\n",
            target(
                "ts",
                swapped.addr(),
                "upstream_models = { \"m\" = \"upstream/m\" }"
            ),
            plain.addr()
        );
        let g = gateway(d, &rest);
        let sizes = [
            IN_PLACE_BODY_MIN - 1,
            IN_PLACE_BODY_MIN,
            64 * 1024 + 3,
            700 * 1024,
        ];
        for len in sizes {
            for model_last in [false, true] {
                let ctx = format!("{ctx}, {len} bytes, model last: {model_last}");
                let body = body_of(len, model_last);
                let before = swapped.requests().len();
                let r = call(g.local_addr(), &chat_post(&body));
                assert_eq!(r.status, 200, "{ctx}: {}", r.text());
                let got = swapped.requests();
                assert_eq!(got.len(), before + 1, "{ctx}");
                let want = body.replacen(r#""model":"m""#, r#""model":"upstream/m""#, 1);
                let seen = &got[before];
                assert!(seen.body == want.as_bytes(), "{ctx}: the body differs");
                assert_eq!(
                    seen.header("content-length"),
                    Some(want.len().to_string().as_str()),
                    "{ctx}"
                );

                let body = body.replacen(r#""model":"m""#, r#""model":"n""#, 1);
                let before = plain.requests().len();
                let r = call(g.local_addr(), &chat_post(&body));
                assert_eq!(r.status, 200, "{ctx}: {}", r.text());
                let got = plain.requests();
                assert!(got[before].body == body.as_bytes(), "{ctx}: unswapped");
            }
        }
    }
}

#[test]
fn a_request_pipelined_after_a_large_body_is_served_from_the_bytes_that_followed_it() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("a", |_| {});
        let g = gateway(
            d,
            &format!(
                "{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
                target("t0", m.addr(), "")
            ),
        );
        let big = body_of(200 * 1024, false);
        let small = body_of(300, true);
        let mut c = Client::connect(g.local_addr());
        // Both requests in one write, so the second one's bytes are read with the first's.
        c.send(&format!("{}{}", chat_post(&big), chat_post(&small)));
        for _ in 0..2 {
            let r = c.response().unwrap();
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
            assert!(r.header("connection") != Some("close"), "{ctx}");
        }
        let got = m.requests();
        assert_eq!(got.len(), 2, "{ctx}");
        assert!(got[0].body == big.as_bytes(), "{ctx}: the large body");
        assert!(got[1].body == small.as_bytes(), "{ctx}: the pipelined one");
    }
}

/// An engine that takes `step` bytes at a time with a pause between reads, through a small
/// receive buffer, so the gateway's write of a large body is cut short many times; it answers
/// once the whole body is in, and keeps what it received.
struct SlowEngine {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl SlowEngine {
    fn start(step: usize, pause: Duration) -> SlowEngine {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // Inherited by the accepted sockets: a small window keeps the gateway's writes short.
        let size: libc::c_int = 8 * 1024;
        // SAFETY: a valid socket and a pointer to an int of the given length.
        let rc = unsafe {
            libc::setsockopt(
                l.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &size as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        let got = Arc::new(Mutex::new(Vec::new()));
        let keep = got.clone();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let keep = keep.clone();
                thread::spawn(move || serve_slowly(s, step, pause, &keep));
            }
        });
        SlowEngine { addr, got }
    }
}

fn serve_slowly(mut s: TcpStream, step: usize, pause: Duration, keep: &Mutex<Vec<Vec<u8>>>) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; step];
    loop {
        let Ok(n) = s.read(&mut chunk) else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if buf.len() < end + 4 + len {
            thread::sleep(pause);
            continue;
        }
        let body = buf[end + 4..end + 4 + len].to_vec();
        buf.drain(..end + 4 + len);
        keep.lock().unwrap().push(body);
        let answer = r#"{"id":"x","object":"chat.completion","model":"m","choices":[]}"#;
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
    }
}

#[test]
fn an_engine_that_reads_slowly_gets_the_whole_large_body() {
    for d in drivers() {
        let ctx = driver_name(d);
        let e = SlowEngine::start(64 * 1024, Duration::from_millis(1));
        let g = gateway(
            d,
            &format!(
                "{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
                target(
                    "t0",
                    e.addr,
                    "upstream_models = { \"m\" = \"upstream/m\" }\n\
                     [targets.timeouts]\nfirst_byte = \"20s\""
                )
            ),
        );
        let body = body_of(BIG, false);
        let r = call(g.local_addr(), &chat_post(&body));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let want = body.replacen(r#""model":"m""#, r#""model":"upstream/m""#, 1);
        let got = e.got.lock().unwrap();
        assert_eq!(got.len(), 1, "{ctx}");
        assert!(got[0] == want.as_bytes(), "{ctx}: the body differs");
    }
}

#[test]
fn a_retried_large_body_is_sent_again_whole() {
    for d in drivers() {
        let ctx = driver_name(d);
        let bad = mock("bad", |_| {});
        bad.set_fault(Some(rolter_mock::Fault::Status(503)));
        let good = mock("good", |_| {});
        let upstream = "upstream_models = { \"m\" = \"upstream/m\" }";
        let g = gateway(
            d,
            &format!(
                "{}{}[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\"]\n\
                 strategy = \"round_robin\"\nretries = 1\nretry_on = [\"503\"]\n",
                target("t0", bad.addr(), upstream),
                target("t1", good.addr(), upstream),
            ),
        );
        let body = body_of(300 * 1024, true);
        let want = body.replacen(r#""model":"m""#, r#""model":"upstream/m""#, 1);
        // Round robin starts the two requests on different targets: one of them is retried.
        for i in 0..2 {
            let r = call(g.local_addr(), &chat_post(&body));
            assert_eq!(r.status, 200, "{ctx} #{i}: {}", r.text());
            assert_eq!(r.header("x-mock-engine"), Some("good"), "{ctx} #{i}");
        }
        let (b, g) = (bad.requests(), good.requests());
        assert_eq!((b.len(), g.len()), (1, 2), "{ctx}");
        for r in b.iter().chain(&g) {
            assert!(r.body == want.as_bytes(), "{ctx}: a body differs");
        }
    }
}

/// An engine that accepts and never reads.
fn deaf_engine() -> (SocketAddr, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let mut held = Vec::new();
        l.set_nonblocking(true).unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < end && held.len() < 4 {
            match l.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => thread::sleep(Duration::from_millis(5)),
            }
        }
        thread::sleep(Duration::from_secs(3));
    });
    (addr, h)
}

#[test]
fn a_large_body_abandoned_mid_write_leaves_the_connection_serving_the_next_request() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (deaf, _h) = deaf_engine();
        let good = mock("good", |_| {});
        let g = gateway(
            d,
            &format!(
                "[[targets]]\nname = \"deaf\"\nurl = \"http://{deaf}\"\nmodels = [\"m\"]\n\
                 [targets.timeouts]\nfirst_byte = \"300ms\"\n\
                 [[targets]]\nname = \"good\"\nurl = \"http://{}\"\nmodels = [\"n\"]\n\
                 [[routes]]\nname = \"r\"\ntargets = [\"deaf\"]\nretries = 0\n\
                 [[routes]]\nname = \"n\"\ntargets = [\"good\"]\n[routes.match]\nmodels = [\"n\"]\n",
                good.addr()
            ),
        );
        // The write is still in flight when the first-byte timeout gives up on it.
        let big = body_of(BIG, false);
        let next = body_of(400, true).replacen(r#""model":"m""#, r#""model":"n""#, 1);
        let mut c = Client::connect(g.local_addr());
        c.send(&format!("{}{}", chat_post(&big), chat_post(&next)));
        let r = c.response().unwrap();
        assert_eq!(r.status, 504, "{ctx}: {}", r.text());
        let r = c.response().unwrap();
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let got = good.requests();
        assert_eq!(got.len(), 1, "{ctx}");
        assert!(
            got[0].body == next.as_bytes(),
            "{ctx}: the next request's body"
        );
    }
}
