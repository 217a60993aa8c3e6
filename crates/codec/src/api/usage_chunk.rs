//! The usage chunk of a stream whose usage the gateway asked for on the client's behalf.
//!
//! A streamed chat or completions request that sends no `stream_options` is sent to the
//! engine with `"stream_options":{"include_usage":true}`, so the engine reports the
//! stream's token counts once, in an extra event before `data: [DONE]` whose `choices` is
//! empty. Some engines (OpenAI's API, older vLLM) then also put `"usage":null` on every
//! token event. [`UsageChunkCut`] relays the stream as the engine would have sent it
//! unasked: without that event (code that reads `choices[0]` of every chunk would fail on
//! it) and without the null fields, and keeps the usage the event carried. That replaces
//! counting every event's content deltas.
//!
//! It relays whole events: a read that ends inside an event holds that event's start until
//! the next read completes it (at most [`MAX_HELD`] bytes; beyond that it gives up cutting
//! and relays as it comes). The bytes kept of a read go out as one part made of pieces of
//! it (a chunk's worth, never copied here). After the usage event it searches for nothing.
//! It does not parse JSON, allocate on a read that ends on an event boundary, or do I/O.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use rolter_core::Usage;

use super::usage;

/// The most bytes of one unfinished event held back (an event this long is no usage chunk).
pub const MAX_HELD: usize = 1 << 20;

/// The key searched for: `null` on token events, the counts on the usage event.
static USAGE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"usage\""));

/// The most pieces one part is made of; more go out as another part.
const MAX_PIECES: usize = 32;

/// Cuts the usage-only event and the null usage fields from a stream's body bytes, fed in
/// order.
#[derive(Debug, Default)]
pub struct UsageChunkCut {
    /// The start of an event a read ended inside.
    held: Vec<u8>,
    usage: Option<Usage>,
    /// The usage event went by, or an overlong event made cutting give up: the rest
    /// passes as it comes.
    passing: bool,
}

impl UsageChunkCut {
    pub fn new() -> UsageChunkCut {
        UsageChunkCut::default()
    }

    /// The usage the cut event reported, once it went by.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Relays `data` (the next body bytes, unframed) through `emit`, as parts each made of
    /// pieces in order, less the usage event and null usage fields; an unfinished event at
    /// its end is held for the next call.
    pub fn feed(&mut self, data: &[u8], mut emit: impl FnMut(&[&[u8]])) {
        if self.passing {
            self.finish(&mut emit);
            return emit(&[data]);
        }
        if self.held.is_empty() {
            let whole = complete_len(data);
            self.relay_events(&data[..whole], &mut emit);
            self.hold(&data[whole..], &mut emit);
            return;
        }
        let mut work = std::mem::take(&mut self.held);
        work.extend_from_slice(data);
        let whole = complete_len(&work);
        self.relay_events(&work[..whole], &mut emit);
        self.hold(&work[whole..], &mut emit);
        // The buffer's allocation serves the next unfinished event.
        if self.held.is_empty() {
            work.clear();
            self.held = work;
        }
    }

    /// The body ended: what is held goes out as it is.
    pub fn finish(&mut self, mut emit: impl FnMut(&[&[u8]])) {
        if !self.held.is_empty() {
            emit(&[&self.held]);
            self.held.clear();
        }
    }

    /// Whole events: relayed less the usage event and the null usage fields.
    fn relay_events(&mut self, events: &[u8], emit: &mut impl FnMut(&[&[u8]])) {
        if events.is_empty() {
            return;
        }
        let mut pieces = Pieces::default();
        // What is relayed as it is from `from`; the key is looked for from `search`.
        let (mut from, mut search) = (0, 0);
        while let Some(at) = USAGE_KEY.find(&events[search..]).map(|p| search + p) {
            let key_end = at + USAGE_KEY.needle().len();
            match value_of(&events[key_end..]) {
                Some((Value::Null, len)) => {
                    let (cut_from, cut_to) = null_field(events, at, key_end + len);
                    pieces.push(&events[from..cut_from.max(from)], emit);
                    from = cut_to;
                    search = cut_to;
                }
                Some((Value::Counts, _)) => {
                    let start = event_start(events, at);
                    let end = event_end(events, at);
                    let event = &events[start..end];
                    self.usage = usage::scan(event).or(self.usage);
                    search = end;
                    if choices_empty(event) {
                        pieces.push(&events[from..start.max(from)], emit);
                        from = end;
                        self.passing = true;
                        break;
                    }
                    // Usage on a token event (continuous usage, or an engine that reports
                    // it on the last token): not the extra event, and it stays.
                }
                None => search = key_end,
            }
        }
        pieces.push(&events[from..], emit);
        pieces.flush(emit);
    }

    /// Holds an unfinished event's start (or, past [`MAX_HELD`], gives up and relays it).
    fn hold(&mut self, partial: &[u8], emit: &mut impl FnMut(&[&[u8]])) {
        if partial.is_empty() {
            return;
        }
        if self.passing || partial.len() > MAX_HELD {
            self.passing = true;
            return emit(&[partial]);
        }
        self.held.clear();
        self.held.extend_from_slice(partial);
    }
}

/// The pieces of one part, gathered before it goes out.
#[derive(Default)]
struct Pieces<'a> {
    list: [&'a [u8]; MAX_PIECES],
    n: usize,
}

impl<'a> Pieces<'a> {
    fn push(&mut self, piece: &'a [u8], emit: &mut impl FnMut(&[&[u8]])) {
        if piece.is_empty() {
            return;
        }
        if self.n == MAX_PIECES {
            self.flush(emit);
        }
        self.list[self.n] = piece;
        self.n += 1;
    }

    fn flush(&mut self, emit: &mut impl FnMut(&[&[u8]])) {
        if self.n > 0 {
            emit(&self.list[..self.n]);
            self.n = 0;
        }
    }
}

/// What a `"usage"` key holds.
enum Value {
    Null,
    /// An object: the counts.
    Counts,
}

/// The value after a key (`rest` starts just past it): a colon, JSON whitespace, then
/// `null` or `{`; with the bytes up to the value's end (`null`) or its start (`{`).
fn value_of(rest: &[u8]) -> Option<(Value, usize)> {
    let ws = |from: usize| {
        rest[from..]
            .iter()
            .position(|b| !b" \t\r\n".contains(b))
            .map(|p| from + p)
    };
    let colon = ws(0)?;
    if rest[colon] != b':' {
        return None;
    }
    let v = ws(colon + 1)?;
    if rest[v..].starts_with(b"null") {
        Some((Value::Null, v + 4))
    } else if rest[v] == b'{' {
        Some((Value::Counts, v))
    } else {
        None
    }
}

/// The bytes to cut for a null usage field from `key` to `end`: with the comma before it
/// (it is not the object's first field), else with the one after it.
fn null_field(events: &[u8], key: usize, end: usize) -> (usize, usize) {
    let before = events[..key].iter().rposition(|b| !b" \t\r\n".contains(b));
    if let Some(c) = before.filter(|&c| events[c] == b',') {
        return (c, end);
    }
    let after = events[end..]
        .iter()
        .position(|b| !b" \t\r\n".contains(b))
        .map(|p| end + p);
    match after.filter(|&c| events[c] == b',') {
        Some(c) => (key, c + 1),
        None => (key, end),
    }
}

/// Where the event holding byte `at` of `events` starts: just past the last blank line
/// before it, or at 0.
fn event_start(events: &[u8], at: usize) -> usize {
    last_blank_end(events, at).unwrap_or(0)
}

/// How many of `data`'s bytes are whole events: up to the end of its last blank line, 0
/// when it has none.
fn complete_len(data: &[u8]) -> usize {
    // The usual read: the engine writes whole events, and it ends with one.
    if data.ends_with(b"\n\n") || data.is_empty() {
        return data.len();
    }
    last_blank_end(data, data.len()).unwrap_or(0)
}

/// Just past the last blank line of `data` that ends before `end`.
fn last_blank_end(data: &[u8], end: usize) -> Option<usize> {
    let mut end = end;
    while let Some(i) = memchr::memrchr2(b'\n', b'\r', &data[..end]) {
        if ends_blank_line(data, i) {
            return Some(i + 1);
        }
        end = i;
    }
    None
}

/// The end of the event that starts at `from` of `events` (whole events): just past its
/// first blank line (else all of it).
fn event_end(events: &[u8], from: usize) -> usize {
    let mut at = from;
    while let Some(i) = memchr::memchr2(b'\n', b'\r', &events[at..]).map(|p| at + p) {
        if ends_blank_line(events, i) {
            return i + 1;
        }
        at = i + 1;
    }
    events.len()
}

/// Whether the line end at `i` ends a blank line, from the bytes up to `i + 1` only (so a
/// read cut anywhere finds the same ones): `\n` after `\n`, `\r\n` or `\r\r`; a `\r` after
/// `\r` or `\n` that a byte other than `\n` follows (a `\r` at the end of the bytes may be
/// the first half of a CRLF, and is not yet one).
fn ends_blank_line(data: &[u8], i: usize) -> bool {
    let before = |k: usize| i.checked_sub(k).map(|j| data[j]);
    match data[i] {
        b'\n' => {
            before(1) == Some(b'\n')
                || (before(1) == Some(b'\r') && matches!(before(2), Some(b'\n' | b'\r')))
        }
        _ => {
            matches!(before(1), Some(b'\r' | b'\n')) && data.get(i + 1).is_some_and(|&b| b != b'\n')
        }
    }
}

/// Whether the event's JSON has `"choices": []`, allowing JSON whitespace.
fn choices_empty(event: &[u8]) -> bool {
    let Some(at) = memchr::memmem::find(event, b"\"choices\"") else {
        return false;
    };
    let mut rest = event[at + 9..]
        .iter()
        .copied()
        .filter(|b| !b" \t\r\n".contains(b));
    rest.next() == Some(b':') && rest.next() == Some(b'[') && rest.next() == Some(b']')
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    const LAST: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":14,\"completion_tokens\":2}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";
    const USAGE_FIXTURE_EVENT: &str = "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1718000000,\"model\":\"sql-lora\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":14,\"completion_tokens\":2}}\n\n";

    fn stream() -> String {
        format!("{TOKEN}{TOKEN}{LAST}{USAGE}{DONE}")
    }

    /// The bytes relayed and the usage kept, with `data` fed in reads cut at `cuts`.
    fn run(data: &[u8], cuts: &[usize]) -> (Vec<u8>, Option<Usage>) {
        let mut cut = UsageChunkCut::new();
        let mut out = Vec::new();
        let mut from = 0;
        for &c in cuts.iter().chain(std::iter::once(&data.len())) {
            cut.feed(&data[from..c], |parts| out.extend(parts.concat()));
            from = c;
        }
        cut.finish(|parts| out.extend(parts.concat()));
        (out, cut.usage())
    }

    const USED: Usage = Usage {
        prompt_tokens: 12,
        completion_tokens: 2,
    };

    #[test]
    fn the_usage_event_is_cut_and_its_counts_kept() {
        let s = stream();
        let (out, usage) = run(s.as_bytes(), &[]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{TOKEN}{TOKEN}{LAST}{DONE}")
        );
        assert_eq!(usage, Some(USED));
    }

    #[test]
    fn reads_cut_anywhere_relay_the_same_bytes() {
        let s = stream();
        let want = format!("{TOKEN}{TOKEN}{LAST}{DONE}");
        for c in 1..s.len() {
            let (out, usage) = run(s.as_bytes(), &[c]);
            assert_eq!(String::from_utf8(out).unwrap(), want, "cut at {c}");
            assert_eq!(usage, Some(USED), "cut at {c}");
        }
        for c in (1..s.len()).step_by(7) {
            let (out, _) = run(s.as_bytes(), &[c / 2, c]);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                want,
                "cuts at {} {c}",
                c / 2
            );
        }
    }

    #[test]
    fn crlf_events_and_spaced_json_are_cut_too() {
        let usage = "data: {\"choices\": [ ], \"usage\": {\"prompt_tokens\": 12, \"completion_tokens\": 2}}\r\n\r\n";
        let token = TOKEN.replace("\n\n", "\r\n\r\n");
        let s = format!("{token}{usage}data: [DONE]\r\n\r\n");
        for c in [0, 5, token.len() + 3, token.len() + usage.len() - 1] {
            let (out, got) = run(s.as_bytes(), &[c]);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("{token}data: [DONE]\r\n\r\n"),
                "cut at {c}"
            );
            assert_eq!(got, Some(USED));
        }
    }

    #[test]
    fn bare_cr_events_are_cut_the_same_however_the_reads_split() {
        // A `\r` that ends a read may be the first half of a CRLF: the event it would end
        // waits for the next byte.
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2}}";
        for sep in ["\r\r", "\n\r", "\r\r\n", "\r\n\r"] {
            let s = format!("data: a{sep}{usage}{sep}data: [DONE]{sep}");
            let want = format!("data: a{sep}data: [DONE]{sep}");
            for c in 0..s.len() {
                let (out, got) = run(s.as_bytes(), &[c]);
                assert_eq!(String::from_utf8(out).unwrap(), want, "{sep:?} cut at {c}");
                assert_eq!(got, Some(USED), "{sep:?} cut at {c}");
            }
        }
    }

    #[test]
    fn usage_on_a_token_event_stays_and_is_kept() {
        let last = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2}}\n\n";
        let s = format!("{TOKEN}{last}{DONE}");
        let (out, usage) = run(s.as_bytes(), &[]);
        assert_eq!(out, s.as_bytes());
        assert_eq!(usage, Some(USED));
    }

    #[test]
    fn a_stream_without_usage_passes_whole_and_an_unfinished_end_goes_out() {
        let s = format!("{TOKEN}{LAST}{DONE}data: {{\"cut");
        let (out, usage) = run(s.as_bytes(), &[10, TOKEN.len() + 4]);
        assert_eq!(out, s.as_bytes());
        assert_eq!(usage, None);
    }

    #[test]
    fn an_overlong_event_is_relayed_without_waiting_for_its_end() {
        let mut cut = UsageChunkCut::new();
        let mut out = Vec::new();
        let big = format!("data: {}", "x".repeat(MAX_HELD + 1));
        cut.feed(big.as_bytes(), |parts| out.extend(parts.concat()));
        assert_eq!(out.len(), big.len(), "relayed at once, not held");
        cut.feed(USAGE.as_bytes(), |parts| out.extend(parts.concat()));
        assert_eq!(out.len(), big.len() + USAGE.len(), "cutting gave up");
    }

    #[test]
    fn null_usage_fields_go_wherever_they_stand() {
        let fixture = include_str!("../../../../tests/fixtures/vllm_chat_stream.sse");
        let unasked: String = fixture.replace(",\"usage\":null", "");
        let unasked = unasked.replace(USAGE_FIXTURE_EVENT, "");
        for c in [0, 1, 40, fixture.len() / 2, fixture.len() - 20] {
            let (out, usage) = run(fixture.as_bytes(), &[c]);
            assert_eq!(String::from_utf8(out).unwrap(), unasked, "cut at {c}");
            assert_eq!(
                usage,
                Some(Usage {
                    prompt_tokens: 12,
                    completion_tokens: 2
                })
            );
        }
        for (event, unasked) in [
            (
                r#"{"usage":null,"choices":[{"index":0}]}"#,
                r#"{"choices":[{"index":0}]}"#,
            ),
            (r#"{"usage" : null , "choices":[]}"#, r#"{ "choices":[]}"#),
            (r#"{"a":1, "usage": null}"#, r#"{"a":1}"#),
            (r#"{"usage":null}"#, r#"{}"#),
        ] {
            let (out, _) = run(format!("data: {event}\n\n").as_bytes(), &[]);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("data: {unasked}\n\n")
            );
        }
    }

    #[test]
    fn many_cuts_in_one_read_all_go_out_in_order() {
        let token = TOKEN.replace("}]}", "}],\"usage\":null}");
        let s = format!("{}{USAGE}{DONE}", token.repeat(MAX_PIECES * 2 + 3));
        let (out, usage) = run(s.as_bytes(), &[]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{}{DONE}", TOKEN.repeat(MAX_PIECES * 2 + 3))
        );
        assert_eq!(usage, Some(USED));
    }

    #[test]
    fn a_held_event_waits_only_for_its_own_end() {
        let mut cut = UsageChunkCut::new();
        let mut out = Vec::new();
        let (a, b) = TOKEN.split_at(20);
        cut.feed(a.as_bytes(), |parts| out.extend(parts.concat()));
        assert!(out.is_empty(), "an unfinished event is held");
        cut.feed(b.as_bytes(), |parts| out.extend(parts.concat()));
        assert_eq!(out, TOKEN.as_bytes());
    }
}
