//! KV-cache events published as vLLM publishes them ([`KvEventsConfig`]).
//!
//! Encoding: msgspec's msgpack layout of vLLM's structs (`array_like=True, tag=True,
//! omit_defaults=True`), so each struct is a positional array whose first element is
//! the class name:
//!
//! - `EventBatch = [ts: float64, [events...], data_parallel_rank: 0]`
//! - `BlockStored = ["BlockStored", [hashes], parent|nil, [token_ids], block_size,
//!   lora_id: nil, medium: "GPU", lora_name: nil]` (the current 8-field layout)
//! - `BlockRemoved = ["BlockRemoved", [hashes], medium: "GPU"]`
//! - `AllBlocksCleared = ["AllBlocksCleared"]`
//!
//! Integers take the smallest msgpack encoding (as msgspec writes them), floats are
//! always float64 (`0xcb`), strings use fixstr/str8, arrays fixarray/array16/array32.
//!
//! Transport: a PUB socket sends one 3-frame message per batch, `[topic][seq: u64 BE,
//! from 0][payload]`; the last `buffer_steps` messages are kept and served on a ROUTER
//! socket: a request `[identity, b"", start_seq_be8]` is answered with
//! `[identity, b"", seq_be8, payload]` for each kept seq ≥ start, then the end marker
//! `[identity, b"", ff×8, b""]`.
//!
//! Test hooks: messages can be dropped (the seq still advances, and the message stays in
//! the replay buffer, as at a real PUB's high-water mark), publishing can be paused
//! (batches are held, without a seq, and sent in order on resume), and the PUB socket can
//! go down and come back on the same endpoint ([`KvPublisher::set_down`]: subscribers
//! are disconnected, batches meanwhile take their seqs and stay in the replay buffer, as
//! when an engine's publisher is unreachable for a while), or start over at seq 0 with an
//! empty buffer ([`KvPublisher::restart`], a restarted engine).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::KvEventsConfig;

/// The storage medium of every block the mock stores (vLLM's `MEDIUM_GPU`).
pub(crate) const MEDIUM_GPU: &str = "GPU";

/// The seq of the replay end marker.
const END_SEQ: u64 = u64::MAX;

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KvEvent {
    /// Blocks that became cached: their chained keys in prompt order, the key of the block
    /// before the first one (`None` for a prompt's first block), their token ids, and the
    /// tokens per block.
    BlockStored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
    },
    /// Blocks evicted.
    BlockRemoved { hashes: Vec<u64> },
    /// The whole cache was reset.
    AllBlocksCleared,
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    rmp::encode::write_str(out, s).expect("writing to a Vec cannot fail");
}

fn write_array_len(out: &mut Vec<u8>, n: usize) {
    let n = u32::try_from(n).expect("array too long for msgpack");
    rmp::encode::write_array_len(out, n).expect("writing to a Vec cannot fail");
}

fn write_uint(out: &mut Vec<u8>, v: u64) {
    rmp::encode::write_uint(out, v).expect("writing to a Vec cannot fail");
}

fn write_nil(out: &mut Vec<u8>) {
    rmp::encode::write_nil(out).expect("writing to a Vec cannot fail");
}

fn write_event(out: &mut Vec<u8>, ev: &KvEvent) {
    match ev {
        KvEvent::BlockStored {
            hashes,
            parent,
            token_ids,
            block_size,
        } => {
            write_array_len(out, 8);
            write_str(out, "BlockStored");
            write_array_len(out, hashes.len());
            for &h in hashes {
                write_uint(out, h);
            }
            match parent {
                Some(p) => write_uint(out, *p),
                None => write_nil(out),
            }
            write_array_len(out, token_ids.len());
            for &t in token_ids {
                write_uint(out, t as u64);
            }
            write_uint(out, *block_size as u64);
            write_nil(out); // lora_id
            write_str(out, MEDIUM_GPU);
            write_nil(out); // lora_name
        }
        KvEvent::BlockRemoved { hashes } => {
            write_array_len(out, 3);
            write_str(out, "BlockRemoved");
            write_array_len(out, hashes.len());
            for &h in hashes {
                write_uint(out, h);
            }
            write_str(out, MEDIUM_GPU);
        }
        KvEvent::AllBlocksCleared => {
            write_array_len(out, 1);
            write_str(out, "AllBlocksCleared");
        }
    }
}

/// Encodes an `EventBatch` (`[ts, [events], data_parallel_rank]`).
pub(crate) fn encode_batch(ts: f64, events: &[KvEvent], data_parallel_rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    write_array_len(&mut out, 3);
    rmp::encode::write_f64(&mut out, ts).expect("writing to a Vec cannot fail");
    write_array_len(&mut out, events.len());
    for ev in events {
        write_event(&mut out, ev);
    }
    write_uint(&mut out, data_parallel_rank as u64);
    out
}

/// Seconds since the Unix epoch, as Python's `time.time()`.
pub(crate) fn now_ts() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The publisher's mutable state; shared with the replay thread.
struct State {
    /// `None` once the publisher was stopped (subscribers see the connection close).
    socket: Option<zmq::Socket>,
    next_seq: u64,
    /// Messages still to drop (seq assigned, nothing sent).
    drop_next: u64,
    paused: bool,
    /// Batches held while paused.
    held: VecDeque<Vec<u8>>,
    /// The last `buffer_steps` messages, for replay.
    buffer: VecDeque<(u64, Arc<[u8]>)>,
    buffer_steps: usize,
}

impl State {
    fn send(&mut self, topic: &[u8], payload: Vec<u8>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.drop_next > 0 {
            self.drop_next -= 1;
        } else {
            // A PUB never blocks; at its high-water mark the message is dropped silently.
            if let Some(socket) = &self.socket {
                let _ = socket
                    .send_multipart([topic, &seq.to_be_bytes()[..], &payload[..]], zmq::DONTWAIT);
            }
        }
        if self.buffer_steps > 0 {
            if self.buffer.len() == self.buffer_steps {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload.into()));
        }
    }
}

/// The PUB socket, the replay ROUTER (on its own thread) and the replay buffer.
pub(crate) struct KvPublisher {
    ctx: zmq::Context,
    state: Arc<Mutex<State>>,
    topic: Vec<u8>,
    endpoint: String,
    replay_endpoint: Option<String>,
    stop: Arc<AtomicBool>,
    replay_thread: Mutex<Option<JoinHandle<()>>>,
}

fn io_err(what: &str, e: zmq::Error) -> io::Error {
    io::Error::other(format!("kv events: {what}: {e}"))
}

/// A PUB socket as the publisher uses it (no linger, a high-water mark of 100 000).
fn pub_socket(ctx: &zmq::Context) -> io::Result<zmq::Socket> {
    let socket = ctx.socket(zmq::PUB).map_err(|e| io_err("socket", e))?;
    socket.set_linger(0).map_err(|e| io_err("linger", e))?;
    socket
        .set_sndhwm(100_000)
        .map_err(|e| io_err("sndhwm", e))?;
    Ok(socket)
}

/// Binds a socket and returns the endpoint it got (with the real port for port 0).
fn bind(socket: &zmq::Socket, endpoint: &str) -> io::Result<String> {
    socket
        .bind(endpoint)
        .map_err(|e| io_err(&format!("cannot bind {endpoint}"), e))?;
    match socket.get_last_endpoint() {
        Ok(Ok(ep)) => Ok(ep),
        _ => Ok(endpoint.to_string()),
    }
}

impl KvPublisher {
    /// Binds the PUB socket (and the ROUTER, when configured) and starts the replay thread.
    pub fn start(cfg: &KvEventsConfig, name: &str) -> io::Result<Arc<KvPublisher>> {
        let ctx = zmq::Context::new();
        let socket = pub_socket(&ctx)?;
        let endpoint = bind(&socket, &cfg.endpoint)?;
        let state = Arc::new(Mutex::new(State {
            socket: Some(socket),
            next_seq: 0,
            drop_next: 0,
            paused: false,
            held: VecDeque::new(),
            buffer: VecDeque::new(),
            buffer_steps: cfg.buffer_steps,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (replay_endpoint, thread) = match &cfg.replay_endpoint {
            Some(ep) => {
                let router = ctx.socket(zmq::ROUTER).map_err(|e| io_err("socket", e))?;
                router.set_linger(0).map_err(|e| io_err("linger", e))?;
                let hwm = i32::try_from(cfg.buffer_steps.saturating_add(16)).unwrap_or(i32::MAX);
                router.set_sndhwm(hwm).map_err(|e| io_err("sndhwm", e))?;
                let bound = bind(&router, ep)?;
                let (state, stop) = (state.clone(), stop.clone());
                let t = std::thread::Builder::new()
                    .name(format!("rolter-mock-{name}-kv-replay"))
                    .spawn(move || serve_replay(router, state, stop))?;
                (Some(bound), Some(t))
            }
            None => (None, None),
        };
        Ok(Arc::new(KvPublisher {
            ctx,
            state,
            topic: cfg.topic.clone().into_bytes(),
            endpoint,
            replay_endpoint,
            stop,
            replay_thread: Mutex::new(thread),
        }))
    }

    /// The bound PUB endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bound replay endpoint, when configured.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Encodes and publishes one batch (held while paused).
    pub fn publish(&self, events: &[KvEvent]) {
        if events.is_empty() {
            return;
        }
        let payload = encode_batch(now_ts(), events, 0);
        let mut st = self.state.lock().unwrap();
        if st.paused {
            st.held.push_back(payload);
        } else {
            st.send(&self.topic, payload);
        }
    }

    /// The seq the next message will get.
    pub fn next_seq(&self) -> u64 {
        self.state.lock().unwrap().next_seq
    }

    /// Drops the next `n` messages (their seqs are used, nothing is sent).
    pub fn drop_next(&self, n: u64) {
        self.state.lock().unwrap().drop_next += n;
    }

    /// Holds batches while `paused`; on resume, sends the held ones in order.
    pub fn pause(&self, paused: bool) {
        let mut st = self.state.lock().unwrap();
        st.paused = paused;
        if !paused {
            while let Some(p) = st.held.pop_front() {
                st.send(&self.topic, p);
            }
        }
    }

    /// Closes the PUB socket, as a crashed or stopped engine would: subscribers lose the
    /// connection and nothing more is published.
    pub fn stop_publishing(&self) {
        self.state.lock().unwrap().socket = None;
    }

    /// Takes the PUB socket down (`true`: subscribers lose the connection; batches keep
    /// their seqs and the replay buffer) or brings it back on the same endpoint (`false`;
    /// the bind is retried for up to a second while the old listener closes).
    pub fn set_down(&self, down: bool) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        if down {
            st.socket = None;
            return Ok(());
        }
        if st.socket.is_some() {
            return Ok(());
        }
        let socket = pub_socket(&self.ctx)?;
        let mut tries = 0;
        loop {
            match socket.bind(&self.endpoint) {
                Ok(()) => break,
                Err(zmq::Error::EADDRINUSE) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(io_err(&format!("cannot bind {}", self.endpoint), e)),
            }
        }
        st.socket = Some(socket);
        Ok(())
    }

    /// Starts over as a restarted engine's publisher does: subscribers are disconnected,
    /// the sequence starts again at 0 and the replay buffer is empty; then the PUB socket
    /// is back on the same endpoint.
    pub fn restart(&self) -> io::Result<()> {
        {
            let mut st = self.state.lock().unwrap();
            st.socket = None;
            st.next_seq = 0;
            st.drop_next = 0;
            st.held.clear();
            st.buffer.clear();
        }
        self.set_down(false)
    }

    /// Stops the replay thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.replay_thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

/// The replay thread: answers requests on the ROUTER until `stop`.
fn serve_replay(router: zmq::Socket, state: Arc<Mutex<State>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        match router.poll(zmq::POLLIN, 20) {
            Ok(n) if n > 0 => {}
            Ok(_) | Err(zmq::Error::EINTR) => continue,
            Err(_) => return,
        }
        let Ok(req) = router.recv_multipart(zmq::DONTWAIT) else {
            continue;
        };
        // [identity, b"", start_seq]: anything else is ignored, as vLLM does.
        let [id, delim, start]: [Vec<u8>; 3] = match req.try_into() {
            Ok(f) => f,
            Err(_) => continue,
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
            continue;
        };
        if !delim.is_empty() {
            continue;
        }
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Arc<[u8]>)> = {
            let st = state.lock().unwrap();
            st.buffer
                .iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect()
        };
        for (seq, payload) in &batches {
            let msg: [&[u8]; 4] = [&id, b"", &seq.to_be_bytes(), payload];
            let _ = router.send_multipart(msg, zmq::DONTWAIT);
        }
        let end: [&[u8]; 4] = [&id, b"", &END_SEQ.to_be_bytes(), b""];
        let _ = router.send_multipart(end, zmq::DONTWAIT);
    }
}

impl Drop for KvPublisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Bounded wait for a message.
    const WAIT: Duration = Duration::from_secs(5);

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The example payload of the KV-events reference (fixtures/kv_events_examples.txt).
    const FIXTURE: &str = "93cb41d999a6602000009398ab426c6f636b53746f72656492cf2ceabcfae6d332eacf26470bbec927f5bfc0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c093ac426c6f636b52656d6f76656491cf26470bbec927f5bfa347505591b0416c6c426c6f636b73436c656172656400";

    #[test]
    fn reproduces_the_reference_payload() {
        let events = [
            KvEvent::BlockStored {
                hashes: vec![3236607068019569386, 2758186210834249151],
                parent: None,
                token_ids: (1..=32).collect(),
                block_size: 16,
            },
            KvEvent::BlockRemoved {
                hashes: vec![2758186210834249151],
            },
            KvEvent::AllBlocksCleared,
        ];
        let got = encode_batch(1718000000.5, &events, 0);
        assert_eq!(got.len(), 133);
        assert_eq!(got, hex(FIXTURE));
    }

    #[test]
    fn ints_take_the_smallest_encoding_and_floats_float64() {
        let ev = KvEvent::BlockStored {
            hashes: vec![5, 200, 70_000, u64::MAX],
            parent: Some(1 << 40),
            token_ids: vec![127, 128, 65_535, 65_536],
            block_size: 16,
        };
        let b = encode_batch(0.0, &[ev], 3);
        assert_eq!(&b[..10], &hex("93cb0000000000000000")[..]);
        let tail = hex(concat!(
            "94",
            "05",
            "ccc8",
            "ce00011170",
            "cfffffffffffffffff", // hashes
            "cf0000010000000000", // parent
            "94",
            "7f",
            "cc80",
            "cdffff",
            "ce00010000", // token ids
            "10",
            "c0",
            "a3475055",
            "c0",
            "03"
        ));
        assert!(b.ends_with(&tail), "{b:02x?}");
    }

    fn publisher(buffer_steps: usize) -> (Arc<KvPublisher>, zmq::Context, zmq::Socket) {
        let p = KvPublisher::start(
            &KvEventsConfig {
                endpoint: "tcp://127.0.0.1:0".into(),
                replay_endpoint: Some("tcp://127.0.0.1:0".into()),
                topic: "kv@mock".into(),
                buffer_steps,
            },
            "t",
        )
        .unwrap();
        assert!(!p.endpoint().ends_with(":0"), "{}", p.endpoint());
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.connect(p.endpoint()).unwrap();
        (p, ctx, sub)
    }

    fn recv(sub: &zmq::Socket) -> Vec<Vec<u8>> {
        assert!(sub.poll(zmq::POLLIN, WAIT.as_millis() as i64).unwrap() > 0);
        sub.recv_multipart(0).unwrap()
    }

    fn replay(p: &KvPublisher, ctx: &zmq::Context, start: u64) -> Vec<(u64, Vec<u8>)> {
        let req = ctx.socket(zmq::REQ).unwrap();
        req.connect(p.replay_endpoint().unwrap()).unwrap();
        req.send(&start.to_be_bytes()[..], 0).unwrap();
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.connect(p.replay_endpoint().unwrap()).unwrap();
        dealer
            .send_multipart([&b""[..], &start.to_be_bytes()[..]], 0)
            .unwrap();
        // A REQ gets the first reply only; a DEALER gets them all.
        let mut out = Vec::new();
        loop {
            assert!(dealer.poll(zmq::POLLIN, WAIT.as_millis() as i64).unwrap() > 0);
            let f = dealer.recv_multipart(0).unwrap();
            assert_eq!(f.len(), 3);
            let seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
            if seq == END_SEQ {
                assert!(f[2].is_empty());
                break;
            }
            out.push((seq, f[2].clone()));
        }
        assert!(req.poll(zmq::POLLIN, WAIT.as_millis() as i64).unwrap() > 0);
        let first = req.recv_multipart(0).unwrap();
        match out.first() {
            Some((seq, _)) => assert_eq!(first[0], seq.to_be_bytes()),
            None => assert_eq!(first[0], END_SEQ.to_be_bytes()),
        }
        out
    }

    #[test]
    fn publishes_drops_pauses_and_replays() {
        let (p, ctx, sub) = publisher(3);
        // Slow joiner: publish until the subscription has arrived.
        let mut seq;
        loop {
            p.publish(&[KvEvent::AllBlocksCleared]);
            if sub.poll(zmq::POLLIN, 20).unwrap() > 0 {
                let f = sub.recv_multipart(0).unwrap();
                seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
                assert_eq!(f[0], b"kv@mock");
                break;
            }
            assert!(p.next_seq() < 500, "no subscription");
        }
        while sub.poll(zmq::POLLIN, 50).unwrap() > 0 {
            let f = sub.recv_multipart(0).unwrap();
            seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
        }
        assert_eq!(seq + 1, p.next_seq());
        let base = p.next_seq();
        p.drop_next(1);
        p.publish(&[KvEvent::BlockRemoved { hashes: vec![1] }]);
        p.publish(&[KvEvent::BlockRemoved { hashes: vec![2] }]);
        let f = recv(&sub);
        assert_eq!(f[1], (base + 1).to_be_bytes(), "seq base was dropped");
        p.pause(true);
        p.publish(&[KvEvent::BlockRemoved { hashes: vec![3] }]);
        assert_eq!(sub.poll(zmq::POLLIN, 50).unwrap(), 0, "held while paused");
        assert_eq!(p.next_seq(), base + 2);
        p.pause(false);
        let f = recv(&sub);
        assert_eq!(f[1], (base + 2).to_be_bytes());
        assert_eq!(f[2], encode_batch_for_test(&f[2], 3));

        // The buffer keeps the last 3 messages, dropped ones included.
        let got = replay(&p, &ctx, 0);
        assert_eq!(
            got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [base, base + 1, base + 2]
        );
        assert_eq!(replay(&p, &ctx, base + 2).len(), 1);
        assert!(replay(&p, &ctx, base + 3).is_empty());
        p.shutdown();
    }

    #[test]
    fn a_publisher_that_goes_down_keeps_its_seqs_and_comes_back_on_the_same_endpoint() {
        let (p, ctx, sub) = publisher(1000);
        loop {
            p.publish(&[KvEvent::AllBlocksCleared]);
            if sub.poll(zmq::POLLIN, 20).unwrap() > 0 {
                break;
            }
            assert!(p.next_seq() < 500, "no subscription");
        }
        while sub.poll(zmq::POLLIN, 50).unwrap() > 0 {
            sub.recv_multipart(0).unwrap();
        }
        p.set_down(true).unwrap();
        let away = p.next_seq();
        p.publish(&[KvEvent::BlockRemoved { hashes: vec![7] }]);
        assert_eq!(p.next_seq(), away + 1);
        assert_eq!(
            sub.poll(zmq::POLLIN, 100).unwrap(),
            0,
            "nothing sent while down"
        );
        p.set_down(false).unwrap();
        // The subscriber reconnects by itself (libzmq retries every 100 ms).
        let f = loop {
            p.publish(&[KvEvent::AllBlocksCleared]);
            if sub.poll(zmq::POLLIN, 50).unwrap() > 0 {
                break sub.recv_multipart(0).unwrap();
            }
            assert!(p.next_seq() < away + 200, "never reconnected");
        };
        let seq = u64::from_be_bytes(f[1].as_slice().try_into().unwrap());
        assert!(seq > away, "the seq went on: {seq}");
        // The batch published while down is in the replay buffer only.
        let got = replay(&p, &ctx, away);
        assert_eq!(got[0].0, away);
        assert_eq!(got[0].1, encode_batch_for_test(&got[0].1, 7));
        p.shutdown();
    }

    /// Re-encodes `payload` with its own ts and a single `BlockRemoved [h]`.
    fn encode_batch_for_test(payload: &[u8], h: u64) -> Vec<u8> {
        let ts = f64::from_be_bytes(payload[2..10].try_into().unwrap());
        encode_batch(ts, &[KvEvent::BlockRemoved { hashes: vec![h] }], 0)
    }
}
