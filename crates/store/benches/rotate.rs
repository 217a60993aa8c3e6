//! Cost of the shared rotation per pick on loopback: one script call per lease of 1, 8 and
//! 64 positions (the figure per pick is the time per call divided by the lease), a `PING`
//! round trip for comparison, and 8 routes advanced in one pipeline. Starts its own
//! redis-server; says so and measures nothing when there is none.
//!
//!     cargo bench -p rolter-store --bench rotate

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rolter_store::testing::RedisServer;
use rolter_store::{RotateAsk, Store};

const MEMBERS: [(&str, f64); 4] = [("e0", 1.0), ("e1", 2.0), ("e2", 3.0), ("e3", 4.0)];

fn bench_rotate(c: &mut Criterion) {
    if !RedisServer::available() {
        eprintln!("redis-server is not installed (apt-get install redis-server): skipping");
        return;
    }
    let server = RedisServer::start();
    let mut store = Store::connect(&server.settings("bench")).expect("connect");

    let mut g = c.benchmark_group("store");
    g.bench_function("ping", |b| b.iter(|| store.ping().unwrap()));
    for lease in [1u32, 8, 64] {
        g.throughput(Throughput::Elements(u64::from(lease)));
        g.bench_function(format!("rotate_lease_{lease}"), |b| {
            b.iter(|| black_box(store.rotate("r", &MEMBERS, lease).unwrap()))
        });
    }
    let routes: Vec<String> = (0..8).map(|i| format!("route{i}")).collect();
    let asks: Vec<RotateAsk<'_>> = routes
        .iter()
        .map(|route| RotateAsk {
            route,
            members: &MEMBERS,
            lease: 1,
        })
        .collect();
    g.throughput(Throughput::Elements(asks.len() as u64));
    g.bench_function("rotate_many_8_routes_lease_1", |b| {
        b.iter(|| black_box(store.rotate_many(&asks).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench_rotate);
criterion_main!(benches);
