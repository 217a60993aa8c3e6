//! The trace plane's series (`[tracing]`): `rolter_trace_spans_exported_total`,
//! `rolter_trace_spans_dropped_total` and `rolter_trace_exports_failed_total`, from the
//! exporter's counters at render time.
//!
//! Owns the series' names and help texts; it keeps no state between renders.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::trace::TraceStats;

/// Appends the series of `stats` to `out`.
pub fn render(stats: &TraceStats, out: &mut String) {
    let series: [(&str, &str, u64); 3] = [
        (
            "rolter_trace_spans_exported",
            "Spans the OpenTelemetry collector accepted ([tracing])",
            stats.exported,
        ),
        (
            "rolter_trace_spans_dropped",
            "Spans never exported: the exporter's queue was full, or their export failed",
            stats.dropped,
        ),
        (
            "rolter_trace_exports_failed",
            "Exports to the OpenTelemetry collector that failed (no connection, a timeout, a non-2xx answer)",
            stats.failed_exports,
        ),
    ];
    let mut r = Registry::default();
    for (name, help, value) in series {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        r.register(name, help, c);
    }
    super::text::append(out, &r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_counters_are_rendered_with_help_and_type() {
        let mut out = String::new();
        let stats = TraceStats {
            exported: 12,
            dropped: 3,
            failed_exports: 1,
        };
        render(&stats, &mut out);
        assert_eq!(
            out,
            "# HELP rolter_trace_spans_exported_total Spans the OpenTelemetry collector accepted ([tracing]).\n\
             # TYPE rolter_trace_spans_exported_total counter\n\
             rolter_trace_spans_exported_total 12\n\
             # HELP rolter_trace_spans_dropped_total Spans never exported: the exporter's queue was full, or their export failed.\n\
             # TYPE rolter_trace_spans_dropped_total counter\n\
             rolter_trace_spans_dropped_total 3\n\
             # HELP rolter_trace_exports_failed_total Exports to the OpenTelemetry collector that failed (no connection, a timeout, a non-2xx answer).\n\
             # TYPE rolter_trace_exports_failed_total counter\n\
             rolter_trace_exports_failed_total 1\n"
        );
    }
}
