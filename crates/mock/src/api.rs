//! The OpenAI / Anthropic / Responses wire formats as vLLM serves them: request-body
//! parsing (only what the mock needs) and rendering of full answers, stream events and
//! error bodies. Token text comes from a fixed word list.

use std::fmt;
use std::io::Write as _;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The token vocabulary; token `i` is `WORDS[i % WORDS.len()]`.
pub(crate) const WORDS: [&str; 32] = [
    " Hello",
    " from",
    " the",
    " mock",
    " engine",
    ",",
    " a",
    " fast",
    " stand",
    "-in",
    " for",
    " vLLM",
    " that",
    " streams",
    " short",
    " words",
    " at",
    " a",
    " steady",
    " pace",
    " so",
    " proxies",
    " can",
    " be",
    " measured",
    " without",
    " any",
    " GPU",
    " in",
    " the",
    " loop",
    ".",
];

pub(crate) fn token(i: u32) -> &'static str {
    WORDS[i as usize % WORDS.len()]
}

pub(crate) fn push_text(out: &mut Vec<u8>, n: u32) {
    for i in 0..n {
        out.extend_from_slice(token(i).as_bytes());
    }
}

/// Length in bytes of the text found in a JSON value: strings count fully, arrays
/// sum their items, objects sum their `text` and `content` members, numbers (token ids)
/// count as 4 bytes.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct TextLen(pub usize);

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextLenVisitor)
    }
}

struct TextLenVisitor;

impl<'de> Visitor<'de> for TextLenVisitor {
    type Value = TextLen;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<TextLen, E> {
        Ok(TextLen(v.len()))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<TextLen, E> {
        Ok(TextLen(4))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<TextLen, E> {
        Ok(TextLen(4))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<TextLen, E> {
        Ok(TextLen(4))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<TextLen, E> {
        Ok(TextLen(0))
    }
    fn visit_unit<E: de::Error>(self) -> Result<TextLen, E> {
        Ok(TextLen(0))
    }
    fn visit_none<E: de::Error>(self) -> Result<TextLen, E> {
        Ok(TextLen(0))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<TextLen, D::Error> {
        TextLen::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextLen, A::Error> {
        let mut n = 0;
        while let Some(t) = seq.next_element::<TextLen>()? {
            n += t.0;
        }
        Ok(TextLen(n))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextLen, A::Error> {
        let mut n = 0;
        while let Some(TextKey(counts)) = map.next_key::<TextKey>()? {
            if counts {
                n += map.next_value::<TextLen>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(TextLen(n))
    }
}

struct TextKey(bool);

impl<'de> Deserialize<'de> for TextKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TextKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TextKey, E> {
                Ok(TextKey(v == "text" || v == "content"))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Deserialize, Default)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The fields of an inference request body the mock looks at.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct GenBody {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub messages: TextLen,
    pub prompt: TextLen,
    pub input: TextLen,
    pub system: TextLen,
    pub instructions: TextLen,
    /// SGLang's rank pin (`data_parallel_rank`).
    pub data_parallel_rank: Option<u64>,
}

impl GenBody {
    pub fn prompt_tokens(&self) -> u64 {
        let bytes =
            self.messages.0 + self.prompt.0 + self.input.0 + self.system.0 + self.instructions.0;
        (bytes.div_ceil(4) as u64).max(1)
    }
    pub fn max_tokens(&self) -> Option<u64> {
        self.max_completion_tokens
            .or(self.max_tokens)
            .or(self.max_output_tokens)
    }
}

/// Body of `POST /mock/fault`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct FaultBody {
    pub status: Option<u16>,
    pub stall: Option<bool>,
    pub reset_after: Option<u32>,
}

/// Which API an inference request uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Api {
    Chat,
    Completions,
    Messages,
    Responses,
}

pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "BadRequestError",
        401 => "AuthenticationError",
        403 => "PermissionDeniedError",
        404 => "NotFoundError",
        405 => "MethodNotAllowed",
        429 => "RateLimitError",
        503 => "ServiceUnavailableError",
        s if s >= 500 => "InternalServerError",
        _ => "BadRequestError",
    }
}

/// OpenAI-shaped error body as vLLM returns it.
pub(crate) fn error_body(status: u16, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "error": {"message": message, "type": error_type(status), "param": null, "code": status}
    }))
    .unwrap_or_default()
}

fn hex_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One generation: everything needed to render its answer.
pub(crate) struct Gen {
    pub api: Api,
    id: String,
    msg_id: String,
    created: u64,
    /// JSON-encoded model name (with quotes).
    model: String,
    pub prompt: u64,
    pub tokens: u32,
    pub length: bool,
    include_usage: bool,
    seq: u64,
    /// Prompt tokens found in the prefix cache; `Some` only with the cache on, and then
    /// reported as `usage.prompt_tokens_details.cached_tokens` (chat and completions).
    pub cached_tokens: Option<u64>,
}

impl Gen {
    pub fn new(
        api: Api,
        model: &str,
        prompt: u64,
        tokens: u32,
        length: bool,
        include_usage: bool,
    ) -> Gen {
        let hex = hex_id();
        let id = match api {
            Api::Chat => format!("chatcmpl-{hex}"),
            Api::Completions => format!("cmpl-{hex}"),
            Api::Messages => format!("msg_{hex}"),
            Api::Responses => format!("resp_{hex}"),
        };
        Gen {
            api,
            id,
            msg_id: format!("msg_{}", hex_id()),
            created: unix_now(),
            model: serde_json::to_string(model).unwrap_or_else(|_| "\"\"".into()),
            prompt,
            tokens,
            length,
            include_usage,
            seq: 0,
            cached_tokens: None,
        }
    }

    /// The `usage.prompt_tokens_details` value of a full body.
    fn details(&self) -> String {
        match self.cached_tokens {
            Some(n) => format!("{{\"cached_tokens\":{n}}}"),
            None => "null".to_string(),
        }
    }

    fn finish(&self) -> &'static str {
        match (self.api, self.length) {
            (Api::Messages, true) => "max_tokens",
            (Api::Messages, false) => "end_turn",
            (_, true) => "length",
            (_, false) => "stop",
        }
    }

    /// The complete non-streaming answer.
    pub fn full_body(&self, out: &mut Vec<u8>) {
        let (p, c) = (self.prompt, self.tokens as u64);
        let (id, created, model, fin) = (&self.id, self.created, &self.model, self.finish());
        match self.api {
            Api::Chat => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"object\":\"chat.completion\",\"created\":{created},\"model\":{model},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"");
                push_text(out, self.tokens);
                let _ = write!(out, "\",\"tool_calls\":[]}},\"logprobs\":null,\"finish_reason\":\"{fin}\",\"stop_reason\":null}}],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c},\"prompt_tokens_details\":{}}},\"prompt_logprobs\":null}}", p + c, self.details());
            }
            Api::Completions => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"object\":\"text_completion\",\"created\":{created},\"model\":{model},\"choices\":[{{\"index\":0,\"text\":\"");
                push_text(out, self.tokens);
                let _ = write!(out, "\",\"logprobs\":null,\"finish_reason\":\"{fin}\",\"stop_reason\":null}}],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c},\"prompt_tokens_details\":{}}}}}", p + c, self.details());
            }
            Api::Messages => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{model},\"content\":[{{\"type\":\"text\",\"text\":\"");
                push_text(out, self.tokens);
                let _ = write!(out, "\"}}],\"stop_reason\":\"{fin}\",\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{p},\"output_tokens\":{c}}}}}");
            }
            Api::Responses => self.response_object(out, true),
        }
    }

    fn response_object(&self, out: &mut Vec<u8>, done: bool) {
        let (p, c) = (self.prompt, self.tokens as u64);
        let status = if done { "completed" } else { "in_progress" };
        let _ = write!(
            out,
            "{{\"id\":\"{}\",\"object\":\"response\",\"created_at\":{},\"model\":{},\"status\":\"{status}\",\"output\":[",
            self.id, self.created, self.model
        );
        if done {
            let _ = write!(out, "{{\"type\":\"message\",\"id\":\"{}\",\"role\":\"assistant\",\"status\":\"completed\",\"content\":[{{\"type\":\"output_text\",\"text\":\"", self.msg_id);
            push_text(out, self.tokens);
            let _ = write!(out, "\",\"annotations\":[]}}]}}],\"usage\":{{\"input_tokens\":{p},\"output_tokens\":{c},\"total_tokens\":{}}}}}", p + c);
        } else {
            out.extend_from_slice(b"],\"usage\":null}");
        }
    }

    fn usage_null(&self) -> &'static str {
        if self.include_usage {
            ",\"usage\":null"
        } else {
            ""
        }
    }

    /// Ends a chat or completions token event: the finish reason on the last token (else
    /// `not_last`, the choice's null fields), then the usage field and the event's end.
    fn end_choice_event(&self, ev: &mut Vec<u8>, last: bool, not_last: &[u8]) {
        if last {
            let _ = write!(
                ev,
                "\"finish_reason\":\"{}\",\"stop_reason\":null}}]",
                self.finish()
            );
        } else {
            ev.extend_from_slice(not_last);
        }
        let _ = write!(ev, "{}}}\n\n", self.usage_null());
    }

    /// A `response.created` or `response.completed` event carrying the response object.
    fn response_event(&mut self, ev: &mut Vec<u8>, kind: &str, done: bool) {
        let _ = write!(
            ev,
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":{},\"response\":",
            self.seq
        );
        self.seq += 1;
        self.response_object(ev, done);
        ev.extend_from_slice(b"}\n\n");
    }

    /// Events before the first token. Each event is appended to `ev` and handed to `emit`.
    pub fn start_events(&mut self, ev: &mut Vec<u8>, emit: &mut impl FnMut(&mut Vec<u8>)) {
        match self.api {
            Api::Chat => {
                let _ = write!(ev, "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]{}}}\n\n", self.id, self.created, self.model, self.usage_null());
                emit(ev);
            }
            Api::Completions => {}
            Api::Messages => {
                let _ = write!(ev, "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":0}}}}}}\n\n", self.id, self.model, self.prompt);
                emit(ev);
                ev.extend_from_slice(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
                emit(ev);
            }
            Api::Responses => {
                self.response_event(ev, "response.created", false);
                emit(ev);
            }
        }
    }

    /// The event carrying token `i` (the last one carries the finish reason for chat/completions).
    pub fn token_event(&mut self, i: u32, ev: &mut Vec<u8>) {
        let last = i + 1 >= self.tokens;
        let tok = if i < self.tokens { token(i) } else { "" };
        match self.api {
            Api::Chat => {
                let _ = write!(ev, "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{tok}\"}},\"logprobs\":null,", self.id, self.created, self.model);
                self.end_choice_event(ev, last, b"\"finish_reason\":null}]");
            }
            Api::Completions => {
                let _ = write!(ev, "data: {{\"id\":\"{}\",\"object\":\"text_completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"text\":\"{tok}\",\"logprobs\":null,", self.id, self.created, self.model);
                self.end_choice_event(ev, last, b"\"finish_reason\":null,\"stop_reason\":null}]");
            }
            Api::Messages => {
                let _ = write!(ev, "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{tok}\"}}}}\n\n");
            }
            Api::Responses => {
                let _ = write!(ev, "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"sequence_number\":{},\"item_id\":\"{}\",\"output_index\":0,\"content_index\":0,\"delta\":\"{tok}\"}}\n\n", self.seq, self.msg_id);
                self.seq += 1;
            }
        }
    }

    /// Events after the last token.
    pub fn end_events(&mut self, ev: &mut Vec<u8>, emit: &mut impl FnMut(&mut Vec<u8>)) {
        let (p, c) = (self.prompt, self.tokens as u64);
        match self.api {
            Api::Chat | Api::Completions => {
                if self.include_usage {
                    let object = if self.api == Api::Chat {
                        "chat.completion.chunk"
                    } else {
                        "text_completion"
                    };
                    let _ = write!(ev, "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c}", self.id, self.created, self.model, p + c);
                    if self.cached_tokens.is_some() {
                        let _ = write!(ev, ",\"prompt_tokens_details\":{}", self.details());
                    }
                    ev.extend_from_slice(b"}}\n\n");
                    emit(ev);
                }
                ev.extend_from_slice(b"data: [DONE]\n\n");
                emit(ev);
            }
            Api::Messages => {
                ev.extend_from_slice(b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
                emit(ev);
                let _ = write!(ev, "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{c}}}}}\n\n", self.finish());
                emit(ev);
                ev.extend_from_slice(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
                emit(ev);
            }
            Api::Responses => {
                self.response_event(ev, "response.completed", true);
                emit(ev);
            }
        }
    }
}

/// `POST /v1/embeddings` answer.
pub(crate) fn embeddings_body(out: &mut Vec<u8>, model: &str, prompt: u64) {
    let model = serde_json::to_string(model).unwrap_or_else(|_| "\"\"".into());
    let _ = write!(out, "{{\"object\":\"list\",\"data\":[{{\"object\":\"embedding\",\"index\":0,\"embedding\":[0.125,-0.25,0.375,-0.5,0.625,-0.75,0.875,-1.0]}}],\"model\":{model},\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{prompt}}}}}");
}

/// The context length the mock reports (`/v1/models`, `/tokenize`).
pub(crate) const MAX_MODEL_LEN: u32 = 8192;

/// The fields of vLLM's `TokenizeCompletionRequest` / `TokenizeChatRequest` that change
/// the mock's answer or its validation; the others (`model`, `add_special_tokens`,
/// `chat_template`, `tools`, ...) are accepted and ignored.
#[derive(Deserialize)]
struct TokenizeRequest {
    #[serde(default)]
    messages: Option<serde_json::Value>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    return_token_strs: Option<bool>,
}

/// `POST /tokenize` answer, as vLLM's `TokenizeResponse`:
/// `{"count":N,"max_model_len":M,"tokens":[...],"token_strs":null}`.
///
/// The tokens are the mock's token ids of the canonical prompt (`messages`, or else the
/// `prompt` string, re-serialised compactly; see `prefix`), exactly the tokens the prefix
/// cache and the KV events use for the same body. The mock has no chat template, so
/// `add_generation_prompt` does not change them. `return_token_strs` returns each piece
/// as text. Errors (400) follow vLLM's validation: a body without `messages` or a string
/// `prompt`, or with both `continue_final_message` and `add_generation_prompt` set.
pub(crate) fn tokenize_body(body: &[u8], chars_per_token: usize) -> Result<Vec<u8>, String> {
    let req: TokenizeRequest =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if req.continue_final_message == Some(true) && req.add_generation_prompt == Some(true) {
        return Err(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.".into(),
        );
    }
    let canonical = match (&req.messages, &req.prompt) {
        (Some(m @ serde_json::Value::Array(_)), _) => serde_json::to_vec(m),
        (None | Some(serde_json::Value::Null), Some(p @ serde_json::Value::String(_))) => {
            serde_json::to_vec(p)
        }
        _ => return Err("the request needs `messages` (a list) or `prompt` (a string)".into()),
    }
    .map_err(|e| e.to_string())?;
    let cpt = chars_per_token.max(1);
    let tokens = crate::prefix::token_ids(&canonical, cpt);
    let mut out = Vec::with_capacity(64 + tokens.len() * 7);
    let _ = write!(
        out,
        "{{\"count\":{},\"max_model_len\":{MAX_MODEL_LEN},\"tokens\":[",
        tokens.len()
    );
    for (i, t) in tokens.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}{t}");
    }
    out.extend_from_slice(b"],\"token_strs\":");
    if req.return_token_strs == Some(true) {
        let strs: Vec<String> = canonical
            .chunks(cpt)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        let _ = serde_json::to_writer(&mut out, &strs);
    } else {
        out.extend_from_slice(b"null");
    }
    out.push(b'}');
    Ok(out)
}

/// `GET /v1/models` answer.
pub(crate) fn models_body(models: &[String]) -> Vec<u8> {
    let created = unix_now();
    let data: Vec<_> = models
        .iter()
        .map(|m| {
            serde_json::json!({"id": m, "object": "model", "created": created, "owned_by": "vllm",
                "root": m, "parent": null, "max_model_len": MAX_MODEL_LEN, "permission": []})
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({"object": "list", "data": data})).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_counts_text() {
        let b: GenBody = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":"12345678"},{"role":"user","content":[{"type":"text","text":"abcd"}]}]}"#,
        )
        .unwrap();
        assert_eq!(b.prompt_tokens(), 3);
        let b: GenBody = serde_json::from_str(r#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(b.prompt_tokens(), 3);
        let b: GenBody = serde_json::from_str(r#"{"prompt":""}"#).unwrap();
        assert_eq!(b.prompt_tokens(), 1);
    }

    #[test]
    fn cached_tokens_in_usage() {
        for api in [Api::Chat, Api::Completions] {
            let mut g = Gen::new(api, "m", 40, 2, false, true);
            let mut out = Vec::new();
            g.full_body(&mut out);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert!(v["usage"]["prompt_tokens_details"].is_null());
            let mut ev = Vec::new();
            let mut events = Vec::new();
            g.end_events(&mut ev, &mut |ev: &mut Vec<u8>| {
                events.push(String::from_utf8(std::mem::take(ev)).unwrap())
            });
            assert!(!events[0].contains("prompt_tokens_details"));

            g.cached_tokens = Some(32);
            out.clear();
            g.full_body(&mut out);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["usage"]["prompt_tokens"], 40);
            assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
            events.clear();
            g.end_events(&mut ev, &mut |ev: &mut Vec<u8>| {
                events.push(String::from_utf8(std::mem::take(ev)).unwrap())
            });
            let data = events[0].strip_prefix("data: ").unwrap().trim_end();
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["usage"]["total_tokens"], 42);
            assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
        }
    }

    #[test]
    fn bodies_are_json() {
        for api in [Api::Chat, Api::Completions, Api::Messages, Api::Responses] {
            let mut g = Gen::new(api, "m\"x", 3, 4, true, true);
            let mut out = Vec::new();
            g.full_body(&mut out);
            serde_json::from_slice::<serde_json::Value>(&out).unwrap();
            let mut events = Vec::new();
            let mut ev = Vec::new();
            let mut emit = |ev: &mut Vec<u8>| {
                events.push(String::from_utf8(std::mem::take(ev)).unwrap());
            };
            g.start_events(&mut ev, &mut emit);
            for i in 0..4 {
                g.token_event(i, &mut ev);
                emit(&mut ev);
            }
            g.end_events(&mut ev, &mut emit);
            for e in events {
                let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                if data != "[DONE]" {
                    serde_json::from_str::<serde_json::Value>(data).unwrap();
                }
            }
        }
    }
}
