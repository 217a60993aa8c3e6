//! `kill -9` of one of two engine processes under streaming and plain load: every request
//! that had received no response byte is retried on the other engine (the client sees an
//! answer), and every stream the kill cut ends with an SSE error event, never a clean end.
//!
//! The engines run in child processes (this test binary, re-run as a mock engine), so the
//! kill is a real SIGKILL: the kernel closes the engine's sockets mid-response.

mod common;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::*;

const CHILD: &str = "ROLTER_TEST_MOCK_CHILD";

/// Run as a child: a mock engine on the port in `ROLTER_TEST_MOCK_CHILD` until killed.
#[test]
fn mock_engine_child() {
    let Ok(port) = std::env::var(CHILD) else {
        return;
    };
    let port: u16 = port.parse().unwrap();
    let _h = rolter_mock::spawn(rolter_mock::MockConfig {
        name: format!("e{port}"),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        models: vec!["m".into()],
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(10),
        tokens: 30,
        ..rolter_mock::MockConfig::default()
    })
    .unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn engine_process(port: u16) -> Child {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "mock_engine_child", "--nocapture"])
        .env(CHILD, port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    process::wait_listening(SocketAddr::from(([127, 0, 0, 1], port)));
    child
}

/// What the client saw of one request.
#[derive(Debug)]
enum Saw {
    Answer,
    /// An error response before any body byte.
    Error(u16, String),
    /// A stream that ended with an error event.
    CutWithError,
    /// Anything else: a stream that ended cleanly but short, or no answer at all.
    Broken(String),
}

impl Saw {
    /// What went wrong, for the failure message.
    fn why(&self) -> String {
        match self {
            Saw::Error(status, body) => format!("{status}: {body}"),
            Saw::Broken(what) => what.clone(),
            Saw::Answer | Saw::CutWithError => String::new(),
        }
    }
}

fn one(addr: SocketAddr, stream: bool) -> Saw {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        return Saw::Broken(format!("read: {e}"));
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let Some(status) = text.get(9..12).and_then(|c| c.parse::<u16>().ok()) else {
        return Saw::Broken(format!("no response: {text:.60}"));
    };
    if status != 200 {
        return Saw::Error(status, text.lines().last().unwrap_or("").to_string());
    }
    if !stream {
        return if text.contains("\"choices\"") {
            Saw::Answer
        } else {
            Saw::Broken(text)
        };
    }
    let last = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap_or("");
    if last == "[DONE]" && text.ends_with("0\r\n\r\n") {
        Saw::Answer
    } else if last.contains("\"error\"") {
        Saw::CutWithError
    } else {
        Saw::Broken(format!("stream ended on: {last:.80}"))
    }
}

#[test]
fn killing_one_of_two_engines_under_load_fails_no_request_that_had_no_byte() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for d in drivers() {
        let ports = [process::free_port(), process::free_port()];
        let mut engines: Vec<Child> = ports.iter().map(|&p| engine_process(p)).collect();
        let mut rest = String::new();
        for (i, p) in ports.iter().enumerate() {
            rest.push_str(&target(
                &format!("e{i}"),
                SocketAddr::from(([127, 0, 0, 1], *p)),
                "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"5s\"\nidle = \"5s\"",
            ));
        }
        rest.push_str("[[routes]]\nname = \"r\"\ntargets = [\"e0\", \"e1\"]\nretries = 2\nstrategy = \"round_robin\"\n");
        let g = gateway_with(d, 2, &rest);
        let addr = g.local_addr();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..16)
            .map(|c| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut saw = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        saw.push(one(addr, c % 2 == 0));
                    }
                    saw
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        // SIGKILL: the kernel closes the engine's connections mid-response.
        engines[0].kill().unwrap();
        let _ = engines[0].wait();
        let killed = Instant::now();
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let saw: Vec<Saw> = clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        let _ = engines[1].kill();
        let _ = engines[1].wait();
        let answers = saw.iter().filter(|s| matches!(s, Saw::Answer)).count();
        let cut = saw
            .iter()
            .filter(|s| matches!(s, Saw::CutWithError))
            .count();
        let errors: Vec<String> = saw
            .iter()
            .filter(|s| matches!(s, Saw::Error(..) | Saw::Broken(_)))
            .map(Saw::why)
            .collect();
        assert!(
            errors.is_empty(),
            "under {}: {} of {} requests failed without having received a byte, or broke: {errors:?}",
            driver_name(d),
            errors.len(),
            saw.len()
        );
        assert!(answers > 50, "{answers} answers");
        eprintln!(
            "under {}: {} requests, {answers} answered, {cut} streams cut with an error event ({:?} after the kill)",
            driver_name(d),
            saw.len(),
            killed.elapsed()
        );
    }
}
