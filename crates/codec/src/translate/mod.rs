//! Translation between the inference APIs, for a client and an engine that do not speak
//! the same one: Anthropic's Messages over an engine that speaks only OpenAI's Chat
//! Completions ([`messages_chat`]), Chat Completions over an Anthropic Messages API
//! ([`chat_messages`]) and OpenAI's Responses over Chat Completions ([`responses_chat`]).
//!
//! Each direction has two halves:
//! - the request: the client's JSON body parsed once and written again in the engine's API
//!   ([`request`]), with what the answer's translation must know of it ([`Asked`]);
//! - the answer ([`Reply`]): a whole body (success or error) translated at once, or an
//!   event stream translated event by event as its bytes arrive: a complete upstream
//!   event becomes the client's events at once, and at most one partial event is held.
//!
//! Owns the mapping between the APIs' shapes only. It must not do I/O, read clocks (ids and
//! `created` stamps are the caller's: [`Asked::created`]) or know of targets and routes.

pub mod chat_messages;
pub mod count_tokens;
pub mod messages_chat;
pub mod responses_chat;
pub mod sse;

pub use sse::SseSplitter;

/// One of the inference APIs a client calls or an engine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI's `/v1/chat/completions`.
    Chat,
    /// Anthropic's `/v1/messages`.
    Messages,
    /// OpenAI's `/v1/responses`.
    Responses,
    /// Anthropic's `/v1/messages/count_tokens`.
    CountTokens,
    /// vLLM's and SGLang's `/tokenize` (a chat's messages counted by the engine).
    Tokenize,
}

impl Api {
    /// The path of the API's generation endpoint.
    /// The API of a `POST` to `path` (origin form, no query) that Rolter can translate.
    pub fn of_path(path: &[u8]) -> Option<Api> {
        match path {
            b"/v1/chat/completions" => Some(Api::Chat),
            b"/v1/messages" => Some(Api::Messages),
            b"/v1/responses" => Some(Api::Responses),
            b"/v1/messages/count_tokens" => Some(Api::CountTokens),
            _ => None,
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
            Api::CountTokens => "/v1/messages/count_tokens",
            Api::Tokenize => "/tokenize",
        }
    }
}

/// A translation: what the client speaks and what the engine speaks. Only the pairs with
/// a module above exist: (Messages, Chat), (Chat, Messages), (Responses, Chat) and
/// (CountTokens, Tokenize).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    pub client: Api,
    pub engine: Api,
}

impl Pair {
    /// The pair, when it is one Rolter translates.
    pub fn new(client: Api, engine: Api) -> Option<Pair> {
        matches!(
            (client, engine),
            (Api::Messages, Api::Chat)
                | (Api::Chat, Api::Messages)
                | (Api::Responses, Api::Chat)
                | (Api::CountTokens, Api::Tokenize)
        )
        .then_some(Pair { client, engine })
    }
}

/// A client body that cannot be translated: answered 400 in the client's API, naming the
/// field (`param`) when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    pub param: Option<String>,
}

impl Refusal {
    pub fn new(message: impl Into<String>, param: Option<&str>) -> Refusal {
        Refusal {
            message: message.into(),
            param: param.map(str::to_string),
        }
    }
}

/// A success answer that is not the engine's API's (not its JSON, no choices, no
/// content): the gateway answers it as any bad response from an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotTheApi;

/// What the answer's translation needs to know of the request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    /// The model the client named (answers echo it).
    pub model: String,
    /// The client asked for a stream.
    pub stream: bool,
    /// A Chat client asked for a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The request's stop sequences (a Messages client's `stop_sequences`), to name the one
    /// an engine's answer stopped at.
    pub stop_sequences: Vec<String>,
    /// Unix seconds, for the `created` / `created_at` fields of translated answers.
    pub created: u64,
    /// A random hex string the translated answer's ids are made from (`msg_…`, `resp_…`,
    /// `chatcmpl-…`, item ids), so translation itself draws no randomness.
    pub id_seed: String,
    /// A Responses client's request echoed in the response object: `instructions`, `tools`,
    /// `tool_choice`, `temperature`, `top_p`, `max_output_tokens`, `metadata`,
    /// `parallel_tool_calls`, `text` (raw JSON, `None` when absent).
    pub echo: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Writes the client's request `body` (in `pair.client`'s API) as `pair.engine`'s request
/// into `out`; `model` replaces the model name when the target maps it. What the answer's
/// translation needs is returned, or the refusal of a body that cannot be translated.
pub fn request(
    pair: Pair,
    body: &[u8],
    model: Option<&str>,
    created: u64,
    id_seed: &str,
    out: &mut Vec<u8>,
) -> Result<Asked, Refusal> {
    let mut asked = match (pair.client, pair.engine) {
        (Api::Messages, Api::Chat) => messages_chat::request(body, model, out)?,
        (Api::Chat, Api::Messages) => chat_messages::request(body, model, out)?,
        (Api::Responses, Api::Chat) => responses_chat::request(body, model, out)?,
        (Api::CountTokens, Api::Tokenize) => count_tokens::request(body, model, out)?,
        _ => return Err(Refusal::new("this translation is not supported", None)),
    };
    asked.created = created;
    asked.id_seed = id_seed.to_string();
    Ok(asked)
}

/// The translation of one answer, from its head to its end.
#[derive(Debug)]
pub enum Reply {
    MessagesChat(messages_chat::Reply),
    ChatMessages(chat_messages::Reply),
    ResponsesChat(responses_chat::Reply),
    CountTokens(count_tokens::Reply),
}

impl Reply {
    /// The translation of the answer to a request translated as `pair`.
    pub fn new(pair: Pair, asked: Asked) -> Reply {
        match (pair.client, pair.engine) {
            (Api::Chat, Api::Messages) => Reply::ChatMessages(chat_messages::Reply::new(asked)),
            (Api::Responses, Api::Chat) => Reply::ResponsesChat(responses_chat::Reply::new(asked)),
            (Api::CountTokens, _) => Reply::CountTokens(count_tokens::Reply),
            _ => Reply::MessagesChat(messages_chat::Reply::new(asked)),
        }
    }

    /// Translates a whole (not streamed) answer with `status` into `out`: a success body,
    /// or an error body in the client's API's error shape. `Err` when a success body is not
    /// the engine's API's JSON (the gateway then answers 502 as for any bad response).
    pub fn whole(&mut self, status: u16, body: &[u8], out: &mut Vec<u8>) -> Result<(), NotTheApi> {
        match self {
            Reply::MessagesChat(r) => r.whole(status, body, out),
            Reply::ChatMessages(r) => r.whole(status, body, out),
            Reply::ResponsesChat(r) => r.whole(status, body, out),
            Reply::CountTokens(r) => r.whole(status, body, out),
        }
    }

    /// Translates the next bytes of a successful event stream (split anywhere) into the
    /// client's events, appended to `out`.
    pub fn events(&mut self, data: &[u8], out: &mut Vec<u8>) {
        match self {
            Reply::MessagesChat(r) => r.events(data, out),
            Reply::ChatMessages(r) => r.events(data, out),
            Reply::ResponsesChat(r) => r.events(data, out),
            // Counting never streams.
            Reply::CountTokens(_) => out.extend_from_slice(data),
        }
    }

    /// The engine's stream ended cleanly: appends what the client's API still expects
    /// (nothing when the engine's own end was translated already). `false` when the
    /// engine's stream ended before its API's end (no `[DONE]`, no `message_stop`): the
    /// caller then treats the stream as cut.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> bool {
        match self {
            Reply::MessagesChat(r) => r.finish(out),
            Reply::ChatMessages(r) => r.finish(out),
            Reply::ResponsesChat(r) => r.finish(out),
            Reply::CountTokens(_) => true,
        }
    }

    /// The engine's event stream held an event beyond [`sse::MAX_EVENT`]: it cannot be
    /// translated, and the caller ends it as a cut stream.
    pub fn overflowed(&self) -> bool {
        match self {
            Reply::MessagesChat(r) => r.overflowed(),
            Reply::ChatMessages(r) => r.overflowed(),
            Reply::ResponsesChat(r) => r.overflowed(),
            Reply::CountTokens(_) => false,
        }
    }

    /// The last `sequence_number` written to a Responses client, for the error event of a
    /// stream cut after it.
    pub fn sequence(&self) -> Option<u64> {
        match self {
            Reply::ResponsesChat(r) => r.sequence(),
            _ => None,
        }
    }
}
