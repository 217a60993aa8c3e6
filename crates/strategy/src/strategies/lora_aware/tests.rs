use super::*;
use crate::testing::{cands, req};

const R: Residency = Residency::RUNNING;
const W: Residency = Residency::WAITING;
const F: Residency = Residency::FREE_SLOT;
const L: Residency = Residency::LOADED;

/// Candidates with the given loads and residencies (slots and lists known, the model a
/// known adapter).
fn lora_cands(spec: &[(u64, Residency)]) -> Vec<Candidate> {
    let base = Residency::ADAPTER
        .union(Residency::SLOTS_KNOWN)
        .union(Residency::LISTED);
    let loads: Vec<(f64, u64)> = spec.iter().map(|&(l, _)| (1.0, l)).collect();
    let mut c = cands(&loads);
    for (c, &(_, r)) in c.iter_mut().zip(spec) {
        c.lora = if r == Residency::UNKNOWN {
            r
        } else {
            base.union(r)
        };
    }
    c
}

fn adapter_req(model: &'static str) -> PickRequest<'static> {
    PickRequest { model, ..req() }
}

fn strategy() -> LoraAware {
    LoraAware::new(&Options::default(), 8, 7)
}

fn pick(s: &mut LoraAware, c: &[Candidate], now: Instant) -> Pick {
    s.pick(&adapter_req("sql-lora"), c, now).unwrap()
}

#[test]
fn levels_follow_the_ladder() {
    let known = Residency::SLOTS_KNOWN.union(Residency::LISTED);
    assert_eq!(Residency::UNKNOWN.level(), Level::Unknown);
    assert_eq!(Residency::ADAPTER.level(), Level::Unknown);
    assert_eq!(known.union(R).union(L).level(), Level::Running);
    assert_eq!(known.union(F).union(L).level(), Level::FreeSlot);
    assert_eq!(known.union(W).union(L).level(), Level::Waiting);
    assert_eq!(known.union(L).level(), Level::Loaded);
    assert_eq!(known.level(), Level::None);
    // Listed without the adapter: a free slot does not help (the engine answers 404).
    assert_eq!(known.union(F).level(), Level::None);
    // Slots only (no model list): a free slot counts.
    assert_eq!(Residency::SLOTS_KNOWN.union(F).level(), Level::FreeSlot);
    assert_eq!(Residency::SLOTS_KNOWN.level(), Level::None);
    // Model list only: registered counts as a free slot, unregistered as nothing.
    assert_eq!(Residency::LISTED.union(L).level(), Level::FreeSlot);
    assert_eq!(Residency::LISTED.level(), Level::None);
    let s = LadderScores::DEFAULT;
    let ladder = [
        Level::Running,
        Level::FreeSlot,
        Level::Waiting,
        Level::Loaded,
        Level::None,
    ];
    for w in ladder.windows(2) {
        assert!(s.of(w[0]) > s.of(w[1]), "{w:?}");
    }
    assert_eq!(s.of(Level::Unknown), 0.0);
}

#[test]
fn running_beats_free_slot_beats_waiting_beats_loaded_beats_none() {
    let now = Instant::now();
    let mut s = strategy();
    // Each rung against every rung below it, whatever the loads.
    let rungs = [R.union(L), F.union(L), W.union(L), L, Residency::UNKNOWN];
    for (i, &better) in rungs.iter().enumerate() {
        for &worse in &rungs[i + 1..] {
            let c = lora_cands(&[(9, worse), (50, better), (0, worse)]);
            let p = pick(&mut s, &c, now);
            assert_eq!(p.index, 1, "{better:?} over {worse:?}");
            assert_eq!(p.fallback, None);
        }
    }
    let c = lora_cands(&[(0, L), (3, R.union(L)), (0, F.union(L)), (0, W)]);
    let p = pick(&mut s, &c, now);
    assert_eq!((p.index, p.score), (1, Some(1.0)));
}

#[test]
fn load_breaks_ties_then_random() {
    let now = Instant::now();
    let mut s = strategy();
    let c = lora_cands(&[
        (4, R.union(L)),
        (2, R.union(L)),
        (2, R.union(L)),
        (0, F.union(L)),
    ]);
    let mut counts = [0u32; 4];
    for _ in 0..4000 {
        counts[pick(&mut s, &c, now).index] += 1;
    }
    assert_eq!((counts[0], counts[3]), (0, 0), "{counts:?}");
    assert!((1700..=2300).contains(&counts[1]), "{counts:?}");
}

#[test]
fn w_load_lets_a_much_less_loaded_target_win() {
    let now = Instant::now();
    let opts = Options {
        w_load: 0.5,
        ..Options::default()
    };
    let mut s = LoraAware::new(&opts, 4, 1);
    // Running at load 100 scores 1 - 0.5 = 0.5; a free slot at load 0 scores 0.8.
    let c = lora_cands(&[(100, R.union(L)), (0, F.union(L))]);
    assert_eq!(pick(&mut s, &c, now).index, 1);
    // Close loads: residency still decides.
    let c = lora_cands(&[(10, R.union(L)), (8, F.union(L))]);
    assert_eq!(pick(&mut s, &c, now).index, 0);
}

#[test]
fn base_model_requests_route_on_load() {
    let now = Instant::now();
    let mut s = strategy();
    // Signals are fresh but the model is no known adapter.
    let mut c = lora_cands(&[(5, R), (1, Residency::UNKNOWN), (3, F)]);
    for c in &mut c {
        c.lora = c.lora.without(Residency::ADAPTER);
    }
    for _ in 0..20 {
        let p = s.pick(&adapter_req("base-model"), &c, now).unwrap();
        assert_eq!((p.index, p.fallback, p.score), (1, None, None));
    }
    let mut sink = ShareSink::default();
    s.routed(&adapter_req("base-model"), 1, &mut sink, now);
    assert!(
        s.recent().is_empty() && sink.is_empty(),
        "base models are not remembered"
    );
    // The `adapters` option makes a name an adapter even before any target lists it.
    let opts = Options {
        adapters: Some(" new-lora , other,".into()),
        ..Options::default()
    };
    assert_eq!(opts.adapter_names(), ["new-lora", "other"]);
    let mut s = LoraAware::new(&opts, 4, 3);
    // No model lists; slots known, one of them free.
    let mut c = cands(&[(1.0, 5), (1.0, 1), (1.0, 3)]);
    for c in &mut c {
        c.lora = Residency::SLOTS_KNOWN;
    }
    c[2].lora = c[2].lora.union(F);
    let p = s.pick(&adapter_req("new-lora"), &c, now).unwrap();
    assert_eq!(p.index, 2, "free slot over load: {p:?}");
    assert!(p.score.is_some());
}

#[test]
fn no_signal_falls_back_to_load_with_a_reason() {
    let now = Instant::now();
    let mut s = strategy();
    // Scraping off or stale: every candidate unknown, even the adapter bit is absent.
    let c = cands(&[(1.0, 7), (1.0, 2), (1.0, 4)]);
    let p = pick(&mut s, &c, now);
    assert_eq!((p.index, p.fallback), (1, Some(NO_LORA_SIGNAL)));
    // Nothing is remembered from a fallback pick.
    let mut sink = ShareSink::default();
    s.routed(&adapter_req("sql-lora"), 1, &mut sink, now);
    assert!(s.recent().is_empty());
    // One fresh candidate is enough to score: the unknown ones score as holding nothing.
    let mut c = lora_cands(&[(0, Residency::UNKNOWN), (9, R.union(L))]);
    c[0].lora = Residency::ADAPTER;
    let p = pick(&mut s, &c, now);
    assert_eq!((p.index, p.fallback), (1, None));
    // One candidate: that one, whatever it holds.
    let one = lora_cands(&[(3, Residency::UNKNOWN)]);
    assert_eq!(pick(&mut s, &one, now).index, 0);
    let one = lora_cands(&[(3, L)]);
    assert_eq!(
        pick(&mut s, &one, now),
        Pick {
            index: 0,
            score: Some(0.4),
            fallback: None
        }
    );
}

#[test]
fn recent_routing_keeps_a_burst_together_within_the_window() {
    let t0 = Instant::now();
    let opts = Options {
        window: Duration::from_secs(5),
        ..Options::default()
    };
    let mut s = LoraAware::new(&opts, 4, 5);
    let mut sink = ShareSink::default();
    // Registered everywhere, running nowhere yet: every target has a free slot.
    let c = lora_cands(&[(0, F.union(L)); 4]);
    let first = pick(&mut s, &c, t0).index;
    s.routed(&adapter_req("sql-lora"), c[first].target, &mut sink, t0);
    assert_eq!(sink.take_batch().len(), 1, "shared with the other cores");
    // The burst follows the first request even as its target's load grows.
    let mut c = c;
    for i in 1..50u64 {
        c[first].load = i;
        let now = t0 + Duration::from_millis(10 * i);
        let p = pick(&mut s, &c, now);
        assert_eq!(p.index, first);
        s.routed(&adapter_req("sql-lora"), c[p.index].target, &mut sink, now);
    }
    assert!(
        sink.take_batch().len() <= 1,
        "refreshes are shared at most every window / 4"
    );
    // After the window, residency alone decides again (load breaks the tie).
    let later = t0 + Duration::from_secs(6);
    assert_ne!(pick(&mut s, &c, later).index, first);
    // A target whose model list no longer has the adapter loses its memory bonus.
    let mut gone = c.clone();
    for (i, c) in gone.iter_mut().enumerate() {
        c.load = 0;
        if i == first {
            c.lora = c.lora.without(L);
        }
    }
    s.routed(&adapter_req("sql-lora"), c[first].target, &mut sink, later);
    assert_ne!(pick(&mut s, &gone, later).index, first);
    // A different adapter is not affected.
    let p = s.pick(&adapter_req("chat-lora"), &c, t0).unwrap();
    assert_ne!(p.index, first);
}

#[test]
fn two_cores_share_the_routing_memory() {
    let now = Instant::now();
    let mut a = strategy();
    let mut b = LoraAware::new(&Options::default(), 8, 99);
    let c = lora_cands(&[(0, F.union(L)); 3]);
    let mut sink = ShareSink::default();
    sink.for_route(2);
    let t = c[pick(&mut a, &c, now).index].target;
    a.routed(&adapter_req("sql-lora"), t, &mut sink, now);
    let batch = sink.take_batch();
    for (route, item) in batch.iter() {
        assert_eq!(route, 2);
        b.apply_shared(&item, now);
    }
    for _ in 0..20 {
        assert_eq!(c[pick(&mut b, &c, now).index].target, t);
    }
    // Prefix items are not ours: ignored.
    b.apply_shared(
        &Shared::Prefix {
            target: 0,
            data: b"x",
        },
        now,
    );
    assert_eq!(b.recent().len(), 1);
}

#[test]
fn routing_memory_is_bounded() {
    let t0 = Instant::now();
    let mut r = RecentRoutes::new(100, Duration::from_secs(60));
    for k in 0..10_000u64 {
        r.record(k, (k % 3) as usize, t0 + Duration::from_millis(k));
        assert!(r.len() <= 100);
    }
    let now = t0 + Duration::from_millis(10_000);
    assert!(r.routed_to(9_999, 0, now), "the newest survive");
    assert!(!r.contains(0, now), "the oldest are gone");
    // Per adapter: the most recent targets.
    let mut r = RecentRoutes::new(10, Duration::from_secs(60));
    for t in 0..6 {
        r.record(1, t, t0 + Duration::from_secs(t as u64));
    }
    let now = t0 + Duration::from_secs(6);
    assert!(r.routed_to(1, 5, now) && r.routed_to(1, 2, now));
    assert!(!r.routed_to(1, 1, now) && !r.routed_to(1, 0, now));
    // Refreshing one moves it to the front; nothing is duplicated.
    assert!(
        !r.record(1, 3, now),
        "refreshed within window / 4: not shared again"
    );
    assert!(r.record(1, 0, now));
    assert!(r.routed_to(1, 0, now) && !r.routed_to(1, 2, now));
    // Expiry.
    assert!(!r.routed_to(1, 0, now + Duration::from_secs(61)));
}

#[test]
fn pick_does_not_allocate_once_warm() {
    let now = Instant::now();
    let mut s = strategy();
    let c = lora_cands(&[(1, R.union(L)), (0, F.union(L)), (2, W)]);
    let mut sink = ShareSink::default();
    let p = pick(&mut s, &c, now);
    s.routed(&adapter_req("sql-lora"), c[p.index].target, &mut sink, now);
    let cap = s.totals.capacity();
    for _ in 0..1000 {
        let p = pick(&mut s, &c, now);
        s.routed(&adapter_req("sql-lora"), c[p.index].target, &mut sink, now);
    }
    assert_eq!(s.totals.capacity(), cap);
    assert_eq!(s.recent().len(), 1);
}

#[test]
fn registry_options() {
    use crate::testing::{build, lookup, validate_spec, Trait};
    let info = lookup("lora_aware").unwrap();
    assert!(info.aliases.is_empty());
    for t in [Trait::LoadAware, Trait::Stateful, Trait::SingleWinner] {
        assert!(info.traits.contains(&t));
    }
    let ok: toml::Table = toml::from_str(
        "window = \"30s\"\nscore_running = 1\nscore_free_slot = 0.5\nscore_waiting = 0.25\n\
         score_loaded = 0\nw_load = 0.3\nmax_adapters = 10\nadapters = \"a, b\"",
    )
    .unwrap();
    assert_eq!(validate_spec("lora_aware", &ok), Ok("lora_aware"));
    let o = crate::testing::parse_options::<Options>(&ok).unwrap();
    assert_eq!(o.window, Duration::from_secs(30));
    assert_eq!(
        o.scores(),
        LadderScores {
            running: 1.0,
            free_slot: 0.5,
            waiting: 0.25,
            loaded: 0.0
        }
    );
    assert_eq!((o.w_load, o.max_adapters), (0.3, 10));
    assert_eq!(o.adapter_names(), ["a", "b"]);
    assert_eq!(
        crate::testing::parse_options::<Options>(&toml::Table::new()).unwrap(),
        Options::default()
    );
    for bad in [
        "window = \"0s\"",
        "window = 5",
        "score_running = 1.5",
        "score_waiting = -0.1",
        "w_load = -1",
        "max_adapters = 0",
        "adapters = \" , \"",
        "adapters = [\"a\"]",
        "bogus = 1",
    ] {
        let t: toml::Table = toml::from_str(bad).unwrap();
        let err = validate_spec("lora_aware", &t).unwrap_err();
        assert!(!err[0].1.is_empty(), "{bad}");
    }
    let ctx = crate::testing::context(&[1.0, 1.0], &[]);
    let spec = crate::testing::raw("lora_aware", ok);
    let s = build(&spec, &ctx);
    assert!(s.needs().contains(Needs::LORA_RESIDENCY));
}
