//! The prefix-cache model ([`PrefixCacheConfig`]): canonical prompt bytes, chained block
//! keys, an LRU of cached blocks shared by all worker threads, and the prefill time of
//! the uncached part of a prompt.
//!
//! Tokens: the mock's prompt tokens are the `chars_per_token`-byte pieces of the
//! canonical prompt (the last one may be shorter). Each piece has a deterministic token
//! id, [`token_id`]: the 32-bit FNV-1a hash of its bytes modulo a vocabulary of
//! [`VOCAB_SIZE`] (128 000) ids. `/tokenize` returns these ids, and the KV events'
//! `BlockStored` carries them for the blocks it reports.
//!
//! With KV events on, each lookup that inserts or evicts blocks publishes one batch while
//! it holds the LRU lock, so the events leave in the order the cache changed.

use std::collections::{BTreeMap, HashMap};
#[cfg(feature = "zmq")]
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::config::PrefixCacheConfig;
#[cfg(feature = "zmq")]
use crate::kv_events::{KvEvent, KvPublisher};

/// The prompt of a request as the cache sees it: its block keys and its token count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PrefixQuery {
    /// One chained key per full block, in prompt order.
    keys: Vec<u64>,
    /// Prompt tokens: the canonical prompt bytes / `chars_per_token`, rounded up, at least 1.
    pub prompt_tokens: u64,
    /// Token ids of the full blocks (`keys.len() * block_tokens` of them); filled only
    /// when KV events are published.
    tokens: Vec<u32>,
}

/// The outcome of one lookup, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PrefixHit {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl PrefixHit {
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }
}

/// Resident blocks, keyed both ways so that refresh and eviction are O(log n).
#[derive(Default)]
struct Lru {
    /// Block key → recency stamp.
    stamps: HashMap<u64, u64>,
    /// Recency stamp → block key; the first entry is the least recently used block.
    order: BTreeMap<u64, u64>,
    next_stamp: u64,
    evicted: u64,
}

pub(crate) struct PrefixCache {
    block_tokens: u64,
    block_bytes: usize,
    chars_per_token: u64,
    capacity: usize,
    prefill_per_token: Duration,
    lru: Mutex<Lru>,
    #[cfg(feature = "zmq")]
    events: Option<Arc<KvPublisher>>,
}

/// The request-body fields whose value is the prompt.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PromptFields {
    messages: Option<Value>,
    prompt: Option<Value>,
}

/// The prompt of a chat or completions body in canonical form: its `messages` value (or
/// else its `prompt`) re-serialised compactly, so that JSON whitespace does not change
/// the bytes (object keys also come out sorted). Empty when the body has neither field;
/// `None` when the body is not a JSON object.
pub(crate) fn canonical_prompt(body: &[u8]) -> Option<Vec<u8>> {
    let f: PromptFields = serde_json::from_slice(body).ok()?;
    match f.messages.filter(|v| !v.is_null()).or(f.prompt) {
        Some(v) => serde_json::to_vec(&v).ok(),
        None => Some(Vec::new()),
    }
}

pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `h`: the mock's key hash (prefix blocks, LMCache
/// chunks).
pub(crate) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Size of the mock's token-id space.
pub(crate) const VOCAB_SIZE: u32 = 128_000;

/// The token id of one prompt piece: 32-bit FNV-1a of its bytes, modulo [`VOCAB_SIZE`].
pub(crate) fn token_id(piece: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in piece {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h % VOCAB_SIZE
}

/// The token ids of canonical prompt bytes: one per `chars_per_token`-byte piece.
pub(crate) fn token_ids(canonical: &[u8], chars_per_token: usize) -> Vec<u32> {
    canonical
        .chunks(chars_per_token.max(1))
        .map(token_id)
        .collect()
}

/// The key of the (absent) block before the first one.
fn root_key() -> u64 {
    fnv1a(FNV_OFFSET, b"rolter-mock prefix cache")
}

/// The key of a block: a hash over the previous block's key and this block's bytes.
fn block_key(parent: u64, block: &[u8]) -> u64 {
    fnv1a(fnv1a(FNV_OFFSET, &parent.to_le_bytes()), block)
}

impl PrefixCache {
    /// A cache; with `events`, every change of its contents is published.
    pub fn new(
        cfg: &PrefixCacheConfig,
        #[cfg(feature = "zmq")] events: Option<Arc<KvPublisher>>,
    ) -> PrefixCache {
        let block_tokens = cfg.block_tokens.max(1) as u64;
        let chars_per_token = cfg.chars_per_token.max(1) as u64;
        PrefixCache {
            block_tokens,
            block_bytes: (block_tokens * chars_per_token) as usize,
            chars_per_token,
            capacity: cfg.capacity_blocks,
            prefill_per_token: Duration::from_micros(cfg.prefill_us_per_token),
            lru: Mutex::new(Lru::default()),
            #[cfg(feature = "zmq")]
            events,
        }
    }

    /// Bytes per token.
    pub fn chars_per_token(&self) -> usize {
        self.chars_per_token as usize
    }

    /// Cuts canonical prompt bytes into full blocks and keys them (no lock taken).
    pub fn query(&self, canonical: &[u8]) -> PrefixQuery {
        let mut parent = root_key();
        let keys = canonical
            .chunks_exact(self.block_bytes)
            .map(|block| {
                parent = block_key(parent, block);
                parent
            })
            .collect::<Vec<u64>>();
        let tokens = if self.publishes() {
            token_ids(
                &canonical[..keys.len() * self.block_bytes],
                self.chars_per_token as usize,
            )
        } else {
            Vec::new()
        };
        PrefixQuery {
            keys,
            tokens,
            prompt_tokens: (canonical.len() as u64)
                .div_ceil(self.chars_per_token)
                .max(1),
        }
    }

    /// Counts the leading blocks already cached (stopping at the first miss), then
    /// inserts or refreshes every block of the prompt, evicting the least recently used
    /// blocks beyond the capacity.
    ///
    /// Blocks are refreshed last-to-first, so a prompt's first block is its most recent
    /// one: when the cache is full, the tails of prompts go before their heads (as vLLM
    /// frees a request's blocks in reverse order), and a cached block's parent is never
    /// older than the block itself.
    ///
    /// With KV events on, the new blocks are published as `BlockStored` (one event per
    /// run of consecutive new blocks; a prompt's new blocks always form one run after its
    /// cached head), then the evicted ones as `BlockRemoved`, in one batch.
    pub fn lookup(&self, q: &PrefixQuery) -> PrefixHit {
        let mut lru = self.lru.lock().unwrap();
        let hit_blocks = q
            .keys
            .iter()
            .take_while(|k| lru.stamps.contains_key(k))
            .count() as u64;
        let publish = self.publishes();
        // Indices of the blocks inserted now, last to first.
        let mut stored: Vec<usize> = Vec::new();
        for (i, &key) in q.keys.iter().enumerate().rev() {
            let stamp = lru.next_stamp;
            lru.next_stamp += 1;
            match lru.stamps.insert(key, stamp) {
                Some(old) => {
                    lru.order.remove(&old);
                }
                None if publish => stored.push(i),
                None => {}
            }
            lru.order.insert(stamp, key);
        }
        let mut removed: Vec<u64> = Vec::new();
        while lru.stamps.len() > self.capacity {
            let Some((_, key)) = lru.order.pop_first() else {
                break;
            };
            lru.stamps.remove(&key);
            lru.evicted += 1;
            if publish {
                removed.push(key);
            }
        }
        #[cfg(feature = "zmq")]
        if let Some(events) = &self.events {
            stored.reverse();
            let mut batch = self.stored_events(q, &stored);
            if !removed.is_empty() {
                batch.push(KvEvent::BlockRemoved { hashes: removed });
            }
            events.publish(&batch);
        }
        drop(lru);
        PrefixHit {
            prompt_tokens: q.prompt_tokens,
            cached_tokens: (hit_blocks * self.block_tokens).min(q.prompt_tokens),
        }
    }

    #[cfg(feature = "zmq")]
    /// `BlockStored` events for the blocks at `idx` (ascending): one per consecutive run.
    fn stored_events(&self, q: &PrefixQuery, idx: &[usize]) -> Vec<KvEvent> {
        let bt = self.block_tokens as usize;
        let mut out = Vec::new();
        let mut rest = idx;
        while let Some(&first) = rest.first() {
            let run = rest
                .iter()
                .enumerate()
                .take_while(|(j, &i)| i == first + j)
                .count();
            let last = first + run;
            out.push(KvEvent::BlockStored {
                hashes: q.keys[first..last].to_vec(),
                parent: first.checked_sub(1).map(|p| q.keys[p]),
                token_ids: q.tokens.get(first * bt..last * bt).unwrap_or(&[]).to_vec(),
                block_size: self.block_tokens as u32,
            });
            rest = &rest[run..];
        }
        out
    }

    /// Whether changes of the contents are published as KV events.
    fn publishes(&self) -> bool {
        #[cfg(feature = "zmq")]
        return self.events.is_some();
        #[cfg(not(feature = "zmq"))]
        false
    }

    /// Empties the cache (vLLM's `reset_prefix_cache`) and publishes `AllBlocksCleared`.
    pub fn clear(&self) {
        let mut lru = self.lru.lock().unwrap();
        lru.stamps.clear();
        lru.order.clear();
        #[cfg(feature = "zmq")]
        if let Some(events) = &self.events {
            events.publish(&[KvEvent::AllBlocksCleared]);
        }
    }

    #[cfg(feature = "zmq")]
    /// Empties the cache without publishing anything, as an engine restart does (the new
    /// process starts with an empty cache and a new event sequence).
    pub fn forget(&self) {
        let mut lru = self.lru.lock().unwrap();
        lru.stamps.clear();
        lru.order.clear();
    }

    /// Prefill time of `uncached` prompt tokens.
    pub fn prefill_time(&self, uncached: u64) -> Duration {
        self.prefill_per_token
            .saturating_mul(u32::try_from(uncached).unwrap_or(u32::MAX))
    }

    /// Time from admission to the first token: the constant part `ttft` plus the
    /// prefill of the prompt tokens the cache did not hold.
    pub fn first_token_delay(&self, ttft: Duration, hit: &PrefixHit) -> Duration {
        ttft.saturating_add(self.prefill_time(hit.uncached_tokens()))
    }

    /// Blocks held now.
    pub fn resident_blocks(&self) -> u64 {
        self.lru.lock().unwrap().stamps.len() as u64
    }

    /// Blocks evicted since start.
    pub fn evicted_blocks(&self) -> u64 {
        self.lru.lock().unwrap().evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(block_tokens: u32, chars_per_token: u32, capacity_blocks: usize) -> PrefixCache {
        PrefixCache::new(
            &PrefixCacheConfig {
                block_tokens,
                capacity_blocks,
                prefill_us_per_token: 100,
                chars_per_token,
            },
            #[cfg(feature = "zmq")]
            None,
        )
    }

    fn chat(messages: &str) -> Vec<u8> {
        canonical_prompt(format!(r#"{{"model":"m","messages":{messages}}}"#).as_bytes()).unwrap()
    }

    #[test]
    fn repeated_prompt_hits_all_full_blocks() {
        let c = cache(16, 4, 1000);
        let p = chat(&format!(
            r#"[{{"role":"user","content":"{}"}}]"#,
            "lorem ipsum ".repeat(40)
        ));
        let q = c.query(&p);
        let full_blocks = (p.len() / 64) as u64;
        assert!(full_blocks >= 7, "{full_blocks}");
        assert_eq!(q.prompt_tokens, (p.len() as u64).div_ceil(4));
        let first = c.lookup(&q);
        assert_eq!(first.cached_tokens, 0);
        assert_eq!(first.prompt_tokens, q.prompt_tokens);
        let second = c.lookup(&c.query(&p));
        assert_eq!(second.cached_tokens, full_blocks * 16);
        // Only the partial tail block is left uncached.
        let tail = p.len() as u64 - full_blocks * 64;
        assert!(tail > 0);
        assert_eq!(second.uncached_tokens(), tail.div_ceil(4));
        assert_eq!(c.resident_blocks(), full_blocks);
    }

    #[test]
    fn shared_system_prompt_hits_shared_blocks_only() {
        let c = cache(16, 4, 1000);
        let system = "You are a careful assistant. ".repeat(20);
        let a = chat(&format!(
            r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"What is the capital of France?"}}]"#
        ));
        let b = chat(&format!(
            r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"How far away is the Moon from the Earth?"}}]"#
        ));
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let shared_blocks = (common / 64) as u64;
        let b_blocks = (b.len() / 64) as u64;
        assert!(shared_blocks >= 5 && shared_blocks < b_blocks);
        c.lookup(&c.query(&a));
        let hit = c.lookup(&c.query(&b));
        assert_eq!(hit.cached_tokens, shared_blocks * 16);
        // b's own blocks are cached now too.
        assert_eq!(c.lookup(&c.query(&b)).cached_tokens, b_blocks * 16);
        // A different first message shares nothing, even with identical later blocks.
        let other = chat(&format!(
            r#"[{{"role":"system","content":"Be brief. {system}"}},{{"role":"user","content":"What is the capital of France?"}}]"#
        ));
        assert_eq!(c.lookup(&c.query(&other)).cached_tokens, 0);
    }

    #[test]
    fn lru_evicts_least_recently_used_blocks() {
        // 2 tokens × 1 byte per block; 4 blocks of capacity; prompts of 2 blocks.
        let c = cache(2, 1, 4);
        let (a, b, d) = (c.query(b"aaaa"), c.query(b"bbbb"), c.query(b"dddd"));
        c.lookup(&a);
        c.lookup(&b);
        assert_eq!(c.resident_blocks(), 4);
        assert_eq!(c.lookup(&a).cached_tokens, 4, "refreshes a");
        c.lookup(&d); // evicts b, the least recently used
        assert_eq!(c.resident_blocks(), 4);
        assert_eq!(c.evicted_blocks(), 2);
        assert_eq!(c.lookup(&a).cached_tokens, 4);
        assert_eq!(c.lookup(&d).cached_tokens, 4);
        assert_eq!(c.lookup(&b).cached_tokens, 0, "b was evicted");

        // A prompt longer than the cache keeps its head: tails are evicted first.
        let c = cache(2, 1, 3);
        let long = c.query(b"0123456789");
        assert_eq!(c.lookup(&long).cached_tokens, 0);
        assert_eq!(c.resident_blocks(), 3);
        assert_eq!(c.lookup(&long).cached_tokens, 6);

        // Capacity 0 caches nothing.
        let c = cache(2, 1, 0);
        c.lookup(&c.query(b"aaaa"));
        assert_eq!(c.lookup(&c.query(b"aaaa")).cached_tokens, 0);
        assert_eq!(c.resident_blocks(), 0);
    }

    #[test]
    fn whitespace_different_json_hits() {
        let c = cache(4, 4, 100);
        let compact = canonical_prompt(
            br#"{"model":"m","messages":[{"role":"user","content":"tell me a story about a dragon and a knight"}]}"#,
        )
        .unwrap();
        let spaced = canonical_prompt(
            b"{ \"messages\" : [\n  { \"content\" : \"tell me a story about a dragon and a knight\",\n    \"role\": \"user\" }\n ],\n \"model\": \"m\" }",
        )
        .unwrap();
        assert_eq!(compact, spaced);
        let blocks = (compact.len() / 16) as u64;
        assert!(blocks >= 3);
        c.lookup(&c.query(&compact));
        assert_eq!(c.lookup(&c.query(&spaced)).cached_tokens, blocks * 4);
        // Completions use `prompt`.
        let p1 = canonical_prompt(br#"{"prompt": "once upon a time there was"}"#).unwrap();
        let p2 = canonical_prompt(br#"{"prompt":"once upon a time there was"}"#).unwrap();
        assert_eq!(p1, p2);
        assert_eq!(p1, br#""once upon a time there was""#.to_vec());
        assert_eq!(canonical_prompt(b"{}").unwrap(), Vec::<u8>::new());
        assert_eq!(canonical_prompt(b"not json"), None);
    }

    #[test]
    fn ttft_grows_with_uncached_tokens() {
        let c = cache(16, 4, 1000);
        let ttft = Duration::from_millis(5);
        let short = c.query(&[b'x'; 64 * 2]);
        let long = c.query(&[b'y'; 64 * 10]);
        let cold_short = c.lookup(&short);
        let cold_long = c.lookup(&long);
        assert_eq!(cold_short.uncached_tokens(), 32);
        assert_eq!(cold_long.uncached_tokens(), 160);
        assert_eq!(
            c.first_token_delay(ttft, &cold_short),
            ttft + Duration::from_micros(32 * 100)
        );
        assert_eq!(
            c.first_token_delay(ttft, &cold_long),
            ttft + Duration::from_micros(160 * 100)
        );
        assert!(c.first_token_delay(ttft, &cold_long) > c.first_token_delay(ttft, &cold_short));
        // Warm: only the constant part is left.
        let warm_long = c.lookup(&long);
        assert_eq!(warm_long.uncached_tokens(), 0);
        assert_eq!(c.first_token_delay(ttft, &warm_long), ttft);
        // A partly cached prompt pays for its uncached tokens only.
        let mut grown = vec![b'y'; 64 * 10];
        grown.extend_from_slice(&[b'z'; 64 * 3 + 8]);
        let part = c.lookup(&c.query(&grown));
        assert_eq!(part.cached_tokens, 160);
        assert_eq!(part.uncached_tokens(), 48 + 2);
        assert_eq!(
            c.first_token_delay(Duration::ZERO, &part),
            Duration::from_micros(50 * 100)
        );
    }
}
