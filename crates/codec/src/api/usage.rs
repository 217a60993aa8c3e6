//! Token usage in a response: `"prompt_tokens": N` and `"completion_tokens": N` (OpenAI
//! chat, completions, embeddings) or `"input_tokens"` / `"output_tokens"` (Responses,
//! Messages), in a JSON body or in the last SSE event of a stream that asked for usage.
//!
//! A byte scan, not a JSON parse: it runs on the relay path over each upstream read of a
//! successful response, so it must stay one SIMD pass (two more when a usage is there) and
//! never allocate.
//! Usage split across two reads is missed (the sample then has no usage).

use memchr::memmem::Finder;
use std::sync::LazyLock;

use rolter_core::Usage;

use super::key_search::KeySearch;

/// The keys that open a usage: OpenAI's (index 0) and Responses' and Messages' (index 1).
static PROMPT_OR_INPUT: LazyLock<KeySearch> =
    LazyLock::new(|| KeySearch::new(&[b"\"prompt_tokens\"", b"\"input_tokens\""]));
static COMPLETION: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"completion_tokens\""));
static OUTPUT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"output_tokens\""));

/// The usage reported in `data`, if a complete one is there.
pub fn scan(data: &[u8]) -> Option<Usage> {
    // One pass finds the first of each opening key (a read without usage, the common
    // case, is searched once).
    let (mut prompt, mut input) = (None, None);
    let mut from = 0;
    while let Some((key, end)) = PROMPT_OR_INPUT.find(data, from) {
        let first = if key == 0 { &mut prompt } else { &mut input };
        first.get_or_insert(end);
        if prompt.is_some() && input.is_some() {
            break;
        }
        from = end;
    }
    let (prompt, completion) = match prompt.and_then(|at| number_at(&data[at..])) {
        Some(p) => (Some(p), number_after(&COMPLETION, data)),
        None => (
            input.and_then(|at| number_at(&data[at..])),
            number_after(&OUTPUT, data),
        ),
    };
    let prompt = prompt?;
    Some(Usage {
        prompt_tokens: prompt,
        // Embeddings report no completion tokens.
        completion_tokens: completion.unwrap_or(0),
    })
}

/// The integer that follows `"key"` and a colon, allowing JSON whitespace.
fn number_after(key: &Finder<'_>, data: &[u8]) -> Option<u32> {
    let at = key.find(data)? + key.needle().len();
    number_at(&data[at..])
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
