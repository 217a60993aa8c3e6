//! Pick cost of each strategy with 4, 16 and 64 candidates.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use rolter::core::{Price, PriceBook};
use rolter::strategy::registry;
use rolter::strategy::{
    AsyncInputs, BuildContext, Candidate, PickRequest, Sample, SessionKey, ShareSink, Strategy,
    StrategySpec, Switches,
};

/// A default-options instance of strategy `name` for a route over `n` targets (weights
/// 1..3), with the given fixed prices (or none).
fn build_strategy(name: &'static str, n: usize, prices: Vec<Option<Price>>) -> Box<dyn Strategy> {
    let weights: Vec<f64> = (0..n).map(|i| (1 + i % 3) as f64).collect();
    let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    let route_targets: Vec<usize> = (0..n).collect();
    let prices = PriceBook::fixed(&prices);
    let switches = Arc::new(Switches::default());
    StrategySpec::with_defaults(name)
        .expect("a registered strategy")
        .build(&BuildContext {
            target_count: n,
            seed: 1,
            weights: &weights,
            names: &names,
            route_targets: &route_targets,
            prices: &prices,
            switches: &switches,
            kv: None,
        })
}

/// `n` candidates with target ids 0.., loads spread over 0..10 and the given weights.
fn bench_candidates(n: usize, weight: impl Fn(usize) -> f64) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            target: i,
            weight: weight(i),
            load: (i * 7 % 11) as u64,
            tier: 0,
            ..Candidate::default()
        })
        .collect()
}

fn bench_picks(c: &mut Criterion) {
    let inputs = AsyncInputs::default();
    let req = PickRequest {
        model: "m",
        session: Default::default(),
        prompt: b"[]",
        prompt_tokens: 256,
        max_tokens: Some(256),
        inputs: &inputs,
    };
    let mut g = c.benchmark_group("pick");
    for info in registry::all() {
        for n in [4usize, 16, 64] {
            let cands = bench_candidates(n, |i| 1.0 + (i % 3) as f64);
            let prices = (0..n)
                .map(|i| {
                    Some(Price {
                        input_per_mtok: 0.1 + (i % 5) as f64 * 0.2,
                        output_per_mtok: 0.4 + (i % 5) as f64 * 0.8,
                    })
                })
                .collect();
            let mut s = build_strategy(info.name, n, prices);
            // Learning strategies pick from a trained state: every target has samples.
            for round in 0..16u64 {
                for t in 0..n {
                    s.observe(&Sample {
                        target: t,
                        status: 200,
                        success: true,
                        ttft: Some(Duration::from_millis(20 + (t as u64 * 13 + round) % 50)),
                        first_byte: Some(Duration::from_millis(20 + (t as u64 * 13 + round) % 50)),
                        duration: Duration::from_millis(400),
                        load_at_send: (t as u64 + round) % 7,
                        prompt_tokens: 100 + (round as u32) * 50,
                        usage: None,
                        finished: Instant::now(),
                    });
                }
            }
            let now = Instant::now();
            g.bench_function(format!("{}/{n}", info.name), |b| {
                b.iter(|| s.pick(black_box(&req), black_box(&cands), now))
            });
        }
    }
    g.finish();
}

/// cache_aware: pick (and index insert) cost with 4, 16 and 64 targets and 1 KiB / 32 KiB
/// prompts. Every target holds 16 prompts sharing its own system prompt; the request shares
/// the system prompt of target `n / 2` and differs in its last 256 bytes.
fn bench_cache_aware(c: &mut Criterion) {
    use rolter::strategy::shared::prefix_index::PrefixIndex;
    use rolter::strategy::{SessionKey, ShareSink};

    fn text(seed: u64, len: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.alphanumeric() as u8).collect()
    }
    let inputs = AsyncInputs::default();
    let mut g = c.benchmark_group("cache_aware");
    for (size, label) in [(1024usize, "1KiB"), (32 * 1024, "32KiB")] {
        for n in [4usize, 16, 64] {
            let cands = bench_candidates(n, |_| 1.0);
            let mut s = build_strategy("cache_aware", n, vec![None; n]);
            let mut sink = ShareSink::default();
            let now = Instant::now();
            let mut request = Vec::new();
            for t in 0..n {
                let mut p = text(t as u64, size);
                for k in 0..16u64 {
                    p[size - 256..].copy_from_slice(&text(1000 + k, 256));
                    let r = PickRequest {
                        model: "m",
                        session: SessionKey {
                            header: None,
                            prompt: &p,
                        },
                        prompt: &p,
                        prompt_tokens: (size / 4) as u32,
                        max_tokens: Some(256),
                        inputs: &inputs,
                    };
                    s.routed(&r, t, &mut sink, now);
                }
                let _ = sink.take_batch();
                if t == n / 2 {
                    p[size - 256..].copy_from_slice(&text(99, 256));
                    request = p;
                }
            }
            let req = PickRequest {
                model: "m",
                session: SessionKey {
                    header: None,
                    prompt: &request,
                },
                prompt: &request,
                prompt_tokens: (size / 4) as u32,
                max_tokens: Some(256),
                inputs: &inputs,
            };
            assert_eq!(
                cands[s.pick(&req, &cands, now).expect("pick").index].target,
                n / 2
            );
            g.bench_function(format!("pick/{n}/{label}"), |b| {
                b.iter(|| s.pick(black_box(&req), black_box(&cands), now))
            });
        }
        // Index cost alone: insert a prompt whose last 256 bytes are new, and a full scan.
        let mut ix = PrefixIndex::new(1, 4 << 20);
        let mut p = text(7, size);
        let now = Instant::now();
        let mut i = 0u64;
        g.bench_function(format!("insert/{label}"), |b| {
            b.iter(|| {
                i += 1;
                p[size - 8..].copy_from_slice(&i.to_le_bytes());
                ix.insert(0, black_box(&p), now)
            })
        });
        g.bench_function(format!("matched/{label}"), |b| {
            b.iter(|| ix.matched(0, black_box(&p)))
        });
    }
    g.finish();
}

/// `pipeline` with its default scorers (load + prefix) and a warm prefix index: 4, 16 and
/// 64 targets, prompts of 1 KiB and 32 KiB sharing a long system prompt with what each
/// target was sent before.
fn bench_pipeline(c: &mut Criterion) {
    let inputs = AsyncInputs::default();
    let mut g = c.benchmark_group("pipeline");
    for n in [4usize, 16, 64] {
        for size in [1024usize, 32 * 1024] {
            let mut s = build_strategy("pipeline", n, vec![None; n]);
            // A shared system prompt of 3/4 of the size, then a per-conversation tail.
            let system: Vec<u8> = (0..size * 3 / 4).map(|i| b'a' + (i % 26) as u8).collect();
            let prompt_for = |conv: usize| {
                let mut p = system.clone();
                p.extend(
                    format!("{conv:08}")
                        .bytes()
                        .cycle()
                        .take(size - system.len()),
                );
                p
            };
            let mut sink = ShareSink::default();
            let now = Instant::now();
            for conv in 0..4 * n {
                let p = prompt_for(conv);
                let r = PickRequest {
                    model: "m",
                    session: SessionKey {
                        header: None,
                        prompt: &p,
                    },
                    prompt: &p,
                    prompt_tokens: (size / 4) as u32,
                    max_tokens: Some(256),
                    inputs: &inputs,
                };
                s.routed(&r, conv % n, &mut sink, now);
                sink.take_batch();
            }
            let prompt = prompt_for(1);
            let req = PickRequest {
                model: "m",
                session: SessionKey {
                    header: None,
                    prompt: &prompt,
                },
                prompt: &prompt,
                prompt_tokens: (size / 4) as u32,
                max_tokens: Some(256),
                inputs: &inputs,
            };
            let cands = bench_candidates(n, |i| 1.0 + (i % 3) as f64);
            g.bench_function(format!("{n}/{}KiB", size / 1024), |b| {
                b.iter(|| s.pick(black_box(&req), black_box(&cands), now))
            });
        }
    }
    g.finish();
}

/// lora_aware with a fresh residency table: the worker's lookup (hash the model, one
/// residency per target) and the pick, with 4, 16 and 64 targets of which every fourth runs
/// the adapter and the rest list it with a free slot.
fn bench_lora_aware(c: &mut Criterion) {
    use rolter::engine::lora::{adapter_key, LoraTable, LoraView, Slots, TargetLora};

    let inputs = AsyncInputs::default();
    let req = PickRequest {
        model: "sql-lora",
        session: SessionKey::default(),
        prompt: b"[]",
        prompt_tokens: 256,
        max_tokens: Some(256),
        inputs: &inputs,
    };
    let mut g = c.benchmark_group("lora_aware");
    for n in [4usize, 16, 64] {
        let others: Vec<u64> = (0..8).map(|i| adapter_key(&format!("lora-{i}"))).collect();
        let targets = (0..n)
            .map(|t| {
                let mut running = others[..2].to_vec();
                if t % 4 == 0 {
                    running.push(adapter_key("sql-lora"));
                }
                let mut loaded = others.clone();
                loaded.push(adapter_key("sql-lora"));
                loaded.sort_unstable();
                TargetLora {
                    slots: Some(Slots {
                        max_lora: Some(4),
                        running,
                        waiting: Vec::new(),
                    }),
                    loaded: Some(loaded),
                }
            })
            .collect();
        let view = LoraView::default();
        view.apply(Arc::new(LoraTable::new(targets)));
        let mut cands = bench_candidates(n, |_| 1.0);
        g.bench_function(format!("lookup/{n}"), |b| {
            b.iter(|| {
                let l = view.lookup(black_box("sql-lora"));
                for c in cands.iter_mut() {
                    c.lora = l.residency(c.target);
                }
            })
        });
        let mut s = build_strategy("lora_aware", n, vec![None; n]);
        let now = Instant::now();
        g.bench_function(format!("pick/{n}"), |b| {
            b.iter(|| s.pick(black_box(&req), black_box(&cands), now))
        });
    }
    g.finish();
}

/// lmcache_aware: the worker's side of a lookup (memo key, request body, answer parsing)
/// for 1 KiB and 32 KiB prompts (256 and 8192 tokens), and the pick over 4, 16 and 64
/// targets of which every fourth holds part of the prompt.
fn bench_lmcache_aware(c: &mut Criterion) {
    use rolter::engine::lmcache::{lookup_body, memo_key, parse_lookup, Instances};

    let mut g = c.benchmark_group("lmcache_aware");
    for (label, tokens) in [("1KiB", 256u32), ("32KiB", 8192)] {
        let ids: Vec<u32> = (0..tokens).map(|i| i * 7 + 100).collect();
        let mut body = Vec::new();
        g.bench_function(format!("memo_key/{label}"), |b| {
            b.iter(|| memo_key(black_box(&ids), 256))
        });
        g.bench_function(format!("body/{label}"), |b| {
            b.iter(|| lookup_body(black_box(&ids), &mut body))
        });
    }
    for n in [4usize, 16, 64] {
        let names: Vec<String> = (0..n).map(|i| format!("vllm-pod-{i}")).collect();
        let instances = Instances::new(names.iter().map(String::as_str).zip(0..n));
        let answer = format!(
            "{{\"event_id\":\"Lookup0f1e\",\"layout_info\":{{{}}}}}",
            (0..n)
                .step_by(4)
                .map(|i| format!("\"vllm-pod-{i}\":[\"LocalCPUBackend\",{}]", 256 * (i + 1)))
                .collect::<Vec<_>>()
                .join(",")
        );
        g.bench_function(format!("parse/{n}"), |b| {
            b.iter(|| parse_lookup(black_box(answer.as_bytes()), &instances, 8192))
        });
        let held = parse_lookup(answer.as_bytes(), &instances, 8192)
            .unwrap()
            .holdings;
        let inputs = AsyncInputs {
            token_ids: Some((0..8192u32).collect::<Vec<_>>().into()),
            cached_tokens: Some(held.into()),
            rotation: None,
        };
        let req = PickRequest {
            model: "m",
            session: SessionKey::default(),
            prompt: b"[]",
            prompt_tokens: 8192,
            max_tokens: Some(256),
            inputs: &inputs,
        };
        let mut cands = bench_candidates(n, |_| 1.0);
        for (i, c) in cands.iter_mut().enumerate() {
            c.kv_usage = Some((i % 10) as f32 / 10.0);
        }
        let mut s = build_strategy("lmcache_aware", n, vec![None; n]);
        let now = Instant::now();
        g.bench_function(format!("pick/{n}"), |b| {
            b.iter(|| s.pick(black_box(&req), black_box(&cands), now))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_picks,
    bench_cache_aware,
    bench_pipeline,
    bench_lora_aware,
    bench_lmcache_aware
);
criterion_main!(benches);
