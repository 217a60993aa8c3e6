//! Cross-checks with independent Python code (pyzmq and msgpack):
//!
//! - Rolter's transport against a publisher (tests/py/kv_publisher.py) in vLLM's exact
//!   wire layout: the reference fixture's bytes, then batches in the v0.9, v0.10 and
//!   current layouts (one with 32-byte bin hashes), and replay. Every frame must arrive
//!   with its seq and byte-identical payload, and replay must return the requested range.
//! - The mock engine's publisher against a subscriber (tests/py/kv_subscriber.py): its
//!   batches must decode with msgpack to vLLM's layout and re-encode to the same bytes.
//!
//! Needs `python3` with the `zmq` and `msgpack` modules (`tests/run.sh` installs
//! Debian's python3-zmq and python3-msgpack). `ROLTER_PYTHON` names the interpreter;
//! otherwise `python3` and then `/usr/bin/python3` are tried. With `ROLTER_SKIP_PY` set
//! the test is skipped.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rolter_mock::{KvEventsConfig, MockConfig, PrefixCacheConfig};

use rolter::engine::kv::transport::{
    replay, KvEventsEndpoint, KvFrame, KvTransport, KvTransportOptions,
};

const WAIT: Duration = Duration::from_secs(10);

/// The payload of the reference fixture (fixtures/kv_events_examples.txt), 133 bytes.
const FIXTURE_HEX: &str = "93cb41d999a6602000009398ab426c6f636b53746f72656492cf2ceabcfae6d332eacf26470bbec927f5bfc0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c093ac426c6f636b52656d6f76656491cf26470bbec927f5bfa347505591b0416c6c426c6f636b73436c656172656400";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A Python interpreter with `zmq` and `msgpack`; `None` when the test is to be skipped.
fn python() -> Option<String> {
    if std::env::var_os("ROLTER_SKIP_PY").is_some() {
        println!("SKIPPED kv_events_pyzmq: ROLTER_SKIP_PY is set");
        return None;
    }
    let candidates: Vec<String> = match std::env::var("ROLTER_PYTHON") {
        Ok(p) => vec![p],
        Err(_) => vec!["python3".into(), "/usr/bin/python3".into()],
    };
    for py in &candidates {
        let ok = Command::new(py)
            .args(["-c", "import zmq, msgpack"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(py.clone());
        }
    }
    panic!(
        "no Python interpreter with the zmq and msgpack modules (tried {candidates:?}). \
         Install them with `apt-get install python3-zmq python3-msgpack` (as tests/run.sh \
         does), or `python3 -m pip install pyzmq msgpack`; set ROLTER_PYTHON to pick the \
         interpreter, or ROLTER_SKIP_PY=1 to skip this test"
    );
}

/// One batch as the Python publisher sent it.
#[derive(Clone, Debug)]
pub struct PublishedBatch {
    pub seq: u64,
    /// Which layout: "fixture", "v0.9", "v0.10", "current", "current-lora-extra-rank1",
    /// "current-bin-hashes".
    pub label: String,
    pub payload: Vec<u8>,
}

/// The Python publisher process and its line protocol.
struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub_endpoint: String,
    replay_endpoint: String,
    fixture_packb_matches: bool,
    batches: Vec<PublishedBatch>,
}

impl Publisher {
    fn start(py: &str) -> Publisher {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/kv_publisher.py");
        let mut child = Command::new(py)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the Python publisher");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let hello = read_json(&mut stdout);
        let batches = hello["batches"]
            .as_array()
            .expect("batches")
            .iter()
            .map(|b| PublishedBatch {
                seq: b["seq"].as_u64().unwrap(),
                label: b["label"].as_str().unwrap().to_string(),
                payload: hex(b["payload"].as_str().unwrap()),
            })
            .collect();
        Publisher {
            child,
            stdin,
            stdout,
            pub_endpoint: hello["pub"].as_str().unwrap().to_string(),
            replay_endpoint: hello["replay"].as_str().unwrap().to_string(),
            fixture_packb_matches: hello["fixture_packb_matches"].as_bool().unwrap(),
            batches,
        }
    }

    fn say(&mut self, word: &str) {
        writeln!(self.stdin, "{word}").unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_json(r: &mut impl BufRead) -> serde_json::Value {
    let mut line = String::new();
    r.read_line(&mut line).expect("read from the publisher");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("publisher said {line:?}: {e}"))
}

/// What one exchange with the Python publisher produced.
struct Exchange {
    publisher: Publisher,
    transport: KvTransport,
    rx: crossbeam_channel::Receiver<KvFrame>,
    /// The live frames received after the probes, in arrival order.
    live: Vec<KvFrame>,
}

const TARGET: usize = 2;

/// Starts the publisher and the transport, waits until the subscription is in place,
/// has every batch published, and collects the live frames.
fn exchange(py: &str) -> Exchange {
    let mut publisher = Publisher::start(py);
    let (transport, rx) = KvTransport::start(
        vec![(
            TARGET,
            KvEventsEndpoint {
                endpoint: publisher.pub_endpoint.clone(),
                replay_endpoint: Some(publisher.replay_endpoint.clone()),
                topic: "kv@".into(),
            },
        )],
        KvTransportOptions::default(),
    )
    .expect("start the transport");
    // The publisher sends probes until told to go: the first one through proves the
    // subscription has reached it.
    let first = rx.recv_timeout(WAIT).expect("no probe arrived");
    assert_eq!(first.topic, b"kv@probe");
    publisher.say("go");
    let published = read_json(&mut publisher.stdout);
    let n = published["published"].as_u64().unwrap() as usize;
    assert_eq!(n, publisher.batches.len());
    let mut live = Vec::new();
    let deadline = Instant::now() + WAIT;
    while live.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let f = rx
            .recv_timeout(left)
            .expect("a published frame did not arrive");
        if f.topic != b"kv@probe" {
            live.push(f);
        }
    }
    Exchange {
        publisher,
        transport,
        rx,
        live,
    }
}

/// The payloads received live, by seq, with the layout label of the batch: the place
/// for decoder assertions (e.g. decode each payload and compare per label).
fn received_batches(ex: &Exchange) -> Vec<PublishedBatch> {
    ex.live
        .iter()
        .map(|f| PublishedBatch {
            seq: f.seq,
            label: ex
                .publisher
                .batches
                .iter()
                .find(|b| b.seq == f.seq)
                .map(|b| b.label.clone())
                .unwrap_or_default(),
            payload: f.payload.clone(),
        })
        .collect()
}

#[test]
fn transport_receives_and_replays_a_python_publisher() {
    let Some(py) = python() else {
        return;
    };
    let ex = exchange(&py);
    let publisher = &ex.publisher;
    assert!(
        publisher.fixture_packb_matches,
        "Python's msgpack.packb disagrees with the fixture bytes"
    );
    assert_eq!(publisher.batches[0].label, "fixture");
    assert_eq!(publisher.batches[0].payload, hex(FIXTURE_HEX));
    assert_eq!(publisher.batches[0].payload.len(), 133);

    // Every batch, in order, with its seq, topic and exact bytes.
    let received = received_batches(&ex);
    assert_eq!(received.len(), publisher.batches.len());
    for (got, sent) in received.iter().zip(&publisher.batches) {
        assert_eq!(got.seq, sent.seq, "{}", sent.label);
        assert_eq!(got.label, sent.label);
        assert_eq!(got.payload, sent.payload, "{}: payload differs", sent.label);
    }
    for f in &ex.live {
        assert_eq!(f.topic, b"kv@127.0.0.1:8000@mock-model");
        assert_eq!(f.target, TARGET);
        assert!(!f.replayed);
    }
    let s = &ex.transport.stats()[0];
    assert_eq!(s.target, TARGET);
    assert!(s.connected);
    assert_eq!(s.malformed, 2, "a 2-frame message and a 4-byte seq");
    assert_eq!(s.dropped, 0);
    assert_eq!(s.last_seq, Some(publisher.batches.len() as u64 - 1));
    assert!(s.last_message.is_some());

    // Blocking replay: the requested range, byte for byte.
    let got = replay(&publisher.replay_endpoint, 2, WAIT).expect("replay");
    let want: Vec<(u64, Vec<u8>)> = publisher.batches[2..]
        .iter()
        .map(|b| (b.seq, b.payload.clone()))
        .collect();
    assert_eq!(got, want);
    let past_end = replay(&publisher.replay_endpoint, 1_000, WAIT).expect("replay");
    assert!(past_end.is_empty());

    // Replay through the transport thread: frames flagged `replayed`.
    ex.transport.request_replay(TARGET, 4);
    let mut replayed = Vec::new();
    while replayed.len() < publisher.batches.len() - 4 {
        let f = ex.rx.recv_timeout(WAIT).expect("replayed frame");
        assert!(f.replayed);
        assert_eq!(f.target, TARGET);
        replayed.push((f.seq, f.payload));
    }
    assert_eq!(replayed, want[2..].to_vec());

    let started = Instant::now();
    let Exchange { transport, .. } = ex;
    transport.stop();
    assert!(started.elapsed() < Duration::from_millis(100));
}

#[test]
fn python_decodes_the_mock_engines_events() {
    let Some(py) = python() else {
        return;
    };
    let mock = rolter_mock::spawn(MockConfig {
        prefix_cache: Some(PrefixCacheConfig {
            block_tokens: 4,
            capacity_blocks: 6,
            prefill_us_per_token: 0,
            chars_per_token: 2,
        }),
        kv_events: Some(KvEventsConfig {
            topic: "kv@mock".into(),
            ..KvEventsConfig::default()
        }),
        ..MockConfig::default()
    })
    .expect("spawn the mock");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/kv_subscriber.py");
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(mock.kv_events_endpoint().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the Python subscriber");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());

    // Probe with clears until the subscriber has seen one.
    let subscribed = std::sync::atomic::AtomicBool::new(false);
    let first = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + WAIT;
            while !subscribed.load(std::sync::atomic::Ordering::Relaxed)
                && Instant::now() < deadline
            {
                mock.publish_clear();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let first = read_json(&mut stdout);
        subscribed.store(true, std::sync::atomic::Ordering::Relaxed);
        first
    });
    assert_eq!(first["batch"][1][0][0], "AllBlocksCleared");

    // 69 canonical bytes: 8 full blocks of 8 bytes, 2 over the capacity.
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(39)
    );
    let mut c = rolter_mock::client::Client::connect(mock.addr());
    c.send(&rolter_mock::client::post(
        "/v1/chat/completions",
        &[],
        &body,
    ));
    assert_eq!(c.response().unwrap().status, 200);
    let stored_seq = mock.kv_next_seq().unwrap() - 1;
    mock.publish_clear();
    let last = mock.kv_next_seq().unwrap() - 1;
    writeln!(stdin, "{last}").unwrap();
    stdin.flush().unwrap();

    let mut seen = Vec::new();
    loop {
        let m = read_json(&mut stdout);
        assert_eq!(m["topic"], "kv@mock");
        assert_eq!(m["roundtrip"], true, "msgpack re-encodes differently: {m}");
        let seq = m["seq"].as_u64().unwrap();
        seen.push(m);
        if seq == last {
            break;
        }
    }
    let stored = seen
        .iter()
        .find(|m| m["seq"] == stored_seq)
        .expect("the BlockStored batch");
    let batch = stored["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 3);
    assert!(batch[0].is_f64());
    assert_eq!(batch[2], 0);
    let ev = &batch[1];
    assert_eq!(ev[0][0], "BlockStored");
    assert_eq!(ev[0].as_array().unwrap().len(), 8);
    assert_eq!(ev[0][1].as_array().unwrap().len(), 8);
    assert!(ev[0][2].is_null());
    assert_eq!(ev[0][3].as_array().unwrap().len(), 32);
    assert_eq!(ev[0][4], 4);
    assert!(ev[0][5].is_null() && ev[0][7].is_null());
    assert_eq!(ev[0][6], "GPU");
    assert_eq!(
        ev[1],
        serde_json::json!(["BlockRemoved", [ev[0][1][7], ev[0][1][6]], "GPU"])
    );
    assert_eq!(seen.last().unwrap()["batch"][1][0][0], "AllBlocksCleared");
    assert!(child.wait().expect("subscriber exit").success());
}
