//! The mesh end to end, without threads: publish on one core, drain on the others.

use rolter_core::Verdict;

use super::*;
use load::LoadView;

/// With N cores each holding some requests, after one publish/drain round every core's
/// view equals the true total, and later changes replace rather than add up.
#[test]
fn every_core_converges_to_the_true_total_after_one_round() {
    let n = 4;
    let targets = 3;
    let (links, control) = mesh(n);
    let views: Vec<LoadView> = (0..n).map(|_| LoadView::new(targets, n)).collect();
    let mut guards = Vec::new();
    // Core i holds i+1 requests on target i % 3.
    for (i, v) in views.iter().enumerate() {
        for _ in 0..=i {
            guards.push(v.enter(i % targets));
        }
    }
    let truth = |t: usize| -> u64 {
        (0..n)
            .filter(|i| i % targets == t)
            .map(|i| i as u64 + 1)
            .sum()
    };
    for (l, v) in links.iter().zip(&views) {
        l.publish(v);
    }
    for (l, v) in links.iter().zip(&views) {
        l.drain(v, |_| {}, |_, _| {}, |_| {}, |_| {});
    }
    for v in &views {
        for t in 0..targets {
            assert_eq!(v.in_flight(t), truth(t), "target {t}");
        }
    }
    // The control thread got one snapshot per core.
    let loads = control
        .inbox
        .try_iter()
        .filter(|m| matches!(m, ToControl::Load { .. }))
        .count();
    assert_eq!(loads, n);
    // Everything finishes: the next round brings every view back to zero.
    drop(guards);
    for (l, v) in links.iter().zip(&views) {
        l.publish(v);
    }
    for (l, v) in links.iter().zip(&views) {
        l.drain(v, |_| {}, |_, _| {}, |_| {}, |_| {});
    }
    for v in &views {
        for t in 0..targets {
            assert_eq!(v.in_flight(t), 0);
        }
    }
}

#[test]
fn samples_reach_every_other_core_and_records_reach_control() {
    let (links, control) = mesh(3);
    let views: Vec<LoadView> = (0..3).map(|_| LoadView::new(1, 3)).collect();
    let sample = rolter_strategy::testing::sample(0, 25, 1, 10);
    links[0].record(Record::Attempt {
        route: 0,
        sample,
        verdict: Verdict::Success,
        notes: Default::default(),
    });
    links[0].record(Record::Gateway {
        status: 404,
        code: "model_not_found",
    });
    links[0].publish(&views[0]);
    let mut seen = [0; 3];
    for (i, (l, v)) in links.iter().zip(&views).enumerate() {
        l.drain(
            v,
            |s| {
                assert_eq!(s.ttft, sample.ttft);
                seen[i] += 1;
            },
            |_, _| {},
            |_| {},
            |_| {},
        );
    }
    assert_eq!(seen, [0, 1, 1], "the sender learned locally already");
    let records: Vec<Record> = control
        .inbox
        .try_iter()
        .flat_map(|m| match m {
            ToControl::Records(r) => r,
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(records.len(), 2);
}

#[test]
fn a_full_inbox_drops_instead_of_blocking() {
    let (links, control) = mesh(2);
    let view = LoadView::new(1, 2);
    for _ in 0..INBOX + 10 {
        let _g = view.enter(0);
        links[0].publish(&view);
    }
    assert!(links[1].has_mail());
    let v1 = LoadView::new(1, 2);
    links[1].drain(&v1, |_| {}, |_, _| {}, |_| {}, |_| {});
    // The inbox held INBOX snapshots (each saying one request); the rest were dropped
    // without blocking the sender.
    assert_eq!(v1.in_flight(0), 1);
    assert!(!links[1].has_mail());
    // Every drop is counted: ten to the other worker, ten to the full control inbox.
    assert_eq!(control.dropped(Kind::Load), 20);
    assert_eq!(control.dropped(Kind::Records), 0);
}

/// A snapshot lost to a full inbox leaves the other core stale only until the heartbeat:
/// within `HEARTBEAT_TICKS` ticks a full snapshot goes out although nothing changed.
#[test]
fn the_heartbeat_heals_a_dropped_snapshot() {
    let (links, control) = mesh(2);
    let (v0, v1) = (LoadView::new(1, 2), LoadView::new(1, 2));
    // Fill worker 1's inbox with stale news (each snapshot saying 0 in flight).
    for _ in 0..INBOX {
        drop(v0.enter(0));
        links[0].publish(&v0);
    }
    // The change that matters (one request now in flight) is dropped: the inbox is full.
    let _held = v0.enter(0);
    links[0].publish(&v0);
    assert!(control.dropped(Kind::Load) >= 1);
    links[1].drain(&v1, |_| {}, |_, _| {}, |_| {}, |_| {});
    assert_eq!(v1.in_flight(0), 0, "worker 1 missed the change");
    // Nothing changes on worker 0 any more; its ticks go on.
    let mut healed_after = None;
    for tick in 1..=HEARTBEAT_TICKS {
        links[0].publish(&v0);
        links[1].drain(&v1, |_| {}, |_, _| {}, |_| {}, |_| {});
        if v1.in_flight(0) == 1 {
            healed_after = Some(tick);
            break;
        }
    }
    let ticks = healed_after.expect("the heartbeat re-sent the full snapshot");
    assert!(ticks <= HEARTBEAT_TICKS, "{ticks}");
    // Between heartbeats an unchanged view sends nothing.
    links[0].publish(&v0);
    assert!(!links[1].has_mail());
}

#[test]
fn shared_routing_state_reaches_every_other_core() {
    let (links, _control) = mesh(3);
    let views: Vec<LoadView> = (0..3).map(|_| LoadView::new(2, 3)).collect();
    let mut sink = rolter_strategy::ShareSink::default();
    sink.for_route(1).prefix(1, b"[{\"role\":\"system\"");
    sink.for_route(0).session_pin(42, 0);
    links[2].share(&std::sync::Arc::new(sink.take_batch()));
    assert!(sink.is_empty());
    let mut got = vec![Vec::new(); 3];
    for (i, (l, v)) in links.iter().zip(&views).enumerate() {
        l.drain(
            v,
            |_| {},
            |b, from_fleet| {
                assert!(!from_fleet, "another core's items are this replica's own");
                for (route, item) in b.iter() {
                    got[i].push(format!("{route}:{item:?}"));
                }
            },
            |_| {},
            |_| {},
        );
    }
    assert!(got[2].is_empty(), "not sent back to its sender");
    assert_eq!(got[0], got[1]);
    assert_eq!(got[0].len(), 2);
    assert!(
        got[0][0].starts_with("1:Prefix { target: 1"),
        "{:?}",
        got[0]
    );
    assert!(got[0][1].starts_with("0:SessionPin { key: 42, target: 0"));
}
