//! Per-target gauges: values the control thread already holds (in-flight counts, the last
//! scrape, health and ejection state), handed to [`super::GatewayMetrics::render`] each time
//! and written as `rolter_target_*`, `rolter_scrape_*` and `rolter_adaptive_enabled`; and
//! the mesh's drop counters, read from their atomics at render time as
//! `rolter_mesh_dropped_total`.
//!
//! Owns the gauge names and the rule for which series are written. It keeps no state
//! between renders and must not be used from worker threads.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The state of one target at render time. The slice given to `render` is indexed like the
/// target names given to `GatewayMetrics::new`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetGauges {
    /// Requests the gateway has in flight to this target, all workers together.
    pub in_flight: u64,
    /// Requests waiting in the engine's queue, from the last scrape still in use (`None`
    /// when unknown or stale: the series is then left out).
    pub queue_depth: Option<u64>,
    /// Requests in the engine's running batch, like `queue_depth`.
    pub running: Option<u64>,
    /// KV-cache usage as a fraction, 0..=1, like `queue_depth`.
    pub kv_usage: Option<f64>,
    /// The active health check's verdict (true when checks are off).
    pub healthy: bool,
    /// Passive ejection is keeping this target out of rotation.
    pub ejected: bool,
    pub scrape: ScrapeStatus,
}

/// Where a target's metrics scraping stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeStatus {
    /// Scraping is off for this target (or globally).
    Off,
    /// On, but no scrape has succeeded yet.
    Never,
    /// The last successful scrape is younger than `stale_after`.
    Fresh { age: Duration },
    /// The last successful scrape is too old to be used.
    Stale { age: Duration },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabel {
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

type IntGauge = Gauge<u64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// This render's per-target gauge families.
#[derive(Default)]
struct TargetFamilies {
    in_flight: Family<TargetLabel, IntGauge>,
    queue_depth: Family<TargetLabel, IntGauge>,
    running: Family<TargetLabel, IntGauge>,
    kv_usage: Family<TargetLabel, FloatGauge>,
    healthy: Family<TargetLabel, IntGauge>,
    ejected: Family<TargetLabel, IntGauge>,
    scrape_up: Family<TargetLabel, IntGauge>,
    scrape_age: Family<TargetLabel, FloatGauge>,
}

impl TargetFamilies {
    /// Writes the series of the target `name` from `g`, leaving out the unknown values.
    fn set(&self, name: &str, g: &TargetGauges) {
        let label = TargetLabel {
            target: name.to_string(),
        };
        self.in_flight.get_or_create(&label).set(g.in_flight);
        if let Some(v) = g.queue_depth {
            self.queue_depth.get_or_create(&label).set(v);
        }
        if let Some(v) = g.running {
            self.running.get_or_create(&label).set(v);
        }
        if let Some(v) = g.kv_usage {
            self.kv_usage.get_or_create(&label).set(v);
        }
        self.healthy.get_or_create(&label).set(u64::from(g.healthy));
        self.ejected.get_or_create(&label).set(u64::from(g.ejected));
        let (up, age) = match g.scrape {
            ScrapeStatus::Off => (None, None),
            ScrapeStatus::Never => (Some(0), None),
            ScrapeStatus::Fresh { age } => (Some(1), Some(age)),
            ScrapeStatus::Stale { age } => (Some(0), Some(age)),
        };
        if let Some(up) = up {
            self.scrape_up.get_or_create(&label).set(up);
        }
        if let Some(age) = age {
            self.scrape_age.get_or_create(&label).set(age.as_secs_f64());
        }
    }

    /// Registers the `rolter_target_*` and `rolter_scrape_*` families.
    fn register(self, registry: &mut Registry) {
        registry.register(
            "rolter_target_in_flight",
            "Requests in flight from the gateway to the target",
            self.in_flight,
        );
        registry.register(
            "rolter_target_queue_depth",
            "Requests waiting in the engine's queue, as last scraped",
            self.queue_depth,
        );
        registry.register(
            "rolter_target_running",
            "Requests in the engine's running batch, as last scraped",
            self.running,
        );
        registry.register(
            "rolter_target_kv_cache_usage",
            "Engine KV-cache usage as a fraction (0 to 1), as last scraped",
            self.kv_usage,
        );
        registry.register(
            "rolter_target_healthy",
            "1 when the target passes active health checks (or checks are off), else 0",
            self.healthy,
        );
        registry.register(
            "rolter_target_ejected",
            "1 while passive ejection keeps the target out of rotation, else 0",
            self.ejected,
        );
        registry.register(
            "rolter_scrape_up",
            "1 when the target's last metrics scrape is fresh, 0 when stale or none succeeded yet",
            self.scrape_up,
        );
        registry.register(
            "rolter_scrape_age_seconds",
            "Seconds since the target's last successful metrics scrape",
            self.scrape_age,
        );
    }
}

/// A registry holding this render's gauges. A series whose value is unknown is left out.
pub(super) fn registry(
    target_names: &[String],
    gauges: &[TargetGauges],
    adaptive_enabled: bool,
    mesh_dropped: &[(&'static str, u64)],
) -> Registry {
    debug_assert_eq!(
        target_names.len(),
        gauges.len(),
        "one TargetGauges per target"
    );
    let targets = TargetFamilies::default();
    for (name, g) in target_names.iter().zip(gauges) {
        targets.set(name, g);
    }
    let mut registry = Registry::default();
    targets.register(&mut registry);
    register_adaptive(&mut registry, adaptive_enabled);
    register_mesh_dropped(&mut registry, mesh_dropped);
    registry
}

/// Registers `rolter_adaptive_enabled`.
fn register_adaptive(registry: &mut Registry, enabled: bool) {
    let adaptive = IntGauge::default();
    adaptive.set(u64::from(enabled));
    registry.register(
        "rolter_adaptive_enabled",
        "1 when adaptive routes blend their signals, 0 when they use their fallback strategy",
        adaptive,
    );
}

/// Registers `rolter_mesh_dropped`, a series per kind of message.
fn register_mesh_dropped(registry: &mut Registry, mesh_dropped: &[(&'static str, u64)]) {
    let dropped = Family::<KindLabel, Counter>::default();
    for &(kind, n) in mesh_dropped {
        dropped.get_or_create(&KindLabel { kind }).inc_by(n);
    }
    registry.register(
        "rolter_mesh_dropped",
        "Messages between cores (and to or from the control thread) dropped because the receiver's inbox was full, by kind; load snapshots heal on the next heartbeat",
        dropped,
    );
}
