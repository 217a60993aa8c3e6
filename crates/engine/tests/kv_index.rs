//! The block index fed with decoded KV-event batches: scoring, the memory bound over a
//! million blocks, and readers scoring while the writer applies.

use std::time::Instant;

use rolter_engine::kv::events::{BlockStored, EventBatch, KvEvent};
use rolter_engine::kv::index::{ApplyOutcome, KeySpace, KvIndex, KvIndexConfig, KvIndexReader};

mod common;
use common::{decode, hex, FIXTURE};
fn keys(r: &KvIndexReader, tokens: &[u32]) -> Vec<u64> {
    let mut out = Vec::new();
    r.request_keys(KeySpace::default(), tokens, &mut out);
    out
}

fn score(r: &KvIndexReader, tokens: &[u32], targets: &[u32]) -> Vec<u32> {
    let mut out = vec![0; targets.len()];
    r.longest_prefix(&keys(r, tokens), targets, &mut out);
    out
}

/// The fixture's events, one batch each, drive the index the way a subscriber would.
#[test]
fn decoded_batches_drive_the_index() {
    let mut idx = KvIndex::new(KvIndexConfig::default()).unwrap();
    let r = idx.reader();
    let fixture = decode(&hex(FIXTURE));
    let tokens: Vec<u32> = (1..=32).collect();
    let mut expected = [2, 1, 0].into_iter();
    let mut one = EventBatch::new();
    for (seq, ev) in fixture.events().enumerate() {
        one.clear();
        match ev {
            KvEvent::BlockStored(s) => one.push_block_stored(&s),
            KvEvent::BlockRemoved(r) => one.push_block_removed(&r),
            KvEvent::AllBlocksCleared { medium } => one.push_all_blocks_cleared(medium),
        }
        let outcome = idx.apply(3, seq as u64, &one, Instant::now()).unwrap();
        assert_eq!(outcome, ApplyOutcome::Applied);
        assert_eq!(score(&r, &tokens, &[3]), [expected.next().unwrap()]);
    }
    // The whole batch at once ends cleared too.
    idx.apply(3, 3, &fixture, Instant::now()).unwrap();
    assert_eq!(score(&r, &tokens, &[3]), [0]);
    assert_eq!(idx.target_stats(3).unwrap().keys, 0);
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// A million distinct blocks through a target capped at 50k: the index stays at the cap,
/// and memory stops growing once it is reached.
#[test]
fn a_million_blocks_stay_within_the_bound() {
    const CAP: usize = 50_000;
    const PER_EVENT: u32 = 64;
    let mut idx = KvIndex::new(KvIndexConfig {
        block_size: 16,
        max_blocks_per_target: CAP,
    })
    .unwrap();
    let r = idx.reader();
    let mut b = EventBatch::new();
    let mut hashes = Vec::new();
    let mut tokens = Vec::new();
    let mut rss_at_cap = None;
    let events = 1_000_000 / PER_EVENT;
    for e in 0..events {
        let first = e * PER_EVENT;
        hashes.clear();
        hashes.extend((first..first + PER_EVENT).map(|i| u64::from(i) + 1));
        tokens.clear();
        tokens.extend(first * 16..(first + PER_EVENT) * 16);
        b.clear();
        b.push_block_stored(&BlockStored {
            block_hashes: &hashes,
            token_ids: &tokens,
            block_size: 16,
            ..Default::default()
        });
        idx.apply(0, u64::from(e), &b, Instant::now()).unwrap();
        if e == events / 4 {
            rss_at_cap = rss_bytes();
        }
    }
    let st = idx.target_stats(0).unwrap();
    let total = u64::from(events * PER_EVENT);
    assert_eq!((st.engine_blocks, st.keys), (CAP, CAP));
    assert_eq!(st.counters.evicted, total - CAP as u64);
    assert_eq!(r.slots(), CAP);
    // The newest event is whole; the first is gone.
    let last = (events - 1) * PER_EVENT;
    let newest: Vec<u32> = (last * 16..(last + PER_EVENT) * 16).collect();
    assert_eq!(score(&r, &newest, &[0]), [PER_EVENT]);
    assert_eq!(score(&r, &(0..1024).collect::<Vec<_>>(), &[0]), [0]);
    if let (Some(before), Some(after)) = (rss_at_cap, rss_bytes()) {
        let growth = after.saturating_sub(before);
        assert!(
            growth < 64 << 20,
            "grew {growth} bytes after reaching the cap"
        );
    }
}

/// Readers on other threads score while the writer applies.
#[test]
fn readers_score_concurrently_with_the_writer() {
    let mut idx = KvIndex::new(KvIndexConfig::default()).unwrap();
    let tokens: Vec<u32> = (0..16 * 64).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let r = idx.reader();
            let tokens = tokens.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let k = keys(&r, &tokens);
                let mut out = [0u32; 4];
                let mut rounds = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds == 0 {
                    r.longest_prefix(&k, &[0, 1, 2, 3], &mut out);
                    assert!(out.iter().all(|&s| s <= 64));
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let mut b = EventBatch::new();
    for seq in 0..2000u64 {
        let target = (seq % 4) as u32;
        let block = (seq / 4 % 64) as usize;
        b.clear();
        let hash = [block as u64 + 1];
        b.push_block_stored(&BlockStored {
            block_hashes: &hash,
            parent_block_hash: (block > 0).then_some(block as u64),
            token_ids: &tokens[block * 16..block * 16 + 16],
            block_size: 16,
            ..Default::default()
        });
        if block == 63 {
            b.push_all_blocks_cleared(None);
        }
        idx.apply(target, seq / 4, &b, Instant::now()).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in readers {
        assert!(h.join().unwrap() > 0);
    }
}
