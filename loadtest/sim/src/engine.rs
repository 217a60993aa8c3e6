//! The engine model: one inference-engine replica with a fixed number of running slots, a
//! FIFO waiting queue, a serialised prefill unit and an LRU prefix cache of prompt blocks;
//! optionally LoRA adapter slots ([`AdapterSlots`]) in front of the running slots.
//!
//! Everything is in simulated time ([`Duration`] offsets from the start of a run); the
//! engine never reads a clock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use crate::adapters::AdapterSlots;

/// Prompt tokens per cache block.
pub const BLOCK_TOKENS: u32 = 16;
/// Canonical prompt bytes per token (the gateway's own estimate: bytes / 4).
pub const BYTES_PER_TOKEN: usize = 4;
/// Canonical prompt bytes per cache block.
pub const BLOCK_BYTES: usize = BLOCK_TOKENS as usize * BYTES_PER_TOKEN;

/// Estimated prompt tokens of canonical prompt bytes (rounded up).
pub fn prompt_tokens(prompt: &[u8]) -> u32 {
    prompt.len().div_ceil(BYTES_PER_TOKEN) as u32
}

/// Chained hashes of the prompt's full blocks: block `i`'s hash covers blocks `0..=i`, so
/// two prompts share block `i` only when they share every byte up to its end (as an
/// engine's prefix cache keys blocks by their whole prefix).
pub fn block_hashes(prompt: &[u8]) -> Vec<u64> {
    let mut prev = 0u64;
    prompt
        .chunks_exact(BLOCK_BYTES)
        .map(|chunk| {
            prev = xxhash_rust::xxh3::xxh3_64_with_seed(chunk, prev);
            prev
        })
        .collect()
}

/// Timing and capacity of one engine replica.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EngineParams {
    /// Requests decoding at once; the rest wait in a FIFO queue.
    pub max_running: usize,
    /// Prefix-cache capacity in blocks of [`BLOCK_TOKENS`] tokens.
    pub cache_blocks: usize,
    /// Constant part of the time to first token (scheduling, first decode step).
    #[serde(serialize_with = "ser_ms")]
    pub ttft_base: Duration,
    /// Prefill cost of one uncached prompt token.
    #[serde(serialize_with = "ser_ms")]
    pub prefill_per_token: Duration,
    /// Inter-token latency while decoding.
    #[serde(serialize_with = "ser_ms")]
    pub itl: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl EngineParams {
    /// The same engine `factor` times slower (constants, prefill and decode).
    pub fn slowed(self, factor: f64) -> EngineParams {
        EngineParams {
            ttft_base: self.ttft_base.mul_f64(factor),
            prefill_per_token: self.prefill_per_token.mul_f64(factor),
            itl: self.itl.mul_f64(factor),
            ..self
        }
    }
}

/// An LRU set of chained block hashes.
#[derive(Debug, Default)]
pub struct PrefixCache {
    capacity: usize,
    clock: u64,
    /// Block hash → last-use stamp.
    stamps: HashMap<u64, u64>,
    /// Last-use stamp → block hash, oldest first.
    order: BTreeMap<u64, u64>,
    evictions: u64,
    /// When set, what `touch` stored and evicted is logged (for KV events).
    log: Option<CacheLog>,
}

/// What the cache stored and evicted since the log was last drained, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CacheLog {
    /// Indices into the touched prompt's blocks that were not cached before.
    pub stored: Vec<usize>,
    /// Block hashes evicted.
    pub evicted: Vec<u64>,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        PrefixCache {
            capacity,
            ..Default::default()
        }
    }

    /// Leading blocks of `blocks` present in the cache.
    pub fn matched(&self, blocks: &[u64]) -> usize {
        blocks
            .iter()
            .take_while(|h| self.stamps.contains_key(h))
            .count()
    }

    /// Keeps a [`CacheLog`] of stored and evicted blocks from now on.
    pub fn enable_log(&mut self) {
        self.log = Some(CacheLog::default());
    }

    /// The log since the last call (empty when logging is off).
    pub fn take_log(&mut self) -> CacheLog {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Marks `blocks` as just used, inserting the missing ones and evicting the least
    /// recently used blocks beyond capacity. Blocks are touched from the last to the first,
    /// so within one prompt the tail is older than the head and is evicted first (as vLLM
    /// frees a sequence's blocks in reverse order), keeping shared prefixes alive.
    pub fn touch(&mut self, blocks: &[u64]) {
        let blocks = &blocks[..blocks.len().min(self.capacity)];
        for (i, &h) in blocks.iter().enumerate().rev() {
            self.clock += 1;
            match self.stamps.insert(h, self.clock) {
                Some(old) => {
                    self.order.remove(&old);
                }
                None => {
                    if let Some(log) = &mut self.log {
                        log.stored.push(i);
                    }
                }
            }
            self.order.insert(self.clock, h);
        }
        if let Some(log) = &mut self.log {
            log.stored.sort_unstable();
        }
        while self.stamps.len() > self.capacity {
            let (_, h) = self.order.pop_first().expect("order tracks stamps");
            self.stamps.remove(&h);
            self.evictions += 1;
            if let Some(log) = &mut self.log {
                log.evicted.push(h);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    pub fn contains(&self, block: u64) -> bool {
        self.stamps.contains_key(&block)
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

/// What admitting one request to a running slot decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Prompt tokens served from the prefix cache.
    pub hit_tokens: u32,
    /// Time from admission to the first token (prefill wait, constant, uncached prefill).
    pub to_first_token: Duration,
    /// Time from admission to the last token.
    pub to_finish: Duration,
}

/// One engine replica.
#[derive(Debug)]
pub struct Engine {
    pub params: EngineParams,
    pub cache: PrefixCache,
    running: usize,
    queue: VecDeque<usize>,
    /// When the prefill unit is next free (prefills run one at a time).
    prefill_free_at: Duration,
    /// Blocks held by running requests (for a kv_usage signal).
    running_blocks: u64,
    /// LoRA adapter slots, on engines that serve adapters.
    pub adapters: Option<AdapterSlots>,
}

impl Engine {
    pub fn new(params: EngineParams) -> Self {
        Engine {
            params,
            cache: PrefixCache::new(params.cache_blocks),
            running: 0,
            queue: VecDeque::new(),
            prefill_free_at: Duration::ZERO,
            running_blocks: 0,
            adapters: None,
        }
    }

    pub fn running(&self) -> usize {
        self.running
    }

    /// Requests waiting: for a running slot, or for an adapter slot (as vLLM counts both in
    /// `num_requests_waiting`).
    pub fn queue_depth(&self) -> usize {
        self.queue.len() + self.adapters.as_ref().map_or(0, |a| a.waiting_len())
    }

    /// Share of the cache held by running requests, in [0, 1].
    pub fn kv_usage(&self) -> f32 {
        if self.params.cache_blocks == 0 {
            return 0.0;
        }
        (self.running_blocks as f64 / self.params.cache_blocks as f64).min(1.0) as f32
    }

    /// Whether a request arriving now gets a slot at once.
    pub fn has_free_slot(&self) -> bool {
        self.running < self.params.max_running
    }

    /// Queues request `id` (FIFO) when every slot is busy.
    pub fn enqueue(&mut self, id: usize) {
        self.queue.push_back(id);
    }

    /// Frees one slot held by a request of `blocks` blocks; returns the next queued request
    /// to admit, if any.
    pub fn release(&mut self, blocks: usize) -> Option<usize> {
        self.running -= 1;
        self.running_blocks -= blocks as u64;
        self.queue.pop_front()
    }

    /// Admits a request to a running slot at `now`: counts its cached prefix, warms the
    /// cache with its blocks, and times its prefill (serialised behind earlier prefills)
    /// and decode.
    pub fn admit(
        &mut self,
        now: Duration,
        blocks: &[u64],
        prompt_tokens: u32,
        output_tokens: u32,
    ) -> Admission {
        debug_assert!(self.has_free_slot());
        self.running += 1;
        self.running_blocks += blocks.len() as u64;
        let hit_tokens = (self.cache.matched(blocks) as u32 * BLOCK_TOKENS).min(prompt_tokens);
        self.cache.touch(blocks);
        let uncached = prompt_tokens - hit_tokens;
        let prefill = self.params.prefill_per_token * uncached;
        let start = self.prefill_free_at.max(now);
        self.prefill_free_at = start + prefill;
        let to_first_token = (start - now) + self.params.ttft_base + prefill;
        Admission {
            hit_tokens,
            to_first_token,
            to_finish: to_first_token + self.params.itl * output_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(cache_blocks: usize) -> EngineParams {
        EngineParams {
            max_running: 2,
            cache_blocks,
            ttft_base: Duration::from_millis(10),
            prefill_per_token: Duration::from_micros(100),
            itl: Duration::from_millis(5),
        }
    }

    fn text(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| b'a' + ((i as u8).wrapping_add(seed)) % 26)
            .collect()
    }

    #[test]
    fn block_hashes_chain_the_prefix() {
        let a = text(64 * 4, 0);
        let mut b = a[..64 * 2].to_vec();
        b.extend_from_slice(&text(64 * 2, 7));
        let (ha, hb) = (block_hashes(&a), block_hashes(&b));
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        // A partial last block is not a block.
        assert_eq!(block_hashes(&a[..64 * 3 + 10]).len(), 3);
        assert_eq!(prompt_tokens(&a[..5]), 2);
    }

    #[test]
    fn hits_count_the_leading_cached_blocks() {
        let mut e = Engine::new(params(100));
        let a = text(64 * 10, 0);
        let ha = block_hashes(&a);
        let first = e.admit(Duration::ZERO, &ha, prompt_tokens(&a), 1);
        assert_eq!(first.hit_tokens, 0);
        // Same first 6 blocks, different tail.
        let mut b = a[..64 * 6].to_vec();
        b.extend_from_slice(&text(64 * 3 + 8, 3));
        let hb = block_hashes(&b);
        e.release(ha.len());
        let second = e.admit(Duration::from_secs(1), &hb, prompt_tokens(&b), 1);
        assert_eq!(second.hit_tokens, 6 * BLOCK_TOKENS);
    }

    #[test]
    fn lru_evicts_the_least_recently_used_tail_first() {
        let mut c = PrefixCache::new(4);
        c.touch(&[1, 2, 3]);
        c.touch(&[10, 11]);
        // Capacity 4: one of the first prompt's blocks went, its tail (3) first.
        assert_eq!(c.len(), 4);
        assert!(!c.contains(3));
        assert!(c.contains(1) && c.contains(2));
        assert_eq!(c.matched(&[1, 2, 3]), 2);
        // Using [1, 2] again makes [10, 11]'s tail the oldest.
        c.touch(&[1, 2]);
        c.touch(&[20]);
        assert!(!c.contains(11));
        assert!(c.contains(10) && c.contains(1) && c.contains(20));
        assert_eq!(c.evictions(), 2);
    }

    #[test]
    fn the_log_lists_stored_blocks_and_evictions() {
        let mut c = PrefixCache::new(3);
        c.enable_log();
        c.touch(&[1, 2]);
        assert_eq!(c.take_log().stored, vec![0, 1]);
        c.touch(&[1, 5, 6]);
        let log = c.take_log();
        assert_eq!(log.stored, vec![1, 2]);
        // Capacity 3: one block went, the earlier prompt's tail.
        assert_eq!(log.evicted, vec![2]);
        assert!(c.take_log().stored.is_empty());
    }

    #[test]
    fn ttft_is_wait_plus_constant_plus_uncached_prefill() {
        let mut e = Engine::new(params(100));
        let p = text(64 * 10, 0); // 160 tokens, 10 blocks
        let h = block_hashes(&p);
        let a = e.admit(Duration::ZERO, &h, 160, 20);
        // 10 ms + 160 × 0.1 ms.
        assert_eq!(a.to_first_token, Duration::from_millis(26));
        assert_eq!(a.to_finish, Duration::from_millis(26 + 100));
        // A second prefill 1 ms later waits for the first (ends at 16 ms); fully cached.
        let b = e.admit(Duration::from_millis(1), &h, 160, 20);
        assert_eq!(b.hit_tokens, 160);
        assert_eq!(b.to_first_token, Duration::from_millis(15 + 10));
        assert!(!e.has_free_slot());
        e.enqueue(7);
        assert_eq!(e.queue_depth(), 1);
        assert_eq!(e.release(10), Some(7));
        assert!(e.has_free_slot());
    }

    #[test]
    fn slowed_scales_every_constant() {
        let p = params(10).slowed(3.0);
        assert_eq!(p.ttft_base, Duration::from_millis(30));
        assert_eq!(p.prefill_per_token, Duration::from_micros(300));
        assert_eq!(p.itl, Duration::from_millis(15));
        assert_eq!(p.max_running, 2);
    }
}
