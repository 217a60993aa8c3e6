//! The LMCache controller stand-in fed by mock engines' LMCache workers: lookups follow
//! what the engines store and evict, the engines' frames are what LMCache sends, and the
//! HTTP side keeps connections alive and obeys its test hooks.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rolter_mock::lmcache_wire::{chunk_keys, WorkerMsg};
use rolter_mock::{
    Controller, ControllerConfig, Driver, LmcacheWorkerConfig, MockHandle, PrefixCacheConfig,
};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);
/// Prefill cost per uncached token; an 833-token prompt takes ~0.4 s cold.
const PREFILL_US: u64 = 500;

fn controller() -> Controller {
    Controller::start(ControllerConfig::default()).expect("start controller")
}

/// An engine whose GPU prefix cache holds nothing (so only LMCache hits count) and whose
/// LMCache worker holds `capacity_chunks` chunks of 256 tokens.
fn engine(name: &str, ctl: &str, capacity_chunks: usize) -> MockHandle {
    common::start(Driver::Epoll, |c| {
        c.name = name.to_string();
        c.prefix_cache = Some(PrefixCacheConfig {
            capacity_blocks: 0,
            prefill_us_per_token: PREFILL_US,
            ..PrefixCacheConfig::default()
        });
        c.lmcache = Some(LmcacheWorkerConfig {
            controller: ctl.to_string(),
            capacity_chunks,
            ..LmcacheWorkerConfig::default()
        });
    })
}

/// `n` characters of deterministic text, different for each seed.
fn text(seed: u64, n: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut s = String::with_capacity(n + 8);
    while s.len() < n {
        let len = rng.usize(2..9);
        for _ in 0..len {
            s.push(rng.lowercase());
        }
        s.push(' ');
    }
    s.truncate(n);
    s
}

fn chat_body(content: &str) -> String {
    json!({"model": "mock-model", "messages": [{"role": "user", "content": content}]}).to_string()
}

/// Sends a chat request; returns the answer's JSON and how long it took.
fn chat(h: &MockHandle, body: &str) -> (Value, Duration) {
    let t = Instant::now();
    let mut c = Client::connect(h.addr());
    c.send(&post("/v1/chat/completions", &[], body));
    let r = c.response().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    (r.json(), t.elapsed())
}

/// The engine's token ids for a body (`POST /tokenize`).
fn tokenize(h: &MockHandle, body: &str) -> Vec<u64> {
    let r = call(h.addr(), &post("/tokenize", &[], body));
    assert_eq!(r.status, 200);
    r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn lookup_request(tokens: &[u64]) -> String {
    post("/lookup", &[], &json!({ "tokens": tokens }).to_string())
}

/// `POST /lookup` on a fresh connection; returns `layout_info`.
fn lookup(ctl: &Controller, tokens: &[u64]) -> Value {
    let r = call(ctl.http_addr(), &lookup_request(tokens));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let j = r.json();
    assert!(j["event_id"].as_str().unwrap().starts_with("Lookup"));
    j["layout_info"].clone()
}

/// Waits until the engines have handed every queued message to ZMQ and the controller has
/// applied them all.
fn caught_up(ctl: &Controller, engines: &[&MockHandle]) {
    wait_for("the controller to catch up", WAIT, || {
        let stats: Vec<_> = engines.iter().map(|h| h.lmcache_stats().unwrap()).collect();
        let sent: u64 = stats.iter().map(|s| s.sent_messages).sum();
        stats.iter().all(|s| s.pending_messages == 0) && ctl.messages() == sent
    });
}

#[test]
fn lookups_follow_what_engines_store_evict_and_deregister() {
    let ctl = controller();
    let a = engine("engine-a", ctl.pull_endpoint(), 8);
    let b = engine("engine-b", ctl.pull_endpoint(), 64);
    wait_for("both registrations", WAIT, || ctl.workers().len() == 2);

    // P: 4 chunks (3 full, then a partial one).
    let p_text = text(1, 3300);
    let p = chat_body(&p_text);
    let p_tokens = tokenize(&a, &p);
    let n = p_tokens.len() as u64;
    assert!(n > 768 && n < 1024, "{n}");
    assert_eq!(tokenize(&b, &p), p_tokens, "engines tokenize alike");
    assert_eq!(lookup(&ctl, &p_tokens), json!({}));

    let (cold_a, _) = chat(&a, &p);
    assert_eq!(cold_a["usage"]["prompt_tokens"], n);
    assert_eq!(cold_a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    caught_up(&ctl, &[&a, &b]);
    assert_eq!(
        lookup(&ctl, &p_tokens),
        json!({"engine-a": ["LocalCPUBackend", n]})
    );
    let s = a.lmcache_stats().unwrap();
    assert_eq!((s.admitted_chunks, s.resident_chunks), (4, 4));
    assert_eq!((s.lookups, s.query_tokens, s.hit_tokens), (1, n, 0));

    // P2 shares P's first 1100 characters: its first chunk (1024 bytes) only.
    let p2 = chat_body(&format!("{}{}", &p_text[..1100], text(2, 2200)));
    let p2_tokens = tokenize(&a, &p2);
    assert_eq!(
        lookup(&ctl, &p2_tokens),
        json!({"engine-a": ["LocalCPUBackend", 256]})
    );
    // A prefix of P that ends inside a chunk matches the full chunks before it.
    assert_eq!(
        lookup(&ctl, &p_tokens[..600]),
        json!({"engine-a": ["LocalCPUBackend", 512]})
    );

    // P on B: cold there. A stays the first holder of every chunk.
    let (cold_b, cold) = chat(&b, &p);
    assert_eq!(cold_b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    caught_up(&ctl, &[&a, &b]);
    assert_eq!(
        lookup(&ctl, &p_tokens),
        json!({"engine-a": ["LocalCPUBackend", n]})
    );

    // P on A again: all of it comes from LMCache, and the first token comes sooner.
    let (warm_a, warm) = chat(&a, &p);
    assert_eq!(warm_a["usage"]["prompt_tokens_details"]["cached_tokens"], n);
    let s = a.lmcache_stats().unwrap();
    assert_eq!((s.lookups, s.query_tokens, s.hit_tokens), (2, 2 * n, n));
    assert_eq!(s.admitted_chunks, 4, "nothing new to admit");
    assert!(cold >= Duration::from_micros(PREFILL_US * n), "{cold:?}");
    assert!(warm < cold / 2, "warm {warm:?} vs cold {cold:?}");
    assert_eq!(
        metric(a.addr(), "lmcache:num_requested_tokens_total"),
        (2 * n) as f64
    );
    assert_eq!(metric(a.addr(), "lmcache:num_hit_tokens_total"), n as f64);
    assert_eq!(
        metric(a.addr(), "lmcache:local_cache_usage"),
        (4 * 256 * 2) as f64
    );

    // Two more 4-chunk prompts on A (capacity 8) evict all of P: B is P's holder now.
    for seed in [10, 11] {
        chat(&a, &chat_body(&text(seed, 3300)));
    }
    let s = a.lmcache_stats().unwrap();
    assert_eq!(
        (s.admitted_chunks, s.evicted_chunks, s.resident_chunks),
        (12, 4, 8)
    );
    caught_up(&ctl, &[&a, &b]);
    assert_eq!(
        lookup(&ctl, &p_tokens),
        json!({"engine-b": ["LocalCPUBackend", n]})
    );
    assert_eq!(
        lookup(&ctl, &p2_tokens),
        json!({"engine-b": ["LocalCPUBackend", 256]})
    );
    assert_eq!(ctl.keys(), 12, "A's 8 chunks, B's 4");

    // B goes away: its chunks leave the pool with its registration.
    b.shutdown();
    wait_for("B's deregistration", WAIT, || ctl.workers().len() == 1);
    assert_eq!(lookup(&ctl, &p_tokens), json!({}));
    assert_eq!(ctl.keys(), 8);
    assert_eq!(ctl.rejected_frames(), 0);
}

#[test]
fn query_instance_maps_addresses_to_instances() {
    let ctl = controller();
    let a = engine("engine-a", ctl.pull_endpoint(), 8);
    let b = common::start(Driver::Epoll, |c| {
        c.name = "engine-b".into();
        c.lmcache = Some(LmcacheWorkerConfig {
            controller: ctl.pull_endpoint().to_string(),
            instance_id: "pod-b".into(),
            ..LmcacheWorkerConfig::default()
        });
    });
    assert_eq!(b.lmcache_instance_id(), Some("pod-b"));
    assert!(
        b.prefix_cache_stats().is_some(),
        "lmcache turns the prefix cache on"
    );
    wait_for("both registrations", WAIT, || ctl.workers().len() == 2);
    let workers = ctl.workers();
    assert_eq!(
        workers
            .iter()
            .map(|w| (w.instance_id.as_str(), w.ip.as_str(), w.port))
            .collect::<Vec<_>>(),
        [
            ("engine-a", "127.0.0.1", a.addr().port()),
            ("pod-b", "127.0.0.1", b.addr().port())
        ]
    );
    let query = |ip: &str| {
        let body = json!({"event_id": "q1", "ip": ip}).to_string();
        let r = call(ctl.http_addr(), &post("/query_instance", &[], &body));
        assert_eq!(r.status, 200);
        let j = r.json();
        assert_eq!(j["event_id"], "q1");
        j["res"].clone()
    };
    assert_eq!(query(&a.addr().to_string()), "engine-a");
    assert_eq!(query(&b.addr().to_string()), "pod-b");
    let by_ip = query("127.0.0.1");
    assert!(by_ip == "engine-a" || by_ip == "pod-b", "{by_ip}");
    assert_eq!(query("10.1.2.3"), Value::Null);
}

#[test]
fn engine_frames_are_lmcache_msgpack_maps_keyed_by_chunk() {
    // A bare PULL socket stands in for the controller.
    let ctx = zmq::Context::new();
    let pull = ctx.socket(zmq::PULL).unwrap();
    pull.bind("tcp://127.0.0.1:*").unwrap();
    let ep = pull.get_last_endpoint().unwrap().unwrap();
    let h = common::start(Driver::Epoll, |c| {
        c.name = "eng".into();
        c.lmcache = Some(LmcacheWorkerConfig {
            controller: ep.clone(),
            chunk_size: 64,
            worker_id: 3,
            location: "LocalCPUBackend".into(),
            ..LmcacheWorkerConfig::default()
        });
    });
    let frames = || -> Vec<Vec<u8>> {
        assert!(pull.poll(zmq::POLLIN, 5_000).unwrap() > 0, "no message");
        pull.recv_multipart(0).unwrap()
    };
    let reg = frames();
    assert_eq!(reg.len(), 1);
    let v = rmpv::decode::read_value(&mut &reg[0][..]).unwrap();
    let map = v.as_map().expect("a msgpack map (msgspec tag=True)");
    assert_eq!(map[0].0.as_str(), Some("type"));
    assert_eq!(map[0].1.as_str(), Some("RegisterMsg"));
    let fields: Vec<&str> = map.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(
        fields,
        [
            "type",
            "instance_id",
            "worker_id",
            "ip",
            "port",
            "distributed_url"
        ]
    );

    let body = chat_body(&text(5, 700));
    let tokens = tokenize(&h, &body);
    let expect: Vec<i128> = chunk_keys(&tokens_i64(&tokens), 64)
        .iter()
        .map(|c| c.key.into())
        .collect();
    assert!(expect.len() >= 3);
    chat(&h, &body);
    let mut admitted = Vec::new();
    while admitted.len() < expect.len() {
        for f in frames() {
            let v = rmpv::decode::read_value(&mut &f[..]).unwrap();
            let map = v.as_map().unwrap();
            assert_eq!(map[0].0.as_str(), Some("type"));
            match WorkerMsg::decode(&f).unwrap() {
                WorkerMsg::Admit(c) => {
                    assert_eq!(map[0].1.as_str(), Some("KVAdmitMsg"));
                    assert_eq!(
                        (c.instance_id.as_str(), c.worker_id, c.location.as_str()),
                        ("eng", 3, "LocalCPUBackend")
                    );
                    admitted.push(c.key);
                }
                WorkerMsg::Heartbeat(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(admitted, expect);

    // Shutdown deregisters (after any heartbeat still queued).
    h.shutdown();
    loop {
        let f = frames();
        match WorkerMsg::decode(f.last().unwrap()).unwrap() {
            WorkerMsg::DeRegister {
                instance_id,
                worker_id,
                ..
            } => {
                assert_eq!((instance_id.as_str(), worker_id), ("eng", 3));
                break;
            }
            WorkerMsg::Heartbeat(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn tokens_i64(tokens: &[u64]) -> Vec<i64> {
    tokens.iter().map(|&t| t as i64).collect()
}

#[test]
fn controller_takes_json_and_msgpack_frames_and_skips_bad_ones() {
    let ctl = controller();
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(ctl.pull_endpoint()).unwrap();
    let tokens: Vec<u64> = (1000..1600).collect(); // chunks end at 256, 512, 600
    let keys = chunk_keys(&tokens_i64(&tokens), 256);
    // Chunk 0 from a JSON frame, chunk 1 in a multipart message with a bad frame.
    let json_admit = format!(
        r#"{{"type":"KVAdmitMsg","instance_id":"ext","worker_id":0,"key":{},"location":"cpu"}}"#,
        keys[0].key
    );
    push.send(json_admit.as_bytes(), 0).unwrap();
    let admit1 = WorkerMsg::Admit(rolter_mock::lmcache_wire::ChunkMsg {
        instance_id: "ext".into(),
        worker_id: 0,
        key: keys[1].key.into(),
        location: "cpu".into(),
    });
    push.send_multipart([&b"\x92\x01\x02"[..], &admit1.to_msgpack()[..]], 0)
        .unwrap();
    wait_for("both frames", WAIT, || {
        ctl.messages() == 2 && ctl.rejected_frames() == 1
    });
    assert_eq!(lookup(&ctl, &tokens), json!({"ext": ["cpu", 512]}));
    assert_eq!(ctl.lookup(&[1000, 1001]), []);
    assert_eq!(
        ctl.lookup(&tokens.iter().map(|&t| t as u32).collect::<Vec<_>>())
            .len(),
        1
    );
}

#[test]
fn http_keeps_connections_alive_and_answers_errors() {
    let ctl = controller();
    let mut c = Client::connect(ctl.http_addr());
    let mut ids = std::collections::HashSet::new();
    for i in 0..50u64 {
        c.send(&lookup_request(&[i, i + 1, i + 2]));
        let r = c.response().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), None);
        assert_eq!(r.json()["layout_info"], json!({}));
        ids.insert(r.json()["event_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ctl.lookups(), 50);
    assert_eq!(ids.len(), 50, "event ids are unique");

    // Pipelined requests on the same connection, answered in order.
    let mut two = lookup_request(&[1]);
    two.push_str(&request("GET", "/health", &[], ""));
    c.send(&two);
    assert_eq!(c.response().unwrap().json()["layout_info"], json!({}));
    assert_eq!(c.response().unwrap().status, 200);

    // Errors keep the connection too.
    for (req, status) in [
        (post("/lookup", &[], "{not json"), 400),
        (post("/lookup", &[], r#"{"tokens":"abc"}"#), 422),
        (post("/lookup", &[], r#"{"tokens":[1,"x"]}"#), 422),
        (post("/lookup", &[], "[1,2]"), 422),
        (post("/query_instance", &[], r#"{"ip":"1.2.3.4"}"#), 422),
        (request("GET", "/lookup", &[], ""), 405),
        (request("GET", "/nope", &[], ""), 404),
    ] {
        c.send(&req);
        let r = c.response().unwrap();
        assert_eq!(r.status, status, "{req}");
        assert!(r.json()["detail"].is_string(), "{}", r.text());
    }
    assert_eq!(ctl.lookups(), 55);

    // Chunked request bodies are read too.
    c.send("POST /lookup HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"tok\r\n9\r\nens\":[1]}\r\n0\r\n\r\n");
    assert_eq!(c.response().unwrap().status, 200);

    // `Connection: close` is honoured.
    c.send(&post(
        "/lookup",
        &[("connection", "close")],
        r#"{"tokens":[]}"#,
    ));
    let r = c.response().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    let mut rest = Vec::new();
    assert_eq!(
        c.r.read_to_end(&mut rest).unwrap(),
        0,
        "closed after the answer"
    );
}

#[test]
fn delay_failing_and_shutdown_hooks() {
    let ctl = controller();
    let health = request("GET", "/health", &[], "");
    assert_eq!(call(ctl.http_addr(), &health).status, 200);

    // Delay: every answer waits; a client with a shorter timeout gives up.
    ctl.set_delay(Duration::from_millis(300));
    let t = Instant::now();
    assert_eq!(call(ctl.http_addr(), &lookup_request(&[1])).status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let mut c = Client::connect(ctl.http_addr());
    c.stream()
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    c.send(&health);
    assert!(c.response().is_err(), "answer came before the delay");
    ctl.set_delay(Duration::ZERO);
    let t = Instant::now();
    assert_eq!(call(ctl.http_addr(), &health).status, 200);
    assert!(t.elapsed() < Duration::from_millis(300));

    // Failing: the queries answer 503 with a JSON error; health stays up.
    ctl.set_failing(true);
    let before = ctl.lookups();
    let r = call(ctl.http_addr(), &lookup_request(&[1, 2]));
    assert_eq!(r.status, 503);
    assert!(r.json()["detail"].is_string());
    assert_eq!(ctl.lookups(), before + 1, "failed lookups count");
    let q = post("/query_instance", &[], r#"{"event_id":"e","ip":"x"}"#);
    assert_eq!(call(ctl.http_addr(), &q).status, 503);
    assert_eq!(call(ctl.http_addr(), &health).status, 200);
    ctl.set_failing(false);
    assert_eq!(call(ctl.http_addr(), &lookup_request(&[1])).status, 200);

    // Shutdown: open connections close, new ones are refused.
    let mut idle = Client::connect(ctl.http_addr());
    idle.send(&health);
    assert_eq!(idle.response().unwrap().status, 200);
    let addr = ctl.http_addr();
    ctl.shutdown();
    let mut rest = Vec::new();
    assert_eq!(idle.r.read_to_end(&mut rest).unwrap_or(0), 0);
    assert!(TcpStream::connect(addr).is_err(), "connect after shutdown");
    ctl.shutdown(); // idempotent
}

/// A child process, killed (SIGTERM, then waited for) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: signals our own child by its pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Starts the binary and returns it with the stdout lines that contain `want` (read
/// until each has appeared once).
fn run_bin(args: &[&str], want: &[&str]) -> (Proc, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rolter-mock"))
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let mut found = Vec::new();
    for w in want {
        loop {
            let line = lines.next().expect("the binary exited").unwrap();
            if line.contains(w) {
                found.push(line);
                break;
            }
        }
    }
    (proc, found)
}

#[test]
fn cli_runs_the_controller_and_an_engine_worker() {
    let (_ctl, lines) = run_bin(
        &[
            "lmcache-controller",
            "--http",
            "127.0.0.1:0",
            "--pull",
            "tcp://127.0.0.1:0",
            "--chunk-size",
            "32",
        ],
        &["lmcache controller stand-in"],
    );
    // "lmcache controller stand-in: http on ADDR, pull on EP (chunk size 32)"
    let line = &lines[0];
    let http: SocketAddr = line
        .split("http on ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let pull = line
        .split("pull on ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert_eq!(call(http, &request("GET", "/health", &[], "")).status, 200);

    let (_eng, lines) = run_bin(
        &[
            "--listen",
            "127.0.0.1:0",
            "--name",
            "cli-eng",
            "--driver",
            "epoll",
            "--lmcache-controller",
            pull,
            "--lmcache-instance-id",
            "pod-7",
            "--lmcache-chunk-size",
            "32",
            "--lmcache-capacity-chunks",
            "100",
        ],
        &["listening on", "lmcache worker pod-7"],
    );
    let addr: SocketAddr = lines[0]
        .split("listening on ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let body = chat_body(&text(9, 200));
    let r = call(addr, &post("/v1/chat/completions", &[], &body));
    assert_eq!(r.status, 200);
    let tokens: Vec<u64> = call(addr, &post("/tokenize", &[], &body)).json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let n = tokens.len();
    wait_for("the engine's chunks at the controller", WAIT, || {
        let r = call(http, &lookup_request(&tokens));
        r.json()["layout_info"] == json!({"pod-7": ["LocalCPUBackend", n]})
    });
    let r = call(
        http,
        &post(
            "/query_instance",
            &[],
            &json!({"event_id": "e", "ip": addr.to_string()}).to_string(),
        ),
    );
    assert_eq!(r.json()["res"], "pod-7");
}
