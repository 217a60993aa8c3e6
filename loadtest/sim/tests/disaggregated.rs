//! The disaggregated prefill/decode model (`rolter_sim::pd`): every request is prefilled
//! on a prefill engine, its KV transfer counted, then decoded on a decode engine; on
//! multi-turn chat without `x-session-id`, a P/D route with `prefill = cache_aware` keeps
//! the prefill pool's hit rate within 2 points of a co-located `cache_aware` route over
//! the same (prefill) engines; and the model shows the interference P/D removes.
//!
//! Every figure is a simulated count or simulated duration for fixed seeds; nothing here
//! reads the wall clock.

use std::time::Duration;

use rolter_sim::pd::cli::spec;
use rolter_sim::pd::node::{NodeParams, Role};
use rolter_sim::pd::shapes::Shape;
use rolter_sim::pd::{run, PdParams, PdRun, Pool, Protocol, Setup, Slo, Transfer};
use rolter_sim::workload::Workload;

fn params(seed: u64) -> PdParams {
    PdParams {
        node: NodeParams {
            max_running: 64,
            cache_blocks: 16000,
            kv_blocks: 24000,
            prefill_base: Duration::from_millis(10),
            prefill_per_token: Duration::from_micros(50),
            itl: Duration::from_millis(10),
            itl_per_seq: Duration::from_micros(100),
        },
        transfer: Transfer {
            latency: Duration::from_millis(2),
            tokens_per_s: 200_000.0,
        },
        slo: Slo {
            ttft: Duration::from_secs(2),
            tpot: Duration::from_millis(25),
        },
        seed,
    }
}

fn pool(engines: usize, strategy: &str) -> Pool {
    Pool {
        engines,
        strategy: spec(strategy, &[]).expect("registered strategy"),
    }
}

fn pd(p: usize, d: usize, prefill: &str, protocol: Protocol) -> Setup {
    Setup::Disaggregated {
        prefill: pool(p, prefill),
        decode: pool(d, "least_loaded"),
        protocol,
    }
}

/// Multi-turn chat without `x-session-id`, at 0.3 of its rate: the prefill pool of two
/// engines is not saturated.
fn chat(seed: u64) -> Workload {
    let w = Shape::Chat.generate(0.2, 0.3, seed, false);
    assert!(!w.kind.header());
    w
}

fn check_pd_traces(w: &Workload, r: &PdRun, p: &PdParams) {
    assert_eq!(r.traces.len(), w.requests());
    assert_eq!(r.result.requests as usize, w.requests());
    assert_eq!(r.result.rejected, 0);
    for t in &r.traces {
        assert_eq!(r.roles[t.prefill_engine], Role::Prefill, "{t:?}");
        assert_eq!(r.roles[t.decode_engine], Role::Decode, "{t:?}");
        assert!(t.sent <= t.prefill_start && t.prefill_start < t.prefill_end);
        assert_eq!(t.transfer, p.transfer.time(t.prompt_tokens));
        assert!(t.transfer > p.transfer.latency);
        // The first token comes from the first decode step after the transfer.
        assert!(
            t.first_token >= t.prefill_end + t.transfer + p.node.itl,
            "{t:?}"
        );
        assert!(t.finished >= t.first_token + p.node.itl * (t.output_tokens - 1));
        assert!(t.hit_tokens <= t.prompt_tokens);
    }
    let sum = |v: &[u64]| v.iter().sum::<u64>() as usize;
    assert_eq!(sum(&r.result.prefill_per_target), w.requests());
    assert_eq!(sum(&r.result.decode_per_target), w.requests());
}

#[test]
fn every_request_is_prefilled_then_transferred_then_decoded() {
    let w = chat(1);
    let p = params(1);
    for protocol in [Protocol::Vllm, Protocol::Sglang] {
        let r = run(&w, &pd(2, 2, "cache_aware", protocol), &p);
        check_pd_traces(&w, &r, &p);
        assert_eq!(r.result.prefill_per_target.len(), 2);
        assert_eq!(r.result.decode_per_target.len(), 2);
        assert!(r.result.transfer_mean_ms > 2.0);
    }
    let r = run(&w, &pd(1, 3, "cache_aware", Protocol::Vllm), &p);
    check_pd_traces(&w, &r, &p);
    assert_eq!(r.result.decode_per_target.len(), 3);
}

#[test]
fn colocated_engines_prefill_and_decode_their_own_requests() {
    let w = chat(1);
    let p = params(1);
    let r = run(&w, &Setup::Colocated(pool(4, "cache_aware")), &p);
    assert_eq!(r.traces.len(), w.requests());
    for t in &r.traces {
        assert_eq!(r.roles[t.prefill_engine], Role::Colocated);
        assert_eq!(t.decode_engine, t.prefill_engine);
        assert_eq!(t.transfer, Duration::ZERO);
        // The prefill produces the first token.
        assert_eq!(t.first_token, t.prefill_end);
    }
    assert!(r.result.decode_per_target.is_empty());
}

#[test]
fn prefill_pool_hit_rate_stays_within_two_points_of_colocated() {
    for seed in [1, 2, 3] {
        let w = chat(seed);
        let p = params(seed);
        let split = run(&w, &pd(2, 2, "cache_aware", Protocol::Vllm), &p).result;
        let same = run(&w, &Setup::Colocated(pool(2, "cache_aware")), &p).result;
        let scattered = run(&w, &pd(2, 2, "round_robin", Protocol::Vllm), &p).result;
        assert!(
            (split.hit_rate - same.hit_rate).abs() <= 0.02,
            "seed {seed}: P/D prefill pool {:.3} vs co-located on the same 2 engines {:.3}",
            split.hit_rate,
            same.hit_rate
        );
        assert!(split.hit_rate > 0.7, "seed {seed}: {:.3}", split.hit_rate);
        // The prefill pool's strategy decides it: scattering turns loses the affinity.
        assert!(
            split.hit_rate > scattered.hit_rate + 0.15,
            "seed {seed}: cache_aware {:.3} vs round_robin {:.3}",
            split.hit_rate,
            scattered.hit_rate
        );
    }
}

#[test]
fn with_small_caches_the_prefill_pool_keeps_at_least_colocated_hits() {
    // A tenth of the default prefix cache, at half the load above: evictions decide.
    for seed in [1, 2, 3] {
        let w = Shape::Chat.generate(0.2, 0.15, seed, false);
        let p = PdParams {
            node: NodeParams {
                cache_blocks: 1500,
                ..params(seed).node
            },
            ..params(seed)
        };
        let split = run(&w, &pd(2, 2, "cache_aware", Protocol::Vllm), &p).result;
        let same = run(&w, &Setup::Colocated(pool(2, "cache_aware")), &p).result;
        assert!(
            split.hit_rate < 0.5,
            "seed {seed}: the caches are too small to hold it all"
        );
        assert!(
            split.hit_rate >= same.hit_rate - 0.02,
            "seed {seed}: P/D prefill pool {:.3} vs co-located on the same 2 engines {:.3}",
            split.hit_rate,
            same.hit_rate
        );
    }
}

#[test]
fn long_prompts_stall_colocated_decodes_and_long_outputs_favour_colocated() {
    let p = params(1);
    // Long prompts near the co-located fleet's capacity: its prefills stall its decodes.
    let w = Shape::LongPrompt.generate(0.1, 1.0, 1, false);
    let split = run(&w, &pd(3, 1, "cache_aware", Protocol::Vllm), &p).result;
    let colo = run(&w, &Setup::Colocated(pool(4, "cache_aware")), &p).result;
    assert!(
        split.tpot_p99_ms < colo.tpot_p99_ms * 0.8,
        "TPOT p99: P/D {:.1} ms, co-located {:.1} ms",
        split.tpot_p99_ms,
        colo.tpot_p99_ms
    );
    assert!(
        split.ttft_p50_ms > colo.ttft_p50_ms,
        "the transfer adds to TTFT"
    );
    // Short prompts, long outputs: two decode engines of four cannot keep up.
    let w = Shape::LongOutput.generate(0.1, 1.0, 1, false);
    let split = run(&w, &pd(2, 2, "cache_aware", Protocol::Vllm), &p).result;
    let colo = run(&w, &Setup::Colocated(pool(4, "cache_aware")), &p).result;
    assert!(
        colo.goodput_per_s > split.goodput_per_s * 1.2,
        "goodput: co-located {:.2}/s, P/D {:.2}/s",
        colo.goodput_per_s,
        split.goodput_per_s
    );
}

#[test]
fn precise_cache_aware_reads_the_prefill_engines_kv_events() {
    let options = rolter_sim::parse_options(&["precise_cache_aware.min_blocks=32".into()])
        .expect("valid option");
    let precise = |engines| Pool {
        engines,
        strategy: spec("precise_cache_aware", &options).expect("registered strategy"),
    };
    let w = chat(1);
    let p = params(1);
    let split = Setup::Disaggregated {
        prefill: precise(2),
        decode: pool(2, "least_loaded"),
        protocol: Protocol::Vllm,
    };
    let split = run(&w, &split, &p);
    check_pd_traces(&w, &split, &p);
    let same = run(&w, &Setup::Colocated(precise(2)), &p).result;
    // Without the events every pick would fall back to the least loaded.
    assert_eq!(split.result.fallbacks, 0);
    assert!(split.result.hit_rate > 0.7, "{:.3}", split.result.hit_rate);
    assert!(
        (split.result.hit_rate - same.hit_rate).abs() <= 0.02,
        "P/D prefill pool {:.3} vs co-located on the same 2 engines {:.3}",
        split.result.hit_rate,
        same.hit_rate
    );
}
