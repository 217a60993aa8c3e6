//! Admission through the binary, under both drivers, in front of two mock engines capped
//! by `max_concurrent` (four places in all, two workers): an interactive and a batch key
//! both over capacity (the interactive class's queue wait against the batch class's, and
//! which requests are displaced, with a queue that never fills and one that does); three
//! tenants, one sending ten times the others, and the tokens each is served; a deadline no
//! engine is predicted to meet, and one that passes in the queue; and the class reaching
//! the engines as vLLM's `priority` field.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::binary::Gw;
use common::*;
use rolter::config::{self, DriverChoice};
use rolter_mock::MockHandle;
use serde_json::Value;

const KEYS: [&str; 4] = [
    "rolter_admission_key_interactive_0123456789",
    "rolter_admission_key_batch_0123456789abcdef",
    "rolter_admission_key_tenant_c_0123456789abc",
    "rolter_admission_key_chooser_0123456789abcd",
];

const CLASSES: &str =
    "[[classes]]\nname = \"interactive\"\nrank = 0\n\n[[classes]]\nname = \"batch\"\nrank = 1\n\n";

/// The `[[keys]]` tables: `interactive`, `batch`, `tenant-c` (batch) and `chooser`
/// (batch, may choose its class).
fn keys() -> String {
    let mut out = String::new();
    let rows = [
        ("interactive", "priority = \"interactive\""),
        ("batch", "priority = \"batch\""),
        ("tenant-c", "priority = \"batch\""),
        ("chooser", "priority = \"batch\"\nset_priority = true"),
    ];
    for (i, (name, extra)) in rows.iter().enumerate() {
        out.push_str(&format!(
            "[[keys]]\nname = \"{name}\"\nhash = \"{}\"\n{extra}\n\n",
            config::key_hash(KEYS[i])
        ));
    }
    out
}

/// Two engines of `ttft`, two places each, the given target settings; one route `r`.
fn fleet(ttft: Duration, target_extra: &str, route_extra: &str) -> (Vec<MockHandle>, String) {
    let mocks: Vec<MockHandle> = (0..2)
        .map(|i| {
            mock(&format!("e{i}"), |c| {
                c.ttft = ttft;
                c.itl = Duration::from_millis(1);
                c.tokens = 12;
            })
        })
        .collect();
    let mut rest = format!("{CLASSES}{}", keys());
    for (i, m) in mocks.iter().enumerate() {
        rest.push_str(&format!(
            "[[targets]]\nname = \"e{i}\"\nurl = \"http://{}\"\nmax_concurrent = 2\n{target_extra}\n\n",
            m.addr()
        ));
    }
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [\"e0\", \"e1\"]\nretries = 0\n{route_extra}\n"
    ));
    (mocks, rest)
}

fn body(max_tokens: u32) -> String {
    format!(r#"{{"model":"m","prompt":"hello there","max_tokens":{max_tokens}}}"#)
}

/// What one client loop's answer came to.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    code: String,
    tokens: u64,
    /// When it ended, from the start of the run.
    at: Duration,
}

/// `loops` clients with `key`, each on its own connection, sending `body` one after the
/// other until `run` has passed since the barrier; every answer.
fn load(
    addr: SocketAddr,
    key: &'static str,
    loops: usize,
    body: String,
    run: Duration,
    start: Arc<Barrier>,
) -> Vec<std::thread::JoinHandle<Vec<Answer>>> {
    (0..loops)
        .map(|_| {
            let (start, body) = (start.clone(), body.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let auth = format!("Bearer {key}");
                start.wait();
                let t0 = Instant::now();
                let mut out = Vec::new();
                while t0.elapsed() < run {
                    c.send(&post(
                        "/v1/completions",
                        &[("authorization", auth.as_str())],
                        &body,
                    ));
                    let Ok(r) = c.response() else {
                        c = Client::connect(addr);
                        continue;
                    };
                    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                    out.push(Answer {
                        status: r.status,
                        code: v["error"]["code"].as_str().unwrap_or("").to_string(),
                        tokens: v["usage"]["total_tokens"].as_u64().unwrap_or(0),
                        at: t0.elapsed(),
                    });
                    if r.status != 200 {
                        // A refused client backs off briefly, as SDKs do.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if r.header("connection") == Some("close") {
                        c = Client::connect(addr);
                    }
                }
                out
            })
        })
        .collect()
}

fn joined(hs: Vec<std::thread::JoinHandle<Vec<Answer>>>) -> Vec<Answer> {
    hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

fn p99(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty());
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.99).ceil() as usize).min(v.len()) - 1]
}

/// The access log's lines, once it holds `n` (every answer is logged).
fn logged(g: &Gw, n: usize) -> Vec<Value> {
    let mut lines = Vec::new();
    wait_for("the access log's lines", Duration::from_secs(10), || {
        lines = g.access_log();
        lines.len() >= n
    });
    lines
}

/// The queue waits (ms) the access log shows for class `class` (0 for a request that
/// did not wait).
fn waits(lines: &[Value], class: &str) -> Vec<f64> {
    lines
        .iter()
        .filter(|l| l["class"] == class && l["status"] == 200)
        .map(|l| l["queue_wait_ms"].as_f64().unwrap_or(0.0))
        .collect()
}

fn displaced(g: &Gw, class: &str, tenant: &str) -> f64 {
    g.series(&format!(
        "rolter_admission_requests_total{{route=\"r\",class=\"{class}\",tenant=\"{tenant}\",result=\"displaced\"}}"
    ))
    .unwrap_or(0.0)
}

/// Interactive and batch clients, both over capacity, for `run`: their answers and the
/// gateway.
fn two_classes(d: DriverChoice, queue_max: usize) -> (Gw, Vec<Answer>, Vec<Answer>) {
    let (mocks, rest) = fleet(
        Duration::from_millis(60),
        "",
        &format!("queue_max = {queue_max}\nqueue_timeout = \"20s\""),
    );
    let g = Gw::start_logging(d, 2, "", &rest, true);
    let run = Duration::from_secs(3);
    let start = Arc::new(Barrier::new(18));
    let i = load(g.addr, KEYS[0], 6, body(4), run, start.clone());
    let b = load(g.addr, KEYS[1], 12, body(4), run, start);
    let (i, b) = (joined(i), joined(b));
    drop(mocks);
    (g, i, b)
}

#[test]
fn the_interactive_class_goes_first_and_is_never_displaced() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (g, inter, batch) = two_classes(d, 64);
        assert!(inter.iter().all(|a| a.status == 200), "{ctx}: {inter:?}");
        let lines = logged(&g, inter.len() + batch.len());
        // Each line names the class it was admitted as; its tenant is its key (a `tenant`
        // field appears only for a route's `tenant_header`).
        for l in &lines {
            assert_eq!(l["class"], l["key"], "{ctx}: {l}");
            assert!(l.get("tenant").is_none(), "{ctx}: {l}");
        }
        let (wi, wb) = (waits(&lines, "interactive"), waits(&lines, "batch"));
        let (pi, pb) = (p99(wi.clone()), p99(wb.clone()));
        eprintln!(
            "{ctx}: interactive {} served, queue wait p99 {pi:.1} ms; batch {} served, p99 {pb:.1} ms",
            wi.len(),
            wb.len()
        );
        assert!(
            pi < 0.1 * pb,
            "{ctx}: interactive p99 {pi} ms, batch {pb} ms"
        );
        // 18 clients never fill a queue of 64: nothing is displaced.
        assert_eq!(displaced(&g, "interactive", "interactive"), 0.0, "{ctx}");
        assert_eq!(displaced(&g, "batch", "batch"), 0.0, "{ctx}");
        assert!(batch.iter().all(|a| a.code != "displaced"), "{ctx}");
    }
}

#[test]
fn batch_requests_are_displaced_only_while_the_queue_is_full() {
    for d in drivers() {
        let ctx = driver_name(d);
        // Six interactive clients always find a seat in a queue of eight; twelve batch
        // clients fill it.
        let (g, inter, batch) = two_classes(d, 8);
        assert!(inter.iter().all(|a| a.status == 200), "{ctx}: {inter:?}");
        let shown = batch.iter().filter(|a| a.code == "displaced").count();
        let counted = displaced(&g, "batch", "batch");
        assert!(shown > 0, "{ctx}: a full queue displaces batch requests");
        assert_eq!(counted, shown as f64, "{ctx}");
        assert_eq!(displaced(&g, "interactive", "interactive"), 0.0, "{ctx}");
        // Every batch refusal is the full queue's: displaced, or no seat at all.
        for a in batch.iter().filter(|a| a.status != 200) {
            assert_eq!(a.status, 503, "{ctx}: {a:?}");
            assert!(
                matches!(a.code.as_str(), "displaced" | "queue_full"),
                "{ctx}: {a:?}"
            );
        }
    }
}

/// Jain's fairness index of `x`.
fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    sum * sum / (x.len() as f64 * sq)
}

#[test]
fn three_tenants_one_flooding_are_served_equal_tokens_over_two_workers() {
    for d in drivers() {
        let ctx = driver_name(d);
        // One class: the three keys are tenants of it, told apart by key.
        let (mocks, rest) = fleet(
            Duration::from_millis(40),
            "",
            "queue_max = 128\nqueue_timeout = \"30s\"",
        );
        let rest = rest.replace("priority = \"interactive\"", "priority = \"batch\"");
        let g = Gw::start(d, 2, "", &rest);
        let run = Duration::from_secs(4);
        let start = Arc::new(Barrier::new(48));
        // The flood asks for twice the tokens per request, ten times as often.
        let heavy = load(g.addr, KEYS[0], 40, body(12), run, start.clone());
        let b = load(g.addr, KEYS[1], 4, body(6), run, start.clone());
        let c = load(g.addr, KEYS[2], 4, body(6), run, start);
        let served = |a: Vec<Answer>| -> f64 {
            // Past the first half second, until the run ends: every tenant backlogged.
            a.iter()
                .filter(|a| a.status == 200 && a.at > Duration::from_millis(500) && a.at <= run)
                .map(|a| a.tokens as f64)
                .sum()
        };
        let x = [served(joined(heavy)), served(joined(b)), served(joined(c))];
        drop(mocks);
        let mean = x.iter().sum::<f64>() / 3.0;
        let j = jain(&x);
        eprintln!("{ctx}: tokens served {x:?}, Jain's index {j:.3}");
        assert!(j >= 0.95, "{ctx}: {x:?} → {j}");
        for v in x {
            assert!((v / mean - 1.0).abs() <= 0.1, "{ctx}: {x:?}");
        }
    }
}

#[test]
fn a_deadline_no_engine_is_predicted_to_meet_is_refused_at_once() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (mocks, rest) = fleet(
            Duration::from_millis(200),
            "",
            "strategy = { name = \"fastest\", min_samples = 2 }\nrefuse_unmeetable = true\nqueue_max = 16\nqueue_timeout = \"10s\"",
        );
        let g = Gw::start_logging(d, 2, "", &rest, true);
        // Teach both workers both engines' time to first token (streams teach it).
        let warm = 16;
        let start = Arc::new(Barrier::new(warm));
        let stream = r#"{"model":"m","prompt":"hello there","max_tokens":2,"stream":true}"#;
        let hs = load(
            g.addr,
            KEYS[0],
            warm,
            stream.to_string(),
            Duration::from_millis(300),
            start,
        );
        assert!(joined(hs).iter().all(|a| a.status == 200), "{ctx}");
        let seen: usize = mocks.iter().map(|m| m.requests().len()).sum();
        let short = [
            (
                "authorization",
                "Bearer rolter_admission_key_interactive_0123456789",
            ),
            ("x-rolter-deadline-ms", "50"),
        ];
        for _ in 0..8 {
            let r = call(g.addr, &post("/v1/completions", &short, &body(2)));
            assert_eq!(r.status, 504, "{ctx}: {}", r.text());
            assert_eq!(r.json()["error"]["code"], "deadline_unmeetable", "{ctx}");
        }
        let after: usize = mocks.iter().map(|m| m.requests().len()).sum();
        assert_eq!(after, seen, "{ctx}: a refused request reaches no engine");
        let mut refused: Vec<f64> = Vec::new();
        wait_for("the refusals' log lines", Duration::from_secs(10), || {
            refused = g
                .access_log()
                .iter()
                .filter(|l| l["error"] == "deadline_unmeetable")
                .map(|l| l["duration_ms"].as_f64().unwrap())
                .collect();
            refused.len() == 8
        });
        // Refused before any pick or wait: no queue wait logged, and the gateway's own time
        // for the whole request (read to answer written) is under a millisecond at the
        // median (a shared machine may delay a single one).
        let mut sorted = refused.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(sorted[sorted.len() / 2] < 1.0, "{ctx}: {refused:?}");
        let lines = g.access_log();
        let waited = lines
            .iter()
            .filter(|l| l["error"] == "deadline_unmeetable")
            .any(|l| !l["queue_wait_ms"].is_null());
        assert!(!waited, "{ctx}: a refused request never waits");
        eprintln!("{ctx}: refused in {refused:?} ms");
        let counted = g.series("rolter_admission_requests_total{route=\"r\",class=\"interactive\",tenant=\"interactive\",result=\"deadline_unmeetable\"}");
        assert_eq!(counted, Some(8.0), "{ctx}");
        // A deadline the engines meet is served.
        let long = [short[0], ("x-rolter-deadline-ms", "5000")];
        let r = call(g.addr, &post("/v1/completions", &long, &body(2)));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
    }
}

#[test]
fn a_deadline_that_passes_in_the_queue_gets_a_504_in_the_apis_shape() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (mocks, rest) = fleet(
            Duration::from_millis(700),
            "",
            "queue_max = 16\nqueue_timeout = \"10s\"",
        );
        let g = Gw::start(d, 2, "", &rest);
        // Both engines full for 700 ms.
        let start = Arc::new(Barrier::new(4));
        let hold = load(
            g.addr,
            KEYS[1],
            4,
            body(2),
            Duration::from_millis(50),
            start,
        );
        std::thread::sleep(Duration::from_millis(100));
        let seen: usize = mocks.iter().map(|m| m.requests().len()).sum();
        assert_eq!(seen, 4, "{ctx}");
        let t = Instant::now();
        let h = [
            (
                "authorization",
                "Bearer rolter_admission_key_interactive_0123456789",
            ),
            ("x-rolter-deadline-ms", "200"),
        ];
        let r = call(g.addr, &post("/v1/completions", &h, &body(2)));
        let took = t.elapsed();
        assert_eq!(r.status, 504, "{ctx}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "deadline_exceeded", "{ctx}");
        assert_eq!(
            r.json()["error"]["type"],
            "server_error",
            "{ctx}: {}",
            r.text()
        );
        assert!(took >= Duration::from_millis(150), "{ctx}: {took:?}");
        joined(hold);
        let after: usize = mocks.iter().map(|m| m.requests().len()).sum();
        assert_eq!(
            after, 4,
            "{ctx}: the request left the queue without reaching an engine"
        );
        let bad = [h[0], ("x-rolter-deadline-ms", "soon")];
        let r = call(g.addr, &post("/v1/completions", &bad, &body(2)));
        assert_eq!(r.status, 400, "{ctx}");
        assert_eq!(r.json()["error"]["code"], "invalid_deadline", "{ctx}");
    }
}

#[test]
fn the_class_reaches_the_engine_as_vllms_priority_field() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (mocks, rest) = fleet(
            Duration::from_millis(1),
            "priority_field = \"priority\"\npriority_values = { interactive = -10 }",
            "priority_header = true",
        );
        let g = Gw::start(d, 2, "", &rest);
        let send = |key: &str, class: Option<&str>| {
            let auth = format!("Bearer {key}");
            let mut h = vec![("authorization", auth.as_str())];
            if let Some(c) = class {
                h.push(("x-rolter-priority", c));
            }
            call(
                g.addr,
                &post(
                    "/v1/completions",
                    &h,
                    r#"{"model":"m","prompt":"x","priority":99}"#,
                ),
            )
        };
        assert_eq!(send(KEYS[0], None).status, 200, "{ctx}");
        assert_eq!(send(KEYS[1], None).status, 200, "{ctx}");
        // A key that may choose its class does; one that may not is refused.
        assert_eq!(send(KEYS[3], Some("interactive")).status, 200, "{ctx}");
        let r = send(KEYS[1], Some("interactive"));
        assert_eq!(r.status, 403, "{ctx}");
        assert_eq!(r.json()["error"]["code"], "priority_not_allowed", "{ctx}");
        let r = send(KEYS[3], Some("gold"));
        assert_eq!(r.status, 400, "{ctx}");
        assert_eq!(r.json()["error"]["code"], "unknown_priority", "{ctx}");
        let mut got: Vec<i64> = mocks
            .iter()
            .flat_map(|m| m.requests())
            .filter(|r| r.path == "/v1/completions")
            .map(|r| {
                let v: Value = serde_json::from_slice(&r.body).unwrap();
                v["priority"].as_i64().unwrap()
            })
            .collect();
        got.sort();
        // Interactive as configured (-10) twice, batch at its rank (1) once; the client's
        // own 99 never reaches the engine.
        assert_eq!(got, vec![-10, -10, 1], "{ctx}");
    }
}
