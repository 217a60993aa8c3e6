//! The engine's LMCache worker ([`LmcacheWorkerConfig`]): the CPU-offload store of prompt
//! chunks (an LRU of chunk keys shared by all worker threads), the lookup that tells how
//! many leading prompt tokens it holds, its counters and `lmcache:*` metrics, and the
//! sender thread that reports registration, heartbeats, admissions and evictions to the
//! controller over a ZMQ PUSH socket.
//!
//! The request path never waits on the network: each store or eviction hands its messages
//! to the sender thread through a bounded channel while it holds the store's lock (so they
//! leave in the order the store changed); when the channel is full they are dropped and
//! counted. The sender sends up to 50 queued messages as one multipart ZMQ message, one
//! msgpack message per frame (as LMCache's worker does), without blocking: what ZMQ cannot
//! queue is dropped and counted too.
//!
//! Store order follows LMCache's LRU (`update_on_put` in chunk order, `update_on_hit` on
//! retrieval): a prompt's chunks are stored first to last, so under pressure a prompt's
//! head is evicted before its tail.
//!
//! This module owns no HTTP and no timing: the connection code decides when a request looks
//! up (on admission) and when it stores (once its prefill is done).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::LmcacheWorkerConfig;
use crate::lmcache_wire::{chunk_keys, Chunk, ChunkMsg, Registration, WorkerMsg};
use crate::stats::{inc, LmcacheStats};

/// Messages waiting for the sender thread; beyond this they are dropped.
const CHANNEL_CAPACITY: usize = 65_536;
/// Messages per multipart send (LMCache's `batched_get_msg(max_bsz=50)`).
const BATCH: usize = 50;
/// Interval of `HeartbeatMsg`.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long the sender waits for a message before checking heartbeat and stop.
const TICK: Duration = Duration::from_millis(50);
/// How long closing the PUSH socket waits to flush queued messages.
const LINGER_MS: i32 = 250;
/// Bytes per token in `lmcache:local_cache_usage` (one fp16 value per token: a stand-in
/// for the real per-token KV size, which depends on the model).
const BYTES_PER_TOKEN: u64 = 2;

/// A prompt as the store sees it: its chunks (the last partial one included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LmcacheQuery {
    chunks: Vec<Chunk>,
}

impl LmcacheQuery {
    /// Prompt tokens covered by the chunks.
    pub fn tokens(&self) -> u64 {
        self.chunks.last().map_or(0, |c| c.end as u64)
    }
}

/// Held chunks, keyed both ways so that refresh and eviction are O(log n).
#[derive(Default)]
struct Store {
    /// Chunk key → recency stamp.
    stamps: HashMap<i64, u64>,
    /// Recency stamp → chunk key; the first entry is the least recently used chunk.
    order: BTreeMap<u64, i64>,
    next_stamp: u64,
}

impl Store {
    /// Marks `key` most recently used; false when it was not held (it is now).
    fn touch(&mut self, key: i64) -> bool {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let held = match self.stamps.insert(key, stamp) {
            Some(old) => {
                self.order.remove(&old);
                true
            }
            None => false,
        };
        self.order.insert(stamp, key);
        held
    }
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    query_tokens: AtomicU64,
    hit_tokens: AtomicU64,
    admitted: AtomicU64,
    evicted: AtomicU64,
    /// Shared with the sender thread.
    sent: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    /// Admissions and evictions queued for the sender thread and not yet handed to ZMQ.
    pending: Arc<AtomicU64>,
}

pub(crate) struct LmcacheWorker {
    instance_id: String,
    worker_id: u32,
    location: String,
    chunk_size: usize,
    capacity: usize,
    store: Mutex<Store>,
    counters: Counters,
    tx: SyncSender<WorkerMsg>,
    stop: Arc<AtomicBool>,
    sender: Mutex<Option<JoinHandle<()>>>,
}

fn io_err(what: &str, e: zmq::Error) -> io::Error {
    io::Error::other(format!("lmcache worker: {what}: {e}"))
}

impl LmcacheWorker {
    /// Connects the PUSH socket to the controller and starts the sender thread, which
    /// registers first. `engine` is the engine's name (the default instance id) and `addr`
    /// its bound HTTP address (the `ip` and `port` it registers with).
    pub fn start(
        cfg: &LmcacheWorkerConfig,
        engine: &str,
        addr: SocketAddr,
    ) -> io::Result<Arc<LmcacheWorker>> {
        let instance_id = if cfg.instance_id.is_empty() {
            engine.to_string()
        } else {
            cfg.instance_id.clone()
        };
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::PUSH).map_err(|e| io_err("socket", e))?;
        socket
            .set_linger(LINGER_MS)
            .map_err(|e| io_err("linger", e))?;
        socket
            .set_sndhwm(100_000)
            .map_err(|e| io_err("sndhwm", e))?;
        socket
            .connect(&cfg.controller)
            .map_err(|e| io_err(&format!("cannot connect to {}", cfg.controller), e))?;
        // An unspecified listen address registers as loopback (LMCache sends the host's IP).
        let ip = match addr.ip() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let registration = Registration {
            instance_id: instance_id.clone(),
            worker_id: cfg.worker_id,
            ip: ip.to_string(),
            port: addr.port(),
            distributed_url: SocketAddr::new(ip, addr.port()).to_string(),
        };
        let (tx, rx) = mpsc::sync_channel(CHANNEL_CAPACITY);
        let counters = Counters::default();
        let stop = Arc::new(AtomicBool::new(false));
        let sender = Sender {
            socket,
            registration,
            sent: counters.sent.clone(),
            dropped: counters.dropped.clone(),
            pending: counters.pending.clone(),
        };
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("rolter-mock-{engine}-lmcache"))
                .spawn(move || sender.run(rx, &stop))?
        };
        Ok(Arc::new(LmcacheWorker {
            instance_id,
            worker_id: cfg.worker_id,
            location: cfg.location.clone(),
            chunk_size: cfg.chunk_size.max(1),
            capacity: cfg.capacity_chunks,
            store: Mutex::new(Store::default()),
            counters,
            tx,
            stop,
            sender: Mutex::new(Some(thread)),
        }))
    }

    /// The instance id the worker reports.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Chunks the prompt's token ids (no lock taken).
    pub fn query(&self, token_ids: &[u32]) -> LmcacheQuery {
        LmcacheQuery {
            chunks: chunk_keys(token_ids, self.chunk_size),
        }
    }

    /// Prompt tokens held: the end of the last of the leading chunks held (stopping at
    /// the first miss), as LMCache's lookup counts them. The chunks found are refreshed.
    pub fn lookup(&self, q: &LmcacheQuery) -> u64 {
        let mut store = self.store.lock().unwrap();
        let held = q
            .chunks
            .iter()
            .take_while(|c| store.stamps.contains_key(&c.key))
            .count();
        for c in &q.chunks[..held] {
            store.touch(c.key);
        }
        drop(store);
        let hit = held.checked_sub(1).map_or(0, |i| q.chunks[i].end as u64);
        inc(&self.counters.lookups);
        self.counters.query_tokens.fetch_add(q.tokens(), Relaxed);
        self.counters.hit_tokens.fetch_add(hit, Relaxed);
        hit
    }

    /// Stores the prompt's chunks (refreshing those held, admitting the others), then
    /// evicts the least recently used chunks beyond the capacity; reports both.
    pub fn store(&self, q: &LmcacheQuery) {
        if self.capacity == 0 {
            return;
        }
        let mut store = self.store.lock().unwrap();
        for c in &q.chunks {
            if !store.touch(c.key) {
                inc(&self.counters.admitted);
                self.send(WorkerMsg::Admit(self.chunk_msg(c.key)));
            }
        }
        while store.stamps.len() > self.capacity {
            let Some((_, key)) = store.order.pop_first() else {
                break;
            };
            store.stamps.remove(&key);
            inc(&self.counters.evicted);
            self.send(WorkerMsg::Evict(self.chunk_msg(key)));
        }
    }

    fn chunk_msg(&self, key: i64) -> ChunkMsg {
        ChunkMsg {
            instance_id: self.instance_id.clone(),
            worker_id: self.worker_id,
            key: key.into(),
            location: self.location.clone(),
        }
    }

    /// Hands a message to the sender thread; drops it when the channel is full.
    fn send(&self, msg: WorkerMsg) {
        // Counted before it is queued, so a reader never sees it neither pending nor sent.
        self.counters.pending.fetch_add(1, Relaxed);
        match self.tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.pending.fetch_sub(1, Relaxed);
                inc(&self.counters.dropped);
            }
        }
    }

    /// Chunks held now.
    fn resident_chunks(&self) -> u64 {
        self.store.lock().unwrap().stamps.len() as u64
    }

    pub fn stats(&self) -> LmcacheStats {
        let c = &self.counters;
        LmcacheStats {
            lookups: c.lookups.load(Relaxed),
            query_tokens: c.query_tokens.load(Relaxed),
            hit_tokens: c.hit_tokens.load(Relaxed),
            admitted_chunks: c.admitted.load(Relaxed),
            evicted_chunks: c.evicted.load(Relaxed),
            resident_chunks: self.resident_chunks(),
            sent_messages: c.sent.load(Relaxed),
            dropped_messages: c.dropped.load(Relaxed),
            pending_messages: c.pending.load(Relaxed),
        }
    }

    /// Appends the `lmcache:*` metrics LMCache's workers export (labels `model_name`,
    /// `worker_id`). `model` is already label-escaped. The usage gauge counts
    /// [`BYTES_PER_TOKEN`] bytes per held token slot (chunks × chunk_size).
    pub fn render_metrics(&self, out: &mut String, model: &str) {
        let s = self.stats();
        let labels = format!("model_name=\"{model}\",worker_id=\"{}\"", self.worker_id);
        let usage = s.resident_chunks * self.chunk_size as u64 * BYTES_PER_TOKEN;
        for (name, kind, help, value) in [
            (
                "lmcache:num_requested_tokens_total",
                "counter",
                "Total number of tokens requested from LMCache.",
                s.query_tokens,
            ),
            (
                "lmcache:num_hit_tokens_total",
                "counter",
                "Total number of tokens hit in LMCache.",
                s.hit_tokens,
            ),
            (
                "lmcache:local_cache_usage",
                "gauge",
                "Local cache usage (bytes) of LMCache.",
                usage,
            ),
        ] {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {:?}\n",
                value as f64
            );
        }
    }

    /// Stops the sender thread once it has sent what is queued and `DeRegisterMsg`.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.sender.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

impl Drop for LmcacheWorker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The sender thread's state.
struct Sender {
    socket: zmq::Socket,
    registration: Registration,
    sent: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    pending: Arc<AtomicU64>,
}

impl Sender {
    /// Registers, then sends queued messages (in batches) and a heartbeat every second
    /// until `stop`; then sends what is still queued and deregisters.
    fn run(self, rx: Receiver<WorkerMsg>, stop: &AtomicBool) {
        self.send(&[WorkerMsg::Register(self.registration.clone())]);
        let mut next_beat = Instant::now() + HEARTBEAT;
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            let wait = next_beat
                .saturating_duration_since(Instant::now())
                .min(TICK);
            match rx.recv_timeout(wait) {
                Ok(msg) => {
                    batch.push(msg);
                    while batch.len() < BATCH {
                        match rx.try_recv() {
                            Ok(m) => batch.push(m),
                            Err(_) => break,
                        }
                    }
                    self.send(&batch);
                    self.pending.fetch_sub(batch.len() as u64, Relaxed);
                    batch.clear();
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if Instant::now() >= next_beat {
                self.send(&[WorkerMsg::Heartbeat(self.registration.clone())]);
                next_beat = Instant::now() + HEARTBEAT;
            }
            if stop.load(Ordering::Acquire) {
                break;
            }
        }
        while let Ok(m) = rx.try_recv() {
            batch.push(m);
            if batch.len() == BATCH {
                self.send(&batch);
                self.pending.fetch_sub(batch.len() as u64, Relaxed);
                batch.clear();
            }
        }
        if !batch.is_empty() {
            self.send(&batch);
            self.pending.fetch_sub(batch.len() as u64, Relaxed);
        }
        let r = &self.registration;
        self.send(&[WorkerMsg::DeRegister {
            instance_id: r.instance_id.clone(),
            worker_id: r.worker_id,
            ip: r.ip.clone(),
            port: r.port,
        }]);
        // Dropping the socket flushes what ZMQ still holds, for up to LINGER_MS.
    }

    /// Sends messages as one multipart message, one msgpack message per frame; never
    /// blocks (what ZMQ cannot queue is dropped and counted).
    fn send(&self, msgs: &[WorkerMsg]) {
        let frames: Vec<Vec<u8>> = msgs.iter().map(WorkerMsg::to_msgpack).collect();
        let n = frames.len() as u64;
        match self.socket.send_multipart(frames, zmq::DONTWAIT) {
            Ok(()) => self.sent.fetch_add(n, Relaxed),
            Err(_) => self.dropped.fetch_add(n, Relaxed),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker whose PUSH socket goes to a PULL bound here; returns both.
    fn worker(capacity: usize, chunk_size: usize) -> (Arc<LmcacheWorker>, zmq::Socket) {
        let ctx = zmq::Context::new();
        let pull = ctx.socket(zmq::PULL).unwrap();
        pull.bind("tcp://127.0.0.1:*").unwrap();
        let ep = pull.get_last_endpoint().unwrap().unwrap();
        let w = LmcacheWorker::start(
            &LmcacheWorkerConfig {
                controller: ep,
                instance_id: String::new(),
                worker_id: 2,
                chunk_size,
                capacity_chunks: capacity,
                location: "LocalCPUBackend".into(),
            },
            "eng",
            "0.0.0.0:8123".parse().unwrap(),
        )
        .unwrap();
        (w, pull)
    }

    /// Receives messages until `n` were seen (or 5 s passed).
    fn recv(pull: &zmq::Socket, n: usize) -> Vec<WorkerMsg> {
        let mut out = Vec::new();
        while out.len() < n {
            assert!(pull.poll(zmq::POLLIN, 5_000).unwrap() > 0, "got {out:?}");
            for f in pull.recv_multipart(0).unwrap() {
                out.push(WorkerMsg::decode(&f).unwrap());
            }
        }
        out
    }

    fn keys(msgs: &[WorkerMsg]) -> Vec<(bool, i128)> {
        msgs.iter()
            .map(|m| match m {
                WorkerMsg::Admit(c) => (true, c.key),
                WorkerMsg::Evict(c) => (false, c.key),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn registers_stores_evicts_and_deregisters() {
        let (w, pull) = worker(3, 4);
        assert_eq!(w.instance_id(), "eng");
        let reg = recv(&pull, 1);
        let WorkerMsg::Register(r) = &reg[0] else {
            panic!("{reg:?}")
        };
        assert_eq!(
            (r.instance_id.as_str(), r.worker_id, r.ip.as_str(), r.port),
            ("eng", 2, "127.0.0.1", 8123)
        );

        let a = w.query(&(0..10).collect::<Vec<u32>>()); // chunks end at 4, 8, 10
        assert_eq!(a.tokens(), 10);
        assert_eq!(w.lookup(&a), 0);
        w.store(&a);
        let ka: Vec<i128> = a.chunks.iter().map(|c| c.key.into()).collect();
        assert_eq!(
            keys(&recv(&pull, 3)),
            ka.iter().map(|&k| (true, k)).collect::<Vec<_>>()
        );
        assert_eq!(w.lookup(&a), 10);
        // A prompt sharing the first chunk only.
        let b = w.query(&[0, 1, 2, 3, 9, 9, 9, 9, 9]);
        assert_eq!(w.lookup(&b), 4);
        // Storing b admits its 2 new chunks and evicts a's least recently used ones: the
        // lookup of b refreshed a's head after a's lookup refreshed all of a, so a's
        // second and third chunks go.
        w.store(&b);
        let kb: Vec<i128> = b.chunks.iter().map(|c| c.key.into()).collect();
        assert_eq!(
            keys(&recv(&pull, 4)),
            [(true, kb[1]), (true, kb[2]), (false, ka[1]), (false, ka[2])]
        );
        assert_eq!(w.lookup(&a), 4);
        assert_eq!(w.lookup(&b), 9);
        let s = w.stats();
        assert_eq!(
            (s.lookups, s.query_tokens, s.hit_tokens),
            (5, 10 + 9 + 10 + 10 + 9, 10 + 4 + 4 + 9)
        );
        assert_eq!(
            (s.admitted_chunks, s.evicted_chunks, s.resident_chunks),
            (5, 2, 3)
        );
        assert_eq!(s.dropped_messages, 0);

        let mut text = String::new();
        w.render_metrics(&mut text, "m");
        assert!(
            text.contains("lmcache:num_hit_tokens_total{model_name=\"m\",worker_id=\"2\"} 27.0\n")
        );
        assert!(text.contains("lmcache:local_cache_usage{model_name=\"m\",worker_id=\"2\"} 24.0\n"));

        w.shutdown();
        let last = recv(&pull, 1);
        assert!(
            matches!(&last[0], WorkerMsg::DeRegister { instance_id, worker_id: 2, port: 8123, .. } if instance_id == "eng"),
            "{last:?}"
        );
    }

    #[test]
    fn heartbeats_every_second_and_capacity_zero_stores_nothing() {
        let (w, pull) = worker(0, 4);
        let q = w.query(&[1, 2, 3, 4, 5]);
        w.store(&q);
        assert_eq!(w.lookup(&q), 0);
        let t = Instant::now();
        let msgs = recv(&pull, 2);
        assert!(matches!(msgs[0], WorkerMsg::Register(_)), "{msgs:?}");
        assert!(matches!(msgs[1], WorkerMsg::Heartbeat(_)), "{msgs:?}");
        assert!(t.elapsed() >= Duration::from_millis(500));
        assert_eq!(w.stats().admitted_chunks, 0);
    }
}
