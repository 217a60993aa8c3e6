//! Pick cost of each strategy with 4, 16 and 64 candidates.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use rolter::config::{Price, StrategySpec, Target};
use rolter::pricing::PriceBook;
use rolter::strategy::registry::{self, BuildContext};
use rolter::strategy::{AsyncInputs, Candidate, PickRequest, Sample, Switches};

/// `n` targets from a parsed configuration, weights 1..3 and tiers 0..1.
fn bench_targets(n: usize) -> Vec<Target> {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "[[targets]]\nname = \"t{i}\"\nurl = \"http://127.0.0.1:{}\"\nweight = {}\n\n",
            9000 + i,
            1 + i % 3
        ));
    }
    text.push_str("[[routes]]\nname = \"r\"\ntargets = [");
    text.push_str(
        &(0..n)
            .map(|i| format!("\"t{i}\""))
            .collect::<Vec<_>>()
            .join(","),
    );
    text.push_str("]\n[routes.strategy]\nname = \"round_robin\"\n");
    rolter::config::load_str(&text, "bench.toml")
        .expect("bench config")
        .targets
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
            let cands: Vec<Candidate> = (0..n)
                .map(|i| Candidate {
                    target: i,
                    weight: 1.0 + (i % 3) as f64,
                    load: (i * 7 % 11) as u64,
                    tier: 0,
                    ..Candidate::default()
                })
                .collect();
            let spec = StrategySpec {
                name: info.name,
                options: toml::Table::new(),
            };
            let targets = bench_targets(n);
            let route_targets: Vec<usize> = (0..n).collect();
            let prices = PriceBook::fixed(
                &(0..n)
                    .map(|i| {
                        Some(Price {
                            input_per_mtok: 0.1 + (i % 5) as f64 * 0.2,
                            output_per_mtok: 0.4 + (i % 5) as f64 * 0.8,
                        })
                    })
                    .collect::<Vec<_>>(),
            );
            let switches = Arc::new(Switches::default());
            let mut s = registry::build(
                &spec,
                &BuildContext {
                    target_count: n,
                    seed: 1,
                    targets: &targets,
                    route_targets: &route_targets,
                    prices: &prices,
                    switches: &switches,
                },
            );
            // Learning strategies pick from a trained state: every target has samples.
            for round in 0..16u64 {
                for t in 0..n {
                    s.observe(&Sample {
                        target: t,
                        status: 200,
                        success: true,
                        ttft: Some(Duration::from_millis(20 + (t as u64 * 13 + round) % 50)),
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

criterion_group!(benches, bench_picks);
criterion_main!(benches);
