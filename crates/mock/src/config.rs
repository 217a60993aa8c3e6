//! Configuration types: [`MockConfig`], the I/O [`Driver`] choice, the [`MockApi`] an
//! engine serves and engine-wide [`Fault`]s. Plain data: no behaviour beyond parsing names.

use std::net::SocketAddr;
use std::time::Duration;

/// Which monoio driver the worker threads run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Driver {
    /// io_uring when the kernel allows it, epoll otherwise (monoio `FusionDriver`).
    #[default]
    Auto,
    /// io_uring only (`IoUringDriver`); `spawn` fails when io_uring is unavailable.
    IoUring,
    /// epoll (`LegacyDriver`).
    Epoll,
}

impl Driver {
    /// Short name: `auto`, `io_uring` or `epoll`.
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::Auto => "auto",
            Driver::IoUring => "io_uring",
            Driver::Epoll => "epoll",
        }
    }
}

impl std::str::FromStr for Driver {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "fusion" => Ok(Driver::Auto),
            "io_uring" | "iouring" | "uring" => Ok(Driver::IoUring),
            "epoll" | "legacy" => Ok(Driver::Epoll),
            other => Err(format!("unknown driver {other:?} (auto, io_uring, epoll)")),
        }
    }
}

impl std::fmt::Display for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which API surface an engine serves, as the engines a gateway routes to differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MockApi {
    /// Every endpoint: vLLM's OpenAI-compatible ones, Anthropic's messages and the
    /// Responses API.
    #[default]
    Any,
    /// vLLM without its Anthropic and Responses routes: `/v1/messages`,
    /// `/v1/messages/count_tokens` and `/v1/responses` answer 404 `{"detail":"Not Found"}`.
    OpenAi,
    /// A managed Anthropic API: `/v1/messages`, `/v1/messages/count_tokens` and
    /// `/v1/models` (plus `/health`, `/metrics` and `/mock/*`); Anthropic's error bodies,
    /// its `anthropic-version` and `x-api-key` checks and its stream `ping` event.
    Anthropic,
}

impl MockApi {
    /// Short name: `any`, `openai` or `anthropic`.
    pub fn as_str(self) -> &'static str {
        match self {
            MockApi::Any => "any",
            MockApi::OpenAi => "openai",
            MockApi::Anthropic => "anthropic",
        }
    }
}

impl std::str::FromStr for MockApi {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "any" => Ok(MockApi::Any),
            "openai" => Ok(MockApi::OpenAi),
            "anthropic" => Ok(MockApi::Anthropic),
            other => Err(format!("unknown API {other:?} (any, openai, anthropic)")),
        }
    }
}

impl std::fmt::Display for MockApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Configuration of one mock engine.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Engine id, sent as the response header `x-mock-engine: <name>`.
    pub name: String,
    /// Listen address (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Worker threads, each with its own monoio runtime and SO_REUSEPORT listener.
    pub threads: usize,
    /// Served model names; the first is the default. Any requested model is answered anyway.
    pub models: Vec<String>,
    /// Time from request (admission) to the first token.
    pub ttft: Duration,
    /// Inter-token latency.
    pub itl: Duration,
    /// Tokens per answer; `max_tokens`/`max_completion_tokens` in a request caps it.
    pub tokens: u32,
    /// Concurrency limit (0 = unlimited). Split across threads: each thread admits
    /// `max_running / threads` requests (the remainder going to the first threads, at
    /// least 1 each) and queues the rest FIFO.
    pub max_running: usize,
    /// I/O driver.
    pub driver: Driver,
    /// Keep every received request (see `MockHandle::requests`).
    pub record_requests: bool,
    /// Prefix-cache model for chat and completions requests; `None` (the default) turns
    /// it off, leaving prompt accounting, usage bodies and timing as without it.
    pub prefix_cache: Option<PrefixCacheConfig>,
    /// LoRA adapters (slots, `/v1/load_lora_adapter`, `vllm:lora_requests_info`); `None`
    /// (the default) answers any requested model as the base model.
    pub lora: Option<crate::lora::LoraConfig>,
    /// KV-cache events published as vLLM does (ZMQ PUB, msgpack batches, replay);
    /// `None` (the default) publishes nothing. Needs the prefix cache: when
    /// `prefix_cache` is `None`, the default [`PrefixCacheConfig`] is used.
    pub kv_events: Option<KvEventsConfig>,
    /// An LMCache worker (CPU-offload store of chunk KV, reported to an LMCache
    /// controller over ZMQ); `None` (the default) runs none. Needs the prefix cache's
    /// token ids: when `prefix_cache` is `None`, the default [`PrefixCacheConfig`] is used.
    pub lmcache: Option<LmcacheWorkerConfig>,
    /// The engine's leg in a disaggregated prefill/decode fleet (see the crate's `pd`
    /// module); `None` (the default) serves whole requests.
    pub pd: Option<crate::pd::PdConfig>,
    /// Data-parallel ranks behind the one HTTP port (see the crate's `dp` module); 1 (the
    /// default) is one engine. `max_running` is split over the ranks (the remainder to
    /// the first ones, at least 1 each), then each rank's share over the threads.
    pub dp_size: u32,
    /// The API surface served (see [`MockApi`]); `Any` (the default) serves every endpoint.
    pub api: MockApi,
    /// The key clients must present; `None` (the default) checks none. With
    /// `MockApi::Anthropic`, the Anthropic API's routes need `x-api-key: <key>` (else 401
    /// `authentication_error`); otherwise every path under `/v1` needs
    /// `Authorization: Bearer <key>` (else 401 `{"error":"Unauthorized"}`), as vLLM's
    /// `--api-key` does. `/health`, `/metrics` and `/mock/*` never need it.
    pub api_key: Option<String>,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            name: "mock".to_string(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            threads: 1,
            models: vec!["mock-model".to_string()],
            ttft: Duration::ZERO,
            itl: Duration::ZERO,
            tokens: 16,
            max_running: 0,
            driver: Driver::Auto,
            record_requests: false,
            prefix_cache: None,
            lora: None,
            kv_events: None,
            lmcache: None,
            pd: None,
            dp_size: 1,
            api: MockApi::Any,
            api_key: None,
        }
    }
}

/// A simulated prefix (KV) cache, modelled on vLLM's automatic prefix caching.
///
/// The prompt of a chat or completions request (its `messages` or `prompt` value,
/// re-serialised compactly so JSON whitespace does not matter) is cut into blocks of
/// `block_tokens * chars_per_token` bytes. Only full blocks are cached; each is keyed by
/// a hash chained over the previous block's key, so a block hits only when the whole
/// prefix before it matches. Hits are counted over the leading blocks and stop at the
/// first miss. Every request then inserts (or refreshes) all its full blocks; the cache
/// keeps at most `capacity_blocks`, evicting the least recently used ones.
///
/// With the cache on, the first token comes after the queue wait, plus `ttft` (or the
/// `x-mock-ttft-ms` override), plus `prefill_us_per_token` for each uncached prompt token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Tokens per cache block (vLLM's `block_size`, 16 by default).
    pub block_tokens: u32,
    /// Cache size in blocks (0 caches nothing).
    pub capacity_blocks: usize,
    /// Prefill cost of each uncached prompt token, in microseconds.
    pub prefill_us_per_token: u64,
    /// Prompt bytes per token, used to turn prompt bytes into tokens (4 by default).
    pub chars_per_token: u32,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            block_tokens: 16,
            capacity_blocks: 4096,
            prefill_us_per_token: 100,
            chars_per_token: 4,
        }
    }
}

/// KV-cache events, as vLLM's `--kv-events-config` publishes them.
///
/// Every admission of a chat or completions request that inserts prefix-cache blocks,
/// or evicts some, publishes one `EventBatch`: a `BlockStored` for the new blocks (their
/// chained keys as hashes, the key before them as parent, their token ids, the block
/// size), then a `BlockRemoved` for the evicted ones. Resetting the cache publishes
/// `AllBlocksCleared`. See the crate's `kv_events` module for the wire layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's bind endpoint, e.g. `tcp://127.0.0.1:5557`; port 0 (or `*`) picks
    /// a free port (see `MockHandle::kv_events_endpoint`).
    pub endpoint: String,
    /// The replay ROUTER's bind endpoint; no replay when `None`.
    pub replay_endpoint: Option<String>,
    /// Frame 1 of every message (vLLM's `topic`, empty by default).
    pub topic: String,
    /// Messages kept for replay (vLLM's `buffer_steps`, 10 000 by default).
    pub buffer_steps: usize,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            endpoint: "tcp://127.0.0.1:0".to_string(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
        }
    }
}

/// An LMCache worker in the engine, as `LMCACHE_ENABLE_CONTROLLER=True` runs one.
///
/// After a chat or completions request's prefill, its prompt token ids are stored in
/// chunks of `chunk_size` tokens (the last partial chunk too, as LMCache's
/// `save_unfull_chunk=True`), each keyed by a hash chained over the previous chunk's key.
/// A chunk not yet held is admitted (`KVAdmitMsg` to the controller); beyond
/// `capacity_chunks` the least recently used chunks are evicted (`KVEvictMsg`). The
/// worker registers on start (`RegisterMsg`), beats every second (`HeartbeatMsg`) and
/// deregisters on shutdown (`DeRegisterMsg`). A request whose leading chunks are held
/// counts those tokens as cached for its prefill time. See the crate's `lmcache_worker`
/// and `lmcache_wire` modules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LmcacheWorkerConfig {
    /// The controller's PULL endpoint the worker's PUSH socket connects to, e.g.
    /// `tcp://127.0.0.1:5600` (LMCache's `controller_url`).
    pub controller: String,
    /// `instance_id` of every message (LMCache's `lmcache_instance_id`); empty (the
    /// default) means the engine's name.
    pub instance_id: String,
    /// `worker_id` of every message (the tensor-parallel rank; 0).
    pub worker_id: u32,
    /// Tokens per chunk (LMCache's `chunk_size`, 256 by default). The controller must use
    /// the same.
    pub chunk_size: usize,
    /// Chunks the CPU-offload store holds (LRU); 0 stores nothing.
    pub capacity_chunks: usize,
    /// `location` of the admit and evict messages (the storage backend's name).
    pub location: String,
}

impl Default for LmcacheWorkerConfig {
    fn default() -> Self {
        LmcacheWorkerConfig {
            controller: "tcp://127.0.0.1:5600".to_string(),
            instance_id: String::new(),
            worker_id: 0,
            chunk_size: 256,
            capacity_chunks: 1024,
            location: "LocalCPUBackend".to_string(),
        }
    }
}

/// An engine-wide fault, applied to every inference request (chat, completions,
/// embeddings, messages, responses) that does not carry its own `x-mock-*` fault header.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this status and an OpenAI-shaped error body.
    Status(u16),
    /// Accept and read the request, never answer (until the client goes away).
    Stall,
    /// Reset the connection (RST) after N token events; 0 = before any response byte.
    ResetAfter(u32),
    /// Answer normally, with this time to first token instead of the configured one (a
    /// throttled GPU); an `x-mock-ttft-ms` header still wins.
    Slow(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_names_round_trip() {
        for api in [MockApi::Any, MockApi::OpenAi, MockApi::Anthropic] {
            assert_eq!(api.as_str().parse::<MockApi>(), Ok(api));
            assert_eq!(api.to_string().to_uppercase().parse::<MockApi>(), Ok(api));
        }
        assert!("vllm".parse::<MockApi>().is_err());
        assert_eq!(MockConfig::default().api, MockApi::Any);
        assert_eq!(MockConfig::default().api_key, None);
    }
}
