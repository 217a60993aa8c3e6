//! Anthropic's Messages API for a client, over an engine that speaks only OpenAI's Chat
//! Completions (vLLM, SGLang, TGI, llama.cpp): the client's `/v1/messages` body written as
//! a chat request, and the engine's answer (a completion, an error body or a stream of
//! chunks) written as a Messages answer.
//!
//! What the engine's API cannot carry is refused by name (`document` blocks, unknown block
//! types, images inside tool results, server tools, MCP servers). What has no meaning for
//! it is dropped: `cache_control`, `thinking` (an engine reasons through its chat template,
//! so the budget has nowhere to go), the thinking blocks of the history, a tool result's
//! `is_error` (its text carries the failure).
//!
//! Owns the mapping between the two shapes only. It must not do I/O, read clocks or draw
//! randomness: the message id is `msg_` and [`Asked::id_seed`]; tool ids are the engine's.

use std::borrow::Cow;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::sse::Event;
use super::{Asked, NotTheApi, Refusal, SseSplitter};
use crate::error::anthropic_type;

/// The longest engine error message passed on to the client, in characters.
const MESSAGE_LIMIT: usize = 1000;

/// A JSON string of the input, borrowed when it holds no escapes.
#[derive(Debug, Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// The fields of a Messages request that are read, each kept raw and decoded on its own so
/// that a bad one is refused by its name.
#[derive(Deserialize)]
struct MessagesBody<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow)]
    top_p: Option<&'a RawValue>,
    #[serde(borrow)]
    top_k: Option<&'a RawValue>,
    #[serde(borrow)]
    stop_sequences: Option<&'a RawValue>,
    #[serde(borrow)]
    stream: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    mcp_servers: Option<&'a RawValue>,
}

/// A Messages request's `metadata`.
#[derive(Deserialize)]
struct Metadata<'a> {
    #[serde(borrow)]
    user_id: Option<Text<'a>>,
}

/// One entry of `messages`.
#[derive(Deserialize)]
struct MessageIn<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    content: &'a RawValue,
}

/// One content block, of any type: the fields each type reads, kept raw.
#[derive(Deserialize)]
struct BlockIn<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    source: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_use_id: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

/// An image block's `source`.
#[derive(Deserialize)]
struct ImageSource<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    media_type: Option<Text<'a>>,
    #[serde(borrow)]
    data: Option<Text<'a>>,
    #[serde(borrow)]
    url: Option<Text<'a>>,
}

/// One entry of `tools`.
#[derive(Deserialize)]
struct ToolIn<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    description: Option<Text<'a>>,
    #[serde(borrow)]
    input_schema: Option<&'a RawValue>,
}

/// `tool_choice`.
#[derive(Deserialize)]
struct ToolChoiceIn<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    name: Option<Text<'a>>,
    disable_parallel_tool_use: Option<bool>,
}

/// A message's `content` (or `system`, or a tool result's `content`): a string or blocks.
enum Content<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<&'a RawValue>),
}

/// The chat request written for the engine.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: Cow<'a, str>,
    messages: Vec<ChatMessage<'a>>,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop: Vec<Cow<'a, str>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ChatTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ChatToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
}

/// `stream_options` of a streamed chat request.
#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One chat message; `content: None` is written as `null`.
#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: Option<ChatContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ChatToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<Cow<'a, str>>,
}

impl<'a> ChatMessage<'a> {
    fn new(role: &'static str, content: ChatContent<'a>) -> ChatMessage<'a> {
        ChatMessage {
            role,
            content: Some(content),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A chat message's content: one string, or parts when there are images.
#[derive(Serialize)]
#[serde(untagged)]
enum ChatContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
}

/// A content part of a chat message.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    Text { text: Cow<'a, str> },
    ImageUrl { image_url: ImageUrl<'a> },
}

/// An `image_url` part's object.
#[derive(Serialize)]
struct ImageUrl<'a> {
    url: Cow<'a, str>,
}

/// A tool call of an assistant message in the history.
#[derive(Serialize)]
struct ChatToolCall<'a> {
    id: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CalledFunction<'a>,
}

/// A history tool call's function, its arguments a JSON text in a string.
#[derive(Serialize)]
struct CalledFunction<'a> {
    name: Cow<'a, str>,
    arguments: &'a str,
}

/// A tool offered to the engine.
#[derive(Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

/// An offered tool's function.
#[derive(Serialize)]
struct ChatFunction<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<&'a RawValue>,
}

/// The chat request's `tool_choice`: a mode, or the one function to call.
#[derive(Serialize)]
#[serde(untagged)]
enum ChatToolChoice<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        function: NamedFunction<'a>,
    },
}

/// The function a named `tool_choice` forces.
#[derive(Serialize)]
struct NamedFunction<'a> {
    name: Cow<'a, str>,
}

/// Decodes one raw field, refusing it by `param` when it has the wrong shape.
fn decode<'a, T: Deserialize<'a>>(raw: &'a RawValue, param: &str) -> Result<T, Refusal> {
    serde_json::from_str(raw.get()).map_err(|e| {
        let reason = e.to_string();
        let reason = reason.split(" at line ").next().unwrap_or_default();
        Refusal::new(format!("`{param}` is invalid: {reason}"), Some(param))
    })
}

/// Decodes a field that may be absent (or `null`).
fn decode_opt<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    param: &str,
) -> Result<Option<T>, Refusal> {
    raw.map(|raw| decode(raw, param)).transpose()
}

/// The refusal of a missing field.
fn required(param: &str) -> Refusal {
    Refusal::new(format!("`{param}` is required"), Some(param))
}

/// The refusal of a content block the engine's API has no place for (`param` names the
/// block; the refusal names its `type`).
fn cannot_carry(kind: &str, block: &str) -> Refusal {
    Refusal::new(
        format!("`{kind}` content blocks cannot be carried by the engine's Chat Completions API"),
        Some(&format!("{block}.type")),
    )
}

/// A required string field of a block.
fn string_field<'a>(raw: Option<&'a RawValue>, param: &str) -> Result<Cow<'a, str>, Refusal> {
    let raw = raw.ok_or_else(|| required(param))?;
    Ok(decode::<Text<'a>>(raw, param)?.0)
}

/// The pieces joined with `separator`, borrowed when there is one.
fn join<'a>(pieces: Vec<Cow<'a, str>>, separator: &str) -> Cow<'a, str> {
    if pieces.len() <= 1 {
        return pieces.into_iter().next().unwrap_or_default();
    }
    Cow::Owned(pieces.join(separator))
}

/// A string or a list of blocks.
fn content<'a>(raw: &'a RawValue, param: &str) -> Result<Content<'a>, Refusal> {
    match raw.get().as_bytes().first() {
        Some(b'"') => Ok(Content::Text(decode::<Text<'a>>(raw, param)?.0)),
        Some(b'[') => Ok(Content::Blocks(decode(raw, param)?)),
        _ => Err(Refusal::new(
            format!("`{param}` must be a string or a list of content blocks"),
            Some(param),
        )),
    }
}

/// Content that may hold text only (`system`, a tool result), its blocks joined with a
/// blank line.
fn text_only<'a>(raw: &'a RawValue, param: &str) -> Result<Cow<'a, str>, Refusal> {
    let blocks = match content(raw, param)? {
        Content::Text(text) => return Ok(text),
        Content::Blocks(blocks) => blocks,
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (k, raw) in blocks.iter().enumerate() {
        let item = format!("{param}[{k}]");
        let block: BlockIn<'a> = decode(raw, &item)?;
        if block.kind.0 != "text" {
            return Err(Refusal::new(
                format!(
                    "`{}` blocks cannot be carried in `{param}`: the engine's Chat Completions \
                     API takes text only there",
                    block.kind.0
                ),
                Some(&format!("{item}.type")),
            ));
        }
        texts.push(string_field(block.text, &format!("{item}.text"))?);
    }
    Ok(join(texts, "\n\n"))
}

/// An image block as an `image_url` part: a `data:` URL for base64 data, or the URL.
fn image_part<'a>(source: Option<&'a RawValue>, block: &str) -> Result<Part<'a>, Refusal> {
    let param = format!("{block}.source");
    let source: ImageSource<'a> = decode(source.ok_or_else(|| required(&param))?, &param)?;
    let url = match &*source.kind.0 {
        "base64" => {
            let media = source
                .media_type
                .ok_or_else(|| required(&format!("{param}.media_type")));
            let data = source
                .data
                .ok_or_else(|| required(&format!("{param}.data")));
            Cow::Owned(format!("data:{};base64,{}", media?.0, data?.0))
        }
        "url" => {
            source
                .url
                .ok_or_else(|| required(&format!("{param}.url")))?
                .0
        }
        other => {
            return Err(Refusal::new(
                format!("image sources of type `{other}` cannot be carried by the engine's API"),
                Some(&format!("{param}.type")),
            ))
        }
    };
    Ok(Part::ImageUrl {
        image_url: ImageUrl { url },
    })
}

/// A user message's content parts as one string when all are text, else as parts.
fn user_content(parts: Vec<Part<'_>>) -> ChatContent<'_> {
    if !parts.iter().all(|p| matches!(p, Part::Text { .. })) {
        return ChatContent::Parts(parts);
    }
    let texts = parts
        .into_iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text),
            Part::ImageUrl { .. } => None,
        })
        .collect();
    ChatContent::Text(join(texts, ""))
}

/// A user message: its tool results as `tool` messages first, then the rest of it as a
/// user message (when there is a rest, or nothing else).
fn user_message<'a>(
    content: Content<'a>,
    param: &str,
    into: &mut Vec<ChatMessage<'a>>,
) -> Result<(), Refusal> {
    let blocks = match content {
        Content::Text(text) => {
            into.push(ChatMessage::new("user", ChatContent::Text(text)));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut tool_results = 0;
    for (j, raw) in blocks.iter().enumerate() {
        let item = format!("{param}.content[{j}]");
        let block: BlockIn<'a> = decode(raw, &item)?;
        match &*block.kind.0 {
            "text" => parts.push(Part::Text {
                text: string_field(block.text, &format!("{item}.text"))?,
            }),
            "image" => parts.push(image_part(block.source, &item)?),
            "tool_result" => {
                let id = string_field(block.tool_use_id, &format!("{item}.tool_use_id"))?;
                let text = match block.content {
                    Some(raw) => text_only(raw, &format!("{item}.content"))?,
                    None => Cow::Borrowed(""),
                };
                let mut tool = ChatMessage::new("tool", ChatContent::Text(text));
                tool.tool_call_id = Some(id);
                into.push(tool);
                tool_results += 1;
            }
            other => return Err(cannot_carry(other, &item)),
        }
    }
    if !parts.is_empty() || tool_results == 0 {
        into.push(ChatMessage::new("user", user_content(parts)));
    }
    Ok(())
}

/// An assistant message: its text as `content` (`null` beside tool calls and no text), its
/// `tool_use` blocks as `tool_calls`; thinking blocks dropped.
fn assistant_message<'a>(content: Content<'a>, param: &str) -> Result<ChatMessage<'a>, Refusal> {
    let blocks = match content {
        Content::Text(text) => return Ok(ChatMessage::new("assistant", ChatContent::Text(text))),
        Content::Blocks(blocks) => blocks,
    };
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for (j, raw) in blocks.iter().enumerate() {
        let item = format!("{param}.content[{j}]");
        let block: BlockIn<'a> = decode(raw, &item)?;
        match &*block.kind.0 {
            "text" => texts.push(string_field(block.text, &format!("{item}.text"))?),
            "tool_use" => tool_calls.push(ChatToolCall {
                id: string_field(block.id, &format!("{item}.id"))?,
                kind: "function",
                function: CalledFunction {
                    name: string_field(block.name, &format!("{item}.name"))?,
                    arguments: block.input.map_or("{}", RawValue::get),
                },
            }),
            "thinking" | "redacted_thinking" => {}
            other => return Err(cannot_carry(other, &item)),
        }
    }
    let content = if texts.is_empty() && !tool_calls.is_empty() {
        None
    } else {
        Some(ChatContent::Text(join(texts, "")))
    };
    Ok(ChatMessage {
        role: "assistant",
        content,
        tool_calls,
        tool_call_id: None,
    })
}

/// The chat messages: the system prompt (when not empty), then each message's translation.
fn chat_messages<'a>(
    system: Option<&'a RawValue>,
    messages: Option<&'a RawValue>,
) -> Result<Vec<ChatMessage<'a>>, Refusal> {
    let raw_messages: Vec<&'a RawValue> =
        decode_opt(messages, "messages")?.ok_or_else(|| required("messages"))?;
    let mut chat = Vec::with_capacity(raw_messages.len() + 1);
    if let Some(system) = system {
        let text = text_only(system, "system")?;
        if !text.is_empty() {
            chat.push(ChatMessage::new("system", ChatContent::Text(text)));
        }
    }
    for (i, raw) in raw_messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        let message: MessageIn<'a> = decode(raw, &param)?;
        let content = content(message.content, &format!("{param}.content"))?;
        match &*message.role.0 {
            "user" => user_message(content, &param, &mut chat)?,
            "assistant" => chat.push(assistant_message(content, &param)?),
            _ => {
                return Err(Refusal::new(
                    format!("`{param}.role` must be \"user\" or \"assistant\""),
                    Some(&format!("{param}.role")),
                ))
            }
        }
    }
    Ok(chat)
}

/// The offered tools as functions; server tools (a `type` other than `custom`) and MCP
/// servers are refused, as the engine cannot run them.
fn chat_tools<'a>(
    tools: Option<&'a RawValue>,
    mcp_servers: Option<&'a RawValue>,
) -> Result<Vec<ChatTool<'a>>, Refusal> {
    let servers: Vec<&RawValue> = decode_opt(mcp_servers, "mcp_servers")?.unwrap_or_default();
    if !servers.is_empty() {
        return Err(Refusal::new(
            "MCP servers cannot be reached through the engine's Chat Completions API",
            Some("mcp_servers"),
        ));
    }
    let raw_tools: Vec<&'a RawValue> = decode_opt(tools, "tools")?.unwrap_or_default();
    let mut chat = Vec::with_capacity(raw_tools.len());
    for (k, raw) in raw_tools.iter().enumerate() {
        let param = format!("tools[{k}]");
        let tool: ToolIn<'a> = decode(raw, &param)?;
        if let Some(kind) = tool.kind.as_ref().filter(|kind| kind.0 != "custom") {
            return Err(Refusal::new(
                format!(
                    "the server tool `{}` cannot be run by the engine behind the Chat \
                     Completions API",
                    kind.0
                ),
                Some(&format!("{param}.type")),
            ));
        }
        let name = tool
            .name
            .ok_or_else(|| required(&format!("{param}.name")))?;
        chat.push(ChatTool {
            kind: "function",
            function: ChatFunction {
                name: name.0,
                description: tool.description.map(|d| d.0),
                parameters: tool.input_schema,
            },
        });
    }
    Ok(chat)
}

/// `tool_choice` and `parallel_tool_calls`.
fn chat_tool_choice(
    raw: Option<&RawValue>,
) -> Result<(Option<ChatToolChoice<'_>>, Option<bool>), Refusal> {
    let Some(choice) = decode_opt::<ToolChoiceIn<'_>>(raw, "tool_choice")? else {
        return Ok((None, None));
    };
    let chat = match &*choice.kind.0 {
        "auto" => ChatToolChoice::Mode("auto"),
        "any" => ChatToolChoice::Mode("required"),
        "none" => ChatToolChoice::Mode("none"),
        "tool" => ChatToolChoice::Function {
            kind: "function",
            function: NamedFunction {
                name: choice.name.ok_or_else(|| required("tool_choice.name"))?.0,
            },
        },
        other => {
            return Err(Refusal::new(
                format!("`tool_choice` of type `{other}` is not one the Messages API has"),
                Some("tool_choice.type"),
            ))
        }
    };
    let parallel = (choice.disable_parallel_tool_use == Some(true)).then_some(false);
    Ok((Some(chat), parallel))
}

/// The body's fields, when it is a JSON object.
fn body_fields(body: &[u8]) -> Result<MessagesBody<'_>, Refusal> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(Refusal::new("the body is not a JSON object", None));
    }
    serde_json::from_slice(body)
        .map_err(|e| Refusal::new(format!("the body is not valid JSON: {e}"), None))
}

/// Writes the client's Messages `body` as a Chat Completions request into `out`, with the
/// model named `model` when given. `tool_choice` is dropped when no tool is offered (engines
/// refuse it alone); a final assistant message is sent as history, not as a prefill.
pub fn request(body: &[u8], model: Option<&str>, out: &mut Vec<u8>) -> Result<Asked, Refusal> {
    let fields = body_fields(body)?;
    let client_model: Option<Text<'_>> = decode_opt(fields.model, "model")?;
    let engine_model = match (model, &client_model) {
        (Some(name), _) => Cow::Borrowed(name),
        (None, Some(name)) => name.0.clone(),
        (None, None) => return Err(required("model")),
    };
    let max_tokens: u64 =
        decode_opt(fields.max_tokens, "max_tokens")?.ok_or_else(|| required("max_tokens"))?;
    let stream: bool = decode_opt(fields.stream, "stream")?.unwrap_or(false);
    let stop: Vec<Text<'_>> =
        decode_opt(fields.stop_sequences, "stop_sequences")?.unwrap_or_default();
    let metadata: Option<Metadata<'_>> = decode_opt(fields.metadata, "metadata")?;
    let messages = chat_messages(fields.system, fields.messages)?;
    let tools = chat_tools(fields.tools, fields.mcp_servers)?;
    let (tool_choice, parallel_tool_calls) = match chat_tool_choice(fields.tool_choice)? {
        _ if tools.is_empty() => (None, None),
        choice => choice,
    };
    let chat = ChatRequest {
        model: engine_model.clone(),
        messages,
        max_tokens,
        temperature: decode_opt(fields.temperature, "temperature")?,
        top_p: decode_opt(fields.top_p, "top_p")?,
        top_k: decode_opt(fields.top_k, "top_k")?,
        stop: stop.iter().map(|s| s.0.clone()).collect(),
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        user: metadata.and_then(|m| m.user_id).map(|u| u.0),
        tools,
        tool_choice,
        parallel_tool_calls,
    };
    let start = out.len();
    if serde_json::to_writer(&mut *out, &chat).is_err() {
        out.truncate(start);
        return Err(Refusal::new("the request could not be written", None));
    }
    Ok(Asked {
        model: client_model.map_or(engine_model, |m| m.0).into_owned(),
        stream,
        stop_sequences: stop.into_iter().map(|s| s.0.into_owned()).collect(),
        ..Asked::default()
    })
}

/// An engine's chat completion.
#[derive(Deserialize)]
struct Completion<'a> {
    #[serde(borrow)]
    choices: Vec<CompletionChoice<'a>>,
    usage: Option<UsageIn>,
}

/// A completion's choice.
#[derive(Deserialize)]
struct CompletionChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow)]
    message: AnswerMessage<'a>,
    #[serde(borrow)]
    finish_reason: Option<Text<'a>>,
    /// vLLM's: the stop string matched (or the stop token's id).
    stop_reason: Option<Value>,
}

/// A completion's message, or a chunk's delta.
#[derive(Deserialize)]
struct AnswerMessage<'a> {
    #[serde(borrow)]
    content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCallIn<'a>>>,
}

impl AnswerMessage<'_> {
    /// The reasoning text, when there is some.
    fn reasoning(&self) -> Option<&str> {
        [&self.reasoning_content, &self.reasoning]
            .into_iter()
            .flatten()
            .map(|t| &*t.0)
            .find(|t| !t.is_empty())
    }

    /// The answer text, when there is some.
    fn text(&self) -> Option<&str> {
        self.content
            .as_ref()
            .map(|t| &*t.0)
            .filter(|t| !t.is_empty())
    }
}

/// A tool call of an answer (whole, or a streamed piece with its `index`).
#[derive(Deserialize)]
struct ToolCallIn<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    id: Option<Text<'a>>,
    #[serde(borrow)]
    function: Option<FunctionIn<'a>>,
}

impl<'a> ToolCallIn<'a> {
    fn name(&self) -> Option<&str> {
        self.function.as_ref()?.name.as_ref().map(|n| &*n.0)
    }

    /// The arguments' text: a JSON string's content, or a JSON object some engines send.
    fn arguments(&self) -> Option<Cow<'a, str>> {
        let raw = self.function.as_ref()?.arguments?;
        if raw.get().starts_with('"') {
            serde_json::from_str::<Text<'a>>(raw.get())
                .ok()
                .map(|t| t.0)
        } else {
            Some(Cow::Borrowed(raw.get()))
        }
    }
}

/// A tool call's function.
#[derive(Deserialize)]
struct FunctionIn<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// An engine's token counts.
#[derive(Debug, Clone, Copy, Deserialize)]
struct UsageIn {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

/// One streamed chunk (or an error sent in its place).
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    usage: Option<UsageIn>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    object: Option<Text<'a>>,
}

/// A chunk's choice.
#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow)]
    delta: Option<AnswerMessage<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Text<'a>>,
    stop_reason: Option<Value>,
}

/// A Messages answer (whole, or empty in `message_start`).
#[derive(Serialize)]
struct MessageOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<BlockOut<'a>>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<&'a str>,
    usage: UsageOut,
}

/// A content block of the answer.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockOut<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        #[serde(serialize_with = "object_or_empty")]
        input: Option<&'a RawValue>,
    },
}

/// A tool's input, `{}` when there is none.
fn object_or_empty<S: Serializer>(input: &Option<&RawValue>, s: S) -> Result<S::Ok, S::Error> {
    match input {
        Some(raw) => raw.serialize(s),
        None => s.serialize_map(Some(0))?.end(),
    }
}

/// The answer's token counts.
#[derive(Serialize)]
struct UsageOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<u64>,
    output_tokens: u64,
}

impl UsageOut {
    /// The engine's counts, the cached prompt tokens apart; `input_tokens` is 0 when
    /// unknown and `always_input`, else left out.
    fn of(usage: Option<UsageIn>, always_input: bool) -> UsageOut {
        let cached = usage
            .and_then(|u| u.prompt_tokens_details)
            .and_then(|d| d.cached_tokens);
        let prompt = usage.and_then(|u| u.prompt_tokens);
        let input = prompt.map(|p| p.saturating_sub(cached.unwrap_or(0)));
        UsageOut {
            input_tokens: if always_input {
                Some(input.unwrap_or(0))
            } else {
                input
            },
            cache_read_input_tokens: cached,
            output_tokens: usage.and_then(|u| u.completion_tokens).unwrap_or(0),
        }
    }
}

/// A streamed event (and, as `Error`, the error body too).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum EventOut<'a> {
    MessageStart {
        message: MessageOut<'a>,
    },
    ContentBlockStart {
        index: u32,
        content_block: BlockOut<'a>,
    },
    ContentBlockDelta {
        index: u32,
        delta: DeltaOut<'a>,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: StopOut<'a>,
        usage: UsageOut,
    },
    MessageStop,
    Error {
        error: ErrorOut<'a>,
    },
}

impl EventOut<'_> {
    /// The event's name, the same as its `type`.
    fn name(&self) -> &'static str {
        match self {
            EventOut::MessageStart { .. } => "message_start",
            EventOut::ContentBlockStart { .. } => "content_block_start",
            EventOut::ContentBlockDelta { .. } => "content_block_delta",
            EventOut::ContentBlockStop { .. } => "content_block_stop",
            EventOut::MessageDelta { .. } => "message_delta",
            EventOut::MessageStop => "message_stop",
            EventOut::Error { .. } => "error",
        }
    }
}

/// A content block's delta.
#[derive(Serialize)]
#[serde(tag = "type")]
enum DeltaOut<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// `message_delta`'s delta.
#[derive(Serialize)]
struct StopOut<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

/// An error's object.
#[derive(Serialize)]
struct ErrorOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// Appends `event` as a complete server-sent event, or nothing when it cannot be written.
fn write_event(out: &mut Vec<u8>, event: &EventOut<'_>) {
    let start = out.len();
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.name().as_bytes());
    out.extend_from_slice(b"\ndata: ");
    if serde_json::to_writer(&mut *out, event).is_err() {
        out.truncate(start);
        return;
    }
    out.extend_from_slice(b"\n\n");
}

/// Anthropic's `stop_reason` (and the stop sequence met) for a chat `finish_reason`, the
/// string vLLM names in `stop_reason`, and whether the answer called tools.
fn stop_reason<'a>(
    finish: Option<&str>,
    stop_string: Option<&'a str>,
    tool_calls: bool,
) -> (&'static str, Option<&'a str>) {
    match finish {
        Some("length") => ("max_tokens", None),
        Some("content_filter") => ("refusal", None),
        _ if tool_calls => ("tool_use", None),
        Some("tool_calls" | "function_call") => ("tool_use", None),
        Some("stop") if stop_string.is_some() => ("stop_sequence", stop_string),
        _ => ("end_turn", None),
    }
}

/// The string of a choice's vLLM `stop_reason` (a token id is not a stop sequence).
fn stop_string(stop_reason: Option<&Value>) -> Option<&str> {
    stop_reason.and_then(Value::as_str)
}

/// A tool call's arguments as the `tool_use` input: a JSON object, or `None` (`{}`) when
/// they are not one.
fn tool_input(arguments: Option<Cow<'_, str>>) -> Option<Box<RawValue>> {
    let arguments = arguments?;
    let input: Box<RawValue> = serde_json::from_str(arguments.trim()).ok()?;
    input.get().starts_with('{').then_some(input)
}

/// `text` cut to [`MESSAGE_LIMIT`] characters.
fn limited(mut text: String) -> String {
    if let Some((end, _)) = text.char_indices().nth(MESSAGE_LIMIT) {
        text.truncate(end);
    }
    text
}

/// The message and status code an engine's error JSON holds, in the shapes engines use:
/// OpenAI's `{"error":{"message","code"}}`, TGI's `{"error":"..."}`, FastAPI's `detail`
/// (a string, or JSON written as text), a bare `message` (old vLLM stream errors).
fn engine_error(value: &Value) -> (Option<String>, Option<u64>) {
    let error = value.get("error");
    let code = error
        .and_then(|e| e.get("code"))
        .or_else(|| value.get("code"))
        .and_then(Value::as_u64);
    let message = match error {
        Some(Value::String(text)) => Some(text.clone()),
        Some(error) => error
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string),
        None => None,
    }
    .or_else(|| match value.get("detail") {
        Some(Value::String(text)) => Some(text.clone()),
        None | Some(Value::Null) => None,
        Some(detail) => Some(detail.to_string()),
    })
    .or_else(|| {
        value
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
    })
    .filter(|m| !m.trim().is_empty());
    (message.map(limited), code)
}

/// The message of an error body or event: the engine's own, or its text, or `fallback`.
fn error_message(text: &str, fallback: impl FnOnce() -> String) -> (String, Option<u64>) {
    let (message, code) = serde_json::from_str::<Value>(text)
        .map(|v| engine_error(&v))
        .unwrap_or((None, None));
    let message = message
        .or_else(|| {
            Some(text.trim())
                .filter(|t| !t.is_empty())
                .map(str::to_string)
        })
        .map_or_else(fallback, limited);
    (message, code)
}

/// The stream's open content block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    /// A tool call, by the engine's tool index.
    Tool(u64),
}

/// A tool call seen in the stream.
#[derive(Debug)]
struct StreamedTool {
    engine_index: u64,
    id: String,
    block: u32,
}

/// The `finish_reason` sent, with vLLM's stop string.
#[derive(Debug)]
struct Finish {
    reason: String,
    stop_string: Option<String>,
}

/// What the translation knows of the request and of the answer so far.
#[derive(Debug)]
struct Translation {
    asked: Asked,
    message_id: String,
    started: bool,
    ended: bool,
    open: Option<(Open, u32)>,
    blocks: u32,
    tools: Vec<StreamedTool>,
    finish: Option<Finish>,
    usage: Option<UsageIn>,
}

/// The translation of one engine answer into the client's Messages answer.
#[derive(Debug)]
pub struct Reply {
    splitter: SseSplitter,
    translation: Translation,
}

impl Reply {
    /// The translation of the answer to the request `asked` describes.
    pub fn new(asked: Asked) -> Reply {
        Reply {
            splitter: SseSplitter::default(),
            translation: Translation {
                message_id: format!("msg_{}", asked.id_seed),
                asked,
                started: false,
                ended: false,
                open: None,
                blocks: 0,
                tools: Vec::new(),
                finish: None,
                usage: None,
            },
        }
    }

    /// Writes a whole answer with `status` as a Messages answer: a completion as a message,
    /// any other status's body (of any shape) as Anthropic's error body, its type by status.
    /// `Err` (nothing written) when a 2xx body is not a chat completion.
    // The unit error is the translation interface's (`super::Reply::whole`): the caller
    // answers 502 whatever the reason.
    pub fn whole(&mut self, status: u16, body: &[u8], out: &mut Vec<u8>) -> Result<(), NotTheApi> {
        if !(200..300).contains(&status) {
            let text = String::from_utf8_lossy(body);
            let (message, _) = error_message(&text, || format!("the engine answered {status}"));
            let error = EventOut::Error {
                error: ErrorOut {
                    kind: anthropic_type(status),
                    message: &message,
                },
            };
            let start = out.len();
            if serde_json::to_writer(&mut *out, &error).is_err() {
                out.truncate(start);
            }
            return Ok(());
        }
        self.translation.whole_message(body, out)
    }

    /// Translates the next bytes of the engine's chunk stream (split anywhere) into Messages
    /// events appended to `out`. Nothing is written after the stream's end or an error.
    /// The engine's stream held an event too large to be one (`SseSplitter::overflowed`).
    pub fn overflowed(&self) -> bool {
        self.splitter.overflowed()
    }

    pub fn events(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let Reply {
            splitter,
            translation,
        } = self;
        if translation.ended {
            return;
        }
        splitter.feed(data, |event| translation.event(event, out));
    }

    /// The engine's body ended: `true` when its end was translated already, or when it sent
    /// a `finish_reason` but no `[DONE]` (the closing events are written then); `false` when
    /// the stream was cut. An event missing only its blank line is taken as complete.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> bool {
        if self.splitter.holds_partial() {
            self.events(b"\n\n", out);
        }
        let translation = &mut self.translation;
        if translation.ended {
            return true;
        }
        if translation.finish.is_some() {
            translation.close(out);
            return true;
        }
        false
    }

    /// Responses' `sequence_number`: a Messages stream has none.
    pub fn sequence(&self) -> Option<u64> {
        None
    }
}

impl Translation {
    /// A completion written as a message.
    fn whole_message(&self, body: &[u8], out: &mut Vec<u8>) -> Result<(), NotTheApi> {
        let completion: Completion<'_> = serde_json::from_slice(body).map_err(|_| NotTheApi)?;
        let choices = &completion.choices;
        let choice = choices
            .iter()
            .find(|c| c.index == 0)
            .or(choices.first())
            .ok_or(NotTheApi)?;
        let message = &choice.message;
        let calls = message.tool_calls.as_deref().unwrap_or_default();
        let inputs: Vec<_> = calls.iter().map(|c| tool_input(c.arguments())).collect();
        let ids: Vec<Cow<'_, str>> = calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                c.id.as_ref()
                    .map_or_else(|| self.made_tool_id(k).into(), |id| id.0.clone())
            })
            .collect();
        let mut content = Vec::with_capacity(calls.len() + 2);
        if let Some(thinking) = message.reasoning() {
            content.push(BlockOut::Thinking {
                thinking,
                signature: "",
            });
        }
        if let Some(text) = message.text() {
            content.push(BlockOut::Text { text });
        }
        for ((call, id), input) in calls.iter().zip(&ids).zip(&inputs) {
            content.push(BlockOut::ToolUse {
                id,
                name: call.name().unwrap_or_default(),
                input: input.as_deref(),
            });
        }
        let finish = choice.finish_reason.as_ref().map(|f| &*f.0);
        let stop = stop_string(choice.stop_reason.as_ref());
        let (stop_reason, stop_sequence) = stop_reason(finish, stop, !calls.is_empty());
        let answer = MessageOut {
            id: &self.message_id,
            kind: "message",
            role: "assistant",
            model: &self.asked.model,
            content,
            stop_reason: Some(stop_reason),
            stop_sequence,
            usage: UsageOut::of(completion.usage, true),
        };
        let start = out.len();
        serde_json::to_writer(&mut *out, &answer).map_err(|_| {
            out.truncate(start);
            NotTheApi
        })
    }

    /// The id of the `k`th tool call when the engine gave it none.
    fn made_tool_id(&self, k: usize) -> String {
        format!("call_{}_{k}", self.asked.id_seed)
    }

    /// One engine event.
    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        let data = event.data.trim();
        match event.name {
            "error" => return self.fail(data, out),
            "" | "message" => {}
            _ => return,
        }
        if data == "[DONE]" {
            return self.close(out);
        }
        if data.is_empty() {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Chunk<'_>>(data) else {
            return self.fail_with(
                "api_error",
                "the engine sent an event that is not a chat completion chunk",
                out,
            );
        };
        if chunk.error.is_some() || chunk.object.as_ref().is_some_and(|o| o.0 == "error") {
            return self.fail(data, out);
        }
        self.chunk(chunk, out);
    }

    /// A chunk: its usage and finish remembered, its deltas written.
    fn chunk(&mut self, chunk: Chunk<'_>, out: &mut Vec<u8>) {
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        if !self.started {
            self.start(out);
        }
        for choice in chunk.choices.iter().flatten().filter(|c| c.index == 0) {
            if let Some(delta) = &choice.delta {
                if let Some(thinking) = delta.reasoning() {
                    self.open_as(Open::Thinking, out);
                    self.delta(DeltaOut::Thinking { thinking }, out);
                }
                if let Some(text) = delta.text() {
                    self.open_as(Open::Text, out);
                    self.delta(DeltaOut::Text { text }, out);
                }
                for call in delta.tool_calls.iter().flatten() {
                    self.tool_call(call, out);
                }
            }
            if let Some(reason) = &choice.finish_reason {
                self.finish = Some(Finish {
                    reason: reason.0.to_string(),
                    stop_string: stop_string(choice.stop_reason.as_ref()).map(str::to_string),
                });
            }
        }
    }

    /// `message_start`, with the prompt's tokens when already known.
    fn start(&mut self, out: &mut Vec<u8>) {
        let message = MessageOut {
            id: &self.message_id,
            kind: "message",
            role: "assistant",
            model: &self.asked.model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: UsageOut {
                output_tokens: 0,
                ..UsageOut::of(self.usage, true)
            },
        };
        write_event(out, &EventOut::MessageStart { message });
        self.started = true;
    }

    /// Makes a thinking or text block the open one, closing another first.
    fn open_as(&mut self, kind: Open, out: &mut Vec<u8>) {
        if self.open.is_some_and(|(open, _)| open == kind) {
            return;
        }
        let block = match kind {
            Open::Thinking => BlockOut::Thinking {
                thinking: "",
                signature: "",
            },
            _ => BlockOut::Text { text: "" },
        };
        self.open_block(kind, block, out);
    }

    /// Closes the open block and opens `block` at the next index, which it returns.
    fn open_block(&mut self, kind: Open, block: BlockOut<'_>, out: &mut Vec<u8>) -> u32 {
        self.close_block(out);
        let index = self.blocks;
        self.blocks += 1;
        let start = EventOut::ContentBlockStart {
            index,
            content_block: block,
        };
        write_event(out, &start);
        self.open = Some((kind, index));
        index
    }

    /// `content_block_stop` for the open block, if one is.
    fn close_block(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            write_event(out, &EventOut::ContentBlockStop { index });
        }
    }

    /// A delta for the open block.
    fn delta(&mut self, delta: DeltaOut<'_>, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open {
            write_event(out, &EventOut::ContentBlockDelta { index, delta });
        }
    }

    /// A streamed piece of a tool call: a new call opens its `tool_use` block; argument
    /// pieces go to the call's block (even one closed since, should an engine interleave
    /// calls: the SDKs gather deltas by index).
    fn tool_call(&mut self, call: &ToolCallIn<'_>, out: &mut Vec<u8>) {
        let engine_index = call.index.unwrap_or_else(|| self.unindexed(call));
        let block = match self.tools.iter().find(|t| t.engine_index == engine_index) {
            Some(tool) => tool.block,
            None => {
                let id = call.id.as_ref().map_or_else(
                    || self.made_tool_id(self.tools.len()),
                    |id| id.0.to_string(),
                );
                let start = BlockOut::ToolUse {
                    id: &id,
                    name: call.name().unwrap_or_default(),
                    input: None,
                };
                let block = self.open_block(Open::Tool(engine_index), start, out);
                self.tools.push(StreamedTool {
                    engine_index,
                    id,
                    block,
                });
                block
            }
        };
        if let Some(partial_json) = call.arguments().filter(|a| !a.is_empty()) {
            let delta = DeltaOut::InputJson {
                partial_json: &partial_json,
            };
            write_event(
                out,
                &EventOut::ContentBlockDelta {
                    index: block,
                    delta,
                },
            );
        }
    }

    /// The index of a tool call piece an engine sent without one: a new call when it
    /// brings a new id, else the last call.
    fn unindexed(&self, call: &ToolCallIn<'_>) -> u64 {
        let last = self.tools.last();
        match (&call.id, last) {
            (Some(id), Some(last)) if id.0 == last.id => last.engine_index,
            (None, Some(last)) => last.engine_index,
            (_, None) => 0,
            (Some(_), Some(_)) => self
                .tools
                .iter()
                .map(|t| t.engine_index + 1)
                .max()
                .unwrap_or(0),
        }
    }

    /// The end of the answer: the open block closed, `message_delta`, `message_stop`.
    fn close(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.start(out);
        }
        self.close_block(out);
        let finish = self.finish.as_ref();
        let (stop_reason, stop_sequence) = stop_reason(
            finish.map(|f| f.reason.as_str()),
            finish.and_then(|f| f.stop_string.as_deref()),
            !self.tools.is_empty(),
        );
        let delta = EventOut::MessageDelta {
            delta: StopOut {
                stop_reason,
                stop_sequence,
            },
            usage: UsageOut::of(self.usage, false),
        };
        write_event(out, &delta);
        write_event(out, &EventOut::MessageStop);
        self.ended = true;
    }

    /// An engine error event (`data`) as the client's error event, which ends the stream.
    fn fail(&mut self, data: &str, out: &mut Vec<u8>) {
        let (message, code) = error_message(data, || "the engine reported an error".to_string());
        let kind = code
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| (400..600).contains(c))
            .map_or("api_error", anthropic_type);
        self.fail_with(kind, &message, out);
    }

    /// The client's error event, which ends the stream.
    fn fail_with(&mut self, kind: &'static str, message: &str, out: &mut Vec<u8>) {
        let error = EventOut::Error {
            error: ErrorOut { kind, message },
        };
        write_event(out, &error);
        self.ended = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn translate(body: &Value, model: Option<&str>) -> Result<(Value, Asked), Refusal> {
        let mut out = Vec::new();
        let asked = request(body.to_string().as_bytes(), model, &mut out)?;
        Ok((
            serde_json::from_slice(&out).expect("the request is JSON"),
            asked,
        ))
    }

    fn chat(body: Value) -> Value {
        translate(&body, None).expect("translated").0
    }

    fn refused(body: Value) -> Refusal {
        translate(&body, None).expect_err("refused")
    }

    fn with_messages(messages: Value) -> Value {
        json!({"model": "m", "max_tokens": 10, "messages": messages})
    }

    fn asked() -> Asked {
        Asked {
            model: "claude-x".into(),
            stream: true,
            id_seed: "abc".into(),
            ..Asked::default()
        }
    }

    fn whole(status: u16, body: &[u8]) -> Value {
        let mut out = Vec::new();
        Reply::new(asked())
            .whole(status, body, &mut out)
            .expect("translated");
        serde_json::from_slice(&out).expect("the answer is JSON")
    }

    /// The events written, each checked to be `event: T` with JSON data of `type` T.
    fn parse_events(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).expect("UTF-8");
        assert!(
            text.is_empty() || text.ends_with("\n\n"),
            "complete events: {text}"
        );
        text.split_terminator("\n\n")
            .map(|event| {
                let (name, data) = event
                    .strip_prefix("event: ")
                    .and_then(|e| e.split_once("\ndata: "))
                    .unwrap_or_else(|| panic!("bad event {event:?}"));
                let value: Value = serde_json::from_str(data).expect("event data is JSON");
                assert_eq!(value["type"], name, "{event}");
                value
            })
            .collect()
    }

    fn sse(chunks: &[Value], done: bool) -> Vec<u8> {
        let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        if done {
            s.push_str("data: [DONE]\n\n");
        }
        s.into_bytes()
    }

    fn stream_in_pieces(input: &[u8], cuts: &[usize]) -> (Vec<u8>, bool) {
        let mut reply = Reply::new(asked());
        let mut out = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([input.len()].iter()) {
            reply.events(&input[from..cut], &mut out);
            from = cut;
        }
        let finished = reply.finish(&mut out);
        (out, finished)
    }

    fn stream(input: &[u8]) -> Vec<Value> {
        let (out, finished) = stream_in_pieces(input, &[]);
        assert!(finished);
        parse_events(&out)
    }

    fn chunk(delta: Value, finish: Option<&str>) -> Value {
        json!({"id": "c", "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    /// The message a client SDK gathers from the events.
    fn assemble(events: &[Value]) -> Value {
        let mut message = events[0]["message"].clone();
        let mut json_parts: Vec<String> = Vec::new();
        for event in &events[1..] {
            let index = event["index"].as_u64().map(|i| i as usize);
            match event["type"].as_str().unwrap() {
                "content_block_start" => {
                    message["content"]
                        .as_array_mut()
                        .unwrap()
                        .push(event["content_block"].clone());
                    json_parts.push(String::new());
                }
                "content_block_delta" => {
                    let (i, d) = (index.unwrap(), &event["delta"]);
                    let block = &mut message["content"][i];
                    match d["type"].as_str().unwrap() {
                        "text_delta" => {
                            block["text"] = (block["text"].as_str().unwrap().to_string()
                                + d["text"].as_str().unwrap())
                            .into()
                        }
                        "thinking_delta" => {
                            block["thinking"] = (block["thinking"].as_str().unwrap().to_string()
                                + d["thinking"].as_str().unwrap())
                            .into()
                        }
                        _ => json_parts[i].push_str(d["partial_json"].as_str().unwrap()),
                    }
                }
                "content_block_stop" => {
                    let i = index.unwrap();
                    if !json_parts[i].is_empty() {
                        message["content"][i]["input"] =
                            serde_json::from_str(&json_parts[i]).unwrap();
                    }
                }
                "message_delta" => {
                    message["stop_reason"] = event["delta"]["stop_reason"].clone();
                    message["stop_sequence"] = event["delta"]["stop_sequence"].clone();
                    for (k, v) in event["usage"].as_object().unwrap() {
                        message["usage"][k] = v.clone();
                    }
                }
                _ => {}
            }
        }
        message
    }

    #[test]
    fn sampling_fields_stop_sequences_and_metadata_are_mapped() {
        let body = json!({
            "model": "claude-x", "max_tokens": 256, "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "stop_sequences": ["END", "\n\nHuman:"], "stream": false,
            "metadata": {"user_id": "u-1"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "hi"}]
        });
        let (chat, asked) = translate(&body, Some("qwen3")).unwrap();
        assert_eq!(
            chat,
            json!({
                "model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 256, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
                "stop": ["END", "\n\nHuman:"], "stream": false, "user": "u-1"
            })
        );
        assert_eq!(asked.model, "claude-x");
        assert!(!asked.stream);
        assert_eq!(asked.stop_sequences, ["END", "\n\nHuman:"]);
    }

    #[test]
    fn a_stream_asks_for_usage_and_the_model_is_kept_when_not_mapped() {
        let mut body = with_messages(json!([{"role": "user", "content": "hi"}]));
        body["stream"] = json!(true);
        let (chat, asked) = translate(&body, None).unwrap();
        assert_eq!(
            chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 10, "stream": true, "stream_options": {"include_usage": true}})
        );
        assert!(asked.stream);
        assert_eq!(asked.model, "m");
    }

    #[test]
    fn system_as_string_and_as_blocks() {
        let mut body = with_messages(json!([{"role": "user", "content": "hi"}]));
        body["system"] = json!("be brief");
        assert_eq!(
            chat(body.clone())["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        body["system"] = json!([
            {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "two"}
        ]);
        assert_eq!(
            chat(body.clone())["messages"],
            json!([{"role": "system", "content": "one\n\ntwo"}, {"role": "user", "content": "hi"}])
        );
        body["system"] = json!("");
        assert_eq!(
            chat(body)["messages"],
            json!([{"role": "user", "content": "hi"}])
        );
    }

    #[test]
    fn text_blocks_join_and_images_become_image_url_parts() {
        let body = with_messages(json!([
            {"role": "user", "content": [
                {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "b"}
            ]},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.jpg"}}
            ]}
        ]));
        assert_eq!(
            chat(body)["messages"],
            json!([
                {"role": "user", "content": "ab"},
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                    {"type": "image_url", "image_url": {"url": "https://x/y.jpg"}}
                ]}
            ])
        );
    }

    #[test]
    fn tool_use_and_tool_results_round_trip_in_order() {
        let body = with_messages(json!([
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris", "unit": "c"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}}
            ]},
            {"role": "user", "content": [
                {"type": "text", "text": "also, thanks"},
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "call_2", "is_error": true,
                 "content": [{"type": "text", "text": "rome: "}, {"type": "text", "text": "timeout"}]}
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_3", "name": "now", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_3"}]}
        ]));
        assert_eq!(
            chat(body)["messages"],
            json!([
                {"role": "user", "content": "weather in Paris and Rome?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"c\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}
                ]},
                {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
                {"role": "tool", "content": "rome: \n\ntimeout", "tool_call_id": "call_2"},
                {"role": "user", "content": "also, thanks"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_3", "type": "function", "function": {"name": "now", "arguments": "{}"}}
                ]},
                {"role": "tool", "content": "", "tool_call_id": "call_3"}
            ])
        );
    }

    #[test]
    fn tools_and_every_tool_choice() {
        let mut body = with_messages(json!([{"role": "user", "content": "hi"}]));
        body["tools"] = json!([
            {"name": "weather", "description": "Weather of a city", "cache_control": {"type": "ephemeral"},
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
            {"type": "custom", "name": "now", "input_schema": {"type": "object"}}
        ]);
        let tools = json!([
            {"type": "function", "function": {"name": "weather", "description": "Weather of a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
        ]);
        assert_eq!(chat(body.clone())["tools"], tools);
        assert!(chat(body.clone()).get("tool_choice").is_none());
        let cases = [
            (json!({"type": "auto"}), json!("auto"), None),
            (json!({"type": "any"}), json!("required"), None),
            (json!({"type": "none"}), json!("none"), None),
            (
                json!({"type": "tool", "name": "weather", "disable_parallel_tool_use": true}),
                json!({"type": "function", "function": {"name": "weather"}}),
                Some(false),
            ),
            (
                json!({"type": "auto", "disable_parallel_tool_use": false}),
                json!("auto"),
                None,
            ),
        ];
        for (choice, want, parallel) in cases {
            body["tool_choice"] = choice;
            let got = chat(body.clone());
            assert_eq!(got["tool_choice"], want);
            assert_eq!(
                got.get("parallel_tool_calls").and_then(Value::as_bool),
                parallel
            );
        }
        body["tools"] = json!([]);
        let got = chat(body);
        assert!(got.get("tools").is_none() && got.get("tool_choice").is_none());
    }

    #[test]
    fn refusals_name_their_param() {
        let doc = json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}});
        let cases = [
            (
                with_messages(
                    json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": [doc]}]),
                ),
                Some("messages[2].content[0].type"),
            ),
            (
                with_messages(json!([{"role": "user", "content": [{"type": "search_result"}]}])),
                Some("messages[0].content[0].type"),
            ),
            (
                with_messages(json!([{"role": "assistant", "content": [{"type": "image",
                "source": {"type": "url", "url": "u"}}]}])),
                Some("messages[0].content[0].type"),
            ),
            (
                with_messages(
                    json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]}]),
                ),
                Some("messages[0].content[0].content[0].type"),
            ),
            (
                with_messages(json!([{"role": "user", "content": [{"type": "image",
                "source": {"type": "file", "file_id": "f"}}]}])),
                Some("messages[0].content[0].source.type"),
            ),
            (
                with_messages(json!([{"role": "system", "content": "x"}])),
                Some("messages[0].role"),
            ),
            (
                with_messages(json!([{"role": "user", "content": 3}])),
                Some("messages[0].content"),
            ),
            (json!({"model": "m", "messages": []}), Some("max_tokens")),
            (
                json!({"model": "m", "max_tokens": "ten", "messages": []}),
                Some("max_tokens"),
            ),
            (json!({"model": "m", "max_tokens": 1}), Some("messages")),
            (
                json!({"model": "m", "max_tokens": 1, "messages": {}}),
                Some("messages"),
            ),
            (json!({"max_tokens": 1, "messages": []}), Some("model")),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [], "system": [{"type": "image"}]}),
                Some("system[0].type"),
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [], "tool_choice": {"type": "tool"}}),
                Some("tool_choice.name"),
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [],
                    "mcp_servers": [{"type": "url", "url": "u", "name": "n"}]}),
                Some("mcp_servers"),
            ),
            (json!([1, 2]), None),
        ];
        for (body, param) in cases {
            assert_eq!(refused(body.clone()).param.as_deref(), param, "{body}");
        }
        let mut body = with_messages(json!([]));
        body["tools"] =
            json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]);
        let refusal = refused(body);
        assert_eq!(refusal.param.as_deref(), Some("tools[0].type"));
        assert!(
            refusal.message.contains("web_search_20250305"),
            "{}",
            refusal.message
        );
        let refusal = refused(with_messages(
            json!([{"role": "user", "content": [doc_block()]}]),
        ));
        assert_eq!(
            refusal.message,
            "`document` content blocks cannot be carried by the engine's Chat Completions API"
        );
        let mut out = Vec::new();
        assert!(request(b"{\"model\": ", None, &mut out).is_err());
        assert!(request(b"", None, &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn tool_inputs_and_schemas_keep_their_key_order() {
        let body = br#"{"model":"m","max_tokens":5,"messages":[
            {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"z":1,"a":{"y":2,"b":3}}}]}],
            "tools":[{"name":"f","input_schema":{"type":"object","properties":{"z":{},"a":{}},"required":["z"]}}]}"#;
        let mut out = Vec::new();
        request(body, None, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(r#""arguments":"{\"z\":1,\"a\":{\"y\":2,\"b\":3}}""#),
            "{text}"
        );
        assert!(
            text.contains(
                r#""parameters":{"type":"object","properties":{"z":{},"a":{}},"required":["z"]}"#
            ),
            "{text}"
        );
        let answer = br#"{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"z\":1,\"a\":2}"}}]},"finish_reason":"tool_calls"}]}"#;
        let mut out = Vec::new();
        Reply::new(asked()).whole(200, answer, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(r#""input":{"z":1,"a":2}"#), "{text}");
    }

    fn doc_block() -> Value {
        json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}})
    }

    fn completion(message: Value, finish: &str, usage: Value) -> Vec<u8> {
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "qwen3",
               "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
        .to_string()
        .into_bytes()
    }

    fn message(content: Value, stop: &str, stop_sequence: Value, usage: Value) -> Value {
        json!({"id": "msg_abc", "type": "message", "role": "assistant", "model": "claude-x",
               "content": content, "stop_reason": stop, "stop_sequence": stop_sequence, "usage": usage})
    }

    #[test]
    fn a_text_completion_becomes_a_message() {
        let body = completion(
            json!({"role": "assistant", "content": "Hello!"}),
            "stop",
            json!({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}),
        );
        assert_eq!(
            whole(200, &body),
            message(
                json!([{"type": "text", "text": "Hello!"}]),
                "end_turn",
                Value::Null,
                json!({"input_tokens": 12, "output_tokens": 3})
            )
        );
        let long = completion(json!({"content": "Hel"}), "length", json!({}));
        assert_eq!(whole(200, &long)["stop_reason"], "max_tokens");
        let filtered = completion(json!({"content": ""}), "content_filter", json!(null));
        assert_eq!(
            whole(200, &filtered),
            message(
                json!([]),
                "refusal",
                Value::Null,
                json!({"input_tokens": 0, "output_tokens": 0})
            )
        );
    }

    #[test]
    fn tool_calls_become_tool_use_blocks() {
        let body = completion(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": ""}},
                {"type": "function", "function": {"name": "bad", "arguments": "{\"cut"}}
            ]}),
            "stop",
            json!({"prompt_tokens": 5, "completion_tokens": 9}),
        );
        assert_eq!(
            whole(200, &body),
            message(
                json!([
                    {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_b", "name": "now", "input": {}},
                    {"type": "tool_use", "id": "call_abc_2", "name": "bad", "input": {}}
                ]),
                "tool_use",
                Value::Null,
                json!({"input_tokens": 5, "output_tokens": 9})
            )
        );
    }

    #[test]
    fn a_stop_sequence_is_named_from_vllms_stop_reason() {
        let body = json!({"choices": [{"index": 0, "message": {"content": "1, 2"}, "finish_reason": "stop",
                                        "stop_reason": "END"}],
                          "usage": {"prompt_tokens": 4, "completion_tokens": 2}});
        let got = whole(200, body.to_string().as_bytes());
        assert_eq!(
            (&got["stop_reason"], &got["stop_sequence"]),
            (&json!("stop_sequence"), &json!("END"))
        );
        let token = json!({"choices": [{"message": {"content": "x"}, "finish_reason": "stop", "stop_reason": 151645}]});
        let got = whole(200, token.to_string().as_bytes());
        assert_eq!(
            (&got["stop_reason"], &got["stop_sequence"]),
            (&json!("end_turn"), &Value::Null)
        );
    }

    #[test]
    fn reasoning_and_cached_tokens() {
        let body = completion(
            json!({"role": "assistant", "reasoning_content": "think", "content": "42"}),
            "stop",
            json!({"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}}),
        );
        assert_eq!(
            whole(200, &body),
            message(
                json!([{"type": "thinking", "thinking": "think", "signature": ""}, {"type": "text", "text": "42"}]),
                "end_turn",
                Value::Null,
                json!({"input_tokens": 36, "cache_read_input_tokens": 64, "output_tokens": 7})
            )
        );
        let newer = completion(
            json!({"reasoning": "r", "reasoning_content": ""}),
            "stop",
            json!({}),
        );
        assert_eq!(
            whole(200, &newer)["content"],
            json!([{"type": "thinking", "thinking": "r", "signature": ""}])
        );
    }

    #[test]
    fn error_bodies_of_every_shape_become_anthropic_errors() {
        let error = |t: &str, m: &str| json!({"type": "error", "error": {"type": t, "message": m}});
        let openai = br#"{"object":"error","error":{"message":"context too long","type":"BadRequestError","code":400}}"#;
        assert_eq!(
            whole(400, openai),
            error("invalid_request_error", "context too long")
        );
        assert_eq!(
            whole(404, br#"{"detail":"Not Found"}"#),
            error("not_found_error", "Not Found")
        );
        assert_eq!(
            whole(
                422,
                br#"{"detail":[{"loc":["body","messages"],"msg":"field required"}]}"#
            ),
            error(
                "invalid_request_error",
                r#"[{"loc":["body","messages"],"msg":"field required"}]"#
            )
        );
        assert_eq!(
            whole(
                429,
                br#"{"error":"Model is overloaded","error_type":"overloaded"}"#
            ),
            error("rate_limit_error", "Model is overloaded")
        );
        assert_eq!(
            whole(500, b"Internal Server Error\n"),
            error("api_error", "Internal Server Error")
        );
        assert_eq!(
            whole(503, b""),
            error("overloaded_error", "the engine answered 503")
        );
        assert_eq!(whole(401, b"{}"), error("authentication_error", "{}"));
        assert_eq!(whole(403, b"no")["error"]["type"], "permission_error");
        assert_eq!(whole(413, b"big")["error"]["type"], "request_too_large");
        assert_eq!(whole(529, b"")["error"]["type"], "overloaded_error");
        assert_eq!(whole(502, b"")["error"]["type"], "api_error");
        assert_eq!(whole(418, b"")["error"]["type"], "invalid_request_error");
        let long = "é".repeat(3000);
        let cut = whole(500, long.as_bytes());
        assert_eq!(
            cut["error"]["message"].as_str().unwrap().chars().count(),
            MESSAGE_LIMIT
        );
    }

    #[test]
    fn a_success_body_that_is_no_completion_is_an_error() {
        let mut out = b"kept".to_vec();
        let mut reply = Reply::new(asked());
        assert_eq!(reply.whole(200, b"<html>", &mut out), Err(NotTheApi));
        assert_eq!(
            reply.whole(200, br#"{"choices":[]}"#, &mut out),
            Err(NotTheApi)
        );
        assert_eq!(
            reply.whole(200, br#"{"object":"list"}"#, &mut out),
            Err(NotTheApi)
        );
        assert_eq!(out, b"kept");
    }

    fn start_event(input_tokens: u64) -> Value {
        json!({"type": "message_start", "message": {"id": "msg_abc", "type": "message", "role": "assistant",
               "model": "claude-x", "content": [], "stop_reason": null, "stop_sequence": null,
               "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})
    }

    fn block_start(index: u32, block: Value) -> Value {
        json!({"type": "content_block_start", "index": index, "content_block": block})
    }

    fn block_delta(index: u32, delta: Value) -> Value {
        json!({"type": "content_block_delta", "index": index, "delta": delta})
    }

    fn block_stop(index: u32) -> Value {
        json!({"type": "content_block_stop", "index": index})
    }

    fn end_events(stop: &str, stop_sequence: Value, usage: Value) -> [Value; 2] {
        [
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": stop_sequence},
                   "usage": usage}),
            json!({"type": "message_stop"}),
        ]
    }

    fn text_stream() -> Vec<u8> {
        let mut last = chunk(json!({"content": "!"}), Some("stop"));
        last["choices"][0]["stop_reason"] = json!("END");
        sse(
            &[
                chunk(json!({"role": "assistant", "content": ""}), None),
                chunk(json!({"content": "Hel"}), None),
                chunk(json!({"content": "lo\n\"é\""}), None),
                last,
                json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
            ],
            true,
        )
    }

    #[test]
    fn a_text_stream_split_anywhere_gives_the_same_events_as_whole() {
        let input = text_stream();
        let events = stream(&input);
        let mut want = vec![
            start_event(0),
            block_start(0, json!({"type": "text", "text": ""})),
            block_delta(0, json!({"type": "text_delta", "text": "Hel"})),
            block_delta(0, json!({"type": "text_delta", "text": "lo\n\"é\""})),
            block_delta(0, json!({"type": "text_delta", "text": "!"})),
            block_stop(0),
        ];
        want.extend(end_events(
            "stop_sequence",
            json!("END"),
            json!({"input_tokens": 9, "output_tokens": 4}),
        ));
        assert_eq!(events, want);
        let (whole_out, _) = stream_in_pieces(&input, &[]);
        for cut in 0..input.len() {
            assert_eq!(
                stream_in_pieces(&input, &[cut]).0,
                whole_out,
                "cut at {cut}"
            );
        }
        let every_byte: Vec<usize> = (1..input.len()).collect();
        assert_eq!(stream_in_pieces(&input, &every_byte).0, whole_out);
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello\n\"é\"!"},
                                        "finish_reason": "stop", "stop_reason": "END"}],
                          "usage": {"prompt_tokens": 9, "completion_tokens": 4}});
        assert_eq!(assemble(&events), whole(200, body.to_string().as_bytes()));
    }

    fn tool_piece(index: u64, id: Option<&str>, name: Option<&str>, arguments: &str) -> Value {
        let mut function = json!({"arguments": arguments});
        if let Some(name) = name {
            function["name"] = json!(name);
        }
        let mut call = json!({"index": index, "function": function});
        if let Some(id) = id {
            call["id"] = json!(id);
            call["type"] = json!("function");
        }
        chunk(json!({"tool_calls": [call]}), None)
    }

    #[test]
    fn a_stream_of_two_tool_calls_in_pieces() {
        let input = sse(
            &[
                chunk(
                    json!({"role": "assistant", "content": "Let me look."}),
                    None,
                ),
                tool_piece(0, Some("call_a"), Some("weather"), ""),
                tool_piece(0, None, None, "{\"city\": "),
                tool_piece(0, None, None, "\"Paris\"}"),
                tool_piece(1, Some("call_b"), Some("now"), "{}"),
                chunk(json!({}), Some("tool_calls")),
                json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 11}}),
            ],
            true,
        );
        let events = stream(&input);
        let mut want = vec![
            start_event(0),
            block_start(0, json!({"type": "text", "text": ""})),
            block_delta(0, json!({"type": "text_delta", "text": "Let me look."})),
            block_stop(0),
            block_start(
                1,
                json!({"type": "tool_use", "id": "call_a", "name": "weather", "input": {}}),
            ),
            block_delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "{\"city\": "}),
            ),
            block_delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "\"Paris\"}"}),
            ),
            block_stop(1),
            block_start(
                2,
                json!({"type": "tool_use", "id": "call_b", "name": "now", "input": {}}),
            ),
            block_delta(2, json!({"type": "input_json_delta", "partial_json": "{}"})),
            block_stop(2),
        ];
        want.extend(end_events(
            "tool_use",
            Value::Null,
            json!({"input_tokens": 20, "output_tokens": 11}),
        ));
        assert_eq!(events, want);
        assert_eq!(
            assemble(&events)["content"],
            json!([
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_b", "name": "now", "input": {}}
            ])
        );
    }

    #[test]
    fn reasoning_then_text_are_two_blocks() {
        let input = sse(
            &[
                chunk(json!({"role": "assistant"}), None),
                chunk(json!({"reasoning_content": "Hmm, "}), None),
                chunk(json!({"reasoning": "two.", "content": null}), None),
                chunk(json!({"content": "2"}), None),
                chunk(json!({"content": ""}), Some("length")),
            ],
            true,
        );
        let mut want = vec![
            start_event(0),
            block_start(
                0,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
            ),
            block_delta(0, json!({"type": "thinking_delta", "thinking": "Hmm, "})),
            block_delta(0, json!({"type": "thinking_delta", "thinking": "two."})),
            block_stop(0),
            block_start(1, json!({"type": "text", "text": ""})),
            block_delta(1, json!({"type": "text_delta", "text": "2"})),
            block_stop(1),
        ];
        want.extend(end_events(
            "max_tokens",
            Value::Null,
            json!({"output_tokens": 0}),
        ));
        assert_eq!(stream(&input), want);
    }

    #[test]
    fn usage_of_the_first_and_of_the_final_chunk() {
        let mut first = chunk(json!({"role": "assistant", "content": "ok"}), None);
        first["usage"] = json!({"prompt_tokens": 50, "completion_tokens": 0});
        let final_usage = json!({"prompt_tokens": 50, "completion_tokens": 1,
                                 "prompt_tokens_details": {"cached_tokens": 32}});
        let input = sse(
            &[
                first,
                chunk(json!({}), Some("stop")),
                json!({"id": "c", "choices": [], "usage": final_usage}),
            ],
            true,
        );
        let mut want = vec![
            start_event(50),
            block_start(0, json!({"type": "text", "text": ""})),
            block_delta(0, json!({"type": "text_delta", "text": "ok"})),
            block_stop(0),
        ];
        want.extend(end_events(
            "end_turn",
            Value::Null,
            json!({"input_tokens": 18, "cache_read_input_tokens": 32, "output_tokens": 1}),
        ));
        assert_eq!(stream(&input), want);
    }

    #[test]
    fn an_engine_error_in_the_stream_ends_it_with_an_error_event() {
        let error = |t: &str, m: &str| json!({"type": "error", "error": {"type": t, "message": m}});
        let mut input = sse(&[chunk(json!({"content": "Hi"}), None)], false);
        input.extend_from_slice(b"data: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"code\":500}}\n\n");
        input.extend_from_slice(&sse(
            &[chunk(json!({"content": "more"}), Some("stop"))],
            true,
        ));
        assert_eq!(
            stream(&input),
            [
                start_event(0),
                block_start(0, json!({"type": "text", "text": ""})),
                block_delta(0, json!({"type": "text_delta", "text": "Hi"})),
                error("api_error", "engine died"),
            ]
        );
        let cases: [(&[u8], Value); 4] = [
            (b"event: error\ndata: {\"error\":{\"message\":\"slow down\",\"code\":429}}\n\n",
             error("rate_limit_error", "slow down")),
            (b"data: {\"object\":\"error\",\"message\":\"bad n\",\"type\":\"BadRequestError\",\"code\":400}\n\n",
             error("invalid_request_error", "bad n")),
            (b"data: {\"error\":\"Input validation error\",\"error_type\":\"validation\"}\n\n",
             error("api_error", "Input validation error")),
            (b"data: {\"choices\": [oops\n\n",
             error("api_error", "the engine sent an event that is not a chat completion chunk")),
        ];
        for (input, want) in cases {
            let (out, finished) = stream_in_pieces(input, &[]);
            assert!(finished);
            assert_eq!(parse_events(&out), [want]);
        }
    }

    #[test]
    fn finish_without_done() {
        let input = sse(
            &[
                chunk(json!({"content": "x"}), None),
                chunk(json!({}), Some("stop")),
            ],
            false,
        );
        let (out, finished) = stream_in_pieces(&input, &[]);
        assert!(finished);
        let mut want = vec![
            start_event(0),
            block_start(0, json!({"type": "text", "text": ""})),
            block_delta(0, json!({"type": "text_delta", "text": "x"})),
            block_stop(0),
        ];
        want.extend(end_events(
            "end_turn",
            Value::Null,
            json!({"output_tokens": 0}),
        ));
        assert_eq!(parse_events(&out), want);

        let cut = sse(&[chunk(json!({"content": "x"}), None)], false);
        let (out, finished) = stream_in_pieces(&cut, &[]);
        assert!(!finished);
        assert_eq!(parse_events(&out), want[..3]);

        let mut reply = Reply::new(asked());
        let mut out = Vec::new();
        reply.events(b"data: [DONE]", &mut out);
        assert!(out.is_empty());
        assert!(reply.finish(&mut out));
        let mut want = vec![start_event(0)];
        want.extend(end_events(
            "end_turn",
            Value::Null,
            json!({"output_tokens": 0}),
        ));
        assert_eq!(parse_events(&out), want);
        let len = out.len();
        assert!(reply.finish(&mut out));
        reply.events(b"data: {}\n\n", &mut out);
        assert_eq!(out.len(), len);
    }

    #[test]
    fn a_role_only_chunk_and_comments_write_only_message_start() {
        let input = b": keep-alive\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\nevent: ping\ndata: {}\n\n";
        let (out, finished) = stream_in_pieces(input, &[]);
        assert!(!finished);
        assert_eq!(parse_events(&out), [start_event(0)]);
        assert_eq!(Reply::new(asked()).sequence(), None);
    }
}
