use super::*;
use crate::testing;
use crate::testing::{cands, context, req, sample};
use rolter_core::Price;
use rolter_core::{AsyncInputs, SessionKey};

fn pipeline(n: usize, opts: Options) -> Pipeline {
    Pipeline::new(opts, &context(&vec![1.0; n], &[]))
}

/// Only `scorer` on, with weight 1.
fn only(scorer: Scorer) -> Options {
    Options::default().with_all(0.0).with(scorer, 1.0)
}

/// The values one scorer gives every candidate.
fn values(p: &Pipeline, scorer: Scorer, r: &PickRequest<'_>, c: &[Candidate]) -> Vec<f64> {
    let kept: Vec<usize> = (0..c.len()).collect();
    let mut out = Vec::new();
    scorer.score(&p.sig, r, c, &kept, &mut out);
    out
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
}

fn with_prompt(prompt: &'static [u8]) -> PickRequest<'static> {
    PickRequest {
        prompt,
        session: SessionKey {
            header: None,
            prompt,
        },
        ..req()
    }
}

fn with_session(id: &'static [u8], prompt: &'static [u8]) -> PickRequest<'static> {
    PickRequest {
        prompt,
        session: SessionKey {
            header: Some(id),
            prompt,
        },
        ..req()
    }
}

fn counts(p: &mut Pipeline, r: &PickRequest<'_>, c: &[Candidate], n: usize) -> Vec<u32> {
    let now = Instant::now();
    let mut counts = vec![0u32; c.len()];
    for _ in 0..n {
        counts[p.pick(r, c, now).unwrap().index] += 1;
    }
    counts
}

#[test]
fn weight_load_and_queue_scorers_normalise() {
    let p = pipeline(3, Options::default());
    let c = cands(&[(1.0, 0), (2.0, 5), (4.0, 10)]);
    let r = req();
    assert!(close(
        &values(&p, Scorer::Weight, &r, &c),
        &[0.25, 0.5, 1.0]
    ));
    assert!(close(&values(&p, Scorer::Load, &r, &c), &[1.0, 0.5, 0.0]));
    let idle = cands(&[(1.0, 0), (1.0, 0)]);
    assert!(close(&values(&p, Scorer::Load, &r, &idle), &[1.0, 1.0]));
    assert!(close(&values(&p, Scorer::Queue, &r, &idle), &[1.0, 1.0]));
    let mut q = c.clone();
    for (c, d) in q.iter_mut().zip([0, 3, 6]) {
        c.queue_depth = d;
    }
    assert!(close(&values(&p, Scorer::Queue, &r, &q), &[1.0, 0.5, 0.0]));
}

#[test]
fn lora_scorer_is_the_residency_ladder() {
    let known = Residency::ADAPTER
        .union(Residency::SLOTS_KNOWN)
        .union(Residency::LISTED);
    let p = pipeline(5, Options::default().with(Scorer::Lora, 1.0));
    assert!(p.needs().contains(Needs::LORA_RESIDENCY));
    assert!(!pipeline(2, Options::default())
        .needs()
        .contains(Needs::LORA_RESIDENCY));
    let mut c = cands(&[(1.0, 0); 5]);
    c[0].lora = known.union(Residency::RUNNING).union(Residency::LOADED);
    c[1].lora = known.union(Residency::FREE_SLOT).union(Residency::LOADED);
    c[2].lora = known.union(Residency::WAITING);
    c[3].lora = known;
    c[4].lora = Residency::ADAPTER;
    assert!(close(
        &values(&p, Scorer::Lora, &req(), &c),
        &[1.0, 0.8, 0.6, 0.0, 0.0]
    ));
    // A base model (no candidate knows it as an adapter): neutral.
    for c in &mut c {
        c.lora = Residency::SLOTS_KNOWN;
    }
    assert!(close(&values(&p, Scorer::Lora, &req(), &c), &[1.0; 5]));
    // Combined with load: residency outweighs a small load difference.
    let mut p = pipeline(2, only(Scorer::Lora).with(Scorer::Load, 0.5));
    let mut c = cands(&[(1.0, 1), (1.0, 2)]);
    c[0].lora = known.union(Residency::WAITING);
    c[1].lora = known.union(Residency::RUNNING);
    assert_eq!(counts(&mut p, &req(), &c, 50), [0, 50]);
}

#[test]
fn kv_cache_scorer_normalises_unknown_to_half() {
    let p = pipeline(3, Options::default());
    let mut c = cands(&[(1.0, 0); 3]);
    c[0].kv_usage = Some(0.25);
    c[2].kv_usage = Some(1.0);
    assert!(close(
        &values(&p, Scorer::KvCache, &req(), &c),
        &[0.75, 0.5, 0.0]
    ));
}

#[test]
fn prefix_scorer_is_the_held_share_of_the_prompt() {
    let mut p = pipeline(3, Options::default());
    let now = Instant::now();
    // The index matches in 64-byte chunks: prompts of four chunks, two shared.
    let full: &'static [u8] = Box::leak([b'a'; 256].to_vec().into_boxed_slice());
    let mut half = [b'a'; 256];
    half[128..].fill(b'X');
    p.sig.index.insert(0, full, now);
    p.sig.index.insert(1, &half, now);
    let c = cands(&[(1.0, 0); 3]);
    assert!(close(
        &values(&p, Scorer::Prefix, &with_prompt(full), &c),
        &[1.0, 0.5, 0.0]
    ));
    assert!(close(
        &values(&p, Scorer::Prefix, &with_prompt(b""), &c),
        &[0.0, 0.0, 0.0]
    ));
}

#[test]
fn latency_scorer_is_min_over_own_with_unmeasured_at_one() {
    let mut p = pipeline(3, only(Scorer::Latency));
    p.observe(&sample(0, 100, 0, 10));
    p.observe(&sample(1, 200, 0, 10));
    let c = cands(&[(1.0, 0); 3]);
    assert!(close(
        &values(&p, Scorer::Latency, &req(), &c),
        &[1.0, 0.5, 1.0]
    ));
    // Measured targets compete; the unmeasured one is tried as if fastest.
    assert_ne!(p.pick(&req(), &c, Instant::now()).unwrap().index, 1);
    let learned = p.learned(1);
    assert!(
        learned
            .iter()
            .any(|&(k, v)| k == "ttft_ewma_ms" && (v - 200.0).abs() < 1e-6),
        "{learned:?}"
    );
}

#[test]
fn cost_scorer_is_cheapest_over_own_with_unknown_at_zero() {
    let price = |i: f64, o: f64| {
        Some(Price {
            input_per_mtok: i,
            output_per_mtok: o,
        })
    };
    let ctx = context(&[1.0; 3], &[price(1.0, 2.0), price(2.0, 4.0), None]);
    let p = Pipeline::new(only(Scorer::Cost), &ctx);
    let r = PickRequest {
        prompt_tokens: 1000,
        max_tokens: Some(500),
        ..req()
    };
    // 0.002, 0.004, unknown.
    let c = cands(&[(1.0, 0); 3]);
    assert!(close(&values(&p, Scorer::Cost, &r, &c), &[1.0, 0.5, 0.0]));
}

#[test]
fn weights_combine() {
    let c = cands(&[(4.0, 10), (1.0, 0)]);
    // weight 1 / 0.25, load 0 / 1.
    let mut p = pipeline(2, only(Scorer::Load).with(Scorer::Weight, 2.0));
    let pick = p.pick(&req(), &c, Instant::now()).unwrap();
    assert_eq!((pick.index, pick.score), (0, Some(2.0)));
    let mut p = pipeline(2, only(Scorer::Load).with(Scorer::Weight, 1.0));
    let pick = p.pick(&req(), &c, Instant::now()).unwrap();
    assert_eq!((pick.index, pick.score), (1, Some(1.25)));
}

#[test]
fn ties_are_broken_uniformly() {
    let c = cands(&[(1.0, 2), (1.0, 2), (1.0, 7), (1.0, 2)]);
    let mut p = pipeline(4, Options::default());
    let n = counts(&mut p, &req(), &c, 30_000);
    assert_eq!(n[2], 0);
    for i in [0, 1, 3] {
        assert!((9_300..=10_700).contains(&n[i]), "{n:?}");
    }
    // Every weight at 0: everything ties.
    let mut p = pipeline(4, Options::default().with_all(0.0));
    let n = counts(&mut p, &req(), &c, 40_000);
    for &k in &n {
        assert!((9_300..=10_700).contains(&k), "{n:?}");
    }
}

#[test]
fn one_and_many_candidates() {
    let mut p = pipeline(5, Options::default());
    let now = Instant::now();
    let one = cands(&[(1.0, 99)]);
    assert_eq!(p.pick(&req(), &one, now).unwrap().index, 0);
    let many = cands(&[(1.0, 4), (1.0, 3), (1.0, 1), (1.0, 8), (1.0, 6)]);
    for _ in 0..50 {
        assert_eq!(p.pick(&req(), &many, now).unwrap().index, 2);
    }
    // A candidate removed mid-stream: the next best of the rest.
    assert_eq!(p.pick(&req(), &[many[0], many[1]], now).unwrap().index, 1);
}

#[test]
fn max_queue_drops_long_queues_unless_all_are_long() {
    let opts = Options {
        max_queue: Some(4),
        ..Options::default()
    };
    let mut p = pipeline(3, opts);
    let now = Instant::now();
    let mut c = cands(&[(1.0, 0), (1.0, 6), (1.0, 0)]);
    for (c, d) in c.iter_mut().zip([5, 1, 9]) {
        c.queue_depth = d;
    }
    for _ in 0..50 {
        assert_eq!(p.pick(&req(), &c, now), Some(Pick::at(1)));
    }
    for c in c.iter_mut() {
        c.queue_depth = 10;
    }
    let pick = p.pick(&req(), &c, now).unwrap();
    assert_ne!(pick.index, 1, "load decides among all");
    assert_eq!(pick.fallback, Some("queue_limit"));
}

#[test]
fn session_sticks_within_ttl_only_while_a_candidate() {
    let opts = Options {
        session_ttl: Duration::from_secs(60),
        ..Options::default()
    };
    let mut p = pipeline(3, opts);
    let mut sink = ShareSink::default();
    let t0 = Instant::now();
    let r = with_session(b"user-7", b"");
    // Target 2 is the busiest; the session was served there.
    let c = cands(&[(1.0, 1), (1.0, 0), (1.0, 5)]);
    p.routed(&r, 2, &mut sink, t0);
    let within = t0 + Duration::from_secs(59);
    assert_eq!(p.pick(&r, &c, within).unwrap().index, 2);
    // Other sessions and implicit sessions score normally.
    assert_eq!(
        p.pick(&with_session(b"user-8", b""), &c, within)
            .unwrap()
            .index,
        1
    );
    assert_eq!(p.pick(&req(), &c, within).unwrap().index, 1);
    // Not a candidate any more.
    assert_eq!(p.pick(&r, &c[..2], within).unwrap().index, 1);
    // After the TTL.
    let after = t0 + Duration::from_secs(61);
    assert_eq!(p.pick(&r, &c, after).unwrap().index, 1);
}

#[test]
fn session_map_is_bounded_oldest_first() {
    let opts = Options {
        pins: PinsAndSharing {
            max_sessions: 2,
            ..PinsAndSharing::default()
        },
        ..Options::default()
    };
    let mut p = pipeline(3, opts);
    let mut sink = ShareSink::default();
    let t0 = Instant::now();
    let c = cands(&[(1.0, 0), (1.0, 0), (1.0, 9)]);
    for (i, id) in [b"a", b"b", b"a", b"c"].into_iter().enumerate() {
        let t = t0 + Duration::from_secs(i as u64);
        p.routed(&with_session(id, b""), 2, &mut sink, t);
    }
    assert_eq!(p.sessions(), 2);
    let now = t0 + Duration::from_secs(5);
    // "b" was least recently used and is gone; "a" and "c" stay pinned.
    assert_ne!(p.pick(&with_session(b"b", b""), &c, now).unwrap().index, 2);
    assert_eq!(p.pick(&with_session(b"a", b""), &c, now).unwrap().index, 2);
    assert_eq!(p.pick(&with_session(b"c", b""), &c, now).unwrap().index, 2);
    // Refreshing one session many times keeps memory bounded.
    for i in 0..10_000u64 {
        p.routed(
            &with_session(b"a", b""),
            2,
            &mut sink,
            now + Duration::from_millis(i),
        );
    }
    assert!(p.sessions.storage() <= 2, "slots stay within max_sessions");
}

#[test]
fn prefix_sends_shared_prefix_requests_to_the_warm_target() {
    let mut p = pipeline(3, Options::default());
    let mut sink = ShareSink::default();
    let now = Instant::now();
    let conversation = |question: &str| -> &'static [u8] {
        let system =
            "You answer billing questions for the finance team, in two sentences. ".repeat(6);
        let text = format!(
            "[{{\"role\":\"system\",\"content\":\"{system}\"}},{{\"role\":\"user\",\"content\":\"{question}\"}}]"
        );
        Box::leak(text.into_bytes().into_boxed_slice())
    };
    let system = conversation("first question");
    p.routed(&with_prompt(system), 2, &mut sink, now);
    assert!(p.learned(2)[0].1 > 0.0);
    assert_eq!(p.learned(0), vec![("prefix_bytes_held", 0.0)]);
    let follow = conversation("second one");
    // Target 2 is a little busier; its warm prefix outweighs that.
    let c = cands(&[(1.0, 1), (1.0, 1), (1.0, 2)]);
    for _ in 0..20 {
        assert_eq!(p.pick(&with_prompt(follow), &c, now).unwrap().index, 2);
    }
    // A prompt with nothing in common goes by load.
    let other = with_prompt(b"{\"prompt\":\"unrelated\"}");
    assert_ne!(p.pick(&other, &c, now).unwrap().index, 2);
    assert_eq!(p.needs(), Needs::CANONICAL_PROMPT);
    assert_eq!(pipeline(2, only(Scorer::Load)).needs(), Needs::NONE);
}

#[test]
fn two_instances_converge_through_shared_items() {
    let mut a = pipeline(3, Options::default());
    let mut b = pipeline(3, Options::default());
    let mut sink = ShareSink::default();
    let now = Instant::now();
    let prompt: &'static [u8] = b"[{\"role\":\"user\",\"content\":\"a long shared context\"}]";
    a.routed(&with_session(b"s1", prompt), 1, &mut sink, now);
    let batch = sink.take_batch();
    assert_eq!(batch.len(), 2);
    assert!(sink.is_empty());
    for (_, item) in batch.iter() {
        b.apply_shared(&item, now);
    }
    let c = cands(&[(1.0, 0), (1.0, 3), (1.0, 0)]);
    let later = now + Duration::from_secs(1);
    // The session pin reached b.
    assert_eq!(
        b.pick(&with_session(b"s1", b"x"), &c, later).unwrap().index,
        1
    );
    // So did the prefix: b sends the same prompt where a warmed it.
    assert_eq!(b.learned(1), a.learned(1));
    let idle = cands(&[(1.0, 1), (1.0, 1), (1.0, 1)]);
    assert_eq!(b.pick(&with_prompt(prompt), &idle, later).unwrap().index, 1);
    assert_eq!(a.pick(&with_prompt(prompt), &idle, later).unwrap().index, 1);
}

#[test]
fn a_pick_says_when_another_replicas_pin_prefix_or_load_decided_it() {
    // The basis is worked out on routes that share with the other replicas.
    let sharing = |mut o: Options| {
        o.pins.share_sessions = true;
        o.pins.share_prefixes = true;
        o.fleet_load = true;
        o
    };
    let mut a = pipeline(3, sharing(Options::default()));
    let mut b = pipeline(3, sharing(Options::default()));
    let mut sink = ShareSink::default();
    let now = Instant::now();
    let prompt: &'static [u8] =
        b"[{\"role\":\"user\",\"content\":\"a long shared context about the fleet's sizing and more\"}]";
    a.routed(&with_session(b"s1", prompt), 1, &mut sink, now);
    for (_, item) in sink.take_batch().iter() {
        b.apply_fleet_shared(&item, now);
    }
    let idle = cands(&[(1.0, 1), (1.0, 1), (1.0, 1)]);
    assert_eq!(
        b.pick(&with_session(b"s1", b"x"), &idle, now)
            .unwrap()
            .index,
        1
    );
    assert_eq!(b.basis(), Basis::SharedPin);
    assert_eq!(b.pick(&with_prompt(prompt), &idle, now).unwrap().index, 1);
    assert_eq!(b.basis(), Basis::SharedPrefix);
    // a routed it itself: the same pick is its own.
    assert_eq!(a.pick(&with_prompt(prompt), &idle, now).unwrap().index, 1);
    assert_eq!(a.basis(), Basis::Local);

    // Load alone: target 0 is idle here but busy on the other replicas.
    let mut p = pipeline(3, sharing(only(Scorer::Load)));
    let mut c = cands(&[(1.0, 3), (1.0, 2), (1.0, 2)]);
    c[0].fleet_load = 3;
    let picked = p.pick(&req(), &c, now).unwrap().index;
    assert_ne!(picked, 0);
    assert_eq!(p.basis(), Basis::SharedLoad, "own loads 0, 2, 2 pick 0");
    // The fleet's load agrees with this replica's own (loads 3, 1, 2; own 3, 1, 1): the
    // pick is its own.
    let mut c = cands(&[(1.0, 3), (1.0, 1), (1.0, 2)]);
    c[2].fleet_load = 1;
    assert_eq!(p.pick(&req(), &c, now).unwrap().index, 1);
    assert_eq!(p.basis(), Basis::Local);
    // A route that shares nothing does not work it out.
    let mut q = pipeline(3, only(Scorer::Load));
    let mut c = cands(&[(1.0, 3), (1.0, 2), (1.0, 2)]);
    c[0].fleet_load = 3;
    q.pick(&req(), &c, now).unwrap();
    assert_eq!(q.basis(), Basis::Local);
}

#[test]
fn scratch_does_not_grow_on_picks() {
    let mut p = pipeline(16, Options::default().with(Scorer::KvCache, 1.0));
    let c = cands(&[(1.0, 3); 16]);
    let caps = (p.kept.capacity(), p.values.capacity(), p.totals.capacity());
    let now = Instant::now();
    for _ in 0..100 {
        p.pick(&with_prompt(b"abc"), &c, now);
    }
    assert_eq!(
        caps,
        (p.kept.capacity(), p.values.capacity(), p.totals.capacity())
    );
}

#[test]
fn registry_validates_and_builds_pipeline() {
    let ok: toml::Table = toml::from_str(
        "w_load = 1\nw_prefix = 0.5\nw_weight = 0\nw_latency = 2\nw_cost = 0.1\n\
         w_queue = 1\nw_kv_cache = 1\nmax_queue = 8\nsession_ttl = \"0s\"\n\
         max_sessions = 10\nmax_bytes_per_target = 1024\nhalf_life = \"5s\"\n\
         default_output_tokens = 128",
    )
    .unwrap();
    assert_eq!(testing::validate_spec("pipeline", &ok), Ok("pipeline"));
    let opts = crate::testing::parse_options::<Options>(&ok).unwrap();
    assert_eq!(opts.max_queue, Some(8));
    assert!(opts.session_ttl.is_zero());
    assert_eq!(opts.weight(Scorer::Latency), 2.0);
    for bad in [
        "w_load = -1",
        "max_queue = -1",
        "session_ttl = \"soon\"",
        "max_sessions = 0",
        "w_lora = -1",
    ] {
        let t: toml::Table = toml::from_str(bad).unwrap();
        assert!(testing::validate_spec("pipeline", &t).is_err(), "{bad}");
    }
    let zero: toml::Table = toml::from_str("w_load = 0\nw_prefix = 0").unwrap();
    let errs = testing::validate_spec("pipeline", &zero).unwrap_err();
    assert!(errs[0].1.contains("every scorer weight is 0"), "{errs:?}");
    let one: toml::Table = toml::from_str("w_load = 0\nw_prefix = 0\nw_queue = 0.5").unwrap();
    assert_eq!(testing::validate_spec("pipeline", &one), Ok("pipeline"));
    let ctx = context(&[1.0, 1.0], &[]);
    let spec = testing::raw("pipeline", toml::Table::new());
    let mut s = testing::build(&spec, &ctx);
    let inputs = AsyncInputs::default();
    let r = PickRequest {
        inputs: &inputs,
        ..req()
    };
    let c = cands(&[(1.0, 3), (1.0, 0)]);
    assert_eq!(s.pick(&r, &c, Instant::now()).unwrap().index, 1);
}
