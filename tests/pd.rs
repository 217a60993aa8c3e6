//! Disaggregated prefill/decode routes and data-parallel targets through the `rolter`
//! binary, under every driver, in front of mock engines in their P/D roles:
//!
//! - what each leg's engine received (vLLM: the prefill request, and the decode request with
//!   the prefill's `kv_transfer_params` verbatim; SGLang: both legs with one bootstrap room,
//!   a batch's rooms), one request id on both, each leg in the access log and the metrics;
//! - the decode's stream relayed byte for byte (a tap between the gateway and the decode
//!   engine records what the engine sent);
//! - a prefill engine killed under load fails no request (its legs retried on the other); a
//!   prefill or decode that answers 503 is retried on another target of its pool; an
//!   engine's refusal (400) reaches the client as the engine's answer;
//! - a client that goes away aborts the legs running;
//! - data-parallel ranks: the rank in the header (vLLM) or in the body (SGLang), spread by a
//!   load-aware pool, kept by a session strategy, on either pool;
//! - a reload that moves the pools;
//! - the prefill pool's prefix hit rate under `cache_aware`, next to a co-located route's;
//! - `rolter check` on a bad P/D configuration.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::{self, Kill};
use common::*;
use rolter::config::DriverChoice;
use rolter_mock::{MockConfig, MockHandle, PdConfig, PdProtocol, PdRole, RecordedRequest};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_rolter");
const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
/// Upper bound of every wait.
const WAIT: Duration = Duration::from_secs(10);
const TIMEOUTS: &str =
    "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"5s\"\nidle = \"5s\"\n";

/// The `kv_transfer_params` of vLLM's prefill request.
const PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

// ---------------------------------------------------------------------------------------
// The gateway binary, the mocks and the configuration.
// ---------------------------------------------------------------------------------------

/// A `rolter run` child with its configuration directory.
struct Gw {
    child: Kill,
    addr: SocketAddr,
    /// The admin listener, when `rest` has an `[admin]` table with `listen = "ADMIN"`.
    admin: Option<SocketAddr>,
    /// The `[server]` table the file starts with.
    head: String,
    dir: tempfile::TempDir,
}

impl Gw {
    /// Starts `rolter run` on a free port under `driver`; `rest` holds targets, routes and
    /// any other table (the access log is off unless `rest` has a `[log]`).
    fn start(driver: DriverChoice, rest: &str) -> Gw {
        let dir = tempfile::tempdir().unwrap();
        let port = process::free_port();
        let admin = rest
            .contains("\"ADMIN\"")
            .then(|| SocketAddr::from(([127, 0, 0, 1], process::free_port())));
        let rest = match admin {
            Some(a) => rest.replace("\"ADMIN\"", &format!("\"{a}\"")),
            None => rest.to_string(),
        };
        let log = if rest.contains("[log]") {
            ""
        } else {
            "[log]\naccess = \"off\"\n"
        };
        let head = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = 1\npin_workers = false\n\
             driver = \"{}\"\nshutdown_grace = \"1s\"\n\n",
            driver_name(driver)
        );
        let text = format!("{head}{log}{rest}");
        let path = dir.path().join("rolter.toml");
        std::fs::write(&path, &text).unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut gw = Gw {
            child: Kill(child),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            admin,
            head,
            dir,
        };
        let t = Instant::now();
        while TcpStream::connect(gw.addr).is_err() {
            if let Some(s) = gw.child.0.try_wait().unwrap() {
                panic!("rolter exited ({s}):\n{}\n{text}", gw.stderr());
            }
            assert!(
                t.elapsed() < WAIT,
                "rolter did not listen:\n{}",
                gw.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        gw
    }

    /// Writes the file again with `rest` (its `"ADMIN"` the same listener) and reloads it
    /// through the admin API.
    fn reload(&self, rest: &str) {
        let admin = self.admin.expect("an admin listener");
        let rest = rest.replace("\"ADMIN\"", &format!("\"{admin}\""));
        let text = format!("{}[log]\naccess = \"off\"\n{rest}", self.head);
        std::fs::write(self.dir.path().join("rolter.toml"), text).unwrap();
        let r = call(admin, &post("/admin/reload", &[], ""));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["status"], "reloaded", "{}", r.text());
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// The access log's path, for a `[log] access = …` line.
    fn log_path(dir: &tempfile::TempDir) -> String {
        dir.path().join("access.log").display().to_string()
    }
}

/// A mock engine in a P/D role (bootstrap server on a free port for an SGLang prefill).
fn pd_mock(
    name: &str,
    role: PdRole,
    protocol: PdProtocol,
    f: impl FnOnce(&mut MockConfig),
) -> MockHandle {
    mock(name, |c| {
        c.tokens = 8;
        c.pd = Some(PdConfig {
            role,
            protocol,
            bootstrap_port: 0,
            handshake_timeout: Duration::from_secs(3),
        });
        f(c);
    })
}

fn protocol_name(p: PdProtocol) -> &'static str {
    match p {
        PdProtocol::Vllm => "vllm",
        PdProtocol::Sglang => "sglang",
    }
}

/// A `[[targets]]` entry for mock `m` (its bootstrap port when it has a bootstrap server),
/// with `extra` keys.
fn tgt(name: &str, m: &MockHandle, extra: &str) -> String {
    let bootstrap = m
        .bootstrap_addr()
        .map(|a| format!("bootstrap_port = {}\n", a.port()))
        .unwrap_or_default();
    target(name, m.addr(), &format!("{bootstrap}{extra}{TIMEOUTS}"))
}

fn quoted(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    q.join(", ")
}

/// A disaggregated route "chat" over the named pools.
fn pd_route(protocol: PdProtocol, prefill: (&[&str], &str), decode: (&[&str], &str)) -> String {
    format!(
        "[[routes]]\nname = \"chat\"\ndisaggregation = \"{}\"\nretries = 2\n\
         prefill = {{ targets = [{}], strategy = \"{}\" }}\n\
         decode = {{ targets = [{}], strategy = \"{}\" }}\n",
        protocol_name(protocol),
        quoted(prefill.0),
        prefill.1,
        quoted(decode.0),
        decode.1
    )
}

/// One prefill `p0` and one decode `d0` behind route "chat".
fn pair_config(protocol: PdProtocol, p: &MockHandle, d: &MockHandle) -> String {
    format!(
        "{}{}{}",
        tgt("p0", p, ""),
        tgt("d0", d, ""),
        pd_route(
            protocol,
            (&["p0"], "round_robin"),
            (&["d0"], "least_loaded")
        )
    )
}

// ---------------------------------------------------------------------------------------
// Requests and records.
// ---------------------------------------------------------------------------------------

/// `body` to `path` through the gateway, with `x-request-id: id` and `headers`.
fn send(addr: SocketAddr, path: &str, id: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let mut h = vec![("x-request-id", id)];
    h.extend_from_slice(headers);
    let mut c = Client::connect(addr);
    c.stream()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    c.send(&post(path, &h, body));
    c.response().unwrap()
}

/// Whether `r` is a whole answer: a stream ending with `[DONE]`, or a JSON body with choices.
fn complete(r: &Response, stream: bool) -> Result<(), String> {
    if r.status != 200 {
        return Err(format!(
            "status {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        ));
    }
    let ok = if stream {
        r.body.ends_with(b"\n\n")
            && sse_events(&r.body).last().map(|e| e.1.as_str()) == Some("[DONE]")
    } else {
        serde_json::from_slice::<Value>(&r.body).is_ok_and(|v| v["choices"].is_array())
    };
    if ok {
        Ok(())
    } else {
        Err(format!("incomplete: {}", String::from_utf8_lossy(&r.body)))
    }
}

fn is_stream(body: &str) -> bool {
    serde_json::from_str::<Value>(body).unwrap()["stream"] == true
}

/// The requests `m` received with `x-request-id: id`.
fn records(m: &MockHandle, id: &str) -> Vec<RecordedRequest> {
    m.requests()
        .into_iter()
        .filter(|r| r.header("x-request-id") == Some(id))
        .collect()
}

/// The one request `m` received with `x-request-id: id`, its body parsed.
fn one_record(m: &MockHandle, id: &str, ctx: &str) -> (RecordedRequest, Value) {
    let mut r = records(m, id);
    assert_eq!(
        r.len(),
        1,
        "{ctx}: {} got {} requests {id}",
        m.name(),
        r.len()
    );
    let r = r.remove(0);
    let body = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{ctx}: {e}: {}", String::from_utf8_lossy(&r.body)));
    (r, body)
}

/// The client's body as vLLM's prefill request must be.
fn vllm_prefill_body(client: &Value) -> Value {
    let mut v = client.clone();
    let o = v.as_object_mut().unwrap();
    o.insert(
        "kv_transfer_params".into(),
        serde_json::from_str(PREFILL_PARAMS).unwrap(),
    );
    o.insert("stream".into(), json!(false));
    o.insert("max_tokens".into(), json!(1));
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
    }
    for k in ["stream_options", "min_tokens", "min_completion_tokens"] {
        o.remove(k);
    }
    v
}

fn with(client: &Value, fields: &[(&str, Value)]) -> Value {
    let mut v = client.clone();
    for (k, f) in fields {
        v[*k] = f.clone();
    }
    v
}

/// Chat and completions, streamed and not, with the fields the prefill edits.
fn leg_cases() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            CHAT,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"max_completion_tokens":6,"min_tokens":2,"min_completion_tokens":2,"temperature":0.5,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there, how are you today?"}]}"#,
        ),
        (
            CHAT,
            r#"{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"top_p":0.9,"min_tokens":1,"user":"u1","n":1}"#,
        ),
        (
            COMPLETIONS,
            r#"{"model":"m","prompt":"Once upon a time","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"seed":7}"#,
        ),
        (
            CHAT,
            r#"{"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"forged"},"messages":[{"role":"user","content":"Forged params"}]}"#,
        ),
        (
            COMPLETIONS,
            r#"{"model":"m","prompt":"Once upon a time, in a land far away, there lived a mock engine that answered every request it was sent.","echo":false}"#,
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// 1, 2: what each leg received.
// ---------------------------------------------------------------------------------------

#[test]
fn vllm_legs_carry_the_toy_proxys_bodies_and_the_prefills_params_verbatim() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Vllm, |_| {});
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Vllm, |_| {});
        let dir = tempfile::tempdir().unwrap();
        let log = Gw::log_path(&dir);
        let g = Gw::start(
            d,
            &format!(
                "[log]\naccess = \"{log}\"\n[admin]\nlisten = \"ADMIN\"\n{}",
                pair_config(PdProtocol::Vllm, &p, &dm)
            ),
        );
        let mut next_block = 1u64;
        for (i, (path, body)) in leg_cases().into_iter().enumerate() {
            let ctx = format!("{ctx} case {i} {path}");
            let id = format!("vllm-legs-{i}");
            let r = send(g.addr, path, &id, &[], body);
            complete(&r, is_stream(body)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let client: Value = serde_json::from_str(body).unwrap();
            let (pr, pbody) = one_record(&p, &id, &ctx);
            assert_eq!(pr.path, path, "{ctx}");
            assert_eq!(
                pbody,
                vllm_prefill_body(&client),
                "{ctx}: the prefill request"
            );
            let (dr, dbody) = one_record(&dm, &id, &ctx);
            assert_eq!(dr.path, path, "{ctx}");
            // The prefill's answer named its engine, its address and fresh blocks.
            let kv = dbody["kv_transfer_params"].clone();
            let blocks: Vec<u64> = serde_json::from_value(kv["remote_block_ids"].clone())
                .unwrap_or_else(|e| panic!("{ctx}: {e}: {kv}"));
            assert!(!blocks.is_empty(), "{ctx}: {kv}");
            let want: Vec<u64> = (next_block..next_block + blocks.len() as u64).collect();
            assert_eq!(blocks, want, "{ctx}: the blocks the prefill held, in order");
            next_block += blocks.len() as u64;
            assert_eq!(
                kv,
                json!({
                    "do_remote_prefill": true, "do_remote_decode": false,
                    "remote_block_ids": blocks, "remote_engine_id": p.pd_engine_id().unwrap(),
                    "remote_host": "127.0.0.1", "remote_port": p.addr().port(), "tp_size": 1
                }),
                "{ctx}: the prefill's kv_transfer_params, verbatim"
            );
            assert_eq!(
                dbody,
                with(&client, &[("kv_transfer_params", kv)]),
                "{ctx}: the decode request is the client's with the prefill's params"
            );
        }
        let n = leg_cases().len() as u64;
        // A request without an id of its own: both legs carry the gateway's one id.
        let r = call(g.addr, &post(CHAT, &[], &chat_body(false)));
        complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        // (The prefill also records the decode's pulls: its chat requests are the legs.)
        let (pre, dec) = (inference(&p), inference(&dm));
        let (pid, did) = (
            pre.last()
                .unwrap()
                .header("x-request-id")
                .map(str::to_string),
            dec.last()
                .unwrap()
                .header("x-request-id")
                .map(str::to_string),
        );
        assert!(
            pid.as_deref().is_some_and(|i| !i.is_empty()),
            "{ctx}: the prefill leg has no x-request-id: {:?}; the decode's: {:?}",
            pre.last().unwrap().headers,
            dec.last().unwrap().headers
        );
        assert_eq!(pid, did, "{ctx}: one x-request-id on both legs");
        let (ps, ds) = (p.pd_stats(), dm.pd_stats());
        assert_eq!(
            (ps.prefills, ps.pulls_served, ps.pulls_refused, ps.refused),
            (n + 1, n + 1, 0, 0),
            "{ctx}: {ps:?}"
        );
        assert_eq!((ds.decodes, ds.refused), (n + 1, 0), "{ctx}: {ds:?}");
        both_legs_logged_and_counted(&g, &log, n as usize + 1, ctx);
    }
}

/// The access log and the metrics of `legs` vLLM requests over `p0` and `d0`, each with one
/// prefill leg: the access log names the decode's target and the prefill leg beside it, the
/// metrics count each leg once under its own route ("chat/prefill" for the prefill pool).
fn both_legs_logged_and_counted(g: &Gw, log: &str, legs: usize, ctx: &str) {
    for l in log_lines(log, legs) {
        assert_eq!(
            (&l["route"], &l["target"], &l["status"]),
            (&json!("chat"), &json!("d0"), &json!(200)),
            "{ctx}: {l}"
        );
        let pre = &l["prefill"];
        assert_eq!(
            (&pre["target"], &pre["status"], &pre["attempts"]),
            (&json!("p0"), &json!(200), &json!(1)),
            "{ctx}: {l}"
        );
        assert!(
            pre["time_ms"].as_f64().is_some_and(|t| t >= 0.0),
            "{ctx}: {l}"
        );
    }
    // The metrics: the prefill pool as route "chat/prefill", each leg counted once.
    let page = call(g.admin.unwrap(), &request("GET", "/metrics", &[], "")).text();
    let count = |route: &str, target: &str| {
        let series =
            format!("rolter_requests_total{{route=\"{route}\",target=\"{target}\",code=\"200\"}} ");
        page.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    let legs = legs as f64;
    assert_eq!(
        [count("chat/prefill", "p0"), count("chat", "d0")],
        [legs, legs],
        "{ctx}:\n{page}"
    );
    assert_eq!(
        [count("chat", "p0"), count("chat/prefill", "d0")],
        [0.0, 0.0],
        "{ctx}"
    );
}

#[test]
fn sglang_legs_carry_one_bootstrap_room_each_request() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Sglang, |_| {});
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Sglang, |_| {});
        let port = p.bootstrap_addr().expect("a bootstrap server").port();
        let g = Gw::start(d, &pair_config(PdProtocol::Sglang, &p, &dm));
        let mut rooms = Vec::new();
        for (i, (path, body)) in leg_cases().into_iter().enumerate() {
            let ctx = format!("{ctx} case {i} {path}");
            let id = format!("sglang-legs-{i}");
            let r = send(g.addr, path, &id, &[], body);
            complete(&r, is_stream(body)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let client: Value = serde_json::from_str(body).unwrap();
            let (pr, pbody) = one_record(&p, &id, &ctx);
            let (dr, dbody) = one_record(&dm, &id, &ctx);
            assert_eq!((pr.path.as_str(), dr.path.as_str()), (path, path), "{ctx}");
            let room = pbody["bootstrap_room"]
                .as_u64()
                .unwrap_or_else(|| panic!("{ctx}: no room: {pbody}"));
            assert!(room < 1 << 63, "{ctx}: room {room}");
            let want = with(
                &client,
                &[
                    ("bootstrap_host", json!("127.0.0.1")),
                    ("bootstrap_port", json!(port)),
                    ("bootstrap_room", json!(room)),
                ],
            );
            assert_eq!(pbody, want, "{ctx}: the prefill leg");
            assert_eq!(dbody, want, "{ctx}: the decode leg, the same room");
            rooms.push(room);
        }
        let mut distinct = rooms.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            rooms.len(),
            "{ctx}: a room per request: {rooms:?}"
        );
        let n = rooms.len() as u64;
        let (ps, ds) = (p.pd_stats(), dm.pd_stats());
        assert_eq!(
            (ps.prefills, ps.handshakes, ps.refused),
            (n, n, 0),
            "{ctx}: {ps:?}"
        );
        assert_eq!((ds.decodes, ds.refused), (n, 0), "{ctx}: {ds:?}");
    }
}

/// A list of prompts on `/v1/completions` (the OpenAI API's batch) is answered through an
/// SGLang route: both legs carry the same bootstrap fields, a room per prompt when they are
/// lists.
#[test]
fn an_sglang_batch_is_answered_with_the_same_rooms_on_both_legs() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Sglang, |_| {});
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Sglang, |_| {});
        let g = Gw::start(d, &pair_config(PdProtocol::Sglang, &p, &dm));
        let body =
            r#"{"model":"m","prompt":["first prompt","second prompt","third"],"max_tokens":4}"#;
        let r = send(g.addr, COMPLETIONS, "batch", &[], body);
        let (_, pbody) = one_record(&p, "batch", ctx);
        let (_, dbody) = one_record(&dm, "batch", ctx);
        let fields = |v: &Value| {
            ["bootstrap_host", "bootstrap_port", "bootstrap_room"].map(|k| v[k].clone())
        };
        assert_eq!(
            fields(&pbody),
            fields(&dbody),
            "{ctx}: the same fields on both legs"
        );
        if let Some(rooms) = pbody["bootstrap_room"].as_array() {
            let mut rooms: Vec<u64> = rooms.iter().filter_map(Value::as_u64).collect();
            rooms.sort_unstable();
            rooms.dedup();
            assert_eq!(rooms.len(), 3, "{ctx}: a room per prompt: {pbody}");
        }
        assert_eq!(
            r.status,
            200,
            "{ctx}: the batch was refused: {}\nthe prefill leg: {pbody}\nthe prefill engine: {:?}",
            String::from_utf8_lossy(&r.body),
            p.pd_stats()
        );
        // SGLang spreads a single room over the batch (room + i): the decode engine
        // fetched one room per prompt from the prefill's bootstrap server.
        assert_eq!(p.pd_stats().handshakes, 3, "{ctx}: {:?}", p.pd_stats());
    }
}

/// A prefill engine that answers 503 is tried no more for the request: the leg is retried
/// on the other prefill target (SGLang: with a new room, its first decode leg dropped).
#[test]
fn a_prefill_503_is_retried_on_the_other_prefill() {
    for d in drivers() {
        for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
            let ctx = format!("{} {}", driver_name(d), protocol_name(protocol));
            let bad = pd_mock("p0", PdRole::Prefill, protocol, |_| {});
            bad.set_fault(Some(rolter_mock::Fault::Status(503)));
            let good = pd_mock("p1", PdRole::Prefill, protocol, |_| {});
            let dm = pd_mock("d0", PdRole::Decode, protocol, |_| {});
            let cfg = format!(
                "{}{}{}{}",
                tgt("p0", &bad, ""),
                tgt("p1", &good, ""),
                tgt("d0", &dm, ""),
                pd_route(
                    protocol,
                    (&["p0", "p1"], "round_robin"),
                    (&["d0"], "least_loaded")
                )
            );
            let g = Gw::start(d, &cfg);
            for i in 0..4 {
                let id = format!("p503-{i}");
                let r = send(g.addr, CHAT, &id, &[], &chat_body(i % 2 == 1));
                complete(&r, i % 2 == 1).unwrap_or_else(|e| panic!("{ctx} {id}: {e}"));
                one_record(&good, &id, &ctx);
                let last = records(&dm, &id).pop().expect("a decode leg");
                let body: Value = serde_json::from_slice(&last.body).unwrap();
                match protocol {
                    PdProtocol::Vllm => assert_eq!(
                        body["kv_transfer_params"]["remote_engine_id"],
                        good.pd_engine_id().unwrap(),
                        "{ctx} {id}"
                    ),
                    PdProtocol::Sglang => assert_eq!(
                        body["bootstrap_port"],
                        good.bootstrap_addr().unwrap().port(),
                        "{ctx} {id}"
                    ),
                }
            }
            assert!(!inference(&bad).is_empty(), "{ctx}: p0 was tried");
        }
    }
}

/// A decode engine that answers 503 is retried on the other decode target, for both
/// protocols (SGLang: a new pair, the prefill not blamed for its decode's refusal).
#[test]
fn a_decode_503_is_retried_on_the_other_decode() {
    for d in drivers() {
        for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
            let ctx = format!("{} {}", driver_name(d), protocol_name(protocol));
            let p = pd_mock("p0", PdRole::Prefill, protocol, |_| {});
            let bad = pd_mock("d0", PdRole::Decode, protocol, |_| {});
            bad.set_fault(Some(rolter_mock::Fault::Status(503)));
            let good = pd_mock("d1", PdRole::Decode, protocol, |_| {});
            let cfg = format!(
                "{}{}{}{}",
                tgt("p0", &p, ""),
                tgt("d0", &bad, ""),
                tgt("d1", &good, ""),
                pd_route(
                    protocol,
                    (&["p0"], "round_robin"),
                    (&["d0", "d1"], "round_robin")
                )
            );
            let g = Gw::start(d, &cfg);
            for i in 0..4 {
                let id = format!("d503-{i}");
                let r = send(g.addr, CHAT, &id, &[], &chat_body(i % 2 == 1));
                complete(&r, i % 2 == 1).unwrap_or_else(|e| panic!("{ctx} {id}: {e}"));
                one_record(&good, &id, &ctx);
            }
            assert!(!inference(&bad).is_empty(), "{ctx}: d0 was tried");
            assert_eq!(good.pd_stats().decodes, 4, "{ctx}");
        }
    }
}

/// A decode engine's refusal (a 400, not retried) reaches the client as that engine's
/// answer, for both protocols; the prefill is not blamed for it.
#[test]
fn a_decodes_refusal_reaches_the_client_as_its_answer() {
    for d in drivers() {
        for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
            let ctx = format!("{} {}", driver_name(d), protocol_name(protocol));
            let p = pd_mock("p0", PdRole::Prefill, protocol, |_| {});
            let dm = pd_mock("d0", PdRole::Decode, protocol, |_| {});
            dm.set_fault(Some(rolter_mock::Fault::Status(400)));
            let g = Gw::start(d, &pair_config(protocol, &p, &dm));
            let r = send(g.addr, CHAT, "decode-refused", &[], &chat_body(false));
            let body = String::from_utf8_lossy(&r.body).to_string();
            assert_eq!(
                (r.status, r.header("x-mock-engine")),
                (400, Some("d0")),
                "{ctx}: {body}\nthe prefill engine: {:?}",
                p.pd_stats()
            );
        }
    }
}

/// A vLLM prefill target with `dp_size`: each prefill leg names its rank in the header,
/// and the decode pulls from the engine the answer named.
#[test]
fn a_vllm_prefill_rank_goes_in_the_prefill_legs_header() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Vllm, |c| c.dp_size = 2);
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Vllm, |_| {});
        let cfg = format!(
            "{}{}{}",
            tgt("p0", &p, "dp_size = 2\n"),
            tgt("d0", &dm, ""),
            pd_route(
                PdProtocol::Vllm,
                (&["p0"], "round_robin"),
                (&["d0"], "least_loaded")
            )
        );
        let g = Gw::start(d, &cfg);
        let mut ranks = Vec::new();
        for i in 0..4 {
            let id = format!("pre-dp-{i}");
            let r = send(g.addr, CHAT, &id, &[], &chat_body(false));
            complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let (pr, pbody) = one_record(&p, &id, ctx);
            let (dr, _) = one_record(&dm, &id, ctx);
            let rank = pr
                .header("x-data-parallel-rank")
                .map(|h| h.parse::<u32>().unwrap());
            assert_eq!(rank, Some(pr.ran_on_rank), "{ctx} {id}");
            ranks.push(pr.ran_on_rank);
            assert!(pbody.get("data_parallel_rank").is_none(), "{ctx}: {pbody}");
            assert!(
                dr.header("x-data-parallel-rank").is_none(),
                "{ctx}: {:?}",
                dr.headers
            );
        }
        // round_robin over the two ranks (from the core's own starting point).
        assert!(
            ranks.windows(2).all(|w| w[0] != w[1]),
            "{ctx}: ranks {ranks:?}"
        );
        assert_eq!(p.pd_stats().pulls_served, 4, "{ctx}");
    }
}

/// An engine's refusal of the client's request (a 400, not retried) reaches the client as
/// the engine's answer on a disaggregated route, as on a co-located one.
#[test]
fn an_engines_refusal_reaches_the_client_as_its_answer() {
    for d in drivers() {
        for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
            let ctx = format!("{} {}", driver_name(d), protocol_name(protocol));
            let p = pd_mock("p0", PdRole::Prefill, protocol, |_| {});
            let dm = pd_mock("d0", PdRole::Decode, protocol, |_| {});
            let g = Gw::start(d, &pair_config(protocol, &p, &dm));
            let r = send(
                g.addr,
                CHAT,
                "refused",
                &[("x-mock-status", "400")],
                &chat_body(false),
            );
            let body = String::from_utf8_lossy(&r.body).to_string();
            assert_eq!(r.status, 400, "{ctx}: {body}");
            assert!(
                r.header("x-mock-engine").is_some(),
                "{ctx}: the engine's own answer: {body}"
            );
            let after = send(g.addr, CHAT, "after", &[], &chat_body(false));
            complete(&after, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        }
    }
}

/// An SGLang route's decode target with `dp_size`: each decode leg names its rank in the
/// body, beside the bootstrap fields; the prefill leg names none.
#[test]
fn an_sglang_decode_rank_goes_in_the_decode_legs_body() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Sglang, |_| {});
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Sglang, |c| c.dp_size = 2);
        let cfg = format!(
            "{}{}{}",
            tgt("p0", &p, ""),
            tgt("d0", &dm, "dp_size = 2\n"),
            pd_route(
                PdProtocol::Sglang,
                (&["p0"], "round_robin"),
                (&["d0"], "round_robin")
            )
        );
        let g = Gw::start(d, &cfg);
        let mut ranks = Vec::new();
        for i in 0..4 {
            let id = format!("sg-dp-{i}");
            let r = send(g.addr, CHAT, &id, &[], &chat_body(false));
            complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let (_, pbody) = one_record(&p, &id, ctx);
            let (dr, dbody) = one_record(&dm, &id, ctx);
            assert!(pbody.get("data_parallel_rank").is_none(), "{ctx}: {pbody}");
            let rank = dbody["data_parallel_rank"]
                .as_u64()
                .unwrap_or_else(|| panic!("{ctx}: {dbody}"));
            assert_eq!(
                dbody,
                with(&pbody, &[("data_parallel_rank", json!(rank))]),
                "{ctx}: the decode leg is the prefill's with its rank"
            );
            assert!(dr.header("x-data-parallel-rank").is_none(), "{ctx}");
            assert_eq!(
                (dr.dp_rank, dr.ran_on_rank),
                (Some(rank as u32), rank as u32),
                "{ctx}"
            );
            ranks.push(rank);
        }
        ranks.sort_unstable();
        assert_eq!(ranks, [0, 0, 1, 1], "{ctx}");
    }
}

/// A vLLM decode that fails before any byte reached the client is retried on the other
/// decode target with a fresh prefill: the first prefill's blocks name one decode only.
#[test]
fn a_failed_vllm_decode_is_retried_with_a_fresh_prefill() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Vllm, |_| {});
        let bad = pd_mock("d0", PdRole::Decode, PdProtocol::Vllm, |_| {});
        bad.set_fault(Some(rolter_mock::Fault::Status(503)));
        let good = pd_mock("d1", PdRole::Decode, PdProtocol::Vllm, |_| {});
        let cfg = format!(
            "{}{}{}{}",
            tgt("p0", &p, ""),
            tgt("d0", &bad, ""),
            tgt("d1", &good, ""),
            pd_route(
                PdProtocol::Vllm,
                (&["p0"], "round_robin"),
                (&["d0", "d1"], "round_robin")
            )
        );
        let g = Gw::start(d, &cfg);
        for i in 0..4 {
            let id = format!("retry-{i}");
            let r = send(g.addr, CHAT, &id, &[], &chat_body(i % 2 == 0));
            complete(&r, i % 2 == 0).unwrap_or_else(|e| panic!("{ctx} {id}: {e}"));
            let prefills = records(&p, &id);
            let failed = records(&bad, &id);
            let (_, decoded) = one_record(&good, &id, ctx);
            assert_eq!(
                prefills.len(),
                1 + failed.len(),
                "{ctx} {id}: a prefill per decode leg"
            );
            let kv = &decoded["kv_transfer_params"];
            if let Some(f) = failed.first() {
                let first: Value = serde_json::from_slice(&f.body).unwrap();
                assert_ne!(
                    first["kv_transfer_params"]["remote_block_ids"], kv["remote_block_ids"],
                    "{ctx} {id}: the retry decodes a fresh prefill's blocks"
                );
            }
        }
        assert!(!bad.requests().is_empty(), "{ctx}: d0 was tried");
        let ps = p.pd_stats();
        assert_eq!((ps.pulls_served, ps.pulls_refused), (4, 0), "{ctx}: {ps:?}");
    }
}

/// A reload that changes a disaggregated route's pools takes effect at once: the next
/// request's legs go to the new pools' targets, and the metrics name the new prefill pool.
#[test]
fn a_reload_moves_a_disaggregated_routes_pools() {
    for d in drivers() {
        let ctx = driver_name(d);
        let ps: Vec<MockHandle> = (0..2)
            .map(|i| pd_mock(&format!("p{i}"), PdRole::Prefill, PdProtocol::Vllm, |_| {}))
            .collect();
        let ds: Vec<MockHandle> = (0..2)
            .map(|i| pd_mock(&format!("d{i}"), PdRole::Decode, PdProtocol::Vllm, |_| {}))
            .collect();
        let config = |i: usize| {
            format!(
                "[admin]\nlisten = \"ADMIN\"\n{}{}{}{}{}",
                tgt("p0", &ps[0], ""),
                tgt("p1", &ps[1], ""),
                tgt("d0", &ds[0], ""),
                tgt("d1", &ds[1], ""),
                pd_route(
                    PdProtocol::Vllm,
                    (&[["p0", "p1"][i]], "round_robin"),
                    (&[["d0", "d1"][i]], "least_loaded")
                )
            )
        };
        let g = Gw::start(d, &config(0));
        for (step, i) in [0, 1, 0].into_iter().enumerate() {
            if step > 0 {
                g.reload(&config(i));
            }
            let id = format!("reload-{step}");
            let r = send(g.addr, CHAT, &id, &[], &chat_body(step == 1));
            complete(&r, step == 1).unwrap_or_else(|e| panic!("{ctx} {id}: {e}"));
            let (_, dbody) = one_record(&ds[i], &id, &format!("{ctx} step {step}"));
            one_record(&ps[i], &id, &format!("{ctx} step {step}"));
            assert!(
                records(&ps[1 - i], &id).is_empty() && records(&ds[1 - i], &id).is_empty(),
                "{ctx} step {step}"
            );
            assert_eq!(
                dbody["kv_transfer_params"]["remote_engine_id"],
                ps[i].pd_engine_id().unwrap(),
                "{ctx} step {step}"
            );
        }
        let page = call(g.admin.unwrap(), &request("GET", "/metrics", &[], "")).text();
        assert!(
            page.lines().any(|l| l.starts_with(
                "rolter_requests_total{route=\"chat/prefill\",target=\"p1\",code=\"200\"} 1"
            )),
            "{ctx}:\n{page}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 3: the decode's stream, byte for byte.
// ---------------------------------------------------------------------------------------

/// What an engine sent on each connection, in accept order.
type Taken = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// A TCP relay in front of an engine that keeps, per connection, every byte the engine sent.
struct Tap {
    addr: SocketAddr,
    conns: Taken,
}

impl Tap {
    fn start(to: SocketAddr) -> Tap {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let conns: Taken = Arc::default();
        let all = conns.clone();
        std::thread::spawn(move || {
            for down in l.incoming() {
                let Ok(mut down) = down else { return };
                let Ok(mut up) = TcpStream::connect(to) else {
                    continue;
                };
                let got = Arc::new(Mutex::new(Vec::new()));
                all.lock().unwrap().push(got.clone());
                let (mut down_r, mut up_w) = (down.try_clone().unwrap(), up.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut down_r, &mut up_w);
                    let _ = up_w.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n @ 1..) = up.read(&mut buf) {
                        got.lock().unwrap().extend_from_slice(&buf[..n]);
                        if down.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = down.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Tap { addr, conns }
    }

    /// The bodies of every whole response the engine sent (de-chunked), in order per
    /// connection.
    fn bodies(&self) -> Vec<Vec<u8>> {
        let conns = self.conns.lock().unwrap();
        conns
            .iter()
            .flat_map(|c| bodies(&c.lock().unwrap()))
            .collect()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The bodies of the whole HTTP/1.1 responses in `raw`, one after another.
fn bodies(raw: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(end) = find(&raw[at..], b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&raw[at..at + end]).to_ascii_lowercase();
        let mut pos = at + end + 4;
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse::<usize>().unwrap());
        let body = if let Some(n) = length {
            if raw.len() < pos + n {
                return out;
            }
            pos += n;
            raw[pos - n..pos].to_vec()
        } else if head.contains("transfer-encoding: chunked") {
            let mut body = Vec::new();
            loop {
                let Some(e) = find(&raw[pos..], b"\r\n") else {
                    return out;
                };
                let size = std::str::from_utf8(&raw[pos..pos + e]).unwrap();
                let size =
                    usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
                pos += e + 2;
                if raw.len() < pos + size + 2 {
                    return out;
                }
                body.extend_from_slice(&raw[pos..pos + size]);
                pos += size + 2;
                if size == 0 {
                    break;
                }
            }
            body
        } else {
            return out;
        };
        out.push(body);
        at = pos;
    }
    out
}

#[test]
fn the_decodes_stream_reaches_the_client_byte_for_byte() {
    for d in drivers() {
        for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
            let ctx = format!("{} {}", driver_name(d), protocol_name(protocol));
            let p = pd_mock("p0", PdRole::Prefill, protocol, |_| {});
            let dm = pd_mock("d0", PdRole::Decode, protocol, |c| {
                c.tokens = 40;
                c.itl = Duration::from_millis(1);
            });
            let tap = Tap::start(dm.addr());
            let cfg = format!(
                "{}{}{}",
                tgt("p0", &p, ""),
                target("d0", tap.addr, TIMEOUTS),
                pd_route(
                    protocol,
                    (&["p0"], "round_robin"),
                    (&["d0"], "least_loaded")
                )
            );
            let g = Gw::start(d, &cfg);
            let cases = [
                (CHAT, chat_body(true)),
                (
                    COMPLETIONS,
                    r#"{"model":"m","prompt":"Tell a story","stream":true,"stream_options":{"include_usage":true}}"#.to_string(),
                ),
                (CHAT, chat_body(false)),
            ];
            let mut got = Vec::new();
            for (i, (path, body)) in cases.iter().enumerate() {
                let r = send(g.addr, path, &format!("bytes-{i}"), &[], body);
                complete(&r, is_stream(body)).unwrap_or_else(|e| panic!("{ctx} {i}: {e}"));
                got.push(r.body);
            }
            let mut sent = Vec::new();
            wait_for("the tap's responses", WAIT, || {
                sent = tap.bodies();
                sent.len() >= cases.len()
            });
            assert_eq!(
                sent.len(),
                cases.len(),
                "{ctx}: one decode answer per request"
            );
            // Each answer carries its own random id: exactly one of the decode's matches.
            for (i, body) in got.iter().enumerate() {
                assert!(
                    sent.iter().filter(|s| *s == body).count() == 1,
                    "{ctx} case {i}: the client got\n{}\nthe decode sent\n{}",
                    String::from_utf8_lossy(body),
                    sent.iter()
                        .map(|s| String::from_utf8_lossy(s).to_string())
                        .collect::<Vec<_>>()
                        .join("\n--\n")
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4: a prefill engine killed under load.
// ---------------------------------------------------------------------------------------

/// The access log's JSON lines once there are at least `n`.
fn log_lines(path: &str, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    wait_for(&format!("{n} access-log lines"), WAIT, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        out = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        out.len() >= n
    });
    out
}

const CHILD: &str = "ROLTER_TEST_PD_PREFILL_CHILD";

/// Run as a child: a prefill engine (`<protocol> <port> <bootstrap port>` in
/// `ROLTER_TEST_PD_PREFILL_CHILD`) until killed.
#[test]
fn prefill_engine_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let protocol = parts[0].parse::<PdProtocol>().unwrap();
    let _h = rolter_mock::spawn(MockConfig {
        name: "p0".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], parts[1].parse().unwrap())),
        models: vec!["m".into()],
        ttft: Duration::from_millis(30),
        tokens: 8,
        pd: Some(PdConfig {
            role: PdRole::Prefill,
            protocol,
            bootstrap_port: parts[2].parse().unwrap(),
            handshake_timeout: Duration::from_secs(3),
        }),
        ..MockConfig::default()
    })
    .unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// A prefill engine in a child process (this test binary run as [`prefill_engine_child`]),
/// so that a SIGKILL closes its sockets as the kernel does for a dead engine; its port
/// and its bootstrap port.
fn prefill_process(protocol: PdProtocol) -> (Kill, u16, u16) {
    let (port, bootstrap) = (process::free_port(), process::free_port());
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "prefill_engine_child", "--nocapture"])
        .env(
            CHILD,
            format!("{} {port} {bootstrap}", protocol_name(protocol)),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Kill(child);
    process::wait_listening(SocketAddr::from(([127, 0, 0, 1], port)));
    if protocol == PdProtocol::Sglang {
        process::wait_listening(SocketAddr::from(([127, 0, 0, 1], bootstrap)));
    }
    (child, port, bootstrap)
}

fn killed_prefill_fails_no_request(d: DriverChoice, protocol: PdProtocol) {
    let ctx = format!("{} {}", driver_name(d), protocol_name(protocol));
    let (mut p0, port, bootstrap) = prefill_process(protocol);
    let p1 = pd_mock("p1", PdRole::Prefill, protocol, |c| {
        c.ttft = Duration::from_millis(30)
    });
    let dm = pd_mock("d0", PdRole::Decode, protocol, |c| {
        c.itl = Duration::from_millis(2)
    });
    let dir = tempfile::tempdir().unwrap();
    let log = Gw::log_path(&dir);
    let p0_extra = match protocol {
        PdProtocol::Sglang => format!("bootstrap_port = {bootstrap}\n{TIMEOUTS}"),
        PdProtocol::Vllm => TIMEOUTS.to_string(),
    };
    let cfg = format!(
        "[log]\naccess = \"{log}\"\n{}{}{}{}",
        target("p0", SocketAddr::from(([127, 0, 0, 1], port)), &p0_extra),
        tgt("p1", &p1, ""),
        tgt("d0", &dm, ""),
        pd_route(
            protocol,
            (&["p0", "p1"], "round_robin"),
            (&["d0"], "least_loaded")
        )
    );
    let g = Gw::start(d, &cfg);
    let done = AtomicUsize::new(0);
    let (workers, each) = (4, 10);
    let results: Vec<(String, Result<(), String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let done = &done;
                let addr = g.addr;
                s.spawn(move || {
                    (0..each)
                        .map(|i| {
                            let stream = (w + i) % 2 == 0;
                            let id = format!("kill-{w}-{i}");
                            let r = send(addr, CHAT, &id, &[], &chat_body(stream));
                            done.fetch_add(1, Ordering::Relaxed);
                            (id, complete(&r, stream))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        wait_for("some requests before the kill", WAIT, || {
            done.load(Ordering::Relaxed) >= 8
        });
        // SIGKILL: the kernel closes the engine's connections, mid-request for some.
        p0.0.kill().unwrap();
        let _ = p0.0.wait();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "{ctx}: failed requests: {failed:?}");
    assert_eq!(results.len(), workers * each);
    let lines = log_lines(&log, workers * each);
    let retried: Vec<&Value> = lines
        .iter()
        .filter(|l| l["prefill"]["attempts"].as_u64().unwrap_or(0) >= 2)
        .collect();
    assert!(
        !retried.is_empty(),
        "{ctx}: no prefill leg was retried:\n{lines:#?}"
    );
    for l in &retried {
        let id = l["request_id"].as_str().unwrap();
        assert_eq!(l["prefill"]["target"], "p1", "{ctx}: {l}");
        assert_eq!(l["status"], 200, "{ctx}: {l}");
        assert!(
            !records(&p1, id).is_empty(),
            "{ctx}: p1 served the retry of {id}"
        );
        // The decode that answered took its KV from p1.
        let last = records(&dm, id).pop().expect("the decode leg");
        let body: Value = serde_json::from_slice(&last.body).unwrap();
        match protocol {
            PdProtocol::Vllm => assert_eq!(
                body["kv_transfer_params"]["remote_engine_id"],
                p1.pd_engine_id().unwrap(),
                "{ctx}: {id}"
            ),
            PdProtocol::Sglang => assert_eq!(
                body["bootstrap_port"],
                p1.bootstrap_addr().unwrap().port(),
                "{ctx}: {id}"
            ),
        }
    }
    eprintln!(
        "{ctx}: {} requests, {} with a retried prefill",
        results.len(),
        retried.len()
    );
}

#[test]
fn a_killed_prefill_engine_fails_no_request_vllm() {
    for d in drivers() {
        killed_prefill_fails_no_request(d, PdProtocol::Vllm);
    }
}

#[test]
fn a_killed_prefill_engine_fails_no_request_sglang() {
    for d in drivers() {
        killed_prefill_fails_no_request(d, PdProtocol::Sglang);
    }
}

// ---------------------------------------------------------------------------------------
// 5: a client that goes away.
// ---------------------------------------------------------------------------------------

fn wait_aborted(m: &MockHandle, id: &str, ctx: &str) {
    wait_for(&format!("{ctx}: {} aborting {id}", m.name()), WAIT, || {
        m.aborted_ids().iter().any(|a| a == id)
    });
}

fn wait_received(m: &MockHandle, id: &str, ctx: &str) {
    wait_for(&format!("{ctx}: {} receiving {id}", m.name()), WAIT, || {
        !records(m, id).is_empty()
    });
}

#[test]
fn a_client_disconnect_aborts_the_running_leg_vllm() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Vllm, |_| {});
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Vllm, |_| {});
        let g = Gw::start(d, &pair_config(PdProtocol::Vllm, &p, &dm));
        // During a slow prefill: the prefill is aborted, the decode never asked.
        let mut c = Client::connect(g.addr);
        c.send(&post(
            CHAT,
            &[("x-request-id", "gone-prefill"), ("x-mock-ttft-ms", "2000")],
            &chat_body(true),
        ));
        wait_received(&p, "gone-prefill", ctx);
        drop(c);
        wait_aborted(&p, "gone-prefill", ctx);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            records(&dm, "gone-prefill").is_empty(),
            "{ctx}: the decode was asked"
        );
        assert_eq!(p.pd_stats().pulls_served, 0, "{ctx}");
        // Mid-stream of a slow decode: the decode is aborted.
        let mut c = Client::connect(g.addr);
        c.send(&post(
            CHAT,
            &[
                ("x-request-id", "gone-decode"),
                ("x-mock-itl-ms", "200"),
                ("x-mock-tokens", "50"),
            ],
            &chat_body(true),
        ));
        let (status, _) = c.head().unwrap();
        assert_eq!(status, 200, "{ctx}");
        let mut seen = String::new();
        while seen.matches("\"delta\":{\"content\":\"").count() < 2 {
            let chunk = c.chunk().unwrap().expect("the stream ended early");
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        drop(c);
        wait_aborted(&dm, "gone-decode", ctx);
        assert!(
            !p.aborted_ids().iter().any(|a| a == "gone-decode"),
            "{ctx}: the prefill had ended"
        );
        assert_eq!(p.pd_stats().pulls_served, 1, "{ctx}");
        // The gateway still serves.
        let r = send(g.addr, CHAT, "after", &[], &chat_body(true));
        complete(&r, true).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
}

#[test]
fn a_client_disconnect_aborts_both_sglang_legs() {
    for d in drivers() {
        let ctx = driver_name(d);
        let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Sglang, |_| {});
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Sglang, |_| {});
        let g = Gw::start(d, &pair_config(PdProtocol::Sglang, &p, &dm));
        let mut c = Client::connect(g.addr);
        c.send(&post(
            CHAT,
            &[("x-request-id", "gone-both"), ("x-mock-ttft-ms", "2000")],
            &chat_body(true),
        ));
        wait_received(&p, "gone-both", ctx);
        wait_received(&dm, "gone-both", ctx);
        // Both legs past their handshake, in their time to first token.
        wait_for("the handshake", WAIT, || p.pd_stats().handshakes == 1);
        drop(c);
        wait_aborted(&p, "gone-both", ctx);
        wait_aborted(&dm, "gone-both", ctx);
        let r = send(g.addr, CHAT, "after", &[], &chat_body(false));
        complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------
// 6: data-parallel ranks.
// ---------------------------------------------------------------------------------------

/// `n` requests at once through `addr`, each with its own id `<prefix>-<i>`; all complete.
fn concurrently(addr: SocketAddr, prefix: &str, n: usize, body: &str) {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    let r = send(addr, CHAT, &format!("{prefix}-{i}"), &[], body);
                    complete(&r, is_stream(body))
                })
            })
            .collect();
        for h in hs {
            h.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{prefix}: {e}"));
        }
    });
}

/// The inference requests `m` received.
fn inference(m: &MockHandle) -> Vec<RecordedRequest> {
    m.requests()
        .into_iter()
        .filter(|r| r.path == CHAT)
        .collect()
}

#[test]
fn data_parallel_ranks_in_the_header_spread_and_kept_by_session() {
    for d in drivers() {
        let ctx = driver_name(d);
        for (strategy, sessions) in [("least_loaded", false), ("consistent_hash", true)] {
            let ctx = format!("{ctx} {strategy}");
            let p = pd_mock("p0", PdRole::Prefill, PdProtocol::Vllm, |_| {});
            let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Vllm, |c| {
                c.dp_size = 4;
                c.tokens = 10;
                c.itl = Duration::from_millis(40);
            });
            let cfg = format!(
                "{}{}{}",
                tgt("p0", &p, ""),
                tgt("d0", &dm, "dp_size = 4\n"),
                pd_route(
                    PdProtocol::Vllm,
                    (&["p0"], "round_robin"),
                    (&["d0"], strategy)
                )
            );
            let g = Gw::start(d, &cfg);
            if sessions {
                for round in 0..3 {
                    for s in 0..6 {
                        let session = format!("s{s}");
                        let id = format!("sess-{s}-{round}");
                        let r = send(
                            g.addr,
                            CHAT,
                            &id,
                            &[("x-session-id", &session)],
                            &chat_body(false),
                        );
                        complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    }
                }
            } else {
                concurrently(g.addr, "dp", 12, &chat_body(false));
            }
            let recs = inference(&dm);
            for r in &recs {
                let body: Value = serde_json::from_slice(&r.body).unwrap();
                let header = r
                    .header("x-data-parallel-rank")
                    .map(|h| h.parse::<u32>().unwrap());
                assert!(header.is_some(), "{ctx}: no rank header: {:?}", r.headers);
                assert_eq!(r.dp_rank, header, "{ctx}");
                assert_eq!(Some(r.ran_on_rank), header, "{ctx}");
                assert!(body.get("data_parallel_rank").is_none(), "{ctx}: {body}");
            }
            if sessions {
                assert_eq!(recs.len(), 18, "{ctx}");
                for s in 0..6 {
                    let ranks: std::collections::BTreeSet<u32> = (0..3)
                        .map(|round| {
                            one_record(&dm, &format!("sess-{s}-{round}"), &ctx)
                                .0
                                .ran_on_rank
                        })
                        .collect();
                    assert_eq!(ranks.len(), 1, "{ctx}: session s{s} on ranks {ranks:?}");
                }
            } else {
                assert_eq!(recs.len(), 12, "{ctx}");
                let per_rank: Vec<u64> = dm.rank_stats().iter().map(|r| r.requests).collect();
                assert!(
                    per_rank.iter().all(|&n| n > 0),
                    "{ctx}: requests per rank {per_rank:?}"
                );
                eprintln!("{ctx}: requests per rank {per_rank:?}");
            }
        }
    }
}

#[test]
fn an_sglang_engine_gets_its_rank_in_the_body() {
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("s0", |c| c.dp_size = 4);
        let cfg = format!(
            "{}[[routes]]\nname = \"r\"\ntargets = [\"s0\"]\nstrategy = \"round_robin\"\n",
            tgt("s0", &m, "dp_size = 4\nengine = \"sglang\"\n")
        );
        let g = Gw::start(d, &cfg);
        for i in 0..8 {
            let r = send(g.addr, CHAT, &format!("sg-{i}"), &[], &chat_body(false));
            complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        }
        let client: Value = serde_json::from_str(&chat_body(false)).unwrap();
        let mut ranks = Vec::new();
        for r in inference(&m) {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            let rank = body["data_parallel_rank"]
                .as_u64()
                .unwrap_or_else(|| panic!("{ctx}: no rank in the body: {body}"))
                as u32;
            assert_eq!(
                body,
                with(&client, &[("data_parallel_rank", json!(rank))]),
                "{ctx}"
            );
            assert!(
                r.header("x-data-parallel-rank").is_none(),
                "{ctx}: {:?}",
                r.headers
            );
            assert_eq!((r.dp_rank, r.ran_on_rank), (Some(rank), rank), "{ctx}");
            ranks.push(rank);
        }
        ranks.sort_unstable();
        assert_eq!(
            ranks,
            [0, 0, 1, 1, 2, 2, 3, 3],
            "{ctx}: round_robin over four ranks"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 7: the prefill pool's prefix hit rate.
// ---------------------------------------------------------------------------------------

/// Conversations sent interleaved, each turn's prompt the conversation so far (with a fixed
/// reply per turn) and a new question: seven of eight turns each, so that a rotation over
/// three engines (7 is no multiple of 3) moves each conversation at every turn.
const CONVERSATIONS: usize = 7;
const TURNS: usize = 8;

fn multi_turn(addr: SocketAddr, ctx: &str) {
    let filler = "and then the engine went on to describe, at some length, what it had seen";
    let mut convs: Vec<Vec<Value>> = vec![Vec::new(); CONVERSATIONS];
    for turn in 0..TURNS {
        for (c, msgs) in convs.iter_mut().enumerate() {
            msgs.push(json!({"role": "user", "content": format!("conversation {c} question {turn}: {filler} {filler}")}));
            let body = json!({"model": "m", "max_tokens": 4, "messages": msgs}).to_string();
            let r = send(addr, CHAT, &format!("mt-{c}-{turn}"), &[], &body);
            complete(&r, false).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            msgs.push(
                json!({"role": "assistant", "content": format!("reply {c}.{turn}: {filler}")}),
            );
        }
    }
}

fn hit_rate(ms: &[MockHandle]) -> f64 {
    let (hits, queries) = ms.iter().fold((0, 0), |(h, q), m| {
        let s = m.prefix_cache_stats().expect("the prefix cache is on");
        (h + s.hits, q + s.queries)
    });
    assert!(queries > 0);
    hits as f64 / queries as f64
}

#[test]
fn the_prefill_pools_prefix_hit_rate_matches_a_colocated_routes() {
    for d in drivers() {
        let ctx = driver_name(d);
        let cached = |c: &mut MockConfig| c.prefix_cache = Some(Default::default());
        let pre: Vec<MockHandle> = (0..3)
            .map(|i| pd_mock(&format!("p{i}"), PdRole::Prefill, PdProtocol::Vllm, cached))
            .collect();
        let dm = pd_mock("d0", PdRole::Decode, PdProtocol::Vllm, |_| {});
        let mut cfg: String = pre
            .iter()
            .enumerate()
            .map(|(i, m)| tgt(&format!("p{i}"), m, ""))
            .collect();
        cfg.push_str(&tgt("d0", &dm, ""));
        cfg.push_str(&pd_route(
            PdProtocol::Vllm,
            (&["p0", "p1", "p2"], "cache_aware"),
            (&["d0"], "least_loaded"),
        ));
        let g = Gw::start(d, &cfg);
        multi_turn(g.addr, ctx);
        drop(g);
        // The same workload on a co-located route over fresh engines, with `strategy`.
        let colocated = |strategy: &str| {
            let colo: Vec<MockHandle> = (0..3).map(|i| mock(&format!("c{i}"), cached)).collect();
            let mut cfg: String = colo
                .iter()
                .enumerate()
                .map(|(i, m)| tgt(&format!("c{i}"), m, ""))
                .collect();
            cfg.push_str(&format!(
                "[[routes]]\nname = \"r\"\ntargets = [\"c0\", \"c1\", \"c2\"]\nstrategy = \"{strategy}\"\n"
            ));
            let g = Gw::start(d, &cfg);
            multi_turn(g.addr, ctx);
            hit_rate(&colo)
        };
        let (pd, co, rr) = (
            hit_rate(&pre),
            colocated("cache_aware"),
            colocated("round_robin"),
        );
        eprintln!(
            "{ctx}: prefix hit rate: prefill pool {:.1} %, co-located cache_aware {:.1} % (round_robin {:.1} %)",
            pd * 100.0,
            co * 100.0,
            rr * 100.0
        );
        assert!(
            pd > rr + 0.2,
            "{ctx}: the prefill pool hit {pd:.3}, a rotation {rr:.3}"
        );
        assert!(
            (pd - co).abs() <= 0.02,
            "{ctx}: prefill pool {pd:.3}, co-located {co:.3}"
        );
        assert_eq!(
            dm.pd_stats().decodes,
            (CONVERSATIONS * TURNS) as u64,
            "{ctx}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 8: `rolter check` on bad P/D configurations.
// ---------------------------------------------------------------------------------------

#[test]
fn check_names_every_pd_error_and_run_refuses_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let port = process::free_port();
    let mut text = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n");
    for t in ["p0", "p1", "d0", "d1"] {
        text.push_str(&format!(
            "[[targets]]\nname = \"{t}\"\nurl = \"http://127.0.0.1:9\"\n"
        ));
    }
    let pools =
        "prefill = { targets = [\"p0\", \"p1\"] }\ndecode = { targets = [\"d0\", \"d1\"] }\n";
    // routes[0]: an unknown protocol; [1]: an empty prefill pool; [2]: p1 in both pools
    // under sglang; [3]: targets of its own besides the pools.
    text.push_str(&format!(
        "[[routes]]\nname = \"a\"\ndisaggregation = \"nixl\"\n{pools}"
    ));
    text.push_str("[[routes]]\nname = \"b\"\ndisaggregation = \"vllm\"\nprefill = { targets = [] }\ndecode = { targets = [\"d0\"] }\n");
    text.push_str("[[routes]]\nname = \"c\"\ndisaggregation = \"sglang\"\nprefill = { targets = [\"p0\", \"p1\"] }\ndecode = { targets = [\"d0\", \"p1\"] }\n");
    text.push_str(&format!(
        "[[routes]]\nname = \"e\"\ndisaggregation = \"vllm\"\ntargets = [\"d0\"]\n{pools}"
    ));
    let path = dir.path().join("pd.toml");
    std::fs::write(&path, &text).unwrap();
    let out = Command::new(BIN)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let keys = [
        "routes[0].disaggregation",
        "routes[1].prefill.targets",
        "routes[2].decode.targets[1]",
        "routes[3].targets",
    ];
    for key in keys {
        let n = err
            .lines()
            .filter(|l| l.contains(&format!(": {key}: ")))
            .count();
        assert_eq!(n, 1, "one message for {key}:\n{err}");
    }
    let errors = err.lines().filter(|l| l.contains(" (fix: ")).count();
    assert_eq!(errors, keys.len(), "one message per error:\n{err}");
    assert!(
        err.contains("`nixl`") && err.contains("`p1` is in both pools"),
        "{err}"
    );
    // `run` refuses the same file (before binding its listener).
    let mut child = Kill(
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = process::wait_exit(&mut child, WAIT);
    assert_eq!(status.code(), Some(2));
}

/// A body with a field twice cannot be split into two legs faithfully: the gateway refuses
/// it with a 400 in the API's shape, and no engine is asked.
#[test]
fn a_body_with_a_field_twice_is_refused_before_either_leg() {
    for d in drivers() {
        let ctx = driver_name(d);
        for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
            let p = pd_mock("p0", PdRole::Prefill, protocol, |_| {});
            let dm = pd_mock("d0", PdRole::Decode, protocol, |_| {});
            let g = Gw::start(d, &pair_config(protocol, &p, &dm));
            let body =
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":1,"seed":2}"#;
            let r = send(g.addr, CHAT, "twice", &[], body);
            assert_eq!(r.status, 400, "{ctx}: {}", String::from_utf8_lossy(&r.body));
            let e = r.json();
            assert_eq!(e["error"]["code"], "invalid_json", "{ctx}: {e}");
            assert!(
                e["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("`seed` appears twice"),
                "{ctx}: {e}"
            );
            assert!(p.requests().is_empty() && dm.requests().is_empty(), "{ctx}");
        }
    }
}
