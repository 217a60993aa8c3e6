//! What the books here are built from: the fleet's targets and routes and the health
//! settings, as plain values. The gateway fills them in from its validated configuration
//! (`[[targets]]`, `[[routes]]`, `[metrics_scrape]`, `[health]`); this crate does not read
//! the configuration itself.

use std::time::Duration;

use rolter_core::TargetId;

/// The targets and routes, in configuration order (a target's index is its [`TargetId`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    pub targets: Vec<FleetTarget>,
    pub routes: Vec<FleetRoute>,
    /// Targets' metrics are scraped (`[metrics_scrape]` is on).
    pub scrape_enabled: bool,
    /// A scrape older than this no longer counts (`[metrics_scrape].stale_after`).
    pub scrape_stale_after: Duration,
}

/// One target (`[[targets]]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetTarget {
    pub name: String,
    /// The target is scraped when scraping is on (`scrape`, default true).
    pub scrape: bool,
    /// Its own health check path; `Some("")` turns active checks off for it.
    pub health_path: Option<String>,
}

/// One route (`[[routes]]`): the targets it sends to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetRoute {
    pub targets: Vec<TargetId>,
}

/// What the health book does (`[health]`, less the probe's path and timing, which are the
/// prober's). [`Default`] holds the `[health]` defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// Probe every target (except those with `health_path = ""`) on an interval.
    pub active: bool,
    /// Consecutive passing probes that make an unhealthy target healthy again.
    pub healthy_threshold: u32,
    /// Consecutive failing probes that make a healthy target unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive failed requests (connect errors, timeouts, 5xx) that eject a target;
    /// 0 turns passive ejection off.
    pub failures: u32,
    /// First ejection time; each further ejection in a row doubles it.
    pub ejection_time: Duration,
    /// Longest ejection time.
    pub max_ejection_time: Duration,
    /// Largest share (percent) of a route's targets ejected at once (rounded down).
    pub max_ejected_percent: u32,
    /// Latency outlier ejection: a target whose TTFT (or inter-token time) average stays
    /// above this factor times its route peers' median is ejected; 0 turns it off.
    pub latency_factor: f64,
    /// How long a target must stay a latency outlier before it is ejected.
    pub latency_for: Duration,
    /// Samples a target (and each peer compared with) needs before latency counts.
    pub latency_min_samples: u32,
    /// A target that joins ramps its share over this window; 0 turns slow start off.
    pub slow_start_window: Duration,
    /// The ramp's shape: share × (elapsed / window)^(1 / aggression).
    pub slow_start_aggression: f64,
    /// The smallest share factor during the ramp.
    pub slow_start_min_weight: f64,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            active: false,
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            failures: 5,
            ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(300),
            max_ejected_percent: 50,
            latency_factor: 0.0,
            latency_for: Duration::from_secs(30),
            latency_min_samples: 20,
            slow_start_window: Duration::ZERO,
            slow_start_aggression: 1.0,
            slow_start_min_weight: 0.1,
        }
    }
}
