//! `rolter demo` as a new user runs it: the binary, its three mock engines of different
//! speeds and its `fastest` route. Tokens stream one by one, and the route learns time to
//! first token from streams only, so plain answers (whose first byte comes when generation
//! ends) never make it send streams to a slower engine.

mod common;

use std::io::{BufRead, BufReader, Lines, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::process::Kill;
use common::{call, post};

const BIN: &str = env!("CARGO_BIN_EXE_rolter");

/// A running `rolter demo`: the child, the gateway's address and the banner's lines after
/// the first.
struct Demo {
    _child: Kill,
    addr: SocketAddr,
    banner: Vec<String>,
    _rest: Lines<BufReader<ChildStdout>>,
}

fn demo() -> Demo {
    demo_with(&[])
}

fn demo_with(extra: &[&str]) -> Demo {
    let child = Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0", "--workers", "1"])
        .args(extra)
        .args(["--admin", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run rolter demo");
    let mut child = Kill(child);
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("banner").unwrap();
    // "rolter demo: gateway on http://127.0.0.1:PORT (...)"
    let addr: SocketAddr = first
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in banner: {first}"));
    let banner: Vec<String> = lines.by_ref().take(14).map(|l| l.unwrap()).collect();
    Demo {
        _child: child,
        addr,
        banner,
        _rest: lines,
    }
}

/// One chat completion, streamed or plain: the engine that served it.
fn chat(addr: SocketAddr, stream: bool) -> String {
    let body = format!(
        r#"{{"model":"demo-model","stream":{stream},"messages":[{{"role":"user","content":"Hello"}}]}}"#
    );
    let r = call(
        addr,
        &post(
            "/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("connection", "close"),
            ],
            &body,
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    if stream {
        assert!(r.text().contains("data: [DONE]"), "{}", r.text());
    }
    r.header("x-mock-engine")
        .expect("x-mock-engine")
        .to_string()
}

#[test]
fn demo_streams_tokens_one_by_one() {
    let d = demo();
    assert!(
        d.banner.iter().any(|l| l.contains("curl -N")),
        "{:?}",
        d.banner
    );
    // The admin listener is on, at the address the banner gives.
    let admin: SocketAddr = d
        .banner
        .iter()
        .find_map(|l| {
            l.trim()
                .strip_prefix("curl http://")?
                .strip_suffix("/admin/targets")
        })
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in banner: {:?}", d.banner));
    let mut a = TcpStream::connect(admin).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(a, "GET /admin/targets HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut targets = String::new();
    a.read_to_string(&mut targets).unwrap();
    assert!(targets.starts_with("HTTP/1.1 200 OK\r\n"), "{targets}");
    assert!(targets.contains("\"name\": \"fast\""), "{targets}");

    let body =
        r#"{"model":"demo-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}"#;
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Record when each token event arrives: they must trickle in, not land at once.
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut arrivals = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        let events = String::from_utf8_lossy(&seen)
            .matches("\"content\":")
            .count();
        arrivals.push((events, start.elapsed()));
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("data: [DONE]"));
    let tokens = text.matches("\"content\":").count();
    assert!(tokens >= 10, "{tokens} token events");
    // At least five distinct reads carried token events: streamed, not buffered.
    let distinct = arrivals.windows(2).filter(|w| w[1].0 > w[0].0).count();
    assert!(
        distinct >= 5,
        "tokens arrived in {distinct} steps: {arrivals:?}"
    );
}

/// The demo's engines answer a plain request after their whole generation (fast ≈ 0.5 s,
/// medium ≈ 1 s, slow ≈ 2 s) and start a stream after their first-token time (40, 90 and
/// 200 ms). Counted as a first token, a plain answer would make the fast engine look slower
/// than a stream on the medium one, and streams would move there.
#[test]
fn fastest_sends_streams_to_the_fastest_first_token_after_plain_and_streamed_calls() {
    let d = demo();
    // Plain calls first: while every engine is unmeasured they teach nothing.
    for _ in 0..3 {
        chat(d.addr, false);
    }
    // Streams measure each engine (3 samples each, unmeasured engines first, in a random
    // order), then go to the quickest. Three fast streams in a row can still be the fast
    // engine's own warm-up while another engine is unmeasured: settled means every engine
    // has its samples and the last three went to the fast one.
    let mut served: Vec<String> = Vec::new();
    let warm = |served: &[String]| {
        ["fast", "medium", "slow"]
            .iter()
            .all(|e| served.iter().filter(|s| s == e).count() >= 3)
    };
    let settled = |served: &[String]| {
        warm(served) && served.ends_with(&["fast", "fast", "fast"].map(String::from))
    };
    while served.len() < 30 && !settled(&served) {
        served.push(chat(d.addr, true));
    }
    assert!(
        settled(&served),
        "streams never settled on the fast engine: {served:?}"
    );
    // Plain calls now go to the winner. Were their durations (≈ 500 ms) learned as a first
    // token, each would lift the fast engine's 10 s half-life average by about 3 % of the
    // gap: past the medium engine's ≈ 90 ms within these 8, and the calls would move.
    let plain: Vec<String> = (0..8).map(|_| chat(d.addr, false)).collect();
    assert_eq!(plain, ["fast"; 8], "plain calls after warm-up");
    let streams: Vec<String> = (0..4).map(|_| chat(d.addr, true)).collect();
    assert_eq!(
        streams, ["fast"; 4],
        "streams after plain calls (warm-up: {served:?})"
    );
}

/// `rolter demo --pd`: every request is prefilled on a prefill engine and decoded on a
/// decode engine (or one of `decode-a`'s two ranks), which the admin listener shows as two
/// pools.
#[test]
fn demo_pd_prefills_and_decodes_on_two_pools() {
    let d = demo_with(&["--pd"]);
    let text = d.banner.join("\n");
    assert!(
        text.contains("prefill-a") && text.contains("2 data-parallel ranks"),
        "{text}"
    );
    let mut decoders = Vec::new();
    for stream in [false, true, false, true] {
        decoders.push(chat(d.addr, stream));
    }
    assert!(
        decoders.iter().all(|e| e.starts_with("decode-")),
        "answers come from decode engines: {decoders:?}"
    );
    let admin: SocketAddr = d
        .banner
        .iter()
        .find_map(|l| {
            l.trim()
                .strip_prefix("curl http://")?
                .strip_suffix("/admin/targets")
        })
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in banner: {:?}", d.banner));
    let mut a = TcpStream::connect(admin).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        a,
        "GET /admin/targets HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut targets = String::new();
    a.read_to_string(&mut targets).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(targets.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let pools: Vec<(String, String)> = json["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["pools"][0]["pool"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        pools,
        [
            ("prefill-a", "prefill"),
            ("prefill-b", "prefill"),
            ("decode-a[0]", "decode"),
            ("decode-a[1]", "decode"),
            ("decode-b", "decode"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(json["routes"][1]["name"], "demo/prefill");
    assert_eq!(json["routes"][0]["disaggregation"]["protocol"], "vllm");
}

#[test]
fn a_taken_port_names_the_demos_own_fix() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let out = Command::new(BIN)
        .args([
            "demo",
            "--workers",
            "1",
            "--admin",
            "127.0.0.1:0",
            "--listen",
        ])
        .arg(addr.to_string())
        .output()
        .expect("run rolter demo");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{addr} is already in use")) && err.contains("rolter demo --listen"),
        "{err}"
    );
    assert!(!err.contains("--upgrade"), "{err}");
}
