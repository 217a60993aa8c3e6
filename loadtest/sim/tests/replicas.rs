//! Gateway replicas sharing routing state through the simulated store: on the multi-turn
//! workload, with requests spread at random over three replicas, `cache_aware`'s engine
//! prefix-cache hit rate stays near one replica's when the replicas share their session
//! pins and prefix insertions, and falls clearly below it when they share nothing; on RAG,
//! `pipeline` needs the replicas' load shared as well.
//!
//! Every figure is a simulated count (hit tokens ÷ prompt tokens) for fixed seeds; nothing
//! here reads the wall clock.

use std::time::Duration;

use rolter_sim::sim::{run, strategy_policy, Policy, RunResult, SimConfig};
use rolter_sim::store::Share;
use rolter_sim::workload::{generate, Kind, Sizes, Workload};
use rolter_sim::{fleet_for, FleetDefaults};

fn policy(name: &str) -> Policy {
    strategy_policy(name, toml::Table::new())
        .expect("default options are valid")
        .expect("strategy is registered")
}

fn workload(seed: u64) -> Workload {
    let sizes = Sizes {
        scale: 0.3,
        ..Sizes::full()
    };
    generate(Kind::MultiTurn, &sizes, seed)
}

fn cache_aware(w: &Workload, seed: u64, replicas: usize, share: Share, delay_ms: u64) -> RunResult {
    let cfg = SimConfig {
        replicas,
        share,
        store_delay: Duration::from_millis(delay_ms),
        seed,
        ..SimConfig::default()
    };
    run(
        w,
        &fleet_for(w, &FleetDefaults::default()),
        &policy("cache_aware"),
        &cfg,
    )
}

#[test]
fn shared_pins_and_prefixes_keep_three_replicas_near_one() {
    for seed in [1, 2] {
        let w = workload(seed);
        let one = cache_aware(&w, seed, 1, Share::NONE, 0);
        let alone = cache_aware(&w, seed, 3, Share::NONE, 0);
        let shared = cache_aware(&w, seed, 3, Share::ALL, 5);
        for r in [&one, &alone, &shared] {
            assert_eq!(r.requests as usize, w.requests(), "seed {seed}");
            assert_eq!(r.rejected, 0, "seed {seed}");
        }
        assert_eq!(one.store_items, None);
        assert_eq!(
            alone.store_items,
            Some(0),
            "nothing crosses without sharing"
        );
        // Every routed request shares a prefix and a session pin.
        assert_eq!(shared.store_items, Some(2 * w.requests() as u64));
        assert!(
            shared.hit_rate >= one.hit_rate - 0.03,
            "seed {seed}: 3 replicas sharing {:.3} vs 1 replica {:.3}",
            shared.hit_rate,
            one.hit_rate
        );
        assert!(
            shared.hit_rate >= alone.hit_rate + 0.10,
            "seed {seed}: 3 replicas sharing {:.3} vs sharing nothing {:.3}",
            shared.hit_rate,
            alone.hit_rate
        );
        // Replicas that share nothing scatter conversations over the engines.
        let sticky = |r: &RunResult| r.sticky_sessions.expect("multi-turn sessions");
        assert!(sticky(&alone) < 0.5, "seed {seed}: {}", sticky(&alone));
        assert!(sticky(&shared) >= 0.95, "seed {seed}: {}", sticky(&shared));
    }
}

#[test]
fn either_kind_of_shared_state_alone_recovers_most_of_the_gain() {
    let w = workload(1);
    let alone = cache_aware(&w, 1, 3, Share::NONE, 0);
    let all = cache_aware(&w, 1, 3, Share::ALL, 5);
    for kind in ["sessions", "prefixes"] {
        let r = cache_aware(&w, 1, 3, Share::parse(kind).unwrap(), 5);
        assert_eq!(r.store_items, Some(w.requests() as u64), "{kind}");
        assert!(
            r.hit_rate > alone.hit_rate + 0.5 * (all.hit_rate - alone.hit_rate),
            "{kind}: {:.3}, none {:.3}, all {:.3}",
            r.hit_rate,
            alone.hit_rate,
            all.hit_rate
        );
    }
}

#[test]
fn with_no_delay_replicas_sharing_everything_route_like_one_gateway_of_their_cores() {
    // Three replicas of one core each, the store instant, against one replica of three
    // cores: the same items reach the same instances at the same ticks; only the load view
    // (a replica's own requests, not its neighbours') and the samples (not shared) differ.
    let w = workload(3);
    let cores = |replicas, cores| SimConfig {
        replicas,
        cores,
        share: Share::ALL,
        seed: 3,
        ..SimConfig::default()
    };
    let fleet = fleet_for(&w, &FleetDefaults::default());
    let one = run(&w, &fleet, &policy("cache_aware"), &cores(1, 3));
    let three = run(&w, &fleet, &policy("cache_aware"), &cores(3, 1));
    assert!(
        (one.hit_rate - three.hit_rate).abs() <= 0.02,
        "1×3 cores {:.3}, 3×1 {:.3}",
        one.hit_rate,
        three.hit_rate
    );
}

#[test]
fn pipeline_on_rag_needs_the_fleets_load_as_well() {
    // `pipeline` scores load relative to the largest load among the candidates: a replica
    // that sees only its own third of the requests in flight finds large relative
    // differences in small counts, and load outweighs the shared prefixes. With every
    // replica's load shared too, it routes as one gateway does.
    for seed in [1, 2] {
        let w = generate(
            Kind::Rag,
            &Sizes {
                scale: 0.5,
                ..Sizes::full()
            },
            seed,
        );
        let fleet = fleet_for(&w, &FleetDefaults::default());
        let pipeline = policy("pipeline");
        let cfg = |replicas, share| SimConfig {
            replicas,
            share,
            store_delay: Duration::from_millis(5),
            seed,
            ..SimConfig::default()
        };
        let one = run(&w, &fleet, &pipeline, &cfg(1, Share::NONE));
        let items = Share::parse("sessions,prefixes").unwrap();
        let without_load = run(&w, &fleet, &pipeline, &cfg(3, items));
        let with_load = run(&w, &fleet, &pipeline, &cfg(3, Share::ALL));
        assert!(
            with_load.hit_rate >= one.hit_rate - 0.05,
            "seed {seed}: sharing load {:.3} vs 1 replica {:.3}",
            with_load.hit_rate,
            one.hit_rate
        );
        assert!(
            with_load.hit_rate >= without_load.hit_rate + 0.2,
            "seed {seed}: sharing load {:.3} vs prefixes only {:.3}",
            with_load.hit_rate,
            without_load.hit_rate
        );
    }
}
