//! The engine's own tokenizer, over HTTP: request bodies and response parsing.
//!
//! Owns the wire format of the engines' tokenize endpoints, as pure functions over bytes:
//!
//! | endpoint | chat body | completions body | answer |
//! |---|---|---|---|
//! | vLLM `POST /tokenize` | `{"model","messages","add_generation_prompt","tools","chat_template_kwargs"}` | `{"model","prompt":"text","add_special_tokens":true}` | `{"count","max_model_len","tokens":[..]}` |
//! | vLLM `POST /v1/chat/completions/render`, `/v1/completions/render` (newer; what llm-d's token producer calls) | as above, without `add_special_tokens` | `{"model","prompt":...}` | `{"token_ids":[..],...}` (chat) / `[{"token_ids":[..]},...]` (completions) |
//! | SGLang `POST /tokenize` | not offered | `{"model","prompt":"text","add_special_tokens":true}` | `{"tokens":[..],"count","max_model_len"}` |
//!
//! vLLM's `/tokenize` for chat uses `add_special_tokens=false` by default (the template writes
//! BOS), the same as its chat completions; completions default to `true`. A completions prompt
//! given as token ids needs no request at all ([`CompletionPlan::Passthrough`]).
//!
//! Must not: open sockets, pick a target, retry, or time out: the caller does the HTTP (and
//! owns the auth header, which it should forward as llm-d does). No logging.

use serde::Deserialize;

use super::{ChatRequest, TokenizeError};

/// Which tokenize endpoint the engine offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// vLLM `POST /tokenize` (all versions with the OpenAI server).
    VllmTokenize,
    /// vLLM `POST /v1/chat/completions/render` and `POST /v1/completions/render`.
    VllmRender,
    /// SGLang `POST /tokenize` (completions prompts only).
    SglangTokenize,
}

impl Endpoint {
    /// The path for a chat request, `None` when the engine cannot tokenize chats.
    pub fn chat_path(self) -> Option<&'static str> {
        match self {
            Endpoint::VllmTokenize => Some("/tokenize"),
            Endpoint::VllmRender => Some("/v1/chat/completions/render"),
            Endpoint::SglangTokenize => None,
        }
    }

    /// The path for a completions prompt.
    pub fn completion_path(self) -> &'static str {
        match self {
            Endpoint::VllmTokenize | Endpoint::SglangTokenize => "/tokenize",
            Endpoint::VllmRender => "/v1/completions/render",
        }
    }
}

/// Whether a completions prompt needs the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionPlan {
    /// The body was written: send it to [`Endpoint::completion_path`].
    Send,
    /// The prompt was token ids and they were appended to `ids`: no request.
    Passthrough,
}

fn check_json<'a>(bytes: &'a [u8], what: &str) -> Result<&'a [u8], TokenizeError> {
    serde_json::from_slice::<&serde_json::value::RawValue>(bytes)
        .map_err(|e| TokenizeError::request(format!("{what} is not valid JSON: {e}")))?;
    Ok(bytes)
}

fn push_model(body: &mut Vec<u8>, model: Option<&str>) {
    if let Some(model) = model {
        body.extend_from_slice(b"\"model\":");
        // Writing a &str to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *body, model);
        body.push(b',');
    }
}

/// Writes into `body` (cleared first) the chat tokenize request for `endpoint`.
///
/// The raw JSON of `messages`, `tools` and `chat_template_kwargs` is copied as it is (after a
/// syntax check), so the engine sees exactly what the client sent.
pub fn chat_body(
    endpoint: Endpoint,
    model: Option<&str>,
    request: &ChatRequest<'_>,
    body: &mut Vec<u8>,
) -> Result<(), TokenizeError> {
    if endpoint.chat_path().is_none() {
        return Err(TokenizeError::request(format!(
            "{endpoint:?} cannot tokenize chat requests"
        )));
    }
    body.clear();
    body.reserve(request.messages.len() + 128);
    body.push(b'{');
    push_model(body, model);
    body.extend_from_slice(b"\"messages\":");
    body.extend_from_slice(check_json(request.messages, "messages")?);
    if let Some(tools) = request.tools {
        body.extend_from_slice(b",\"tools\":");
        body.extend_from_slice(check_json(tools, "tools")?);
    }
    if let Some(kwargs) = request.chat_template_kwargs {
        body.extend_from_slice(b",\"chat_template_kwargs\":");
        body.extend_from_slice(check_json(kwargs, "chat_template_kwargs")?);
    }
    body.extend_from_slice(if request.add_generation_prompt {
        b",\"add_generation_prompt\":true"
    } else {
        b",\"add_generation_prompt\":false"
    });
    body.push(b'}');
    Ok(())
}

/// Writes into `body` (cleared first) the completions tokenize request for `endpoint`, or,
/// for a prompt given as token ids, appends them to `ids` and writes nothing.
///
/// `prompt` is the raw JSON of the request's `prompt` field; of a batch, the first prompt
/// counts (see [`super::prompt_text`]).
pub fn completion_body(
    endpoint: Endpoint,
    model: Option<&str>,
    prompt: &[u8],
    body: &mut Vec<u8>,
    ids: &mut Vec<u32>,
) -> Result<CompletionPlan, TokenizeError> {
    body.clear();
    let Some(text) = super::prompt_text(prompt, ids)? else {
        return Ok(CompletionPlan::Passthrough);
    };
    body.reserve(text.len() + 96);
    body.push(b'{');
    push_model(body, model);
    body.extend_from_slice(b"\"prompt\":");
    let _ = serde_json::to_writer(&mut *body, &text);
    if endpoint != Endpoint::VllmRender {
        body.extend_from_slice(b",\"add_special_tokens\":true");
    }
    body.push(b'}');
    Ok(CompletionPlan::Send)
}

/// What an answer says besides the ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizeInfo {
    /// Number of ids appended.
    pub count: usize,
    /// The engine's context length, when the answer gives it (`/tokenize` does).
    pub max_model_len: Option<u64>,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    count: Option<usize>,
    #[serde(default)]
    max_model_len: Option<u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Answers {
    // First: an empty JSON array would also deserialize as an all-default `Answer`.
    Many(Vec<Answer>),
    One(Answer),
}

/// Parses a 2xx answer of any [`Endpoint`] and appends its ids to `out`. A render answer
/// that is a list (completions batch) yields its first entry's ids.
pub fn parse_response(body: &[u8], out: &mut Vec<u32>) -> Result<TokenizeInfo, TokenizeError> {
    let answer = match serde_json::from_slice::<Answers>(body) {
        Ok(Answers::One(a)) => a,
        Ok(Answers::Many(mut list)) => {
            if list.is_empty() {
                return Err(response_error("an empty list"));
            }
            list.swap_remove(0)
        }
        Err(_) => return Err(response_error(&explain(body))),
    };
    let ids = match (answer.tokens, answer.token_ids) {
        (Some(ids), _) | (None, Some(ids)) => ids,
        (None, None) => return Err(response_error(&explain(body))),
    };
    if let Some(count) = answer.count {
        if count != ids.len() {
            return Err(response_error(&format!(
                "\"count\" is {count} but {} tokens were listed",
                ids.len()
            )));
        }
    }
    out.extend_from_slice(&ids);
    Ok(TokenizeInfo {
        count: ids.len(),
        max_model_len: answer.max_model_len,
    })
}

fn response_error(what: &str) -> TokenizeError {
    TokenizeError::Response {
        message: what.to_string(),
    }
}

/// Why a body is not a tokenize answer: an engine error message when it carries one.
fn explain(body: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Err(e) => format!("not JSON: {e}"),
        Ok(v) => {
            let message = v
                .pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("detail"))
                .and_then(|m| m.as_str());
            match message {
                Some(m) => format!("engine error: {m}"),
                None => "no \"tokens\" or \"token_ids\" list of u32 ids".to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_bodies() {
        let mut body = Vec::new();
        let req = ChatRequest {
            messages: br#"[{"role":"user","content":"hi"}]"#,
            tools: Some(br#"[{"type":"function","function":{"name":"f"}}]"#),
            add_generation_prompt: true,
            chat_template_kwargs: Some(br#"{"enable_thinking":false}"#),
        };
        chat_body(Endpoint::VllmTokenize, Some("m\"1"), &req, &mut body).unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"model":"m\"1","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true}"#
        );
        let req = ChatRequest {
            messages: br#"[]"#,
            ..ChatRequest::default()
        };
        chat_body(Endpoint::VllmRender, None, &req, &mut body).unwrap();
        assert_eq!(body, br#"{"messages":[],"add_generation_prompt":false}"#);
        assert!(chat_body(Endpoint::SglangTokenize, None, &req, &mut body).is_err());
        let bad = ChatRequest {
            messages: b"[{",
            ..ChatRequest::default()
        };
        let err = chat_body(Endpoint::VllmTokenize, None, &bad, &mut body).unwrap_err();
        assert!(
            err.to_string().contains("messages is not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn completion_bodies_and_passthrough() {
        let (mut body, mut ids) = (Vec::new(), Vec::new());
        let plan = completion_body(
            Endpoint::SglangTokenize,
            Some("m"),
            br#""a\nb""#,
            &mut body,
            &mut ids,
        )
        .unwrap();
        assert_eq!(plan, CompletionPlan::Send);
        assert_eq!(
            body,
            br#"{"model":"m","prompt":"a\nb","add_special_tokens":true}"#
        );
        completion_body(
            Endpoint::VllmRender,
            None,
            br#"["x","y"]"#,
            &mut body,
            &mut ids,
        )
        .unwrap();
        assert_eq!(body, br#"{"prompt":"x"}"#);
        let plan = completion_body(
            Endpoint::VllmTokenize,
            None,
            b"[[5,6],[7]]",
            &mut body,
            &mut ids,
        )
        .unwrap();
        assert_eq!(
            (plan, body.is_empty(), ids),
            (CompletionPlan::Passthrough, true, vec![5, 6])
        );
        let mut ids = Vec::new();
        assert!(
            completion_body(Endpoint::VllmTokenize, None, b"[1,-2]", &mut body, &mut ids).is_err()
        );
        assert!(completion_body(Endpoint::VllmTokenize, None, b"{}", &mut body, &mut ids).is_err());
        assert!(completion_body(Endpoint::VllmTokenize, None, b"[]", &mut body, &mut ids).is_err());
    }

    #[test]
    fn responses() {
        let mut out = vec![9];
        let info = parse_response(
            br#"{"count":3,"max_model_len":32768,"tokens":[1,2,3],"token_strs":null}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            info,
            TokenizeInfo {
                count: 3,
                max_model_len: Some(32768)
            }
        );
        assert_eq!(out, [9, 1, 2, 3]);
        let mut out = Vec::new();
        let info = parse_response(
            br#"{"request_id":"chatcmpl-1","token_ids":[4,5],"features":null,"sampling_params":{"max_tokens":16}}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            (info.count, info.max_model_len, &out[..]),
            (2, None, &[4, 5][..])
        );
        let mut out = Vec::new();
        parse_response(br#"[{"token_ids":[7]},{"token_ids":[8]}]"#, &mut out).unwrap();
        assert_eq!(out, [7]);
        for (bad, want) in [
            (&br#"{"count":2,"tokens":[1]}"#[..], "\"count\" is 2"),
            (
                br#"{"object":"error","message":"model x not found","code":404}"#,
                "engine error: model x not found",
            ),
            (br#"{"error":{"message":"bad"}}"#, "engine error: bad"),
            (br#"{"tokens":[-1]}"#, "list of u32 ids"),
            (br#"{"prompt":"x"}"#, "no \"tokens\""),
            (b"<html>", "not JSON"),
            (b"[]", "an empty list"),
        ] {
            let err = parse_response(bad, &mut Vec::new())
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
        }
    }
}
