//! Pick cost of each strategy with 4, 16 and 64 candidates.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use rolter::config::StrategySpec;
use rolter::strategy::registry::{self, BuildContext};
use rolter::strategy::{AsyncInputs, Candidate, PickRequest};

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
            let cands: Vec<Candidate> = (0..n)
                .map(|i| Candidate {
                    target: i,
                    weight: 1.0 + (i % 3) as f64,
                    load: (i * 7 % 11) as u64,
                    tier: 0,
                })
                .collect();
            let spec = StrategySpec {
                name: info.name,
                options: toml::Table::new(),
            };
            let mut s = registry::build(
                &spec,
                &BuildContext {
                    target_count: n,
                    seed: 1,
                },
            );
            let now = Instant::now();
            g.bench_function(format!("{}/{n}", info.name), |b| {
                b.iter(|| s.pick(black_box(&req), black_box(&cands), now))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_picks);
criterion_main!(benches);
