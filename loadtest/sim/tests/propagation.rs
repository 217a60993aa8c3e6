//! How fast the store carries what one gateway replica learned to the others, on the
//! `few-users` workload (six users without `x-session-id`, conversations one after another,
//! the next turn 20–50 ms after the answer, engines with LRU prefix caches that cannot each
//! hold every live conversation, every request to a random one of three replicas).
//!
//! Old propagation: a replica publishes at its next sync tick (100 ms) and the others read at
//! theirs, items and the fleet's load alike. New: items reach the others about 2 ms after the
//! exchange tick that carries them, and the load every exchange tick. `pipeline` with the
//! fleet's load scores load relative to the largest count it sees; with counts of a few
//! requests, a count up to two intervals old outweighs the prefix score and moves
//! conversations, so the old propagation loses points that the new one keeps.
//!
//! Every figure is a simulated count for fixed seeds (deterministic); nothing here reads
//! the wall clock.

use std::time::Duration;

use rolter_sim::sim::{run, strategy_policy, RunResult, SimConfig};
use rolter_sim::store::{Share, SyncPeriods};
use rolter_sim::workload::{generate, Kind, Sizes, Workload};
use rolter_sim::{fleet_for, FleetDefaults};

fn workload(seed: u64) -> Workload {
    generate(Kind::FewUsers, &Sizes::full(), seed)
}

#[derive(Clone, Copy)]
enum Setup {
    OneGateway,
    Alone,
    Old,
    New,
}

fn hit(w: &Workload, strategy: &str, setup: Setup, share: Share, seed: u64) -> RunResult {
    let policy = strategy_policy(strategy, toml::Table::new())
        .expect("default options are valid")
        .expect("strategy is registered");
    let sync = SyncPeriods {
        items: Duration::from_millis(100),
        load: Duration::from_millis(100),
    };
    let (replicas, share, store_delay, sync) = match setup {
        Setup::OneGateway => (1, Share::NONE, Duration::ZERO, SyncPeriods::default()),
        Setup::Alone => (3, Share::NONE, Duration::ZERO, SyncPeriods::default()),
        Setup::Old => (3, share, Duration::from_millis(1), sync),
        Setup::New => (3, share, Duration::from_millis(2), SyncPeriods::default()),
    };
    let cfg = SimConfig {
        replicas,
        share,
        store_delay,
        sync,
        seed,
        ..SimConfig::default()
    };
    let r = run(w, &fleet_for(w, &FleetDefaults::default()), &policy, &cfg);
    assert_eq!(r.requests as usize, w.requests(), "seed {seed}");
    r
}

#[test]
fn the_workload_makes_engines_evict() {
    let w = workload(0);
    assert_eq!((w.sessions.len(), w.requests()), (6, 300));
    let fleet = fleet_for(&w, &FleetDefaults::default());
    // The fleet holds the live conversations, one engine a couple of them.
    assert!(fleet.engine.cache_blocks * fleet.targets < w.footprint_blocks());
    let big = FleetDefaults {
        cache_blocks: Some(100_000),
        ..FleetDefaults::default()
    };
    let policy = strategy_policy("cache_aware", toml::Table::new())
        .unwrap()
        .unwrap();
    let small = run(&w, &fleet, &policy, &SimConfig::default());
    let unbounded = run(&w, &fleet_for(&w, &big), &policy, &SimConfig::default());
    assert!(
        unbounded.hit_rate > small.hit_rate + 0.03,
        "eviction costs hits: {:.3} against {:.3}",
        small.hit_rate,
        unbounded.hit_rate
    );
}

#[test]
fn pipeline_with_fleet_load_reaches_one_gateway_only_with_the_new_propagation() {
    for seed in [0, 1, 2] {
        let w = workload(seed);
        let one = hit(&w, "pipeline", Setup::OneGateway, Share::ALL, seed);
        let alone = hit(&w, "pipeline", Setup::Alone, Share::ALL, seed);
        let old = hit(&w, "pipeline", Setup::Old, Share::ALL, seed);
        let new = hit(&w, "pipeline", Setup::New, Share::ALL, seed);
        let msg = format!(
            "seed {seed}: one gateway {:.3}, alone {:.3}, old {:.3}, new {:.3}",
            one.hit_rate, alone.hit_rate, old.hit_rate, new.hit_rate
        );
        assert!(new.hit_rate >= one.hit_rate - 0.03, "{msg}");
        assert!(new.hit_rate >= alone.hit_rate, "{msg}");
        assert!(old.hit_rate <= one.hit_rate - 0.05, "{msg}");
        assert_eq!(new.store_items, Some(old.store_items.unwrap()), "{msg}");
    }
}

#[test]
fn cache_aware_sharing_prefixes_keeps_one_gateways_hit_rate_with_the_new_propagation() {
    let items = Share::parse("sessions,prefixes").unwrap();
    for seed in [0, 1, 2] {
        let w = workload(seed);
        let one = hit(&w, "cache_aware", Setup::OneGateway, items, seed);
        let alone = hit(&w, "cache_aware", Setup::Alone, items, seed);
        let old = hit(&w, "cache_aware", Setup::Old, items, seed);
        let new = hit(&w, "cache_aware", Setup::New, items, seed);
        let msg = format!(
            "seed {seed}: one gateway {:.3}, alone {:.3}, old {:.3}, new {:.3}",
            one.hit_rate, alone.hit_rate, old.hit_rate, new.hit_rate
        );
        assert!(new.hit_rate >= one.hit_rate - 0.03, "{msg}");
        assert!(new.hit_rate >= old.hit_rate, "{msg}");
        assert!(new.hit_rate >= alone.hit_rate + 0.1, "{msg}");
    }
}
