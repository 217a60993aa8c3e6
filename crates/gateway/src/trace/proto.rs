//! OTLP's trace messages in protobuf, as far as the exporter sends them, and the request
//! one batch of [`SpanRecord`]s makes: one resource (`service.name`, `service.version`),
//! one instrumentation scope (`rolter`).
//!
//! The field numbers are those of opentelemetry-proto's `collector/trace/v1`,
//! `trace/v1`, `common/v1` and `resource/v1` files; fields the exporter never sets (links,
//! dropped counts, entity references, string tables) are left out, which protobuf allows.
//! Owns the wire shape only: no I/O.

use prost::Message;

use super::span::{AttrValue, Attributes, SpanKind, SpanRecord, SpanStatus};

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ResourceSpans`.
#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `Resource`.
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `ScopeSpans`.
#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `Span`.
#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
    #[prost(string, tag = "5")]
    pub name: String,
    /// `SpanKind`: 1 internal, 2 server, 3 client.
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
}

/// `Span.Event`.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<KeyValue>,
}

/// `Status`: code 0 unset, 1 ok, 2 error.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `AnyValue`, for the scalar kinds the exporter sends.
#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
    pub value: Option<Value>,
}

/// `AnyValue.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    Str(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
}

/// `SpanFlags`: the W3C trace flags (sampled) and whether the parent is remote.
const FLAG_SAMPLED: u32 = 0x01;
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// The instrumentation scope's name (and the resource's fallback service name).
pub const SCOPE_NAME: &str = "rolter";

/// The resource every export describes: this gateway as `service_name`.
pub fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: vec![
            key_value("service.name", Value::Str(service_name.to_string())),
            key_value(
                "service.version",
                Value::Str(env!("CARGO_PKG_VERSION").to_string()),
            ),
        ],
    }
}

/// Encodes `spans` (emptied) as one request for `resource` into `out` (cleared first).
pub fn encode_request(resource: &Resource, spans: &mut Vec<SpanRecord>, out: &mut Vec<u8>) {
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                }),
                spans: spans.drain(..).map(span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    out.clear();
    out.reserve(request.encoded_len());
    // A Vec grows as needed, so encoding into it cannot run out of room.
    let _ = request.encode(out);
}

/// One span's message.
fn span(s: SpanRecord) -> Span {
    let mut flags = FLAG_SAMPLED;
    if s.parent_span_id.is_some() {
        flags |= FLAG_HAS_IS_REMOTE;
        if s.remote_parent {
            flags |= FLAG_IS_REMOTE;
        }
    }
    let status = match s.status {
        SpanStatus::Unset => None,
        SpanStatus::Ok => Some(Status {
            message: String::new(),
            code: 1,
        }),
        SpanStatus::Error(message) => Some(Status { message, code: 2 }),
    };
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        trace_state: String::new(),
        parent_span_id: s.parent_span_id.map_or_else(Vec::new, |p| p.to_vec()),
        flags,
        name: s.name.into_owned(),
        kind: match s.kind {
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
        },
        start_time_unix_nano: s.start_unix_nanos,
        end_time_unix_nano: s.end_unix_nanos,
        attributes: attributes(s.attributes),
        events: s
            .events
            .into_iter()
            .map(|e| Event {
                time_unix_nano: e.time_unix_nanos,
                name: e.name.to_string(),
                attributes: attributes(e.attributes),
            })
            .collect(),
        status,
    }
}

fn attributes(attrs: Attributes) -> Vec<KeyValue> {
    attrs
        .into_iter()
        .map(|(k, v)| {
            let value = match v {
                AttrValue::Str(s) => Value::Str(s),
                AttrValue::Static(s) => Value::Str(s.to_string()),
                AttrValue::Int(n) => Value::Int(n),
                AttrValue::F64(x) => Value::Double(x),
                AttrValue::Bool(b) => Value::Bool(b),
            };
            key_value(k, value)
        })
        .collect()
}

fn key_value(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::span::SpanEvent;

    fn server_span() -> SpanRecord {
        let mut s = SpanRecord::new(
            [0xab; 16],
            [0x01; 8],
            Some([0x02; 8]),
            "POST /v1/chat/completions",
            SpanKind::Server,
            1_000,
        );
        s.remote_parent = true;
        s.end_unix_nanos = 9_000;
        s.attr("http.request.method", "POST");
        s.attr("http.response.status_code", 502i64);
        s.attr("rolter.weight", 0.5);
        s.attr("rolter.hedged", true);
        s.attr("gen_ai.request.model", String::from("llama-3"));
        s.events.push(SpanEvent {
            name: "retry",
            time_unix_nanos: 5_000,
            attributes: vec![("rolter.attempt", AttrValue::Int(2))],
        });
        s.status = SpanStatus::Error("upstream reset".into());
        s
    }

    fn kv(key: &str, value: Value) -> KeyValue {
        key_value(key, value)
    }

    #[test]
    fn a_request_decodes_back_to_what_was_recorded() {
        let mut spans = vec![
            server_span(),
            SpanRecord::new(
                [0xab; 16],
                [0x03; 8],
                None,
                "upstream",
                SpanKind::Client,
                2_000,
            ),
        ];
        let mut out = vec![0xff; 3];
        encode_request(&resource("gw"), &mut spans, &mut out);
        assert!(spans.is_empty());
        let decoded = ExportTraceServiceRequest::decode(out.as_slice()).unwrap();
        let [rs] = decoded.resource_spans.as_slice() else {
            panic!("{decoded:?}")
        };
        assert_eq!(
            rs.resource.as_ref().unwrap().attributes,
            vec![
                kv("service.name", Value::Str("gw".into())),
                kv(
                    "service.version",
                    Value::Str(env!("CARGO_PKG_VERSION").into())
                ),
            ]
        );
        let [ss] = rs.scope_spans.as_slice() else {
            panic!("{rs:?}")
        };
        assert_eq!(ss.scope.as_ref().unwrap().name, "rolter");
        let [server, client] = ss.spans.as_slice() else {
            panic!("{ss:?}")
        };
        assert_eq!(
            *server,
            Span {
                trace_id: vec![0xab; 16],
                span_id: vec![0x01; 8],
                trace_state: String::new(),
                parent_span_id: vec![0x02; 8],
                flags: 0x301,
                name: "POST /v1/chat/completions".into(),
                kind: 2,
                start_time_unix_nano: 1_000,
                end_time_unix_nano: 9_000,
                attributes: vec![
                    kv("http.request.method", Value::Str("POST".into())),
                    kv("http.response.status_code", Value::Int(502)),
                    kv("rolter.weight", Value::Double(0.5)),
                    kv("rolter.hedged", Value::Bool(true)),
                    kv("gen_ai.request.model", Value::Str("llama-3".into())),
                ],
                events: vec![Event {
                    time_unix_nano: 5_000,
                    name: "retry".into(),
                    attributes: vec![kv("rolter.attempt", Value::Int(2))],
                }],
                status: Some(Status {
                    message: "upstream reset".into(),
                    code: 2
                }),
            }
        );
        // A root span has no parent and no remote bits; no status is written as unset.
        assert_eq!(
            (client.parent_span_id.len(), client.flags, client.kind),
            (0, 0x01, 3)
        );
        assert_eq!(client.status, None);
    }
}
