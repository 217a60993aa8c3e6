//! `[health]` and `[metrics_scrape]`.

use super::common::*;

/// `[health]`: the defaults when the section is absent, `None` when any key has an error.
pub(super) fn health(raw: Option<RawHealth>, errs: &mut Collector) -> Option<HealthConfig> {
    let d = HealthConfig::default();
    let Some(raw) = raw else {
        return Some(d);
    };
    let probes = probes(&raw, &d, errs);
    let ejection = ejection(&raw, &d, errs);
    let latency = latency(&raw, &d, errs);
    let slow_start = slow_start(&raw, &d, errs);
    let (probes, ejection, latency, slow_start) = (probes?, ejection?, latency?, slow_start?);
    Some(HealthConfig {
        latency_factor: latency.factor,
        latency_for: latency.outlier_for,
        latency_min_samples: latency.min_samples,
        slow_start_window: slow_start.window,
        slow_start_aggression: slow_start.aggression,
        slow_start_min_weight: slow_start.min_weight,
        active: raw.active.unwrap_or(true),
        path: probes.path,
        interval: probes.interval,
        timeout: probes.timeout,
        healthy_threshold: probes.healthy_threshold,
        unhealthy_threshold: probes.unhealthy_threshold,
        failures: ejection.failures,
        ejection_time: ejection.time,
        max_ejection_time: ejection.max_time,
        max_ejected_percent: ejection.max_percent,
    })
}

/// Active checks: what is probed, how often, and how many results in a row count.
struct Probes {
    path: String,
    interval: Duration,
    timeout: Duration,
    healthy_threshold: u32,
    unhealthy_threshold: u32,
}

/// `path`, `interval`, `timeout` (shorter than the interval) and the two thresholds.
fn probes(raw: &RawHealth, d: &HealthConfig, errs: &mut Collector) -> Option<Probes> {
    let path = http_path(raw.path.clone(), "health.path", &d.path, errs);
    let interval = nonzero_duration(raw.interval.as_ref(), "health.interval", d.interval, errs);
    let timeout = duration(
        raw.timeout.as_ref(),
        "health.timeout",
        d.timeout,
        false,
        errs,
    );
    let timeout = timeout_within_interval(
        "health.timeout",
        (interval, timeout),
        raw.timeout.is_none(),
        Bound::Below,
        errs,
    );
    let healthy_threshold = count(
        raw.healthy_threshold,
        "health.healthy_threshold",
        d.healthy_threshold,
        1..=u32::MAX,
        "the number of passing probes that bring a target back",
        errs,
    );
    let unhealthy_threshold = count(
        raw.unhealthy_threshold,
        "health.unhealthy_threshold",
        d.unhealthy_threshold,
        1..=u32::MAX,
        "the number of failing probes that take a target out",
        errs,
    );
    Some(Probes {
        path: path?,
        interval: interval?,
        timeout: timeout?,
        healthy_threshold: healthy_threshold?,
        unhealthy_threshold: unhealthy_threshold?,
    })
}

/// Passive ejection: failed requests in a row take a target out for a while.
struct Ejection {
    failures: u32,
    time: Duration,
    max_time: Duration,
    max_percent: u32,
}

/// `failures`, `ejection_time`, `max_ejection_time` (at least `ejection_time`) and
/// `max_ejected_percent`.
fn ejection(raw: &RawHealth, d: &HealthConfig, errs: &mut Collector) -> Option<Ejection> {
    let failures = count(
        raw.failures,
        "health.failures",
        d.failures,
        0..=u32::MAX,
        "the number of failed requests in a row that eject a target; 0 turns passive ejection off",
        errs,
    );
    let ejection_time = nonzero_duration(
        raw.ejection_time.as_ref(),
        "health.ejection_time",
        d.ejection_time,
        errs,
    );
    let max_ejection_time = nonzero_duration(
        raw.max_ejection_time.as_ref(),
        "health.max_ejection_time",
        d.max_ejection_time,
        errs,
    );
    let max_ejection_time = match (ejection_time, max_ejection_time) {
        (Some(first), Some(max)) if max < first => {
            errs.push(
                "health.max_ejection_time",
                format!(
                    "max_ejection_time {}{} is shorter than ejection_time {}",
                    humantime::format_duration(max),
                    if raw.max_ejection_time.is_none() { " (the default)" } else { "" },
                    humantime::format_duration(first)
                ),
                format!(
                    "set max_ejection_time to at least ejection_time, e.g. max_ejection_time = \"{}\"",
                    humantime::format_duration(first * 30)
                ),
            );
            None
        }
        (_, m) => m,
    };
    let max_ejected_percent = count(
        raw.max_ejected_percent,
        "health.max_ejected_percent",
        d.max_ejected_percent,
        0..=100,
        "the largest share of a route's targets ejected at once, in percent",
        errs,
    );
    Some(Ejection {
        failures: failures?,
        time: ejection_time?,
        max_time: max_ejection_time?,
        max_percent: max_ejected_percent?,
    })
}

/// Latency outlier ejection: how much slower than its peers, for how long, on how many samples.
struct Latency {
    factor: f64,
    outlier_for: Duration,
    min_samples: u32,
}

/// `latency_factor` (0 or above 1), `latency_for` and `latency_min_samples`.
fn latency(raw: &RawHealth, d: &HealthConfig, errs: &mut Collector) -> Option<Latency> {
    let latency_factor = match raw.latency_factor {
        None => Some(d.latency_factor),
        Some(f) if f == 0.0 || (f.is_finite() && f > 1.0) => Some(f),
        Some(f) => {
            errs.push(
                "health.latency_factor",
                format!("latency_factor is {f}; it must be 0 (off) or greater than 1"),
                "write how many times slower than its peers' median a target may be, e.g. latency_factor = 3.0, or 0 to turn latency ejection off",
            );
            None
        }
    };
    let latency_for = nonzero_duration(
        raw.latency_for.as_ref(),
        "health.latency_for",
        d.latency_for,
        errs,
    );
    let latency_min_samples = count(
        raw.latency_min_samples,
        "health.latency_min_samples",
        d.latency_min_samples,
        1..=1_000_000,
        "the samples a target and its peers need before latency counts",
        errs,
    );
    Some(Latency {
        factor: latency_factor?,
        outlier_for: latency_for?,
        min_samples: latency_min_samples?,
    })
}

/// Slow start: the ramp a joining target's share follows.
struct SlowStart {
    window: Duration,
    aggression: f64,
    min_weight: f64,
}

/// `slow_start_window`, `slow_start_aggression` (above 0) and `slow_start_min_weight`
/// (above 0, at most 1).
fn slow_start(raw: &RawHealth, d: &HealthConfig, errs: &mut Collector) -> Option<SlowStart> {
    let slow_start_window = duration(
        raw.slow_start_window.as_ref(),
        "health.slow_start_window",
        d.slow_start_window,
        true,
        errs,
    );
    let slow_start_aggression = match raw.slow_start_aggression {
        None => Some(d.slow_start_aggression),
        Some(a) if a.is_finite() && a > 0.0 => Some(a),
        Some(a) => {
            errs.push(
                "health.slow_start_aggression",
                format!("slow_start_aggression is {a}; it must be greater than 0"),
                "use 1.0 (a linear ramp, the default), more for a faster start, less for a slower one",
            );
            None
        }
    };
    let slow_start_min_weight = match raw.slow_start_min_weight {
        None => Some(d.slow_start_min_weight),
        Some(w) if (0.0..=1.0).contains(&w) && w > 0.0 => Some(w),
        Some(w) => {
            errs.push(
                "health.slow_start_min_weight",
                format!(
                    "slow_start_min_weight is {w}; it must be a fraction above 0 and at most 1"
                ),
                "write the smallest share factor during the ramp, e.g. 0.1 (the default)",
            );
            None
        }
    };
    Some(SlowStart {
        window: slow_start_window?,
        aggression: slow_start_aggression?,
        min_weight: slow_start_min_weight?,
    })
}

pub(super) fn scrape(raw: Option<RawScrape>, errs: &mut Collector) -> Option<ScrapeConfig> {
    let d = ScrapeConfig::default();
    let Some(raw) = raw else {
        return Some(d);
    };
    let path = http_path(raw.path, "metrics_scrape.path", &d.path, errs);
    let interval = nonzero_duration(
        raw.interval.as_ref(),
        "metrics_scrape.interval",
        d.interval,
        errs,
    );
    let timeout = duration(
        raw.timeout.as_ref(),
        "metrics_scrape.timeout",
        d.timeout,
        false,
        errs,
    );
    let timeout = timeout_within_interval(
        "metrics_scrape.timeout",
        (interval, timeout),
        raw.timeout.is_none(),
        Bound::AtMost,
        errs,
    );
    let stale_default = interval.map_or(d.stale_after, |i| i * 3);
    let stale_after = nonzero_duration(
        raw.stale_after.as_ref(),
        "metrics_scrape.stale_after",
        stale_default,
        errs,
    );
    let stale_after = match (interval, stale_after) {
        (Some(i), Some(s)) if s < i => {
            errs.push(
                "metrics_scrape.stale_after",
                format!(
                    "stale_after {} is shorter than interval {}, so every scrape would be stale before the next one",
                    humantime::format_duration(s),
                    humantime::format_duration(i)
                ),
                format!(
                    "set stale_after to at least the interval, e.g. stale_after = \"{}\" (the default, 3 × interval), or remove it",
                    humantime::format_duration(i * 3)
                ),
            );
            None
        }
        (_, s) => s,
    };
    Some(ScrapeConfig {
        enabled: raw.enabled.unwrap_or(true),
        path: path?,
        interval: interval?,
        timeout: timeout?,
        stale_after: stale_after?,
    })
}

/// How a periodic task's timeout must relate to its interval.
enum Bound {
    /// Strictly shorter (a health probe must end before the next one starts).
    Below,
    /// Shorter or equal (a scrape may take its whole interval).
    AtMost,
}

/// The timeout, or `None` with an error under `key` when it breaks `bound` against the
/// interval. Either side missing (already reported) passes the timeout through.
fn timeout_within_interval(
    key: &str,
    (interval, timeout): (Option<Duration>, Option<Duration>),
    defaulted: bool,
    bound: Bound,
    errs: &mut Collector,
) -> Option<Duration> {
    let (Some(i), Some(t)) = (interval, timeout) else {
        return timeout;
    };
    let (breaks, relation, fix) = match bound {
        Bound::Below => (t >= i, "is not shorter than", "below"),
        Bound::AtMost => (t > i, "is longer than", "to at most"),
    };
    if !breaks {
        return Some(t);
    }
    errs.push(
        key,
        format!(
            "timeout {}{} {relation} interval {}",
            humantime::format_duration(t),
            if defaulted { " (the default)" } else { "" },
            humantime::format_duration(i)
        ),
        format!(
            "set timeout {fix} the interval, e.g. timeout = \"{}\", or raise interval",
            humantime::format_duration(half(i))
        ),
    );
    None
}

/// Half a duration, rounded to whole milliseconds (at least 1ms), for examples in fixes.
pub(super) fn half(d: Duration) -> Duration {
    Duration::from_millis((d.as_millis() / 2).max(1) as u64)
}
