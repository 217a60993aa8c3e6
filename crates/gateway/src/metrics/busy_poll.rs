//! `rolter_busy_poll_seconds_total`: the wall time the workers spent busy polling
//! (`server.busy_poll`), summed over workers. A worker polls on its core at 100 %, so the
//! series' rate is the CPU (in cores) that polling costs on top of serving.
//!
//! Owns the series' name and help text; it reads the shared counter at render time and
//! keeps no state.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::{Registry, Unit};

use crate::mesh::polling::PollStats;

/// Appends the series to `out`.
pub fn render(stats: &PollStats, out: &mut String) {
    let mut r = Registry::default();
    let c = Counter::<f64, AtomicU64>::default();
    c.inc_by(stats.total().as_secs_f64());
    r.register_with_unit(
        "rolter_busy_poll",
        "Wall time the workers spent polling their rings instead of sleeping (server.busy_poll), summed over workers; its rate is the cores polling keeps busy",
        Unit::Seconds,
        c,
    );
    super::text::append(out, &r);
}
