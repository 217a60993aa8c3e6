//! In-process tokenizer: a Hugging Face `tokenizer.json` plus the model's chat template.
//!
//! Owns loading the model's tokenizer files, rendering a chat request through the chat
//! template (see [`super::template`]) and encoding the result, so that the ids are the ones
//! vLLM feeds the model: chat prompts are rendered, then encoded *without* the tokenizer's
//! own special tokens (the template already wrote `bos_token`), completions prompts are
//! encoded *with* them (`add_special_tokens=True`, vLLM's default), and a prompt given as
//! token ids passes through unchanged.
//!
//! A chat prompt is encoded piece by piece between its added tokens (module `segments`: the
//! chat template puts one around every message), each piece's ids cached by the piece's
//! hash in a bounded cache shared by all threads, so a conversation's next request encodes
//! only its new turn; pieces are encoded by the direct encoder of module `byte_level` for
//! the byte-level BPE pipelines it recognises, else by the library. The ids are always those
//! of the library's whole-text encode: a tokenizer for which that would not hold is encoded
//! whole (see [`LocalTokenizer::encodes_by_segment`]), and so are completions prompts, which
//! take the tokenizer's special tokens from its post-processor.
//!
//! Cost (`benches/tokenize.rs`, a 32k-entry BPE, realistic English, every cache emptied):
//! about 110 µs for a 1 KiB chat request and 3 ms for 32 KiB (the library's whole encode
//! took 0.56 and 18 ms of that text); a 32 KiB conversation whose history was tokenized
//! before costs about 90 µs. Cold, the BPE merges of new words are most of it; a message
//! with any non-ASCII character is split by the regex engine, many times slower than the
//! ASCII scanner. Callers run it off the event loop.
//!
//! Must not: fetch anything (no hub downloads; files are given by path), log, keep
//! per-request state (a [`LocalTokenizer`] is shared, `Send + Sync`, by all workers), or
//! hash blocks.

use std::path::Path;

use minijinja::{Environment, Value};

use super::byte_level::ByteLevelEncoder;
use super::segments::{Segmenter, DEFAULT_CACHE_IDS};
use super::template::{
    self, conversation, detect_content_format, normalise_tools, ContentFormat, MediaPlaceholders,
};
use super::{ChatRequest, TokenizeError};

/// One compiled chat template.
struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
}

/// A model's tokenizer and chat template, loaded from its Hugging Face files.
pub struct LocalTokenizer {
    tokenizer: tokenizers::Tokenizer,
    /// Piece-wise encoding between added tokens, with its cache, or why it is not exact for
    /// this tokenizer (then texts are encoded whole).
    segments: Result<Segmenter, String>,
    /// The direct encoder of pieces, for the byte-level BPE pipelines it recognises.
    direct: Option<ByteLevelEncoder>,
    /// `"default"` (or the only) template.
    default: Option<ChatTemplate>,
    /// The `"tool_use"` template of a config with named templates, used when tools are given.
    tool_use: Option<ChatTemplate>,
    /// Why there is no template, for the error a chat request gets.
    missing_template: String,
    /// `bos_token`, `eos_token`, ... as the template sees them.
    special_tokens: Vec<(&'static str, Value)>,
    placeholders: MediaPlaceholders,
}

impl std::fmt::Debug for LocalTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("by_segment", &self.segments.is_ok())
            .field("direct", &self.direct.is_some())
            .field("chat_template", &self.default.is_some())
            .field("tool_use_template", &self.tool_use.is_some())
            .finish()
    }
}

const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

fn read(path: &Path) -> Result<Vec<u8>, TokenizeError> {
    std::fs::read(path).map_err(|source| TokenizeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn config_error(path: &Path, message: impl Into<String>) -> TokenizeError {
    TokenizeError::ConfigFile {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl LocalTokenizer {
    /// Loads `tokenizer.json` and, when given, `tokenizer_config.json` (chat template,
    /// bos/eos tokens). The chat template is taken from the config's `chat_template` (a string,
    /// or a list of `{"name", "template"}` whose `"default"` and `"tool_use"` entries are
    /// used), else from a `chat_template.jinja` beside the config (or beside `tokenizer.json`
    /// when no config is given). Without any, [`prompt_ids`](Self::prompt_ids) works and
    /// [`chat_ids`](Self::chat_ids) returns [`TokenizeError::NoChatTemplate`].
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Self, TokenizeError> {
        let bytes = read(tokenizer_json)?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            TokenizeError::TokenizerFile {
                path: tokenizer_json.to_path_buf(),
                message: e.to_string(),
            }
        })?;
        let segments = Segmenter::new(&tokenizer, DEFAULT_CACHE_IDS);
        // Pieces may hold `normalized: true` added tokens, which only the library matches.
        let direct = match &segments {
            Ok(_)
                if tokenizer
                    .get_added_tokens_decoder()
                    .values()
                    .all(|t| !t.normalized) =>
            {
                ByteLevelEncoder::new(&tokenizer)
            }
            _ => None,
        };
        let mut this = LocalTokenizer {
            tokenizer,
            segments,
            direct,
            default: None,
            tool_use: None,
            missing_template: String::new(),
            special_tokens: Vec::new(),
            placeholders: MediaPlaceholders::default(),
        };

        let mut has_config_template = false;
        if let Some(path) = tokenizer_config_json {
            let config: serde_json::Value = serde_json::from_slice(&read(path)?)
                .map_err(|e| config_error(path, format!("not valid JSON: {e}")))?;
            let config = config
                .as_object()
                .ok_or_else(|| config_error(path, "not a JSON object"))?;
            this.special_tokens = special_tokens(config, path)?;
            if let Some(template) = config.get("chat_template").filter(|v| !v.is_null()) {
                this.load_config_template(template, path)?;
                has_config_template = true;
            }
        }
        if !has_config_template {
            let dir = tokenizer_config_json
                .unwrap_or(tokenizer_json)
                .parent()
                .unwrap_or(Path::new("."));
            let jinja = dir.join("chat_template.jinja");
            match std::fs::read_to_string(&jinja) {
                Ok(source) => {
                    this.default = Some(compile(source, &jinja.display().to_string())?);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    this.missing_template = match tokenizer_config_json {
                        Some(path) => format!(
                            "{} has no \"chat_template\" and {} does not exist",
                            path.display(),
                            jinja.display()
                        ),
                        None => format!(
                            "no tokenizer_config.json given and {} does not exist",
                            jinja.display()
                        ),
                    };
                }
                Err(source) => {
                    return Err(TokenizeError::Io {
                        path: jinja,
                        source,
                    })
                }
            }
        }
        Ok(this)
    }

    fn load_config_template(
        &mut self,
        template: &serde_json::Value,
        path: &Path,
    ) -> Result<(), TokenizeError> {
        let origin = |name: &str| format!("{} (chat_template {name})", path.display());
        match template {
            serde_json::Value::String(source) => {
                self.default = Some(compile(source.clone(), &origin("string"))?);
            }
            serde_json::Value::Array(named) => {
                for entry in named {
                    let name = entry.get("name").and_then(|v| v.as_str());
                    let source = entry.get("template").and_then(|v| v.as_str());
                    let (Some(name), Some(source)) = (name, source) else {
                        return Err(config_error(
                            path,
                            "chat_template list entries need string \"name\" and \"template\"",
                        ));
                    };
                    match name {
                        "default" => {
                            self.default = Some(compile(source.to_string(), &origin(name))?)
                        }
                        "tool_use" => {
                            self.tool_use = Some(compile(source.to_string(), &origin(name))?)
                        }
                        _ => {}
                    }
                }
                if self.default.is_none() {
                    if self.tool_use.is_none() {
                        return Err(config_error(
                            path,
                            "chat_template list has neither a \"default\" nor a \"tool_use\" entry",
                        ));
                    }
                    self.missing_template = format!(
                        "{} has named chat templates but no \"default\" one",
                        path.display()
                    );
                }
            }
            _ => {
                return Err(config_error(
                    path,
                    "chat_template must be a string or a list of {\"name\", \"template\"}",
                ))
            }
        }
        Ok(())
    }

    /// Replaces the chat template (as vLLM's `--chat-template` does).
    pub fn with_chat_template(mut self, source: String) -> Result<Self, TokenizeError> {
        self.default = Some(compile(source, "the configured chat template")?);
        self.tool_use = None;
        Ok(self)
    }

    /// Sets the text put in the prompt for image/audio/video content parts.
    pub fn with_media_placeholders(mut self, placeholders: MediaPlaceholders) -> Self {
        self.placeholders = placeholders;
        self
    }

    /// The underlying Hugging Face tokenizer.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// Whether chat requests can be rendered.
    pub fn has_chat_template(&self) -> bool {
        self.default.is_some() || self.tool_use.is_some()
    }

    /// Appends to `out` the ids of a chat request's prompt: the messages through the chat
    /// template (with `tools` when given), then encoded. `out` is not cleared.
    pub fn chat_ids(
        &self,
        messages_json: &[u8],
        tools_json: Option<&[u8]>,
        add_generation_prompt: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        self.chat_request_ids(
            &ChatRequest {
                messages: messages_json,
                tools: tools_json,
                add_generation_prompt,
                chat_template_kwargs: None,
            },
            out,
        )
    }

    /// [`chat_ids`](Self::chat_ids) with every field of [`ChatRequest`].
    pub fn chat_request_ids(
        &self,
        request: &ChatRequest<'_>,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let text = self.render_chat(request)?;
        self.encode(&text, false, out)
    }

    /// The prompt text the chat template makes of `request` (what [`chat_request_ids`]
    /// encodes).
    ///
    /// [`chat_request_ids`]: Self::chat_request_ids
    pub fn render_chat(&self, request: &ChatRequest<'_>) -> Result<String, TokenizeError> {
        let messages: Value = parse_json(request.messages, "messages")?;
        let tools = match request.tools {
            Some(bytes) => normalise_tools(&parse_json(bytes, "tools")?)?,
            None => Value::from(()),
        };
        // As transformers: any `tools` (even empty) selects a "tool_use" template.
        let chosen = match (&self.tool_use, &self.default) {
            (Some(t), _) if !tools.is_none() => t,
            (_, Some(t)) => t,
            (_, None) => {
                return Err(TokenizeError::NoChatTemplate {
                    origin: self.missing_template.clone(),
                })
            }
        };
        let conv = conversation(&messages, chosen.format, &self.placeholders)?;

        let mut ctx: Vec<(Value, Value)> = Vec::with_capacity(12);
        ctx.push((Value::from("messages"), conv));
        ctx.push((Value::from("tools"), tools));
        ctx.push((Value::from("documents"), Value::from(())));
        ctx.push((
            Value::from("add_generation_prompt"),
            Value::from(request.add_generation_prompt),
        ));
        for (k, v) in &self.special_tokens {
            ctx.push((Value::from(*k), v.clone()));
        }
        if let Some(bytes) = request.chat_template_kwargs {
            let kwargs: Value = parse_json(bytes, "chat_template_kwargs")?;
            if !kwargs.is_none() {
                if kwargs.kind() != minijinja::value::ValueKind::Map {
                    return Err(TokenizeError::request(
                        "chat_template_kwargs must be an object",
                    ));
                }
                for key in kwargs
                    .try_iter()
                    .map_err(|e| TokenizeError::request(e.to_string()))?
                {
                    if key.as_str() == Some("messages") {
                        continue;
                    }
                    let value = kwargs.get_item(&key).unwrap_or(Value::from(()));
                    ctx.push((key, value));
                }
            }
        }
        let template = chosen
            .env
            .get_template(template::TEMPLATE_NAME)
            .map_err(|e| TokenizeError::TemplateRender {
                message: template::describe(&e),
            })?;
        template
            .render(Value::from_pairs(ctx))
            .map_err(|e| TokenizeError::TemplateRender {
                message: template::describe(&e),
            })
    }

    /// Appends to `out` the ids of a `/v1/completions` prompt, given as the raw JSON of the
    /// request's `prompt` field: a string is encoded with the tokenizer's special tokens (as
    /// vLLM's `add_special_tokens=true` default), an array of token ids passes through. A batch
    /// (array of strings or of id arrays) yields its first prompt: the batch goes to one
    /// target, and the first prompt is the one whose prefix matters first.
    pub fn prompt_ids(&self, prompt: &[u8], out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        match super::prompt_text(prompt, out)? {
            Some(text) => self.encode(&text, true, out),
            None => Ok(()),
        }
    }

    /// Appends to `out` the ids of `text`, with the tokenizer's special tokens (BOS, per its
    /// post-processor) when `add_special_tokens`.
    ///
    /// Without special tokens (chat prompts), the text is encoded piece by piece between its
    /// added tokens and each piece's ids are cached, when [`encodes_by_segment`] says that is
    /// exact for this tokenizer; the ids are the same as a whole encode's.
    ///
    /// [`encodes_by_segment`]: Self::encodes_by_segment
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        match &self.segments {
            Ok(segments) if !add_special_tokens => {
                segments.encode(text, out, |piece, out| self.encode_piece(piece, out))
            }
            _ => self.encode_whole(text, add_special_tokens, out),
        }
    }

    /// Whether texts are encoded piece by piece between added tokens (with the piece cache);
    /// `Err` says why not for this tokenizer.
    pub fn encodes_by_segment(&self) -> Result<(), &str> {
        self.segments.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// Whether pieces are encoded by the direct byte-level encoder rather than the library's
    /// general pipeline (the ids are the same).
    pub fn encodes_directly(&self) -> bool {
        self.direct.is_some()
    }

    /// Pieces whose ids are cached.
    pub fn cached_segments(&self) -> usize {
        self.segments.as_ref().map_or(0, Segmenter::cached_pieces)
    }

    /// Empties the piece cache and the BPE model's own word cache, so that the next encode
    /// is as cold as the first.
    pub fn clear_caches(&self) {
        if let Ok(segments) = &self.segments {
            segments.clear();
        }
        if let tokenizers::models::ModelWrapper::BPE(bpe) = self.tokenizer.get_model() {
            bpe.clear_cache();
        }
    }

    /// The ids of one piece (no added token in it).
    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        match &self.direct {
            Some(direct) => {
                direct
                    .encode(&self.tokenizer, piece, out)
                    .map_err(|e| TokenizeError::Encode {
                        message: e.to_string(),
                    })
            }
            None => self.encode_whole(piece, false, out),
        }
    }

    fn encode_whole(
        &self,
        text: &str,
        add_special_tokens: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Encode {
                message: e.to_string(),
            })?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }
}

fn compile(source: String, origin: &str) -> Result<ChatTemplate, TokenizeError> {
    let format = detect_content_format(&source);
    Ok(ChatTemplate {
        env: template::environment(source, origin)?,
        format,
    })
}

fn parse_json(bytes: &[u8], what: &str) -> Result<Value, TokenizeError> {
    serde_json::from_slice(bytes)
        .map_err(|e| TokenizeError::request(format!("{what} is not valid JSON: {e}")))
}

/// `bos_token` & co. from a tokenizer config: a string, an `AddedToken` object
/// (`{"content": ...}`) or null (left out, as `transformers` leaves out unset tokens).
fn special_tokens(
    config: &serde_json::Map<String, serde_json::Value>,
    path: &Path,
) -> Result<Vec<(&'static str, Value)>, TokenizeError> {
    let mut out = Vec::new();
    for key in SPECIAL_TOKEN_KEYS {
        let token = match config.get(key) {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Object(o)) => match o.get("content") {
                Some(serde_json::Value::String(s)) => s.clone(),
                _ => {
                    return Err(config_error(
                        path,
                        format!("{key} object has no string \"content\""),
                    ))
                }
            },
            Some(_) => {
                return Err(config_error(
                    path,
                    format!("{key} must be a string, an object or null"),
                ))
            }
        };
        out.push((key, Value::from(token)));
    }
    if let Some(serde_json::Value::Array(extra)) = config.get("additional_special_tokens") {
        let list: Vec<Value> = extra
            .iter()
            .filter_map(|t| match t {
                serde_json::Value::String(s) => Some(Value::from(s.as_str())),
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(Value::from),
                _ => None,
            })
            .collect();
        out.push(("additional_special_tokens", Value::from(list)));
    }
    Ok(out)
}
