//! Token ids for a request's prompt, computed the way the engine computes them.
//!
//! A cache-aware strategy (`precise_cache_aware`, `lmcache_aware`) looks a request's prompt
//! up by its token ids. The ids must be the engine's own: the chat template applied to the
//! messages first, then the model's tokenizer. This crate owns turning request bytes into
//! those ids, two ways:
//!
//! - [`local`] (feature `local`): in process, from the model's `tokenizer.json` and the chat
//!   template in its `tokenizer_config.json` ([`LocalTokenizer`]), with [`template`], the
//!   chat-template environment and message normalisation.
//! - [`remote`]: the body for the engine's own tokenize / render endpoint and the parser for
//!   its answer; the caller does the HTTP.
//!
//! What this crate must not do: open sockets, read files other than the ones it is pointed
//! at, log, or hash blocks (block keys belong to the index that uses them). Depends on no
//! other Rolter crate.

#[cfg(feature = "local")]
mod byte_level;
#[cfg(feature = "local")]
pub mod local;
pub mod remote;
#[cfg(feature = "local")]
mod scanner;
#[cfg(feature = "local")]
mod segments;
#[cfg(feature = "local")]
pub mod template;

use std::path::PathBuf;

#[cfg(feature = "local")]
pub use local::LocalTokenizer;

/// A chat request's parts that decide the prompt: the raw JSON of the request's fields.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatRequest<'a> {
    /// The `messages` array.
    pub messages: &'a [u8],
    /// The `tools` array, when the request has one (`null` is the same as none).
    pub tools: Option<&'a [u8]>,
    /// `add_generation_prompt` (vLLM's default is `true`).
    pub add_generation_prompt: bool,
    /// The `chat_template_kwargs` object (e.g. `{"enable_thinking": false}`), passed to the
    /// template as variables; they override the ones set here, as in vLLM.
    pub chat_template_kwargs: Option<&'a [u8]>,
}

/// Why a prompt could not be turned into token ids. Each variant says what was wrong and,
/// for files, which file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` was read but is not a tokenizer the library can load.
    #[error("{}: not a loadable tokenizer.json: {message}", path.display())]
    TokenizerFile { path: PathBuf, message: String },
    /// `tokenizer_config.json` (or `chat_template.jinja`) has the wrong shape.
    #[error("{}: {message}", path.display())]
    ConfigFile { path: PathBuf, message: String },
    /// A chat request, but no chat template was found for this tokenizer.
    #[error("no chat template: {origin}")]
    NoChatTemplate { origin: String },
    /// The chat template does not compile (syntax error, unknown tag).
    #[error("chat template from {origin} does not compile: {message}")]
    TemplateSyntax { origin: String, message: String },
    /// The template failed while rendering, e.g. `raise_exception(...)` for a conversation
    /// shape the model does not accept.
    #[error("chat template failed to render: {message}")]
    TemplateRender { message: String },
    /// The request's `messages`, `tools`, `prompt` or `chat_template_kwargs` are not what the
    /// API allows.
    #[error("invalid request: {message}")]
    Request { message: String },
    /// The tokenizer refused the rendered text (should not happen with byte-level BPE).
    #[error("tokenizer failed: {message}")]
    Encode { message: String },
    /// The engine's tokenize/render answer could not be understood.
    #[error("engine tokenize response: {message}")]
    Response { message: String },
}

/// The first prompt of a `/v1/completions` request's `prompt` field (raw JSON): its text, or
/// `None` after appending its ids to `ids` when it is given as token ids. A batch (array of
/// strings or of id arrays) yields its first prompt: the batch goes to one target, and the
/// first prompt is the one whose prefix matters first.
pub fn prompt_text(prompt: &[u8], ids: &mut Vec<u32>) -> Result<Option<String>, TokenizeError> {
    use serde_json::Value;
    let prompt: Value = serde_json::from_slice(prompt)
        .map_err(|e| TokenizeError::request(format!("prompt is not valid JSON: {e}")))?;
    let first = match prompt {
        Value::Array(mut items) => match items.first() {
            None => return Err(TokenizeError::request("prompt is an empty array")),
            Some(Value::String(_)) | Some(Value::Array(_)) => items.swap_remove(0),
            Some(_) => Value::Array(items),
        },
        other => other,
    };
    match first {
        Value::String(text) => Ok(Some(text)),
        Value::Array(items) => {
            ids.reserve(items.len());
            for id in &items {
                let id = id
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        TokenizeError::request(format!("prompt token id {id} is not a u32"))
                    })?;
                ids.push(id);
            }
            Ok(None)
        }
        other => Err(TokenizeError::request(format!(
            "prompt must be a string, an array of token ids, or a batch of either; got {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                _ => "an object",
            }
        ))),
    }
}

impl TokenizeError {
    pub(crate) fn request(message: impl Into<String>) -> Self {
        TokenizeError::Request {
            message: message.into(),
        }
    }
}
