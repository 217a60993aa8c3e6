//! The trace plane (`[tracing]`): OpenTelemetry spans of the requests, built on the
//! workers and exported over OTLP/HTTP in protobuf by the `rolter-traces` thread.
//!
//! - [`span`]: the [`SpanRecord`] a worker fills, new ids, the clock.
//! - [`sampler`]: whether a trace is sampled (the client's flag, or the trace id's ratio).
//! - [`export`]: the [`Tracer`] workers record with (never waits, drops and counts when
//!   full), the exporter thread and its [`ExporterHandle`], the [`TraceStats`].
//! - `proto`: OTLP's protobuf messages; `client`: the blocking HTTP/1.1 (or TLS) client
//!   for the collector.
//!
//! A bottom module of the gateway: it uses only the codec (`traceparent`, response
//! framing), the configuration and third-party crates, nothing of the gateway's other
//! modules. The `traceparent` header itself is parsed and written by
//! `rolter_codec::h1::traceparent`.

mod client;
pub mod export;
mod proto;
pub mod sampler;
pub mod span;

#[cfg(test)]
mod tests;

pub use export::{start, ExporterHandle, TraceStats, Tracer};
pub use sampler::sampled;
pub use span::{
    new_span_id, new_trace_id, now_unix_nanos, unix_nanos, AttrValue, SpanEvent, SpanKind,
    SpanRecord, SpanStatus,
};
