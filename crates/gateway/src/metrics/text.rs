//! The Prometheus text format (version 0.0.4) of one registry, appended to a page.
//!
//! Owns the encoding call every series module renders through. It must not hold or name
//! any series itself.

use prometheus_client::registry::Registry;

/// `Content-Type` of a page of these series.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Appends `registry`'s series to `out` in the Prometheus text format.
pub fn append(out: &mut String, registry: &Registry) {
    // Writing into a String cannot fail; an error could only come from an encoder bug.
    let written = prometheus_client::encoding::prometheus_text::encode(out, registry);
    debug_assert!(written.is_ok(), "metrics encoding failed");
}
