//! Chat Completions over an Anthropic Messages API: an OpenAI Chat Completions request
//! written as a `/v1/messages` request, and the Messages answer (a whole message, an error
//! or an event stream) written back as a `chat.completion`, an OpenAI error body or
//! `chat.completion.chunk` events ending in `data: [DONE]`.
//!
//! The request's fields:
//! - Mapped: `model` (replaced when the target maps it), `max_completion_tokens` or
//!   `max_tokens` (→ `max_tokens`, [`DEFAULT_MAX_TOKENS`] when neither is given),
//!   `temperature`, `top_p`, `top_k`, `stop` (→ `stop_sequences`), `stream`, `user`
//!   (→ `metadata.user_id`), `tools`, `tool_choice`, `parallel_tool_calls: false`
//!   (→ `disable_parallel_tool_use`, not added to a `none` choice).
//! - Messages: `system` and `developer` messages, wherever they are, become the top-level
//!   `system` (joined with a blank line); `tool` messages become `tool_result` blocks of a
//!   user message; consecutive messages of one role are merged into one, with a user
//!   message's tool results first (Anthropic wants them so); an assistant message with
//!   neither text nor tool calls is left out.
//! - Refused, naming the field: `n` > 1, a `response_format` other than text, `logprobs`,
//!   `top_logprobs`, the legacy `functions`, `function_call` and `function` role, audio
//!   and file parts, images that are neither `data:…;base64,` nor http(s) URLs, tool call
//!   arguments that are not a JSON object, fields of the wrong JSON type.
//! - Dropped, having no Anthropic counterpart: `frequency_penalty`, `presence_penalty`,
//!   `seed`, `logit_bias`, `reasoning_effort`, `service_tier`, `store`, `metadata`,
//!   `modalities`, `audio`, `prediction`, `web_search_options`, `stream_options` (read for
//!   the usage chunk only), a tool's `strict`, an image's `detail`, an assistant message's
//!   `reasoning_content` (thinking blocks cannot be sent back without their signature),
//!   and any unknown field. `tool_choice` and `parallel_tool_calls` are dropped when no
//!   tools are given. A `null` field is taken as absent.
//!
//! The answer: text blocks → `content` (joined), `tool_use` → `tool_calls`, `thinking` →
//! `reasoning_content` (joined); `redacted_thinking` and server tool blocks are dropped.
//! Prompt tokens count Anthropic's input, cache read and cache creation tokens.
//!
//! Owns the mapping of the two APIs' shapes only: no I/O, no clocks, no randomness (ids are
//! made from [`Asked::id_seed`]).

use serde_json::{json, Map, Value};

use super::{Asked, NotTheApi, Refusal, SseSplitter};

/// The `max_tokens` sent when the client gives no limit: Anthropic requires one, OpenAI
/// does not.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Writes the Chat Completions request `body` as an Anthropic Messages request into `out`
/// (appended); `model` replaces the client's model name when given. The returned [`Asked`]
/// holds the client's model name as sent, `stream` and `stream_options.include_usage`.
pub fn request(body: &[u8], model: Option<&str>, out: &mut Vec<u8>) -> Result<Asked, Refusal> {
    let chat = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(chat)) => chat,
        Ok(_) => return Err(Refusal::new("the request body must be a JSON object", None)),
        Err(e) => {
            return Err(Refusal::new(
                format!("the request body is not valid JSON: {e}"),
                None,
            ))
        }
    };
    refuse_unsupported(&chat)?;
    let client_model = match field(&chat, "model") {
        None => None,
        Some(Value::String(name)) => Some(name.clone()),
        Some(_) => return Err(wrong("model", "a string")),
    };
    let engine_model = match (model, &client_model) {
        (Some(mapped), _) => mapped.to_string(),
        (None, Some(name)) => name.clone(),
        (None, None) => return Err(Refusal::new("`model` is required", Some("model"))),
    };
    let stream = optional_bool(&chat, "stream")?;
    let include_usage = field(&chat, "stream_options")
        .and_then(|options| options.get("include_usage"))
        == Some(&Value::Bool(true));
    let (system, messages) = translate_messages(&chat)?;

    let mut anthropic = Map::new();
    anthropic.insert("model".into(), engine_model.into());
    anthropic.insert("max_tokens".into(), max_tokens(&chat)?.into());
    if !system.is_empty() {
        anthropic.insert("system".into(), system.join("\n\n").into());
    }
    anthropic.insert("messages".into(), messages);
    copy_sampling(&chat, &mut anthropic)?;
    if let Some(stop) = stop_sequences(&chat)? {
        anthropic.insert("stop_sequences".into(), stop.into());
    }
    if let Some(stream) = stream {
        anthropic.insert("stream".into(), stream.into());
    }
    match field(&chat, "user") {
        None => {}
        Some(Value::String(user)) => {
            anthropic.insert("metadata".into(), json!({ "user_id": user }));
        }
        Some(_) => return Err(wrong("user", "a string")),
    }
    translate_tools(&chat, &mut anthropic)?;
    write_json(out, &Value::Object(anthropic));
    Ok(Asked {
        model: client_model.unwrap_or_default(),
        stream: stream.unwrap_or(false),
        include_usage,
        ..Asked::default()
    })
}

/// A field of `object`, `None` when absent or `null`.
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

/// The refusal of a field of the wrong shape.
fn wrong(param: &str, what: &str) -> Refusal {
    Refusal::new(format!("`{param}` must be {what}"), Some(param))
}

/// An optional boolean field.
fn optional_bool(chat: &Map<String, Value>, key: &str) -> Result<Option<bool>, Refusal> {
    match field(chat, key) {
        None => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

/// Refuses the fields whose meaning the Messages API cannot give.
fn refuse_unsupported(chat: &Map<String, Value>) -> Result<(), Refusal> {
    let unsupported = |param: &str, why: &str| Err(Refusal::new(why, Some(param)));
    if let Some(n) = field(chat, "n") {
        match n.as_u64() {
            Some(0 | 1) => {}
            Some(_) => return unsupported("n", "`n` greater than 1 is not supported"),
            None => return Err(wrong("n", "an integer")),
        }
    }
    if let Some(format) = field(chat, "response_format") {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return unsupported(
                "response_format",
                "only a `text` response_format is supported",
            );
        }
    }
    if field(chat, "logprobs") == Some(&Value::Bool(true)) {
        return unsupported("logprobs", "log probabilities are not supported");
    }
    if field(chat, "top_logprobs").is_some_and(|n| n.as_u64() != Some(0)) {
        return unsupported("top_logprobs", "log probabilities are not supported");
    }
    for legacy in ["functions", "function_call"] {
        if field(chat, legacy).is_some() {
            return unsupported(
                legacy,
                "the legacy function calling is not supported; use `tools`",
            );
        }
    }
    Ok(())
}

/// `max_completion_tokens`, else `max_tokens`, else [`DEFAULT_MAX_TOKENS`].
fn max_tokens(chat: &Map<String, Value>) -> Result<u64, Refusal> {
    for key in ["max_completion_tokens", "max_tokens"] {
        if let Some(limit) = field(chat, key) {
            return limit
                .as_u64()
                .ok_or_else(|| wrong(key, "a non-negative integer"));
        }
    }
    Ok(DEFAULT_MAX_TOKENS)
}

/// Copies `temperature`, `top_p` and `top_k` as given.
fn copy_sampling(
    chat: &Map<String, Value>,
    anthropic: &mut Map<String, Value>,
) -> Result<(), Refusal> {
    for key in ["temperature", "top_p", "top_k"] {
        if let Some(value) = field(chat, key) {
            if !value.is_number() {
                return Err(wrong(key, "a number"));
            }
            anthropic.insert(key.into(), value.clone());
        }
    }
    Ok(())
}

/// `stop` as a list, `None` when absent or empty.
fn stop_sequences(chat: &Map<String, Value>) -> Result<Option<Vec<String>>, Refusal> {
    match field(chat, "stop") {
        None => Ok(None),
        Some(Value::String(stop)) => Ok(Some(vec![stop.clone()])),
        Some(Value::Array(list)) => {
            let stops = list
                .iter()
                .map(|stop| stop.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| wrong("stop", "a string or a list of strings"))?;
            Ok((!stops.is_empty()).then_some(stops))
        }
        Some(_) => Err(wrong("stop", "a string or a list of strings")),
    }
}

/// A message's content on the Anthropic side: a plain string until merged with another.
enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

impl Content {
    fn into_blocks(self) -> Vec<Value> {
        match self {
            Content::Text(text) => vec![text_block(&text)],
            Content::Blocks(blocks) => blocks,
        }
    }
}

/// One Anthropic message.
struct Turn {
    role: &'static str,
    content: Content,
}

impl Turn {
    fn into_value(self) -> Value {
        let content = match self.content {
            Content::Text(text) => Value::String(text),
            Content::Blocks(mut blocks) => {
                // Stable: tool results first, everything else in its order.
                blocks.sort_by_key(|block| block.get("type") != Some(&json!("tool_result")));
                Value::Array(blocks)
            }
        };
        json!({ "role": self.role, "content": content })
    }
}

/// Appends a message, merged into the last one when it has the same role.
fn push_turn(turns: &mut Vec<Turn>, role: &'static str, content: Content) {
    match turns.last_mut() {
        Some(last) if last.role == role => {
            let earlier = std::mem::replace(&mut last.content, Content::Blocks(Vec::new()));
            let mut blocks = earlier.into_blocks();
            blocks.extend(content.into_blocks());
            last.content = Content::Blocks(blocks);
        }
        _ => turns.push(Turn { role, content }),
    }
}

/// The system text (each system or developer message's) and the Anthropic messages.
fn translate_messages(chat: &Map<String, Value>) -> Result<(Vec<String>, Value), Refusal> {
    let Some(Value::Array(list)) = chat.get("messages") else {
        return Err(wrong("messages", "a list of messages"));
    };
    let mut system = Vec::new();
    let mut turns = Vec::new();
    for (i, message) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(message) = message else {
            return Err(wrong(&at, "an object"));
        };
        let role_param = format!("{at}.role");
        let Some(role) = message.get("role").and_then(Value::as_str) else {
            return Err(wrong(&role_param, "a string"));
        };
        match role {
            "system" | "developer" => {
                let text = joined_text(field(message, "content"), &format!("{at}.content"))?;
                if !text.is_empty() {
                    system.push(text);
                }
            }
            "user" => push_turn(&mut turns, "user", user_content(message, &at)?),
            "assistant" => {
                let blocks = assistant_blocks(message, &at)?;
                if !blocks.is_empty() {
                    push_turn(&mut turns, "assistant", Content::Blocks(blocks));
                }
            }
            "tool" => push_turn(
                &mut turns,
                "user",
                Content::Blocks(vec![tool_result(message, &at)?]),
            ),
            "function" => {
                return Err(Refusal::new(
                    "the legacy `function` role is not supported; use `tool` messages",
                    Some(&role_param),
                ))
            }
            other => {
                return Err(Refusal::new(
                    format!("unknown role `{other}`"),
                    Some(&role_param),
                ))
            }
        }
    }
    let messages = turns.into_iter().map(Turn::into_value).collect();
    Ok((system, Value::Array(messages)))
}

/// An Anthropic text block.
fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// The `text` of a text part at `at`.
fn part_text(part: &Value, at: &str) -> Result<String, Refusal> {
    part.get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| wrong(&format!("{at}.text"), "a string"))
}

/// A string content or its text parts concatenated (system, developer and tool messages).
fn joined_text(content: Option<&Value>, param: &str) -> Result<String, Refusal> {
    match content {
        None => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{param}[{j}]");
                if part.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(Refusal::new(
                        "only text content parts are supported in this message",
                        Some(&format!("{at}.type")),
                    ));
                }
                text.push_str(&part_text(part, &at)?);
            }
            Ok(text)
        }
        Some(_) => Err(wrong(param, "a string or a list of text parts")),
    }
}

/// A user message's content: its string, or its parts as blocks.
fn user_content(message: &Map<String, Value>, at: &str) -> Result<Content, Refusal> {
    let param = format!("{at}.content");
    match field(message, "content") {
        Some(Value::String(text)) => Ok(Content::Text(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| user_part(part, &format!("{param}[{j}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Content::Blocks),
        _ => Err(wrong(&param, "a string or a list of content parts")),
    }
}

/// One part of a user message as an Anthropic block.
fn user_part(part: &Value, at: &str) -> Result<Value, Refusal> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => Ok(text_block(&part_text(part, at)?)),
        "image_url" => image_block(part, at),
        "input_audio" | "file" => Err(Refusal::new(
            format!("`{kind}` content parts are not supported by this model"),
            Some(&format!("{at}.type")),
        )),
        _ => Err(Refusal::new(
            format!("unknown content part type `{kind}`"),
            Some(&format!("{at}.type")),
        )),
    }
}

/// An `image_url` part as an image block: a base64 source from a `data:` URL, a URL source
/// from an http(s) URL.
fn image_block(part: &Value, at: &str) -> Result<Value, Refusal> {
    let param = format!("{at}.image_url.url");
    let url = match part.get("image_url") {
        Some(Value::String(url)) => Some(url.as_str()),
        Some(image) => image.get("url").and_then(Value::as_str),
        None => None,
    }
    .ok_or_else(|| wrong(&param, "a string"))?;
    let source = if let Some(rest) = strip_prefix_ignoring_case(url, "data:") {
        let (media_type, data) = base64_data(rest).ok_or_else(|| {
            Refusal::new(
                "an image `data:` URL must be `data:<media type>;base64,<data>`",
                Some(&param),
            )
        })?;
        json!({ "type": "base64", "media_type": media_type, "data": data })
    } else if strip_prefix_ignoring_case(url, "https://").is_some()
        || strip_prefix_ignoring_case(url, "http://").is_some()
    {
        json!({ "type": "url", "url": url })
    } else {
        return Err(Refusal::new(
            "an image URL must be a `data:` URL or an http(s) URL",
            Some(&param),
        ));
    };
    Ok(json!({ "type": "image", "source": source }))
}

/// `text` without `prefix` (ASCII, matched in any case).
fn strip_prefix_ignoring_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// The media type and data of a `data:` URL's rest, when it is base64.
fn base64_data(rest: &str) -> Option<(&str, &str)> {
    let (header, data) = rest.split_once(',')?;
    let cut = header.len().checked_sub(";base64".len())?;
    if !header.get(cut..)?.eq_ignore_ascii_case(";base64") {
        return None;
    }
    let media_type = header.get(..cut)?.split(';').next()?;
    (!media_type.is_empty() && !data.is_empty()).then_some((media_type, data))
}

/// An assistant message's text blocks, then its tool calls as `tool_use` blocks.
fn assistant_blocks(message: &Map<String, Value>, at: &str) -> Result<Vec<Value>, Refusal> {
    if field(message, "function_call").is_some() {
        return Err(Refusal::new(
            "the legacy `function_call` is not supported; use `tool_calls`",
            Some(&format!("{at}.function_call")),
        ));
    }
    let mut blocks = Vec::new();
    let mut push_text = |text: &str| {
        if !text.is_empty() {
            blocks.push(text_block(text));
        }
    };
    let param = format!("{at}.content");
    match field(message, "content") {
        None => {}
        Some(Value::String(text)) => push_text(text),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                let at_part = format!("{param}[{j}]");
                let text = match part.get("type").and_then(Value::as_str) {
                    Some("text") => part_text(part, &at_part)?,
                    Some("refusal") => part
                        .get("refusal")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| wrong(&format!("{at_part}.refusal"), "a string"))?,
                    _ => {
                        return Err(Refusal::new(
                            "an assistant message's parts must be `text` or `refusal`",
                            Some(&format!("{at_part}.type")),
                        ))
                    }
                };
                push_text(&text);
            }
        }
        Some(_) => return Err(wrong(&param, "a string, a list of content parts or null")),
    }
    match field(message, "tool_calls") {
        None => {}
        Some(Value::Array(calls)) => {
            for (k, call) in calls.iter().enumerate() {
                blocks.push(tool_use_block(call, &format!("{at}.tool_calls[{k}]"))?);
            }
        }
        Some(_) => return Err(wrong(&format!("{at}.tool_calls"), "a list")),
    }
    Ok(blocks)
}

/// One tool call as a `tool_use` block, its arguments parsed.
fn tool_use_block(call: &Value, at: &str) -> Result<Value, Refusal> {
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| wrong(&format!("{at}.id"), "a string"))?;
    if call
        .get("type")
        .is_some_and(|kind| !kind.is_null() && kind != "function")
    {
        return Err(Refusal::new(
            "only `function` tool calls are supported",
            Some(&format!("{at}.type")),
        ));
    }
    let function = call.get("function");
    let name = function
        .and_then(|function| function.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| wrong(&format!("{at}.function.name"), "a string"))?;
    let arguments = function.and_then(|function| function.get("arguments"));
    let input = call_input(arguments, &format!("{at}.function.arguments"))?;
    Ok(json!({ "type": "tool_use", "id": id, "name": name, "input": input }))
}

/// A tool call's arguments (a JSON string, or an object given as such) as an object; empty
/// arguments are `{}`.
fn call_input(arguments: Option<&Value>, param: &str) -> Result<Value, Refusal> {
    let input = match arguments {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(text)) if text.trim().is_empty() => Value::Object(Map::new()),
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
            Refusal::new(
                format!("tool call arguments are not valid JSON: {e}"),
                Some(param),
            )
        })?,
        Some(other) => other.clone(),
    };
    if input.is_object() {
        Ok(input)
    } else {
        Err(Refusal::new(
            "tool call arguments must be a JSON object",
            Some(param),
        ))
    }
}

/// A `tool` message as a `tool_result` block.
fn tool_result(message: &Map<String, Value>, at: &str) -> Result<Value, Refusal> {
    let id = field(message, "tool_call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| wrong(&format!("{at}.tool_call_id"), "a string"))?;
    let content = joined_text(field(message, "content"), &format!("{at}.content"))?;
    Ok(json!({ "type": "tool_result", "tool_use_id": id, "content": content }))
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; the last two only with tools.
fn translate_tools(
    chat: &Map<String, Value>,
    anthropic: &mut Map<String, Value>,
) -> Result<(), Refusal> {
    let mut choice = tool_choice(field(chat, "tool_choice"))?;
    let parallel = optional_bool(chat, "parallel_tool_calls")?;
    let tools = match field(chat, "tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, tool)| translate_tool(tool, &format!("tools[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(wrong("tools", "a list of tools")),
    };
    if tools.is_empty() {
        return Ok(());
    }
    anthropic.insert("tools".into(), Value::Array(tools));
    if parallel == Some(false) {
        let choice = choice.get_or_insert_with(|| typed("auto"));
        if choice.get("type") != Some(&json!("none")) {
            choice.insert("disable_parallel_tool_use".into(), true.into());
        }
    }
    if let Some(choice) = choice {
        anthropic.insert("tool_choice".into(), Value::Object(choice));
    }
    Ok(())
}

/// An object with only a `type`.
fn typed(kind: &str) -> Map<String, Value> {
    let mut object = Map::new();
    object.insert("type".into(), kind.into());
    object
}

/// One function tool as an Anthropic tool. A schema without a `type` gets `"object"`, as
/// Anthropic requires it.
fn translate_tool(tool: &Value, at: &str) -> Result<Value, Refusal> {
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(Refusal::new(
            "only `function` tools are supported",
            Some(&format!("{at}.type")),
        ));
    }
    let function = tool
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| wrong(&format!("{at}.function"), "an object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| wrong(&format!("{at}.function.name"), "a string"))?;
    let mut anthropic = Map::new();
    anthropic.insert("name".into(), name.into());
    if let Some(description) = field(function, "description") {
        let description = description
            .as_str()
            .ok_or_else(|| wrong(&format!("{at}.function.description"), "a string"))?;
        anthropic.insert("description".into(), description.into());
    }
    let mut schema = match field(function, "parameters") {
        None => json!({ "type": "object", "properties": {} }),
        Some(Value::Object(schema)) => Value::Object(schema.clone()),
        Some(_) => {
            return Err(wrong(
                &format!("{at}.function.parameters"),
                "a JSON Schema object",
            ))
        }
    };
    if let Value::Object(schema) = &mut schema {
        schema.entry("type").or_insert_with(|| "object".into());
    }
    anthropic.insert("input_schema".into(), schema);
    Ok(Value::Object(anthropic))
}

/// `tool_choice` as Anthropic's.
fn tool_choice(choice: Option<&Value>) -> Result<Option<Map<String, Value>>, Refusal> {
    let refused = || {
        Refusal::new(
            "`tool_choice` must be \"auto\", \"required\", \"none\" or a function",
            Some("tool_choice"),
        )
    };
    match choice {
        None => Ok(None),
        Some(Value::String(kind)) => match kind.as_str() {
            "auto" => Ok(Some(typed("auto"))),
            "required" => Ok(Some(typed("any"))),
            "none" => Ok(Some(typed("none"))),
            _ => Err(refused()),
        },
        Some(Value::Object(choice)) => {
            if choice.get("type").and_then(Value::as_str) != Some("function") {
                return Err(refused());
            }
            let name = choice
                .get("function")
                .and_then(|function| function.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| wrong("tool_choice.function.name", "a string"))?;
            let mut anthropic = typed("tool");
            anthropic.insert("name".into(), name.into());
            Ok(Some(anthropic))
        }
        Some(_) => Err(refused()),
    }
}

/// Appends `value`'s JSON to `out`.
fn write_json(out: &mut Vec<u8>, value: &Value) {
    // A `Value` always serializes, and writing into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Appends `value` as one `data:` event.
fn write_event(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(b"data: ");
    write_json(out, value);
    out.extend_from_slice(b"\n\n");
}

/// OpenAI's `finish_reason` for Anthropic's `stop_reason`.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

/// OpenAI's error `type` for an answer's status, when the body names none.
fn status_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// An error answer, whatever its body, in OpenAI's error shape.
fn error_body(status: u16, body: &[u8]) -> Value {
    let parsed = serde_json::from_slice::<Value>(body).ok();
    let error = parsed.as_ref().and_then(|body| body.get("error"));
    let message = error
        .and_then(|error| error.get("message").or(Some(error)))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            match text.trim() {
                "" => format!("the upstream API answered with status {status}"),
                text => text.to_string(),
            }
        });
    let kind = error
        .and_then(|error| error.get("type"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| status_error_type(status));
    json!({ "error": { "message": message, "type": kind, "param": null, "code": null } })
}

/// Anthropic's token counts.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    input: u64,
    cache_read: Option<u64>,
    cache_creation: u64,
    output: u64,
}

impl Usage {
    /// Takes the counts present in an Anthropic `usage` object.
    fn read(&mut self, usage: Option<&Value>) {
        let Some(usage) = usage else { return };
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        if let Some(n) = count("input_tokens") {
            self.input = n;
        }
        if let Some(n) = count("cache_read_input_tokens") {
            self.cache_read = Some(n);
        }
        if let Some(n) = count("cache_creation_input_tokens") {
            self.cache_creation = n;
        }
        if let Some(n) = count("output_tokens") {
            self.output = n;
        }
    }

    /// OpenAI's `usage` object.
    fn openai(&self) -> Value {
        let prompt = self
            .input
            .saturating_add(self.cache_read.unwrap_or(0))
            .saturating_add(self.cache_creation);
        let mut usage = Map::new();
        usage.insert("prompt_tokens".into(), prompt.into());
        usage.insert("completion_tokens".into(), self.output.into());
        usage.insert(
            "total_tokens".into(),
            prompt.saturating_add(self.output).into(),
        );
        if let Some(cached) = self.cache_read {
            usage.insert(
                "prompt_tokens_details".into(),
                json!({ "cached_tokens": cached }),
            );
        }
        Value::Object(usage)
    }
}

/// The chat completion's id.
fn chat_id(asked: &Asked) -> String {
    format!("chatcmpl-{}", asked.id_seed)
}

/// A whole Anthropic message as a chat completion; `None` when it is not one.
fn completion(asked: &Asked, body: &[u8]) -> Option<Value> {
    let message = serde_json::from_slice::<Value>(body).ok()?;
    if message.get("type").is_some_and(|kind| kind != "message") {
        return None;
    }
    let mut text: Option<String> = None;
    let mut thinking: Option<String> = None;
    let mut tool_calls = Vec::new();
    for block in message.get("content")?.as_array()? {
        let string = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text
                .get_or_insert_with(String::new)
                .push_str(string("text")),
            Some("thinking") => thinking
                .get_or_insert_with(String::new)
                .push_str(string("thinking")),
            Some("tool_use") => {
                let arguments = block
                    .get("input")
                    .map_or_else(|| "{}".to_string(), Value::to_string);
                tool_calls.push(json!({
                    "id": string("id"),
                    "type": "function",
                    "function": { "name": string("name"), "arguments": arguments },
                }));
            }
            _ => {}
        }
    }
    let mut reply = Map::new();
    reply.insert("role".into(), "assistant".into());
    reply.insert("content".into(), text.map_or(Value::Null, Value::String));
    if !tool_calls.is_empty() {
        reply.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    if let Some(thinking) = thinking {
        reply.insert("reasoning_content".into(), thinking.into());
    }
    let mut usage = Usage::default();
    usage.read(message.get("usage"));
    let stop_reason = message.get("stop_reason").and_then(Value::as_str);
    Some(json!({
        "id": chat_id(asked),
        "object": "chat.completion",
        "created": asked.created,
        "model": asked.model,
        "choices": [{
            "index": 0,
            "message": reply,
            "finish_reason": finish_reason(stop_reason),
            "logprobs": null,
        }],
        "usage": usage.openai(),
    }))
}

/// A `chat.completion.chunk` with one choice.
fn chunk(asked: &Asked, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": chat_id(asked),
        "object": "chat.completion.chunk",
        "created": asked.created,
        "model": asked.model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    })
}

/// What a stream's translation remembers between events.
#[derive(Debug, Default)]
struct Stream {
    /// The role chunk was written.
    started: bool,
    /// `message_stop` or an error was translated: nothing more is written.
    ended: bool,
    /// Tool calls started so far (the next one's `index`).
    tool_calls: u64,
    /// Each `tool_use` block's Anthropic `index` and its tool call `index`.
    tool_blocks: Vec<(u64, u64)>,
    usage: Usage,
    finish_reason: Option<&'static str>,
}

impl Stream {
    /// Translates one Anthropic event.
    fn event(&mut self, asked: &Asked, name: &str, data: &str, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let parsed = serde_json::from_str::<Value>(data).ok();
        let kind = parsed
            .as_ref()
            .and_then(|event| event.get("type"))
            .and_then(Value::as_str)
            .unwrap_or(name);
        if name == "error" || kind == "error" {
            self.fail(parsed.as_ref().unwrap_or(&Value::Null), out);
            return;
        }
        let Some(event) = parsed.as_ref() else { return };
        match kind {
            "message_start" => {
                self.usage.read(event.pointer("/message/usage"));
                if !self.started {
                    self.started = true;
                    let delta = json!({ "role": "assistant", "content": "" });
                    write_event(out, &chunk(asked, delta, None));
                }
            }
            "content_block_start" => self.block_start(asked, event, out),
            "content_block_delta" => self.block_delta(asked, event, out),
            "message_delta" => {
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.finish_reason = Some(finish_reason(Some(reason)));
                }
                self.usage.read(event.get("usage"));
            }
            "message_stop" => self.stop(asked, out),
            _ => {}
        }
    }

    /// A content block's start: a tool call's head, or a block's initial text.
    fn block_start(&mut self, asked: &Asked, event: &Value, out: &mut Vec<u8>) {
        let Some(block) = event.get("content_block") else {
            return;
        };
        let string = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
        let delta = match block.get("type").and_then(Value::as_str) {
            Some("text") if !string("text").is_empty() => json!({ "content": string("text") }),
            Some("thinking") if !string("thinking").is_empty() => {
                json!({ "reasoning_content": string("thinking") })
            }
            Some("tool_use") => {
                let index = self.tool_calls;
                self.tool_calls += 1;
                if let Some(block_index) = event.get("index").and_then(Value::as_u64) {
                    self.tool_blocks.push((block_index, index));
                }
                json!({ "tool_calls": [{
                    "index": index,
                    "id": string("id"),
                    "type": "function",
                    "function": { "name": string("name"), "arguments": "" },
                }] })
            }
            _ => return,
        };
        write_event(out, &chunk(asked, delta, None));
    }

    /// A content block's delta: text, reasoning or a piece of a tool call's arguments.
    fn block_delta(&mut self, asked: &Asked, event: &Value, out: &mut Vec<u8>) {
        let Some(delta) = event.get("delta") else {
            return;
        };
        let piece = |key: &str| {
            delta
                .get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let client_delta = match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => piece("text").map(|text| json!({ "content": text })),
            Some("thinking_delta") => {
                piece("thinking").map(|text| json!({ "reasoning_content": text }))
            }
            Some("input_json_delta") => {
                let block_index = event.get("index").and_then(Value::as_u64);
                let index = self
                    .tool_blocks
                    .iter()
                    .find(|(block, _)| Some(*block) == block_index)
                    .map(|(_, index)| *index);
                index.zip(piece("partial_json")).map(|(index, json)| {
                    json!({ "tool_calls": [{ "index": index, "function": { "arguments": json } }] })
                })
            }
            _ => None,
        };
        if let Some(client_delta) = client_delta {
            write_event(out, &chunk(asked, client_delta, None));
        }
    }

    /// `message_stop`: the finish chunk, the usage chunk when asked for, `[DONE]`.
    fn stop(&mut self, asked: &Asked, out: &mut Vec<u8>) {
        let reason = self.finish_reason.unwrap_or("stop");
        write_event(out, &chunk(asked, json!({}), Some(reason)));
        if asked.include_usage {
            let usage = json!({
                "id": chat_id(asked),
                "object": "chat.completion.chunk",
                "created": asked.created,
                "model": asked.model,
                "choices": [],
                "usage": self.usage.openai(),
            });
            write_event(out, &usage);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.ended = true;
    }

    /// An `error` event: OpenAI's error event, and nothing after it.
    fn fail(&mut self, event: &Value, out: &mut Vec<u8>) {
        let error = event.get("error");
        let string = |key: &str| {
            error
                .and_then(|error| error.get(key))
                .and_then(Value::as_str)
        };
        let message = string("message").unwrap_or("the upstream stream failed");
        let kind = string("type").unwrap_or("api_error");
        let body =
            json!({ "error": { "message": message, "type": kind, "param": null, "code": null } });
        write_event(out, &body);
        self.ended = true;
    }
}

/// The translation of one Anthropic answer into Chat Completions.
#[derive(Debug)]
pub struct Reply {
    asked: Asked,
    splitter: SseSplitter,
    stream: Stream,
}

impl Reply {
    /// The translation of the answer to a request that returned `asked` (with its `created`
    /// and `id_seed` filled in).
    pub fn new(asked: Asked) -> Reply {
        Reply {
            asked,
            splitter: SseSplitter::default(),
            stream: Stream::default(),
        }
    }

    /// Translates a whole answer: a 2xx Anthropic message into a `chat.completion`, any
    /// other status's body (Anthropic error, text or nothing) into an OpenAI error body.
    /// `Err` only for a 2xx body that is not an Anthropic message.
    // The signature is the one every translation shares (`super::Reply::whole`).
    pub fn whole(&mut self, status: u16, body: &[u8], out: &mut Vec<u8>) -> Result<(), NotTheApi> {
        if !(200..300).contains(&status) {
            write_json(out, &error_body(status, body));
            return Ok(());
        }
        let completion = completion(&self.asked, body).ok_or(NotTheApi)?;
        write_json(out, &completion);
        Ok(())
    }

    /// Translates the next bytes of an Anthropic event stream into `data:` chunks appended
    /// to `out`; only complete client events are written.
    /// The engine's stream held an event too large to be one (`SseSplitter::overflowed`).
    pub fn overflowed(&self) -> bool {
        self.splitter.overflowed()
    }

    pub fn events(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let Reply {
            asked,
            splitter,
            stream,
        } = self;
        if stream.ended {
            return;
        }
        splitter.feed(data, |event| {
            stream.event(asked, event.name, event.data, out)
        });
    }

    /// The stream ended cleanly: `true` when `message_stop` or an error was translated
    /// (nothing more is written), `false` when the stream was cut before its end.
    pub fn finish(&mut self, _out: &mut Vec<u8>) -> bool {
        self.stream.ended
    }

    /// Always `None`: Chat Completions events carry no sequence numbers.
    pub fn sequence(&self) -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Anthropic body a Chat body becomes, and its `Asked`.
    fn translate(body: Value, model: Option<&str>) -> (Value, Asked) {
        let mut out = Vec::new();
        let asked = request(body.to_string().as_bytes(), model, &mut out).expect("translates");
        (
            serde_json::from_slice(&out).expect("the request is JSON"),
            asked,
        )
    }

    /// The Anthropic messages of a Chat body of `messages`.
    fn messages_of(messages: Value) -> Value {
        translate(json!({ "model": "m", "messages": messages }), None).0["messages"].clone()
    }

    /// The refusal of a Chat body.
    fn refused(body: Value) -> Refusal {
        let mut out = Vec::new();
        request(body.to_string().as_bytes(), None, &mut out).expect_err("refused")
    }

    fn asked(include_usage: bool) -> Asked {
        Asked {
            model: "gpt-4o".into(),
            stream: true,
            include_usage,
            created: 1_700_000_000,
            id_seed: "5eed".into(),
            ..Asked::default()
        }
    }

    #[test]
    fn fields_map_and_the_rest_are_dropped() {
        let (body, asked) = translate(
            json!({
                "model": "gpt-4o", "max_completion_tokens": 300, "max_tokens": 100,
                "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop": "END",
                "stream": true, "stream_options": { "include_usage": true }, "user": "u-1",
                "frequency_penalty": 1, "presence_penalty": 1, "seed": 7,
                "reasoning_effort": "high", "logit_bias": {}, "store": true, "n": 1,
                "response_format": { "type": "text" }, "logprobs": false,
                "messages": [{ "role": "user", "content": "Hi" }],
            }),
            Some("claude-sonnet-4-5"),
        );
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5", "max_tokens": 300, "temperature": 0.5,
                "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"], "stream": true,
                "metadata": { "user_id": "u-1" },
                "messages": [{ "role": "user", "content": "Hi" }],
            })
        );
        assert_eq!(
            asked,
            Asked {
                model: "gpt-4o".into(),
                stream: true,
                include_usage: true,
                ..Asked::default()
            }
        );
    }

    #[test]
    fn default_max_tokens_stop_list_and_unmapped_model() {
        let (body, asked) = translate(
            json!({
                "model": "claude-haiku", "max_tokens": 50, "stop": ["a", "b"],
                "messages": [{ "role": "user", "content": "Hi" }],
            }),
            None,
        );
        assert_eq!(body["model"], "claude-haiku");
        assert_eq!(body["max_tokens"], 50);
        assert_eq!(body["stop_sequences"], json!(["a", "b"]));
        assert_eq!(asked.model, "claude-haiku");
        assert!(!asked.stream && !asked.include_usage);
        let (body, _) = translate(
            json!({ "model": "m", "stop": null, "max_tokens": null, "messages": [] }),
            None,
        );
        assert_eq!(
            body,
            json!({ "model": "m", "max_tokens": 4096, "messages": [] })
        );
    }

    #[test]
    fn system_and_developer_messages_anywhere_become_system() {
        let (body, _) = translate(
            json!({ "model": "m", "messages": [
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": "Hi" },
                { "role": "developer", "content": [
                    { "type": "text", "text": "Answer " }, { "type": "text", "text": "in French." },
                ] },
                { "role": "assistant", "content": "Bonjour" },
                { "role": "system", "content": "" },
                { "role": "user", "content": "Ça va ?" },
                { "role": "system", "content": "Last." },
            ] }),
            None,
        );
        assert_eq!(body["system"], "Be brief.\n\nAnswer in French.\n\nLast.");
        assert_eq!(
            body["messages"],
            json!([
                { "role": "user", "content": "Hi" },
                { "role": "assistant", "content": [{ "type": "text", "text": "Bonjour" }] },
                { "role": "user", "content": "Ça va ?" },
            ])
        );
    }

    #[test]
    fn images_from_data_and_http_urls() {
        let messages = messages_of(json!([{ "role": "user", "content": [
            { "type": "text", "text": "What are these?" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0K" } },
            { "type": "image_url",
              "image_url": { "url": "https://x.test/a.jpg", "detail": "low" } },
        ] }]));
        assert_eq!(
            messages,
            json!([{ "role": "user", "content": [
                { "type": "text", "text": "What are these?" },
                { "type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "iVBORw0K" } },
                { "type": "image", "source": { "type": "url", "url": "https://x.test/a.jpg" } },
            ] }])
        );
    }

    #[test]
    fn tool_calls_and_tool_messages_become_tool_use_and_one_tool_result_message() {
        let messages = messages_of(json!([
            { "role": "user", "content": "Weather in Paris and Rome?" },
            { "role": "assistant", "content": "Checking.", "tool_calls": [
                { "id": "call_1", "type": "function",
                  "function": { "name": "weather", "arguments": "{\"city\":\"Paris\"}" } },
                { "id": "call_2", "type": "function",
                  "function": { "name": "weather", "arguments": "" } },
            ] },
            { "role": "tool", "tool_call_id": "call_1", "content": "18C" },
            { "role": "tool", "tool_call_id": "call_2",
              "content": [{ "type": "text", "text": "2" }, { "type": "text", "text": "1C" }] },
            { "role": "user", "content": "Thanks" },
        ]));
        assert_eq!(
            messages,
            json!([
                { "role": "user", "content": "Weather in Paris and Rome?" },
                { "role": "assistant", "content": [
                    { "type": "text", "text": "Checking." },
                    { "type": "tool_use", "id": "call_1", "name": "weather",
                      "input": { "city": "Paris" } },
                    { "type": "tool_use", "id": "call_2", "name": "weather", "input": {} },
                ] },
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "call_1", "content": "18C" },
                    { "type": "tool_result", "tool_use_id": "call_2", "content": "21C" },
                    { "type": "text", "text": "Thanks" },
                ] },
            ])
        );
    }

    #[test]
    fn same_role_messages_merge_and_empty_assistant_messages_go() {
        let messages = messages_of(json!([
            { "role": "user", "content": "One" },
            { "role": "user", "content": [{ "type": "text", "text": "Two" }] },
            { "role": "assistant", "content": null },
            { "role": "user", "content": "Three" },
            { "role": "assistant", "content": [{ "type": "text", "text": "A" }] },
            { "role": "assistant", "content": [{ "type": "refusal", "refusal": "B" }] },
        ]));
        assert_eq!(
            messages,
            json!([
                { "role": "user", "content": [
                    { "type": "text", "text": "One" },
                    { "type": "text", "text": "Two" },
                    { "type": "text", "text": "Three" },
                ] },
                { "role": "assistant", "content": [
                    { "type": "text", "text": "A" }, { "type": "text", "text": "B" },
                ] },
            ])
        );
        // A user message before a tool message: the tool result still comes first.
        let messages = messages_of(json!([
            { "role": "assistant", "tool_calls": [{ "id": "c", "type": "function",
              "function": { "name": "f", "arguments": "{}" } }] },
            { "role": "user", "content": "By the way" },
            { "role": "tool", "tool_call_id": "c", "content": "ok" },
        ]));
        assert_eq!(
            messages[1]["content"],
            json!([
                { "type": "tool_result", "tool_use_id": "c", "content": "ok" },
                { "type": "text", "text": "By the way" },
            ])
        );
    }

    fn with_tools(extra: Value) -> Value {
        let mut body = json!({ "model": "m", "messages": [{ "role": "user", "content": "Hi" }],
            "tools": [
                { "type": "function", "function": { "name": "weather", "description": "Weather",
                  "parameters": { "type": "object",
                                  "properties": { "city": { "type": "string" } } },
                  "strict": true } },
                { "type": "function", "function": { "name": "now" } },
            ] });
        if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
            body.extend(extra);
        }
        translate(body, None).0
    }

    #[test]
    fn tools_and_every_tool_choice() {
        let body = with_tools(json!({}));
        assert_eq!(
            body["tools"],
            json!([
                { "name": "weather", "description": "Weather", "input_schema":
                  { "type": "object", "properties": { "city": { "type": "string" } } } },
                { "name": "now", "input_schema": { "type": "object", "properties": {} } },
            ])
        );
        assert_eq!(body.get("tool_choice"), None);
        let cases = [
            (json!("auto"), json!({ "type": "auto" })),
            (json!("required"), json!({ "type": "any" })),
            (json!("none"), json!({ "type": "none" })),
            (
                json!({ "type": "function", "function": { "name": "now" } }),
                json!({ "type": "tool", "name": "now" }),
            ),
        ];
        for (choice, expected) in cases {
            let body = with_tools(json!({ "tool_choice": choice }));
            assert_eq!(body["tool_choice"], expected, "{choice}");
        }
    }

    #[test]
    fn parallel_tool_calls_false_disables_parallel_tool_use() {
        let cases = [
            (
                json!({}),
                json!({ "type": "auto", "disable_parallel_tool_use": true }),
            ),
            (
                json!({ "tool_choice": "required" }),
                json!({ "type": "any", "disable_parallel_tool_use": true }),
            ),
            (
                json!({ "tool_choice": { "type": "function", "function": { "name": "now" } } }),
                json!({ "type": "tool", "name": "now", "disable_parallel_tool_use": true }),
            ),
            (json!({ "tool_choice": "none" }), json!({ "type": "none" })),
        ];
        for (extra, expected) in cases {
            let mut extra = extra;
            extra["parallel_tool_calls"] = json!(false);
            assert_eq!(
                with_tools(extra.clone())["tool_choice"],
                expected,
                "{extra}"
            );
        }
        assert_eq!(
            with_tools(json!({ "parallel_tool_calls": true })).get("tool_choice"),
            None
        );
        let (body, _) = translate(
            json!({ "model": "m", "messages": [], "tool_choice": "auto",
                    "parallel_tool_calls": false }),
            None,
        );
        assert_eq!(
            body,
            json!({ "model": "m", "max_tokens": 4096, "messages": [] })
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let user = |content: Value| {
            json!({ "model": "m", "messages": [
            { "role": "system", "content": "S" }, { "role": "user", "content": content }] })
        };
        let cases = [
            (json!({ "model": "m", "messages": [], "n": 2 }), "n"),
            (
                json!({ "model": "m", "messages": [],
                        "response_format": { "type": "json_object" } }),
                "response_format",
            ),
            (
                json!({ "model": "m", "messages": [], "logprobs": true }),
                "logprobs",
            ),
            (
                json!({ "model": "m", "messages": [], "top_logprobs": 3 }),
                "top_logprobs",
            ),
            (
                json!({ "model": "m", "messages": [], "functions": [] }),
                "functions",
            ),
            (json!({ "model": "m" }), "messages"),
            (json!({ "model": "m", "messages": {} }), "messages"),
            (json!({ "messages": [] }), "model"),
            (
                json!({ "model": "m", "messages": [{ "content": "x" }] }),
                "messages[0].role",
            ),
            (
                json!({ "model": "m",
                        "messages": [{ "role": "function", "name": "f", "content": "x" }] }),
                "messages[0].role",
            ),
            (
                user(json!([{ "type": "input_audio", "input_audio": {} }])),
                "messages[1].content[0].type",
            ),
            (
                user(json!([{ "type": "text", "text": "a" }, { "type": "file", "file": {} }])),
                "messages[1].content[1].type",
            ),
            (
                user(json!([{ "type": "image_url", "image_url": { "url": "ftp://x/a.png" } }])),
                "messages[1].content[0].image_url.url",
            ),
            (
                user(
                    json!([{ "type": "image_url", "image_url": { "url": "data:image/png,abc" } }]),
                ),
                "messages[1].content[0].image_url.url",
            ),
            (
                json!({ "model": "m", "messages": [{ "role": "assistant", "tool_calls": [
                    { "id": "c", "type": "function",
                      "function": { "name": "f", "arguments": "{oops" } }] }] }),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({ "model": "m", "messages": [{ "role": "assistant", "tool_calls": [
                    { "id": "c", "type": "function",
                      "function": { "name": "f", "arguments": "[1]" } }] }] }),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({ "model": "m", "messages": [{ "role": "tool", "content": "x" }] }),
                "messages[0].tool_call_id",
            ),
            (
                json!({ "model": "m", "messages": [], "tool_choice": "sometimes" }),
                "tool_choice",
            ),
            (
                json!({ "model": "m", "messages": [], "tools": [{ "type": "web_search" }] }),
                "tools[0].type",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(
                refused(body.clone()).param.as_deref(),
                Some(param),
                "{body}"
            );
        }
        let mut out = Vec::new();
        for body in [&b"[1]"[..], b"{not json", b""] {
            assert_eq!(
                request(body, None, &mut out).map_err(|r| r.param),
                Err(None)
            );
        }
        assert!(out.is_empty());
    }

    /// The chat completion a whole 200 Anthropic message becomes.
    fn whole_of(message: Value) -> Value {
        let mut reply = Reply::new(asked(false));
        let mut out = Vec::new();
        reply
            .whole(200, message.to_string().as_bytes(), &mut out)
            .expect("a message");
        serde_json::from_slice(&out).expect("the completion is JSON")
    }

    #[test]
    fn whole_text_message_with_cache_tokens() {
        let completion = whole_of(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{ "type": "text", "text": "Hello" }, { "type": "text", "text": ", you." }],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": { "input_tokens": 10, "cache_read_input_tokens": 100,
                       "cache_creation_input_tokens": 5, "output_tokens": 7 },
        }));
        assert_eq!(
            completion,
            json!({
                "id": "chatcmpl-5eed", "object": "chat.completion", "created": 1_700_000_000,
                "model": "gpt-4o",
                "choices": [{ "index": 0,
                              "message": { "role": "assistant", "content": "Hello, you." },
                              "finish_reason": "stop", "logprobs": null }],
                "usage": { "prompt_tokens": 115, "completion_tokens": 7, "total_tokens": 122,
                           "prompt_tokens_details": { "cached_tokens": 100 } },
            })
        );
    }

    #[test]
    fn whole_tool_use_and_thinking() {
        let completion = whole_of(json!({
            "type": "message", "role": "assistant",
            "content": [
                { "type": "thinking", "thinking": "Need weather.", "signature": "sig" },
                { "type": "redacted_thinking", "data": "xx" },
                { "type": "tool_use", "id": "toolu_1", "name": "weather",
                  "input": { "city": "Paris" } },
            ],
            "stop_reason": "tool_use", "usage": { "input_tokens": 3, "output_tokens": 4 },
        }));
        assert_eq!(
            completion["choices"][0],
            json!({ "index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
                "role": "assistant", "content": null, "reasoning_content": "Need weather.",
                "tool_calls": [{ "id": "toolu_1", "type": "function",
                    "function": { "name": "weather", "arguments": "{\"city\":\"Paris\"}" } }],
            } })
        );
        assert_eq!(
            completion["usage"],
            json!({ "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7 })
        );
    }

    #[test]
    fn whole_stop_reasons() {
        let cases = [
            (json!("end_turn"), "stop"),
            (json!("stop_sequence"), "stop"),
            (json!("max_tokens"), "length"),
            (json!("tool_use"), "tool_calls"),
            (json!("refusal"), "content_filter"),
            (json!("pause_turn"), "stop"),
            (json!("something_new"), "stop"),
            (Value::Null, "stop"),
        ];
        for (stop_reason, expected) in cases {
            let completion = whole_of(json!({ "type": "message", "content": [],
                                             "stop_reason": stop_reason }));
            assert_eq!(
                completion["choices"][0]["finish_reason"], expected,
                "{stop_reason}"
            );
        }
    }

    #[test]
    fn whole_success_that_is_not_a_message_is_err() {
        let mut reply = Reply::new(asked(false));
        let mut out = Vec::new();
        for body in [
            &b"not json"[..],
            b"",
            b"{\"type\":\"error\",\"content\":[]}",
            b"{\"id\":\"x\"}",
        ] {
            assert_eq!(reply.whole(200, body, &mut out), Err(NotTheApi));
        }
        assert!(out.is_empty());
    }

    #[test]
    fn whole_errors_in_openai_shape() {
        let error = |status: u16, body: &[u8]| {
            let mut out = Vec::new();
            Reply::new(asked(false))
                .whole(status, body, &mut out)
                .expect("always Ok");
            serde_json::from_slice::<Value>(&out).expect("the error is JSON")
        };
        let shape = |message: &str, kind: &str| {
            let error = json!({ "message": message, "type": kind, "param": null, "code": null });
            json!({ "error": error })
        };
        let anthropic =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(
            error(529, anthropic),
            shape("Overloaded", "overloaded_error")
        );
        assert_eq!(
            error(502, b" Bad Gateway\n"),
            shape("Bad Gateway", "api_error")
        );
        let empty = "the upstream API answered with status 429";
        assert_eq!(error(429, b""), shape(empty, "rate_limit_error"));
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "invalid_request_error"),
            (500, "api_error"),
            (503, "api_error"),
        ];
        for (status, kind) in cases {
            assert_eq!(error(status, b"nope")["error"]["type"], kind, "{status}");
        }
    }

    /// The Anthropic event stream of `events` (`event:` name, data).
    fn anthropic_stream(events: &[Value]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for event in events {
            let name = event["type"].as_str().expect("typed");
            bytes.extend_from_slice(format!("event: {name}\ndata: {event}\n\n").as_bytes());
        }
        bytes
    }

    /// The client events in `out`: each chunk's JSON, `"[DONE]"` as a string.
    fn client_events(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).expect("UTF-8");
        assert!(
            text.is_empty() || text.ends_with("\n\n"),
            "only complete events: {text:?}"
        );
        text.split_terminator("\n\n")
            .map(|event| {
                let data = event.strip_prefix("data: ").expect("a data event");
                match data {
                    "[DONE]" => json!("[DONE]"),
                    data => serde_json::from_str(data).expect("each chunk is JSON"),
                }
            })
            .collect()
    }

    /// What the stream becomes, fed in `pieces`, and whether `finish` saw its end.
    fn run(asked: Asked, pieces: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut reply = Reply::new(asked);
        let mut out = Vec::new();
        for piece in pieces {
            reply.events(piece, &mut out);
        }
        let before = out.len();
        let ended = reply.finish(&mut out);
        assert_eq!(out.len(), before, "finish writes nothing");
        assert_eq!(reply.sequence(), None);
        (out, ended)
    }

    fn text_stream() -> Vec<u8> {
        let mut bytes = anthropic_stream(&[json!({ "type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": 25, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 10, "output_tokens": 1 } } })]);
        bytes.extend_from_slice(b"event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n");
        bytes.extend(anthropic_stream(&[
            json!({ "type": "content_block_start", "index": 0,
                    "content_block": { "type": "text", "text": "" } }),
            json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "text_delta", "text": "Hello" } }),
            json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "text_delta", "text": ", wörld ✓" } }),
            json!({ "type": "content_block_stop", "index": 0 }),
            json!({ "type": "message_delta", "delta": { "stop_reason": "end_turn",
                    "stop_sequence": null }, "usage": { "output_tokens": 15 } }),
            json!({ "type": "message_stop" }),
        ]));
        bytes
    }

    fn chunk_of(delta: Value, finish_reason: Value) -> Value {
        json!({ "id": "chatcmpl-5eed", "object": "chat.completion.chunk", "created": 1_700_000_000,
                "model": "gpt-4o", "choices": [{ "index": 0, "delta": delta, "logprobs": null,
                "finish_reason": finish_reason }] })
    }

    #[test]
    fn text_stream_split_anywhere_gives_the_same_chunks() {
        let stream = text_stream();
        let (whole, ended) = run(asked(true), &[&stream]);
        assert!(ended);
        assert_eq!(
            client_events(&whole),
            [
                chunk_of(json!({ "role": "assistant", "content": "" }), Value::Null),
                chunk_of(json!({ "content": "Hello" }), Value::Null),
                chunk_of(json!({ "content": ", wörld ✓" }), Value::Null),
                chunk_of(json!({}), json!("stop")),
                json!({ "id": "chatcmpl-5eed", "object": "chat.completion.chunk",
                        "created": 1_700_000_000, "model": "gpt-4o", "choices": [],
                        "usage": { "prompt_tokens": 35, "completion_tokens": 15,
                                   "total_tokens": 50,
                                   "prompt_tokens_details": { "cached_tokens": 10 } } }),
                json!("[DONE]"),
            ]
        );
        for cut in 0..=stream.len() {
            let (out, ended) = run(asked(true), &[&stream[..cut], &stream[cut..]]);
            assert!(ended);
            assert_eq!(out, whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(run(asked(true), &bytes).0, whole);
    }

    #[test]
    fn without_include_usage_no_usage_chunk() {
        let (out, ended) = run(asked(false), &[&text_stream()]);
        assert!(ended);
        let events = client_events(&out);
        assert_eq!(events.len(), 5);
        assert_eq!(events[3], chunk_of(json!({}), json!("stop")));
        assert_eq!(events[4], json!("[DONE]"));
    }

    #[test]
    fn tool_use_stream() {
        let stream = anthropic_stream(&[
            json!({ "type": "message_start", "message": { "type": "message", "content": [],
                    "usage": { "input_tokens": 40, "output_tokens": 1 } } }),
            json!({ "type": "content_block_start", "index": 0,
                    "content_block": { "type": "thinking", "thinking": "" } }),
            json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "thinking_delta", "thinking": "Look it up." } }),
            json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "signature_delta", "signature": "sig" } }),
            json!({ "type": "content_block_stop", "index": 0 }),
            json!({ "type": "content_block_start", "index": 1, "content_block":
                    { "type": "tool_use", "id": "toolu_1", "name": "weather", "input": {} } }),
            json!({ "type": "content_block_delta", "index": 1,
                    "delta": { "type": "input_json_delta", "partial_json": "" } }),
            json!({ "type": "content_block_delta", "index": 1,
                    "delta": { "type": "input_json_delta", "partial_json": "{\"city\": " } }),
            json!({ "type": "content_block_delta", "index": 1,
                    "delta": { "type": "input_json_delta", "partial_json": "\"Paris\"}" } }),
            json!({ "type": "content_block_stop", "index": 1 }),
            json!({ "type": "content_block_start", "index": 2, "content_block":
                    { "type": "tool_use", "id": "toolu_2", "name": "now", "input": {} } }),
            json!({ "type": "content_block_delta", "index": 2,
                    "delta": { "type": "input_json_delta", "partial_json": "{}" } }),
            json!({ "type": "content_block_stop", "index": 2 }),
            json!({ "type": "message_delta", "delta": { "stop_reason": "tool_use" },
                    "usage": { "input_tokens": 40, "output_tokens": 30 } }),
            json!({ "type": "message_stop" }),
        ]);
        let (out, ended) = run(asked(true), &[&stream]);
        assert!(ended);
        let call = |index: u64, id: &str, name: &str| {
            json!({ "tool_calls": [{ "index": index, "id": id, "type": "function",
                                     "function": { "name": name, "arguments": "" } }] })
        };
        let arguments = |index: u64, piece: &str| {
            let call = json!({ "index": index, "function": { "arguments": piece } });
            json!({ "tool_calls": [call] })
        };
        assert_eq!(
            client_events(&out),
            [
                chunk_of(json!({ "role": "assistant", "content": "" }), Value::Null),
                chunk_of(json!({ "reasoning_content": "Look it up." }), Value::Null),
                chunk_of(call(0, "toolu_1", "weather"), Value::Null),
                chunk_of(arguments(0, "{\"city\": "), Value::Null),
                chunk_of(arguments(0, "\"Paris\"}"), Value::Null),
                chunk_of(call(1, "toolu_2", "now"), Value::Null),
                chunk_of(arguments(1, "{}"), Value::Null),
                chunk_of(json!({}), json!("tool_calls")),
                json!({ "id": "chatcmpl-5eed", "object": "chat.completion.chunk",
                        "created": 1_700_000_000, "model": "gpt-4o", "choices": [],
                        "usage": { "prompt_tokens": 40, "completion_tokens": 30,
                                   "total_tokens": 70 } }),
                json!("[DONE]"),
            ]
        );
    }

    #[test]
    fn error_event_mid_stream_ends_the_translation() {
        let mut stream = text_stream();
        let cut = stream
            .windows(b"event: content_block_stop".len())
            .position(|w| w == b"event: content_block_stop")
            .expect("present");
        stream.truncate(cut);
        stream.extend_from_slice(
            concat!(
                "event: error\ndata: {\"type\":\"error\",",
                "\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
            )
            .as_bytes(),
        );
        let rest = anthropic_stream(&[json!({ "type": "message_stop" })]);
        let (out, ended) = run(asked(true), &[&stream, &rest]);
        assert!(ended);
        let events = client_events(&out);
        assert_eq!(events.len(), 4);
        assert_eq!(
            events[2],
            chunk_of(json!({ "content": ", wörld ✓" }), Value::Null)
        );
        assert_eq!(
            events[3],
            json!({ "error": { "message": "Overloaded", "type": "overloaded_error",
                               "param": null, "code": null } })
        );
    }

    #[test]
    fn finish_without_message_stop_is_a_cut_stream() {
        let stream = text_stream();
        let cut = stream
            .windows(b"event: message_stop".len())
            .position(|w| w == b"event: message_stop")
            .expect("present");
        let (out, ended) = run(asked(true), &[&stream[..cut]]);
        assert!(!ended);
        let events = client_events(&out);
        assert_eq!(events.len(), 3, "no finish chunk, no [DONE]");
        // A partial final event is not translated either.
        let (_, ended) = run(asked(true), &[&stream[..stream.len() - 1]]);
        assert!(!ended);
        assert_eq!(run(asked(false), &[]), (Vec::new(), false));
    }

    #[test]
    fn unknown_and_malformed_events_are_ignored() {
        let mut stream = b"event: future_event\ndata: {\"type\":\"future_event\"}\n\n".to_vec();
        stream.extend_from_slice(b"event: content_block_delta\ndata: {not json\n\n");
        // A delta of a tool block never started.
        let orphan = json!({ "type": "content_block_delta", "index": 9,
                             "delta": { "type": "input_json_delta", "partial_json": "x" } });
        stream.extend_from_slice(format!("data: {orphan}\n\n").as_bytes());
        let (out, ended) = run(asked(false), &[&stream]);
        assert_eq!((out, ended), (Vec::new(), false));
    }
}
