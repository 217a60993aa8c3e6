//! Token usage in a response: `"prompt_tokens": N` and `"completion_tokens": N` (OpenAI
//! chat, completions, embeddings) or `"input_tokens"` / `"output_tokens"` (Responses,
//! Messages), in a JSON body or in the last SSE event of a stream that asked for usage.
//!
//! A byte scan, not a JSON parse: it runs on the relay path over each upstream read of a
//! successful response, so it must stay one SIMD pass and never allocate.
//! Usage split across two reads is missed (the sample then has no usage).

use memchr::memmem::Finder;
use std::sync::LazyLock;

use rolter_core::Usage;

/// What every usage key ends in; the searched bytes are rare in SSE events, so the search
/// runs at memchr's speed over a read that holds no usage (the common case).
static TOKENS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"_tokens\""));

/// The usage keys, by what precedes `_tokens"`: OpenAI's prompt and completion, then
/// Responses' and Messages' input and output.
const PREFIXES: [&[u8]; 4] = [b"\"prompt", b"\"completion", b"\"input", b"\"output"];

/// The usage reported in `data`, if a complete one is there.
pub fn scan(data: &[u8]) -> Option<Usage> {
    // Where the first of each key ends.
    let mut first: [Option<usize>; 4] = [None; 4];
    for at in TOKENS.find_iter(data) {
        if let Some(k) = PREFIXES.iter().position(|p| data[..at].ends_with(p)) {
            first[k].get_or_insert(at + TOKENS.needle().len());
        }
    }
    let number = |k: usize| first[k].and_then(|at| number_at(&data[at..]));
    let (prompt, completion) = match number(0) {
        Some(p) => (Some(p), number(1)),
        None => (number(2), number(3)),
    };
    let prompt = prompt?;
    Some(Usage {
        prompt_tokens: prompt,
        // Embeddings report no completion tokens.
        completion_tokens: completion.unwrap_or(0),
    })
}

/// The integer after a key: a colon and the digits, allowing JSON whitespace.
fn number_at(rest: &[u8]) -> Option<u32> {
    let mut i = rest.iter().position(|b| !b" \t\r\n".contains(b))?;
    if rest[i] != b':' {
        return None;
    }
    i += 1;
    i += rest[i..].iter().position(|b| !b" \t\r\n".contains(b))?;
    let digits = rest[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 9 {
        return None;
    }
    std::str::from_utf8(&rest[i..i + digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_chat_usage_in_a_body_and_in_a_stream_event() {
        let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"total_tokens":30,"completion_tokens":18,"prompt_tokens_details":null}}"#;
        assert_eq!(
            scan(body),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 18
            })
        );
        let event = b"data: {\"choices\":[],\"usage\": {\"prompt_tokens\" : 7,\n \"completion_tokens\": 3}}\n\n";
        assert_eq!(
            scan(event),
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
    }

    #[test]
    fn ignores_null_usage_and_partial_numbers() {
        assert_eq!(scan(b"data: {\"usage\":null,\"choices\":[]}\n\n"), None);
        assert_eq!(scan(b"{\"prompt_tokens\":"), None);
        assert_eq!(scan(b"{\"prompt_tokens\": \"12\"}"), None);
        assert_eq!(scan(b"{\"prompt_tokens\": 99999999999}"), None);
    }

    #[test]
    fn reads_messages_and_responses_usage() {
        let body = br#"{"usage":{"input_tokens":40,"output_tokens":2}}"#;
        assert_eq!(
            scan(body),
            Some(Usage {
                prompt_tokens: 40,
                completion_tokens: 2
            })
        );
        // Messages' stream: the first usage has both; a later `input_tokens` is ignored.
        let start = br#"{"usage":{"input_tokens":25,"output_tokens":1},"x":{"input_tokens":9}}"#;
        assert_eq!(
            scan(start),
            Some(Usage {
                prompt_tokens: 25,
                completion_tokens: 1
            })
        );
        // A `prompt_tokens` with no number falls back to `input_tokens`.
        let both = br#"{"prompt_tokens":null,"input_tokens":3,"output_tokens":4}"#;
        assert_eq!(
            scan(both),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4
            })
        );
        let emb = br#"{"data":[],"usage":{"prompt_tokens":5,"total_tokens":5}}"#;
        assert_eq!(
            scan(emb),
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 0
            })
        );
    }
}
