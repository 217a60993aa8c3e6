//! KV-event routing costs: decoding event batches, applying them to the index, computing a
//! request's keys and scoring 4, 16 and 64 candidates for 1 KiB (16 blocks) and 32 KiB
//! (512 blocks) prompts.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rmp::encode as enc;
use rolter::engine::kv::events::{decode_batch, BlockStored, EventBatch};
use rolter::engine::kv::index::{KeySpace, KvIndex, KvIndexConfig};

const BLOCK: u32 = 16;

/// A vLLM-style payload: `events` BlockStored events of `blocks` chained blocks each
/// (current layout, 8 fields), hashes as u64 ints or as 32-byte `bin`s.
fn payload(events: u32, blocks: u32, bin_hashes: bool) -> Vec<u8> {
    let mut out = Vec::new();
    enc::write_array_len(&mut out, 3).unwrap();
    enc::write_f64(&mut out, 1_718_000_000.5).unwrap();
    enc::write_array_len(&mut out, events).unwrap();
    let hash = |out: &mut Vec<u8>, h: u64| {
        if bin_hashes {
            let mut digest = [0xa5u8; 32];
            digest[24..].copy_from_slice(&h.to_be_bytes());
            enc::write_bin(out, &digest).unwrap();
        } else {
            enc::write_u64(out, h).unwrap();
        }
    };
    for e in 0..events {
        let first = u64::from(e * blocks);
        enc::write_array_len(&mut out, 8).unwrap();
        enc::write_str(&mut out, "BlockStored").unwrap();
        enc::write_array_len(&mut out, blocks).unwrap();
        for b in 0..u64::from(blocks) {
            hash(&mut out, 0x9E37_79B9_7F4A_7C15 ^ (first + b));
        }
        if e == 0 {
            enc::write_nil(&mut out).unwrap();
        } else {
            hash(&mut out, 0x9E37_79B9_7F4A_7C15 ^ (first - 1));
        }
        enc::write_array_len(&mut out, blocks * BLOCK).unwrap();
        for t in 0..blocks * BLOCK {
            enc::write_uint(
                &mut out,
                u64::from(1000 + (e * blocks * BLOCK + t) * 37 % 150_000),
            )
            .unwrap();
        }
        enc::write_uint(&mut out, u64::from(BLOCK)).unwrap();
        enc::write_nil(&mut out).unwrap();
        enc::write_str(&mut out, "GPU").unwrap();
        enc::write_nil(&mut out).unwrap();
    }
    enc::write_uint(&mut out, 0).unwrap();
    out
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_decode");
    let mut batch = EventBatch::new();
    for (label, events, blocks, bin) in [
        ("16x1block_int", 16, 1, false),
        ("16x1block_bin32", 16, 1, true),
        ("4x32blocks_int", 4, 32, false),
    ] {
        let p = payload(events, blocks, bin);
        g.throughput(Throughput::Elements(u64::from(events)));
        g.bench_function(format!("{label}/{}B", p.len()), |b| {
            b.iter(|| {
                decode_batch(black_box(&p), &mut batch).unwrap();
                black_box(batch.len())
            })
        });
    }
    g.finish();
}

/// A batch of `events` new single-block sequences (distinct tokens), numbered from `first`.
fn fresh_batch(first: u64, events: u64, tokens: &mut Vec<u32>, batch: &mut EventBatch) {
    batch.clear();
    for e in first..first + events {
        tokens.clear();
        tokens.extend((0..BLOCK).map(|t| (e as u32).wrapping_mul(BLOCK) + t));
        batch.push_block_stored(&BlockStored {
            block_hashes: &[e + 1],
            token_ids: tokens,
            block_size: BLOCK,
            ..Default::default()
        });
    }
}

fn bench_apply(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_apply");
    g.throughput(Throughput::Elements(16));
    // Steady state: the target is at its bound, every new block evicts the oldest.
    let mut idx = KvIndex::new(KvIndexConfig {
        block_size: BLOCK as usize,
        max_blocks_per_target: 1 << 16,
    })
    .unwrap();
    let mut tokens = Vec::new();
    let mut batch = EventBatch::new();
    let mut next = 0u64;
    let mut seq = 0u64;
    for _ in 0..(1 << 16) / 16 {
        fresh_batch(next, 16, &mut tokens, &mut batch);
        next += 16;
        idx.apply(0, seq, &batch, Instant::now()).unwrap();
        seq += 1;
    }
    g.bench_function("16x1block_at_bound", |b| {
        b.iter_batched_ref(
            || {
                let mut batch = EventBatch::new();
                fresh_batch(next, 16, &mut tokens, &mut batch);
                next += 16;
                batch
            },
            |batch| {
                idx.apply(0, seq, batch, Instant::now()).unwrap();
                seq += 1;
            },
            BatchSize::SmallInput,
        )
    });
    // Decode and apply together, as the subscriber does (same payload each time: the
    // blocks are already known, so this is the refresh path).
    let p = payload(16, 1, false);
    let mut batch = EventBatch::new();
    g.bench_function("decode_and_apply_16x1block_known", |b| {
        b.iter(|| {
            decode_batch(black_box(&p), &mut batch).unwrap();
            idx.apply(1, seq, &batch, Instant::now()).unwrap();
            seq += 1;
        })
    });
    g.finish();
}

fn bench_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_lookup");
    let prompt: Vec<u32> = (0..512 * BLOCK).map(|t| 1000 + t * 7 % 90_000).collect();
    for (label, blocks) in [("1KiB", 16usize), ("32KiB", 512)] {
        let tokens = &prompt[..blocks * BLOCK as usize];
        let mut keys = Vec::new();
        let reader = KvIndex::new(KvIndexConfig::default()).unwrap().reader();
        g.bench_function(format!("request_keys/{label}"), |b| {
            b.iter(|| {
                reader.request_keys(KeySpace::default(), black_box(tokens), &mut keys);
                black_box(keys.len())
            })
        });
    }
    for n in [4u32, 16, 64] {
        // Target i holds the first (i + 1) / n of the 512-block prompt, plus 2048 blocks of
        // other prompts, so the map has realistic size and the scan runs to the end.
        let mut idx = KvIndex::new(KvIndexConfig::default()).unwrap();
        let mut batch = EventBatch::new();
        let mut other = Vec::new();
        for t in 0..n {
            let held = 512 * (t as usize + 1) / n as usize;
            let hashes: Vec<u64> = (1..=held as u64).collect();
            batch.clear();
            batch.push_block_stored(&BlockStored {
                block_hashes: &hashes,
                token_ids: &prompt[..held * BLOCK as usize],
                block_size: BLOCK,
                ..Default::default()
            });
            idx.apply(t, 0, &batch, Instant::now()).unwrap();
            for s in 0..2048u64 {
                fresh_batch(1_000_000 * u64::from(t + 1) + s, 1, &mut other, &mut batch);
                idx.apply(t, s + 1, &batch, Instant::now()).unwrap();
            }
        }
        let reader = idx.reader();
        let targets: Vec<u32> = (0..n).collect();
        let mut scores = vec![0u32; n as usize];
        for (label, blocks) in [("1KiB", 16usize), ("32KiB", 512)] {
            let mut keys = Vec::new();
            reader.request_keys(KeySpace::default(), &prompt[..blocks * 16], &mut keys);
            g.bench_function(format!("longest_prefix/{label}/{n}"), |b| {
                b.iter(|| {
                    reader.longest_prefix(black_box(&keys), &targets, &mut scores);
                    black_box(scores[0])
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_decode, bench_apply, bench_lookup);
criterion_main!(benches);
