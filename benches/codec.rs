//! Hot-path codec costs: request-head parsing, routing-fact extraction, chunked decoding
//! and re-framing of an SSE event, and what the relay does to each read of a streamed
//! answer (decode, count the content deltas, look for usage, re-frame).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rolter::codec::api::deltas::DeltaCounter;
use rolter::codec::api::usage_chunk::UsageChunkCut;
use rolter::codec::api::{facts, usage};
use rolter::codec::h1::chunked::{encode_chunk, encode_chunk_parts, ChunkedDecoder};
use rolter::codec::h1::request_head::{self as head, HeadLimits};
use rolter::gateway::path::outgoing::Outgoing;
use rolter::gateway::path::request::{BodyInPlace, Request};
use rolter::gateway::path::route::Routed;
use rolter::gateway::path::upstream_request;

const HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.local:8080\r\nUser-Agent: OpenAI/Python 1.54.0\r\nAccept: application/json\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-test-0123456789abcdef\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.54.0\r\nx-session-id: user-42\r\nContent-Length: 1024\r\n\r\n";

fn chat_body(prompt_bytes: usize) -> Vec<u8> {
    let content = "lorem ipsum ".repeat(prompt_bytes / 12 + 1);
    format!(
        r#"{{"model":"llama-3.1-8b","stream":true,"stream_options":{{"include_usage":true}},"max_tokens":256,"temperature":0.7,"messages":[{{"role":"system","content":"You are a helpful assistant."}},{{"role":"user","content":"{}"}}]}}"#,
        &content[..prompt_bytes]
    )
    .into_bytes()
}

fn bench_head(c: &mut Criterion) {
    let limits = HeadLimits {
        max_head_bytes: 32 * 1024,
        max_headers: 100,
        max_uri_bytes: 8192,
        underscores: Default::default(),
    };
    let mut spans = Vec::with_capacity(32);
    let mut g = c.benchmark_group("head");
    g.throughput(Throughput::Bytes(HEAD.len() as u64));
    g.bench_function("parse_openai_sdk_head", |b| {
        b.iter(|| {
            head::parse(black_box(HEAD), &limits, &mut spans)
                .unwrap()
                .unwrap()
        })
    });
    g.finish();
}

fn bench_facts(c: &mut Criterion) {
    let mut g = c.benchmark_group("facts");
    for size in [1024usize, 32 * 1024] {
        let body = chat_body(size);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("extract_chat_{}k", size / 1024), |b| {
            b.iter(|| facts::extract(black_box(&body)).unwrap().prompt_tokens)
        });
    }
    g.finish();
}

fn bench_chunked(c: &mut Criterion) {
    let event = br#"data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1718000000,"model":"llama","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}

"#;
    let mut framed = Vec::new();
    encode_chunk(&mut framed, event);
    let mut out = Vec::with_capacity(1024);
    let mut g = c.benchmark_group("sse_event");
    g.throughput(Throughput::Bytes(event.len() as u64));
    g.bench_function("decode_and_reframe", |b| {
        b.iter(|| {
            out.clear();
            let mut d = ChunkedDecoder::new();
            d.feed(black_box(&framed), |piece| encode_chunk(&mut out, piece))
                .unwrap();
            out.len()
        })
    });
    g.finish();
}

/// A 64-token chat stream as an engine frames it (one chunk per event, usage in the last),
/// cut into the 4 KiB reads the relay makes.
fn chunked_stream() -> Vec<u8> {
    let mut framed = Vec::new();
    let head = r#"data: {"id":"chatcmpl-72529da172387fe44e6d89813d11b1cd","object":"chat.completion.chunk","created":1796171015,"model":"m","choices":[{"index":0,"delta":{"#;
    encode_chunk(
        &mut framed,
        format!("{head}\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n").as_bytes(),
    );
    for i in 0..64 {
        encode_chunk(
            &mut framed,
            format!("{head}\"content\":\" tok{i}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n").as_bytes(),
        );
    }
    encode_chunk(
        &mut framed,
        format!("{head}}},\"logprobs\":null,\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":250,\"total_tokens\":314,\"completion_tokens\":64}}}}\n\n").as_bytes(),
    );
    encode_chunk(&mut framed, b"data: [DONE]\n\n");
    framed.extend_from_slice(b"0\r\n\r\n");
    framed
}

/// The same stream as an engine asked for its usage sends it: the usage in an event of its
/// own, and with `nulls`, `"usage":null` on every token event (OpenAI's API, older vLLM).
fn asked_stream(nulls: bool) -> Vec<u8> {
    let mut framed = Vec::new();
    let head = r#"data: {"id":"chatcmpl-72529da172387fe44e6d89813d11b1cd","object":"chat.completion.chunk","created":1796171015,"model":"m","choices":["#;
    let token = |delta: &str, finish: &str| {
        let null = if nulls { r#","usage":null"# } else { "" };
        format!("{head}{{\"index\":0,\"delta\":{{{delta}}},\"logprobs\":null,\"finish_reason\":{finish}}}]{null}}}\n\n")
    };
    encode_chunk(
        &mut framed,
        token(r#""role":"assistant","content":"""#, "null").as_bytes(),
    );
    for i in 0..64 {
        encode_chunk(
            &mut framed,
            token(&format!(r#""content":" tok{i}""#), "null").as_bytes(),
        );
    }
    encode_chunk(&mut framed, token("", r#""length""#).as_bytes());
    encode_chunk(
        &mut framed,
        format!("{head}],\"usage\":{{\"prompt_tokens\":250,\"total_tokens\":314,\"completion_tokens\":64}}}}\n\n").as_bytes(),
    );
    encode_chunk(&mut framed, b"data: [DONE]\n\n");
    framed.extend_from_slice(b"0\r\n\r\n");
    framed
}

/// A stream's reads decoded, cut of their usage event and re-framed into `out`.
fn cut_stream(framed: &[u8], out: &mut Vec<u8>) -> Option<rolter::core::Usage> {
    let mut d = ChunkedDecoder::new();
    let mut cut = UsageChunkCut::new();
    for read in framed.chunks(4096) {
        out.clear();
        d.feed(read, |piece| {
            cut.feed(piece, |parts| encode_chunk_parts(out, parts))
        })
        .unwrap();
    }
    assert!(d.is_done());
    cut.usage()
}

/// The relay's work on a stream it asked the usage for: decode, cut the usage event and
/// the null fields, re-frame (`stream_usage = "ask"`); against counting the deltas and
/// scanning for usage over the same stream (`"count"`).
fn bench_asked_stream(c: &mut Criterion) {
    let framed = asked_stream(true);
    let plain = asked_stream(false);
    let mut out = Vec::with_capacity(8192);
    let mut g = c.benchmark_group("sse_stream_asked");
    g.throughput(Throughput::Bytes(framed.len() as u64));
    g.bench_function("cut_usage_no_null_fields_64_events_in_4k_reads", |b| {
        b.iter(|| cut_stream(black_box(&plain), &mut out))
    });
    g.bench_function("cut_usage_64_events_in_4k_reads", |b| {
        b.iter(|| cut_stream(black_box(&framed), &mut out))
    });
    g.bench_function("count_deltas_64_events_in_4k_reads", |b| {
        b.iter(|| {
            let mut d = ChunkedDecoder::new();
            let mut deltas = DeltaCounter::default();
            let mut found = None;
            for read in black_box(&framed).chunks(4096) {
                out.clear();
                found = usage::scan(read).or(found);
                d.feed(read, |piece| {
                    deltas.feed(piece);
                    encode_chunk(&mut out, piece)
                })
                .unwrap();
            }
            assert!(d.is_done());
            (deltas.count(), found)
        })
    });
    g.finish();
}

fn bench_stream(c: &mut Criterion) {
    let framed = chunked_stream();
    let mut out = Vec::with_capacity(8192);
    let mut g = c.benchmark_group("sse_stream");
    g.throughput(Throughput::Bytes(framed.len() as u64));
    g.bench_function("relay_64_events_in_4k_reads", |b| {
        b.iter(|| {
            let mut d = ChunkedDecoder::new();
            let mut deltas = DeltaCounter::default();
            let mut found = None;
            for read in black_box(&framed).chunks(4096) {
                out.clear();
                found = usage::scan(read).or(found);
                d.feed(read, |piece| {
                    deltas.feed(piece);
                    encode_chunk(&mut out, piece)
                })
                .unwrap();
            }
            assert!(d.is_done());
            (deltas.count(), found)
        })
    });
    g.bench_function("scan_usage_64_events_in_4k_reads", |b| {
        b.iter(|| {
            black_box(&framed)
                .chunks(4096)
                .fold(None, |found, read| usage::scan(read).or(found))
        })
    });
    g.bench_function("decode_64_events", |b| {
        b.iter(|| {
            let mut d = ChunkedDecoder::new();
            let mut n = 0;
            d.feed(black_box(&framed), |piece| n += piece.len())
                .unwrap();
            n
        })
    });
    g.bench_function("count_deltas_64_events", |b| {
        b.iter(|| {
            let mut d = ChunkedDecoder::new();
            let mut deltas = DeltaCounter::default();
            d.feed(black_box(&framed), |piece| deltas.feed(piece))
                .unwrap();
            deltas.count()
        })
    });
    g.finish();
}

fn bench_rewrite(c: &mut Criterion) {
    // The upstream request for a typical SDK request: hop-by-hop and client auth removed, a
    // target key injected, X-Forwarded-For replaced, fresh Content-Length, the body copied
    // after the head (1 KiB, 32 KiB) or, at 32 KiB, left in place for a vectored write.
    let config = rolter::config::load_str(
        r#"
[[targets]]
name = "vllm-0"
url = "http://127.0.0.1:8000"
headers = { "Authorization" = "Bearer upstream-key" }
"#,
        "<bench>",
    )
    .unwrap();
    let limits = HeadLimits {
        max_head_bytes: 32 * 1024,
        max_headers: 100,
        max_uri_bytes: 8192,
        underscores: Default::default(),
    };
    let mut g = c.benchmark_group("rewrite");
    for (name, size, in_place) in [
        ("upstream_request_1k", 1024, false),
        ("upstream_request_32k_copied", 32 * 1024, false),
        ("upstream_request_32k_in_place", 32 * 1024, true),
    ] {
        let body = chat_body(size);
        let mut raw = HEAD.to_vec();
        raw.extend_from_slice(&body);
        let raw = std::rc::Rc::new(raw);
        let mut spans = Vec::new();
        let head = head::parse(&raw, &limits, &mut spans).unwrap().unwrap();
        let body = &raw[head.len..];
        let facts = facts::extract(body).unwrap();
        let req = Request {
            head: &head,
            buf: &raw,
            spans: &spans,
            body,
            body_in_place: in_place.then_some(BodyInPlace {
                buf: &raw,
                at: head.len,
            }),
            peer_ip: "10.1.2.3",
            peer: "10.1.2.3:50000".parse().unwrap(),
            close: false,
            id: rolter::codec::h1::request_id::RequestId::generate(),
            started: std::time::Instant::now(),
            time: std::time::SystemTime::now(),
            surface: rolter::codec::Surface::OpenAi,
        };
        let routed = Routed {
            facts,
            index: 0,
            route: &config.routes[0],
            passthrough: false,
            key_header: None,
        };
        let mut out = Outgoing::default();
        out.bytes.reserve(64 * 1024);
        g.bench_function(name, |b| {
            b.iter(|| {
                upstream_request::build(&mut out, black_box(&req), &routed, &config.targets[0]);
                out.len()
            })
        });
        out.clear();
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_head,
    bench_facts,
    bench_chunked,
    bench_stream,
    bench_asked_stream,
    bench_rewrite
);
criterion_main!(benches);
