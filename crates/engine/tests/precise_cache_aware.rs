//! `precise_cache_aware` over the real block index: the strategy from the strategy crate,
//! the index and its view from this one, fed with decoded KV events.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use rolter_core::{AsyncInputs, Candidate, KvCacheView, Pick, PickRequest};
use rolter_engine::kv::events::{BlockRemoved, BlockStored, EventBatch, Medium};
use rolter_engine::kv::index::{KvIndex, KvIndexConfig};
use rolter_engine::kv::view::EngineView;
use rolter_strategy::shared::IMBALANCE;
use rolter_strategy::strategies::precise_cache_aware::{
    PreciseCacheAware, KV_EVENTS_STALE, NO_TOKEN_IDS,
};
use rolter_strategy::testing::{cands, req};
use rolter_strategy::Strategy;

/// The strategy over `view`, as the gateway builds it.
fn over(view: &EngineView, min_blocks: u32, seed: u64) -> PreciseCacheAware {
    let view: Arc<dyn KvCacheView> = Arc::new(view.clone());
    PreciseCacheAware::new(Some(view), min_blocks, seed)
}

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
    let mut s = over(&view, 0, 1);
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
    let mut s = over(&view, 1, 1);
    assert_eq!(pick(&mut s, &prompt, &c).index, 0);
    let mut s = over(&view, 2, 1);
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
    let mut s = over(&view, 0, 1);
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
    let mut s = over(&view, 0, 1);
    let p = s.pick(&req(), &c, Instant::now()).unwrap();
    assert_eq!((p.index, p.fallback), (1, Some(NO_TOKEN_IDS)));
    // Target 0 holds everything but its stream went stale: it is not trusted.
    view.set_kv_live(0, false);
    let p = pick(&mut s, &prompt, &c);
    assert_eq!(p.index, 1);
    view.set_kv_live(1, false);
    let p = pick(&mut s, &prompt, &c);
    assert_eq!((p.index, p.fallback), (1, Some(KV_EVENTS_STALE)));
    // No index at all (no target publishes): no view, or a view without an index.
    let mut s = PreciseCacheAware::new(None, 0, 1);
    let p = pick(&mut s, &prompt, &c);
    assert_eq!((p.index, p.fallback), (1, Some(KV_EVENTS_STALE)));
    let mut s = over(&EngineView::default(), 0, 1);
    let p = pick(&mut s, &prompt, &c);
    assert_eq!((p.index, p.fallback), (1, Some(KV_EVENTS_STALE)));
}

#[test]
fn the_balance_guard_overrides_a_resident_prefix() {
    let (mut index, view) = setup(2);
    let prompt = tokens(1, 16 * 4);
    store(&mut index, 0, 0, &prompt, 10);
    let mut s = over(&view, 0, 1);
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
    let mut s = over(&view, 0, 7);
    let c = cands(&[(1.0, 2), (1.0, 2), (1.0, 5)]);
    let mut counts = [0u32; 3];
    for _ in 0..2000 {
        counts[pick(&mut s, &prompt, &c).index] += 1;
    }
    assert_eq!(counts[2], 0);
    assert!(counts[0] > 850 && counts[1] > 850, "{counts:?}");
}
