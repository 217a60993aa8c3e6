//! Engine counters (atomics shared by all worker threads), their snapshot and the
//! Prometheus rendering of `/metrics` in vLLM's names and label style.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use serde::Serialize;

/// A point-in-time copy of the engine counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    /// Inference requests received (chat, completions, embeddings, messages, responses).
    pub requests: u64,
    /// Inference requests whose answer was written completely (including injected error statuses).
    pub completed: u64,
    /// Inference requests whose client went away (or half-closed) before the answer was complete.
    pub aborted: u64,
    /// Requests currently admitted (from admission until the answer ends).
    pub running: u64,
    /// Requests currently queued behind `max_running`.
    pub waiting: u64,
    /// The most requests ever admitted at once (the highest `running` seen since start).
    pub peak_running: u64,
    /// Tokens generated (streamed or returned), over all requests.
    pub generation_tokens: u64,
    /// Requests cut short by an injected reset or stall fault.
    pub faulted: u64,
    /// TCP connections accepted since start (keep-alive reuse shows as fewer connections
    /// than requests).
    pub connections: u64,
    /// Prefix-cache queries, in prompt tokens (`vllm:prefix_cache_queries_total`); 0 when
    /// the prefix cache is off.
    pub prefix_cache_queries: u64,
    /// Prefix-cache hits, in cached prompt tokens (`vllm:prefix_cache_hits_total`).
    pub prefix_cache_hits: u64,
}

/// One data-parallel rank's counters (see `MockHandle::rank_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankStats {
    pub rank: u32,
    /// Inference requests that ran (or were answered) on this rank.
    pub requests: u64,
    /// Of those, the ones whose answer was written completely.
    pub completed: u64,
    /// Requests running on the rank now.
    pub running: u64,
    /// Requests queued behind the rank's share of `max_running`.
    pub waiting: u64,
    /// Tokens the rank generated.
    pub generation_tokens: u64,
    /// The rank's prefix-cache queries, in prompt tokens.
    pub prefix_cache_queries: u64,
    /// The rank's prefix-cache hits, in cached prompt tokens.
    pub prefix_cache_hits: u64,
}

/// The prefix cache's counters and occupancy (see `MockHandle::prefix_cache_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Prompt tokens found cached (leading full blocks).
    pub hits: u64,
    /// Blocks held now.
    pub resident_blocks: u64,
    /// Blocks evicted since start.
    pub evicted_blocks: u64,
}

/// The LMCache worker's counters and occupancy (see `MockHandle::lmcache_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LmcacheStats {
    /// Lookups (one per admitted chat or completions request).
    pub lookups: u64,
    /// Prompt tokens looked up (`lmcache:num_requested_tokens_total`).
    pub query_tokens: u64,
    /// Prompt tokens found held: the end of the last leading chunk held
    /// (`lmcache:num_hit_tokens_total`).
    pub hit_tokens: u64,
    /// Chunks admitted into the store (each sent as `KVAdmitMsg`).
    pub admitted_chunks: u64,
    /// Chunks evicted from the store (each sent as `KVEvictMsg`).
    pub evicted_chunks: u64,
    /// Chunks held now.
    pub resident_chunks: u64,
    /// Messages handed to ZMQ (registration, heartbeats, admissions, evictions).
    pub sent_messages: u64,
    /// Messages dropped: the sender's queue was full or ZMQ could not take them.
    pub dropped_messages: u64,
    /// Admissions and evictions queued and not yet handed to ZMQ (or dropped).
    pub pending_messages: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub requests: AtomicU64,
    pub completed: AtomicU64,
    pub aborted: AtomicU64,
    pub running: AtomicU64,
    pub peak_running: AtomicU64,
    pub waiting: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub faulted: AtomicU64,
    pub connections: AtomicU64,
    pub prefix_cache_queries: AtomicU64,
    pub prefix_cache_hits: AtomicU64,
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub finished_abort: AtomicU64,
}

/// Each data-parallel rank's counters: with one rank, the engine's own.
pub(crate) fn rank_counters(engine: &Arc<Stats>, dp_size: u32) -> Vec<Arc<Stats>> {
    match dp_size {
        0 | 1 => vec![engine.clone()],
        n => (0..n).map(|_| Arc::default()).collect(),
    }
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

pub(crate) fn dec(c: &AtomicU64) {
    c.fetch_sub(1, Relaxed);
}

impl Stats {
    /// One more request admitted: `running` goes up and `peak_running` follows it.
    pub fn admit(&self) {
        let now = self.running.fetch_add(1, Relaxed) + 1;
        self.peak_running.fetch_max(now, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            requests: self.requests.load(Relaxed),
            completed: self.completed.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            peak_running: self.peak_running.load(Relaxed),
            generation_tokens: self.generation_tokens.load(Relaxed),
            faulted: self.faulted.load(Relaxed),
            connections: self.connections.load(Relaxed),
            prefix_cache_queries: self.prefix_cache_queries.load(Relaxed),
            prefix_cache_hits: self.prefix_cache_hits.load(Relaxed),
        }
    }

    /// The counters of one data-parallel rank (see `MockHandle::rank_stats`).
    pub fn rank_snapshot(&self, rank: u32) -> RankStats {
        RankStats {
            rank,
            requests: self.requests.load(Relaxed),
            completed: self.completed.load(Relaxed),
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            generation_tokens: self.generation_tokens.load(Relaxed),
            prefix_cache_queries: self.prefix_cache_queries.load(Relaxed),
            prefix_cache_hits: self.prefix_cache_hits.load(Relaxed),
        }
    }
}

/// One metric family of `/metrics`: name, type, help and the value of one rank.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Stats, usize) -> f64,
);

fn load(c: &AtomicU64) -> f64 {
    c.load(Relaxed) as f64
}

const FAMILIES: [Family; 7] = [
    (
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        |s, _| load(&s.running),
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        |s, _| load(&s.waiting),
    ),
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        |s, max_running| {
            if max_running > 0 {
                (load(&s.running) / max_running as f64).min(1.0)
            } else {
                0.0
            }
        },
    ),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        |s, _| load(&s.prefix_cache_queries),
    ),
    (
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        |s, _| load(&s.prefix_cache_hits),
    ),
    (
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        |s, _| load(&s.prompt_tokens),
    ),
    (
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        |s, _| load(&s.generation_tokens),
    ),
];

/// Renders `/metrics`: each family once, with one series per data-parallel rank labelled
/// `engine="<rank>"` (as vLLM labels its engine cores). `ranks` holds each rank's counters
/// and `max_running` share; `model` is the first served model name (already
/// label-escaped).
pub(crate) fn render_metrics(ranks: &[(&Stats, usize)], model: &str) -> String {
    let mut out = String::with_capacity(2048 * ranks.len());
    for (name, kind, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (rank, (stats, max_running)) in ranks.iter().enumerate() {
            let v = value(stats, *max_running);
            let _ = writeln!(
                out,
                "{name}{{engine=\"{rank}\",model_name=\"{model}\"}} {v:?}"
            );
        }
    }
    let _ = write!(
        out,
        "# HELP vllm:request_success_total Count of successfully processed requests.\n\
         # TYPE vllm:request_success_total counter\n"
    );
    for (rank, (stats, _)) in ranks.iter().enumerate() {
        for (reason, c) in [
            ("abort", &stats.finished_abort),
            ("length", &stats.finished_length),
            ("stop", &stats.finished_stop),
        ] {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{engine=\"{rank}\",finished_reason=\"{reason}\",model_name=\"{model}\"}} {:?}",
                load(c)
            );
        }
    }
    out
}
