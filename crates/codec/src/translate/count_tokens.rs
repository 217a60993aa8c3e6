//! Anthropic's `/v1/messages/count_tokens` answered by an OpenAI engine's `/tokenize`
//! (vLLM's and SGLang's chat form: `{"model","messages","tools"}` in, `{"count",…}` out):
//! the Messages body is translated as a generation would be ([`super::messages_chat`]),
//! and only what tokenizing reads is sent. A gateway with a local tokenizer counts the
//! same parts itself ([`chat_parts`]).
//!
//! Owns that pairing only; it must not do I/O.

use serde_json::{json, Map, Value};

use super::{messages_chat, Asked, NotTheApi, Refusal};

/// The fields of a chat request the engine's `/tokenize` reads.
const TOKENIZED: [&str; 3] = ["model", "messages", "tools"];

/// Writes the `/tokenize` body for the count_tokens request `body` into `out`.
pub fn request(body: &[u8], model: Option<&str>, out: &mut Vec<u8>) -> Result<Asked, Refusal> {
    let mut value: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| Refusal::new(format!("the body is not a JSON object: {e}"), None))?;
    // Counting takes no `max_tokens`; the generation's translation requires one.
    value.insert("max_tokens".into(), json!(1));
    value.remove("stream");
    let with_max = serde_json::to_vec(&value).unwrap_or_default();
    let mut chat = Vec::new();
    let asked = messages_chat::request(&with_max, model, &mut chat)?;
    let chat: Map<String, Value> = serde_json::from_slice(&chat).unwrap_or_default();
    let mut tokenize: Map<String, Value> = chat
        .into_iter()
        .filter(|(k, _)| TOKENIZED.contains(&k.as_str()))
        .collect();
    tokenize.insert("add_generation_prompt".into(), json!(true));
    out.clear();
    out.extend_from_slice(&serde_json::to_vec(&tokenize).unwrap_or_default());
    Ok(Asked {
        stream: false,
        ..asked
    })
}

/// What a local tokenizer counts of the count_tokens request `body`: the chat messages'
/// JSON and the tools' (OpenAI's shapes, as a chat template reads them).
pub fn chat_parts(body: &[u8]) -> Result<(Vec<u8>, Option<Vec<u8>>), Refusal> {
    let mut tokenize = Vec::new();
    request(body, None, &mut tokenize)?;
    let mut v: Map<String, Value> = serde_json::from_slice(&tokenize).unwrap_or_default();
    let messages = v.remove("messages").unwrap_or(Value::Array(Vec::new()));
    let json = |v: &Value| serde_json::to_vec(v).unwrap_or_default();
    Ok((json(&messages), v.remove("tools").map(|t| json(&t))))
}

/// The answer's translation: `{"count": N}` becomes `{"input_tokens": N}`.
#[derive(Debug)]
pub struct Reply;

impl Reply {
    /// Translates the engine's whole answer; an error keeps its status and takes
    /// Anthropic's error shape.
    pub fn whole(&mut self, status: u16, body: &[u8], out: &mut Vec<u8>) -> Result<(), NotTheApi> {
        if !(200..300).contains(&status) {
            return messages_chat::Reply::new(Asked::default()).whole(status, body, out);
        }
        let v: Value = serde_json::from_slice(body).map_err(|_| NotTheApi)?;
        let count = v.get("count").and_then(Value::as_u64).ok_or(NotTheApi)?;
        out.extend_from_slice(
            &serde_json::to_vec(&json!({ "input_tokens": count })).unwrap_or_default(),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_tokenizer_gets_the_chat_messages_and_tools() {
        let body = br#"{"model":"m","system":"Be brief.","messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}"#;
        let (messages, tools) = chat_parts(body).unwrap();
        let messages: Value = serde_json::from_slice(&messages).unwrap();
        assert_eq!(
            messages,
            json!([{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}])
        );
        let tools: Value = serde_json::from_slice(&tools.unwrap()).unwrap();
        assert_eq!(tools[0]["function"]["name"], "f");
        assert!(chat_parts(b"[]").is_err());
    }

    #[test]
    fn the_engines_count_becomes_input_tokens() {
        let mut out = Vec::new();
        Reply
            .whole(
                200,
                br#"{"count":17,"max_model_len":4096,"tokens":[1]}"#,
                &mut out,
            )
            .unwrap();
        assert_eq!(out, br#"{"input_tokens":17}"#);
        assert!(Reply.whole(200, b"[]", &mut Vec::new()).is_err());
    }
}
