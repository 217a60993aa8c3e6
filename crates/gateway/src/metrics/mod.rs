//! The gateway's own Prometheus metrics: what it routed, how the targets answered, and the
//! state of each target, rendered in the Prometheus text format (version 0.0.4).
//!
//! Owns every `rolter_*` metric name, its labels and its buckets. One thread owns a
//! [`GatewayMetrics`]: the control thread, which merges the per-request records the workers
//! send it (one [`rolter_strategy::Sample`] per upstream attempt, decisions, fallbacks, the
//! gateway's own error responses) and renders the whole set for the admin endpoint. It must
//! not be touched from worker threads: workers never record here directly, they send
//! records. The type is `Send` but not `Sync`, so it cannot be shared by reference.
//!
//! Recording is cheap: series are looked up by index (route, target, status), and a label set
//! is built only the first time its series appears. The target gauges are not stored here;
//! the control thread passes them to [`GatewayMetrics::render`] as [`TargetGauges`].
//!
//! - [`series`]: the counters and histograms, and rendering.
//! - [`gauges`]: the per-target gauges given at render time.
//! - [`kv_events`]: the KV-event plane's per-target series, from its reports at render time.
//! - [`key_series`]: the client API keys' requests by result and tokens, from the key book.
//! - [`reloads`]: the running configuration's digest and the reload counters.
//! - [`dns`]: lookups of targets' host names, from the control thread's counts.
//! - [`queue`]: the routes' queues (depth, wait, how waits ended).
//! - [`busy_poll`]: the time the workers spent busy polling.
//! - [`process`]: the `process_*` series from `/proc/self` and `rolter_build_info`.
//! - [`text`]: the text encoding every registry is appended with.
//! - [`trace`]: the trace exporter's counters (`[tracing]`).

pub mod busy_poll;
pub mod dns;
pub mod gauges;
pub mod key_series;
pub mod kv_events;
pub mod process;
pub mod queue;
pub mod reloads;
pub mod series;
pub mod text;
pub mod trace;

#[cfg(test)]
mod tests;

pub use gauges::{ScrapeStatus, TargetGauges};
pub use series::{GatewayMetrics, DURATION_BUCKETS, TTFT_BUCKETS};

/// Appends the configuration's series (digest, reload counts) to `out`.
pub fn render_reloads(stats: &crate::reload::ReloadStats, out: &mut String) {
    text::append(out, &reloads::registry(stats));
}

/// `Content-Type` of what [`GatewayMetrics::render`] writes.
pub use text::CONTENT_TYPE;
