//! `precise_cache_aware`: send a request to the engine that holds the longest run of its
//! leading KV blocks, as the engines themselves report them in their KV-cache events.
//!
//! A pick, in order:
//!
//! 0. **Balance guard** (as `cache_aware`'s): when the candidates' loads differ by more than
//!    `balance_abs_threshold` (32) and the highest exceeds `balance_rel_threshold` (1.5)
//!    times the lowest, the least-loaded candidate wins (fallback `imbalance`). Without it,
//!    the first engine to hold a prefix every prompt shares (a system prompt) would draw
//!    every request.
//! 1. **Token ids.** The request's prompt as token ids (`Needs::TOKEN_IDS`: a local tokenizer
//!    with the model's chat template, or the engine's tokenize endpoint, resolved before the
//!    pick). Without them, the least-loaded candidate wins (fallback `no_token_ids`).
//! 2. **Live streams.** Only candidates whose KV-event stream is live can be scored; when
//!    none is (no events yet, publisher stopped, index dropped after a gap), the
//!    least-loaded candidate wins (fallback `kv_events_stale`).
//! 3. **Score.** The ids are cut into full blocks and keyed the way the index keys the
//!    events' `token_ids` (chained, so a match is a consecutive prefix); each live candidate
//!    scores the number of leading blocks it holds. When the best score is above
//!    `min_blocks` (default 0), the best wins, ties by load then at random; otherwise load
//!    decides (the normal path for a prompt no engine holds).
//!
//! Owns scratch buffers (keys, candidate ids, scores) that grow to the largest request seen,
//! and a generator. It reads the shared index without locks, must not block, log, or do
//! I/O, and reads no clock.

use std::time::Instant;

use super::cache_aware::IMBALANCE;
use super::{
    choose_least_loaded, choose_uniform, BalanceGuard, Candidate, Needs, Pick, PickRequest,
    Strategy,
};
use crate::engine_state::kv_index::KeySpace;
use crate::engine_state::view::EngineView;

/// Fallback: the request's token ids were not available in time.
pub const NO_TOKEN_IDS: &str = "no_token_ids";
/// Fallback: no candidate's KV-event stream is live.
pub const KV_EVENTS_STALE: &str = "kv_events_stale";

pub struct PreciseCacheAware {
    view: EngineView,
    min_blocks: u32,
    guard: BalanceGuard,
    rng: fastrand::Rng,
    keys: Vec<u64>,
    targets: Vec<u32>,
    scores: Vec<u32>,
}

impl PreciseCacheAware {
    pub fn new(view: EngineView, min_blocks: u32, seed: u64) -> Self {
        PreciseCacheAware {
            view,
            min_blocks,
            guard: BalanceGuard {
                abs: super::cache_aware::DEFAULT_BALANCE_ABS,
                rel: super::cache_aware::DEFAULT_BALANCE_REL,
            },
            rng: fastrand::Rng::with_seed(seed),
            keys: Vec::new(),
            targets: Vec::new(),
            scores: Vec::new(),
        }
    }

    /// The balance guard's thresholds (see the module documentation).
    pub fn with_balance(mut self, abs: u64, rel: f64) -> Self {
        self.guard = BalanceGuard { abs, rel };
        self
    }

    fn least_loaded(&mut self, candidates: &[Candidate]) -> Option<usize> {
        choose_least_loaded(&mut self.rng, candidates)
    }
}

impl Strategy for PreciseCacheAware {
    fn name(&self) -> &'static str {
        "precise_cache_aware"
    }

    fn needs(&self) -> Needs {
        Needs::TOKEN_IDS
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        if let Some(i) = self.guard.check(&mut self.rng, candidates) {
            return Some(Pick::fallback(i, IMBALANCE));
        }
        let (Some(ids), Some(index)) = (req.inputs.token_ids.as_deref(), self.view.kv.as_ref())
        else {
            let reason = if req.inputs.token_ids.is_none() {
                NO_TOKEN_IDS
            } else {
                KV_EVENTS_STALE
            };
            return Some(Pick::fallback(self.least_loaded(candidates)?, reason));
        };
        if !candidates.iter().any(|c| self.view.kv_live(c.target)) {
            return Some(Pick::fallback(
                self.least_loaded(candidates)?,
                KV_EVENTS_STALE,
            ));
        }
        index.request_keys(KeySpace::default(), ids, &mut self.keys);
        self.targets.clear();
        self.targets
            .extend(candidates.iter().map(|c| c.target as u32));
        self.scores.clear();
        self.scores.resize(candidates.len(), 0);
        index.longest_prefix(&self.keys, &self.targets, &mut self.scores);
        for (c, s) in candidates.iter().zip(self.scores.iter_mut()) {
            if !self.view.kv_live(c.target) {
                *s = 0;
            }
        }
        let best = self.scores.iter().copied().max().unwrap_or(0);
        let score = if self.keys.is_empty() {
            0.0
        } else {
            f64::from(best) / self.keys.len() as f64
        };
        let chosen = if best > self.min_blocks {
            let scores = &self.scores;
            let low = candidates
                .iter()
                .zip(scores)
                .filter(|&(_, &s)| s == best)
                .map(|(c, _)| c.load)
                .min()?;
            choose_uniform(&mut self.rng, candidates.len(), |i| {
                scores[i] == best && candidates[i].load == low
            })?
        } else {
            self.least_loaded(candidates)?
        };
        Some(Pick {
            index: chosen,
            score: Some(score),
            fallback: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::engine_state::kv_events::{BlockRemoved, BlockStored, EventBatch, Medium};
    use crate::engine_state::kv_index::{KvIndex, KvIndexConfig};
    use crate::strategy::testing::{cands, req};
    use crate::strategy::AsyncInputs;

    /// Tokens 0..n shifted by `base`, so prompts with different bases share nothing.
    fn tokens(base: u32, n: u32) -> Vec<u32> {
        (0..n).map(|i| base + i).collect()
    }

    /// Stores `toks`' full 16-token blocks on `target` as one BlockStored with engine
    /// hashes `hash_base + i`.
    fn store(index: &mut KvIndex, target: u32, seq: u64, toks: &[u32], hash_base: u64) {
        let blocks = toks.len() / 16;
        let hashes: Vec<u64> = (0..blocks as u64).map(|i| hash_base + i).collect();
        let mut b = EventBatch::new();
        b.push_block_stored(&BlockStored {
            block_hashes: &hashes,
            token_ids: &toks[..blocks * 16],
            block_size: 16,
            medium: Some(Medium::Gpu),
            ..BlockStored::default()
        });
        index.apply(target, seq, &b, Instant::now()).unwrap();
    }

    fn setup(targets: usize) -> (KvIndex, EngineView) {
        let index = KvIndex::new(KvIndexConfig::default()).unwrap();
        let view = EngineView::with_kv(index.reader(), targets);
        for t in 0..targets {
            view.set_kv_live(t, true);
        }
        (index, view)
    }

    fn pick(s: &mut PreciseCacheAware, ids: &[u32], c: &[Candidate]) -> Pick {
        let inputs = AsyncInputs {
            token_ids: Some(Rc::from(ids)),
            ..AsyncInputs::default()
        };
        let r = PickRequest {
            inputs: &inputs,
            ..req()
        };
        s.pick(&r, c, Instant::now()).unwrap()
    }

    #[test]
    fn the_engine_holding_the_longest_prefix_wins() {
        let (mut index, view) = setup(3);
        let prompt = tokens(1000, 16 * 8 + 5);
        store(&mut index, 0, 0, &prompt[..16 * 2], 1);
        store(&mut index, 1, 0, &prompt[..16 * 6], 100);
        store(&mut index, 2, 0, &tokens(5000, 16 * 8), 200);
        let mut s = PreciseCacheAware::new(view, 0, 1);
        // Target 1 holds 6 of 8 blocks, even though it is the busiest.
        let c = cands(&[(1.0, 0), (1.0, 9), (1.0, 0)]);
        let p = pick(&mut s, &prompt, &c);
        assert_eq!(p.index, 1);
        assert_eq!(p.fallback, None);
        assert!((p.score.unwrap() - 6.0 / 8.0).abs() < 1e-9);
    }

    #[test]
    fn below_min_blocks_load_decides() {
        let (mut index, view) = setup(2);
        let prompt = tokens(1, 16 * 4);
        store(&mut index, 0, 0, &prompt[..16 * 2], 1);
        let c = cands(&[(1.0, 5), (1.0, 1)]);
        // Two blocks held: above 1, below 2.
        let mut s = PreciseCacheAware::new(view.clone(), 1, 1);
        assert_eq!(pick(&mut s, &prompt, &c).index, 0);
        let mut s = PreciseCacheAware::new(view, 2, 1);
        let p = pick(&mut s, &prompt, &c);
        assert_eq!(p.index, 1);
        assert_eq!(p.fallback, None, "load deciding is not a fallback");
    }

    #[test]
    fn a_removed_block_ends_the_match() {
        let (mut index, view) = setup(2);
        let prompt = tokens(1, 16 * 4);
        store(&mut index, 0, 0, &prompt, 10);
        store(&mut index, 1, 0, &prompt[..16 * 2], 20);
        let mut s = PreciseCacheAware::new(view, 0, 1);
        let c = cands(&[(1.0, 3), (1.0, 0)]);
        assert_eq!(pick(&mut s, &prompt, &c).index, 0);
        // Target 0 loses its first block: its run is now empty, target 1 holds two.
        let mut b = EventBatch::new();
        b.push_block_removed(&BlockRemoved {
            block_hashes: &[10],
            medium: Some(Medium::Gpu),
            group_idx: None,
        });
        index.apply(0, 1, &b, Instant::now()).unwrap();
        assert_eq!(pick(&mut s, &prompt, &c).index, 1);
    }

    #[test]
    fn without_token_ids_or_live_streams_load_decides_and_says_so() {
        let (mut index, view) = setup(2);
        let prompt = tokens(1, 16 * 4);
        store(&mut index, 0, 0, &prompt, 10);
        let c = cands(&[(1.0, 4), (1.0, 1)]);
        let mut s = PreciseCacheAware::new(view.clone(), 0, 1);
        let p = s.pick(&req(), &c, Instant::now()).unwrap();
        assert_eq!((p.index, p.fallback), (1, Some(NO_TOKEN_IDS)));
        // Target 0 holds everything but its stream went stale: it is not trusted.
        view.set_kv_live(0, false);
        let p = pick(&mut s, &prompt, &c);
        assert_eq!(p.index, 1);
        view.set_kv_live(1, false);
        let p = pick(&mut s, &prompt, &c);
        assert_eq!((p.index, p.fallback), (1, Some(KV_EVENTS_STALE)));
        // No index at all (no target publishes).
        let mut s = PreciseCacheAware::new(EngineView::default(), 0, 1);
        let p = pick(&mut s, &prompt, &c);
        assert_eq!((p.index, p.fallback), (1, Some(KV_EVENTS_STALE)));
    }

    #[test]
    fn the_balance_guard_overrides_a_resident_prefix() {
        let (mut index, view) = setup(2);
        let prompt = tokens(1, 16 * 4);
        store(&mut index, 0, 0, &prompt, 10);
        let mut s = PreciseCacheAware::new(view, 0, 1);
        // 40 in flight on the holder against 2: 38 apart and 20x: the idle one wins.
        let c = cands(&[(1.0, 40), (1.0, 2)]);
        let p = pick(&mut s, &prompt, &c);
        assert_eq!((p.index, p.fallback), (1, Some(IMBALANCE)));
        // 30 against 2 is within the absolute threshold: the prefix wins.
        let c = cands(&[(1.0, 30), (1.0, 2)]);
        assert_eq!(pick(&mut s, &prompt, &c).index, 0);
    }

    #[test]
    fn equal_runs_tie_by_load_then_at_random() {
        let (mut index, view) = setup(3);
        let prompt = tokens(1, 16 * 3);
        for t in 0..3 {
            store(&mut index, t, 0, &prompt, 100 * u64::from(t) + 1);
        }
        let mut s = PreciseCacheAware::new(view, 0, 7);
        let c = cands(&[(1.0, 2), (1.0, 2), (1.0, 5)]);
        let mut counts = [0u32; 3];
        for _ in 0..2000 {
            counts[pick(&mut s, &prompt, &c).index] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!(counts[0] > 850 && counts[1] > 850, "{counts:?}");
    }
}
