//! The OpenAI / Anthropic / Responses wire formats as vLLM serves them: request-body
//! parsing (only what the mock needs), how an answer ends (its length, a stop string or a
//! tool call) and rendering of full answers, stream events and error bodies. Token text
//! comes from a fixed word list. Renders only: it must not decide timing or keep state.

use std::fmt;
use std::io::Write as _;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

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
    /// The tools offered: chat's `{"type":"function","function":{"name",...}}`, messages'
    /// `{"name",...}`; any JSON is accepted, and only a non-empty list counts.
    pub tools: Option<Value>,
    /// Chat's `"none"`/`"auto"`/`"required"`/`{"type":"function","function":{"name"}}`,
    /// messages' `{"type":"none"|"auto"|"any"}`/`{"type":"tool","name"}`.
    pub tool_choice: Option<Value>,
    /// Chat's and completions' stop strings: one string or a list.
    pub stop: Option<Value>,
    /// Messages' stop strings: a list.
    pub stop_sequences: Option<Value>,
    /// The tool the answer calls, decided by [`GenBody::decide`]; `None` for text.
    #[serde(skip)]
    pub call_tool: Option<String>,
    /// The stop strings that apply to the request's API, decided by [`GenBody::decide`].
    #[serde(skip)]
    pub stops: Vec<String>,
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

    /// Fills `call_tool` and `stops` for a request of `api` whose whole body is `body`.
    pub fn decide(&mut self, api: Api, body: &[u8]) {
        self.call_tool = self.tool_to_call(api, body);
        let stops = match api {
            Api::Chat | Api::Completions => self.stop.as_ref(),
            Api::Messages => self.stop_sequences.as_ref(),
            Api::Responses => None,
        };
        self.stops = match stops {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        };
        self.stops.retain(|s| !s.is_empty());
    }

    /// The tool a chat or messages request gets one call of: it offers tools, its
    /// `tool_choice` is not none, and its conversation does not end with a tool's result.
    /// The tool is the one `tool_choice` names, else the first one offered.
    fn tool_to_call(&self, api: Api, body: &[u8]) -> Option<String> {
        let first = self.tools.as_ref()?.as_array()?.first()?;
        let choice = self.tool_choice.as_ref();
        let (named, first_name) = match api {
            Api::Chat => {
                if choice.and_then(Value::as_str) == Some("none") {
                    return None;
                }
                let named = choice.and_then(|c| c.pointer("/function/name"));
                (named, first.pointer("/function/name"))
            }
            Api::Messages => {
                let kind = choice.and_then(|c| c.get("type")).and_then(Value::as_str);
                let named = match kind {
                    Some("none") => return None,
                    Some("tool") => choice.and_then(|c| c.get("name")),
                    _ => None,
                };
                (named, first.get("name"))
            }
            Api::Completions | Api::Responses => return None,
        };
        let name = named
            .and_then(Value::as_str)
            .or(first_name.and_then(Value::as_str))?;
        (!ends_with_tool_result(api, body)).then(|| name.to_string())
    }
}

/// Whether a conversation's last turn hands back a tool's result: chat's last message has
/// the role `tool`; in messages, the last user message holds a `tool_result` block.
fn ends_with_tool_result(api: Api, body: &[u8]) -> bool {
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Conversation {
        messages: Value,
    }
    let conversation: Conversation = serde_json::from_slice(body).unwrap_or_default();
    let Some(messages) = conversation.messages.as_array() else {
        return false;
    };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
    match api {
        Api::Chat => messages.last().and_then(role).as_deref() == Some("tool"),
        _ => messages
            .iter()
            .rev()
            .find(|m| role(m).as_deref() == Some("user"))
            .and_then(|m| m.get("content"))
            .and_then(Value::as_array)
            .is_some_and(|blocks| {
                blocks
                    .iter()
                    .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            }),
    }
}

/// Where the first of `stops` occurs whole in the text of the first `tokens` tokens: the
/// number of tokens before the one it begins in, and the string. The earliest occurrence
/// wins; at the same place, the string listed first.
pub(crate) fn find_stop(stops: &[String], tokens: u32) -> Option<(u32, &str)> {
    if stops.is_empty() {
        return None;
    }
    let mut text = String::new();
    for i in 0..tokens {
        text.push_str(token(i));
    }
    let (at, stop) = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s.as_str())))
        .min_by_key(|&(at, _)| at)?;
    let mut start = 0;
    for i in 0..tokens {
        start += token(i).len();
        if start > at {
            return Some((i, stop));
        }
    }
    None
}

/// How an answer ends, beyond its length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Ending {
    /// All its tokens, or as many as `max_tokens` allows.
    #[default]
    Natural,
    /// Cut before the token this stop string begins in.
    Stop(String),
    /// One call of this tool instead of text.
    ToolCall(String),
}

/// Token events of a tool call's stream: the call's head, then its arguments in two pieces.
pub(crate) const TOOL_CALL_EVENTS: u32 = 3;
/// The completion tokens a tool call counts.
pub(crate) const TOOL_CALL_TOKENS: u64 = 12;
/// The arguments of every tool call, as JSON text.
pub(crate) const TOOL_ARGUMENTS: &str = r#"{"location": "Paris", "unit": "celsius"}"#;
/// [`TOOL_ARGUMENTS`] as streamed, in two pieces.
const TOOL_ARGUMENT_PIECES: [&str; 2] = [r#"{"location": "Paris", "#, r#""unit": "celsius"}"#];

/// The answer's text and finish for a request that may stop early or call a tool: the
/// token events, whether `max_tokens` cut it, and how it ends.
pub(crate) fn choose_ending(gb: &GenBody, tokens: u32, length: bool) -> (u32, bool, Ending) {
    if let Some(name) = &gb.call_tool {
        return (TOOL_CALL_EVENTS, false, Ending::ToolCall(name.clone()));
    }
    match find_stop(&gb.stops, tokens) {
        Some((sent, stop)) => (sent, false, Ending::Stop(stop.to_string())),
        None => (tokens, length, Ending::Natural),
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

/// JSON text of a string (with its quotes).
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A tool call's id and JSON-encoded tool name.
struct ToolCall {
    id: String,
    name: String,
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
    /// Token events: the text's tokens, or [`TOOL_CALL_EVENTS`] for a tool call.
    pub tokens: u32,
    pub length: bool,
    include_usage: bool,
    seq: u64,
    /// Prompt tokens found in the prefix cache; `Some` only with the cache on, and then
    /// reported as `usage.prompt_tokens_details.cached_tokens` (chat and completions).
    pub cached_tokens: Option<u64>,
    /// Anthropic's `ping` event after `message_start` (an Anthropic-mode engine's streams).
    pub ping: bool,
    /// The stop string that cut the text, JSON-encoded.
    stop: Option<String>,
    /// The tool call answered instead of text.
    tool: Option<ToolCall>,
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
            model: json_str(model),
            prompt,
            tokens,
            length,
            include_usage,
            seq: 0,
            cached_tokens: None,
            ping: false,
            stop: None,
            tool: None,
        }
    }

    /// Ends the answer as `ending` says: at a stop string, or with a tool call (chat and
    /// messages only; other APIs answer text).
    pub fn with_ending(mut self, ending: Ending) -> Gen {
        match ending {
            Ending::Natural => {}
            Ending::Stop(s) => self.stop = Some(json_str(&s)),
            Ending::ToolCall(name) if matches!(self.api, Api::Chat | Api::Messages) => {
                let prefix = if self.api == Api::Chat {
                    "call"
                } else {
                    "toolu"
                };
                let hex = format!("{:024x}", fastrand::u128(..) >> 32);
                let (id, name) = (format!("{prefix}_{hex}"), json_str(&name));
                self.tool = Some(ToolCall { id, name });
            }
            Ending::ToolCall(_) => {}
        }
        self
    }

    /// The completion tokens the usage reports: the text's, or [`TOOL_CALL_TOKENS`].
    pub fn completion_tokens(&self) -> u64 {
        match self.tool {
            Some(_) => TOOL_CALL_TOKENS,
            None => self.tokens as u64,
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
        let messages = self.api == Api::Messages;
        match (messages, &self.tool, &self.stop, self.length) {
            (true, Some(_), _, _) => "tool_use",
            (false, Some(_), _, _) => "tool_calls",
            (true, None, Some(_), _) => "stop_sequence",
            (true, None, None, true) => "max_tokens",
            (true, None, None, false) => "end_turn",
            (false, None, _, true) => "length",
            (false, None, _, false) => "stop",
        }
    }

    /// vLLM's `stop_reason` (chat, completions) and Anthropic's `stop_sequence`: the
    /// matched stop string, else `null`.
    fn stop_value(&self) -> &str {
        self.stop.as_deref().unwrap_or("null")
    }

    /// The complete non-streaming answer.
    pub fn full_body(&self, out: &mut Vec<u8>) {
        let (p, c) = (self.prompt, self.completion_tokens());
        let (id, created, model, fin) = (&self.id, self.created, &self.model, self.finish());
        let stop = self.stop_value();
        match self.api {
            Api::Chat => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"object\":\"chat.completion\",\"created\":{created},\"model\":{model},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":");
                self.chat_message_rest(out);
                let _ = write!(out, "}},\"logprobs\":null,\"finish_reason\":\"{fin}\",\"stop_reason\":{stop}}}],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c},\"prompt_tokens_details\":{}}},\"prompt_logprobs\":null}}", p + c, self.details());
            }
            Api::Completions => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"object\":\"text_completion\",\"created\":{created},\"model\":{model},\"choices\":[{{\"index\":0,\"text\":\"");
                push_text(out, self.tokens);
                let _ = write!(out, "\",\"logprobs\":null,\"finish_reason\":\"{fin}\",\"stop_reason\":{stop}}}],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c},\"prompt_tokens_details\":{}}}}}", p + c, self.details());
            }
            Api::Messages => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{model},\"content\":[");
                match &self.tool {
                    Some(t) => {
                        let _ = write!(out, "{{\"type\":\"tool_use\",\"id\":\"{}\",\"name\":{},\"input\":{TOOL_ARGUMENTS}}}", t.id, t.name);
                    }
                    None => {
                        out.extend_from_slice(b"{\"type\":\"text\",\"text\":\"");
                        push_text(out, self.tokens);
                        out.extend_from_slice(b"\"}");
                    }
                }
                let _ = write!(out, "],\"stop_reason\":\"{fin}\",\"stop_sequence\":{stop},\"usage\":{{\"input_tokens\":{p},\"output_tokens\":{c}}}}}");
            }
            Api::Responses => self.response_object(out, true),
        }
    }

    /// A whole chat message after `"content":`: the text and an empty `tool_calls`, or a
    /// null content and the tool call.
    fn chat_message_rest(&self, out: &mut Vec<u8>) {
        match &self.tool {
            Some(t) => {
                let _ = write!(out, "null,\"tool_calls\":[{{\"id\":\"{}\",\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":{}}}}}]", t.id, t.name, json_str(TOOL_ARGUMENTS));
            }
            None => {
                out.push(b'"');
                push_text(out, self.tokens);
                out.extend_from_slice(b"\",\"tool_calls\":[]");
            }
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
                "\"finish_reason\":\"{}\",\"stop_reason\":{}}}]",
                self.finish(),
                self.stop_value()
            );
        } else {
            ev.extend_from_slice(not_last);
        }
        let _ = write!(ev, "{}}}\n\n", self.usage_null());
    }

    /// The opening of a chat chunk, up to its choice's `delta` value.
    fn chat_chunk_head(&self, ev: &mut Vec<u8>) {
        let _ = write!(ev, "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\"delta\":", self.id, self.created, self.model);
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
                self.chat_chunk_head(ev);
                let _ = write!(ev, "{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]{}}}\n\n", self.usage_null());
                emit(ev);
            }
            Api::Completions => {}
            Api::Messages => {
                let _ = write!(ev, "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":0}}}}}}\n\n", self.id, self.model, self.prompt);
                emit(ev);
                if self.ping {
                    ev.extend_from_slice(b"event: ping\ndata: {\"type\": \"ping\"}\n\n");
                    emit(ev);
                }
                // A tool call's block opens with its first token event.
                if self.tool.is_none() {
                    ev.extend_from_slice(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
                    emit(ev);
                }
            }
            Api::Responses => {
                self.response_event(ev, "response.created", false);
                emit(ev);
            }
        }
    }

    /// The event carrying token `i` (the last one carries the finish reason for chat/completions).
    pub fn token_event(&mut self, i: u32, ev: &mut Vec<u8>) {
        if self.tool.is_some() {
            return self.tool_event(i, ev);
        }
        let last = i + 1 >= self.tokens;
        let tok = if i < self.tokens { token(i) } else { "" };
        match self.api {
            Api::Chat => {
                self.chat_chunk_head(ev);
                let _ = write!(ev, "{{\"content\":\"{tok}\"}},\"logprobs\":null,");
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

    /// A tool call's event `i`: 0 names the tool, 1 and 2 carry the arguments' pieces.
    fn tool_event(&self, i: u32, ev: &mut Vec<u8>) {
        let Some(t) = &self.tool else {
            return;
        };
        let piece = json_str(TOOL_ARGUMENT_PIECES[(i.max(1) as usize - 1).min(1)]);
        match (self.api, i) {
            (Api::Chat, 0) => {
                self.chat_chunk_head(ev);
                let _ = write!(ev, "{{\"tool_calls\":[{{\"index\":0,\"id\":\"{}\",\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":\"\"}}}}]}},\"logprobs\":null,\"finish_reason\":null}}]{}}}\n\n", t.id, t.name, self.usage_null());
            }
            (Api::Chat, _) => {
                self.chat_chunk_head(ev);
                let _ = write!(ev, "{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":{piece}}}}}]}},\"logprobs\":null,\"finish_reason\":null}}]{}}}\n\n", self.usage_null());
            }
            (_, 0) => {
                let _ = write!(ev, "event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"tool_use\",\"id\":\"{}\",\"name\":{},\"input\":{{}}}}}}\n\n", t.id, t.name);
            }
            (_, _) => {
                let _ = write!(ev, "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":{piece}}}}}\n\n");
            }
        }
    }

    /// Events after the last token.
    pub fn end_events(&mut self, ev: &mut Vec<u8>, emit: &mut impl FnMut(&mut Vec<u8>)) {
        let (p, c) = (self.prompt, self.completion_tokens());
        match self.api {
            Api::Chat | Api::Completions => {
                if self.tool.is_some() {
                    // A tool call's finish comes in a chunk of its own.
                    self.chat_chunk_head(ev);
                    ev.extend_from_slice(b"{},\"logprobs\":null,");
                    self.end_choice_event(ev, true, b"");
                    emit(ev);
                }
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
                let _ = write!(ev, "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":{}}},\"usage\":{{\"output_tokens\":{c}}}}}\n\n", self.finish(), self.stop_value());
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

    fn decided(api: Api, body: &str) -> GenBody {
        let mut gb: GenBody = serde_json::from_str(body).unwrap();
        gb.decide(api, body.as_bytes());
        gb
    }

    #[test]
    fn stop_strings_cut_before_their_token() {
        let stops = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(find_stop(&stops(&["mock"]), 16), Some((3, "mock")));
        assert_eq!(find_stop(&stops(&[" mock"]), 16), Some((3, " mock")));
        // Begins in " from" (token 1), ends in " the".
        assert_eq!(find_stop(&stops(&["om the"]), 16), Some((1, "om the")));
        // Earliest wins; at the same place, the first listed.
        assert_eq!(find_stop(&stops(&["fast", "the"]), 16), Some((2, "the")));
        assert_eq!(find_stop(&stops(&["the m", "the"]), 16), Some((2, "the m")));
        assert_eq!(find_stop(&stops(&["Hello"]), 16), Some((0, "Hello")));
        // Only whole within the text: "mock" is token 3, past 3 tokens.
        assert_eq!(find_stop(&stops(&["mock"]), 3), None);
        assert_eq!(find_stop(&stops(&["the mo"]), 3), None);
        assert_eq!(find_stop(&stops(&["", "absent"]), 16), None);
        assert_eq!(find_stop(&[], 16), None);
        // Later laps of the word list count too.
        assert_eq!(
            find_stop(&stops(&["loop. Hello"]), 40),
            Some((30, "loop. Hello"))
        );
    }

    #[test]
    fn stops_by_api_and_hostile_values() {
        let gb = decided(Api::Chat, r#"{"stop":"a"}"#);
        assert_eq!(gb.stops, ["a"]);
        let gb = decided(Api::Completions, r#"{"stop":["a","",null,{"x":1},"b"]}"#);
        assert_eq!(gb.stops, ["a", "b"]);
        let gb = decided(Api::Chat, r#"{"stop":{"a":1},"stop_sequences":["x"]}"#);
        assert!(gb.stops.is_empty());
        let gb = decided(Api::Messages, r#"{"stop":["x"],"stop_sequences":["y"]}"#);
        assert_eq!(gb.stops, ["y"]);
        let gb = decided(Api::Responses, r#"{"stop":["x"]}"#);
        assert!(gb.stops.is_empty());
    }

    #[test]
    fn which_tool_is_called() {
        let chat_tools = r#""tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}]"#;
        let ask = r#""messages":[{"role":"user","content":"q"}]"#;
        let chat = |extra: &str| {
            let body = format!("{{{chat_tools},{ask}{extra}}}");
            decided(Api::Chat, &body).call_tool
        };
        assert_eq!(chat("").as_deref(), Some("a"));
        assert_eq!(chat(r#","tool_choice":"auto""#).as_deref(), Some("a"));
        assert_eq!(
            chat(r#","tool_choice":{"type":"function","function":{"name":"b"}}"#).as_deref(),
            Some("b")
        );
        assert_eq!(chat(r#","tool_choice":"none""#), None);
        // A named tool that is not a string: the first one.
        assert_eq!(
            chat(r#","tool_choice":{"function":{"name":5}}"#).as_deref(),
            Some("a")
        );
        let msg_tools = r#""tools":[{"name":"a"},{"name":"b"}]"#;
        let messages = |extra: &str| {
            let body = format!("{{{msg_tools},{ask}{extra}}}");
            decided(Api::Messages, &body).call_tool
        };
        assert_eq!(messages("").as_deref(), Some("a"));
        assert_eq!(
            messages(r#","tool_choice":{"type":"any"}"#).as_deref(),
            Some("a")
        );
        assert_eq!(
            messages(r#","tool_choice":{"type":"tool","name":"b"}"#).as_deref(),
            Some("b")
        );
        assert_eq!(messages(r#","tool_choice":{"type":"none"}"#), None);
        // Hostile shapes answer text, never fail.
        for body in [
            r#"{"tools":"x","messages":[]}"#,
            r#"{"tools":[],"messages":[]}"#,
            r#"{"tools":[1],"messages":[]}"#,
            r#"{"tools":[{"function":"x"}],"messages":"x"}"#,
            r#"{"tools":null}"#,
        ] {
            assert_eq!(decided(Api::Chat, body).call_tool, None, "{body}");
            assert_eq!(decided(Api::Messages, body).call_tool, None, "{body}");
        }
        // Messages that are not a list: no tool result in them.
        let gb = decided(
            Api::Chat,
            r#"{"tools":[{"function":{"name":"a"}}],"messages":7}"#,
        );
        assert_eq!(gb.call_tool.as_deref(), Some("a"));
        // Completions and responses never call tools.
        let body = r#"{"tools":[{"name":"a","function":{"name":"a"}}],"prompt":"x"}"#;
        assert_eq!(decided(Api::Completions, body).call_tool, None);
        assert_eq!(decided(Api::Responses, body).call_tool, None);
    }

    #[test]
    fn tool_results_end_the_calls() {
        let chat = |messages: &str| {
            let body =
                format!(r#"{{"tools":[{{"function":{{"name":"a"}}}}],"messages":{messages}}}"#);
            decided(Api::Chat, &body).call_tool
        };
        assert_eq!(
            chat(r#"[{"role":"user"},{"role":"tool","content":"r"}]"#),
            None
        );
        assert_eq!(
            chat(r#"[{"role":"tool"},{"role":"user","content":"again"}]"#).as_deref(),
            Some("a")
        );
        let messages = |messages: &str| {
            let body = format!(r#"{{"tools":[{{"name":"a"}}],"messages":{messages}}}"#);
            decided(Api::Messages, &body).call_tool
        };
        let result = r#"{"role":"user","content":[{"type":"text","text":"x"},{"type":"tool_result","tool_use_id":"t"}]}"#;
        assert_eq!(messages(&format!("[{result}]")), None);
        // The last user message counts, whatever follows it.
        assert_eq!(
            messages(&format!(
                r#"[{result},{{"role":"assistant","content":"ok"}}]"#
            )),
            None
        );
        assert_eq!(
            messages(&format!(r#"[{result},{{"role":"user","content":"more"}}]"#)).as_deref(),
            Some("a")
        );
        assert_eq!(
            messages(r#"[{"role":"user","content":[{"type":"text"}]}]"#).as_deref(),
            Some("a")
        );
    }

    #[test]
    fn bodies_are_json() {
        let endings = [
            Ending::Natural,
            Ending::Stop("a \"quoted\" stop".into()),
            Ending::ToolCall("tool \"x\"".into()),
        ];
        for (api, ending) in [Api::Chat, Api::Completions, Api::Messages, Api::Responses]
            .into_iter()
            .flat_map(|api| endings.clone().map(|e| (api, e)))
        {
            let mut g = Gen::new(api, "m\"x", 3, 4, true, true).with_ending(ending);
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
