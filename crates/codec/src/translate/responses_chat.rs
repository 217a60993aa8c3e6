//! OpenAI's Responses API (`/v1/responses`) for a client whose engine speaks only Chat
//! Completions: the Responses request written as a chat request, and the chat answer
//! (whole or streamed) written as a Response object or the Responses event stream.
//!
//! Owns the mapping between the two shapes only. It keeps no response state: whatever needs
//! stored responses, conversations, files or OpenAI's hosted tools is refused, never
//! approximated. It must not do I/O, read clocks or draw randomness (ids come from
//! [`Asked::id_seed`], timestamps from [`Asked::created`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::sse::SseSplitter;
use super::{Asked, NotTheApi, Refusal};

/// The top-level fields of a JSON object, each kept as its raw text (so schemas keep their
/// key order on their way to the engine).
type Fields<'a> = BTreeMap<String, &'a RawValue>;

/// The client's fields a Response object echoes.
const ECHOED: [&str; 9] = [
    "instructions",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "text",
];

/// The longest engine error text (bytes) carried into a translated error message.
const ERROR_TEXT_LIMIT: usize = 1024;

// ---------------------------------------------------------------------------------------
// The request
// ---------------------------------------------------------------------------------------

/// The chat request written for the engine.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ChatTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<String>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Serialize)]
struct ChatFunction<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseFormat<'a> {
    JsonObject,
    JsonSchema { json_schema: JsonSchema<'a> },
}

#[derive(Serialize)]
struct JsonSchema<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    schema: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

/// Writes the Responses request `body` as a chat request into `out` (appended; nothing is
/// written when the body is refused). `model` replaces the model name sent to the engine;
/// [`Asked::model`] stays the client's.
pub fn request(body: &[u8], model: Option<&str>, out: &mut Vec<u8>) -> Result<Asked, Refusal> {
    let text = std::str::from_utf8(body)
        .map_err(|_| Refusal::new("the request body is not UTF-8 JSON", None))?;
    let fields: Fields = serde_json::from_str(text)
        .map_err(|e| Refusal::new(format!("the request body is not a JSON object: {e}"), None))?;
    refuse_stateful(&fields)?;
    let client_model: Option<String> = field(&fields, "model", "model", "a string")?;
    let asked_model = client_model
        .or_else(|| model.map(str::to_string))
        .ok_or_else(|| Refusal::new("`model` is required", Some("model")))?;
    let stream = field(&fields, "stream", "stream", "a boolean")?.unwrap_or(false);
    let instructions: Option<String> = field(&fields, "instructions", "instructions", "a string")?;
    let input: Value = field(&fields, "input", "input", "a string or a list of items")?
        .ok_or_else(|| Refusal::new("`input` is required", Some("input")))?;
    let tools = match fields.get("tools").filter(|raw| raw.get() != "null") {
        Some(raw) => chat_tools(raw)?,
        None => Vec::new(),
    };
    let tool_choice = field::<Value>(
        &fields,
        "tool_choice",
        "tool_choice",
        "a string or an object",
    )?
    .map(|choice| chat_tool_choice(&choice))
    .transpose()?;
    let reasoning: Option<Value> = field(&fields, "reasoning", "reasoning", "an object")?;
    let chat = ChatRequest {
        model: model.unwrap_or(&asked_model),
        messages: chat_messages(instructions.as_deref(), &input)?,
        tools,
        tool_choice,
        parallel_tool_calls: field(
            &fields,
            "parallel_tool_calls",
            "parallel_tool_calls",
            "a boolean",
        )?,
        max_tokens: field(
            &fields,
            "max_output_tokens",
            "max_output_tokens",
            "a positive integer",
        )?,
        temperature: field(&fields, "temperature", "temperature", "a number")?,
        top_p: field(&fields, "top_p", "top_p", "a number")?,
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        user: field(&fields, "user", "user", "a string")?,
        response_format: match fields.get("text").filter(|raw| raw.get() != "null") {
            Some(raw) => response_format(raw)?,
            None => None,
        },
        reasoning_effort: reasoning
            .as_ref()
            .and_then(|r| r.get("effort"))
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let written = serde_json::to_vec(&chat)
        .map_err(|e| Refusal::new(format!("the request cannot be written: {e}"), None))?;
    out.extend_from_slice(&written);
    Ok(Asked {
        model: asked_model,
        stream,
        echo: Some(echo(&fields)),
        ..Asked::default()
    })
}

/// The field `key` of `fields` as a `T` (`None` when absent or null); `path` names it in
/// the refusal of a value that is not `what`.
fn field<'a, T: Deserialize<'a>>(
    fields: &Fields<'a>,
    key: &str,
    path: &str,
    what: &str,
) -> Result<Option<T>, Refusal> {
    match fields.get(key) {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) => serde_json::from_str(raw.get())
            .map(Some)
            .map_err(|_| Refusal::new(format!("`{path}` must be {what}"), Some(path))),
    }
}

/// Refuses what needs state kept between requests, which this translation has none of.
fn refuse_stateful(fields: &Fields) -> Result<(), Refusal> {
    let set = |key: &str| fields.get(key).is_some_and(|raw| raw.get() != "null");
    for key in ["previous_response_id", "conversation"] {
        if set(key) {
            return Err(Refusal::new(
                format!(
                    "`{key}` is not supported: this target keeps no response state; send the \
                     whole conversation in `input`"
                ),
                Some(key),
            ));
        }
    }
    if fields
        .get("background")
        .is_some_and(|raw| raw.get() == "true")
    {
        return Err(Refusal::new(
            "`background` responses are not supported: this target keeps no response state",
            Some("background"),
        ));
    }
    if set("prompt") {
        return Err(Refusal::new(
            "`prompt` templates are not supported: this target keeps no stored prompts; send \
             the text in `instructions` and `input`",
            Some("prompt"),
        ));
    }
    Ok(())
}

/// The client's fields a Response object echoes (those present and not null).
fn echo(fields: &Fields) -> Map<String, Value> {
    ECHOED
        .iter()
        .filter_map(|key| {
            let raw = fields.get(*key).filter(|raw| raw.get() != "null")?;
            let value = serde_json::from_str(raw.get()).ok()?;
            Some((key.to_string(), value))
        })
        .collect()
}

/// A refusal naming `path`.
fn refuse(path: &str, message: impl Into<String>) -> Refusal {
    Refusal::new(message, Some(path))
}

/// The string field `key` of an input object at `at`.
fn str_field<'v>(obj: &'v Map<String, Value>, at: &str, key: &str) -> Result<&'v str, Refusal> {
    let path = format!("{at}.{key}");
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(refuse(&path, format!("`{path}` is required"))),
        Some(_) => Err(refuse(&path, format!("`{path}` must be a string"))),
    }
}

/// The chat messages of `instructions` and `input`.
fn chat_messages(instructions: Option<&str>, input: &Value) -> Result<Vec<Value>, Refusal> {
    let mut messages = Vec::new();
    if let Some(text) = instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    match input {
        Value::String(text) => messages.push(json!({"role": "user", "content": text})),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                input_item(&format!("input[{i}]"), item, &mut messages)?;
            }
        }
        _ => {
            return Err(refuse(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    }
    Ok(messages)
}

/// Appends the chat form of the input item at `at` to `messages`.
fn input_item(at: &str, item: &Value, messages: &mut Vec<Value>) -> Result<(), Refusal> {
    let obj = item
        .as_object()
        .ok_or_else(|| refuse(at, format!("`{at}` must be an object")))?;
    let kind = match obj.get("type") {
        None | Some(Value::Null) => "message",
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => {
            let path = format!("{at}.type");
            return Err(refuse(&path, format!("`{path}` must be a string")));
        }
    };
    match kind {
        "message" => messages.push(message_item(at, obj)?),
        "function_call" => function_call_item(at, obj, messages)?,
        "function_call_output" => messages.push(function_call_output_item(at, obj)?),
        // Reasoning is the engine's own; Chat Completions takes none back.
        "reasoning" => {}
        other => {
            let path = format!("{at}.type");
            return Err(refuse(
                &path,
                format!(
                    "input items of type \"{other}\" (`{path}`) are not supported: the engine \
                     has only Chat Completions, with messages and function calls"
                ),
            ));
        }
    }
    Ok(())
}

/// A message item as a chat message.
fn message_item(at: &str, obj: &Map<String, Value>) -> Result<Value, Refusal> {
    let role = match str_field(obj, at, "role")? {
        "user" => "user",
        "assistant" => "assistant",
        "system" | "developer" => "system",
        other => {
            let path = format!("{at}.role");
            return Err(refuse(
                &path,
                format!("`{path}` \"{other}\" is not a message role"),
            ));
        }
    };
    let content = match obj.get("content") {
        Some(Value::String(text)) => Value::String(text.clone()),
        Some(Value::Array(parts)) => chat_content(at, role, parts)?,
        _ => {
            let path = format!("{at}.content");
            return Err(refuse(
                &path,
                format!("`{path}` must be a string or a list of content parts"),
            ));
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// A message's content parts as chat content: one text part as a string, else the list.
fn chat_content(at: &str, role: &str, parts: &[Value]) -> Result<Value, Refusal> {
    let mut chat_parts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let part_at = format!("{at}.content[{j}]");
        let chat_part = content_part(&part_at, part)?;
        if role != "user" && chat_part["type"] != "text" {
            let path = format!("{part_at}.type");
            return Err(refuse(
                &path,
                format!("`{path}`: Chat Completions takes images and files in user messages only"),
            ));
        }
        chat_parts.push(chat_part);
    }
    if let [only] = chat_parts.as_slice() {
        if only["type"] == "text" {
            return Ok(only["text"].clone());
        }
    }
    Ok(Value::Array(chat_parts))
}

/// One content part as a chat content part.
fn content_part(at: &str, part: &Value) -> Result<Value, Refusal> {
    let obj = part
        .as_object()
        .ok_or_else(|| refuse(at, format!("`{at}` must be an object")))?;
    match str_field(obj, at, "type")? {
        "input_text" | "output_text" | "text" => {
            Ok(json!({"type": "text", "text": str_field(obj, at, "text")?}))
        }
        "refusal" => Ok(json!({"type": "text", "text": str_field(obj, at, "refusal")?})),
        "input_image" => image_part(at, obj),
        "input_file" => file_part(at, obj),
        other => {
            let path = format!("{at}.type");
            Err(refuse(
                &path,
                format!("content parts of type \"{other}\" (`{path}`) are not supported"),
            ))
        }
    }
}

/// An `input_image` part as a chat `image_url` part.
fn image_part(at: &str, obj: &Map<String, Value>) -> Result<Value, Refusal> {
    if obj.get("file_id").is_some_and(|id| !id.is_null()) {
        let path = format!("{at}.file_id");
        return Err(refuse(
            &path,
            format!(
                "`{path}`: uploaded files need OpenAI's file storage, which this target does \
                 not have; send the image as `image_url` (a URL or a data: URL)"
            ),
        ));
    }
    let mut image = json!({"url": str_field(obj, at, "image_url")?});
    if let Some(detail) = obj.get("detail").and_then(Value::as_str) {
        if matches!(detail, "low" | "high" | "auto") {
            image["detail"] = json!(detail);
        }
    }
    Ok(json!({"type": "image_url", "image_url": image}))
}

/// An `input_file` part with inline data as a chat `file` part.
fn file_part(at: &str, obj: &Map<String, Value>) -> Result<Value, Refusal> {
    for key in ["file_id", "file_url"] {
        if obj.get(key).is_some_and(|v| !v.is_null()) {
            let path = format!("{at}.{key}");
            return Err(refuse(
                &path,
                format!("`{path}` is not supported: send the file inline as `file_data`"),
            ));
        }
    }
    let mut file = json!({"file_data": str_field(obj, at, "file_data")?});
    if let Some(name) = obj.get("filename").and_then(Value::as_str) {
        file["filename"] = json!(name);
    }
    Ok(json!({"type": "file", "file": file}))
}

/// A `function_call` item as a tool call of an assistant message: the last message when it
/// is the assistant's (consecutive calls, or the text before them, make one message).
fn function_call_item(
    at: &str,
    obj: &Map<String, Value>,
    messages: &mut Vec<Value>,
) -> Result<(), Refusal> {
    let call = json!({
        "id": str_field(obj, at, "call_id")?,
        "type": "function",
        "function": {
            "name": str_field(obj, at, "name")?,
            "arguments": str_field(obj, at, "arguments")?,
        },
    });
    let last_assistant = messages
        .last_mut()
        .filter(|m| m["role"] == "assistant")
        .and_then(Value::as_object_mut);
    match last_assistant {
        Some(message) => match message.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => {
                message.insert("tool_calls".to_string(), json!([call]));
            }
        },
        None => messages.push(json!({"role": "assistant", "tool_calls": [call]})),
    }
    Ok(())
}

/// A `function_call_output` item as a `tool` message (a list of text parts joined by
/// newlines).
fn function_call_output_item(at: &str, obj: &Map<String, Value>) -> Result<Value, Refusal> {
    let call_id = str_field(obj, at, "call_id")?;
    let path = format!("{at}.output");
    let output = match obj.get("output") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let part_at = format!("{path}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        texts.push(part.get("text").and_then(Value::as_str).ok_or_else(|| {
                            refuse(&part_at, format!("`{part_at}.text` must be a string"))
                        })?);
                    }
                    _ => {
                        let type_path = format!("{part_at}.type");
                        return Err(refuse(
                            &type_path,
                            format!("`{type_path}`: Chat Completions tool results are text only"),
                        ));
                    }
                }
            }
            texts.join("\n")
        }
        _ => {
            return Err(refuse(
                &path,
                format!("`{path}` must be a string or a list of parts"),
            ))
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": call_id, "content": output}))
}

/// The client's function tools as chat tools; any other tool is refused.
fn chat_tools<'a>(raw: &'a RawValue) -> Result<Vec<ChatTool<'a>>, Refusal> {
    let list: Vec<Fields<'a>> = serde_json::from_str(raw.get())
        .map_err(|_| refuse("tools", "`tools` must be a list of objects"))?;
    let mut tools = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let type_path = format!("{at}.type");
        let kind: String = field(tool, "type", &type_path, "a string")?
            .ok_or_else(|| refuse(&type_path, format!("`{type_path}` is required")))?;
        if kind != "function" {
            return Err(refuse(
                &type_path,
                format!(
                    "tools of type \"{kind}\" (`{type_path}`) are not supported: hosted tools \
                     run on OpenAI's servers, and this target's engine has function tools only"
                ),
            ));
        }
        let name_path = format!("{at}.name");
        let name = field(tool, "name", &name_path, "a string")?
            .ok_or_else(|| refuse(&name_path, format!("`{name_path}` is required")))?;
        let params_path = format!("{at}.parameters");
        let parameters = tool
            .get("parameters")
            .copied()
            .filter(|raw| raw.get() != "null");
        if let Some(raw) = parameters {
            serde_json::from_str::<Fields>(raw.get()).map_err(|_| {
                refuse(
                    &params_path,
                    format!("`{params_path}` must be a JSON Schema object"),
                )
            })?;
        }
        tools.push(ChatTool {
            kind: "function",
            function: ChatFunction {
                name,
                description: field(
                    tool,
                    "description",
                    &format!("{at}.description"),
                    "a string",
                )?,
                parameters,
            },
        });
    }
    Ok(tools)
}

/// The client's `tool_choice` in chat's shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, Refusal> {
    match choice {
        Value::String(mode) if matches!(mode.as_str(), "auto" | "none" | "required") => {
            Ok(choice.clone())
        }
        Value::Object(obj) if obj.get("type").and_then(Value::as_str) == Some("function") => {
            let name = str_field(obj, "tool_choice", "name")?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(refuse(
            "tool_choice",
            "`tool_choice` must be \"auto\", \"none\", \"required\" or a function \
             ({\"type\": \"function\", \"name\": …}); hosted tools are not supported",
        )),
    }
}

/// The chat `response_format` of the client's `text.format` (`None` for plain text).
fn response_format<'a>(text: &'a RawValue) -> Result<Option<ResponseFormat<'a>>, Refusal> {
    let text: Fields<'a> =
        serde_json::from_str(text.get()).map_err(|_| refuse("text", "`text` must be an object"))?;
    let Some(format) = text.get("format").filter(|raw| raw.get() != "null") else {
        return Ok(None);
    };
    let format: Fields<'a> = serde_json::from_str(format.get())
        .map_err(|_| refuse("text.format", "`text.format` must be an object"))?;
    let kind: Option<String> = field(&format, "type", "text.format.type", "a string")?;
    match kind.as_deref() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let name = field(&format, "name", "text.format.name", "a string")?
                .ok_or_else(|| refuse("text.format.name", "`text.format.name` is required"))?;
            let schema = format
                .get("schema")
                .copied()
                .filter(|raw| raw.get().starts_with('{'))
                .ok_or_else(|| {
                    refuse(
                        "text.format.schema",
                        "`text.format.schema` must be a JSON Schema object",
                    )
                })?;
            Ok(Some(ResponseFormat::JsonSchema {
                json_schema: JsonSchema {
                    name,
                    description: field(
                        &format,
                        "description",
                        "text.format.description",
                        "a string",
                    )?,
                    schema,
                    strict: field(&format, "strict", "text.format.strict", "a boolean")?,
                },
            }))
        }
        _ => Err(refuse(
            "text.format.type",
            "`text.format.type` must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Output items, shared by the whole answer and the stream
// ---------------------------------------------------------------------------------------

/// What an output item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

/// What a content part of an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartKind {
    /// A message's `output_text`.
    Text,
    /// A message's `refusal`.
    Refusal,
    /// A reasoning item's `reasoning_text`.
    Reasoning,
}

#[derive(Debug)]
struct Part {
    kind: PartKind,
    text: String,
}

/// One output item as it is known so far.
#[derive(Debug)]
struct Item {
    kind: Kind,
    id: String,
    /// A message's or a reasoning item's content.
    parts: Vec<Part>,
    call_id: String,
    name: String,
    arguments: String,
    /// Set when the item is done.
    status: Option<&'static str>,
}

impl Item {
    /// The `n`th item of `kind` (counting from 0) in an answer with ids from `seed`.
    fn new(kind: Kind, seed: &str, n: usize) -> Item {
        let id = match (kind, n) {
            (Kind::Call, _) => format!("fc_{seed}_{n}"),
            (Kind::Reasoning, 0) => format!("rs_{seed}"),
            (Kind::Reasoning, _) => format!("rs_{seed}_{n}"),
            (Kind::Message, 0) => format!("msg_{seed}"),
            (Kind::Message, _) => format!("msg_{seed}_{n}"),
        };
        Item {
            kind,
            id,
            parts: Vec::new(),
            call_id: String::new(),
            name: String::new(),
            arguments: String::new(),
            status: None,
        }
    }

    /// The item's JSON with `status`.
    fn json(&self, status: &str) -> Value {
        let content: Vec<Value> = self.parts.iter().map(part_json).collect();
        match self.kind {
            Kind::Reasoning => json!({
                "type": "reasoning", "id": self.id, "summary": [], "content": content,
                "status": status,
            }),
            Kind::Message => json!({
                "type": "message", "id": self.id, "status": status, "role": "assistant",
                "content": content,
            }),
            Kind::Call => json!({
                "type": "function_call", "id": self.id, "call_id": self.call_id,
                "name": self.name, "arguments": self.arguments, "status": status,
            }),
        }
    }
}

/// A content part's JSON.
fn part_json(part: &Part) -> Value {
    match part.kind {
        PartKind::Text => {
            json!({"type": "output_text", "text": part.text, "annotations": [], "logprobs": []})
        }
        PartKind::Refusal => json!({"type": "refusal", "refusal": part.text}),
        PartKind::Reasoning => json!({"type": "reasoning_text", "text": part.text}),
    }
}

/// The `incomplete_details.reason` of a chat `finish_reason` that cut the answer short.
fn incomplete_reason(finish_reason: Option<&str>) -> Option<&'static str> {
    match finish_reason {
        Some("length") => Some("max_output_tokens"),
        Some("content_filter") => Some("content_filter"),
        _ => None,
    }
}

/// A chat `usage` object in the Responses shape (`None` when there is none).
fn usage_json(usage: &Value) -> Option<Value> {
    usage.as_object()?;
    let count = |v: &Value| v.as_u64().unwrap_or(0);
    let input = count(&usage["prompt_tokens"]);
    let output = count(&usage["completion_tokens"]);
    let total = usage["total_tokens"].as_u64().unwrap_or(input + output);
    Some(json!({
        "input_tokens": input,
        "input_tokens_details": {
            "cached_tokens": count(&usage["prompt_tokens_details"]["cached_tokens"]),
            "cache_write_tokens": 0,
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": count(&usage["completion_tokens_details"]["reasoning_tokens"]),
        },
        "total_tokens": total,
    }))
}

/// The reasoning text of a chat message or delta (`reasoning_content`, else `reasoning`).
fn reasoning_text(message: &Value) -> Option<&str> {
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|key| message[*key].as_str().filter(|s| !s.is_empty()))
}

/// A tool call's arguments as the string Responses carries (an object some engines send is
/// written as JSON).
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The items of a whole chat message: reasoning, the message, then each tool call.
fn message_items(seed: &str, message: &Value) -> Vec<Item> {
    let mut items = Vec::new();
    if let Some(text) = reasoning_text(message) {
        let mut item = Item::new(Kind::Reasoning, seed, 0);
        item.parts.push(Part {
            kind: PartKind::Reasoning,
            text: text.to_string(),
        });
        items.push(item);
    }
    let text = match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    let mut reply = Item::new(Kind::Message, seed, 0);
    if !text.is_empty() {
        reply.parts.push(Part {
            kind: PartKind::Text,
            text,
        });
    }
    if let Some(refusal) = message["refusal"].as_str().filter(|s| !s.is_empty()) {
        reply.parts.push(Part {
            kind: PartKind::Refusal,
            text: refusal.to_string(),
        });
    }
    if !reply.parts.is_empty() {
        items.push(reply);
    }
    let calls = message["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (n, call) in calls.iter().enumerate() {
        let mut item = Item::new(Kind::Call, seed, n);
        item.call_id = call_id(seed, n, call["id"].as_str());
        item.name = call["function"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        item.arguments = arguments_text(&call["function"]["arguments"]);
        items.push(item);
    }
    items
}

/// The engine's tool call id, or one made for a call that came without.
fn call_id(seed: &str, n: usize, engine_id: Option<&str>) -> String {
    match engine_id.filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => format!("call_{seed}_{n}"),
    }
}

// ---------------------------------------------------------------------------------------
// The answer
// ---------------------------------------------------------------------------------------

/// The translation of one chat answer into the Responses API.
#[derive(Debug)]
pub struct Reply {
    asked: Asked,
    splitter: SseSplitter,
    /// How many events were written (the next `sequence_number`).
    written: u64,
    /// `response.created` and `response.in_progress` were written.
    started: bool,
    /// The terminal event (`response.completed`, `response.incomplete` or `error`) was
    /// written; nothing follows it.
    ended: bool,
    finish_reason: Option<String>,
    usage: Option<Value>,
    items: Vec<Item>,
    /// The open reasoning or message item.
    open_text: Option<usize>,
    /// The open function calls: the chat tool call's index and id, and the item.
    calls: Vec<CallKey>,
}

#[derive(Debug)]
struct CallKey {
    index: Option<u64>,
    engine_id: Option<String>,
    item: usize,
}

impl Reply {
    /// The translation of the answer to a request `asked` for.
    pub fn new(asked: Asked) -> Reply {
        Reply {
            asked,
            splitter: SseSplitter::default(),
            written: 0,
            started: false,
            ended: false,
            finish_reason: None,
            usage: None,
            items: Vec::new(),
            open_text: None,
            calls: Vec::new(),
        }
    }

    /// Writes a whole chat answer with `status` as a Response object, or any answer that is
    /// not 2xx as OpenAI's error body. `Err` when a 2xx body is not a chat completion.
    pub fn whole(&mut self, status: u16, body: &[u8], out: &mut Vec<u8>) -> Result<(), NotTheApi> {
        if !(200..300).contains(&status) {
            write_json(out, &error_body(status, body));
            return Ok(());
        }
        let chat: Value = serde_json::from_slice(body).map_err(|_| NotTheApi)?;
        let choices = chat
            .get("choices")
            .and_then(Value::as_array)
            .ok_or(NotTheApi)?;
        let choice = choices
            .iter()
            .find(|c| c["index"].as_u64().unwrap_or(0) == 0)
            .or(choices.first());
        let finish_reason = choice.and_then(|c| c["finish_reason"].as_str());
        let incomplete = incomplete_reason(finish_reason);
        let item_status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let items = choice.map_or_else(Vec::new, |c| {
            message_items(&self.asked.id_seed, &c["message"])
        });
        let output = items.iter().map(|item| item.json(item_status)).collect();
        let response =
            self.response_json(item_status, output, usage_json(&chat["usage"]), incomplete);
        write_json(out, &response);
        Ok(())
    }

    /// Translates the next bytes of the engine's chat event stream into Responses events.
    /// The engine's stream held an event too large to be one (`SseSplitter::overflowed`).
    pub fn overflowed(&self) -> bool {
        self.splitter.overflowed()
    }

    pub fn events(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let mut splitter = std::mem::take(&mut self.splitter);
        splitter.feed(data, |event| self.engine_event(event.name, event.data, out));
        self.splitter = splitter;
    }

    /// The engine's stream ended cleanly: writes the closing events when a `finish_reason`
    /// came but the stream's end did not. `false` when the answer never finished.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> bool {
        if self.splitter.holds_partial() {
            // A last event without its blank line.
            self.events(b"\n\n", out);
        }
        if self.ended {
            return true;
        }
        if self.finish_reason.is_some() {
            self.complete(out);
            return true;
        }
        false
    }

    /// The last `sequence_number` written, `None` before any.
    pub fn sequence(&self) -> Option<u64> {
        self.written.checked_sub(1)
    }

    /// The Response object as it stands, with `status`, `output` and `usage`.
    fn response_json(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<Value>,
        incomplete: Option<&str>,
    ) -> Value {
        let echo = |key: &str, default: Value| {
            self.asked
                .echo
                .as_ref()
                .and_then(|e| e.get(key))
                .cloned()
                .unwrap_or(default)
        };
        json!({
            "id": format!("resp_{}", self.asked.id_seed),
            "object": "response",
            "created_at": self.asked.created,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "instructions": echo("instructions", Value::Null),
            "max_output_tokens": echo("max_output_tokens", Value::Null),
            "metadata": echo("metadata", json!({})),
            "model": self.asked.model,
            "output": output,
            "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
            "store": false,
            "temperature": echo("temperature", Value::Null),
            "text": echo("text", json!({"format": {"type": "text"}})),
            "tool_choice": echo("tool_choice", json!("auto")),
            "tools": echo("tools", json!([])),
            "top_p": echo("top_p", Value::Null),
            "usage": usage,
        })
    }

    /// Writes one event: `type` and `sequence_number` first, then the fields of `body` (an
    /// object).
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, body: Value) {
        let sequence = self.written;
        self.written += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":");
        write_json(out, &kind);
        out.extend_from_slice(b",\"sequence_number\":");
        out.extend_from_slice(sequence.to_string().as_bytes());
        let rest = serde_json::to_vec(&body).unwrap_or_default();
        match rest.get(1..) {
            Some(fields) if rest.len() > 2 => {
                out.push(b',');
                out.extend_from_slice(fields);
            }
            _ => out.push(b'}'),
        }
        out.extend_from_slice(b"\n\n");
    }

    /// One event of the engine's stream.
    fn engine_event(&mut self, name: &str, data: &str, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let data = data.trim();
        if data == "[DONE]" {
            self.start(out);
            self.complete(out);
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let error = chunk.get("error").filter(|e| !e.is_null());
        if error.is_some() || name == "error" {
            self.start(out);
            self.fail(error.unwrap_or(&chunk), out);
            return;
        }
        self.start(out);
        let choices = chunk["choices"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if let Some(choice) = choices
            .iter()
            .find(|c| c["index"].as_u64().unwrap_or(0) == 0)
        {
            self.choice(choice, out);
        }
        if let Some(usage) = usage_json(&chunk["usage"]) {
            self.usage = Some(usage);
            // The usage chunk comes last: the answer is complete without waiting for [DONE].
            if self.finish_reason.is_some() {
                self.complete(out);
            }
        }
    }

    /// Writes `response.created` and `response.in_progress` once.
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let response = self.response_json("in_progress", Vec::new(), None, None);
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    /// One chunk's choice: its deltas, then its `finish_reason`.
    fn choice(&mut self, choice: &Value, out: &mut Vec<u8>) {
        if self.finish_reason.is_some() {
            return;
        }
        let delta = &choice["delta"];
        if let Some(text) = reasoning_text(delta) {
            self.text_delta(PartKind::Reasoning, text, out);
        }
        if let Some(text) = delta["content"].as_str() {
            self.text_delta(PartKind::Text, text, out);
        }
        if let Some(text) = delta["refusal"].as_str() {
            self.text_delta(PartKind::Refusal, text, out);
        }
        for call in delta["tool_calls"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            self.call_delta(call, out);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_string());
            self.close_all(out);
        }
    }

    /// Opens a new item of `kind` (closing an open reasoning or message item first).
    fn add_item(&mut self, kind: Kind, out: &mut Vec<u8>) -> usize {
        self.close_text(out);
        let n = self.items.iter().filter(|item| item.kind == kind).count();
        let mut item = Item::new(kind, &self.asked.id_seed, n);
        if kind == Kind::Call {
            item.call_id = call_id(&self.asked.id_seed, n, None);
        }
        let at = self.items.len();
        self.items.push(item);
        if kind != Kind::Call {
            self.open_text = Some(at);
            self.emit_added(at, out);
        }
        at
    }

    fn emit_added(&mut self, at: usize, out: &mut Vec<u8>) {
        let item = self.items[at].json("in_progress");
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": at, "item": item}),
        );
    }

    /// A piece of reasoning, text or refusal.
    fn text_delta(&mut self, kind: PartKind, delta: &str, out: &mut Vec<u8>) {
        if delta.is_empty() {
            return;
        }
        let item_kind = if kind == PartKind::Reasoning {
            Kind::Reasoning
        } else {
            Kind::Message
        };
        let at = match self.open_text.filter(|&i| self.items[i].kind == item_kind) {
            Some(at) => at,
            None => self.add_item(item_kind, out),
        };
        if self.items[at].parts.last().map(|p| p.kind) != Some(kind) {
            self.close_part(at, out);
            self.items[at].parts.push(Part {
                kind,
                text: String::new(),
            });
            let body = self.part_event(
                at,
                "part",
                part_json(&Part {
                    kind,
                    text: String::new(),
                }),
            );
            self.emit(out, "response.content_part.added", body);
        }
        if let Some(part) = self.items[at].parts.last_mut() {
            part.text.push_str(delta);
        }
        let mut body = self.part_event(at, "delta", json!(delta));
        let name = match kind {
            PartKind::Text => {
                body["logprobs"] = json!([]);
                "response.output_text.delta"
            }
            PartKind::Refusal => "response.refusal.delta",
            PartKind::Reasoning => "response.reasoning_text.delta",
        };
        self.emit(out, name, body);
    }

    /// The body of an event about item `at`'s last content part, with `key: value`.
    fn part_event(&self, at: usize, key: &str, value: Value) -> Value {
        let item = &self.items[at];
        let mut body = json!({
            "item_id": item.id,
            "output_index": at,
            "content_index": item.parts.len().saturating_sub(1),
        });
        body[key] = value;
        body
    }

    /// Closes item `at`'s last content part, if it has one.
    fn close_part(&mut self, at: usize, out: &mut Vec<u8>) {
        let Some(part) = self.items[at].parts.last() else {
            return;
        };
        let (name, key, kind) = match part.kind {
            PartKind::Text => ("response.output_text.done", "text", PartKind::Text),
            PartKind::Refusal => ("response.refusal.done", "refusal", PartKind::Refusal),
            PartKind::Reasoning => ("response.reasoning_text.done", "text", PartKind::Reasoning),
        };
        let full = part_json(part);
        let mut body = self.part_event(at, key, json!(part.text));
        if kind == PartKind::Text {
            body["logprobs"] = json!([]);
        }
        self.emit(out, name, body);
        let body = self.part_event(at, "part", full);
        self.emit(out, "response.content_part.done", body);
    }

    /// Closes the open reasoning or message item.
    fn close_text(&mut self, out: &mut Vec<u8>) {
        if let Some(at) = self.open_text.take() {
            self.close_part(at, out);
            self.close_item(at, out);
        }
    }

    /// Marks item `at` done and writes `response.output_item.done`.
    fn close_item(&mut self, at: usize, out: &mut Vec<u8>) {
        let status = match incomplete_reason(self.finish_reason.as_deref()) {
            Some(_) => "incomplete",
            None => "completed",
        };
        self.items[at].status = Some(status);
        let item = self.items[at].json(status);
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        );
    }

    /// A piece of a tool call: a call not seen before opens a function call item.
    fn call_delta(&mut self, call: &Value, out: &mut Vec<u8>) {
        let index = call["index"].as_u64();
        let engine_id = call["id"].as_str().filter(|id| !id.is_empty());
        let known = self
            .calls
            .iter()
            .rev()
            .find(|key| match (index, engine_id) {
                (Some(index), _) => key.index == Some(index),
                (None, Some(id)) => key.engine_id.as_deref() == Some(id),
                (None, None) => true,
            });
        let function = &call["function"];
        let name = function["name"].as_str().unwrap_or_default();
        let at = match known {
            Some(key) => key.item,
            None => {
                let at = self.add_item(Kind::Call, out);
                if let Some(id) = engine_id {
                    self.items[at].call_id = id.to_string();
                }
                self.items[at].name = name.to_string();
                self.calls.push(CallKey {
                    index,
                    engine_id: engine_id.map(str::to_string),
                    item: at,
                });
                self.emit_added(at, out);
                at
            }
        };
        if self.items[at].name.is_empty() {
            self.items[at].name = name.to_string();
        }
        let delta = arguments_text(&function["arguments"]);
        if !delta.is_empty() {
            self.items[at].arguments.push_str(&delta);
            let body = json!({"item_id": self.items[at].id, "output_index": at, "delta": delta});
            self.emit(out, "response.function_call_arguments.delta", body);
        }
    }

    /// Closes every open item, in output order.
    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.close_text(out);
        for at in 0..self.items.len() {
            let item = &self.items[at];
            if item.kind != Kind::Call || item.status.is_some() {
                continue;
            }
            let body = json!({
                "item_id": item.id, "output_index": at, "name": item.name,
                "arguments": item.arguments,
            });
            self.emit(out, "response.function_call_arguments.done", body);
            self.close_item(at, out);
        }
    }

    /// Closes what is open and writes `response.completed` (or `response.incomplete`).
    fn complete(&mut self, out: &mut Vec<u8>) {
        self.close_all(out);
        let incomplete = incomplete_reason(self.finish_reason.as_deref());
        let status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let output = self
            .items
            .iter()
            .map(|item| item.json(item.status.unwrap_or(status)))
            .collect();
        let response = self.response_json(status, output, self.usage.clone(), incomplete);
        self.emit(
            out,
            &format!("response.{status}"),
            json!({"response": response}),
        );
        self.ended = true;
    }

    /// Writes the `error` event of an engine's error chunk; nothing follows it.
    fn fail(&mut self, error: &Value, out: &mut Vec<u8>) {
        let message = match error {
            Value::String(text) => text.as_str(),
            _ => error["message"]
                .as_str()
                .unwrap_or("the engine reported an error"),
        };
        let code = match &error["code"] {
            Value::String(code) => Some(code.clone()),
            Value::Number(code) => Some(code.to_string()),
            _ => error["type"].as_str().map(str::to_string),
        };
        let body = json!({"code": code, "message": message, "param": error["param"].as_str()});
        self.emit(out, "error", body);
        self.ended = true;
    }
}

/// Appends `value` as JSON.
fn write_json(out: &mut Vec<u8>, value: &impl Serialize) {
    out.extend_from_slice(&serde_json::to_vec(value).unwrap_or_default());
}

/// OpenAI's error body for an engine's answer with `status` that was not a success.
fn error_body(status: u16, body: &[u8]) -> Value {
    let default_type = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let (message, kind) = match parsed
        .as_ref()
        .map(|v| (&v["error"], &v["detail"], &v["message"]))
    {
        Some((Value::Object(error), _, _)) => (
            error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string),
            error.get("type").and_then(Value::as_str),
        ),
        Some((Value::String(text), _, _)) => (Some(text.clone()), None),
        Some((_, Value::String(text), _)) => (Some(text.clone()), None),
        Some((_, detail, _)) if !detail.is_null() => (Some(detail.to_string()), None),
        Some((_, _, Value::String(text))) => (Some(text.clone()), None),
        _ => (None, None),
    };
    let message = message
        .or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            (!text.is_empty()).then(|| truncated(text, ERROR_TEXT_LIMIT).to_string())
        })
        .unwrap_or_else(|| format!("the engine answered {status}"));
    json!({"error": {
        "message": message, "type": kind.unwrap_or(default_type), "param": null, "code": null,
    }})
}

/// `text` cut to at most `limit` bytes, at a character boundary.
fn truncated(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "s1";
    const CREATED: u64 = 1_700_000_000;

    fn chat_of(body: Value, model: Option<&str>) -> (Value, Asked) {
        let mut out = Vec::new();
        let asked = request(body.to_string().as_bytes(), model, &mut out).expect("translated");
        (serde_json::from_slice(&out).expect("chat JSON"), asked)
    }

    fn refusal_of(body: &str) -> Refusal {
        let mut out = Vec::new();
        let refusal = request(body.as_bytes(), None, &mut out).expect_err("refused");
        assert!(out.is_empty(), "nothing written for a refused body");
        refusal
    }

    /// What mod.rs hands [`Reply::new`] for a request `body`.
    fn asked_for(body: Value) -> Asked {
        let mut asked = request(body.to_string().as_bytes(), None, &mut Vec::new()).expect("ok");
        asked.created = CREATED;
        asked.id_seed = SEED.to_string();
        asked
    }

    fn plain_asked(stream: bool) -> Asked {
        asked_for(json!({"model": "gpt-test", "input": "Hi", "stream": stream}))
    }

    /// The Response object of a plain request, before `status`, `output` and `usage`.
    fn response(status: &str, output: Value, usage: Value) -> Value {
        json!({
            "id": "resp_s1", "object": "response", "created_at": CREATED, "status": status,
            "background": false, "error": null, "incomplete_details": null,
            "instructions": null, "max_output_tokens": null, "metadata": {},
            "model": "gpt-test", "output": output, "parallel_tool_calls": true, "store": false,
            "temperature": null, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
            "tools": [], "top_p": null, "usage": usage,
        })
    }

    fn usage(input: u64, output: u64, cached: u64) -> Value {
        json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        })
    }

    /// The events written, as (name, data without `type` and `sequence_number`), checking
    /// that `type` is the event's name and the sequence numbers count from 0.
    fn events_of(out: &[u8]) -> Vec<(String, Value)> {
        let text = std::str::from_utf8(out).expect("UTF-8");
        assert!(
            text.is_empty() || text.ends_with("\n\n"),
            "events end with a blank line"
        );
        let mut events = Vec::new();
        for (n, event) in text.split_terminator("\n\n").enumerate() {
            let (head, data) = event.split_once("\ndata: ").expect("event and data lines");
            let name = head.strip_prefix("event: ").expect("event line");
            let mut data: Value = serde_json::from_str(data).expect("event JSON");
            let fields = data.as_object_mut().expect("an object");
            assert_eq!(fields.remove("type"), Some(json!(name)));
            assert_eq!(
                fields.remove("sequence_number"),
                Some(json!(n)),
                "event {n}"
            );
            events.push((name.to_string(), data));
        }
        events
    }

    fn sse(chunks: &[Value]) -> Vec<u8> {
        let mut stream = Vec::new();
        for chunk in chunks {
            stream.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
        }
        stream.extend_from_slice(b"data: [DONE]\n\n");
        stream
    }

    fn delta(delta: Value, finish_reason: Value) -> Value {
        json!({"id": "c1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish_reason}
        ]})
    }

    fn usage_chunk(prompt: u64, completion: u64) -> Value {
        json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": prompt,
            "completion_tokens": completion, "total_tokens": prompt + completion}})
    }

    fn stream_of(asked: Asked, stream: &[u8]) -> (Vec<u8>, Reply) {
        let mut reply = Reply::new(asked);
        let mut out = Vec::new();
        reply.events(stream, &mut out);
        (out, reply)
    }

    fn text_stream() -> Vec<u8> {
        sse(&[
            delta(json!({"role": "assistant", "content": ""}), Value::Null),
            delta(json!({"content": "Hel"}), Value::Null),
            delta(json!({"content": "lo"}), Value::Null),
            delta(json!({}), json!("stop")),
            usage_chunk(5, 2),
        ])
    }

    fn message(status: &str, text: &str) -> Value {
        json!({"type": "message", "id": "msg_s1", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    }

    #[test]
    fn a_string_input_with_instructions_and_sampling() {
        let (chat, asked) = chat_of(
            json!({"model": "gpt-4.1", "instructions": "Be brief.", "input": "Hi",
                "max_output_tokens": 64, "temperature": 0.5, "top_p": 0.9, "user": "u1",
                "stream": true, "metadata": {"k": "v"}, "store": true, "include": []}),
            Some("llama-3"),
        );
        assert_eq!(
            chat,
            json!({"model": "llama-3", "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"}],
                "max_tokens": 64, "temperature": 0.5, "top_p": 0.9, "user": "u1",
                "stream": true, "stream_options": {"include_usage": true}})
        );
        assert_eq!(asked.model, "gpt-4.1");
        assert!(asked.stream);
        let echo = json!({"instructions": "Be brief.", "max_output_tokens": 64,
            "metadata": {"k": "v"}, "temperature": 0.5, "top_p": 0.9});
        assert_eq!(Value::Object(asked.echo.expect("echo")), echo);
        let (chat, asked) = chat_of(json!({"model": "m", "input": "x"}), None);
        assert_eq!(
            chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": false})
        );
        assert_eq!((asked.model.as_str(), asked.stream), ("m", false));
    }

    #[test]
    fn message_items_with_images_files_and_roles() {
        let (chat, _) = chat_of(
            json!({"model": "m", "input": [
                {"role": "developer", "content": "Rules."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "https://x/a.png", "detail": "low"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "original"},
                    {"type": "input_file", "file_data": "data:application/pdf;base64,JV", "filename": "a.pdf"}]},
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": "A cat.", "annotations": []}]},
                {"role": "system", "content": [{"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"}]}]}),
            None,
        );
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Rules."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JV",
                        "filename": "a.pdf"}}]},
                {"role": "assistant", "content": "A cat."},
                {"role": "system", "content": [{"type": "text", "text": "a"},
                    {"type": "text", "text": "b"}]}
            ])
        );
    }

    #[test]
    fn function_call_history_merges_into_assistant_messages() {
        let (chat, _) = chat_of(
            json!({"model": "m", "input": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "weather",
                    "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
                {"type": "function_call", "call_id": "call_b", "name": "weather",
                    "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
                {"type": "function_call_output", "call_id": "call_b", "output": [
                    {"type": "input_text", "text": "21C"}, {"type": "input_text", "text": "sunny"}]},
                {"type": "function_call", "call_id": "call_c", "name": "weather", "arguments": "{}"}]}),
            None,
        );
        let call = |id: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": "weather", "arguments": args}});
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    call("call_a", "{\"city\":\"Paris\"}"), call("call_b", "{\"city\":\"Rome\"}")]},
                {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
                {"role": "tool", "tool_call_id": "call_b", "content": "21C\nsunny"},
                {"role": "assistant", "tool_calls": [call("call_c", "{}")]}
            ])
        );
    }

    #[test]
    fn tools_tool_choice_text_format_and_reasoning() {
        let schema = r#"{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}}"#;
        let body = format!(
            r#"{{"model":"m","input":"x","tools":[{{"type":"function","name":"f","description":"d",
            "parameters":{schema},"strict":true}},{{"type":"function","name":"g"}}],
            "tool_choice":{{"type":"function","name":"f"}},"parallel_tool_calls":false,
            "text":{{"format":{{"type":"json_schema","name":"out","schema":{schema},"strict":true}}}},
            "reasoning":{{"effort":"low","summary":"auto"}}}}"#
        );
        let mut out = Vec::new();
        let asked = request(body.as_bytes(), None, &mut out).expect("translated");
        let written = String::from_utf8(out.clone()).expect("UTF-8");
        assert_eq!(
            written.matches(schema).count(),
            2,
            "schemas keep their key order"
        );
        let chat: Value = serde_json::from_slice(&out).expect("JSON");
        let schema: Value = serde_json::from_str(schema).expect("schema");
        assert_eq!(
            chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": false,
                "tools": [
                    {"type": "function", "function": {"name": "f", "description": "d",
                        "parameters": schema}},
                    {"type": "function", "function": {"name": "g"}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "parallel_tool_calls": false,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "out", "schema": schema, "strict": true}},
                "reasoning_effort": "low"})
        );
        let echo = asked.echo.expect("echo");
        assert_eq!(
            echo["tool_choice"],
            json!({"type": "function", "name": "f"})
        );
        assert_eq!(echo["parallel_tool_calls"], json!(false));
        assert_eq!(echo["tools"][1], json!({"type": "function", "name": "g"}));
        assert_eq!(echo["text"]["format"]["name"], json!("out"));
        for (choice, chat_choice) in [
            ("\"required\"", json!("required")),
            ("\"none\"", json!("none")),
        ] {
            let body = format!(
                r#"{{"model":"m","input":"x","tool_choice":{choice},"text":{{"format":{{"type":"json_object"}}}}}}"#
            );
            let mut out = Vec::new();
            request(body.as_bytes(), None, &mut out).expect("translated");
            let chat: Value = serde_json::from_slice(&out).expect("JSON");
            assert_eq!(chat["tool_choice"], chat_choice);
            assert_eq!(chat["response_format"], json!({"type": "json_object"}));
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                r#"{"model":"m","input":"x","previous_response_id":"resp_1"}"#,
                Some("previous_response_id"),
            ),
            (
                r#"{"model":"m","input":"x","conversation":"conv_1"}"#,
                Some("conversation"),
            ),
            (
                r#"{"model":"m","input":"x","background":true}"#,
                Some("background"),
            ),
            (r#"{"model":"m","prompt":{"id":"pmpt_1"}}"#, Some("prompt")),
            (
                r#"{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"web_search"}]}"#,
                Some("tools[1].type"),
            ),
            (
                r#"{"model":"m","input":"x","tools":[{"type":"function"}]}"#,
                Some("tools[0].name"),
            ),
            (
                r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","file_id":"file_1","detail":"auto"}]}]}"#,
                Some("input[0].content[1].file_id"),
            ),
            (
                r#"{"model":"m","input":[{"role":"user","content":"a"},{"type":"item_reference","id":"msg_1"}]}"#,
                Some("input[1].type"),
            ),
            (
                r#"{"model":"m","input":[{"type":"web_search_call","id":"ws_1"}]}"#,
                Some("input[0].type"),
            ),
            (
                r#"{"model":"m","input":[{"role":"assistant","content":[{"type":"input_image","image_url":"u"}]}]}"#,
                Some("input[0].content[0].type"),
            ),
            (
                r#"{"model":"m","input":[{"role":"tool","content":"a"}]}"#,
                Some("input[0].role"),
            ),
            (
                r#"{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}"#,
                Some("input[0].call_id"),
            ),
            (
                r#"{"model":"m","input":"x","tool_choice":{"type":"file_search"}}"#,
                Some("tool_choice"),
            ),
            (
                r#"{"model":"m","input":"x","text":{"format":{"type":"json_schema","schema":{}}}}"#,
                Some("text.format.name"),
            ),
            (
                r#"{"model":"m","input":"x","temperature":"hot"}"#,
                Some("temperature"),
            ),
            (r#"{"model":"m"}"#, Some("input")),
            (r#"{"input":"x"}"#, Some("model")),
            (r#"{"model":"m","input":"x""#, None),
            ("[1]", None),
        ];
        for (body, param) in cases {
            assert_eq!(refusal_of(body).param.as_deref(), param, "{body}");
        }
        let refusal = refusal_of(r#"{"model":"m","input":"x","previous_response_id":"resp_1"}"#);
        assert_eq!(
            refusal.message,
            "`previous_response_id` is not supported: this target keeps no response state; send \
             the whole conversation in `input`"
        );
        let (_, asked) = chat_of(
            json!({"model": "m", "input": "x", "previous_response_id": null,
            "background": false, "store": true}),
            None,
        );
        assert_eq!(asked.model, "m");
    }

    #[test]
    fn whole_text_with_reasoning_and_usage() {
        let mut reply = Reply::new(plain_asked(false));
        let body = json!({"id": "c1", "object": "chat.completion", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Hello", "reasoning_content": "Think."},
            "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
            "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}});
        let mut out = Vec::new();
        assert_eq!(
            reply.whole(200, body.to_string().as_bytes(), &mut out),
            Ok(())
        );
        let got: Value = serde_json::from_slice(&out).expect("JSON");
        let reasoning = json!({"type": "reasoning", "id": "rs_s1", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": "Think."}]});
        let want = response(
            "completed",
            json!([reasoning, message("completed", "Hello")]),
            usage(5, 2, 3),
        );
        assert_eq!(got, want);
    }

    #[test]
    fn whole_tool_calls_echo_the_request() {
        let asked = asked_for(
            json!({"model": "gpt-test", "input": "x", "instructions": "I",
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
            "tool_choice": "required", "temperature": 0.2, "metadata": {"a": "b"}}),
        );
        let mut reply = Reply::new(asked);
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null,
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"c\":1}"}},
                {"type": "function", "function": {"name": "weather", "arguments": {"c": 2}}}]},
            "finish_reason": "tool_calls"}]});
        let mut out = Vec::new();
        assert_eq!(
            reply.whole(200, body.to_string().as_bytes(), &mut out),
            Ok(())
        );
        let got: Value = serde_json::from_slice(&out).expect("JSON");
        let mut want = response(
            "completed",
            json!([
            {"type": "function_call", "id": "fc_s1_0", "call_id": "call_a", "name": "weather",
                "arguments": "{\"c\":1}", "status": "completed"},
            {"type": "function_call", "id": "fc_s1_1", "call_id": "call_s1_1", "name": "weather",
                "arguments": "{\"c\":2}", "status": "completed"}]),
            Value::Null,
        );
        want["instructions"] = json!("I");
        want["tools"] =
            json!([{"type": "function", "name": "weather", "parameters": {"type": "object"}}]);
        want["tool_choice"] = json!("required");
        want["temperature"] = json!(0.2);
        want["metadata"] = json!({"a": "b"});
        assert_eq!(got, want);
    }

    #[test]
    fn whole_length_and_content_filter_are_incomplete() {
        for (finish, reason) in [
            ("length", "max_output_tokens"),
            ("content_filter", "content_filter"),
        ] {
            let mut reply = Reply::new(plain_asked(false));
            let body = json!({"choices": [{"index": 0, "message": {"role": "assistant",
                "content": "Hel"}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}});
            let mut out = Vec::new();
            assert_eq!(
                reply.whole(200, body.to_string().as_bytes(), &mut out),
                Ok(())
            );
            let mut want = response(
                "incomplete",
                json!([message("incomplete", "Hel")]),
                usage(5, 1, 0),
            );
            want["incomplete_details"] = json!({"reason": reason});
            assert_eq!(serde_json::from_slice::<Value>(&out).expect("JSON"), want);
        }
    }

    #[test]
    fn whole_errors_take_openai_shape() {
        let cases: [(u16, &[u8], Value); 6] = [
            (
                400,
                br#"{"error":{"message":"too long","type":"BadRequestError","code":400}}"#,
                json!({"message": "too long", "type": "BadRequestError"}),
            ),
            (
                422,
                br#"{"detail":"bad field"}"#,
                json!({"message": "bad field", "type": "invalid_request_error"}),
            ),
            (
                422,
                br#"{"detail":[{"loc":["body"],"msg":"x"}]}"#,
                json!({"message": "[{\"loc\":[\"body\"],\"msg\":\"x\"}]", "type": "invalid_request_error"}),
            ),
            (
                500,
                br#"{"error":"engine crashed"}"#,
                json!({"message": "engine crashed", "type": "server_error"}),
            ),
            (
                502,
                b"<html>Bad Gateway</html>\n",
                json!({"message": "<html>Bad Gateway</html>", "type": "server_error"}),
            ),
            (
                503,
                b"",
                json!({"message": "the engine answered 503", "type": "server_error"}),
            ),
        ];
        for (status, body, error) in cases {
            let mut out = Vec::new();
            assert_eq!(
                Reply::new(plain_asked(false)).whole(status, body, &mut out),
                Ok(())
            );
            let mut want = json!({"error": error});
            want["error"]["param"] = Value::Null;
            want["error"]["code"] = Value::Null;
            assert_eq!(
                serde_json::from_slice::<Value>(&out).expect("JSON"),
                want,
                "{status}"
            );
        }
        for body in [&b"not json"[..], br#"{"object":"list","data":[]}"#] {
            assert_eq!(
                Reply::new(plain_asked(false)).whole(200, body, &mut Vec::new()),
                Err(NotTheApi)
            );
        }
    }

    #[test]
    fn a_text_stream_split_anywhere_is_the_same() {
        let stream = text_stream();
        let (whole, reply) = stream_of(plain_asked(true), &stream);
        let events = events_of(&whole);
        assert_eq!(reply.sequence(), Some(events.len() as u64 - 1));
        let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        let at = |mut body: Value| {
            body["item_id"] = json!("msg_s1");
            body["output_index"] = json!(0);
            body["content_index"] = json!(0);
            body
        };
        let in_progress = response("in_progress", json!([]), Value::Null);
        let want = [
            ("response.created", json!({"response": in_progress})),
            ("response.in_progress", json!({"response": in_progress})),
            (
                "response.output_item.added",
                json!({"output_index": 0, "item":
                {"type": "message", "id": "msg_s1", "status": "in_progress", "role": "assistant", "content": []}}),
            ),
            ("response.content_part.added", at(json!({"part": part("")}))),
            (
                "response.output_text.delta",
                at(json!({"delta": "Hel", "logprobs": []})),
            ),
            (
                "response.output_text.delta",
                at(json!({"delta": "lo", "logprobs": []})),
            ),
            (
                "response.output_text.done",
                at(json!({"text": "Hello", "logprobs": []})),
            ),
            (
                "response.content_part.done",
                at(json!({"part": part("Hello")})),
            ),
            (
                "response.output_item.done",
                json!({"output_index": 0, "item": message("completed", "Hello")}),
            ),
            (
                "response.completed",
                json!({"response":
                response("completed", json!([message("completed", "Hello")]), usage(5, 2, 0))}),
            ),
        ];
        let want: Vec<(String, Value)> =
            want.into_iter().map(|(n, v)| (n.to_string(), v)).collect();
        assert_eq!(events, want);
        for cut in 0..=stream.len() {
            let mut reply = Reply::new(plain_asked(true));
            let mut out = Vec::new();
            reply.events(&stream[..cut], &mut out);
            reply.events(&stream[cut..], &mut out);
            assert!(reply.finish(&mut out));
            assert_eq!(out, whole, "cut at {cut}");
        }
        let mut bytewise = Reply::new(plain_asked(true));
        let mut out = Vec::new();
        for byte in &stream {
            bytewise.events(std::slice::from_ref(byte), &mut out);
        }
        assert_eq!(out, whole);
    }

    #[test]
    fn a_function_call_stream() {
        let call = |index: u64, id: Option<&str>, name: Option<&str>, args: &str| {
            let mut call = json!({"index": index, "function": {"arguments": args}});
            if let Some(id) = id {
                call["id"] = json!(id);
                call["type"] = json!("function");
            }
            if let Some(name) = name {
                call["function"]["name"] = json!(name);
            }
            delta(json!({"tool_calls": [call]}), Value::Null)
        };
        let stream = sse(&[
            delta(
                json!({"role": "assistant", "content": "On it."}),
                Value::Null,
            ),
            call(0, Some("call_a"), Some("weather"), ""),
            call(0, None, None, "{\"c\":"),
            call(0, None, None, "1}"),
            call(1, Some("call_b"), Some("time"), "{}"),
            delta(json!({}), json!("tool_calls")),
            usage_chunk(9, 4),
        ]);
        let (out, reply) = stream_of(plain_asked(true), &stream);
        let events = events_of(&out);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let fc = |n: u64, call_id: &str, name: &str, args: &str, status: &str| {
            json!({"type": "function_call", "id": format!("fc_s1_{n}"), "call_id": call_id,
                "name": name, "arguments": args, "status": status})
        };
        assert_eq!(
            events[8].1,
            json!({"output_index": 1, "item": fc(0, "call_a", "weather", "", "in_progress")})
        );
        assert_eq!(
            events[9].1,
            json!({"item_id": "fc_s1_0", "output_index": 1, "delta": "{\"c\":"})
        );
        assert_eq!(
            events[11].1,
            json!({"output_index": 2, "item": fc(1, "call_b", "time", "", "in_progress")})
        );
        assert_eq!(
            events[13].1,
            json!({"item_id": "fc_s1_0", "output_index": 1, "name": "weather", "arguments": "{\"c\":1}"})
        );
        assert_eq!(
            events[14].1,
            json!({"output_index": 1, "item": fc(0, "call_a", "weather", "{\"c\":1}", "completed")})
        );
        assert_eq!(
            events[16].1,
            json!({"output_index": 2, "item": fc(1, "call_b", "time", "{}", "completed")})
        );
        let output = json!([
            message("completed", "On it."),
            fc(0, "call_a", "weather", "{\"c\":1}", "completed"),
            fc(1, "call_b", "time", "{}", "completed")
        ]);
        assert_eq!(
            events[17].1,
            json!({"response": response("completed", output, usage(9, 4, 0))})
        );
        assert_eq!(reply.sequence(), Some(17));
    }

    #[test]
    fn a_cut_answer_ends_incomplete_and_finish_closes_it() {
        let stream = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":\"length\"}]}\n\n";
        let (mut out, mut reply) = stream_of(plain_asked(true), stream);
        let before = events_of(&out).len();
        assert_eq!(
            events_of(&out)[before - 1].1["item"],
            message("incomplete", "Hel")
        );
        assert!(reply.finish(&mut out), "a finish_reason came");
        let events = events_of(&out);
        assert_eq!(events.len(), before + 1);
        let mut want = response(
            "incomplete",
            json!([message("incomplete", "Hel")]),
            Value::Null,
        );
        want["incomplete_details"] = json!({"reason": "max_output_tokens"});
        assert_eq!(
            events[before],
            ("response.incomplete".to_string(), json!({"response": want}))
        );
        let len = out.len();
        assert!(reply.finish(&mut out));
        assert_eq!(out.len(), len, "nothing after the terminal event");

        let (mut out, mut reply) = stream_of(
            plain_asked(true),
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        );
        assert!(
            !reply.finish(&mut out),
            "no finish_reason: the stream was cut"
        );
        assert_eq!(reply.sequence(), Some(4));
        assert!(!Reply::new(plain_asked(true)).finish(&mut Vec::new()));
        assert_eq!(Reply::new(plain_asked(true)).sequence(), None);
    }

    #[test]
    fn an_error_chunk_ends_the_stream() {
        let stream = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n\
            data: {\"error\":{\"object\":\"error\",\"message\":\"out of memory\",\"type\":\"InternalServerError\",\"code\":500}}\n\n\
            data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n";
        let (mut out, mut reply) = stream_of(plain_asked(true), stream);
        let events = events_of(&out);
        assert_eq!(events.len(), 6);
        assert_eq!(
            events[5],
            (
                "error".to_string(),
                json!({"code": "500", "message": "out of memory", "param": null})
            )
        );
        assert!(reply.finish(&mut out));
        assert_eq!(events_of(&out).len(), 6);
        assert_eq!(reply.sequence(), Some(5));
        let (out, _) = stream_of(
            plain_asked(true),
            b"event: error\ndata: {\"message\":\"overloaded\",\"type\":\"overloaded_error\"}\n\n",
        );
        let events = events_of(&out);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["response.created", "response.in_progress", "error"]);
        assert_eq!(
            events[2].1,
            json!({"code": "overloaded_error", "message": "overloaded", "param": null})
        );
    }

    #[test]
    fn a_reasoning_stream_then_text_then_refusal() {
        let stream = sse(&[
            delta(json!({"reasoning_content": "Hmm"}), Value::Null),
            delta(json!({"content": "No"}), Value::Null),
            delta(json!({"refusal": "I can't"}), json!("stop")),
        ]);
        let (out, _) = stream_of(plain_asked(true), &stream);
        let events = events_of(&out);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.content_part.added",
                "response.refusal.delta",
                "response.refusal.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(
            events[5].1,
            json!({"item_id": "rs_s1", "output_index": 0, "content_index": 0, "text": "Hmm"})
        );
        assert_eq!(
            events[14].1,
            json!({"item_id": "msg_s1", "output_index": 1, "content_index": 1, "delta": "I can't"})
        );
        let output = &events[18].1["response"]["output"];
        assert_eq!(
            output[0],
            json!({"type": "reasoning", "id": "rs_s1", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": "Hmm"}]})
        );
        assert_eq!(
            output[1]["content"][1],
            json!({"type": "refusal", "refusal": "I can't"})
        );
        assert_eq!(events[18].1["response"]["usage"], Value::Null);
    }

    /// Translates the request bodies `req_<n>.json` found in `dir` (to `chat_<n>.json`, or
    /// `refusal_<n>.json`), and returns the `Asked` of each in order.
    fn translate_sample_requests(dir: &std::path::Path) -> Vec<Asked> {
        let mut asked_list = Vec::new();
        for n in 0.. {
            let Ok(body) = std::fs::read(dir.join(format!("req_{n}.json"))) else {
                break;
            };
            let mut out = Vec::new();
            let (name, written) = match request(&body, Some("engine-model"), &mut out) {
                Ok(mut asked) => {
                    asked.created = CREATED;
                    asked.id_seed = format!("seed{n}");
                    asked_list.push(asked);
                    (format!("chat_{n}.json"), out)
                }
                Err(refusal) => (
                    format!("refusal_{n}.json"),
                    format!("{refusal:?}").into_bytes(),
                ),
            };
            std::fs::write(dir.join(name), written).expect("written");
        }
        asked_list
    }

    /// Writes translated answers for a check against the `openai` SDK's types: set
    /// `RESPONSES_SAMPLES` to a directory and run the ignored tests.
    #[test]
    #[ignore = "writes samples for the openai SDK check (RESPONSES_SAMPLES=<dir>)"]
    fn write_samples_for_the_sdk_check() {
        let Some(dir) = std::env::var_os("RESPONSES_SAMPLES") else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let mut asked = translate_sample_requests(&dir);
        asked.insert(0, plain_asked(false));
        let wholes = [
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello",
                "reasoning_content": "Think."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}),
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "",
                "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "weather",
                "arguments": "{\"city\":\"Paris\"}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hel",
                "refusal": "no"}, "finish_reason": "length"}]}),
        ];
        for (n, asked) in asked.iter().enumerate() {
            for (w, body) in wholes.iter().enumerate() {
                let mut out = Vec::new();
                Reply::new(asked.clone())
                    .whole(200, body.to_string().as_bytes(), &mut out)
                    .expect("ok");
                std::fs::write(dir.join(format!("whole_{n}_{w}.json")), out).expect("written");
            }
            for (status, body) in [(400u16, &br#"{"detail":"bad"}"#[..]), (503, b"")] {
                let mut out = Vec::new();
                Reply::new(asked.clone())
                    .whole(status, body, &mut out)
                    .expect("ok");
                std::fs::write(dir.join(format!("error_{n}_{status}.json")), out).expect("written");
            }
            for (k, stream) in sample_streams().iter().enumerate() {
                let mut reply = Reply::new(asked.clone());
                let mut out = Vec::new();
                reply.events(stream, &mut out);
                reply.finish(&mut out);
                std::fs::write(dir.join(format!("stream_{n}_{k}.sse")), out).expect("written");
            }
        }
    }

    fn sample_streams() -> Vec<Vec<u8>> {
        let call = |index: u64, id: &str, name: &str, args: &str| {
            let mut call = json!({"index": index, "function": {"arguments": args}});
            if !id.is_empty() {
                call["id"] = json!(id);
                call["function"]["name"] = json!(name);
            }
            delta(json!({"tool_calls": [call]}), Value::Null)
        };
        let mut cut = sse(&[delta(json!({"content": "Hel"}), json!("length"))]);
        cut.truncate(cut.len() - b"data: [DONE]\n\n".len());
        vec![
            text_stream(),
            sse(&[
                delta(json!({"role": "assistant", "content": "On it."}), Value::Null),
                call(0, "call_a", "weather", ""),
                call(0, "", "", "{\"city\":\"Paris\"}"),
                call(1, "call_b", "weather", "{\"city\":\"Rome\"}"),
                delta(json!({}), json!("tool_calls")),
                usage_chunk(9, 4),
            ]),
            sse(&[
                delta(json!({"reasoning": "Hmm"}), Value::Null),
                delta(json!({"content": "No"}), Value::Null),
                delta(json!({"refusal": "I can't"}), json!("stop")),
            ]),
            cut,
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n\
              data: {\"error\":{\"message\":\"out of memory\",\"type\":\"InternalServerError\",\"code\":500}}\n\n"
                .to_vec(),
            sse(&[]),
        ]
    }
}
