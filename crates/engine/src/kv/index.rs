//! `KvIndex`: which targets hold which prefix blocks, rebuilt from the engines' KV-cache
//! events, and the request-side keys to look them up with.
//!
//! # Two key spaces
//!
//! The gateway cannot reproduce the engines' block hashes (they cover chat-templated token
//! ids, with an engine-chosen algorithm and a per-process random seed), so, like llm-d, it
//! keeps its own **gateway keys**:
//!
//! - A key names a whole prefix: `key_i = xxh3_64(key_{i-1} ‖ tokens_i ‖ extra_i)` over full
//!   chunks of [`KvIndexConfig::block_size`] tokens (a partial tail is never keyed), so two
//!   sequences share `key_i` only if they share all the tokens up to the end of chunk `i`.
//! - The chain starts from a seed made of the LoRA adapter name and the request's
//!   `cache_salt` ([`KeySpace`]): the same tokens under another adapter or salt give other
//!   keys, as they give other engine hashes. An engine that only sends the deprecated
//!   numeric `lora_id` (vLLM 0.9, SGLang) is seeded with that id, which no request names,
//!   so its adapter blocks never match (a missed hit rather than a wrong one).
//! - `extra_i` is the event's digest of the block's other extra keys (multimodal inputs,
//!   prompt embeddings); the request side passes none, so such blocks, and everything
//!   chained after them, match no text-only request.
//!
//! On `BlockStored` the index computes the gateway keys from the event's `token_ids`
//! (chunked by the gateway block size; an engine block of `k` chunks maps to `k` keys, so
//! the engine block size must be a multiple of the gateway's), chained from the parent's
//! keys, and records the engine hash → gateway keys mapping, per target and KV-cache group.
//! `BlockRemoved` carries only engine hashes and is applied through that mapping. A stored
//! block whose parent is unknown (evicted here, or stored before the subscription began)
//! cannot be keyed and is counted as orphaned; a token-less `BlockStored` (an offload tier
//! announcing a block it copied) adds its tier to a block already known.
//!
//! A target holds a key while any of its engine blocks (in any group, on any tier) maps to
//! it; the per-target reference counts live on the writer side.
//!
//! # Scoring
//!
//! The score of a target for a request is the number of consecutive leading request keys
//! it holds: a hole stops the match, since the engine can only reuse a consecutive prefix.
//! [`KvIndexReader::longest_prefix`] scores up to 64 candidates (ids in one block of 64) in
//! a single pass over the request's keys with one map probe per key, stopping as soon as no
//! candidate is left; candidates spread over several blocks of 64 ids cost one pass each.
//!
//! # Read structure: one lock-free map shared by all workers
//!
//! The writer ([`KvIndex`], owned by the `rolter-kv-index` thread of `kv::index_thread`) publishes
//! into a `papaya` concurrent hash map from `(gateway key, 64-target word)` to a 64-bit
//! holder mask; the workers read it through [`KvIndexReader`] (an `Arc`, cheap to clone,
//! `Send + Sync`). Reads take no lock and never write shared memory other than the epoch
//! reservation of their own thread (one per `longest_prefix` call), so they do not contend
//! with each other or with the writer. The alternative, a replica per worker updated by
//! messages, would multiply the memory (millions of keys) and the update work by the number
//! of cores and put the updates on the request threads; `dashmap` takes a shard read lock
//! per probe. The price of papaya is a pointer chase per probe (entries are boxed) and
//! boxed entries; `benches/kv_events.rs` measures the read cost.
//!
//! # Memory bound
//!
//! Per target, at most [`KvIndexConfig::max_blocks_per_target`] engine blocks and as many
//! distinct gateway keys; beyond it the least recently stored blocks are evicted (oldest
//! `BlockStored` first; a store of a block already held refreshes it). The bound is per
//! target rather than global because each engine's cache is itself bounded (its GPU and
//! offload block counts), so a cap sized to the largest engine keeps the mirror exact in
//! normal operation and only bites when removals were lost; and a target that floods or
//! never sends removals evicts only its own entries, never another engine's. Total memory
//! is therefore at most the cap times the number of targets, at about 170 bytes per key
//! when first filled and about 310 under steady churn (shared map entry and its
//! tombstones, engine block, reference count, eviction queue; measured with the system
//! allocator). It stays flat however many distinct blocks go through.
//!
//! # Sequence numbers
//!
//! Per target the index expects `seq + 1` after `seq`. A batch past the expected number is
//! a gap: it is **not** applied ([`ApplyOutcome::Gap`]), and the caller repairs by applying
//! the missing batches from the publisher's replay socket and then this one, or by calling
//! [`KvIndex::drop_target`] (the next batch is then accepted as a fresh start). A batch
//! below the expected number (a restarted publisher counts from 0 again) is a reconnect:
//! the target's entries are dropped and the batch applied from scratch. A target that stops
//! publishing keeps its entries until [`KvIndex::drop_target`] or [`KvIndex::drop_idle`].
//!
//! # Rules
//!
//! [`KvIndex`] owns the per-target mirrors and is the only writer of the shared map; it must
//! not be shared between threads (it is not `Clone`; apply from one thread). Neither side
//! opens sockets, reads clocks (time is an argument), logs or blocks. `longest_prefix`
//! never allocates; `request_keys` only grows the caller's vector.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::block_keys::{chain, seed, BUF, ROOT};
pub use super::block_keys::{request_keys, KeySpace, MAX_BLOCK_SIZE};
use super::events::{BlockRemoved, BlockStored, EventBatch, KvEvent, Medium};

/// Target ids are `0..MAX_TARGETS`.
pub const MAX_TARGETS: u32 = 4096;
const _: () = assert!(MAX_TARGETS / 64 <= 64);

/// Settings of a [`KvIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvIndexConfig {
    /// Tokens per gateway key; every engine's block size must be a multiple of it.
    pub block_size: usize,
    /// Most engine blocks, and most distinct gateway keys, kept per target.
    pub max_blocks_per_target: usize,
}

impl Default for KvIndexConfig {
    /// The `[kv_events]` defaults: vLLM's 16-token blocks, 2^17 blocks per target (2M
    /// tokens, several times the GPU cache of a large engine, about 40 MB at most).
    fn default() -> Self {
        Self {
            block_size: 16,
            max_blocks_per_target: 1 << 17,
        }
    }
}

/// Why the index refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The gateway block size is outside `1..=MAX_BLOCK_SIZE`.
    #[error("block_size must be 1..={MAX_BLOCK_SIZE}, got {0}")]
    BlockSize(usize),
    /// The per-target bound is 0.
    #[error("max_blocks_per_target must be at least 1")]
    Bound,
    /// A target id at or past [`MAX_TARGETS`].
    #[error("target id {0} out of range (max {MAX_TARGETS})")]
    Target(u32),
}

/// What [`KvIndex::apply`] did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Applied in order (or as the first batch seen from the target).
    Applied,
    /// The sequence went backwards (publisher restart or reconnect): the target's entries
    /// were dropped, then the batch applied.
    Reset,
    /// Batches `expected..got` are missing; this batch was not applied.
    Gap {
        /// The next sequence number the index expects.
        expected: u64,
        /// The sequence number received.
        got: u64,
    },
}

/// Event counters of one target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetCounters {
    /// Batches applied.
    pub batches: u64,
    /// Gaps reported.
    pub gaps: u64,
    /// Batches found missing by those gaps.
    pub missed_batches: u64,
    /// Sequence resets (publisher restarts).
    pub resets: u64,
    /// Calls that dropped the target's entries ([`KvIndex::drop_target`], idle expiry).
    pub drops: u64,
    /// Blocks evicted by the memory bound.
    pub evicted: u64,
    /// Stored blocks skipped because their parent was unknown.
    pub orphaned: u64,
    /// Token-less stored blocks skipped because the block was unknown.
    pub unresolved: u64,
    /// `BlockStored` events skipped because their sizes were inconsistent or their block
    /// size is not a multiple of the gateway's.
    pub inconsistent: u64,
    /// Events with unknown tags in applied batches.
    pub unknown_events: u64,
}

/// The state of one target, as [`KvIndex::stats`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetStats {
    /// The target id.
    pub target: u32,
    /// Engine blocks held (per group).
    pub engine_blocks: usize,
    /// Distinct gateway keys held.
    pub keys: usize,
    /// The sequence number expected next (`None` before the first batch or after a drop).
    pub next_seq: Option<u64>,
    /// When the last batch arrived.
    pub last_event: Option<Instant>,
    /// Counters.
    pub counters: TargetCounters,
}

/// The state of the whole index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvIndexStats {
    /// One entry per target that ever sent a batch, by id.
    pub targets: Vec<TargetStats>,
    /// Entries in the shared map (gateway keys × 64-target words holding them).
    pub slots: usize,
}

/// A hasher for keys that already are well-mixed 64-bit hashes (one multiply per word).
#[derive(Debug, Default, Clone, Copy)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(23) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

type Mix = BuildHasherDefault<MixHasher>;
type FastMap<K, V> = HashMap<K, V, Mix>;

/// A key of the shared map: a gateway key and which 64 targets the value's bits stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Slot {
    key: u64,
    word: u32,
}

/// What the writer and the readers share.
#[derive(Debug)]
struct Shared {
    map: papaya::HashMap<Slot, u64, Mix>,
    block_size: usize,
}

/// The tier bit of a medium (absent means GPU).
fn medium_bit(medium: Option<Medium>) -> u8 {
    match medium {
        None | Some(Medium::Gpu) => 1,
        Some(Medium::Cpu) => 2,
        Some(Medium::Disk) => 4,
        Some(Medium::Other) => 8,
    }
}

/// The gateway keys an engine block maps to (one unless the engine block spans several
/// gateway chunks).
#[derive(Debug, Clone)]
enum BlockKeys {
    One(u64),
    Many(Box<[u64]>),
}

impl BlockKeys {
    fn as_slice(&self) -> &[u64] {
        match self {
            Self::One(k) => std::slice::from_ref(k),
            Self::Many(keys) => keys,
        }
    }

    /// The key of the block's last chunk: the parent of the next block.
    fn last(&self) -> u64 {
        self.as_slice().last().copied().unwrap_or(ROOT)
    }
}

#[derive(Debug)]
struct EngineBlock {
    keys: BlockKeys,
    /// Tiers holding the block ([`medium_bit`]).
    media: u8,
    /// Store order, to recognise the live entry of the eviction queue.
    stamp: u64,
}

/// An engine block: its hash and KV-cache group.
type EngineKey = (u64, u32);

/// The writer-side mirror of one target.
#[derive(Debug, Default)]
struct TargetState {
    next_seq: Option<u64>,
    last_event: Option<Instant>,
    blocks: FastMap<EngineKey, EngineBlock>,
    /// Gateway key → number of engine blocks mapping to it.
    refs: FastMap<u64, u32>,
    /// Store order; entries whose stamp no longer matches their block are stale.
    fifo: VecDeque<(EngineKey, u64)>,
    counters: TargetCounters,
}

/// Applies changes to one target's mirror and its bits in the shared map.
struct Writer<'a, 'm> {
    st: &'a mut TargetState,
    map: &'a papaya::HashMapRef<'m, Slot, u64, Mix, papaya::LocalGuard<'m>>,
    word: u32,
    bit: u64,
    cfg: KvIndexConfig,
    stamp: &'a mut u64,
}

impl Writer<'_, '_> {
    fn set_bit(&self, key: u64) {
        let slot = Slot {
            key,
            word: self.word,
        };
        let held = self.map.get(&slot).copied().unwrap_or(0);
        if held & self.bit == 0 {
            self.map.insert(slot, held | self.bit);
        }
    }

    fn clear_bit(&self, key: u64) {
        let slot = Slot {
            key,
            word: self.word,
        };
        let Some(&held) = self.map.get(&slot) else {
            return;
        };
        if held & self.bit != 0 {
            match held & !self.bit {
                0 => self.map.remove(&slot),
                rest => self.map.insert(slot, rest),
            };
        }
    }

    fn hold(&mut self, key: u64) {
        let refs = self.st.refs.entry(key).or_insert(0);
        *refs += 1;
        if *refs == 1 {
            self.set_bit(key);
        }
    }

    fn release(&mut self, key: u64) {
        match self.st.refs.get_mut(&key) {
            Some(refs) if *refs > 1 => *refs -= 1,
            Some(_) => {
                self.st.refs.remove(&key);
                self.clear_bit(key);
            }
            None => {}
        }
    }

    fn next_stamp(&mut self) -> u64 {
        *self.stamp += 1;
        *self.stamp
    }

    /// Marks a known block as stored again on `media`, refreshing its place in the queue.
    fn refresh(&mut self, engine: EngineKey, media: u8) -> Option<u64> {
        let stamp = self.next_stamp();
        let block = self.st.blocks.get_mut(&engine)?;
        block.media |= media;
        block.stamp = stamp;
        let last = block.keys.last();
        self.st.fifo.push_back((engine, stamp));
        Some(last)
    }

    fn remove_block(&mut self, engine: EngineKey) {
        if let Some(block) = self.st.blocks.remove(&engine) {
            for &key in block.keys.as_slice() {
                self.release(key);
            }
        }
    }

    fn clear(&mut self) {
        for &key in self.st.refs.keys() {
            self.clear_bit(key);
        }
        self.st.refs.clear();
        self.st.blocks.clear();
        self.st.fifo.clear();
    }

    /// Evicts the least recently stored blocks while over the bound; compacts the queue
    /// when stale entries dominate.
    fn enforce_bound(&mut self) {
        let max = self.cfg.max_blocks_per_target;
        while self.st.blocks.len() > max || self.st.refs.len() > max {
            let Some((engine, stamp)) = self.st.fifo.pop_front() else {
                break;
            };
            if self
                .st
                .blocks
                .get(&engine)
                .is_some_and(|b| b.stamp == stamp)
            {
                self.remove_block(engine);
                self.st.counters.evicted += 1;
            }
        }
        if self.st.fifo.len() > 2 * self.st.blocks.len() + 64 {
            let blocks = &self.st.blocks;
            self.st
                .fifo
                .retain(|(engine, stamp)| blocks.get(engine).is_some_and(|b| b.stamp == *stamp));
        }
    }

    fn event(&mut self, event: KvEvent<'_>) {
        match event {
            KvEvent::BlockStored(ev) => self.stored(&ev),
            KvEvent::BlockRemoved(ev) => self.removed(&ev),
            KvEvent::AllBlocksCleared { medium: None } => self.clear(),
            KvEvent::AllBlocksCleared {
                medium: Some(medium),
            } => {
                let bit = medium_bit(Some(medium));
                let mut emptied = Vec::new();
                for (engine, block) in self.st.blocks.iter_mut() {
                    block.media &= !bit;
                    if block.media == 0 {
                        emptied.push(*engine);
                    }
                }
                for engine in emptied {
                    self.remove_block(engine);
                }
            }
        }
    }

    fn stored(&mut self, ev: &BlockStored<'_>) {
        let group = ev.group_idx.unwrap_or(0);
        let media = medium_bit(ev.medium);
        if ev.token_ids.is_empty() {
            for &hash in ev.block_hashes {
                if self.refresh((hash, group), media).is_none() {
                    self.st.counters.unresolved += 1;
                }
            }
            self.enforce_bound();
            return;
        }
        let gateway = self.cfg.block_size;
        let engine_size = ev.block_size as usize;
        if engine_size == 0
            || !engine_size.is_multiple_of(gateway)
            || Some(ev.token_ids.len()) != ev.block_hashes.len().checked_mul(engine_size)
        {
            self.st.counters.inconsistent += 1;
            return;
        }
        let mut parent = match ev.parent_block_hash {
            None => seed(ev.lora_name, ev.lora_id, ev.cache_salt),
            Some(hash) => match self.st.blocks.get(&(hash, group)) {
                Some(block) => block.keys.last(),
                None => {
                    self.st.counters.orphaned += ev.block_hashes.len() as u64;
                    return;
                }
            },
        };
        let mut buf = [0u8; BUF];
        let per_block = engine_size / gateway;
        for (i, (&hash, tokens)) in ev
            .block_hashes
            .iter()
            .zip(ev.token_ids.chunks_exact(engine_size))
            .enumerate()
        {
            let engine = (hash, group);
            if let Some(last) = self.refresh(engine, media) {
                parent = last;
                continue;
            }
            let extra = ev
                .extra_digests
                .and_then(|d| d.get(i))
                .copied()
                .unwrap_or(0);
            let keys = if per_block == 1 {
                parent = chain(&mut buf, parent, tokens, extra);
                BlockKeys::One(parent)
            } else {
                BlockKeys::Many(
                    tokens
                        .chunks_exact(gateway)
                        .map(|chunk| {
                            parent = chain(&mut buf, parent, chunk, extra);
                            parent
                        })
                        .collect(),
                )
            };
            for &key in keys.as_slice() {
                self.hold(key);
            }
            let stamp = self.next_stamp();
            self.st
                .blocks
                .insert(engine, EngineBlock { keys, media, stamp });
            self.st.fifo.push_back((engine, stamp));
            self.enforce_bound();
        }
        // Refreshes of known blocks grow the queue too: compact it.
        self.enforce_bound();
    }

    fn removed(&mut self, ev: &BlockRemoved<'_>) {
        let group = ev.group_idx.unwrap_or(0);
        let media = medium_bit(ev.medium);
        for &hash in ev.block_hashes {
            let engine = (hash, group);
            let Some(block) = self.st.blocks.get_mut(&engine) else {
                continue;
            };
            block.media &= !media;
            if block.media == 0 {
                self.remove_block(engine);
            }
        }
    }
}

/// The writer: per-target mirrors of the engines' caches, applied from decoded event
/// batches, and the shared map the readers score against. Owned by one thread.
#[derive(Debug)]
pub struct KvIndex {
    cfg: KvIndexConfig,
    shared: Arc<Shared>,
    targets: Vec<Option<Box<TargetState>>>,
    stamp: u64,
}

impl KvIndex {
    /// An empty index.
    pub fn new(cfg: KvIndexConfig) -> Result<Self, IndexError> {
        if !(1..=MAX_BLOCK_SIZE).contains(&cfg.block_size) {
            return Err(IndexError::BlockSize(cfg.block_size));
        }
        if cfg.max_blocks_per_target == 0 {
            return Err(IndexError::Bound);
        }
        let map = papaya::HashMap::builder().hasher(Mix::default()).build();
        Ok(Self {
            cfg,
            shared: Arc::new(Shared {
                map,
                block_size: cfg.block_size,
            }),
            targets: Vec::new(),
            stamp: 0,
        })
    }

    /// The settings.
    pub fn config(&self) -> KvIndexConfig {
        self.cfg
    }

    /// A read handle for the workers.
    pub fn reader(&self) -> KvIndexReader {
        KvIndexReader {
            shared: Arc::clone(&self.shared),
        }
    }

    fn state(&mut self, target: u32) -> Result<&mut TargetState, IndexError> {
        if target >= MAX_TARGETS {
            return Err(IndexError::Target(target));
        }
        let i = target as usize;
        if self.targets.len() <= i {
            self.targets.resize_with(i + 1, || None);
        }
        Ok(self.targets[i].get_or_insert_with(Box::default))
    }

    /// Runs `f` with a writer for `target`.
    fn with_writer<T>(
        &mut self,
        target: u32,
        f: impl FnOnce(&mut Writer<'_, '_>) -> T,
    ) -> Result<T, IndexError> {
        let cfg = self.cfg;
        let shared = Arc::clone(&self.shared);
        let map = shared.map.pin();
        let mut stamp = self.stamp;
        let st = self.state(target)?;
        let mut writer = Writer {
            st,
            map: &map,
            word: target / 64,
            bit: 1 << (target % 64),
            cfg,
            stamp: &mut stamp,
        };
        let out = f(&mut writer);
        self.stamp = stamp;
        Ok(out)
    }

    /// Applies the batch numbered `seq` from `target`'s publisher, received at `now`. See
    /// the module documentation for the sequence rules.
    pub fn apply(
        &mut self,
        target: u32,
        seq: u64,
        batch: &EventBatch,
        now: Instant,
    ) -> Result<ApplyOutcome, IndexError> {
        self.with_writer(target, |w| {
            w.st.last_event = Some(now);
            let outcome = match w.st.next_seq {
                Some(expected) if seq > expected => {
                    w.st.counters.gaps += 1;
                    w.st.counters.missed_batches += seq - expected;
                    return ApplyOutcome::Gap { expected, got: seq };
                }
                Some(expected) if seq < expected => {
                    w.clear();
                    w.st.counters.resets += 1;
                    ApplyOutcome::Reset
                }
                _ => ApplyOutcome::Applied,
            };
            w.st.next_seq = Some(seq.wrapping_add(1));
            w.st.counters.batches += 1;
            w.st.counters.unknown_events += u64::from(batch.unknown_events);
            for event in batch.events() {
                w.event(event);
            }
            outcome
        })
    }

    /// Forgets everything about `target` (its entries and its sequence position); the next
    /// batch from it is accepted as a fresh start.
    pub fn drop_target(&mut self, target: u32) {
        if target >= MAX_TARGETS
            || self
                .targets
                .get(target as usize)
                .is_none_or(Option::is_none)
        {
            return;
        }
        let _ = self.with_writer(target, |w| {
            w.clear();
            w.st.next_seq = None;
            w.st.counters.drops += 1;
        });
    }

    /// Drops every target whose last batch is older than `max_idle` at `now` and that still
    /// holds entries or a sequence position. Returns how many were dropped.
    pub fn drop_idle(&mut self, now: Instant, max_idle: Duration) -> usize {
        let idle: Vec<u32> = self
            .targets
            .iter()
            .enumerate()
            .filter_map(|(i, st)| {
                let st = st.as_deref()?;
                let last = st.last_event?;
                let live = st.next_seq.is_some() || !st.blocks.is_empty();
                (live && now.saturating_duration_since(last) > max_idle).then_some(i as u32)
            })
            .collect();
        for &target in &idle {
            self.drop_target(target);
        }
        idle.len()
    }

    /// The state of one target, if it ever sent a batch.
    pub fn target_stats(&self, target: u32) -> Option<TargetStats> {
        let st = self.targets.get(target as usize)?.as_deref()?;
        Some(TargetStats {
            target,
            engine_blocks: st.blocks.len(),
            keys: st.refs.len(),
            next_seq: st.next_seq,
            last_event: st.last_event,
            counters: st.counters,
        })
    }

    /// The state of every target and the size of the shared map.
    pub fn stats(&self) -> KvIndexStats {
        KvIndexStats {
            targets: (0..self.targets.len() as u32)
                .filter_map(|t| self.target_stats(t))
                .collect(),
            slots: self.shared.map.len(),
        }
    }
}

/// The workers' read handle on a [`KvIndex`]: cheap to clone, `Send + Sync`, lock-free.
#[derive(Debug, Clone)]
pub struct KvIndexReader {
    shared: Arc<Shared>,
}

impl KvIndexReader {
    /// Tokens per gateway key.
    pub fn block_size(&self) -> usize {
        self.shared.block_size
    }

    /// The request's gateway keys (see [`request_keys`]), with this index's block size.
    pub fn request_keys(&self, space: KeySpace<'_>, tokens: &[u32], out: &mut Vec<u64>) {
        request_keys(self.shared.block_size, space, tokens, out);
    }

    /// Entries in the shared map.
    pub fn slots(&self) -> usize {
        self.shared.map.len()
    }

    /// For each candidate `targets[i]`, writes to `scores[i]` the number of consecutive
    /// leading `keys` it holds (0 for ids out of range). Pairs past the shorter of the two
    /// slices are left alone.
    pub fn longest_prefix(&self, keys: &[u64], targets: &[u32], scores: &mut [u32]) {
        let n = targets.len().min(scores.len());
        let (targets, scores) = (&targets[..n], &mut scores[..n]);
        scores.fill(0);
        if keys.is_empty() || n == 0 {
            return;
        }
        let guard = self.shared.map.guard();
        let full = keys.len().min(u32::MAX as usize) as u32;
        // One bit per 64-target word (MAX_TARGETS / 64 == 64 words).
        let mut done = 0u64;
        for (j, &first) in targets.iter().enumerate() {
            if first >= MAX_TARGETS {
                continue;
            }
            let word = first / 64;
            if done & (1 << word) != 0 {
                continue;
            }
            done |= 1 << word;
            let mut alive = targets[j..]
                .iter()
                .filter(|&&t| t < MAX_TARGETS && t / 64 == word)
                .fold(0u64, |mask, &t| mask | 1 << (t % 64));
            let mut depth = [full; 64];
            for (i, &key) in keys.iter().enumerate() {
                let held = self
                    .shared
                    .map
                    .get(&Slot { key, word }, &guard)
                    .copied()
                    .unwrap_or(0);
                let mut lost = alive & !held;
                if lost != 0 {
                    alive &= held;
                    while lost != 0 {
                        depth[lost.trailing_zeros() as usize] = i as u32;
                        lost &= lost - 1;
                    }
                    if alive == 0 {
                        break;
                    }
                }
            }
            for (&t, score) in targets[j..].iter().zip(scores[j..].iter_mut()) {
                if t < MAX_TARGETS && t / 64 == word {
                    *score = depth[(t % 64) as usize];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
