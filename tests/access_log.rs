//! The access log, the request id and the request-outcome metrics, under both drivers:
//! one JSON line per request with the right fields and response flags for a success, a
//! retry, an upstream failure, timeouts, a client that goes away mid-stream, a request
//! no route takes and requests a route's queue turns away (full, timed out); the request
//! id kept, generated, returned and seen by the engine; cut streams counted as
//! interrupted, not 200; tokens counted from a stream without usage.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::*;
use rolter::config::DriverChoice;
use rolter::Gateway;
use rolter_mock::MockHandle;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

/// A fresh directory for one test's access log.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rolter-access-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An address nothing listens on (connections are refused).
fn dead_addr() -> SocketAddr {
    refused_addr()
}

/// A gateway with an admin listener, its access log in `log`, targets `t0`, `t1`, … at
/// `addrs` and one round-robin route `r` over them with `route_extra`.
fn start(
    d: DriverChoice,
    log: &Path,
    addrs: &[SocketAddr],
    timeouts: &str,
    route_extra: &str,
) -> Gateway {
    let mut rest = format!(
        "[log]\naccess = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[health]\nfailures = 0\n",
        log.display()
    );
    let mut names = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        rest.push_str(&target(&format!("t{i}"), *a, ""));
        rest.push_str(&format!("[targets.timeouts]\n{timeouts}\n"));
        names.push(format!("\"t{i}\""));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\nstrategy = \"round_robin\"\n{route_extra}\n",
        names.join(", ")
    ));
    gateway(d, &rest)
}

const TIMEOUTS: &str = "connect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"2s\"";

/// The access log's lines once there are at least `n`.
fn lines(log: &Path, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    wait_for(&format!("{n} access-log lines"), WAIT, || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        out = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        out.len() >= n
    });
    out
}

/// The line of request `id`.
fn line_of(log: &Path, n: usize, id: &str) -> Value {
    let all = lines(log, n);
    all.into_iter()
        .find(|l| l["request_id"] == id)
        .unwrap_or_else(|| panic!("no access-log line for {id}"))
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn chat(
    addr: SocketAddr,
    id: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> rolter_mock::client::Response {
    let mut h = vec![("x-request-id", id)];
    h.extend_from_slice(headers);
    call(addr, &post(CHAT, &h, body))
}

/// A streamed request whose answer is cut off: its status, once the stream ended.
fn cut_stream(addr: SocketAddr, id: &str, fault: (&str, &str)) -> u16 {
    let mut c = rolter_mock::client::Client::connect(addr);
    c.send(&post(
        CHAT,
        &[("x-request-id", id), fault],
        &chat_body(true),
    ));
    let (status, _) = c.head().unwrap();
    // Read until the gateway closes without a terminal chunk.
    while let Ok(Some(_)) = c.chunk() {}
    status
}

/// The `x-request-id` values of each inference request the engine received.
fn ids_at(m: &MockHandle) -> Vec<Vec<String>> {
    m.requests()
        .iter()
        .filter(|r| r.path == CHAT)
        .map(|r| {
            r.headers
                .iter()
                .filter(|(n, _)| n == "x-request-id")
                .map(|(_, v)| v.clone())
                .collect()
        })
        .collect()
}

#[test]
fn a_success_is_logged_with_its_fields_and_the_request_id_travels() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("success-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |_| {});
        let g = start(d, &log, &[m.addr()], TIMEOUTS, "");

        // A valid client id is kept: returned, sent upstream once, logged.
        let r = chat(g.local_addr(), "client-id.1", &[], &chat_body(false));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        assert_eq!(r.header("x-request-id"), Some("client-id.1"), "{ctx}");
        assert_eq!(ids_at(&m), vec![vec!["client-id.1".to_string()]], "{ctx}");
        let l = line_of(&log, 1, "client-id.1");
        assert_eq!(l["method"], "POST", "{ctx}: {l}");
        assert_eq!(l["path"], CHAT, "{ctx}");
        assert_eq!(l["route"], "r", "{ctx}");
        assert_eq!(l["strategy"], "round_robin", "{ctx}");
        assert_eq!(l["target"], "t0", "{ctx}");
        assert_eq!(l["model"], "m", "{ctx}");
        assert_eq!(l["status"], 200, "{ctx}");
        assert_eq!(l["upstream_status"], 200, "{ctx}");
        assert_eq!(l["attempts"], 1, "{ctx}");
        assert_eq!(l["flags"], "-", "{ctx}");
        assert!(
            l["client"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{ctx}"
        );
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{ctx}");
        assert!(l["ttft_ms"].as_f64().is_some(), "{ctx}");
        assert!(l["duration_ms"].as_f64().unwrap() >= l["ttft_ms"].as_f64().unwrap());
        let sent = post(CHAT, &[("x-request-id", "client-id.1")], &chat_body(false));
        assert_eq!(l["bytes_in"], sent.len(), "{ctx}");
        assert!(
            l["bytes_out"].as_u64().unwrap() > r.body.len() as u64,
            "{ctx}"
        );
        assert!(l["prompt_tokens"].as_u64().unwrap() > 0, "{ctx}");
        assert!(l["completion_tokens"].as_u64().unwrap() > 0, "{ctx}");
        assert_eq!(l["tokens_estimated"], false, "{ctx}");

        // No id, or an invalid one: a generated id, the same everywhere.
        for (n, sent) in [(2, None), (3, Some("has space")), (4, Some("quo\"te"))] {
            let mut h = Vec::new();
            if let Some(v) = sent {
                h.push(("x-request-id", v));
            }
            let r = call(g.local_addr(), &post(CHAT, &h, &chat_body(true)));
            assert_eq!(r.status, 200, "{ctx}");
            let id = r.header("x-request-id").expect("an id").to_string();
            assert_eq!(id.len(), 32, "{ctx}: {id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{ctx}: {id}");
            assert_eq!(
                ids_at(&m)[n - 1],
                vec![id.clone()],
                "{ctx}: sent upstream once"
            );
            let l = line_of(&log, n, &id);
            assert_eq!(l["status"], 200, "{ctx}");
        }

        // The gateway's own answers carry it too.
        let r = call(
            g.local_addr(),
            &request("GET", "/health", &[("x-request-id", "h-1")], ""),
        );
        assert_eq!(r.header("x-request-id"), Some("h-1"), "{ctx}");
        assert_eq!(line_of(&log, 5, "h-1")["status"], 200, "{ctx}");
    }
}

#[test]
fn no_route_is_flagged_nr() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("nr-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |_| {});
        let g = start(d, &log, &[m.addr()], TIMEOUTS, "");
        let body = r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#;
        let r = chat(g.local_addr(), "nr-1", &[], body);
        assert_eq!(r.status, 404, "{ctx}");
        assert_eq!(r.header("x-request-id"), Some("nr-1"), "{ctx}");
        let l = line_of(&log, 1, "nr-1");
        assert_eq!(l["status"], 404, "{ctx}: {l}");
        assert_eq!(l["flags"], "NR", "{ctx}");
        assert_eq!(l["error"], "model_not_found", "{ctx}");
        assert_eq!(l["route"], Value::Null, "{ctx}");
        assert_eq!(l["attempts"], 0, "{ctx}");
        assert!(
            l["bytes_out"].as_u64().unwrap() > r.body.len() as u64,
            "{ctx}"
        );
    }
}

#[test]
fn a_retry_an_upstream_failure_and_exhausted_retries_are_flagged() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("retry-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("b", |_| {});
        let g = start(d, &log, &[dead_addr(), m.addr()], TIMEOUTS, "retries = 1");
        // Round robin alternates: of two requests, at least one goes to the dead target
        // first and is served by the other.
        for id in ["rt-1", "rt-2"] {
            assert_eq!(chat(g.local_addr(), id, &[], &chat_body(false)).status, 200);
        }
        let all = lines(&log, 2);
        let retried: Vec<&Value> = all.iter().filter(|l| l["attempts"] == 2).collect();
        assert!(!retried.is_empty(), "{ctx}: {all:?}");
        for l in retried {
            assert_eq!(l["target"], "t1", "{ctx}: {l}");
            assert_eq!(l["status"], 200, "{ctx}");
            assert_eq!(l["upstream_status"], 200, "{ctx}");
            assert_eq!(l["flags"], "-", "{ctx}");
        }
        drop(g);

        // One dead target, no retry: a connect failure.
        let log = dir.join("uf.log");
        let g = start(d, &log, &[dead_addr()], TIMEOUTS, "retries = 0");
        let r = chat(g.local_addr(), "uf-1", &[], &chat_body(false));
        assert_eq!(r.status, 502, "{ctx}");
        assert_eq!(r.header("x-request-id"), Some("uf-1"), "{ctx}");
        let l = line_of(&log, 1, "uf-1");
        assert_eq!(l["flags"], "UF", "{ctx}: {l}");
        assert_eq!(l["error"], "upstream_connect_failed", "{ctx}");
        assert_eq!(l["target"], "t0", "{ctx}");
        assert_eq!(l["upstream_status"], Value::Null, "{ctx}");
        assert_eq!(l["attempts"], 1, "{ctx}");
        drop(g);

        // Two dead targets and a retry: retries exhausted.
        let log = dir.join("urx.log");
        let g = start(
            d,
            &log,
            &[dead_addr(), dead_addr()],
            TIMEOUTS,
            "retries = 1",
        );
        let r = chat(g.local_addr(), "urx-1", &[], &chat_body(false));
        assert_eq!(r.status, 502, "{ctx}");
        let l = line_of(&log, 1, "urx-1");
        assert_eq!(l["flags"], "UF,URX", "{ctx}: {l}");
        assert_eq!(l["attempts"], 2, "{ctx}");
    }
}

/// A series' value on `/metrics`, 0 when absent.
fn series(g: &Gateway, s: &str) -> f64 {
    admin_series(g, s).unwrap_or(0.0)
}

#[test]
fn timeouts_and_cut_streams_are_flagged_and_not_counted_as_200() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("timeout-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |c| c.tokens = 20);
        let short = "connect = \"500ms\"\nfirst_byte = \"300ms\"\nidle = \"300ms\"";
        let g = start(d, &log, &[m.addr()], short, "retries = 0");

        // No first byte in time.
        let r = chat(
            g.local_addr(),
            "ut-1",
            &[("x-mock-ttft-ms", "2000")],
            &chat_body(false),
        );
        assert_eq!(r.status, 504, "{ctx}");
        let l = line_of(&log, 1, "ut-1");
        assert_eq!(l["flags"], "UT", "{ctx}: {l}");
        assert_eq!(l["error"], "upstream_timeout", "{ctx}");

        // A stream that stalls after two tokens: cut by the idle timeout.
        let status = cut_stream(g.local_addr(), "ut-2", ("x-mock-stall-after", "2"));
        assert_eq!(status, 200, "{ctx}");
        let l = line_of(&log, 2, "ut-2");
        assert_eq!(l["status"], 200, "{ctx}: {l}");
        assert_eq!(l["upstream_status"], 200, "{ctx}");
        assert_eq!(l["flags"], "UT", "{ctx}");

        // A stream reset after two tokens.
        let status = cut_stream(g.local_addr(), "uc-1", ("x-mock-reset-after", "2"));
        assert_eq!(status, 200, "{ctx}");
        let l = line_of(&log, 3, "uc-1");
        assert_eq!(l["flags"], "UC", "{ctx}: {l}");

        let labels = "route=\"r\",target=\"t0\"";
        assert_eq!(
            series(
                &g,
                &format!("rolter_stream_interrupted_total{{{labels},cause=\"upstream_timeout\"}}")
            ),
            1.0,
            "{ctx}"
        );
        assert_eq!(
            series(
                &g,
                &format!("rolter_stream_interrupted_total{{{labels},cause=\"upstream_reset\"}}")
            ),
            1.0,
            "{ctx}"
        );
        assert_eq!(
            series(
                &g,
                &format!("rolter_requests_total{{{labels},code=\"interrupted\"}}")
            ),
            2.0,
            "{ctx}"
        );
        assert_eq!(
            series(
                &g,
                &format!("rolter_requests_total{{{labels},code=\"200\"}}")
            ),
            0.0,
            "{ctx}: a cut stream is not a 200"
        );
        assert_eq!(series(&g, "rolter_access_log_dropped_total"), 0.0, "{ctx}");
    }
}

#[test]
fn a_client_gone_mid_stream_is_flagged_dc() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("dc-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |c| {
            c.tokens = 200;
            c.itl = std::time::Duration::from_millis(20);
        });
        let g = start(d, &log, &[m.addr()], TIMEOUTS, "");
        let mut c = rolter_mock::client::Client::connect(g.local_addr());
        c.send(&post(CHAT, &[("x-request-id", "dc-1")], &chat_body(true)));
        let (status, _) = c.head().unwrap();
        assert_eq!(status, 200, "{ctx}");
        assert!(c.chunk().unwrap().is_some(), "{ctx}: a first event");
        drop(c);
        let l = line_of(&log, 1, "dc-1");
        assert_eq!(l["status"], 200, "{ctx}: {l}");
        assert_eq!(l["flags"], "DC", "{ctx}");
        assert_eq!(
            series(
                &g,
                "rolter_stream_interrupted_total{route=\"r\",target=\"t0\",cause=\"client_gone\"}"
            ),
            1.0,
            "{ctx}"
        );
    }
}

/// The line of request `id`, once it is written.
fn wait_line(log: &Path, id: &str) -> Value {
    let mut found = Value::Null;
    wait_for(&format!("the access-log line of {id}"), WAIT, || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        found = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .find(|l| l["request_id"] == id)
            .unwrap_or(Value::Null);
        !found.is_null()
    });
    found
}

#[test]
fn a_queue_timeout_and_a_full_queue_are_flagged_uo() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("uo-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |_| {});
        // One worker and one target taking one request at a time. Requests with
        // `x-queue: short` wait at most 300 ms (route `short`); the others have a queue of
        // one place and a long wait (route `r`).
        let rest = format!(
            "[log]\naccess = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}\
             [[routes]]\nname = \"short\"\ntargets = [\"t0\"]\nretries = 0\nqueue_max = 4\n\
             queue_timeout = \"300ms\"\n\
             [routes.match]\nheader = {{ name = \"x-queue\", value = \"short\" }}\n\
             [[routes]]\nname = \"r\"\ntargets = [\"t0\"]\nretries = 0\nqueue_max = 1\n\
             queue_timeout = \"20s\"\n",
            log.display(),
            target(
                "t0",
                m.addr(),
                "max_concurrent = 1\n[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"10s\"\nidle = \"10s\""
            ),
        );
        let g = gateway(d, &rest);
        let addr = g.local_addr();
        // The engine holds the target's only place: for 3 s, long enough for the steps
        // below and well inside the test client's 5 s read timeout.
        let held = std::thread::spawn(move || {
            chat(
                addr,
                "uo-held",
                &[("x-mock-ttft-ms", "3000")],
                &chat_body(false),
            )
        });
        wait_for("the place is taken", SHORT, || m.stats().running == 1);

        // Waits in the short queue until queue_timeout.
        let r = chat(
            addr,
            "uo-timeout",
            &[("x-queue", "short")],
            &chat_body(false),
        );
        assert_eq!(r.status, 503, "{ctx}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "queue_timeout", "{ctx}");

        // One waits in route r's single place, so the next finds its queue full.
        let mut waiting = rolter_mock::client::Client::connect(addr);
        waiting.send(&post(
            CHAT,
            &[("x-request-id", "uo-waiting")],
            &chat_body(false),
        ));
        wait_for("one request queued", SHORT, || {
            series(&g, "rolter_queue_depth{route=\"r\"}") == 1.0
        });
        let r = chat(addr, "uo-full", &[], &chat_body(false));
        assert_eq!(r.status, 503, "{ctx}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "queue_full", "{ctx}");
        drop(waiting);
        assert_eq!(held.join().unwrap().status, 200, "{ctx}");
        assert_eq!(
            m.stats().requests,
            1,
            "{ctx}: only the held request reached the engine"
        );

        for (id, route, code) in [
            ("uo-timeout", "short", "queue_timeout"),
            ("uo-full", "r", "queue_full"),
        ] {
            let l = wait_line(&log, id);
            assert_eq!(l["status"], 503, "{ctx}: {l}");
            assert_eq!(l["error"], code, "{ctx}: {l}");
            assert_eq!(l["route"], route, "{ctx}: {l}");
            assert_eq!(l["flags"], "UO", "{ctx}: {l}");
            assert_eq!(l["attempts"], 0, "{ctx}: {l}");
            assert_eq!(l["target"], Value::Null, "{ctx}: {l}");
        }
        let l = wait_line(&log, "uo-held");
        assert_eq!(l["status"], 200, "{ctx}: {l}");
        assert_eq!(l["flags"], "-", "{ctx}: {l}");
    }
}

/// A gateway logging to `log` with one target `t0` at `addr` (its extra lines `extra`).
fn start_one(d: DriverChoice, log: &Path, addr: SocketAddr, extra: &str) -> Gateway {
    let rest = format!(
        "[log]\naccess = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
        log.display(),
        target("t0", addr, extra)
    );
    gateway(d, &rest)
}

#[test]
fn tokens_are_counted_from_a_stream_without_usage() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("tokens-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |c| c.tokens = 7);
        // An engine that refuses `stream_options`: its streams' deltas are counted.
        let g = start_one(d, &log, m.addr(), "stream_usage = \"count\"\n");
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Hello"}]}"#;
        let r = chat(g.local_addr(), "tok-1", &[], body);
        assert_eq!(r.status, 200, "{ctx}");
        assert!(
            !r.text().contains("\"usage\""),
            "{ctx}: the engine sent no usage"
        );
        let l = line_of(&log, 1, "tok-1");
        assert_eq!(l["completion_tokens"], 7, "{ctx}: {l}");
        assert_eq!(l["tokens_estimated"], true, "{ctx}");
        assert_eq!(l["prompt_tokens"], Value::Null, "{ctx}");
        assert_eq!(
            series(&g, "rolter_tokens_total{target=\"t0\",kind=\"completion\"}"),
            7.0,
            "{ctx}"
        );
    }
}

/// The SSE events' data of a streamed answer, `[DONE]` included.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .collect()
}

#[test]
fn a_streams_tokens_come_from_the_usage_asked_for_and_kept_from_the_client() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(&format!("asked-{ctx}"));
        let log = dir.join("access.log");
        let m = mock("a", |c| {
            c.tokens = 7;
            c.record_requests = true;
        });
        let g = start_one(d, &log, m.addr(), "");
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Hello"}]}"#;
        let r = chat(g.local_addr(), "ask-1", &[], body);
        assert_eq!(r.status, 200, "{ctx}");
        let text = r.text();
        let evs = events(&text);
        assert_eq!(evs.last(), Some(&"[DONE]"), "{ctx}: {text}");
        assert!(
            !text.contains("_tokens"),
            "{ctx}: the usage event the client did not ask for is not relayed: {text}"
        );
        for e in &evs[..evs.len() - 1] {
            let v: Value = serde_json::from_str(e).unwrap();
            assert_eq!(v["choices"].as_array().map(Vec::len), Some(1), "{ctx}: {e}");
        }
        let sent = &m.requests()[0];
        let sent: Value = serde_json::from_slice(&sent.body).unwrap();
        assert_eq!(
            sent["stream_options"],
            serde_json::json!({"include_usage": true})
        );
        assert_eq!(
            sent["messages"][0]["content"], "Hello",
            "{ctx}: the rest as sent"
        );

        // A client that asked gets the event as the engine sent it.
        let asked = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}"#;
        let r = chat(g.local_addr(), "ask-2", &[], asked);
        let text = r.text();
        let evs = events(&text);
        let usage: Value = serde_json::from_str(evs[evs.len() - 2]).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]), "{ctx}: {text}");
        assert_eq!(usage["usage"]["completion_tokens"], 7, "{ctx}");
        assert_eq!(
            m.requests()[1].body,
            asked.as_bytes(),
            "{ctx}: sent as it came"
        );

        for id in ["ask-1", "ask-2"] {
            let l = line_of(&log, 1, id);
            assert_eq!(l["completion_tokens"], 7, "{ctx}: {l}");
            assert_eq!(
                l["prompt_tokens"], usage["usage"]["prompt_tokens"],
                "{ctx}: {l}"
            );
            assert_eq!(l["tokens_estimated"], false, "{ctx}: {l}");
        }
    }
}

#[test]
fn sampling_keeps_errors_and_off_writes_nothing() {
    let d = DriverChoice::Epoll;
    let dir = temp_dir("sample");
    let log = dir.join("access.log");
    let m = mock("a", |_| {});
    let rest = format!(
        "[log]\naccess = \"{}\"\nsample = 0.0\n{}[[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
        log.display(),
        target("t0", m.addr(), "")
    );
    let g = gateway(d, &rest);
    assert_eq!(
        chat(g.local_addr(), "s-ok", &[], &chat_body(false)).status,
        200
    );
    let body = r#"{"model":"nope","messages":[]}"#;
    assert_eq!(chat(g.local_addr(), "s-err", &[], body).status, 404);
    let all = lines(&log, 1);
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["request_id"], "s-err");
}

#[test]
fn reopen_logs_follows_a_rotated_file() {
    let d = DriverChoice::Epoll;
    let dir = temp_dir("rotate");
    let log = dir.join("access.log");
    let m = mock("a", |_| {});
    let g = start(d, &log, &[m.addr()], TIMEOUTS, "");
    assert_eq!(
        chat(g.local_addr(), "rot-1", &[], &chat_body(false)).status,
        200
    );
    line_of(&log, 1, "rot-1");
    // What logrotate does: move the file away, then signal.
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    g.reopen_logs();
    assert_eq!(
        chat(g.local_addr(), "rot-2", &[], &chat_body(false)).status,
        200
    );
    line_of(&log, 1, "rot-2");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert_eq!(old.lines().count(), 1, "{old}");
    assert!(old.contains("\"rot-1\""), "{old}");
}
