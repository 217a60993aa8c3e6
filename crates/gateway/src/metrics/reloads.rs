//! The configuration's series: `rolter_config_info` (the running file's SHA-256),
//! `rolter_config_reloads_total` by result, and
//! `rolter_config_last_reload_success_timestamp_seconds`, and DNS discovery's
//! `rolter_discovery_lookups_total{group,result}` and `rolter_discovery_members{group}`,
//! written from the reload counters each time `/metrics` is rendered.
//!
//! Owns those names and their help texts. It keeps no state between renders.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::reload::ReloadStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Digest {
    sha256: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupResult {
    group: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Group {
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    result: &'static str,
}

type IntGauge = Gauge<u64, AtomicU64>;

/// A registry holding one render's configuration series.
pub(crate) fn registry(stats: &ReloadStats) -> Registry {
    let mut r = Registry::default();
    let info = Family::<Digest, IntGauge>::default();
    info.get_or_create(&Digest {
        sha256: stats.running().digest,
    })
    .set(1);
    r.register(
        "rolter_config_info",
        "The running configuration: its file's SHA-256 as a label (value always 1)",
        info,
    );
    let reloads = Family::<Outcome, Counter>::default();
    for (result, n) in stats.counts() {
        reloads.get_or_create(&Outcome { result }).inc_by(n);
    }
    r.register(
        "rolter_config_reloads",
        "Configuration reloads by result: ok, invalid (the file has errors), restart_needed, failed",
        reloads,
    );
    let last = IntGauge::default();
    last.set(stats.last_success());
    r.register(
        "rolter_config_last_reload_success_timestamp_seconds",
        "Unix time of the start or of the last successful reload",
        last,
    );
    let groups = stats.discovery();
    if !groups.is_empty() {
        let lookups = Family::<GroupResult, Counter>::default();
        let members = Family::<Group, IntGauge>::default();
        for (group, c) in groups {
            for (result, n) in [
                ("unchanged", c.unchanged),
                ("changed", c.changed),
                ("failed", c.failed),
            ] {
                let labels = GroupResult {
                    group: group.clone(),
                    result,
                };
                lookups.get_or_create(&labels).inc_by(n);
            }
            members
                .get_or_create(&Group { group })
                .set(c.members as u64);
        }
        r.register(
            "rolter_discovery_lookups",
            "DNS lookups of discover entries (every server.dns_refresh), by result: unchanged, changed (members added or removed, applied as a reload), failed (an error or an empty answer; the last good members are kept)",
            lookups,
        );
        r.register(
            "rolter_discovery_members",
            "Targets a discover entry has in the running configuration",
            members,
        );
    }
    r
}
