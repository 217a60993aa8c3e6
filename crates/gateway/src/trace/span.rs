//! The span a worker builds for the trace plane: ids, name, kind, times, attributes,
//! events and status, all owned values, and the helpers that make new ids and read the
//! clock.
//!
//! Owns the span's shape only. Nothing here does I/O or touches another thread: a worker
//! fills a [`SpanRecord`] and hands it to [`super::export::Tracer::record`].

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

/// What the span stands for (OTLP's `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the gateway (a queue wait, a pick).
    Internal,
    /// The client's request as the gateway served it.
    Server,
    /// One request the gateway sent upstream.
    Client,
}

/// An attribute's value. `Static` keeps a constant string without allocating.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Static(&'static str),
    Int(i64),
    F64(f64),
    Bool(bool),
}

impl From<&'static str> for AttrValue {
    fn from(v: &'static str) -> Self {
        AttrValue::Static(v)
    }
}

impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        AttrValue::Str(v)
    }
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}

impl From<u64> for AttrValue {
    /// Saturates at `i64::MAX` (OTLP's integers are signed).
    fn from(v: u64) -> Self {
        AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::F64(v)
    }
}

impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}

/// Attributes: keys are constants (semantic-convention names).
pub type Attributes = Vec<(&'static str, AttrValue)>;

/// Something that happened at one instant of a span (the first token, a retry).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    pub name: &'static str,
    pub time_unix_nanos: u64,
    pub attributes: Attributes,
}

/// How the span's work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanStatus {
    Unset,
    Ok,
    /// Failed, with a description.
    Error(String),
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// `None` for a trace's root span.
    pub parent_span_id: Option<[u8; 8]>,
    /// The parent is another process's span (a client's `traceparent`).
    pub remote_parent: bool,
    /// The span's name, e.g. `POST /v1/chat/completions`.
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Attributes,
    pub events: Vec<SpanEvent>,
    pub status: SpanStatus,
}

impl SpanRecord {
    /// A span started at `start_unix_nanos` (its end is set to the same instant: set
    /// `end_unix_nanos` when it ends), with no attributes, events or status yet.
    pub fn new(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        parent_span_id: Option<[u8; 8]>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        start_unix_nanos: u64,
    ) -> SpanRecord {
        SpanRecord {
            trace_id,
            span_id,
            parent_span_id,
            remote_parent: false,
            name: name.into(),
            kind,
            start_unix_nanos,
            end_unix_nanos: start_unix_nanos,
            attributes: Vec::new(),
            events: Vec::new(),
            status: SpanStatus::Unset,
        }
    }

    /// Adds an attribute.
    pub fn attr(&mut self, key: &'static str, value: impl Into<AttrValue>) {
        self.attributes.push((key, value.into()));
    }

    /// Adds an event without attributes at `time_unix_nanos`.
    pub fn event(&mut self, name: &'static str, time_unix_nanos: u64) {
        self.events.push(SpanEvent {
            name,
            time_unix_nanos,
            attributes: Vec::new(),
        });
    }
}

/// A new random trace id, never all zero.
pub fn new_trace_id() -> [u8; 16] {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A new random span id, never all zero.
pub fn new_span_id() -> [u8; 8] {
    fastrand::u64(1..).to_be_bytes()
}

/// `t` in nanoseconds since the Unix epoch (0 before it).
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Now, in nanoseconds since the Unix epoch.
pub fn now_unix_nanos() -> u64 {
    unix_nanos(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_never_zero() {
        let traces: std::collections::HashSet<[u8; 16]> =
            (0..1000).map(|_| new_trace_id()).collect();
        let spans: std::collections::HashSet<[u8; 8]> = (0..1000).map(|_| new_span_id()).collect();
        assert_eq!((traces.len(), spans.len()), (1000, 1000));
        assert!(!traces.contains(&[0; 16]) && !spans.contains(&[0; 8]));
    }

    #[test]
    fn a_span_is_built_with_attributes_and_events() {
        let mut s = SpanRecord::new(
            [1; 16],
            [2; 8],
            None,
            "POST /v1/chat/completions",
            SpanKind::Server,
            10,
        );
        s.attr("http.request.method", "POST");
        s.attr("http.response.status_code", 200i64);
        s.attr("rolter.retried", false);
        s.attr("gen_ai.request.model", String::from("llama"));
        s.event("first_token", 15);
        s.end_unix_nanos = 20;
        assert_eq!(s.name, "POST /v1/chat/completions");
        assert_eq!(
            s.attributes,
            vec![
                ("http.request.method", AttrValue::Static("POST")),
                ("http.response.status_code", AttrValue::Int(200)),
                ("rolter.retried", AttrValue::Bool(false)),
                ("gen_ai.request.model", AttrValue::Str("llama".into())),
            ]
        );
        assert_eq!(
            s.events,
            vec![SpanEvent {
                name: "first_token",
                time_unix_nanos: 15,
                attributes: vec![]
            }]
        );
        assert_eq!(AttrValue::from(u64::MAX), AttrValue::Int(i64::MAX));
    }

    #[test]
    fn the_clock_reads_nanoseconds_since_the_epoch() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1500);
        assert_eq!(unix_nanos(t), 1_500_000_000);
        assert_eq!(
            unix_nanos(UNIX_EPOCH - std::time::Duration::from_secs(1)),
            0
        );
        assert!(now_unix_nanos() > 1_700_000_000_000_000_000);
    }
}
