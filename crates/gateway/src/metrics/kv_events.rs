//! The KV-event plane's series (`rolter_kv_events_*`, `rolter_kv_index_*`), written from the
//! index thread's latest per-target reports each time `/metrics` is rendered.
//!
//! Owns those names and their help texts. It keeps no state between renders; the counters
//! it writes are the plane's own running totals.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use rolter_engine::kv::reports::KvTargetReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabel {
    target: String,
}

type IntGauge = Gauge<u64, AtomicU64>;

/// A series family: name, help, and the report field it shows.
type Series = (&'static str, &'static str, fn(&KvTargetReport) -> u64);

/// A registry holding one render's KV-plane series, for the targets that publish events.
pub(super) fn registry(target_names: &[String], reports: &[KvTargetReport]) -> Registry {
    let gauges: [Series; 3] = [
        (
            "rolter_kv_events_connected",
            "1 while the gateway's subscription to the target's KV-event publisher is connected",
            |r| u64::from(r.connected),
        ),
        (
            "rolter_kv_events_live",
            "1 while the target's KV events are in order and recent, so strategies route on its index entries",
            |r| u64::from(r.live),
        ),
        (
            "rolter_kv_index_blocks",
            "Engine KV blocks the gateway's index holds for the target",
            |r| r.blocks,
        ),
    ];
    let counters: [Series; 10] = [
        (
            "rolter_kv_events_messages",
            "KV-event messages received from the target (live and replayed)",
            |r| r.frames,
        ),
        (
            "rolter_kv_events_replayed_messages",
            "KV-event messages received through the target's replay socket",
            |r| r.replayed,
        ),
        (
            "rolter_kv_events_malformed",
            "KV-event messages that were not three frames with an 8-byte sequence number",
            |r| r.malformed,
        ),
        (
            "rolter_kv_events_dropped",
            "KV-event messages dropped because the index thread fell behind",
            |r| r.dropped,
        ),
        (
            "rolter_kv_events_gaps",
            "Gaps in the target's KV-event sequence numbers",
            |r| r.gaps,
        ),
        (
            "rolter_kv_events_replays",
            "Replays requested from the target's replay socket after a gap or a reconnect",
            |r| r.replays,
        ),
        (
            "rolter_kv_events_replay_failures",
            "Replays that failed or timed out",
            |r| r.replay_failures,
        ),
        (
            "rolter_kv_events_publisher_restarts",
            "Times the target's sequence numbers started over (engine restart)",
            |r| r.seq_resets,
        ),
        (
            "rolter_kv_index_drops",
            "Times the target's index entries were dropped (a gap or a return that could not be repaired from the replay, a publisher restart)",
            |r| r.drops,
        ),
        (
            "rolter_kv_index_evicted_blocks",
            "Blocks evicted from the target's index by max_blocks_per_target",
            |r| r.evicted,
        ),
    ];
    let label = |r: &KvTargetReport| TargetLabel {
        target: target_names
            .get(r.target)
            .cloned()
            .unwrap_or_else(|| r.target.to_string()),
    };
    let mut registry = Registry::default();
    for (name, help, value) in gauges {
        let family = Family::<TargetLabel, IntGauge>::default();
        for r in reports {
            family.get_or_create(&label(r)).set(value(r));
        }
        registry.register(name, help, family);
    }
    for (name, help, value) in counters {
        let family = Family::<TargetLabel, Counter>::default();
        for r in reports {
            family.get_or_create(&label(r)).inc_by(value(r));
        }
        registry.register(name, help, family);
    }
    registry
}
