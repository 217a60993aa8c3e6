//! `rolter-mock`: a fast mock of vLLM's OpenAI-compatible HTTP surface for Rolter's tests,
//! demo and load tests.
//!
//! [`spawn`] starts an engine on background threads (one monoio runtime and one
//! SO_REUSEPORT listener per thread) and returns a [`MockHandle`] once it listens.
//! Module map: [`config`] (configuration types), `server` (threads, runtimes, accept
//! loop), `conn` (per-connection request loop, abort detection, timing, faults),
//! `http` (HTTP/1.1 parsing and response heads), `api` (vLLM's JSON and SSE formats),
//! `admission` (the `max_running` FIFO queue), `prefix` (the prefix-cache model and the
//! mock's token ids), `kv_events` (KV-cache events over ZMQ, as vLLM publishes them),
//! `lmcache_worker` (the engine's LMCache worker: chunk store and controller reports),
//! [`lmcache_wire`] (LMCache's worker messages and chunk keys),
//! [`lmcache_controller`] (an LMCache controller stand-in: `/lookup` over HTTP, fed by
//! workers over ZMQ), [`lora`] (LoRA adapters: slots, load/unload,
//! `vllm:lora_requests_info`), [`stats`] (counters and `/metrics`), [`pd`] (disaggregated
//! prefill/decode legs: vLLM's KV-transfer params and pull, SGLang's bootstrap rooms),
//! `bootstrap` (an SGLang prefill's bootstrap server), `dp` (data-parallel ranks: which rank serves a request),
//! `modes` (the API modes: refused requests, error and model-list bodies).
//!
//! **Disaggregated prefill/decode** (`MockConfig::pd`, CLI `--pd-role prefill|decode`,
//! `--pd-protocol vllm|sglang`, `--bootstrap-port N`, `--pd-handshake-timeout 5s`): the
//! engine serves one leg of vLLM's or SGLang's P/D protocol; see the [`pd`] module.
//! **Data-parallel ranks** (`MockConfig::dp_size`, CLI `--dp-size N`): N ranks behind one
//! port, pinned by `X-data-parallel-rank` or `data_parallel_rank`, each with its own
//! queue, prefix cache and `engine="r"` metric series.
//! **API modes** (`MockConfig::api`, CLI `--api any|openai|anthropic`, with
//! `MockConfig::api_key`, CLI `--api-key KEY`): an engine serves every API, only vLLM's
//! OpenAI surface, or only a managed Anthropic API (its routes, error bodies, header
//! checks and stream `ping`); see [`MockApi`] and the `modes` module.
//! **Tool calls and stop strings** (chat and messages): a request offering `tools` gets one
//! call of a tool (unless its conversation ends with a tool's result), and `stop` /
//! `stop_sequences` cut the text before the token where a stop string begins; see `api`.

pub mod client;
pub mod config;
#[cfg(feature = "zmq")]
pub mod lmcache_controller;
pub mod lmcache_wire;
pub mod lora;
pub mod pd;
pub mod stats;

mod admission;
mod api;
mod bootstrap;
mod conn;
mod dp;
mod endpoints;
mod http;
#[cfg(feature = "zmq")]
mod kv_events;
#[cfg(feature = "zmq")]
mod lmcache_worker;
mod modes;
mod prefix;
mod server;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

pub use config::{
    Driver, Fault, KvEventsConfig, LmcacheWorkerConfig, MockApi, MockConfig, PrefixCacheConfig,
};
#[cfg(feature = "zmq")]
pub use lmcache_controller::{Controller, ControllerConfig, LayoutEntry};
pub use lora::{LoraConfig, LoraStats};
pub use pd::{PdConfig, PdProtocol, PdRole, PdStats};
pub use stats::{LmcacheStats, PrefixCacheStats, RankStats, StatsSnapshot};

/// A request as received (kept when `MockConfig::record_requests` is set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
    /// The data-parallel rank an inference request asked for (`X-data-parallel-rank` or
    /// `data_parallel_rank`); `None` when it named none (and for other requests).
    pub dp_rank: Option<u32>,
    /// The rank an inference request ran on (0 for other requests and with one rank).
    pub ran_on_rank: u32,
}

impl RecordedRequest {
    /// First header with this (lowercase) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// State shared by all worker threads of one engine.
pub(crate) struct Shared {
    pub cfg: MockConfig,
    pub engine_header: Vec<u8>,
    pub default_model: String,
    pub metrics_model: String,
    pub models_body: Vec<u8>,
    pub stats: Arc<stats::Stats>,
    /// Each data-parallel rank's counters; with one rank, `stats` itself.
    pub ranks: Vec<Arc<stats::Stats>>,
    /// The next rank of the round-robin (requests that name none).
    pub rank_turn: AtomicU32,
    /// One prefix cache per data-parallel rank, when `cfg.prefix_cache` is set (else none).
    pub caches: Vec<prefix::PrefixCache>,
    /// The P/D leg's state, when `cfg.pd` is set.
    pub pd: Option<Arc<pd::Pd>>,
    /// LoRA adapters, when `cfg.lora` is set.
    pub lora: Option<Arc<lora::Lora>>,
    /// The KV-event publisher, when `cfg.kv_events` is set.
    #[cfg(feature = "zmq")]
    pub kv: Option<Arc<kv_events::KvPublisher>>,
    /// The LMCache worker, when `cfg.lmcache` is set.
    #[cfg(feature = "zmq")]
    pub lmcache: Option<Arc<lmcache_worker::LmcacheWorker>>,
    fault_set: AtomicBool,
    fault: Mutex<Option<Fault>>,
    pub recorded: Mutex<Vec<RecordedRequest>>,
    pub aborted_ids: Mutex<Vec<String>>,
    pub shutdown: AtomicBool,
}

impl Shared {
    /// Rank 0's prefix cache (all ranks' caches share one configuration); `None` when off.
    pub fn cache(&self) -> Option<&prefix::PrefixCache> {
        self.caches.first()
    }

    /// Whether the ranks keep counters of their own (more than one rank).
    pub fn multi_rank(&self) -> bool {
        self.ranks.len() > 1
    }

    /// The engine-wide fault; a single atomic load when none is set.
    pub fn fault(&self) -> Option<Fault> {
        if !self.fault_set.load(Ordering::Acquire) {
            return None;
        }
        self.fault.lock().unwrap().clone()
    }

    pub fn set_fault(&self, fault: Option<Fault>) {
        let mut f = self.fault.lock().unwrap();
        self.fault_set.store(fault.is_some(), Ordering::Release);
        *f = fault;
    }

    /// An error body in the shape of the engine's API mode.
    pub fn error_body(&self, status: u16, message: &str) -> Vec<u8> {
        modes::error_body(self.cfg.api, status, message)
    }
}

/// Starts an engine; returns once every thread listens.
pub fn spawn(cfg: MockConfig) -> std::io::Result<MockHandle> {
    let mut cfg = cfg;
    cfg.threads = cfg.threads.max(1);
    cfg.dp_size = cfg.dp_size.max(1);
    if cfg.models.is_empty() {
        cfg.models.push("mock-model".to_string());
    }
    #[cfg(not(feature = "zmq"))]
    if cfg.kv_events.is_some() || cfg.lmcache.is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "KV events and the LMCache worker speak ZMQ: build rolter-mock with its `zmq` feature",
        ));
    }
    #[cfg(feature = "zmq")]
    let kv = match &cfg.kv_events {
        Some(k) => {
            cfg.prefix_cache
                .get_or_insert_with(PrefixCacheConfig::default);
            Some(kv_events::KvPublisher::start(k, &cfg.name)?)
        }
        None => None,
    };
    if cfg.lmcache.is_some() {
        cfg.prefix_cache
            .get_or_insert_with(PrefixCacheConfig::default);
    }
    let listeners = server::bind(cfg.listen, cfg.threads)?;
    let addr = listeners[0].local_addr()?;
    #[cfg(feature = "zmq")]
    let lmcache = match &cfg.lmcache {
        Some(l) => Some(lmcache_worker::LmcacheWorker::start(l, &cfg.name, addr)?),
        None => None,
    };
    let default_model = cfg.models[0].clone();
    let stats = Arc::new(stats::Stats::default());
    let ranks = stats::rank_counters(&stats, cfg.dp_size);
    let (pd, bootstrap) = start_pd(&cfg, addr)?;
    let shared = Arc::new(Shared {
        engine_header: format!("x-mock-engine: {}\r\n", cfg.name).into_bytes(),
        metrics_model: default_model.replace('\\', "\\\\").replace('"', "\\\""),
        default_model,
        models_body: modes::models_body(cfg.api, &cfg.models),
        stats,
        ranks,
        rank_turn: AtomicU32::new(0),
        caches: match &cfg.prefix_cache {
            // One cache per rank, all publishing on the one KV-event socket.
            Some(p) => (0..cfg.dp_size)
                .map(|_| {
                    prefix::PrefixCache::new(
                        p,
                        #[cfg(feature = "zmq")]
                        kv.clone(),
                    )
                })
                .collect(),
            None => Vec::new(),
        },
        pd,
        #[cfg(feature = "zmq")]
        kv,
        #[cfg(feature = "zmq")]
        lmcache,
        lora: cfg.lora.clone().map(|l| Arc::new(lora::Lora::new(l))),
        fault_set: AtomicBool::new(false),
        fault: Mutex::new(None),
        recorded: Mutex::new(Vec::new()),
        aborted_ids: Mutex::new(Vec::new()),
        shutdown: AtomicBool::new(false),
        cfg,
    });
    let mut handle = MockHandle {
        shared: shared.clone(),
        threads: Vec::new(),
        addr,
        driver: Driver::Epoll,
        bootstrap,
    };
    let (tx, rx) = mpsc::channel();
    let n = listeners.len();
    for (i, l) in listeners.into_iter().enumerate() {
        let shared = shared.clone();
        let tx = tx.clone();
        let limits = thread_limits(&shared.cfg, n, i);
        let driver = shared.cfg.driver;
        let t = std::thread::Builder::new()
            .name(format!("rolter-mock-{}-{i}", shared.cfg.name))
            .spawn(move || server::run_thread(l, shared, limits, driver, tx))?;
        handle.threads.push(t);
    }
    for _ in 0..n {
        match rx.recv() {
            Ok(Ok(d)) => handle.driver = d,
            Ok(Err(e)) => return Err(e), // handle drops: stops the other threads
            Err(_) => return Err(std::io::Error::other("mock engine thread died")),
        }
    }
    Ok(handle)
}

/// Thread `i`'s (of `n`) share of each data-parallel rank's `max_running`.
fn thread_limits(cfg: &MockConfig, n: usize, i: usize) -> Vec<usize> {
    let rank_limit = |r| dp::rank_limit(cfg.max_running, cfg.dp_size, r);
    let limits = (0..cfg.dp_size).map(|r| server::thread_limit(rank_limit(r), n, i));
    limits.collect()
}

/// The P/D state (with `cfg.pd`) and, for an SGLang prefill, its bootstrap server.
fn start_pd(
    cfg: &MockConfig,
    addr: SocketAddr,
) -> std::io::Result<(Option<Arc<pd::Pd>>, Option<bootstrap::Bootstrap>)> {
    let Some(p) = cfg.pd else {
        return Ok((None, None));
    };
    let state = Arc::new(pd::Pd::new(p, &cfg.name, addr));
    let server = match p.serves_bootstrap() {
        true => {
            let at = SocketAddr::new(cfg.listen.ip(), p.bootstrap_port);
            Some(bootstrap::Bootstrap::start(at, state.clone())?)
        }
        false => None,
    };
    Ok((Some(state), server))
}

/// A running engine; stops its threads on [`MockHandle::shutdown`] or drop.
pub struct MockHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
    driver: Driver,
    /// The SGLang prefill's bootstrap server.
    bootstrap: Option<bootstrap::Bootstrap>,
}

impl MockHandle {
    /// The bound address (with the real port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The driver actually in use: `Driver::IoUring` or `Driver::Epoll`.
    pub fn driver(&self) -> Driver {
        self.driver
    }

    /// The engine's name.
    pub fn name(&self) -> &str {
        &self.shared.cfg.name
    }

    /// The data-parallel ranks behind its port.
    pub fn dp_size(&self) -> u32 {
        self.shared.cfg.dp_size.max(1)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The prefix cache's counters and occupancy (over all data-parallel ranks); `None`
    /// when the cache is off.
    pub fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        let caches = &self.shared.caches;
        if caches.is_empty() {
            return None;
        }
        let s = self.shared.stats.snapshot();
        Some(PrefixCacheStats {
            queries: s.prefix_cache_queries,
            hits: s.prefix_cache_hits,
            resident_blocks: caches.iter().map(|c| c.resident_blocks()).sum(),
            evicted_blocks: caches.iter().map(|c| c.evicted_blocks()).sum(),
        })
    }

    /// Each data-parallel rank's counters, by rank (one entry with `dp_size` 1).
    pub fn rank_stats(&self) -> Vec<RankStats> {
        let ranks = self.shared.ranks.iter().enumerate();
        ranks.map(|(r, s)| s.rank_snapshot(r as u32)).collect()
    }

    /// The P/D counters (all zero without `pd`).
    pub fn pd_stats(&self) -> PdStats {
        self.shared
            .pd
            .as_ref()
            .map(|p| p.stats())
            .unwrap_or_default()
    }

    /// The engine id a vLLM-protocol prefill names in its `kv_transfer_params`; `None`
    /// without `pd`.
    pub fn pd_engine_id(&self) -> Option<&str> {
        Some(&self.shared.pd.as_ref()?.engine_id)
    }

    /// The SGLang prefill's bootstrap server address (loopback when it listens on any
    /// address); `None` for other engines.
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        Some(self.bootstrap.as_ref()?.addr())
    }

    /// LoRA counters (slot loads, load/unload calls) and adapter state; `None` when LoRA
    /// is off.
    pub fn lora_stats(&self) -> Option<LoraStats> {
        self.shared.lora.as_ref().map(|l| l.stats())
    }

    #[cfg(feature = "zmq")]
    /// The bound KV-event PUB endpoint (real port when 0 was asked); `None` without
    /// `kv_events`.
    pub fn kv_events_endpoint(&self) -> Option<String> {
        Some(self.shared.kv.as_ref()?.endpoint().to_string())
    }

    #[cfg(feature = "zmq")]
    /// The bound KV-event replay endpoint; `None` without one.
    pub fn kv_replay_endpoint(&self) -> Option<String> {
        Some(self.shared.kv.as_ref()?.replay_endpoint()?.to_string())
    }

    #[cfg(feature = "zmq")]
    /// The seq the next KV-event message will get; `None` without `kv_events`.
    pub fn kv_next_seq(&self) -> Option<u64> {
        Some(self.shared.kv.as_ref()?.next_seq())
    }

    /// Resets the prefix cache and publishes `AllBlocksCleared` (as vLLM's
    /// `/reset_prefix_cache` does); also served as `POST /reset_prefix_cache`.
    pub fn publish_clear(&self) {
        for cache in &self.shared.caches {
            cache.clear();
        }
    }

    #[cfg(feature = "zmq")]
    /// Drops the next `n` KV-event messages as a PUB does at its high-water mark: each
    /// takes its seq (and its place in the replay buffer) but is not sent, so
    /// subscribers see a gap.
    pub fn drop_next_kv_messages(&self, n: u64) {
        if let Some(kv) = &self.shared.kv {
            kv.drop_next(n);
        }
    }

    #[cfg(feature = "zmq")]
    /// Closes the KV-event PUB socket for good (the engine's HTTP side keeps serving), as
    /// when an engine's publisher dies.
    pub fn stop_kv_events(&self) {
        if let Some(kv) = &self.shared.kv {
            kv.stop_publishing();
        }
    }

    #[cfg(feature = "zmq")]
    /// Takes the KV-event PUB socket down (`true`) or brings it back on the same endpoint
    /// (`false`), as when an engine's publisher is unreachable for a while: subscribers
    /// are disconnected, and batches published meanwhile take their seqs and stay in the
    /// replay buffer, so only a replay brings them.
    pub fn set_kv_events_down(&self, down: bool) -> std::io::Result<()> {
        match &self.shared.kv {
            Some(kv) => kv.set_down(down),
            None => Ok(()),
        }
    }

    #[cfg(feature = "zmq")]
    /// Restarts the engine as far as its KV cache goes: the prefix cache empties without
    /// an event (a new process), and the KV-event publisher starts over at seq 0 with an
    /// empty replay buffer, its subscribers disconnected and then reconnecting. The HTTP
    /// side keeps serving.
    pub fn restart_kv_cache(&self) -> std::io::Result<()> {
        for cache in &self.shared.caches {
            cache.forget();
        }
        match &self.shared.kv {
            Some(kv) => kv.restart(),
            None => Ok(()),
        }
    }

    #[cfg(feature = "zmq")]
    /// While paused, KV-event batches are held (without a seq); on resume they are
    /// sent in order.
    pub fn pause_kv_events(&self, paused: bool) {
        if let Some(kv) = &self.shared.kv {
            kv.pause(paused);
        }
    }

    #[cfg(feature = "zmq")]
    /// The LMCache worker's counters and occupancy; `None` without `lmcache`.
    pub fn lmcache_stats(&self) -> Option<LmcacheStats> {
        Some(self.shared.lmcache.as_ref()?.stats())
    }

    #[cfg(feature = "zmq")]
    /// The instance id the LMCache worker reports (the engine's name unless configured);
    /// `None` without `lmcache`.
    pub fn lmcache_instance_id(&self) -> Option<&str> {
        Some(self.shared.lmcache.as_ref()?.instance_id())
    }

    /// Requests received so far (empty unless `record_requests`).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.recorded.lock().unwrap().clone()
    }

    /// `x-request-id` of every aborted request ("" when it had none), in abort order.
    pub fn aborted_ids(&self) -> Vec<String> {
        self.shared.aborted_ids.lock().unwrap().clone()
    }

    /// Sets (or clears with `None`) the engine-wide fault.
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.shared.set_fault(fault);
    }

    /// Stops the threads (open connections are closed) and joins them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(b) = &self.bootstrap {
            b.shutdown();
        }
        #[cfg(feature = "zmq")]
        if let Some(kv) = &self.shared.kv {
            kv.shutdown();
        }
        #[cfg(feature = "zmq")]
        if let Some(w) = &self.shared.lmcache {
            w.shutdown();
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
