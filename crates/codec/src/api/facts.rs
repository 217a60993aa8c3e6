//! Extraction of the facts routing needs from a request body, without building a JSON tree.
//!
//! `serde_json` skips every field it is not asked for and borrows the big ones (`messages`,
//! `prompt`, `input`) as raw slices, so the cost is one validating scan of the body. The
//! offsets of the `model` value are kept so a route can swap in the upstream model name
//! without re-serialising. It must not copy the prompt.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::GatewayError;

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
}

/// A field that is there, even as `null` (which `Option` would read as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// What routing knows about a request, borrowed from its body.
#[derive(Debug, Clone, Default)]
pub struct RequestFacts<'a> {
    /// The requested model, unescaped.
    pub model: Cow<'a, str>,
    /// Byte range of the `model` value in the body: the JSON string (quotes included), or
    /// a form field's raw value (see `model_is_json`).
    pub model_span: Option<Range<usize>>,
    /// The span holds a JSON string (a swapped-in name is written quoted), not a form
    /// field's raw bytes.
    pub model_is_json: bool,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The body has `stream_options` (with or without `include_usage`).
    pub stream_options: bool,
    /// `max_tokens`, `max_completion_tokens` or `max_output_tokens`, whichever is present.
    pub max_tokens: Option<u64>,
    /// The raw JSON of the prompt: `messages` (with `system` for Anthropic), `prompt` or
    /// `input`, in that order of preference.
    pub prompt: &'a [u8],
    /// Estimated prompt tokens (about four bytes a token).
    pub prompt_tokens: u32,
}

/// Extracts the routing facts from a JSON request body.
pub fn extract(body: &[u8]) -> Result<RequestFacts<'_>, GatewayError> {
    let top: Top<'_> = serde_json::from_slice(body).map_err(|e| {
        GatewayError::client(
            400,
            "invalid_json",
            format!("request body is not a valid JSON object: {e}"),
        )
    })?;
    let base = body.as_ptr() as usize;
    let span_of = |raw: &RawValue| {
        let s = raw.get();
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let (model, model_span) = match top.model {
        None => (Cow::Borrowed(""), None),
        Some(raw) => {
            let text = raw.get();
            let model: Cow<'_, str> = if text.len() >= 2
                && text.starts_with('"')
                && text.ends_with('"')
                && !text.contains('\\')
            {
                Cow::Borrowed(&text[1..text.len() - 1])
            } else {
                match serde_json::from_str::<String>(text) {
                    Ok(s) => Cow::Owned(s),
                    Err(_) => {
                        return Err(GatewayError::client(
                            400,
                            "invalid_type",
                            "`model` must be a string",
                        )
                        .with_param("model"))
                    }
                }
            };
            (model, Some(span_of(raw)))
        }
    };
    let prompt_raw = top.messages.or(top.prompt).or(top.input);
    let prompt: &[u8] = match prompt_raw {
        Some(raw) => &body[span_of(raw)],
        None => b"",
    };
    let system_len = top.system.map(|s| s.get().len()).unwrap_or(0);
    let prompt_bytes = prompt.len() + system_len;
    Ok(RequestFacts {
        model,
        model_span,
        model_is_json: true,
        stream: top.stream.unwrap_or(false),
        // Present even when null: a field the gateway adds would meet the client's.
        stream_options: top.stream_options.is_some(),
        include_usage: top
            .stream_options
            .and_then(|o| serde_json::from_str::<Option<StreamOptions>>(o.get()).ok()?)
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        max_tokens: top
            .max_tokens
            .or(top.max_completion_tokens)
            .or(top.max_output_tokens),
        prompt,
        prompt_tokens: (prompt_bytes.div_ceil(4)).min(u32::MAX as usize) as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_chat_facts() {
        let body = br#"{"model": "llama", "messages":[{"role":"user","content":"hi there"}],
            "stream":true, "stream_options":{"include_usage":true}, "max_tokens": 7,
            "tools":[{"deep":{"er":[1,2,3]}}]}"#;
        let f = extract(body).unwrap();
        assert_eq!(f.model, "llama");
        assert_eq!(&body[f.model_span.clone().unwrap()], br#""llama""#);
        assert!(f.stream && f.include_usage && f.stream_options);
        assert_eq!(f.max_tokens, Some(7));
        assert_eq!(f.prompt, br#"[{"role":"user","content":"hi there"}]"#);
        assert_eq!(f.prompt_tokens, (f.prompt.len() as u32).div_ceil(4));
    }

    #[test]
    fn stream_options_are_seen_whatever_they_say() {
        fn f(b: &str) -> RequestFacts<'_> {
            extract(b.as_bytes()).unwrap()
        }
        let none = f(r#"{"model":"m","stream":true}"#);
        assert!(!none.stream_options && !none.include_usage);
        for b in [
            r#"{"model":"m","stream":true,"stream_options":null}"#,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":false}}"#,
            r#"{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
        ] {
            let facts = f(b);
            assert!(facts.stream_options && !facts.include_usage, "{b}");
        }
    }

    #[test]
    fn escaped_model_is_decoded() {
        let f = extract(br#"{"model":"a\/b","prompt":"x"}"#).unwrap();
        assert_eq!(f.model, "a/b");
        assert_eq!(f.prompt, br#""x""#);
    }

    #[test]
    fn rejects_bad_json_duplicates_and_types() {
        assert_eq!(extract(b"{").unwrap_err().status, 400);
        assert_eq!(extract(b"[1]").unwrap_err().status, 400);
        assert_eq!(
            extract(br#"{"model":"a","model":"b"}"#).unwrap_err().status,
            400
        );
        assert_eq!(extract(br#"{"model":5}"#).unwrap_err().status, 400);
        assert_eq!(
            extract(br#"{"model":"a","stream":"yes"}"#)
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn deep_nesting_does_not_overflow_the_stack() {
        let mut body = br#"{"model":"a","x":"#.to_vec();
        body.extend(std::iter::repeat_n(b'[', 10_000));
        body.extend(std::iter::repeat_n(b']', 10_000));
        body.push(b'}');
        // Skipped values are scanned iteratively: no recursion, no crash.
        assert_eq!(extract(&body).unwrap().model, "a");
    }
}
