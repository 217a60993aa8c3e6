//! Fuzz targets for Rolter's byte parsers: one plain function per target, which feeds the
//! parser and checks what its contract promises (bounds, the same answer however the
//! input is split into reads, agreement with a reference implementation), not only that it
//! does not panic. A broken promise panics, which AFL++ records as a crash.
//!
//! The AFL++ binaries (`src/bin/`) and the corpus replay test (`tests/corpus.rs`) call the
//! same functions, listed in [`TARGETS`].

use std::borrow::Cow;

use rolter_codec::api::deltas::DeltaCounter;
use rolter_codec::api::usage_chunk::UsageChunkCut;
use rolter_codec::api::{facts as json_facts, multipart as form, usage};
use rolter_codec::h1::chunked::{encode_chunk, ChunkError, ChunkedDecoder, LAST_CHUNK};
use rolter_codec::h1::request_head::{
    self, BodyFraming, HeadError, HeadLimits, HeaderSpan, RequestHead, UnderscoreHeaders,
};
use rolter_codec::h1::{parse_content_length, trim_ows};
use rolter_codec::translate::sse::{SseSplitter, MAX_EVENT};
use rolter_engine::kv::events::{
    decode_batch, decode_message, parse_seq, DecodeError, EventBatch, KvEvent, REPLAY_END_SEQ,
};

mod chunked_reference;
mod host_reference;
mod replay;

pub use replay::{files, replay_main};

/// A target: what the fuzzer's input is fed to.
pub type Target = fn(&[u8]);

/// Every target by name: the name of its binary, of its corpus folder and of its
/// regressions folder.
pub const TARGETS: &[(&str, Target)] = &[
    ("request_head", request_head),
    ("chunked", chunked),
    ("sse", sse),
    ("multipart", multipart),
    ("facts", facts),
    ("kv_events", kv_events),
    ("host", host),
];

/// A few ordinary inputs, one of each kind the targets parse.
const WARM_UP: &[&[u8]] = &[
    b"",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"data: {\"content\":\"x\",\"text\":\"y\",\"prompt_tokens\":1}\n\n",
    b"multipart/form-data; boundary=b\n--b\r\n\r\nx\r\n--b--",
    b"{\"model\":\"m\",\"stream\":true}",
    b"\x92\xcb\0\0\0\0\0\0\0\0\x90",
];

/// Runs `target` over a few ordinary inputs, so that what the parsers build or detect once
/// per process (lazily built searches, CPU feature detection) is done before AFL++'s fork
/// server starts: otherwise the first input of every child takes other paths than the rest,
/// which AFL++ counts as instability.
pub fn warm_up(target: Target) {
    for input in WARM_UP {
        target(input);
    }
}

/// Where to split an input of `len` bytes in two: at every boundary when it is short, else
/// at nine evenly spaced points and one that the last two bytes of `data` choose.
fn cut_points(len: usize, data: &[u8]) -> Vec<usize> {
    if len <= 64 {
        return (0..=len).collect();
    }
    let mut cuts: Vec<usize> = (0..=8).map(|i| i * len / 8).collect();
    let chosen = u16::from_le_bytes([data[data.len() - 2], data[data.len() - 1]]);
    cuts.push(usize::from(chosen) % (len + 1));
    cuts
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether `part` lies inside `whole` (an empty slice anywhere counts).
fn inside(whole: &[u8], part: &[u8]) -> bool {
    let (start, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    part.is_empty() || (p >= start && p + part.len() <= start + whole.len())
}

// ---------------------------------------------------------------------------------------
// 1. Request head.

/// The limits the targets parse heads with (the gateway's defaults).
const LIMITS: HeadLimits = HeadLimits {
    max_head_bytes: 32 * 1024,
    max_headers: 100,
    max_uri_bytes: 8192,
    underscores: UnderscoreHeaders::Drop,
};

type Parsed = Result<Option<RequestHead>, HeadError>;

fn parse_head(data: &[u8], underscores: UnderscoreHeaders) -> (Parsed, Vec<HeaderSpan>) {
    let mut spans = Vec::new();
    let limits = HeadLimits {
        underscores,
        ..LIMITS
    };
    let parsed = request_head::parse(data, &limits, &mut spans);
    (parsed, spans)
}

/// `RequestHead` has no `PartialEq`: its debug text says everything it holds.
fn summary(p: &Parsed) -> String {
    format!("{p:?}")
}

/// The request-head parser: a head it accepts is well-formed and its ranges lie inside it;
/// the bytes after a head do not change it; every prefix of a head it accepts (or still
/// waits for) is incomplete, never refused; the underscore policies differ only in the
/// fields they drop or refuse.
pub fn request_head(data: &[u8]) {
    let (whole, spans) = parse_head(data, UnderscoreHeaders::Drop);
    if let Ok(Some(head)) = &whole {
        check_head(data, head, &spans, UnderscoreHeaders::Drop);
        let (again, again_spans) = parse_head(&data[..head.len], UnderscoreHeaders::Drop);
        assert_eq!(summary(&again), summary(&whole), "the bytes after the head");
        assert_eq!(again_spans, spans, "the bytes after the head");
    }
    check_underscore_policies(data, &whole, &spans);
    if whole.is_ok() {
        let end = match &whole {
            Ok(Some(head)) => head.len,
            _ => data.len(),
        };
        for cut in cut_points(end, data).into_iter().filter(|&c| c < end) {
            let (prefix, _) = parse_head(&data[..cut], UnderscoreHeaders::Drop);
            assert!(
                matches!(prefix, Ok(None)),
                "prefix of {cut} bytes of an acceptable head: {prefix:?}"
            );
        }
    }
}

/// What an accepted head must be.
fn check_head(data: &[u8], head: &RequestHead, spans: &[HeaderSpan], policy: UnderscoreHeaders) {
    assert!(head.len <= data.len(), "head longer than its input");
    let raw = &data[..head.len];
    assert!(raw.ends_with(b"\r\n\r\n"), "head not ended by a blank line");
    for (i, &b) in raw.iter().enumerate() {
        if b == b'\n' {
            assert!(i > 0 && raw[i - 1] == b'\r', "bare LF accepted at {i}");
        }
        if b == b'\r' {
            assert_eq!(raw.get(i + 1), Some(&b'\n'), "bare CR accepted at {i}");
        }
    }
    let (path, query) = (head.path.clone(), head.query.clone());
    assert!(path.start < path.end && path.end == query.start && query.end <= head.len);
    assert_eq!(raw[path.start], b'/', "path not in origin form");
    assert!(!raw[path.clone()].contains(&b'?'), "query left in the path");
    assert!(query.is_empty() || raw[query.start] == b'?');
    assert!(
        !raw[path.start..query.end].contains(&b'#'),
        "fragment accepted"
    );
    assert_eq!(head.path(data).as_bytes(), &raw[path]);
    let mut after = 0;
    for s in spans {
        let (name, value) = (
            s.name.0 as usize..s.name.1 as usize,
            s.value.0 as usize..s.value.1 as usize,
        );
        assert!(after <= name.start && name.start < name.end && name.end <= value.start);
        assert!(
            value.start <= value.end && value.end <= head.len,
            "span outside the head"
        );
        after = value.end;
        assert!(raw[name].iter().all(|&b| request_head::is_tchar(b)));
        assert!(!raw[value].iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)));
        if policy == UnderscoreHeaders::Drop {
            assert!(!s.name(data).contains(&b'_'), "underscored name kept");
        }
    }
    check_framing(data, head, spans);
}

/// The framing, Host and Expect an accepted head reports, against its fields.
fn check_framing(data: &[u8], head: &RequestHead, spans: &[HeaderSpan]) {
    let named = |name: &str| -> Vec<&[u8]> {
        spans
            .iter()
            .filter(|s| s.is(data, name))
            .map(|s| s.value(data))
            .collect()
    };
    let (cl, te, hosts) = (
        named("content-length"),
        named("transfer-encoding"),
        named("host"),
    );
    match head.framing {
        BodyFraming::Chunked => assert!(te.len() == 1 && cl.is_empty() && !head.http10),
        BodyFraming::Length(n) => {
            assert!(te.is_empty() && cl.len() == 1 && n > 0);
            assert_eq!(parse_content_length(cl[0]), Some(n));
        }
        BodyFraming::None => {
            assert!(te.is_empty() && cl.len() <= 1);
            assert!(cl.iter().all(|v| parse_content_length(v) == Some(0)));
        }
    }
    assert!(
        hosts.len() <= 1 && (head.http10 || hosts.len() == 1),
        "Host count"
    );
    assert!(hosts.iter().all(|v| request_head::valid_host(v)));
    if head.expect_continue {
        assert!(!head.http10);
        assert!(named("expect")
            .iter()
            .all(|v| trim_ows(v).eq_ignore_ascii_case(b"100-continue")));
    }
    assert!(!head.http10 || head.close, "HTTP/1.0 kept alive");
}

/// Dropping underscored fields reads the head as if they were absent; forwarding them keeps
/// them; refusing them refuses exactly the heads that have one.
fn check_underscore_policies(data: &[u8], dropped: &Parsed, dropped_spans: &[HeaderSpan]) {
    let (forward, forward_spans) = parse_head(data, UnderscoreHeaders::Forward);
    assert_eq!(
        summary(&forward),
        summary(dropped),
        "forward and drop differ"
    );
    let Ok(Some(head)) = &forward else {
        return;
    };
    check_head(data, head, &forward_spans, UnderscoreHeaders::Forward);
    let kept: Vec<HeaderSpan> = forward_spans
        .iter()
        .filter(|s| !s.name(data).contains(&b'_'))
        .copied()
        .collect();
    assert_eq!(
        kept, dropped_spans,
        "drop is not forward less the underscored fields"
    );
    let (reject, reject_spans) = parse_head(data, UnderscoreHeaders::Reject);
    if kept.len() == forward_spans.len() {
        assert_eq!(summary(&reject), summary(dropped));
        assert_eq!(reject_spans, dropped_spans);
    } else {
        assert_eq!(
            reject.unwrap_err(),
            HeadError::BadRequest("header name with an underscore")
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. Chunked decoder.

/// What feeding a chunked decoder some reads left.
#[derive(Debug, PartialEq)]
struct Decoded {
    out: Vec<u8>,
    consumed: usize,
    done: bool,
    decoded: u64,
    pending: u64,
}

fn feed_chunked(parts: &[&[u8]]) -> Result<Decoded, ChunkError> {
    let mut d = ChunkedDecoder::new();
    let (mut out, mut consumed) = (Vec::new(), 0);
    for part in parts {
        if d.is_done() {
            break;
        }
        let n = d.feed(part, |s| out.extend_from_slice(s))?;
        assert!(n <= part.len(), "consumed more than fed");
        assert!(
            n == part.len() || d.is_done(),
            "stopped before the end of the body"
        );
        consumed += n;
    }
    Ok(Decoded {
        out,
        consumed,
        done: d.is_done(),
        decoded: d.decoded,
        pending: d.pending_chunk_bytes(),
    })
}

/// The chunked decoder: it agrees with a whole-input reference of the grammar, hands out no
/// more bytes than it consumed, gives the same result fed whole, in two reads split
/// anywhere, or a byte at a time, and decodes what `encode_chunk` writes.
pub fn chunked(data: &[u8]) {
    use chunked_reference::Outcome;
    let whole = feed_chunked(&[data]);
    match (&whole, chunked_reference::decode(data)) {
        (
            Ok(d),
            Outcome::Done {
                data: out,
                consumed,
            },
        ) => {
            assert!(d.done && d.out == out && d.consumed == consumed, "{d:?}");
        }
        (Ok(d), Outcome::Incomplete { data: out }) => {
            assert!(!d.done && d.out == out && d.consumed == data.len(), "{d:?}");
        }
        (Err(_), Outcome::Invalid) => {}
        (got, want) => panic!("decoder {got:?}, reference {want:?}"),
    }
    if let Ok(d) = &whole {
        assert!(d.out.len() <= d.consumed && d.consumed <= data.len());
        assert_eq!(d.decoded, d.out.len() as u64);
        assert!(!d.done || d.out.len() + LAST_CHUNK.len() <= d.consumed);
    }
    for cut in cut_points(data.len(), data) {
        let split = feed_chunked(&[&data[..cut], &data[cut..]]);
        assert_eq!(split, whole, "split at {cut}");
    }
    let bytes: Vec<&[u8]> = data.chunks(1).collect();
    assert_eq!(feed_chunked(&bytes), whole, "fed a byte at a time");
    if let Ok(d) = &whole {
        let mut encoded = Vec::new();
        encode_chunk(&mut encoded, &d.out);
        encoded.extend_from_slice(LAST_CHUNK);
        let back = feed_chunked(&[&encoded]).expect("encode_chunk's output decodes");
        assert!(back.done && back.out == d.out && back.consumed == encoded.len());
    }
}

// ---------------------------------------------------------------------------------------
// 3. SSE splitter, delta counter, usage scan.

/// What an SSE splitter made of some reads.
#[derive(Debug, PartialEq)]
struct Split {
    events: Vec<(String, String)>,
    overflowed: bool,
    partial: bool,
}

fn split_sse(parts: &[&[u8]]) -> Split {
    let mut s = SseSplitter::default();
    let mut events = Vec::new();
    for part in parts {
        s.feed(part, |e| {
            events.push((e.name.to_string(), e.data.to_string()))
        });
    }
    Split {
        events,
        overflowed: s.overflowed(),
        partial: s.holds_partial(),
    }
}

fn count_deltas(parts: &[&[u8]]) -> u32 {
    let mut c = DeltaCounter::default();
    for part in parts {
        c.feed(part);
    }
    c.count()
}

/// The SSE splitter: its events hold no more characters than the input had bytes (a
/// replacement character stands for at least one byte), at least 6 bytes make an event,
/// and the events are the same however the input is split into reads (within
/// `MAX_EVENT`: past it, whether a held event overflows depends on the reads, by design).
/// The delta counter counts the same whole, split or a byte at a time, at most one delta
/// per 9 bytes; the usage scan reports only numbers the input holds.
pub fn sse(data: &[u8]) {
    let whole = split_sse(&[data]);
    let chars: usize = whole
        .events
        .iter()
        .map(|(name, d)| name.chars().count() + d.chars().count())
        .sum();
    assert!(chars <= data.len(), "events longer than their input");
    assert!(whole.events.len() * 6 <= data.len(), "too many events");
    for (name, d) in &whole.events {
        assert!(
            !name.contains(['\r', '\n']) && !d.contains('\r'),
            "line end kept"
        );
    }
    if data.len() <= MAX_EVENT {
        for cut in cut_points(data.len(), data) {
            assert_eq!(
                split_sse(&[&data[..cut], &data[cut..]]),
                whole,
                "split at {cut}"
            );
        }
    }
    let count = count_deltas(&[data]);
    assert!(
        count as usize * 9 <= data.len(),
        "more deltas than bytes allow"
    );
    for cut in cut_points(data.len(), data) {
        assert_eq!(
            count_deltas(&[&data[..cut], &data[cut..]]),
            count,
            "split at {cut}"
        );
    }
    let bytes: Vec<&[u8]> = data.chunks(1).collect();
    assert_eq!(count_deltas(&bytes), count, "fed a byte at a time");
    if let Some(u) = usage::scan(data) {
        assert!(contains(data, u.prompt_tokens.to_string().as_bytes()));
        assert!(
            u.completion_tokens == 0 || contains(data, u.completion_tokens.to_string().as_bytes())
        );
    }
    usage_cut(data);
}

/// The usage event's cut: never more bytes out than in, the same bytes and usage however
/// the reads split the stream, and nothing but whole events while it holds.
fn usage_cut(data: &[u8]) {
    let run = |reads: &[&[u8]]| {
        let mut cut = UsageChunkCut::new();
        let mut out = Vec::new();
        for r in reads {
            cut.feed(r, |parts| {
                parts.iter().for_each(|p| out.extend_from_slice(p))
            });
        }
        cut.finish(|parts| parts.iter().for_each(|p| out.extend_from_slice(p)));
        (out, cut.usage())
    };
    let whole = run(&[data]);
    assert!(whole.0.len() <= data.len(), "the cut added bytes");
    for cut in cut_points(data.len(), data) {
        assert_eq!(run(&[&data[..cut], &data[cut..]]), whole, "split at {cut}");
    }
}

// ---------------------------------------------------------------------------------------
// 4. Multipart `model` scan.

/// The multipart scan. The input is a `Content-Type` value, a LF, then the body. A boundary
/// is 1 to 70 bytes of the content type without CR or LF; a `model` span lies in the body,
/// after a blank line and right before a delimiter; `extract` agrees with `model_field`;
/// and an epilogue after the close delimiter (here, one holding a second `model` part)
/// changes nothing.
pub fn multipart(data: &[u8]) {
    let (content_type, body) = match data.iter().position(|&b| b == b'\n') {
        Some(lf) => (&data[..lf], &data[lf + 1..]),
        None => (data, &data[data.len()..]),
    };
    let boundary = match form::boundary(content_type) {
        Ok(Some(b)) => b,
        Ok(None) => return,
        Err(e) => return assert_eq!(e.status, 400),
    };
    assert!((1..=70).contains(&boundary.len()) && inside(content_type, boundary));
    assert!(!boundary.iter().any(|&b| b == b'\r' || b == b'\n'));
    let mut delim = b"\r\n--".to_vec();
    delim.extend_from_slice(boundary);
    let field = form::model_field(body, boundary).map_err(|e| (e.status, e.code));
    match &field {
        Ok(Some(span)) => {
            assert!(span.start <= span.end && span.end <= body.len());
            assert!(
                body[..span.start].ends_with(b"\r\n"),
                "value not after a blank line"
            );
            assert!(
                body[span.end..].starts_with(&delim),
                "value not ended by a delimiter"
            );
        }
        Ok(None) => {}
        Err(e) => assert_eq!(*e, (400, "invalid_multipart")),
    }
    match (&field, form::extract(body, boundary)) {
        (Ok(Some(span)), Ok(f)) => {
            assert_eq!(f.model.as_bytes(), &body[span.clone()]);
            assert!(matches!(f.model, Cow::Borrowed(_)) && !f.model_is_json);
            assert_eq!(f.model_span.as_ref(), Some(span));
        }
        (Ok(Some(span)), Err(e)) => {
            assert!(std::str::from_utf8(&body[span.clone()]).is_err() && e.status == 400);
        }
        (Ok(None), Ok(f)) => assert!(f.model.is_empty() && f.model_span.is_none()),
        (Err(_), Err(e)) => assert_eq!(e.status, 400),
        (field, facts) => panic!(
            "model_field {field:?}, extract {:?}",
            facts.map(|f| f.model)
        ),
    }
    if field.is_ok() {
        let mut longer = body.to_vec();
        for piece in [
            &delim[..],
            b"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nx",
        ] {
            longer.extend_from_slice(piece);
        }
        longer.extend_from_slice(&delim);
        longer.extend_from_slice(b"--\r\n");
        let again = form::model_field(&longer, boundary).map_err(|e| (e.status, e.code));
        assert_eq!(again, field, "the epilogue changed the answer");
    }
}

// ---------------------------------------------------------------------------------------
// 5. JSON request facts.

/// The JSON facts: the `model` span lies in the body and is a JSON string; a borrowed model
/// is the text between its quotes (a substring of the body), a decoded one is what
/// `serde_json` decodes the span to; the prompt is a slice of the body; and where
/// `serde_json`'s own tree holds the body, `model` and `stream` agree with it.
pub fn facts(data: &[u8]) {
    let f = match json_facts::extract(data) {
        Ok(f) => f,
        Err(e) => return assert_eq!(e.status, 400),
    };
    assert!(
        f.model_is_json && inside(data, f.prompt),
        "prompt outside the body"
    );
    assert!(f.prompt_tokens as usize <= data.len().div_ceil(4));
    match &f.model_span {
        None => assert!(f.model.is_empty(), "a model without a span"),
        Some(span) => {
            assert!(span.start + 2 <= span.end && span.end <= data.len());
            let json = &data[span.clone()];
            assert!(
                json[0] == b'"' && json[json.len() - 1] == b'"',
                "span not a string"
            );
            match &f.model {
                Cow::Borrowed(m) => {
                    assert!(
                        inside(data, m.as_bytes()),
                        "model not borrowed from the body"
                    );
                    assert_eq!(m.as_bytes(), &json[1..json.len() - 1]);
                }
                Cow::Owned(m) => {
                    assert!(json.contains(&b'\\'), "decoded a string without escapes");
                    let decoded: Option<String> = serde_json::from_slice(json).ok();
                    assert_eq!(decoded.as_deref(), Some(m.as_str()));
                }
            }
        }
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(data) {
        match map.get("model") {
            Some(serde_json::Value::String(m)) => assert_eq!(f.model, m.as_str()),
            None | Some(serde_json::Value::Null) => assert!(f.model_span.is_none()),
            Some(other) => panic!("a non-string model accepted: {other}"),
        }
        let stream = map.get("stream").and_then(serde_json::Value::as_bool);
        assert_eq!(f.stream, stream.unwrap_or(false));
    }
}

// ---------------------------------------------------------------------------------------
// 6. KV-event msgpack decoder.

fn same_batch(a: &EventBatch, b: &EventBatch) -> bool {
    a.ts.to_bits() == b.ts.to_bits()
        && a.data_parallel_rank == b.data_parallel_rank
        && a.unknown_events == b.unknown_events
        && a.events().eq(b.events())
}

/// A decoded batch's counts are bounded by its payload's size (every event, hash, token id
/// and extra-key digest takes at least one byte) and its strings occur in the payload; a
/// failed decode leaves the batch empty.
fn check_batch(data: &[u8], result: &Result<(), DecodeError>, batch: &EventBatch) {
    if result.is_err() {
        assert!(
            batch.is_empty() && batch.unknown_events == 0,
            "error left events"
        );
        assert!(batch.ts.to_bits() == 0 && batch.data_parallel_rank.is_none());
        return;
    }
    let n = data.len();
    assert!(
        batch.len() + batch.unknown_events as usize <= n,
        "more events than bytes"
    );
    assert_eq!(batch.events().len(), batch.len());
    let (mut hashes, mut tokens, mut digests) = (0, 0, 0);
    for event in batch.events() {
        match event {
            KvEvent::BlockStored(s) => {
                hashes += s.block_hashes.len();
                tokens += s.token_ids.len();
                digests += s.extra_digests.map_or(0, <[u64]>::len);
                for text in [s.lora_name, s.cache_salt, s.kv_cache_spec_kind]
                    .into_iter()
                    .flatten()
                {
                    assert!(
                        contains(data, text.as_bytes()),
                        "{text:?} not in the payload"
                    );
                }
            }
            KvEvent::BlockRemoved(r) => hashes += r.block_hashes.len(),
            KvEvent::AllBlocksCleared { .. } => {}
        }
    }
    assert!(
        hashes <= n && tokens <= n && digests <= n,
        "{hashes} {tokens} {digests}"
    );
}

/// The KV-event decoder, on the input as a payload: the batch checks above; a reused batch
/// decodes the same as a new one; `decode_message` with a topic and a sequence decodes
/// the same; as a replay reply whose sequence frame is the input's first 8 bytes, it
/// follows `parse_seq`; one frame is a frame-count error.
pub fn kv_events(data: &[u8]) {
    let mut batch = EventBatch::new();
    let result = decode_batch(data, &mut batch);
    check_batch(data, &result, &batch);
    let mut reused = EventBatch::new();
    let _ = decode_batch(&data[data.len() / 2..], &mut reused);
    assert_eq!(decode_batch(data, &mut reused), result);
    assert!(
        same_batch(&reused, &batch),
        "a reused batch decodes differently"
    );
    let seq = 7u64.to_be_bytes();
    let head = decode_message(&[b"kv@fuzz", &seq, data], &mut reused);
    let want = result.clone().map(|()| (&b"kv@fuzz"[..], 7));
    assert_eq!(head.map(|h| (h.topic, h.seq)), want);
    assert!(
        same_batch(&reused, &batch),
        "three frames decode differently"
    );
    let (seq_frame, payload) = data.split_at(data.len().min(8));
    let head = decode_message(&[seq_frame, payload], &mut reused);
    match parse_seq(seq_frame) {
        Err(e) => {
            assert_eq!(e, DecodeError::SeqLength(seq_frame.len()));
            assert_eq!(head, Err(e));
            assert!(reused.is_empty());
        }
        Ok(seq) if seq == REPLAY_END_SEQ && payload.is_empty() => {
            assert!(head.unwrap().is_replay_end() && reused.is_empty());
        }
        Ok(seq) => {
            let mut alone = EventBatch::new();
            let want = decode_batch(payload, &mut alone).map(|()| seq);
            assert_eq!(head.map(|h| h.seq), want);
            assert!(same_batch(&reused, &alone), "two frames decode differently");
        }
    }
    let one = decode_message(&[data], &mut reused);
    assert_eq!(one.unwrap_err(), DecodeError::FrameCount(1));
}

// ---------------------------------------------------------------------------------------
// 7. Host validator.

/// The Host validator agrees with the reference written from RFC 3986 and RFC 9112
/// (`host_reference`), and the head parser refuses a head for its Host exactly when the
/// validator refuses the value.
pub fn host(data: &[u8]) {
    let got = request_head::valid_host(data);
    let want = host_reference::valid(data);
    assert_eq!(got, want, "valid_host(b\"{}\")", data.escape_ascii());
    if data.iter().any(|&b| b == b'\r' || b == b'\n') {
        return;
    }
    let mut raw = b"GET / HTTP/1.1\r\nHost: ".to_vec();
    raw.extend_from_slice(data);
    raw.extend_from_slice(b"\r\n\r\n");
    match parse_head(&raw, UnderscoreHeaders::Drop).0 {
        Ok(Some(_)) => assert!(got, "a head with a refused Host accepted"),
        Err(HeadError::BadRequest("invalid Host")) => assert!(!got, "a valid Host refused"),
        // httparse refused the value's bytes before the Host rules ran.
        _ => {}
    }
}
